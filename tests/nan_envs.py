"""CartPole variants that return a non-finite observation or reward at a given step (for the NaN guard tests).

Used as env ids ``nan_envs:NaNObsCartPole-v0`` / ``nan_envs:NaNRewardCartPole-v0``.
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
            else:
                reward = float("inf")
        return obs, reward, terminated, truncated, info


gym.register("NaNObsCartPole-v0", entry_point=NaNCartPole, kwargs={"what": "obs"}, max_episode_steps=500)
gym.register("NaNRewardCartPole-v0", entry_point=NaNCartPole, kwargs={"what": "reward"}, max_episode_steps=500)
