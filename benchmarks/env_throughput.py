"""Env engines side by side: gymnasium vs EnvPool vs scalebox_ms's native envs, env steps/s at growing env batches.

Two tables, one run:

* ``env``    the engine alone: random actions (drawn beforehand), ``step`` called in a Python loop, NEXT_STEP
             autoreset included. gymnasium: ``gymnasium.make_vec`` as scalebox_ms builds it (CartPole's own numpy
             vector env; MuJoCo: SyncVectorEnv); EnvPool: ``env.backend: envpool`` (:class:`EnvPoolVectorEnv`,
             EnvPool's C++ threads); native: one graph call per vector step (CartPole only; the compiled rollout
             steps it inside a graph loop instead, see ``native_throughput.py``).
* ``ppo``    PPO training steps/s, updates included, at the same settings per backend (4 epochs x 4 minibatches,
             graph update; native with its compiled rollout): median over the iterations after the first.

Atari (``ALE/Breakout-v5``) runs with ``env.preprocess: auto`` on both engines: gymnasium's wrappers
(envs/atari.py) vs EnvPool's C++ preprocessing, the same (4, 84, 84) uint8 frame stacks.

Usage:  python benchmarks/env_throughput.py [--seconds 2] [--envs CartPole-v1 ...] [--no-ppo]
        [--out benchmarks/results/env_throughput.json]
With --envs or --no-ppo the new rows replace the same rows of an existing --out file; the others are kept.
MuJoCo rows need the [mujoco] extra for gymnasium's HalfCheetah-v5 (EnvPool brings its own MuJoCo); Atari rows
the [atari] extra.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
from bench_args import above  # noqa: E402 (benchmarks/ is on sys.path)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
CASES = [("CartPole-v1", (1, 8, 64, 256, 1024)), ("HalfCheetah-v5", (1, 8, 32)), ("ALE/Breakout-v5", (1, 8))]


def env_steps_per_s(env_id: str, backend: str, num_envs: int, seconds: float) -> float:
    from scalebox_ms.envs import make_vec_env

    env = make_vec_env(env_id, num_envs, backend=backend, preprocess="auto")
    try:
        env.reset(seed=0)
        rng = np.random.default_rng(0)
        space = env.single_action_space
        if hasattr(space, "n"):
            actions = rng.integers(0, space.n, (64, num_envs))
        else:
            actions = rng.uniform(space.low, space.high, (64, num_envs) + space.shape).astype(np.float32)
        for a in actions[:8]:  # warm-up (native: compiles its step graph)
            env.step(a)
        steps, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            for a in actions:
                env.step(a)
            steps += len(actions) * num_envs
        return steps / (time.perf_counter() - start)
    finally:
        env.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=above(0), default=2.0, help="timed stepping per configuration")
    ap.add_argument("--iterations", type=int, default=4, help="PPO iterations per configuration")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "env_throughput.json"))
    ap.add_argument("--envs", nargs="+", choices=[c[0] for c in CASES], help="only these envs' rows")
    ap.add_argument("--no-ppo", action="store_true", help="skip the PPO table")
    args = ap.parse_args()
    if args.iterations < 2:  # (the first iteration compiles: the median is over the others)
        ap.error("--iterations: must be >= 2")
    from native_throughput import run

    from scalebox_ms.fileio import atomic_write_json

    env_rows, ppo_rows = [], []
    for env_id, sizes in CASES:
        if args.envs and env_id not in args.envs:
            continue
        for n in sizes:
            for backend in ("gymnasium", "envpool") + (("native",) if env_id == "CartPole-v1" else ()):
                r = {"env": env_id, "backend": backend, "num_envs": n,
                     "steps_per_s": env_steps_per_s(env_id, backend, n, args.seconds)}
                env_rows.append(r)
                print(f"env  {env_id:15s} N={n:5d} {backend:9s} {r['steps_per_s']:12,.0f} steps/s", flush=True)
    for n, t in () if args.no_ppo else ((8, 32), (256, 32), (1024, 16)):
        for backend, compiled in (("gymnasium", False), ("envpool", False), ("native", True)):
            r = run(backend, compiled, n, t, args.iterations)
            ppo_rows.append(r)
            print(f"ppo  CartPole-v1     N={n:5d} T={t:3d} {backend:9s} {r['steps_per_s']:12,.0f} steps/s", flush=True)
    result = {"env": env_rows, "ppo": ppo_rows, "date": time.strftime("%Y-%m-%d %H:%M"),
              "machine": {"cpus": os.cpu_count()}}
    if (args.envs or args.no_ppo) and os.path.exists(args.out):  # a partial run: keep the other rows
        with open(args.out) as f:
            old = json.load(f)
        keys = {(r["env"], r["backend"], r["num_envs"]) for r in env_rows}
        result["env"] = [r for r in old.get("env", []) if (r["env"], r["backend"], r["num_envs"]) not in keys] + env_rows
        result["ppo"] = ppo_rows or old.get("ppo", [])
        result["dates"] = {**old.get("dates", {"all": old.get("date")}),
                           **{env_id: result["date"] for env_id in {r["env"] for r in env_rows}}}
    atomic_write_json(args.out, result)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
