"""scalebox_ms vs Stable-Baselines3 PPO on CartPole-v1, side by side in one script run.

Both use rl-zoo3's tuned hyper-parameters (8 envs, n_steps 32, batch 256, 20 epochs, gamma 0.98,
gae_lambda 0.8, linear lr 1e-3 and clip 0.2, 100k steps). Each (library, seed) runs in its own fresh
process, one after another, so peak RSS and wall time belong to that run alone. Reported per run:

* ``train_s``   wall time of the training call (SB3 ``learn``; our ``PPOTrainer.learn``), compile included
* ``steps/s``   env steps / train_s
* ``eval``      deterministic evaluation mean over 20 episodes (fresh envs)
* ``rss_mb``    peak resident memory of the process

Needs the [bench] extra:  pip install -e ".[bench]"
Usage:  python benchmarks/compare_sb3.py [--seeds 0 1 2] [--steps 100000] [--out benchmarks/results/compare_sb3.json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from scalebox_ms.fileio import atomic_write_json  # noqa: E402
from scalebox_ms.sandbox import peak_rss_bytes  # noqa: E402
from bench_args import SB3, at_least, require  # noqa: E402 (benchmarks/ is on sys.path)

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
EVAL_EPISODES = 20


def worker_scalebox(seed: int, steps: int) -> dict:
    t0 = time.perf_counter()
    import numpy as np

    from scalebox_ms.config import load_config
    from scalebox_ms.trainers import PPOTrainer
    from scalebox_ms.trainers.evaluation import evaluate_policy

    cfg = load_config(os.path.join(REPO, "configs", "ppo_cartpole.yaml"),
                      [f"run.seed={seed}", f"run.total_steps={steps}", "run.progress=false"])
    trainer = PPOTrainer(cfg)
    t_import = time.perf_counter() - t0
    t1 = time.perf_counter()
    trainer.learn()
    train_s = time.perf_counter() - t1
    rets = evaluate_policy(trainer, episodes=EVAL_EPISODES, seed=10_000 + seed)
    return {"train_s": train_s, "setup_s": t_import, "steps": trainer.global_step, "eval": float(np.mean(rets))}


def worker_sb3(seed: int, steps: int) -> dict:
    t0 = time.perf_counter()
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy

    def linear(v):
        return lambda progress_remaining: progress_remaining * v

    env = make_vec_env("CartPole-v1", n_envs=8, seed=seed)
    model = PPO("MlpPolicy", env, n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20,
                ent_coef=0.0, learning_rate=linear(1e-3), clip_range=linear(0.2), seed=seed, device="cpu", verbose=0)
    t_import = time.perf_counter() - t0
    t1 = time.perf_counter()
    model.learn(total_timesteps=steps)
    train_s = time.perf_counter() - t1
    eval_env = make_vec_env("CartPole-v1", n_envs=1, seed=10_000 + seed)
    mean, _ = evaluate_policy(model, eval_env, n_eval_episodes=EVAL_EPISODES, deterministic=True)
    return {"train_s": train_s, "setup_s": t_import, "steps": int(model.num_timesteps), "eval": float(mean)}


def run_worker(lib: str, seed: int, steps: int) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", lib, "--seed", str(seed), "--steps", str(steps)]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        raise SystemExit(f"{lib} seed {seed} failed:\n{out.stderr[-3000:]}")
    res = json.loads(out.stdout.strip().splitlines()[-1])
    res.update({"lib": lib, "seed": seed, "process_s": wall})
    res["steps_per_s"] = res["steps"] / res["train_s"]
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=at_least(0), nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=at_least(1), default=100_000)
    ap.add_argument("--out", default=os.path.join(HERE, "results", "compare_sb3.json"))
    ap.add_argument("--worker", choices=["scalebox_ms", "sb3"], help=argparse.SUPPRESS)
    ap.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.worker:
        res = (worker_scalebox if args.worker == "scalebox_ms" else worker_sb3)(args.seed, args.steps)
        res["rss_mb"] = peak_rss_bytes() / 2.0 ** 20
        print(json.dumps(res))
        return

    require(*SB3)
    results = []
    for seed in args.seeds:  # interleave the libraries so machine noise hits both alike
        for lib in ("scalebox_ms", "sb3"):
            r = run_worker(lib, seed, args.steps)
            results.append(r)
            print(f"{lib:12s} seed {seed}: train {r['train_s']:6.1f} s  {r['steps_per_s']:7.0f} steps/s  "
                  f"eval {r['eval']:6.1f}  rss {r['rss_mb']:5.0f} MB  (process {r['process_s']:.1f} s)", flush=True)

    def agg(lib, key):
        return statistics.median(r[key] for r in results if r["lib"] == lib)

    print()
    print(f"{'':12s} {'train s':>8s} {'steps/s':>8s} {'eval':>7s} {'solved':>7s} {'rss MB':>7s} {'process s':>9s}")
    for lib in ("scalebox_ms", "sb3"):
        solved = sum(r["eval"] >= 475 for r in results if r["lib"] == lib)
        print(f"{lib:12s} {agg(lib, 'train_s'):8.1f} {agg(lib, 'steps_per_s'):8.0f} {agg(lib, 'eval'):7.1f} "
              f"{solved:>3d}/{len(args.seeds):<3d} {agg(lib, 'rss_mb'):7.0f} {agg(lib, 'process_s'):9.1f}")
    ratio = agg("scalebox_ms", "train_s") / agg("sb3", "train_s")
    pratio = agg("scalebox_ms", "process_s") / agg("sb3", "process_s")
    print(f"\nmedian wall-time ratio scalebox_ms / sb3: train {ratio:.2f}x, whole process {pratio:.2f}x "
          f"(sb3 is {1 / ratio:.2f}x slower)")
    import platform

    payload = {"steps": args.steps, "seeds": args.seeds, "runs": results, "median_train_ratio": ratio,
               "median_process_ratio": pratio, "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
               "date": time.strftime("%Y-%m-%d %H:%M")}
    atomic_write_json(args.out, payload)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
