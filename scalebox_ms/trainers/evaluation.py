"""Deterministic evaluation on fresh gymnasium envs."""
from __future__ import annotations

from typing import List

import numpy as np


def evaluate_policy(trainer, episodes: int = 20, seed: int = 10_000, deterministic: bool = True,
                    max_envs: int = 16) -> List[float]:
    """Run ``episodes`` full episodes on new envs (``env.id``/``env.kwargs`` of the trainer's config).

    Episodes are spread over ``min(episodes, max_envs)`` envs with fixed per-env targets (as SB3's
    ``evaluate_policy``), so short episodes are not over-counted. Observations are normalised with the
    trainer's statistics without updating them. Returns the undiscounted, unscaled episode returns.
    """
    from ..envs import make_vec_env

    if episodes < 1:
        raise ValueError(f"episodes: must be >= 1, got {episodes}")
    cfg = trainer.config.env
    n = min(episodes, max_envs)
    env = make_vec_env(cfg.id, n, cfg.kwargs)
    try:
        targets = np.array([(episodes + i) // n for i in range(n)])
        counts = np.zeros(n, int)
        returns: List[float] = []
        ep_return = np.zeros(n)
        valid = np.ones(n, bool)
        obs, _ = env.reset(seed=seed)
        while (counts < targets).any():
            actions = trainer.predict(obs, deterministic=deterministic)
            obs, reward, terminated, truncated, _ = env.step(actions)
            ep_return += np.where(valid, reward, 0.0)
            done = (np.asarray(terminated) | np.asarray(truncated)) & valid
            for i in np.flatnonzero(done):
                if counts[i] < targets[i]:
                    returns.append(float(ep_return[i]))
                    counts[i] += 1
            ep_return[done] = 0.0
            valid = ~done
        return returns
    finally:
        env.close()
