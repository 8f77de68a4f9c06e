"""Data-parallel scaling: CartPole PPO with 1 vs 2 msrun workers (MCCL over loopback), in one script run.

Both runs use the same global problem (``env.num_envs`` envs and ``ppo.batch_size`` per minibatch in total;
with 2 workers each rank steps half the envs and computes half of each minibatch, gradients all-reduced every
minibatch). Each run goes through the real CLI (``python -m scalebox_ms.train [--workers 2]``) and the script
reads its metrics.csv and summary.json: steps/s (median over iterations after the first), the communication
share of the iteration (``share_comm``: the update's all-reduces timed on their own, times the minibatch steps),
scaling efficiency = steps/s(2) / (2 x steps/s(1)), and the eval return.

What 2 shared CPU cores can show: that the machinery works (identical parameters on both ranks, the job learns)
and what the collectives cost. They cannot show speed-up: 1 worker already uses both cores for MindSpore's
kernels, so 2 workers split the same 2 cores (1 thread each) and add communication. The seed's 92% at 8 cards
needs 8 devices (see docs/data_parallel.md).

Every row runs the same code: the compiled graphs for acting and the update (``policy.act_kernel`` and
``ppo.update_kernel`` builtin; ``auto`` would pick the C++ kernels for 1 worker only, which have no all-reduce),
unless ``--set`` says otherwise; each row records the kernels its run reported.

Usage:  python benchmarks/dp_scaling.py [--workers 1 2] [--total-steps 100000] [--set ppo.n_epochs=20 ...]
                                        [--out benchmarks/results/dp_scaling.json]
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile

from scalebox_ms.fileio import atomic_write_json

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def run(workers: int, total_steps: int, sets, root: str) -> dict:
    run_dir = os.path.join(root, f"w{workers}")
    cmd = [sys.executable, "-m", "scalebox_ms.train", "--workers", str(workers), "--total-steps", str(total_steps),
           "--run-dir", run_dir, "--no-progress"]
    for s in sets:
        cmd += ["--set", s]
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{workers} worker(s) failed: {r.stderr.strip().splitlines()[-1]}")
    summary = json.loads(r.stdout)
    with open(os.path.join(run_dir, "metrics.csv"), newline="") as f:
        rows = list(csv.DictReader(f))[1:]  # the first iteration compiles
    if not rows:
        raise SystemExit(f"{workers} worker(s): --total-steps {total_steps} is a single iteration; the medians need "
                         "at least two")
    return {
        "workers": workers,
        "steps_per_s": statistics.median(float(x["steps_per_second"]) for x in rows),
        "share_comm": statistics.median(float(x["share_comm"]) for x in rows),
        "share_update": statistics.median(float(x["share_update"]) for x in rows),
        "wall_time_s": summary["wall_time_s"],
        "eval_mean_return": summary.get("eval_mean_return"),
        "ranks_identical": len(set(summary["param_sha256_per_rank"])) == 1,
        "update_kernel": summary.get("update_kernel"), "act_kernel": summary.get("act_kernel"),
        "peak_rss_mb_rank0": summary["peak_rss_mb"],
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="worker counts, the first the baseline")
    ap.add_argument("--total-steps", type=int, default=100_000)
    ap.add_argument("--set", dest="sets", action="append", default=[])
    ap.add_argument("--out", default=os.path.join(HERE, "results", "dp_scaling.json"))
    args = ap.parse_args(argv)
    if args.total_steps < 1 or min(args.workers) < 1:
        ap.error("--total-steps and --workers must be >= 1")
    keys = {s.split("=", 1)[0].strip() for s in args.sets}
    sets = [f"{k}=builtin" for k in ("policy.act_kernel", "ppo.update_kernel") if k not in keys] + args.sets
    with tempfile.TemporaryDirectory() as root:
        rows = [run(w, args.total_steps, sets, root) for w in args.workers]
    base = rows[0]
    for r in rows:
        r["speedup"] = r["steps_per_s"] / base["steps_per_s"]
        r["efficiency"] = r["speedup"] * base["workers"] / r["workers"]
    print(f"{'workers':>7} {'steps/s':>9} {'comm share':>10} {'update share':>12} {'wall s':>8} {'eval':>7} identical "
          "speed-up efficiency kernels")
    for r in rows:
        print(f"{r['workers']:>7} {r['steps_per_s']:>9.0f} {r['share_comm']:>10.1%} {r['share_update']:>12.1%} "
              f"{r['wall_time_s']:>8.1f} {r['eval_mean_return'] or float('nan'):>7.1f} {str(r['ranks_identical']):>9} "
              f"{r['speedup']:>7.2f}x {r['efficiency']:>10.0%} {r['act_kernel']}/{r['update_kernel']}")
    atomic_write_json(args.out, {"benchmark": "dp_scaling", "cpu_count": os.cpu_count(),
                                 "total_steps": args.total_steps, "sets": sets, "rows": rows,
                                 "speedup": rows[-1]["speedup"], "efficiency": rows[-1]["efficiency"]})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
