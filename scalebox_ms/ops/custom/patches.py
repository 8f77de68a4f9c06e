"""``ImagePatchesKernel``: the im2col patches of NatureCNN's first convolution as one C++ aot kernel (CPU).

``ImagePatchesKernel(kernel, stride, scale)(x)`` with ``x`` uint8 or float32 ``(B, C, H, W)`` returns float32 ``(B,
C*k*k, OH*OW)``, the values and layout of ``ops.unfold(x.astype(float32) * scale, k, 1, 0, stride)``, bit for bit
(``patches.cc``; ``tests/test_patch_kernel.py`` compares them). NatureCNN's first layer reads the observation
itself, so nothing needs a gradient through its patches: the op has no backward, and
:class:`~scalebox_ms.models.cnn.NatureCNN` puts ``ops.stop_gradient`` on its output (the weight gradient only needs
the patches' values). It writes the first layer's 26M patch values per minibatch of 256 Atari frame stacks in one
pass, the uint8 -> float32 cast and the 1/255 scaling included (what it gains: docs/performance.md, CNN section).

Selected by ``policy.conv_kernel`` (:func:`scalebox_ms.trainers.kernels.select_conv_kernel`): ``auto`` uses it on
CPU when it can be built, ``custom`` insists (a one-line :class:`~scalebox_ms.errors.ConfigError` off CPU, a
:class:`~scalebox_ms.errors.CustomOpError` without a compiler), ``builtin`` keeps ``ops.unfold``. Exported MindIR
policies always use the MindSpore ops (:func:`scalebox_ms.models.cnn.builtin_patches`): an aot kernel's library path
does not travel with a model file.
"""
from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn, ops

from ...errors import CustomOpError
from .build import KERNELS, SETTINGS, func_spec
from .status import custom_op_errors

KERNEL = "image_patches"
KERNELS.setdefault(KERNEL, ("patches.cc", "ImagePatches"))  # registered here: build.py is shared code
SETTINGS.setdefault(KERNEL, "policy.conv_kernel")


class ImagePatchesKernel(nn.Cell):
    """``x (B, C, H, W)`` uint8/float32 -> float32 patches ``(B, C*k*k, OH*OW)`` of a valid ``k x k`` convolution
    with stride ``stride``, every value times ``scale``. Forward only (no bprop)."""

    def __init__(self, kernel: int, stride: int, scale: float = 1.0):
        super().__init__(auto_prefix=False)
        target = ms.get_context("device_target")
        if target != "CPU":
            raise CustomOpError(f"custom op {KERNEL!r}: the C++ kernel runs on CPU only, not {target}; "
                                f"use the builtin ops (policy.conv_kernel: builtin)")
        k, s = int(kernel), int(stride)
        if k < 1 or s < 1:
            raise CustomOpError(f"custom op {KERNEL!r}: kernel size and stride must be >= 1, got {k} and {s}")
        self.k, self.s = k, s
        self.meta = Tensor(np.asarray([k, s], np.int32))
        self.scale = Tensor(np.asarray([scale], np.float32))

        def out_shape(x, *rest):
            if len(x) != 4:
                raise CustomOpError(f"custom op {KERNEL!r}: the frames must be (B, C, H, W), got shape {tuple(x)}")
            b, c, h, w = x
            if 0 <= h < k or 0 <= w < k:  # (-1: a dynamic size, known only at run time; the kernel checks it)
                raise CustomOpError(f"custom op {KERNEL!r}: frames of {h}x{w} pixels are smaller than the "
                                    f"{k}x{k} kernel")
            return (b, c * k * k, ((h - k) // s + 1) * ((w - k) // s + 1))

        self.op = ops.Custom(func_spec(KERNEL), out_shape=out_shape, out_dtype=lambda *dtypes: ms.float32,
                             func_type="aot")

    def construct(self, x):
        return self.op(x, self.meta, self.scale)

    def __call__(self, x):
        # a direct call: the kernel's return code as a CustomOpError (inside another graph that graph's call raises
        # MindSpore's RuntimeError; status.custom_op_errors translates it)
        with custom_op_errors(self.detail):
            return super().__call__(x)

    @staticmethod
    def detail(code):
        """This kernel's meaning of the shared return codes (status.h; the table there is worded for the MLPs)."""
        return {3: "the kernel takes the frames, meta and scale and writes one output",
                4: "the frames must be uint8 or float32 (meta int32, scale float32, the output float32)",
                5: "the frames must be (B, C, H, W) with H and W at least the kernel size, the output "
                   "(B, C*k*k, OH*OW)"}.get(code)
