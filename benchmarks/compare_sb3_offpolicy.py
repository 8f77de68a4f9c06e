"""scalebox_ms vs Stable-Baselines3 off-policy trainers (DQN, SAC, TD3), side by side in one script run.

Both sides use rl-zoo3's tuned hyper-parameters, one env, SB3 on the CPU:

* ``dqn_cartpole``         DQN, CartPole-v1, 50k steps: lr 2.3e-3, batch 64, buffer 100k, learning_starts 1000,
  gamma 0.99, target_update_interval 10, train_freq 256, gradient_steps 128, exploration_fraction 0.16,
  exploration_final_eps 0.04, net [256, 256]. Ours: configs/dqn_cartpole.yaml.
* ``sac_pendulum``         SAC, Pendulum-v1, 20k steps: lr 1e-3, otherwise SB3's defaults (buffer 1e6,
  learning_starts 100, batch 256, tau 0.005, gamma 0.99, train_freq 1, gradient_steps 1, ent_coef auto,
  net [256, 256]). Ours: configs/sac_pendulum.yaml.
* ``sac_pendulum_native``  ours only: configs/sac_pendulum_native.yaml steps scalebox_ms's MindSpore-native
  Pendulum (evaluation still runs on gymnasium's Pendulum-v1); compared by env steps/s, updates included, with
  SB3's ``sac_pendulum`` run (gymnasium Pendulum-v1), which is run once per seed and shared by both tasks.
* ``sac_halfcheetah``      (not run by default; the [mujoco] extra) SAC, HalfCheetah-v5, 200k steps (issue 14's
  comparison; rl-zoo3 trains 1M): learning_starts 10000, SB3's defaults otherwise (lr 3e-4, buffer 1e6, batch 256,
  tau 0.005, gamma 0.99, train_freq 1, gradient_steps 1, ent_coef auto, net [256, 256]). Ours:
  configs/sac_halfcheetah.yaml at 200k steps. ~25 min per library here: run it alone.
* ``td3_pendulum``         (not run by default) TD3, Pendulum-v1, 20k steps: gamma 0.98, buffer 200k,
  learning_starts 10k, Gaussian action noise sigma 0.1, train_freq 1, gradient_steps 1, lr 1e-3,
  net [400, 300]. Ours: configs/td3_pendulum.yaml.

Each (library, task, seed) runs in its own fresh process (in a fresh temporary directory, removed afterwards),
one after another with the libraries interleaved, so peak RSS and wall time belong to that run alone. torch
keeps its default thread count (recorded per SB3 run as ``torch_threads``). Reported per run:

* ``train_s``   wall time of the training call (SB3 ``learn``; our ``trainer.learn``), compile included
* ``steps/s``   env steps / train_s (gradient updates included)
* ``eval``      deterministic evaluation mean over 20 episodes on fresh gymnasium envs, seed 10_000 + seed
* ``rss_mb``    peak resident memory of the process

Ratio lines: per task the median train-time ratio scalebox_ms / SB3; for ``sac_pendulum_native`` the median
env-steps/s ratio scalebox_ms (native env) / SB3 SAC (gymnasium env).

Needs the [bench] extra:  pip install -e ".[bench]"
Usage:  python benchmarks/compare_sb3_offpolicy.py [--tasks dqn_cartpole sac_pendulum sac_pendulum_native
        td3_pendulum] [--seeds 0 1 2] [--steps N] [--out benchmarks/results/compare_sb3_offpolicy.json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from bench_args import MUJOCO, SB3, at_least, require  # noqa: E402 (benchmarks/ is on sys.path)
from scalebox_ms.fileio import atomic_write_json
from scalebox_ms.sandbox import peak_rss_bytes

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
EVAL_EPISODES = 20
LIBS = ("scalebox_ms", "sb3")

# env: the gymnasium env both sides are evaluated on (and SB3 trains on); steps: rl-zoo3's n_timesteps (SB3's
# default here; ours run their config's run.total_steps unless --steps is given); config: our config file;
# sb3: the SB3 task whose runs this task is compared with.
TASKS = {
    "dqn_cartpole": {"env": "CartPole-v1", "steps": 50_000, "config": "dqn_cartpole.yaml", "sb3": "dqn_cartpole"},
    "dqn_acrobot": {"env": "Acrobot-v1", "steps": 100_000, "config": "dqn_acrobot.yaml", "sb3": "dqn_acrobot"},
    "sac_pendulum": {"env": "Pendulum-v1", "steps": 20_000, "config": "sac_pendulum.yaml", "sb3": "sac_pendulum"},
    "sac_pendulum_native": {"env": "Pendulum-v1", "steps": 20_000, "config": "sac_pendulum_native.yaml",
                            "sb3": "sac_pendulum"},
    "td3_pendulum": {"env": "Pendulum-v1", "steps": 20_000, "config": "td3_pendulum.yaml", "sb3": "td3_pendulum"},
    # (ours_steps: our run's length when --steps is not given, instead of the config's run.total_steps)
    "sac_halfcheetah": {"env": "HalfCheetah-v5", "mujoco": True, "steps": 200_000, "ours_steps": 200_000,
                        "config": "sac_halfcheetah.yaml", "sb3": "sac_halfcheetah"},
}
DEFAULT_TASKS = ["dqn_cartpole", "sac_pendulum", "sac_pendulum_native"]


def worker_scalebox(task: str, seed: int, steps: int | None) -> dict:
    t0 = time.perf_counter()
    import numpy as np

    from scalebox_ms.config import load_config
    from scalebox_ms.trainers import make_trainer
    from scalebox_ms.trainers.evaluation import evaluate_policy

    steps = steps or TASKS[task].get("ours_steps")
    overrides = [f"run.seed={seed}", "run.progress=false"] + ([f"run.total_steps={steps}"] if steps else [])
    cfg = load_config(os.path.join(REPO, "configs", TASKS[task]["config"]), overrides)
    trainer = make_trainer(cfg)
    t_import = time.perf_counter() - t0
    t1 = time.perf_counter()
    trainer.learn()
    train_s = time.perf_counter() - t1
    rets = evaluate_policy(trainer, episodes=EVAL_EPISODES, seed=10_000 + seed)
    return {"train_s": train_s, "setup_s": t_import, "steps": int(trainer.global_step), "eval": float(np.mean(rets))}


def make_sb3_model(task: str, seed: int):
    """SB3 model for ``task`` with rl-zoo3's hyper-parameters (hyperparams/{dqn,sac,td3}.yml), on the CPU."""
    import numpy as np
    from stable_baselines3 import DQN, SAC, TD3
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.noise import NormalActionNoise

    env = make_vec_env(TASKS[task]["env"], n_envs=1, seed=seed)
    common = {"seed": seed, "device": "cpu", "verbose": 0}
    if task == "dqn_cartpole":
        return DQN("MlpPolicy", env, learning_rate=2.3e-3, batch_size=64, buffer_size=100_000, learning_starts=1000,
                   gamma=0.99, target_update_interval=10, train_freq=256, gradient_steps=128,
                   exploration_fraction=0.16, exploration_final_eps=0.04, policy_kwargs={"net_arch": [256, 256]},
                   **common)
    if task == "dqn_acrobot":  # (gradient_steps -1: as many gradient steps as env steps per train_freq cycle)
        return DQN("MlpPolicy", env, learning_rate=6.3e-4, batch_size=128, buffer_size=50_000, learning_starts=0,
                   gamma=0.99, target_update_interval=250, train_freq=4, gradient_steps=-1,
                   exploration_fraction=0.12, exploration_final_eps=0.1, policy_kwargs={"net_arch": [256, 256]},
                   **common)
    if task == "sac_pendulum":  # rl-zoo3 sets only learning_rate; the rest are SB3's defaults, spelt out
        return SAC("MlpPolicy", env, learning_rate=1e-3, buffer_size=1_000_000, learning_starts=100, batch_size=256,
                   tau=0.005, gamma=0.99, train_freq=1, gradient_steps=1, ent_coef="auto",
                   policy_kwargs={"net_arch": [256, 256]}, **common)
    if task == "sac_halfcheetah":  # rl-zoo3 sets only learning_starts
        return SAC("MlpPolicy", env, learning_rate=3e-4, buffer_size=1_000_000, learning_starts=10_000,
                   batch_size=256, tau=0.005, gamma=0.99, train_freq=1, gradient_steps=1, ent_coef="auto",
                   policy_kwargs={"net_arch": [256, 256]}, **common)
    if task == "td3_pendulum":
        n_actions = env.action_space.shape[-1]
        noise = NormalActionNoise(mean=np.zeros(n_actions), sigma=0.1 * np.ones(n_actions))
        return TD3("MlpPolicy", env, learning_rate=1e-3, buffer_size=200_000, learning_starts=10_000, gamma=0.98,
                   train_freq=1, gradient_steps=1, action_noise=noise, policy_kwargs={"net_arch": [400, 300]},
                   **common)
    raise ValueError(f"no SB3 model for task {task!r}")


def worker_sb3(task: str, seed: int, steps: int | None) -> dict:
    t0 = time.perf_counter()
    import stable_baselines3
    import torch
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy

    model = make_sb3_model(task, seed)
    t_import = time.perf_counter() - t0
    t1 = time.perf_counter()
    model.learn(total_timesteps=steps or TASKS[task]["steps"])
    train_s = time.perf_counter() - t1
    eval_env = make_vec_env(TASKS[task]["env"], n_envs=1, seed=10_000 + seed)
    mean, _ = evaluate_policy(model, eval_env, n_eval_episodes=EVAL_EPISODES, deterministic=True)
    return {"train_s": train_s, "setup_s": t_import, "steps": int(model.num_timesteps), "eval": float(mean),
            "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
            "sb3": stable_baselines3.__version__}


def run_worker(lib: str, task: str, seed: int, steps: int | None) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", lib, "--task", task, "--seed", str(seed)]
    if steps:
        cmd += ["--steps", str(steps)]
    # a fresh cwd per run: MindSpore writes kernel_meta/ (and a trainer may write runs/) into the cwd
    with tempfile.TemporaryDirectory(prefix="compare_sb3_offpolicy-") as cwd:
        t0 = time.perf_counter()
        out = subprocess.run(cmd, check=False, capture_output=True, text=True, cwd=cwd)
        wall = time.perf_counter() - t0
    if out.returncode != 0:
        raise SystemExit(f"{lib} {task} seed {seed} failed:\n{out.stderr[-3000:]}")
    res = json.loads(out.stdout.strip().splitlines()[-1])
    res.update({"lib": lib, "task": task, "seed": seed, "process_s": wall})
    res["steps_per_s"] = res["steps"] / res["train_s"]
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", nargs="+", choices=list(TASKS), default=DEFAULT_TASKS)
    ap.add_argument("--seeds", type=at_least(0), nargs="+", default=[0])
    ap.add_argument("--steps", type=int, default=None,
                    help="env steps for every task (default: rl-zoo3's per task for SB3, the config's for ours)")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "compare_sb3_offpolicy.json"))
    ap.add_argument("--worker", choices=LIBS, help=argparse.SUPPRESS)
    ap.add_argument("--task", choices=list(TASKS), default="dqn_cartpole", help=argparse.SUPPRESS)
    ap.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.steps is not None and args.steps < 1:
        ap.error(f"--steps: must be >= 1, got {args.steps}")

    if args.worker:
        if args.worker == "sb3" and TASKS[args.task]["sb3"] != args.task:
            ap.error(f"--task {args.task} has no SB3 run of its own (it is compared with {TASKS[args.task]['sb3']})")
        res = (worker_scalebox if args.worker == "scalebox_ms" else worker_sb3)(args.task, args.seed, args.steps)
        res["rss_mb"] = peak_rss_bytes() / 2.0 ** 20
        print(json.dumps(res))
        return

    tasks = list(dict.fromkeys(args.tasks))
    require(*SB3, *(MUJOCO if any(TASKS[t].get("mujoco") for t in tasks) else ()))
    config_dir = os.path.join(REPO, "configs")
    missing = [TASKS[t]["config"] for t in tasks if not os.path.isfile(os.path.join(config_dir, TASKS[t]["config"]))]
    if missing:
        raise SystemExit(f"config(s) not found in {config_dir}: {', '.join(missing)}")

    results = []
    partial = args.out + ".partial"  # the runs so far, rewritten after each one (long tasks); removed at the end
    for seed in args.seeds:  # interleave the libraries so machine noise hits both alike
        done = set()
        for task in tasks:
            for lib, run_task in (("scalebox_ms", task), ("sb3", TASKS[task]["sb3"])):
                if (lib, run_task) in done:  # sac_pendulum's SB3 run serves sac_pendulum_native too
                    continue
                done.add((lib, run_task))
                r = run_worker(lib, run_task, seed, args.steps)
                results.append(r)
                print(f"{lib:12s} {run_task:20s} seed {seed}: train {r['train_s']:7.1f} s  "
                      f"{r['steps_per_s']:6.0f} steps/s  eval {r['eval']:7.1f}  rss {r['rss_mb']:5.0f} MB  "
                      f"(process {r['process_s']:.1f} s)", flush=True)
                atomic_write_json(partial, {"runs": results, "complete": False})

    def agg(lib, task, key):
        return statistics.median(r[key] for r in results if r["lib"] == lib and r["task"] == task)

    import gymnasium

    print()
    print(f"{'':12s} {'task':20s} {'steps':>7s} {'train s':>8s} {'steps/s':>8s} {'eval':>7s} {'solved':>7s} "
          f"{'rss MB':>7s} {'process s':>9s}")
    ratios = {}
    for task in tasks:
        threshold = gymnasium.spec(TASKS[task]["env"]).reward_threshold
        for lib, run_task in (("scalebox_ms", task), ("sb3", TASKS[task]["sb3"])):
            runs = [r for r in results if r["lib"] == lib and r["task"] == run_task]
            solved = (f"{sum(r['eval'] >= threshold for r in runs):>3d}/{len(runs):<3d}" if threshold is not None
                      else f"{'-':>7s}")
            print(f"{lib:12s} {run_task:20s} {agg(lib, run_task, 'steps'):7.0f} {agg(lib, run_task, 'train_s'):8.1f} "
                  f"{agg(lib, run_task, 'steps_per_s'):8.0f} {agg(lib, run_task, 'eval'):7.1f} {solved} "
                  f"{agg(lib, run_task, 'rss_mb'):7.0f} {agg(lib, run_task, 'process_s'):9.1f}")
        sb3_task = TASKS[task]["sb3"]
        ratios[task] = {
            "sb3_task": sb3_task,
            "median_train_ratio": agg("scalebox_ms", task, "train_s") / agg("sb3", sb3_task, "train_s"),
            "median_process_ratio": agg("scalebox_ms", task, "process_s") / agg("sb3", sb3_task, "process_s"),
            "median_steps_per_s_ratio": agg("scalebox_ms", task, "steps_per_s") / agg("sb3", sb3_task, "steps_per_s"),
        }

    print()
    for task, q in ratios.items():
        ours_steps, sb3_steps = agg("scalebox_ms", task, "steps"), agg("sb3", q["sb3_task"], "steps")
        if task == "sac_pendulum_native":
            print(f"{task}: median env steps/s ratio scalebox_ms (native env) / sb3 SAC (gymnasium env): "
                  f"{q['median_steps_per_s_ratio']:.2f}x")
        else:
            ratio = q["median_train_ratio"]
            print(f"{task}: median train-time ratio scalebox_ms / sb3: {ratio:.2f}x "
                  f"(scalebox_ms at {1 / ratio:.2f}x SB3's speed), whole process {q['median_process_ratio']:.2f}x")
        if abs(ours_steps - sb3_steps) > 0.01 * sb3_steps:
            print(f"  note: scalebox_ms ran {ours_steps:.0f} steps, sb3 {sb3_steps:.0f}: compare steps/s "
                  f"({q['median_steps_per_s_ratio']:.2f}x), not train time")
    import platform

    sb3_runs = [r for r in results if r["lib"] == "sb3"]
    payload = {"tasks": tasks, "steps": args.steps, "default_steps": {t: TASKS[t]["steps"] for t in tasks},
               "seeds": args.seeds, "runs": results, "ratios": ratios,
               "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                           "torch_threads": sorted({r["torch_threads"] for r in sb3_runs})},
               "date": time.strftime("%Y-%m-%d %H:%M")}
    atomic_write_json(args.out, payload)
    os.remove(partial)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
