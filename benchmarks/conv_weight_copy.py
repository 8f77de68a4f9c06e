"""The batched matmul of NatureCNN's im2col convolutions on CPU, four ways (models/cnn.py: conv_from_patches).

For each layer's weight ``(out, C*k*k)`` and patches ``(B, C*k*k, oh*ow)`` at batch 256 (a minibatch of
configs/ppo_atari.yaml), the median ms of 20 compiled calls (each including the copy of the result to numpy) of:
``broadcast_to`` (the weight copied over the batch with ``ops.broadcast_to``, then ``ops.bmm``), ``tile`` (copied
with ``ops.tile``, what models/cnn.py does), ``implicit`` (``ops.matmul(weight, patches)``, MindSpore broadcasting
the weight itself) and ``2d`` (the same products as one 2-D matmul on patches laid out ``(C*k*k, B*oh*ow)``, a
layout scalebox_ms does not use). Forward only: benchmarks/cnn_conv.py times the layers with their gradients.

Usage:  python benchmarks/conv_weight_copy.py [--batch 256] [--out benchmarks/results/conv_weight_copy.json]
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

from mindspore import ops  # (module level: graph code cannot import)
from bench_args import at_least  # noqa: E402 (benchmarks/ is on sys.path)

HERE = os.path.dirname(os.path.abspath(__file__))
LAYERS = [(32, 256, 400), (64, 512, 81), (64, 576, 49)]  # (out, C*k*k, oh*ow) of NatureCNN's three layers


def median_ms(fn, *args, n=20):
    fn(*args).asnumpy()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn(*args).asnumpy()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=at_least(1), default=256)
    ap.add_argument("--out", default=os.path.join(HERE, "results", "conv_weight_copy.json"))
    args = ap.parse_args()

    import mindspore as ms
    import numpy as np

    from scalebox_ms import Sandbox
    from scalebox_ms.fileio import atomic_write_json

    Sandbox(device="cpu", seed=0)
    B, rng, rows = args.batch, np.random.default_rng(0), []
    for out, ckk, hw in LAYERS:
        w = ms.Tensor(rng.random((out, ckk)).astype(np.float32))
        cols = ms.Tensor(rng.random((B, ckk, hw)).astype(np.float32))
        cols_2d = ms.Tensor(rng.random((ckk, B * hw)).astype(np.float32))

        @ms.jit
        def broadcast_to(w, c, out=out, ckk=ckk):
            return ops.bmm(ops.broadcast_to(w.reshape(1, out, ckk), (B, out, ckk)), c)

        @ms.jit
        def tile(w, c, out=out, ckk=ckk):
            return ops.bmm(ops.tile(w.reshape(1, out, ckk), (B, 1, 1)), c)

        @ms.jit
        def matmul(w, c):
            return ops.matmul(w, c)

        row = {"layer": f"{out} x {ckk} @ {ckk} x {hw}", "broadcast_to_ms": median_ms(broadcast_to, w, cols),
               "tile_ms": median_ms(tile, w, cols), "implicit_ms": median_ms(matmul, w, cols),
               "2d_ms": median_ms(matmul, w, cols_2d)}
        rows.append(row)
        print({k: (round(v, 2) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
    atomic_write_json(args.out, {"batch": B, "rows": rows, "date": time.strftime("%Y-%m-%d %H:%M"),
                                 "mindspore": ms.__version__, "cpus": os.cpu_count()})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
