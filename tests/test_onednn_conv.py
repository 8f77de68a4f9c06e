"""NatureCNN's convolutions on oneDNN's own primitives (``policy.conv_backend``, ops/custom/onednn_conv.cc) against
MindSpore's ``ops.conv2d`` and the im2col path: outputs and every gradient, the choice and its errors, trainers that
use it, and MindIR exports that never contain it."""
import logging
import os
import platform
import subprocess
import sys
import textwrap

import mindspore as ms
import numpy as np
import pytest
from mindspore import ops

import image_envs  # noqa: F401  (registers BrightSide-v0)
from scalebox_ms import Config
from scalebox_ms.errors import ConfigError, CustomOpError
from scalebox_ms.models.cnn import NatureCNN, builtin_patches, patch_kernel_cnns
from scalebox_ms.ops.custom import onednn_conv
from scalebox_ms.ops.custom.onednn_conv import (BACKWARD_DATA, BACKWARD_WEIGHTS, FORWARD, OneDNNConv,
                                                implementation, slow_passes)
from scalebox_ms.trainers import Callback, DQNTrainer, PPOTrainer
from scalebox_ms.trainers.kernels import select_conv_backend


def _conv_and_grads(conv, x, w, b, dy):
    """y = conv(x, w, b) and the gradients of sum(y * dy) for x, w and b, compiled."""
    def loss(x, w, b):
        return (conv(x, w, b) * dy).sum()

    y = ms.jit(conv)(x, w, b)
    grads = ms.jit(ms.grad(loss, grad_position=(0, 1, 2)))(x, w, b)
    return [y.asnumpy()] + [g.asnumpy() for g in grads]


@pytest.mark.parametrize("shape,out,k,s", [
    ((3, 4, 36, 40), 8, 8, 4),     # a first layer: few input channels (NHWC for the weight gradient)
    ((2, 8, 9, 11), 6, 4, 2),      # odd sizes, stride 2
    ((2, 16, 10, 10), 16, 3, 1),   # 16 channels: oneDNN's blocked layouts throughout
    ((1, 5, 7, 7), 3, 7, 1),       # a 1x1 output
])
def test_forward_and_gradients_equal_conv2d(shape, out, k, s):
    rng = np.random.default_rng(0)
    x = ms.Tensor(rng.standard_normal(shape).astype(np.float32))
    w = ms.Tensor(rng.standard_normal((out, shape[1], k, k)).astype(np.float32) * 0.1)
    b = ms.Tensor(rng.standard_normal(out).astype(np.float32))
    oh, ow = (shape[2] - k) // s + 1, (shape[3] - k) // s + 1
    dy = ms.Tensor(rng.standard_normal((shape[0], out, oh, ow)).astype(np.float32))

    def reference(x, w, b):
        return ops.conv2d(x, w, None, stride=s, pad_mode="valid") + b.reshape(1, -1, 1, 1)

    want = _conv_and_grads(reference, x, w, b, dy)
    got = _conv_and_grads(OneDNNConv(k, s), x, w, b, dy)
    assert [g.shape for g in got] == [g.shape for g in want]
    for g, r in zip(got, want):
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-4 * np.abs(r).max())
    assert all(np.abs(g).max() > 0 for g in got)
    again = _conv_and_grads(OneDNNConv(k, s), x, w, b, dy)  # the same bits on the same input
    for g, a in zip(got, again):
        np.testing.assert_array_equal(g, a)
    # input_grad=False: no input gradient (a first layer's input is the observation), the others unchanged
    skipped = _conv_and_grads(OneDNNConv(k, s, input_grad=False), x, w, b, dy)
    assert not skipped[1].any()
    for g, a in zip(skipped[2:], got[2:]):
        np.testing.assert_array_equal(g, a)


def test_nature_cnn_on_onednn_matches_im2col():
    """uint8 frames: the same outputs and weight gradients (to float precision, compiled and eager) as the im2col
    path; switching back restores it."""
    rng = np.random.default_rng(1)
    ms.set_seed(0)
    cnn = NatureCNN((2, 44, 40), channels=(4, 8, 8), features_dim=16)
    x = ms.Tensor(rng.integers(0, 256, (6, 2, 44, 40)).astype(np.uint8))

    def grads(net):
        def loss(obs):
            return (net(obs) ** 2).sum()

        out = ms.jit(net.construct)(x).asnumpy()
        grad = ms.grad(loss, grad_position=None, weights=net.trainable_params())
        eager, compiled = [g.asnumpy() for g in grad(x)], [g.asnumpy() for g in ms.jit(grad)(x)]
        for e, c in zip(eager, compiled):  # (graph mode once gave every layer the first layer's bprop: no dx)
            np.testing.assert_allclose(c, e, rtol=1e-5, atol=1e-6 * np.abs(e).max())
        return out, compiled

    want_out, want_grads = grads(cnn)
    cnn.set_onednn(True)
    assert all(layer.use_onednn for layer in cnn.layers()) and cnn.raw_input  # (the first op reads the frames)
    assert [layer.onednn.input_grad for layer in cnn.layers()] == [False, True, True]
    assert [layer.onednn.pixels for layer in cnn.layers()] == [True, False, False]
    got_out, got_grads = grads(cnn)
    np.testing.assert_allclose(got_out, want_out, rtol=1e-5, atol=1e-6)
    assert len(got_grads) == len(want_grads) == 8
    for g, w in zip(got_grads, want_grads):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5 * np.abs(w).max())
    assert np.abs(got_grads[0]).sum() > 0  # the first layer's weight gradient comes through the op's bprop
    cnn.set_onednn(False)
    assert not any(layer.use_onednn for layer in cnn.layers()) and not cnn.raw_input
    np.testing.assert_array_equal(ms.jit(cnn.construct)(x).asnumpy(), want_out)


@pytest.mark.parametrize("shape,out,k,s", [((3, 4, 36, 40), 8, 8, 4), ((2, 1, 12, 12), 3, 4, 2)])
def test_pixels_are_cast_and_scaled_inside_the_op(shape, out, k, s):
    """pixels=True (NatureCNN's first layer): uint8 frames, or float32 pixel values, give bit for bit the output and
    weight gradients of the float32 op on MindSpore's ``x.astype(float32) * (1 / 255)``; one channel too (NCHW is
    then already the primitive's layout, the scaling reorder still runs)."""
    rng = np.random.default_rng(4)
    frames = rng.integers(0, 256, shape).astype(np.uint8)
    w = ms.Tensor(rng.standard_normal((out, shape[1], k, k)).astype(np.float32) * 0.1)
    b = ms.Tensor(rng.standard_normal(out).astype(np.float32))
    dy = ms.Tensor(rng.standard_normal((shape[0], out, (shape[2] - k) // s + 1,
                                        (shape[3] - k) // s + 1)).astype(np.float32))

    def run(conv, x):
        def loss(w, b):
            return (conv(x, w, b) * dy).sum()

        return [ms.jit(conv)(x, w, b).asnumpy()] + [g.asnumpy() for g in ms.jit(ms.grad(loss, (0, 1)))(w, b)]

    want = run(OneDNNConv(k, s, input_grad=False), ms.Tensor(frames).astype(ms.float32) * (1.0 / 255.0))
    assert np.abs(want[0]).max() > 0
    for x in (ms.Tensor(frames), ms.Tensor(frames.astype(np.float32))):
        for g, r in zip(run(OneDNNConv(k, s, input_grad=False, pixels=True), x), want):
            np.testing.assert_array_equal(g, r)
    with pytest.raises(CustomOpError, match="input_grad=False"):
        OneDNNConv(k, s, pixels=True)
    with pytest.raises(CustomOpError, match="dtype"):  # uint8 is read as pixels only
        OneDNNConv(k, s, input_grad=False)(ms.Tensor(frames), w, b)


@pytest.mark.skipif(platform.machine() != "x86_64", reason="oneDNN's JIT convolutions checked on x86-64 only")
def test_oneDNN_runs_its_jit_convolutions_for_natures_layers():
    """The point of the op: for NatureCNN's Atari shapes oneDNN picks compiled code, not its reference
    implementation (what MindSpore's own Conv2D gets); slow_passes, which auto consults, finds none."""
    for c, h, o, k, s in [(4, 84, 32, 8, 4), (32, 20, 64, 4, 2), (64, 9, 64, 3, 1)]:
        for kind in (FORWARD, BACKWARD_DATA, BACKWARD_WEIGHTS):
            name = implementation(kind, 8, c, h, h, o, k, s)
            assert name and not name.startswith("ref"), (c, h, o, k, s, kind, name)
    assert slow_passes([NatureCNN((4, 84, 84))]) == []


def test_one_kernel_thread_gives_conv2d_results_too(tmp_path):
    """SCALEBOX_MS_KERNEL_THREADS=1: oneDNN's work split over a pool of one thread (its parallel_for runs every
    piece on the caller)."""
    code = textwrap.dedent("""
        import numpy as np, mindspore as ms
        from mindspore import ops
        from scalebox_ms.ops.custom.onednn_conv import OneDNNConv
        rng = np.random.default_rng(0)
        x = ms.Tensor(rng.standard_normal((4, 8, 12, 13)).astype(np.float32))
        w = ms.Tensor(rng.standard_normal((16, 8, 4, 4)).astype(np.float32))
        b = ms.Tensor(rng.standard_normal(16).astype(np.float32))
        conv = OneDNNConv(4, 2)
        def loss(x, w, b, f):
            return (f(x, w, b) ** 2).sum()
        def ref(x, w, b):
            return ops.conv2d(x, w, None, stride=2, pad_mode="valid") + b.reshape(1, -1, 1, 1)
        def mine(x, w, b):
            return loss(x, w, b, conv)
        def theirs(x, w, b):
            return loss(x, w, b, ref)
        got = ms.jit(ms.grad(mine, grad_position=(0, 1, 2)))(x, w, b)
        want = ms.grad(theirs, grad_position=(0, 1, 2))(x, w, b)
        for g, r in zip(got, want):
            r = r.asnumpy()
            np.testing.assert_allclose(g.asnumpy(), r, rtol=1e-4, atol=1e-4 * np.abs(r).max())
        print("ok")
    """)
    script = tmp_path / "one_thread.py"  # (a file: MindSpore's jit reads the functions' source)
    script.write_text(code)
    env = {**os.environ, "SCALEBOX_MS_KERNEL_THREADS": "1"}
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300,
                         cwd=tmp_path)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-2000:]


def test_bad_shapes_are_one_line_errors():
    conv = OneDNNConv(3, 1)
    x = ms.Tensor(np.zeros((2, 4, 8, 8), np.float32))
    b = ms.Tensor(np.zeros(5, np.float32))
    with pytest.raises(CustomOpError, match=r"^custom op 'onednn_conv': inputs of 2x8 pixels are smaller than the "
                                            r"3x3 kernel$"):
        conv(ms.Tensor(np.zeros((2, 4, 2, 8), np.float32)), ms.Tensor(np.zeros((5, 4, 3, 3), np.float32)), b)
    with pytest.raises(CustomOpError, match=r"^custom op 'onednn_conv': .*wrong shape.*\(kernel return code 5\)$"):
        conv(x, ms.Tensor(np.zeros((5, 3, 3, 3), np.float32)), b)  # the weight's input channels are not x's
    with pytest.raises(CustomOpError, match="kernel size and stride must be >= 1"):
        OneDNNConv(3, 0)


def ppo_image_config(steps=128, learning_rate=1e-3, **policy):
    return Config.from_dict({
        "env": {"id": "BrightSide-v0", "num_envs": 4},
        "policy": {"pi_layers": [], "vf_layers": [], "cnn_channels": [8, 16, 16], "cnn_features_dim": 64, **policy},
        "ppo": {"n_steps": 32, "batch_size": 64, "n_epochs": 2, "learning_rate": learning_rate},
        "run": {"seed": 0, "total_steps": steps, "progress": False},
    })


def test_ppo_defaults_to_onednn_and_trains_like_im2col(caplog):
    """auto (the default) picks the op on CPU and says so, and every convolution learns; with a learning rate too
    small to move the weights, the first iteration's losses (forward passes of the compiled update graph, 2 epochs)
    match the im2col run's to float precision. (At a real learning rate Adam's first steps, ~lr * sign(gradient),
    turn float-order differences of near-zero gradients into visible ones: runs are not comparable that way.)"""
    with caplog.at_level(logging.INFO, logger="scalebox_ms"):
        fast = PPOTrainer(ppo_image_config())
    try:
        assert "policy.conv_backend auto: oneDNN (CPU)" in caplog.text
        assert fast.conv_backend == "onednn"
        assert fast.conv_kernel == "builtin"  # (no patches kernel: the op computes whole convolutions)
        assert all(layer.use_onednn for c in patch_kernel_cnns(fast.model) for layer in c.layers())
        before = [p.asnumpy().copy() for p in fast.model.trainable_params() if "conv" in p.name]
        fast.learn()
        after = [p.asnumpy() for p in fast.model.trainable_params() if "conv" in p.name]
        assert len(before) == 6 and all(not np.array_equal(a, b) for a, b in zip(after, before))
    finally:
        fast.close()
    rows = []

    class Record(Callback):
        def on_iteration_end(self, trainer, metrics):
            rows.append(metrics)

    for backend in ("onednn", "im2col"):
        tr = PPOTrainer(ppo_image_config(steps=128, conv_backend=backend, learning_rate=1e-10))
        try:
            assert tr.conv_backend == backend
            tr.learn(callbacks=[Record()])
        finally:
            tr.close()
    assert len(rows) == 2
    for key in ("value_loss", "policy_loss", "entropy_loss"):
        np.testing.assert_allclose(rows[0][key], rows[1][key], rtol=1e-4, atol=1e-7)


def test_dqn_runs_its_q_and_target_networks_on_onednn():
    cfg = Config.from_dict({
        "algo": "dqn", "env": {"id": "BrightSide-v0", "num_envs": 1},
        "policy": {"vf_layers": [], "cnn_channels": [8, 16, 16], "cnn_features_dim": 64, "conv_backend": "onednn"},
        "dqn": {"buffer_size": 500, "learning_starts": 50, "batch_size": 16, "train_freq": 4, "gradient_steps": 1},
        "run": {"seed": 0, "total_steps": 200, "progress": False},
    })
    tr = DQNTrainer(cfg)
    try:
        cnns = patch_kernel_cnns(tr.learner)
        assert len(cnns) == 2 and all(layer.use_onednn for c in cnns for layer in c.layers())
        before = [layer.weight.asnumpy().copy() for layer in patch_kernel_cnns(tr.learner.q)[0].layers()]
        tr.learn()
        assert tr.global_step == 200
        after = [layer.weight.asnumpy() for layer in patch_kernel_cnns(tr.learner.q)[0].layers()]
        assert all(not np.array_equal(a, b) for a, b in zip(after, before))
    finally:
        tr.close()


def test_choice_errors_name_the_setting(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match=r"policy\.conv_backend: 'fast' is not one of im2col, onednn, auto"):
        ppo_image_config(conv_backend="fast")
    cartpole = Config.from_dict({"env": {"id": "CartPole-v1"}, "policy": {"conv_backend": "onednn"}})
    with pytest.raises(ConfigError, match="policy.conv_backend: onednn applies to the NatureCNN"):
        PPOTrainer(cartpole)
    onednn = ppo_image_config(conv_backend="onednn").policy
    with pytest.raises(ConfigError, match="onednn cannot run with the GPU backend"):
        select_conv_backend(onednn, NatureCNN((1, 36, 36), (2, 2, 2), 4), "GPU")
    with pytest.raises(ConfigError, match="onednn cannot run with a NatureCNN built for ops.conv2d"):
        select_conv_backend(onednn, NatureCNN((1, 36, 36), (2, 2, 2), 4, im2col=False), "CPU")
    both = ppo_image_config(conv_backend="onednn", conv_kernel="custom").policy
    with pytest.raises(ConfigError, match="onednn cannot run with policy.conv_kernel: custom"):
        select_conv_backend(both, NatureCNN((1, 36, 36), (2, 2, 2), 4), "CPU")
    auto = ppo_image_config().policy
    assert select_conv_backend(auto, NatureCNN((1, 36, 36), (2, 2, 2), 4), "GPU") == "im2col"
    # auto with the patches kernel asked for: im2col, and the kernel is used
    tr = PPOTrainer(ppo_image_config(conv_kernel="custom"))
    try:
        assert tr.conv_backend == "im2col" and tr.conv_kernel == "custom"
    finally:
        tr.close()
    # oneDNN with only its reference code for a pass (what MindSpore's Conv2D runs): auto keeps im2col, onednn warns
    monkeypatch.setattr(onednn_conv, "slow_passes", lambda cnns: ["forward 1->2 8x8/4 on 36x36"])
    cnn = NatureCNN((1, 36, 36), (2, 2, 2), 4)
    assert select_conv_backend(auto, cnn, "CPU") == "im2col" and not cnn.first.use_onednn
    assert select_conv_backend(onednn, cnn, "CPU") == "onednn" and cnn.first.use_onednn
    monkeypatch.undo()
    # no compiler and no cached library: onednn is a one-line error, auto keeps im2col
    monkeypatch.setenv("SCALEBOX_MS_CUSTOM_OPS_CACHE", str(tmp_path / "empty"))
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-g++"))
    with pytest.raises(CustomOpError, match=r"^policy\.conv_backend: onednn: .*not found"):
        select_conv_backend(onednn, NatureCNN((1, 36, 36), (2, 2, 2), 4), "CPU")
    cnn = NatureCNN((1, 36, 36), (2, 2, 2), 4)
    assert select_conv_backend(auto, cnn, "CPU") == "im2col" and not cnn.first.use_onednn


def test_export_uses_mindspore_ops_and_needs_no_compiler(tmp_path, monkeypatch, capsys):
    """The MindIR file holds no custom op (it runs where scalebox_ms is not installed); the trainer uses oneDNN again
    afterwards; a run trained with it exports on a machine without a compiler."""
    from scalebox_ms.export import MindIRPolicy, export_mindir
    from scalebox_ms.export import main as export_main
    from scalebox_ms.trainers.run import train_run

    tr = PPOTrainer(ppo_image_config(steps=64, conv_backend="onednn"))
    try:
        tr.learn()
        path = str(tmp_path / "p.mindir")
        export_mindir(tr, path)
        blob = open(path, "rb").read()
        assert b"OneDNN" not in blob and b"Custom" not in blob
        assert all(c.first.use_onednn for c in patch_kernel_cnns(tr.model))
        frames = np.random.default_rng(3).integers(0, 256, (8, 40, 40, 3)).astype(np.uint8)
        np.testing.assert_array_equal(MindIRPolicy(path)(frames), tr.predict(frames))
        op = patch_kernel_cnns(tr.model)[0].first.onednn
        with builtin_patches(tr.model):
            assert not any(c.first.use_onednn for c in patch_kernel_cnns(tr.model))
        assert all(c.first.use_onednn for c in patch_kernel_cnns(tr.model))
        assert patch_kernel_cnns(tr.model)[0].first.onednn is op  # (the same op: nothing was built again)
    finally:
        tr.close()
    run_dir = tmp_path / "run"
    train_run(ppo_image_config(steps=64, conv_backend="onednn"), run_dir=str(run_dir))
    monkeypatch.setenv("SCALEBOX_MS_CUSTOM_OPS_CACHE", str(tmp_path / "empty"))
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-g++"))
    assert export_main(["--run", str(run_dir)]) == 0, capsys.readouterr().err
    assert (run_dir / "policy.mindir").stat().st_size > 0
