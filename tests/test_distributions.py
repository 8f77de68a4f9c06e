"""Log-probabilities, entropies and sampling of the graph distributions vs numpy."""
import math

import mindspore as ms
import numpy as np
import pytest

from scalebox_ms.ops import distributions as D
from scalebox_ms.sandbox import Sandbox


@pytest.fixture(autouse=True, scope="module")
def _sandbox():
    Sandbox(device="auto", seed=0)


def np_log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_categorical_log_prob_and_entropy():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(32, 5)).astype(np.float32) * 3
    actions = rng.integers(0, 5, size=32).astype(np.int32)
    lp = D.categorical_log_prob(ms.Tensor(logits), ms.Tensor(actions)).asnumpy()
    ref = np_log_softmax(logits.astype(np.float64))
    np.testing.assert_allclose(lp, ref[np.arange(32), actions], rtol=1e-5, atol=1e-5)
    ent = D.categorical_entropy(ms.Tensor(logits)).asnumpy()
    np.testing.assert_allclose(ent, -(np.exp(ref) * ref).sum(-1), rtol=1e-5, atol=1e-5)


def test_categorical_entropy_of_masked_logits_counts_them_zero():
    """Logits of -inf (masked actions) made 0 * -inf = NaN entropies; their log-probs were finite already."""
    logits = np.random.default_rng(3).normal(size=(8, 4)).astype(np.float32)
    masked = logits.copy()
    masked[:, 0] = -np.inf
    masked[0, 1:3] = -np.inf  # (one row with a single action left: entropy 0)
    ent = D.categorical_entropy(ms.Tensor(masked)).asnumpy()
    ref = np_log_softmax(logits[:, 1:].astype(np.float64))
    ref_ent = -(np.exp(ref) * ref).sum(-1)
    ref_ent[0] = 0.0
    np.testing.assert_allclose(ent, ref_ent, rtol=1e-5, atol=1e-5)
    grad = ms.grad(lambda x: D.categorical_entropy(x).sum())(ms.Tensor(masked)).asnumpy()
    assert np.isfinite(grad).all() and (grad[:, 0] == 0).all()


def test_gaussian_log_prob_and_entropy():
    rng = np.random.default_rng(1)
    mean = rng.normal(size=(16, 3)).astype(np.float32)
    log_std = np.array([-1.0, 0.0, 0.5], np.float32)
    a = rng.normal(size=(16, 3)).astype(np.float32)
    lp = D.gaussian_log_prob(ms.Tensor(mean), ms.Tensor(log_std), ms.Tensor(a)).asnumpy()
    std = np.exp(log_std.astype(np.float64))
    ref = (-0.5 * ((a - mean) / std) ** 2 - np.log(std) - 0.5 * math.log(2 * math.pi)).sum(-1)
    np.testing.assert_allclose(lp, ref, rtol=1e-5, atol=1e-5)
    ent = D.gaussian_entropy(ms.Tensor(log_std), ms.Tensor(mean)).asnumpy()
    np.testing.assert_allclose(ent, np.full(16, (0.5 + 0.5 * math.log(2 * math.pi) + np.log(std)).sum()), rtol=1e-6)


def test_gumbel_max_samples_the_softmax():
    rng = np.random.default_rng(2)
    logits = np.array([[0.0, 1.0, -1.0, 2.0]], np.float32)
    n = 20000
    noise = rng.gumbel(size=(n, 4)).astype(np.float32)
    samples = D.categorical_sample(ms.Tensor(np.repeat(logits, n, 0)), ms.Tensor(noise)).asnumpy()
    freq = np.bincount(samples, minlength=4) / n
    probs = np.exp(np_log_softmax(logits[0].astype(np.float64)))
    np.testing.assert_allclose(freq, probs, atol=0.015)
    # each row gets its own sample (MindSpore's RandomCategorical returns one per batch on CPU)
    assert len(np.unique(samples)) == 4


def test_gaussian_sample_uses_the_noise():
    mean = ms.Tensor(np.array([[1.0, -2.0]], np.float32))
    log_std = ms.Tensor(np.array([math.log(2.0), 0.0], np.float32))
    out = D.gaussian_sample(mean, log_std, ms.Tensor(np.array([[0.5, -1.0]], np.float32))).asnumpy()
    np.testing.assert_allclose(out, [[2.0, -3.0]], rtol=1e-6)
