"""CartPole variants that crash, hang (in step or reset), blow their memory or return a wrongly shaped observation at a given step (for isolation tests), or tell a test
that a process is stepping its env (``Marking``: creates the file named by ``$FAULTY_ENVS_MARK``, if set).

Used as env ids ``faulty_envs:CrashingCartPole-v0`` etc.: gymnasium imports this module (registering the
envs) in each worker process. The fault fires once per process, at step ``at`` of the process's life; with
the env kwarg ``once=<path>`` it fires in one process only: the first to create the file ``path``.
"""
import os
import time

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control.cartpole import CartPoleEnv


class ResetCrashingCartPole(CartPoleEnv):
    def reset(self, **kw):
        if os.environ.get("FAULTY_ENVS_OFF") != "1":
            os._exit(4)
        return super().reset(**kw)


class ResetAndCloseRaisingCartPole(CartPoleEnv):
    """reset() raises, and close() then too: it reads what only a reset sets."""

    def reset(self, **kw):
        raise RuntimeError("reset boom")

    def close(self):
        raise RuntimeError("close boom")


class ResetHangingCartPole(CartPoleEnv):
    def reset(self, **kw):
        if os.environ.get("FAULTY_ENVS_OFF") != "1":
            time.sleep(3600)
        return super().reset(**kw)


class FaultyCartPole(CartPoleEnv):
    def __init__(self, fault: str = "crash", at: int = 5, once: str = None, **kw):
        super().__init__(**kw)
        self.fault, self.at, self.once, self.steps = fault, at, once, 0

    def _armed(self) -> bool:
        if os.environ.get("FAULTY_ENVS_OFF") == "1":
            return False
        if self.once is None:
            return True
        try:  # only the process that creates the marker file faults
            os.close(os.open(self.once, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            return True
        except FileExistsError:
            return False

    def step(self, action):
        self.steps += 1
        if self.steps == self.at and self._armed():
            if self.fault == "crash":
                os._exit(3)  # like a segfault in native env code: no exception, the process is gone
            if self.fault == "hang":
                time.sleep(3600)
            if self.fault == "memory":
                blob = bytearray(8 * 2**30)  # 8 GB: past the worker's address-space limit
                blob[0] = 1
            if self.fault == "raise":
                raise ValueError("env bug")
            if self.fault == "shape":  # an observation of 5 numbers where the space declares 4
                obs, reward, terminated, truncated, info = super().step(action)
                return np.append(obs, 0.0).astype(np.float32), reward, terminated, truncated, info
            if self.fault == "mark" and os.environ.get("FAULTY_ENVS_MARK"):
                open(os.environ["FAULTY_ENVS_MARK"], "w").close()
        return super().step(action)


class LockInfoCartPole(CartPoleEnv):
    """A legal env whose step info holds a value that cannot be pickled (a lock), beside a plain one."""

    def step(self, action):
        import threading

        obs, reward, terminated, truncated, info = super().step(action)
        return obs, reward, terminated, truncated, {**info, "lock": threading.Lock(), "plain": 7}


for name, fault in [("Crashing", "crash"), ("Hanging", "hang"), ("MemoryHog", "memory"), ("Raising", "raise"),
                    ("Marking", "mark"), ("WrongShape", "shape")]:
    gym.register(f"{name}CartPole-v0", entry_point=FaultyCartPole, kwargs={"fault": fault, "at": 5},
                 max_episode_steps=500)
gym.register("ResetCrashingCartPole-v0", entry_point=ResetCrashingCartPole, max_episode_steps=500)
gym.register("ResetAndCloseRaisingCartPole-v0", entry_point=ResetAndCloseRaisingCartPole, max_episode_steps=500)
gym.register("ResetHangingCartPole-v0", entry_point=ResetHangingCartPole, max_episode_steps=500)
gym.register("LockInfoCartPole-v0", entry_point=LockInfoCartPole, max_episode_steps=500)
