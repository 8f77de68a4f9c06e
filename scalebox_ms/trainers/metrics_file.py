"""``metrics.csv`` (one row per iteration, written as it goes) and ``learning_curve.png`` of a run directory
(:mod:`.run`)."""
from __future__ import annotations

import csv
import math
import os

from ..fileio import atomic_path, errors_named
from .core import Callback

METRIC_COLUMNS = [
    "iteration", "global_step", "wall_time_s", "steps_per_second", "episode_return_mean", "episode_length_mean",
    "episodes", "loss", "policy_loss", "value_loss", "entropy_loss", "approx_kl", "clip_fraction",
    "explained_variance", "learning_rate", "clip_range", "n_updates", "early_stopped", "rollout_time_s",
    "update_time_s", "share_env", "share_act", "share_update", "share_comm", "share_other", "update_samples_per_s",
    "batch_size", "env_restarts", "world_size", "comm_time_s", "loss_scale", "amp_overflows", "amp_skipped_steps",
    "nonfinite_updates",
]
# DQN/SAC/TD3: one row per iteration (whole training phases adding up to >= 1,000 env steps), statistics averaged
# over its gradient steps (columns of another algorithm stay empty)
OFF_POLICY_COLUMNS = [
    "iteration", "global_step", "wall_time_s", "steps_per_second", "episode_return_mean", "episode_length_mean",
    "episodes", "loss", "critic_loss", "actor_loss", "q_values", "ent_coef", "ent_coef_loss", "entropy",
    "exploration_rate", "actor_updates", "learning_rate", "n_updates", "replay_size", "update_time_s", "share_env",
    "share_act", "share_update", "share_other", "update_samples_per_s", "batch_size", "env_restarts", "world_size",
    "nonfinite_updates", "loss_scale", "amp_skipped_steps",
]
# columns that depend on the machine's speed, not on the maths (excluded from reproducibility checks)
TIMING_COLUMNS = {"wall_time_s", "steps_per_second", "rollout_time_s", "update_time_s", "share_env", "share_act",
                  "share_update", "share_comm", "share_other", "update_samples_per_s",
                  "comm_time_s"}


class MetricsWriter(Callback):
    """Appends one CSV row per iteration and flushes it (a crash loses at most the current row)."""

    def __init__(self, path: str, columns=METRIC_COLUMNS):
        self.path = path
        self.columns = list(columns)
        self._open()

    def _open(self):
        new = not os.path.exists(self.path) or os.path.getsize(self.path) == 0
        self._f = open(self.path, "a", newline="", encoding="utf-8")
        self._w = csv.DictWriter(self._f, fieldnames=self.columns, extrasaction="ignore")
        if new:
            self._w.writeheader()
            self._f.flush()

    def on_iteration_end(self, trainer, metrics):
        with errors_named(self.path):
            if os.fstat(self._f.fileno()).st_nlink == 0:  # (deleted while training: its rows went nowhere, silently)
                self._f.close()
                self._open()
                trainer.log.warning(f"warning: {self.path} was removed while training: a new one starts at step "
                                    f"{metrics.get('global_step')} (the rows before are gone)")
            self._w.writerow({k: _fmt(metrics.get(k)) for k in self.columns})
            self._f.flush()

    def close(self):
        with errors_named(self.path):
            self._f.close()


def _fmt(v):
    if isinstance(v, float):
        return repr(v)
    return "" if v is None else v


def plot_learning_curve(metrics_csv: str, out_png: str, title: str, log=None) -> None:
    """Episode return vs env steps from ``metrics_csv`` into ``out_png`` (atomically). With ``log`` a file that
    cannot be written, or a matplotlib that cannot be imported, is a logged warning, not an error: a run whose
    checkpoint is written is not failed for its plot (a learning_curve.png that was a directory ended a completed run
    with exit 2 and no summary)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot  # noqa: F401
    except Exception as exc:  # (a missing or broken matplotlib, e.g. built for another numpy: the run's own files
        if log is None:  # are written all the same)
            raise
        log(f"warning: matplotlib cannot be imported ({type(exc).__name__}: {exc}): the learning curve was not "
            "written; pip install matplotlib")
        return
    try:
        _plot(metrics_csv, out_png, title)
    except OSError as exc:
        if log is None:
            raise
        log(f"warning: {exc.filename or out_png}: {exc.strerror or exc}: the learning curve was not written")


def _plot(metrics_csv: str, out_png: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps, rets = [], []
    with open(metrics_csv, newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            try:
                step, ret = int(row["global_step"]), float(row["episode_return_mean"])
            except (TypeError, ValueError, KeyError):
                continue  # header-only, torn or NaN rows
            if math.isfinite(ret):
                steps.append(step)
                rets.append(ret)
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(steps, rets, lw=1.5)
    ax.set_xlabel("env steps")
    ax.set_ylabel("episode return (mean of last 100)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    try:
        with errors_named(out_png), atomic_path(out_png) as tmp:
            fig.savefig(tmp, format="png", dpi=100)
    finally:
        plt.close(fig)
