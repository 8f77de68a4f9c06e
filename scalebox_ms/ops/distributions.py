"""Action distributions as MindSpore graph functions.

Sampling takes its noise as an input (Gumbel noise for Categorical, standard normal noise for Gaussian) drawn
by the trainer's numpy Generator. That keeps every random draw reproducible and checkpointable, and avoids
MindSpore 2.10's CPU RNG pitfalls (``RandomCategorical`` returns one sample per batch; random ops in helpers
repeat their draw; see docs/design.md).
"""
import math

import mindspore as ms
from mindspore import ops

_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


def categorical_log_prob(logits, actions):
    """log pi(a|s) for integer ``actions`` (B,) under ``logits`` (B, A)."""
    log_p = ops.log_softmax(logits, -1)
    return ops.gather_elements(log_p, 1, actions.astype(ms.int32).expand_dims(-1)).squeeze(-1)


def categorical_entropy(logits):
    """Entropy of softmax(``logits``) (B, A) -> (B,). Logits of -inf (masked actions) count 0: their 0 * -inf was
    NaN. Clamping log p at -1e4 changes nothing else: below it p is exactly 0 in float32 and float16."""
    log_p = ops.log_softmax(logits, -1)
    return -(ops.exp(log_p) * ops.maximum(log_p, -1e4)).sum(-1)


def categorical_sample(logits, gumbel_noise):
    """Gumbel-max sampling: argmax(logits + g), g ~ Gumbel(0, 1); exact samples of softmax(logits)."""
    return ops.argmax(logits + gumbel_noise, -1).astype(ms.int32)


def gaussian_log_prob(mean, log_std, actions):
    """Sum over action dims of the diagonal Gaussian log density."""
    z = (actions - mean) * ops.exp(-log_std)
    return (-0.5 * z * z - log_std - _HALF_LOG_2PI).sum(-1)


def gaussian_entropy(log_std, batch_like):
    """Entropy of the diagonal Gaussian, broadcast to the batch of ``batch_like`` (B, D)."""
    ent = (0.5 + _HALF_LOG_2PI + log_std).sum(-1)
    return ops.zeros_like(batch_like[:, 0]) + ent


def gaussian_sample(mean, log_std, normal_noise):
    return mean + ops.exp(log_std) * normal_noise



# -- MultiDiscrete: independent Categoricals over column segments of one logits row ---------------------------
def _as_columns(columns):
    """(B,) tensors -> (B, len(columns)) (scalars -> (len(columns),)). Not ``ops.stack``: in an exported MindIR with a
    dynamic batch, Stack keeps the batch size of the first call (later calls got that many rows, cut or garbage)."""
    return ops.concat([ops.expand_dims(c, -1) for c in columns], -1)


def multi_categorical_sample(logits, gumbel_noise, segments):
    """(B, len(segments)) int32: Gumbel-max per component; ``segments`` are static (start, end) column pairs."""
    return _as_columns([categorical_sample(logits[:, s:e], gumbel_noise[:, s:e]) for s, e in segments])


def multi_categorical_log_prob(logits, actions, segments):
    """Sum over components of log pi(a_i|s)."""
    out = None
    for i, (s, e) in enumerate(segments):
        lp = categorical_log_prob(logits[:, s:e], actions[:, i])
        out = lp if out is None else out + lp
    return out


def multi_categorical_entropy(logits, segments):
    out = None
    for s, e in segments:
        h = categorical_entropy(logits[:, s:e])
        out = h if out is None else out + h
    return out


def multi_categorical_mode(logits, segments):
    """The most likely action per component: (B, len(segments)) int32, or (len(segments),) for one unbatched row of
    logits, as the other action kinds' modes accept it."""
    return _as_columns([ops.argmax(logits[..., s:e], -1).astype(ms.int32) for s, e in segments])


# -- MultiBinary: independent Bernoullis with logits l, p = sigmoid(l) ----------------------------------------
def bernoulli_sample(logits, logistic_noise):
    """1[l + g > 0] for g ~ Logistic(0, 1): exactly Bernoulli(sigmoid(l)) (the binary Gumbel-max trick)."""
    return (logits + logistic_noise > 0).astype(ms.int32)


def bernoulli_log_prob(logits, actions):
    """Sum over bits of a log p + (1 - a) log(1 - p), with log p = -softplus(-l), log(1 - p) = -softplus(l)."""
    a = actions.astype(logits.dtype)
    return -(a * ops.softplus(-logits) + (1.0 - a) * ops.softplus(logits)).sum(-1)


def bernoulli_entropy(logits):
    """Sum over bits of -p log p - (1 - p) log(1 - p) = softplus(l) - p l."""
    return (ops.softplus(logits) - ops.sigmoid(logits) * logits).sum(-1)


def bernoulli_mode(logits):
    return (logits > 0).astype(ms.int32)
