"""scalebox_ms vs Stable-Baselines3 PPO on an Atari game, side by side in one script run.

Both train ``configs/ppo_atari.yaml``'s hyper-parameters (rl-zoo3's Atari PPO: 8 envs, n_steps 128, 4 epochs,
batch 256, linear lr 2.5e-4 and clip 0.1, vf 0.5, ent 0.01, NatureCNN) on the same ale-py env
(``ALE/Breakout-v5`` with ``frameskip=1`` for the preprocessing's own frame skip), SB3 with its ``AtariWrapper`` +
``VecFrameStack(4)``, scalebox_ms with ``env.preprocess: atari`` (docs/spaces.md#atari). Each library runs in its own
fresh process, one after the other. Reported per run:

* ``train_s``       wall time of the training call, compile included
* ``last100``       mean (and std) return of the last 100 training games (whole games, unclipped rewards: SB3's
                    ``Monitor`` below its wrappers, our ``GameStats``)
* ``curve``         every finished training game: (env step, seconds into training, return), for the plot

Needs the [bench] and [atari] extras:  pip install -e ".[bench,atari]"
Usage:  python benchmarks/compare_sb3_atari.py [--env ALE/Breakout-v5] [--steps 300000] [--seed 0]
            [--libs scalebox_ms sb3] [--out benchmarks/results/compare_sb3_atari.json]
            [--plot docs/img/atari_ppo_curves.png] [--plot-only]
Each run takes tens of minutes on 2 cores: run it in the background. Results are saved after each run.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from bench_args import ATARI, SB3, at_least, plot_path, require, results_to_plot  # noqa: E402 (on sys.path)

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)


def worker_scalebox(env_id: str, seed: int, steps: int) -> dict:
    import numpy as np

    from scalebox_ms.config import load_config
    from scalebox_ms.trainers import PPOTrainer
    from scalebox_ms.trainers.core import Callback

    cfg = load_config(os.path.join(REPO, "configs", "ppo_atari.yaml"),
                      [f"env.id={env_id}", f"run.seed={seed}", f"run.total_steps={steps}", "run.progress=false"])
    trainer = PPOTrainer(cfg)
    curve, t1 = [], time.perf_counter()

    class Curve(Callback):
        seen = 0

        def on_iteration_end(self, tr, metrics):
            new = tr.episodes - self.seen
            self.seen = tr.episodes
            returns = list(tr.episode_returns)[-new:] if new else []
            now = time.perf_counter() - t1
            curve.extend((tr.global_step, now, r) for r in returns)
            print(f"step {tr.global_step} {now:.0f}s games {tr.episodes} last100 "
                  f"{np.mean(tr.episode_returns) if tr.episode_returns else float('nan'):.2f}", file=sys.stderr,
                  flush=True)

    trainer.learn(callbacks=[Curve()])
    train_s = time.perf_counter() - t1
    last = [c[2] for c in curve[-100:]]
    return {"train_s": train_s, "steps": trainer.global_step, "games": len(curve),
            "last100": float(np.mean(last)) if last else None, "last100_std": float(np.std(last)) if last else None,
            "curve": curve}


def sb3_atari_ppo(env_id: str, seed: int, env_kwargs: dict = None):
    """SB3's PPO CnnPolicy at ``configs/ppo_atari.yaml``'s settings on ``AtariWrapper`` + ``VecFrameStack(4)``
    training envs; returns the model (its env is ``model.get_env()``)."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_atari_env
    from stable_baselines3.common.vec_env import VecFrameStack

    import ale_py  # noqa: F401  (registers the ALE ids)

    def linear(v):
        return lambda progress_remaining: progress_remaining * v

    env = VecFrameStack(make_atari_env(env_id, n_envs=8, seed=seed, env_kwargs={"frameskip": 1, **(env_kwargs or {})}),
                        n_stack=4)
    return PPO("CnnPolicy", env, n_steps=128, n_epochs=4, batch_size=256, learning_rate=linear(2.5e-4),
               clip_range=linear(0.1), vf_coef=0.5, ent_coef=0.01, seed=seed, device="cpu", verbose=0)


def sb3_atari_eval_env(env_id: str, seed: int, n_envs: int, env_kwargs: dict = None):
    """Evaluation envs as scalebox_ms evaluates Atari (``envs/atari.py``): whole games (no end of episode at a lost
    life), unclipped rewards, FIRE after reset, 4 stacked frames."""
    from stable_baselines3.common.env_util import make_atari_env
    from stable_baselines3.common.vec_env import VecFrameStack

    import ale_py  # noqa: F401

    return VecFrameStack(make_atari_env(env_id, n_envs=n_envs, seed=seed,
                                        env_kwargs={"frameskip": 1, **(env_kwargs or {})},
                                        wrapper_kwargs={"terminal_on_life_loss": False, "clip_reward": False}),
                         n_stack=4)


def worker_sb3(env_id: str, seed: int, steps: int) -> dict:
    import numpy as np

    from sb3_ppo import sb3_episode_curve

    model = sb3_atari_ppo(env_id, seed)
    curve, t1 = [], time.perf_counter()
    model.learn(total_timesteps=steps, callback=sb3_episode_curve(curve, t1))
    train_s = time.perf_counter() - t1
    last = [c[2] for c in curve[-100:]]
    return {"train_s": train_s, "steps": int(model.num_timesteps), "games": len(curve),
            "last100": float(np.mean(last)) if last else None, "last100_std": float(np.std(last)) if last else None,
            "curve": curve}


def plot(payload: dict, path: str, unit: str = "game") -> None:
    """Training returns (mean of the last 20 games or episodes) against env steps and against wall time, both
    libraries."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for lib, run in payload["runs"].items():
        curve = np.asarray(run["curve"], np.float64).reshape(-1, 3)
        if not len(curve):
            continue
        smooth = np.convolve(curve[:, 2], np.ones(20) / 20, mode="valid") if len(curve) >= 20 else curve[:, 2]
        for ax, col in zip(axes, (0, 1)):
            ax.plot(curve[len(curve) - len(smooth):, col], smooth, label=lib)
    axes[0].set_xlabel("env steps")
    axes[1].set_xlabel("training wall time (s)")
    for ax in axes:
        ax.set_ylabel(f"{unit} return (last 20 {unit}s)")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(f"PPO on {payload['env']}, {payload['steps']} steps, seed {payload['seed']} "
                 f"({payload['date']}, {payload['machine']['cpus']} CPUs)")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    print(f"wrote {path}")


DEFAULT_OUT = os.path.join(HERE, "results", "compare_sb3_atari.json")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--env", default="ALE/Breakout-v5")
    ap.add_argument("--steps", type=at_least(1), default=300_000)
    ap.add_argument("--seed", type=at_least(0), default=0)
    ap.add_argument("--libs", nargs="+", default=["scalebox_ms", "sb3"], choices=["scalebox_ms", "sb3"])
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--plot", help="learning-curve figure written from the results (default: "
                                   "docs/img/atari_ppo_curves.png with the default --out, else a .png next to --out)")
    ap.add_argument("--plot-only", action="store_true", help="only redraw --plot from --out")
    ap.add_argument("--worker", choices=["scalebox_ms", "sb3"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.plot = plot_path(args.plot, args.out, DEFAULT_OUT, os.path.join(REPO, "docs", "img", "atari_ppo_curves.png"))
    if args.plot_only:
        with open(results_to_plot(ap, args.out)) as f:
            plot(json.load(f), args.plot)
        return

    if args.worker:
        res = (worker_scalebox if args.worker == "scalebox_ms" else worker_sb3)(args.env, args.seed, args.steps)
        print(json.dumps(res))
        return

    require(*ATARI, *(SB3 if "sb3" in args.libs else ()))
    from scalebox_ms.fileio import atomic_write_json

    payload = {"env": args.env, "steps": args.steps, "seed": args.seed, "runs": {},
               "date": time.strftime("%Y-%m-%d %H:%M"), "machine": {"cpus": os.cpu_count()}}
    if os.path.exists(args.out):  # keep the other library's finished run
        with open(args.out) as f:
            old = json.load(f)
        if (old.get("env"), old.get("steps"), old.get("seed")) == (args.env, args.steps, args.seed):
            payload["runs"] = old.get("runs", {})
    for lib in args.libs:
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", lib, "--env", args.env, "--seed",
               str(args.seed), "--steps", str(args.steps)]
        t0 = time.perf_counter()
        out = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, cwd=REPO)
        if out.returncode != 0:
            raise SystemExit(f"{lib} failed (exit {out.returncode})")
        res = json.loads(out.stdout.strip().splitlines()[-1])
        res["process_s"] = time.perf_counter() - t0
        payload["runs"][lib] = res
        atomic_write_json(args.out, payload)  # saved as each run finishes
        print(f"{lib:12s} train {res['train_s']:7.0f} s  games {res['games']:4d}  last-100 return "
              f"{res['last100']} +- {res['last100_std']}", flush=True)
    runs = payload["runs"]
    if "scalebox_ms" in runs and "sb3" in runs:
        ratio = runs["scalebox_ms"]["train_s"] / runs["sb3"]["train_s"]
        print(f"wall-time ratio scalebox_ms / sb3: {ratio:.2f}x")
        payload["train_ratio"] = ratio
        atomic_write_json(args.out, payload)
    print(f"wrote {args.out}")
    os.makedirs(os.path.dirname(args.plot) or ".", exist_ok=True)
    plot(payload, args.plot)


if __name__ == "__main__":
    main()
