"""An exclusive lock on a run directory: one train process (or one data-parallel launch) writes a run at a time.

The lock is ``<run_dir>/train.lock``, held with ``fcntl.flock`` and holding the holder's pid. The kernel drops a
flock when its process dies, so a lock file left by a killed process is simply taken over. Under a data-parallel
launch the launching process holds the lock and tells its msrun ranks so through :data:`HELD_ENV`; under a
user's own msrun command line rank 0 takes it.
"""
from __future__ import annotations

import fcntl
import os
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
