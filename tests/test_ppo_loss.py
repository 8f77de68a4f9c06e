"""The PPO loss and the compiled update step vs a hand computation in numpy."""
import mindspore as ms
import numpy as np
import pytest
from mindspore import ops

from scalebox_ms.config import Config
from scalebox_ms.models import SpaceSpec, build_model
from scalebox_ms.sandbox import Sandbox
from scalebox_ms.trainers.ppo_update import PPOLoss, PPOUpdateStep, pack_features


@pytest.fixture(autouse=True, scope="module")
def _sandbox():
    Sandbox(device="auto", seed=0)


def np_forward(model, obs):
    """Plain numpy MLP forward (tanh) with the Cell's weights: the obviously-correct reference."""
    def run(seq, x):
        cells = list(seq.cells())
        for c in cells:
            if hasattr(c, "weight"):
                x = x @ c.weight.asnumpy().astype(np.float64).T + c.bias.asnumpy()
            else:
                x = np.tanh(x)
        return x
    return run(model.pi_net, obs.astype(np.float64)), run(model.vf_net, obs.astype(np.float64))[:, 0]


def np_log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def hand_loss(model, batch, clip, clip_vf, ent_coef, vf_coef):
    obs, act, old_lp, old_v, adv, ret, mask = batch
    logits, v = np_forward(model, obs)
    logp_all = np_log_softmax(logits)
    logp = logp_all[np.arange(len(act)), act]
    ent = -(np.exp(logp_all) * logp_all).sum(-1)
    m = mask.astype(bool)
    a = adv[m]
    a = (a - a.mean()) / (a.std(ddof=1) + 1e-8)
    ratio = np.exp(logp[m] - old_lp[m])
    pg = -np.minimum(ratio * a, np.clip(ratio, 1 - clip, 1 + clip) * a).mean()
    vp = v[m] if clip_vf is None else old_v[m] + np.clip(v[m] - old_v[m], -clip_vf, clip_vf)
    vl = ((ret[m] - vp) ** 2).mean()
    el = -ent[m].mean()
    kl = ((ratio - 1) - np.log(ratio)).mean()
    cf = (np.abs(ratio - 1) > clip).mean()
    return pg + ent_coef * el + vf_coef * vl, pg, vl, el, kl, cf


def make_batch(model, rng, B=48):
    obs = rng.normal(size=(B, 4)).astype(np.float32)
    act = rng.integers(0, 2, size=B).astype(np.int32)
    logits, v = np_forward(model, obs)
    # old policy = current policy perturbed, so ratios differ from 1 and some get clipped
    old_lp = (np_log_softmax(logits)[np.arange(B), act] + rng.normal(scale=0.3, size=B)).astype(np.float32)
    old_v = (v + rng.normal(scale=0.5, size=B)).astype(np.float32)
    adv = rng.normal(size=B).astype(np.float32)
    ret = rng.normal(size=B).astype(np.float32)
    mask = (rng.random(B) > 0.15).astype(np.float32)
    return obs, act, old_lp, old_v, adv, ret, mask


@pytest.mark.parametrize("clip_vf", [None, 0.2])
def test_loss_matches_hand_computation(clip_vf):
    cfg = Config()
    model = build_model(SpaceSpec(4, True, 2), cfg.policy)
    rng = np.random.default_rng(0)
    batch = make_batch(model, rng)
    loss_fn = PPOLoss(model, ent_coef=0.01, vf_coef=0.5, clip_value=clip_vf is not None, normalize_advantage=True)
    out = loss_fn(*[ms.Tensor(x) for x in batch], ms.Tensor(np.float32(0.2)),
                  ms.Tensor(np.float32(clip_vf if clip_vf else np.inf)))
    got = [float(out[0].asnumpy())] + [float(x.asnumpy()) for x in out[1]]
    want = hand_loss(model, batch, 0.2, clip_vf, 0.01, 0.5)
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-5)
    assert 0 < want[5] < 1, "the batch must exercise clipping"


def _state(step):
    """Parameters, Adam moments and step counters, in a fixed order."""
    opt = step.optimizer
    return [p.asnumpy().copy() for p in list(opt.parameters) + list(opt.moment1) + list(opt.moment2)] + \
           [opt.beta1_power.asnumpy().copy(), opt.global_step.asnumpy().copy()]


def test_update_step_applies_and_kl_limit_skips():
    cfg = Config.from_dict({"ppo": {"target_kl": 0.01}})
    model = build_model(SpaceSpec(4, True, 2), cfg.policy)
    step = PPOUpdateStep(model, cfg.ppo)
    rng = np.random.default_rng(1)
    obs, act, old_lp, old_v, adv, ret, mask = make_batch(model, rng, B=64)
    batch = [ms.Tensor(pack_features(obs, old_lp, old_v, adv, ret, mask)), ms.Tensor(act)]
    idx = ms.Tensor(rng.permutation(64)[:32].astype(np.int32))
    scalars = [ms.Tensor(np.float32(x)) for x in (1e-3, 0.2, np.inf)]
    before = _state(step)
    out = step(*batch, idx, *scalars, ms.Tensor(np.float32(-1.0))).asnumpy()  # approx_kl >= 0 > limit: skip
    assert out[6] == 0.0
    # the packed features + in-graph gather feed the same loss as the hand computation on that minibatch
    sel = idx.asnumpy()
    want = hand_loss(model, [x[sel] for x in (obs, act, old_lp, old_v, adv, ret, mask)], 0.2, None, 0.0, 0.5)
    np.testing.assert_allclose(out[:6], want, rtol=2e-4, atol=2e-5)
    after = _state(step)
    assert all(np.array_equal(a, b) for a, b in zip(before, after)), "a skipped step must not touch anything"
    out = step(*batch, idx, *scalars, ms.Tensor(np.float32(np.inf))).asnumpy()
    assert out[6] == 1.0
    changed = _state(step)
    assert not np.array_equal(before[0], changed[0]) and not np.array_equal(before[-1], changed[-1])
    assert float(step.learning_rate.asnumpy()) == pytest.approx(1e-3)


def step_with_batch(seed, B=32):
    """A fresh PPOUpdateStep and its (features, actions, indices) inputs for one full-batch minibatch."""
    cfg = Config()
    model = build_model(SpaceSpec(4, True, 2), cfg.policy)
    obs, act, old_lp, old_v, adv, ret, mask = make_batch(model, np.random.default_rng(seed), B=B)
    inputs = [ms.Tensor(pack_features(obs, old_lp, old_v, adv, ret, mask)), ms.Tensor(act),
              ms.Tensor(np.arange(B, dtype=np.int32))]
    return model, PPOUpdateStep(model, cfg.ppo), inputs


def test_update_step_without_target_kl_always_applies():
    model, step, inputs = step_with_batch(2)
    before = _state(step)
    out = step(*inputs, *[ms.Tensor(np.float32(x)) for x in (1e-3, 0.2, np.inf, -1.0)])
    assert out.asnumpy()[6] == 0.0  # reported: approx_kl > limit ...
    assert not np.array_equal(before[0], _state(step)[0])  # ... but no target_kl: the step is applied


def test_clip_grad_norm_matches_torch_semantics():
    from scalebox_ms.ops import clip_grad_norm

    rng = np.random.default_rng(3)
    grads = [rng.normal(size=s).astype(np.float32) for s in [(64, 4), (64,), (2, 64), (2,)]]
    norm = np.sqrt(sum((g.astype(np.float64) ** 2).sum() for g in grads))
    for max_norm in (0.5, norm * 2):
        out, got_norm = clip_grad_norm(tuple(ms.Tensor(g) for g in grads), max_norm)
        coef = min(1.0, max_norm / (norm + 1e-6))
        assert float(got_norm.asnumpy()) == pytest.approx(norm, rel=1e-5)
        for o, g in zip(out, grads):
            np.testing.assert_allclose(o.asnumpy(), g * coef, rtol=1e-5, atol=1e-7)


def test_global_norm_is_the_update_steps_finite_check_inside_a_graph():
    """PPOUpdateStep (no AMP) skips a step when the gradients' global norm is not finite: NaN or inf in any one of
    several gradients makes it so, finite gradients give numpy's norm."""
    from scalebox_ms.ops import global_norm

    @ms.jit
    def check(a, b):
        norm = global_norm((a * 2, b))
        return norm, ops.isfinite(norm)

    rng = np.random.default_rng(5)
    a, b = rng.normal(size=(3, 2)).astype(np.float32), rng.normal(size=4).astype(np.float32)
    norm, finite = check(ms.Tensor(a), ms.Tensor(b))
    assert bool(finite.asnumpy())
    assert float(norm.asnumpy()) == pytest.approx(np.sqrt(((2.0 * a) ** 2).sum() + (b ** 2).sum()), rel=1e-6)
    for bad in (np.inf, -np.inf, np.nan):
        b2 = b.copy()
        b2[1] = bad
        assert not bool(check(ms.Tensor(a), ms.Tensor(b2))[1].asnumpy())
    big = np.full((3, 2), 3e19, np.float32)  # finite values whose squares overflow float32: counted as not finite
    assert not bool(check(ms.Tensor(big), ms.Tensor(b))[1].asnumpy())


def test_global_norm_of_float16_gradients_is_summed_in_float32():
    """float16 squares overflowed at 256 (a norm of 948.7 came back inf), and float16 mixed with float32 failed in
    MindSpore's Concat."""
    from scalebox_ms.ops import clip_grad_norm, global_norm

    half = np.full(10, 300.0, np.float16)
    single = np.full(3, 2.0, np.float32)
    want = np.sqrt(10 * 300.0 ** 2 + 3 * 4.0)
    norm = global_norm((ms.Tensor(half), ms.Tensor(single)))
    assert norm.dtype == ms.float32 and float(norm.asnumpy()) == pytest.approx(want, rel=1e-6)
    clipped, norm = clip_grad_norm((ms.Tensor(half),), 1.0)
    assert float(norm.asnumpy()) == pytest.approx(np.sqrt(10 * 300.0 ** 2), rel=1e-6)
    assert clipped[0].dtype == ms.float16 and np.isfinite(clipped[0].asnumpy()).all()


def test_assign_parameters_writes_one_value_per_parameter():
    """zip wrote as many Parameters as there were values and left the rest as they were, without a word."""
    from scalebox_ms.ops import AssignParameters

    p = ms.Parameter(ms.Tensor(np.zeros(2, np.float32)), name="p_assign")
    q = ms.Parameter(ms.Tensor(np.zeros(3, np.float32)), name="q_assign")
    writer = AssignParameters([p, q])
    with pytest.raises(ValueError, match="1 values for 2 Parameters"):
        writer.write([ms.Tensor(np.ones(2, np.float32))])
    with pytest.raises(ValueError, match="no Parameters"):
        AssignParameters([])
    writer.write([ms.Tensor(np.ones(2, np.float32)), ms.Tensor(np.full(3, 2.0, np.float32))])
    np.testing.assert_array_equal(q.asnumpy(), [2.0, 2.0, 2.0])


def test_learning_rate_input_reaches_the_optimizer():
    model, step, args = step_with_batch(4)
    rest = [ms.Tensor(np.float32(x)) for x in (0.2, np.inf, np.inf)]
    w0 = model.pi_net[0].weight.asnumpy().copy()
    step(*args, ms.Tensor(np.float32(0.0)), *rest)
    np.testing.assert_array_equal(model.pi_net[0].weight.asnumpy(), w0)  # lr 0: Adam moves nothing
    step(*args, ms.Tensor(np.float32(1e-2)), *rest)
    small = np.abs(model.pi_net[0].weight.asnumpy() - w0).max()
    w1 = model.pi_net[0].weight.asnumpy().copy()
    step(*args, ms.Tensor(np.float32(1e-1)), *rest)
    large = np.abs(model.pi_net[0].weight.asnumpy() - w1).max()
    assert small > 0 and large > 5 * small
    assert float(step.optimizer.learning_rate.asnumpy()) == pytest.approx(0.1)


def test_explained_variance_of_no_samples_is_nan_without_a_numpy_warning():
    """A rollout without a valid sample (ppo.n_steps=1, one env) printed numpy's 'Degrees of freedom <= 0' warnings."""
    import warnings

    from scalebox_ms.trainers.ppo import _explained_variance

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert np.isnan(_explained_variance(np.zeros(0), np.zeros(0)))
    assert _explained_variance(np.array([1.0, 2.0]), np.array([1.0, 2.0])) == 1.0
