"""Networks of the off-policy algorithms and the two graph helpers they share (Adam groups, Polyak updates).

Layouts are Stable-Baselines3's ``MlpPolicy`` ones, so hyper-parameters tuned for SB3 carry over:

* :class:`QNetwork` (DQN): obs -> MLP(``vf_layers``) -> one Q value per action; image observations go through
  a NatureCNN first (SB3's ``CnnPolicy`` has no hidden layers after it: ``configs/dqn_atari.yaml`` sets
  ``vf_layers: []``; the default stays ``[64, 64]``).
* :class:`TwinCritic` (SAC, TD3): two independent MLPs (``vf_layers``) on ``concat(obs, action)`` -> Q, run as one
  ensemble of batched matmuls (:class:`EnsembleDense`).
* :class:`SquashedGaussianActor` (SAC): obs -> MLP(``pi_layers``, activation after every layer) -> mean and
  log-std heads; ``a = tanh(mean + std * eps)`` with the log-probability of the squashed sample
  (``log N(u) - sum log(1 - tanh(u)^2 + 1e-6)``; log-std clipped to [-20, 2]); both tanh terms through sigmoids
  (:func:`squash`: MindSpore's CPU tanh saturates early).
* :class:`DeterministicActor` (TD3): obs -> MLP(``pi_layers``) -> tanh.

With ``cnn`` (:func:`cnn_kwargs`), uint8 image observations (B, C, H, W) go through a NatureCNN first
(``features``), and the MLPs read its features: SB3's ``CnnPolicy``; Dict/Tuple observations with images inside
through a :class:`~scalebox_ms.models.cnn.CombinedFeatures` (a NatureCNN per image: SB3's ``MultiInputPolicy``).
Each network has its own CNN, as SB3's SAC and TD3 (``share_features_extractor=False``): the actor's is trained
by the actor loss, the critic's (one CNN under both Q-nets) by the critic loss, and targets copy theirs.

Actions of continuous actors live in [-1, 1]; the trainer maps them to the env's Box bounds. Weights start with
MindSpore's ``nn.Dense`` defaults (the same uniform ranges as PyTorch's ``nn.Linear``, which SB3 uses), or
orthogonal with ``policy.ortho_init``.

:class:`AdamGroup` is one Adam optimizer over a group of Parameters with its own step counter and moment names
(``<prefix>.m.<param>``), so several can live in one graph (two ``nn.Adam`` in one graph clash on their
``global_step`` Parameter on MindSpore 2.10). Each group applies MindSpore's fused ``ops.Adam`` kernel (one kernel
per Parameter; epsilon outside the bias correction, as in ``nn.Adam``; PyTorch adds it after correcting ``v``, a
difference of eps * (1 - sqrt(1 - beta2^t)) in the denominator).
"""
from __future__ import annotations

import math

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn, ops

from ..amp import update_scale
from .actor_critic import mlp

LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0
SQUASH_EPS = 1e-6


def squash(u):
    """tanh(u), as ``2 sigmoid(2u) - 1``: within 1.6e-6 of float64's tanh on [-30, 30], its gradient too.
    MindSpore 2.10's CPU Tanh is off by up to 1e-4, returns up to 1.0000098 near |u| = 5 and exactly 1.0 (gradient
    0) from |u| of about 4.97 on, where float32's tanh is 0.99990 (measured on a grid of [-20, 20]): SAC's
    log-probability was up to 5.2 nats too high there and the actor got no gradient out of saturation."""
    return 2.0 * ops.sigmoid(2.0 * u) - 1.0


def log_one_minus_squash_sq(u):
    """``log(1 - tanh(u)^2 + 1e-6)`` (SB3's correction of the squashed log-probability) from ``u``, as
    ``1 - tanh(u)^2 = 4 sigmoid(2u) sigmoid(-2u)``: within 5e-6 of float64 on [-30, 30] with its gradient. From the
    float32 action ``a`` itself, ``1 - a^2`` has an error of ~1e-7 against the 1e-6 floor once ``|a|`` is near 1
    (0.06 nats off even with an exact tanh)."""
    return ops.log(4.0 * ops.sigmoid(2.0 * u) * ops.sigmoid(-2.0 * u) + SQUASH_EPS)


def _trunk(in_dim: int, layers, activation: str, ortho: bool) -> nn.Cell:
    """Dense + activation for every layer of ``layers`` (an MLP whose output is activated: SB3's latent_pi); no
    layers: the identity (the heads read the observation's features themselves: a linear policy)."""
    if not layers:
        return nn.Identity()
    net = mlp(in_dim, list(layers[:-1]), layers[-1], activation, ortho, math.sqrt(2.0))
    act = {"tanh": nn.Tanh, "relu": nn.ReLU}[activation]()
    return nn.SequentialCell(list(net.cells()) + [act])


def _head(in_dim: int, out_dim: int, ortho: bool, gain: float = 1.0) -> nn.Dense:
    return mlp(in_dim, [], out_dim, "relu", ortho, gain)[0]


def cnn_kwargs(spec, policy_cfg):
    """The feature extractor's arguments for image observations (``spec.cnn``: uint8 (C, H, W) frames, or images
    inside a Dict/Tuple; the ``policy.cnn_*`` sizes), else None (an MLP on the flat observation)."""
    if not spec.cnn:
        return None
    return {"spec": spec, "channels": tuple(policy_cfg.cnn_channels), "features_dim": policy_cfg.cnn_features_dim,
            "ortho": policy_cfg.ortho_init}


def _features(obs_dim: int, cnn):
    """(extractor or None, the MLP input width): a NatureCNN / CombinedFeatures per ``cnn`` (:func:`cnn_kwargs`)."""
    if cnn is None:
        return None, obs_dim
    from .cnn import build_features

    features = build_features(**cnn)
    return features, features.features_dim


def _encode(features, obs):
    """The MLP input: the observation itself, or the CNN features of the uint8 frames (graph code)."""
    return obs if features is None else features(obs)


class QNetwork(nn.Cell):
    """obs (B, obs_dim) -> Q values (B, n_actions); with ``cnn`` (:func:`cnn_kwargs`) uint8 images (B, C, H, W)
    (or a Dict/Tuple with images inside) -> NatureCNN features -> the MLP
    (SB3's DQN ``CnnPolicy``; ``features.*`` Parameters, ``q_net`` reads the features)."""

    def __init__(self, obs_dim: int, n_actions: int, layers, activation: str = "relu", ortho: bool = False,
                 cnn=None):
        super().__init__()
        self.features, obs_dim = _features(obs_dim, cnn)
        self.q_net = mlp(obs_dim, list(layers), n_actions, activation, ortho, 1.0)

    def construct(self, obs):
        # (float32 maths after a low-precision net under AMP)
        return self.q_net(_encode(self.features, obs)).astype(ms.float32)


class EnsembleDense(nn.Cell):
    """K independent dense layers applied at once, on column-major activations: x (K, in, B) ->
    W_k @ x_k + b_k, (K, out, B), one batched matmul and one BiasAdd. ``weight`` (K, out, in) and ``bias`` (K, out)
    start as the stacked weights of the K given ``nn.Dense`` layers (so their initialisation, ``policy.ortho_init``
    included, is nn.Dense's). Features x batch, not batch x features: the bias is then a per-row (channel) add
    whose gradient sums contiguous rows, cheaper on CPU than a broadcast add over (K, B, out) and its strided
    reduction."""

    def __init__(self, layers):
        super().__init__()
        self.weight = Parameter(Tensor(np.stack([d.weight.asnumpy() for d in layers])), name="weight")
        self.bias = Parameter(Tensor(np.stack([d.bias.asnumpy() for d in layers])), name="bias")
        self.bias_add = ops.BiasAdd()
        self.matmul_t = ops.MatMul(transpose_b=True)
        self.bmm = ops.BatchMatMul()

    def member(self, x, k: int):
        """Layer ``k`` alone on row-major activations: x (B, in) -> x @ W_k^T + b_k, (B, out) (a 2-D matmul)."""
        _, out, n_in = self.weight.shape  # (ops.slice: cheaper on CPU than a StridedSlice of the weight)
        w = ops.slice(self.weight, (k, 0, 0), (1, out, n_in)).reshape((out, n_in)).astype(x.dtype)  # (AMP)
        b = ops.slice(self.bias, (k, 0), (1, out)).reshape((out,)).astype(x.dtype)
        return self.bias_add(self.matmul_t(x, w), b)

    def construct(self, x):
        y = self.bmm(self.weight, x)
        k, out, n = y.shape
        if n == 1:  # (static: MindSpore 2.10's CPU BiasAddGrad refuses a last dimension of 1, a batch of one)
            return y + self.bias.reshape((k, out, 1))
        return self.bias_add(y.reshape((1, k * out, n)), self.bias.reshape((-1,))).reshape((k, out, n))


class TwinCritic(nn.Cell):
    """(obs, action) -> Q (2, B): two independent MLPs on concat(obs, action) (clipped double-Q), row k = Q_k; with
    ``cnn``, on concat(NatureCNN(obs), action), one CNN under both (SB3's ContinuousCritic).

    The two MLPs run as one ensemble (``qf``: :class:`EnsembleDense` layers, weights stacked (2, out, in)):
    every layer of both critics is one batched matmul and one bias add, half the kernels of two separate MLPs.
    Initialised exactly as two ``mlp`` (nn.Dense) networks drawn one after the other; checkpoints and hashes see
    them in that layout (``qf0.*``/``qf1.*``, :func:`split_ensemble`)."""

    def __init__(self, obs_dim: int, action_dim: int, layers, activation: str = "relu", ortho: bool = False,
                 cnn=None):
        super().__init__()
        self.features, obs_dim = _features(obs_dim, cnn)
        nets = [mlp(obs_dim + action_dim, list(layers), 1, activation, ortho, 1.0) for _ in range(2)]
        self.qf = nn.SequentialCell([EnsembleDense([a, b]) if isinstance(a, nn.Dense) else a
                                     for a, b in zip(nets[0].cells(), nets[1].cells())])
        self.dense_at = tuple(isinstance(c, EnsembleDense) for c in self.qf.cells())  # (static, for first())

    def construct(self, obs, action):
        x = ops.concat([_encode(self.features, obs), action], 1).T  # (D, B)
        q = self.qf(ops.broadcast_to(x, (2,) + x.shape))  # (2, 1, B)
        return q.reshape((2, -1)).astype(ms.float32)  # (float32 maths after a low-precision net under AMP)

    def first(self, obs, action):
        """Q_1 alone, (B,) (TD3's actor loss): critic 1's layers as 2-D matmuls on its slices of the weights, half
        the work of both critics."""
        h = ops.concat([_encode(self.features, obs), action], 1)
        for i in range(len(self.qf)):
            h = self.qf[i].member(h, 0) if self.dense_at[i] else self.qf[i](h)
        return h.reshape((-1,)).astype(ms.float32)


ENSEMBLE = "qf"  # the name segment of TwinCritic's stacked layers; "qf0"/"qf1" in the per-critic (nn.Dense) layout


def _member_names(name: str, k_count: int = 2):
    """The per-critic names of ensemble tensor ``name`` (``...qf.<i>...`` -> ``...qf0.<i>...``, ``...qf1...``), or
    None if ``name`` is not one (a whole ``qf`` segment only)."""
    parts = name.split(".")
    if ENSEMBLE not in parts:
        return None
    at = parts.index(ENSEMBLE)
    return [".".join(parts[:at] + [f"{ENSEMBLE}{k}"] + parts[at + 1:]) for k in range(k_count)]


def split_ensemble(name: str, array):
    """[(name, array)] of one stored Parameter in the per-critic nn.Dense layout: a TwinCritic ensemble tensor
    (``...qf.<i>.weight`` (2, out, in), ``.bias`` (2, out), and the Adam moments of both) becomes
    ``...qf0.<i>.weight`` (out, in) and ``...qf1...``; any other Parameter is returned as it is."""
    names = _member_names(name, np.shape(array)[0]) if np.ndim(array) else None
    return [(name, array)] if names is None else [(n, array[k]) for k, n in enumerate(names)]


def stack_ensemble(name: str, tensors: dict):
    """Inverse of :func:`split_ensemble` for one stored ``name``: its stacked array built from the per-critic
    arrays in ``tensors`` (a checkpoint written before the ensemble layout), or None when they are not there."""
    names = _member_names(name)
    if names is None or any(n not in tensors for n in names):
        return None
    return np.stack([np.asarray(tensors[n]) for n in names])


class SquashedGaussianActor(nn.Cell):
    """SAC's actor: tanh-squashed diagonal Gaussian with state-dependent log-std."""

    def __init__(self, obs_dim: int, action_dim: int, layers, activation: str = "relu", ortho: bool = False,
                 cnn=None):
        super().__init__()
        self.features, obs_dim = _features(obs_dim, cnn)
        self.latent_pi = _trunk(obs_dim, list(layers), activation, ortho)
        width = layers[-1] if layers else obs_dim
        self.mu = _head(width, action_dim, ortho, 0.01)
        self.log_std = _head(width, action_dim, ortho, 0.01)

    def action_log_prob(self, obs, eps):
        """Reparameterised sample ``tanh(mean + std * eps)`` for standard-normal ``eps`` and its log-probability."""
        h = self.latent_pi(_encode(self.features, obs))
        mean = self.mu(h).astype(ms.float32)
        log_std = ops.clip_by_value(self.log_std(h).astype(ms.float32), LOG_STD_MIN, LOG_STD_MAX)
        u = mean + ops.exp(log_std) * eps
        action = squash(u)
        gaussian = (-0.5 * eps * eps - log_std - 0.5 * math.log(2.0 * math.pi)).sum(1)
        return action, gaussian - log_one_minus_squash_sq(u).sum(1)

    def construct(self, obs):
        """The deterministic action: tanh of the mean."""
        return squash(self.mu(self.latent_pi(_encode(self.features, obs))).astype(ms.float32))


class DeterministicActor(nn.Cell):
    """TD3's actor: obs -> tanh(MLP(obs))."""

    def __init__(self, obs_dim: int, action_dim: int, layers, activation: str = "relu", ortho: bool = False,
                 cnn=None):
        super().__init__()
        self.features, obs_dim = _features(obs_dim, cnn)
        self.mu = mlp(obs_dim, list(layers), action_dim, activation, ortho, 1.0)

    def construct(self, obs):
        return squash(self.mu(_encode(self.features, obs)).astype(ms.float32))


def copy_network(net: nn.Cell, prefix: str) -> nn.Cell:
    """A target network: same class and weights, Parameters renamed ``<prefix>.<name>``, no gradients."""
    import copy

    target = copy.deepcopy(net)
    for (name, p), (_, src) in zip(target.parameters_and_names(), net.parameters_and_names()):
        p.name = f"{prefix}.{name}"
        p.set_data(Tensor(src.asnumpy()))
        p.requires_grad = False
    return target


class AdamGroup(nn.Cell):
    """Adam over ``params`` with its own step counter and moments (named ``<prefix>.m.<name>``/``.v.``)."""

    def __init__(self, params, prefix: str, eps: float, beta1: float = 0.9, beta2: float = 0.999):
        super().__init__(auto_prefix=False)
        self.params = ms.ParameterTuple(params)
        self.m = ms.ParameterTuple([Parameter(Tensor(np.zeros(p.shape, np.float32)), name=f"{prefix}.m.{p.name}",
                                              requires_grad=False) for p in params])
        self.v = ms.ParameterTuple([Parameter(Tensor(np.zeros(p.shape, np.float32)), name=f"{prefix}.v.{p.name}",
                                              requires_grad=False) for p in params])
        self.step = Parameter(Tensor(0.0, ms.float32), name=f"{prefix}.step", requires_grad=False)
        self.beta1, self.beta2, self.eps = float(beta1), float(beta2), float(eps)
        self.adam = ops.Adam()
        self.kernel = None  # a GuardedAdamKernel: guarded_update's arithmetic as one C++ kernel (set_kernel)

    def set_kernel(self, kernel) -> None:
        """Run :func:`guarded_update` on this group through ``kernel`` (an
        :class:`~scalebox_ms.ops.custom.offpolicy_optim.GuardedAdamKernel`, or None for the graph ops); before the
        first compile of a graph that updates the group."""
        self.kernel = kernel

    def apply(self, grads, lr):
        step = self.step + 1.0
        ops.assign(self.step, step)
        b1p = ops.pow(Tensor(self.beta1, ms.float32), step)
        b2p = ops.pow(Tensor(self.beta2, ms.float32), step)
        b1 = Tensor(self.beta1, ms.float32)
        b2 = Tensor(self.beta2, ms.float32)
        eps = Tensor(self.eps, ms.float32)
        done = []
        for p, m, v, g in zip(self.params, self.m, self.v, grads):
            done.append(self.adam(p, m, v, b1p, b2p, lr, b1, b2, eps, g)[0])
        return done

    def state(self):
        return list(self.m) + list(self.v) + [self.step]


def polyak(targets, sources, tau, kernel=None):
    """target <- (1 - tau) * target + tau * source for every pair (graph code); with ``kernel`` (a
    :class:`~scalebox_ms.ops.custom.offpolicy_optim.PolyakKernel`, the learner's ``polyak_kernel``) as one C++
    kernel call, bit-identical."""
    if kernel is not None:  # (static)
        return kernel(targets, sources, tau)
    done = []
    for t, s in zip(targets, sources):
        done.append(ops.assign(t, t * (1.0 - tau) + s * tau))
    return done


def guarded_update(optimizer, grads, loss, lr, max_grad_norm=None, inv_scale=None):
    """Apply ``grads`` with ``optimizer`` unless the loss or a gradient is not finite; returns the bool ``ok``.

    Branch-free (a graph ``if`` inside the gradient-step ``while`` loop costs ~2 ms per step on CPU): the global
    gradient norm doubles as the finiteness check, a non-finite step applies zero gradients at learning rate 0,
    so the weights stay untouched (Adam's moments decay by one step and its step counter advances). With
    ``max_grad_norm`` the gradients are clipped to it first (torch's ``clip_grad_norm_``). ``inv_scale`` (AMP)
    unscales gradients of a loss multiplied by the loss scale; an overflow is a non-finite step. With the group's
    ``kernel`` set (float32, no loss scale) all of it runs as one C++ kernel (``ops/custom/offpolicy_optim.cc``)."""
    if inv_scale is None and optimizer.kernel is not None:  # (static) the same arithmetic as one C++ kernel
        return optimizer.kernel(optimizer, grads, loss, lr, max_grad_norm)
    if inv_scale is not None:
        grads = tuple(g * inv_scale for g in grads)
    flat = ops.concat([g.reshape(-1) for g in grads])
    sq = (flat * flat).sum()
    ok = ops.logical_and(ops.isfinite(sq), ops.isfinite(loss))
    if max_grad_norm is not None:
        coef = ops.minimum(max_grad_norm / (ops.sqrt(sq) + 1e-6), 1.0)
        grads = tuple(g * coef for g in grads)
    grads = tuple(ops.select(ok, g, ops.zeros_like(g)) for g in grads)
    optimizer.apply(grads, lr * ok.astype(ms.float32))
    return ok


class CellChain:
    """Existing cells in order, read like an ``nn.SequentialCell`` (``cells()``) without re-parenting them (a new
    SequentialCell would rename their Parameters)."""

    def __init__(self, cells):
        self._cells = list(cells)

    def cells(self):
        return iter(self._cells)


class Learner(nn.Cell):
    """Base of the algorithms' learner Cells: checkpoints and hashes see every Parameter (networks, targets,
    optimizer state, the AMP loss scaler) as stored (no padded layers here), except the twin critics' ensembles,
    which both see split per critic (:meth:`checkpoint_items`, :meth:`logical_parameters`).

    Mixed precision (:meth:`use_amp`, the ``amp:`` section): every network is cast by
    :meth:`~scalebox_ms.amp.AutoMixedPrecision.cast` (outputs back to float32), every loss is multiplied by one
    dynamic loss scale (:class:`~scalebox_ms.amp.LossScaler`; ``self.scale()``, 1 without AMP) and its gradients
    unscaled (``self.inv_scale()``); :meth:`end_step` backs the scale off when any of the step's updates overflowed
    and grows it after ``growth_interval`` clean steps."""

    mixed = False  # (a bool: graph code branches on it statically)

    def __init__(self):
        super().__init__()
        self.polyak_kernel = None  # a PolyakKernel over (target_params, online_params): target updates as one kernel

    def batches_targets(self, rows: int) -> bool:
        """Whether a training phase of ``rows`` sampled transitions may compute all its TD targets in one pass
        before its gradient steps (``td_target`` + ``train_on_targets``; see ``offpolicy_graph.add_and_train``):
        only where the target depends on nothing a gradient step changes (DQN). The default: no."""
        return False

    def use_amp(self, amp, networks) -> None:
        from ..amp import LossScaler

        self.mixed = True
        self.amp = amp
        for net in networks:
            amp.cast(net)
        self.loss_scale, self.good_steps, self.skipped_steps = LossScaler(amp).parameters()

    def scale(self):
        return self.loss_scale if self.mixed else ops.ones((), ms.float32)

    def inv_scale(self):
        return 1.0 / self.loss_scale if self.mixed else None

    def nonfinite(self, ok, losses):
        """1.0 where a gradient step counts as non-finite (``nonfinite_updates``; a run stops after phases of only
        such steps), else 0.0: in float32 a skipped update (``ok`` False); with AMP a non-finite loss among
        ``losses`` only: an overflow of the scaled gradients at a finite loss is the loss scaler's business
        (``amp_skipped_steps``: it backs off), as for PPO."""
        if self.mixed:  # (static)
            finite = ops.ones((), ms.bool_)
            for loss in losses:
                finite = ops.logical_and(finite, ops.isfinite(loss))
            return 1.0 - finite.astype(ms.float32)
        return 1.0 - ok.astype(ms.float32)

    def end_step(self, ok):
        """The loss scaler's update after a gradient step (``ok``: all of its updates were finite)."""
        if self.mixed:
            new_scale, new_good, new_skipped = update_scale(self.loss_scale, self.good_steps, self.skipped_steps, ok,
                                                            self.amp)
            ops.assign(self.loss_scale, new_scale)
            ops.assign(self.good_steps, new_good)
            ops.assign(self.skipped_steps, new_skipped)
        return ok

    def logical_parameters(self):
        """Every Parameter, TwinCritic ensembles split per critic (:func:`split_ensemble`): the hash's layout."""
        return [kv for name, p in self.parameters_and_names() for kv in self.checkpoint_items(name, p.asnumpy())]

    @staticmethod
    def checkpoint_items(name, array):
        """[(name, array)] as a checkpoint stores one Parameter: per critic (:func:`split_ensemble`), the layout of
        two separate nn.Dense critics, which checkpoints had before the ensemble (so files read both ways)."""
        return split_ensemble(name, array)

    @staticmethod
    def upgrade_tensors(tensors: dict, names) -> dict:
        """A checkpoint's tensors with every one of the stored ``names`` that is missing and is a TwinCritic
        ensemble tensor stacked from its per-critic arrays (``qf0.*``/``qf1.*``: how :meth:`checkpoint_items`
        stores them, and how checkpoints written before the ensemble hold them); everything else is left as it
        is."""
        out = dict(tensors)
        for name in names:
            if name not in out:
                stacked = stack_ensemble(name, tensors)
                if stacked is not None:
                    out[name] = stacked
        return out

    def to_logical(self, name, array):
        return np.asarray(array)

    def to_storage(self, name, array):
        return np.asarray(array)
