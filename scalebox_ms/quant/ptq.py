"""INT8 post-training quantization of the policy network.

``DynamicQuantizer(calibrate_steps=200, quant_level="L1")`` turns a trained float policy into a
:class:`QuantizedPolicy` ``nn.Cell``:

* **L1** -- weights int8, symmetric, one scale per output channel (``scale = max|w_row| / 127``); activations
  stay float. The graph dequantises in-graph (``cast(w_int8) * scale``), so exported MindIR files store the
  weights as int8 tensors plus float scales (~4x smaller weights).
* **L2** -- additionally every Dense layer's input is quantized to int8 (symmetric, per tensor) with a scale
  calibrated on observations collected by running the policy (``activation_calibration="minmax"`` uses the
  largest magnitude seen, ``"percentile"`` the given percentile of magnitudes, which ignores outliers). The
  matmul runs on the int8 values and the result is rescaled by ``scale_x * scale_w``, folded into one float
  per output channel at quantization time.

File size: L1 and L2 store the same tensors (int8 weights, one float32 scale per output channel, float32
biases); L2 adds one float32 constant per layer (``scale_x``). What L2 adds is graph: three ops per layer
(divide by ``scale_x``, round, clamp to [-127, 127]). A MindIR node carries its name, inputs and output shape,
so for a policy as small as CartPole's (4-64-64-2, a few KB of int8 weights) these nodes make the L2 file
larger than the L1 file; for wide layers the weights dominate and the difference vanishes.

Backend note: MindSpore 2.10's CPU int8 MatMul accumulates in int8 and overflows, and CPU has no int8 quant
kernels (docs/design.md). L2 therefore *simulates* int8 arithmetic on every backend: int8 values are cast to float32
and multiplied; products of int8 values summed over up to 1040 inputs stay below 2**24, so this equals an int32
accumulation exactly. Real int8 kernels (Ascend ``QuantBatchMatmul``) are not wired in yet; L2 files run
everywhere but are not faster than float on CPU.
"""
from __future__ import annotations

from typing import List, Optional

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn, ops

from ..errors import ConfigError
from ..models.cnn import CombinedFeatures, conv2d_valid
from ..models.offpolicy import squash

LEVELS = ("L1", "L2")
CALIBRATIONS = ("minmax", "percentile")
_MAX_EXACT_FAN_IN = 1040  # 127 * 127 * 1040 < 2**24: float32 sums of int8 products are exact


def quantize_weight_per_channel(w: np.ndarray):
    """Symmetric per-output-channel int8: returns (int8 weights, float32 scales (out,))."""
    w = np.asarray(w, np.float32)
    amax = np.abs(w).max(axis=1)
    scale = np.where(amax > 0, amax / 127.0, 1.0).astype(np.float32)
    q = np.clip(np.rint(w / scale[:, None]), -127, 127).astype(np.int8)
    return q, scale


class QuantDense(nn.Cell):
    """y = act(x @ (W_int8 * scale)^T + b) with per-output-channel ``scale``; with ``input_scale`` (L2) the input
    is quantized to int8 first and the int8 product is rescaled: y = act((x_int8 @ W_int8^T) * scale + b), where
    ``scale`` is ``weight_scale * input_scale``."""

    def __init__(self, weight: np.ndarray, bias: np.ndarray, activation: Optional[str],
                 input_scale: Optional[float] = None):
        super().__init__()
        q, scale = quantize_weight_per_channel(weight)
        self.quantize_input = input_scale is not None
        self.input_scale = float(input_scale) if input_scale is not None else 1.0
        if self.quantize_input:  # one float per output channel either way; L2 folds the input scale in
            scale = (scale * np.float32(self.input_scale)).astype(np.float32)
        else:  # L1 scales the weight rows: stored as a column, no reshape in the graph
            scale = scale[:, None]
        self.weight_int8 = Parameter(Tensor(q), name="weight_int8", requires_grad=False)
        self.scale = Parameter(Tensor(scale), name="scale", requires_grad=False)
        self.bias = Parameter(Tensor(np.asarray(bias, np.float32)), name="bias", requires_grad=False)
        self.matmul = ops.MatMul(transpose_b=True)
        self.activation = {"tanh": nn.Tanh(), "relu": nn.ReLU(), None: None}[activation]

    def construct(self, x):
        w = self.weight_int8.astype(ms.float32)
        if self.quantize_input:
            x = ops.clamp(ops.round(x / self.input_scale), -127.0, 127.0)
            y = self.matmul(x, w) * self.scale + self.bias  # integer-valued product, then one rescale
        else:
            y = self.matmul(x, w * self.scale) + self.bias
        if self.activation is not None:
            y = self.activation(y)
        return y


class QuantConv(nn.Cell):
    """A NatureCNN convolution (L1): y = relu(conv(x, W_int8 * scale) + b), one scale per output channel."""

    def __init__(self, weight: np.ndarray, bias: np.ndarray, stride: int, im2col: bool):
        super().__init__()
        weight = np.asarray(weight, np.float32)
        q, scale = quantize_weight_per_channel(weight.reshape(weight.shape[0], -1))
        self.weight_int8 = Parameter(Tensor(q.reshape(weight.shape)), name="weight_int8", requires_grad=False)
        self.scale = Parameter(Tensor(scale.reshape(-1, 1, 1, 1)), name="scale", requires_grad=False)
        self.bias = Parameter(Tensor(np.asarray(bias, np.float32)), name="bias", requires_grad=False)
        self.stride, self.im2col = int(stride), bool(im2col)

    def construct(self, x):
        w = self.weight_int8.astype(ms.float32) * self.scale
        return ops.relu(conv2d_valid(x, w, self.bias, self.stride, self.im2col))


class ImageInput(nn.Cell):
    """uint8 frames -> float32 / 255, as NatureCNN's first step."""

    def construct(self, x):
        return x.astype(ms.float32) * (1.0 / 255.0)


class Flatten(nn.Cell):
    def construct(self, x):
        return x.reshape(x.shape[0], -1)


def _cnn_layers(cnn) -> list:
    """L1 cells of a NatureCNN: scaling, three int8 convolutions, flatten, the int8 Dense layer (ReLU)."""
    from ..models.cnn import KERNELS, Conv

    convs = [c for c in cnn.conv.cells() if isinstance(c, Conv)]
    layers = [ImageInput()] + [QuantConv(c.weight.asnumpy(), c.bias.asnumpy(), s, c.im2col)
                               for c, (_, s) in zip(convs, KERNELS)]
    return layers + [Flatten(), QuantDense(cnn.linear.weight.asnumpy(), cnn.linear.bias.asnumpy(), "relu")]


class QuantCombinedFeatures(CombinedFeatures):
    """A :class:`~scalebox_ms.models.cnn.CombinedFeatures` at L1: the same column layout, each image's NatureCNN
    replaced by its int8 layers (:func:`_cnn_layers`)."""

    def __init__(self, combined):
        super().__init__(combined.obs_dim, combined.image_parts,
                         extractors=[nn.SequentialCell(_cnn_layers(cnn)) for cnn in combined.cnns])


class QuantizedPolicy(nn.Cell):
    """Deterministic policy on normalised observations with int8 Dense layers: obs -> action.

    ``output`` maps the last layer to the action: 'argmax' (Discrete: PPO's logits, DQN's Q values), 'clip' (PPO's
    Gaussian mean clipped to the Box) or 'tanh' (SAC/TD3: tanh, then [-1, 1] mapped to the Box)."""

    def __init__(self, layers: List[QuantDense], discrete: bool, low=None, high=None, level: str = "L1",
                 info: Optional[dict] = None, output: Optional[str] = None):
        super().__init__()
        self.layers = nn.CellList(layers)
        self.discrete = discrete
        self.output = output or ("argmax" if discrete else "clip")
        self.level = level
        self.info = info or {}
        if not discrete:
            self.low = Tensor(np.asarray(low, np.float32))
            self.high = Tensor(np.asarray(high, np.float32))
            self.half_range = Tensor(0.5 * (np.asarray(high, np.float32) - np.asarray(low, np.float32)))

    def logits(self, x):
        for layer in self.layers:
            x = layer(x)
        return x

    def construct(self, obs):
        out = self.logits(obs)
        if self.output == "argmax":
            return ops.argmax(out, -1).astype(ms.int32)
        if self.output == "tanh":
            return self.low + (squash(out) + 1.0) * self.half_range  # (as the float policy's DeployActor)
        return ops.clip_by_value(out, self.low, self.high)


def _dense_layers(seq: nn.SequentialCell):
    """[(weight, bias, activation name or None)] of an MLP built by :func:`scalebox_ms.models.actor_critic.mlp`:
    ``nn.Dense`` + activation cells or ``FusedDense`` layers (their logical, unpadded weights)."""
    from ..ops.fused import mlp_layers

    return [(layer.logical_weight(), layer.logical_bias(), layer.activation) for layer in mlp_layers(seq)]


class DynamicQuantizer:
    """Post-training quantizer: ``quant_model = DynamicQuantizer(...)(model, calibration_data)``.

    Args:
        calibrate_steps: env steps of calibration data to collect (used by :func:`collect_calibration_data`
            and recorded in the result); must be >= 1.
        quant_level: 'L1' (int8 weights) or 'L2' (int8 weights and activations).
        activation_calibration: 'minmax' or 'percentile' (L2 only).
        percentile: the percentile of |activation| used as the clipping range with 'percentile'.
    """

    def __init__(self, calibrate_steps: int = 200, quant_level: str = "L1", activation_calibration: str = "minmax",
                 percentile: float = 99.99):
        if isinstance(calibrate_steps, bool) or not isinstance(calibrate_steps, (int, np.integer)) or calibrate_steps < 1:
            raise ConfigError(f"calibrate_steps: must be an integer >= 1, got {calibrate_steps!r}")
        if quant_level not in LEVELS:
            raise ConfigError(f"quant_level: {quant_level!r} is not one of {', '.join(LEVELS)}")
        if activation_calibration not in CALIBRATIONS:
            raise ConfigError(f"activation_calibration: {activation_calibration!r} is not one of {', '.join(CALIBRATIONS)}")
        if not 50.0 < float(percentile) <= 100.0:
            raise ConfigError(f"percentile: must be in (50, 100], got {percentile}")
        self.calibrate_steps = int(calibrate_steps)
        self.quant_level = quant_level
        self.activation_calibration = activation_calibration
        self.percentile = float(percentile)

    def check(self, cnn: bool, spec) -> None:
        """What this quantizer cannot do with a policy (``cnn``: a NatureCNN extractor; ``spec``: its SpaceSpec or
        None), before any calibration: :func:`scalebox_ms.export.export_mindir` calls it first."""
        if cnn and self.quant_level != "L1":
            raise ConfigError("quantize: NatureCNN policies quantize at L1 (int8 weights per output channel); L2's "
                              "activation quantization covers Dense layers only")
        if spec is not None and spec.action_kind not in ("discrete", "box"):
            raise ConfigError(f"quantize: the INT8 policy implements Discrete and Box actions, not {spec.action_kind}; "
                              "export without --int8")

    def __call__(self, model, calibration_data) -> QuantizedPolicy:
        """Quantize ``model`` (an ActorCritic, or a trainer: PPO's policy MLP; DQN's Q-network, SAC's and TD3's
        actor) using normalised observations ``calibration_data``."""
        trainer = None
        output = None
        if hasattr(model, "model") and hasattr(model, "global_step"):  # a trainer
            trainer, model = model, model.model
            if trainer.global_step == 0:
                raise ConfigError("quantize: the policy is untrained (global_step 0); INT8 calibration needs a trained "
                                  "one: train first, or load a later checkpoint (export --checkpoint)")
        if hasattr(trainer, "policy_mlp"):  # off-policy: (the deterministic policy's MLP, its output mapping)
            pi, output = trainer.policy_mlp()
            spec = trainer.spec
        else:
            pi = getattr(model, "pi_net", None)
            spec = getattr(model, "spec", None)
        cnn = getattr(model, "features", None)
        self.check(cnn is not None, spec)
        layers = _dense_layers(pi) if hasattr(pi, "cells") else []
        if not layers:
            raise ConfigError(f"quantize: {type(model).__name__} has no policy Dense layers to quantize")
        if cnn is not None:  # L1: scales come from the weights; the image data only has to be there
            combined = isinstance(cnn, CombinedFeatures)  # images inside a Dict/Tuple: packed in the flat vector
            data = np.asarray(calibration_data) if calibration_data is not None else np.zeros((0,))
            if data.ndim != (2 if combined else 4) or data.shape[0] == 0:
                raise ConfigError(f"quantize: calibration data must be a non-empty "
                                  f"{'(N, obs_dim) array' if combined else '(N, C, H, W) image batch'}, got "
                                  f"shape {data.shape}")
            qlayers = ([QuantCombinedFeatures(cnn)] if combined else _cnn_layers(cnn)) + [
                QuantDense(w, b, act) for w, b, act in layers]
            info = {"level": "L1", "weights": "int8, symmetric, per output channel (convolutions and Dense)",
                    "activations": "float32", "calibrate_steps": self.calibrate_steps,
                    "calibration_samples": int(data.shape[0]), "input_scales": [None] * len(qlayers),
                    "int8_arithmetic": "n/a (weights dequantised in graph)"}
            return QuantizedPolicy(qlayers, spec.discrete, spec.low, spec.high, "L1", info, output)
        data = np.asarray(calibration_data, np.float32) if calibration_data is not None else np.zeros((0,))
        if data.ndim != 2 or data.shape[0] == 0:
            raise ConfigError(f"quantize: calibration data must be a non-empty (N, obs_dim) array, got shape {data.shape}")
        if data.shape[1] != layers[0][0].shape[1]:
            raise ConfigError(f"quantize: calibration data has {data.shape[1]} features, the policy expects {layers[0][0].shape[1]}")
        if not np.isfinite(data).all():  # (L2: NaN gave a scale of 1.0 without a word, inf quantised every input to 0)
            raise ConfigError("quantize: calibration data holds NaN or infinity")
        if self.quant_level == "L2":
            fan_in = max(w.shape[1] for w, _, _ in layers)
            if fan_in > _MAX_EXACT_FAN_IN:
                raise ConfigError(f"quantize: L2 simulation is exact up to {_MAX_EXACT_FAN_IN} inputs per layer, "
                                  f"this policy has {fan_in}")
        scales = self._input_scales(layers, data) if self.quant_level == "L2" else [None] * len(layers)
        qlayers = [QuantDense(w, b, act, s) for (w, b, act), s in zip(layers, scales)]
        info = {
            "level": self.quant_level,
            "weights": "int8, symmetric, per output channel",
            "activations": "float32" if self.quant_level == "L1" else
            f"int8, symmetric, per tensor, {self.activation_calibration}"
            + (f" p{self.percentile}" if self.activation_calibration == "percentile" else ""),
            "calibrate_steps": self.calibrate_steps,
            "calibration_samples": int(data.shape[0]),
            "input_scales": [None if s is None else float(s) for s in scales],
            "int8_arithmetic": "simulated in float32 (exact int32-equivalent accumulation)"
            if self.quant_level == "L2" else "n/a (weights dequantised in graph)",
        }
        return QuantizedPolicy(qlayers, spec.discrete, spec.low, spec.high, self.quant_level, info, output)

    def _input_scales(self, layers, data: np.ndarray) -> List[float]:
        """Per-layer input scales from a float forward pass over the calibration data."""
        scales = []
        x = data.astype(np.float64)
        for w, b, act in layers:
            mag = np.abs(x).ravel()
            r = mag.max() if self.activation_calibration == "minmax" else np.percentile(mag, self.percentile)
            scales.append(float(r / 127.0) if r > 0 else 1.0)
            x = x @ w.T.astype(np.float64) + b
            x = np.tanh(x) if act == "tanh" else np.maximum(x, 0) if act == "relu" else x
        return scales


def collect_calibration_data(trainer, steps: int, seed: int = 12_345, should_stop=None) -> np.ndarray:
    """Run the trainer's deterministic policy on fresh envs (``min(num_envs, 8)`` copies, isolated in worker
    processes as the trainer's own envs are) until ``steps`` env steps are done; return the normalised
    observations it saw, (steps, obs_dim) float32. ``should_stop`` (asked before every vector step) returning True
    stops it with KeyboardInterrupt."""
    from ..envs import make_vec_env
    from ..trainers.evaluation import isolation_kwargs

    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 1:
        raise ConfigError(f"calibrate_steps: must be an integer >= 1, got {steps!r}")
    cfg = trainer.config.env
    n = min(cfg.num_envs, 8, steps)
    env = make_vec_env(cfg.id, n, cfg.kwargs, evaluation=True, **isolation_kwargs(trainer))
    try:
        obs, _ = env.reset(seed=seed)
        seen = []
        for _ in range(-(-steps // n)):
            if should_stop is not None and should_stop():
                raise KeyboardInterrupt
            seen.append(trainer.normalize_obs(obs, update=False))
            obs, *_ = env.step(trainer.predict(obs, deterministic=True))
        return np.concatenate(seen, axis=0)[:steps]
    finally:
        from ..envs.factory import close_env

        close_env(env, cfg.id)
