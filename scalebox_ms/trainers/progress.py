"""What ``train`` shows while it trains: the progress over env steps, and ``--profile``'s recording.

On a terminal the progress is a tqdm bar; lines logged meanwhile (a warning, a signal's notice) go through
:func:`scalebox_ms.cli_common.say`, which clears the bar first and draws it again after. Where stderr is not a
terminal (a log file, a pipe, a scheduler's output), a bar redrawn with carriage returns would be one ever-growing
line, so the progress is a plain line at each tenth of the run instead.
"""
from __future__ import annotations

import math
import os
import sys

from .core import Callback


def stderr_is_a_terminal() -> bool:
    try:
        return sys.stderr is not None and sys.stderr.isatty()
    except (AttributeError, ValueError, OSError):  # (closed, or a stand-in without isatty)
        return False


class ProgressBar(Callback):
    """tqdm bar over env steps with the mean episode return (on a terminal; no tqdm: a warning and plain lines);
    elsewhere one line per tenth of ``total`` env steps."""

    LINES = 10

    def __init__(self, total: int, log=print, terminal=None):
        self.total, self.log, self.bar, self.tqdm = total, log, None, None
        if stderr_is_a_terminal() if terminal is None else terminal:
            try:
                from tqdm import tqdm
            except Exception as exc:  # (missing, or broken)
                log(f"warning: tqdm cannot be imported ({type(exc).__name__}: {exc}): no progress bar; pip install "
                    "tqdm")
            else:
                self.tqdm = tqdm
        self._next_line = 0

    def _after(self, step: int) -> int:
        """The first tenth of the run past ``step``."""
        k = step * self.LINES // self.total + 1
        return -(-k * self.total // self.LINES)

    def on_training_start(self, trainer):
        step = trainer.global_step
        if self.tqdm is not None:
            self.bar = self.tqdm(total=max(self.total, step), initial=step, unit="step", unit_scale=True,
                                 dynamic_ncols=True, file=sys.stderr, desc=trainer.config.env.id)
        self._next_line = self._after(step)

    def on_iteration_end(self, trainer, metrics):
        step, ret = metrics["global_step"], metrics["episode_return_mean"]
        shown = "n/a" if math.isnan(ret) else f"{ret:.1f}"
        if self.bar is not None:
            if step > self.bar.total:  # (the last iteration ends past run.total_steps: keep a percentage)
                self.bar.total = step
            self.bar.update(step - self.bar.n)
            self.bar.set_postfix({"return": shown}, refresh=False)
        elif step >= self._next_line:
            self.log(f"{trainer.config.env.id}: step {step:,} of {self.total:,} ({min(100, 100 * step // self.total)}%)"
                     f", {metrics['steps_per_second']:.0f} steps/s, return {shown}")
            self._next_line = self._after(step)

    def on_training_end(self, trainer):
        if self.bar is not None:
            self.bar.close()


class ProfileIterations(Callback):
    """Record ``n`` iterations with MindSpore's profiler into ``directory`` (skipping the first, compiling, one)."""

    def __init__(self, directory: str, n: int, log=print):
        self.directory, self.n, self.log = directory, n, log
        self.prof = None
        self.recorded = 0
        self.done = False

    def on_iteration_end(self, trainer, metrics):
        if self.done:
            return None
        if self.prof is None:
            from mindspore import Profiler

            os.makedirs(self.directory, exist_ok=True)
            self.prof = Profiler(output_path=self.directory, start_profile=False)
            self.prof.start()
            return None
        self.recorded += 1
        if self.recorded >= self.n:
            self._finish()
        return None

    def on_training_end(self, trainer):
        if self.prof is not None and not self.done:
            self._finish()

    def _finish(self):
        self.prof.stop()
        self.log(f"profile: {self.recorded} iteration(s) recorded; MindSpore's analysis writes {self.directory}")
        sys.stdout.flush()
        saved = os.dup(1)
        from ..cli_common import bars_cleared

        try:  # the analysis (and its worker processes) print progress on fd 1: keep stdout for our JSON (and the
            os.dup2(2, 1)  # bar off the terminal meanwhile)
            with bars_cleared():
                self.prof.analyse()
        finally:
            sys.stdout.flush()
            os.dup2(saved, 1)
            os.close(saved)
        self.done = True
