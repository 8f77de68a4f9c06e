"""PPO update-step time: float32 vs each AMP level (O1, O2, O3; float16 with dynamic loss scaling).

One compiled minibatch update (gather, loss + grads, unscale + finite check, clip, Adam) of CartPole's default
actor-critic, timed from the Python call to the numpy copy of its stats, at minibatch 64, 256 and 1024.
Variants run interleaved in rounds so machine drift hits all alike; the table shows the median ms per step and
each level's time relative to float32 (> 1: slower). On CPU float16 is *slower*: there are no half-precision
matrix units, and every cast is an extra kernel. AMP is the fast path on Ascend (Cube units) and GPU (tensor
cores), which this machine cannot measure.

Usage:  python benchmarks/amp_update.py [--steps 100] [--rounds 5] [--out benchmarks/results/amp_update.json]
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

from scalebox_ms.fileio import atomic_write_json
from bench_args import at_least  # noqa: E402 (benchmarks/ is on sys.path)

HERE = os.path.dirname(os.path.abspath(__file__))
LEVELS = ("O0", "O1", "O2", "O3")
BATCHES = (64, 256, 1024)


def build(level: str, batch: int):
    import mindspore as ms
    import numpy as np

    from scalebox_ms import Config
    from scalebox_ms.amp import AutoMixedPrecision
    from scalebox_ms.models import SpaceSpec, build_model
    from scalebox_ms.trainers.ppo_update import PPOUpdateStep, pack_features

    cfg = Config()
    ms.set_seed(0)
    model = build_model(SpaceSpec(4, True, 2), cfg.policy)
    amp = None if level == "O0" else AutoMixedPrecision(level)
    if amp is not None:
        amp.apply(model)
    step = PPOUpdateStep(model, cfg.ppo, amp=amp)
    rng = np.random.default_rng(batch)
    B = 4 * batch
    feats = ms.Tensor(pack_features(rng.normal(size=(B, 4)), rng.normal(size=B) - 0.7, rng.normal(size=B),
                                    rng.normal(size=B), rng.normal(size=B), np.ones(B)))
    acts = ms.Tensor(rng.integers(0, 2, B).astype(np.int32))
    idx = [ms.Tensor(rng.permutation(B)[:batch].astype(np.int32)) for _ in range(8)]
    scalars = [ms.Tensor(np.float32(x)) for x in (3e-4, 0.2, np.inf, np.inf)]
    out = step(feats, acts, idx[0], *scalars).asnumpy()  # compile
    assert np.isfinite(out[:6]).all(), f"{level}: non-finite loss"

    def run(n):
        for i in range(n):
            o = step(feats, acts, idx[i % 8], *scalars)
        o.asnumpy()

    return run


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=at_least(1), default=100)
    ap.add_argument("--rounds", type=at_least(1), default=5)
    ap.add_argument("--out", default=os.path.join(HERE, "results", "amp_update.json"))
    args = ap.parse_args(argv)
    from scalebox_ms import Sandbox

    Sandbox(device="cpu", seed=0)
    rows = []
    for batch in BATCHES:
        runs = {lv: build(lv, batch) for lv in LEVELS}
        times = {lv: [] for lv in LEVELS}
        for _ in range(args.rounds):
            for lv in LEVELS:
                t0 = time.perf_counter()
                runs[lv](args.steps)
                times[lv].append(1000 * (time.perf_counter() - t0) / args.steps)
        med = {lv: statistics.median(v) for lv, v in times.items()}
        rows.append({"batch": batch, **{f"{lv}_ms": med[lv] for lv in LEVELS},
                     **{f"{lv}_vs_fp32": med[lv] / med["O0"] for lv in LEVELS[1:]}})
    print(f"{'batch':>6} " + " ".join(f"{lv + ' ms':>9}" for lv in LEVELS) + "  " +
          " ".join(f"{lv + '/fp32':>8}" for lv in LEVELS[1:]))
    for r in rows:
        print(f"{r['batch']:>6} " + " ".join(f"{r[lv + '_ms']:>9.3f}" for lv in LEVELS) + "  " +
              " ".join(f"{r[lv + '_vs_fp32']:>8.2f}" for lv in LEVELS[1:]))
    atomic_write_json(args.out, {"benchmark": "amp_update", "machine": platform.platform(),
                                 "cpu_count": os.cpu_count(), "steps": args.steps, "rounds": args.rounds,
                                 "rows": rows})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
