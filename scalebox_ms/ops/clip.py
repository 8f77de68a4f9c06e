"""Global gradient-norm clipping with few kernels.

``mindspore.ops.clip_by_global_norm`` (deprecated since 2.9) launches ~5 kernels per gradient tensor; on CPU,
where each kernel costs ~6 us of fixed overhead, that was a quarter of a small PPO update step. Here the
gradients are flattened into one vector for the norm, so the cost is ~2 kernels per tensor.

Semantics are torch's ``clip_grad_norm_`` (what SB3 uses): ``g * min(1, max_norm / (||g||_2 + 1e-6))``.
"""
import mindspore as ms
from mindspore import ops


def global_norm(grads):
    """The global L2 norm of ``grads`` (float32 scalar). It is not finite iff a gradient holds a NaN or an inf, or
    the sum of squares overflows float32 (a norm above ~1.8e19): the PPO update without AMP uses it as its
    finiteness check too. Gradients of other dtypes are summed in float32 (float16's squares overflowed at 256)."""
    flat = ops.concat([g.reshape(-1) if g.dtype == ms.float32 else g.reshape(-1).astype(ms.float32) for g in grads])
    return ops.sqrt((flat * flat).sum())


def clip_grad_norm(grads, max_norm: float, norm=None):
    """Return (clipped grads tuple, global L2 norm before clipping); ``norm``: that norm if already computed
    (:func:`global_norm`)."""
    if norm is None:
        norm = global_norm(grads)
    coef = ops.minimum(max_norm / (norm + 1e-6), 1.0)
    return tuple(g * coef for g in grads), norm


def normalize_obs(enabled: bool, obs, mean, inv_std, clip):
    """Running observation normalisation in a graph: ``clip((obs - mean) * inv_std, -clip, clip)`` when ``enabled``
    (static), else ``obs``. ``clip`` is a scalar or one bound per column (``RolloutCollector.normalizer_inputs``)."""
    if enabled:
        return ops.clip_by_value((obs - mean) * inv_std, -clip, clip)
    return obs
