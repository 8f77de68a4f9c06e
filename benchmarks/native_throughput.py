"""Env steps per second, updates included, for native CartPole at growing env batches, vs the gymnasium path.

Each configuration trains a few PPO iterations (rollout T x N, GAE, 4 epochs x 4 minibatches) and reports the
median steps/s of the iterations after the first (which compiles). Rows: gymnasium path (numpy CartPole,
one acting call per step), native env stepped per call, native env with the compiled rollout (one call per
rollout), the same with the C++ update kernel (``ppo.update_kernel: custom``: all epochs in one call, so an
iteration is 2 calls), and Stable-Baselines3 PPO with the same settings on its DummyVecEnv when the [bench] extra is
installed (each SB3 configuration in a subprocess, so torch never shares the process with MindSpore).
Measured in one run; the machine is shared, so compare within the run.

Usage:  python benchmarks/native_throughput.py [--iterations 4] [--out benchmarks/results/native_throughput.json]
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

from scalebox_ms.fileio import atomic_write_json  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def run(backend: str, compiled: bool, num_envs: int, n_steps: int, iterations: int,
        update_kernel: str = "builtin", act_kernel: str = "builtin") -> dict:
    from scalebox_ms.config import Config
    from scalebox_ms.trainers import Callback, PPOTrainer

    batch = num_envs * n_steps // 4
    cfg = Config.from_dict({
        "env": {"id": "CartPole-v1", "num_envs": num_envs, "backend": backend, "compiled_rollout": compiled},
        "ppo": {"n_steps": n_steps, "batch_size": batch, "n_epochs": 4, "learning_rate": 3e-4,
                "update_kernel": update_kernel},
        "policy": {"act_kernel": act_kernel},
        "run": {"total_steps": 10**9, "progress": False},
    })
    rows = []

    class Keep(Callback):
        def on_iteration_end(self, trainer, metrics):
            rows.append(metrics)

    trainer = PPOTrainer(cfg)
    trainer.learn(until=iterations * n_steps * num_envs, callbacks=[Keep()])
    trainer.close()
    later = rows[1:]
    return {"backend": backend, "compiled_rollout": compiled, "update_kernel": update_kernel,
            "act_kernel": act_kernel,
            "num_envs": num_envs, "n_steps": n_steps,
            "batch_size": batch, "steps_per_s": statistics.median(r["steps_per_second"] for r in later),
            "rollout_share": statistics.median(r["rollout_time_s"] / (r["rollout_time_s"] + r["update_time_s"])
                                               for r in later)}


def run_sb3(num_envs: int, n_steps: int, iterations: int):
    """SB3 steps/s after its first iteration, in a fresh process; None without stable-baselines3."""
    import json
    import subprocess
    import sys

    code = f"""
import json, time
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env
stamps = []
class Stamp(BaseCallback):
    def _on_rollout_start(self):
        stamps.append(time.perf_counter())
    def _on_step(self):
        return True
env = make_vec_env("CartPole-v1", n_envs={num_envs}, seed=0)
model = PPO("MlpPolicy", env, n_steps={n_steps}, batch_size={num_envs * n_steps // 4}, n_epochs=4, device="cpu")
model.learn({(iterations + 1) * num_envs * n_steps}, callback=Stamp())
steps = (len(stamps) - 2) * {num_envs * n_steps}
print(json.dumps(steps / (stamps[-1] - stamps[1])))
"""
    try:
        import stable_baselines3  # noqa: F401
    except ImportError:
        return None
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"SB3 run failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iterations", type=int, default=4)
    ap.add_argument("--out", default=os.path.join(HERE, "results", "native_throughput.json"))
    args = ap.parse_args()
    if args.iterations < 2:  # (the first iteration compiles: the median is over the others)
        ap.error("--iterations: must be >= 2")
    results = []
    for n in (8, 256, 1024, 4096):
        t = 32 if n <= 256 else 16
        for backend, compiled, kernel in (("gymnasium", False, "builtin"), ("native", False, "builtin"),
                                          ("native", True, "builtin"), ("native", True, "custom")):
            r = run(backend, compiled, n, t, args.iterations, kernel)
            results.append(r)
            print(f"N={n:5d} T={t:3d} {backend:9s} {'compiled' if compiled else 'per-step':9s} "
                  f"{'update kernel' if kernel == 'custom' else 'update graph':13s} "
                  f"{r['steps_per_s']:10,.0f} steps/s  (rollout {100 * r['rollout_share']:.0f}% of the time)", flush=True)
        sb3 = run_sb3(n, t, args.iterations)
        if sb3 is not None:
            results.append({"backend": "sb3", "compiled_rollout": False, "num_envs": n, "n_steps": t,
                            "batch_size": n * t // 4, "steps_per_s": sb3, "rollout_share": None})
            print(f"N={n:5d} T={t:3d} {'sb3':9s} {'':9s} {sb3:10,.0f} steps/s", flush=True)
    atomic_write_json(args.out, {"results": results, "date": time.strftime("%Y-%m-%d %H:%M")})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
