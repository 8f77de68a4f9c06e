"""Replay buffer insert/sample throughput at capacity 1e6, batch 256, obs dim 4 and 64, side by side with a
numpy ring buffer, in one pytest-benchmark run:

    python -m pytest benchmarks/test_bench_buffers.py --benchmark-only --benchmark-columns=median,ops

``ops`` is calls per second; samples/s = ops x 256 (x 64 for the in-graph case, which draws 64 minibatches of
256 per call inside one graph, the way an off-policy train step would).
"""
import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn, ops

from scalebox_ms.buffers import ReplayBuffer
from scalebox_ms.buffers.device import sample_draws
from scalebox_ms.sandbox import Sandbox

CAPACITY, BATCH, INNER = 1_000_000, 256, 64


@pytest.fixture(scope="module", autouse=True)
def sandbox():
    return Sandbox(device="auto", seed=0)


class NumpyReplay:
    def __init__(self, capacity, obs_dim):
        self.obs = np.zeros((capacity, obs_dim), np.float32)
        self.reward = np.zeros(capacity, np.float32)
        self.capacity, self.pos, self.size = capacity, 0, 0

    def add(self, obs, reward):
        idx = (self.pos + np.arange(len(obs))) % self.capacity
        self.obs[idx], self.reward[idx] = obs, reward
        self.pos = (self.pos + len(obs)) % self.capacity
        self.size = min(self.size + len(obs), self.capacity)

    def sample(self, rng, n):
        idx = rng.integers(0, self.size, n)
        return self.obs[idx], self.reward[idx]


class InGraphSampler(nn.Cell):
    def __init__(self, buffer):
        super().__init__(auto_prefix=False)
        self.buffer = buffer

    @ms.jit
    def construct(self, u):  # (INNER, BATCH) int32 row draws (sample_draws)
        acc = ops.zeros((), ms.float32)
        k = Tensor(0, ms.int32)
        while k < INNER:
            obs, reward = self.buffer.gather(u[k])
            acc = acc + obs.sum() + reward.sum()
            k = k + 1
        return acc


def filled(obs_dim):
    buf = ReplayBuffer(CAPACITY, {"obs": ((obs_dim,), np.float32), "reward": ((), np.float32)})
    rng = np.random.default_rng(0)
    chunk = 100_000
    for _ in range(CAPACITY // chunk):
        buf.add_batch(obs=rng.normal(size=(chunk, obs_dim)).astype(np.float32),
                      reward=rng.normal(size=chunk).astype(np.float32))
    return buf


@pytest.fixture(scope="module", params=[4, 64])
def buffers(request):
    d = request.param
    ref = NumpyReplay(CAPACITY, d)
    ref.add(np.random.default_rng(0).normal(size=(CAPACITY, d)).astype(np.float32), np.zeros(CAPACITY, np.float32))
    return d, filled(d), ref


def test_insert_mindspore(benchmark, buffers):
    d, buf, _ = buffers
    obs, rew = np.ones((BATCH, d), np.float32), np.ones(BATCH, np.float32)
    benchmark(lambda: buf.add_batch(obs=obs, reward=rew))


def test_insert_numpy(benchmark, buffers):
    d, _, ref = buffers
    obs, rew = np.ones((BATCH, d), np.float32), np.ones(BATCH, np.float32)
    benchmark(lambda: ref.add(obs, rew))


def test_sample_mindspore_host_api(benchmark, buffers):
    _, buf, _ = buffers
    rng = np.random.default_rng(1)
    benchmark(lambda: buf.sample(BATCH, rng))


def test_sample_numpy(benchmark, buffers):
    _, _, ref = buffers
    rng = np.random.default_rng(1)
    benchmark(lambda: ref.sample(rng, BATCH))


def test_sample_in_graph_64_minibatches_per_call(benchmark, buffers):
    _, buf, _ = buffers
    sampler = InGraphSampler(buf)
    u = Tensor(sample_draws(np.random.default_rng(2), (INNER, BATCH)))
    sampler(u).asnumpy()
    benchmark(lambda: sampler(u).asnumpy())
