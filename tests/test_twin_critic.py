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
def test_ensemble_matches_two_dense_mlps(ortho):
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
    obs, action = (Tensor(rng.normal(size=(5, d)).astype(np.float32)) for d in (OBS, ACT))
    c = Tensor(rng.normal(size=(2, 5)).astype(np.float32))
    q = ms.jit(critic)(obs, action).asnumpy()
    assert q.shape == (2, 5)
    np.testing.assert_allclose(q, ref(obs, action).asnumpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ms.jit(_First(critic))(obs, action).asnumpy(), q[0], rtol=1e-5, atol=1e-6)
    value, g_action, g_params = _grads(critic, obs, action, c)
    ref_value, ref_action, ref_params = _grads(ref, obs, action, c)
    np.testing.assert_allclose(value, ref_value, rtol=1e-5)
    np.testing.assert_allclose(g_action, ref_action, rtol=1e-4, atol=1e-6)
    g_split = dict(kv for n, g in zip(names, g_params) for kv in split_ensemble(n, g))
    ref_named = {f"q{k}": r for k, r in enumerate(refs)}
    for (n, _), g in zip(ref.parameters_and_names(), ref_params):
        key = "qf" + n[1:]  # (q0.0.weight -> qf0.0.weight)
        assert ref_named and key in g_split
        np.testing.assert_allclose(g_split[key], g, rtol=1e-4, atol=1e-6, err_msg=key)
    # Q_1 alone (TD3's actor loss): its action gradient is the first reference MLP's
    _, g_first, _ = _grads(critic, obs, action, c, first=True)
    c0 = Tensor(np.stack([c.asnumpy()[0], np.zeros(5, np.float32)]))
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


def test_checkpoint_in_the_per_critic_layout_loads(tmp_path):
    """A checkpoint written before the ensemble (qf0.*/qf1.* tensors, the moments too) resumes: every stored array
    and the parameter hash come back."""
    from scalebox_ms import Config
    from scalebox_ms.trainers import make_trainer
    from scalebox_ms.trainers.checkpoint import read_checkpoint, write_checkpoint

    cfg = Config.from_dict({"algo": "sac", "env": {"id": "Pendulum-v1", "num_envs": 1},
                            "policy": {"pi_layers": [16, 16], "vf_layers": [16, 16]},
                            "sac": {"batch_size": 16, "learning_starts": 20, "buffer_size": 500},
                            "run": {"seed": 3, "total_steps": 200, "progress": False}})
    t = make_trainer(cfg)
    t.learn(until=60)
    path = t.save(str(tmp_path / "new"))
    ck = read_checkpoint(path)
    old = [{"name": n, "data": Tensor(a)} for name, arr in ck["tensors"].items()
           for n, a in split_ensemble(name, np.asarray(arr))]
    assert any(".qf0." in d["name"] for d in old) and not any(".qf." in d["name"] for d in old)
    old_path = write_checkpoint(str(tmp_path / "old"), old, ck["sidecar"], env_obj=ck["env"], replay=ck["replay"])
    fresh = make_trainer(cfg)
    fresh.load(old_path)
    assert fresh.parameters_sha256() == t.parameters_sha256()
    for (n, p), (_, q) in zip(t._named_state(), fresh._named_state()):
        np.testing.assert_array_equal(p.asnumpy(), q.asnumpy(), err_msg=n)
    t.close()
    fresh.close()
