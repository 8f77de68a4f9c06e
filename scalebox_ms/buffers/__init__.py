"""Rollout storage, advantage estimation and replay.

``rollout``: host-side (numpy) rollout storage and the numpy GAE reference. ``device``: Parameter-backed
:class:`RolloutBuffer` (GAE as a graph reverse scan) and :class:`ReplayBuffer` (ring buffer with in-graph
add/sample; :func:`sample_draws` makes its row draws); they import MindSpore, so they load lazily.
"""
from .rollout import RolloutStorage, compute_gae


def __getattr__(name):
    if name in ("RolloutBuffer", "ReplayBuffer", "sample_draws"):
        from . import device

        return getattr(device, name)
    raise AttributeError(f"module 'scalebox_ms.buffers' has no attribute {name!r}")


__all__ = ["ReplayBuffer", "RolloutBuffer", "RolloutStorage", "compute_gae", "sample_draws"]
