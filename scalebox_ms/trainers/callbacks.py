"""Callbacks for ``learn``: periodic deterministic evaluation, optionally stopping at a return threshold; the
``--workers`` ranks' progress beat.

:class:`EvalCallback` is what a time-to-solve measurement needs (``benchmarks/time_to_solve.py``) and what SB3
users know as ``EvalCallback`` + ``StopTrainingOnRewardThreshold``::

    from scalebox_ms.trainers import PPOTrainer
    from scalebox_ms.trainers.callbacks import EvalCallback

    stop = EvalCallback(every_steps=10_000, episodes=10, threshold=475)
    PPOTrainer(cfg).learn(callbacks=[stop])
    stop.solved  # the first evaluation at or above 475: {"step", "train_s", "mean", "std"}, or None

Evaluations run on fresh gymnasium envs of the trainer's ``env.id`` (also for ``env.backend: native``), at the
first iteration end at or after each multiple of ``every_steps``. ``train_s`` is the wall time since training
started (this ``learn`` call) *without* the time spent in evaluations, so evaluating more often does not make
training look slower. Each result is also appended to ``trainer.evaluations``, which checkpoints keep: a resumed
run's summary.json lists the evaluations of every session up to the step it resumed from (``train_s`` counts from
the start of each session's ``learn``).
``learn`` (and so the CLI) adds one from the config, unless given one: ``run.eval_every`` (and ``run.eval_episodes``),
``run.stop_return``.

Data-parallel ranks (``--workers``) train in lockstep, so they must stop together: each rank evaluates its own copy
of the (identical) policy on the same seeded episodes, then the ranks share rank 0's result (one small all-gather)
and all follow rank 0's decision.
"""
from __future__ import annotations

import time
from typing import List, Optional

import numpy as np

from .core import Callback


def eval_seed(cfg) -> int:
    """The seed of a run's evaluation envs: ``run.seed`` + 10,000, for the evaluations while training, the final one
    (``eval_mean_return``) and ``python -m scalebox_ms.evaluate --run`` alike, so they agree on the same weights."""
    return cfg.run.seed + 10_000


class EvalCallback(Callback):
    """Evaluate every ``every_steps`` env steps; stop training once the mean return reaches ``threshold``."""

    def __init__(self, every_steps: int, episodes: int = 10, threshold: Optional[float] = None,
                 seed: int = 10_000, clock=time.perf_counter, log=None):
        if int(every_steps) < 1:
            raise ValueError(f"every_steps: must be >= 1, got {every_steps}")
        if int(episodes) < 1:
            raise ValueError(f"episodes: must be >= 1, got {episodes}")
        self.every_steps, self.episodes, self.threshold = int(every_steps), int(episodes), threshold
        self.seed, self.clock, self.log = int(seed), clock, log
        self.history: List[dict] = []  # one dict per evaluation of this callback: step, train_s, eval_s, mean, std
        self.solved: Optional[dict] = None
        self.eval_s = 0.0  # time spent evaluating, in all
        self._t0 = self._eval_at_start = 0.0
        self._next = 0

    @classmethod
    def from_config(cls, cfg, log=None) -> "EvalCallback":
        """The one ``run.eval_every``, ``run.eval_episodes``, ``run.stop_return`` ask for (seed: :func:`eval_seed`,
        as the final evaluation's)."""
        r = cfg.run
        return cls(r.eval_every, r.eval_episodes, r.stop_return, seed=eval_seed(cfg), log=log)

    def on_training_start(self, trainer) -> None:
        self._t0, self._eval_at_start = self.clock(), self.eval_s  # (a callback may serve several learn calls)
        self._next = (trainer.global_step // self.every_steps + 1) * self.every_steps

    def on_iteration_end(self, trainer, metrics: dict) -> Optional[bool]:
        if trainer.global_step < self._next:
            return None
        from .evaluation import evaluate_policy

        start = self.clock()
        returns = np.asarray(evaluate_policy(trainer, episodes=self.episodes, seed=self.seed), float)
        took = self.clock() - start
        record = {"step": int(trainer.global_step), "eval_s": took,
                  "train_s": start - self._t0 - (self.eval_s - self._eval_at_start),
                  "mean": float(returns.mean()), "std": float(returns.std())}
        solved = self.threshold is not None and record["mean"] >= self.threshold
        dist = getattr(trainer, "dist", None)
        if dist is not None and dist.distributed:  # every rank stops where rank 0 does (lockstep collectives)
            flag, mean, std = dist.all_gather(np.array([solved, record["mean"], record["std"]]))[0]
            solved = bool(flag)
            if not dist.is_main:
                record["mean"], record["std"] = float(mean), float(std)
        self.eval_s += took
        self.history.append(record)
        if isinstance(getattr(trainer, "evaluations", None), list):
            trainer.evaluations.append(record)
        self._next = (trainer.global_step // self.every_steps + 1) * self.every_steps
        if self.log is not None:
            self.log(f"evaluation at step {record['step']}: mean return {record['mean']:.2f} +- {record['std']:.2f} "
                     f"({self.episodes} episodes)" + (f", at or above {self.threshold:g}: stopping" if solved else ""))
        if solved:
            self.solved = record
            return False
        return None


class ProgressBeat(Callback):
    """``--workers`` ranks: each iteration's end is a sign of progress for the launcher's hang watch
    (:func:`scalebox_ms.parallel.ranks.beat`)."""

    def on_iteration_end(self, trainer, metrics):
        from ..parallel.ranks import beat

        beat()
