"""Graph operators used by the models and the PPO update.

``distributions``: log-probabilities, entropies and noise-driven sampling of the Categorical and diagonal
Gaussian action distributions, written as MindSpore ops so they compile into the acting and update graphs.
"""
from .distributions import (
    categorical_entropy,
    categorical_log_prob,
    categorical_sample,
    gaussian_entropy,
    gaussian_log_prob,
    gaussian_sample,
)

__all__ = [
    "categorical_entropy",
    "categorical_log_prob",
    "categorical_sample",
    "gaussian_entropy",
    "gaussian_log_prob",
    "gaussian_sample",
]
