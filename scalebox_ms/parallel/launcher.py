"""``python -m scalebox_ms.train --workers N``: run the same command as N msrun workers on this machine.

The launcher (this process) never imports MindSpore. It

1. picks a free TCP port on 127.0.0.1 and creates ``<run_dir>/msrun/`` for msrun's scheduler and worker logs;
2. runs ``msrun --worker_num=N --local_worker_num=N --master_addr=127.0.0.1 --master_port=P --join=True
   --log_dir=<run_dir>/msrun python -m scalebox_ms.train <the same arguments> --run-dir <run_dir>``; each worker
   writes its pid to ``<run_dir>/msrun/rank_<r>.pid``;
3. when msrun reports a worker that exited abnormally (msrun then kills the other workers; a worker that failed
   before the cluster formed, msrun would wait for until ``timeout``: the launcher stops the job a few seconds
   after msrun's report), names its rank in a one-line error and exits non-zero; a worker's own one-line ``error:`` (bad config, bad env id) is repeated
   with exit code 2. A fresh run that failed before its first checkpoint leaves no run directory behind. A worker
   killed by a signal in MindSpore's own shutdown, after it passed Python's exit and this job's summary.json was
   written (:func:`_crash_after_the_run`), is a warning and exit code 0: nothing of the run is missing.

``timeout`` (``parallel.timeout``) bounds msrun's cluster building. A worker killed mid-collective does not hang
the job: the launcher watches the workers' pids, and a worker gone without passing through Python's exit (killed,
a segfault, ``os._exit``: no ``rank_<r>.exit`` marker, which each worker writes at its interpreter's exit) stops the
job within about a second; msrun alone would wait for its scheduler's heartbeat timeout (measured here: ~30 s from
the kill to the exit).

A worker that hangs without dying (an env stuck in ``step``, a deadlock) stops the others at their next collective,
so the whole job stops making progress. Each worker touches its ``rank_<r>.beat`` marker at the end of every
iteration (:func:`beat`); once every live rank has ended its first iteration (start-up and the first graph
compilations are not timed: they can take minutes), and when no live rank has ended one for ``hang_timeout``
seconds (``parallel.hang_timeout``; 0: never), the launcher sends each rank :data:`STACK_SIGNAL`, on which Python's
``faulthandler`` prints every thread's stack into that rank's log, then stops the job and names the ranks in a
one-line error.
"""
from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Dict, List, Optional

from ..errors import Interrupted
from .msrun_output import LAUNCHER_LOG, RANK_PID_DIR, Console, how_it_ended, worker_error

#: a worker prints the Python stack of each of its threads into its log on this signal (``faulthandler``)
STACK_SIGNAL = signal.SIGUSR1
_beat_marker: Optional[str] = None  # (in a worker: its rank_<r>.beat, touched by beat())
_job: Optional[tuple] = None  # (in a worker: (run_dir, rank, the time it started), for wait_for_rank_zero())


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def msrun_executable() -> str:
    """msrun next to this interpreter (a venv's bin/), else on PATH."""
    here = os.path.join(os.path.dirname(sys.executable), "msrun")
    if os.path.exists(here):
        return here
    found = shutil.which("msrun")
    if found is None:
        from ..errors import ConfigError

        raise ConfigError("parallel.workers: msrun (MindSpore's launcher) was not found next to the Python "
                          "interpreter or on PATH")
    return found


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
    alive = os.path.join(d, f"rank_{rank}.alive")
    open(alive, "w").close()  # renamed to rank_<r>.exit at exit: a rename needs no free space (a full disk)
    _beat_marker = os.path.join(d, f"rank_{rank}.beat")
    faulthandler.register(STACK_SIGNAL, all_threads=True)  # (to sys.stderr: msrun's worker_<r>.log)
    faulthandler.enable(all_threads=True)  # a crash (SIGSEGV, SIGABRT) prints the Python stacks into the log too
    os.replace(tmp, os.path.join(d, f"rank_{rank}.pid"))

    def exited():
        if os.getpid() == pid:  # (not in a forked child that inherited the handler)
            try:
                os.replace(alive, os.path.join(d, f"rank_{rank}.exit"))
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
    accepts such a crash once the run has ended: :func:`_crash_after_the_run`). A no-op outside a job, on rank 0."""
    if _job is None or _job[1] == 0:
        return
    run_dir, _, started = _job
    log_dir = os.path.join(run_dir, RANK_PID_DIR)
    pid = _rank_pids(log_dir).get(0)
    summary = os.path.join(run_dir, "summary.json")
    while pid is not None and _alive(pid) and not os.path.exists(os.path.join(log_dir, "rank_0.exit")):
        try:
            if os.stat(summary).st_mtime >= started:
                return
        except OSError:
            pass
        time.sleep(poll)


def stalled_workers(log_dir: str, hang_timeout: float, now: Optional[float] = None) -> List[tuple]:
    """``[(rank, pid, seconds since its last beat)]`` for every live rank (no exit marker) when ALL of them have
    been silent for more than ``hang_timeout`` seconds (ranks train in lockstep: one stuck rank soon blocks the
    others in a collective), else ``[]``; also ``[]`` while a live rank has not ended its first iteration (no
    ``rank_<r>.beat`` yet). Ranks that have not written their pid yet are not counted."""
    now = time.time() if now is None else now
    found = []
    for rank, pid in sorted(_rank_pids(log_dir).items()):
        if os.path.exists(os.path.join(log_dir, f"rank_{rank}.exit")) or not _alive(pid):
            continue
        try:
            age = now - os.stat(os.path.join(log_dir, f"rank_{rank}.beat")).st_mtime
        except OSError:
            return []  # (still in its first iteration)
        if age <= hang_timeout:
            return []
        found.append((rank, pid, age))
    return found


def _dump_stacks(stalled: List[tuple]) -> None:
    for _, pid, _ in stalled:
        try:
            os.kill(pid, STACK_SIGNAL)
        except (ProcessLookupError, PermissionError):
            pass


def _stat(pid: int) -> List[str]:
    """The fields of ``/proc/<pid>/stat`` after the command name (state, ppid, ...); FileNotFoundError if gone."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def _alive(pid: int) -> bool:
    """The process exists and is not a zombie (a dead worker msrun has not reaped yet)."""
    try:
        return _stat(pid)[0] != "Z"
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


def _rank_pids(log_dir: str) -> Dict[int, int]:
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
    return [pid for rank, pid in sorted(_rank_pids(log_dir).items())
            if not _alive(pid) and not os.path.exists(os.path.join(log_dir, f"rank_{rank}.exit"))]


def _children(pid: int) -> List[int]:
    """The pids whose parent is ``pid`` (Linux /proc; empty elsewhere)."""
    found = []
    for path in glob.glob("/proc/[0-9]*/stat"):
        child = int(path.split("/")[2])
        try:
            if int(_stat(child)[1]) == pid:
                found.append(child)
        except (OSError, IndexError, ValueError):
            continue
    return found


_stopping = threading.Lock()


def _stop_job(proc, grace: float = 10.0) -> None:
    """msrun's own Ctrl-C path (SIGINT: it SIGKILLs its workers' process groups and its scheduler), then SIGKILL
    for whatever of msrun and its children (each in its own session) still runs after ``grace`` seconds. The pid
    watcher and a Ctrl-C may both ask: the second caller waits until the first has stopped the job (returning at
    once would let the launcher exit, and its watcher thread with it, before the SIGKILL sweep), then finds
    nothing left to stop."""
    with _stopping:
        _stop_job_now(proc, grace)


def _stop_job_now(proc, grace: float) -> None:
    children = _children(proc.pid)
    try:
        proc.send_signal(2)
    except ProcessLookupError:
        pass
    deadline = time.time() + grace
    while proc.poll() is None and time.time() < deadline:
        time.sleep(0.1)
    for pid in [proc.pid] + children:
        if _alive(pid):
            try:
                os.killpg(os.getpgid(pid), 9)
            except (ProcessLookupError, PermissionError):
                pass


EXCEPTION_GRACE_S = 3.0  # after msrun reports a worker's exception, how long it may take to end the job itself


def _stop_unless_ended(proc, grace: float) -> None:
    deadline = time.time() + grace
    while proc.poll() is None and time.time() < deadline:
        time.sleep(0.1)
    if proc.poll() is None:
        _stop_job(proc)


def _watch(proc, log_dir: str, found: list, hung: list, hang_timeout: float = 0.0, interval: float = 0.2) -> None:
    """Until msrun ends: a worker that died (:func:`dead_workers`) ends the job now; msrun alone would wait for its
    scheduler's heartbeat timeout (~30 s). With ``hang_timeout`` > 0, a job whose ranks all stopped making progress
    (:func:`stalled_workers`) has its stacks printed into the workers' logs, then is stopped."""
    while proc.poll() is None:
        pids = dead_workers(log_dir)
        if pids:
            found.extend(pids)
            _stop_job(proc)
            return
        stalled = stalled_workers(log_dir, hang_timeout) if hang_timeout > 0 else []
        if stalled:
            hung.extend(stalled)
            _dump_stacks(stalled)
            time.sleep(1.0)  # (faulthandler writes from a signal handler: a moment for the logs)
            _stop_job(proc)
            return
        time.sleep(interval)


def _rank_of_pid(run_dir: str, pid: int) -> Optional[int]:
    return next((rank for rank, p in _rank_pids(os.path.join(run_dir, RANK_PID_DIR)).items() if p == pid), None)


def _default_sigint() -> None:
    """In msrun (before exec): Ctrl-C's default action and unblocked, whatever the launcher inherited (a launcher
    started in the background ignores SIGINT, and an ignored signal survives exec): _stop_job's SIGINT must reach
    msrun's own handler."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _terminated(signum, frame):
    """SIGTERM or SIGHUP to the launcher: the job is stopped as for Ctrl-C; the CLI exits 128 + signum."""
    raise Interrupted(signum)


def _stopping_signals() -> List[int]:
    """The signals the launcher turns into a clean stop of the job besides Ctrl-C: SIGTERM, and SIGHUP unless it is
    ignored (``nohup``)."""
    return [signal.SIGTERM] + ([] if signal.getsignal(signal.SIGHUP) == signal.SIG_IGN else [signal.SIGHUP])


# MindSpore's cluster heartbeat interval, drawn between these bounds in whole seconds (its defaults: 3 and 5): each
# rank's exit waits out the heartbeat loop's sleep, so a local job ended 3-5 s after its last step. 1 s heartbeats
# are one small message per rank and second to a scheduler on the same machine (throughput not measured separately);
# the node timeout (MS_NODE_TIMEOUT, 30 s) is unchanged. (0 is not an option: the heartbeat loop would spin.) If the
# environment sets either bound (non-empty), neither is touched: one of ours could undercut the user's other one.
HEARTBEAT_INTERVAL = {"MS_RETRY_INTERVAL_LOWER": "1", "MS_RETRY_INTERVAL_UPPER": "1"}


def msrun_env(environ) -> dict:
    """The environment of the msrun job: ``environ``, this interpreter first on PATH (msrun starts ``python``),
    MindSpore's logging at errors only (``GLOG_v=3``) and :data:`HEARTBEAT_INTERVAL` unless ``environ`` sets them."""
    env = dict(environ)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env.setdefault("GLOG_v", "3")
    if not any(env.get(key) for key in HEARTBEAT_INTERVAL):  # (empty is unset for MindSpore too)
        env.update(HEARTBEAT_INTERVAL)
    return env


def launch(worker_args: List[str], workers: int, run_dir: str, fresh: bool, timeout: float,
           stream=sys.stderr, hang_timeout: float = 0.0) -> int:
    """Run ``python -m scalebox_ms.train <worker_args>`` as ``workers`` msrun ranks; returns the exit code."""
    log_dir = os.path.join(run_dir, RANK_PID_DIR)
    created = fresh and not os.path.exists(run_dir)
    os.makedirs(log_dir, exist_ok=True)
    # a previous launch's files (resume): not this job's
    for pattern in ("rank_*.pid", "rank_*.alive", "rank_*.beat", "rank_*.exit", "worker_*.log", "scheduler.log",
                    LAUNCHER_LOG):
        for stale in glob.glob(os.path.join(log_dir, pattern)):
            os.unlink(stale)
    port = free_port()
    cmd = [msrun_executable(), f"--worker_num={workers}", f"--local_worker_num={workers}",
           "--master_addr=127.0.0.1", f"--master_port={port}", "--join=True", f"--log_dir={log_dir}",
           f"--cluster_time_out={int(max(1, timeout))}", "--tail_worker_log=0",
           "python", "-m", "scalebox_ms.train"] + list(worker_args)
    env = msrun_env(os.environ)
    stream.write(f"launching {workers} msrun workers on 127.0.0.1:{port}; logs in {log_dir}\n")
    stream.flush()
    t0 = time.time()
    main = threading.current_thread() is threading.main_thread()
    old_int = signal.getsignal(signal.SIGINT) if main else None
    # (before msrun exists)
    old = {s: signal.signal(s, _terminated) for s in _stopping_signals()} if main else {}
    proc = None
    console = Console(os.path.join(log_dir, LAUNCHER_LOG))
    dead_pid = dead_code = None
    died: list = []  # (filled by the watcher thread)
    hung: list = []  # (rank, pid, seconds silent) of a job stopped as hung (filled by the watcher thread)
    ended_open = [False]  # what was shown last does not end its line

    def shown(lines) -> None:
        for text in lines:
            stream.write(text)
            ended_open[0] = not text.endswith("\n") if text else ended_open[0]
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True,
                                errors="replace", start_new_session=True, preexec_fn=_default_sigint)
        threading.Thread(target=_watch, args=(proc, log_dir, died, hung, hang_timeout), daemon=True).start()
        for line in proc.stdout:
            m = re.search(r"Worker process (\d+) exit with exception(?:\. Error code: (-?\d+))?", line)
            if m and dead_pid is None:
                dead_pid = int(m.group(1))
                dead_code = int(m.group(2)) if m.group(2) else None
                # a worker that failed before the cluster formed (a check in the trainer's constructor): msrun would
                # wait out its cluster_time_out for it (parallel.timeout); after a moment for its clean-up, stop it
                threading.Thread(target=_stop_unless_ended, args=(proc, EXCEPTION_GRACE_S), daemon=True).start()
            shown(console.shown(line))
        shown(console.shown(None))
        rc = proc.wait()
    except BaseException:  # Ctrl-C, SIGTERM/SIGHUP (_terminated: exit 130 / 143 / 129), or a broken stderr pipe:
        if main:           # no job is left running without its launcher (a second signal must not cut it short)
            for s in [signal.SIGINT, *old]:
                signal.signal(s, signal.SIG_IGN)
        if proc is not None and proc.poll() is None:
            _stop_job(proc)  # msrun's workers and scheduler run in sessions of their own: stop them all
        raise
    finally:
        console.close()
        if ended_open[0]:  # (a rank's progress bar ends in "\r": the launcher's own last line must not join it)
            with contextlib.suppress(OSError, ValueError):  # (a closed or broken stderr)
                stream.write("\n")
        if main:
            for s, handler in old.items():
                signal.signal(s, handler)
            signal.signal(signal.SIGINT, old_int)
    if rc == 0 and not died and not hung and dead_pid is None:  # (msrun stopped by us after an exception: rc 0)
        stream.writelines(console.held)
        return 0
    message = None if hung else worker_error(run_dir)
    if not hung and message is None and dead_pid is not None and dead_code is not None and dead_code < 0:
        ended = _crash_after_the_run(run_dir, t0, dead_pid)
        if ended is not None:  # (MindSpore's shutdown, after rank 0 wrote the run's summary: nothing is lost)
            rank = _rank_of_pid(run_dir, dead_pid)
            sys.stderr.write(f"warning: rank {rank} (pid {dead_pid}) {how_it_ended(dead_code)} in MindSpore's "
                             f"shutdown, after the run had ended ({ended}; summary.json written); msrun reported "
                             f"the job failed, but nothing of the run is missing (logs: {log_dir})\n")
            stream.writelines(console.held)
            return 0
    code = 2 if message else 1
    if hung:
        ages = ", ".join(f"rank {r} (pid {p}): {age:.0f} s" for r, p, age in hung)
        logs = ", ".join(f"worker_{r}.log" for r, _, _ in hung)
        message = (f"data-parallel job stopped after {time.time() - t0:.0f} s: no rank ended an iteration for more "
                   f"than {hang_timeout:g} s (parallel.hang_timeout; {ages}); each rank's Python stacks are at the "
                   f"end of its log ({logs} in {log_dir})")
    elif message is None:
        # msrun's report names the first it saw (it then kills the others); else every worker found dead
        pids = [dead_pid] if dead_pid is not None else died
        who = " and ".join(f"rank {r} (pid {p})" if r is not None else f"pid {p}"
                           for p, r in ((p, _rank_of_pid(run_dir, p)) for p in pids)) or "a worker"
        stopper = "the launcher" if died else "msrun"
        message = (f"data-parallel job failed after {time.time() - t0:.0f} s: {who} {how_it_ended(dead_code)}, "
                   f"{stopper} stopped the other workers (logs: {log_dir})")
    ckpts = glob.glob(os.path.join(run_dir, "checkpoints", "ckpt_*.json"))
    if created and not ckpts:
        shutil.rmtree(run_dir, ignore_errors=True)  # nothing worth keeping: leave no half-made run behind
    sys.stderr.write(f"error: {message}\n")
    return code


#: summary.json statuses of a run that ended by itself (an interrupted one was stopped by a signal)
_ENDED = ("completed", "solved", "paused")


def _crash_after_the_run(run_dir: str, since: float, pid: int) -> Optional[str]:
    """The status of the run when the worker ``pid`` crashed only after it had passed through Python's exit
    (``rank_<r>.exit``: all its work done) and rank 0 had written this job's summary.json (modified at or after
    ``since``, the launch) with a status of a run that ended by itself; else None. MindSpore 2.10's shutdown of a
    worker (the cluster's finalisation) was seen to die of SIGSEGV there, once in a while, on a busy machine."""
    rank = _rank_of_pid(run_dir, pid)
    if rank is None or not os.path.exists(os.path.join(run_dir, RANK_PID_DIR, f"rank_{rank}.exit")):
        return None
    path = os.path.join(run_dir, "summary.json")
    try:
        if os.stat(path).st_mtime < since:
            return None  # (a previous launch's)
        with open(path, encoding="utf-8") as f:
            status = json.load(f).get("status")
    except (OSError, ValueError, AttributeError):
        return None
    return status if status in _ENDED else None
