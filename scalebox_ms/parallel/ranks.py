"""The marker files of a ``--workers`` job in ``<run_dir>/msrun/``: what each rank writes, and what the launcher
(:mod:`.launcher`) reads from them.

A rank writes ``rank_<r>.pid`` (its pid) and ``rank_<r>.alive``, renamed to ``rank_<r>.exit`` when its interpreter
exits (success or a reported error: a rank gone without it was killed or crashed); it touches ``rank_<r>.beat`` at the
end of every iteration (:func:`beat`, the launcher's hang watch) and creates ``rank_<r>.stoppable`` once a signal
stops it at an iteration boundary (:func:`mark_stoppable`: the launcher then forwards Ctrl-C/SIGTERM/SIGHUP to the
ranks instead of stopping the job at once). On :data:`STACK_SIGNAL` a rank prints its Python stacks into its log.
msrun's scheduler creates ``scheduler.port_taken`` when another process holds its port as it starts
(:func:`report_port_taken`).
"""
from __future__ import annotations

import errno
import glob
import os
import re
import signal
import socket
import time
from typing import Dict, List, Optional

from .msrun_output import RANK_PID_DIR

#: a worker prints the Python stack of each of its threads into its log on this signal (``faulthandler``)
STACK_SIGNAL = signal.SIGUSR1
#: the launcher names the job's log directory to msrun's scheduler in this variable (for :func:`report_port_taken`)
LOG_DIR_ENV = "SCALEBOX_MS_MSRUN_LOG_DIR"
#: created by msrun's scheduler when another process holds its port: the launcher then starts the job again
PORT_TAKEN = "scheduler.port_taken"
_beat_marker: Optional[str] = None  # (in a worker: its rank_<r>.beat, touched by beat())
_job: Optional[tuple] = None  # (in a worker: (run_dir, rank, the time it started), for wait_for_rank_zero())


def write_rank_pid(run_dir: str, rank: int) -> None:
    """Called by each worker: lets the launcher map a dead process to its rank, and tell a worker that exited
    through Python (``rank_<r>.exit``, written at interpreter exit: success or a reported error) from one that
    died; :func:`beat` marks its progress, and :data:`STACK_SIGNAL` prints its Python stacks into its log."""
    import atexit
    import faulthandler

    global _beat_marker, _job

    _job = (run_dir, rank, time.time())
    d = os.path.join(run_dir, RANK_PID_DIR)
    os.makedirs(d, exist_ok=True)
    pid = os.getpid()
    tmp = os.path.join(d, f".rank_{rank}.pid.tmp")
    with open(tmp, "w") as f:
        f.write(str(pid))
    marker = os.path.join(d, f"rank_{rank}.alive")
    open(marker, "w").close()  # renamed to rank_<r>.exit at exit: a rename needs no free space (a full disk)
    _beat_marker = os.path.join(d, f"rank_{rank}.beat")
    faulthandler.register(STACK_SIGNAL, all_threads=True)  # (to sys.stderr: msrun's worker_<r>.log)
    faulthandler.enable(all_threads=True)  # a crash (SIGSEGV, SIGABRT) prints the Python stacks into the log too
    os.replace(tmp, os.path.join(d, f"rank_{rank}.pid"))

    def exited():
        if os.getpid() == pid:  # (not in a forked child that inherited the handler)
            try:
                os.replace(marker, os.path.join(d, f"rank_{rank}.exit"))
            except OSError:
                pass

    atexit.register(exited)


def beat() -> None:
    """In a worker, at the end of each iteration: touch ``rank_<r>.beat`` (an empty file: no data is written). A
    no-op outside a ``--workers`` job."""
    if _beat_marker is not None:
        try:
            try:
                os.utime(_beat_marker)
            except FileNotFoundError:  # the first iteration's end
                open(_beat_marker, "a").close()
        except OSError:
            pass


def wait_for_rank_zero(poll: float = 0.1) -> None:
    """In a rank > 0 whose work is done: return once rank 0 has written this job's ``summary.json`` (modified since
    this worker started) or has ended (its exit marker, or its pid gone). MindSpore 2.10's shutdown of a worker was
    seen to die of SIGSEGV now and then on a busy machine, and msrun then stops every other worker; its cluster
    finalisation does not reliably wait for rank 0 (seen in CI: rank 1 died while rank 0 still evaluated). A rank
    that leaves only after rank 0's summary cannot take down a run that has not been summarised (the launcher
    accepts such a crash once the run has ended: :func:`.launcher._crash_after_the_run`). A no-op outside a job,
    on rank 0."""
    if _job is None or _job[1] == 0:
        return
    run_dir, _, started = _job
    log_dir = os.path.join(run_dir, RANK_PID_DIR)
    pid = rank_pids(log_dir).get(0)
    summary = os.path.join(run_dir, "summary.json")
    while pid is not None and alive(pid) and not os.path.exists(os.path.join(log_dir, "rank_0.exit")):
        try:
            if os.stat(summary).st_mtime >= started:
                return
        except OSError:
            pass
        time.sleep(poll)


def report_port_taken(environ=None) -> bool:
    """In msrun's scheduler, before MindSpore binds anything: where its port (``MS_SCHED_PORT``) is held by another
    process, which took it between the launcher's :func:`~.launcher.free_port` and now, create :data:`PORT_TAKEN` in
    the job's log directory (the launcher then launches the job again on another port; its workers would otherwise
    wait out ``parallel.timeout`` for this scheduler) and return True; the scheduler then exits. (Not after a failed
    ``init``: MindSpore's own server may hold the port then, and a cluster that failed for another reason would be
    retried as if its port were taken.)"""
    environ = os.environ if environ is None else environ
    log_dir, port = environ.get(LOG_DIR_ENV), environ.get("MS_SCHED_PORT", "")
    if not log_dir or not port.isdigit():
        return False
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((environ.get("MS_SCHED_HOST") or "127.0.0.1", int(port)))
        return False  # (free)
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE:
            return False
    try:
        open(os.path.join(log_dir, PORT_TAKEN), "w").close()
    except OSError:
        return False
    return True


def stalled_workers(log_dir: str, hang_timeout: float, now: Optional[float] = None) -> List[tuple]:
    """``[(rank, pid, seconds since its last beat)]`` for every live rank (no exit marker) when ALL of them have
    been silent for more than ``hang_timeout`` seconds (ranks train in lockstep: one stuck rank soon blocks the
    others in a collective), else ``[]``; also ``[]`` while a live rank has not ended its first iteration (no
    ``rank_<r>.beat`` yet). Ranks that have not written their pid yet are not counted."""
    now = time.time() if now is None else now
    found = []
    for rank, pid in sorted(rank_pids(log_dir).items()):
        if os.path.exists(os.path.join(log_dir, f"rank_{rank}.exit")) or not alive(pid):
            continue
        try:
            age = now - os.stat(os.path.join(log_dir, f"rank_{rank}.beat")).st_mtime
        except OSError:
            return []  # (still in its first iteration)
        if age <= hang_timeout:
            return []
        found.append((rank, pid, age))
    return found




def proc_stat(pid: int) -> List[str]:
    """The fields of ``/proc/<pid>/stat`` after the command name (state, ppid, ...); FileNotFoundError if gone."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def alive(pid: int) -> bool:
    """The process exists and is not a zombie (a dead worker msrun has not reaped yet)."""
    try:
        return proc_stat(pid)[0] != "Z"
    except FileNotFoundError:
        return False
    except (OSError, IndexError):  # no /proc: signal 0 tells existence only
        try:
            os.kill(pid, 0)
            return True
        except ProcessLookupError:
            return False
        except PermissionError:
            return True


def rank_pids(log_dir: str) -> Dict[int, int]:
    """rank -> pid from the workers' ``rank_<r>.pid`` files."""
    found = {}
    for path in glob.glob(os.path.join(log_dir, "rank_*.pid")):
        try:
            rank = int(re.search(r"rank_(\d+)\.pid$", path).group(1))
            with open(path) as f:
                found[rank] = int(f.read().strip())
        except (OSError, ValueError, AttributeError):
            continue
    return found


def dead_workers(log_dir: str) -> List[int]:
    """The pids of the workers that are gone without their exit marker, in rank order."""
    return [pid for rank, pid in sorted(rank_pids(log_dir).items())
            if not alive(pid) and not os.path.exists(os.path.join(log_dir, f"rank_{rank}.exit"))]


def children(pid: int) -> List[int]:
    """The pids whose parent is ``pid`` (Linux /proc; empty elsewhere)."""
    found = []
    for path in glob.glob("/proc/[0-9]*/stat"):
        child = int(path.split("/")[2])
        try:
            if int(proc_stat(child)[1]) == pid:
                found.append(child)
        except (OSError, IndexError, ValueError):
            continue
    return found




def rank_of_pid(run_dir: str, pid: int) -> Optional[int]:
    return next((rank for rank, p in rank_pids(os.path.join(run_dir, RANK_PID_DIR)).items() if p == pid), None)


def mark_stoppable() -> None:
    """In a rank: a signal from now on stops the job at an iteration boundary, all ranks together (the run's
    :class:`~scalebox_ms.trainers.lifecycle.StopOnSignal` is installed). A no-op outside a ``--workers`` job."""
    if _job is not None:
        run_dir, rank, _ = _job
        try:
            open(os.path.join(run_dir, RANK_PID_DIR, f"rank_{rank}.stoppable"), "w").close()
        except OSError:
            pass  # (the launcher then stops the job at once, as before a rank can stop by itself)


def stoppable_ranks(log_dir: str, workers: int) -> Optional[Dict[int, int]]:
    """rank -> pid when each of the job's ``workers`` ranks runs, has not exited and is stoppable
    (:func:`mark_stoppable`), else None."""
    pids = rank_pids(log_dir)
    if sorted(pids) != list(range(workers)):
        return None
    for rank, pid in pids.items():
        marker = os.path.join(log_dir, f"rank_{rank}.")
        if not alive(pid) or os.path.exists(marker + "exit") or not os.path.exists(marker + "stoppable"):
            return None
    return pids
