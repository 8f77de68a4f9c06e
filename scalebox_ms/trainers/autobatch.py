"""Dynamic batching: pick the PPO minibatch size by measured update throughput.

With ``ppo.batch_size: auto`` the trainer, in its first update, times a few optimizer steps at each candidate
size (the divisors of the rollout size ``n_steps * num_envs`` in ``[min_batch, max_batch]``) on the real
rollout, restores parameters and optimizer state after each probe, and keeps the size with the highest
samples/s whose estimated memory fits the budget. The chosen size and the probe table go to the log, to
``metrics.csv`` (``batch_size``) and to every checkpoint, so a resumed run continues with the same size
without probing again.

If an update step fails with a device out-of-memory error, the trainer halves the size (while it still
divides the rollout and stays >= ``min_batch``), restores the state from the start of that update and redoes
it. Timing-based choices differ between machines and runs: to reproduce a run bit for bit, set the recorded
size explicitly, with ``ppo.update_kernel: builtin`` (the size is probed and trained with the compiled update graph;
``auto`` may pick the C++ kernel for a fixed size, which rounds differently).
"""
from __future__ import annotations

import math
from typing import Dict, List, Optional

# MindSpore 2.10's out-of-memory messages (its memory pool and device backends), lower-cased; matched as phrases,
# so words that merely contain "oom" ("room", "zoom") are not mistaken for one
_OOM_MARKERS = ("out of memory", "memory not enough", "memory isn't enough", "malloc device memory failed",
                "alloc device mem failed", "allocate device memory failed", "allocate memory failed",
                "allocate dynamic workspace memory failed", "allocate continuous memory failed",
                "alloc memory failed")


def candidate_sizes(rollout: int, min_batch: int, max_batch: int, limit: int = 6) -> List[int]:
    """Divisors of ``rollout`` in ``[min_batch, max_batch]``, thinned geometrically to at most ``limit``."""
    sizes = [b for b in range(min_batch, min(max_batch, rollout) + 1) if rollout % b == 0]
    if len(sizes) <= limit:
        return sizes
    picks = {sizes[0], sizes[-1]}
    lo, hi = math.log(sizes[0]), math.log(sizes[-1])
    for i in range(1, limit - 1):
        target = math.exp(lo + (hi - lo) * i / (limit - 1))
        picks.add(min(sizes, key=lambda b: abs(math.log(b) - math.log(target))))
    return sorted(picks)


def estimate_bytes(batch: int, obs_dim: int, hidden: List[int]) -> int:
    """Rough activation memory of one update step: inputs + per-layer activations and their gradients."""
    per_sample = obs_dim + 5 + 4 * sum(hidden)
    return int(batch * per_sample * 4)


def choose(table: List[Dict], budget_bytes: Optional[int] = None) -> int:
    """The size with the highest measured samples/s among probes that succeeded and fit ``budget_bytes``
    (ties: the smaller size, i.e. more optimizer steps per epoch)."""
    ok = [row for row in table if row.get("status") == "ok"
          and (budget_bytes is None or row["est_bytes"] <= budget_bytes)]
    if not ok:
        raise RuntimeError("dynamic batching: no candidate minibatch size could be run within the memory budget")
    return max(ok, key=lambda row: (row["samples_per_s"], -row["batch_size"]))["batch_size"]


def is_oom_error(exc: BaseException) -> bool:
    """True for Python's MemoryError and MindSpore RuntimeErrors that report an allocation failure."""
    text = str(exc).lower()
    return isinstance(exc, MemoryError) or (isinstance(exc, RuntimeError) and any(m in text for m in _OOM_MARKERS))


def halve(batch: int, rollout: int, min_batch: int) -> Optional[int]:
    """Next smaller size after an out-of-memory error: the largest divisor of ``rollout`` <= batch / 2."""
    for b in range(batch // 2, min_batch - 1, -1):
        if rollout % b == 0:
            return b
    return None


def probe(runner, tensors, scalars, B: int, timed_steps: int = 6, warmup: int = 2):
    """Time ``timed_steps`` optimizer steps of ``runner.step`` at each candidate size on this rollout, after
    ``warmup`` untimed ones (the first compiles the shape, the next still run slower), restoring parameters and
    optimizer state after each probe; a size's rate is from the median step, so one step slowed by the machine does
    not decide. Returns (chosen size, the ``auto_batch`` record)."""
    import time

    import mindspore as ms
    import numpy as np

    p = runner.cfg
    state = runner.snapshot()
    probe_rng = np.random.default_rng(0)
    table = []
    for b in candidate_sizes(B, p.min_batch, p.max_batch):
        row = {"batch_size": b, "est_bytes": estimate_bytes(b, runner.obs_dim, runner.hidden)}
        try:
            idx = [ms.Tensor(probe_rng.permutation(B)[:b].astype(np.int32)) for _ in range(warmup + timed_steps)]
            times = []
            for i, ix in enumerate(idx):  # (the first call compiles this shape)
                t0 = time.perf_counter()
                runner.step(*tensors, ix, *scalars).asnumpy()
                if i >= warmup:
                    times.append(time.perf_counter() - t0)
            dt = float(np.median(times))
            row.update(status="ok", step_ms=1000 * dt, samples_per_s=b / dt)
        except Exception as exc:
            if not is_oom_error(exc):
                raise
            row.update(status="oom", step_ms=None, samples_per_s=0.0)
        finally:
            runner.restore(state)
        table.append(row)
    budget = runner.memory_budget()
    try:
        chosen = choose(table, budget)
    except RuntimeError:  # nothing fits the budget by the rough estimate: take the smallest size that ran
        ran = [r["batch_size"] for r in table if r["status"] == "ok"]
        if not ran:
            raise
        chosen = min(ran)
        runner.log.warning("warning: dynamic batching: no size fits the %s-byte budget by estimate; using %d", budget,
                           chosen)
    runner.log.info("dynamic batching: chose minibatch %d of %d candidates (%s)", chosen, len(table),
                    ", ".join(f"{r['batch_size']}: {r['samples_per_s']:.0f}/s" for r in table))
    return chosen, {"chosen": chosen, "table": table, "events": [], "memory_budget_bytes": budget}
