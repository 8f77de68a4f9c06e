"""Vectorised GAE vs a plain per-env, per-episode reference written from the definition."""
import numpy as np
import pytest

from scalebox_ms.buffers import compute_gae


def reference_gae(rewards, values, last_values, terminated, truncated, valid, gamma, lam):
    """Split each env's stream into episode segments and apply the textbook recursion to each."""
    T, N = rewards.shape
    adv = np.zeros((T, N))
    for i in range(N):
        t = 0
        while t < T:
            if not valid[t, i]:
                t += 1
                continue
            seg = []  # consecutive valid steps of one episode
            while t < T and valid[t, i]:
                seg.append(t)
                if terminated[t, i] or truncated[t, i]:
                    break
                t += 1
            end = seg[-1]
            if terminated[end, i]:
                bootstrap = 0.0
            else:  # truncated, or the rollout ended mid-episode: V of the next observation
                bootstrap = values[end + 1, i] if end + 1 < T else last_values[i]
            next_value = bootstrap
            running = 0.0
            for s in reversed(seg):
                delta = rewards[s, i] + gamma * next_value - values[s, i]
                running = delta + gamma * lam * running
                adv[s, i] = running
                next_value = values[s, i]
            t = end + 1
    returns = (adv + values) * valid
    return adv, returns


def random_rollout(rng, T, N):
    rewards = rng.normal(size=(T, N)).astype(np.float32)
    values = rng.normal(size=(T, N)).astype(np.float32)
    last = rng.normal(size=N).astype(np.float32)
    terminated = np.zeros((T, N), bool)
    truncated = np.zeros((T, N), bool)
    valid = np.ones((T, N), bool)
    for i in range(N):
        t = 0
        while t < T:
            u = rng.random()
            if u < 0.08:
                terminated[t, i] = True
            elif u < 0.14:
                truncated[t, i] = True
            if terminated[t, i] or truncated[t, i]:
                if t + 1 < T:
                    valid[t + 1, i] = False  # NEXT_STEP autoreset step
                    rewards[t + 1, i] = 0.0
                t += 2
            else:
                t += 1
    return rewards, values, last, terminated, truncated, valid


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("gamma, lam", [(0.99, 0.95), (0.98, 0.8), (1.0, 1.0), (0.9, 0.0)])
def test_gae_matches_reference(seed, gamma, lam):
    rng = np.random.default_rng(seed)
    batch = random_rollout(rng, 64, 6)
    assert batch[3].any() and batch[4].any(), "the rollout must contain terminations and truncations"
    adv, ret = compute_gae(*batch, gamma, lam)
    ref_adv, ref_ret = reference_gae(*batch, gamma, lam)
    np.testing.assert_allclose(adv, ref_adv, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ret, ref_ret, rtol=1e-5, atol=1e-5)


def test_truncation_bootstraps_and_termination_does_not():
    # one env, 4 steps: step 1 truncated (final obs value 10 seen at step 2), step 2 is the autoreset step
    rewards = np.array([[1.0], [1.0], [0.0], [1.0]], np.float32)
    values = np.array([[0.0], [0.0], [10.0], [0.0]], np.float32)
    valid = np.array([[True], [True], [False], [True]])
    trunc = np.array([[False], [True], [False], [False]])
    term = np.zeros_like(trunc)
    adv, _ = compute_gae(rewards, values, np.array([0.0], np.float32), term, trunc, valid, 0.5, 1.0)
    assert adv[1, 0] == pytest.approx(1.0 + 0.5 * 10.0)  # bootstrapped with V(final obs)
    assert adv[2, 0] == 0.0  # autoreset step carries nothing
    adv_t, _ = compute_gae(rewards, values, np.array([0.0], np.float32), trunc, term, valid, 0.5, 1.0)
    assert adv_t[1, 0] == pytest.approx(1.0)  # terminated: no bootstrap
