"""msrun's output as the ``--workers`` launcher reads it: what reaches the console (:class:`Console`), a rank's own
one-line error (:func:`worker_error`) and how a dead worker ended (:func:`how_it_ended`)."""
from __future__ import annotations

import glob
import os
import re
import signal
from typing import List, Optional

#: a run directory's folder for msrun's logs and the ranks' marker files
RANK_PID_DIR = "msrun"
#: msrun's own output (its lines and rank 0's log), all of it, in the log directory: the console shows only part
LAUNCHER_LOG = "launcher.log"


def worker_error(run_dir: str) -> Optional[str]:
    """The first one-line ``error: ...`` a worker printed (rank order), if any."""
    for path in sorted(glob.glob(os.path.join(run_dir, RANK_PID_DIR, "worker_*.log"))):
        try:
            with open(path, errors="replace") as f:
                for line in f:
                    if line.startswith("error: "):
                        rank = re.search(r"worker_(\d+)\.log$", path)
                        return f"rank {rank.group(1) if rank else '?'}: {line[len('error: '):].strip()}"
        except OSError:
            continue
    return None


def how_it_ended(code: Optional[int]) -> str:
    """msrun's error code of a worker (a negative one: the signal that killed it) in words."""
    if code is None or code == 0:
        return "exited abnormally"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


class Console:
    """What of msrun's output (its own lines and rank 0's log, ``--tail_worker_log=0``) reaches the console: a
    failed job ends in the launcher's one-line ``error:``, so the lines it summarises go to ``launcher.log`` in
    the log directory instead (with every other line msrun printed). Hidden: msrun's INFO/WARNING chatter, its
    report of a worker's exit, msrun's own traceback when it gives up on the job ("Distributed job exited with
    exception": the launcher's error says it in one line), the Python stacks faulthandler prints on a hang dump or a
    crash (in the rank's log; the message points to the logs), and a rank's own ``error:`` line (held back: the
    launcher repeats it naming the rank; shown as it is only if the job still succeeds). Any other traceback (a
    worker's bug) is shown whole."""

    MSRUN_GAVE_UP = "RuntimeError: Distributed job exited with exception"

    #: the lines that open a block of faulthandler's (a hang dump, or a crash's "Fatal Python error: ...")
    STACK = re.compile(r"^((Current thread|Thread) 0x[0-9a-f]+ \(most recent call first\):|Fatal Python error: "
                       r"|Extension modules: )")

    def __init__(self, log_path: str):
        self.held: List[str] = []
        self._in_stack = False
        self._traceback: List[str] = []  # (a traceback being read: shown or dropped once its last line is in)
        self._log = open(log_path, "a", encoding="utf-8", errors="replace")

    def shown(self, line: Optional[str]) -> List[str]:
        """The lines to show now, given the next line of msrun's output (``None``: the output ended)."""
        if self._traceback:
            if line is not None and line.startswith(" "):
                self._traceback.append(line)
                self._log.write(line)
                return []
            block, self._traceback = self._traceback, []
            if line is not None and line.startswith(self.MSRUN_GAVE_UP):
                self._log.write(line)
                return []
            return block + self.shown(line)
        if line is None:
            return []
        if line.startswith("Traceback (most recent call last):"):
            self._traceback.append(line)
            self._log.write(line)
            return []
        return [line] if self._show(line) else []

    def _show(self, line: str) -> bool:
        self._log.write(line)
        if self._in_stack and (line.startswith("  ") or not line.strip()):  # ("  File ...", "  <no Python frame>")
            return False
        self._in_stack = bool(self.STACK.match(line))
        if (self._in_stack or re.match(r"^\[(INFO|WARNING|DEBUG)\]", line) or "Start scheduler process" in line
                or "Start worker process with rank id" in line
                or re.search(r"Worker process \d+ exit with exception", line)):
            return False
        if line.startswith("error: "):
            self.held.append(line)
            return False
        return True

    def close(self) -> None:
        self._log.close()
