"""Time of one off-policy gradient step inside the compiled training phase, per implementation choice.

For each task the preset's trainer collects ``--collect`` env steps of random actions (``learning_starts`` is set
past them, so no gradient step runs), then its training phase is called ``--calls`` times with fixed, freshly
drawn inputs and ``gradient_steps`` gradient steps each; reported: the median (and min) ms per gradient step of
the calls after the first two, for

* ``builtin``  ``<algo>.optimizer_kernel: builtin`` (the optimizer step and target updates as MindSpore graph ops);
* ``custom``   ``<algo>.optimizer_kernel: custom`` (the optimizer step and target updates as C++ kernels,
  ops/custom/offpolicy_optim.cc);
* DQN also ``custom, per-step targets``: the kernel, with the TD targets computed per gradient step instead of
  once per phase (``DQNLearner.batches_targets`` patched off), and ``builtin, per-step targets`` (neither
  change: the code before both).

``--graph-kernel`` adds each configuration again with MindSpore's graph-kernel fusion
(``mindspore.set_context(enable_graph_kernel=True)``; on CPU it needs the ``decorator`` module, which MindSpore 2.10
does not install). Each configuration runs in its own fresh process, one after another. Tasks: ``dqn_cartpole``
(configs/dqn_cartpole.yaml: 256x256 Q-network, batch 64, 128 gradient steps per phase) and ``sac_pendulum``
(configs/sac_pendulum.yaml: 256x256 actor and critics, batch 256; phases of 1 gradient step, so the phase call's
fixed cost is included).

Usage:  python benchmarks/offpolicy_step.py [--tasks dqn_cartpole sac_pendulum] [--calls 30]
        [--graph-kernel] [--out benchmarks/results/offpolicy_step.json]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
TASKS = {"dqn_cartpole": "dqn_cartpole.yaml", "sac_pendulum": "sac_pendulum.yaml"}
VARIANTS = {"dqn_cartpole": [("builtin", True), ("custom", True), ("custom", False), ("builtin", False)],
            "sac_pendulum": [("builtin", True), ("custom", True)]}


def worker(task: str, kernel: str, batched: bool, calls: int, collect: int, graph_kernel: bool = False) -> dict:
    import time

    import mindspore as ms
    import numpy as np
    from mindspore import Tensor

    if graph_kernel:
        ms.set_context(enable_graph_kernel=True)

    from scalebox_ms.buffers.device import sample_draws
    from scalebox_ms.config import load_config
    from scalebox_ms.trainers import make_trainer
    from scalebox_ms.trainers.dqn import DQNLearner

    if not batched:
        DQNLearner.batches_targets = lambda self, rows: False
    cfg = load_config(os.path.join(REPO, "configs", TASKS[task]))
    o = cfg.algo_config
    o.optimizer_kernel = kernel
    o.learning_starts = collect + 1000
    cfg.run.progress = False
    t = make_trainer(cfg)
    t.learn(until=collect)
    rng = np.random.default_rng(0)
    T, N = t._phase_steps, t.num_envs
    act_shape, act_dtype = t._replay_action_spec()
    rows = T * N
    empty = ms.mutable((Tensor(np.zeros((rows,) + t.spec.obs_shape, np.float32)),
                        Tensor(np.zeros((rows,) + act_shape, act_dtype)), Tensor(np.zeros(rows, np.float32)),
                        Tensor(np.zeros((rows,) + t.spec.obs_shape, np.float32)), Tensor(np.zeros(rows, np.float32))))
    mean, inv_std, clip = t._obs_stats()
    G, b = t.gradient_steps, o.batch_size
    times = []
    for _ in range(calls):
        args = (empty, Tensor(np.zeros(rows, np.int32)), Tensor(np.int32(G)), Tensor(np.int32(0)),
                Tensor(sample_draws(rng, (G, b))), Tensor(t._train_noise(rng, G, b)),
                Tensor(np.float32(o.learning_rate)), Tensor(mean), Tensor(inv_std), Tensor(clip),
                Tensor(t.collector.obs), Tensor(t._act_noise_or_zeros(rng, N)))
        t0 = time.perf_counter()
        _, acc = t.phase(*args)
        acc.asnumpy()
        times.append((time.perf_counter() - t0) * 1e3 / G)
    kept = sorted(times[2:])
    return {"task": task, "optimizer_kernel": kernel, "batched_targets": bool(t.phase.batched_targets),
            "kernel_used": bool(t.optimizer_kernel), "graph_kernel": graph_kernel, "gradient_steps_per_call": G, "calls": len(kept),
            "median_ms_per_step": kept[len(kept) // 2], "min_ms_per_step": kept[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    ap.add_argument("--calls", type=int, default=30)
    ap.add_argument("--collect", type=int, default=3000, help="env steps of random actions before timing")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "offpolicy_step.json"))
    ap.add_argument("--graph-kernel", action="store_true", help="also run each configuration with graph-kernel fusion")
    ap.add_argument("--worker", nargs=4, metavar=("TASK", "KERNEL", "BATCHED", "FUSION"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.calls < 3:  # (the first two calls compile and warm up: the median is over the others)
        ap.error("--calls: must be >= 3")
    if args.collect < 256:  # (the largest batch, SAC's: gradient steps on fewer rows time an empty buffer)
        ap.error(f"--collect: must be >= 256 (SAC's batch size), got {args.collect}")
    if args.graph_kernel:
        import importlib.util

        if importlib.util.find_spec("decorator") is None:  # (MindSpore's fused-kernel build imports it)
            ap.error("--graph-kernel: MindSpore's graph-kernel fusion needs the package decorator, which MindSpore "
                     "2.10 does not install: pip install decorator")
    if args.worker:
        task, kernel, batched, fusion = args.worker
        print(json.dumps(worker(task, kernel, batched == "1", args.calls, args.collect, fusion == "1")))
        return
    from scalebox_ms.fileio import atomic_write_json

    rows = []
    for task in args.tasks:
        for kernel, batched, fusion in [v + (f,) for v in VARIANTS[task] for f in (False, True)[:1 + args.graph_kernel]]:
            with tempfile.TemporaryDirectory() as tmp:  # (MindSpore writes its caches into the working directory)
                proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--calls", str(args.calls),
                                       "--collect", str(args.collect), "--worker", task, kernel, str(int(batched)),
                                       str(int(fusion))], cwd=tmp, capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                err = next((ln for ln in reversed(proc.stderr.splitlines()) if "Check failed" in ln),
                           (proc.stderr.strip().splitlines() or ["?"])[-1])
                if not fusion:
                    sys.exit(f"{task} {kernel}: worker failed: {err}")
                rows.append({"task": task, "optimizer_kernel": kernel, "graph_kernel": True, "error": err[-300:]})
                print(f"{task:14s} {kernel}, graph-kernel fusion: failed to compile: {err[-200:]}", flush=True)
                continue
            row = json.loads(proc.stdout.strip().splitlines()[-1])
            rows.append(row)
            label = kernel + ("" if row["batched_targets"] or task != "dqn_cartpole" else ", per-step targets") + (
                ", graph-kernel fusion" if fusion else "")
            print(f"{task:14s} {label:28s} {row['median_ms_per_step']:7.3f} ms/step (min {row['min_ms_per_step']:.3f})",
                  flush=True)
    atomic_write_json(args.out, {"rows": rows})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
