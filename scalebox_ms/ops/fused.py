"""``FusedDense``: Linear + bias + activation as one layer, with storage padded to aligned shapes.

``FusedDense(in_features, out_features, activation=None|'tanh'|'relu', align=16)`` computes exactly what
``nn.Dense(in_features, out_features)`` followed by ``nn.Tanh``/``nn.ReLU`` computes, but stores its Parameters
padded to multiples of ``align`` elements::

    weight: (ceil(out/align)*align, ceil(in/align)*align)    bias: (ceil(out/align)*align,)

with every padded entry zero. Padding is invisible from outside:

* outputs: the input is zero-padded to the storage width and the output sliced back to ``out_features``;
* gradients: padded weight rows/columns and bias entries only ever meet zero inputs or zero upstream
  gradients, so their gradients are exactly zero and Adam (whose update is 0 for a zero moment) keeps them
  at zero for ever;
* checkpoints: :meth:`FusedDense.logical_weight` / :meth:`logical_bias` return the logical slices and
  :func:`to_storage` pads logical arrays back (``ActorCritic.to_logical`` / ``to_storage`` map whole models).

Inside an MLP built by :func:`fused_mlp`, activations stay padded between consecutive layers: only the first
layer pads its input and only the last slices its output (``pad_input`` / ``slice_output``), so there is no
pad/slice per layer. The padded hidden units compute ``act(0 + 0) = 0`` for tanh and relu, which is what
makes that exact.

Backends: on Ascend and GPU the matmul + bias runs as MindSpore's ``Dense`` primitive (``ops.dense``, one
fused kernel: aclnn matmul-with-bias on Ascend, cuBLAS GEMM with bias epilogue on GPU) followed by the
activation. MindSpore 2.10 exposes no public matmul + bias + activation primitive (the Ascend
``aclnnFusedMatmul`` covers gelu/add/mul epilogues, not tanh/relu, and is not wrapped as an op), so the
activation stays a separate elementwise op that graph-kernel fusion may merge. On CPU the layer is the exact
composition ``nn.Dense`` uses (``MatMul(transpose_b=True)`` + ``BiasAdd``) plus ``ops.tanh``/``ops.relu``.
"""
from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from typing import NamedTuple

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn, ops
from mindspore.common.initializer import HeUniform, Uniform, initializer

ACTIVATIONS = (None, "tanh", "relu")
_FUSED_BACKENDS = ("Ascend", "GPU")


def aligned(n: int, align: int) -> int:
    """``n`` rounded up to a multiple of ``align``."""
    return -(-int(n) // int(align)) * int(align)


def pad_to(array: np.ndarray, shape: Sequence[int]) -> np.ndarray:
    """Zero-pad ``array`` at the end of every axis to ``shape`` (float32 copy)."""
    array = np.asarray(array, np.float32)
    if array.ndim != len(shape) or any(a > s for a, s in zip(array.shape, shape)):
        raise ValueError(f"cannot pad an array of shape {array.shape} to {tuple(shape)}")
    out = np.zeros(tuple(shape), np.float32)
    out[tuple(slice(0, n) for n in array.shape)] = array
    return out


def _logical_init(init, shape: list[int], default) -> np.ndarray:
    """Materialise an initializer (name, Initializer, Tensor or array) at the logical ``shape``.

    The same ``initializer(init, shape)`` call ``nn.Dense`` makes, so under the same MindSpore seed and draw
    order a FusedDense starts with the same logical weights as the Dense layer it replaces.
    """
    if init is None:
        init = default
    if isinstance(init, np.ndarray):
        init = Tensor(init.astype(np.float32))
    if isinstance(init, Tensor) and tuple(init.shape) != tuple(shape):
        raise ValueError(f"initial value has shape {tuple(init.shape)}, expected {tuple(shape)}")
    t = initializer(init, shape, ms.float32)
    if getattr(t, "has_init", False):
        t = t.init_data()
    return t.asnumpy().astype(np.float32)


class FusedDense(nn.Cell):
    """``act(x @ W.T + b)`` as one layer with ``align``-padded storage (see the module docstring).

    Args:
        in_features, out_features: logical sizes (what ``nn.Dense`` would take).
        activation: None, 'tanh' or 'relu'.
        align: storage alignment in elements (1: no padding).
        weight_init, bias_init: as for ``nn.Dense`` (None: its defaults, HeUniform(sqrt(5)) and
            Uniform(1/sqrt(in_features))), at the logical shapes; an array/Tensor must have the logical shape.
        pad_input: zero-pad a logical ``(..., in_features)`` input (False: the input is already padded to
            the storage width, as between layers of :func:`fused_mlp`).
        slice_output: return the logical ``(..., out_features)`` output (False: the padded one).
    """

    def __init__(self, in_features: int, out_features: int, activation: str | None = None, align: int = 16,
                 weight_init=None, bias_init=None, pad_input: bool = True, slice_output: bool = True):
        super().__init__()
        for key, v in (("in_features", in_features), ("out_features", out_features), ("align", align)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"FusedDense: {key} must be an integer >= 1, got {v!r}")
        if activation not in ACTIVATIONS:
            raise ValueError(f"FusedDense: activation must be one of None, 'tanh', 'relu', got {activation!r}")
        self.in_features, self.out_features, self.align = int(in_features), int(out_features), int(align)
        self.activation = activation
        self.in_storage = aligned(in_features, align)
        self.out_storage = aligned(out_features, align)
        w = _logical_init(weight_init, [self.out_features, self.in_features], HeUniform(math.sqrt(5)))
        b = _logical_init(bias_init, [self.out_features], Uniform(scale=1.0 / math.sqrt(self.in_features)))
        self.weight = Parameter(Tensor(pad_to(w, self.storage_shape("weight"))), name="weight")
        self.bias = Parameter(Tensor(pad_to(b, self.storage_shape("bias"))), name="bias")
        self.pad_input = bool(pad_input) and self.in_storage != self.in_features
        self.slice_output = bool(slice_output) and self.out_storage != self.out_features
        self.in_pad = self.in_storage - self.in_features
        self.use_dense_primitive = ms.get_context("device_target") in _FUSED_BACKENDS
        self.matmul = ops.MatMul(transpose_b=True)
        self.bias_add = ops.BiasAdd()

    # ------------------------------------------------------------------ layout
    def storage_shape(self, which: str):
        return (self.out_storage, self.in_storage) if which == "weight" else (self.out_storage,)

    def logical_shape(self, which: str):
        return (self.out_features, self.in_features) if which == "weight" else (self.out_features,)

    def logical_weight(self) -> np.ndarray:
        """The logical ``(out_features, in_features)`` weight as a numpy array."""
        return self.weight.asnumpy()[: self.out_features, : self.in_features].copy()

    def logical_bias(self) -> np.ndarray:
        return self.bias.asnumpy()[: self.out_features].copy()

    def storage_arrays(self, weight: np.ndarray, bias: np.ndarray):
        """Zero-padded storage arrays for logical ``weight`` and ``bias`` (shapes checked)."""
        weight, bias = np.asarray(weight, np.float32), np.asarray(bias, np.float32)
        if weight.shape != self.logical_shape("weight") or bias.shape != self.logical_shape("bias"):
            raise ValueError(f"FusedDense: expected logical weight {self.logical_shape('weight')} and bias "
                             f"{self.logical_shape('bias')}, got {weight.shape} and {bias.shape}")
        return pad_to(weight, self.storage_shape("weight")), pad_to(bias, self.storage_shape("bias"))

    def load_logical(self, weight: np.ndarray, bias: np.ndarray) -> None:
        """Write logical arrays into the padded Parameters with a compiled assign (visible to compiled graphs)."""
        from .assign import AssignParameters

        w, b = self.storage_arrays(weight, bias)
        AssignParameters([self.weight, self.bias]).write([Tensor(w), Tensor(b)])

    def extend_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, activation={self.activation}, "
                f"align={self.align}, storage={self.out_storage}x{self.in_storage}")

    # ------------------------------------------------------------------ graph
    def __call__(self, x):
        # (a direct call with an empty batch: an empty output, as nn.Dense gives; the padding kernel refused it. Not
        # in construct: under an exported graph's dynamic batch that check became a runtime Switch, and the loaded
        # graph failed on its second batch size)
        if 0 in tuple(x.shape)[:-1]:
            return ops.zeros(tuple(x.shape)[:-1] + (self.out_features,), x.dtype)
        return super().__call__(x)

    def construct(self, x):
        shape = x.shape
        if len(shape) != 2:
            x = x.reshape(-1, shape[-1])
        if self.pad_input:
            x = ops.pad(x, (0, self.in_pad))
        if self.use_dense_primitive:
            y = ops.dense(x, self.weight, self.bias)
        else:
            y = self.bias_add(self.matmul(x, self.weight), self.bias)
        if self.activation == "tanh":
            y = ops.tanh(y)
        elif self.activation == "relu":
            y = ops.relu(y)
        if self.slice_output:
            y = y[:, : self.out_features]
        if len(shape) != 2:
            y = y.reshape(shape[:-1] + (y.shape[-1],))
        return y


def fused_mlp(dims: Sequence[int], activation: str, align: int = 16, inits=None,
              out_activation: str | None = None) -> nn.SequentialCell:
    """``dims[0] -> dims[1] -> ... -> dims[-1]`` MLP of FusedDense layers, activations padded in between.

    The cells are keyed "0", "2", "4", ...: the indices the Dense layers have in the equivalent
    ``SequentialCell([Dense, Act, Dense, Act, Dense])``, so Parameter names (``pi_net.2.weight``) coincide.
    ``inits`` is an optional list of (weight_init, bias_init) per layer.
    """
    n = len(dims) - 1
    inits = inits or [(None, None)] * n
    if len(inits) != n:  # (too few was an IndexError; too many were ignored)
        raise ValueError(f"fused_mlp: {len(inits)} (weight_init, bias_init) pairs for {n} layers")
    cells = OrderedDict()
    for i in range(n):
        a, b = dims[i], dims[i + 1]
        act = activation if i < n - 1 else out_activation
        cells[str(2 * i)] = FusedDense(a, b, act, align, weight_init=inits[i][0], bias_init=inits[i][1],
                                       pad_input=(i == 0), slice_output=(i == n - 1))
    return nn.SequentialCell(cells)


class LayerInfo(NamedTuple):
    """One affine layer of an MLP: its Parameters, logical sizes and the activation that follows it."""
    weight: Parameter
    bias: Parameter
    in_features: int
    out_features: int
    activation: str | None
    fused: bool

    def logical_weight(self) -> np.ndarray:
        return self.weight.asnumpy()[: self.out_features, : self.in_features].copy()

    def logical_bias(self) -> np.ndarray:
        return self.bias.asnumpy()[: self.out_features].copy()


def mlp_layers(seq: nn.Cell) -> list[LayerInfo]:
    """The affine layers of an MLP made of ``nn.Dense`` (+ ``nn.Tanh``/``nn.ReLU``) or ``FusedDense`` cells. Any
    other cell (``nn.Sigmoid``, a Dense's own ``activation=``, a Dense without bias) is a ValueError: it was left out,
    and a quantised copy then computed another function."""
    cells = list(seq.cells())
    out = []
    for i, cell in enumerate(cells):
        if isinstance(cell, FusedDense):
            out.append(LayerInfo(cell.weight, cell.bias, cell.in_features, cell.out_features, cell.activation, True))
        elif isinstance(cell, nn.Dense):
            if getattr(cell, "activation_flag", False) or not getattr(cell, "has_bias", True):
                raise ValueError(f"mlp_layers: layer {i} is an nn.Dense with its own activation or without a bias; "
                                 "supported: nn.Dense(has_bias=True) followed by nn.Tanh or nn.ReLU, or FusedDense")
            nxt = cells[i + 1] if i + 1 < len(cells) else None
            act = "tanh" if isinstance(nxt, nn.Tanh) else "relu" if isinstance(nxt, nn.ReLU) else None
            out_f, in_f = cell.weight.shape
            out.append(LayerInfo(cell.weight, cell.bias, int(in_f), int(out_f), act, False))
        elif not (isinstance(cell, (nn.Tanh, nn.ReLU)) and i > 0 and isinstance(cells[i - 1], nn.Dense)):
            raise ValueError(f"mlp_layers: layer {i} is a {type(cell).__name__}; supported: nn.Dense followed by "
                             "nn.Tanh or nn.ReLU, or FusedDense")
    return out
