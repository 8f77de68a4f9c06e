"""Automatic mixed precision with dynamic loss scaling for the PPO update.

``AutoMixedPrecision(level, dtype, init_scale, growth_factor, backoff_factor, growth_interval)`` does two things:

1. **Casting** (:meth:`AutoMixedPrecision.apply`), following MindSpore's amp levels, applied to the policy and
   value MLPs of an :class:`~scalebox_ms.models.ActorCritic`:

   * ``O0`` -- nothing (float32);
   * ``O1`` -- white-list cells (``nn.Dense``, :class:`~scalebox_ms.ops.FusedDense`, the twin critics'
     :class:`~scalebox_ms.models.offpolicy.EnsembleDense`) compute in ``dtype``; the
     activation cells between dense layers and everything else stay float32 (a FusedDense layer computes its
     activation inside the cell, so in ``dtype``);
   * ``O2`` -- the whole MLPs compute in ``dtype``; their outputs are cast back to float32, so the action
     distributions (log-softmax, Gaussian log-prob) and the PPO loss run in float32;
   * ``O3`` -- as O2, and the distribution heads also run in ``dtype`` (only the loss reduction promotes back).

   Parameters stay float32 (master weights); MindSpore's ``Cell.to_float`` casts them per call. MindSpore's own
   ``amp.auto_mixed_precision`` is not used on the whole model: its O1 path rewrites the network's source (it
   fails on package-relative imports) and its O2/O3 wrap the network, which renames every parameter and so
   would break checkpoints; the per-cell ``to_float`` it uses underneath is used here directly.

2. **Dynamic loss scaling** (:class:`LossScaler`, used inside the compiled update step): the loss is multiplied
   by ``scale`` before differentiation, gradients are divided by it, and if any gradient is not finite the
   optimizer step is **skipped** (parameters and Adam state untouched) and the scale multiplied by
   ``backoff_factor`` (never below 1). After ``growth_interval`` consecutive finite steps the scale is multiplied
   by ``growth_factor``, unless that would overflow float32 (the scale then stays). Scale, clean-step counter and
   skipped-step count are Parameters: they live in the checkpoint and are the same on every data-parallel rank (the
   finite check runs after the gradient all-reduce).

   The finite check is ``mindspore.amp.all_finite`` (:func:`all_finite`), which runs inside the compiled update
   graph on CPU, GPU and Ascend (on Ascend it reads the device's overflow status). MindSpore's
   ``amp.DynamicLossScaler`` is not used for the scale update (:func:`update_scale`): it takes one integer
   ``scale_factor`` for both growth and backoff (backoff is ``1 / scale_factor``), so the separate
   ``growth_factor`` / ``backoff_factor`` of the ``amp:`` section (e.g. grow by 2, back off by 0.25) cannot be
   expressed; it counts no skipped steps; and its Parameters are named ``scale_value`` / ``counter``, which would
   change the names (``amp.loss_scale``, ``amp.good_steps``, ``amp.skipped_steps``) that checkpoints store.

Backends: on CPU float16 runs (correct, but slower than float32: there are no fp16 matrix units); bfloat16
MatMul is not supported on CPU, which :func:`check_backend` reports at start-up. On Ascend/GPU float16 is the
fast path.
"""
from __future__ import annotations

from typing import Optional

import mindspore as ms
import numpy as np
from mindspore import amp as ms_amp
from mindspore import ops

from .config import checked_section
from .errors import ConfigError


class AutoMixedPrecision:
    """Mixed-precision policy + loss-scaler settings (the ``amp:`` config section)."""

    def __init__(self, level: str = "O2", dtype: str = "float16", init_scale: float = 2.0 ** 10,
                 growth_factor: float = 2.0, backoff_factor: float = 0.5, growth_interval: int = 2000):
        # the amp: section's own checks (scalebox_ms.config), so direct construction is refused the same way
        cfg = checked_section("amp", level=level, dtype=dtype, init_scale=init_scale, growth_factor=growth_factor,
                              backoff_factor=backoff_factor, growth_interval=growth_interval)
        self.level = cfg.level
        self.dtype = cfg.dtype
        self.init_scale = cfg.init_scale
        self.growth_factor = cfg.growth_factor
        self.backoff_factor = cfg.backoff_factor
        self.growth_interval = cfg.growth_interval

    @classmethod
    def from_config(cls, amp_cfg) -> Optional["AutoMixedPrecision"]:
        """None for level O0 (no casting, no loss scaling: the float32 graph is unchanged). ``amp_cfg`` is the
        ``amp:`` section (checked again by the constructor, so a hand-built section is refused the same way)."""
        if amp_cfg is None or amp_cfg.level == "O0":
            return None
        return cls(amp_cfg.level, amp_cfg.dtype, amp_cfg.init_scale, amp_cfg.growth_factor,
                   amp_cfg.backoff_factor, amp_cfg.growth_interval)

    @property
    def ms_dtype(self):
        return ms.float16 if self.dtype == "float16" else ms.bfloat16

    def apply(self, model):
        """Cast ``model``'s MLPs in place per :attr:`level`; parameter names and dtypes are unchanged."""
        dtype = self.ms_dtype
        for attr in ("pi_net", "vf_net"):
            self.cast(getattr(model, attr))
        # O2: MLP outputs cast back to float32 before the distribution maths; O3: heads stay in low precision
        model.head_dtype = dtype if self.level == "O3" else ms.float32
        model.amp_level = self.level
        return model

    def cast(self, net):
        """Cast one network in place: O1 its Dense/FusedDense cells (activations in float32), O2/O3 all of it.
        Its users cast its output back to float32 (the off-policy networks always do)."""
        from mindspore import nn

        dtype = self.ms_dtype
        if self.level == "O1":
            for _, cell in net.cells_and_names():
                if _is_white_listed(cell):
                    cell.to_float(dtype)
                elif isinstance(cell, (nn.Tanh, nn.ReLU)):
                    cell.to_float(ms.float32)  # activations back in float32 between low-precision layers
        else:
            net.to_float(dtype)
        return net


def _is_white_listed(cell) -> bool:
    from mindspore import nn

    if isinstance(cell, nn.Dense):
        return True
    from .models.offpolicy import EnsembleDense  # (both ship with the package; imported late: no import cycle)
    from .ops.fused import FusedDense

    return isinstance(cell, (FusedDense, EnsembleDense))


def check_backend(amp: Optional[AutoMixedPrecision], device: str) -> None:
    """Refuse dtypes the backend cannot run, at start-up (one line naming the key)."""
    if amp is None:
        return
    if amp.dtype == "bfloat16" and device.upper() == "CPU":
        raise ConfigError("amp.dtype: bfloat16 MatMul is not supported on CPU by MindSpore 2.10; "
                          "use float16 (correct but slower than float32 on CPU) or run on Ascend/GPU")


class LossScaler:
    """Graph-side dynamic loss scaler; owns three Parameters (created by :meth:`parameters`)."""

    def __init__(self, amp: AutoMixedPrecision):
        from mindspore import Parameter, Tensor

        self.amp = amp
        self.scale = Parameter(Tensor(np.float32(amp.init_scale)), name="amp.loss_scale", requires_grad=False)
        self.good_steps = Parameter(Tensor(np.int32(0)), name="amp.good_steps", requires_grad=False)
        self.skipped = Parameter(Tensor(np.int32(0)), name="amp.skipped_steps", requires_grad=False)
        self._dtype = ms.float32

    def parameters(self):
        return [self.scale, self.good_steps, self.skipped]


def all_finite(grads):
    """Scalar bool Tensor: every element of every gradient is finite (``mindspore.amp.all_finite``)."""
    return ms_amp.all_finite(tuple(grads))


def update_scale(scale, good_steps, skipped, finite, amp: AutoMixedPrecision):
    """New (scale, good_steps, skipped) after one step: back off on overflow, grow after the interval."""
    one = ops.ones((), ms.int32)
    zero = ops.zeros((), ms.int32)
    good = ops.select(finite, good_steps + one, zero)
    grow = good >= amp.growth_interval
    larger = scale * amp.growth_factor
    # (never to infinity: inf x backoff_factor is inf, the scale would stay there, and every step after would be
    # skipped or, unscaled as inf / inf, non-finite; PyTorch's GradScaler grows only to a finite scale too)
    grown = ops.select(grow & ops.isfinite(larger), larger, scale)
    backed = ops.maximum(scale * amp.backoff_factor, 1.0)
    new_scale = ops.select(finite, grown, backed)
    new_good = ops.select(grow, zero, good)
    new_skipped = ops.select(finite, skipped, skipped + one)
    return new_scale, new_good, new_skipped
