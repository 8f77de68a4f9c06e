"""``python -m scalebox_ms.train --workers N``: run the same command as N msrun workers on this machine.

The launcher (this process) never imports MindSpore. It

1. picks a free TCP port on 127.0.0.1 and creates ``<run_dir>/msrun/`` for msrun's scheduler and worker logs;
2. runs ``msrun --worker_num=N --local_worker_num=N --master_addr=127.0.0.1 --master_port=P --join=True
   --log_dir=<run_dir>/msrun python -m scalebox_ms.train <the same arguments> --run-dir <run_dir>``; each worker
   writes its pid to ``<run_dir>/msrun/rank_<r>.pid``;
3. when msrun reports a worker that exited abnormally (msrun then kills the other workers; a worker that failed
   before the cluster formed, msrun would wait for until ``timeout``: the launcher stops the job a few seconds
   after msrun's report), names its rank in a one-line error and exits non-zero; a worker's own one-line
   ``error:`` (bad config, bad env id) is repeated with exit code 2 (the CLI then removes a fresh run's directory
   if nothing was trained). A worker killed by a signal in MindSpore's own shutdown, after it passed Python's exit
   and this job's summary.json was written (:func:`_crash_after_the_run`), is a warning and exit code 0: nothing
   of the run is missing. msrun itself killed (``kill -9``, the OOM killer) ends the job the same way: its
   workers, scheduler and log tail are killed (:func:`_watch`).

Ctrl-C, SIGTERM and SIGHUP (:class:`_Signals`): once every rank has its step-0 checkpoint behind it, the first one is
sent on to the ranks, which stop together at the end of an iteration with a checkpoint and summary.json, as a run in
one process does; earlier, or on a second signal, the launcher stops the job at once.

``timeout`` (``parallel.timeout``) bounds msrun's cluster building. A worker killed mid-collective does not hang
the job: the launcher watches the workers' pids, and a worker gone without passing through Python's exit (killed,
a segfault, ``os._exit``: no ``rank_<r>.exit`` marker, which each worker writes at its interpreter's exit) stops the
job within about a second; msrun alone would wait for its scheduler's heartbeat timeout (measured here: ~30 s from
the kill to the exit).

A worker that hangs without dying (an env stuck in ``step``, a deadlock) stops the others at their next collective,
so the whole job stops making progress. Each worker touches its ``rank_<r>.beat`` marker at the end of every
iteration (:func:`~.ranks.beat`); once every live rank has ended its first iteration (start-up and the first graph
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
from typing import List, Optional

from ..errors import Interrupted
from .msrun_output import LAUNCHER_LOG, RANK_PID_DIR, Console, how_it_ended, worker_error
from .ranks import (LOG_DIR_ENV, PORT_TAKEN, STACK_SIGNAL, alive, children, dead_workers, rank_of_pid, rank_pids,
                    stalled_workers, stoppable_ranks)


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


def _dump_stacks(stalled: List[tuple]) -> None:
    for _, pid, _ in stalled:
        try:
            os.kill(pid, STACK_SIGNAL)
        except (ProcessLookupError, PermissionError):
            pass


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
    kids = children(proc.pid)
    try:
        proc.send_signal(2)
    except ProcessLookupError:
        pass
    deadline = time.time() + grace
    while proc.poll() is None and time.time() < deadline:
        time.sleep(0.1)
    _kill_groups([proc.pid] + kids)


def _kill_groups(pids) -> None:
    """SIGKILL the process group of each of ``pids`` that still runs."""
    for pid in pids:
        if alive(pid):
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


def _watch(proc, log_dir: str, found: list, hung: list, hang_timeout: float = 0.0, interval: float = 0.2,
           taken: Optional[list] = None) -> None:
    """Until msrun ends: a worker that died (:func:`dead_workers`) ends the job now; msrun alone would wait for its
    scheduler's heartbeat timeout (~30 s). So does a scheduler that found its port taken (:data:`PORT_TAKEN`, noted
    in ``taken``): its workers would wait for it until msrun's cluster timeout. With ``hang_timeout`` > 0, a job
    whose ranks all stopped making progress (:func:`stalled_workers`) has its stacks printed into the workers' logs,
    then is stopped. msrun itself killed (``kill -9``, the OOM killer): its workers, scheduler and log tail, each in
    a session of its own, are killed too (they trained on unsupervised, and the tail held msrun's output open: the
    launcher waited for ever)."""
    known, scanned = set(), 0.0
    while proc.poll() is None:
        if time.time() - scanned >= 1.0:  # (msrun's children, while it lives: once it is gone, they are init's)
            known.update(children(proc.pid))
            scanned = time.time()
        if taken is not None and os.path.exists(os.path.join(log_dir, PORT_TAKEN)):
            taken.append(True)
            _stop_job(proc)
            return
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
    if proc.returncode < 0:
        with _stopping:
            _kill_groups(sorted(known | set(rank_pids(log_dir).values())))
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, 9)  # (msrun's own group, which it led: its log tail)


def _default_sigint() -> None:
    """In msrun (before exec): Ctrl-C's default action and unblocked, whatever the launcher inherited (a launcher
    started in the background ignores SIGINT, and an ignored signal survives exec): _stop_job's SIGINT must reach
    msrun's own handler. SIGTERM and SIGHUP, blocked in the launcher while it forks msrun, unblocked."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM, signal.SIGHUP})


class _Signals:
    """The launcher's handler of Ctrl-C, SIGTERM and SIGHUP. The first one, once every rank can stop by itself
    (:func:`~.ranks.stoppable_ranks`), is sent on to the ranks: they stop together at the end of the iteration, rank 0
    writes a checkpoint and summary.json (``"status": "interrupted"``), and the job ends by itself. Before that (the
    ranks still start up), or a second time, the job is stopped at once (:class:`Interrupted`; the CLI exits
    128 + signum; ``--resume`` continues from the latest checkpoint)."""

    def __init__(self, log_dir: str, workers: int, stream):
        self.log_dir, self.workers, self.stream = log_dir, workers, stream
        self.forwarded: Optional[int] = None
        self.stopped: Optional[int] = None  # the signal that stopped the job at once

    def __call__(self, signum, frame):
        pids = None if self.forwarded is not None else stoppable_ranks(self.log_dir, self.workers)
        if pids is None:
            self.stopped = signum
            raise Interrupted(signum)
        self.forwarded = signum
        for pid in pids.values():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signum)
        with contextlib.suppress(OSError, ValueError):
            self.stream.write(f"\n{signal.Signals(signum).name}: the {self.workers} ranks stop together at the end "
                              "of this iteration (checkpoint + summary); send it again to stop the job at once\n")
            self.stream.flush()


def _stopping_signals() -> List[int]:
    """The signals that stop the job (:class:`_Signals`): SIGINT (Ctrl-C), SIGTERM, and SIGHUP unless it is ignored
    (``nohup``)."""
    hup = [] if signal.getsignal(signal.SIGHUP) == signal.SIG_IGN else [signal.SIGHUP]
    return [signal.SIGINT, signal.SIGTERM] + hup


# MindSpore's cluster heartbeat interval, drawn between these bounds in whole seconds (its defaults: 3 and 5): each
# rank's exit waits out the heartbeat loop's sleep, so a local job ended 3-5 s after its last step. 1 s heartbeats
# are one small message per rank and second to a scheduler on the same machine (throughput not measured separately);
# the node timeout (MS_NODE_TIMEOUT, 30 s) is unchanged. (0 is not an option: the heartbeat loop would spin.) If the
# environment sets either bound (non-empty), neither is touched: one of ours could undercut the user's other one.
HEARTBEAT_INTERVAL = {"MS_RETRY_INTERVAL_LOWER": "1", "MS_RETRY_INTERVAL_UPPER": "1"}


def msrun_command(workers: int, port: int, log_dir: str, timeout: float, command: List[str]) -> List[str]:
    """msrun's command line for a job of ``workers`` local ranks running ``command`` (and its scheduler, which runs
    it too), scheduled on 127.0.0.1:``port``, logs in ``log_dir``, giving up on a cluster not formed in ``timeout``
    seconds; msrun's own tail of the workers' logs is off (the caller reads them)."""
    return [msrun_executable(), f"--worker_num={workers}", f"--local_worker_num={workers}", "--master_addr=127.0.0.1",
            f"--master_port={port}", "--join=True", f"--log_dir={log_dir}",
            f"--cluster_time_out={int(max(1, timeout))}", "--tail_worker_log=0", *command]


def msrun_env(environ) -> dict:
    """The environment of the msrun job: ``environ``, this interpreter first on PATH (msrun starts ``python``),
    MindSpore's logging at errors only (``GLOG_v=3``) and :data:`HEARTBEAT_INTERVAL` unless ``environ`` sets them."""
    env = dict(environ)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env.setdefault("GLOG_v", "3")
    if not any(env.get(key) for key in HEARTBEAT_INTERVAL):  # (empty is unset for MindSpore too)
        env.update(HEARTBEAT_INTERVAL)
    return env


#: launches of one job whose scheduler found its port taken by another process (each on a new free port)
PORT_TRIES = 3
_PORT_TAKEN = -1  # (_launch_once's result then: not an exit code)


def launch(worker_args: List[str], workers: int, run_dir: str, timeout: float,
           stream=sys.stderr, hang_timeout: float = 0.0) -> int:
    """Run ``python -m scalebox_ms.train <worker_args>`` as ``workers`` msrun ranks; returns the exit code. Where
    another process takes the scheduler's port between :func:`free_port` and the scheduler's bind, the job is stopped
    at once (its workers would wait out ``timeout`` for the scheduler) and launched again on a new port."""
    ports = []
    for attempt in range(PORT_TRIES):
        if attempt:
            stream.write(f"port {ports[-1]} was taken by another process before msrun's scheduler could listen on "
                         "it; launching again on another port\n")
        ports.append(free_port())
        code = _launch_once(worker_args, workers, run_dir, timeout, stream, hang_timeout, ports[-1])
        if code != _PORT_TAKEN:
            return code
    sys.stderr.write(f"error: data-parallel job did not start: on each of {PORT_TRIES} tries another process took the "
                     f"scheduler's port ({', '.join(map(str, ports))}) before it could listen on it\n")
    return 1


def _clear_previous_launch(log_dir: str) -> None:
    """Remove a previous launch's logs and markers (a resumed run's, or a try whose port was taken): a stale
    ``rank_<r>.stoppable`` made the new ranks look stoppable as soon as they wrote their pids, before they could stop
    by themselves."""
    os.makedirs(log_dir, exist_ok=True)
    for pattern in ("rank_*.pid", "rank_*.alive", "rank_*.beat", "rank_*.exit", "rank_*.stoppable", "worker_*.log",
                    "scheduler.log", PORT_TAKEN, LAUNCHER_LOG):
        for stale in glob.glob(os.path.join(log_dir, pattern)):
            os.unlink(stale)


def _launch_once(worker_args: List[str], workers: int, run_dir: str, timeout: float, stream, hang_timeout: float,
                 port: int) -> int:
    log_dir = os.path.join(run_dir, RANK_PID_DIR)
    _clear_previous_launch(log_dir)
    cmd = msrun_command(workers, port, log_dir, timeout, ["python", "-m", "scalebox_ms.train", *worker_args])
    env = {**msrun_env(os.environ), LOG_DIR_ENV: log_dir}  # (for the scheduler's report_port_taken)
    t0 = time.time()
    main = threading.current_thread() is threading.main_thread()
    proc = None
    console = Console(os.path.join(log_dir, LAUNCHER_LOG))
    dead_pid = dead_code = None
    died: list = []  # (filled by the watcher thread)
    hung: list = []  # (rank, pid, seconds silent) of a job stopped as hung (filled by the watcher thread)
    taken: list = []  # (not empty: the scheduler found its port taken; filled by the watcher thread)
    ended_open = [False]  # what was shown last does not end its line

    def shown(lines) -> None:
        for text in lines:
            stream.write(text)
            ended_open[0] = not text.endswith("\n") if text else ended_open[0]

    # (before the first line the user sees, and before msrun exists: a signal then stops the launch cleanly)
    signals = _Signals(log_dir, workers, stream)
    old = {s: signal.signal(s, signals) for s in _stopping_signals()} if main else {}
    try:
        stream.write(f"launching {workers} msrun workers on 127.0.0.1:{port}; logs in {log_dir}\n")
        stream.flush()
        # (a signal's handler run in the fork's after-fork hooks raised into them, and its exception was lost: the
        # job ran on; blocked, it comes once msrun has started, and stops it)
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, old) if main else None
        try:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True,
                                    errors="replace", start_new_session=True, preexec_fn=_default_sigint)
        finally:
            if main:
                signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        if signals.stopped is not None:  # (Ctrl-C, routed by a thread of ours, may still come in those hooks)
            raise Interrupted(signals.stopped)
        threading.Thread(target=_watch, args=(proc, log_dir, died, hung, hang_timeout), kwargs={"taken": taken},
                         daemon=True).start()
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
    except BaseException:  # a signal (_Signals: exit 130 / 143 / 129), or a broken stderr pipe: no job is left
        if main:           # running without its launcher (a second signal must not cut it short)
            for s in old:
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
    if taken:
        return _PORT_TAKEN
    if rc == 0 and not died and not hung and dead_pid is None:  # (msrun stopped by us after an exception: rc 0)
        stream.writelines(console.held)
        return 0
    message = None if hung else worker_error(run_dir)
    if not hung and message is None and dead_pid is not None and dead_code is not None and dead_code < 0:
        ended = _crash_after_the_run(run_dir, t0, dead_pid)
        if ended is not None:  # (MindSpore's shutdown, after rank 0 wrote the run's summary: nothing is lost)
            rank = rank_of_pid(run_dir, dead_pid)
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
    elif message is None and rc < 0 and not died and dead_pid is None:
        message = (f"data-parallel job failed after {time.time() - t0:.0f} s: msrun (pid {proc.pid}) "
                   f"{how_it_ended(rc)}; the launcher stopped its workers and scheduler (logs: {log_dir})")
    elif message is None:
        # msrun's report names the first it saw (it then kills the others); else every worker found dead
        pids = [dead_pid] if dead_pid is not None else died
        who = " and ".join(f"rank {r} (pid {p})" if r is not None else f"pid {p}"
                           for p, r in ((p, rank_of_pid(run_dir, p)) for p in pids)) or "a worker"
        stopper = "the launcher" if died else "msrun"
        message = (f"data-parallel job failed after {time.time() - t0:.0f} s: {who} {how_it_ended(dead_code)}, "
                   f"{stopper} stopped the other workers (logs: {log_dir})")
    sys.stderr.write(f"error: {message}\n")
    return code


#: summary.json statuses of a run that ended by itself (an interrupted one was stopped by a signal)
_ENDED = ("completed", "solved", "paused")


def _crash_after_the_run(run_dir: str, since: float, pid: int) -> Optional[str]:
    """The status of the run when the worker ``pid`` crashed only after it had passed through Python's exit
    (``rank_<r>.exit``: all its work done) and rank 0 had written this job's summary.json (modified at or after
    ``since``, the launch) with a status of a run that ended by itself; else None. MindSpore 2.10's shutdown of a
    worker (the cluster's finalisation) was seen to die of SIGSEGV there, once in a while, on a busy machine."""
    rank = rank_of_pid(run_dir, pid)
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
