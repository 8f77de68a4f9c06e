"""A small learnable image env (registered on import).

``BrightSide-v0``: uint8 RGB frames of 40x40 pixels, channels last (HWC); noise everywhere, and one half of the
frame (left or right, at random each step) brighter. Action 0/1: say which half. Reward 1 when right, 8 steps per
episode (best return 8, random 4).

``BrightSideBox-v0``: the same frames with a Box action a in [-1, 1]: point at the bright half (a > 0: right);
reward a if right is bright, else -a (best return 8, random 0). For SAC and TD3 from pixels.

``BrightSideDict-v0`` / ``BrightSideDictBox-v0``: a Dict observation, the frame (``frame``) and a sign
(``flip``, Box (1,) of -1 or +1); the answer is the bright half when flip is +1 and the other half when it is -1,
so neither part alone beats random (images inside a Dict: a NatureCNN on the frame, the sign beside its features).
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


class BrightSideDict(BrightSide):
    observation_space = spaces.Dict({"frame": BrightSide.observation_space,
                                     "flip": spaces.Box(-1.0, 1.0, (1,), np.float32)})

    def _obs(self):
        self.flip = 1.0 if self.np_random.random() < 0.5 else -1.0
        return {"frame": super()._obs(), "flip": np.array([self.flip], np.float32)}

    def _target(self):
        return self.side if self.flip > 0 else 1 - self.side

    def step(self, action):
        reward = float(int(action) == self._target())
        self.t += 1
        self.side = int(self.np_random.integers(2))
        return self._obs(), reward, False, self.t >= 8, {}


class BrightSideDictBox(BrightSideDict):
    action_space = spaces.Box(-1.0, 1.0, (1,), np.float32)

    def step(self, action):
        a = float(np.clip(np.asarray(action, np.float64).reshape(-1)[0], -1.0, 1.0))
        reward = a if self._target() else -a
        self.t += 1
        self.side = int(self.np_random.integers(2))
        return self._obs(), reward, False, self.t >= 8, {}


if "BrightSide-v0" not in gym.registry:
    gym.register("BrightSide-v0", entry_point=f"{__name__}:BrightSide")
    gym.register("BrightSideBox-v0", entry_point=f"{__name__}:BrightSideBox")
    gym.register("BrightSideDict-v0", entry_point=f"{__name__}:BrightSideDict")
    gym.register("BrightSideDictBox-v0", entry_point=f"{__name__}:BrightSideDictBox")
