"""Global gradient-norm clipping with few kernels.

``mindspore.ops.clip_by_global_norm`` (deprecated since 2.9) launches ~5 kernels per gradient tensor; on CPU,
where each kernel costs ~6 us of fixed overhead, that was a quarter of a small PPO update step. Here the
gradients are flattened into one vector for the norm, so the cost is ~2 kernels per tensor.

Semantics are torch's ``clip_grad_norm_`` (what SB3 uses): ``g * min(1, max_norm / (||g||_2 + 1e-6))``.
"""
from mindspore import ops


def clip_grad_norm(grads, max_norm: float):
    """Return (clipped grads tuple, global L2 norm before clipping)."""
    flat = ops.concat([g.reshape(-1) for g in grads])
    norm = ops.sqrt((flat * flat).sum())
    coef = ops.minimum(max_norm / (norm + 1e-6), 1.0)
    return tuple(g * coef for g in grads), norm


def normalize_obs(enabled: bool, obs, mean, inv_std, clip):
    """Running observation normalisation in a graph: ``clip((obs - mean) * inv_std, -clip, clip)`` when ``enabled``
    (static), else ``obs``. ``clip`` is a scalar or one bound per column (``RolloutCollector.normalizer_inputs``)."""
    if enabled:
        return ops.clip_by_value((obs - mean) * inv_std, -clip, clip)
    return obs
