"""The PPO update of one iteration: epochs x minibatches over a rollout, on the compiled graph or the C++ kernel.

Both implementations sit behind ONE interface, ``run_minibatches(features, actions, rows, lr, clip, clip_vf,
kl_limit) -> float32 (len(rows), N_STATS + 1)``: ``rows`` int32 ``(n, b)`` holds the rollout rows of n
minibatches in order; each output row is the minibatch's statistics (:data:`scalebox_ms.ops.layout.STAT_COLUMNS`)
and ``RAN`` (1 if it was processed). A minibatch whose ``kl_ok`` is 0 (``target_kl`` exceeded) is the last one
processed. :class:`GraphMinibatches` calls the compiled :class:`PPOUpdateStep` once per row;
:class:`~scalebox_ms.ops.custom.PPOUpdateKernel` runs all rows in one call.

Minibatch permutations come from the trainer's Generator, one ``permutation(B)`` per epoch in epoch order. With
``target_kl`` the runner hands over one epoch at a time, so an early stop never draws a permutation the update
does not use; without it, all epochs go in one call. Either way the generator is consumed exactly as by a
per-minibatch loop, so the two implementations are interchangeable mid-run (checkpoints, resume).

Non-finite steps: an update step whose loss or gradients are not finite is skipped inside the graph/kernel
(weights and optimizer state untouched) and counted (``nonfinite_updates``); :data:`NONFINITE_LIMIT` such steps in
a row stop the run with a one-line :class:`TrainingError`. With AMP, gradient overflows at a finite loss are the
loss scaler's business (``amp_overflows``), not errors.

``ppo.batch_size: auto`` (:mod:`.autobatch`): the first update probes the candidate sizes; an out-of-memory
error halves the size and redoes the update from the state it started with.
"""
from __future__ import annotations

import logging
from typing import Callable, List

import numpy as np

from ..errors import TrainingError
from ..ops.layout import LOSS_TERMS, N_STATS, RAN, STAT

NONFINITE_LIMIT = 10  # consecutive skipped non-finite steps before the run stops


class GraphMinibatches:
    """``run_minibatches`` over the compiled :class:`PPOUpdateStep` (one graph call per minibatch)."""

    def __init__(self, step, kl_stop: bool):
        self.step = step
        self.kl_stop = kl_stop

    @staticmethod
    def calls(rows: int) -> int:
        """Graph calls for ``rows`` minibatches handed over at once."""
        return rows

    def __call__(self, features, actions, rows: np.ndarray, *scalars) -> np.ndarray:
        import mindspore as ms

        outputs: List = []
        for row in rows:
            out = self.step(features, actions, ms.Tensor(row), *scalars)
            if self.kl_stop:  # the next call depends on this one: wait for it
                out = out.asnumpy()
                outputs.append(out)
                if out[STAT.kl_ok] < 0.5 and out[STAT.finite] > 0.5:
                    break
            else:
                outputs.append(out)
        table = np.zeros((len(rows), N_STATS + 1), np.float32)
        for i, out in enumerate(outputs):
            table[i, :N_STATS] = out if isinstance(out, np.ndarray) else out.asnumpy()
            table[i, RAN] = 1.0
        return table


class KernelMinibatches:
    """``run_minibatches`` over the C++ :class:`PPOUpdateKernel` (all rows in one kernel call)."""

    def __init__(self, kernel):
        self.step = self.kernel = kernel

    @staticmethod
    def calls(rows: int) -> int:
        return 1

    def __call__(self, features, actions, rows: np.ndarray, *scalars) -> np.ndarray:
        import mindspore as ms

        return self.kernel.run_epochs(features, actions, ms.Tensor(rows), *scalars).asnumpy()


class UpdateRunner:
    """Runs the PPO update of an iteration and summarises it (losses, KL, clip fraction, steps, AMP)."""

    def __init__(self, run_minibatches, ppo_cfg, rng_owner, world_size: int, amp, snapshot: Callable,
                 restore: Callable, obs_dim: int = 0, hidden=(), memory_budget: Callable = lambda: None):
        self.run_minibatches = run_minibatches  # GraphMinibatches or KernelMinibatches
        self.step = run_minibatches.step  # PPOUpdateStep or PPOUpdateKernel: owns the optimizer
        self.cfg = ppo_cfg
        self._rng_owner = rng_owner  # .rng: the trainer's Generator (replaced on a data-parallel resume)
        self.world_size = world_size
        self.amp = amp
        self.snapshot, self.restore = snapshot, restore
        self.obs_dim, self.hidden, self.memory_budget = obs_dim, list(hidden), memory_budget  # for the size probe
        self.batch_size = None if ppo_cfg.batch_size == "auto" else int(ppo_cfg.batch_size)
        self.auto_batch = None
        self.nonfinite_in_a_row = 0
        self.log = logging.getLogger("scalebox_ms")

    def calls_per_update(self, rollout: int) -> int:
        """Graph/kernel calls of one update without a target_kl stop."""
        p = self.cfg
        rows = rollout // (self.batch_size // self.world_size)  # minibatches per epoch
        per_call = 1 if p.target_kl is not None else p.n_epochs  # epochs per run_minibatches call (see _epochs)
        return (p.n_epochs // per_call) * self.run_minibatches.calls(per_call * rows)

    # ------------------------------------------------------------------ one update
    def run(self, batch: dict, lr: float, clip: float, clip_vf, kl_limit, global_step: int) -> dict:
        import mindspore as ms

        from .autobatch import halve, is_oom_error
        from .ppo_update import pack_features

        obs = batch["obs"]
        B = obs.shape[0]
        if obs.ndim > 2:  # image frames: kept as uint8 in the update step's store, not in the float32 features
            self.run_minibatches.step.load_rollout_obs(obs)
            obs = np.zeros((B, 0), np.float32)
        tensors = [ms.Tensor(pack_features(obs, batch["log_probs"], batch["values"], batch["advantages"],
                                           batch["returns"], batch["mask"])), ms.Tensor(batch["actions"])]
        scalars = [ms.Tensor(np.float32(lr)), ms.Tensor(np.float32(clip)), clip_vf, kl_limit]
        if self.batch_size is None:
            from .autobatch import probe

            self.batch_size, self.auto_batch = probe(self, tensors, scalars, B)
        if self.cfg.batch_size != "auto":
            return self._epochs(tensors, scalars, B)
        rng = self._rng_owner.rng
        state, rng_state = self.snapshot(), rng.bit_generator.state
        while True:
            try:
                return self._epochs(tensors, scalars, B)
            except Exception as exc:  # device out of memory: halve the minibatch and redo this update
                smaller = halve(self.batch_size, B, self.cfg.min_batch) if is_oom_error(exc) else None
                if smaller is None:
                    raise
                self.log.warning("warning: dynamic batching: out of memory at batch %d, retrying with %d",
                                 self.batch_size, smaller)
                self.auto_batch["events"].append({"global_step": global_step, "oom_at": self.batch_size,
                                                  "retry_with": smaller})
                self.batch_size = smaller
                self.restore(state)
                rng.bit_generator.state = rng_state

    def _epochs(self, tensors, scalars, B: int) -> dict:
        p = self.cfg
        rng = self._rng_owner.rng
        b = self.batch_size // self.world_size  # this rank's share of each minibatch
        per_call = 1 if p.target_kl is not None else p.n_epochs
        tables = []
        stopped = False
        for first in range(0, p.n_epochs, per_call):
            perms = np.stack([rng.permutation(B).astype(np.int32) for _ in range(min(per_call, p.n_epochs - first))])
            table = self.run_minibatches(*tensors, perms.reshape(-1, b), *scalars)
            ran = table[table[:, RAN] > 0.5]
            tables.append(ran)
            last = ran[-1] if len(ran) else None
            if last is not None and last[STAT.kl_ok] < 0.5 and last[STAT.finite] > 0.5 and p.target_kl is not None:
                stopped = True
                break
        return self._summary(np.concatenate(tables) if tables else np.zeros((0, N_STATS + 1), np.float32), stopped)

    def _summary(self, stats: np.ndarray, stopped: bool) -> dict:
        finite = stats[:, STAT.finite] > 0.5
        ok = stats[finite]  # skipped (non-finite) steps carry inf/nan losses: averaged over the finite steps
        result = {n: (float(ok[:, i].mean()) if len(ok) else float("nan")) for i, n in enumerate(LOSS_TERMS)}
        result["n_updates"] = int(((stats[:, STAT.kl_ok] > 0.5) & finite).sum())  # optimizer steps applied
        result["early_stopped"] = int(stopped)
        result["minibatch_steps"] = len(stats)
        bad_loss = ~np.isfinite(stats[:, STAT.loss])
        # steps skipped for a non-finite loss or gradient; with AMP, a gradient overflow at a finite loss is the
        # loss scaler's business (amp_overflows), not a fault
        nonfinite = bad_loss if self.amp is not None else ~finite
        result["nonfinite_updates"] = int(nonfinite.sum())
        if self.amp is not None:
            result["amp_overflows"] = int((~finite & ~bad_loss).sum())
            result["loss_scale"] = float(stats[-1, STAT.loss_scale]) if len(stats) else float("nan")
        self._count_nonfinite(nonfinite)
        return result

    def _count_nonfinite(self, bad_loss: np.ndarray) -> None:
        for bad in bad_loss:
            self.nonfinite_in_a_row = self.nonfinite_in_a_row + 1 if bad else 0
            if self.nonfinite_in_a_row >= NONFINITE_LIMIT:
                raise TrainingError(f"the PPO loss was non-finite in {NONFINITE_LIMIT} consecutive minibatch steps "
                                    "(each skipped, the weights are unchanged); check the scale of the env's "
                                    "observations and rewards (env.normalize_obs / env.normalize_reward) or lower "
                                    "ppo.learning_rate, in a new run (--resume keeps the run's config)")

    def comm_time(self, dist, minibatch_steps: int) -> float:
        """Seconds this update spent in collectives: the update's all-reduces (same sizes) timed on their own,
        times the minibatch steps run. Collectives run inside the compiled update graph, so they cannot be
        clocked there; this probe includes waiting for the slowest rank, as the real ones do."""
        n_params = sum(int(np.prod(prm.shape)) for prm in self.step.optimizer.parameters)
        sizes = [2, 1, n_params + 6] if self.cfg.normalize_advantage else [2, n_params + 6]
        return minibatch_steps * dist.time_collectives(sizes)

