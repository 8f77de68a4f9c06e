"""NatureCNN's convolutions on CPU: MindSpore's nn.Conv2d kernel vs scalebox_ms's im2col + matmul (models/cnn.py).

For each of NatureCNN's three layers on Atari's (4, 84, 84) frame stacks at batch 256 (a minibatch of
configs/ppo_atari.yaml): forward seconds and forward+backward (weight gradients) seconds, median of 3 calls after
a warm-up, both compiled with ``@ms.jit``; then the whole NatureCNN forward and forward+backward both ways.
``im2col, implicit broadcast`` is the formulation models/cnn.py used before: ``ops.matmul(weight, patches)``,
MindSpore broadcasting the weight over the batch itself (its backward then also computes the patches' gradient).
``im2col, broadcast_to`` copies the weight over the batch with ``ops.broadcast_to`` (models/cnn.py before it used
``ops.tile``). The variants run one after the other (nn.Conv2d, im2col, implicit, broadcast_to), not interleaved. The whole-NatureCNN row
also times ``im2col_patch_kernel``: the first layer's patches from the C++ kernel on the uint8 frames
(``policy.conv_kernel: custom``, ops/custom/patches.cc) instead of ``ops.unfold`` of the scaled float frames.
``onednn`` is ``policy.conv_backend: onednn`` (ops/custom/onednn_conv.cc: oneDNN's own convolution primitives, the
default on CPU since 2026-12-05): per layer with the input gradient, for NatureCNN without the first layer's.

Usage:  python benchmarks/cnn_conv.py [--batch 256] [--out benchmarks/results/cnn_conv.json]
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

from mindspore import ops  # (module level: graph code cannot import)
from bench_args import at_least  # noqa: E402 (benchmarks/ is on sys.path)

HERE = os.path.dirname(os.path.abspath(__file__))


def timed(fn, *args, n=3):
    out = fn(*args)
    (out[0] if isinstance(out, (tuple, list)) else out).asnumpy()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        out = fn(*args)
        (out[0] if isinstance(out, (tuple, list)) else out).asnumpy()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def fwd_and_fwd_bwd(cell, x):
    """(forward seconds, forward + weight-gradient seconds) of a Cell on ``x``, both compiled."""
    import mindspore as ms

    def forward(inp):  # (a function of ours: ms.jit of a construct patched onto the class, as cnn_channel_major.py
        return cell(inp)  # does, recompiled on every call, ~0.5 s each whatever the batch)

    def loss(inp):
        return cell(inp).sum()

    return timed(ms.jit(forward), x), timed(ms.jit(ms.value_and_grad(loss, None, cell.trainable_params())), x)


def conv_implicit_broadcast(x, weight, bias, stride: int, im2col: bool):
    """models/cnn.py's im2col convolution as it was before the explicit broadcast (for the side-by-side row)."""
    B, _, H, W = x.shape
    out, k, s = weight.shape[0], weight.shape[2], stride
    oh, ow = (H - k) // s + 1, (W - k) // s + 1
    y = ops.matmul(weight.reshape(out, -1), ops.unfold(x, k, 1, 0, s)) + bias.reshape(out, 1)
    return y.reshape(B, out, oh, ow)


def conv_from_patches_broadcast_to(cols, weight, bias, H: int, W: int, stride: int):
    """models/cnn.py's conv_from_patches as it was before ops.tile: the weight copied with ops.broadcast_to."""
    B = cols.shape[0]
    out, k, s = weight.shape[0], weight.shape[2], stride
    oh, ow = (H - k) // s + 1, (W - k) // s + 1
    w = ops.broadcast_to(weight.reshape(1, out, -1), (B, out, cols.shape[1]))
    y = ops.bmm(w, cols) + bias.reshape(out, 1)
    return y.reshape(B, out, oh, ow)


def variants(run):
    """``run()`` once per convolution path: nn.Conv2d, im2col as it is, im2col with the implicit broadcast, im2col
    with the weight copied by ops.broadcast_to instead of ops.tile."""
    from scalebox_ms.models import cnn

    out = {"nn.Conv2d": run(False), "im2col": run(True)}
    for name, attr, replacement in [("im2col_implicit", "conv2d_valid", conv_implicit_broadcast),
                                    ("im2col_broadcast_to", "conv_from_patches", conv_from_patches_broadcast_to)]:
        current = getattr(cnn, attr)
        setattr(cnn, attr, replacement)  # read when a new cell is compiled
        try:
            out[name] = run(True)
        finally:
            setattr(cnn, attr, current)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=at_least(1), default=256)
    ap.add_argument("--out", default=os.path.join(HERE, "results", "cnn_conv.json"))
    args = ap.parse_args()

    import mindspore as ms
    import numpy as np
    from mindspore import nn

    from scalebox_ms import Sandbox
    from scalebox_ms.fileio import atomic_write_json
    from scalebox_ms.models.cnn import Conv, NatureCNN
    from scalebox_ms.ops.custom.onednn_conv import OneDNNConv
    from scalebox_ms.ops.custom.patches import ImagePatchesKernel

    Sandbox(device="cpu", seed=0)
    B = args.batch
    rows = []
    for cin, cout, k, s, hw in [(4, 32, 8, 4, 84), (32, 64, 4, 2, 20), (64, 64, 3, 1, 9)]:
        x = ms.Tensor(np.random.default_rng(0).random((B, cin, hw, hw)).astype(np.float32))
        row = {"layer": f"{cin}->{cout} {k}x{k}/{s} on {hw}x{hw}"}
        def run(im2col, cin=cin, cout=cout, k=k, s=s, x=x):
            cell = (Conv(cin, cout, k, s, "normal", "zeros", im2col=True) if im2col
                    else nn.Conv2d(cin, cout, k, stride=s, pad_mode="valid", has_bias=True))
            return fwd_and_fwd_bwd(cell, x)

        for name, (fwd, fwd_bwd) in variants(run).items():
            row[f"{name}_fwd_s"], row[f"{name}_fwd_bwd_s"] = fwd, fwd_bwd
        on_onednn = Conv(cin, cout, k, s, "normal", "zeros", im2col=True)
        on_onednn.onednn, on_onednn.use_onednn = OneDNNConv(k, s), True  # (with the input gradient: layers 2-3's case)
        row["onednn_fwd_s"], row["onednn_fwd_bwd_s"] = fwd_and_fwd_bwd(on_onednn, x)
        rows.append(row)
        print(row, flush=True)
    frames = ms.Tensor(np.random.default_rng(1).integers(0, 256, (B, 4, 84, 84)).astype(np.uint8))
    whole = {"layer": "NatureCNN (4, 84, 84) -> 512"}
    for name, (fwd, fwd_bwd) in variants(lambda im2col: fwd_and_fwd_bwd(NatureCNN((4, 84, 84), im2col=im2col),
                                                                          frames)).items():
        whole[f"{name}_fwd_s"], whole[f"{name}_fwd_bwd_s"] = fwd, fwd_bwd
    with_kernel = NatureCNN((4, 84, 84), im2col=True)
    with_kernel.set_patch_kernel(ImagePatchesKernel(8, 4, 1.0 / 255.0))  # CustomOpError without a C++ compiler
    whole["im2col_patch_kernel_fwd_s"], whole["im2col_patch_kernel_fwd_bwd_s"] = fwd_and_fwd_bwd(with_kernel, frames)
    whole["patch_kernel_fwd_speedup"] = whole["im2col_fwd_s"] / whole["im2col_patch_kernel_fwd_s"]
    whole["patch_kernel_fwd_bwd_speedup"] = whole["im2col_fwd_bwd_s"] / whole["im2col_patch_kernel_fwd_bwd_s"]
    on_onednn = NatureCNN((4, 84, 84), im2col=True)
    on_onednn.set_onednn(True)  # CustomOpError without a C++ compiler
    whole["onednn_fwd_s"], whole["onednn_fwd_bwd_s"] = fwd_and_fwd_bwd(on_onednn, frames)
    rows.append(whole)
    print(whole, flush=True)
    for row in rows:
        row["fwd_speedup"] = row["nn.Conv2d_fwd_s"] / row["im2col_fwd_s"]
        row["fwd_bwd_speedup"] = row["nn.Conv2d_fwd_bwd_s"] / row["im2col_fwd_bwd_s"]
        row["explicit_broadcast_fwd_bwd_speedup"] = row["im2col_implicit_fwd_bwd_s"] / row["im2col_fwd_bwd_s"]
        row["tile_fwd_bwd_speedup"] = row["im2col_broadcast_to_fwd_bwd_s"] / row["im2col_fwd_bwd_s"]
        row["onednn_fwd_speedup"] = row["im2col_fwd_s"] / row["onednn_fwd_s"]
        row["onednn_fwd_bwd_speedup"] = row["im2col_fwd_bwd_s"] / row["onednn_fwd_bwd_s"]
    atomic_write_json(args.out, {"batch": B, "rows": rows, "date": time.strftime("%Y-%m-%d %H:%M"),
                                 "mindspore": ms.__version__, "cpus": os.cpu_count()})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
