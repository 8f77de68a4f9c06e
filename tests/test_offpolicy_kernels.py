"""Fast paths of the off-policy training phase against their references.

* The update arithmetic after the gradients as C++ kernels (``<algo>.optimizer_kernel``): the optimizer step equal
  to the graph ops of ``guarded_update`` step by step (clipped, unclipped, non-finite gradients and losses), the
  Polyak target update bit-identical to ``polyak``'s graph ops, both equal inside the DQN, SAC and TD3 training
  phases, and chosen, refused or fallen back from as documented.
* DQN's batched TD targets (one target-network pass per phase) against computing them per gradient step.
* A whole DQN phase (masked replay add, target copy, gradient steps) against a PyNative loop with a numpy Adam."""
import logging
import math

import numpy as np
import pytest

from scalebox_ms import Config, ConfigError
from scalebox_ms.errors import CustomOpError


def _groups(shapes, seed=0):
    """Two AdamGroups over equal copies of the same Parameters: (graph ops, kernel)."""
    from mindspore import Parameter, Tensor

    from scalebox_ms.models.offpolicy import AdamGroup
    from scalebox_ms.ops.custom.offpolicy_optim import GuardedAdamKernel

    rng = np.random.default_rng(seed)
    values = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    out = []
    for tag in ("ref", "ker"):
        params = [Parameter(Tensor(v.copy()), name=f"{tag}.p{i}") for i, v in enumerate(values)]
        out.append(AdamGroup(params, f"{tag}_opt", 1e-8))
    out[1].set_kernel(GuardedAdamKernel(out[1]))
    return out


class _Step:
    """A compiled guarded_update on one group (per max_grad_norm; static)."""

    def __new__(cls, group, max_grad_norm):
        import mindspore as ms
        from mindspore import nn

        from scalebox_ms.models.offpolicy import guarded_update

        class Step(nn.Cell):
            def __init__(self):
                super().__init__()
                self.group = group

            @ms.jit
            def construct(self, grads, loss, lr):
                return guarded_update(self.group, grads, loss, lr, max_grad_norm)

        return Step()


def _state(group):
    return [p.asnumpy().copy() for p in list(group.params) + list(group.m) + list(group.v) + [group.step]]


@pytest.mark.parametrize("max_grad_norm", [0.5, 1e3, None])
def test_kernel_equals_the_graph_ops_step_by_step(max_grad_norm):
    """0.5 clips every step (the gradients' norm is ~10), 1e3 never does (the coefficient must stay 1), None has no
    clip. Equal up to float rounding (MindSpore's vectorised CPU Adam rounds a few elements 1 ulp apart)."""
    import mindspore as ms
    from mindspore import Tensor

    shapes = [(64, 4), (64,), (2, 64), (2,)]
    ref, ker = _groups(shapes)
    step_ref, step_ker = _Step(ref, max_grad_norm), _Step(ker, max_grad_norm)
    rng = np.random.default_rng(1)
    lr = Tensor(np.float32(0.01))
    # finite steps (clipped with 0.5: the norm of these gradients is ~10), a NaN gradient, an inf loss, finite again
    plan = ["ok", "ok", "nan_grad", "ok", "inf_loss", "ok"]
    for i, what in enumerate(plan):
        grads = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        loss = np.float32(rng.random())
        if what == "nan_grad":
            grads[2][1, 3] = np.nan
        if what == "inf_loss":
            loss = np.float32(np.inf)
        before = _state(ker)
        ok_ref = step_ref(ms.mutable(tuple(Tensor(g) for g in grads)), Tensor(loss), lr)
        ok_ker = step_ker(ms.mutable(tuple(Tensor(g) for g in grads)), Tensor(loss), lr)
        assert bool(ok_ref.asnumpy()) == bool(ok_ker.asnumpy()) == (what == "ok"), (i, what)
        after_ref, after_ker = _state(ref), _state(ker)
        for a, b in zip(after_ref, after_ker):
            np.testing.assert_allclose(b, a, rtol=2e-6, atol=1e-7, err_msg=f"step {i} ({what})")
        if what != "ok":  # skipped: weights untouched, moments decayed one step, the counter advanced
            for k in range(len(shapes)):
                np.testing.assert_array_equal(after_ker[k], before[k])
                np.testing.assert_allclose(after_ker[len(shapes) + k], 0.9 * before[len(shapes) + k], rtol=1e-6)
            assert after_ker[-1] == before[-1] + 1
        else:
            assert np.abs(after_ker[0] - before[0]).max() > 1e-4  # it moved
    assert float(ker.step.asnumpy()) == len(plan)


@pytest.mark.parametrize("tau", [0.005, 1.0])
def test_polyak_kernel_is_bit_identical_to_the_graph_ops(tau):
    import mindspore as ms
    from mindspore import Parameter, Tensor, nn

    from scalebox_ms.models.offpolicy import polyak
    from scalebox_ms.ops.custom.offpolicy_optim import PolyakKernel

    rng = np.random.default_rng(4)
    shapes = [(32, 3), (32,), (1, 32)]
    targets0 = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    sources = [rng.standard_normal(s).astype(np.float32) for s in shapes]

    class Update(nn.Cell):
        def __init__(self, tag, use_kernel):
            super().__init__()
            self.t = ms.ParameterTuple([Parameter(Tensor(v.copy()), name=f"{tag}.t{i}")
                                        for i, v in enumerate(targets0)])
            self.s = ms.ParameterTuple([Parameter(Tensor(v.copy()), name=f"{tag}.s{i}")
                                        for i, v in enumerate(sources)])
            self.kernel = PolyakKernel(self.t, self.s) if use_kernel else None

        @ms.jit
        def construct(self):
            polyak(self.t, self.s, tau, self.kernel)
            return self.t[0].sum()

    ref, ker = Update("ref", False), Update("ker", True)
    for _ in range(3):
        ref(), ker()
    for a, b, t0 in zip(ref.t, ker.t, targets0):
        np.testing.assert_array_equal(b.asnumpy(), a.asnumpy())
        assert not np.array_equal(b.asnumpy(), t0)


def _trainer(algo, kernel):
    from scalebox_ms.trainers import make_trainer

    if algo == "dqn":
        env, section = {"id": "CartPole-v1", "num_envs": 2}, {"gradient_steps": 6, "max_grad_norm": 0.5}
    else:
        env, section = {"id": "Pendulum-v1", "num_envs": 1}, {"gradient_steps": 2}
    section.update(batch_size=16, learning_starts=10_000, buffer_size=2000, train_freq=8, optimizer_kernel=kernel)
    if algo == "td3":
        section.update(policy_delay=2)
    cfg = Config.from_dict({"algo": algo, "env": env, "policy": {"pi_layers": [32, 32], "vf_layers": [32, 32]},
                            algo: section, "run": {"seed": 3, "total_steps": 20_000, "progress": False}})
    return make_trainer(cfg)


def _phases(t, n=3):
    """n training phases on the replay collected so far, with fixed inputs; returns (per phase: statistics, policy
    output) and the learner's state after them."""
    import mindspore as ms
    from mindspore import Tensor

    from scalebox_ms.buffers.device import sample_draws

    rng = np.random.default_rng(7)
    T, N, o = t._phase_steps, t.num_envs, t.config.algo_config
    act_shape, act_dtype = t._replay_action_spec()
    empty = ms.mutable((Tensor(np.zeros((T * N,) + t.spec.obs_shape, np.float32)),
                        Tensor(np.zeros((T * N,) + act_shape, act_dtype)), Tensor(np.zeros(T * N, np.float32)),
                        Tensor(np.zeros((T * N,) + t.spec.obs_shape, np.float32)), Tensor(np.zeros(T * N, np.float32))))
    mean, inv_std, clip = t._obs_stats()
    out = []
    for _ in range(n):
        u = sample_draws(rng, (t.gradient_steps, o.batch_size))
        noise = t._train_noise(rng, t.gradient_steps, o.batch_size)
        act_noise = t._act_noise_or_zeros(rng, N)
        pol, acc = t.phase(empty, Tensor(np.zeros(T * N, np.int32)), Tensor(np.int32(t.gradient_steps)),
                           Tensor(np.int32(1)), Tensor(u), Tensor(noise), Tensor(np.float32(3e-3)), Tensor(mean),
                           Tensor(inv_std), Tensor(clip), Tensor(t.collector.obs), Tensor(act_noise))
        out.append((acc.asnumpy(), pol.asnumpy()))
    return out, {n: p.asnumpy().copy() for n, p in t.learner.parameters_and_names()}


@pytest.mark.parametrize("algo", ["dqn", "sac", "td3"])
def test_training_phases_equal_with_and_without_the_kernel(algo):
    """Same seed, same replay, same phase inputs: the kernel's phases give the graph ops' losses, policy outputs
    (computed after the updates) and state. SAC: the actor loss reads the critic after the critic's kernel update;
    TD3: the delayed actor update runs inside a graph branch."""
    results = {}
    for kernel in ("builtin", "custom"):
        t = _trainer(algo, kernel)
        assert t.optimizer_kernel == (kernel == "custom")
        assert (t.learner.polyak_kernel is not None) == (kernel == "custom")
        t.learn(until=200)  # random actions only (learning_starts 10,000): the same replay in both
        start = {n: p.asnumpy().copy() for n, p in t.learner.parameters_and_names()}
        results[kernel] = _phases(t)
    (ref_phases, ref_state), (ker_phases, ker_state) = results["builtin"], results["custom"]
    for (acc_r, pol_r), (acc_k, pol_k) in zip(ref_phases, ker_phases):
        np.testing.assert_allclose(acc_k, acc_r, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(pol_k, pol_r, rtol=1e-4, atol=1e-5)
    assert ref_state.keys() == ker_state.keys()
    moved = 0
    for name in ref_state:
        np.testing.assert_allclose(ker_state[name], ref_state[name], rtol=1e-4, atol=1e-6, err_msg=name)
        moved += not np.array_equal(ker_state[name], start[name])
    assert moved > len(ref_state) // 2


def test_dqn_batched_targets_equal_per_step_targets(monkeypatch):
    from scalebox_ms.trainers.dqn import DQNLearner

    results = {}
    for batched in (True, False):
        if not batched:
            monkeypatch.setattr(DQNLearner, "batches_targets", lambda self, rows: False)
        t = _trainer("dqn", "builtin")
        assert t.phase.batched_targets is batched
        t.learn(until=200)
        results[batched] = _phases(t)
    for (acc_b, pol_b), (acc_s, pol_s) in zip(results[True][0], results[False][0]):
        np.testing.assert_array_equal(acc_b, acc_s)
        np.testing.assert_array_equal(pol_b, pol_s)
    for name, value in results[True][1].items():
        np.testing.assert_array_equal(value, results[False][1][name], err_msg=name)


def test_dqn_batches_targets_only_for_mlps_within_the_memory_bound():
    from scalebox_ms.trainers import dqn

    t = _trainer("dqn", "builtin")
    widths = t.learner.widths  # CartPole: 4 -> 32 -> 32 -> 2
    assert widths == [4, 32, 32, 2]
    limit_rows = dqn.BATCHED_TARGETS_MAX_BYTES // (4 * (sum(widths) + widths[0]))
    assert t.learner.batches_targets(limit_rows) and not t.learner.batches_targets(limit_rows + 1)


def test_optimizer_kernel_values_are_checked():
    from scalebox_ms import load_config

    with pytest.raises(ConfigError, match=r"^sac\.optimizer_kernel: must be 'builtin', 'custom' or 'auto'"):
        Config.from_dict({"algo": "sac", "sac": {"optimizer_kernel": "fast"}})
    with pytest.raises(ConfigError, match=r"^dqn\.optimizer_kernel: custom computes in float32.*amp\.level O1"):
        load_config(None, ["algo=dqn", "dqn.optimizer_kernel=custom", "amp.level=O1"])


def test_custom_is_refused_off_cpu_and_auto_keeps_the_graph(monkeypatch, caplog):
    from scalebox_ms.trainers import kernels
    from scalebox_ms.trainers.kernels import select_optimizer_kernel

    t = _trainer("sac", "builtin")
    custom, auto = (t.config.with_overrides([f"sac.optimizer_kernel={c}"]) for c in ("custom", "auto"))
    with pytest.raises(ConfigError, match=r"^sac\.optimizer_kernel: custom cannot run with the GPU backend"):
        select_optimizer_kernel(custom, t.learner, None, "GPU")
    assert select_optimizer_kernel(auto, t.learner, None, "Ascend") is False
    assert t.learner.polyak_kernel is None and t.learner.critic_optimizer.kernel is None
    # auto stays within the measured sizes (the critics' 2 x (4*32 + 32 + 32*32 + 32 + 32 + 1) = 2,498 values here)
    monkeypatch.setattr(kernels, "AUTO_OPTIMIZER_MAX_ELEMENTS", 2497)
    with caplog.at_level(logging.INFO, logger="scalebox_ms"):
        assert select_optimizer_kernel(auto, t.learner, None, "CPU") is False
    assert "an optimizer of 2498 values > 2497, beyond the measured range" in caplog.text
    assert t.learner.polyak_kernel is None
    monkeypatch.setattr(kernels, "AUTO_OPTIMIZER_MAX_ELEMENTS", 2498)
    assert select_optimizer_kernel(auto, t.learner, None, "CPU") is True
    assert t.learner.polyak_kernel is not None and t.learner.critic_optimizer.kernel is not None


def test_auto_keeps_the_graph_under_amp_and_logs_why(caplog):
    from scalebox_ms.trainers import make_trainer

    cfg = Config.from_dict({"algo": "dqn", "env": {"id": "CartPole-v1", "num_envs": 1}, "amp": {"level": "O1"},
                            "dqn": {"buffer_size": 1000}, "run": {"progress": False}})
    with caplog.at_level(logging.INFO, logger="scalebox_ms"):
        t = make_trainer(cfg)
    assert t.optimizer_kernel is False and t.learner.optimizer.kernel is None
    assert any("dqn.optimizer_kernel auto: graph ops (amp.level O1" in r.getMessage() for r in caplog.records)


def test_without_a_compiler_custom_fails_and_auto_falls_back(tmp_path, monkeypatch, caplog):
    from scalebox_ms.trainers import make_trainer

    monkeypatch.setenv("SCALEBOX_MS_CUSTOM_OPS_CACHE", str(tmp_path / "empty"))
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-g++"))
    base = {"algo": "td3", "env": {"id": "Pendulum-v1", "num_envs": 1}, "td3": {"buffer_size": 1000},
            "run": {"progress": False}}
    base["td3"]["optimizer_kernel"] = "custom"
    with pytest.raises(CustomOpError, match=r"^td3\.optimizer_kernel: custom: custom op 'offpolicy_optim': C\+\+ "
                                            r"compiler .* not found"):
        make_trainer(Config.from_dict(base))
    base["td3"]["optimizer_kernel"] = "auto"
    with caplog.at_level(logging.INFO, logger="scalebox_ms"):
        t = make_trainer(Config.from_dict(base))
    assert t.optimizer_kernel is False and t.learner.polyak_kernel is None
    assert t.learner.actor_optimizer.kernel is None and t.learner.critic_optimizer.kernel is None
    warned = [r for r in caplog.records
              if r.levelno == logging.WARNING and "td3.optimizer_kernel auto" in r.getMessage()]
    assert warned and "cannot be built" in warned[0].getMessage()


@pytest.mark.parametrize("kernel", ["builtin", "custom"])
def test_dqn_phase_matches_step_by_step_reference(kernel):
    """Replay add (masked), 3 in-graph gradient steps and the target copy equal a plain PyNative loop over the
    same batches with a numpy Adam (MindSpore's Adam formula), with the optimizer step as graph ops or as the C++
    kernel (and the phase's TD targets computed in one batched pass before its steps)."""
    import mindspore as ms
    from mindspore import Tensor, ops

    from scalebox_ms.buffers.device import sample_draws
    from scalebox_ms.models.offpolicy import QNetwork
    from scalebox_ms.trainers import make_trainer

    cfg = Config.from_dict({
        "algo": "dqn", "env": {"id": "CartPole-v1", "num_envs": 2},
        "dqn": {"train_freq": 32, "gradient_steps": 3, "batch_size": 16, "learning_starts": 0, "buffer_size": 5000,
                "target_update_interval": 50, "learning_rate": 0.01, "max_grad_norm": 0.5,
                "optimizer_kernel": kernel},
        "run": {"seed": 1, "total_steps": 2000, "progress": False}})
    t = make_trainer(cfg)
    assert t.optimizer_kernel == (kernel == "custom") and t.phase.batched_targets
    T, rng = 64, np.random.default_rng(1)
    obs, nxt = rng.standard_normal((2, T, 4)).astype(np.float32)
    act = rng.integers(0, 2, T).astype(np.int32)
    rew = rng.standard_normal(T).astype(np.float32)
    term = (rng.random(T) < 0.2).astype(np.float32)
    valid = (rng.random(T) < 0.8).astype(np.int32)
    u = sample_draws(rng, (3, 16))
    online0 = [p.asnumpy().copy() for p in t.learner.q.get_parameters()]
    items = ms.mutable((Tensor(obs), Tensor(act), Tensor(rew), Tensor(nxt), Tensor(term)))
    t.phase(items, Tensor(valid), Tensor(np.int32(3)), Tensor(np.int32(1)), Tensor(u), Tensor(np.zeros((3, 1), np.float32)),
            Tensor(np.float32(0.01)), Tensor(np.zeros(4, np.float32)), Tensor(np.ones(4, np.float32)),
            Tensor(np.float32(np.inf)), Tensor(obs[:2]), Tensor(np.zeros((2, 1), np.float32)))
    got = [p.asnumpy() for p in t.learner.q.get_parameters()]
    target = [p.asnumpy() for p in t.learner.q_target.get_parameters()]
    for a, b in zip(target, online0):  # n_target = 1: the target is the online net at the start of the phase
        np.testing.assert_array_equal(a, b)

    keep = valid.astype(bool)
    data = [obs[keep], act[keep], rew[keep], nxt[keep], term[keep]]
    n = int(keep.sum())
    assert len(t.replay) == n
    q, qt = QNetwork(4, 2, [64, 64]), QNetwork(4, 2, [64, 64])
    for net in (q, qt):
        for p, v in zip(net.get_parameters(), online0):
            p.set_data(Tensor(v))

    def loss_fn(o, a, r, no, d):
        y = r + 0.99 * (1 - d) * ops.amax(qt(no), 1)
        err = ops.abs(ops.gather_elements(q(o), 1, a.reshape(-1, 1))[:, 0] - y)
        return ops.select(err < 1, 0.5 * err * err, err - 0.5).mean()

    grad_fn = ms.value_and_grad(loss_fn, None, q.trainable_params())
    m = [np.zeros_like(v) for v in online0]
    v2 = [np.zeros_like(v) for v in online0]
    for s in range(3):
        idx = u[s] % n
        _, g = grad_fn(*(Tensor(x[idx]) for x in data))
        g = [x.asnumpy() for x in g]
        norm = math.sqrt(sum(float((x.astype(np.float64) ** 2).sum()) for x in g))
        g = [x * min(1.0, 0.5 / norm) for x in g]
        lr_t = 0.01 * math.sqrt(1 - 0.999 ** (s + 1)) / (1 - 0.9 ** (s + 1))
        for k, p in enumerate(q.get_parameters()):
            m[k] = 0.9 * m[k] + 0.1 * g[k]
            v2[k] = 0.999 * v2[k] + 0.001 * g[k] ** 2
            p.set_data(Tensor((p.asnumpy() - lr_t * m[k] / (np.sqrt(v2[k]) + 1e-8)).astype(np.float32)))
    for a, p in zip(got, q.get_parameters()):
        np.testing.assert_allclose(a, p.asnumpy(), atol=1e-5)
    assert any(np.abs(a - b).max() > 1e-3 for a, b in zip(got, online0))  # it did learn
