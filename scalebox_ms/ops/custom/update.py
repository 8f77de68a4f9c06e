"""``PPOUpdateKernel``: the whole PPO minibatch update (forward, loss, backward, grad clip, Adam) as ONE C++ kernel.

``PPOUpdateKernel(model, optimizer, ppo_cfg)`` is a drop-in for
:class:`scalebox_ms.trainers.ppo_update.PPOUpdateStep` without AMP, data parallelism or micro-batches:
``kernel(features, actions, indices, learning_rate, clip_range, clip_range_vf, kl_limit)`` returns the same
float32 ``(N_STATS,)`` vector, columns :data:`scalebox_ms.ops.layout.STAT_COLUMNS` (``finite`` is 0 when a non-finite loss or gradient skipped the step, ``loss_scale``
is always 1; ``ops/custom/layout.h`` mirrors the names for the C++), and applies the same update: the gradient
of PPOLoss (the maths of :mod:`scalebox_ms.trainers.ppo_update`, derived by hand in ``ppo_loss.h``), the
global-norm clip ``g * min(1, max_norm / (norm + 1e-6))`` and MindSpore ``nn.Adam``'s step (``P.Adam``'s CPU
formula, beta powers, ``global_step``); with ``ppo_cfg.target_kl`` set, nothing changes when
``approx_kl > kl_limit``. Adam's ``learning_rate`` Parameter is set to ``learning_rate`` on every call (as
PPOUpdateStep does).

State: the model's Parameters (weights, biases, ``log_std``) and the given ``nn.Adam``'s ``moment1``/``moment2``/
``beta1_power``/``beta2_power``/``global_step``/``learning_rate`` are inputs of the kernel, which writes them IN
PLACE. On MindSpore 2.10 CPU graph mode an aot kernel receives the Parameters' own memory, so every other
compiled graph (ActStep, ValueStep, PPOUpdateStep, ``AssignParameters``) and ``Parameter.asnumpy()`` see the new
values with no extra kernel (tests/test_custom_update.py checks it). This relies on MindSpore not copying
Parameter inputs of a Custom op, which is not a documented contract: the tests are the guard on a MindSpore
upgrade.

``kernel.run_epochs(features, actions, indices, learning_rate, clip_range, clip_range_vf, kl_limit)`` runs ALL
minibatches of an update (every epoch) in one kernel call: ``indices`` int32 ``(n_mb, b)``, row i the i-th
minibatch's rows (epoch-major order). The rows are applied sequentially exactly as ``n_mb`` successive ``kernel(...)``
calls (same code, bit-identical results); it returns float32 ``(n_mb, N_STATS + 1)``: per row the statistics
and, in column ``layout.RAN``, 1.0 if the row was processed. With ``target_kl`` set, the first row whose ``kl_ok``
is 0 (its step skipped, its statistics reported, as a single call would) is the last one: later rows get
``ran = 0`` and statistics 0. This saves the per-call launch overhead of every minibatch but the first
(docs/custom_ops.md).

Threads: a minibatch of 2048 rows or more is split into ``ceil(rows / 512)`` contiguous blocks of rows (forward,
loss terms and backward per block, partial sums and gradients combined in the fixed block order) that run on
``T`` threads: ``$SCALEBOX_MS_KERNEL_THREADS`` if set to an integer >= 1, else the hardware threads capped at 8,
read on every call. Results are deterministic and identical for every ``T`` (the block split, not the thread
count, sets the float summation order; against one pass over all rows it differs by ~1e-7 relative per step).
Smaller minibatches (e.g. CartPole's 256) run the original single-thread code, no thread started.
:func:`kernel_threads` tells what a minibatch size would use.

Supported: CPU, ``layer='dense'`` float32 ActorCritic models, tanh/relu hidden layers, 1..16 layers per MLP,
Discrete or Box actions; a plain ``nn.Adam`` over exactly the model's trainable Parameters (no weight decay,
loss scale 1, no nesterov/amsgrad/lazy/offload, no groups, a fixed learning rate Parameter). Anything else raises
:class:`scalebox_ms.errors.CustomOpError` (one line).

Errors inside a call: the kernel checks its inputs (every minibatch index against the rollout, every discrete
action against the action space) before it writes anything, and returns a code instead of throwing (no exception
escapes the kernel, so a failure never aborts the process). The call then raises
``CustomOpError("custom op 'ppo_update': <what went wrong> (kernel return code N)")`` (the codes:
:data:`scalebox_ms.ops.custom.status.MESSAGES`), and the kernel stays usable: its graph is rebuilt for the next
call (MindSpore 2.10 leaves a graph whose kernel failed unable to run again).

Configuration guard: the kernel implements a fixed subset of :class:`~scalebox_ms.config.PPOConfig` and
:class:`~scalebox_ms.config.PolicyConfig`. Every field is classified in :data:`KERNEL_IMPLEMENTS` or
:data:`OUTSIDE_THE_UPDATE`; :func:`unsupported_settings` lists the others that differ from their defaults (a new
loss option the kernel does not know), and ``PPOUpdateKernel`` refuses them.
"""
from __future__ import annotations

import dataclasses

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn, ops

from ...errors import CustomOpError
from ..fused import mlp_layers
from ..layout import N_STATS
from .actor import ACT_IDS, MAX_LAYERS
from .build import KERNELS, SETTINGS, func_spec, library_path
from .status import custom_op_errors

KERNEL = "ppo_update"
KERNELS.setdefault(KERNEL, ("ppo_update.cc", "PPOUpdate"))  # registered here: build.py is shared code
SETTINGS.setdefault(KERNEL, "ppo.update_kernel")
EPOCHS_SYMBOL = "PPOUpdateEpochs"  # second entry point of ppo_update.cc: all minibatches of an update in one call

#: config fields the kernel reads or implements (from the config, the model, the optimizer or a per-call input)
KERNEL_IMPLEMENTS = frozenset({
    "ppo.ent_coef", "ppo.vf_coef", "ppo.max_grad_norm", "ppo.normalize_advantage",
    "ppo.clip_range_vf",  # None or not: value clipping (meta); the range itself is a per-call input
    "ppo.target_kl",  # None or not: the KL early stop (meta); the limit (1.5 target_kl) is a per-call input
    "ppo.adam_eps",  # read from the optimizer (nn.Adam's eps)
    "policy.pi_layers", "policy.vf_layers", "policy.activation",  # read from the model (_describe)
})
#: config fields outside the update's maths: the trainer's business, per-call inputs, or model initialisation
OUTSIDE_THE_UPDATE = frozenset({
    "ppo.n_steps", "ppo.batch_size", "ppo.min_batch", "ppo.max_batch", "ppo.n_epochs",  # rollout / minibatching
    "ppo.gamma", "ppo.gae_lambda",  # GAE, before the update
    "ppo.learning_rate", "ppo.lr_schedule", "ppo.clip_range", "ppo.clip_schedule",  # per-call inputs
    "ppo.update_kernel",  # the choice of this kernel
    "policy.ortho_init", "policy.log_std_init",  # initial weights
    "policy.layer", "policy.align",  # the model's storage: _describe refuses anything but layer='dense'
    "policy.act_kernel",  # the acting call
    # the image feature extractor: _describe refuses models with one (and the multi-discrete/binary heads)
    "policy.features", "policy.share_features", "policy.cnn_channels", "policy.cnn_features_dim",
    "policy.conv_kernel", "policy.conv_backend",
})


def _default(field):
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return dataclasses.MISSING


def unsupported_settings(ppo_cfg, policy_cfg=None) -> list:
    """``["ppo.<field>=<value>", ...]``: the fields of ``ppo_cfg`` and ``policy_cfg`` (dataclasses; subclasses
    included) in neither :data:`KERNEL_IMPLEMENTS` nor :data:`OUTSIDE_THE_UPDATE` whose value is not the field's
    default: settings the kernel would silently ignore. ``PPOUpdateKernel`` refuses a config that has any."""
    out = []
    for section, cfg in (("ppo", ppo_cfg), ("policy", policy_cfg)):
        if cfg is None:
            continue
        for field in dataclasses.fields(cfg):
            name = f"{section}.{field.name}"
            if name in KERNEL_IMPLEMENTS or name in OUTSIDE_THE_UPDATE:
                continue
            value = getattr(cfg, field.name)
            if value != _default(field):
                out.append(f"{name}={value!r}")
    return out


def kernel_threads(rows: int) -> tuple:
    """(threads, blocks) the kernel uses for a minibatch of ``rows`` rows under the current environment
    (``SCALEBOX_MS_KERNEL_THREADS``); (1, 1) below 2048 rows. Compiles the kernel if it is not cached."""
    import ctypes

    lib = ctypes.CDLL(library_path(KERNEL))
    return int(lib.PPOUpdateThreads(ctypes.c_int(rows))), int(lib.PPOUpdateBlocks(ctypes.c_int(rows)))


def _fail(msg: str):
    raise CustomOpError(f"custom op {KERNEL!r}: {msg}")


def _describe(model):
    """(meta int32 list, [LayerInfo] policy, [LayerInfo] value) of a supported ActorCritic."""
    if getattr(model, "layer", "dense") != "dense":
        _fail(f"needs layer='dense' models, got layer={model.layer!r}")
    if getattr(model, "features", None) is not None:
        _fail("implements MLPs on flat observations, not the NatureCNN of image observations; use PPOUpdateStep")
    if model.spec.action_kind not in ("discrete", "box"):
        _fail(f"implements Discrete and Box actions, not {model.spec.action_kind}; use PPOUpdateStep")
    if getattr(model, "amp_level", "O0") != "O0" or getattr(model, "head_dtype", None) is not None:
        _fail("computes in float32 and cannot update an AMP-cast model; use PPOUpdateStep")
    pi, vf = mlp_layers(model.pi_net), mlp_layers(model.vf_net)
    if not pi or not vf:
        _fail(f"{type(model).__name__} has no Dense policy and value MLPs")
    if any(layer.fused for layer in pi + vf):
        _fail("needs nn.Dense layers, not FusedDense")
    if len(pi) > MAX_LAYERS or len(vf) > MAX_LAYERS:
        _fail(f"at most {MAX_LAYERS} layers per MLP ({MAX_LAYERS - 1} hidden layers and the head), got {len(pi)} and "
              f"{len(vf)}")
    hidden = {layer.activation for layer in pi[:-1] + vf[:-1]}
    if len(hidden) > 1 or not hidden <= set(ACT_IDS) or pi[-1].activation or vf[-1].activation:
        _fail(f"needs one hidden activation (tanh or relu) and linear heads, got {sorted(map(str, hidden))}")
    n_cells = sum(1 for _ in model.pi_net.cells()) + sum(1 for _ in model.vf_net.cells())
    if n_cells != 2 * (len(pi) + len(vf)) - 2:
        _fail("the MLPs contain cells other than Dense + Tanh/ReLU")
    spec = model.spec
    if pi[0].in_features != spec.obs_dim or vf[0].in_features != spec.obs_dim or \
            pi[-1].out_features != spec.action_dim or vf[-1].out_features != 1:
        _fail(f"MLP sizes do not match the spaces (obs {spec.obs_dim}, actions {spec.action_dim})")
    for layer in pi + vf:
        for p in (layer.weight, layer.bias):
            if p.dtype != ms.float32:
                _fail(f"parameter {p.name} is {p.dtype}, needs float32")
    act = ACT_IDS[hidden.pop()] if hidden else 0
    return [len(pi), len(vf), int(spec.discrete), act, spec.obs_dim, spec.action_dim], pi, vf


def _check_optimizer(optimizer, params):
    if type(optimizer) is not nn.Adam:
        _fail(f"needs a plain mindspore.nn.Adam, got {type(optimizer).__name__}")
    bad = [name for name, on in (("use_lazy", optimizer.use_lazy), ("use_offload", optimizer.use_offload),
                                 ("use_amsgrad", optimizer.use_amsgrad), ("use_nesterov", optimizer.use_nesterov),
                                 ("weight decay", optimizer.exec_weight_decay), ("parameter groups", optimizer.is_group),
                                 ("a dynamic learning rate", optimizer.dynamic_lr),
                                 ("loss_scale != 1", float(optimizer.loss_scale) != 1.0),
                                 ("grad centralization", any(getattr(optimizer, "gc_flags", ()) or ())))
           if on]
    if bad:
        _fail(f"unsupported nn.Adam options: {', '.join(bad)}")
    opt_params = list(optimizer._parameters)  # noqa: SLF001 (Adam's own ordering of moment1/moment2)
    if {id(p) for p in opt_params} != {id(p) for p in params} or len(opt_params) != len(params):
        _fail("the optimizer must hold exactly the model's trainable parameters")
    position = {id(p): i for i, p in enumerate(opt_params)}
    m1 = [optimizer.moment1[position[id(p)]] for p in params]
    m2 = [optimizer.moment2[position[id(p)]] for p in params]
    return m1, m2


class _Call(nn.Cell):
    """One entry point of the kernel as a compiled graph: the 7 per-call inputs plus the state the kernel reads and
    writes (the Parameters are referenced, not copied). Replaced by a fresh one (a new graph) after a failed call."""

    def __init__(self, op, kernel):
        super().__init__(auto_prefix=False)
        self.op = op
        opt = kernel.optimizer
        self.meta, self.hyper, self.learning_rate = kernel.meta, kernel.hyper, kernel.learning_rate
        self.beta1_power, self.beta2_power, self.global_step = opt.beta1_power, opt.beta2_power, opt.global_step
        self.log_std, self.m_log_std, self.v_log_std = kernel.log_std, kernel.m_log_std, kernel.v_log_std
        self.params, self.moment1, self.moment2 = kernel.params, kernel.moment1, kernel.moment2

    @ms.jit
    def construct(self, features, actions, indices, learning_rate, clip_range, clip_range_vf, kl_limit):
        return self.op(features, actions, indices, learning_rate, clip_range, clip_range_vf, kl_limit, self.meta,
                       self.hyper, self.learning_rate, self.beta1_power, self.beta2_power, self.global_step,
                       self.log_std, self.m_log_std, self.v_log_std, *self.params, *self.moment1, *self.moment2)


class PPOUpdateKernel(nn.Cell):
    """One PPO minibatch update as one C++ aot kernel; same call and return as ``PPOUpdateStep``.

    Args:
        model: a float32 ``layer='dense'`` :class:`~scalebox_ms.models.ActorCritic`.
        optimizer: the ``nn.Adam`` over ``model.trainable_params()`` whose state the kernel updates in place
            (e.g. ``PPOUpdateStep(model, cfg).optimizer``, to swap the kernel in for that step).
        ppo_cfg: :class:`~scalebox_ms.config.PPOConfig` (ent_coef, vf_coef, clip_range_vf is None or not,
            normalize_advantage, max_grad_norm, target_kl is None or not).
        policy_cfg: the :class:`~scalebox_ms.config.PolicyConfig` the model was built from, if any: checked,
            with ``ppo_cfg``, by :func:`unsupported_settings`.

    Raises :class:`CustomOpError` for anything the kernel does not implement, and from a call whose kernel failed.
    """

    def __init__(self, model, optimizer, ppo_cfg, *, policy_cfg=None):
        super().__init__(auto_prefix=False)
        unsupported = unsupported_settings(ppo_cfg, policy_cfg)
        if unsupported:
            _fail(f"does not implement {', '.join(unsupported)}; use PPOUpdateStep (ppo.update_kernel: builtin)")
        target = ms.get_context("device_target")
        if target != "CPU":
            _fail(f"the C++ kernel runs on CPU only, not {target}; use PPOUpdateStep")
        meta, pi, vf = _describe(model)
        self.discrete = bool(model.spec.discrete)
        self.n_actions = int(model.spec.action_dim)
        layer_params = [p for layer in pi + vf for p in (layer.weight, layer.bias)]
        trainable = list(model.trainable_params())
        all_params = layer_params + ([] if self.discrete else [model.log_std])
        if {id(p) for p in trainable} != {id(p) for p in all_params} or len(trainable) != len(all_params):
            _fail("the model has trainable parameters outside its policy/value MLPs and log_std")
        m1, m2 = _check_optimizer(optimizer, all_params)
        n = len(layer_params)
        # meta: MlpMeta, then PPOMeta (ppo_state.h), then the layer widths
        meta += [int(ppo_cfg.normalize_advantage), int(ppo_cfg.clip_range_vf is not None),
                 int(ppo_cfg.target_kl is not None)]
        meta += [layer.out_features for layer in pi] + [layer.out_features for layer in vf]
        self.meta = Tensor(np.asarray(meta, np.int32))
        beta1 = float(optimizer.beta1.asnumpy())
        beta2 = float(optimizer.beta2.asnumpy())
        eps = float(optimizer.eps.asnumpy())
        hyper = [ppo_cfg.ent_coef, ppo_cfg.vf_coef, ppo_cfg.max_grad_norm, beta1, beta2, eps]  # enum Hyper
        self.hyper = Tensor(np.asarray(hyper, np.float32))
        self.optimizer = optimizer
        self.learning_rate = optimizer.learning_rate
        if not isinstance(self.learning_rate, ms.Parameter) or self.learning_rate.dtype != ms.float32 or \
                self.learning_rate.shape not in ((), (1,)):
            _fail("needs nn.Adam with a fixed float learning rate (a float32 scalar Parameter)")
        if optimizer.global_step.dtype != ms.int32:
            _fail("nn.Adam.global_step must be int32")
        if self.discrete:  # placeholders: the kernel never reads or writes them for discrete actions
            dummy = np.zeros(model.spec.action_dim, np.float32)
            self.log_std, self.m_log_std, self.v_log_std = Tensor(dummy), Tensor(dummy), Tensor(dummy)
        else:
            self.log_std, self.m_log_std, self.v_log_std = model.log_std, m1[n], m2[n]
        self.params = ms.ParameterTuple(layer_params)
        self.moment1 = ms.ParameterTuple(m1[:n])
        self.moment2 = ms.ParameterTuple(m2[:n])
        self.op = ops.Custom(func_spec(KERNEL), out_shape=lambda *shapes: (N_STATS,),
                             out_dtype=lambda *dtypes: ms.float32, func_type="aot")
        self.op_epochs = ops.Custom(f"{library_path(KERNEL)}:{EPOCHS_SYMBOL}",
                                    out_shape=lambda *shapes: (shapes[2][0], N_STATS + 1),
                                    out_dtype=lambda *dtypes: ms.float32, func_type="aot")
        self.call_one = _Call(self.op, self)
        self.call_epochs = _Call(self.op_epochs, self)

    def state_parameters(self):
        """Parameters besides the model's and Adam's that belong in a checkpoint: none (no AMP loss scaler)."""
        return []

    def construct(self, features, actions, indices, learning_rate, clip_range, clip_range_vf, kl_limit):
        """One minibatch: ``indices`` int32 (b,); returns the float32 (N_STATS,) statistics (ops.layout.STAT)."""
        return self._launch("call_one", features, actions, indices, learning_rate, clip_range, clip_range_vf,
                            kl_limit)

    def run_epochs(self, features, actions, indices, learning_rate, clip_range, clip_range_vf, kl_limit):
        """All minibatches of an update in one kernel call; ``indices`` int32 (n_mb, b); returns float32
        (n_mb, N_STATS + 1): per minibatch the statistics and ``RAN`` (ops.layout). See the module docstring."""
        return self._launch("call_epochs", features, actions, indices, learning_rate, clip_range, clip_range_vf,
                            kl_limit)

    def _launch(self, which, features, actions, indices, *scalars):
        call = getattr(self, which)
        try:
            with custom_op_errors(lambda code: self._detail(code, features, actions, indices)):
                return call.construct(features, actions, indices, *scalars)
        except Exception:
            setattr(self, which, _Call(call.op, self))  # a graph whose kernel failed cannot run again: a new one
            raise

    def _detail(self, code, features, actions, indices):
        """The bad index or action of a failed call (codes 8 and 9), for the error message; None otherwise."""
        if code not in (8, 9):
            return None
        rows = int(features.shape[0])
        idx = indices.asnumpy().reshape(-1).astype(np.int64)
        bad = idx[(idx < 0) | (idx >= rows)]
        if code == 8:
            return f"minibatch index {bad[0]} is outside the rollout of {rows} rows" if bad.size else None
        chosen = actions.asnumpy().reshape(-1)[idx[(idx >= 0) & (idx < rows)]]
        wrong = chosen[(chosen < 0) | (chosen >= self.n_actions)] if self.discrete else chosen[:0]
        return (f"discrete action {wrong[0]} is outside the action space of {self.n_actions} actions"
                if wrong.size else None)
