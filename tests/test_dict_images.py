"""Images inside Dict/Tuple observations (SB3's MultiInputPolicy): frames packed three pixels per float32 column
and unpacked exactly in the graph, one NatureCNN per image beside the other columns, PPO and SAC learning an env
that needs both parts, MindIR export without scalebox_ms, INT8 L1, refusals."""
import json
import os
import subprocess
import sys
import textwrap

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces

import image_envs  # noqa: F401  (registers BrightSideDict-v0, BrightSideDictBox-v0)
from conftest import REPO
from scalebox_ms import Config
from scalebox_ms.envs.obs_encoding import ObsEncoder, pack_pixels
from scalebox_ms.errors import ConfigError
from scalebox_ms.trainers import PPOTrainer, make_trainer
from scalebox_ms.trainers.evaluation import evaluate_policy

# an odd-sized CHW frame (1 x 37 x 37 = 1369 pixels: the last packed column is padded) and an HWC one
SPACE = spaces.Dict({"cam": spaces.Box(0, 255, (1, 37, 37), np.uint8),
                     "rgb": spaces.Box(0, 255, (40, 40, 3), np.uint8),
                     "speed": spaces.Box(-2, 2, (2,), np.float32), "gear": spaces.Discrete(3)})


def dict_obs(rng, n):
    return {"cam": rng.integers(0, 256, (n, 1, 37, 37)).astype(np.uint8),
            "rgb": rng.integers(0, 256, (n, 40, 40, 3)).astype(np.uint8),
            "speed": rng.uniform(-2, 2, (n, 2)).astype(np.float32), "gear": rng.integers(0, 3, n)}


def test_frames_are_packed_exactly_and_unpacked_in_the_graph():
    import mindspore as ms
    from mindspore import Tensor, nn

    from scalebox_ms.models.cnn import CombinedFeatures, unpack_pixels
    from scalebox_ms.models.obs_encoder import ObsEncoderCell

    enc = ObsEncoder(SPACE)
    kinds = {leaf.name: (leaf.kind, leaf.width, leaf.chw) for leaf in enc.leaves}
    assert kinds["cam"] == ("image", 457, (1, 37, 37)) and kinds["rgb"] == ("image", 1600, (3, 40, 40))
    assert not enc.image and enc.obs_dim == 457 + 1600 + 2 + 3
    for offset, width, _ in enc.image_parts:  # packed pixels are never normalised
        assert not enc.normalize_mask[offset:offset + width].any()
    assert enc.normalize_mask.sum() == 2
    obs = dict_obs(np.random.default_rng(0), 6)
    x = enc.encode(obs)
    assert x.dtype == np.float32 and x.max() < 2 ** 24
    rgb = [leaf for leaf in enc.leaves if leaf.name == "rgb"][0]
    packed = pack_pixels(obs["rgb"].transpose(0, 3, 1, 2))
    np.testing.assert_array_equal(x[:, rgb.offset:rgb.offset + rgb.width], packed)
    # the exported policy's in-graph encoder gives the same columns from the raw leaves
    assert [leaf.name for leaf in enc.leaves] == ["cam", "gear", "rgb", "speed"]  # gymnasium's Dict sorts its keys
    leaves = [Tensor(a) for a in enc.leaf_arrays(obs)]
    assert [t.dtype for t in leaves] == [ms.uint8, ms.int32, ms.uint8, ms.float32]
    np.testing.assert_array_equal(ms.jit(ObsEncoderCell(enc).construct)(*leaves).asnumpy(), x)

    class Unpack(nn.Cell):
        def __init__(self, parts):
            super().__init__()
            self.parts = parts

        @ms.jit
        def construct(self, v):
            return tuple(unpack_pixels(v[:, o:o + w], chw) for o, w, chw in self.parts)

    cam, frame = (t.asnumpy() for t in Unpack(enc.image_parts)(Tensor(x)))
    np.testing.assert_array_equal(cam, obs["cam"].astype(np.float32))
    np.testing.assert_array_equal(frame, obs["rgb"].transpose(0, 3, 1, 2).astype(np.float32))

    # CombinedFeatures = [NatureCNN(cam) | gear's one-hot | NatureCNN(rgb) | speed], in column order
    ms.set_seed(0)
    features = CombinedFeatures(enc.obs_dim, enc.image_parts, (8, 16, 16), 32)
    assert features.features_dim == 32 + 32 + 5
    got = ms.jit(features.construct)(Tensor(x)).asnumpy()
    want = np.concatenate([features.cnns[0](Tensor(obs["cam"])).asnumpy(), x[:, 457:460],
                           features.cnns[1](Tensor(obs["rgb"].transpose(0, 3, 1, 2).copy())).asnumpy(), x[:, -2:]], 1)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_tuples_too_mlp_still_flattens_and_small_images_are_one_line_errors():
    assert ObsEncoder(spaces.Tuple((SPACE["rgb"], spaces.Discrete(4)))).image_parts == ((0, 1600, (3, 40, 40)),)
    assert ObsEncoder(SPACE, features="mlp").obs_dim == 1369 + 4800 + 2 + 3
    assert ObsEncoder(SPACE, features="nature_cnn").image_parts
    with pytest.raises(ConfigError, match="policy.features: nature_cnn needs an image observation"):
        ObsEncoder(spaces.Dict({"speed": spaces.Box(-1, 1, (2,), np.float32)}), features="nature_cnn")
    minigrid = spaces.Dict({"image": spaces.Box(0, 255, (7, 7, 3), np.uint8), "direction": spaces.Discrete(4)})
    with pytest.raises(ConfigError, match=r"part image that is an image of 7x7 pixels; NatureCNN needs at least "
                                          r"36x36 \(policy.features: mlp flattens it\)"):
        ObsEncoder(minigrid, "MiniGrid-Empty-5x5-v0")
    assert ObsEncoder(minigrid, features="mlp").obs_dim == 147 + 4


def ppo_config(steps, **extra):
    return Config.from_dict({
        "env": {"id": "BrightSideDict-v0", "num_envs": 4, "normalize_obs": True},
        "policy": {"pi_layers": [64], "vf_layers": [64], "cnn_channels": [8, 16, 16], "cnn_features_dim": 64,
                   "act_kernel": "auto"},
        "ppo": {"n_steps": 32, "batch_size": 64, "n_epochs": 4, "learning_rate": 1e-3, "update_kernel": "auto"},
        "run": {"seed": 0, "total_steps": steps, "progress": False}, **extra})


DRIVER = textwrap.dedent("""
    import json, sys
    import numpy as np, gymnasium as gym, mindspore as ms
    import image_envs
    path, env_id = sys.argv[1], sys.argv[2]
    sidecar = json.load(open(path + ".json"))
    policy = ms.nn.GraphCell(ms.load(path))
    env = gym.make_vec(env_id, num_envs=16, vectorization_mode="sync")
    obs, _ = env.reset(seed=5)
    inputs = [ms.Tensor(np.asarray(obs[leaf["path"][0]]).astype(leaf["dtype"])) for leaf in sidecar["input"]["leaves"]]
    actions = policy(*inputs).asnumpy()
    assert "scalebox_ms" not in sys.modules
    print(json.dumps({"actions": actions.tolist()}))
""")


def exported_actions(tr, env_id, tmp_path):
    """Export ``tr``'s policy and run it on ``env_id``'s reset observations (seed 5) without scalebox_ms."""
    from scalebox_ms.export import export_mindir

    path = str(tmp_path / "policy.mindir")
    sc = export_mindir(tr, path)
    frame = [leaf for leaf in sc["input"]["leaves"] if leaf["name"] == "frame"][0]
    assert frame["dtype"] == "uint8" and frame["shape"] == [40, 40, 3] and frame["image"]["channels_last"]
    (tmp_path / "driver.py").write_text(DRIVER)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = os.path.join(REPO, "tests")  # image_envs only; scalebox_ms is not imported
    r = subprocess.run([sys.executable, str(tmp_path / "driver.py"), path, env_id], capture_output=True, text=True,
                       timeout=300, cwd=str(tmp_path), env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    return np.asarray(json.loads(r.stdout.strip().splitlines()[-1])["actions"])


def reset_obs(env_id, seed=5):
    probe = gym.make_vec(env_id, num_envs=16, vectorization_mode="sync")
    try:
        return probe.reset(seed=seed)[0]
    finally:
        probe.close()


def test_ppo_on_an_image_and_a_vector_exports(tmp_path):
    """The rollout holds the packed float32 columns, the C++ kernels fall back, the Box column alone is normalised;
    the exported policy takes the raw Dict leaves (HWC uint8 frame) and acts like predict; INT8 L1 quantizes both
    CNN and MLP. (That PPO learns this env, and INT8's agreement on a learned policy: the slow test below.)"""
    from scalebox_ms.export import MindIRPolicy, export_mindir
    from scalebox_ms.quant import DynamicQuantizer
    from scalebox_ms.quant.ptq import QuantCombinedFeatures

    tr = PPOTrainer(ppo_config(512))
    try:
        assert tr.act_step.kernel == "builtin" and type(tr.update_step).__name__ == "PPOUpdateStep"
        assert type(tr.model.features).__name__ == "CombinedFeatures" and tr.spec.obs_dim == 1 + 1600
        assert tr.obs_normalizer.mask.tolist() == [True] + [False] * 1600
        tr.learn()
        obs = reset_obs("BrightSideDict-v0")
        np.testing.assert_array_equal(exported_actions(tr, "BrightSideDict-v0", tmp_path), tr.predict(obs))
        policy = MindIRPolicy(str(tmp_path / "policy.mindir"))
        for n in (16, 3, 1, 16):  # one loaded graph, any batch (the pixels' ops.stack kept the first call's)
            part = {k: v[:n] for k, v in obs.items()}
            np.testing.assert_array_equal(policy(part), tr.predict(part))
        sc = export_mindir(tr, str(tmp_path / "int8.mindir"), int8=True, calibrate_steps=16)
        assert sc["quantization"]["level"] == "L1"
        assert MindIRPolicy(str(tmp_path / "int8.mindir"))(obs).shape == tr.predict(obs).shape
        q = DynamicQuantizer(16)(tr, tr.normalize_obs(obs))
        assert isinstance(q.layers[0], QuantCombinedFeatures)
    finally:
        tr.close()


@pytest.mark.slow  # ~50 s on 2 cores
def test_ppo_learns_from_an_image_and_a_vector(tmp_path):
    """BrightSideDict needs both parts (the sign flips the answer): random 4, best 8; INT8 L1 of the learned policy
    takes the same actions as predict on >= 90% of the frames."""
    from scalebox_ms.export import MindIRPolicy, export_mindir

    tr = PPOTrainer(ppo_config(8192))
    try:
        tr.learn()
        assert np.mean(evaluate_policy(tr, episodes=20)) >= 7.0
        obs = reset_obs("BrightSideDict-v0")
        export_mindir(tr, str(tmp_path / "int8.mindir"), int8=True, calibrate_steps=16)
        assert (MindIRPolicy(str(tmp_path / "int8.mindir"))(obs) == tr.predict(obs)).mean() >= 0.9
    finally:
        tr.close()


@pytest.mark.slow  # ~36 s on 2 cores, mostly compiling three CNN graphs: out of the default suite's budget
def test_sac_learns_from_an_image_and_a_vector_and_resumes(tmp_path):
    """Off-policy: the replay rows are the packed columns (4/3 of the uint8 frame's bytes, not 4x); SAC's actor and
    critic each get a CombinedFeatures; a checkpoint round-trips."""
    import mindspore as ms

    from scalebox_ms.trainers import load_trainer

    tr = make_trainer(Config.from_dict({
        "algo": "sac", "env": {"id": "BrightSideDictBox-v0", "num_envs": 1},
        "policy": {"pi_layers": [64], "vf_layers": [64], "cnn_channels": [8, 16, 16], "cnn_features_dim": 64},
        "sac": {"learning_rate": 1e-3, "buffer_size": 5000, "learning_starts": 200, "batch_size": 32, "gamma": 0.5},
        "run": {"seed": 0, "total_steps": 1000, "progress": False}}))
    try:
        field = tr.replay.fields[tr.replay.names.index("obs")]
        assert field.dtype == ms.float32 and field.shape == (5001, 1601)
        assert tr.replay_row_bytes < 2 * (4 * 1601) + 16  # obs + next_obs packed, action, reward, terminated
        for net in (tr.learner.actor, tr.learner.critic, tr.learner.critic_target):
            assert type(net.features).__name__ == "CombinedFeatures"
        tr.learn()
        assert np.mean(evaluate_policy(tr, episodes=20)) >= 4.0  # best 8, random 0 (measured 5.4)
        back = load_trainer(tr.save(str(tmp_path / "sac_dict")))
        try:
            obs = reset_obs("BrightSideDictBox-v0")
            assert back.parameters_sha256() == tr.parameters_sha256()
            np.testing.assert_array_equal(back.predict(obs), tr.predict(obs))
        finally:
            back.close()
    finally:
        tr.close()


def test_amp_with_images_inside_a_dict_is_refused():
    with pytest.raises(ConfigError, match=r"amp.level: image observations \(NatureCNN\) train in float32"):
        PPOTrainer(ppo_config(128, amp={"level": "O1"}))
