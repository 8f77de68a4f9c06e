"""``GuardedAdamKernel``: one off-policy optimizer step (global-norm check and clip, Adam) as ONE C++ kernel.

The off-policy learners (DQN, SAC, TD3) update each network with
:func:`scalebox_ms.models.offpolicy.guarded_update` on an :class:`~scalebox_ms.models.offpolicy.AdamGroup`: the
global gradient norm (a non-finite loss or gradient skips the step), the optional clip to ``max_grad_norm``, then
MindSpore's fused Adam per Parameter -- about 30 MindSpore kernels per update on CPU (a concat, a square sum,
a multiply and a select per gradient, the scalar checks, one Adam per Parameter), each with its launch cost.
With an ``AdamGroup``'s ``kernel`` set to this Cell, ``guarded_update`` runs the same arithmetic as one aot kernel
(``offpolicy_optim.cc``): the gradients still come from MindSpore's autodiff, only the optimizer's elementwise
arithmetic moves, so the algorithms' maths stays in their Python modules.

Results equal the graph reference up to float rounding: the kernel sums the squared gradients in double, so a clip
coefficient below 1 can differ in its last bits, and MindSpore's vectorised CPU Adam rounds a few elements 1 ulp
apart from this plain loop (tests/test_offpolicy_kernels.py compares both paths). A non-finite step does what the reference does: zero
gradients at learning rate 0 (the moments decay by one step, the step counter advances, the weights stay).

State: the group's weights, moments and step counter are inputs the kernel writes IN PLACE (MindSpore 2.10 CPU
graph mode hands an aot kernel the Parameters' own memory; the PPO update kernel relies on the same, see
:mod:`.update`). The Custom primitive is flagged ``side_effect_mem``, so MindSpore orders every later read of a
Parameter in the graph (the next gradient step, the actor loss after the critic update, the policy output of a
training phase) after it; the equivalence tests are the guard on a MindSpore upgrade.

Supported: CPU, float32 Parameters and gradients, no AMP loss scale. The constructors raise
:class:`~scalebox_ms.errors.CustomOpError` (one line) off CPU and for Parameters of another dtype; with AMP
``guarded_update`` keeps the graph ops (the trainer does not set the kernels then: ``amp.level`` O1-O3 make
``auto`` choose the graph ops and ``custom`` a ConfigError). Selected per algorithm by
``<algo>.optimizer_kernel`` (:func:`scalebox_ms.trainers.kernels.select_optimizer_kernel`).
"""
from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn, ops

from ...errors import CustomOpError
from .build import KERNELS, SETTINGS, func_spec, library_path

KERNEL = "offpolicy_optim"
KERNELS.setdefault(KERNEL, ("offpolicy_optim.cc", "GuardedAdam"))  # registered here: build.py is shared code
SETTINGS.setdefault(KERNEL, "<algo>.optimizer_kernel")
POLYAK_SYMBOL = "PolyakUpdate"  # the file's second entry point


def _fail(msg: str):
    raise CustomOpError(f"custom op {KERNEL!r}: {msg}")


def _check_cpu():
    target = ms.get_context("device_target")
    if target != "CPU":
        _fail(f"the C++ kernel runs on CPU only, not {target}; use the graph (optimizer_kernel: builtin)")


class GuardedAdamKernel(nn.Cell):
    """The optimizer step of one :class:`~scalebox_ms.models.offpolicy.AdamGroup` as one kernel call.

    ``kernel(group, grads, loss, lr, max_grad_norm)`` (graph code, what ``guarded_update`` calls) applies the
    update in place and returns the bool ``ok`` (the step was finite), like ``guarded_update``."""

    def __init__(self, group):
        super().__init__(auto_prefix=False)
        _check_cpu()
        for p in list(group.params) + list(group.m) + list(group.v) + [group.step]:
            if p.dtype != ms.float32:
                _fail(f"parameter {p.name} is {p.dtype}, needs float32")
        self.op = ops.Custom(func_spec(KERNEL), out_shape=lambda *shapes: (1,),
                             out_dtype=lambda *dtypes: ms.float32, func_type="aot")
        self.op.add_prim_attr("side_effect_mem", True)  # (it writes its Parameter inputs: order later reads)
        self.hyper = (group.beta1, group.beta2, group.eps)

    def construct(self, group, grads, loss, lr, max_grad_norm):
        beta1, beta2, eps = self.hyper
        clip = -1.0 if max_grad_norm is None else max_grad_norm
        hyper = Tensor(np.asarray([clip, beta1, beta2, eps], np.float32))
        ok = self.op(hyper, lr.astype(ms.float32), loss.astype(ms.float32), group.step, *group.params, *group.m,
                     *group.v, *grads)
        return ok[0] > 0.5


class PolyakKernel(nn.Cell):
    """``kernel(targets, sources, tau)`` (graph code, what ``models.offpolicy.polyak`` calls): ``target <- target *
    (1 - tau) + source * tau`` for every pair, in place, as one kernel call (``PolyakUpdate``) instead of two
    multiplies, an add and an assign per Parameter; bit-identical to the graph ops. Returns a dummy (1,) tensor."""

    def __init__(self, targets, sources):
        super().__init__(auto_prefix=False)
        _check_cpu()
        if len(targets) != len(sources):
            _fail(f"{len(targets)} targets for {len(sources)} sources")
        for t, s in zip(targets, sources):
            if t.dtype != ms.float32 or s.dtype != ms.float32 or t.shape != s.shape:
                _fail(f"target {t.name} and source {s.name} must be float32 of one shape")
        self.op = ops.Custom(f"{library_path(KERNEL)}:{POLYAK_SYMBOL}", out_shape=lambda *shapes: (1,),
                             out_dtype=lambda *dtypes: ms.float32, func_type="aot")
        self.op.add_prim_attr("side_effect_mem", True)  # (it writes the targets: order later reads)

    def construct(self, targets, sources, tau):
        coef = Tensor(np.asarray([1.0 - tau, tau], np.float32))  # (rounded as MindSpore rounds the constants)
        return self.op(coef, *targets, *sources)
