"""Sandbox: the one place that sets MindSpore's process-global state.

``Sandbox(device, seed, threads, deterministic)`` chooses the backend, the CPU thread count, determinism and
the seeds of Python, numpy and MindSpore. Trainers take a Sandbox (or build one from ``config.sandbox``);
nothing else in scalebox_ms calls ``mindspore.set_context``/``set_seed``.

Backends: ``cpu`` runs everywhere. ``gpu`` and ``ascend`` are accepted only when the installed MindSpore
build reports the device as available (``mindspore.hal.is_available``); otherwise construction fails with a
clear error rather than silently running on CPU. ``auto`` picks Ascend, then GPU, then CPU, and says which in
``Sandbox.device``.

Memory limits and process isolation are not implemented yet (see the Sandbox issue); MindSpore ignores its
own memory settings on CPU anyway.
"""
from __future__ import annotations

import os
import random
from typing import Optional

import numpy as np

from .errors import ConfigError

# Must be set before MindSpore starts its runtime: without host-blocking runs, compiled steps on a
# few-core CPU thrash threads (DESIGN.md: ~7,500 -> ~100 context switches per step, 5x faster updates).
os.environ.setdefault("MS_DEV_HOST_BLOCKING_RUN", "1")
os.environ.setdefault("GLOG_v", "3")  # MindSpore C++ log level: errors only

_BACKENDS = {"cpu": "CPU", "gpu": "GPU", "ascend": "Ascend"}
_active: Optional[dict] = None  # settings of the Sandbox that configured this process


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
    """

    def __init__(self, device: str = "auto", seed: int = 0, threads: int = 0, deterministic: bool = True):
        global _active
        import mindspore as ms

        device = str(device).lower()
        if device not in ("auto",) + tuple(_BACKENDS):
            raise ConfigError(f"sandbox.device: {device!r} is not one of auto, cpu, gpu, ascend")
        if device == "auto":
            target = next(t for t in ("Ascend", "GPU", "CPU") if t == "CPU" or _available(t))
        else:
            target = _BACKENDS[device]
            if not _available(target):
                raise ConfigError(
                    f"sandbox.device: {device!r} is not available in this MindSpore build/machine; use 'cpu' or 'auto'")
        settings = {"device": target, "threads": int(threads), "deterministic": bool(deterministic)}
        if _active is not None and _active != settings:
            raise ConfigError(
                f"sandbox: this process is already configured as {_active}; a Sandbox with {settings} conflicts "
                "(MindSpore's device settings are process-global)")
        if _active is None:
            ms.set_context(device_target=target)
            if threads > 0 and target == "CPU":
                ms.device_context.cpu.op_tuning.threads_num(int(threads))
            if deterministic:
                ms.set_context(deterministic="ON")
            _active = settings
        self.device = target
        self.threads = int(threads)
        self.deterministic = bool(deterministic)
        self.seed = int(seed)
        self.reseed(self.seed)

    def reseed(self, seed: int) -> None:
        import mindspore as ms

        random.seed(seed)
        np.random.seed(seed % 2**32)
        ms.set_seed(seed)

    @classmethod
    def from_config(cls, sandbox_cfg, seed: int) -> "Sandbox":
        return cls(device=sandbox_cfg.device, seed=seed, threads=sandbox_cfg.threads,
                   deterministic=sandbox_cfg.deterministic)

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc) -> None:
        return None

    def __repr__(self) -> str:
        return (f"Sandbox(device={self.device!r}, seed={self.seed}, threads={self.threads}, "
                f"deterministic={self.deterministic})")
