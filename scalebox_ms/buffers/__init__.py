"""Rollout storage and advantage estimation."""
from .rollout import RolloutStorage, compute_gae

__all__ = ["RolloutStorage", "compute_gae"]
