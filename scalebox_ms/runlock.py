"""An exclusive lock on a run directory: one train process (or one data-parallel launch) writes a run at a time.

The lock is ``<run_dir>/train.lock``, held with ``fcntl.flock`` and holding the holder's pid. The kernel drops a
flock when its process dies, so a lock file left by a killed process is simply taken over. Under a data-parallel
launch the launching process holds the lock and tells its msrun ranks so through :data:`HELD_ENV`, and each rank
watches that lock (:func:`watch_launcher`): a launcher killed without stopping its job (SIGKILL, the OOM killer)
frees it, and the ranks then stop rather than train on unlocked. Under a user's own msrun command line rank 0 takes
the lock.
"""
from __future__ import annotations

import fcntl
import os
import signal
import sys
import threading
import time
from typing import Optional

from .errors import ConfigError

LOCK_NAME = "train.lock"
HELD_ENV = "SCALEBOX_MS_RUN_LOCK_HELD"  # set to the run directory by the launcher that holds its lock


class RunLock:
    """``RunLock(run_dir).acquire()`` or raise a one-line :class:`ConfigError` naming the holder's pid."""

    def __init__(self, run_dir: str):
        self.run_dir = run_dir
        self.path = os.path.join(run_dir, LOCK_NAME)
        self._fd: Optional[int] = None

    def acquire(self) -> "RunLock":
        while True:
            try:  # (O_NOFOLLOW: a train.lock that is a symlink must not get another file truncated and written)
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
            except OSError as exc:
                if os.path.islink(self.path):
                    raise ConfigError(f"{self.path}: is a symbolic link, not a lock file of scalebox_ms; remove it")
                raise
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_pid(fd)
                for _ in range(20):  # the holder writes its pid just after locking: give it a moment
                    if holder:
                        break
                    time.sleep(0.01)
                    holder = _read_pid(fd)
                os.close(fd)
                raise ConfigError(f"run directory {self.run_dir} is in use by another train process"
                                  + (f" (pid {holder})" if holder else "") + f"; its lock is {self.path}") from None
            try:  # the holder before us may have removed the file after we opened it: lock the current one
                same = os.path.samestat(os.fstat(fd), os.stat(self.path))
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            os.unlink(self.path)  # while still locked: a waiter re-checks the inode (see acquire)
        except OSError:
            pass
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _read_pid(fd: int) -> Optional[int]:
    try:
        return int(os.pread(fd, 32, 0).decode().strip())
    except (OSError, ValueError):
        return None


def in_use(run_dir: str) -> bool:
    """Whether a fresh run may not go into ``run_dir``: it exists and holds more than a data-parallel launch's log
    directory (``msrun/``), a lock file, or temporaries of a process killed before it wrote anything."""
    if not os.path.exists(run_dir):
        return False
    if not os.path.isdir(run_dir):
        return True
    return any(name not in ("msrun", LOCK_NAME) and not name.startswith(".tmp-") for name in os.listdir(run_dir))


def held_by_launcher(run_dir: str) -> bool:
    """True in an msrun rank whose launching process already holds ``run_dir``'s lock."""
    held = os.environ.get(HELD_ENV)
    return held is not None and os.path.realpath(held) == os.path.realpath(run_dir)


def watch_launcher(run_dir: str, interval: float = 0.5) -> bool:
    """In an msrun rank whose launcher holds ``run_dir``'s lock (:func:`held_by_launcher`): start a daemon thread
    that stops the job once the launcher is gone while the rank still runs: its lock is free, or its pid (which it
    wrote into the lock file) no longer runs, for a new ``train`` may have taken the lock at once. The launcher then
    died without stopping its job (it stops it on Ctrl-C, SIGTERM and SIGHUP; SIGKILL or the OOM killer leave msrun
    and the ranks running in sessions of their own), and the ranks must not go on writing a directory no one holds.
    The thread asks msrun to stop the job (its SIGINT path kills every worker and its scheduler) and kills its own
    process, as msrun's stop would; the run continues from its last checkpoint with ``--resume``. Returns whether it
    watches."""
    if not held_by_launcher(run_dir):
        return False
    path = os.path.join(run_dir, LOCK_NAME)
    try:  # (the launcher's lock file: it unlinks it only after msrun, and so this rank, has ended)
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        fd = None  # already gone: so is the launcher
    launcher = None if fd is None else _read_pid(fd)

    def gone() -> bool:
        if fd is None or (launcher is not None and not _running(launcher)):
            return True
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return True  # (free: the launcher is gone)
        except BlockingIOError:
            return False

    def watch():
        while not gone():
            time.sleep(interval)
        sys.stderr.write(f"error: the data-parallel launcher (pid {launcher}) is gone without having stopped this job "
                         f"(its lock {path} is no longer held by it): rank {os.environ.get('RANK_ID', '?')} (pid "
                         f"{os.getpid()}) stops; continue the run with --resume\n")
        sys.stderr.flush()
        parent = os.getppid()
        if _is_msrun(parent):
            try:
                os.kill(parent, signal.SIGINT)
            except OSError:
                pass
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="scalebox_ms-launcher-watch", daemon=True).start()
    return True


def _running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped by its parent, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return True


def _is_msrun(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return pid > 1 and b"msrun" in f.read()
    except OSError:
        return False
