"""Dynamic batching vs fixed minibatch sizes, in one run.

Trains the Acrobot-v1 preset (rollout 16 envs x 256 steps = 4096 samples, 4 epochs) for a few iterations
with ppo.batch_size fixed at 64 (the preset), 256 and 1024, and with `auto` (probe 64..1024 in the first
iteration, keep the fastest). Reports update throughput (minibatch samples/s through the compiled update),
wall time per iteration after the first (compile) one, and the size auto chose with its probe table.

Note what it measures: a larger minibatch means fewer optimizer steps per epoch, i.e. a different algorithm
setting; dynamic batching maximises hardware throughput, not sample efficiency.

Usage:  python benchmarks/autobatch.py [--iterations 8] [--out benchmarks/results/autobatch.json]
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

from scalebox_ms.fileio import atomic_write_json  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def run(batch, iterations: int) -> dict:
    from scalebox_ms.config import load_config
    from scalebox_ms.trainers import Callback, PPOTrainer

    cfg = load_config(os.path.join(REPO, "configs", "ppo_acrobot.yaml"),
                      ["run.progress=false", f"ppo.batch_size={batch}", "ppo.min_batch=64", "ppo.max_batch=1024",
                       # every row through the compiled update (the C++ kernel takes fixed sizes only: auto's row
                       # would compare another update path)
                       "ppo.update_kernel=builtin"])
    rows = []

    class Keep(Callback):
        def on_iteration_end(self, trainer, metrics):
            rows.append(metrics)

    trainer = PPOTrainer(cfg)
    steps = iterations * cfg.ppo.n_steps * cfg.env.num_envs
    t0 = time.perf_counter()
    trainer.learn(until=steps, callbacks=[Keep()])
    wall = time.perf_counter() - t0
    later = rows[1:]
    out = {"batch_size": str(batch), "chosen": trainer.batch_size, "wall_s": wall,
           "iteration_s": statistics.median(r["rollout_time_s"] + r["update_time_s"] for r in later),
           "update_samples_per_s": statistics.median(r["update_samples_per_s"] for r in later),
           "first_iteration_s": rows[0]["rollout_time_s"] + rows[0]["update_time_s"]}
    if trainer.auto_batch:
        out["probe"] = trainer.auto_batch["table"]
    trainer.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iterations", type=int, default=8)
    ap.add_argument("--out", default=os.path.join(HERE, "results", "autobatch.json"))
    args = ap.parse_args()
    if args.iterations < 2:  # (the first iteration compiles and probes: the medians are over the others)
        ap.error("--iterations: must be >= 2")
    results = [run(b, args.iterations) for b in (64, 256, 1024, "auto")]
    print(f"{'batch_size':>10s} {'chosen':>6s} {'update samples/s':>17s} {'s/iteration':>12s} {'1st iteration s':>16s}")
    for r in results:
        print(f"{r['batch_size']:>10s} {r['chosen']:6d} {r['update_samples_per_s']:17.0f} {r['iteration_s']:12.3f} "
              f"{r['first_iteration_s']:16.2f}")
    auto = results[-1]
    print("auto probe: " + ", ".join(f"{p['batch_size']}: {p['samples_per_s']:.0f}/s" for p in auto["probe"]))
    atomic_write_json(args.out, {"results": results, "date": time.strftime("%Y-%m-%d %H:%M")})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
