"""``DirectActorKernel``: the fused acting kernel (``fused_actor_mlp.cc``) called straight from the host.

Inside MindSpore the kernel is one ``ops.Custom`` node of a compiled graph (:class:`~.actor.FusedActorKernel`), and
on CPU a graph call costs ~0.3-0.5 ms whatever it computes. A rollout with few envs (the MuJoCo presets: one)
makes one acting call per env step, so that dispatch costs more than the kernel's own ~20 us. This class calls the
same compiled function through ``ctypes`` with numpy buffers, in the aot calling convention MindSpore uses
(``int f(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *stream, void *extra)``),
so the arithmetic is the very code the graph runs and the outputs are identical (tested).

The weights are numpy copies: :meth:`sync` re-reads every Parameter the kernel uses (the MLP layers and
``log_std``). The PPO trainer syncs at the start of every rollout, the only place they are read, and weights
change only in the update between rollouts. A non-zero return code raises the same
:class:`~scalebox_ms.errors.CustomOpError` as the graph path.
"""
from __future__ import annotations

import ctypes

import numpy as np

from ...errors import CustomOpError
from .actor import KERNEL, _describe
from .build import KERNELS, library_path
from .status import MESSAGES

_F32, _I32 = b"float32", b"int32"


class DirectActorKernel:
    """``(obs (B, obs_dim) float32, noise (B, action_dim) float32) -> (B, W + 2)`` numpy
    ``[action | log_prob | value]``, as :class:`~.actor.FusedActorKernel` returns it."""

    host_call = True  # (the rollout loop passes numpy arrays, not Tensors)

    def __init__(self, model):
        self.meta, pi, vf = _describe(model)
        self.discrete = bool(model.spec.discrete)
        self.width = 1 if self.discrete else int(model.spec.action_dim)
        self.obs_dim, self.action_dim = int(model.spec.obs_dim), int(model.spec.action_dim)
        self._params = [p for layer in pi + vf for p in (layer.weight, layer.bias)]
        self._log_std = None if self.discrete else model.log_std
        fn = getattr(ctypes.CDLL(library_path(KERNEL)), KERNELS[KERNEL][1])
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_int),
                       ctypes.POINTER(ctypes.POINTER(ctypes.c_int64)), ctypes.POINTER(ctypes.c_char_p),
                       ctypes.c_void_p, ctypes.c_void_p]
        self._fn = fn
        self._calls = {}  # batch size -> the argument arrays (pointers to this batch size's buffers)
        self.sync()

    def sync(self) -> None:
        """Re-read the weights from the model's Parameters."""
        # (copies: on CPU asnumpy() can share the Parameter's memory, which a later assign may replace)
        log_std = (np.zeros(self.action_dim, np.float32) if self._log_std is None
                   else np.array(self._log_std.asnumpy(), np.float32, copy=True))
        self._weights = [log_std] + [np.array(p.asnumpy(), np.float32, order="C", copy=True) for p in self._params]
        self._calls.clear()

    def _arguments(self, batch: int):
        """The kernel's argument arrays for ``batch`` rows, with the obs/noise/out buffers they point to."""
        obs = np.zeros((batch, self.obs_dim), np.float32)
        noise = np.zeros((batch, self.action_dim), np.float32)
        out = np.zeros((batch, self.width + 2), np.float32)
        arrays = [obs, noise, self.meta] + self._weights + [out]  # enum Input order; the output last
        n = len(arrays)
        shapes = [np.asarray(a.shape, np.int64) for a in arrays]
        args = (n, (ctypes.c_void_p * n)(*[a.ctypes.data for a in arrays]),
                (ctypes.c_int * n)(*[a.ndim for a in arrays]),
                (ctypes.POINTER(ctypes.c_int64) * n)(*[s.ctypes.data_as(ctypes.POINTER(ctypes.c_int64))
                                                       for s in shapes]),
                (ctypes.c_char_p * n)(*[_I32 if a is self.meta else _F32 for a in arrays]), None, None)
        return obs, noise, out, args, (arrays, shapes)  # (the last item keeps the buffers alive)

    def __call__(self, obs: np.ndarray, noise: np.ndarray) -> np.ndarray:
        batch = len(obs)
        if np.shape(obs) != (batch, self.obs_dim) or np.shape(noise) != (batch, self.action_dim):
            raise CustomOpError(f"custom op {KERNEL!r}: {MESSAGES[5]}: obs {np.shape(obs)} and noise "
                                f"{np.shape(noise)}, expected (B, {self.obs_dim}) and (B, {self.action_dim})")
        call = self._calls.get(batch)
        if call is None:
            call = self._calls[batch] = self._arguments(batch)
        obs_buf, noise_buf, out, args, _ = call
        obs_buf[...] = obs
        noise_buf[...] = noise
        code = self._fn(*args)
        if code != 0:
            raise CustomOpError(f"custom op {KERNEL!r}: {MESSAGES.get(code, 'unknown error')} (kernel return code "
                                f"{code})")
        return out.copy()
