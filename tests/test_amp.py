"""Mixed precision: casting per amp level, dynamic loss scaling with overflow skip, checkpointed scaler state."""
import mindspore as ms
import numpy as np
import pytest
from conftest import run_module, small_config

from scalebox_ms import Config
from scalebox_ms.amp import AutoMixedPrecision
from scalebox_ms.envs.spaces import SpaceSpec
from scalebox_ms.errors import ConfigError
from scalebox_ms.models import build_model
from scalebox_ms.trainers.ppo_update import PPOUpdateStep, pack_features


def _batch(B=32, seed=0, poison=False):
    rng = np.random.default_rng(seed)
    obs = rng.normal(size=(B, 4)).astype(np.float32)
    if poison:
        obs[3, 1] = np.inf  # -> non-finite gradients
    cols = [rng.normal(size=B) - 0.7, rng.normal(size=B), rng.normal(size=B), rng.normal(size=B), np.ones(B)]
    return [ms.Tensor(pack_features(obs, *cols)), ms.Tensor(rng.integers(0, 2, B).astype(np.int32)),
            ms.Tensor(np.arange(B, dtype=np.int32))]


SCALARS = [ms.Tensor(np.float32(x)) for x in (1e-3, 0.2, np.inf, np.inf)]


def _step(level="O2", seed=7, **amp_kw):
    cfg = Config()
    ms.set_seed(seed)
    model = build_model(SpaceSpec(4, True, 2), cfg.policy)
    amp = None
    if level != "O0":
        amp = AutoMixedPrecision(level, **amp_kw)
        amp.apply(model)
    return model, PPOUpdateStep(model, cfg.ppo, amp=amp)


def _opt_state(step):
    opt = step.optimizer
    return [p.asnumpy().copy() for p in list(opt.parameters) + list(opt.moment1) + list(opt.moment2)] + \
           [opt.beta1_power.asnumpy().copy(), opt.beta2_power.asnumpy().copy(), opt.global_step.asnumpy().copy()]


def test_overflow_skips_the_step_and_backs_off_the_scale():
    _, step = _step(init_scale=1024.0)
    before = _opt_state(step)
    out = step(*_batch(poison=True), *SCALARS).asnumpy()
    assert out[7] == 0.0  # not finite
    after = _opt_state(step)
    assert all(np.array_equal(a, b) for a, b in zip(before, after)), "an overflow step must not touch anything"
    assert float(step.loss_scale.asnumpy()) == 512.0
    assert int(step.skipped_steps.asnumpy()) == 1 and int(step.good_steps.asnumpy()) == 0
    # a clean step afterwards is applied at the backed-off scale
    out = step(*_batch(), *SCALARS).asnumpy()
    assert out[7] == 1.0 and out[8] == 512.0
    assert not np.array_equal(before[0], _opt_state(step)[0])


def test_scale_grows_after_the_interval_and_never_drops_below_one():
    _, step = _step(init_scale=4.0, growth_interval=3, growth_factor=2.0, backoff_factor=0.25)
    scales = [float(step(*_batch(seed=i), *SCALARS).asnumpy()[8]) for i in range(7)]
    assert scales == [4.0, 4.0, 8.0, 8.0, 8.0, 16.0, 16.0]
    assert int(step.good_steps.asnumpy()) == 1
    for _ in range(3):  # 16 -> 4 -> 1 -> 1 (floor)
        step(*_batch(poison=True), *SCALARS)
    assert float(step.loss_scale.asnumpy()) == 1.0
    assert int(step.skipped_steps.asnumpy()) == 3


def test_the_scale_never_grows_to_infinity():
    """A growth past float32's range made the scale inf, where backing off (inf x 0.5) left it: every later step was
    skipped (DQN completed having learned nothing, silently) or its loss non-finite (PPO stopped, blaming the
    env's scale)."""
    _, step = _step(init_scale=8.0, growth_interval=1, growth_factor=3e38)  # (2.4e39 is beyond float32: inf)
    scales = [float(step(*_batch(seed=i), *SCALARS).asnumpy()[8]) for i in range(3)]
    assert scales == [8.0] * 3 and int(step.skipped_steps.asnumpy()) == 0


@pytest.mark.parametrize("level", ["O1", "O2", "O3"])
def test_amp_step_matches_fp32_within_half_precision(level):
    """Loss and Adam's first moment are unscaled: they match the float32 step to fp16 accuracy, not 1024x off."""
    _, ref = _step("O0")
    _, amp = _step(level, init_scale=1024.0)
    out_ref = ref(*_batch(), *SCALARS).asnumpy()
    out_amp = amp(*_batch(), *SCALARS).asnumpy()
    np.testing.assert_allclose(out_amp[:4], out_ref[:4], rtol=2e-2, atol=2e-3)
    m_ref = np.concatenate([m.asnumpy().ravel() for m in ref.optimizer.moment1])
    m_amp = np.concatenate([m.asnumpy().ravel() for m in amp.optimizer.moment1])
    assert np.abs(m_amp - m_ref).max() <= 0.02 * np.abs(m_ref).max()


def test_apply_keeps_names_and_float32_master_weights():
    cfg = Config()
    dense = build_model(SpaceSpec(4, True, 2), cfg.policy)
    names = [n for n, _ in dense.parameters_and_names()]
    for level in ("O1", "O2", "O3"):
        model = build_model(SpaceSpec(4, True, 2), cfg.policy)
        AutoMixedPrecision(level).apply(model)
        assert [n for n, _ in model.parameters_and_names()] == names
        assert all(p.dtype == ms.float32 for p in model.trainable_params())
    model = build_model(SpaceSpec(4, True, 2), cfg.policy)
    AutoMixedPrecision("O2").apply(model)

    @ms.jit
    def logits(x):
        return model.pi_net(x), model._policy_out(x)

    raw, head = logits(ms.Tensor(np.ones((2, 4), np.float32)))
    assert raw.dtype == ms.float16 and head.dtype == ms.float32  # MLP in fp16, distribution maths in fp32


@pytest.mark.integration
def test_bad_amp_settings_are_config_errors():
    with pytest.raises(ConfigError, match=r"amp\.level"):
        Config.from_dict({"amp": {"level": "O4"}})
    with pytest.raises(ConfigError, match=r"amp\.backoff_factor"):
        Config.from_dict({"amp": {"backoff_factor": 1.5}})
    with pytest.raises(ConfigError, match=r"amp\.growth_interval"):
        AutoMixedPrecision("O2", growth_interval=0)
    from scalebox_ms.trainers import PPOTrainer

    with pytest.raises(ConfigError, match=r"amp\.dtype: bfloat16 MatMul is not supported on CPU"):
        PPOTrainer(small_config(amp={"level": "O2", "dtype": "bfloat16"}))
    r = run_module("train", "--set", "amp.level=O2", "--set", "amp.dtype=bfloat16", "--total-steps", "64")
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1].startswith("error: amp.dtype")


def test_scaler_state_is_checkpointed_and_logged(tmp_path):
    from scalebox_ms.trainers import PPOTrainer

    cfg = small_config(amp={"level": "O2", "init_scale": 65536.0, "growth_interval": 5})
    tr = PPOTrainer(cfg)
    tr.learn(total_steps=256)
    m = tr._last_metrics
    assert "loss_scale" in m and "amp_skipped_steps" in m and "amp_overflows" in m
    scale = float(tr.update_step.loss_scale.asnumpy())
    good = int(tr.update_step.good_steps.asnumpy())
    assert scale == m["loss_scale"]
    assert (scale, good) != (65536.0, 0), "the scaler state must have moved for this test to mean anything"
    path = tr.save(str(tmp_path / "ck"))
    names = [n for n, _ in tr._named_state()]
    assert {"amp.loss_scale", "amp.good_steps", "amp.skipped_steps"} <= set(names)
    again = PPOTrainer.from_checkpoint(path)
    assert float(again.update_step.loss_scale.asnumpy()) == scale
    assert int(again.update_step.good_steps.asnumpy()) == good
    assert again.parameters_sha256() == tr.parameters_sha256()
    fp32 = PPOTrainer(small_config())  # the AMP run's weights in float32: the loss scaler is left out
    fp32.load(path)
    assert fp32.parameters_sha256() == tr.parameters_sha256()
    tr.close()
    again.close()
    fp32.close()


def test_a_real_fp16_overflow_is_skipped_not_taken_for_a_kl_stop():
    """init_scale 2**40 overflows fp16 in the backward pass: every step of the first update is skipped and backs off;
    with target_kl set the update must not end early (the KL check of a non-finite step is meaningless)."""
    from scalebox_ms.trainers import PPOTrainer

    tr = PPOTrainer(small_config(amp={"level": "O2", "init_scale": 2.0 ** 40}, ppo={"target_kl": 0.01}))
    tr.learn(total_steps=64)  # one iteration: 2 epochs x 2 minibatches
    m = tr._last_metrics
    assert m["amp_overflows"] == m["minibatch_steps"] == 4
    assert m["early_stopped"] == 0 and m["n_updates"] == 0
    assert m["loss_scale"] == 2.0 ** 36 and m["amp_skipped_steps"] == 4
    tr.close()


def test_all_finite_inside_a_graph_sees_inf_nan_and_fp16_overflow():
    """The update step's finite check (mindspore.amp.all_finite) inside a compiled graph, over several tensors."""
    from scalebox_ms.amp import all_finite

    @ms.jit
    def check(a, b):
        return all_finite((a * 2, b))

    ok = np.ones((3, 2), np.float32)
    assert bool(check(ms.Tensor(ok), ms.Tensor(ok[0])).asnumpy())
    for bad in (np.inf, -np.inf, np.nan):
        b = ok[0].copy()
        b[1] = bad
        assert not bool(check(ms.Tensor(ok), ms.Tensor(b)).asnumpy())
    half = np.array([[40000.0, 1.0]], np.float16)  # doubling overflows float16 to inf inside the graph
    assert not bool(check(ms.Tensor(half), ms.Tensor(np.ones(2, np.float16))).asnumpy())
    assert bool(check(ms.Tensor(half / 2), ms.Tensor(np.ones(2, np.float16))).asnumpy())


def test_the_export_sidecar_records_the_amp_level_its_graph_computes_in(tmp_path):
    """An AMP model's graph runs its fp16 casts; the sidecar (and export's message) used to call it fp32."""
    from scalebox_ms.export import MindIRPolicy, export_mindir
    from scalebox_ms.trainers import PPOTrainer

    tr = PPOTrainer(small_config(amp={"level": "O2"}))
    try:
        sidecar = export_mindir(tr, str(tmp_path / "amp.mindir"))
        assert sidecar["amp"] == {"level": "O2", "dtype": "float16"}
        obs = np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32)
        np.testing.assert_array_equal(MindIRPolicy(str(tmp_path / "amp.mindir"))(obs), tr.predict(obs))
        tr.learn(until=64)  # (INT8 calibration needs a trained policy)
        int8 = export_mindir(tr, str(tmp_path / "amp_int8.mindir"), int8=True, calibrate_steps=32)
        assert int8["amp"] == {"level": "O0", "dtype": None}  # (QuantDense computes in float32: not O2/float16)
    finally:
        tr.close()
    # O3 casts the heads too: a Box policy's graph gave float16 actions where its sidecar said float32
    tr = PPOTrainer(small_config(env={"id": "Pendulum-v1", "num_envs": 2}, amp={"level": "O3"}))
    try:
        sidecar = export_mindir(tr, str(tmp_path / "o3.mindir"))
        obs = np.random.default_rng(0).normal(size=(8, 3)).astype(np.float32)
        actions = MindIRPolicy(str(tmp_path / "o3.mindir"))(obs)
        assert sidecar["output"]["dtype"] == "float32" == actions.dtype
        np.testing.assert_array_equal(actions, tr.predict(obs))
    finally:
        tr.close()
