"""Exported policies, fp32 vs INT8 (L1, L2), measured in one run.

For CartPole-v1 and Pendulum-v1 (trained with the presets unless --cartpole-run/--pendulum-run point at
finished runs) and a HalfCheetah-size 256x256 MLP policy (Pendulum spaces, briefly trained: size and latency
only), export fp32, INT8 L1 and INT8 L2 MindIR files and report:

* eval mean return over 20 deterministic episodes, run through the exported file (mindspore.load + GraphCell)
* file size and the INT8/fp32 ratio
* latency of one GraphCell call at batch 1 and 256 (median of repeated calls)

``--sizes-only`` skips the evaluation and latency measurements (file sizes and graph node counts only).

Usage:  python benchmarks/export_int8.py [--cartpole-run DIR] [--pendulum-run DIR] [--sizes-only]
                                         [--out benchmarks/results/export_int8.json]
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import numpy as np

from scalebox_ms.fileio import atomic_write_json  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def trained(preset: str, run_dir):
    from scalebox_ms.config import load_config
    from scalebox_ms.trainers import PPOTrainer
    from scalebox_ms.trainers.checkpoint import resolve_checkpoint

    if run_dir:
        cfg = load_config(os.path.join(run_dir, "config.yaml"))
        return PPOTrainer(cfg).load(resolve_checkpoint(os.path.join(run_dir, "checkpoints")))
    cfg = load_config(os.path.join(REPO, "configs", preset), ["run.progress=false"])
    trainer = PPOTrainer(cfg)
    trainer.learn()
    return trainer


def latency_ms(path: str, obs_dim: int, batch: int, reps: int = 300) -> float:
    import mindspore as ms

    cell = ms.nn.GraphCell(ms.load(path))
    x = ms.Tensor(np.random.default_rng(0).normal(size=(batch, obs_dim)).astype(np.float32))
    for _ in range(10):
        cell(x).asnumpy()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        cell(x).asnumpy()
        times.append(time.perf_counter() - t)
    return 1000 * statistics.median(times)


def graph_nodes(path: str) -> int:
    from mindspore.train import mind_ir_pb2

    model = mind_ir_pb2.ModelProto()
    with open(path, "rb") as f:
        model.ParseFromString(f.read())
    return len(model.graph.node)


def measure(name: str, trainer, outdir: str, evaluate: bool, timing: bool = True) -> list:
    from scalebox_ms.export import evaluate_mindir, export_mindir

    rows = []
    for label, kw in [("fp32", {}), ("int8-L1", {"int8": True, "quant_level": "L1"}),
                      ("int8-L2", {"int8": True, "quant_level": "L2"})]:
        path = os.path.join(outdir, f"{name}_{label}.mindir")
        sc = export_mindir(trainer, path, calibrate_steps=200, **kw)
        row = {"policy": name, "variant": label, "bytes": sc["file_bytes"], "graph_nodes": graph_nodes(path)}
        if timing:
            row["latency_ms_b1"] = latency_ms(path, trainer.spec.obs_dim, 1)
            row["latency_ms_b256"] = latency_ms(path, trainer.spec.obs_dim, 256)
        if evaluate:
            row["eval_mean"] = float(np.mean(evaluate_mindir(path, episodes=20)))
        rows.append(row)
    fp32 = rows[0]
    for r in rows:
        r["size_ratio"] = r["bytes"] / fp32["bytes"]
        if evaluate:
            r["eval_delta"] = r["eval_mean"] - fp32["eval_mean"]
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cartpole-run")
    ap.add_argument("--pendulum-run")
    ap.add_argument("--sizes-only", action="store_true", help="no evaluation or latency: file sizes only")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "export_int8.json"))
    args = ap.parse_args()
    for flag, run in (("--cartpole-run", args.cartpole_run), ("--pendulum-run", args.pendulum_run)):
        if run is not None and not os.path.isfile(os.path.join(run, "config.yaml")):
            ap.error(f"{flag}: {run} is not a run directory (no config.yaml)")

    from scalebox_ms.config import load_config
    from scalebox_ms.trainers import PPOTrainer

    rows = []
    with tempfile.TemporaryDirectory() as outdir:
        full = not args.sizes_only
        rows += measure("CartPole-v1", trained("ppo_cartpole.yaml", args.cartpole_run), outdir, full, full)
        rows += measure("Pendulum-v1", trained("ppo_pendulum.yaml", args.pendulum_run), outdir, full, full)
        big = PPOTrainer(load_config(os.path.join(REPO, "configs", "ppo_pendulum.yaml"), [
            "policy.pi_layers=[256, 256]", "policy.vf_layers=[256, 256]", "policy.activation=relu",
            "ppo.n_steps=64", "run.total_steps=256", "run.progress=false"]))
        big.learn()
        rows += measure("MLP-256x256", big, outdir, False, full)
    print(f"{'policy':12s} {'variant':8s} {'eval':>9s} {'delta':>7s} {'bytes':>9s} {'ratio':>6s} {'nodes':>5s} "
          f"{'b1 ms':>7s} {'b256 ms':>8s}")
    for r in rows:
        ev = f"{r['eval_mean']:9.1f} {r['eval_delta']:7.1f}" if "eval_mean" in r else f"{'-':>9s} {'-':>7s}"
        lat = (f"{r['latency_ms_b1']:7.3f} {r['latency_ms_b256']:8.3f}" if "latency_ms_b1" in r
               else f"{'-':>7s} {'-':>8s}")
        print(f"{r['policy']:12s} {r['variant']:8s} {ev} {r['bytes']:9d} {r['size_ratio']:6.2f} "
              f"{r['graph_nodes']:5d} {lat}")
    atomic_write_json(args.out, {"rows": rows, "date": time.strftime("%Y-%m-%d %H:%M")})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
