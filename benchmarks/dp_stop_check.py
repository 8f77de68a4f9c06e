"""What the data-parallel stop check costs: one all-gather of one float per rank at every iteration's end
(:class:`scalebox_ms.trainers.StopOnSignal` with ``dist``: the ranks stop together on a signal any of them got).

The script starts itself under msrun with ``--workers`` ranks (MCCL over loopback on CPU), times ``--calls`` calls of
``DistContext.all_gather`` of one float32 after 20 warm-up calls, and prints rank 0's milliseconds per call as
JSON. Compare with an iteration's time (a run's metrics.csv, or ``dp_scaling.py``).

Usage:  python benchmarks/dp_stop_check.py [--workers 2] [--calls 500]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from bench_args import at_least  # noqa: E402 (benchmarks/ is on sys.path)
from scalebox_ms.parallel.context import in_msrun, is_msrun_scheduler, serve_as_scheduler


def rank(calls: int) -> None:
    import mindspore as ms
    import numpy as np

    from scalebox_ms.parallel.context import init_distributed

    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    dist = init_distributed("CPU")
    flag = np.zeros(1, np.float32)
    for _ in range(20):  # (compile, warm up)
        dist.all_gather(flag)
    t0 = time.perf_counter()
    for _ in range(calls):
        dist.all_gather(flag)
    ms_per_call = (time.perf_counter() - t0) / calls * 1e3
    if dist.is_main:
        print("RESULT " + json.dumps({"ranks": dist.world_size, "calls": calls, "ms_per_call": ms_per_call}),
              flush=True)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=at_least(2), default=2)
    p.add_argument("--calls", type=at_least(1), default=500)
    args = p.parse_args(argv)
    if is_msrun_scheduler():
        serve_as_scheduler()
        return
    if in_msrun():
        rank(args.calls)
        return
    from scalebox_ms.parallel.launcher import free_port, msrun_command, msrun_env

    with tempfile.TemporaryDirectory() as logs:
        subprocess.run(msrun_command(args.workers, free_port(), logs, 300,
                                     ["python", os.path.abspath(__file__), "--calls", str(args.calls)]),
                       env=msrun_env(os.environ), cwd=logs, check=True, capture_output=True, timeout=300)
        with open(os.path.join(logs, "worker_0.log"), errors="replace") as f:
            line = next(x for x in f if x.startswith("RESULT "))
    print(json.dumps(json.loads(line[len("RESULT "):]), indent=2))


if __name__ == "__main__":
    sys.exit(main())
