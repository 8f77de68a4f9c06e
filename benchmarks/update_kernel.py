"""PPO minibatch update latency: builtin PPOUpdateStep (MindSpore ops) vs the C++ PPOUpdateKernel.

One call = one minibatch step: gather, forward, PPO loss, backward, grad-norm clip, Adam (PPOUpdateStep launches
~220 MindSpore kernels; PPOUpdateKernel one). Timed from the Python call to the numpy copy of the (9,) stats
vector. Models: CartPole's default actor-critic (obs 4, pi 64-64-2, vf 64-64-1, tanh) and a continuous one
(obs 3, pi 64-64-1 Gaussian, vf 64-64-1, tanh); rollout of 4096 rows, minibatches of 64 / 256 / 1024 gathered
by random indices, default PPOConfig (max_grad_norm 0.5, no value clipping, no target_kl).

Before timing, each variant runs 3 steps from identical weights on identical minibatches and must agree with the
builtin step (stats and all parameters). Variants are timed in interleaved rounds so machine drift hits both
alike; the table shows the median ms per call and kernel / builtin (< 1: faster).

Usage:  python benchmarks/update_kernel.py [--calls 200] [--rounds 5] [--out benchmarks/results/update_kernel.json]
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

from scalebox_ms.fileio import atomic_write_json

HERE = os.path.dirname(os.path.abspath(__file__))
BATCHES = (64, 256, 1024)
ROWS = 4096
MODELS = ("cartpole-discrete", "continuous")
VARIANTS = ("builtin", "kernel")


def build(model_name: str, batch: int):
    """{variant: step}, the call's inputs, and the max deviation of the kernel from builtin after 3 steps."""
    import mindspore as ms
    import numpy as np

    from scalebox_ms.config import PPOConfig
    from scalebox_ms.models import SpaceSpec
    from scalebox_ms.models.actor_critic import ActorCritic
    from scalebox_ms.ops.custom import PPOUpdateKernel
    from scalebox_ms.trainers.ppo_update import PPOUpdateStep, pack_features

    discrete = model_name == "cartpole-discrete"
    spec = SpaceSpec(4, True, 2) if discrete else SpaceSpec(3, False, 1, low=(-2.0,), high=(2.0,))
    cfg = PPOConfig(learning_rate=3e-4)
    a, b = ActorCritic(spec), ActorCritic(spec)
    b.load_logical_parameters(a.logical_parameters())
    builtin = PPOUpdateStep(a, cfg)
    kernel = PPOUpdateKernel(b, PPOUpdateStep(b, cfg).optimizer, cfg)
    rng = np.random.default_rng(batch)
    obs = rng.normal(size=(ROWS, spec.obs_dim))
    actions = rng.integers(0, 2, ROWS).astype(np.int32) if discrete else \
        rng.normal(size=(ROWS, 1)).astype(np.float32)
    old_lp = np.full(ROWS, -0.69) if discrete else -0.92 - 0.5 * np.asarray(actions)[:, 0] ** 2
    adv = rng.normal(size=ROWS)
    features = ms.Tensor(pack_features(obs, old_lp + rng.normal(size=ROWS) * 0.05, rng.normal(size=ROWS), adv,
                                       adv, np.ones(ROWS)))
    actions = ms.Tensor(actions)
    scalars = [ms.Tensor(np.float32(x)) for x in (3e-4, 0.2, 0.0, 1e9)]
    dev = 0.0
    for _ in range(3):
        idx = ms.Tensor(rng.permutation(ROWS)[:batch].astype(np.int32))
        want = builtin(features, actions, idx, *scalars).asnumpy()
        got = kernel(features, actions, idx, *scalars).asnumpy()
        dev = max(dev, float(np.abs(got - want).max()))
    for (name, pa), (_, pb) in zip(a.parameters_and_names(), b.parameters_and_names()):
        dev = max(dev, float(np.abs(pa.asnumpy() - pb.asnumpy()).max()))
    if dev > 1e-4:
        raise SystemExit(f"kernel disagrees with builtin ({model_name}, batch {batch}): max |diff| {dev}")
    idx = ms.Tensor(rng.permutation(ROWS)[:batch].astype(np.int32))
    return {"builtin": builtin, "kernel": kernel}, (features, actions, idx, *scalars), dev


def time_calls(step, inputs, calls: int) -> list:
    out = []
    for _ in range(calls):
        t0 = time.perf_counter()
        step(*inputs).asnumpy()
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=200, help="timed calls per variant per round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="MindSpore CPU threads (0: its default)")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "update_kernel.json"))
    args = ap.parse_args()

    from scalebox_ms.sandbox import Sandbox

    Sandbox(device="cpu", seed=0, threads=args.threads)
    results = []
    print(f"{'model':>18} {'batch':>6} {'builtin ms':>11} {'kernel ms':>10} {'kernel/builtin':>15}", flush=True)
    for model_name in MODELS:
        for batch in BATCHES:
            steps, inputs, dev = build(model_name, batch)
            for step in steps.values():  # warm-up
                time_calls(step, inputs, 20)
            samples = {v: [] for v in VARIANTS}
            for _ in range(args.rounds):
                for v in VARIANTS:
                    samples[v] += time_calls(steps[v], inputs, args.calls)
            med = {v: statistics.median(samples[v]) * 1e3 for v in VARIANTS}
            row = {"model": model_name, "batch": batch, "median_ms": med,
                   "ratio_kernel_vs_builtin": med["kernel"] / med["builtin"],
                   "p90_ms": {v: sorted(samples[v])[int(0.9 * len(samples[v]))] * 1e3 for v in VARIANTS},
                   "max_abs_diff_vs_builtin": dev, "calls": len(samples["builtin"])}
            results.append(row)
            print(f"{model_name:>18} {batch:6d} {med['builtin']:11.3f} {med['kernel']:10.3f} "
                  f"{row['ratio_kernel_vs_builtin']:15.2f}", flush=True)
    import mindspore as ms

    atomic_write_json(args.out, {
        "models": {"cartpole-discrete": "obs 4, pi 64-64-2 Categorical, vf 64-64-1, tanh",
                   "continuous": "obs 3, pi 64-64-1 diagonal Gaussian (state-independent log_std), vf 64-64-1, tanh"},
        "call": "step(features, actions, indices, lr, clip_range, clip_range_vf, kl_limit).asnumpy(): one PPO "
                "minibatch update (gather, loss, backward, grad clip 0.5, Adam) from a 4096-row rollout",
        "results": results, "mindspore": ms.__version__, "cpu_count": os.cpu_count(), "machine": platform.machine(),
        "threads": args.threads, "date": time.strftime("%Y-%m-%d %H:%M"),
    })
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
