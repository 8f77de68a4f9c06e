"""INT8 post-training quantization vs numpy references (true int32 arithmetic for L2)."""
import mindspore as ms
import numpy as np
import pytest

from conftest import small_config
from scalebox_ms import ConfigError
from scalebox_ms.models import SpaceSpec, build_model
from scalebox_ms.quant import DynamicQuantizer, QuantDense, collect_calibration_data, quantize_weight_per_channel
from scalebox_ms.sandbox import Sandbox


@pytest.fixture(autouse=True, scope="module")
def _sandbox():
    Sandbox(device="auto", seed=0)


def test_per_channel_weights_roundtrip_within_half_a_step():
    rng = np.random.default_rng(0)
    w = rng.normal(size=(16, 8)).astype(np.float32)
    w[3] = 0.0  # an all-zero channel must not divide by zero
    q, s = quantize_weight_per_channel(w)
    assert q.dtype == np.int8 and s.shape == (16,) and np.abs(q).max() == 127
    assert np.all(np.abs(q.astype(np.float32) * s[:, None] - w) <= s[:, None] / 2 + 1e-7)
    assert np.all(q[3] == 0)


def test_quant_dense_l1_matches_dequantised_reference():
    rng = np.random.default_rng(1)
    w, b, x = rng.normal(size=(6, 5)), rng.normal(size=6), rng.normal(size=(10, 5)).astype(np.float32)
    q, s = quantize_weight_per_channel(w)
    pre = x @ (q.astype(np.float64) * s[:, None]).T + b
    np.testing.assert_allclose(QuantDense(w, b, None)(ms.Tensor(x)).asnumpy(), pre, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(QuantDense(w, b, "relu")(ms.Tensor(x)).asnumpy(), np.maximum(pre, 0), rtol=1e-5, atol=1e-6)
    # MindSpore's CPU tanh differs from numpy's by up to ~1e-4 near saturation
    np.testing.assert_allclose(QuantDense(w, b, "tanh")(ms.Tensor(x)).asnumpy(), np.tanh(pre), atol=2e-4)


def test_quant_dense_l2_equals_true_int32_arithmetic():
    rng = np.random.default_rng(2)
    w, b = rng.normal(size=(32, 64)), rng.normal(size=32)
    x = rng.normal(size=(50, 64)).astype(np.float32) * 3
    sx = float(np.abs(x).max() / 127)
    layer = QuantDense(w, b, None, input_scale=sx)
    q, s = quantize_weight_per_channel(w)
    xq = np.clip(np.rint(x / np.float32(sx)), -127, 127).astype(np.int8)
    acc = xq.astype(np.int32) @ q.astype(np.int32).T  # what an int8 kernel with int32 accumulators computes
    ref = acc * (s * sx) + b
    np.testing.assert_allclose(layer(ms.Tensor(x)).asnumpy(), ref, rtol=1e-5, atol=1e-5)


def test_quantizer_input_validation():
    with pytest.raises(ConfigError, match="calibrate_steps"):
        DynamicQuantizer(calibrate_steps=0)
    with pytest.raises(ConfigError, match="quant_level: 'L3'"):
        DynamicQuantizer(quant_level="L3")
    with pytest.raises(ConfigError, match="activation_calibration"):
        DynamicQuantizer(activation_calibration="kl")
    model = build_model(SpaceSpec(4, True, 2), small_config().policy)
    q = DynamicQuantizer()
    with pytest.raises(ConfigError, match="non-empty"):
        q(model, np.zeros((0, 4)))
    with pytest.raises(ConfigError, match="3 features"):
        q(model, np.zeros((5, 3)))
    for bad in (np.nan, np.inf):  # (L2: NaN gave a scale of 1.0, inf quantised every input to 0: a constant action)
        data = np.zeros((5, 4))
        data[2, 1] = bad
        for level in ("L1", "L2"):
            with pytest.raises(ConfigError, match="calibration data holds NaN or infinity"):
                DynamicQuantizer(quant_level=level)(model, data)
    with pytest.raises(ConfigError, match="no policy Dense layers"):
        q(ms.nn.Dense(4, 2), np.zeros((5, 4)))


def test_untrained_trainer_is_refused():
    from scalebox_ms.trainers import PPOTrainer

    tr = PPOTrainer(small_config())
    with pytest.raises(ConfigError, match=r"untrained \(global_step 0\); .* load a later checkpoint \(export --checkpoint\)$"):
        DynamicQuantizer()(tr, np.zeros((5, 4), np.float32))
    tr.close()


@pytest.mark.parametrize("level, calib", [("L1", "minmax"), ("L2", "minmax"), ("L2", "percentile")])
def test_quantized_policy_agrees_with_float_policy(level, calib):
    from scalebox_ms.trainers import PPOTrainer

    tr = PPOTrainer(small_config(run={"total_steps": 1024}))
    tr.learn()
    data = collect_calibration_data(tr, 300)
    assert data.shape == (300, 4)
    qp = DynamicQuantizer(300, level, calib, percentile=99.0)(tr, data)
    assert qp.info["level"] == level and qp.info["calibration_samples"] == 300
    if level == "L2":
        assert all(s is not None and s > 0 for s in qp.info["input_scales"])
    got = qp(ms.Tensor(data)).asnumpy()
    want = tr.deterministic_step(ms.Tensor(data)).asnumpy()
    assert (got == want).mean() >= 0.95
    tr.close()


def test_a_quantized_squashed_policy_maps_saturated_outputs_like_the_float_one():
    """SAC/TD3's INT8 graph took MindSpore's CPU tanh, which returns up to 1.0000098 near 5 and exactly 1 beyond:
    actions above the Box's high bound, and another policy than the float graph (models.offpolicy.squash)."""
    from scalebox_ms.quant.ptq import QuantDense, QuantizedPolicy

    pre = np.array([[4.99, 6.0, -4.99, 0.3]], np.float32)
    layer = QuantDense(np.zeros((4, 2), np.float32), pre[0], None)
    policy = QuantizedPolicy([layer], discrete=False, low=[-2.0] * 4, high=[2.0] * 4, output="tanh")
    got = policy(ms.Tensor(np.zeros((1, 2), np.float32))).asnumpy()
    assert np.abs(got).max() <= 2.0
    np.testing.assert_allclose(got, -2.0 + (np.tanh(pre.astype(np.float64)) + 1.0) * 2.0, atol=1e-6)
