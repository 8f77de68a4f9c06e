"""Graph operators used by the models and the PPO update.

``distributions``: log-probabilities, entropies and noise-driven sampling of the Categorical and diagonal
Gaussian action distributions, written as MindSpore ops so they compile into the acting and update graphs.
``clip``: global gradient-norm clipping (torch ``clip_grad_norm_`` semantics) with few kernels.
``assign``: write Parameter values in a compiled call (``set_data`` is invisible to compiled graphs).
"""
from .assign import AssignParameters
from .clip import clip_grad_norm
from .distributions import (
    categorical_entropy,
    categorical_log_prob,
    categorical_sample,
    gaussian_entropy,
    gaussian_log_prob,
    gaussian_sample,
)

__all__ = [
    "AssignParameters",
    "clip_grad_norm",
    "categorical_entropy",
    "categorical_log_prob",
    "categorical_sample",
    "gaussian_entropy",
    "gaussian_log_prob",
    "gaussian_sample",
]
