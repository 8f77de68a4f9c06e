"""Gymnasium vector environments and stateful normalisation wrappers."""
from .envpool_env import EnvPoolVectorEnv  # imports envpool only when one is built
from .factory import make_vec_env, space_spec
from .isolated import IsolatedVectorEnv
from .spaces import SpaceSpec
from .normalize import ObsNormalizer, RewardScaler, RunningMeanStd

__all__ = ["EnvPoolVectorEnv", "IsolatedVectorEnv", "SpaceSpec", "make_vec_env", "space_spec", "ObsNormalizer", "RewardScaler", "RunningMeanStd"]
