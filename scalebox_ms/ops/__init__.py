"""Graph operators used by the models and the PPO update.

``distributions``: log-probabilities, entropies and noise-driven sampling of the Categorical and diagonal
Gaussian action distributions, written as MindSpore ops so they compile into the acting and update graphs.
``clip``: global gradient-norm clipping (torch ``clip_grad_norm_`` semantics) with few kernels.
``assign``: write Parameter values in a compiled call (``set_data`` is invisible to compiled graphs).
``fused``: ``FusedDense`` (Linear + bias + activation, storage padded to aligned shapes) and MLPs of it.
``custom`` (imported on use): C++ kernels registered with ``ops.Custom(func_type="aot")``, compiled on first use.
"""
from .assign import AssignParameters
from .clip import clip_grad_norm, global_norm
from .distributions import (
    categorical_entropy,
    categorical_log_prob,
    categorical_sample,
    gaussian_entropy,
    gaussian_log_prob,
    gaussian_sample,
)
from .fused import FusedDense, aligned, fused_mlp, mlp_layers

__all__ = [
    "AssignParameters",
    "FusedDense",
    "aligned",
    "categorical_entropy",
    "categorical_log_prob",
    "categorical_sample",
    "clip_grad_norm",
    "global_norm",
    "fused_mlp",
    "gaussian_entropy",
    "gaussian_log_prob",
    "gaussian_sample",
    "mlp_layers",
]
