"""What the model needs to know about an env's spaces (plain data: no MindSpore, no numpy arrays)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple


@dataclass(frozen=True)
class SpaceSpec:
    obs_dim: int
    discrete: bool
    action_dim: int  # number of actions (discrete) or action dimensions (continuous)
    low: Optional[Tuple[float, ...]] = None
    high: Optional[Tuple[float, ...]] = None
