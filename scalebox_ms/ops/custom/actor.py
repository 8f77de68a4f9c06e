"""``FusedActorKernel``: the whole acting call of an MLP actor-critic as one C++ aot kernel (CPU, inference only).

``FusedActorKernel(model)(obs, noise)`` returns the packed float32 ``(B, W + 2)`` Tensor
``[action | log_prob | value]`` (W = 1 for Discrete, action_dim for Box) that ``ActStep(packed=True)``
returns, computed by ``fused_actor_mlp.cc`` in one kernel launch instead of ~25 MindSpore kernels.

The model's Parameters are the kernel's inputs, so it always reads the current weights (also after optimizer
steps or ``ops.assign`` restores). Works for ``nn.Dense`` and ``FusedDense`` MLPs (padded storage is read with
the storage row stride). There is no backward: the Custom op is registered without a bprop, so asking MindSpore
for a gradient through it raises ``RuntimeError: ... Custom's bprop not defined`` (at graph compile time under
``@ms.jit``, at the call in PyNative); it can only serve acting, never the PPO update.

A kernel that fails returns a code (``status.h``; e.g. 5: an observation batch of the wrong width) and a direct
call raises ``CustomOpError("custom op 'fused_actor_mlp': <what went wrong> (kernel return code N)")``.
"""
from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn, ops

from ...errors import CustomOpError
from ..fused import mlp_layers
from .build import func_spec
from .status import custom_op_errors

KERNEL = "fused_actor_mlp"
ACT_IDS = {"tanh": 0, "relu": 1}  # enum Activation in mlp.h
MAX_LAYERS = 16  # kMaxLayers in mlp.h


def _describe(model):
    """(meta int32 array, [pi LayerInfo], [vf LayerInfo]) of an ActorCritic, checked against the kernel's limits."""
    pi, vf = mlp_layers(model.pi_net), mlp_layers(model.vf_net)
    if not pi or not vf:
        raise CustomOpError(f"custom op {KERNEL!r}: {type(model).__name__} has no Dense/FusedDense policy and value MLPs")
    hidden_acts = {layer.activation for layer in pi[:-1] + vf[:-1]}
    if len(hidden_acts) > 1 or not hidden_acts <= set(ACT_IDS) or pi[-1].activation or vf[-1].activation:
        raise CustomOpError(f"custom op {KERNEL!r}: needs one hidden activation (tanh or relu) and linear heads, got "
                            f"{sorted(map(str, hidden_acts))}")
    if len(pi) > MAX_LAYERS or len(vf) > MAX_LAYERS:
        raise CustomOpError(f"custom op {KERNEL!r}: at most {MAX_LAYERS} layers per MLP ({MAX_LAYERS - 1} hidden "
                            "layers and the head)")
    spec = model.spec
    if getattr(model, "features", None) is not None or spec.action_kind not in ("discrete", "box"):
        raise CustomOpError(f"custom op {KERNEL!r}: implements MLPs on flat observations with Discrete or Box "
                            f"actions, not this model ({spec.action_kind} actions, image: {spec.cnn})")
    if pi[0].in_features != spec.obs_dim or vf[0].in_features != spec.obs_dim or pi[-1].out_features != spec.action_dim \
            or vf[-1].out_features != 1:
        raise CustomOpError(f"custom op {KERNEL!r}: MLP sizes do not match the spaces (obs {spec.obs_dim}, "
                            f"actions {spec.action_dim})")
    act = ACT_IDS[hidden_acts.pop()] if hidden_acts else 0
    meta = [len(pi), len(vf), int(spec.discrete), act, spec.obs_dim, spec.action_dim]
    meta += [layer.out_features for layer in pi] + [layer.out_features for layer in vf]
    return np.asarray(meta, np.int32), pi, vf


class FusedActorKernel(nn.Cell):
    """(obs (B, obs_dim), noise (B, action_dim)) -> packed (B, W + 2) ``[action | log_prob | value]``."""

    def __init__(self, model):
        super().__init__(auto_prefix=False)
        target = ms.get_context("device_target")
        if target != "CPU":
            raise CustomOpError(f"custom op {KERNEL!r}: the C++ kernel runs on CPU only, not {target}; "
                                f"use the builtin kernel (policy.act_kernel: builtin)")
        meta, pi, vf = _describe(model)
        self.discrete = bool(model.spec.discrete)
        self.width = 1 if self.discrete else int(model.spec.action_dim)
        self.meta = Tensor(meta)
        self.log_std = Tensor(np.zeros(model.spec.action_dim, np.float32)) if self.discrete else model.log_std
        self.params = ms.ParameterTuple([p for layer in pi + vf for p in (layer.weight, layer.bias)])
        width = self.width + 2
        self.op = ops.Custom(func_spec(KERNEL), out_shape=lambda obs, *rest: (obs[0], width),
                             out_dtype=lambda obs, *rest: obs, func_type="aot")

    def __call__(self, obs, noise):
        # a direct call: the kernel's return code as a CustomOpError (inside another graph, e.g. ActStep, that
        # graph's call raises MindSpore's RuntimeError; status.custom_op_errors translates it)
        with custom_op_errors():
            return super().__call__(obs, noise)

    def construct(self, obs, noise):
        return self.op(obs, noise, self.meta, self.log_std, *self.params)

    def unpack(self, out):
        """The packed output as (action, log_prob, value), for use inside a graph: one Split kernel (column slices
        ``out[:, i]`` cost one StridedSlice each, ~4x slower per column on MindSpore 2.10's CPU backend)."""
        action, log_prob, value = ops.split(out, (self.width, 1, 1), axis=1)
        action = action.reshape(-1).astype(ms.int32) if self.discrete else action
        return action, log_prob.reshape(-1), value.reshape(-1)
