"""Device-resident buffers vs numpy references: in-graph GAE, replay ring buffer with wrap-around."""
import numpy as np
import pytest

from scalebox_ms.buffers import ReplayBuffer, RolloutBuffer, compute_gae
from scalebox_ms.sandbox import Sandbox
from test_gae import random_rollout


@pytest.fixture(autouse=True, scope="module")
def _sandbox():
    Sandbox(device="auto", seed=0)


@pytest.mark.parametrize("seed", range(3))
def test_graph_gae_matches_numpy_reference(seed):
    import mindspore as ms

    rng = np.random.default_rng(seed)
    rewards, values, last, term, trunc, valid = random_rollout(rng, 48, 5)
    buf = RolloutBuffer(48, 5, obs_dim=3)
    buf.fill(rewards=rewards, values=values, terminated=term, truncated=trunc, valid=valid)
    buf.compute_gae(ms.Tensor(last), ms.Tensor(np.float32(0.98)), ms.Tensor(np.float32(0.9)))
    adv, ret = compute_gae(rewards, values, last, term, trunc, valid, 0.98, 0.9)
    np.testing.assert_allclose(buf.advantages.asnumpy(), adv, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(buf.returns.asnumpy(), ret, rtol=1e-5, atol=1e-5)


class NumpyRing:
    """The obviously-correct reference."""

    def __init__(self, capacity):
        self.capacity, self.pos, self.size, self.data = capacity, 0, 0, {}

    def add(self, **arrays):
        b = len(next(iter(arrays.values())))
        for k, v in arrays.items():
            store = self.data.setdefault(k, np.zeros((self.capacity,) + v.shape[1:], v.dtype))
            for i in range(b):
                store[(self.pos + i) % self.capacity] = v[i]
        self.pos = (self.pos + b) % self.capacity
        self.size = min(self.size + b, self.capacity)


def test_replay_add_wraps_around_like_a_ring():
    specs = {"obs": ((3,), np.float32), "action": ((), np.int32)}
    buf, ref = ReplayBuffer(10, specs), NumpyRing(10)
    rng = np.random.default_rng(0)
    for b in (4, 4, 5, 7, 1, 23):  # 23 > capacity: only the last 10 items survive
        batch = {"obs": rng.normal(size=(b, 3)).astype(np.float32), "action": rng.integers(0, 9, b).astype(np.int32)}
        assert buf.add_batch(**batch) == min(ref.size + b, 10)
        ref.add(**batch)
        state = buf.state_dict()
        assert len(buf) == ref.size and int(state["_position"]) == ref.pos
        np.testing.assert_array_equal(state["obs"], ref.data["obs"][: ref.size])
        np.testing.assert_array_equal(state["action"], ref.data["action"][: ref.size])


def test_masked_add_keeps_the_valid_items_in_order_like_the_ring():
    specs = {"obs": ((3,), np.float32), "action": ((), np.int32)}
    buf, ref = ReplayBuffer(10, specs, spare_row=True), NumpyRing(10)
    rng = np.random.default_rng(1)
    for _ in range(5):  # 8 rows per call, some masked out; wraps around the ring of 10
        batch = {"obs": rng.normal(size=(8, 3)).astype(np.float32), "action": rng.integers(0, 9, 8).astype(np.int32)}
        valid = rng.integers(0, 2, 8).astype(np.int32)
        ref.add(**{k: v[valid > 0] for k, v in batch.items()})
        assert buf.add_batch_masked(valid, **batch) == ref.size
        state = buf.state_dict()
        assert int(state["_position"]) == ref.pos
        np.testing.assert_array_equal(state["obs"], ref.data["obs"][: ref.size])
        np.testing.assert_array_equal(state["action"], ref.data["action"][: ref.size])
    with pytest.raises(ValueError, match="no spare row"):
        ReplayBuffer(10, specs).add_batch_masked(np.ones(1, np.int32), obs=np.zeros((1, 3)), action=np.zeros(1))


def test_replay_rows_are_the_int32_draws_mod_the_size():
    """Row draws are int32 uniform in [0, 2**31 - 1) and the graph takes them mod the filled size: every row within a
    relative size / 2**31 of the same probability. Float32 draws ``floor(u * size)`` had 24 random bits: rows of a
    1e6 buffer came 16 or 17 times in 2**24 (6% apart), and a 2e7 buffer never sampled 4.3M of its rows."""
    from mindspore import Tensor

    from scalebox_ms.buffers.device import DRAW_RANGE, _Compiled, sample_draws

    size = 3_000_000
    buf = ReplayBuffer(size + 5, {"x": ((), np.int32)})
    buf.add_batch(x=np.arange(size, dtype=np.int32))
    draws = sample_draws(np.random.default_rng(0), 4096)
    assert draws.dtype == np.int32 and draws.min() >= 0
    draws[:3] = [0, size - 1, DRAW_RANGE - 1]  # (the largest draw there is)
    rows = _Compiled(buf, "gather")(Tensor(draws))[0].asnumpy()
    np.testing.assert_array_equal(rows, draws.astype(np.int64) % size)
    assert draws.max() > 2 ** 30  # (the draws span the int32 range, not 24 bits)


def test_replay_sampling_is_uniform_with_replacement_and_reproducible():
    buf = ReplayBuffer(1000, {"x": ((), np.int32)})
    buf.add_batch(x=np.arange(300, dtype=np.int32))  # only the first 300 slots are filled
    s1 = buf.sample(20000, np.random.default_rng(1))["x"]
    s2 = buf.sample(20000, np.random.default_rng(1))["x"]
    np.testing.assert_array_equal(s1, s2)
    assert s1.min() >= 0 and s1.max() < 300
    counts = np.bincount(s1, minlength=300)
    assert counts.min() > 20 and counts.max() < 120  # ~66.7 each
    assert len(np.unique(s1[:500])) < 500  # with replacement


def test_replay_state_dict_roundtrip_and_errors():
    specs = {"obs": ((2,), np.float32)}
    a = ReplayBuffer(5, specs)
    a.add_batch(obs=np.arange(14, dtype=np.float32).reshape(7, 2))
    b = ReplayBuffer(5, specs)
    b.load_state_dict(a.state_dict())
    assert len(b) == 5
    np.testing.assert_array_equal(b.state_dict()["obs"], a.state_dict()["obs"])
    b.add_batch(obs=np.full((1, 2), -1, np.float32))
    assert int(b.state_dict()["_position"]) == 3
    with pytest.raises(ValueError, match="empty"):
        ReplayBuffer(5, specs).sample(3, np.random.default_rng(0))
    with pytest.raises(ValueError, match="expected fields"):
        a.add_batch(other=np.zeros((1, 2)))
    with pytest.raises(ValueError, match="capacity"):
        ReplayBuffer(0, specs)


@pytest.mark.parametrize("capacity", [2**32 + 3, 2**31, 2.7, True, 0])
def test_replay_refuses_a_capacity_its_int32_ring_cannot_hold(capacity):
    """2**32 + 3 wrapped to a ring of 3 (position 0 after 3 adds), 2**31 + 5 made len() negative, 2.7 became 2."""
    with pytest.raises(ValueError, match=r"capacity: must be an integer from 1 to 2147483647"):
        ReplayBuffer(capacity, {"x": ((0,), np.float32)})


def test_replay_host_api_refuses_bad_batches_in_one_line():
    """Each used to be a ~30-line MindSpore traceback at the graph's compile (or the first add's, for bool)."""
    specs = {"obs": ((3,), np.float32), "action": ((), np.int32)}
    buf = ReplayBuffer(4, specs, spare_row=True)
    bad = [(dict(obs=np.zeros((2, 4)), action=np.zeros(2)), r"field 'obs' has shape \(2, 4\), expected \(B,\) "
            r"\+ \(3,\) with B = 2"),
           (dict(obs=np.zeros((2, 3)), action=np.zeros(3)), r"field 'action' has shape \(3,\)"),
           (dict(obs=np.zeros(3), action=np.zeros(())), r"field 'obs' has shape \(3,\)")]
    for arrays, message in bad:
        with pytest.raises(ValueError, match=message):
            buf.add_batch(**arrays)
    with pytest.raises(ValueError, match=r"valid has shape \(2,\), expected \(3,\)"):
        buf.add_batch_masked([1, 0], obs=np.zeros((3, 3)), action=np.zeros(3))
    with pytest.raises(ValueError, match="a batch of 5 items is larger than the capacity 4"):
        buf.add_batch_masked(np.ones(5), obs=np.zeros((5, 3)), action=np.zeros(5))
    with pytest.raises(ValueError, match="field 'done' is bool; store flags as uint8"):
        ReplayBuffer(4, {"done": ((), np.bool_)})
    assert len(buf) == 0
    rollout = RolloutBuffer(4, 2, 3)
    with pytest.raises(ValueError, match=r"fill: field 'obs' has shape \(4, 2, 2\), expected \(4, 2, 3\)"):
        rollout.fill(obs=np.zeros((4, 2, 2)))
    with pytest.raises(ValueError, match="fill: unknown field 'reward'"):
        rollout.fill(reward=np.zeros((4, 2)))


def test_masked_add_writes_every_non_zero_flag_once():
    """A flag of 2 counted twice in the size: a never-written row was then sampled and the ring position was off."""
    buf = ReplayBuffer(4, {"x": ((), np.int32)}, spare_row=True)
    assert buf.add_batch_masked([2, 0, -1], x=[1, 2, 3]) == 2
    np.testing.assert_array_equal(buf.state_dict()["x"], [1, 3])
    assert int(buf.state_dict()["_position"]) == 2


@pytest.mark.parametrize("saved_capacity, added, capacity", [(4, 6, 8), (4, 6, 5), (4, 6, 3), (8, 6, 4), (8, 6, 6),
                                                             (8, 3, 3), (4, 4, 2), (4, 6, 4)])
def test_replay_state_loads_into_another_capacity_as_the_newest_rows_oldest_first(saved_capacity, added, capacity):
    """A checkpoint's replay loaded into a trainer with another buffer_size: a larger buffer overwrote saved rows
    while its size grew over never-written zeros; a smaller one failed halfway with numpy's broadcast error. The
    reference: the same rows added to a ring of the new capacity (the newest `capacity` of them, oldest first)."""
    specs = {"x": ((), np.float32)}
    saved = ReplayBuffer(saved_capacity, specs)
    saved.add_batch(x=np.arange(1, added + 1, dtype=np.float32))
    held = list(range(max(1, added - saved_capacity + 1), added + 1))  # what the saved ring holds, oldest first
    loaded, reference = ReplayBuffer(capacity, specs), ReplayBuffer(capacity, specs)
    loaded.load_state_dict(saved.state_dict())
    reference.add_batch(x=np.asarray(held, np.float32))
    more = np.asarray([100, 101, 102], np.float32)  # later adds overwrite what the reference's do (the oldest)
    loaded.add_batch(x=more)
    reference.add_batch(x=more)
    got, want = loaded.state_dict(), reference.state_dict()
    assert len(loaded) == len(reference) == min(capacity, len(held) + 3)
    assert sorted(got["x"].tolist()) == sorted(want["x"].tolist())
    assert 0.0 not in got["x"]  # (no never-written row counted)


def test_graph_gae_refuses_last_values_of_another_width_in_one_line():
    """A MindSpore traceback (a Mul that cannot broadcast) and an analyze_fail.ir dump in the working directory."""
    from mindspore import Tensor

    buf = RolloutBuffer(4, 2, 3)
    with pytest.raises(ValueError, match=r"^compute_gae: last_values has shape \(3,\), expected \(2,\)"):
        buf.compute_gae(Tensor(np.zeros(3, np.float32)), 0.99, 0.95)
