"""FusedDense and layer='fused' models vs nn.Dense references: outputs, gradients, Adam, checkpoint mapping, quant."""
import mindspore as ms
import numpy as np
import pytest
from conftest import small_config
from mindspore import Tensor, nn, ops

from scalebox_ms.errors import CheckpointError, ConfigError
from scalebox_ms.models import SpaceSpec, build_model
from scalebox_ms.models.actor_critic import ActorCritic, ActStep
from scalebox_ms.ops import FusedDense, aligned, fused_mlp
from scalebox_ms.quant import DynamicQuantizer
from scalebox_ms.sandbox import Sandbox


def _identity(x):
    return x


_ACT = {"tanh": ops.tanh, "relu": ops.relu, None: _identity}


@pytest.fixture(autouse=True, scope="module")
def _sandbox():
    Sandbox(device="auto", seed=0)


def _fwd_grad(cell, act, x, r):
    """(output, d loss/dx, d loss/dW, d loss/db) of loss = sum(act(cell(x)) * r), in one compiled graph."""

    def loss(x):
        y = act(cell(x))
        return (y * r).sum(), y

    step = ms.jit(ms.value_and_grad(loss, grad_position=0, weights=[cell.weight, cell.bias], has_aux=True))
    (_, y), (gx, (gw, gb)) = step(x)
    return y.asnumpy(), gx.asnumpy(), gw.asnumpy(), gb.asnumpy()


@pytest.mark.parametrize("n_in, n_out, act, align", [(5, 7, "tanh", 4), (4, 64, "relu", 16), (3, 2, None, 1),
                                                      (64, 2, "tanh", 16)])
def test_fused_dense_equals_dense_plus_activation(n_in, n_out, act, align):
    rng = np.random.default_rng(n_in * 100 + n_out)
    w = rng.normal(size=(n_out, n_in)).astype(np.float32)
    b = rng.normal(size=n_out).astype(np.float32)
    x = Tensor(rng.normal(size=(9, n_in)).astype(np.float32))
    r = Tensor(rng.normal(size=(9, n_out)).astype(np.float32))
    fused = FusedDense(n_in, n_out, act, align, weight_init=w, bias_init=b)
    dense = nn.Dense(n_in, n_out, weight_init=Tensor(w), bias_init=Tensor(b))

    storage = (aligned(n_out, align), aligned(n_in, align))
    assert fused.weight.shape == storage and fused.bias.shape == (storage[0],)
    assert aligned(5, 4) == 8 and aligned(64, 16) == 64 and aligned(3, 1) == 3
    np.testing.assert_array_equal(fused.logical_weight(), w)
    np.testing.assert_array_equal(fused.logical_bias(), b)
    np.testing.assert_array_equal(fused.weight.asnumpy()[n_out:], 0)
    np.testing.assert_array_equal(fused.weight.asnumpy()[:, n_in:], 0)

    yf, gxf, gwf, gbf = _fwd_grad(fused, _ACT[None], x, r)
    yd, gxd, gwd, gbd = _fwd_grad(dense, _ACT[act], x, r)
    assert yf.shape == yd.shape == (9, n_out) and gxf.shape == (9, n_in)
    np.testing.assert_allclose(yf, yd, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(gxf, gxd, rtol=1e-5, atol=1e-6)
    assert gwf.shape == storage
    np.testing.assert_allclose(gwf[:n_out, :n_in], gwd, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(gbf[:n_out], gbd, rtol=1e-5, atol=1e-6)
    # the padding is invisible: exactly zero gradient there (so Adam never moves it)
    assert not gwf[n_out:].any() and not gwf[:, n_in:].any() and not gbf[n_out:].any()
    assert np.abs(gwd).max() > 0  # the reference gradient is not trivially zero


def test_fused_dense_of_an_empty_batch_is_empty_like_dense():
    """The input padding's kernel (PadV3) refused an empty batch, where nn.Dense returns (0, out)."""
    fused = FusedDense(5, 3, "tanh", 4)
    assert fused(Tensor(np.zeros((0, 5), np.float32))).shape == (0, 3)
    assert fused(Tensor(np.zeros((2, 0, 5), np.float32))).shape == (2, 0, 3)
    with pytest.raises(ValueError, match=r"fused_mlp: 1 \(weight_init, bias_init\) pairs for 2 layers"):
        fused_mlp([4, 8, 2], "tanh", inits=[(None, None)])  # (an IndexError)


def test_an_exported_fused_mlp_runs_every_batch_size(tmp_path):
    """A check for an empty batch in construct became a runtime Switch under export's dynamic batch: the loaded
    graph ran its first batch size and failed on the second ("The actor already exists")."""
    import mindspore as ms

    net = fused_mlp([5, 8, 3], "tanh", align=4)
    ms.export(net, Tensor(shape=[None, 5], dtype=ms.float32), file_name=str(tmp_path / "mlp"), file_format="MINDIR")
    graph = nn.GraphCell(ms.load(str(tmp_path / "mlp.mindir")))
    for batch in (4, 4, 1, 7):
        x = Tensor(np.random.default_rng(batch).normal(size=(batch, 5)).astype(np.float32))
        np.testing.assert_allclose(graph(x).asnumpy(), net(x).asnumpy(), rtol=1e-6, atol=1e-6)


def test_fused_dense_load_logical_is_seen_by_compiled_graphs():
    fd = FusedDense(3, 5, "relu", 8)

    @ms.jit
    def f(x):
        return fd(x)

    x = np.random.default_rng(0).normal(size=(4, 3)).astype(np.float32)
    f(Tensor(x))  # compiled and run once: later set_data would be invisible
    w, b = np.arange(15, dtype=np.float32).reshape(5, 3) / 10, np.full(5, -0.5, np.float32)
    fd.load_logical(w, b)
    np.testing.assert_allclose(f(Tensor(x)).asnumpy(), np.maximum(x @ w.T + b, 0), rtol=1e-5, atol=1e-6)
    assert fd.weight.shape == (8, 8) and not fd.weight.asnumpy()[5:].any()
    with pytest.raises(ValueError, match="logical weight"):
        fd.load_logical(np.zeros((8, 8), np.float32), b)
    with pytest.raises(ValueError, match="activation"):
        FusedDense(3, 5, "gelu")
    with pytest.raises(ValueError, match="align"):
        FusedDense(3, 5, None, 0)


# ---------------------------------------------------------------------------------------------- models
SPECS = {
    "discrete": (SpaceSpec(4, True, 2), {"pi_layers": (64, 64), "vf_layers": (64, 64), "activation": "tanh"}),
    "continuous": (SpaceSpec(3, False, 2, low=(-2.0, -2.0), high=(2.0, 2.0)),
                   {"pi_layers": (20,), "vf_layers": (24, 8), "activation": "relu", "log_std_init": -0.5}),
}


def _pair(kind, align=16, seed=11):
    spec, kw = SPECS[kind]
    ms.set_seed(seed)
    dense = ActorCritic(spec, layer="dense", **kw)
    ms.set_seed(seed)
    fused = ActorCritic(spec, layer="fused", align=align, **kw)
    return spec, dense, fused


def _batch(spec, n=12, seed=0):
    rng = np.random.default_rng(seed)
    obs = rng.normal(size=(n, spec.obs_dim)).astype(np.float32)
    if spec.discrete:
        return obs, rng.gumbel(size=(n, spec.action_dim)).astype(np.float32), rng.integers(0, spec.action_dim, n).astype(np.int32)
    return obs, rng.normal(size=(n, spec.action_dim)).astype(np.float32), rng.normal(size=(n, spec.action_dim)).astype(np.float32)


def _padding(model, name, arr):
    """The entries of storage array ``arr`` outside the logical block (a copy with the logical block zeroed)."""
    out = np.array(arr, copy=True)
    out[tuple(slice(0, n) for n in model.to_logical(name, arr).shape)] = 0
    return out


def _evaluate(model, obs, actions):
    @ms.jit
    def ev(o, a):
        return model.evaluate_actions(o, a)

    return ev(obs, actions)


class TrainStep(nn.Cell):
    """A PPO-shaped loss on model.evaluate_actions + Adam over model.trainable_params(), as the update uses them."""

    def __init__(self, model):
        super().__init__(auto_prefix=False)
        self.model = model
        self.optimizer = nn.Adam(model.trainable_params(), learning_rate=1e-2)
        self.grad_fn = ms.value_and_grad(self.loss, None, self.optimizer.parameters)

    def loss(self, obs, actions, adv, ret):
        log_prob, entropy, value = self.model.evaluate_actions(obs, actions)
        return -(log_prob * adv).mean() - 0.01 * entropy.mean() + 0.5 * ((value - ret) ** 2).mean()

    @ms.jit
    def construct(self, obs, actions, adv, ret):
        loss, grads = self.grad_fn(obs, actions, adv, ret)
        self.optimizer(grads)
        return loss, grads


@pytest.mark.parametrize("kind", ["discrete", "continuous"])
def test_fused_model_equals_dense_model(kind):
    spec, dense, fused = _pair(kind)
    # same names, same logical shapes, same initial values (same initializer calls under the same seed)
    ld, lf = dense.logical_parameters(), fused.logical_parameters()
    assert [n for n, _ in lf] == [n for n, _ in ld] == [n for n, _ in dense.parameters_and_names()]
    assert "pi_net.2.weight" in dict(lf) or "pi_net.0.weight" in dict(lf)
    for (name, a), (_, b) in zip(ld, lf):
        assert a.shape == b.shape, name
        np.testing.assert_array_equal(a, b, err_msg=name)
    assert any(p.shape != a.shape for (_, p), (_, a) in zip(fused.parameters_and_names(), ld))  # storage is padded

    obs, noise, actions = _batch(spec)
    out_d = ActStep(dense)(Tensor(obs), Tensor(noise))
    out_f = ActStep(fused)(Tensor(obs), Tensor(noise))
    for a, b in zip(out_d, out_f):
        np.testing.assert_allclose(a.asnumpy(), b.asnumpy(), rtol=1e-5, atol=1e-5)

    rng = np.random.default_rng(1)
    adv, ret = (Tensor(rng.normal(size=len(obs)).astype(np.float32)) for _ in range(2))
    sd, sf = TrainStep(dense), TrainStep(fused)
    for step in range(3):
        loss_d, grads_d = sd(Tensor(obs), Tensor(actions), adv, ret)
        loss_f, grads_f = sf(Tensor(obs), Tensor(actions), adv, ret)
        np.testing.assert_allclose(loss_f.asnumpy(), loss_d.asnumpy(), rtol=1e-5, atol=1e-6)
        for (name, p), gd, gf in zip(fused.parameters_and_names(), grads_d, grads_f):
            gf = gf.asnumpy()
            np.testing.assert_allclose(fused.to_logical(name, gf), gd.asnumpy(), rtol=1e-4, atol=1e-6, err_msg=name)
            assert not _padding(fused, name, gf).any(), f"{name}: non-zero gradient in the padding"
    # after 3 Adam steps: same logical weights, padding still exactly zero
    for (name, a), (_, b) in zip(dense.logical_parameters(), fused.logical_parameters()):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5, err_msg=name)
    n_padded = 0
    for name, p in fused.parameters_and_names():
        assert not _padding(fused, name, p.asnumpy()).any(), f"{name}: Adam moved the padding"
        n_padded += p.shape != fused.to_logical(name, p.asnumpy()).shape
    assert n_padded >= 4
    # evaluate_actions after training, outside the train step
    outs = [_evaluate(model, Tensor(obs), Tensor(actions)) for model in (dense, fused)]
    for a, b in zip(*outs):
        np.testing.assert_allclose(b.asnumpy(), a.asnumpy(), rtol=1e-4, atol=1e-5)

    # optimizer state maps to the dense layout too (names "moment1.pi_net.0.weight", ...)
    opt_d = {n: p.asnumpy() for n, p in sd.optimizer.parameters_and_names()}
    n_checked = 0
    for name, p in sf.optimizer.parameters_and_names():
        logical = fused.to_logical(name, p.asnumpy())
        assert logical.shape == opt_d[name].shape, name
        if name.startswith("moment"):
            np.testing.assert_allclose(logical, opt_d[name], rtol=1e-3, atol=1e-6, err_msg=name)
            n_checked += 1
    assert n_checked == 2 * len(fused.trainable_params())


def test_to_logical_to_storage_round_trip():
    _spec, dense, fused = _pair("continuous", align=8)
    layouts = fused.storage_layouts()
    assert layouts["pi_net.0.weight"] == ((20, 3), (24, 8)) and layouts["vf_net.4.bias"] == ((1,), (8,))
    assert "log_std" not in layouts and dense.storage_layouts() == {}
    for name, p in fused.parameters_and_names():
        storage = p.asnumpy()
        logical = fused.to_logical(name, storage)
        for prefix in ("", "model.", "moment1.", "adam_m.", "optimizer.moment2."):
            np.testing.assert_array_equal(fused.to_storage(prefix + name, logical), storage)
            np.testing.assert_array_equal(fused.to_logical(prefix + name, storage), logical)
        assert fused.to_storage(name, logical).dtype == np.float32
    w = np.random.default_rng(0).normal(size=(20, 3)).astype(np.float32)
    padded = fused.to_storage("moment1.pi_net.0.weight", w)
    assert padded.shape == (24, 8) and not padded[20:].any() and not padded[:, 3:].any()
    np.testing.assert_array_equal(fused.to_logical("pi_net.0.weight", padded), w)
    np.testing.assert_array_equal(fused.to_logical("pi_net.0.weight", w), w)  # already logical: unchanged
    # identity for non-fused names, including scalars and names that only look similar
    for name, arr in [("log_std", np.ones(2)), ("beta1_power", np.float32(0.9)), ("global_step", np.int32(3)),
                      ("xpi_net.0.weight", np.ones((5, 5)))]:
        np.testing.assert_array_equal(fused.to_logical(name, arr), arr)
        np.testing.assert_array_equal(fused.to_storage(name, arr), arr)
    with pytest.raises(CheckpointError, match="pi_net.0.weight"):
        fused.to_storage("pi_net.0.weight", np.zeros((21, 3)))
    with pytest.raises(CheckpointError, match="neither"):
        fused.to_logical("moment2.vf_net.0.weight", np.zeros((3, 3)))
    # loading the dense model's logical parameters makes the fused model identical to it
    fused.load_logical_parameters(dense.logical_parameters())
    for (name, a), (_, b) in zip(dense.logical_parameters(), fused.logical_parameters()):
        np.testing.assert_array_equal(a, b, err_msg=name)
    with pytest.raises(CheckpointError, match="missing"):
        fused.load_logical_parameters(dense.logical_parameters()[:-1])


def test_build_model_honours_policy_layer_and_align():
    cfg = small_config(policy={"layer": "fused", "align": 8, "pi_layers": [10]})
    model = build_model(SpaceSpec(4, True, 2), cfg.policy)
    layers = [c for c in model.pi_net.cells() if isinstance(c, FusedDense)]
    assert [c.weight.shape for c in layers] == [(16, 8), (8, 16)] and all(c.align == 8 for c in layers)
    assert [n for n, _ in model.parameters_and_names()][:4] == ["pi_net.0.weight", "pi_net.0.bias",
                                                                  "pi_net.2.weight", "pi_net.2.bias"]
    dense = build_model(SpaceSpec(4, True, 2), small_config().policy)
    assert all(isinstance(c, (nn.Dense, nn.Tanh)) for c in dense.pi_net.cells())
    with pytest.raises(ConfigError, match="policy.layer"):
        ActorCritic(SpaceSpec(4, True, 2), layer="conv")


def test_mlp_layers_refuses_what_it_cannot_describe():
    """An nn.Dense's own activation, an nn.Sigmoid, a Dense without bias were left out of the layer list: a
    quantised copy (DynamicQuantizer reads it) then computed another function."""
    from mindspore import nn

    from scalebox_ms.ops.fused import mlp_layers

    assert [l.activation for l in mlp_layers(nn.SequentialCell([nn.Dense(4, 8), nn.Tanh(), nn.Dense(8, 2)]))] == \
        ["tanh", None]
    for cells, culprit in [([nn.Dense(4, 8, activation="tanh"), nn.Dense(8, 2)], "layer 0 is an nn.Dense with"),
                           ([nn.Dense(4, 8), nn.Sigmoid(), nn.Dense(8, 2)], "layer 1 is a Sigmoid"),
                           ([nn.Dense(4, 8, has_bias=False), nn.ReLU()], "layer 0 is an nn.Dense with"),
                           ([nn.ReLU(), nn.Dense(4, 2)], "layer 0 is a ReLU")]:
        with pytest.raises(ValueError, match=culprit):
            mlp_layers(nn.SequentialCell(cells))


def test_quantizer_reads_fused_layers_logically():
    for kind in ("discrete", "continuous"):
        spec, dense, fused = _pair(kind, align=16, seed=5)
        data = np.random.default_rng(2).normal(size=(64, spec.obs_dim)).astype(np.float32)
        for level in ("L1", "L2"):
            qd, qf = DynamicQuantizer(quant_level=level)(dense, data), DynamicQuantizer(quant_level=level)(fused, data)
            assert qf.info == qd.info
            for a, b in zip(qd.layers, qf.layers):
                assert a.weight_int8.shape == b.weight_int8.shape
                np.testing.assert_array_equal(a.weight_int8.asnumpy(), b.weight_int8.asnumpy())
                np.testing.assert_array_equal(a.bias.asnumpy(), b.bias.asnumpy())
            np.testing.assert_array_equal(qf(Tensor(data)).asnumpy(), qd(Tensor(data)).asnumpy())


def test_fused_trainer_checkpoint_is_the_dense_checkpoint(tmp_path):
    """A policy.layer=fused run saves logical (nn.Dense-shaped) tensors, hashes like the dense model, and its
    checkpoint loads into a dense trainer (and back) with identical parameters, optimizer state and actions."""
    from conftest import small_config

    from scalebox_ms.trainers import PPOTrainer
    from scalebox_ms.trainers.checkpoint import read_checkpoint

    fused = PPOTrainer(small_config(policy={"layer": "fused", "align": 16}))
    dense = PPOTrainer(small_config())
    assert any(tuple(p.shape) != tuple(q.shape) for (_, p), (_, q) in zip(fused._named_state(), dense._named_state()))
    fused.learn(total_steps=128)
    path = fused.save(str(tmp_path / "ck"))
    tensors = read_checkpoint(path)["tensors"]
    for name, param in dense._named_state():  # same names, dense shapes
        assert tensors[name].shape == tuple(param.shape), name
    dense.load(path)
    assert dense.parameters_sha256() == fused.parameters_sha256()
    m_f = {n: fused.model.to_logical(n, p.asnumpy()) for n, p in fused._named_state()}
    for name, param in dense._named_state():
        np.testing.assert_array_equal(param.asnumpy(), m_f[name], err_msg=name)
    obs = np.random.default_rng(0).normal(size=(4, 4)).astype(np.float32)
    np.testing.assert_array_equal(dense.predict(obs), fused.predict(obs))
    # and back: a dense checkpoint into a fused trainer (padding restored as zeros)
    path2 = dense.save(str(tmp_path / "ck2"))
    again = PPOTrainer(small_config(policy={"layer": "fused", "align": 16})).load(path2)
    assert again.parameters_sha256() == dense.parameters_sha256()
    w = dict(again.model.pi_net.name_cells())["0"].weight.asnumpy()
    assert w.shape == (64, 16) and np.all(w[:, 4:] == 0)  # obs_dim 4 padded to 16 with zeros
    for t in (fused, dense, again):
        t.close()
