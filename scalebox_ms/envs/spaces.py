"""What the model needs to know about an env's spaces (plain data: no MindSpore, no numpy arrays).

Action kinds (:attr:`SpaceSpec.action_kind`) and how each is represented:

=============== ============================= ======================== ==================================
kind            gymnasium space               policy head (logits)      action array (per env)
=============== ============================= ======================== ==================================
``discrete``    ``Discrete(n)``               n logits (Categorical)    int32 scalar
``box``         1-D bounded ``Box(d)``        d means (Gaussian)        float32 (d,)
``multidiscrete`` 1-D ``MultiDiscrete(nvec)`` sum(nvec) logits          int32 (len(nvec),), one
                                              (independent Categoricals) Categorical per component
``multibinary`` 1-D ``MultiBinary(n)``        n logits (Bernoulli)      int32 (n,) of 0/1
=============== ============================= ======================== ==================================

``discrete`` is True only for a single ``Discrete`` space (the kind the C++ kernels, DQN and the native envs
implement); code that must know the multi kinds reads ``action_kind``.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Optional, Tuple

from ..errors import short_repr

ACTION_KINDS = ("discrete", "box", "multidiscrete", "multibinary")


@dataclass(frozen=True)
class SpaceSpec:
    obs_dim: int
    discrete: bool
    #: number of actions (discrete), action dimensions (box), components (multidiscrete) or bits (multibinary)
    action_dim: int
    low: Optional[Tuple[float, ...]] = None
    high: Optional[Tuple[float, ...]] = None
    #: one of :data:`ACTION_KINDS`; derived from ``discrete`` when not given
    action_kind: str = ""
    #: multidiscrete: the number of choices of each component
    nvec: Optional[Tuple[int, ...]] = None
    #: multidiscrete: the first value of each component (gymnasium's ``start``), added to the sampled index
    action_start: Optional[Tuple[int, ...]] = None
    #: image observations: the encoded (C, H, W) uint8 shape (``obs_dim`` is its size); None for flat vectors
    image_shape: Optional[Tuple[int, ...]] = None
    #: images inside a Dict/Tuple observation: ``(offset, width, (C, H, W))`` of each one's packed float32 columns
    #: in the flat vector (:func:`~.obs_encoding.pack_pixels`); empty otherwise
    image_parts: Tuple[Tuple[int, int, Tuple[int, int, int]], ...] = ()

    def __post_init__(self):
        kind = self.action_kind or ("discrete" if self.discrete else "box")
        if kind not in ACTION_KINDS:
            raise ValueError(f"action_kind: {kind!r} is not one of {', '.join(ACTION_KINDS)}")
        if bool(self.discrete) != (kind == "discrete"):  # (multidiscrete with discrete=True failed in a Concat)
            raise ValueError(f"discrete: {short_repr(self.discrete)} contradicts action_kind {kind!r} (True for "
                             "'discrete' only)")
        for name in ("obs_dim", "action_dim"):  # (0: MindSpore's initializer failed with a traceback)
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
                raise ValueError(f"{name}: must be an integer >= 1, got {short_repr(value)}")
        object.__setattr__(self, "action_kind", kind)
        if kind == "multidiscrete" and (not self.nvec or len(self.nvec) != self.action_dim):
            raise ValueError("action_kind multidiscrete needs nvec with action_dim entries")
        if kind == "box":  # (bounds of None were NaN in the model: every deterministic action NaN)
            for name in ("low", "high"):
                bound = getattr(self, name)
                if bound is None or len(bound) != self.action_dim or not all(math.isfinite(x) for x in bound):
                    raise ValueError(f"{name}: a Box action needs {self.action_dim} finite bounds, got "
                                     f"{short_repr(bound)}")
            if any(lo > hi for lo, hi in zip(self.low, self.high)):
                raise ValueError(f"low: {short_repr(self.low)} is above high {short_repr(self.high)}")

    @property
    def image(self) -> bool:
        return self.image_shape is not None

    @property
    def cnn(self) -> bool:
        """Whether the model has a NatureCNN feature extractor (an image observation, or images inside one)."""
        return self.image or bool(self.image_parts)

    @property
    def obs_shape(self) -> Tuple[int, ...]:
        """Shape of one encoded observation: ``(obs_dim,)``, or ``(C, H, W)`` for images."""
        return self.image_shape if self.image_shape is not None else (self.obs_dim,)

    @property
    def logits_dim(self) -> int:
        """Width of the policy head's output."""
        return sum(self.nvec) if self.action_kind == "multidiscrete" else self.action_dim

    @property
    def action_width(self) -> int:
        """Columns of one action in packed arrays (1 for a Discrete action)."""
        return 1 if self.action_kind == "discrete" else self.action_dim

    @property
    def action_shape(self) -> Tuple[int, ...]:
        """Shape of one action in rollout storage."""
        return () if self.action_kind == "discrete" else (self.action_dim,)

    @property
    def integer_actions(self) -> bool:
        return self.action_kind != "box"

    @property
    def segments(self) -> Tuple[Tuple[int, int], ...]:
        """multidiscrete: (start, end) columns of each component's logits."""
        out, s = [], 0
        for n in self.nvec or ():
            out.append((s, s + n))
            s += n
        return tuple(out)
