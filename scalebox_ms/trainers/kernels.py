"""Kernel selection: which implementation runs the acting call, the PPO update, the off-policy optimizer step, the
CNN's convolutions and its first-layer patches.

Five choices, one rule each, all logged the same way (logger ``scalebox_ms``, one INFO line saying which path
was chosen and why; a WARNING when an ``auto`` choice had to fall back because the kernel could not be built):

* ``policy.act_kernel`` -- the acting call: ``builtin`` (MindSpore ops in the compiled :class:`ActStep`) or
  ``custom`` (the C++ fused-MLP aot kernel, CPU, float32, inference only). ``auto`` picks ``custom`` on CPU for
  float32 models up to :data:`AUTO_ACT_MAX_MACS` multiply-adds per call, where ``benchmarks/acting_kernels.py``
  measured it faster (docs/performance.md has the table).
* ``ppo.update_kernel`` -- the minibatch update: ``builtin`` (the compiled :class:`PPOUpdateStep` graph) or
  ``custom`` (the C++ :class:`PPOUpdateKernel`: forward, hand-derived backward, clip and Adam, all epochs in one
  call). The kernel implements a fixed subset of the configuration
  (:func:`scalebox_ms.ops.custom.update.unsupported_settings` lists what it does not); any setting outside it
  makes ``auto`` use the compiled graph and ``custom`` a :class:`ConfigError`. ``auto`` also keeps the graph
  above :data:`AUTO_UPDATE_MAX_BATCH` rows per minibatch (not measured beyond; ``benchmarks/update_kernel.py``).
* ``<algo>.optimizer_kernel`` (DQN, SAC, TD3) -- the update arithmetic after the gradients: ``builtin`` (graph
  ops) or ``custom`` (the C++ optimizer step and target update, ``ops/custom/offpolicy_optim.cc``). ``auto`` picks
  ``custom`` on CPU in float32 for optimizers of up to :data:`AUTO_OPTIMIZER_MAX_ELEMENTS` values
  (``benchmarks/offpolicy_step.py`` measured 256x256 MLPs; the kernel is single-threaded, MindSpore's Adam is not).
* ``policy.conv_kernel`` (every algorithm, image observations) -- NatureCNN's first-layer patches on CPU:
  ``builtin`` (``ops.unfold`` of the scaled frames) or ``custom`` (the C++ im2col kernel reading the uint8 frames,
  ``ops/custom/patches.cc``; the same values bit for bit). ``auto`` picks ``custom`` on CPU whenever it can be
  built (it is exact); the default is ``builtin``, since in PPO on Breakout the kernel measured no faster end to
  end (``benchmarks/cnn_conv.py`` times both).
* ``policy.conv_backend`` (every algorithm, image observations) -- NatureCNN's convolutions on CPU: ``im2col``
  (MindSpore's ops: unfold + one batched matmul, with the patches per ``policy.conv_kernel``) or ``onednn`` (oneDNN's
  own forward and backward convolution primitives, from the library inside MindSpore's CPU wheel,
  ``ops/custom/onednn_conv.cc``; float sums in another order than im2col's, so not the same bits). ``auto`` picks
  ``onednn`` on CPU whenever it can be built. It replaces the patches kernel: ``conv_kernel: custom`` with
  ``onednn`` is an error.
"""
from __future__ import annotations

import logging
from typing import Optional, Tuple

import numpy as np

from ..config import micro_batches
from ..errors import ConfigError, CustomOpError

log = logging.getLogger("scalebox_ms")

# largest CartPole acting batch measured faster with the custom kernel (benchmarks/acting_kernels.py), as
# multiply-adds per call so that other MLP sizes scale from it: custom where batch * macs <= AUTO_ACT_MAX_MACS
_CARTPOLE_MACS = (4 * 64 + 64 * 64 + 64 * 2) + (4 * 64 + 64 * 64 + 64 * 1)
AUTO_ACT_MAX_MACS = 4096 * _CARTPOLE_MACS
# largest minibatch at which benchmarks/update_kernel.py measured the update kernel faster
AUTO_UPDATE_MAX_BATCH = 16384
# most values of one optimizer's Parameters for which 'auto' uses the off-policy optimizer kernel: about twice
# the largest measured (SAC's twin 256x256 critics: ~135k; benchmarks/offpolicy_step.py)
AUTO_OPTIMIZER_MAX_ELEMENTS = 262_144


def _report(key: str, choice: str, chosen: str, reason: str, fallback: bool = False) -> None:
    line = (f"{key}: {chosen} ({reason})" if chosen == choice  # (not 'policy.act_kernel builtin: builtin')
            else f"{key} {choice}: {chosen} ({reason})")
    if fallback:
        log.warning("warning: %s", line)
    else:
        log.info("%s", line)


def model_macs(model) -> int:
    """Multiply-adds per sample of the policy and value MLPs (logical sizes)."""
    from ..ops.fused import mlp_layers

    return sum(layer.in_features * layer.out_features for net in (model.pi_net, model.vf_net)
               for layer in mlp_layers(net))


def resolve_act_kernel(model, choice: str, num_envs: int) -> Tuple[str, str]:
    """('builtin' | 'custom', why) for ``policy.act_kernel = choice`` at batch ``num_envs``."""
    import mindspore as ms

    from ..config import checked_section
    from ..ops.custom import kernel_available

    choice = checked_section("policy", act_kernel=choice).act_kernel  # the config's own check and message
    if choice in ("builtin", "custom"):
        return choice, "as configured"
    if getattr(model, "features", None) is not None:
        return "builtin", "image observations: the kernel implements MLPs, not the NatureCNN"
    kind = getattr(model, "kind", "discrete")
    if kind not in ("discrete", "box"):
        return "builtin", f"{kind} actions: the kernel implements Discrete and Box actions"

    device = ms.get_context("device_target")
    if device != "CPU":
        return "builtin", f"the C++ kernel is CPU code, this is {device}"
    if getattr(model, "amp_level", "O0") != "O0":
        return "builtin", f"amp.level {model.amp_level}: the kernel computes in float32"
    if not kernel_available():
        return "builtin", "no C++ compiler and no cached kernel"
    macs = int(num_envs) * model_macs(model)
    if macs > AUTO_ACT_MAX_MACS:
        return "builtin", f"{macs} multiply-adds per call exceed the measured range ({AUTO_ACT_MAX_MACS})"
    return "custom", f"{macs} multiply-adds per call, within the range measured faster"


def build_act_steps(model, policy_cfg, num_envs: int):
    """(act_step, packed_act_step) per ``policy.act_kernel``; the choice is logged once.

    ``custom`` that cannot be built raises :class:`CustomOpError`; ``auto`` then falls back to ``builtin``."""
    from ..models import ActStep

    def steps(kernel):
        return ActStep(model, kernel=kernel), ActStep(model, packed=True, kernel=kernel)

    choice = policy_cfg.act_kernel
    kernel, reason = resolve_act_kernel(model, choice, num_envs)
    try:
        built = steps(kernel)
    except CustomOpError as exc:
        if choice != "auto":
            raise CustomOpError(f"policy.act_kernel: custom: {exc}") from None
        _report("policy.act_kernel", choice, "builtin", f"the custom kernel cannot be built: {exc}", fallback=True)
        return steps("builtin")
    _report("policy.act_kernel", choice, kernel, reason)
    return built


def direct_acting(act_step, model):
    """The rollout's acting call when ``act_step`` runs the C++ kernel: the same kernel called directly
    (:class:`~scalebox_ms.ops.custom.direct.DirectActorKernel`, no MindSpore graph dispatch, ~0.2 ms less per
    call on CPU), or None (builtin acting; the kernel's library cannot be loaded: logged, the graph call stays)."""
    if getattr(act_step, "kernel", "builtin") != "custom":
        return None
    from ..ops.custom.direct import DirectActorKernel

    try:
        return DirectActorKernel(model)
    except (CustomOpError, OSError, AttributeError) as exc:
        _report("policy.act_kernel", "custom", "custom inside the acting graph",
                f"the kernel cannot be called directly: {exc}", fallback=True)
        return None


def update_kernel_blockers(config, amp, world_size: int, device: str) -> list:
    """Why the C++ update kernel cannot run this configuration (empty: it can)."""
    from ..ops.custom.update import unsupported_settings

    blockers = []
    if device != "CPU":
        blockers.append(f"the {device} backend (the kernel is CPU code)")
    if amp is not None:
        blockers.append(f"amp.level {amp.level} (the kernel computes in float32)")
    if world_size > 1:
        blockers.append("data parallelism (the kernel has no all-reduce)")
    if micro_batches(config) > 1:
        blockers.append("gradient accumulation")
    if config.policy.layer != "dense":
        blockers.append(f"policy.layer {config.policy.layer}")
    blockers += [f"{s} (not implemented by the kernel)" for s in unsupported_settings(config.ppo, config.policy)]
    return blockers


def select_update_kernel(config, model, optimizer, amp, world_size: int, device: str) -> Optional[object]:
    """The :class:`PPOUpdateKernel` over ``optimizer``'s state per ``ppo.update_kernel``, or None for the
    compiled graph; the choice is logged."""
    choice = config.ppo.update_kernel
    if choice == "builtin":
        _report("ppo.update_kernel", choice, "compiled graph", "as configured")
        return None
    from ..ops.custom import PPOUpdateKernel

    blockers = update_kernel_blockers(config, amp, world_size, device)
    if getattr(model, "kind", "discrete") not in ("discrete", "box"):
        blockers.insert(0, f"{model.kind} actions (the kernel implements Discrete and Box actions)")
    if getattr(model, "features", None) is not None:
        blockers.insert(0, "image observations (the kernel implements MLPs, not the NatureCNN)")
    if choice == "custom":
        if blockers:
            raise ConfigError(f"ppo.update_kernel: custom cannot run with {blockers[0]}; use builtin or auto")
        try:
            kernel = PPOUpdateKernel(model, optimizer, config.ppo, policy_cfg=config.policy)
        except CustomOpError as exc:
            raise CustomOpError(f"ppo.update_kernel: custom: {exc}") from None
        _report("ppo.update_kernel", choice, "C++ kernel", "as configured")
        return kernel
    batch = config.ppo.batch_size
    if batch == "auto":
        blockers.append("ppo.batch_size auto (the size is probed with the compiled graph)")
    elif batch // world_size > AUTO_UPDATE_MAX_BATCH:
        blockers.append(f"minibatch {batch // world_size} > {AUTO_UPDATE_MAX_BATCH}, beyond the measured range")
    if blockers:
        _report("ppo.update_kernel", choice, "compiled graph", "; ".join(blockers))
        return None
    try:
        kernel = PPOUpdateKernel(model, optimizer, config.ppo, policy_cfg=config.policy)
    except CustomOpError as exc:
        _report("ppo.update_kernel", choice, "compiled graph", f"the C++ kernel cannot be built: {exc}", fallback=True)
        return None
    _report("ppo.update_kernel", choice, "C++ kernel", "CPU, float32, one process, settings it implements")
    return kernel


def select_conv_backend(policy_cfg, model, device: str) -> str:
    """Per ``policy.conv_backend``, run every NatureCNN in ``model`` (policy, value function, targets) on oneDNN's
    convolution primitives (:class:`~scalebox_ms.ops.custom.onednn_conv.OneDNNConv`), set before the model's graphs
    compile; returns 'onednn' or 'im2col'. ``onednn`` that cannot run raises (ConfigError / CustomOpError); ``auto``
    then keeps im2col. The choice is logged (nothing for models without a CNN under ``auto``/``im2col``)."""
    from ..config import checked_section
    from ..models.cnn import patch_kernel_cnns

    checked = checked_section("policy", conv_backend=policy_cfg.conv_backend, conv_kernel=policy_cfg.conv_kernel)
    choice = checked.conv_backend
    cnns = patch_kernel_cnns(model)
    if not cnns:
        if choice == "onednn":
            raise ConfigError("policy.conv_backend: onednn applies to the NatureCNN of image observations; this model "
                              "has none (use auto or im2col)")
        return "im2col"
    if choice == "im2col":
        _report("policy.conv_backend", choice, "im2col", "as configured")
        return "im2col"
    blocker = None
    if device != "CPU":
        blocker = f"the {device} backend (the op is CPU code; convolutions there run ops.conv2d)"
    elif not all(cnn.first.im2col for cnn in cnns):
        blocker = "a NatureCNN built for ops.conv2d (im2col=False)"
    elif checked.conv_kernel == "custom":
        blocker = "policy.conv_kernel: custom (the first layer's patches kernel belongs to the im2col backend)"
    if blocker is not None:
        if choice == "onednn":
            raise ConfigError(f"policy.conv_backend: onednn cannot run with {blocker}; use im2col or auto")
        _report("policy.conv_backend", choice, "im2col", blocker)
        return "im2col"
    from ..ops.custom import kernel_available
    from ..ops.custom.onednn_conv import KERNEL, onednn_library, slow_passes

    if choice == "auto":
        try:
            onednn_library()
        except CustomOpError as exc:
            _report("policy.conv_backend", choice, "im2col", str(exc))
            return "im2col"
        if not kernel_available(KERNEL):
            _report("policy.conv_backend", choice, "im2col", "no C++ compiler and no cached kernel")
            return "im2col"
    try:
        slow = slow_passes(cnns)  # builds the kernel; oneDNN's implementation of every pass of these layers
        for cnn in cnns:
            cnn.set_onednn(True)
    except CustomOpError as exc:
        for cnn in cnns:
            cnn.set_onednn(False)
        if choice == "onednn":
            raise CustomOpError(f"policy.conv_backend: onednn: {exc}") from None
        _report("policy.conv_backend", choice, "im2col", f"the oneDNN op cannot run: {exc}", fallback=True)
        return "im2col"
    if slow:
        if choice == "auto":
            for cnn in cnns:
                cnn.set_onednn(False)
            _report("policy.conv_backend", choice, "im2col", f"oneDNN has only reference code for {slow[0]} here")
            return "im2col"
        log.warning("warning: policy.conv_backend onednn: oneDNN has only reference code for %s here (slow)", slow[0])
    _report("policy.conv_backend", choice, "oneDNN", "CPU" if choice == "auto" else "as configured")
    return "onednn"


def select_conv_kernel(policy_cfg, model, device: str) -> str:
    """Per ``policy.conv_kernel``, compute the first-layer patches of every NatureCNN in ``model`` (policy, value
    function, targets) with the C++ kernel (:class:`~scalebox_ms.ops.custom.patches.ImagePatchesKernel`), set before
    the model's graphs compile; returns 'custom' or 'builtin'. ``custom`` that cannot run raises (ConfigError /
    CustomOpError); ``auto`` then keeps ``ops.unfold``. The choice is logged (nothing for models without a CNN
    under ``auto``/``builtin``)."""
    from ..config import checked_section
    from ..models.cnn import KERNELS as CONV_LAYERS, patch_kernel_cnns

    choice = checked_section("policy", conv_kernel=policy_cfg.conv_kernel).conv_kernel  # the config's own check
    cnns = patch_kernel_cnns(model)
    if not cnns:
        if choice == "custom":
            raise ConfigError("policy.conv_kernel: custom applies to the NatureCNN of image observations; this model "
                              "has none (use auto or builtin)")
        return "builtin"
    if choice == "builtin":
        _report("policy.conv_kernel", choice, "ops.unfold", "as configured")
        return "builtin"
    blocker = None
    if cnns[0].first.use_onednn:
        blocker = "policy.conv_backend onednn (it computes whole convolutions; no patches)"
    elif device != "CPU":
        blocker = f"the {device} backend (the kernel is CPU code; convolutions there run ops.conv2d)"
    elif not all(cnn.first.im2col for cnn in cnns):
        blocker = "a NatureCNN built without the im2col path (im2col=False)"
    if blocker is not None:
        if choice == "custom":
            raise ConfigError(f"policy.conv_kernel: custom cannot run with {blocker}; use builtin or auto")
        _report("policy.conv_kernel", choice, "ops.unfold", blocker)
        return "builtin"
    from ..ops.custom import kernel_available
    from ..ops.custom.patches import KERNEL, ImagePatchesKernel

    if choice == "auto" and not kernel_available(KERNEL):
        _report("policy.conv_kernel", choice, "ops.unfold", "no C++ compiler and no cached kernel")
        return "builtin"
    try:
        k, s = CONV_LAYERS[0]
        kernel = ImagePatchesKernel(k, s, 1.0 / 255.0)  # (stateless: one instance serves every CNN)
    except CustomOpError as exc:
        if choice == "custom":
            raise CustomOpError(f"policy.conv_kernel: custom: {exc}") from None
        _report("policy.conv_kernel", choice, "ops.unfold", f"the C++ kernel cannot be built: {exc}", fallback=True)
        return "builtin"
    for cnn in cnns:
        cnn.set_patch_kernel(kernel)
    _report("policy.conv_kernel", choice, "C++ kernel", "CPU" if choice == "auto" else "as configured")
    return "custom"


def select_optimizer_kernel(config, learner, amp, device: str) -> bool:
    """Per ``<algo>.optimizer_kernel`` (off-policy), run the update arithmetic after the gradients as C++ kernels
    (``ops/custom/offpolicy_optim.cc``): a :class:`GuardedAdamKernel` on every
    :class:`~scalebox_ms.models.offpolicy.AdamGroup` of ``learner`` and a :class:`PolyakKernel` for its target
    updates (``learner.polyak_kernel``), set before its graphs compile; returns whether they run. ``custom`` that
    cannot run raises (ConfigError / CustomOpError); ``auto`` then keeps the graph ops. The choice is logged."""
    from ..models.offpolicy import AdamGroup

    key = f"{config.algo}.optimizer_kernel"
    choice = config.algo_config.optimizer_kernel
    if choice == "builtin":
        _report(key, choice, "graph ops", "as configured")
        return False
    blockers = []
    if device != "CPU":
        blockers.append(f"the {device} backend (the kernel is CPU code)")
    if amp is not None:
        blockers.append(f"amp.level {amp.level} (the kernel computes in float32 without a loss scale)")
    if blockers and choice == "custom":
        raise ConfigError(f"{key}: custom cannot run with {blockers[0]}; use builtin or auto")
    groups = [cell for _, cell in learner.cells_and_names() if isinstance(cell, AdamGroup)]
    largest = max(sum(int(np.prod(p.shape)) for p in group.params) for group in groups)
    if choice == "auto" and largest > AUTO_OPTIMIZER_MAX_ELEMENTS:
        blockers.append(f"an optimizer of {largest} values > {AUTO_OPTIMIZER_MAX_ELEMENTS}, beyond the measured range")
    if blockers:
        _report(key, choice, "graph ops", "; ".join(blockers))
        return False
    from ..ops.custom import build
    from ..ops.custom.offpolicy_optim import KERNEL, GuardedAdamKernel, PolyakKernel

    build.SETTINGS[KERNEL] = key  # (named in the no-compiler error: the builtin path of this algorithm)
    try:
        kernels = [GuardedAdamKernel(group) for group in groups]
        polyak = PolyakKernel(learner.target_params, learner.online_params)
    except CustomOpError as exc:
        if choice == "custom":
            raise CustomOpError(f"{key}: custom: {exc}") from None
        _report(key, choice, "graph ops", f"the C++ kernel cannot be built: {exc}", fallback=True)
        return False
    for group, kernel in zip(groups, kernels):
        group.set_kernel(kernel)
    learner.polyak_kernel = polyak
    _report(key, choice, "C++ kernel", f"CPU, float32; {len(groups)} optimizer(s) and the target updates")
    return True
