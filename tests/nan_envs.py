"""CartPole variants that return a non-finite observation or reward at a given step (for the NaN guard tests), a
reward or an observation beyond float32's range, or raise in ``close()``; an env of float64 observations near an
offset (float32 resolution).

Used as env ids ``nan_envs:NaNObsCartPole-v0`` / ``nan_envs:NaNRewardCartPole-v0`` / ``nan_envs:HugeRewardCartPole-v0``
/ ``nan_envs:HugeObsCartPole-v0`` / ``nan_envs:CloseRaisingCartPole-v0`` / ``nan_envs:OffsetObs-v0``.
"""
import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control.cartpole import CartPoleEnv


class NaNCartPole(CartPoleEnv):
    def __init__(self, what: str = "obs", at: int = 5, **kw):
        super().__init__(**kw)
        self.what, self.at, self.steps = what, at, 0
        if what == "hugeobs":  # (a float64 space: a float32 one's vector env would make -1e300 -inf itself)
            space = self.observation_space
            self.observation_space = gym.spaces.Box(space.low, space.high, dtype=np.float64)

    def step(self, action):
        self.steps += 1
        obs, reward, terminated, truncated, info = super().step(action)
        if self.steps == self.at:
            if self.what == "obs":
                obs = obs.copy()
                obs[2] = np.nan
            elif self.what == "huge":
                reward = 1e39  # (finite as a Python float, inf as float32)
            elif self.what == "reward":
                reward = float("inf")
            elif self.what == "hugeobs":
                obs = obs.astype(np.float64)
                obs[1] = -1e300  # (finite in float64, inf as float32)
        return obs, reward, terminated, truncated, info


gym.register("NaNObsCartPole-v0", entry_point=NaNCartPole, kwargs={"what": "obs"}, max_episode_steps=500)
gym.register("NaNRewardCartPole-v0", entry_point=NaNCartPole, kwargs={"what": "reward"}, max_episode_steps=500)
gym.register("HugeRewardCartPole-v0", entry_point=NaNCartPole, kwargs={"what": "huge"}, max_episode_steps=500)
gym.register("HugeObsCartPole-v0", entry_point=NaNCartPole, kwargs={"what": "hugeobs"}, max_episode_steps=500)


class OffsetObs(gym.Env):
    """float64 observations ``offset + U(-1, 1)`` (3 columns), reward 1 for action 0, 20 steps per episode."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (3,), np.float64)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, offset: float = 1e8):
        self.offset = offset

    def _obs(self):
        return self.offset + self.np_random.uniform(-1.0, 1.0, 3)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        return self._obs(), float(action == 0), False, self.t >= 20, {}


gym.register("OffsetObs-v0", entry_point=OffsetObs)


class CloseRaisingCartPole(CartPoleEnv):
    def close(self):
        raise RuntimeError("close bug")


gym.register("CloseRaisingCartPole-v0", entry_point=CloseRaisingCartPole, max_episode_steps=500)
