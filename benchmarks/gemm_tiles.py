"""The C++ kernels' GEMM micro-kernel (scalebox_ms/ops/custom/mlp.h) with different micro-tile heights.

Builds ``scalebox_ms/ops/custom/gemm_probe.cc`` once per tiling (``SBX_TILE_ROWS``: rows per register tile; the
default is this CPU's, from simd.h) with the kernels' flags, checks that every tiling gives bit-identical outputs
on the probe's cases, then times the GEMMs of one 512-row block of the PPO update on CartPole's 64-64 networks
(and a 256x256 layer) on one thread: best of 300 calls per shape, fresh process per tiling, tilings run in
``--rounds`` interleaved rounds (the best round kept), GFLOP/s counted from the shapes.

Usage:  python benchmarks/gemm_tiles.py [--tiles 4 6 8] [--rounds 3] [--out benchmarks/results/gemm_tiles.json]
"""
from __future__ import annotations

import argparse
import filecmp
import os
import platform
import subprocess
import tempfile
import time
from bench_args import at_least  # noqa: E402 (benchmarks/ is on sys.path)

HERE = os.path.dirname(os.path.abspath(__file__))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiles", type=int, choices=range(1, 9), nargs="+", default=[4, 6, 8],
                    help="rows per register tile (1-8: mlp.h's gemm covers a remainder of up to 7 rows)")
    ap.add_argument("--rounds", type=at_least(1), default=3)
    ap.add_argument("--out", default=os.path.join(HERE, "results", "gemm_tiles.json"))
    args = ap.parse_args()
    from scalebox_ms.fileio import atomic_write_json
    from scalebox_ms.ops.custom.build import probe_command

    variants = [None, *args.tiles]  # None: simd.h's default for this CPU
    best: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        dumps = {}
        for rows in variants:
            exe = os.path.join(tmp, f"probe_{rows}")
            subprocess.run(probe_command(exe, rows), check=True)
            dumps[rows] = os.path.join(tmp, f"cases_{rows}.bin")
            subprocess.run([exe, "dump", dumps[rows]], check=True)
        identical = all(filecmp.cmp(dumps[None], dumps[r], shallow=False) for r in args.tiles)
        if not identical:
            raise SystemExit("tilings disagree: the GEMM's results depend on the tile shape (see tests/test_gemm_tiles.py)")
        for _ in range(args.rounds):
            for rows in variants:
                out = subprocess.run([os.path.join(tmp, f"probe_{rows}"), "time"], check=True, capture_output=True,
                                     text=True).stdout
                for line in out.splitlines():
                    name, m, n, k, sec = line.split()
                    key = (str(rows), name)
                    gflops = 2.0 * int(m) * int(n) * int(k) / float(sec) / 1e9
                    if key not in best or gflops > best[key]["gflops"]:
                        best[key] = {"shape": f"{m}x{n}x{k}", "seconds": float(sec), "gflops": gflops}
    names = [name for (rows, name) in best if rows == "None"]
    print(f"{'GEMM (rows x N x K)':36s}" + "".join(f"{'tile ' + str(r):>12s}" for r in args.tiles) + f"{'default':>12s}")
    for name in names:
        print(f"{name + ' ' + best[('None', name)]['shape']:36s}"
              + "".join(f"{best[(str(r), name)]['gflops']:12.1f}" for r in args.tiles)
              + f"{best[('None', name)]['gflops']:12.1f}")
    print("GFLOP/s on one thread; all tilings bit-identical on the probe's cases")
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?") \
        if os.path.exists("/proc/cpuinfo") else platform.processor()
    atomic_write_json(args.out, {
        "date": time.strftime("%Y-%m-%d %H:%M"), "cpu": cpu, "machine": platform.machine(), "identical": identical,
        "rows": [{"tile_rows": rows, "gemm": name, **v} for (rows, name), v in best.items()]})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
