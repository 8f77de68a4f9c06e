"""``OneDNNConv``: a valid, strided 2-D convolution on CPU through oneDNN's own primitives (``onednn_conv.cc``).

MindSpore 2.10's CPU ``Conv2D`` passes oneDNN fixed NCHW/OIHW layouts, for which oneDNN runs its reference
convolution (~0.6 GFLOP/s for NatureCNN's first layer); scalebox_ms's default CPU path therefore computes NatureCNN's
convolutions as im2col + one batched matmul (:mod:`scalebox_ms.models.cnn`). This op calls the same oneDNN library
(``mindspore/lib/libdnnl.so.3``, shipped in MindSpore's CPU wheel; no other dependency) but lets it choose its own
layouts, so its JIT convolutions run, with the tensors reordered in and out.

The gradient is not derived by hand: the op's bprop calls oneDNN's backward-data and backward-weights primitives of
the same convolution (as MindSpore's ``Conv2D`` bprop calls ``Conv2DBackpropInput`` / ``Conv2DBackpropFilter``).
``input_grad=False`` (NatureCNN's first layer, whose input is the observation) skips the backward-data pass and
returns a zero input gradient. ``pixels=True`` (that first layer) takes the frames themselves, uint8 (or float32
pixel values), and convolves ``x / 255``: the cast and the scaling happen in oneDNN's reorder of the frames into the
convolution's layout, which runs anyway, instead of two MindSpore kernels over the whole batch before it. Tests compare outputs and every gradient with ``nn.Conv2d``
(``tests/test_onednn_conv.py``).

Selected by ``policy.conv_backend`` (:func:`scalebox_ms.trainers.kernels.select_conv_backend`). Float32 (and uint8
pixels), CPU only;
exported MindIR policies use MindSpore's ops (:func:`scalebox_ms.models.cnn.builtin_patches`), as an aot library's
path does not travel with a model file.
"""
from __future__ import annotations

import ctypes
import os

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn, ops

from ...errors import CustomOpError
from .build import KERNELS, LINK_ARGS, SETTINGS, library_path
from .status import custom_op_errors

KERNEL = "onednn_conv"
KERNELS.setdefault(KERNEL, ("onednn_conv.cc", "OneDNNConvForward"))  # registered here: build.py is shared code
SETTINGS.setdefault(KERNEL, "policy.conv_backend")
#: the oneDNN library inside MindSpore's wheel (this MindSpore's CPU kernels use the same file)
LIBRARY = "libdnnl.so.3"
FORWARD, BACKWARD_DATA, BACKWARD_WEIGHTS = 0, 1, 2


def onednn_library() -> str:
    """Path of MindSpore's own oneDNN library; CustomOpError if this MindSpore has none."""
    path = os.path.join(os.path.dirname(os.path.abspath(ms.__file__)), "lib", LIBRARY)
    if not os.path.isfile(path):
        raise CustomOpError(f"custom op {KERNEL!r}: this MindSpore has no {LIBRARY} ({path} is missing); use "
                            f"policy.conv_backend: im2col")
    return path


def _link_args() -> list:
    """Link MindSpore's libdnnl (resolved through an rpath at load time); its size and mtime enter the cache key as
    a define, so a MindSpore upgrade in place rebuilds the kernel."""
    path = onednn_library()
    st = os.stat(path)
    return [path, f"-Wl,-rpath,{os.path.dirname(path)}", "-Wl,--no-undefined",
            f"-DSBX_DNNL_ID={st.st_size}_{int(st.st_mtime)}"]


LINK_ARGS.setdefault(KERNEL, _link_args)


def implementation(kind: int, n: int, c: int, h: int, w: int, o: int, k: int, s: int) -> str:
    """The name of the implementation oneDNN picks for a pass (FORWARD, BACKWARD_DATA, BACKWARD_WEIGHTS) of this
    shape, e.g. ``'jit:avx512_core'`` (``'ref:any'`` is its slow reference code)."""
    lib = ctypes.CDLL(library_path(KERNEL))
    fn = lib.OneDNNConvImplementation
    fn.argtypes = [ctypes.c_int] + [ctypes.c_int64] * 7 + [ctypes.c_char_p, ctypes.c_int64]
    out = ctypes.create_string_buffer(256)
    if fn(int(kind), n, c, h, w, o, k, s, out, 256) != 0:
        raise CustomOpError(f"custom op {KERNEL!r}: MindSpore's oneDNN is not a usable version (3.x with the "
                            f"threadpool runtime) or has no convolution for N={n} C={c} {h}x{w} -> {o}, k={k}, s={s}")
    return out.value.decode()


def _float32(*dtypes):
    return ms.float32


# The two backward ops, made once per process and shared by every OneDNNConv (the kernel reads everything from the
# shapes and meta). MindSpore's graph mode keeps the first bprop it sees for an aot function (its "path:symbol")
# and gives it to every op of that function: the two bprops are module-level functions of their own forward
# symbols, never closures over per-instance values (in graph mode every instance would get the first one's).
_BACKWARD_DATA = None
_BACKWARD_WEIGHTS = None


_BACKWARD_LIBRARY = None


def _make_backward_ops(so: str) -> None:
    global _BACKWARD_DATA, _BACKWARD_WEIGHTS, _BACKWARD_LIBRARY
    if _BACKWARD_LIBRARY != so:  # (first use, or the library moved: a changed CXX or cache; graphs compile anew)
        _BACKWARD_LIBRARY = so
        _BACKWARD_DATA = ops.Custom(f"{so}:OneDNNConvBackwardData", out_shape=lambda dy, w, x, meta: x,
                                    out_dtype=_float32, func_type="aot")
        _BACKWARD_WEIGHTS = ops.Custom(f"{so}:OneDNNConvBackwardWeights",
                                       out_shape=lambda x, dy, w, meta: (w, [w[0]]),
                                       out_dtype=lambda *dtypes: (ms.float32, ms.float32), func_type="aot")


def _bprop(x, w, b, meta, out, dout):
    """oneDNN's backward passes of the convolution: dx (backward data), dw and db (backward weights)."""
    dw, db = _BACKWARD_WEIGHTS(x, dout, w, meta)
    return _BACKWARD_DATA(dout, w, x, meta), dw, db, ops.zeros_like(meta)


def _bprop_weights_only(x, w, b, meta, out, dout):
    """As :func:`_bprop` with a zero input gradient (``input_grad=False``: nothing needs it)."""
    dw, db = _BACKWARD_WEIGHTS(x, dout, w, meta)
    return ops.zeros_like(x), dw, db, ops.zeros_like(meta)


def slow_passes(cnns, batch: int = 2) -> list:
    """The passes of the NatureCNNs' convolutions for which oneDNN has only its reference code on this CPU (what
    MindSpore's own Conv2D runs), e.g. ``['backward_weights 4->32 8x8/4 on 84x84']``; empty when all have compiled
    code. Builds the kernel (CustomOpError if it cannot be built or oneDNN is unusable)."""
    names = {FORWARD: "forward", BACKWARD_DATA: "backward_data", BACKWARD_WEIGHTS: "backward_weights"}
    slow, seen = [], set()
    for cnn in cnns:
        c, h, w = cnn.image_shape
        for i, layer in enumerate(cnn.layers()):
            k, s, o = layer.kernel, layer.stride, layer.out_channels
            kinds = (FORWARD, BACKWARD_DATA, BACKWARD_WEIGHTS) if i > 0 else (FORWARD, BACKWARD_WEIGHTS)
            for kind in kinds:
                key = (kind, c, h, w, o, k, s)
                if key not in seen:
                    seen.add(key)
                    if implementation(kind, batch, c, h, w, o, k, s).startswith("ref"):
                        slow.append(f"{names[kind]} {c}->{o} {k}x{k}/{s} on {h}x{w}")
            c, h, w = o, (h - k) // s + 1, (w - k) // s + 1
    return slow


class OneDNNConv(nn.Cell):
    """``(x (N, C, H, W), weight (O, C, k, k), bias (O,)) -> (N, O, OH, OW)``, a valid convolution with stride
    ``stride``; float32, with a gradient for all three (``input_grad=False``: zeros for ``x``). ``pixels=True``: ``x``
    holds pixel values 0..255 (uint8 or float32) and the op convolves ``x / 255`` (no input gradient: it needs
    ``input_grad=False``)."""

    def __init__(self, kernel: int, stride: int, input_grad: bool = True, pixels: bool = False):
        super().__init__(auto_prefix=False)
        target = ms.get_context("device_target")
        if target != "CPU":
            raise CustomOpError(f"custom op {KERNEL!r}: oneDNN's convolutions here are CPU code, not {target}; use "
                                f"policy.conv_backend: im2col")
        k, s = int(kernel), int(stride)
        if k < 1 or s < 1:
            raise CustomOpError(f"custom op {KERNEL!r}: kernel size and stride must be >= 1, got {k} and {s}")
        if pixels and input_grad:
            raise CustomOpError(f"custom op {KERNEL!r}: a convolution of pixels (x / 255) has no input gradient; "
                                f"pass input_grad=False")
        self.k, self.s, self.input_grad, self.pixels = k, s, bool(input_grad), bool(pixels)
        self.meta = Tensor(np.asarray([k, s, int(self.pixels)], np.int32))
        so = library_path(KERNEL)
        _make_backward_ops(so)

        def conv_shape(x, w, *rest):
            if len(x) != 4 or len(w) != 4:
                raise CustomOpError(f"custom op {KERNEL!r}: input and weight must be 4-D, got {tuple(x)} and "
                                    f"{tuple(w)}")
            n, _, h, wd = x
            if 0 <= h < k or 0 <= wd < k:
                raise CustomOpError(f"custom op {KERNEL!r}: inputs of {h}x{wd} pixels are smaller than the {k}x{k} "
                                    f"kernel")
            # (-1: a size known only at run time, which the kernel checks)
            return (n, w[0], (h - k) // s + 1 if h >= 0 else -1, (wd - k) // s + 1 if wd >= 0 else -1)

        # MindSpore's graph mode keeps one bprop per aot function: each bprop has its own entry point
        symbol, bprop = ("OneDNNConvForward", _bprop) if self.input_grad else \
            ("OneDNNConvForwardNoInputGrad", _bprop_weights_only)
        self.forward = ops.Custom(f"{so}:{symbol}", out_shape=conv_shape, out_dtype=_float32, func_type="aot",
                                  bprop=bprop)

    def construct(self, x, weight, bias):
        return self.forward(x, weight, bias, self.meta)

    def __call__(self, *args):
        # a direct call: the kernel's return code as a CustomOpError (inside another graph that graph's call raises
        # MindSpore's RuntimeError; status.custom_op_errors translates it)
        with custom_op_errors():
            return super().__call__(*args)
