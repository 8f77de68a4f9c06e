"""Time-to-solve: wall time from process start until the deterministic eval mean first reaches the task's threshold,
scalebox_ms presets vs Stable-Baselines3 2.9 (PPO, DQN, SAC, TD3) at the same hyper-parameters, back to back on one
machine.

For every task, each scalebox_ms preset of its family and SB3 (at the hyper-parameters of the task's rl-zoo3 preset,
built by ``sb3_ppo.py``; no gSDE, which scalebox_ms does not have) train seed by seed, each run in a fresh process.
Every ``eval_every`` env steps (at the first iteration end at or past each multiple, SB3: the next rollout start,
i.e. after the update) the policy plays ``--episodes`` deterministic episodes on fresh gymnasium envs, observations
normalised with the training statistics; a run stops at the first evaluation at or above the threshold, or at the
preset's ``run.total_steps`` (also the horizon of linear schedules, the same for both libraries).

Reported per run (time spent in evaluations is excluded from both figures and reported separately):

* ``e2e_s``    from the moment the parent launched the process (interpreter start, imports, env and model set-up,
               compile included) to the solving evaluation
* ``train_s``  from the start of the training call to the solving evaluation
* ``steps``    env steps used; ``curve``: (step, e2e_s, eval mean) of every evaluation

Per (task, preset): median/min/max of both times over the seeds that solved, and how many solved.

Needs the [bench] extra:  pip install -e ".[bench]" (and [atari] for ``--tasks breakout``)
Usage:  python benchmarks/time_to_solve.py [--tasks cartpole acrobot pendulum dqn_cartpole sac_pendulum
            dqn_acrobot td3_pendulum breakout]
            [--seeds 0 1 2] [--episodes 10]
            [--libs scalebox_ms sb3] [--out benchmarks/results/time_to_solve.json]
            [--plot docs/img/time_to_solve.png] [--plot-only]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from bench_args import ATARI, SB3, at_least, plot_path, require, results_to_plot  # noqa: E402 (on sys.path)

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

# the first preset of each task is rl-zoo3's: SB3 trains at its hyper-parameters (PPO: built from the preset by
# sb3_ppo.py; off-policy: compare_sb3_offpolicy.make_sb3_model's task of that name) for its run.total_steps
TASKS = {
    "cartpole": {"env": "CartPole-v1", "threshold": 475.0, "eval_every": 8192,
                 "presets": ["ppo_cartpole.yaml", "ppo_cartpole_native.yaml", "ppo_cartpole_fast.yaml"]},
    "acrobot": {"env": "Acrobot-v1", "threshold": -100.0, "eval_every": 16384,
                "presets": ["ppo_acrobot.yaml", "ppo_acrobot_fast.yaml"]},
    "pendulum": {"env": "Pendulum-v1", "threshold": -200.0, "eval_every": 8192,
                 "presets": ["ppo_pendulum.yaml", "ppo_pendulum_native.yaml", "ppo_pendulum_fast.yaml"]},
    "dqn_cartpole": {"env": "CartPole-v1", "threshold": 475.0, "eval_every": 2500,
                     "presets": ["dqn_cartpole.yaml", "dqn_cartpole_fast.yaml"], "sb3": "dqn_cartpole"},
    "sac_pendulum": {"env": "Pendulum-v1", "threshold": -200.0, "eval_every": 1000,
                     "presets": ["sac_pendulum.yaml", "sac_pendulum_native.yaml", "sac_pendulum_fast.yaml"],
                     "sb3": "sac_pendulum"},
    "dqn_acrobot": {"env": "Acrobot-v1", "threshold": -100.0, "eval_every": 5000,
                    "presets": ["dqn_acrobot.yaml", "dqn_acrobot_fast.yaml"], "sb3": "dqn_acrobot"},
    "td3_pendulum": {"env": "Pendulum-v1", "threshold": -200.0, "eval_every": 1000,
                     "presets": ["td3_pendulum.yaml", "td3_pendulum_fast.yaml"], "sb3": "td3_pendulum"},
    # Breakout is not "solved" on 2 cores: the bar is a whole game's score of 5 (a random policy scores ~1.5), within
    # a budget of 300k of rl-zoo3's 10M steps (also the linear schedules' horizon, for both libraries). Games end
    # after 18,000 frames (5 minutes of play), in training and evaluation alike: a greedy policy that never
    # presses FIRE after a lost life would otherwise play on to ALE's 108,000 frames. Not in the default tasks
    # (~40 minutes per seed for the two libraries): run it with --tasks breakout.
    "breakout": {"env": "ALE/Breakout-v5", "threshold": 5.0, "eval_every": 50_000, "episodes": 8,
                 "total_steps": 300_000, "env_kwargs": {"max_num_frames_per_episode": 18_000},
                 "presets": ["ppo_atari.yaml"], "sb3": "ppo_atari"},
}
DEFAULT_TASKS = ["cartpole", "acrobot", "pendulum", "dqn_cartpole", "sac_pendulum", "dqn_acrobot", "td3_pendulum"]


def _config(task: dict, preset: str, seed: int):
    from scalebox_ms.config import load_config

    overrides = [f"run.seed={seed}", "run.progress=false", "run.eval_episodes=0", "run.checkpoint_every=0",
                 "run.eval_every=0", "run.stop_return=null"]  # (the suite evaluates on its own clock)
    if "total_steps" in task:
        overrides.append(f"run.total_steps={task['total_steps']}")
    overrides += [f"env.kwargs.{key}={value}" for key, value in task.get("env_kwargs", {}).items()]
    return load_config(os.path.join(REPO, "configs", preset), overrides)


def _episodes(task: dict, episodes: int) -> int:
    return task.get("episodes", episodes)


def worker_scalebox(task: dict, preset: str, seed: int, episodes: int, launched: float) -> dict:
    from scalebox_ms.trainers import make_trainer
    from scalebox_ms.trainers.callbacks import EvalCallback

    trainer = make_trainer(_config(task, preset, seed))
    setup_s = time.time() - launched
    evals = EvalCallback(task["eval_every"], _episodes(task, episodes), task["threshold"], seed=10_000 + seed)
    trainer.learn(callbacks=[evals])
    last = evals.history[-1] if evals.history else None
    if (last is None or last["mean"] < task["threshold"]) and (last is None or last["step"] != trainer.global_step):
        evals._next = 0  # the last iteration's evaluation, as SB3's worker has its last update's (below)
        evals.on_iteration_end(trainer, {})
    curve = [(h["step"], setup_s + h["train_s"], h["mean"]) for h in evals.history]
    return _result(curve, setup_s, evals.eval_s, task["threshold"], trainer.global_step)


def worker_sb3(task: dict, preset: str, seed: int, episodes: int, launched: float) -> dict:
    import numpy as np
    import torch
    from sb3_ppo import sb3_eval_env, sb3_ppo
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.evaluation import evaluate_policy

    cfg = _config(task, preset, seed)
    episodes = _episodes(task, episodes)
    if task.get("sb3") == "ppo_atari":  # CnnPolicy on SB3's Atari wrappers, as compare_sb3_atari.py builds it
        from compare_sb3_atari import sb3_atari_eval_env, sb3_atari_ppo

        model = sb3_atari_ppo(task["env"], seed, task.get("env_kwargs"))
        eval_env = sb3_atari_eval_env(task["env"], 10_000 + seed, min(episodes, 16), task.get("env_kwargs"))
    else:
        if "sb3" in task:  # an off-policy task: rl-zoo3's settings as compare_sb3_offpolicy.py builds them
            from compare_sb3_offpolicy import make_sb3_model

            model = make_sb3_model(task["sb3"], seed)
            env = model.get_env()
        else:
            model, env = sb3_ppo(cfg, seed)
        eval_env = sb3_eval_env(cfg, env, 10_000 + seed, n_envs=min(episodes, 16))
    setup_s = time.time() - launched
    every, curve, spent = task["eval_every"], [], [0.0]
    t_start = time.perf_counter()

    class Evaluate(BaseCallback):
        next_at, solved = every, False

        def _on_rollout_start(self):  # SB3 calls it after the update(s) of the previous rollout (train_freq cycle)
            if self.num_timesteps < self.next_at:
                return
            t0 = time.perf_counter()
            rets, _ = evaluate_policy(model, eval_env, n_eval_episodes=episodes, deterministic=True,
                                      return_episode_rewards=True)
            took = time.perf_counter() - t0
            curve.append((int(self.num_timesteps), setup_s + t0 - t_start - spent[0], float(np.mean(rets))))
            spent[0] += took
            self.next_at = (self.num_timesteps // every + 1) * every
            self.solved = curve[-1][2] >= task["threshold"]

        def _on_step(self):
            return not self.solved

    cb = Evaluate()
    model.learn(total_timesteps=cfg.run.total_steps, callback=cb)
    if not cb.solved:  # the last update's evaluation, as worker_scalebox has its last iteration's
        cb.next_at = 0
        cb._on_rollout_start()
    res = _result(curve, setup_s, spent[0], task["threshold"], int(model.num_timesteps))
    res["torch_threads"] = torch.get_num_threads()
    return res


def _result(curve, setup_s, eval_s, threshold, steps) -> dict:
    solved = next(((step, e2e) for step, e2e, mean in curve if mean >= threshold), None)
    return {"solved": solved is not None, "steps": solved[0] if solved else steps,
            "e2e_s": solved[1] if solved else None, "train_s": solved[1] - setup_s if solved else None,
            "setup_s": setup_s, "eval_s": eval_s, "best": max((c[2] for c in curve), default=None), "curve": curve}


def _summary(runs: list) -> dict:
    done = [r for r in runs if r["solved"]]
    out = {"solved": f"{len(done)}/{len(runs)}"}
    for key in ("e2e_s", "train_s", "steps"):
        vals = [r[key] for r in done]
        if vals:
            out[key] = {"median": statistics.median(vals), "min": min(vals), "max": max(vals)}
    return out


def plot(payload: dict, path: str) -> None:
    """Eval return against end-to-end wall time, one panel per task; SB3 in black, each preset its own colour."""
    import math

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    tasks = [t for t in TASKS if t in payload["results"]]
    cols = min(3, len(tasks))
    rows = math.ceil(len(tasks) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 3.9 * rows), squeeze=False)
    for ax in axes.flat[len(tasks):]:
        ax.set_visible(False)
    for ax, task in zip(axes.flat, tasks):
        presets = TASKS[task]["presets"]
        for label, entry in payload["results"][task].items():
            color = "black" if entry["lib"] == "sb3" else f"C{presets.index(entry['preset'])}"
            for j, run in enumerate(entry["runs"]):
                xs, ys = [c[1] for c in run["curve"]], [c[2] for c in run["curve"]]
                ax.plot(xs, ys, color=color, alpha=0.75, label=label if j == 0 else None, marker=".")
        ax.axhline(TASKS[task]["threshold"], color="grey", ls="--", lw=1)
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("s from process start (evaluations excluded)")
        ax.set_ylabel("deterministic eval return")
        ax.set_title(f"{task.split('_')[0].upper() if '_' in task else 'PPO'} {TASKS[task]['env']}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"time to solve, {payload['episodes']} eval episodes ({payload['date']}, "
                 f"{payload['machine']['cpus']} CPUs)")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    print(f"wrote {path}")


DEFAULT_OUT = os.path.join(HERE, "results", "time_to_solve.json")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", nargs="+", default=DEFAULT_TASKS, choices=list(TASKS))
    ap.add_argument("--seeds", nargs="+", type=at_least(0), default=[0, 1, 2])
    ap.add_argument("--episodes", type=at_least(1), default=10)
    ap.add_argument("--libs", nargs="+", default=["scalebox_ms", "sb3"], choices=["scalebox_ms", "sb3"])
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--plot", help="the figure (default: docs/img/time_to_solve.png with the default --out, else a "
                                   ".png next to --out)")
    ap.add_argument("--plot-only", action="store_true", help="only redraw --plot from --out")
    ap.add_argument("--worker", nargs=5, metavar=("LIB", "TASK", "PRESET", "SEED", "LAUNCHED"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.plot = plot_path(args.plot, args.out, DEFAULT_OUT, os.path.join(REPO, "docs", "img", "time_to_solve.png"))
    if args.plot_only:
        with open(results_to_plot(ap, args.out)) as f:
            plot(json.load(f), args.plot)
        return
    if args.worker:
        lib, task, preset, seed, launched = args.worker
        work = worker_scalebox if lib == "scalebox_ms" else worker_sb3
        print(json.dumps(work(TASKS[task], preset, int(seed), args.episodes, float(launched))))
        return

    require(*(SB3 if "sb3" in args.libs else ()), *(ATARI if "breakout" in args.tasks else ()))
    from scalebox_ms.fileio import atomic_write_json

    payload = {"episodes": args.episodes, "seeds": args.seeds, "results": {}, "tasks": {t: TASKS[t] for t in TASKS},
               "date": time.strftime("%Y-%m-%d %H:%M"), "machine": {"cpus": os.cpu_count()}}
    payload["task_dates"] = {}
    if os.path.exists(args.out):  # keep the other tasks' results
        with open(args.out) as f:
            old = json.load(f)
        payload["results"], payload["task_dates"] = old.get("results", {}), old.get("task_dates", {})
    for task in args.tasks:
        spec = TASKS[task]
        jobs = [(lib, preset) for lib in args.libs
                for preset in (spec["presets"] if lib == "scalebox_ms" else spec["presets"][:1])]
        results = dict(payload["results"].get(task, {}))  # (a library run before, to the same --out, stays)
        for lib, preset in jobs:
            label = f"{lib} {preset}" if lib == "scalebox_ms" else f"sb3 ({preset})"
            runs = []
            for seed in args.seeds:
                launched = time.time()
                cmd = [sys.executable, os.path.abspath(__file__), "--episodes", str(args.episodes),
                       "--worker", lib, task, preset, str(seed), repr(launched)]
                out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                if out.returncode != 0:
                    raise SystemExit(f"{label} seed {seed} failed:\n{out.stderr[-3000:]}")
                run = json.loads(out.stdout.strip().splitlines()[-1])
                run["seed"], run["process_s"] = seed, time.time() - launched
                runs.append(run)
                print(f"{task:9s} {label:38s} seed {seed}: " + (
                    f"solved at {run['steps']:>8d} steps, {run['e2e_s']:7.2f} s end to end, {run['train_s']:7.2f} s "
                    f"training" if run["solved"] else f"not solved in {run['steps']} steps (best {run['best']})"),
                    flush=True)
            # (its own seeds and episodes: an entry kept from an earlier run to this --out may have others)
            results[label] = {"lib": lib, "preset": preset, "runs": runs, "seeds": args.seeds,
                              "episodes": args.episodes, **_summary(runs)}
            payload["results"][task] = results
            payload["task_dates"][task] = time.strftime("%Y-%m-%d %H:%M")
            atomic_write_json(args.out, payload)  # saved as each (library, preset) finishes
        sb3 = next((r for r in results.values() if r["lib"] == "sb3"), None)
        for label, entry in results.items():
            if sb3 and entry["lib"] == "scalebox_ms" and "e2e_s" in entry and "e2e_s" in sb3:
                entry["e2e_ratio_vs_sb3"] = entry["e2e_s"]["median"] / sb3["e2e_s"]["median"]
                print(f"{task:9s} {label:38s} median end-to-end {entry['e2e_s']['median']:.2f} s = "
                      f"{entry['e2e_ratio_vs_sb3']:.2f}x SB3's {sb3['e2e_s']['median']:.2f} s")
        atomic_write_json(args.out, payload)
    print(f"wrote {args.out}")
    os.makedirs(os.path.dirname(args.plot) or ".", exist_ok=True)
    plot(payload, args.plot)


if __name__ == "__main__":
    main()
