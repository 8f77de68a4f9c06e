import numpy as np
import pytest

from scalebox_ms.envs import ObsNormalizer, RewardScaler, RunningMeanStd


def test_running_mean_std_matches_numpy_over_all_batches():
    rng = np.random.default_rng(0)
    batches = [rng.normal(loc=3.0, scale=2.0, size=(rng.integers(1, 20), 3)) for _ in range(30)]
    rms = RunningMeanStd((3,), epsilon=1e-12)
    for b in batches:
        rms.update(b)
    data = np.concatenate(batches)
    np.testing.assert_allclose(rms.mean, data.mean(0), rtol=1e-9)
    np.testing.assert_allclose(rms.var, data.var(0), rtol=1e-6)


def test_one_row_updates_give_the_general_updates_bits():
    """The one-env fast path (a batch of one row) gives exactly what the mean/var of that row give."""
    rng = np.random.default_rng(1)
    fast, general = RunningMeanStd((4,)), RunningMeanStd((4,))
    for _ in range(200):
        row = rng.normal(loc=5.0, scale=3.0, size=(1, 4)) * rng.choice([1e-3, 1.0, 1e3])
        fast.update(row)
        b_mean, b_var = row.mean(axis=0), row.var(axis=0)  # the general path, by hand
        delta = b_mean - general.mean
        total = general.count + 1
        general.mean = general.mean + delta * 1 / total
        general.var = (general.var * general.count + b_var * 1 + delta**2 * general.count * 1 / total) / total
        general.count = total
    np.testing.assert_array_equal(fast.mean, general.mean)
    np.testing.assert_array_equal(fast.var, general.var)
    assert fast.count == general.count


def test_obs_normalizer_state_roundtrip_and_clip():
    rng = np.random.default_rng(1)
    a = ObsNormalizer(2, clip=1.5)
    for _ in range(10):
        a(rng.normal(size=(4, 2)) * 5)
    b = ObsNormalizer(2, clip=99)
    b.load_state_dict(a.state_dict())
    x = rng.normal(size=(4, 2)) * 5
    np.testing.assert_array_equal(a(x, update=False), b(x, update=False))
    assert np.abs(a(np.full((1, 2), 1e6), update=False)).max() == 1.5


def test_reward_scaler_divides_by_return_std_and_skips_autoreset_steps():
    gamma = 0.9
    s = RewardScaler(2, gamma=gamma, clip=100.0)
    rewards = [np.array([1.0, 2.0]), np.array([1.0, 0.0]), np.array([3.0, 1.0])]
    dones = [np.array([False, True]), np.array([False, False]), np.array([False, False])]
    valid = [np.array([True, True]), np.array([True, False]), np.array([True, True])]
    ref_returns, seen = np.zeros(2), []
    for r, d, v in zip(rewards, dones, valid):
        out = s(r, d, v)
        ref_returns = np.where(v, ref_returns * gamma + r, ref_returns)
        seen.extend(ref_returns[v])
        var = np.var(np.asarray(seen))
        np.testing.assert_allclose(out, r / np.sqrt(var + 1e-8), rtol=1e-3)
        ref_returns[d] = 0.0


def test_a_reward_whose_return_variance_overflows_stops_with_a_training_error():
    """A finite reward of 1e200 made the return's float64 variance inf: every later scaled reward was 0, silently."""
    from scalebox_ms.errors import TrainingError

    s = RewardScaler(2, gamma=0.99)
    ones, none = np.ones(2, bool), np.zeros(2, bool)
    s(np.array([1.0, 2.0]), none, ones)
    s(np.array([1e150, 1.0]), none, ones)  # (large, but its square still fits float64)
    with pytest.raises(TrainingError, match=r"^env\.normalize_reward: the discounted return's variance overflowed "
                                            r"float64 \(a reward of 1e\+200 in this step\)"):
        s(np.array([1e200, 1.0]), none, ones)
