"""MLP actor-critic ``nn.Cell`` for flat (encoded) observations and Discrete, Box, MultiDiscrete or MultiBinary actions.

Separate policy and value MLPs (SB3's ``MlpPolicy`` layout for PPO), orthogonal initialisation with gains
sqrt(2) for hidden layers, 0.01 for the policy head and 1 for the value head. Continuous actions use a diagonal
Gaussian with a state-independent ``log_std`` Parameter; MultiDiscrete actions one Categorical per component
over its segment of the logits, MultiBinary actions one Bernoulli per bit (SB3's distributions for those spaces).
Observations arrive flat: :mod:`scalebox_ms.envs.obs_encoding` one-hots Discrete parts and joins Dict/Tuple parts.
Image observations (uint8 ``(C, H, W)``) go through a :class:`~scalebox_ms.models.cnn.NatureCNN` first, one shared
by the two heads (``features.*``) or one each (``features.*`` and ``vf_features.*``), as SB3's ``CnnPolicy``;
Dict/Tuple observations with images inside through a :class:`~scalebox_ms.models.cnn.CombinedFeatures` (a NatureCNN
per image, SB3's ``MultiInputPolicy``), shared or not the same way.

Layers: ``layer='dense'`` builds ``nn.Dense`` + activation cells; ``layer='fused'`` builds
:class:`scalebox_ms.ops.FusedDense` layers (Linear + bias + activation as one layer, storage padded to
``align`` elements) with the same Parameter names (``pi_net.0.weight``, ``pi_net.2.weight``, ...), the same
logical initial weights under the same seed, and the same outputs and gradients. Checkpoints stay in the
logical (dense) layout through :meth:`ActorCritic.to_logical` / :meth:`ActorCritic.to_storage`.

The Cell's methods are plain graph code. The compiled entry points are the small wrapper Cells at the bottom
(:class:`ActStep`, :class:`ValueStep`, :class:`DeterministicStep`), each one ``@ms.jit`` graph, which users
can also embed in their own MindSpore code.
"""
from __future__ import annotations

import math

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn, ops
from mindspore.common.initializer import Orthogonal, Zero, initializer

from ..envs.spaces import SpaceSpec
from ..config import checked_section
from ..errors import CheckpointError, ConfigError, short_repr
from ..ops import distributions as D
from ..ops.fused import FusedDense, fused_mlp, pad_to

_ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU}


def mlp(in_dim: int, hidden: list[int], out_dim: int, activation: str, ortho: bool, out_gain: float,
        layer: str = "dense", align: int = 16) -> nn.SequentialCell:
    """[Dense, Act, Dense, Act, ..., Dense] (``layer='dense'``) or the FusedDense equivalent (``'fused'``).

    Both draw their initial weights with the same initializer calls in the same order, so under the same
    MindSpore seed they start with the same logical weights. Arguments are taken as checked
    (:class:`ActorCritic` checks them with the ``policy:`` section's checks).
    """
    dims = [in_dim] + list(hidden) + [out_dim]
    gains = [math.sqrt(2.0) if ortho else None] * len(hidden) + [out_gain if ortho else None]
    inits = [_inits(dims[i], dims[i + 1], g) for i, g in enumerate(gains)]
    if layer == "fused":
        return fused_mlp(dims, activation, align, inits)
    layers = []
    for i, (w_init, b_init) in enumerate(inits):
        layers.append(nn.Dense(dims[i], dims[i + 1], weight_init=w_init, bias_init=b_init))
        if i < len(inits) - 1:
            layers.append(_ACTIVATIONS[activation]())
    return nn.SequentialCell(layers)


def _inits(a: int, b: int, gain: float | None):
    if gain is None:  # MindSpore's default initialisation (nn.Dense's and FusedDense's defaults)
        return None, None
    return (initializer(Orthogonal(gain=gain), [b, a], ms.float32), initializer(Zero(), [b], ms.float32))


class ActorCritic(nn.Cell):
    """Policy pi(a|s) and value V(s) networks.

    Args:
        spec: observation/action space description.
        pi_layers, vf_layers: hidden sizes of the policy and value MLPs.
        activation: 'tanh' or 'relu'.
        ortho_init: orthogonal initialisation (else MindSpore's default).
        log_std_init: initial log standard deviation (continuous actions only).
        layer: 'dense' (nn.Dense + activation cells) or 'fused' (FusedDense, padded storage).
        align: FusedDense storage alignment in elements (layer 'fused' only; 1: no padding).
        share_features, cnn_channels, cnn_features_dim: the NatureCNN of image observations (``spec.cnn``).
    """

    def __init__(self, spec: SpaceSpec, pi_layers=(64, 64), vf_layers=(64, 64), activation: str = "tanh",
                 ortho_init: bool = True, log_std_init: float = 0.0, layer: str = "dense", align: int = 16,
                 share_features: bool = True, cnn_channels=(32, 64, 64), cnn_features_dim: int = 512):
        super().__init__()
        # the policy: section's own checks (scalebox_ms.config), so direct construction is refused the same way
        cfg = checked_section("policy", pi_layers=list(pi_layers), vf_layers=list(vf_layers), activation=activation,
                              ortho_init=ortho_init, log_std_init=log_std_init, layer=layer, align=align,
                              share_features=share_features, cnn_channels=list(cnn_channels),
                              cnn_features_dim=cnn_features_dim)
        self.spec = spec
        self.features = None  # no extractor: the MLPs read the (encoded) observation
        self.shared = True
        in_dim = spec.obs_dim
        if spec.cnn:
            from .cnn import build_features

            cnn = (spec, cfg.cnn_channels, cfg.cnn_features_dim, cfg.ortho_init)
            self.features = build_features(*cnn)
            self.shared = cfg.share_features
            if not self.shared:
                self.vf_features = build_features(*cnn)
            in_dim = self.features.features_dim
        self.discrete = spec.discrete
        self.kind = spec.action_kind
        self.segments = spec.segments
        self.activation = cfg.activation
        self.layer = cfg.layer
        self.align = cfg.align
        self.pi_net = mlp(in_dim, cfg.pi_layers, spec.logits_dim, cfg.activation, cfg.ortho_init, 0.01,
                          cfg.layer, cfg.align)
        self.vf_net = mlp(in_dim, cfg.vf_layers, 1, cfg.activation, cfg.ortho_init, 1.0, cfg.layer, cfg.align)
        if self.kind == "box":
            self.log_std = Parameter(Tensor(np.full(spec.action_dim, cfg.log_std_init, np.float32)), name="log_std")
            self.low = Tensor(np.asarray(spec.low, np.float32))
            self.high = Tensor(np.asarray(spec.high, np.float32))
        self._layouts: dict[str, tuple[tuple, tuple]] | None = None

    # -- logical (nn.Dense) layout of the Parameters --------------------------------------------
    def storage_layouts(self) -> dict[str, tuple[tuple, tuple]]:
        """{parameter name: (logical shape, storage shape)} of the padded (FusedDense) Parameters only."""
        if self._layouts is None:
            layouts = {}
            for prefix, cell in self.cells_and_names():
                if isinstance(cell, FusedDense):
                    for which in ("weight", "bias"):
                        if cell.logical_shape(which) != cell.storage_shape(which):
                            layouts[f"{prefix}.{which}"] = (cell.logical_shape(which), cell.storage_shape(which))
            self._layouts = layouts
        return self._layouts

    def _layout(self, name: str):
        """(parameter name, logical shape, storage shape) for ``name`` or a name ending with ``.<param name>``."""
        for pname, (logical, storage) in self.storage_layouts().items():
            if name == pname or name.endswith("." + pname):
                return pname, logical, storage
        return None

    def to_logical(self, name: str, array) -> np.ndarray:
        """The logical (``nn.Dense``-layout) view of a Parameter or optimizer-state array.

        ``name`` is a parameter name (``"pi_net.0.weight"``) or any name ending with ``.<parameter name>``
        (``"moment1.pi_net.0.weight"``, ``"model.pi_net.0.weight"``). Padded storage is sliced to the logical
        shape; arrays already of the logical shape, and all non-padded Parameters, are returned unchanged.
        """
        array = np.asarray(array)
        hit = self._layout(name)
        if hit is None:
            return array
        pname, logical, storage = hit
        if array.shape == storage:
            return array[tuple(slice(0, n) for n in logical)].copy()
        if array.shape == logical:
            return array
        raise CheckpointError(f"{name}: shape {array.shape} is neither the storage {storage} nor the logical "
                              f"{logical} shape of {pname}")

    def to_storage(self, name: str, array) -> np.ndarray:
        """Inverse of :meth:`to_logical`: zero-pad a logical array to the Parameter's storage shape.

        Arrays already of the storage shape, and all non-padded Parameters, are returned unchanged.
        """
        array = np.asarray(array)
        hit = self._layout(name)
        if hit is None:
            return array
        pname, logical, storage = hit
        if array.shape == logical:
            return pad_to(array, storage).astype(array.dtype, copy=False)
        if array.shape == storage:
            return array
        raise CheckpointError(f"{name}: shape {array.shape} does not match the logical shape {logical} of {pname}")

    def logical_parameters(self) -> list[tuple[str, np.ndarray]]:
        """[(name, logical numpy array)] in parameter order: the names and shapes of the ``layer='dense'`` model."""
        return [(name, self.to_logical(name, p.asnumpy())) for name, p in self.parameters_and_names()]

    def load_logical_parameters(self, values) -> None:
        """Write logical arrays (a dict or (name, array) pairs, all parameters) into the Parameters, padded, with one
        compiled assign so already-compiled graphs see them."""
        from ..ops.assign import AssignParameters

        values = dict(values)
        params = list(self.parameters_and_names())
        missing = [n for n, _ in params if n not in values]
        if missing:
            raise CheckpointError(f"load_logical_parameters: missing {', '.join(missing)}")
        arrays = []
        for name, p in params:
            arr = self.to_storage(name, np.asarray(values[name], np.float32))
            if tuple(arr.shape) != tuple(p.shape):
                raise CheckpointError(f"{name}: shape {arr.shape} does not match the parameter's {tuple(p.shape)}")
            arrays.append(Tensor(arr))
        AssignParameters([p for _, p in params]).write(arrays)

    # -- graph building blocks ------------------------------------------------------------------
    #: set by :meth:`scalebox_ms.amp.AutoMixedPrecision.apply`: the dtype the MLP outputs are cast to before the
    #: distribution maths (float32 under O1/O2, the low-precision dtype under O3); None: no cast (float32 model)
    head_dtype = None

    def _inputs(self, obs):
        """(policy MLP input, value MLP input): the observation itself, or the CNN features of the image (computed
        once when shared)."""
        if self.features is None:
            return obs, obs
        f = self.features(obs)
        return (f, f) if self.shared else (f, self.vf_features(obs))

    def _pi(self, x):
        out = self.pi_net(x)
        if self.head_dtype is not None:
            out = out.astype(self.head_dtype)
        return out

    def _v(self, x):
        v = self.vf_net(x).squeeze(-1)
        if self.head_dtype is not None:
            v = v.astype(self.head_dtype)
        return v

    def _policy_out(self, obs):
        return self._pi(obs if self.features is None else self.features(obs))

    def value(self, obs):
        if self.features is None:
            return self._v(obs)
        return self._v(self.features(obs) if self.shared else self.vf_features(obs))

    def act(self, obs, noise):
        """Sample actions with externally drawn noise; return (action, log_prob, value)."""
        pi_in, vf_in = self._inputs(obs)
        out = self._pi(pi_in)
        if self.kind == "discrete":
            action = D.categorical_sample(out, noise)
            log_prob = D.categorical_log_prob(out, action)
        elif self.kind == "multidiscrete":
            action = D.multi_categorical_sample(out, noise, self.segments)
            log_prob = D.multi_categorical_log_prob(out, action, self.segments)
        elif self.kind == "multibinary":
            action = D.bernoulli_sample(out, noise)
            log_prob = D.bernoulli_log_prob(out, action)
        else:
            action = D.gaussian_sample(out, self.log_std, noise)
            log_prob = D.gaussian_log_prob(out, self.log_std, action)
        return action, log_prob, self._v(vf_in)

    def evaluate_actions(self, obs, actions):
        """Return (log_prob, entropy, value) of given actions: the quantities of the PPO loss."""
        pi_in, vf_in = self._inputs(obs)
        out = self._pi(pi_in)
        if self.kind == "discrete":
            log_prob = D.categorical_log_prob(out, actions)
            entropy = D.categorical_entropy(out)
        elif self.kind == "multidiscrete":
            log_prob = D.multi_categorical_log_prob(out, actions, self.segments)
            entropy = D.multi_categorical_entropy(out, self.segments)
        elif self.kind == "multibinary":
            log_prob = D.bernoulli_log_prob(out, actions)
            entropy = D.bernoulli_entropy(out)
        else:
            log_prob = D.gaussian_log_prob(out, self.log_std, actions)
            entropy = D.gaussian_entropy(self.log_std, out)
        return log_prob, entropy, self._v(vf_in)

    def deterministic_action(self, obs):
        """argmax for Categorical (per component for MultiDiscrete); l > 0 for Bernoulli; the mean clipped to the
        Box bounds for Gaussian."""
        out = self._policy_out(obs)
        if self.kind == "discrete":
            return ops.argmax(out, -1).astype(ms.int32)
        if self.kind == "multidiscrete":
            return D.multi_categorical_mode(out, self.segments)
        if self.kind == "multibinary":
            return D.bernoulli_mode(out)
        # (float32 as the exported graph's sidecar says: under amp.level O3 the head computes in float16)
        return ops.clip_by_value(out.astype(ms.float32), self.low, self.high)

    def construct(self, obs):
        return self.deterministic_action(obs)


ACT_KERNELS = ("builtin", "custom")


def _act_batch_error(obs_shape, noise_shape) -> str:
    """Why :class:`ActStep` cannot act on a batch of these shapes ("" if it can)."""
    if obs_shape[0] == 0:
        return "ActStep: an empty batch (0 observations)"
    if noise_shape[0] != obs_shape[0]:
        return f"ActStep: noise needs one row per observation ({noise_shape[0]} rows for {obs_shape[0]})"
    return ""


class ActStep(nn.Cell):
    """Compiled acting call: (obs batch, noise) -> (action, log_prob, value) for all envs at once.

    With ``packed=True`` it returns one float32 (B, action_width + 2) Tensor ``[action | log_prob | value]``
    instead, so the trainer's rollout loop copies one buffer back per step rather than three.

    ``kernel='builtin'`` runs MindSpore ops (``model.act``); ``kernel='custom'`` runs the whole call as the C++
    aot kernel :class:`scalebox_ms.ops.custom.FusedActorKernel` (CPU only, inference only: it has no gradient;
    raises :class:`~scalebox_ms.errors.CustomOpError` if it cannot be built). Both read the model's current
    Parameters and give the same results to float tolerance.
    """

    def __init__(self, model: ActorCritic, packed: bool = False, kernel: str = "builtin"):
        super().__init__(auto_prefix=False)
        if kernel not in ACT_KERNELS:
            raise ConfigError(f"act kernel: {short_repr(kernel)} is not one of {', '.join(ACT_KERNELS)}")
        self.model = model
        self.packed = packed
        self.kernel = kernel
        self.custom = kernel == "custom"
        if self.custom and model.features is not None:
            raise ConfigError("policy.act_kernel: the custom kernel implements MLPs, not the NatureCNN of image "
                              "observations; use act_kernel builtin or auto")
        if self.custom and model.kind not in ("discrete", "box"):
            raise ConfigError(f"policy.act_kernel: the custom kernel implements Discrete and Box actions, not "
                              f"{model.kind}; use act_kernel builtin or auto")
        if self.custom and getattr(model, "amp_level", "O0") != "O0":
            raise ConfigError(f"policy.act_kernel: the custom kernel computes in float32 and cannot run a model cast "
                              f"by amp.level {model.amp_level}; use act_kernel builtin or auto")
        if self.custom:
            from ..ops.custom import FusedActorKernel

            self.fused = FusedActorKernel(model)
            self.width = self.fused.width

    def __call__(self, obs, noise):
        # (a direct call: one line; inside a graph of yours construct's own check raises when that graph compiles)
        error = _act_batch_error(tuple(obs.shape), tuple(noise.shape))
        if error:
            raise ValueError(error)
        return super().__call__(obs, noise)

    @ms.jit
    def construct(self, obs, noise):
        # (static shapes: an empty batch killed the process with the custom kernel, MindSpore 2.10's Split of the
        # empty output: SIGFPE, and was an empty RuntimeError with the builtin one)
        if obs.shape[0] == 0 or noise.shape[0] != obs.shape[0]:
            raise ValueError(_act_batch_error(obs.shape, noise.shape))
        if self.custom:
            out = self.fused(obs, noise)
            if self.packed:
                return out
            return self.fused.unpack(out)
        action, log_prob, value = self.model.act(obs, noise)
        if self.packed:
            if self.model.discrete:
                action = action.astype(ms.float32).expand_dims(-1)
            elif self.model.kind != "box":
                action = action.astype(ms.float32)
            return ops.concat([action, log_prob.expand_dims(-1), value.expand_dims(-1)], -1)
        return action, log_prob, value


class ValueStep(nn.Cell):
    """Compiled V(s) for the bootstrap value at the end of a rollout."""

    def __init__(self, model: ActorCritic):
        super().__init__(auto_prefix=False)
        self.model = model

    @ms.jit
    def construct(self, obs):
        return self.model.value(obs)


class DeterministicStep(nn.Cell):
    """Compiled deterministic policy: obs -> action (used by predict and evaluation)."""

    def __init__(self, model: ActorCritic):
        super().__init__(auto_prefix=False)
        self.model = model

    @ms.jit
    def construct(self, obs):
        return self.model.deterministic_action(obs)


def build_model(spec: SpaceSpec, policy_cfg) -> ActorCritic:
    return ActorCritic(spec, pi_layers=policy_cfg.pi_layers, vf_layers=policy_cfg.vf_layers,
                       activation=policy_cfg.activation, ortho_init=policy_cfg.ortho_init,
                       log_std_init=policy_cfg.log_std_init, layer=getattr(policy_cfg, "layer", "dense"),
                       align=getattr(policy_cfg, "align", 16), share_features=policy_cfg.share_features,
                       cnn_channels=policy_cfg.cnn_channels, cnn_features_dim=policy_cfg.cnn_features_dim)
