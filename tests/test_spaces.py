"""Observation spaces beyond a flat Box (Discrete, MultiDiscrete, MultiBinary, Dict, Tuple) and MultiDiscrete /
MultiBinary actions: the host encoder against gymnasium's own ``flatten``, the graph encoder against the host one,
the new distributions against numpy, PPO learning small envs of each kind, export, kernels and refusals."""
import json
import os
import re
import subprocess
import sys
import textwrap

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces

import space_envs  # noqa: F401  (registers DictMatch-v0, MultiDiscreteMatch-v0, MultiBinaryMatch-v0)
from conftest import REPO, run_module, small_config
from scalebox_ms import Config
from scalebox_ms.envs.obs_encoding import ObsEncoder
from scalebox_ms.errors import ConfigError, TrainingError
from scalebox_ms.trainers import PPOTrainer
from scalebox_ms.trainers.evaluation import evaluate_policy

NESTED = spaces.Dict({
    "pos": spaces.Box(-2.0, 2.0, (2, 3), np.float32),
    "cell": spaces.Discrete(5, start=-2),
    "inner": spaces.Tuple((spaces.MultiDiscrete([3, 4], start=[1, 0]), spaces.MultiBinary(4))),
})


def ppo_config(env_id, steps, **env):
    return Config.from_dict({
        "env": {"id": env_id, "num_envs": 8, **env},
        "ppo": {"n_steps": 32, "batch_size": 128, "n_epochs": 4, "learning_rate": 3e-3, "gamma": 0.9},
        "run": {"seed": 0, "total_steps": steps, "progress": False},
    })


# ---------------------------------------------------------------------------------------------- encoding
@pytest.mark.parametrize("space", [
    spaces.Discrete(7), spaces.Discrete(4, start=3), spaces.MultiDiscrete([2, 5, 3]), spaces.MultiBinary(6),
    spaces.Tuple((spaces.Discrete(32), spaces.Discrete(11), spaces.Discrete(2))), NESTED,
], ids=["discrete", "discrete-start", "multidiscrete", "multibinary", "tuple-blackjack", "nested-dict"])
def test_encoding_equals_gymnasium_flatten(space):
    space.seed(0)
    samples = [space.sample() for _ in range(16)]
    enc = ObsEncoder(space)
    want = np.stack([spaces.flatten(space, x) for x in samples]).astype(np.float32)
    assert enc.obs_dim == spaces.flatdim(space)
    batch = gym.vector.utils.concatenate(space, samples, gym.vector.utils.create_empty_array(space, len(samples)))
    np.testing.assert_array_equal(enc.encode(batch), want)
    assert enc.is_single(samples[0]) and not enc.is_single(batch)


def test_only_box_columns_are_normalised():
    from scalebox_ms.envs import ObsNormalizer

    enc = ObsEncoder(NESTED)
    assert enc.normalize_mask.sum() == 6  # the (2, 3) Box; one-hots and bits are not normalised
    NESTED.seed(1)
    data = enc.encode(gym.vector.utils.concatenate(NESTED, [NESTED.sample() for _ in range(64)],
                                                   gym.vector.utils.create_empty_array(NESTED, 64)))
    norm = ObsNormalizer(enc.obs_dim, clip=0.5, mask=enc.normalize_mask)
    out = norm(data, update=True)
    np.testing.assert_array_equal(out[:, ~enc.normalize_mask], data[:, ~enc.normalize_mask])
    assert np.abs(out[:, enc.normalize_mask]).max() <= 0.5 and not np.allclose(out[:, enc.normalize_mask],
                                                                               data[:, enc.normalize_mask])


def test_out_of_range_discrete_observation_is_a_one_line_error():
    enc = ObsEncoder(spaces.Discrete(4), "Bad-v0")
    with pytest.raises(TrainingError, match=r"observation obs = 4 at env index 1, outside its space") as e:
        enc.encode(np.array([0, 4]))
    assert "\n" not in str(e.value)


class _OffSpaceLater(gym.Env):
    """Discrete(3) observations; the third step of each episode returns 7."""
    observation_space, action_space = spaces.Discrete(3), spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return 0, {}

    def step(self, action):
        self.t += 1
        return (7 if self.t == 3 else 1), 0.0, self.t >= 5, False, {}


def test_an_off_space_observation_while_training_names_the_call_and_the_step():
    """The error named the env and its index but not when: at the first reset, or thousands of steps in."""
    if "OffSpaceLater-v0" not in gym.registry:
        gym.register("OffSpaceLater-v0", entry_point=_OffSpaceLater)
    trainer = PPOTrainer(small_config(env={"id": "OffSpaceLater-v0", "num_envs": 2}))
    try:
        with pytest.raises(TrainingError, match=r"^env 'OffSpaceLater-v0' returned observation obs = 7 at env index "
                                                r"0, outside its space \(discrete \[3\], start \[0\]\), from step\(\) "
                                                r"at step 4; the run stops$"):
            trainer.learn(until=64)
    finally:
        trainer.close()


def test_off_space_values_blame_the_env_or_the_caller_and_multibinary_values_are_checked():
    enc = ObsEncoder(spaces.Dict({"bits": spaces.MultiBinary([2, 3]), "n": spaces.Discrete(3)}), "Bad-v0")
    ok = {"bits": np.ones((2, 2, 3), np.int8), "n": np.array([0, 2])}
    assert enc.encode(ok).shape == (2, 9)
    with pytest.raises(TrainingError, match=r"env 'Bad-v0' returned observation bits = 5 at env index 1, outside its "
                                            r"space \(multibinary: values 0 or 1\)"):
        enc.encode({**ok, "bits": np.array([np.ones((2, 3)), np.full((2, 3), 5)], np.int8)})
    with pytest.raises(ValueError, match=r"^predict: observation n = 9 at index 0 is outside the env's observation "
                                         r"space \(discrete \[3\], start \[0\]\)$"):
        enc.encode({**ok, "n": np.array([9, 0])}, "predict")


def test_fractional_discrete_values_are_off_space_not_truncated():
    """A float 1.5 for a Discrete part used to be cast to 1 silently; whole floats (3.0) are still taken."""
    enc = ObsEncoder(spaces.Dict({"bits": spaces.MultiBinary(2), "n": spaces.Discrete(4)}), "Bad-v0")
    ok = {"bits": np.array([[0, 1]]), "n": np.array([3.0])}
    assert enc.encode(ok).shape == (1, 6)
    with pytest.raises(ValueError, match=r"^predict: observation n = 1.5 at index 0 is outside the env's observation "
                                         r"space \(discrete: whole numbers\)$"):
        enc.encode({**ok, "n": np.array([1.5])}, "predict")
    with pytest.raises(TrainingError, match=r"returned observation bits = 0.5 at env index 0, outside its space "
                                            r"\(multibinary: whole numbers\)"):
        enc.encode({**ok, "bits": np.array([[0.5, 1.0]])})


def test_shape_check_names_ragged_non_numeric_and_mismatched_batches():
    enc = ObsEncoder(spaces.Dict({"pos": spaces.Box(-1, 1, (2,)), "n": spaces.Discrete(3)}), "Bad-v0")
    with pytest.raises(ValueError, match=r"^predict: the observation parts are batches of different sizes "
                                         r"\(n: 2, pos: 3\)$"):
        enc.check_shapes({"pos": np.zeros((3, 2)), "n": np.array([0, 1])}, single=False)
    with pytest.raises(ValueError, match=r"^predict: observation part pos is a ragged nesting of sequences"):
        enc.check_shapes({"pos": [[0.0, 0.0], [0.0]], "n": np.array([0, 1])}, single=False)
    with pytest.raises(ValueError, match=r"^predict: observation part n must hold numbers, got <U1 values$"):
        enc.check_shapes({"pos": np.zeros(2), "n": "a"}, single=True)
    one = {"pos": np.zeros(2), "n": 1}
    with pytest.raises(ValueError, match=r"^predict: observation part n is missing \(the env's observation space is "
                                         r"Dict.*; a batch is one dict of batched parts, not a list of observations\)$"):
        enc.check_shapes([one, one], single=False)


def test_unsupported_observation_part_names_it():
    space = spaces.Dict({"ok": spaces.Discrete(2), "words": spaces.Text(5)})
    with pytest.raises(ConfigError, match=r"observation part words of type Text") as e:
        ObsEncoder(space, "Words-v0")
    assert "\n" not in str(e.value)


def test_graph_encoder_equals_host_encoder():
    import mindspore as ms

    from scalebox_ms.models.obs_encoder import ObsEncoderCell

    enc = ObsEncoder(NESTED)
    NESTED.seed(2)
    batch = gym.vector.utils.concatenate(NESTED, [NESTED.sample() for _ in range(9)],
                                         gym.vector.utils.create_empty_array(NESTED, 9))
    cell = ObsEncoderCell(enc)
    got = ms.jit(cell.construct)(*[ms.Tensor(x) for x in enc.leaf_arrays(batch)]).asnumpy()
    np.testing.assert_array_equal(got, enc.encode(batch))


# ---------------------------------------------------------------------------------------------- distributions
def test_multidiscrete_and_bernoulli_maths_match_numpy():
    import mindspore as ms

    from scalebox_ms.ops import distributions as D

    rng = np.random.default_rng(0)
    segs = ((0, 3), (3, 5))
    logits = rng.normal(size=(6, 5)).astype(np.float32)
    actions = np.stack([rng.integers(0, 3, 6), rng.integers(0, 2, 6)], 1).astype(np.int32)

    def log_softmax(x):
        return x - np.log(np.exp(x).sum(-1, keepdims=True))

    want_lp = sum(log_softmax(logits[:, s:e])[np.arange(6), actions[:, i]] for i, (s, e) in enumerate(segs))
    want_h = sum(-(np.exp(log_softmax(logits[:, s:e])) * log_softmax(logits[:, s:e])).sum(-1) for s, e in segs)
    lt, at = ms.Tensor(logits), ms.Tensor(actions)
    np.testing.assert_allclose(D.multi_categorical_log_prob(lt, at, segs).asnumpy(), want_lp, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(D.multi_categorical_entropy(lt, segs).asnumpy(), want_h, rtol=1e-5, atol=1e-6)

    bits = rng.integers(0, 2, (6, 5)).astype(np.int32)
    p = 1.0 / (1.0 + np.exp(-logits.astype(np.float64)))
    want_blp = (bits * np.log(p) + (1 - bits) * np.log(1 - p)).sum(-1)
    want_bh = (-(p * np.log(p) + (1 - p) * np.log(1 - p))).sum(-1)
    np.testing.assert_allclose(D.bernoulli_log_prob(lt, ms.Tensor(bits)).asnumpy(), want_blp, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(D.bernoulli_entropy(lt).asnumpy(), want_bh, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", ["discrete", "box", "multidiscrete", "multibinary"])
def test_deterministic_step_takes_one_unbatched_observation_of_every_action_kind(kind):
    """A 1-D observation gives the action of its row in a batch; MultiDiscrete's mode indexed [:, s:e] (IndexError)."""
    import mindspore as ms

    from scalebox_ms.envs.spaces import SpaceSpec
    from scalebox_ms.models.actor_critic import ActorCritic, DeterministicStep

    spec = {"discrete": SpaceSpec(4, True, 3), "box": SpaceSpec(4, False, 2, low=(-1, -2), high=(1, 2)),
            "multidiscrete": SpaceSpec(4, False, 2, action_kind="multidiscrete", nvec=(3, 4)),
            "multibinary": SpaceSpec(4, False, 3, action_kind="multibinary")}[kind]
    step = DeterministicStep(ActorCritic(spec))
    batch = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32) * 3
    rows = step(ms.Tensor(batch)).asnumpy()
    for i in range(5):
        one = step(ms.Tensor(batch[i])).asnumpy()
        assert one.shape == rows.shape[1:]
        np.testing.assert_allclose(one, rows[i], rtol=1e-5, atol=1e-6)  # (Box: matmul of 1 vs 5 rows)


def test_samples_follow_the_distributions():
    import mindspore as ms

    from scalebox_ms.ops import distributions as D

    rng = np.random.default_rng(1)
    n = 20000
    logits = np.tile(np.array([[1.0, -0.5, 0.0, 2.0, -1.0]], np.float32), (n, 1))
    segs = ((0, 3), (3, 5))
    a = D.multi_categorical_sample(ms.Tensor(logits), ms.Tensor(rng.gumbel(size=(n, 5)).astype(np.float32)),
                                   segs).asnumpy()
    for i, (s, e) in enumerate(segs):
        p = np.exp(logits[0, s:e]) / np.exp(logits[0, s:e]).sum()
        np.testing.assert_allclose(np.bincount(a[:, i], minlength=e - s) / n, p, atol=0.015)
    b = D.bernoulli_sample(ms.Tensor(logits), ms.Tensor(rng.logistic(size=(n, 5)).astype(np.float32))).asnumpy()
    np.testing.assert_allclose(b.mean(0), 1.0 / (1.0 + np.exp(-logits[0])), atol=0.015)


# ---------------------------------------------------------------------------------------------- learning
@pytest.mark.parametrize("env_id,steps,bar", [
    ("DictMatch-v0", 8192, 7.5),             # best 8, random 2: needs both the Box and the Discrete part
    ("MultiDiscreteMatch-v0", 8192, 15.0),    # best 16, random ~6.7
    ("MultiBinaryMatch-v0", 8192, 23.0),      # best 24, random 12
])
def test_ppo_learns_composite_observations_and_multi_actions(env_id, steps, bar):
    tr = PPOTrainer(ppo_config(env_id, steps, normalize_obs=True))
    try:
        tr.learn()
        assert np.mean(evaluate_policy(tr, episodes=20)) >= bar
    finally:
        tr.close()


def test_ppo_solves_frozenlake_deterministic_and_its_int8_export_agrees(tmp_path):
    """Discrete observations (one-hot): PPO solves FrozenLake; INT8 L1 of the one-hot policy acts like predict."""
    from scalebox_ms.export import MindIRPolicy, export_mindir

    cfg = Config.from_dict({**ppo_config("FrozenLake-v1", 8192).to_dict(), "env": {
        "id": "FrozenLake-v1", "num_envs": 8, "kwargs": {"is_slippery": False}}})
    tr = PPOTrainer(cfg)
    try:
        tr.learn()
        assert np.mean(evaluate_policy(tr, episodes=20)) == 1.0
        path = str(tmp_path / "policy_int8.mindir")
        sc = export_mindir(tr, path, int8=True, calibrate_steps=64)
        assert sc["quantization"]["level"] == "L1" and sc["input"]["leaves"][0]["kind"] == "discrete"
        cells = np.arange(16)
        agree = (MindIRPolicy(path)(cells) == tr.predict(cells)).mean()
        assert agree >= 0.9, agree
    finally:
        tr.close()


@pytest.mark.parametrize("env_id", ["FrozenLake-v1", "Blackjack-v1"])  # toy-text envs resume mid-episode
def test_checkpoint_resume_is_bit_identical(env_id, tmp_path):
    cfg = ppo_config(env_id, 1024, normalize_obs=True)
    a = PPOTrainer(cfg)
    a.learn(until=512)
    path = a.save(str(tmp_path / "ck"))
    b = PPOTrainer(cfg).load(path)
    a.learn()
    b.learn()
    try:
        assert b.global_step == 1024 and a.parameters_sha256() == b.parameters_sha256()
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("layout, words", [
    ("box", r"obs: box \(7,\)$"), ("swapped", r"obs: multidiscrete \(2,\) nvec \[4, 3\]$"), ("multidiscrete", None)])
def test_a_checkpoint_is_refused_for_observations_of_its_width_in_another_layout(tmp_path, layout, words):
    """A MultiDiscrete([3, 4]) policy (7 one-hot columns) loaded into an env of Box(7,) or MultiDiscrete([4, 3])
    observations without a word (evaluate, export, resume): the spaces' spec held only the encoded width."""
    from scalebox_ms.errors import CheckpointError

    def config(kind):
        return small_config(env={"id": "SameWidthObs-v0", "num_envs": 2, "kwargs": {"layout": kind}})

    a = PPOTrainer(config("multidiscrete"))
    path = a.save(str(tmp_path / "ck"))
    a.close()
    b = PPOTrainer(config(layout))
    try:
        if words is None:
            b.load(path)  # the same layout loads
            return
        made = r"was made for observations obs: multidiscrete \(2,\) nvec \[3, 4\]; this trainer's env has "
        with pytest.raises(CheckpointError, match=made + words):
            b.load(path)
    finally:
        b.close()


def test_a_box_with_other_bounds_keeps_its_layout():  # (fine-tuning on changed dynamics may move a Box's bounds)
    assert ObsEncoder(space_envs.SameWidthObs.LAYOUTS["box"]).layout() == \
        ObsEncoder(space_envs.SameWidthObs.LAYOUTS["wide_box"]).layout()


def test_an_image_layout_is_the_cnns_whatever_the_envs_channel_order():
    """HWC and CHW frames are the same CNN input (the encoder transposes): one layout; flattened into an MLP they are
    two."""
    def layout(shape, features="auto"):
        return ObsEncoder(spaces.Box(0, 255, shape, np.uint8), features=features).layout()

    assert layout((84, 84, 4)) == layout((4, 84, 84)) and layout((84, 84, 4))[0]["shape"] == [4, 84, 84]
    assert layout((84, 84, 4), "mlp") != layout((4, 84, 84), "mlp")


@pytest.mark.parametrize("step_only, words", [(False, "reset() returned the observation alone"),
                                               (True, "step() returned 4 values")])
def test_an_env_of_gyms_older_api_is_named_as_such(step_only, words):
    """It failed with gymnasium's unpacking error ('too many values to unpack (expected 2)'), naming neither."""
    from scalebox_ms.envs import make_vec_env

    with pytest.raises(ConfigError, match=rf"^env.id: 'OldApi-v0' follows gym's older API \({re.escape(words)}\); "
                                          r"scalebox_ms needs gymnasium's: reset\(\) -> \(observation, info\)"):
        make_vec_env("OldApi-v0", 2, {"step_only": step_only})


def test_checkpoints_from_before_the_new_space_fields_still_load(tmp_path):
    """A sidecar whose space_spec lacks action_kind/nvec/action_start/image_shape (written before they existed)."""
    from conftest import small_config
    from scalebox_ms.trainers.checkpoint import sidecar_digest

    a = PPOTrainer(small_config())
    a.learn(until=64)
    path = a.save(str(tmp_path / "ck"))
    a.close()
    sc = json.loads(open(path).read())
    for key in ("action_kind", "nvec", "action_start", "image_shape"):
        sc["space_spec"].pop(key)
    sc["sidecar_sha256"] = sidecar_digest(sc)
    with open(path, "w") as f:
        json.dump(sc, f)
    b = PPOTrainer(small_config()).load(path)
    assert b.global_step == 64
    b.close()


# ---------------------------------------------------------------------------------------------- refusals
def test_kernels_fall_back_for_multi_actions_and_custom_refuses(caplog):
    import logging

    cfg = ppo_config("MultiDiscreteMatch-v0", 256).to_dict()
    cfg["policy"] = {"act_kernel": "auto"}
    cfg["ppo"]["update_kernel"] = "auto"
    with caplog.at_level(logging.INFO, logger="scalebox_ms"):
        tr = PPOTrainer(Config.from_dict(cfg))
    tr.close()
    assert tr.act_step.kernel == "builtin" and tr.update_step.__class__.__name__ == "PPOUpdateStep"
    assert "multidiscrete actions" in caplog.text
    cfg["ppo"]["update_kernel"] = "custom"
    with pytest.raises(ConfigError, match="ppo.update_kernel: custom cannot run with multidiscrete actions"):
        PPOTrainer(Config.from_dict(cfg))


@pytest.mark.parametrize("algo,env_id,has", [("dqn", "MultiDiscreteMatch-v0", "MultiDiscrete"),
                                             ("sac", "MultiBinaryMatch-v0", "MultiBinary"),
                                             ("td3", "FrozenLake-v1", "Discrete")])
def test_off_policy_algorithms_refuse_action_spaces_they_cannot_handle(algo, env_id, has):
    from scalebox_ms.trainers import make_trainer

    with pytest.raises(ConfigError, match=rf"algo: {algo} needs a (Discrete|Box) action space; {env_id} has {has}"):
        make_trainer(Config.from_dict({"algo": algo, "env": {"id": env_id, "num_envs": 1}}))


def small_dqn(env: dict, steps: int, learning_starts: int, train_freq: int, gradient_steps: int, batch_size: int):
    from scalebox_ms.trainers import make_trainer

    return make_trainer(Config.from_dict({
        "algo": "dqn", "env": env, "run": {"total_steps": steps, "progress": False},
        "dqn": {"learning_starts": learning_starts, "train_freq": train_freq, "gradient_steps": gradient_steps,
                "batch_size": batch_size, "buffer_size": 1000}}))


def test_dqn_trains_on_one_hot_observations():
    tr = small_dqn({"id": "FrozenLake-v1", "num_envs": 1, "kwargs": {"is_slippery": False}}, 256, 64, 64, 8, 32)
    try:
        tr.learn()
        assert tr.global_step >= 256 and tr.spec.obs_dim == 16
        assert tr.predict(3) in range(4) and tr.predict(np.array([0, 5])).shape == (2,)
    finally:
        tr.close()


def test_off_policy_replay_normalisation_leaves_one_hots_alone():
    """The graph normalises replay samples with the same per-column rule as the host (Box columns only)."""
    import mindspore as ms

    from scalebox_ms.ops.clip import normalize_obs

    tr = small_dqn({"id": "DictMatch-v0", "num_envs": 2, "normalize_obs": True, "clip_obs": 0.5}, 128, 32, 16, 2, 16)
    try:
        tr.learn()
        mean, inv_std, clip = tr._obs_stats()
        box = tr.collector.encoder.normalize_mask  # "flag" one-hot (2 columns), then "position" (Dict keys sorted)
        assert box.tolist() == [False, False, True]
        assert clip.tolist() == [np.inf, np.inf, 0.5] and mean[0] == 0.0 and inv_std[0] == 1.0
        raw = tr.collector.raw_obs
        graph = ms.jit(normalize_obs, static_argnums=0)(True, ms.Tensor(raw), ms.Tensor(mean), ms.Tensor(inv_std),
                                                        ms.Tensor(clip)).asnumpy()
        np.testing.assert_allclose(graph, tr.collector.normalize_obs(raw), rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(graph[:, ~box], raw[:, ~box])
    finally:
        tr.close()


def test_isolated_envs_batch_infos_as_gymnasium_does():
    from scalebox_ms.envs import IsolatedVectorEnv

    ref = gym.make_vec("InfoSteps-v0", num_envs=2, vectorization_mode="sync")
    iso = IsolatedVectorEnv("space_envs:InfoSteps-v0", 2)
    try:
        ref.reset(seed=0)
        iso.reset(seed=0)
        for t in range(5):  # episode ends at step 3 (info "ended"), step 4 is the autoreset step (info "reset")
            actions = np.array([t % 2, 1])
            want, got = ref.step(actions)[4], iso.step(actions)[4]
            assert sorted(got) == sorted(want), (t, got, want)
            for key in want:
                np.testing.assert_array_equal(got[key], want[key])
            assert ("ended" in got) == (t == 2) and ("reset" in got) == (t == 3)
    finally:
        ref.close()
        iso.close()


def test_whole_game_statistics_come_from_info():
    """env.preprocess atari: the episodes counted are the games GameStats reports, not the (life) episodes."""
    from scalebox_ms.trainers.collector import RolloutCollector

    c = RolloutCollector.__new__(RolloutCollector)
    c.game_stats, c.reward_scaler, c.episodes = True, None, 0
    c.ep_return, c.ep_length = np.zeros(2), np.zeros(2, np.int64)
    c.episode_returns, c.episode_lengths = [], []
    done, valid = np.array([True, False]), np.array([True, True])
    c._account_step(np.array([1.0, 0.0]), done, valid, {})  # a lost life: no game over
    assert c.episodes == 0
    info = {"game_return": np.array([0.0, 7.0]), "_game_return": np.array([False, True]),
            "game_length": np.array([0, 900]), "_game_length": np.array([False, True])}
    c._account_step(np.array([0.0, 1.0]), np.array([False, True]), valid, info)
    assert c.episodes == 1 and c.episode_returns == [7.0] and c.episode_lengths == [900]


def test_isolated_envs_stack_dict_observations():
    from scalebox_ms import Sandbox

    cfg = ppo_config("space_envs:DictMatch-v0", 64).with_overrides(["sandbox.isolation_level=process"])
    with Sandbox(device="CPU", seed=0, isolation_level="process") as sb:
        tr = PPOTrainer(cfg, sandbox=sb)
        assert type(tr.env).__name__ == "IsolatedVectorEnv"
        try:
            tr.learn()
            assert tr.global_step == 256
        finally:
            tr.close()


# ---------------------------------------------------------------------------------------------- export
DRIVER = textwrap.dedent("""
    import json, sys
    import numpy as np, gymnasium as gym, mindspore as ms
    path, env_id = sys.argv[1], sys.argv[2]
    if env_id.startswith("space_envs:"):
        import space_envs
        env_id = env_id.split(":", 1)[1]
    sidecar = json.load(open(path + ".json"))
    policy = ms.nn.GraphCell(ms.load(path))
    env = gym.make_vec(env_id, num_envs=16, vectorization_mode="sync")
    obs, _ = env.reset(seed=5)
    inputs = []
    for leaf in sidecar["input"]["leaves"]:
        x = obs
        for p in leaf["path"]:
            x = x[p]
        inputs.append(ms.Tensor(np.asarray(x).astype(leaf["dtype"]).reshape([-1] + leaf["shape"])))
    actions = policy(*inputs).asnumpy()
    assert "scalebox_ms" not in sys.modules
    print(json.dumps({"actions": actions.tolist()}))
""")


def test_export_refuses_dict_keys_that_are_not_strings(tmp_path):
    """Dict keys 0 and 1 exported, and evaluate --mindir then refused the file ('the sidecar's input leaves [[0], [1]]
    do not describe one observation space; export again'), which exporting again could not mend."""
    from scalebox_ms.export import export_mindir

    tr = PPOTrainer(ppo_config("space_envs:IntKeysObs-v0", 64))
    try:
        tr.learn()
        with pytest.raises(ConfigError, match=r"^export: the observation space's Dict key 0 is not a string"):
            export_mindir(tr, str(tmp_path / "p.mindir"))
        assert os.listdir(tmp_path) == []
    finally:
        tr.close()


@pytest.mark.integration
@pytest.mark.parametrize("env_id", ["space_envs:DictMatch-v0", "Blackjack-v1", "FrozenLake-v1"])
def test_export_of_composite_observations_matches_predict_without_scalebox(env_id, tmp_path):
    from scalebox_ms.export import export_mindir

    tr = PPOTrainer(ppo_config(env_id, 512, normalize_obs=True))
    try:
        tr.learn()
        path = str(tmp_path / "policy.mindir")
        sc = export_mindir(tr, path)
        assert [leaf["name"] for leaf in sc["input"]["leaves"]] == [leaf.name for leaf in tr.collector.encoder.leaves]
        script = tmp_path / "driver.py"
        script.write_text(DRIVER)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env["PYTHONPATH"] = os.path.join(REPO, "tests")  # space_envs only; scalebox_ms is not imported
        r = subprocess.run([sys.executable, str(script), path, env_id], capture_output=True, text=True, timeout=300,
                           cwd=str(tmp_path), env=env)
        assert r.returncode == 0, r.stderr[-2000:]
        got = np.asarray(json.loads(r.stdout.strip().splitlines()[-1])["actions"])
        probe = gym.make_vec(env_id.split(":")[-1], num_envs=16, vectorization_mode="sync")
        obs, _ = probe.reset(seed=5)
        probe.close()
        np.testing.assert_array_equal(got, tr.predict(obs))
        from scalebox_ms.export import MindIRPolicy

        policy = MindIRPolicy(path)
        for n in (16, 5, 1):  # one loaded graph, any batch size
            part = tuple(v[:n] for v in obs) if isinstance(obs, tuple) else (
                {k: v[:n] for k, v in obs.items()} if isinstance(obs, dict) else obs[:n])
            np.testing.assert_array_equal(policy.env_actions(policy(part)), tr.predict(part))
    finally:
        tr.close()


@pytest.mark.integration
def test_export_of_multidiscrete_actions_mindir_evaluation_and_int8_refusal(tmp_path, monkeypatch):
    import scalebox_ms.quant
    from scalebox_ms.export import MindIRPolicy, evaluate_mindir, export_mindir

    tr = PPOTrainer(ppo_config("MultiDiscreteMatch-v0", 512))
    try:
        tr.learn()
        path = str(tmp_path / "policy.mindir")
        sc = export_mindir(tr, path)
        assert sc["action_space"] == {"type": "MultiDiscrete", "nvec": [3, 2], "start": [1, 0]}
        policy = MindIRPolicy(path)
        rng = np.random.default_rng(0)
        for n in (32, 5, 1, 40):  # one loaded graph, batches of any size (ops.stack kept the first call's)
            obs = rng.uniform(-1, 1, (n, 2)).astype(np.float32)
            np.testing.assert_array_equal(policy.env_actions(policy(obs)), tr.predict(obs))
        returns = evaluate_mindir(path, episodes=4)
        assert len(returns) == 4 and np.mean(returns) == np.mean(evaluate_policy(tr, episodes=4))
        def calibrate(*args, **kwargs):  # (the refusal came after calibrate_steps env steps: on a slow env, minutes)
            raise AssertionError("calibrated before the refusal")

        monkeypatch.setattr(scalebox_ms.quant, "collect_calibration_data", calibrate)
        with pytest.raises(ConfigError, match="quantize: the INT8 policy implements Discrete and Box actions, not "
                                              "multidiscrete"):
            export_mindir(tr, str(tmp_path / "md.mindir"), int8=True, calibrate_steps=16)
    finally:
        tr.close()


def test_export_of_a_scalar_box_observation_takes_one_value_or_a_batch(tmp_path):
    """observation_shape [] in the sidecar used to be read as absent: MindIRPolicy then wanted (N, 1) and refused
    what the env returns, (N,) (evaluate --mindir failed)."""
    from scalebox_ms.export import MindIRPolicy, evaluate_mindir, export_mindir

    tr = PPOTrainer(ppo_config("ScalarObs-v0", 512))
    try:
        tr.learn()
        path = str(tmp_path / "policy.mindir")
        export_mindir(tr, path)
        policy = MindIRPolicy(path)
        obs = np.linspace(-1, 1, 9, dtype=np.float32)
        np.testing.assert_array_equal(policy.env_actions(policy(obs)), tr.predict(obs))
        assert policy.env_actions(policy(np.float32(0.3))).tolist() == [tr.predict(np.float32(0.3))]
        assert len(evaluate_mindir(path, episodes=2)) == 2
    finally:
        tr.close()


# ---------------------------------------------------------------------------------------------- custom env CLI
EXAMPLE = os.path.join(REPO, "examples", "custom_env")


@pytest.mark.integration
def test_custom_env_module_trains_from_the_cli(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", EXAMPLE)
    r = run_module("train", "--config", os.path.join(REPO, "configs", "ppo_corridor.yaml"), "--run-dir",
                   tmp_path / "run", "--set", "run.total_steps=8192", "--no-progress")
    assert r.returncode == 0, r.stderr[-2000:]
    # (the example registers its TimeLimit: a pattern to copy)
    assert "registered without an episode step limit" not in r.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["eval_mean_return"] >= 0.9  # the best return is 0.93


@pytest.mark.integration
def test_custom_env_module_that_cannot_be_imported_is_one_line(tmp_path):
    r = run_module("train", "--set", "env.id=no_such_module_xyz:Corridor-v0", "--run-dir", tmp_path / "run")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1].startswith("error: env.id: 'no_such_module_xyz:Corridor-v0': cannot import")
    assert not (tmp_path / "run").exists()


_BROKEN_MODULE = '''
import gymnasium as gym
from gymnasium import spaces

{top}

class Raises(gym.Env):
    def __init__(self):
        raise RuntimeError("cannot open device /dev/foo")

class NoSpaces(gym.Env):
    def reset(self, *, seed=None, options=None):
        return 0, {{}}

class Exits(gym.Env):
    def __init__(self):
        import sys
        sys.exit(3)

gym.register("Exits-v0", entry_point=__name__ + ":Exits")
gym.register("Raises-v0", entry_point=__name__ + ":Raises")
gym.register("NoSpaces-v0", entry_point=__name__ + ":NoSpaces")
gym.register("Missing-v0", entry_point=__name__ + ":DoesNotExist")
'''


@pytest.mark.parametrize("top, env_id, culprit", [
    ("raise RuntimeError('boom at import')", "{m}:Raises-v0",
     "env.id: '{m}:Raises-v0': importing '{m}' raised RuntimeError ({m}.py:5 in <module>): boom at import"),
    ("def broken(:", "{m}:Raises-v0", "importing '{m}' raised SyntaxError"),
    ("", ":Raises-v0", "env.id: ':Raises-v0': expected 'module:EnvName-v0'"),
    ("", "{m}:Raises-v0", "cannot create '{m}:Raises-v0': RuntimeError ({m}.py:9 in __init__): cannot open device"),
    ("", "{m}:NoSpaces-v0", "cannot create '{m}:NoSpaces-v0': AttributeError: The environment must specify"),
    ("", "{m}:Missing-v0", "cannot create '{m}:Missing-v0': AttributeError: module '{m}' has no attribute"),
    # (sys.exit(0) in a user's module or constructor ended train with exit 0, nothing trained, not a word)
    ("import sys; sys.exit(0)", "{m}:Raises-v0",
     "importing '{m}' raised SystemExit ({m}.py:5 in <module>): it called sys.exit(0)"),
    ("", "{m}:Exits-v0", "cannot create '{m}:Exits-v0': SystemExit ({m}.py:18 in __init__): it called sys.exit(3)"),
], ids=["import-raises", "syntax-error", "no-module-name", "constructor-raises", "no-spaces", "no-such-class",
        "import-exits", "constructor-exits"])
def test_a_broken_env_module_or_constructor_is_a_config_error_naming_it(tmp_path, monkeypatch, top, env_id,
                                                                        culprit):
    """Any exception of the user's env module (at import or in the constructor) used to escape as a traceback."""
    from scalebox_ms.envs import make_vec_env

    name = f"broken_env_{len(top)}_{abs(hash(env_id)) % 10_000}"  # a fresh module per case
    (tmp_path / f"{name}.py").write_text(_BROKEN_MODULE.format(top=top))
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError) as info:
        make_vec_env(env_id.format(m=name), 1)
    assert culprit.format(m=name) in str(info.value) and "\n" not in str(info.value)


def test_env_kwargs_are_checked_as_the_single_env_checks_them_also_for_gymnasiums_vector_envs():
    """From 4 envs on, CartPole runs as gymnasium's CartPoleVectorEnv, which took max_episode_steps 0 (every episode
    one step long) where the single env, which evaluation plays, refuses it: the run trained on, its evaluation
    failed."""
    from scalebox_ms.envs import make_vec_env

    for n in (2, 4):
        with pytest.raises(ConfigError, match=r"^env.id: cannot create 'CartPole-v1' with env.kwargs="
                                              r"\{'max_episode_steps': 0\} \(Expect the `max_episode_steps` to be"):
            make_vec_env("CartPole-v1", n, {"max_episode_steps": 0})
    env = make_vec_env("CartPole-v1", 4, {"max_episode_steps": 7})  # (a valid one still makes the vector env)
    try:
        assert type(env).__name__ == "CartPoleVectorEnv"
    finally:
        env.close()


def test_predict_and_normalize_obs_take_one_observation_or_a_batch():
    """normalize_obs treated one Box observation as a batch of scalars ((3,) -> (3, 3) with normalisation) and a
    Tuple observation had to be a Python tuple for predict (a list, as gymnasium's Tuple.contains accepts, failed
    with an IndexError)."""
    box = PPOTrainer(Config.from_dict({"env": {"id": "Pendulum-v1", "num_envs": 2, "normalize_obs": True},
                                       "run": {"progress": False}}))
    blackjack = PPOTrainer(Config.from_dict({"env": {"id": "Blackjack-v1", "num_envs": 2}, "run": {"progress": False}}))
    try:
        box.learn(total_steps=256)  # (statistics that are not the identity)
        obs = np.array([[0.5, -0.5, 0.9], [-1.0, 0.2, 3.0]], np.float32)
        batch = box.normalize_obs(obs)
        assert batch.shape == (2, 3) and not np.allclose(batch, obs)
        np.testing.assert_array_equal(box.normalize_obs(obs[1]), batch[1])
        one = (14, 10, 0)
        parts = (np.array([14, 20]), np.array([10, 2]), np.array([0, 1]))
        expected = blackjack.predict(parts)
        assert blackjack.predict(one) == expected[0]
        assert blackjack.predict(list(one)) == blackjack.predict(np.array(one)) == expected[0]
        np.testing.assert_array_equal(blackjack.normalize_obs(list(one)), blackjack.normalize_obs(parts)[0])
        # stacked observations: (N, parts) by rows (two actions here, not three), or (parts, N); (3, 3) is ambiguous
        rows = np.stack(parts, axis=1)
        np.testing.assert_array_equal(blackjack.predict(rows), expected)
        np.testing.assert_array_equal(blackjack.predict(rows.T), expected)
        np.testing.assert_array_equal(blackjack.predict(rows.tolist()), expected)
        with pytest.raises(ValueError, match=r"^predict: a \(3, 3\) array is ambiguous for a Tuple of 3 parts"):
            blackjack.predict(np.zeros((3, 3), np.int64))
        with pytest.raises(ValueError, match=r"^predict: an array of shape \(4, 2\) for a Tuple of 3 scalar parts"):
            blackjack.predict(np.zeros((4, 2), np.int64))
        # a fourth part, which the space has not, was dropped without a word (even None, or another batch size)
        for extra in ((14, 10, 0, None), (*parts, np.array([1, 2, 3]))):
            with pytest.raises(ValueError, match=r"^predict: observation part 3 is not in the env's observation space "
                                                 r"\(Tuple\(Discrete\(32\), Discrete\(11\), Discrete\(2\)\)\)$"):
                blackjack.predict(extra)
    finally:
        box.close()
        blackjack.close()


def test_predict_names_an_observation_of_the_wrong_shape_or_a_missing_part():
    """A wrong shape used to fail inside MindSpore's graph compile (an analyzer dump, analyze_fail.ir written into
    the working directory, "MatMul ... x1_col: 3 and x2_row: 4"); now one line names the part and the shapes."""
    flat = PPOTrainer(Config.from_dict({"env": {"id": "CartPole-v1", "num_envs": 2}, "run": {"progress": False}}))
    try:
        assert flat.predict(np.zeros(4)).shape == () and flat.predict(np.zeros((3, 4))).shape == (3,)
        with pytest.raises(ValueError, match=r"observation has shape \(3,\); .* needs \(4,\) .* or \(N, 4\)"):
            flat.predict(np.zeros(3))
        with pytest.raises(ValueError, match=r"observation has shape \(2, 5\)"):
            flat.predict(np.zeros((2, 5)))
    finally:
        flat.close()
    composite = PPOTrainer(Config.from_dict({"env": {"id": "DictMatch-v0", "num_envs": 2},
                                             "run": {"progress": False}}))
    try:
        good = {"position": np.zeros((5, 1), np.float32), "flag": np.ones(5, np.int64)}
        assert composite.predict(good).shape == (5,)
        with pytest.raises(ValueError, match=r"observation part position has shape \(5, 2\); .* needs \(1,\)"):
            composite.predict({**good, "position": np.zeros((5, 2), np.float32)})
        with pytest.raises(ValueError, match="observation part flag is missing"):
            composite.predict({"position": good["position"]})
    finally:
        composite.close()
    assert not os.path.exists("rank_0")  # no compile failure left its analyzer files behind


@pytest.mark.parametrize("algo", ["ppo", "sac", "td3"])
def test_box_actions_reach_the_env_in_its_dtype_and_within_its_bounds(algo):
    """Actions went to a float64 Box as float32 clipped to float32 bounds: float32(0.1) > 0.1 was outside the
    space (an env that checks refused it at step 0; one that does not got off-space actions). Training, predict
    and evaluation alike."""
    from scalebox_ms.trainers import make_trainer
    from scalebox_ms.trainers.evaluation import evaluate_policy

    section = {"n_steps": 16, "batch_size": 32} if algo == "ppo" else {"batch_size": 16, "learning_starts": 64,
                                                                          "train_freq": 16, "gradient_steps": 2}
    cfg = Config.from_dict({"algo": algo, "env": {"id": "space_envs:NarrowF64Action-v0", "num_envs": 2},
                            "policy": {"pi_layers": [8], "vf_layers": [8]}, algo: section,
                            "run": {"seed": 0, "total_steps": 1000, "progress": False}})
    t = make_trainer(cfg)
    try:
        t.learn(until=256)  # (the env asserts every action is in its space)
        for deterministic in (True, False):
            a = t.predict(np.full((64, 1), 1.0, np.float32), deterministic=deterministic)
            assert a.dtype == np.float64 and np.all(np.abs(a) <= 0.1)
        assert len(evaluate_policy(t, episodes=2)) == 2
    finally:
        t.close()


def test_an_integer_box_action_space_is_refused_in_one_line():
    from scalebox_ms.trainers import PPOTrainer

    with pytest.raises(ConfigError, match=r"^env\.id: 'space_envs:NarrowF64Action-v0' has a Box action space of "
                                          r"int64 values; continuous actions need a float Box \(integer actions: "
                                          r"Discrete or MultiDiscrete\)$"):
        PPOTrainer(ppo_config("space_envs:NarrowF64Action-v0", 64, kwargs={"integers": True}))


def test_an_exported_box_policy_evaluates_on_a_float64_space(tmp_path):
    """The MindIR graph's float32 actions went to the env as they were: float32(0.1) is outside Box(-0.1, 0.1)
    of float64. The sidecar records the space's dtype; ``MindIRPolicy.env_actions`` casts and clips in it."""
    from scalebox_ms.export import export_mindir
    from scalebox_ms.mindir_policy import MindIRPolicy, evaluate_mindir
    from scalebox_ms.trainers import PPOTrainer

    t = PPOTrainer(ppo_config("space_envs:NarrowF64Action-v0", 256))
    try:
        t.learn(until=256)
        sidecar = export_mindir(t, str(tmp_path / "p.mindir"))
    finally:
        t.close()
    assert sidecar["action_space"]["dtype"] == "float64"
    a = MindIRPolicy(str(tmp_path / "p.mindir")).env_actions(np.full((3, 1), 0.5, np.float32))
    assert a.dtype == np.float64 and np.all(a == 0.1)
    assert len(evaluate_mindir(str(tmp_path / "p.mindir"), episodes=2)) == 2  # (the env asserts each action)


def test_ppo_warns_of_box_bounds_that_exclude_zero(caplog):
    """PPO's Gaussian starts at mean 0: with bounds [10, 12] every action was clipped to 10 and nothing was learned,
    without a word (SB3's env checker warns)."""
    import logging

    from gymnasium.wrappers import RescaleAction

    from scalebox_ms.trainers import PPOTrainer

    if "OffsetActionPendulum-v0" not in gym.registry:
        gym.register("OffsetActionPendulum-v0", lambda **kw: RescaleAction(gym.make("Pendulum-v1", **kw), 10.0, 12.0))
    for env_id, warned in (("OffsetActionPendulum-v0", True), ("Pendulum-v1", False)):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="scalebox_ms"):
            PPOTrainer(ppo_config(env_id, 256, num_envs=4)).close()
        assert ("Box action bounds [10.0]..[12.0] exclude 0: PPO's Gaussian starts at mean 0" in caplog.text) == warned


def test_infos_are_cut_to_what_is_read_so_any_info_trains():
    """gymnasium's SyncVectorEnv batches every info key: an info array of another shape per sub-env failed at the
    first step, though scalebox_ms reads only Atari's whole-game statistics from infos. Each sub-env's info is now
    cut to those (which pass through); isolated workers batch the infos themselves: there such an info is still
    named, not the env's kwargs (the error read "env.id: ... with env.kwargs={} fails its first step")."""
    from scalebox_ms.envs import make_vec_env
    from scalebox_ms.envs.atari import GameStats, OnlyGameEnd

    env = make_vec_env("space_envs:VaryingInfo-v0", 2, {})
    try:
        assert env.reset(seed=0)[1] == {} and env.step(env.action_space.sample())[4] == {}
    finally:
        env.close()
    with pytest.raises(ConfigError, match=r"^env\.id: 'space_envs:VaryingInfo-v0': gymnasium's vector env cannot "
                                          r"batch the info dict of its step \(ValueError: .*\); each info key needs "
                                          r"one shape and type from step to step$"):
        make_vec_env("space_envs:VaryingInfo-v0", 2, {}, isolation="process")
    games = gym.make_vec("InfoSteps-v0", num_envs=2, vectorization_mode="sync", wrappers=[GameStats, OnlyGameEnd])
    try:
        games.reset(seed=0)
        infos = [games.step(np.array([1, 1]))[4] for _ in range(3)]  # (InfoSteps: "count" each step, 3 per game)
    finally:
        games.close()
    assert infos[0] == {} and sorted(infos[2]) == ["_game_length", "_game_return", "game_length", "game_return"]
    assert list(infos[2]["game_length"]) == [3, 3]


@pytest.mark.parametrize("kwargs, message", [
    (dict(obs_dim=4, discrete=False, action_dim=2), "low: a Box action needs 2 finite bounds, got None"),
    (dict(obs_dim=4, discrete=False, action_dim=2, low=(-1.0,), high=(1.0, 1.0)), "low: a Box action needs 2"),
    (dict(obs_dim=4, discrete=False, action_dim=1, low=(-1.0,), high=(float("inf"),)), "high: a Box action needs 1"),
    (dict(obs_dim=4, discrete=False, action_dim=1, low=(1.0,), high=(-1.0,)), r"low: \(1.0,\) is above high"),
    (dict(obs_dim=0, discrete=True, action_dim=2), "obs_dim: must be an integer >= 1, got 0"),
    (dict(obs_dim=4, discrete=True, action_dim=0), "action_dim: must be an integer >= 1, got 0"),
    (dict(obs_dim=4, discrete=True, action_dim=2, action_kind="multidiscrete", nvec=(2, 2)),
     "discrete: True contradicts action_kind 'multidiscrete'"),
])
def test_a_space_spec_the_model_cannot_act_on_is_refused(kwargs, message):
    """A Box spec without bounds gave NaN actions (np.asarray(None, float32)); zero widths and a multidiscrete spec
    marked discrete failed later in MindSpore with a traceback."""
    from scalebox_ms.models import SpaceSpec

    with pytest.raises(ValueError, match=message):
        SpaceSpec(**kwargs)
