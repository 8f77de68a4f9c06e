"""PPO minibatch update latency: builtin PPOUpdateStep (MindSpore ops) vs the C++ PPOUpdateKernel.

One call = one minibatch step: gather, forward, PPO loss, backward, grad-norm clip, Adam (PPOUpdateStep launches
~220 MindSpore kernels; PPOUpdateKernel one). Timed from the Python call to the numpy copy of the (N_STATS,)
stats vector. Models: CartPole's default actor-critic (obs 4, pi 64-64-2, vf 64-64-1, tanh) and a continuous one
(obs 3, pi 64-64-1 Gaussian, vf 64-64-1, tanh), minibatches of 64 / 256 / 1024 / 4096 / 16384, and the MuJoCo
presets' networks (``mujoco``: obs 17, pi 256-256-6 Gaussian, vf 256-256-1, relu), minibatches of 64 / 256; a
rollout of max(4096, batch) rows, minibatches gathered by random indices, default PPOConfig (max_grad_norm 0.5, no value clipping, no target_kl).
Variants: ``builtin``, ``kernel`` (default threads: SCALEBOX_MS_KERNEL_THREADS or the hardware threads capped at
8; minibatches of >= 2048 rows are split into 512-row blocks shared out to the threads) and ``kernel_t1`` (the
same kernel with SCALEBOX_MS_KERNEL_THREADS=1 set around each call). Large batches get fewer timed calls
(calls * 1024 / batch, at least 20).

Before timing, each variant runs 3 steps from identical weights on identical minibatches and must agree with the
builtin step (stats and all parameters). Variants are timed in interleaved rounds so machine drift hits both
alike; the table shows the median ms per call and kernel / builtin (< 1: faster).

Second table (``update`` in the JSON): one whole PPO update of a CartPole-like rl-zoo setup, a 256-row rollout,
20 epochs x 1 minibatch of 256 (n_mb = 20, b = 256), through (a) 20 builtin PPOUpdateStep calls, (b) 20 single
PPOUpdateKernel calls, (c) ONE ``PPOUpdateKernel.run_epochs`` call with indices (20, 256). Timed like the trainer
runs it: index Tensors built from numpy per call, the stats copied to numpy once at the end; reported as ms per
minibatch (update time / 20). Before timing, (c) must equal (b) bit for bit and agree with (a).

Usage:  python benchmarks/update_kernel.py [--calls 200] [--rounds 5] [--out benchmarks/results/update_kernel.json]
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

from scalebox_ms.fileio import atomic_write_json
from acting_kernels import time_calls  # same timing loop (benchmarks/ is the script directory)
from bench_args import at_least  # noqa: E402 (benchmarks/ is on sys.path)

HERE = os.path.dirname(os.path.abspath(__file__))
BATCHES = (64, 256, 1024, 4096, 16384)
ROWS = 4096  # rollout rows (at least the batch)
THREADS_ENV = "SCALEBOX_MS_KERNEL_THREADS"
MODELS = ("cartpole-discrete", "continuous", "mujoco")
#: minibatch sizes per model (the MuJoCo presets train minibatches of 32-64 rows)
MODEL_BATCHES = {"mujoco": (64, 256)}
UPDATE_MODELS = ("cartpole-discrete", "continuous")
VARIANTS = ("builtin", "kernel", "kernel_t1")


def model_spec(model_name: str):
    """(SpaceSpec, ActorCritic kwargs) of a benchmark model."""
    from scalebox_ms.models import SpaceSpec

    if model_name == "cartpole-discrete":
        return SpaceSpec(4, True, 2), {}
    if model_name == "continuous":
        return SpaceSpec(3, False, 1, low=(-2.0,), high=(2.0,)), {}
    # the MuJoCo presets' networks (configs/ppo_halfcheetah.yaml): obs 17, 6 actions, 256-256 ReLU, no ortho init
    return (SpaceSpec(17, False, 6, low=(-1.0,) * 6, high=(1.0,) * 6),
            {"pi_layers": (256, 256), "vf_layers": (256, 256), "activation": "relu", "ortho_init": False,
             "log_std_init": -2.0})


def build(model_name: str, batch: int):
    """{variant: step}, the call's inputs, and the max deviation of the kernel from builtin after 3 steps."""
    import mindspore as ms
    import numpy as np

    from scalebox_ms.config import PPOConfig
    from scalebox_ms.models.actor_critic import ActorCritic
    from scalebox_ms.ops.custom import PPOUpdateKernel
    from scalebox_ms.trainers.ppo_update import PPOUpdateStep, pack_features

    discrete = model_name == "cartpole-discrete"
    spec, kw = model_spec(model_name)
    cfg = PPOConfig(learning_rate=3e-4)
    a, b = ActorCritic(spec, **kw), ActorCritic(spec, **kw)
    b.load_logical_parameters(a.logical_parameters())
    builtin = PPOUpdateStep(a, cfg)
    kernel = PPOUpdateKernel(b, PPOUpdateStep(b, cfg).optimizer, cfg)
    rng = np.random.default_rng(batch)
    rows = max(ROWS, batch)
    obs = rng.normal(size=(rows, spec.obs_dim))
    actions = rng.integers(0, 2, rows).astype(np.int32) if discrete else \
        rng.normal(size=(rows, spec.action_dim)).astype(np.float32)
    old_lp = np.full(rows, -0.69) if discrete else (-0.92 - 0.5 * np.asarray(actions) ** 2).sum(1)
    adv = rng.normal(size=rows)
    features = ms.Tensor(pack_features(obs, old_lp + rng.normal(size=rows) * 0.05, rng.normal(size=rows), adv,
                                       adv, np.ones(rows)))
    actions = ms.Tensor(actions)
    scalars = [ms.Tensor(np.float32(x)) for x in (3e-4, 0.2, 0.0, 1e9)]
    dev = 0.0
    for _ in range(3):
        idx = ms.Tensor(rng.permutation(rows)[:batch].astype(np.int32))
        want = builtin(features, actions, idx, *scalars).asnumpy()
        got = kernel(features, actions, idx, *scalars).asnumpy()
        dev = max(dev, float((np.abs(got - want) / np.maximum(1.0, np.abs(want))).max()))  # (relative: the
        # MuJoCo model's approx_kl on these synthetic old log-probs is ~140)
    for (name, pa), (_, pb) in zip(a.parameters_and_names(), b.parameters_and_names()):
        dev = max(dev, float(np.abs(pa.asnumpy() - pb.asnumpy()).max()))
    if dev > 1e-4:
        raise SystemExit(f"kernel disagrees with builtin ({model_name}, batch {batch}): max diff {dev} (statistics: "
                         f"relative to max(1, |value|); parameters: absolute)")
    idx = ms.Tensor(rng.permutation(rows)[:batch].astype(np.int32))

    def kernel_t1(*inputs):
        old = os.environ.get(THREADS_ENV)
        os.environ[THREADS_ENV] = "1"
        try:
            return kernel(*inputs)
        finally:
            if old is None:
                del os.environ[THREADS_ENV]
            else:
                os.environ[THREADS_ENV] = old

    return {"builtin": builtin, "kernel": kernel, "kernel_t1": kernel_t1}, (features, actions, idx, *scalars), dev


UPDATE_ROWS, UPDATE_MB = 256, 20  # CartPole rl-zoo: n_steps 32 x 8 envs, batch 256, 20 epochs
UPDATE_VARIANTS = ("builtin", "kernel", "run_epochs")


def build_update(model_name: str):
    """{variant: fn(perms) -> (n_mb, N_STATS) stats} over three models from identical weights, and the max
    deviation of run_epochs from the builtin sequence (after checking it equals the single kernel calls exactly)."""
    import mindspore as ms
    import numpy as np

    from scalebox_ms.config import PPOConfig
    from scalebox_ms.models import SpaceSpec
    from scalebox_ms.models.actor_critic import ActorCritic
    from scalebox_ms.ops.custom import PPOUpdateKernel
    from scalebox_ms.ops.layout import N_STATS
    from scalebox_ms.trainers.ppo_update import PPOUpdateStep, pack_features

    discrete = model_name == "cartpole-discrete"
    spec = SpaceSpec(4, True, 2) if discrete else SpaceSpec(3, False, 1, low=(-2.0,), high=(2.0,))
    cfg = PPOConfig(learning_rate=3e-4)
    models = [ActorCritic(spec) for _ in range(3)]
    for m in models[1:]:
        m.load_logical_parameters(models[0].logical_parameters())
    builtin = PPOUpdateStep(models[0], cfg)
    kernel = PPOUpdateKernel(models[1], PPOUpdateStep(models[1], cfg).optimizer, cfg)
    epochs = PPOUpdateKernel(models[2], PPOUpdateStep(models[2], cfg).optimizer, cfg)
    rng = np.random.default_rng(7)
    rows = UPDATE_ROWS
    actions = rng.integers(0, 2, rows).astype(np.int32) if discrete else rng.normal(size=(rows, 1)).astype(np.float32)
    old_lp = np.full(rows, -0.69) if discrete else -0.92 - 0.5 * np.asarray(actions)[:, 0] ** 2
    adv = rng.normal(size=rows)
    features = ms.Tensor(pack_features(rng.normal(size=(rows, spec.obs_dim)), old_lp + rng.normal(size=rows) * 0.05,
                                       rng.normal(size=rows), adv, adv, np.ones(rows)))
    actions = ms.Tensor(actions)
    scalars = [ms.Tensor(np.float32(x)) for x in (3e-4, 0.2, 0.0, 1e9)]

    def calls(step):
        def run(perms):
            outs = [step(features, actions, ms.Tensor(p), *scalars) for p in perms]
            return np.stack([o.asnumpy() for o in outs])
        return run

    def one_call(perms):
        return epochs.run_epochs(features, actions, ms.Tensor(perms), *scalars).asnumpy()[:, :N_STATS]

    fns = {"builtin": calls(builtin), "kernel": calls(kernel), "run_epochs": one_call}
    perms = np.stack([rng.permutation(rows) for _ in range(UPDATE_MB)]).astype(np.int32)
    got = {v: fn(perms) for v, fn in fns.items()}
    if not np.array_equal(got["run_epochs"], got["kernel"]) or any(
            not np.array_equal(pk.asnumpy(), pe.asnumpy())
            for pk, pe in zip(models[1].get_parameters(), models[2].get_parameters())):
        raise SystemExit(f"run_epochs differs from 20 single kernel calls ({model_name})")
    dev = float(np.abs(got["run_epochs"] - got["builtin"]).max())
    for pa, pe in zip(models[0].get_parameters(), models[2].get_parameters()):
        dev = max(dev, float(np.abs(pa.asnumpy() - pe.asnumpy()).max()))
    if dev > 1e-4:
        raise SystemExit(f"run_epochs disagrees with builtin ({model_name}): max |diff| {dev}")
    return fns, perms, dev


def time_updates(fn, perms, updates: int) -> list:
    out = []
    for _ in range(updates):
        t0 = time.perf_counter()
        fn(perms)
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=at_least(1), default=200, help="timed calls per variant per round")
    ap.add_argument("--rounds", type=at_least(1), default=5)
    ap.add_argument("--threads", type=at_least(0), default=0, help="MindSpore CPU threads (0: its default)")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "update_kernel.json"))
    args = ap.parse_args()

    from scalebox_ms.sandbox import Sandbox

    Sandbox(device="cpu", seed=0, threads=args.threads)
    from scalebox_ms.ops.custom.update import kernel_threads

    results = []
    print(f"{'model':>18} {'batch':>6} {'builtin ms':>11} {'kernel ms':>10} {'T':>3} {'kernel T=1 ms':>14} "
          f"{'kernel/builtin':>15} {'T=1/kernel':>11}", flush=True)
    for model_name in MODELS:
        for batch in MODEL_BATCHES.get(model_name, BATCHES):
            steps, inputs, dev = build(model_name, batch)
            calls = min(args.calls, max(20, args.calls * 1024 // batch))
            for step in steps.values():  # warm-up
                time_calls(step, inputs, min(20, calls))
            samples = {v: [] for v in VARIANTS}
            for _ in range(args.rounds):
                for v in VARIANTS:
                    samples[v] += time_calls(steps[v], inputs, calls)
            med = {v: statistics.median(samples[v]) * 1e3 for v in VARIANTS}
            row = {"model": model_name, "batch": batch, "median_ms": med,
                   "ratio_kernel_vs_builtin": med["kernel"] / med["builtin"],
                   "p90_ms": {v: sorted(samples[v])[int(0.9 * len(samples[v]))] * 1e3 for v in VARIANTS},
                   "max_abs_diff_vs_builtin": dev, "calls": len(samples["builtin"])}
            row["kernel_threads"], row["kernel_blocks"] = kernel_threads(batch)
            row["speedup_threads"] = med["kernel_t1"] / med["kernel"]
            results.append(row)
            print(f"{model_name:>18} {batch:6d} {med['builtin']:11.3f} {med['kernel']:10.3f} "
                  f"{row['kernel_threads']:3d} {med['kernel_t1']:14.3f} {row['ratio_kernel_vs_builtin']:15.2f} "
                  f"{row['speedup_threads']:11.2f}", flush=True)
    update = []
    print(f"\nwhole update, {UPDATE_ROWS}-row rollout, {UPDATE_MB} minibatches of {UPDATE_ROWS}: ms per minibatch",
          flush=True)
    print(f"{'model':>18} {'builtin':>9} {'kernel':>9} {'run_epochs':>11} {'epochs/kernel':>14}", flush=True)
    for model_name in UPDATE_MODELS:
        fns, perms, dev = build_update(model_name)
        for fn in fns.values():  # warm-up
            time_updates(fn, perms, 3)
        samples = {v: [] for v in UPDATE_VARIANTS}
        for _ in range(args.rounds):
            for v in UPDATE_VARIANTS:
                samples[v] += time_updates(fns[v], perms, max(1, args.calls // UPDATE_MB))
        med = {v: statistics.median(samples[v]) * 1e3 / UPDATE_MB for v in UPDATE_VARIANTS}
        row = {"model": model_name, "rollout_rows": UPDATE_ROWS, "n_mb": UPDATE_MB, "batch": UPDATE_ROWS,
               "median_ms_per_minibatch": med,
               "median_ms_per_update": {v: med[v] * UPDATE_MB for v in UPDATE_VARIANTS},
               "ratio_run_epochs_vs_kernel": med["run_epochs"] / med["kernel"],
               "ratio_run_epochs_vs_builtin": med["run_epochs"] / med["builtin"],
               "max_abs_diff_vs_builtin": dev, "updates": len(samples["builtin"])}
        update.append(row)
        print(f"{model_name:>18} {med['builtin']:9.3f} {med['kernel']:9.3f} {med['run_epochs']:11.3f} "
              f"{row['ratio_run_epochs_vs_kernel']:14.2f}", flush=True)
    import mindspore as ms

    atomic_write_json(args.out, {
        "models": {"cartpole-discrete": "obs 4, pi 64-64-2 Categorical, vf 64-64-1, tanh",
                   "continuous": "obs 3, pi 64-64-1 diagonal Gaussian (state-independent log_std), vf 64-64-1, tanh",
                   "mujoco": "obs 17, pi 256-256-6 diagonal Gaussian, vf 256-256-1, relu (the MuJoCo presets)"},
        "call": "step(features, actions, indices, lr, clip_range, clip_range_vf, kl_limit).asnumpy(): one PPO "
                "minibatch update (gather, loss, backward, grad clip 0.5, Adam) from a max(4096, batch)-row rollout; "
                "kernel: default threads (kernel_threads/kernel_blocks per row), kernel_t1: "
                "SCALEBOX_MS_KERNEL_THREADS=1",
        "results": results,
        "update_call": "one PPO update of 20 minibatches x 256 rows (20 epochs x 1 minibatch, 256-row rollout, "
                       "CartPole rl-zoo): 20 builtin calls, 20 single kernel calls, or ONE run_epochs call "
                       "(indices (20, 256)); index Tensors from numpy per call, stats to numpy once at the end; "
                       "ms per minibatch = update time / 20",
        "update": update, "mindspore": ms.__version__, "cpu_count": os.cpu_count(), "machine": platform.machine(),
        "threads": args.threads, "date": time.strftime("%Y-%m-%d %H:%M"),
    })
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
