"""NatureCNN, the image feature extractor of Mnih et al. (2015) as Stable-Baselines3 builds it.

uint8 ``(B, C, H, W)`` -> float32 / 255 -> Conv 8x8 stride 4 -> ReLU -> Conv 4x4 stride 2 -> ReLU -> Conv 3x3
stride 1 -> ReLU -> flatten -> Dense(``features_dim``) -> ReLU. Convolutions are ``valid`` (no padding). The
scaling is inside the graph, so rollout storage and exported policies take the frames as uint8. With orthogonal
initialisation every layer gets gain sqrt(2) and zero biases (SB3's ``ortho_init`` for the extractor).

:class:`Conv` holds ``nn.Conv2d``'s Parameters (``weight (out, in, k, k)``, ``bias (out,)``) and computes the
convolution as im2col (``ops.unfold``) + one batched matmul on CPU, where MindSpore 2.10's ``Conv2D`` kernel is much
slower (``benchmarks/cnn_conv.py``; docs/performance.md has the table); elsewhere it calls ``ops.conv2d``.
Tests check both against ``nn.Conv2d``. On the im2col path the first layer's patches can come from a C++ kernel
instead (:meth:`NatureCNN.set_patch_kernel`, ``policy.conv_kernel``; :mod:`scalebox_ms.ops.custom.patches`): it
reads the uint8 frames, casts, scales by 1/255 and unfolds them in one pass, with ``ops.unfold``'s values bit for
bit; it has no backward (nothing needs the observation's gradient), so its output goes through
``ops.stop_gradient``. Or all three convolutions run on oneDNN's own forward and backward primitives
(:meth:`NatureCNN.set_onednn`, ``policy.conv_backend``; :mod:`scalebox_ms.ops.custom.onednn_conv`), the default on CPU.
:func:`builtin_patches` switches back to the MindSpore ops for a MindIR export.

:class:`CombinedFeatures` is SB3's ``CombinedExtractor`` for Dict/Tuple observations with images inside: one
NatureCNN per image leaf on its unpacked frame (:func:`unpack_pixels`), the other columns passed through, all
concatenated in leaf order.
"""
from __future__ import annotations

import contextlib
import math

import mindspore as ms
from mindspore import nn, ops
from mindspore.common.initializer import HeUniform, Orthogonal, Zero, initializer

from ..errors import ConfigError

KERNELS = ((8, 4), (4, 2), (3, 1))  # (kernel size, stride) of the three convolutions


class Conv(nn.Cell):
    """A valid, strided 2-D convolution with ``nn.Conv2d``'s Parameters; ``im2col`` picks the CPU path."""

    def __init__(self, in_channels: int, out_channels: int, kernel: int, stride: int, weight_init, bias_init,
                 im2col=None):
        super().__init__()
        self.weight = ms.Parameter(initializer(weight_init, [out_channels, in_channels, kernel, kernel], ms.float32),
                                   name="weight")
        self.bias = ms.Parameter(initializer(bias_init, [out_channels], ms.float32), name="bias")
        self.kernel, self.stride = int(kernel), int(stride)
        self.in_channels, self.out_channels = int(in_channels), int(out_channels)
        self.im2col = (ms.get_context("device_target") == "CPU") if im2col is None else bool(im2col)

        self.patches = None  # an ImagePatchesKernel (first layer only, set_patch_kernel): computes the patches
        self.use_patches = False
        self.onednn = None  # a OneDNNConv (NatureCNN.set_onednn): the whole convolution and its gradients
        self.use_onednn = False

    def construct(self, x):
        if self.use_onednn:
            return self.onednn(x, self.weight, self.bias)
        if self.use_patches:  # x: the raw observation; the kernel casts, scales and unfolds it (no gradient)
            return conv_from_patches(ops.stop_gradient(self.patches(x)), self.weight, self.bias, x.shape[2],
                                     x.shape[3], self.stride)
        return conv2d_valid(x, self.weight, self.bias, self.stride, self.im2col)


def conv2d_valid(x, weight, bias, stride: int, im2col: bool):
    """Valid 2-D convolution of NCHW ``x`` with ``weight (out, in, k, k)``: im2col + matmul, or ``ops.conv2d``."""
    if not im2col:
        return ops.conv2d(x, weight, bias, stride=stride, pad_mode="valid")
    k = weight.shape[2]
    cols = ops.unfold(x, k, 1, 0, stride)  # (B, C*k*k, oh*ow), the patch in (C, kh, kw) order like the weight
    return conv_from_patches(cols, weight, bias, x.shape[2], x.shape[3], stride)


def conv_from_patches(cols, weight, bias, H: int, W: int, stride: int):
    """The convolution of an ``H x W`` input from its im2col patches ``cols (B, C*k*k, oh*ow)``: one batched
    matmul with the weight ``(out, C, k, k)``, plus the bias, as NCHW ``(B, out, oh, ow)``."""
    B = cols.shape[0]
    out, k, s = weight.shape[0], weight.shape[2], stride
    oh, ow = (H - k) // s + 1, (W - k) // s + 1
    # (B, out, C*k*k) @ (B, C*k*k, oh*ow) -> (B, out, oh*ow): already NCHW, no transposes (they cost more than the
    # matmul). The weight is broadcast explicitly: through ops.matmul's implicit broadcast, MindSpore 2.10's CPU
    # backward also computes the patches' gradient (and unfold's backward) where nothing needs it, e.g. for the
    # first layer, whose input is the observation (benchmarks/cnn_conv.py: forward + backward 1.2-1.6x faster
    # per layer, 1.34x for NatureCNN). It is copied with ops.tile, not ops.broadcast_to: MindSpore 2.10's CPU
    # BroadcastTo writes ~1.5 GB/s (24 ms for layer 2's 8.4M values at batch 256, a fifth of a PPO update on
    # Breakout); Tile makes NatureCNN's forward + backward ~1.35x faster (docs/performance.md, CNN section).
    w = ops.tile(weight.reshape(1, out, -1), (B, 1, 1))
    y = ops.bmm(w, cols) + bias.reshape(out, 1)
    return y.reshape(B, out, oh, ow)


def patch_kernel_cnns(model) -> list:
    """Every NatureCNN inside ``model`` (a Cell), e.g. the policy's, the value function's and target networks'."""
    return [cell for _, cell in model.cells_and_names() if isinstance(cell, NatureCNN)]


@contextlib.contextmanager
def builtin_patches(model):
    """Within the block every NatureCNN of ``model`` computes its convolutions with MindSpore's ops (``ops.unfold``,
    no patches kernel, no oneDNN op): for graphs compiled there, e.g. a MindIR export (an aot kernel's library path
    does not travel with the file).
    Graphs compiled before keep their own choice; the kernels are set back afterwards."""
    saved = [(cnn, cnn.first.patches, cnn.raw_input, [(layer.onednn, layer.use_onednn) for layer in cnn.layers()])
             for cnn in patch_kernel_cnns(model)]
    try:
        for cnn, _, _, _ in saved:
            cnn.set_patch_kernel(None)
            for layer in cnn.layers():
                layer.use_onednn = False
        yield model
    finally:
        for cnn, kernel, raw, ops_ in saved:
            cnn.set_patch_kernel(kernel)
            for layer, (op, used) in zip(cnn.layers(), ops_):  # (the same op objects: nothing to build again)
                layer.onednn, layer.use_onednn = op, used
            cnn.raw_input = raw


def conv_output_hw(h: int, w: int):
    """Spatial size after the three valid convolutions."""
    for k, s in KERNELS:
        h, w = (h - k) // s + 1, (w - k) // s + 1
    return h, w


class NatureCNN(nn.Cell):
    def __init__(self, image_shape, channels=(32, 64, 64), features_dim: int = 512, ortho: bool = True,
                 im2col=None):
        super().__init__()
        c, h, w = (int(x) for x in image_shape)
        oh, ow = conv_output_hw(h, w)
        if oh < 1 or ow < 1:
            raise ConfigError(f"policy.features: nature_cnn (set, or auto's choice for images) needs images of "
                              f"at least 36x36 pixels, got {h}x{w}; policy.features: mlp flattens them instead")
        gain = math.sqrt(2.0)
        layers, in_c = [], c
        for (k, s), out_c in zip(KERNELS, channels):
            # without ortho_init: nn.Conv2d's defaults (HeUniform(sqrt(5)) weights, zero biases)
            w_init = Orthogonal(gain=gain) if ortho else HeUniform(negative_slope=math.sqrt(5))
            layers += [Conv(in_c, out_c, k, s, w_init, Zero(), im2col), nn.ReLU()]
            in_c = out_c
        self.conv = nn.SequentialCell(layers)
        self.n_flatten = in_c * oh * ow
        w_init = initializer(Orthogonal(gain=gain), [features_dim, self.n_flatten], ms.float32) if ortho else None
        b_init = initializer(Zero(), [features_dim], ms.float32) if ortho else None
        self.linear = (nn.Dense(self.n_flatten, features_dim, weight_init=w_init, bias_init=b_init) if ortho
                       else nn.Dense(self.n_flatten, features_dim))
        self.features_dim = int(features_dim)
        self.image_shape = (c, h, w)
        # True with a patch kernel or oneDNN: construct hands the frames to the first layer as they are
        self.raw_input = False

    def construct(self, obs):
        if self.raw_input:  # the first layer's kernel reads the frames themselves (uint8 or float pixels)
            x = self.conv(obs)
        else:
            x = self.conv(obs.astype(ms.float32) * (1.0 / 255.0))
        return ops.relu(self.linear(x.reshape(x.shape[0], -1)))

    @property
    def first(self) -> Conv:
        return self.conv[0]

    def set_patch_kernel(self, kernel) -> None:
        """Compute the first convolution's patches with ``kernel`` (an
        :class:`~scalebox_ms.ops.custom.patches.ImagePatchesKernel` for 8x8/4 and scale 1/255, on the im2col path),
        or with ``ops.unfold`` again (None). Before the model is compiled: a compiled graph keeps its choice."""
        first = self.first
        if kernel is not None:
            k, s = KERNELS[0]
            if not first.im2col or (kernel.k, kernel.s) != (k, s):
                raise ConfigError(f"policy.conv_kernel: the patches kernel needs the im2col path and {k}x{k} "
                                  f"stride {s}, got im2col={first.im2col}, {kernel.k}x{kernel.k} stride {kernel.s}")
        first.patches, first.use_patches = kernel, kernel is not None
        self.raw_input = kernel is not None

    def set_onednn(self, enabled: bool) -> None:
        """Run the three convolutions as :class:`~scalebox_ms.ops.custom.onednn_conv.OneDNNConv` (oneDNN's own
        forward and backward primitives, CPU; ``policy.conv_backend``), or as before (False). The first layer's
        input is the observation: its input gradient is not computed, and it casts and scales the frames itself.
        Replaces a patches kernel. Before the model is compiled: a compiled graph keeps its choice."""
        from ..ops.custom.onednn_conv import OneDNNConv

        if enabled:
            self.set_patch_kernel(None)
        for i, cell in enumerate(self.layers()):  # the first reads the frames (uint8 or float pixels) itself
            cell.onednn = OneDNNConv(cell.kernel, cell.stride, input_grad=i > 0, pixels=i == 0) if enabled else None
            cell.use_onednn = bool(enabled)
        self.raw_input = bool(enabled) or self.first.use_patches

    def layers(self) -> list:
        """The three :class:`Conv` cells, in order."""
        return [m for m in self.conv.cells() if isinstance(m, Conv)]

    def activation_sizes(self, image_shape=None) -> list:
        """Floats per image of each layer's im2col patches, broadcast weight (CPU path) and outputs (for memory
        estimates)."""
        c, h, w = image_shape or self.image_shape
        sizes, in_c = [], c
        for (k, s), cell in zip(KERNELS, self.layers()):
            h, w = (h - k) // s + 1, (w - k) // s + 1
            patches = in_c * k * k
            sizes.append(patches * h * w)
            if cell.im2col:
                sizes.append(patches * cell.out_channels)  # the weight broadcast over the batch
            sizes.append(cell.out_channels * h * w)
            in_c = cell.out_channels
        return sizes + [self.features_dim]

    def macs(self, image_shape=None) -> int:
        """Multiply-adds per image (convolutions and the Dense layer)."""
        c, h, w = image_shape or self.image_shape
        total, in_c = 0, c
        for (k, s), cell in zip(KERNELS, self.layers()):
            h, w = (h - k) // s + 1, (w - k) // s + 1
            total += h * w * cell.out_channels * in_c * k * k
            in_c = cell.out_channels
        return total + self.n_flatten * self.features_dim


def unpack_pixels(cols, chw):
    """Packed float32 columns (B, ceil(n / 3)) -> float32 (B, C, H, W) pixel values 0..255 (graph code); the
    inverse of :func:`scalebox_ms.envs.obs_encoding.pack_pixels`. Exact: every step is float32 arithmetic on
    integers below 2**24 (divisions by powers of two, floor, subtraction)."""
    v = cols.astype(ms.float32)
    p2 = ops.floor(v * (1.0 / 65536.0))
    rest = v - p2 * 65536.0
    p1 = ops.floor(rest * (1.0 / 256.0))
    p0 = rest - p1 * 256.0
    # (B, 3 * columns): pixel order restored. expand_dims + concat, not ops.stack: in an exported MindIR with a
    # dynamic batch, Stack keeps the first call's batch size
    pixels = ops.concat([ops.expand_dims(p, 2) for p in (p0, p1, p2)], 2).reshape(v.shape[0], -1)
    c, h, w = chw
    return pixels[:, :c * h * w].reshape(v.shape[0], c, h, w)


class CombinedFeatures(nn.Cell):
    """SB3's ``CombinedExtractor`` on the flat vector of a Dict/Tuple observation with images inside: for each
    image leaf (``image_parts``: ``(offset, width, (C, H, W))`` of its packed columns) a NatureCNN on the unpacked
    frame; every other column as it is; concatenated in column order. ``features_dim`` = the other columns +
    ``features_dim`` per image (SB3's default there is 256, ``cnn_output_dim``)."""

    def __init__(self, obs_dim: int, image_parts, channels=(32, 64, 64), features_dim: int = 512,
                 ortho: bool = True, im2col=None, extractors=None):
        super().__init__()
        # (extractors: cells to use instead of new NatureCNNs, one per image part: INT8 export's quantized ones)
        self.obs_dim, self.image_parts = int(obs_dim), tuple(image_parts)
        segments, cnns, chws, col = [], [], [], 0  # segments: (start, end, CNN index or -1 for plain columns)
        for offset, width, chw in sorted(image_parts):
            if offset > col:
                segments.append((col, offset, -1))
            segments.append((offset, offset + width, len(cnns)))
            chws.append(tuple(int(x) for x in chw))
            cnns.append(NatureCNN(chw, channels, features_dim, ortho, im2col) if extractors is None
                        else extractors[len(cnns)])
            col = offset + width
        if col < obs_dim:
            segments.append((col, int(obs_dim), -1))
        self.segments, self.chws = tuple(segments), tuple(chws)
        self.cnns = nn.CellList(cnns)
        self.features_dim = sum(e - s for s, e, i in segments if i < 0) + len(cnns) * int(features_dim)

    def construct(self, obs):
        out = []
        for start, end, i in self.segments:
            if i < 0:
                out.append(obs[:, start:end])
            else:
                out.append(self.cnns[i](unpack_pixels(obs[:, start:end], self.chws[i])))
        return ops.concat(out, 1) if len(out) > 1 else out[0]

    def activation_sizes(self, image_shape=None) -> list:
        """Floats per observation of each image's unpacking (the stacked pixels, the float frame), its CNN layers'
        patches and outputs, then the concatenated features."""
        sizes = []
        for cnn in self.cnns:
            c, h, w = cnn.image_shape
            sizes += [c * h * w, c * h * w] + cnn.activation_sizes()
        return sizes + [self.features_dim]

    def macs(self, image_shape=None) -> int:
        return sum(cnn.macs() for cnn in self.cnns)


def build_features(spec, channels, features_dim: int, ortho: bool):
    """The feature extractor ``spec`` calls for: a NatureCNN (an image observation), a CombinedFeatures (images
    inside a Dict/Tuple) or None (a flat vector: the MLPs read it directly)."""
    if spec.image:
        return NatureCNN(spec.image_shape, channels, features_dim, ortho)
    if spec.image_parts:
        return CombinedFeatures(spec.obs_dim, spec.image_parts, channels, features_dim, ortho)
    return None
