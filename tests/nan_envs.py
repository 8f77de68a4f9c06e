"""CartPole variants that return a non-finite observation or reward at a given step (for the NaN guard tests), a
reward beyond float32's range, or raise in ``close()``.

Used as env ids ``nan_envs:NaNObsCartPole-v0`` / ``nan_envs:NaNRewardCartPole-v0`` / ``nan_envs:HugeRewardCartPole-v0``
/ ``nan_envs:CloseRaisingCartPole-v0``.
"""
import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control.cartpole import CartPoleEnv


class NaNCartPole(CartPoleEnv):
    def __init__(self, what: str = "obs", at: int = 5, **kw):
        super().__init__(**kw)
        self.what, self.at, self.steps = what, at, 0

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
        return obs, reward, terminated, truncated, info


gym.register("NaNObsCartPole-v0", entry_point=NaNCartPole, kwargs={"what": "obs"}, max_episode_steps=500)
gym.register("NaNRewardCartPole-v0", entry_point=NaNCartPole, kwargs={"what": "reward"}, max_episode_steps=500)
gym.register("HugeRewardCartPole-v0", entry_point=NaNCartPole, kwargs={"what": "huge"}, max_episode_steps=500)


class CloseRaisingCartPole(CartPoleEnv):
    def close(self):
        raise RuntimeError("close bug")


gym.register("CloseRaisingCartPole-v0", entry_point=CloseRaisingCartPole, max_episode_steps=500)
