"""The C++ aot acting kernel (scalebox_ms.ops.custom) vs the builtin MindSpore-ops path; build cache; errors."""
import os

import mindspore as ms
import numpy as np
import pytest
from conftest import small_config
from mindspore import Tensor

from scalebox_ms.errors import ConfigError, CustomOpError
from scalebox_ms.models import SpaceSpec
from scalebox_ms.models.actor_critic import ActorCritic, ActStep
from scalebox_ms.trainers.kernels import AUTO_ACT_MAX_MACS, build_act_steps, model_macs, resolve_act_kernel
from scalebox_ms.ops import custom
from scalebox_ms.ops.custom import FusedActorKernel, build
from scalebox_ms.sandbox import Sandbox


@pytest.fixture(autouse=True, scope="module")
def _sandbox(kernel_cache):
    """CPU sandbox, and a fresh kernel cache for this module (conftest.kernel_cache)."""
    Sandbox(device="auto", seed=0)


CASES = {
    # name: (spec, ActorCritic kwargs)
    "discrete-2x64-tanh-dense": (SpaceSpec(4, True, 2), {"pi_layers": (64, 64), "vf_layers": (64, 64), "activation": "tanh"}),
    "discrete-1x5-relu-fused": (SpaceSpec(6, True, 3), {"pi_layers": (5,), "vf_layers": (7,), "activation": "relu",
                                                            "layer": "fused", "align": 4}),
    "continuous-1x32-relu-fused": (SpaceSpec(3, False, 2, low=(-1.0, -1.0), high=(1.0, 1.0)),
                                   {"pi_layers": (32,), "vf_layers": (32,), "activation": "relu", "layer": "fused",
                                        "log_std_init": -0.7}),
    "continuous-2x24-tanh-dense": (SpaceSpec(5, False, 3, low=(-1.0,) * 3, high=(1.0,) * 3),
                                   {"pi_layers": (24, 17), "vf_layers": (24, 24), "activation": "tanh", "log_std_init": 0.3}),
}


def _inputs(spec, batch, seed):
    rng = np.random.default_rng(seed)
    obs = (rng.normal(size=(batch, spec.obs_dim)) * 2).astype(np.float32)
    noise = rng.gumbel(size=(batch, spec.action_dim)) if spec.discrete else rng.normal(size=(batch, spec.action_dim))
    return Tensor(obs), Tensor(noise.astype(np.float32))


@pytest.mark.parametrize("case", list(CASES))
def test_custom_kernel_matches_builtin(case):
    spec, kw = CASES[case]
    ms.set_seed(3)
    model = ActorCritic(spec, ortho_init=False, **kw)  # MindSpore's default init: larger weights than orthogonal
    builtin, kernel = ActStep(model, packed=True), ActStep(model, packed=True, kernel="custom")
    width = 1 if spec.discrete else spec.action_dim
    for batch in (1, 4, 5, 13, 64):  # up to 4: W read as stored (no transposed copy); 13: partial row tiles
        obs, noise = _inputs(spec, batch, batch)
        ref, out = builtin(obs, noise).asnumpy(), kernel(obs, noise).asnumpy()
        assert out.shape == ref.shape == (batch, width + 2)
        if spec.discrete:
            np.testing.assert_array_equal(out[:, 0], ref[:, 0])  # the sampled actions
        # MindSpore's CPU tanh is ~1e-6 off (the kernel's is ~1e-7), log-probs sum over action dims
        np.testing.assert_allclose(out, ref, rtol=1e-4, atol=3e-5)
        assert np.abs(ref[:, -1]).max() > 1e-3 and np.abs(ref[:, width]).max() > 1e-3  # non-trivial values


@pytest.mark.parametrize("case", list(CASES))
def test_large_batches_split_over_threads_give_the_same_results(case, monkeypatch):
    """From 2048 rows the kernel shares its row blocks out to SCALEBOX_MS_KERNEL_THREADS threads: any thread count
    gives the single-thread outputs bit for bit, and they match the builtin path; the unpacked (action, log_prob,
    value) of ActStep are the packed columns."""
    spec, kw = CASES[case]
    ms.set_seed(5)
    model = ActorCritic(spec, ortho_init=False, **kw)
    builtin, kernel = ActStep(model, packed=True), ActStep(model, packed=True, kernel="custom")
    unpacked = ActStep(model, kernel="custom")
    width = 1 if spec.discrete else spec.action_dim
    obs, noise = _inputs(spec, 4099, 11)  # not a whole number of row blocks
    outs = {}
    for threads in ("1", "2", "3"):
        monkeypatch.setenv("SCALEBOX_MS_KERNEL_THREADS", threads)
        outs[threads] = kernel(obs, noise).asnumpy()
    for threads, out in outs.items():
        np.testing.assert_array_equal(out.view(np.uint32), outs["1"].view(np.uint32), err_msg=f"{threads} threads")
    ref = builtin(obs, noise).asnumpy()
    if spec.discrete:
        assert (outs["1"][:, 0] == ref[:, 0]).mean() > 0.999  # (a Gumbel tie within float tolerance may differ)
    np.testing.assert_allclose(outs["1"][:, width:], ref[:, width:], rtol=1e-4, atol=3e-5)
    action, log_prob, value = (x.asnumpy() for x in unpacked(obs, noise))
    np.testing.assert_array_equal(action.astype(np.float32).reshape(4099, -1), outs["2"][:, :width])
    np.testing.assert_array_equal(log_prob, outs["2"][:, width])
    np.testing.assert_array_equal(value, outs["2"][:, width + 1])
    assert action.dtype == (np.int32 if spec.discrete else np.float32) and log_prob.shape == value.shape == (4099,)


@pytest.mark.parametrize("case", list(CASES))
def test_direct_call_gives_the_graph_kernels_outputs_and_reads_weights_on_sync(case):
    from scalebox_ms.errors import CustomOpError
    from scalebox_ms.ops.custom.direct import DirectActorKernel

    spec, kw = CASES[case]
    ms.set_seed(4)
    model = ActorCritic(spec, ortho_init=False, **kw)
    kernel, direct = ActStep(model, packed=True, kernel="custom"), DirectActorKernel(model)
    for batch in (1, 4, 5, 13):
        obs, noise = _inputs(spec, batch, 100 + batch)
        np.testing.assert_array_equal(direct(obs.asnumpy(), noise.asnumpy()), kernel(obs, noise).asnumpy())
    obs, noise = _inputs(spec, 3, 7)
    before = direct(obs.asnumpy(), noise.asnumpy())
    rng = np.random.default_rng(9)
    model.load_logical_parameters([(n, (0.2 * rng.normal(size=p.shape)).astype(np.float32))
                                   for n, p in model.logical_parameters()])
    np.testing.assert_array_equal(direct(obs.asnumpy(), noise.asnumpy()), before)  # numpy copies until sync
    direct.sync()
    after = direct(obs.asnumpy(), noise.asnumpy())
    np.testing.assert_array_equal(after, kernel(obs, noise).asnumpy())
    assert np.abs(after[:, -1] - before[:, -1]).max() > 1e-3
    with pytest.raises(CustomOpError, match=r"fused_actor_mlp': an input has the wrong shape .*: obs \(2, "):
        direct(np.zeros((2, spec.obs_dim + 1), np.float32), noise.asnumpy()[:2])


def test_unpacked_outputs_and_current_weights():
    spec, kw = CASES["discrete-2x64-tanh-dense"]
    model = ActorCritic(spec, **kw)
    builtin, kernel = ActStep(model), ActStep(model, kernel="custom")
    obs, noise = _inputs(spec, 32, 0)
    a_ref, lp_ref, v_ref = builtin(obs, noise)
    a, lp, v = kernel(obs, noise)
    assert a.dtype == a_ref.dtype == ms.int32 and a.shape == (32,) and lp.shape == v.shape == (32,)
    np.testing.assert_array_equal(a.asnumpy(), a_ref.asnumpy())
    np.testing.assert_allclose(lp.asnumpy(), lp_ref.asnumpy(), rtol=1e-4, atol=3e-5)
    np.testing.assert_allclose(v.asnumpy(), v_ref.asnumpy(), rtol=1e-4, atol=3e-5)
    # weights are kernel inputs: a compiled assign (as after an optimizer step / checkpoint load) is seen
    rng = np.random.default_rng(9)
    new = [(n, (0.2 * rng.normal(size=p.shape)).astype(np.float32)) for n, p in model.logical_parameters()]
    model.load_logical_parameters(new)
    _a2, lp2, v2 = kernel(obs, noise)
    b2 = builtin(obs, noise)
    assert np.abs(v2.asnumpy() - v.asnumpy()).max() > 1e-2
    np.testing.assert_allclose(v2.asnumpy(), b2[2].asnumpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(lp2.asnumpy(), b2[1].asnumpy(), rtol=1e-4, atol=1e-4)


def test_kernel_is_inference_only():
    spec, kw = CASES["continuous-1x32-relu-fused"]
    model = ActorCritic(spec, **kw)
    kernel = FusedActorKernel(model)
    obs, noise = _inputs(spec, 4, 1)

    def loss(o, n):
        return kernel(o, n).sum()

    grad = ms.jit(ms.value_and_grad(loss, grad_position=None, weights=model.trainable_params()))
    with pytest.raises(RuntimeError, match="bprop not defined"):
        grad(obs, noise)


def test_library_is_cached_and_reused(tmp_path, monkeypatch):
    monkeypatch.setenv("SCALEBOX_MS_CUSTOM_OPS_CACHE", str(tmp_path / "cache"))
    before = dict(build.stats)
    so = build.library_path("fused_actor_mlp")
    assert build.stats["compiles"] == before["compiles"] + 1
    assert os.path.dirname(so) == str(tmp_path / "cache") and so.endswith(".so")
    mtime = os.stat(so).st_mtime_ns
    assert build.library_path("fused_actor_mlp") == so  # second build: cache hit, no compile
    assert build.stats["compiles"] == before["compiles"] + 1 and build.stats["cache_hits"] > before["cache_hits"]
    assert os.stat(so).st_mtime_ns == mtime
    assert sorted(os.listdir(tmp_path / "cache")) == [os.path.basename(so)]  # no temp files left behind
    # different flags -> a different key and a new library next to the old one
    monkeypatch.setattr(build, "CXX_FLAGS", build.CXX_FLAGS + ("-DSCALEBOX_TEST_FLAG",))
    so2 = build.library_path("fused_actor_mlp")
    assert so2 != so and build.stats["compiles"] == before["compiles"] + 2
    assert custom.kernel_available()
    with pytest.raises(CustomOpError, match="unknown kernel"):
        build.library_path("no_such_kernel")


def test_missing_compiler_is_a_clear_error_and_auto_falls_back(tmp_path, monkeypatch):
    monkeypatch.setenv("SCALEBOX_MS_CUSTOM_OPS_CACHE", str(tmp_path / "empty"))
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-g++"))
    with pytest.raises(CustomOpError, match="compiler .*no-such-g\\+\\+.* not found") as err:
        build.library_path("fused_actor_mlp")
    assert "\n" not in str(err.value)
    assert not custom.compiler_available() and not custom.kernel_available()
    spec, kw = CASES["discrete-2x64-tanh-dense"]
    model = ActorCritic(spec, **kw)
    with pytest.raises(CustomOpError, match="not found"):
        ActStep(model, kernel="custom")
    cfg = small_config(policy={"act_kernel": "auto"}).policy
    assert resolve_act_kernel(model, "auto", 8) == ("builtin", "no C++ compiler and no cached kernel")
    assert build_act_steps(model, cfg, 8)[0].kernel == "builtin"
    with pytest.raises(CustomOpError, match=r"^policy\.act_kernel: custom: .*not found"):
        build_act_steps(model, small_config(policy={"act_kernel": "custom"}).policy, 8)
    # a compiler that fails: the first error line, on one line
    monkeypatch.setenv("CXX", "false")
    with pytest.raises(CustomOpError, match="failed \\(exit 1\\)"):
        build.library_path("fused_actor_mlp")


def test_act_kernel_resolution_follows_the_measured_rule():
    spec, kw = CASES["discrete-2x64-tanh-dense"]
    model = ActorCritic(spec, **kw)
    macs = model_macs(model)
    assert macs == (4 * 64 + 64 * 64 + 64 * 2) + (4 * 64 + 64 * 64 + 64)
    small, large = AUTO_ACT_MAX_MACS // macs, AUTO_ACT_MAX_MACS // macs + 1
    assert resolve_act_kernel(model, "auto", small)[0] == "custom"
    assert resolve_act_kernel(model, "auto", large)[0] == "builtin"
    assert resolve_act_kernel(model, "builtin", 8)[0] == "builtin"
    assert resolve_act_kernel(model, "custom", 10**6)[0] == "custom"
    with pytest.raises(ConfigError, match="act_kernel"):
        resolve_act_kernel(model, "fast", 8)
    step, packed = build_act_steps(model, small_config(policy={"act_kernel": "auto"}).policy, 8)
    assert step.kernel == packed.kernel == "custom" and packed.packed and not step.packed
    assert build_act_steps(model, small_config().policy, 8)[0].kernel == "builtin"
    with pytest.raises(ConfigError, match="act kernel"):
        ActStep(model, kernel="cuda")


def test_kernel_return_code_is_a_custom_op_error():
    """An observation batch of the wrong width reaches the kernel (its output shape does not depend on it): code 5
    as a one-line CustomOpError; the kernel works again with the right width."""
    spec, kw = CASES["discrete-2x64-tanh-dense"]
    model = ActorCritic(spec, **kw)
    kernel = FusedActorKernel(model)
    obs, noise = _inputs(spec, 8, 0)
    want = kernel(obs, noise).asnumpy()
    wide = Tensor(np.zeros((8, spec.obs_dim + 1), np.float32))
    with pytest.raises(CustomOpError) as err:
        kernel(wide, noise)
    assert str(err.value).startswith("custom op 'fused_actor_mlp': an input has the wrong shape")
    assert str(err.value).endswith("(kernel return code 5)") and "\n" not in str(err.value)
    np.testing.assert_array_equal(kernel(obs, noise).asnumpy(), want)


def test_noise_rows_must_match_the_observations_and_an_empty_batch_is_refused():
    """Fewer noise rows than observations reached the kernel, which read past their end (actions from whatever
    memory followed); an empty batch killed the process (SIGFPE in MindSpore's Split of the empty output)."""
    spec, kw = CASES["discrete-2x64-tanh-dense"]
    model = ActorCritic(spec, **kw)
    obs, noise = _inputs(spec, 8, 0)
    short = Tensor(noise.asnumpy()[:2])
    with pytest.raises(CustomOpError, match="kernel return code 5"):
        FusedActorKernel(model)(obs, short)
    for kernel in ("custom", "builtin"):
        with pytest.raises(ValueError, match=r"^ActStep: noise needs one row per observation \(2 rows for 8\)$"):
            ActStep(model, kernel=kernel)(obs, short)
        with pytest.raises(ValueError, match=r"^ActStep: an empty batch \(0 observations\)$"):
            ActStep(model, kernel=kernel)(Tensor(np.zeros((0, spec.obs_dim), np.float32)),
                                          Tensor(np.zeros((0, spec.action_dim), np.float32)))


def test_short_log_std_meta_or_output_are_refused_by_the_kernel():
    """A short log_std was read past its end (actions from whatever memory followed), a short meta too, a narrow
    output written past its end; an unknown activation id made the hidden layers linear. The wrapper builds them
    right; here the kernel is called by hand with one of them wrong."""
    from mindspore import ops

    from scalebox_ms.ops.custom.actor import KERNEL, func_spec
    from scalebox_ms.ops.custom.status import custom_op_errors

    spec, kw = CASES["continuous-2x24-tanh-dense"]
    kernel = FusedActorKernel(ActorCritic(spec, **kw))
    obs, noise = _inputs(spec, 8, 0)
    meta = kernel.meta.asnumpy()
    activation = meta.copy()
    activation[3] = 7  # (mlp.h's kMetaActivation)

    def call(log_std=kernel.log_std, meta=kernel.meta, width=kernel.width + 2):
        op = ops.Custom(func_spec(KERNEL), out_shape=lambda o, *rest: (o[0], width), out_dtype=lambda o, *rest: o,
                        func_type="aot")
        with custom_op_errors():
            return op(obs, noise, meta, log_std, *kernel.params)

    assert call().shape == (8, kernel.width + 2)
    for bad, code in [(dict(log_std=Tensor(kernel.log_std.asnumpy()[:1])), 5),
                      (dict(width=kernel.width + 1), 5),
                      (dict(meta=Tensor(meta[:-1])), 13),
                      (dict(meta=Tensor(meta.astype(np.float32))), 13),
                      (dict(meta=Tensor(activation)), 13)]:
        with pytest.raises(CustomOpError, match=rf"\(kernel return code {code}\)$"):
            call(**bad)
