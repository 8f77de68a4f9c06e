"""What gymnasium's info batching costs: a SyncVectorEnv's step with each sub-env's info as the env returns it,
and cut to what scalebox_ms reads (:class:`scalebox_ms.envs.atari.OnlyGameEnd`, as ``make_vec_env`` builds it),
in one run: microseconds per vector step (random actions drawn beforehand).

Usage:  python benchmarks/info_batching.py [--envs HalfCheetah-v5 Pendulum-v1] [--num-envs 8] [--steps 2000]
HalfCheetah-v5 needs the [mujoco] extra.
"""
from __future__ import annotations

import argparse
import json
import time

from bench_args import at_least  # noqa: E402 (benchmarks/ is on sys.path)
import gymnasium as gym
import numpy as np

from scalebox_ms.envs.atari import OnlyGameEnd


def us_per_step(env_id: str, num_envs: int, steps: int, cut: bool) -> float:
    env = gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="sync", wrappers=[OnlyGameEnd] if cut else None)
    try:
        env.reset(seed=0)
        actions = [env.action_space.sample() for _ in range(100)]
        t0 = time.perf_counter()
        for i in range(steps):
            env.step(actions[i % 100])
        return (time.perf_counter() - t0) / steps * 1e6
    finally:
        env.close()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--envs", nargs="+", default=["HalfCheetah-v5", "Pendulum-v1"])
    p.add_argument("--num-envs", type=at_least(1), default=8)
    p.add_argument("--steps", type=at_least(1), default=2000)
    args = p.parse_args(argv)
    unknown = [e for e in args.envs if e not in gym.registry]
    if unknown:
        p.error(f"--envs: {', '.join(unknown)}: not a registered gymnasium env id")
    rows = []
    for env_id in args.envs:
        full, cut = (us_per_step(env_id, args.num_envs, args.steps, c) for c in (False, True))
        rows.append({"env": env_id, "num_envs": args.num_envs, "us_per_step_info": round(full, 1),
                     "us_per_step_cut": round(cut, 1), "cut_over_info": round(cut / full, 3)})
    print(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
