"""Sandbox: the one place that sets MindSpore's process-global state.

``Sandbox(device, seed, threads, deterministic)`` chooses the backend, the CPU thread count, determinism and
the seeds of Python, numpy and MindSpore. Trainers take a Sandbox (or build one from ``config.sandbox``);
nothing else in scalebox_ms calls ``mindspore.set_context``/``set_seed``.

Backends: ``cpu`` runs everywhere. ``gpu`` and ``ascend`` are accepted only when the installed MindSpore
build reports the device as available (``mindspore.hal.is_available``); otherwise construction fails with a
clear error rather than silently running on CPU. ``auto`` picks Ascend, then GPU, then CPU, and says which in
``Sandbox.device``.

Memory: on GPU/Ascend ``memory_limit`` caps MindSpore's device memory (``mindspore.runtime.set_memory``). On
CPU MindSpore ignores memory settings, so the Sandbox watches this process's resident memory
(:meth:`check_memory`, called by the trainer every iteration: exceeding the limit stops training with an error
after the last checkpoint) and, with isolation, puts an address-space limit (``RLIMIT_AS``) on env workers.

Isolation (a trainer's envs follow its config's ``sandbox`` section; a Sandbox given to it must not say otherwise,
:meth:`Sandbox.check_env_isolation`): ``'none'`` runs envs in this process; ``'process'`` runs each env in a worker
process (:class:`scalebox_ms.envs.isolated.IsolatedVectorEnv`): a crashed or hung worker is restarted, its episode
marked truncated and the event logged; ``'strict'`` adds ``worker_memory_limit`` per worker and forces
deterministic kernels. Workers are spawned (fresh interpreters inheriting no file descriptors but their pipe).
Every run directory records package versions and the config hash (``environment.json``).
"""
from __future__ import annotations

import os
import random
from typing import Optional

import numpy as np

from .errors import ConfigError, ScaleboxError, first_line

# Must be set before MindSpore starts its runtime: without host-blocking runs, compiled steps on a
# few-core CPU thrash threads (many more context switches per step and much slower updates).
os.environ.setdefault("MS_DEV_HOST_BLOCKING_RUN", "1")
os.environ.setdefault("GLOG_v", "3")  # MindSpore C++ log level: errors only

_BACKENDS = {"cpu": "CPU", "gpu": "GPU", "ascend": "Ascend"}
_active: Optional[dict] = None  # settings of the Sandbox that configured this process


def current_rss_bytes() -> int:
    """Resident set size of this process now (Linux /proc; falls back to the peak)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):  # pragma: no cover - non-Linux
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def peak_rss_bytes() -> int:
    """Peak resident set size of this process (Linux: ``VmHWM`` of /proc/self/status).

    Not ``getrusage``'s ``ru_maxrss``: Linux carries that over ``exec`` from the parent, so a run started by a large
    process (a test runner, a notebook, a benchmark driver) would report its parent's peak as its own."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):  # pragma: no cover - non-Linux
        pass
    import resource  # pragma: no cover - no /proc: the best there is

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # pragma: no cover


def _usable_cpus() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover - non-Linux
        return max(1, os.cpu_count() or 1)


def _available(target: str) -> bool:
    import mindspore as ms

    if target == "CPU":
        return True
    try:
        return bool(ms.hal.is_available(target))
    except Exception:  # pragma: no cover - depends on the MindSpore build
        return False


class Sandbox:
    """Configure MindSpore for this process; usable as a context manager.

    Args:
        device: 'auto' | 'cpu' | 'gpu' | 'ascend'.
        seed: seeds Python's ``random``, numpy's global RNG and ``mindspore.set_seed``.
        threads: CPU kernel threads (0: MindSpore's default).
        deterministic: request deterministic kernels where the backend offers them.
        memory_limit, isolation_level, device_id, worker_memory_limit, step_timeout: as in the ``sandbox:``
            config section; every argument is checked by the config's own checks (a bad one raises
            :class:`ConfigError` naming ``sandbox.<key>`` or ``run.seed``).
    """

    def __init__(self, device: str = "auto", seed: int = 0, threads: int = 0, deterministic: bool = True,
                 memory_limit: Optional[str] = None, isolation_level: str = "none", device_id: int = 0,
                 worker_memory_limit: Optional[str] = "2GB", step_timeout: float = 10.0):
        global _active
        from .config import checked_section, parse_bytes

        # the sandbox: section's own checks (scalebox_ms.config), so direct construction is refused the same way
        cfg = checked_section("sandbox", device=device.lower() if isinstance(device, str) else device,
                              threads=threads, deterministic=deterministic, memory_limit=memory_limit,
                              isolation_level=isolation_level, device_id=device_id,
                              worker_memory_limit=worker_memory_limit, step_timeout=step_timeout)
        seed = checked_section("run", seed=seed).seed
        device, threads, device_id, isolation_level = cfg.device, cfg.threads, cfg.device_id, cfg.isolation_level
        self.isolation_level = isolation_level
        self._section = cfg  # (its env isolation settings: check_env_isolation)
        self.memory_limit_bytes = parse_bytes(cfg.memory_limit, "sandbox.memory_limit")
        self.worker_memory_limit_bytes = (parse_bytes(cfg.worker_memory_limit, "sandbox.worker_memory_limit")
                                          if isolation_level == "strict" else None)
        self.step_timeout = cfg.step_timeout
        deterministic = cfg.deterministic or isolation_level == "strict"
        import mindspore as ms

        if device == "auto":
            target = next(t for t in ("Ascend", "GPU", "CPU") if t == "CPU" or _available(t))
        else:
            target = _BACKENDS[device]
            if not _available(target):
                raise ConfigError(
                    f"sandbox.device: {device!r} is not available in this MindSpore build/machine; use 'cpu' or 'auto'")
        # the settings MindSpore keeps per process (on CPU, device_id is unused and memory_limit is this Sandbox's
        # own check of rollout sizes: Sandboxes may differ there)
        settings = {"device": target, "threads": threads, "deterministic": deterministic,
                    **({} if target == "CPU" else {"device_id": device_id, "memory_limit": self.memory_limit_bytes})}
        if _active is not None and _active != settings:
            raise ConfigError(
                f"sandbox: this process is already configured as {_active}; a Sandbox with {settings} conflicts "
                "(MindSpore's device settings are process-global: pass the first trainer's sandbox=, or the same "
                "sandbox settings)")
        if _active is None:
            ms.set_context(device_target=target)
            if threads > 0 and target == "CPU":
                try:
                    ms.device_context.cpu.op_tuning.threads_num(threads)
                except RuntimeError as exc:  # (set already in this process, by the user's own code)
                    raise ConfigError(f"sandbox.threads: {threads}: MindSpore's CPU thread count was set before in "
                                      f"this process and cannot be set again ({first_line(exc)}); set "
                                      "sandbox.threads: 0 to keep it") from None
            # threads of the C++ update kernel (scalebox_ms.ops.custom) unless the user set them: this sandbox's
            # thread count, else the CPUs this process may run on (affinity / container limits, not all cores)
            os.environ.setdefault("SCALEBOX_MS_KERNEL_THREADS", str(threads if threads > 0 else _usable_cpus()))
            if deterministic:
                ms.set_context(deterministic="ON")
            if target != "CPU":
                ms.set_context(device_id=device_id)
                if self.memory_limit_bytes:
                    ms.runtime.set_memory(max_size=f"{self.memory_limit_bytes / 2**30:.3f}GB")
            _active = settings
        self.device = target
        self.threads = threads
        self.deterministic = deterministic
        self.seed = seed
        self.reseed(self.seed)

    def reseed(self, seed: int) -> None:
        """Seed Python's, numpy's and MindSpore's global generators with ``seed`` (also what ``seed`` then says)."""
        import mindspore as ms

        self.seed = seed
        random.seed(seed)
        np.random.seed(seed % 2**32)
        ms.set_seed(seed)

    def check_memory(self) -> None:
        """On CPU, raise :class:`ScaleboxError` when this process's resident memory exceeds ``memory_limit``."""
        if self.memory_limit_bytes is None or self.device != "CPU":
            return
        rss = current_rss_bytes()
        if rss > self.memory_limit_bytes:
            raise ScaleboxError(f"sandbox.memory_limit: this process uses {rss / 2**20:.0f} MB, more than the limit "
                                f"of {self.memory_limit_bytes / 2**20:.0f} MB; stopped")

    def check_env_isolation(self, sandbox_cfg) -> None:
        """A trainer's envs are isolated as its config says (``sandbox_cfg``: its ``sandbox`` section, which its
        checkpoints record). Each of this Sandbox's isolation settings that is not the default, and matters (the
        step timeout under isolation, the worker memory limit under 'strict'), must be the config's: a
        ``Sandbox(isolation_level="process")`` isolated the envs of a config that said ``none``, and its checkpoints
        said ``none``; with a native env, whose config refuses isolation, it was dropped silently. 'strict' in the
        config needs this Sandbox's deterministic kernels, which a Sandbox built as 'strict' forces."""
        from .config import SandboxConfig, parse_bytes

        def value(section, key):
            v = getattr(section, key)
            if key == "worker_memory_limit" and v is not None:
                return parse_bytes(v, "sandbox.worker_memory_limit")
            return float(v) if key == "step_timeout" else v

        mine, default = self._section, SandboxConfig()
        levels = {mine.isolation_level, sandbox_cfg.isolation_level}
        keys = (["isolation_level"] + (["step_timeout"] if levels != {"none"} else [])
                + (["worker_memory_limit"] if "strict" in levels else []))
        keys = [k for k in keys if value(mine, k) != value(default, k) and value(mine, k) != value(sandbox_cfg, k)]
        if keys:
            ours = ", ".join(f"{k}={getattr(mine, k)!r}" for k in keys)
            theirs = ", ".join(f"{k}={getattr(sandbox_cfg, k)!r}" for k in keys)
            raise ConfigError(f"sandbox: this Sandbox has {ours}, the config's sandbox section {theirs}: the envs are "
                              "isolated as the config says (its checkpoints record it); set the config's sandbox keys, "
                              "or build the Sandbox from them (Sandbox.from_config(config.sandbox, seed))")
        if sandbox_cfg.isolation_level == "strict" and not self.deterministic:
            raise ConfigError("sandbox: the config's sandbox.isolation_level 'strict' needs deterministic kernels, and "
                              "this Sandbox has deterministic=False; build it with deterministic=True (or as 'strict')")

    @classmethod
    def from_config(cls, sandbox_cfg, seed: int) -> "Sandbox":
        return cls(device=sandbox_cfg.device, seed=seed, threads=sandbox_cfg.threads,
                   deterministic=sandbox_cfg.deterministic, memory_limit=sandbox_cfg.memory_limit,
                   isolation_level=sandbox_cfg.isolation_level, device_id=sandbox_cfg.device_id,
                   worker_memory_limit=sandbox_cfg.worker_memory_limit, step_timeout=sandbox_cfg.step_timeout)

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc) -> None:
        return None

    def __repr__(self) -> str:
        return (f"Sandbox(device={self.device!r}, seed={self.seed}, threads={self.threads}, "
                f"deterministic={self.deterministic}, isolation_level={self.isolation_level!r}, "
                f"memory_limit={self.memory_limit_bytes})")


def env_isolation(sandbox) -> dict:
    """``make_vec_env``'s isolation arguments (``isolation``, ``step_timeout``, ``worker_memory_limit`` in bytes) of a
    config's ``sandbox`` section."""
    from .config import parse_bytes

    strict = sandbox.isolation_level == "strict"
    return {"isolation": sandbox.isolation_level, "step_timeout": float(sandbox.step_timeout),
            "worker_memory_limit": (parse_bytes(sandbox.worker_memory_limit, "sandbox.worker_memory_limit")
                                    if strict else None)}
