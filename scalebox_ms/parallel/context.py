"""Rank detection, collective-backend initialisation and host-side collectives."""
from __future__ import annotations

import os
import time
from typing import Optional

import numpy as np

from ..errors import ConfigError

_BACKENDS = {"CPU": "mccl", "GPU": "nccl", "Ascend": "hccl"}
_current: Optional["DistContext"] = None


def in_msrun() -> bool:
    """True inside a worker process started by msrun (MindSpore's dynamic-cluster environment)."""
    return os.environ.get("MS_ROLE") == "MS_WORKER" and int(os.environ.get("MS_WORKER_NUM", "1") or 1) > 0


def is_msrun_scheduler() -> bool:
    """True in msrun's scheduler process, which runs the same command line as the workers."""
    return os.environ.get("MS_ROLE") == "MS_SCHED"


def serve_as_scheduler() -> None:
    """msrun's scheduler role: join the cluster as its scheduler; MindSpore keeps the process until the job ends."""
    os.environ.setdefault("GLOG_v", "3")
    from mindspore.communication import init

    from .ranks import report_port_taken

    # (checked after MindSpore's import, right before its bind: another process took the port since the launcher
    # found it free; the launcher then starts the job again on another)
    if report_port_taken():
        raise SystemExit(1)
    init()


def local_rank(environ=None) -> int:
    """This worker's rank on its node: LOCAL_RANK where a launcher sets it, else msrun's DEVICE_ID (its local
    rank), else RANK_ID (the global rank, = the local one on a single node), else 0."""
    environ = os.environ if environ is None else environ
    for key in ("LOCAL_RANK", "DEVICE_ID", "RANK_ID"):
        value = environ.get(key)
        if value is not None and value.strip().isdigit():
            return int(value)
    return 0


def msrun_world_size() -> int:
    return int(os.environ.get("MS_WORKER_NUM", "1") or 1) if in_msrun() else 1


def backend_for_device(device: str) -> str:
    """The collective library MindSpore uses on ``device`` ('CPU' -> mccl, 'GPU' -> nccl, 'Ascend' -> hccl)."""
    try:
        return _BACKENDS[device]
    except KeyError:
        raise ConfigError(f"sandbox.device: no collective backend for {device!r}") from None


class DistContext:
    """This process's place in a data-parallel job (rank 0 of 1 when not distributed)."""

    def __init__(self, rank: int = 0, world_size: int = 1, backend: Optional[str] = None):
        self.rank, self.world_size, self.backend = int(rank), int(world_size), backend
        self._cells = {}

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def __repr__(self) -> str:
        return f"DistContext(rank={self.rank}, world_size={self.world_size}, backend={self.backend!r})"

    # -- host-side collectives (small vectors; compiled once per length) -------------------------------
    def all_gather(self, vec: np.ndarray) -> np.ndarray:
        """(world_size, n) float32: every rank's ``vec`` (1-D float32), in rank order, on every rank."""
        vec = np.ascontiguousarray(vec, np.float32).reshape(-1)
        if not self.distributed:
            return vec[None]
        import mindspore as ms

        cell = self._cell("gather", vec.shape[0])
        return cell(ms.Tensor(vec)).asnumpy().reshape(self.world_size, -1)

    def all_reduce_sum(self, vec: np.ndarray) -> np.ndarray:
        vec = np.ascontiguousarray(vec, np.float32).reshape(-1)
        if not self.distributed:
            return vec
        import mindspore as ms

        return self._cell("sum", vec.shape[0])(ms.Tensor(vec)).asnumpy()

    def barrier(self) -> None:
        self.all_reduce_sum(np.zeros(1, np.float32))

    def time_collectives(self, sizes) -> float:
        """Seconds one call of all-reduces of these float32 sizes takes now (the update step's pattern)."""
        if not self.distributed:
            return 0.0
        import mindspore as ms

        key = tuple(int(s) for s in sizes)
        if ("probe", key) not in self._cells:
            inputs = [ms.Tensor(np.zeros(s, np.float32)) for s in key]
            cell = _cell_classes()[1]()
            cell(*inputs).asnumpy()  # compile outside the timing
            self._cells[("probe", key)] = (cell, inputs)
        cell, inputs = self._cells[("probe", key)]
        t0 = time.perf_counter()
        cell(*inputs).asnumpy()
        return time.perf_counter() - t0

    def _cell(self, kind: str, n: int):
        key = (kind, n)
        if key not in self._cells:
            from mindspore import ops

            self._cells[key] = _cell_classes()[0](ops.AllGather() if kind == "gather" else ops.AllReduce())
        return self._cells[key]


_CELL_CLASSES = None


def _cell_classes():
    """(OneOp, Probe) Cell classes, defined once MindSpore is imported (this module does not import it eagerly)."""
    global _CELL_CLASSES
    if _CELL_CLASSES is None:
        import mindspore as ms
        from mindspore import nn, ops

        class OneOp(nn.Cell):
            """One compiled collective on one Tensor."""

            def __init__(self, op):
                super().__init__()
                self.op = op

            @ms.jit
            def construct(self, x):
                return self.op(x)

        class Probe(nn.Cell):
            """The update step's all-reduces, on Tensors of the same sizes, in one graph."""

            def __init__(self):
                super().__init__()
                self.op = ops.AllReduce()

            @ms.jit
            def construct(self, *xs):
                acc = self.op(xs[0])[0]
                for x in xs[1:]:
                    acc = acc + self.op(x)[0]
                return acc

        _CELL_CLASSES = (OneOp, Probe)
    return _CELL_CLASSES


def current() -> DistContext:
    """The process's DistContext (rank 0 of 1 until :func:`init_distributed` ran)."""
    return _current if _current is not None else DistContext()


def init_distributed(device: str) -> DistContext:
    """Inside an msrun worker: initialise the device's collective backend once; returns the context."""
    global _current
    if _current is not None:
        return _current
    if not in_msrun():
        _current = DistContext()
        return _current
    from mindspore.communication import get_group_size, get_rank, init

    backend = backend_for_device(device)
    init(backend)
    _current = DistContext(get_rank(), get_group_size(), backend)
    return _current


def moments_reducer(dist: DistContext):
    """A ``RunningMeanStd.reduce`` function: every rank's batch moments, all-gathered and combined in rank order."""
    from ..envs.normalize import combine_moments

    def reduce(batch: np.ndarray):
        n = batch.shape[0]
        shape = batch.shape[1:]
        size = int(np.prod(shape)) if shape else 1
        flat = batch.reshape(n, size)
        mean = flat.mean(axis=0) if n else np.zeros(size)
        var = flat.var(axis=0) if n else np.zeros(size)
        rows = dist.all_gather(np.concatenate([[n], mean, var]).astype(np.float32))
        m, v, c = combine_moments([(r[1:1 + size], r[1 + size:], float(r[0])) for r in rows])
        if m is None:
            return np.zeros(shape), np.ones(shape), 0.0
        return m.reshape(shape), v.reshape(shape), c

    return reduce
