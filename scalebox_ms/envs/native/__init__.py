"""MindSpore-native vectorised classic-control envs (``env.backend: native``).

Supported ids: CartPole-v1, Acrobot-v1, MountainCar-v0, MountainCarContinuous-v0, Pendulum-v1.
"""
SUPPORTED = ("CartPole-v1", "Acrobot-v1", "MountainCar-v0", "MountainCarContinuous-v0", "Pendulum-v1")


def make_native(env_id: str, num_envs: int):
    from .vector import NativeVectorEnv

    return NativeVectorEnv(env_id, num_envs)


__all__ = ["SUPPORTED", "make_native"]
