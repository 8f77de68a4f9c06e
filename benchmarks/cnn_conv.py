"""NatureCNN's convolutions on CPU: MindSpore's nn.Conv2d kernel vs scalebox_ms's im2col + matmul (models/cnn.py).

For each of NatureCNN's three layers on Atari's (4, 84, 84) frame stacks at batch 256 (a minibatch of
configs/ppo_atari.yaml): forward seconds and forward+backward (weight gradients) seconds, median of 3 calls after
a warm-up, both compiled with ``@ms.jit``; then the whole NatureCNN forward and forward+backward both ways.

Usage:  python benchmarks/cnn_conv.py [--batch 256] [--out benchmarks/results/cnn_conv.json]
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

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

    def loss(inp):
        return cell(inp).sum()

    return timed(ms.jit(cell.construct), x), timed(ms.jit(ms.value_and_grad(loss, None, cell.trainable_params())), x)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--out", default=os.path.join(HERE, "results", "cnn_conv.json"))
    args = ap.parse_args()

    import mindspore as ms
    import numpy as np
    from mindspore import nn

    from scalebox_ms import Sandbox
    from scalebox_ms.fileio import atomic_write_json
    from scalebox_ms.models.cnn import Conv, NatureCNN

    Sandbox(device="cpu", seed=0)
    B = args.batch
    rows = []
    for cin, cout, k, s, hw in [(4, 32, 8, 4, 84), (32, 64, 4, 2, 20), (64, 64, 3, 1, 9)]:
        x = ms.Tensor(np.random.default_rng(0).random((B, cin, hw, hw)).astype(np.float32))
        row = {"layer": f"{cin}->{cout} {k}x{k}/{s} on {hw}x{hw}"}
        for name, cell in (("nn.Conv2d", nn.Conv2d(cin, cout, k, stride=s, pad_mode="valid", has_bias=True)),
                           ("im2col", Conv(cin, cout, k, s, "normal", "zeros", im2col=True))):
            row[f"{name}_fwd_s"], row[f"{name}_fwd_bwd_s"] = fwd_and_fwd_bwd(cell, x)
        rows.append(row)
        print(row, flush=True)
    frames = ms.Tensor(np.random.default_rng(1).integers(0, 256, (B, 4, 84, 84)).astype(np.uint8))
    whole = {"layer": "NatureCNN (4, 84, 84) -> 512"}
    for name, im2col in (("nn.Conv2d", False), ("im2col", True)):
        whole[f"{name}_fwd_s"], whole[f"{name}_fwd_bwd_s"] = fwd_and_fwd_bwd(NatureCNN((4, 84, 84), im2col=im2col),
                                                                             frames)
    rows.append(whole)
    print(whole, flush=True)
    for row in rows:
        row["fwd_speedup"] = row["nn.Conv2d_fwd_s"] / row["im2col_fwd_s"]
        row["fwd_bwd_speedup"] = row["nn.Conv2d_fwd_bwd_s"] / row["im2col_fwd_bwd_s"]
    atomic_write_json(args.out, {"batch": B, "rows": rows, "date": time.strftime("%Y-%m-%d %H:%M"),
                                 "mindspore": ms.__version__, "cpus": os.cpu_count()})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
