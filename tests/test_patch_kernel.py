"""The C++ im2col kernel of NatureCNN's first layer (``policy.conv_kernel``) against ``ops.unfold``: the same
patches bit for bit, the same CNN outputs and weight gradients, the same training run, the choice and its errors,
and MindIR exports that never contain the kernel."""
import logging

import mindspore as ms
import numpy as np
import pytest
from mindspore import ops

import image_envs  # noqa: F401  (registers BrightSide-v0)
from scalebox_ms import Config
from scalebox_ms.errors import ConfigError, CustomOpError
from scalebox_ms.models.cnn import CombinedFeatures, NatureCNN, builtin_patches, patch_kernel_cnns
from scalebox_ms.ops.custom.patches import ImagePatchesKernel
from scalebox_ms.trainers import DQNTrainer, PPOTrainer
from scalebox_ms.trainers.kernels import select_conv_kernel


def unfold_reference(x, k, s, scale):
    """What the builtin path computes: the scaled float frame, unfolded by MindSpore."""
    @ms.jit
    def ref(t):
        return ops.unfold(t.astype(ms.float32) * scale, k, 1, 0, s)

    return ref(ms.Tensor(x)).asnumpy()


@pytest.mark.parametrize("shape,k,s,dtype", [
    ((3, 4, 84, 84), 8, 4, np.uint8),    # Atari frame stacks
    ((17, 3, 37, 41), 8, 4, np.uint8),   # odd sizes, a batch split over threads (8 images or more per thread)
    ((5, 2, 20, 20), 4, 2, np.float32),  # float pixels (CombinedFeatures' unpacked frames)
    ((2, 1, 9, 9), 3, 1, np.float32),
])
def test_patches_equal_unfold_bit_for_bit(shape, k, s, dtype, monkeypatch):
    x = np.random.default_rng(0).integers(0, 256, size=shape).astype(dtype)
    want = unfold_reference(x, k, s, 1.0 / 255.0)
    for threads in ("1", "2"):
        monkeypatch.setenv("SCALEBOX_MS_KERNEL_THREADS", threads)
        got = ImagePatchesKernel(k, s, 1.0 / 255.0)(ms.Tensor(x)).asnumpy()
        assert got.shape == want.shape and got.dtype == np.float32
        np.testing.assert_array_equal(got.view(np.int32), want.view(np.int32))


def test_kernel_errors_are_one_line():
    kernel = ImagePatchesKernel(8, 4, 1.0)
    with pytest.raises(CustomOpError) as err:  # int32 frames reach the kernel: its dtype check
        kernel(ms.Tensor(np.zeros((1, 1, 12, 12), np.int32)))
    assert str(err.value).startswith("custom op 'image_patches': the frames must be uint8 or float32")
    assert str(err.value).endswith("(kernel return code 4)") and "\n" not in str(err.value)
    with pytest.raises(CustomOpError, match="kernel size and stride must be >= 1"):
        ImagePatchesKernel(0, 4)
    x = np.arange(144, dtype=np.uint8).reshape(1, 1, 12, 12)  # and it still works after the failure
    np.testing.assert_array_equal(kernel(ms.Tensor(x)).asnumpy(), unfold_reference(x, 8, 4, 1.0))


def _grads(cnn, x):
    def loss(inp):
        return (cnn(inp) ** 2).sum()

    out = ms.jit(cnn.construct)(x).asnumpy()
    return out, [g.asnumpy() for g in ms.grad(loss, grad_position=None, weights=cnn.trainable_params())(x)]


def test_nature_cnn_with_the_kernel_gives_the_builtin_outputs_and_gradients():
    """uint8 frames (NatureCNN) and float pixels (CombinedFeatures' unpacked images): the kernel's patches equal
    ops.unfold's, so the forward pass and every weight gradient (first layer included: it reads the patches through
    stop_gradient) are those of the builtin path."""
    rng = np.random.default_rng(1)
    ms.set_seed(0)
    cnn = NatureCNN((2, 44, 40), channels=(4, 8, 8), features_dim=16)
    x = ms.Tensor(rng.integers(0, 256, (6, 2, 44, 40)).astype(np.uint8))
    want_out, want_grads = _grads(cnn, x)
    cnn.set_patch_kernel(ImagePatchesKernel(8, 4, 1.0 / 255.0))
    assert cnn.raw_input and cnn.first.use_patches
    got_out, got_grads = _grads(cnn, x)
    np.testing.assert_array_equal(got_out, want_out)
    assert len(got_grads) == len(want_grads) == 8
    for g, w in zip(got_grads, want_grads):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-7)
    assert np.abs(got_grads[0]).sum() > 0  # the first layer's weight gradient flows (it is not stopped)
    with pytest.raises(ConfigError, match="8x8 stride 4"):
        cnn.set_patch_kernel(ImagePatchesKernel(4, 2))

    # images inside a Dict: packed columns unpacked to float pixels, then the kernel (float32 input)
    from scalebox_ms.envs.obs_encoding import pack_pixels

    frames = rng.integers(0, 256, (3, 1, 36, 36)).astype(np.uint8)
    packed = pack_pixels(frames.reshape(3, -1))
    extra = rng.standard_normal((3, 2)).astype(np.float32)
    obs = ms.Tensor(np.concatenate([packed, extra], 1))
    combined = CombinedFeatures(packed.shape[1] + 2, [(0, packed.shape[1], (1, 36, 36))], (4, 8, 8), 16)
    want_out, want_grads = _grads(combined, obs)
    for cell in patch_kernel_cnns(combined):
        cell.set_patch_kernel(ImagePatchesKernel(8, 4, 1.0 / 255.0))
    got_out, got_grads = _grads(combined, obs)
    np.testing.assert_array_equal(got_out, want_out)
    for g, w in zip(got_grads, want_grads):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-7)


def ppo_image_config(steps=128, **policy):
    return Config.from_dict({
        "env": {"id": "BrightSide-v0", "num_envs": 4},
        "policy": {"pi_layers": [], "vf_layers": [], "cnn_channels": [8, 16, 16], "cnn_features_dim": 64,
                   "conv_backend": "im2col", **policy},  # (the patches kernel belongs to the im2col backend)
        "ppo": {"n_steps": 32, "batch_size": 64, "n_epochs": 2, "learning_rate": 1e-3},
        "run": {"seed": 0, "total_steps": steps, "progress": False},
    })


def zero_patches(model):
    """Make every patch kernel of ``model`` write zeros (scale 0), before its graphs compile: a first layer that then
    still learns did not get its patches from the kernel."""
    cnns = patch_kernel_cnns(model)
    for cnn in cnns:
        cnn.first.patches.scale = ms.Tensor(np.zeros(1, np.float32))
    return [cnn.first.weight.asnumpy().copy() for cnn in cnns]


def assert_first_layers(model, before, learned):
    for cnn, w in zip(patch_kernel_cnns(model), before):
        assert (not np.array_equal(cnn.first.weight.asnumpy(), w)) == learned


def test_ppo_trains_the_same_run_with_and_without_the_kernel(caplog):
    """auto picks the kernel on CPU and says so; the run's weights equal the builtin run's (the
    patches are bit for bit ops.unfold's, so every later float operation is the same)."""
    with caplog.at_level(logging.INFO, logger="scalebox_ms"):
        fast = PPOTrainer(ppo_image_config(conv_kernel="auto"))
    slow = PPOTrainer(ppo_image_config(conv_kernel="builtin"))
    try:
        assert "policy.conv_kernel auto: C++ kernel" in caplog.text
        assert fast.conv_kernel == "custom" and slow.conv_kernel == "builtin"
        assert all(c.first.use_patches for c in patch_kernel_cnns(fast.model))
        assert not any(c.first.use_patches for c in patch_kernel_cnns(slow.model))
        fast.learn()
        slow.learn()
        assert fast.global_step == slow.global_step == 128
        assert fast.parameters_sha256() == slow.parameters_sha256()
    finally:
        fast.close()
        slow.close()
    # the training graphs read the kernel's patches: with zeros from it the first layer gets no gradient
    blind = PPOTrainer(ppo_image_config(conv_kernel="custom"))
    try:
        before = zero_patches(blind.model)
        blind.learn()
        assert_first_layers(blind.model, before, learned=False)
        assert blind.parameters_sha256() != slow.parameters_sha256()  # (the later layers did learn)
    finally:
        blind.close()


@pytest.mark.parametrize("blind", [False, True])
def test_dqn_sets_the_kernel_on_its_q_and_target_networks(blind):
    """The Q-network's training graph reads the kernel's patches: its first layer learns, unless the kernel writes
    zeros."""
    cfg = Config.from_dict({
        "algo": "dqn", "env": {"id": "BrightSide-v0", "num_envs": 1},
        "policy": {"vf_layers": [], "cnn_channels": [8, 16, 16], "cnn_features_dim": 64, "conv_kernel": "custom",
                   "conv_backend": "im2col"},
        "dqn": {"buffer_size": 500, "learning_starts": 50, "batch_size": 16, "train_freq": 4, "gradient_steps": 1},
        "run": {"seed": 0, "total_steps": 200, "progress": False},
    })
    tr = DQNTrainer(cfg)
    try:
        cnns = patch_kernel_cnns(tr.learner)
        assert len(cnns) == 2 and all(c.first.use_patches for c in cnns)  # the Q-network's and its target's
        before = zero_patches(tr.learner.q) if blind else [c.first.weight.asnumpy().copy()
                                                          for c in patch_kernel_cnns(tr.learner.q)]
        tr.learn()
        assert tr.global_step == 200
        assert_first_layers(tr.learner.q, before, learned=not blind)
    finally:
        tr.close()


def test_choice_errors_name_the_setting(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match=r"policy\.conv_kernel: 'fast' is not one of builtin, custom, auto"):
        ppo_image_config(conv_kernel="fast")
    cartpole = Config.from_dict({"env": {"id": "CartPole-v1"}, "policy": {"conv_kernel": "custom"}})
    with pytest.raises(ConfigError, match="policy.conv_kernel: custom applies to the NatureCNN"):
        PPOTrainer(cartpole)
    cnn = NatureCNN((1, 36, 36), channels=(2, 2, 2), features_dim=4, im2col=False)  # the ops.conv2d path
    policy = ppo_image_config(conv_kernel="custom").policy
    with pytest.raises(ConfigError, match="custom cannot run with a NatureCNN built without the im2col path"):
        select_conv_kernel(policy, cnn, "CPU")
    with pytest.raises(ConfigError, match="custom cannot run with the GPU backend"):
        select_conv_kernel(policy, NatureCNN((1, 36, 36), (2, 2, 2), 4), "GPU")
    auto = ppo_image_config(conv_kernel="auto").policy
    assert select_conv_kernel(auto, NatureCNN((1, 36, 36), (2, 2, 2), 4), "GPU") == "builtin"
    # no compiler and no cached library: custom is a one-line error, auto keeps ops.unfold
    monkeypatch.setenv("SCALEBOX_MS_CUSTOM_OPS_CACHE", str(tmp_path / "empty"))
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-g++"))
    with pytest.raises(CustomOpError, match=r"^policy\.conv_kernel: custom: .*not found"):
        select_conv_kernel(policy, NatureCNN((1, 36, 36), (2, 2, 2), 4), "CPU")
    cnn = NatureCNN((1, 36, 36), (2, 2, 2), 4)
    assert select_conv_kernel(auto, cnn, "CPU") == "builtin" and not cnn.first.use_patches


def test_export_uses_the_builtin_ops_and_restores_the_kernel(tmp_path):
    """The MindIR file names no kernel library (it runs where scalebox_ms is not installed: test_images checks its
    actions); the trainer's CNNs use the kernel again afterwards, and predict still agrees."""
    from scalebox_ms.export import MindIRPolicy, export_mindir

    tr = PPOTrainer(ppo_image_config(steps=64, conv_kernel="custom"))
    try:
        tr.learn()
        path = str(tmp_path / "p.mindir")
        export_mindir(tr, path)
        blob = open(path, "rb").read()
        assert b"ImagePatches" not in blob and b"image_patches" not in blob and b"Custom" not in blob
        assert all(c.first.use_patches for c in patch_kernel_cnns(tr.model))
        frames = np.random.default_rng(3).integers(0, 256, (8, 40, 40, 3)).astype(np.uint8)
        np.testing.assert_array_equal(MindIRPolicy(path)(frames), tr.predict(frames))
        with builtin_patches(tr.model):
            assert not any(c.first.use_patches for c in patch_kernel_cnns(tr.model))
        assert all(c.first.use_patches for c in patch_kernel_cnns(tr.model))
    finally:
        tr.close()


def test_export_cli_of_a_kernel_run_needs_no_compiler(tmp_path, monkeypatch, capsys):
    """A run trained with conv_kernel: custom exports where no compiler and no built library exist: the export
    builds its trainer with the builtin patches (the file uses them anyway)."""
    from scalebox_ms.export import main as export_main
    from scalebox_ms.trainers.run import train_run

    run_dir = tmp_path / "run"
    train_run(ppo_image_config(steps=64, conv_kernel="custom"), run_dir=str(run_dir))
    monkeypatch.setenv("SCALEBOX_MS_CUSTOM_OPS_CACHE", str(tmp_path / "empty"))
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-g++"))
    assert export_main(["--run", str(run_dir)]) == 0, capsys.readouterr().err
    assert (run_dir / "policy.mindir").stat().st_size > 0


def test_a_kernel_error_is_raised_by_the_call_without_host_blocking_runs(tmp_path):
    """Without MS_DEV_HOST_BLOCKING_RUN (a user who never imports the Sandbox) MindSpore queues kernels; the call
    still raises the kernel's one-line CustomOpError itself, not a RuntimeError at some later read."""
    import subprocess
    import sys

    script = (
        "import os; os.environ.pop('MS_DEV_HOST_BLOCKING_RUN', None)\n"
        "import mindspore as ms, numpy as np\n"
        "from scalebox_ms.ops.custom.patches import ImagePatchesKernel\n"
        "from scalebox_ms.errors import CustomOpError\n"
        "assert 'MS_DEV_HOST_BLOCKING_RUN' not in os.environ\n"
        "try:\n"
        "    ImagePatchesKernel(8, 4)(ms.Tensor(np.zeros((1, 1, 12, 12), np.int32)))\n"
        "except CustomOpError as e:\n"
        "    print('CAUGHT', e)\n"
    )
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "CAUGHT custom op 'image_patches': the frames must be uint8 or float32" in r.stdout, r.stdout


def test_frames_smaller_than_the_kernel_are_a_one_line_error():
    with pytest.raises(CustomOpError, match=r"frames of 6x12 pixels are smaller than the 8x8 kernel"):
        ImagePatchesKernel(8, 4)(ms.Tensor(np.zeros((1, 1, 6, 12), np.uint8)))
    with pytest.raises(CustomOpError, match=r"must be \(B, C, H, W\), got shape \(12, 12\)"):
        ImagePatchesKernel(8, 4)(ms.Tensor(np.zeros((12, 12), np.uint8)))
