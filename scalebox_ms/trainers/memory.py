"""Host-memory estimates checked before a run allocates (or writes) anything.

A rollout (and, for off-policy algorithms, a replay buffer) is sized by the config alone; a size the machine
cannot hold must be a one-line :class:`ConfigError` at start-up, not a ``MemoryError`` traceback minutes in with a
half-made run directory. The estimate counts every host array of one iteration, not only the storage: the
rollout arrays, GAE's temporaries, the flattened and packed update inputs and their MindSpore copies.
"""
from __future__ import annotations

import os
from typing import Optional

from ..errors import ConfigError


def available_bytes() -> Optional[int]:
    """Memory the kernel says can be allocated without swapping (``MemAvailable``), or None if unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def rollout_bytes(samples: int, obs_dim: int, action_width: int, image: bool = False) -> int:
    """Host bytes of one PPO iteration over ``samples`` = n_steps x envs of this process (``image``: uint8
    observations, copied once to the update's device store instead of into the packed features)."""
    obs_bytes = obs_dim if image else 4 * obs_dim
    storage = obs_bytes + 4 * action_width + 4 * 3 + 3           # obs, actions, log-prob/value/reward, 3 flags
    gae = 4 * 6                                                    # advantages, returns and 4 temporaries
    features = 2 * obs_dim if image else 2 * 4 * obs_dim           # image store (numpy, Tensor) or packed obs
    update = features + 2 * 4 * 5 + 2 * 4 * action_width          # packed features + actions, numpy and Tensor
    return int(samples) * (storage + gae + update)


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if n < 1024 or unit == "PB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024.0
    return f"{n:.1f} PB"


def check_fits(key: str, what: str, need: int, limit: Optional[int] = None) -> None:
    """Raise a one-line ConfigError naming ``key`` when ``need`` bytes exceed the memory available now or
    ``limit`` (``sandbox.memory_limit``)."""
    avail = available_bytes()
    budget, source = avail, "available on this machine"
    if limit is not None and (budget is None or limit < budget):
        budget, source = limit, "allowed by sandbox.memory_limit"
    if budget is not None and need > budget:
        raise ConfigError(f"{key}: {what} needs about {_size(need)} of host memory, more than the {_size(budget)} "
                          f"{source}")


#: float32 copies of each network parameter a trainer holds, at most: the weights, Adam's two moments, the gradient,
#: the C++ kernels' padded and transposed copies; off-policy trainers add target networks (and twin critics)
PARAMETER_COPIES = 8


def network_bytes(spec, policy) -> int:
    """Host bytes of the policy and value MLPs (their input -> ``policy.pi_layers``/``vf_layers`` -> head) times
    :data:`PARAMETER_COPIES`, for the spaces ``spec``. With images the MLPs read the CNN's features
    (``policy.cnn_features_dim`` per image, beside the other columns), not the pixels. An upper bound for PPO's actor
    and critic; off-policy networks are counted alike (their targets are among the copies)."""
    image_columns = sum(width for _, width, _ in spec.image_parts) if spec.image_parts else 0
    inputs = (policy.cnn_features_dim if spec.image else
              spec.obs_dim - image_columns + policy.cnn_features_dim * len(spec.image_parts))
    count = 0
    for layers, head in ((policy.pi_layers, 2 * spec.action_width), (policy.vf_layers, 2 * spec.action_width + 1)):
        sizes = [inputs, *layers, head]
        count += sum(int(a) * int(b) + int(b) for a, b in zip(sizes, sizes[1:]))
    return 4 * PARAMETER_COPIES * count
