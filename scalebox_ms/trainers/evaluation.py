"""Deterministic evaluation on fresh gymnasium envs."""
from __future__ import annotations

from typing import Callable, List, Optional

import numpy as np


def run_episodes(env_id: str, env_kwargs: Optional[dict], act: Callable[[np.ndarray], np.ndarray], episodes: int,
                 seed: int = 10_000, max_envs: int = 16) -> List[float]:
    """Play ``episodes`` full episodes with ``act(obs_batch) -> action_batch`` on new vector envs.

    Episodes are spread over ``min(episodes, max_envs)`` envs with fixed per-env targets (as SB3's
    ``evaluate_policy``), so short episodes are not over-counted. Returns the undiscounted, unscaled returns.
    """
    from ..envs import make_vec_env

    if episodes < 1:
        raise ValueError(f"episodes: must be >= 1, got {episodes}")
    n = min(episodes, max_envs)
    env = make_vec_env(env_id, n, env_kwargs)
    try:
        targets = np.array([(episodes + i) // n for i in range(n)])
        counts = np.zeros(n, int)
        returns: List[float] = []
        ep_return = np.zeros(n)
        valid = np.ones(n, bool)  # False: the next step is a NEXT_STEP autoreset step
        obs, _ = env.reset(seed=seed)
        while (counts < targets).any():
            obs, reward, terminated, truncated, _ = env.step(act(obs))
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


def evaluate_policy(trainer, episodes: int = 20, seed: int = 10_000, deterministic: bool = True,
                    max_envs: int = 16) -> List[float]:
    """Episodes of ``trainer``'s policy on new envs of its ``env.id``/``env.kwargs``; observations are
    normalised with the trainer's statistics without updating them."""
    cfg = trainer.config.env
    return run_episodes(cfg.id, cfg.kwargs, lambda obs: trainer.predict(obs, deterministic=deterministic),
                        episodes, seed, max_envs)
