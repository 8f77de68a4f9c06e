"""Gymnasium vector environments and stateful normalisation wrappers."""
from .factory import make_vec_env, space_spec
from .isolated import IsolatedVectorEnv
from .spaces import SpaceSpec
from .normalize import ObsNormalizer, RewardScaler, RunningMeanStd

__all__ = ["IsolatedVectorEnv", "SpaceSpec", "make_vec_env", "space_spec", "ObsNormalizer", "RewardScaler", "RunningMeanStd"]
