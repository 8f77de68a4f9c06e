"""A small learnable image env (registered on import).

``BrightSide-v0``: uint8 RGB frames of 40x40 pixels, channels last (HWC); noise everywhere, and one half of the
frame (left or right, at random each step) brighter. Action 0/1: say which half. Reward 1 when right, 8 steps per
episode (best return 8, random 4).

``BrightSideBox-v0``: the same frames with a Box action a in [-1, 1]: point at the bright half (a > 0: right);
reward a if right is bright, else -a (best return 8, random 0). For SAC and TD3 from pixels.
"""
import gymnasium as gym
import numpy as np
from gymnasium import spaces


class BrightSide(gym.Env):
    observation_space = spaces.Box(0, 255, (40, 40, 3), np.uint8)
    action_space = spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self.side = int(self.np_random.integers(2))
        return self._obs(), {}

    def _obs(self):
        img = self.np_random.integers(0, 60, (40, 40, 3)).astype(np.uint8)
        img[:, 20:] += 150 if self.side else 0
        img[:, :20] += 0 if self.side else 150
        return img

    def step(self, action):
        reward = float(int(action) == self.side)
        self.t += 1
        self.side = int(self.np_random.integers(2))
        return self._obs(), reward, False, self.t >= 8, {}


class BrightSideBox(BrightSide):
    action_space = spaces.Box(-1.0, 1.0, (1,), np.float32)

    def step(self, action):
        a = float(np.clip(np.asarray(action, np.float64).reshape(-1)[0], -1.0, 1.0))
        reward = a if self.side else -a
        self.t += 1
        self.side = int(self.np_random.integers(2))
        return self._obs(), reward, False, self.t >= 8, {}


if "BrightSide-v0" not in gym.registry:
    gym.register("BrightSide-v0", entry_point=f"{__name__}:BrightSide")
    gym.register("BrightSideBox-v0", entry_point=f"{__name__}:BrightSideBox")
