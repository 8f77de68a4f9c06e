"""A user's own env, trained from the CLI without editing scalebox_ms (see docs/spaces.md).

    PYTHONPATH=examples/custom_env python -m scalebox_ms.train --config configs/ppo_corridor.yaml

``env.id: my_envs:Corridor-v0`` makes scalebox_ms import this module (which registers the env with gymnasium)
and then make ``Corridor-v0``.

Corridor-v0: a corridor of ``length`` cells; the agent starts in cell 0 and sees its cell as a Discrete
observation. Actions: 0 left, 1 right. Reaching the last cell ends the episode with reward 1; every step costs
0.01. The best return is 1 - 0.01 * (length - 1). Episodes are truncated after 32 steps by gymnasium's TimeLimit,
from ``max_episode_steps`` in the registration below (``env.kwargs.max_episode_steps`` overrides it; raise it too
for a ``length`` above 8, or the far end is out of reach): an env
registered without a limit gets scalebox_ms's evaluation cap of 10,000 steps, and a log line saying so.
"""
import gymnasium as gym
import numpy as np
from gymnasium import spaces


class Corridor(gym.Env):
    def __init__(self, length: int = 8):
        self.length = int(length)
        self.observation_space = spaces.Discrete(self.length)
        self.action_space = spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = 0
        return self.pos, {}

    def step(self, action):
        self.pos = int(np.clip(self.pos + (1 if int(action) == 1 else -1), 0, self.length - 1))
        terminated = self.pos == self.length - 1
        reward = (1.0 if terminated else 0.0) - 0.01
        return self.pos, reward, terminated, False, {}  # (truncation: the registration's TimeLimit)


if "Corridor-v0" not in gym.registry:
    gym.register("Corridor-v0", entry_point=f"{__name__}:Corridor", max_episode_steps=32)
