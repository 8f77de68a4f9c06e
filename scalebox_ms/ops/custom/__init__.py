"""Custom C++ operators registered with ``ops.Custom(func_type="aot")`` (CPU), compiled on first use.

``FusedActorKernel(model)``: the acting call of an MLP actor-critic (policy MLP, action head, sampling from
given noise, log-probability, value MLP) as one kernel; inference only. Used by
``ActStep(model, kernel='custom')`` and by ``policy.act_kernel: custom|auto``.

Build and cache (:mod:`.build`): the ``.cc`` sources next to this file are compiled with ``$CXX`` (default
``g++``) into ``$SCALEBOX_MS_CUSTOM_OPS_CACHE`` (default ``~/.cache/scalebox_ms/custom_ops/``), keyed by a hash
of source, compiler and flags; written atomically. Without a compiler (and no cached library) building raises
:class:`scalebox_ms.errors.CustomOpError`; the fallback is the builtin MindSpore-ops path
(``act_kernel: builtin``, which ``act_kernel: auto`` selects by itself). See docs/custom_ops.md.
"""
from .actor import FusedActorKernel
from .build import (
    KERNELS,
    cache_dir,
    compiler_available,
    func_spec,
    library_path,
    stats,
)


def kernel_available(name: str = "fused_actor_mlp") -> bool:
    """True if kernel ``name`` is cached or a compiler is present to build it (builds nothing)."""
    import os

    from ...errors import CustomOpError

    try:
        return os.path.isfile(library_path(name, build=False)) or compiler_available()
    except CustomOpError:
        return False


__all__ = [
    "KERNELS",
    "FusedActorKernel",
    "cache_dir",
    "compiler_available",
    "func_spec",
    "kernel_available",
    "library_path",
    "stats",
]

from .update import PPOUpdateKernel, unsupported_settings  # noqa: E402  (the whole PPO update as one kernel)

__all__ += ["PPOUpdateKernel", "unsupported_settings"]
from .offpolicy_optim import GuardedAdamKernel, PolyakKernel  # noqa: E402  (the off-policy optimizer kernels)

__all__ += ["GuardedAdamKernel", "PolyakKernel"]
