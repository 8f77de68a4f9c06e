"""pytest-benchmark micro-benchmarks of the compiled hot paths (not part of the default test run).

    python -m pytest benchmarks/test_bench_steps.py --benchmark-only

Measures one acting call (obs -> action, log-prob, value for all envs), one PPO minibatch update step and
the numpy GAE over a rollout, at the CartPole preset's sizes and larger ones. Compare numbers within one run.
"""
import mindspore as ms
import numpy as np
import pytest

from scalebox_ms.buffers import compute_gae
from scalebox_ms.config import Config
from scalebox_ms.models import ActStep, SpaceSpec, build_model
from scalebox_ms.sandbox import Sandbox
from scalebox_ms.trainers.ppo_update import PPOUpdateStep, pack_features


@pytest.fixture(scope="module", autouse=True)
def sandbox():
    return Sandbox(device="auto", seed=0)


@pytest.mark.parametrize("num_envs", [8, 64, 1024])
def test_act_call(benchmark, num_envs):
    model = build_model(SpaceSpec(4, True, 2), Config().policy)
    act = ActStep(model, packed=True)
    rng = np.random.default_rng(0)
    obs = rng.normal(size=(num_envs, 4)).astype(np.float32)
    noise = rng.gumbel(size=(num_envs, 2)).astype(np.float32)
    act(ms.Tensor(obs), ms.Tensor(noise)).asnumpy()  # compile
    benchmark(lambda: act(ms.Tensor(obs), ms.Tensor(noise)).asnumpy())


@pytest.mark.parametrize("batch", [64, 256, 1024])
def test_update_step(benchmark, batch):
    cfg = Config()
    model = build_model(SpaceSpec(4, True, 2), cfg.policy)
    step = PPOUpdateStep(model, cfg.ppo)
    rng = np.random.default_rng(0)
    B = 4096
    feats = ms.Tensor(pack_features(rng.normal(size=(B, 4)), *[rng.normal(size=B) for _ in range(4)], np.ones(B)))
    acts = ms.Tensor(rng.integers(0, 2, B).astype(np.int32))
    idx = ms.Tensor(rng.permutation(B)[:batch].astype(np.int32))
    scalars = [ms.Tensor(np.float32(x)) for x in (1e-4, 0.2, np.inf, np.inf)]
    step(feats, acts, idx, *scalars).asnumpy()  # compile
    benchmark(lambda: step(feats, acts, idx, *scalars).asnumpy())


@pytest.mark.parametrize("T, N", [(32, 8), (256, 16), (2048, 64)])
def test_numpy_gae(benchmark, T, N):
    rng = np.random.default_rng(0)
    args = (rng.normal(size=(T, N)).astype(np.float32), rng.normal(size=(T, N)).astype(np.float32),
            rng.normal(size=N).astype(np.float32), rng.random((T, N)) < 0.01, rng.random((T, N)) < 0.01,
            np.ones((T, N), bool))
    benchmark(lambda: compute_gae(*args, 0.99, 0.95))
