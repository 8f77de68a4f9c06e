"""scalebox_ms vs Stable-Baselines3 PPO on MuJoCo (HalfCheetah-v5, Hopper-v5), side by side in one script run.

Both train the preset's hyper-parameters (rl-zoo3's tuned HalfCheetah-v3 / Hopper-v3 entries: 1 env, VecNormalize
of observations and rewards, 256-256 ReLU actor and critic, log_std_init -2, no orthogonal init; neither entry uses
gSDE) for the same number of steps on gymnasium's v5 env. Each library runs in its own fresh process, one after
the other; SB3 keeps torch's default thread count (recorded). Reported per run:

* ``train_s``   wall time of the training call, compile included
* ``eval``      deterministic evaluation over ``--eval-episodes`` fresh episodes (observations normalised with the
                training statistics, rewards raw): mean and std
* ``curve``     every finished training episode: (env step, seconds into training, raw return), for the plot

Needs the [bench] and [mujoco] extras:  pip install -e ".[bench,mujoco]"
Usage:  python benchmarks/compare_sb3_mujoco.py [--env HalfCheetah-v5] [--steps 1000000] [--seed 0]
            [--libs scalebox_ms sb3] [--out benchmarks/results/compare_sb3_mujoco_<env>.json] [--plot-only]
Each run takes tens of minutes on 2 cores: run it in the background. Results are saved after each run.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from bench_args import MUJOCO, SB3, at_least, plot_path, require, results_to_plot  # noqa: E402 (on sys.path)

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
PRESETS = {"HalfCheetah-v5": "ppo_halfcheetah.yaml", "Hopper-v5": "ppo_hopper.yaml"}


def _preset(env_id: str):
    from scalebox_ms.config import load_config

    return load_config(os.path.join(REPO, "configs", PRESETS[env_id]))


def worker_scalebox(env_id: str, seed: int, steps: int, episodes: int) -> dict:
    import numpy as np

    from scalebox_ms.config import load_config
    from scalebox_ms.trainers import PPOTrainer
    from scalebox_ms.trainers.core import Callback
    from scalebox_ms.trainers.evaluation import evaluate_policy

    cfg = load_config(os.path.join(REPO, "configs", PRESETS[env_id]),
                      [f"run.seed={seed}", f"run.total_steps={steps}", "run.progress=false", "run.eval_episodes=0"])
    trainer = PPOTrainer(cfg)
    curve, t1 = [], time.perf_counter()

    class Curve(Callback):
        seen = 0

        def on_iteration_end(self, tr, metrics):
            new = tr.episodes - self.seen
            self.seen = tr.episodes
            now = time.perf_counter() - t1
            curve.extend((tr.global_step, now, r) for r in (list(tr.episode_returns)[-new:] if new else []))
            if tr.iteration % 50 == 0:
                print(f"step {tr.global_step} {now:.0f}s return {curve[-1][2] if curve else float('nan'):.0f}",
                      file=sys.stderr, flush=True)

    trainer.learn(callbacks=[Curve()])
    train_s = time.perf_counter() - t1
    rets = evaluate_policy(trainer, episodes=episodes, seed=10_000 + seed)
    return {"train_s": train_s, "steps": trainer.global_step, "eval": float(np.mean(rets)),
            "eval_std": float(np.std(rets)), "curve": curve}


def worker_sb3(env_id: str, seed: int, steps: int, episodes: int) -> dict:
    import numpy as np
    import torch
    from sb3_ppo import sb3_episode_curve, sb3_eval_env, sb3_ppo
    from stable_baselines3.common.evaluation import evaluate_policy

    cfg = _preset(env_id)
    model, env = sb3_ppo(cfg, seed)
    curve, t1 = [], time.perf_counter()
    model.learn(total_timesteps=steps, callback=sb3_episode_curve(curve, t1))
    train_s = time.perf_counter() - t1
    rets, _ = evaluate_policy(model, sb3_eval_env(cfg, env, 10_000 + seed), n_eval_episodes=episodes,
                              deterministic=True, return_episode_rewards=True)
    return {"train_s": train_s, "steps": int(model.num_timesteps), "eval": float(np.mean(rets)),
            "eval_std": float(np.std(rets)), "curve": curve, "torch_threads": torch.get_num_threads()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--env", default="HalfCheetah-v5", choices=sorted(PRESETS))
    ap.add_argument("--steps", type=at_least(1), default=1_000_000)
    ap.add_argument("--seed", type=at_least(0), default=0)
    ap.add_argument("--eval-episodes", type=at_least(1), default=10)
    ap.add_argument("--libs", nargs="+", default=["scalebox_ms", "sb3"], choices=["scalebox_ms", "sb3"])
    ap.add_argument("--out", default=None, help="default benchmarks/results/compare_sb3_mujoco_<env>.json")
    ap.add_argument("--plot", default=None, help="default docs/img/mujoco_ppo_<env>.png with the default --out, "
                                                 "else a .png next to --out")
    ap.add_argument("--plot-only", action="store_true", help="only redraw --plot from --out")
    ap.add_argument("--worker", choices=["scalebox_ms", "sb3"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    name = args.env.split("-")[0].lower()
    default_out = os.path.join(HERE, "results", f"compare_sb3_mujoco_{name}.json")
    out = args.out or default_out
    fig = plot_path(args.plot, out, default_out, os.path.join(REPO, "docs", "img", f"mujoco_ppo_{name}.png"))
    from compare_sb3_atari import plot  # the same two-panel learning-curve figure

    if args.plot_only:
        with open(results_to_plot(ap, out)) as f:
            plot(json.load(f), fig, "episode")
        return
    if args.worker:
        work = worker_scalebox if args.worker == "scalebox_ms" else worker_sb3
        print(json.dumps(work(args.env, args.seed, args.steps, args.eval_episodes)))
        return

    require(*MUJOCO, *(SB3 if "sb3" in args.libs else ()))
    from scalebox_ms.fileio import atomic_write_json

    payload = {"env": args.env, "steps": args.steps, "seed": args.seed, "preset": PRESETS[args.env], "runs": {},
               "date": time.strftime("%Y-%m-%d %H:%M"), "machine": {"cpus": os.cpu_count()}}
    if os.path.exists(out):  # keep the other library's finished run
        with open(out) as f:
            old = json.load(f)
        if (old.get("env"), old.get("steps"), old.get("seed")) == (args.env, args.steps, args.seed):
            payload["runs"] = old.get("runs", {})
    for lib in args.libs:
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", lib, "--env", args.env, "--seed",
               str(args.seed), "--steps", str(args.steps), "--eval-episodes", str(args.eval_episodes)]
        t0 = time.perf_counter()
        res = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
        if res.returncode != 0:
            raise SystemExit(f"{lib} failed (exit {res.returncode})")
        run = json.loads(res.stdout.strip().splitlines()[-1])
        run["process_s"] = time.perf_counter() - t0
        payload["runs"][lib] = run
        atomic_write_json(out, payload)  # saved as each run finishes
        print(f"{lib:12s} train {run['train_s']:7.0f} s  eval {run['eval']:8.1f} +- {run['eval_std']:.1f}", flush=True)
    runs = payload["runs"]
    if "scalebox_ms" in runs and "sb3" in runs:
        payload["train_ratio"] = runs["scalebox_ms"]["train_s"] / runs["sb3"]["train_s"]
        print(f"wall-time ratio scalebox_ms / sb3: {payload['train_ratio']:.2f}x")
        atomic_write_json(out, payload)
    print(f"wrote {out}")
    os.makedirs(os.path.dirname(fig) or ".", exist_ok=True)
    plot(payload, fig, "episode")


if __name__ == "__main__":
    main()
