"""The C++ PPO update kernel (scalebox_ms.ops.custom.PPOUpdateKernel) vs the reference PPOUpdateStep.

Two models start from identical weights; the reference PPOUpdateStep updates model A, the kernel updates model B
(through the nn.Adam of a PPOUpdateStep built on B, so both paths share B's optimizer state). After every step
the statistics, all parameters, Adam's moments, beta powers, global step and learning rate must agree to float
tolerance, and other compiled graphs (ActStep builtin and custom, ValueStep) must see B's new weights.
"""
import json
import os
import subprocess
import sys
from dataclasses import replace

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn

from scalebox_ms.config import PPOConfig
from scalebox_ms.errors import CustomOpError
from scalebox_ms.models import SpaceSpec
from scalebox_ms.models.actor_critic import ActorCritic, ActStep, ValueStep
from scalebox_ms.ops.custom import PPOUpdateKernel, build
from scalebox_ms.sandbox import Sandbox
from scalebox_ms.trainers.ppo_update import PPOUpdateStep, pack_features


@pytest.fixture(autouse=True, scope="module")
def _sandbox(kernel_cache):
    """CPU sandbox, and a fresh kernel cache for this module (conftest.kernel_cache)."""
    Sandbox(device="auto", seed=0)


DISC = SpaceSpec(4, True, 2)
DISC3 = SpaceSpec(6, True, 3)
CONT = SpaceSpec(3, False, 2, low=(-1.0, -1.0), high=(1.0, 1.0))

CASES = {
    # name: (spec, ActorCritic kwargs, PPOConfig overrides)
    "discrete-tanh-ent": (DISC, {"pi_layers": (64, 64), "vf_layers": (64, 64), "activation": "tanh"},
                          {"ent_coef": 0.01}),
    "discrete-relu-vclip-nonorm": (DISC3, {"pi_layers": (20,), "vf_layers": (24, 9), "activation": "relu"},
                                   {"clip_range_vf": 0.1, "normalize_advantage": False, "max_grad_norm": 100.0}),
    "continuous-tanh-vclip-ent-kl": (CONT, {"pi_layers": (24, 17), "vf_layers": (32, 32), "activation": "tanh",
                                            "log_std_init": -0.3},
                                     {"ent_coef": 0.02, "clip_range_vf": 0.2, "target_kl": 0.05}),
    "continuous-relu": (CONT, {"pi_layers": (32,), "vf_layers": (32,), "activation": "relu"}, {"vf_coef": 0.7}),
}

N = 512  # rollout rows
MB = 96  # minibatch (not a multiple of the kernel's 8-row tiles: partial tiles)


def _rollout(model, spec, seed, n=N):
    """(features, actions) Tensors: actions sampled from ``model``, old log-probs/values near the model's own."""
    N = n  # noqa: N806 (the rollout size)
    rng = np.random.default_rng(seed)
    obs = (rng.normal(size=(N, spec.obs_dim)) * 1.5).astype(np.float32)
    noise = rng.gumbel(size=(N, spec.action_dim)) if spec.discrete else rng.normal(size=(N, spec.action_dim))
    action, log_prob, value = ActStep(model)(Tensor(obs), Tensor(noise.astype(np.float32)))
    old_lp = log_prob.asnumpy() + rng.normal(size=N) * 0.1
    old_v = value.asnumpy() + rng.normal(size=N) * 0.2
    adv = rng.normal(size=N) * 2 + 0.3
    mask = (rng.random(N) > 0.15).astype(np.float32)
    features = pack_features(obs, old_lp, old_v, adv, adv + old_v, mask)
    return Tensor(features), action


def _state(step):
    """{name: array} of everything nn.Adam holds (model params, moments, beta powers, global step, lr)."""
    return {name: p.asnumpy().copy() for name, p in step.optimizer.parameters_and_names()}


def _pair(case, **extra):
    spec, kw, over = CASES[case]
    cfg = replace(PPOConfig(learning_rate=3e-3), **{**over, **extra})
    ms.set_seed(11)
    a, b = ActorCritic(spec, **kw), ActorCritic(spec, **kw)
    b.load_logical_parameters(a.logical_parameters())
    ref, step_b = PPOUpdateStep(a, cfg), PPOUpdateStep(b, cfg)
    kernel = PPOUpdateKernel(b, step_b.optimizer, cfg)
    return spec, cfg, a, b, ref, step_b, kernel


def _assert_state_close(ref, other, what):
    sa, sb = _state(ref), _state(other)
    assert sa.keys() == sb.keys()
    for name in sa:
        np.testing.assert_allclose(sb[name], sa[name], rtol=2e-4, atol=2e-6, err_msg=f"{what}: {name}")


@pytest.mark.parametrize("case", list(CASES))
def test_kernel_matches_reference_update(case):
    spec, cfg, a, b, ref, step_b, kernel = _pair(case)
    features, actions = _rollout(a, spec, seed=len(case))
    rng = np.random.default_rng(5)
    initial = _state(step_b)
    skip_at = 3 if cfg.target_kl is not None else None
    applied = 0
    for i in range(6):
        idx = Tensor(rng.permutation(N)[:MB].astype(np.int32))
        lr = 3e-3 * (1.0 - 0.1 * i)  # a schedule: the learning rate is an input
        kl_limit = -1.0 if i == skip_at else 10.0
        scalars = [Tensor(np.float32(x)) for x in (lr, 0.2, cfg.clip_range_vf or 0.0, kl_limit)]
        before = _state(step_b)
        want = ref(features, actions, idx, *scalars).asnumpy()
        got = kernel(features, actions, idx, *scalars).asnumpy()
        assert got.shape == (9,) and got.dtype == np.float32
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-6, err_msg=f"stats at step {i}")
        assert got[5] > 0.0 or i == 0  # some samples clipped: the clipped branch is exercised
        _assert_state_close(ref, step_b, f"step {i}")
        after = _state(step_b)
        if i == skip_at:  # KL early stop: nothing but Adam's learning-rate Parameter changes
            assert got[6] == 0.0 and want[6] == 0.0
            for name in after:
                if name != "learning_rate":
                    np.testing.assert_array_equal(after[name], before[name], err_msg=name)
        else:
            assert got[6] == 1.0
            applied += 1
    final = _state(step_b)
    assert int(final["global_step"][0]) == applied
    np.testing.assert_allclose(final["beta1_power"], 0.9 ** applied, rtol=1e-6)
    moved = [n for n in final if not n.startswith(("moment", "beta", "global", "learning"))
             and np.abs(final[n] - initial[n]).max() > 1e-4]
    assert len(moved) == len(list(b.trainable_params()))  # every parameter (incl. log_std) was updated


def _one_minibatch(pair, old_log_prob: float, advantages, returns):
    """One minibatch of MB rows through the reference step and the kernel of ``_pair``: (reference stats, kernel
    stats, the kernel's optimizer state before, after)."""
    spec, _, _, _, ref, step_b, kernel = pair
    rng = np.random.default_rng(0)
    features = Tensor(pack_features(rng.normal(size=(MB, spec.obs_dim)), np.full(MB, old_log_prob),
                                    rng.normal(size=MB), advantages, returns, np.ones(MB)))
    actions = Tensor(rng.integers(0, spec.action_dim, MB).astype(np.int32))
    idx = Tensor(np.arange(MB, dtype=np.int32))
    scalars = [Tensor(np.float32(x)) for x in (3e-3, 0.2, 0.0, 10.0)]
    before = _state(step_b)
    want = ref(features, actions, idx, *scalars).asnumpy()
    got = kernel(features, actions, idx, *scalars).asnumpy()
    return want, got, before, _state(step_b)


@pytest.mark.parametrize("returns, finite", [(1.5e18, True), (3e18, False), (2e19, False)])
def test_kernel_and_graph_skip_the_same_steps_whose_float32_sums_overflow(returns, finite):
    """The compiled graph sums a loss term's rows in float32: returns of ~3e18 overflow its value loss to inf and the
    step is skipped. The kernel summed in double and applied a clipped step (a run with rewards of 1.5e18 stopped
    at the non-finite guard with `builtin` and trained on with `auto`)."""
    from scalebox_ms.ops import layout

    pair = _pair("discrete-tanh-ent")
    adv = np.random.default_rng(1).normal(size=MB)
    want, got, before, after = _one_minibatch(pair, -0.7, adv, np.full(MB, returns))
    assert want[layout.STAT.finite] == got[layout.STAT.finite] == float(finite)
    _assert_state_close(pair[4], pair[5], f"returns {returns:g}")
    if not finite:  # nothing moved (but Adam's learning-rate Parameter)
        assert all(np.array_equal(after[n], before[n]) for n in after if n != "learning_rate")


def test_a_step_the_kl_stops_is_judged_by_its_loss_on_both_paths():
    """old log-probs of -1000 make every ratio inf: with positive advantages the clipped surrogate keeps the loss
    finite, the KL is inf (over target_kl) and the gradient NaN (0 * inf through the minimum). The kernel checks the
    KL before its backward pass (as SB3) and stopped the epochs; the graph called the step non-finite and went on."""
    from scalebox_ms.ops import layout

    pair = _pair("discrete-tanh-ent", target_kl=0.05, normalize_advantage=False)
    adv = np.abs(np.random.default_rng(1).normal(size=MB)) + 0.1
    want, got, before, after = _one_minibatch(pair, -1000.0, adv, adv)
    assert np.isfinite(want[layout.STAT.loss]) and want[layout.STAT.kl_ok] == got[layout.STAT.kl_ok] == 0.0
    assert want[layout.STAT.finite] == got[layout.STAT.finite] == 1.0  # (the epochs stop here on both paths)
    assert all(np.array_equal(after[n], before[n]) for n in after if n != "learning_rate")
    _assert_state_close(pair[4], pair[5], "KL stop")


DENORMAL_SCRIPT = """
import numpy as np
from mindspore import Tensor
from scalebox_ms.config import PPOConfig
from scalebox_ms.models import SpaceSpec
from scalebox_ms.models.actor_critic import ActorCritic
from scalebox_ms.ops.custom import PPOUpdateKernel
from scalebox_ms.trainers.ppo_update import PPOUpdateStep, pack_features

spec = SpaceSpec(3, False, 2, low=(-1.0, -1.0), high=(1.0, 1.0))
model = ActorCritic(spec, pi_layers=(32,), vf_layers=(32,), activation="relu")
cfg = PPOConfig(learning_rate=3e-3, target_kl=0.05)
optimizer = PPOUpdateStep(model, cfg).optimizer
kernel = PPOUpdateKernel(model, optimizer, cfg)
params = dict(model.parameters_and_names())
bias = params["pi_net.0.bias"].asnumpy().copy()
bias[5] = -1e4  # unit 5 outputs 0 for every row: its incoming weights get a zero gradient
params["pi_net.0.bias"].set_data(Tensor(bias))
rng = np.random.default_rng(0)
n = 64
adv = rng.normal(size=n)
features = Tensor(pack_features(rng.normal(size=(n, 3)), np.full(n, -2.0), rng.normal(size=n), adv, adv, np.ones(n)))
actions = Tensor(rng.normal(size=(n, 2)).astype(np.float32))
scalars = [Tensor(np.float32(x)) for x in (3e-3, 0.2, 0.0, 10.0)]
moment1 = dict(optimizer.parameters_and_names())["moment1.pi_net.0.weight"]
m = moment1.asnumpy().copy()
m[5] = 1e-39  # below float32's smallest normal (1.18e-38)
moment1.set_data(Tensor(m))
idx = Tensor(np.arange(n, dtype=np.int32))
skip = [Tensor(np.float32(x)) for x in (3e-3, 0.2, 0.0, -1.0)]  # kl_limit -1: the KL stop skips the step
kernel(features, actions, idx, *skip)  # MindSpore runs a graph's first call on a flushing thread, later ones not
assert moment1.asnumpy()[5].tolist() == [np.float32(1e-39).item()] * 3
kernel(features, actions, idx, *scalars)
print("moment1", moment1.asnumpy()[5].tolist())
print("numpy", float(np.float32(1e-39) * np.float32(1.0)))
"""


def test_denormals_are_flushed_inside_the_kernel_only(tmp_path):
    """The kernel runs with denormals flushed to zero (simd.h FlushDenormals) whatever the calling thread's FP mode:
    a dead ReLU unit (zero gradient) whose Adam moment1 holds a denormal gets 0 (as from MindSpore's CPU Adam), not
    0.9 x the denormal; and the caller's mode is restored (numpy still computes denormals). In a fresh process, on
    the second call: MindSpore 2.10 ran the first on a thread that flushes (MXCSR 0x9fe2) and later ones on one that
    does not (0x1fa2), which made the kernel's results depend on the call before this flush."""
    proc = subprocess.run([sys.executable, "-c", DENORMAL_SCRIPT], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines() if line.startswith(("moment1", "numpy")))
    assert json.loads(lines["moment1"]) == [0.0, 0.0, 0.0]
    assert float(lines["numpy"]) == pytest.approx(1e-39, rel=1e-3)  # FTZ/DAZ did not leak out of the kernel


def test_other_graphs_see_kernel_writes():
    """ActStep (builtin and custom kernel), ValueStep and asnumpy read the weights the kernel wrote in place."""
    spec, cfg, a, b, ref, step_b, kernel = _pair("discrete-tanh-ent")
    assert kernel.optimizer is step_b.optimizer and kernel.state_parameters() == []  # PPOUpdateStep's trainer API
    features, actions = _rollout(a, spec, seed=1)
    obs = Tensor(np.random.default_rng(2).normal(size=(16, spec.obs_dim)).astype(np.float32))
    noise = Tensor(np.random.default_rng(3).gumbel(size=(16, spec.action_dim)).astype(np.float32))
    graphs_a = (ActStep(a, packed=True), ValueStep(a))
    graphs_b = (ActStep(b, packed=True), ActStep(b, packed=True, kernel="custom"), ValueStep(b))
    for g in graphs_a + graphs_b:  # compile everything before the first update
        g(obs, noise) if isinstance(g, ActStep) else g(obs)
    v0 = graphs_b[2](obs).asnumpy()
    rng = np.random.default_rng(4)
    scalars = [Tensor(np.float32(x)) for x in (3e-3, 0.2, 0.0, 10.0)]
    for _ in range(3):
        idx = Tensor(rng.permutation(N)[:MB].astype(np.int32))
        ref(features, actions, idx, *scalars)
        kernel(features, actions, idx, *scalars)
    act_a, val_a = graphs_a[0](obs, noise).asnumpy(), graphs_a[1](obs).asnumpy()
    np.testing.assert_allclose(graphs_b[0](obs, noise).asnumpy(), act_a, rtol=1e-4, atol=2e-5)
    np.testing.assert_allclose(graphs_b[1](obs, noise).asnumpy(), act_a, rtol=1e-4, atol=3e-5)
    np.testing.assert_allclose(graphs_b[2](obs).asnumpy(), val_a, rtol=1e-4, atol=2e-5)
    assert np.abs(graphs_b[2](obs).asnumpy() - v0).max() > 1e-3  # the value head really moved
    for (name, pa), (_, pb) in zip(a.parameters_and_names(), b.parameters_and_names()):
        np.testing.assert_allclose(pb.asnumpy(), pa.asnumpy(), rtol=1e-4, atol=2e-6, err_msg=name)


def test_interleaved_with_builtin_step_and_external_writes():
    """The kernel and the builtin PPOUpdateStep share model B's Parameters and Adam state both ways, and the kernel
    reads values written by other graphs (AssignParameters, i.e. load_logical_parameters)."""
    spec, cfg, a, b, ref, step_b, kernel = _pair("continuous-tanh-vclip-ent-kl")
    features, actions = _rollout(a, spec, seed=7)
    rng = np.random.default_rng(8)
    scalars = [Tensor(np.float32(x)) for x in (3e-3, 0.2, 0.2, 10.0)]
    for i in range(6):
        idx = Tensor(rng.permutation(N)[:MB].astype(np.int32))
        want = ref(features, actions, idx, *scalars).asnumpy()
        got = (kernel if i % 2 else step_b)(features, actions, idx, *scalars).asnumpy()
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-6, err_msg=f"step {i}")
    _assert_state_close(ref, step_b, "interleaved")
    # overwrite both models' weights from outside (a compiled assign), then one more step each
    values = [(n, v + 0.01) for n, v in a.logical_parameters()]
    a.load_logical_parameters(values)
    b.load_logical_parameters(values)
    idx = Tensor(rng.permutation(N)[:MB].astype(np.int32))
    np.testing.assert_allclose(kernel(features, actions, idx, *scalars).asnumpy(),
                               ref(features, actions, idx, *scalars).asnumpy(), rtol=1e-4, atol=2e-6)
    _assert_state_close(ref, step_b, "after external write")


def test_kernel_uses_build_cache():
    before = dict(build.stats)
    spec, cfg, *_ = _pair("discrete-tanh-ent")
    assert build.stats["cache_hits"] > before["cache_hits"]
    assert os.path.isfile(build.library_path("ppo_update", build=False))


def _cfg():
    return PPOConfig()


@pytest.mark.parametrize("what", ["fused", "amp", "deep", "weight_decay", "other_params", "nesterov"])
def test_unsupported_raise_custom_op_error(what):
    from scalebox_ms.amp import AutoMixedPrecision

    kw = {"layer": "fused"} if what == "fused" else {"pi_layers": (4,) * 17} if what == "deep" else {}
    model = ActorCritic(DISC, **kw)
    params = model.trainable_params()
    if what == "amp":
        AutoMixedPrecision(level="O2").apply(model)
    opt = {"weight_decay": nn.Adam(params, weight_decay=0.1), "other_params": nn.Adam(params[:-1]),
           "nesterov": nn.Adam(params, use_nesterov=True)}.get(what) or nn.Adam(params)
    with pytest.raises(CustomOpError) as err:
        PPOUpdateKernel(model, opt, _cfg())
    assert "\n" not in str(err.value) and "ppo_update" in str(err.value)


# ---- run_epochs: every minibatch of an update in one kernel call ----------------------------------------------------

EPOCHS = 2  # x (N // MB = 5) minibatches per epoch: n_mb = 10 rows, epoch-major


def _triple(case, **over):
    """Three models from identical weights: A (builtin PPOUpdateStep), B (single kernel calls), C (run_epochs)."""
    spec, kw, base = CASES[case]
    cfg = replace(PPOConfig(learning_rate=3e-3), **{**base, **over})
    ms.set_seed(11)
    models = [ActorCritic(spec, **kw) for _ in range(3)]
    for m in models[1:]:
        m.load_logical_parameters(models[0].logical_parameters())
    steps = [PPOUpdateStep(m, cfg) for m in models]
    single = PPOUpdateKernel(models[1], steps[1].optimizer, cfg)
    epochs = PPOUpdateKernel(models[2], steps[2].optimizer, cfg)
    return spec, cfg, models, steps, single, epochs


def _epoch_indices(seed, n_epochs=EPOCHS):
    """int32 (n_mb, MB): per epoch a permutation cut into N // MB full minibatches (the trainer's order)."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n_epochs):
        perm = rng.permutation(N).astype(np.int32)
        rows += [perm[s:s + MB] for s in range(0, N - MB + 1, MB)]
    return np.stack(rows)


def _run_sequence(step, features, actions, idx, scalars, stop_on_kl):
    """n_mb successive single calls; with stop_on_kl, stop after the first row whose kl_ok is 0 (the trainer)."""
    rows = []
    for row in idx:
        out = step(features, actions, Tensor(row), *scalars).asnumpy()
        rows.append(out)
        if stop_on_kl and out[6] < 0.5:
            break
    return np.stack(rows)


def _assert_state_equal(want_step, got_step, what):
    sa, sb = _state(want_step), _state(got_step)
    assert sa.keys() == sb.keys()
    for name in sa:
        np.testing.assert_array_equal(sb[name], sa[name], err_msg=f"{what}: {name}")


@pytest.mark.parametrize("case", list(CASES))
def test_run_epochs_matches_single_calls(case):
    """One run_epochs call == n_mb single kernel calls (bit-identical: same C++ code) == the builtin sequence."""
    spec, cfg, (a, b, c), (step_a, step_b, step_c), single, epochs = _triple(case)
    features, actions = _rollout(a, spec, seed=len(case) + 3)
    idx = _epoch_indices(seed=len(case))
    n_mb = len(idx)
    # kl_limit 10 with target_kl (never stops); -1 without it (kl_ok reports 0, yet every row runs and steps)
    kl_limit = 10.0 if cfg.target_kl is not None else -1.0
    scalars = [Tensor(np.float32(x)) for x in (3e-3, 0.2, cfg.clip_range_vf or 0.0, kl_limit)]
    initial = _state(step_c)
    got = epochs.run_epochs(features, actions, Tensor(idx), *scalars).asnumpy()
    assert got.shape == (n_mb, 10) and got.dtype == np.float32
    np.testing.assert_array_equal(got[:, 9], 1.0)  # every row ran
    if cfg.target_kl is None:
        np.testing.assert_array_equal(got[:, 6], 0.0)
    want_single = _run_sequence(single, features, actions, idx, scalars, stop_on_kl=False)
    np.testing.assert_array_equal(got[:, :9], want_single)
    _assert_state_equal(step_b, step_c, "run_epochs vs single kernel calls")
    want_builtin = _run_sequence(step_a, features, actions, idx, scalars, stop_on_kl=False)
    np.testing.assert_allclose(got[:, :9], want_builtin, rtol=1e-4, atol=2e-6)
    _assert_state_close(step_a, step_c, "run_epochs vs builtin")
    final = _state(step_c)
    assert int(final["global_step"][0]) == n_mb
    np.testing.assert_allclose(final["beta1_power"], 0.9 ** n_mb, rtol=1e-6)
    assert (got[n_mb // 2:, 5] > 0).all()  # the second epoch clips: the policy really moved between rows
    moved = [n for n in final if not n.startswith(("moment", "beta", "global", "learning"))
             and np.abs(final[n] - initial[n]).max() > 1e-4]
    assert len(moved) == len(list(c.trainable_params()))


@pytest.mark.parametrize("case", ["discrete-tanh-ent", "continuous-tanh-vclip-ent-kl"])
def test_run_epochs_target_kl_stops_mid_way(case):
    """With target_kl: the first row whose approx_kl > kl_limit is reported with its step skipped; later rows
    have ran = 0 and zero statistics; the state equals the single-call sequence that stops at the same row."""
    spec, cfg, (a, b, c), (step_a, step_b, step_c), single, epochs = _triple(case, target_kl=0.01)
    features, actions = _rollout(a, spec, seed=21)
    idx = _epoch_indices(seed=22, n_epochs=3)
    n_mb = len(idx)
    lr = 3e-3
    # probe on a fourth model (same weights, limit never reached): the approx_kl of every row
    spec_, kw, _ = CASES[case]
    ms.set_seed(11)
    d = ActorCritic(spec_, **kw)
    d.load_logical_parameters(a.logical_parameters())
    probe = PPOUpdateKernel(d, PPOUpdateStep(d, cfg).optimizer, cfg)
    kl = probe.run_epochs(features, actions, Tensor(idx),
                          *[Tensor(np.float32(x)) for x in (lr, 0.2, cfg.clip_range_vf or 0.0, 1e9)]).asnumpy()[:, 4]
    # stop row: the first new running maximum of approx_kl from row 2 on, not the last row
    stop = next((j for j in range(2, n_mb - 1) if kl[j] > kl[:j].max()), None)
    assert stop is not None, f"approx_kl never rises mid-way: {kl}"
    kl_limit = 0.5 * (kl[:stop].max() + kl[stop])
    scalars = [Tensor(np.float32(x)) for x in (lr, 0.2, cfg.clip_range_vf or 0.0, kl_limit)]
    got = epochs.run_epochs(features, actions, Tensor(idx), *scalars).asnumpy()
    ran = got[:, 9]
    np.testing.assert_array_equal(ran[:stop + 1], 1.0)
    np.testing.assert_array_equal(got[stop + 1:], 0.0)  # later rows: ran 0, statistics 0
    np.testing.assert_array_equal(got[:stop, 6], 1.0)
    assert got[stop, 6] == 0.0 and got[stop, 4] > kl_limit
    want_single = _run_sequence(single, features, actions, idx, scalars, stop_on_kl=True)
    assert len(want_single) == stop + 1
    np.testing.assert_array_equal(got[:stop + 1, :9], want_single)
    _assert_state_equal(step_b, step_c, "run_epochs vs single kernel calls (early stop)")
    want_builtin = _run_sequence(step_a, features, actions, idx, scalars, stop_on_kl=True)
    assert len(want_builtin) == stop + 1
    np.testing.assert_allclose(got[:stop + 1, :9], want_builtin, rtol=1e-4, atol=2e-6)
    _assert_state_close(step_a, step_c, "run_epochs vs builtin (early stop)")
    final = _state(step_c)
    assert int(final["global_step"][0]) == stop  # the stop row's step was skipped
    np.testing.assert_allclose(final["beta1_power"], 0.9 ** stop, rtol=1e-6)


def test_run_epochs_without_target_kl_runs_all_rows_and_single_call_still_works():
    """No target_kl: a tiny kl_limit stops nothing; the single-minibatch call works on the same kernel after."""
    spec, cfg, (a, b, c), (step_a, step_b, step_c), single, epochs = _triple("continuous-relu")
    features, actions = _rollout(a, spec, seed=31)
    idx = _epoch_indices(seed=32, n_epochs=1)
    scalars = [Tensor(np.float32(x)) for x in (3e-3, 0.2, 0.0, -1.0)]
    got = epochs.run_epochs(features, actions, Tensor(idx), *scalars).asnumpy()
    np.testing.assert_array_equal(got[:, 9], 1.0)
    assert int(_state(step_c)["global_step"][0]) == len(idx)
    want = _run_sequence(single, features, actions, idx, scalars, stop_on_kl=False)
    extra = Tensor(idx[0])
    np.testing.assert_array_equal(epochs(features, actions, extra, *scalars).asnumpy(),
                                  single(features, actions, extra, *scalars).asnumpy())
    np.testing.assert_array_equal(got[:, :9], want)
    _assert_state_equal(step_b, step_c, "after a single call following run_epochs")


# ---- large minibatches: row blocks on SCALEBOX_MS_KERNEL_THREADS threads --------------------------------------------

THREADS_ENV = "SCALEBOX_MS_KERNEL_THREADS"
N_LARGE, MB_LARGE = 4096, 3000  # 3000 rows: 6 blocks of 500 (not the 512 maximum: uneven split)


def test_kernel_threads_and_blocks(monkeypatch):
    """The env var is read per call; no split below 2048 rows; blocks of <= 512 rows; never more threads than
    blocks; an invalid value falls back to the hardware default."""
    from scalebox_ms.ops.custom.update import kernel_threads

    monkeypatch.setenv(THREADS_ENV, "2")
    assert kernel_threads(96) == (1, 1) and kernel_threads(256) == (1, 1) and kernel_threads(2047) == (1, 1)
    assert kernel_threads(2048) == (2, 4) and kernel_threads(MB_LARGE) == (2, 6) and kernel_threads(16384) == (2, 32)
    monkeypatch.setenv(THREADS_ENV, "1")
    assert kernel_threads(MB_LARGE) == (1, 6)
    monkeypatch.setenv(THREADS_ENV, "16")
    assert kernel_threads(2048) == (4, 4) and kernel_threads(16384) == (16, 32)
    hw = min(os.cpu_count() or 1, 8)
    for bad in ("0", "-3", "two", ""):
        monkeypatch.setenv(THREADS_ENV, bad)
        assert kernel_threads(16384) == (hw, 32), bad
    monkeypatch.delenv(THREADS_ENV)
    assert kernel_threads(16384) == (hw, 32)


@pytest.mark.parametrize("case", ["discrete-tanh-ent", "continuous-tanh-vclip-ent-kl"])
def test_large_minibatch_threads(case, monkeypatch):
    """3000-row minibatches: the kernel with 2 threads equals itself with 1 thread and a second 2-thread run bit
    for bit (single calls and run_epochs), and agrees with the builtin PPOUpdateStep."""
    from scalebox_ms.ops.custom.update import kernel_threads

    spec, kw, over = CASES[case]
    cfg = replace(PPOConfig(learning_rate=3e-3), **over)
    ms.set_seed(11)
    models = [ActorCritic(spec, **kw) for _ in range(5)]
    for m in models[1:]:
        m.load_logical_parameters(models[0].logical_parameters())
    steps = [PPOUpdateStep(m, cfg) for m in models]
    kernels = [None] + [PPOUpdateKernel(m, s.optimizer, cfg) for m, s in zip(models[1:], steps[1:])]
    features, actions = _rollout(models[0], spec, seed=41, n=N_LARGE)
    rng = np.random.default_rng(42)
    idx = np.stack([rng.permutation(N_LARGE)[:MB_LARGE] for _ in range(3)]).astype(np.int32)
    scalars = [Tensor(np.float32(x)) for x in (3e-3, 0.2, cfg.clip_range_vf or 0.0, 10.0)]
    monkeypatch.setenv(THREADS_ENV, "2")
    assert kernel_threads(MB_LARGE) == (2, 6)  # the split path really runs, on 2 threads
    want = _run_sequence(steps[0], features, actions, idx, scalars, stop_on_kl=False)
    got = {}
    for i, threads in ((1, "1"), (2, "2"), (3, "2")):  # models 1..3: single calls with 1, 2, 2 threads
        monkeypatch.setenv(THREADS_ENV, threads)
        got[i] = _run_sequence(kernels[i], features, actions, idx, scalars, stop_on_kl=False)
    got[4] = kernels[4].run_epochs(features, actions, Tensor(idx), *scalars).asnumpy()  # 2 threads
    np.testing.assert_array_equal(got[4][:, 9], 1.0)
    for i in (2, 3):
        np.testing.assert_array_equal(got[i], got[1], err_msg=f"model {i} vs 1 thread")
        _assert_state_equal(steps[1], steps[i], f"model {i} vs 1 thread")
    np.testing.assert_array_equal(got[4][:, :9], got[1])
    _assert_state_equal(steps[1], steps[4], "run_epochs (2 threads) vs single calls (1 thread)")
    np.testing.assert_allclose(got[2], want, rtol=1e-4, atol=2e-6)
    _assert_state_close(steps[0], steps[2], "2 threads vs builtin")
    assert int(_state(steps[2])["global_step"][0]) == len(idx) and (got[2][1:, 5] > 0).all()


# ---- the C++ mirrors of the Python names, and the build inputs ------------------------------------------------------

CUSTOM_DIR = os.path.dirname(build.__file__)


def _header_constants(name):
    """{identifier: int} of the ``constexpr int kX = N;`` lines and enumerators ``kX = N,`` of a header."""
    import re

    with open(os.path.join(CUSTOM_DIR, name)) as f:
        text = f.read()
    return {m[1]: int(m[2]) for m in re.finditer(r"\b(k\w+)\s*=\s*(-?\d+)\s*[;,]", text)}


def _camel(name):
    return "".join(part.capitalize() for part in name.split("_"))


def test_layout_header_mirrors_layout_py():
    """layout.h names every column of ops/layout.py, name for name, with the same values, and nothing else."""
    from scalebox_ms.ops import layout

    want = {f"kFeat{_camel(n)}": getattr(layout.FEAT, n) for n in layout.FEATURE_COLUMNS}
    want.update({f"kStat{_camel(n)}": getattr(layout.STAT, n) for n in layout.STAT_COLUMNS})
    want.update(kNFeatures=layout.N_FEATURES, kNStats=layout.N_STATS, kRan=layout.RAN)
    assert _header_constants("layout.h") == want


def test_status_codes_match_the_message_table():
    """status.h's return codes are exactly the codes ops/custom/status.py has a message for."""
    from scalebox_ms.ops.custom.status import MESSAGES

    codes = _header_constants("status.h")
    assert codes.pop("kOk") == 0
    assert sorted(codes.values()) == sorted(MESSAGES)


def test_headers_are_in_the_cache_key_and_no_cpp_file_is_long(monkeypatch, tmp_path):
    """Every header a kernel includes lies next to it (shipped as ops/custom/*.h) and is part of the cache key; a
    changed header means a new library. C++ files stay under 450 lines."""
    import re

    names = {os.path.basename(h) for h in build.headers()}
    sources = [src for src, _ in build.KERNELS.values()]
    for path in sources + sorted(names):
        with open(os.path.join(CUSTOM_DIR, path)) as f:
            text = f.read()
        assert set(re.findall(r'#include "([^"]+)"', text)) <= names, path
        assert text.count("\n") < 450, path
    key = build.library_path("ppo_update", build=False)
    extra = tmp_path / "extra.h"
    extra.write_text("// changed\n")
    real = build.headers()
    monkeypatch.setattr(build, "headers", lambda: sorted([*real, str(extra)]))
    assert build.library_path("ppo_update", build=False) != key


# ---- kernel return codes as CustomOpError ---------------------------------------------------------------------------

def _bad_call_setup(case):
    """(single, epochs, step_b, step_c, features, actions, scalars): kernels B, C on models of identical weights."""
    spec, cfg, (a, b, c), (step_a, step_b, step_c), single, epochs = _triple(case)
    features, actions = _rollout(a, spec, seed=51)
    scalars = [Tensor(np.float32(x)) for x in (3e-3, 0.2, cfg.clip_range_vf or 0.0, 10.0)]
    return single, epochs, step_b, step_c, features, actions, scalars


@pytest.mark.parametrize("entry", ["call", "run_epochs"])
def test_bad_minibatch_index_raises_custom_op_error(entry):
    """An index outside the rollout: CustomOpError naming it and code 8, nothing written, the kernel usable after."""
    single, epochs, step_b, step_c, features, actions, scalars = _bad_call_setup("continuous-relu")
    idx = np.arange(MB, dtype=np.int32)
    bad = idx.copy()
    bad[7] = N + 3
    call = epochs if entry == "call" else epochs.run_epochs
    shape = (-1,) if entry == "call" else (1, -1)
    before = _state(step_c)
    with pytest.raises(CustomOpError) as err:
        call(features, actions, Tensor(bad.reshape(shape)), *scalars)
    msg = str(err.value)
    assert msg == f"custom op 'ppo_update': minibatch index {N + 3} is outside the rollout of {N} rows " \
                  f"(kernel return code 8)"
    after = _state(step_c)
    for name in before:
        np.testing.assert_array_equal(after[name], before[name], err_msg=name)
    # still usable: the same good call on both kernels (identical weights) gives identical results
    twin = single if entry == "call" else single.run_epochs
    got = call(features, actions, Tensor(idx.reshape(shape)), *scalars).asnumpy()
    np.testing.assert_array_equal(got, twin(features, actions, Tensor(idx.reshape(shape)), *scalars).asnumpy())
    _assert_state_equal(step_b, step_c, "after a failed call")


def test_bad_discrete_action_raises_custom_op_error():
    single, epochs, step_b, step_c, features, actions, scalars = _bad_call_setup("discrete-relu-vclip-nonorm")
    wrong = actions.asnumpy().copy()
    wrong[11] = 3  # DISC3: actions 0, 1, 2
    idx = Tensor(np.arange(MB, dtype=np.int32))
    for call in (epochs, lambda *a: epochs.run_epochs(a[0], a[1], Tensor(a[2].asnumpy()[None]), *a[3:])):
        with pytest.raises(CustomOpError) as err:
            call(features, Tensor(wrong), idx, *scalars)
        assert str(err.value) == "custom op 'ppo_update': discrete action 3 is outside the action space of 3 " \
                                 "actions (kernel return code 9)"
    np.testing.assert_array_equal(epochs(features, actions, idx, *scalars).asnumpy(),
                                  single(features, actions, idx, *scalars).asnumpy())
    _assert_state_equal(step_b, step_c, "after failed calls")


def test_a_per_call_scalar_that_is_not_one_value_is_refused():
    """An empty learning-rate Tensor was read past its end: Adam's learning_rate Parameter became junk (-2.9e-4)
    and the weights moved by it, without an error."""
    single, epochs, step_b, step_c, features, actions, scalars = _bad_call_setup("continuous-relu")
    idx = Tensor(np.arange(MB, dtype=np.int32))
    before = _state(step_c)
    for k, bad in [(0, np.zeros(0, np.float32)), (3, np.zeros(2, np.float32))]:
        wrong = list(scalars)
        wrong[k] = Tensor(bad)
        with pytest.raises(CustomOpError, match=r"a per-call scalar.*\(kernel return code 5\)$"):
            epochs(features, actions, idx, *wrong)
    after = _state(step_c)
    for name in before:
        np.testing.assert_array_equal(after[name], before[name], err_msg=name)
    np.testing.assert_array_equal(epochs(features, actions, idx, *scalars).asnumpy(),
                                  single(features, actions, idx, *scalars).asnumpy())


def test_short_state_inputs_are_refused_before_the_kernel_writes_past_them():
    """Adam's moments, the log_std moments, hyper and meta were not checked against the sizes the kernel reads and
    writes (found with hand-built calls: a short moment had the float after it overwritten). The wrapper builds them
    right; here the kernel is called by hand with one of them short, and refuses before anything is written."""
    from scalebox_ms.ops.custom.status import custom_op_errors

    single, epochs, step_b, step_c, features, actions, scalars = _bad_call_setup("continuous-relu")
    idx = Tensor(np.arange(MB, dtype=np.int32))
    c = epochs.call_one
    names = ("meta", "hyper", "learning_rate", "beta1_power", "beta2_power", "global_step", "log_std", "m_log_std",
             "v_log_std")

    def call(name, short):
        state = [Tensor(getattr(c, n).asnumpy()[:-1]) if n == name else getattr(c, n) for n in names]
        moments = list(c.moment1)
        if short == "moment":
            moments[0] = Tensor(moments[0].asnumpy()[:-1])
        with custom_op_errors():
            c.op(features, actions, idx, *scalars, *state, *c.params, *moments, *c.moment2)

    for name, short, code in [("m_log_std", None, 5), ("v_log_std", None, 5), ("hyper", None, 5), ("meta", None, 13),
                              (None, "moment", 6)]:
        with pytest.raises(CustomOpError, match=rf"\(kernel return code {code}\)$"):
            call(name, short)
    _assert_state_equal(step_b, step_c, "after the refused calls")


def test_return_code_messages():
    """MindSpore's RuntimeError text is parsed for the code; unknown text passes through as None."""
    from scalebox_ms.ops.custom.status import MESSAGES, kernel_error

    text = ("Return value from CPU AOT kernel(/c/ppo_update-0a.so)'s function(PPOUpdateEpochs) is {}. Any return "
            "value not equal to 0 will be treated as user defined error code")
    for code, what in MESSAGES.items():
        err = kernel_error(RuntimeError(text.format(code)))
        assert isinstance(err, CustomOpError) and "\n" not in str(err)
        assert str(err) == f"custom op 'ppo_update': {what} (kernel return code {code})"
    assert kernel_error(RuntimeError("Invalid output number")) is None
    assert kernel_error(RuntimeError(text.replace("PPOUpdateEpochs", "SomeoneElses").format(8))) is None


# ---- the configuration guard ----------------------------------------------------------------------------------------

def test_every_config_field_is_classified():
    """Each field of PPOConfig and PolicyConfig is either implemented by the kernel or outside the update; a new
    field fails here until someone decides which (and, if the kernel must implement it, implements it)."""
    from dataclasses import fields

    from scalebox_ms.config import PolicyConfig
    from scalebox_ms.ops.custom.update import KERNEL_IMPLEMENTS, OUTSIDE_THE_UPDATE

    names = {f"ppo.{f.name}" for f in fields(PPOConfig)} | {f"policy.{f.name}" for f in fields(PolicyConfig)}
    assert not KERNEL_IMPLEMENTS & OUTSIDE_THE_UPDATE
    assert names - (KERNEL_IMPLEMENTS | OUTSIDE_THE_UPDATE) == set(), "unclassified config fields"
    assert (KERNEL_IMPLEMENTS | OUTSIDE_THE_UPDATE) - names == set(), "classified fields that do not exist"


def test_unknown_config_option_is_refused():
    """A config subclass with a loss option the kernel does not know: fine at its default, refused otherwise."""
    from dataclasses import dataclass

    from scalebox_ms.config import PolicyConfig
    from scalebox_ms.ops.custom.update import unsupported_settings

    @dataclass
    class PPOConfigPlus(PPOConfig):
        new_loss_term: float = 0.0

    @dataclass
    class PolicyConfigPlus(PolicyConfig):
        head_norm: bool = False

    model = ActorCritic(DISC)
    opt = nn.Adam(model.trainable_params())
    assert unsupported_settings(PPOConfigPlus(ent_coef=0.3, n_steps=8), PolicyConfigPlus(pi_layers=[8])) == []
    PPOUpdateKernel(model, opt, PPOConfigPlus(), policy_cfg=PolicyConfigPlus())
    cfg, policy = PPOConfigPlus(new_loss_term=0.5), PolicyConfigPlus(head_norm=True)
    assert unsupported_settings(cfg) == ["ppo.new_loss_term=0.5"]
    assert unsupported_settings(cfg, policy) == ["ppo.new_loss_term=0.5", "policy.head_norm=True"]
    with pytest.raises(CustomOpError, match=r"^custom op 'ppo_update': does not implement ppo\.new_loss_term=0\.5; "):
        PPOUpdateKernel(model, opt, cfg)
    with pytest.raises(CustomOpError, match=r"policy\.head_norm=True"):
        PPOUpdateKernel(model, opt, PPOConfigPlus(), policy_cfg=policy)
