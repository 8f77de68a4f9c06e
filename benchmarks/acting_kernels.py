"""Acting-call latency: builtin MindSpore ops vs FusedDense layers vs the C++ custom kernel.

The acting call is what the trainer runs once per env step: obs batch (all envs) -> action, log-prob and value,
returned as one packed float32 array (``ActStep(packed=True)``), timed from the Python call to the numpy copy
of the result. Model: CartPole's default actor-critic (obs 4, policy 64-64-2, value 64-64-1, tanh, orthogonal
init). Rows:

* ``builtin``: ``layer: dense``, ``act_kernel: builtin`` (nn.Dense + activation cells, ~25 kernels);
* ``fused``:   ``layer: fused`` (FusedDense, storage padded to 16), builtin kernels;
* ``custom``:  ``act_kernel: custom`` (``scalebox_ms.ops.custom.FusedActorKernel``, one C++ aot kernel);
* ``direct``:  the same C++ kernel called through ctypes without a graph call
  (``scalebox_ms.ops.custom.direct.DirectActorKernel``, what PPO rollouts use with the custom kernel), timed from
  numpy in to numpy out.

``--model halfcheetah`` times the MuJoCo presets' actor-critic instead (obs 17, policy 256-256-6 and value
256-256-1, ReLU, Box actions) at batches 1 and 8 (their ``num_envs: 1``).

Every variant is checked against ``builtin`` (same logical weights, same noise) before it is timed. Variants are
timed in interleaved rounds so machine drift hits all of them alike; the table shows the median us per call
and each variant's time relative to ``builtin`` (< 1: faster). The 'auto' rule in
``scalebox_ms/trainers/kernels.py`` (AUTO_ACT_MAX_MACS) is read off this table.

Usage:  python benchmarks/acting_kernels.py [--model cartpole|halfcheetah] [--calls 300] [--rounds 5]
        [--out benchmarks/results/acting_kernels[_halfcheetah].json]
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
BATCHES = {"cartpole": (8, 64, 256, 1024, 4096),  # 4096: where the single-threaded kernel's arithmetic shows
           "halfcheetah": (1, 8)}
VARIANTS = ("builtin", "fused", "custom", "direct")
MODELS = {"cartpole": "CartPole actor-critic: obs 4, pi 64-64-2, vf 64-64-1, tanh",
          "halfcheetah": "MuJoCo presets' actor-critic: obs 17, pi 256-256-6 (Box), vf 256-256-1, relu"}


class _Direct:
    """DirectActorKernel with the Tensor-in / .asnumpy() interface of the other variants (inputs as numpy)."""

    def __init__(self, model):
        from scalebox_ms.ops.custom.direct import DirectActorKernel

        self.kernel = DirectActorKernel(model)

    def __call__(self, obs, noise):
        out = self.kernel(obs, noise)
        return type("Out", (), {"asnumpy": lambda _self: out})()


def build(batch: int, model: str = "cartpole"):
    """{variant: (callable obs,noise -> packed Tensor)}, the inputs per variant, and the max deviation from
    builtin."""
    import mindspore as ms
    import numpy as np

    from scalebox_ms.models import SpaceSpec
    from scalebox_ms.models.actor_critic import ActorCritic, ActStep

    if model == "cartpole":
        spec, kw = SpaceSpec(4, True, 2), {}
    else:
        spec = SpaceSpec(17, False, 6, low=(-1.0,) * 6, high=(1.0,) * 6)
        kw = {"pi_layers": [256, 256], "vf_layers": [256, 256], "activation": "relu", "ortho_init": False}
    dense = ActorCritic(spec, layer="dense", **kw)
    fused = ActorCritic(spec, layer="fused", align=16, **kw)
    fused.load_logical_parameters(dense.logical_parameters())
    steps = {"builtin": ActStep(dense, packed=True), "fused": ActStep(fused, packed=True),
             "custom": ActStep(dense, packed=True, kernel="custom"), "direct": _Direct(dense)}
    rng = np.random.default_rng(batch)
    obs = rng.normal(size=(batch, spec.obs_dim)).astype(np.float32)
    noise = (rng.gumbel(size=(batch, spec.action_dim)) if spec.discrete
             else rng.normal(size=(batch, spec.action_dim))).astype(np.float32)
    inputs = {v: (obs, noise) if v == "direct" else (ms.Tensor(obs), ms.Tensor(noise)) for v in VARIANTS}
    ref = steps["builtin"](*inputs["builtin"]).asnumpy()
    dev = {}
    for name, step in steps.items():
        out = step(*inputs[name]).asnumpy()
        dev[name] = float(np.abs(out - ref).max())
        if dev[name] > 1e-4:
            raise SystemExit(f"{name} disagrees with builtin at batch {batch}: max |diff| {dev[name]}")
    return steps, inputs, dev


def time_calls(step, inputs, calls: int) -> list:
    out = []
    for _ in range(calls):
        t0 = time.perf_counter()
        step(*inputs).asnumpy()
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=at_least(1), default=300, help="timed calls per variant per round")
    ap.add_argument("--rounds", type=at_least(1), default=5)
    ap.add_argument("--threads", type=at_least(0), default=0, help="MindSpore CPU threads (0: its default)")
    ap.add_argument("--model", choices=sorted(BATCHES), default="cartpole")
    ap.add_argument("--out", default=None, help="default benchmarks/results/acting_kernels[_<model>].json")
    args = ap.parse_args()
    out = args.out or os.path.join(HERE, "results", "acting_kernels" + (
        "" if args.model == "cartpole" else f"_{args.model}") + ".json")

    from scalebox_ms.sandbox import Sandbox

    Sandbox(device="cpu", seed=0, threads=args.threads)
    results = []
    print(f"{'batch':>6} {'builtin us':>11} {'fused us':>9} {'custom us':>10} {'direct us':>10} {'fused/builtin':>14} "
          f"{'custom/builtin':>15} {'direct/builtin':>15}", flush=True)
    batches = BATCHES[args.model]
    for batch in batches:
        steps, inputs, dev = build(batch, args.model)
        for v, step in steps.items():  # warm-up after compile
            time_calls(step, inputs[v], 30)
        samples = {v: [] for v in VARIANTS}
        for _ in range(args.rounds):
            for v in VARIANTS:
                samples[v] += time_calls(steps[v], inputs[v], args.calls)
        med = {v: statistics.median(samples[v]) * 1e6 for v in VARIANTS}
        row = {"batch": batch, "median_us": med,
               "ratio_vs_builtin": {v: med[v] / med["builtin"] for v in VARIANTS},
               "p90_us": {v: sorted(samples[v])[int(0.9 * len(samples[v]))] * 1e6 for v in VARIANTS},
               "max_abs_diff_vs_builtin": dev, "calls": len(samples["builtin"])}
        results.append(row)
        print(f"{batch:6d} {med['builtin']:11.1f} {med['fused']:9.1f} {med['custom']:10.1f} {med['direct']:10.1f} "
              f"{row['ratio_vs_builtin']['fused']:14.2f} {row['ratio_vs_builtin']['custom']:15.2f} "
              f"{row['ratio_vs_builtin']['direct']:15.2f}", flush=True)
    faster = [r["batch"] for r in results if r["ratio_vs_builtin"]["custom"] < 1.0]
    largest = max((b for b in faster if all(b2 in faster for b2 in batches if b2 <= b)), default=0)
    print(f"custom kernel faster than builtin at batches {faster}; contiguous from the smallest up to {largest}")
    import mindspore as ms

    atomic_write_json(out, {
        "model": MODELS[args.model],
        "call": "ActStep(packed=True)(obs, noise).asnumpy(): action, log_prob, value for all envs",
        "results": results, "custom_faster_batches": faster, "custom_faster_up_to_batch": largest,
        "mindspore": ms.__version__, "cpu_count": os.cpu_count(), "machine": platform.machine(),
        "threads": args.threads, "date": time.strftime("%Y-%m-%d %H:%M"),
    })
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
