"""The twin critics as one ensemble (models/offpolicy.py: TwinCritic over EnsembleDense layers) against the
obviously-correct reference: two plain nn.Dense MLPs with the same weights. Also the per-critic (nn.Dense) layout
that hashes see, and checkpoints written in that layout before the ensemble existed."""
import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn, ops

from scalebox_ms.models.actor_critic import mlp
from scalebox_ms.models.offpolicy import TwinCritic, split_ensemble, stack_ensemble

OBS, ACT, LAYERS = 3, 2, [16, 8]


def _pair(ortho):
    """(TwinCritic, [reference MLP 1, reference MLP 2]) drawn from the same seed: the same initial weights."""
    ms.set_seed(7)
    critic = TwinCritic(OBS, ACT, LAYERS, "relu", ortho)
    ms.set_seed(7)
    refs = [mlp(OBS + ACT, LAYERS, 1, "relu", ortho, 1.0) for _ in range(2)]
    return critic, refs


class _Refs(nn.Cell):
    def __init__(self, refs):
        super().__init__()
        self.q0, self.q1 = refs

    def construct(self, obs, action):
        x = ops.concat([obs, action], 1)
        return ops.stack([self.q0(x).reshape((-1,)), self.q1(x).reshape((-1,))])


class _First(nn.Cell):
    """Q_1 alone through a Cell (``ms.jit`` of the bound method ``critic.first`` would register that method as the
    critic's graph in MindSpore 2.10: later graphs calling ``critic(...)`` then compile ``first`` instead)."""

    def __init__(self, net):
        super().__init__()
        self.net = net

    def construct(self, obs, action):
        return self.net.first(obs, action)


class _Weighted(nn.Cell):
    """sum(c * Q) for fixed coefficients c (2, B): a loss whose gradient reaches every weight of both critics."""

    def __init__(self, net, first=False):
        super().__init__()
        self.net, self.first = net, first

    def construct(self, obs, action, c):
        if self.first:
            return (self.net.first(obs, action) * c[0]).sum()
        return (self.net(obs, action) * c).sum()


def _grads(net, obs, action, c, first=False):
    """Gradients w.r.t. the action and every trainable Parameter, in one compiled call."""
    loss = _Weighted(net, first)
    grad = ms.jit(ms.value_and_grad(loss, 1, net.trainable_params()))
    value, (g_action, g_params) = grad(obs, action, c)
    return value.asnumpy(), g_action.asnumpy(), [g.asnumpy() for g in g_params]


@pytest.mark.parametrize("ortho", [False, True], ids=["default-init", "ortho-init"])
@pytest.mark.parametrize("batch", [5, 1])  # (1: MindSpore's BiasAddGrad refused it: SAC/TD3 with batch_size 1)
def test_ensemble_matches_two_dense_mlps(ortho, batch):
    critic, refs = _pair(ortho)
    ref = _Refs(refs)
    names = [n for n, _ in critic.parameters_and_names()]
    # initialised as the two nn.Dense MLPs drawn one after the other, in their (out, in) layout
    split = dict(kv for n, p in critic.parameters_and_names() for kv in split_ensemble(n, p.asnumpy()))
    expected = {f"qf{k}.{n}": p.asnumpy() for k, r in enumerate(refs) for n, p in r.parameters_and_names()}
    assert split.keys() == expected.keys()
    for n in expected:
        np.testing.assert_array_equal(split[n], expected[n], err_msg=n)
    rng = np.random.default_rng(0)
    obs, action = (Tensor(rng.normal(size=(batch, d)).astype(np.float32)) for d in (OBS, ACT))
    c = Tensor(rng.normal(size=(2, batch)).astype(np.float32))
    q = ms.jit(critic)(obs, action).asnumpy()
    assert q.shape == (2, batch)
    np.testing.assert_allclose(q, ref(obs, action).asnumpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ms.jit(_First(critic))(obs, action).asnumpy(), q[0], rtol=1e-5, atol=1e-6)
    value, g_action, g_params = _grads(critic, obs, action, c)
    ref_value, ref_action, ref_params = _grads(ref, obs, action, c)
    np.testing.assert_allclose(value, ref_value, rtol=1e-5)
    np.testing.assert_allclose(g_action, ref_action, rtol=1e-4, atol=1e-6)
    g_split = dict(kv for n, g in zip(names, g_params) for kv in split_ensemble(n, g))
    assert len(g_split) == len(ref_params)
    for (n, _), g in zip(ref.parameters_and_names(), ref_params):
        key = "qf" + n[1:]  # (q0.0.weight -> qf0.0.weight)
        np.testing.assert_allclose(g_split[key], g, rtol=1e-4, atol=1e-6, err_msg=key)
    # Q_1 alone (TD3's actor loss): its action gradient is the first reference MLP's
    _, g_first, _ = _grads(critic, obs, action, c, first=True)
    c0 = Tensor(np.stack([c.asnumpy()[0], np.zeros(batch, np.float32)]))
    _, ref_first, _ = _grads(ref, obs, action, c0)
    np.testing.assert_allclose(g_first, ref_first, rtol=1e-4, atol=1e-6)


def test_split_and_stack_are_inverse_and_leave_other_names_alone():
    w = np.arange(2 * 4 * 3, dtype=np.float32).reshape(2, 4, 3)
    b = np.arange(8, dtype=np.float32).reshape(2, 4)
    for name, arr in (("critic.qf.2.weight", w), ("critic_optimizer.m.critic.qf.0.bias", b)):
        parts = split_ensemble(name, arr)
        assert [n for n, _ in parts] == [name.replace(".qf.", ".qf0."), name.replace(".qf.", ".qf1.")]
        np.testing.assert_array_equal(stack_ensemble(name, dict(parts)), arr)
        assert stack_ensemble(name, dict(parts[:1])) is None  # one critic missing: nothing made up
    assert split_ensemble("actor.mu.weight", w)[0][1] is w
    assert split_ensemble("critic.qf0x.weight", w) == [("critic.qf0x.weight", w)]  # (a whole segment only)
    assert stack_ensemble("actor.mu.weight", {}) is None


def test_checkpoints_store_the_critics_per_critic_and_load_both_layouts(tmp_path):
    """Checkpoints keep the file format of two separate nn.Dense critics (names qf0.*/qf1.*, (out, in) arrays, Adam
    moments likewise), so a checkpoint written before the ensemble loads here and one written here loads in a
    version from before it; loading stacks them back: every stored array and the parameter hash come back."""
    from scalebox_ms import Config
    from scalebox_ms.trainers import make_trainer
    from scalebox_ms.trainers.checkpoint import read_checkpoint

    cfg = Config.from_dict({"algo": "sac", "env": {"id": "Pendulum-v1", "num_envs": 1},
                            "policy": {"pi_layers": [16, 16], "vf_layers": [16, 16]},
                            "sac": {"batch_size": 16, "learning_starts": 20, "buffer_size": 500},
                            "run": {"seed": 3, "total_steps": 200, "progress": False}})
    t = make_trainer(cfg)
    t.learn(until=60)
    path = t.save(str(tmp_path / "ck"))
    stored = {n: np.asarray(a).shape for n, a in read_checkpoint(path)["tensors"].items()}
    assert not any(".qf." in n for n in stored)
    # the names and shapes two plain mlp() critics (the layout before the ensemble) have, for the networks and
    # both Adam moments
    dense = [(n, tuple(p.shape)) for n, p in mlp(OBS + 1, [16, 16], 1, "relu", False, 1.0).parameters_and_names()]
    for prefix in ("model.critic.", "model.critic_target.", "model.critic_optimizer.critic_optimizer.m.critic.",
                   "model.critic_optimizer.critic_optimizer.v.critic."):
        for k in range(2):
            for n, shape in dense:
                assert stored.get(f"{prefix}qf{k}.{n}") == shape, f"{prefix}qf{k}.{n}"
    fresh = make_trainer(cfg)
    fresh.load(path)
    assert fresh.parameters_sha256() == t.parameters_sha256()
    for (n, p), (_, q) in zip(t._named_state(), fresh._named_state()):
        np.testing.assert_array_equal(p.asnumpy(), q.asnumpy(), err_msg=n)
    t.close()
    fresh.close()


def _np_mlp(weights, prefix, x):
    """An nn.Dense MLP ``<prefix>.<i>.weight/bias`` in numpy, ReLU between layers, linear output."""
    layers = sorted({int(n.split(".")[-2]) for n in weights if n.startswith(prefix + ".")})
    h = x.astype(np.float64)
    for j, i in enumerate(layers):
        h = h @ weights[f"{prefix}.{i}.weight"].T + weights[f"{prefix}.{i}.bias"]
        if j + 1 < len(layers):
            h = np.maximum(h, 0.0)
    return h


def _np_critic(weights, prefix, k, obs, action):
    """Q_k(obs, action) in numpy from the per-critic arrays ``<prefix>.qf<k>.<i>.weight/bias``."""
    return _np_mlp(weights, f"{prefix}.qf{k}", np.concatenate([obs, action], 1))[:, 0]


class _Call(nn.Cell):
    def __init__(self, learner, method):
        super().__init__(auto_prefix=False)
        self.learner, self.method = learner, method

    def construct(self, *args):
        if self.method == "step":
            return self.learner.train_step(*args)
        if self.method == "sac_actor":
            return self.learner.actor.action_log_prob(*args)
        return self.learner.actor_target(*args)


@pytest.mark.parametrize("algo", ["sac", "td3"])
def test_one_gradient_step_reports_the_papers_losses(algo):
    """One SAC/TD3 gradient step through the ensemble critics against the losses written out in numpy from the
    per-critic weights (two separate critics): SAC J(Q) = 0.5 sum_k mean (Q_k - y)^2 with y from min_k Q_target_k,
    J(pi) = mean(alpha log pi - min_k Q_k) with the updated critics; TD3 J(Q) = sum_k mean (Q_k - y)^2 and
    J(pi) = -mean Q_1(s, mu(s)) with the updated critic 1; q_values = mean Q_1(s, a) before the update."""
    from scalebox_ms import Config
    from scalebox_ms.trainers import make_trainer

    cfg = Config.from_dict({"algo": algo, "env": {"id": "Pendulum-v1", "num_envs": 1},
                            "policy": {"pi_layers": [16, 16], "vf_layers": [16, 16]},
                            algo: {"batch_size": 8, "learning_starts": 10, "buffer_size": 100,
                                   **({"policy_delay": 1} if algo == "td3" else {})},
                            "run": {"seed": 5, "total_steps": 100, "progress": False}})
    t = make_trainer(cfg)
    learner = t.learner
    rng = np.random.default_rng(1)
    B, gamma = 8, float(cfg.algo_config.gamma)
    obs, next_obs = (rng.normal(size=(B, OBS)).astype(np.float32) for _ in range(2))
    action = rng.uniform(-1, 1, size=(B, 1)).astype(np.float32)
    reward = rng.normal(size=B).astype(np.float32)
    terminated = (rng.random(B) < 0.3).astype(np.float32)
    noise = t._train_noise(rng, 1, B)[0]
    before = {n: np.array(a) for n, a in learner.logical_parameters()}  # (copies: asnumpy can share memory)
    T = Tensor
    if algo == "sac":
        alpha = float(np.exp(before["log_alpha"][0]))
        next_a, next_lp = (x.asnumpy() for x in ms.jit(_Call(learner, "sac_actor"))(T(next_obs), T(noise[1])))
        a_pi, lp_pi = (x.asnumpy() for x in ms.jit(_Call(learner, "sac_actor"))(T(obs), T(noise[0])))
        next_q = np.minimum(*(_np_critic(before, "critic_target", k, next_obs, next_a) for k in range(2)))
        y = reward + gamma * (1.0 - terminated) * (next_q - alpha * next_lp)
    else:
        o = cfg.algo_config
        smooth = np.clip(noise * o.target_policy_noise, -o.target_noise_clip, o.target_noise_clip)
        next_a = np.clip(ms.jit(_Call(learner, "td3_target_actor"))(T(next_obs)).asnumpy() + smooth, -1, 1)
        next_q = np.minimum(*(_np_critic(before, "critic_target", k, next_obs, next_a) for k in range(2)))
        y = reward + gamma * (1.0 - terminated) * next_q
    q = [_np_critic(before, "critic", k, obs, action) for k in range(2)]
    per_critic = [((qk - y) ** 2).mean() for qk in q]
    stats = ms.jit(_Call(learner, "step"))(T(obs), T(action), T(reward), T(next_obs), T(terminated), T(noise),
                                          T(np.int32(0)), T(np.float32(1e-3))).asnumpy()
    named = dict(zip(learner.STATS, stats))
    after = {n: np.array(a) for n, a in learner.logical_parameters()}
    assert not np.array_equal(after["critic.qf1.2.weight"], before["critic.qf1.2.weight"])  # both critics trained
    assert not np.array_equal(after["critic.qf0.2.weight"], before["critic.qf0.2.weight"])
    if algo == "sac":
        np.testing.assert_allclose(named["critic_loss"], 0.5 * sum(per_critic), rtol=1e-4)
        q_pi = np.minimum(*(_np_critic(after, "critic", k, obs, a_pi) for k in range(2)))
        np.testing.assert_allclose(named["actor_loss"], (alpha * lp_pi - q_pi).mean(), rtol=1e-4, atol=1e-6)
    else:
        np.testing.assert_allclose(named["critic_loss"], sum(per_critic), rtol=1e-4)
        mu_before = np.tanh(_np_mlp(before, "actor.mu", obs))
        np.testing.assert_allclose(named["actor_loss"], -_np_critic(after, "critic", 0, obs, mu_before).mean(),
                                   rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(named["q_values"], q[0].mean(), rtol=1e-4, atol=1e-6)
    t.close()

