"""Env steps per second, updates included, for native CartPole at growing env batches, vs the gymnasium path.

Each configuration trains a few PPO iterations (rollout T x N, GAE, 4 epochs x 4 minibatches) and reports the
median steps/s of the iterations after the first (which compiles). Rows: gymnasium path (numpy CartPole,
one acting call per step), native env stepped per call, native env with the compiled rollout (one call per
rollout). Measured in one run; the machine is shared, so compare within the run.

Usage:  python benchmarks/native_throughput.py [--iterations 4] [--out benchmarks/results/native_throughput.json]
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

from scalebox_ms.fileio import atomic_write_json  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def run(backend: str, compiled: bool, num_envs: int, n_steps: int, iterations: int) -> dict:
    from scalebox_ms.config import Config
    from scalebox_ms.trainers import Callback, PPOTrainer

    batch = num_envs * n_steps // 4
    cfg = Config.from_dict({
        "env": {"id": "CartPole-v1", "num_envs": num_envs, "backend": backend, "compiled_rollout": compiled},
        "ppo": {"n_steps": n_steps, "batch_size": batch, "n_epochs": 4, "learning_rate": 3e-4},
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
    return {"backend": backend, "compiled_rollout": compiled, "num_envs": num_envs, "n_steps": n_steps,
            "batch_size": batch, "steps_per_s": statistics.median(r["steps_per_second"] for r in later),
            "rollout_share": statistics.median(r["rollout_time_s"] / (r["rollout_time_s"] + r["update_time_s"])
                                               for r in later)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iterations", type=int, default=4)
    ap.add_argument("--out", default=os.path.join(HERE, "results", "native_throughput.json"))
    args = ap.parse_args()
    results = []
    for n in (8, 256, 1024, 4096):
        t = 32 if n <= 256 else 16
        for backend, compiled in (("gymnasium", False), ("native", False), ("native", True)):
            r = run(backend, compiled, n, t, args.iterations)
            results.append(r)
            print(f"N={n:5d} T={t:3d} {backend:9s} {'compiled' if compiled else 'per-step':9s} "
                  f"{r['steps_per_s']:10,.0f} steps/s  (rollout {100 * r['rollout_share']:.0f}% of the time)", flush=True)
    atomic_write_json(args.out, {"results": results, "date": time.strftime("%Y-%m-%d %H:%M")})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
