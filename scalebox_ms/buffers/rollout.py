"""Host-side rollout storage for the gymnasium path, and GAE.

Autoreset semantics: gymnasium 1.x vector envs in ``AutoresetMode.NEXT_STEP`` (the default, and the only
mode gymnasium's fast native ``CartPoleVectorEnv`` supports). When sub-env i ends at step t, the observation
returned at t is the true final observation; at step t+1 the env resets, ignores the action, and returns
reward 0 with both flags False. scalebox_ms records step t+1 for env i as *invalid*: it gets advantage 0 and a
0 weight in every loss term. The acting call at t+1 computed V(final observation) anyway, so a truncated
episode is bootstrapped with ``gamma * values[t+1]`` at no extra cost, and a terminated one with 0.
"""
from __future__ import annotations

from typing import Tuple

import numpy as np


def compute_gae(rewards: np.ndarray, values: np.ndarray, last_values: np.ndarray, terminated: np.ndarray,
                truncated: np.ndarray, valid: np.ndarray, gamma: float, gae_lambda: float) -> Tuple[np.ndarray, np.ndarray]:
    """Generalised advantage estimation over a (T, N) rollout, vectorised over envs.

    ``values[t]`` is V(obs_t); ``last_values`` is V(obs_T) for the observation after the last step. Under
    NEXT_STEP autoreset ``values[t + 1]`` (or ``last_values``) is V(final obs) when step t ended an episode.

    Returns (advantages, returns), both (T, N) float32; invalid steps have advantage 0.
    """
    T = rewards.shape[0]
    term = terminated.astype(np.float32)
    done = np.logical_or(terminated, truncated).astype(np.float32)
    valid_f = valid.astype(np.float32)
    next_values = np.concatenate([values[1:], last_values[None]], axis=0)
    advantages = np.zeros_like(rewards, dtype=np.float32)
    running = np.zeros(rewards.shape[1], dtype=np.float32)
    for t in range(T - 1, -1, -1):
        delta = rewards[t] + gamma * (1.0 - term[t]) * next_values[t] - values[t]
        running = (delta + gamma * gae_lambda * (1.0 - done[t]) * running) * valid_f[t]
        advantages[t] = running
    returns = (advantages + values) * valid_f
    return advantages.astype(np.float32), returns.astype(np.float32)


class RolloutStorage:
    """(T, N, ...) numpy arrays for one rollout of T vector steps over N envs.

    ``obs_dim`` is the width of a flat observation, or the shape of one (``(C, H, W)`` for images, stored in
    ``obs_dtype``: uint8 frames stay uint8)."""

    def __init__(self, n_steps: int, num_envs: int, obs_dim, action_shape: Tuple[int, ...], action_dtype,
                 obs_dtype=np.float32):
        T, N = n_steps, num_envs
        self.n_steps, self.num_envs = T, N
        obs_shape = tuple(obs_dim) if isinstance(obs_dim, (tuple, list)) else (int(obs_dim),)
        self.obs = np.zeros((T, N) + obs_shape, obs_dtype)
        self.actions = np.zeros((T, N) + tuple(action_shape), action_dtype)
        self.log_probs = np.zeros((T, N), np.float32)
        self.values = np.zeros((T, N), np.float32)
        self.rewards = np.zeros((T, N), np.float32)
        self.terminated = np.zeros((T, N), bool)
        self.truncated = np.zeros((T, N), bool)
        self.valid = np.zeros((T, N), bool)

    def flat(self, advantages: np.ndarray, returns: np.ndarray) -> dict:
        """The rollout flattened to (T*N, ...) arrays in the order the update graph takes them."""
        B = self.n_steps * self.num_envs
        return {
            "obs": self.obs.reshape((B,) + self.obs.shape[2:]),
            "actions": self.actions.reshape((B,) + self.actions.shape[2:]),
            "log_probs": self.log_probs.reshape(B),
            "values": self.values.reshape(B),
            "advantages": advantages.reshape(B),
            "returns": returns.reshape(B),
            "mask": self.valid.reshape(B).astype(np.float32),
        }
