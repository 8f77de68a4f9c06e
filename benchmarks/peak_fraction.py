"""How close PPO on CartPole gets to this CPU's fp32 peak.

1. The peak: the best of a few fp32 matmuls of ``--peak-size`` squared (numpy/BLAS on all cores), in FLOP/s.
   And the rate of one layer's GEMM over a minibatch (the skinny shapes the update runs).
2. The work per env step of a PPO iteration, counted from the layer sizes: the rollout's forward pass of actor and
   critic (2 x multiply-adds per sample) plus ``n_epochs`` x (forward + backward), backward counted as twice the
   forward (the gradient with respect to the inputs and to the weights). Activations, Adam and GAE are ignored
   (a few per cent at these sizes).
3. The best configuration (native CartPole, compiled rollout, C++ update kernel) at growing env batches, env steps/s
   updates included (``native_throughput.run``), times the work per step, as a fraction of the peak.

Usage:  python benchmarks/peak_fraction.py [--peak-size 4096] [--act-kernel builtin|custom]
        [--out benchmarks/results/peak_fraction.json]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
from bench_args import at_least  # noqa: E402 (benchmarks/ is on sys.path)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
OBS, ACTIONS, HIDDEN = 4, 2, (64, 64)  # CartPole-v1, the presets' 64-64 actor and critic


def ensure_fast_blas() -> None:
    """The peak is numpy's matmul: where OpenBLAS fell back to its pre-AVX kernels on this CPU (doctor's
    ``numpy-blas`` warning, e.g. on Intel Emerald Rapids with numpy 1.26's OpenBLAS) it would be ~5x too low and
    every fraction ~5x too high, so run again with the ``OPENBLAS_CORETYPE`` doctor names."""
    from scalebox_ms.doctor import blas_check, cpu_flags, openblas_core

    check = blas_check(openblas_core(), cpu_flags())
    if check["status"] == "ok":
        return
    core = check["detail"].split("OPENBLAS_CORETYPE=")[1].split()[0]
    if os.environ.get("OPENBLAS_CORETYPE"):  # already set, and still pre-AVX: do not loop
        sys.exit(f"peak_fraction.py: numpy's OpenBLAS runs pre-AVX kernels despite OPENBLAS_CORETYPE="
                 f"{os.environ['OPENBLAS_CORETYPE']}; the peak would be wrong (set OPENBLAS_CORETYPE={core})")
    print(f"numpy's OpenBLAS runs pre-AVX kernels here; running again with OPENBLAS_CORETYPE={core}", flush=True)
    os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, "OPENBLAS_CORETYPE": core})


def peak_flops(n: int, repeats: int = 5) -> float:
    a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    b = np.random.default_rng(1).standard_normal((n, n), dtype=np.float32)
    a @ b  # warm-up
    best = np.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2.0 * n**3 / best


def gemm_flops(m: int, k: int, n: int, repeats: int = 50) -> float:
    """FLOP/s of an (m, k) @ (k, n) fp32 matmul: the shapes of a minibatch through one layer."""
    a = np.random.default_rng(0).standard_normal((m, k), dtype=np.float32)
    b = np.random.default_rng(1).standard_normal((k, n), dtype=np.float32)
    a @ b
    best = np.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2.0 * m * k * n / best


def mlp_macs(sizes) -> int:
    return sum(i * o for i, o in zip(sizes[:-1], sizes[1:]))


def flops_per_env_step(n_epochs: int) -> dict:
    forward_macs = mlp_macs((OBS, *HIDDEN, ACTIONS)) + mlp_macs((OBS, *HIDDEN, 1))
    forward = 2 * forward_macs
    return {"forward_flop": forward, "per_env_step_flop": forward + n_epochs * 3 * forward, "n_epochs": n_epochs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--peak-size", type=at_least(512), default=4096)
    ap.add_argument("--iterations", type=int, default=6)
    ap.add_argument("--act-kernel", choices=("builtin", "custom"), default="builtin",
                    help="the acting call inside the compiled rollout: MindSpore ops or the fused C++ kernel")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "peak_fraction.json"))
    args = ap.parse_args()
    if args.iterations < 2:  # (the first iteration compiles: the median is over the others)
        ap.error("--iterations: must be >= 2")
    ensure_fast_blas()
    from native_throughput import run

    from scalebox_ms.fileio import atomic_write_json

    peak = peak_flops(args.peak_size)
    work = flops_per_env_step(4)
    print(f"fp32 peak ({args.peak_size}^2 matmul): {peak / 1e9:.0f} GFLOP/s; PPO work per env step "
          f"(4 epochs): {work['per_env_step_flop'] / 1e3:.0f} kFLOP (forward {work['forward_flop'] / 1e3:.1f} kFLOP)")
    layers = {f"{m}x{k}x{n}": gemm_flops(m, k, n) / peak for m, k, n in
              ((16384, OBS, HIDDEN[0]), (16384, HIDDEN[0], HIDDEN[1]), (16384, HIDDEN[1], ACTIONS))}
    print("one layer's GEMM over a 16384-row minibatch, fraction of the peak: "
          + ", ".join(f"{k} {100 * v:.0f}%" for k, v in layers.items()))
    rows = []
    for n, t in ((1024, 16), (4096, 16), (8192, 16)):
        r = run("native", True, n, t, args.iterations, "custom", args.act_kernel)
        r["gflops"] = r["steps_per_s"] * work["per_env_step_flop"] / 1e9
        r["peak_fraction"] = r["gflops"] * 1e9 / peak
        rows.append(r)
        print(f"N={n:5d} T={t}: {r['steps_per_s']:10,.0f} env steps/s = {r['gflops']:5.1f} GFLOP/s = "
              f"{100 * r['peak_fraction']:4.1f}% of the peak (rollout {100 * r['rollout_share']:.0f}% of the time)",
              flush=True)
    atomic_write_json(args.out, {"peak_gflops": peak / 1e9, "peak_size": args.peak_size, **work, "rows": rows,
                                 "layer_gemm_peak_fraction": layers,
                                 "ceiling_steps_per_s": peak / work["per_env_step_flop"],
                                 "date": time.strftime("%Y-%m-%d %H:%M"), "machine": {"cpus": os.cpu_count()}})
    print(f"ceiling at the peak: {peak / work['per_env_step_flop']:,.0f} env steps/s; wrote {args.out}")


if __name__ == "__main__":
    main()
