"""PPOTrainer as a library: learning loop, predict, checkpoints, early stop, continuous actions."""

import json
import os

import numpy as np
import pytest

from conftest import small_config
from scalebox_ms import CheckpointError, ConfigError
from scalebox_ms.trainers import Callback, PPOTrainer
from scalebox_ms.trainers.evaluation import evaluate_policy


class Recorder(Callback):
    def __init__(self):
        self.rows = []
        self.started = self.ended = 0

    def on_training_start(self, trainer):
        self.started += 1

    def on_iteration_end(self, trainer, metrics):
        self.rows.append(dict(metrics))

    def on_training_end(self, trainer):
        self.ended += 1


def test_learn_runs_callbacks_and_schedules(small_cfg):
    tr = PPOTrainer(small_cfg)
    rec = Recorder()
    tr.learn(callbacks=[rec])
    assert tr.global_step == 256 and rec.started == rec.ended == 1
    assert [r["global_step"] for r in rec.rows] == [64, 128, 192, 256]
    lrs = [r["learning_rate"] for r in rec.rows]
    assert lrs == pytest.approx([1e-3 * (1 - s / 256) for s in (0, 64, 128, 192)])  # linear schedule
    assert all(r["n_updates"] == 2 * 2 for r in rec.rows)  # epochs * minibatches
    assert all(np.isfinite(r["loss"]) for r in rec.rows)
    tr.close()


def test_callback_can_stop_and_until_pauses(small_cfg):
    class StopAfterTwo(Callback):
        def on_iteration_end(self, trainer, metrics):
            return metrics["iteration"] < 2

    tr = PPOTrainer(small_cfg)
    tr.learn(callbacks=[StopAfterTwo()])
    assert tr.global_step == 128
    tr.learn(until=192)
    assert tr.global_step == 192
    with pytest.raises(ConfigError, match=r"^until: must be >= 0"):
        tr.learn(until=-1)
    for bad in (1700.7, "1536", True):  # (int() used to take them: True became total_steps 1)
        with pytest.raises(ConfigError, match=r"^total_steps: expected an integer"):
            tr.learn(bad)
    with pytest.raises(ValueError, match=r"^predict: an empty batch"):
        tr.predict(np.zeros((0, 4), np.float32))
    tr.learn(until=0)  # (the envs' reset only)
    assert tr.global_step == 192

    class NumpyAnswer(Callback):  # (a numpy comparison: np.False_ is not False, and used not to stop)
        def on_iteration_end(self, trainer, metrics):
            return np.int64(metrics["global_step"]) < 0

    tr.learn(1024, callbacks=[NumpyAnswer()])
    assert tr.global_step == 256  # (one iteration)
    tr.learn(1024, until=320, callbacks=None)
    assert tr.global_step == 320
    with pytest.raises(ValueError, match=r"^seed: must be an integer >= 0, got -1"):
        evaluate_policy(tr, episodes=1, seed=-1, deterministic=False)
    with pytest.raises(ValueError, match=r"^max_envs: must be an integer >= 1, got 0"):
        evaluate_policy(tr, episodes=1, max_envs=0)
    tr.close()
    with pytest.raises(ConfigError, match=r"^learn: this PPOTrainer was closed"):
        tr.learn(until=512)  # (it used to step the closed envs on)


@pytest.mark.parametrize("kernel", ["builtin", "auto"])
def test_target_kl_stops_the_update_early(kernel):
    cfg = small_config(ppo={"target_kl": 1e-6, "n_epochs": 10, "learning_rate": 0.01, "update_kernel": kernel})
    tr = PPOTrainer(cfg)
    rec = Recorder()
    tr.learn(callbacks=[rec])
    assert any(r["early_stopped"] for r in rec.rows)
    assert min(r["n_updates"] for r in rec.rows) < 10 * 2
    tr.close()


def test_predict_single_and_batch(small_cfg):
    tr = PPOTrainer(small_cfg)
    obs, _ = tr.env.reset(seed=0)
    a = tr.predict(obs[0])
    assert np.ndim(a) == 0 and a in (0, 1)
    batch = tr.predict(obs)
    assert batch.shape == (4,)
    np.testing.assert_array_equal(tr.predict(obs), batch)  # deterministic
    # deterministic action = argmax of the policy logits
    logits = tr.model.pi_net(__import__("mindspore").Tensor(obs.astype(np.float32))).asnumpy()
    np.testing.assert_array_equal(batch, logits.argmax(-1))
    tr.close()


def test_continuous_actions_clip_to_bounds_and_learn_step():
    cfg = small_config(env={"id": "Pendulum-v1", "num_envs": 2, "normalize_obs": True, "normalize_reward": True},
                       ppo={"n_steps": 32, "batch_size": 16}, run={"total_steps": 128})
    tr = PPOTrainer(cfg)
    assert not tr.spec.discrete and tr.spec.low == (-2.0,)
    tr.learn()
    obs, _ = tr.env.reset(seed=1)
    a = tr.predict(obs * 100, deterministic=False)
    assert a.shape == (2, 1) and np.all(np.abs(a) <= 2.0)
    assert tr.obs_normalizer.rms.count > 100
    tr.close()


def test_a_checkpoint_fine_tuned_with_another_n_steps_loads_again(tmp_path):
    """Saved at step 64 with n_steps 16, loaded with n_steps 32, trained to 128 and saved: that checkpoint was refused
    ('global_step 128 does not fit iteration 3 of 64 env steps per iteration')."""
    from scalebox_ms.trainers import load_trainer
    from scalebox_ms.trainers.checkpoint import read_sidecar, sidecar_digest

    a = PPOTrainer(small_config(env={"num_envs": 2}))
    a.learn(until=64)
    b = PPOTrainer(small_config(env={"num_envs": 2}, ppo={"n_steps": 32}))
    b.load(a.save(str(tmp_path / "a")))
    b.learn(until=128)
    path = b.save(str(tmp_path / "b"))
    c = load_trainer(path)
    assert (c.global_step, c.iteration, c.steps_base) == (128, 3, (64, 2))
    c.learn(until=192)  # its own n_steps from here: the base stays
    assert (c.iteration, load_trainer(c.save(str(tmp_path / "c"))).steps_base) == (4, (64, 2))
    a.close(), b.close(), c.close()
    sidecar = read_sidecar(path[:-5])  # a steps_base after the checkpoint's own step is refused
    sidecar["steps_base"] = [192, 2]
    sidecar["sidecar_sha256"] = sidecar_digest(sidecar)
    with open(path, "w") as f:
        json.dump(sidecar, f)
    with pytest.raises(CheckpointError, match=r"steps_base must be \[global_step, iteration\] of an earlier point"):
        load_trainer(path)


def test_reward_scaling_after_load_keeps_the_trainers_settings_and_no_dead_episodes_returns(tmp_path):
    """load() took gamma and clip of the reward scaling from the checkpoint (fine-tuning with ppo.gamma 0.9 scaled
    rewards with 0.99), and an env that cannot be pickled restarted its episodes with the old ones' returns."""
    cfg = small_config(env={"normalize_reward": True}, ppo={"gamma": 0.99})
    a = PPOTrainer(cfg)
    a.learn(until=64)
    path = a.save(str(tmp_path / "a"))
    b = PPOTrainer(small_config(env={"normalize_reward": True, "clip_reward": 0.5}, ppo={"gamma": 0.9}))
    b.load(path)
    scaler = b.collector.reward_scaler
    assert (scaler.gamma, scaler.clip) == (0.9, 0.5) and scaler.rms.count == a.collector.reward_scaler.rms.count
    a.close(), b.close()
    # space_envs' DictMatch cannot be pickled: the resumed trainer starts fresh episodes
    c = PPOTrainer(small_config(env={"id": "space_envs:DictMatch-v0", "num_envs": 2, "normalize_reward": True}))
    c.learn(until=64)
    assert np.any(c.collector.reward_scaler.returns != 0)
    d = PPOTrainer.from_checkpoint(c.save(str(tmp_path / "c")))
    assert np.all(d.collector.reward_scaler.returns == 0) and d.collector.reward_scaler.rms.count > 0
    c.close(), d.close()


@pytest.mark.parametrize("kernel", ["builtin", "auto"])  # the update graph's optimizer state, and the C++ kernel's
def test_checkpoint_roundtrip_restores_everything(tmp_path, kernel):
    small_cfg = small_config(ppo={"update_kernel": kernel})
    a = PPOTrainer(small_cfg)
    a.learn(until=128)
    path = a.save(str(tmp_path / "ck"))
    b = PPOTrainer(small_cfg).load(path)
    assert b.global_step == 128 and b.parameters_sha256() == a.parameters_sha256()
    assert b.rng.bit_generator.state == a.rng.bit_generator.state
    a.learn()
    b.learn()
    assert a.parameters_sha256() == b.parameters_sha256()
    c = PPOTrainer.from_checkpoint(path)
    assert c.global_step == 128
    for t in (a, b, c):
        t.close()


def test_save_into_a_directory_uses_the_runs_checkpoint_name(tmp_path, small_cfg, monkeypatch):
    """``save("adir/")`` (or ``""``, or an existing directory) used to write an empty ``adir/.ckpt`` and report
    success, the weights left behind in a temporary file: the directory now gets ``ckpt_<step>``, which
    ``load_trainer(directory)`` finds."""
    from scalebox_ms.trainers import load_trainer

    a = PPOTrainer(small_cfg)
    try:
        a.learn(until=64)
        monkeypatch.chdir(tmp_path)
        (tmp_path / "existing").mkdir()
        for prefix, directory in (("adir/", "adir"), ("", "."), ("existing", "existing")):
            path = a.save(prefix)
            assert path == os.path.join(directory, "ckpt_000000000064.json")
            assert {"ckpt_000000000064.ckpt", "ckpt_000000000064.json"} <= set(os.listdir(tmp_path / directory))
            assert not [n for n in os.listdir(tmp_path / directory) if n.startswith(".")]  # no temporaries left
            b = load_trainer(directory)
            assert b.global_step == 64 and b.parameters_sha256() == a.parameters_sha256()
            b.close()
        with pytest.raises(CheckpointError, match="save: the checkpoint prefix must be a path, got int"):
            a.save(3)
        # a file name of the checkpoint as the prefix (it wrote named.json.json, which load did not find), and
        # path-likes for load as for save
        assert a.save(str(tmp_path / "named.json")) == str(tmp_path / "named.json")
        for path in (str(tmp_path / "named.json"), tmp_path / "named.ckpt", tmp_path / "named"):
            b = load_trainer(path)
            assert b.parameters_sha256() == a.parameters_sha256()
            b.close()
        # every file name load accepts, save takes as the same prefix (x.env.pkl wrote x.env.pkl.json); and
        # load_trainer("") reads the current directory, where save("") wrote
        assert a.save(str(tmp_path / "other.env.pkl")) == str(tmp_path / "other.json")
        assert a.save(str(tmp_path / "third.replay.npz")) == str(tmp_path / "third.json")
        b = load_trainer("")
        assert b.global_step == 64
        b.close()
    finally:
        a.close()


def test_atomic_path_keeps_the_extension_of_a_name_that_is_only_an_extension(tmp_path):
    """MindSpore's writers append their extension to a path without it: the temporary path must end in it too."""
    from scalebox_ms.fileio import atomic_path

    target = tmp_path / ".ckpt"
    with atomic_path(str(target)) as tmp:
        assert tmp.endswith(".ckpt")
        with open(tmp, "wb") as f:
            f.write(b"weights")
    assert target.read_bytes() == b"weights" and os.listdir(tmp_path) == [".ckpt"]


def test_a_file_that_cannot_be_replaced_is_named_not_its_temporary(tmp_path):
    """A directory where summary.json goes: the error named the hidden temporary file, which was gone by then."""
    from scalebox_ms.fileio import atomic_write_json

    (tmp_path / "summary.json").mkdir()
    with pytest.raises(IsADirectoryError) as exc:
        atomic_write_json(str(tmp_path / "summary.json"), {})
    assert exc.value.filename == str(tmp_path / "summary.json") and os.listdir(tmp_path) == ["summary.json"]


def test_corrupt_and_mismatched_checkpoints_are_refused(tmp_path, small_cfg):
    a = PPOTrainer(small_cfg)
    path = a.save(str(tmp_path / "ck"))
    with pytest.raises(CheckpointError, match="checkpoint not found"):
        PPOTrainer(small_cfg).load(str(tmp_path / "missing"))
    other = small_config(policy={"pi_layers": [32]})
    with pytest.raises(CheckpointError, match="does not match this model|shape"):
        PPOTrainer(other).load(path)
    ckpt = str(tmp_path / "ck.ckpt")
    data = bytearray(open(ckpt, "rb").read())
    data[len(data) // 2] ^= 0xFF
    open(ckpt, "wb").write(bytes(data))
    with pytest.raises(CheckpointError, match="corrupt"):
        PPOTrainer(small_cfg).load(path)
    with open(path, "w") as f:
        f.write("{not json")
    with pytest.raises(CheckpointError, match="corrupt"):
        PPOTrainer(small_cfg).load(path)
    a.close()


def test_unsupported_env_and_unknown_id():
    with pytest.raises(ConfigError, match="unknown environment 'NoSuchEnv-v0'"):
        PPOTrainer(small_config(env={"id": "NoSuchEnv-v0"}))
    from gymnasium import spaces

    from scalebox_ms.envs import space_spec

    with pytest.raises(ConfigError, match="'X' has action space Tuple; scalebox_ms supports Discrete, Box"):
        space_spec(spaces.Box(-1, 1, (3,)), spaces.Tuple((spaces.Discrete(2), spaces.Discrete(3))), "X")
    with pytest.raises(ConfigError, match="'X' has a MultiDiscrete action space of shape"):
        space_spec(spaces.Box(-1, 1, (3,)), spaces.MultiDiscrete([[2, 3], [2, 2]]), "X")
    with pytest.raises(ConfigError, match="'X' has an observation space of type Graph"):
        space_spec(spaces.Graph(spaces.Box(-1, 1, (2,)), None), spaces.Discrete(2), "X")
    # zero-width spaces: MindSpore's initializer failed with a traceback on a (64, 0) weight
    box = spaces.Box(-1, 1, (3,))
    for obs, act, culprit in ((spaces.Box(-1, 1, (0,)), spaces.Discrete(2), "observation"),
                              (spaces.Dict({}), spaces.Discrete(2), "observation"),
                              (box, spaces.Box(-1, 1, (0,)), "action"), (box, spaces.MultiDiscrete([]), "action")):
        with pytest.raises(ConfigError, match=rf"^env\.id: 'X' has an empty {culprit} space \(.*\): no {culprit} values"):
            space_spec(obs, act, "X")


def test_evaluate_policy_counts_episodes(small_cfg):
    tr = PPOTrainer(small_cfg)
    rets = evaluate_policy(tr, episodes=5, seed=1)
    assert len(rets) == 5 and all(r >= 1 for r in rets)
    assert rets == evaluate_policy(tr, episodes=5, seed=1)  # deterministic policy, same seeds
    tr.close()


def test_evaluation_episodes_of_an_env_without_a_step_limit_end(caplog, monkeypatch):
    """CliffWalking-v1 is registered without a TimeLimit and stepping into the cliff only sends the agent back:
    a policy that never reaches the goal would keep an evaluation running forever. Evaluation envs without a
    limit of their own are cut at EVAL_MAX_EPISODE_STEPS (logged once); env.kwargs.max_episode_steps chooses one;
    an env's own limit is left alone."""
    import logging

    from scalebox_ms.envs import factory
    from scalebox_ms.envs.factory import EVAL_MAX_EPISODE_STEPS
    from scalebox_ms.trainers.evaluation import run_episodes

    monkeypatch.setattr(factory, "_capped", set())  # (logged once per env id and process)

    calls = []

    def up(obs):
        calls.append(1)
        assert len(calls) <= 2 * EVAL_MAX_EPISODE_STEPS + 10, "the step cap did not end the episodes"  # (not hang)
        return np.zeros(len(obs), np.int64)  # walks into the top wall: -1 per step, never the goal

    with caplog.at_level(logging.INFO, logger="scalebox_ms"):
        returns = run_episodes("CliffWalking-v1", None, up, episodes=2)
    assert returns == [-float(EVAL_MAX_EPISODE_STEPS)] * 2
    assert "registered without an episode step limit" in caplog.text and "env.kwargs.max_episode_steps" in caplog.text
    calls.clear()
    assert run_episodes("CliffWalking-v1", {"max_episode_steps": 30}, up, episodes=3) == [-30.0] * 3
    calls.clear()  # -1, gymnasium's "no TimeLimit": capped too (it hung)
    assert run_episodes("CliffWalking-v1", {"max_episode_steps": -1}, up, episodes=1) == [-float(EVAL_MAX_EPISODE_STEPS)]
    balance = run_episodes("CartPole-v1", None, lambda obs: (obs[:, 2] + obs[:, 3] > 0).astype(np.int64), episodes=2)
    assert balance == [500.0, 500.0]  # a policy that balances is still cut by CartPole's own 500-step limit
    caplog.clear()  # null is gym.make's "the registered limit": it was taken for none (10,000-step evaluations)
    with caplog.at_level(logging.INFO, logger="scalebox_ms"):
        balance = run_episodes("CartPole-v1", {"max_episode_steps": None},  # (4 envs: CartPoleVectorEnv)
                               lambda obs: (obs[:, 2] + obs[:, 3] > 0).astype(np.int64), episodes=4)
    assert balance == [500.0] * 4 and "step limit" not in caplog.text
    caplog.clear()  # (CartPole has a limit of its own: -1 took it away, it is not "registered without" one)
    with caplog.at_level(logging.INFO, logger="scalebox_ms"):
        run_episodes("CartPole-v1", {"max_episode_steps": -1}, lambda obs: np.zeros(len(obs), np.int64), episodes=1)
    assert "CartPole-v1 runs without an episode step limit (env.kwargs.max_episode_steps: -1)" in caplog.text


def test_cartpole_uses_gymnasiums_vector_env_only_for_batches_it_makes_faster():
    from gymnasium.vector import SyncVectorEnv

    from scalebox_ms.envs import make_vec_env
    from scalebox_ms.envs.factory import VECTOR_ENTRY_MIN_ENVS

    few, many = make_vec_env("CartPole-v1", VECTOR_ENTRY_MIN_ENVS - 1), make_vec_env("CartPole-v1", VECTOR_ENTRY_MIN_ENVS)
    assert isinstance(few, SyncVectorEnv) and not isinstance(many, SyncVectorEnv)
    assert type(many).__name__ == "CartPoleVectorEnv"
    few.close(), many.close()
    # max_episode_steps -1 (no TimeLimit for gym.make): CartPoleVectorEnv cut every episode after one step
    unlimited = make_vec_env("CartPole-v1", VECTOR_ENTRY_MIN_ENVS, {"max_episode_steps": -1})
    unlimited.reset(seed=0)
    _, _, terminated, truncated, _ = unlimited.step(np.zeros(VECTOR_ENTRY_MIN_ENVS, np.int64))
    assert not truncated.any() and not terminated.any()
    unlimited.close()


def test_metrics_report_phase_shares(small_cfg):
    tr = PPOTrainer(small_cfg)
    rec = Recorder()
    tr.learn(until=128, callbacks=[rec])
    for r in rec.rows:
        shares = [r[k] for k in ("share_env", "share_act", "share_update", "share_comm", "share_other")]
        assert all(0 <= s <= 1 for s in shares) and abs(sum(shares) - 1) < 1e-6
        assert r["share_act"] > 0 and r["share_update"] > 0 and r["share_env"] > 0
        assert r["update_samples_per_s"] > 0
    tr.close()


@pytest.mark.parametrize("section, change", [("policy", {"activation": "relu"}), ("env", {"normalize_obs": False}),
                                             ("env", {"clip_obs": 5.0})])
def test_load_refuses_a_checkpoint_whose_weights_would_compute_another_function(tmp_path, section, change):
    """Weights of the same shapes loaded without a word into a trainer with another activation, or without the
    checkpoint's observation normalisation (its statistics then dropped): another policy, silently. What only
    changes training (here the learning rate) still loads."""
    base = {"env": {"normalize_obs": True}}
    tr = PPOTrainer(small_config(**base))
    prefix = str(tmp_path / "ck")
    tr.learn(until=64)
    tr.save(prefix)
    tr.close()
    other = PPOTrainer(small_config(**{**base, section: {**base.get(section, {}), **change}}))
    key, value = next(iter(change.items()))
    try:
        with pytest.raises(CheckpointError, match=rf"^checkpoint .*ck was trained with {section}\.{key}=.*, this "
                                                  rf"trainer has {section}\.{key}={value!r}: its weights would "
                                                  r"compute another function here"):
            other.load(prefix)
    finally:
        other.close()
    # what only changes training, and choices that resolve to the same function for these spaces, still load
    same = [{"ppo": {"learning_rate": 1e-4}}, {"policy": {"share_features": False}}, {"policy": {"features": "mlp"}},
            {"env": {"normalize_obs": True, "preprocess": "none"}}]
    for extra in same:
        tuned = PPOTrainer(small_config(**{**base, **extra}))
        try:
            tuned.load(prefix)
            assert tuned.global_step == 64, extra
        finally:
            tuned.close()


@pytest.mark.parametrize("change", [{"kwargs": {"g": 2.0}}, {"backend": "native"}])
def test_load_keeps_this_trainers_envs_when_the_checkpoints_were_built_otherwise(tmp_path, change, caplog):
    """load() swapped in the checkpoint's pickled envs whatever this trainer's env.kwargs/backend said: fine-tuning
    a Pendulum policy on g=2 trained on the checkpoint's g=10 (while evaluation built g=2 envs), and a gymnasium
    trainer stepped a native env."""
    cfg = {"env": {"id": "Pendulum-v1", "num_envs": 2}}
    a = PPOTrainer(small_config(**cfg))
    a.learn(until=64)
    prefix = a.save(str(tmp_path / "ck"))
    a.close()
    b = PPOTrainer(small_config(env={**cfg["env"], **change}))
    env_before = b.env
    try:
        with caplog.at_level("WARNING"):
            b.load(prefix)
        key = next(iter(change))
        assert f"its envs were built with another env.{key} than this trainer's: its in-flight episodes are not " \
               "restored" in caplog.text
        assert b.env is env_before and b.global_step == 64
        if key == "kwargs":
            assert [e.unwrapped.g for e in b.env.envs] == [2.0, 2.0]
        b.learn(until=128)  # trains on from fresh episodes
    finally:
        b.close()
    caplog.clear()
    same = PPOTrainer(small_config(**cfg))  # the same env config: the checkpoint's episodes go on
    try:
        with caplog.at_level("WARNING"):
            same.load(prefix)
        assert "its envs were built with another" not in caplog.text
    finally:
        same.close()


def test_load_into_isolated_workers_starts_fresh_episodes(tmp_path, caplog):
    """sandbox.isolation_level may differ (evaluate and export accept an edited one): an in-process checkpoint's
    sub-envs were put into an IsolatedVectorEnv (AttributeError: no attribute 'envs')."""
    a = PPOTrainer(small_config(env={"num_envs": 2}))
    a.learn(until=64)
    prefix = a.save(str(tmp_path / "ck"))
    a.close()
    b = PPOTrainer(small_config(env={"num_envs": 2}, sandbox={"isolation_level": "process"}))
    try:
        with caplog.at_level("WARNING"):
            b.load(prefix)
        assert "its envs were built with another kind of vector env (here IsolatedVectorEnv" in caplog.text
        assert b.global_step == 64 and type(b.env).__name__ == "IsolatedVectorEnv"
        b.learn(until=128)
    finally:
        b.close()


@pytest.mark.parametrize("policy", [{}, {"act_kernel": "custom", "layer": "fused"}])
def test_set_parameters_is_seen_by_the_compiled_graphs_and_round_trips(policy):
    """Weights written with MindSpore's own load_param_into_net (set_data) after the graphs ran were not seen by
    predict, while save/learn saw them; set_parameters is the supported way (an assign inside a graph)."""
    tr = PPOTrainer(small_config(policy=policy))
    other = PPOTrainer(small_config(policy=policy, run={"seed": 4}))
    try:
        tr.learn(until=64)  # (its graphs have run)
        obs = np.random.default_rng(0).normal(size=(64, 4)).astype(np.float32)
        mine, theirs = tr.get_parameters(), other.get_parameters()
        assert set(mine) == set(theirs) and any(k.startswith("optimizer.") for k in mine)
        assert mine["model." + next(n for n, _ in tr.model.parameters_and_names())].dtype == np.float32
        tr.set_parameters({k: v for k, v in theirs.items() if k.startswith("model.")})
        assert tr.parameters_sha256() == other.parameters_sha256()
        np.testing.assert_array_equal(tr.predict(obs), other.predict(obs))
        np.testing.assert_array_equal(tr.predict(obs, deterministic=False, rng=1),
                                      other.predict(obs, deterministic=False, rng=1))
        tr.set_parameters(mine.items())  # (pairs too) back to its own
        assert all(np.array_equal(v, mine[k]) for k, v in tr.get_parameters().items())
        first = next(iter(mine))
        with pytest.raises(ValueError, match=r"^set_parameters: 'nope' is none of this trainer's parameters"):
            tr.set_parameters({first: np.zeros_like(mine[first]), "nope": np.zeros(3)})
        with pytest.raises(ValueError, match=rf"^set_parameters: '{first}' has shape \(1,\)"):
            tr.set_parameters({first: np.zeros(1)})
        for bad, words in ((np.nan, "NaN or infinity"), (np.inf, "NaN or infinity"), ("x", "<U1 values, not real")):
            with pytest.raises(ValueError, match=rf"^set_parameters: '{first}' holds {words}"):  # (predict gave 0s)
                tr.set_parameters({first: np.full_like(mine[first], bad, dtype=type(bad) if bad == "x" else None)})
        assert all(np.array_equal(v, mine[k]) for k, v in tr.get_parameters().items())  # nothing written
        name = next(n for n, _ in tr.model.parameters_and_names())  # ("model." may be left out)
        tr.set_parameters({name: theirs["model." + name]})
        np.testing.assert_array_equal(tr.get_parameters()["model." + name], theirs["model." + name])
    finally:
        tr.close(), other.close()


def test_load_into_a_trainer_that_already_ran_its_graphs(tmp_path):
    """Compiled graphs must see loaded parameters (MindSpore's set_data alone would be invisible to them)."""
    small_cfg = small_config(ppo={"update_kernel": "builtin"})  # (the update as a compiled graph too)
    a = PPOTrainer(small_cfg)
    a.learn(until=128)
    path = a.save(str(tmp_path / "ck"))
    b = PPOTrainer(small_cfg)
    b.learn(until=64)  # compiles act/value/update graphs with other weights
    b.load(path)
    obs = np.random.default_rng(0).normal(size=(64, 4)).astype(np.float32)
    np.testing.assert_array_equal(b.predict(obs), a.predict(obs))
    a.learn()
    b.learn()
    assert a.parameters_sha256() == b.parameters_sha256()
    a.close(), b.close()


def test_eval_callback_evaluates_on_schedule_and_stops_at_the_threshold():
    from scalebox_ms.trainers import PPOTrainer
    from scalebox_ms.trainers.callbacks import EvalCallback

    every = EvalCallback(every_steps=100, episodes=2)  # iterations of 64 steps: evaluates at 128, 256
    trainer = PPOTrainer(small_config())
    trainer.learn(callbacks=[every])
    assert [h["step"] for h in every.history] == [128, 256] and every.solved is None
    assert all(h["eval_s"] > 0 and h["std"] >= 0 for h in every.history)
    assert 0 < every.history[0]["train_s"] < every.history[1]["train_s"]
    assert every.eval_s == pytest.approx(sum(h["eval_s"] for h in every.history))

    stop = EvalCallback(every_steps=64, episodes=2, threshold=-1.0)  # any CartPole return solves it
    trainer = PPOTrainer(small_config())
    trainer.learn(callbacks=[stop])
    assert trainer.global_step == 64 and stop.solved == stop.history[0] and stop.solved["mean"] >= 1
    with pytest.raises(ValueError, match="every_steps"):
        EvalCallback(every_steps=0)


def test_loading_the_latest_checkpoint_of_a_run_still_being_pruned(tmp_path):
    """evaluate/export read a run's latest checkpoint; a train still writing the run may prune it (sidecar first)
    between picking and reading it: the new latest is loaded instead. A checkpoint that is still there but fails
    to load (corrupt) is an error at once."""
    from scalebox_ms.trainers.checkpoint import load_into

    ckdir = tmp_path / "checkpoints"
    ckdir.mkdir()
    (ckdir / "ckpt_000000000100.json").write_text("{}")

    class Pruned:  # trainer.load, while the run's trainer writes step 200 and prunes step 100
        calls = []

        def load(self, prefix, replay=True):
            self.calls.append(os.path.basename(prefix))
            if prefix.endswith("100"):
                (ckdir / "ckpt_000000000200.json").write_text("{}")
                os.unlink(prefix + ".json")
                raise CheckpointError(f"checkpoint not found: {prefix}.json")
            return self

    tr = Pruned()
    assert load_into(tr, None, str(tmp_path)).endswith("ckpt_000000000200")
    assert tr.calls == ["ckpt_000000000100", "ckpt_000000000200"]

    class Corrupt:
        calls = 0

        def load(self, prefix, replay=True):
            Corrupt.calls += 1
            raise CheckpointError(f"{prefix}.json was edited or is corrupt")

    with pytest.raises(CheckpointError, match="corrupt"):
        load_into(Corrupt(), None, str(tmp_path))
    assert Corrupt.calls == 1
    with pytest.raises(CheckpointError, match="checkpoint not found"):
        load_into(Corrupt(), str(tmp_path / "checkpoints" / "ckpt_000000000300"), str(tmp_path))
    # evaluate/export --checkpoint: one of the --run's own (or its discarded/), not another run's
    other = tmp_path / "other" / "checkpoints"
    other.mkdir(parents=True)
    (other / "ckpt_000000000100.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"^--checkpoint .*: not one of .*'s checkpoints"):
        load_into(Corrupt(), str(other / "ckpt_000000000100.json"), str(tmp_path))
    (ckdir / "discarded").mkdir()
    (ckdir / "discarded" / "ckpt_000000000400.json").write_text("{}")
    with pytest.raises(CheckpointError, match="corrupt"):  # (accepted, then loaded)
        load_into(Corrupt(), str(ckdir / "discarded" / "ckpt_000000000400.json"), str(tmp_path))
    (ckdir / "discarded" / "2").mkdir()  # where a second resume's discarded checkpoints go
    (ckdir / "discarded" / "2" / "ckpt_000000000400.json").write_text("{}")
    with pytest.raises(CheckpointError, match="corrupt"):
        load_into(Corrupt(), str(ckdir / "discarded" / "2" / "ckpt_000000000400.json"), str(tmp_path))
    (ckdir / "discarded-x").mkdir()  # a sibling whose name only starts like it
    (ckdir / "discarded-x" / "ckpt_000000000400.json").write_text("{}")
    with pytest.raises(ConfigError, match="not one of"):
        load_into(Corrupt(), str(ckdir / "discarded-x" / "ckpt_000000000400.json"), str(tmp_path))


def test_run_seed_decides_the_initial_parameters_with_a_users_sandbox():
    """A Sandbox passed in used to keep MindSpore's random state as the process left it: a second trainer of the
    same config got other initial weights, and the Sandbox's seed overrode ``run.seed``."""
    from scalebox_ms import Sandbox
    from scalebox_ms.trainers import make_trainer

    cfg = small_config(run={"seed": 3})
    own = make_trainer(cfg)
    expected = own.parameters_sha256()
    own.close()
    with Sandbox(device="cpu", seed=0) as sb:
        for _ in range(2):
            tr = make_trainer(cfg, sandbox=sb)
            assert tr.parameters_sha256() == expected
            tr.close()
        other = make_trainer(small_config(run={"seed": 4}), sandbox=sb)
        assert other.parameters_sha256() != expected
        other.close()
        assert sb.seed == 4  # (what it was reseeded with)


def test_a_run_without_a_checkpoints_directory_is_named_as_such(tmp_path):
    """evaluate/export --run of a directory holding only config.yaml used to report the made-up file
    '<run>/checkpoints.json'."""
    from scalebox_ms.trainers.checkpoint import load_into

    (tmp_path / "config.yaml").write_text("{}")
    with pytest.raises(CheckpointError, match=r"^no checkpoint found in .* \(it has no checkpoints/ directory\)$"):
        load_into(None, None, str(tmp_path))
    (tmp_path / "checkpoints").mkdir()
    with pytest.raises(CheckpointError, match=r"^no checkpoint found in .*checkpoints$"):
        load_into(None, None, str(tmp_path))


def test_from_checkpoint_closes_the_trainer_it_built_when_the_load_fails(tmp_path, small_cfg, monkeypatch):
    tr = PPOTrainer(small_cfg)
    path = tr.save(str(tmp_path / "a"))
    tr.close()
    closed = []
    monkeypatch.setattr(PPOTrainer, "close", lambda self: closed.append(self))
    monkeypatch.setattr(PPOTrainer, "load", lambda self, path, replay=True: (_ for _ in ()).throw(
        CheckpointError("mismatched")))
    with pytest.raises(CheckpointError, match="mismatched"):
        PPOTrainer.from_checkpoint(path)
    assert len(closed) == 1  # (its envs: with env isolation, worker processes)


def test_a_trainer_refused_after_its_envs_were_built_closes_them(monkeypatch):
    """(the memory check comes after the envs: with env isolation their worker processes outlived the error)"""
    from scalebox_ms.trainers import make_trainer
    from scalebox_ms.trainers.collector import RolloutCollector

    closed = []
    real = RolloutCollector.close
    monkeypatch.setattr(RolloutCollector, "close", lambda self: (closed.append(self), real(self)))
    with pytest.raises(ConfigError, match=r"^ppo\.n_steps: "):
        PPOTrainer(small_config(ppo={"n_steps": 10**12, "batch_size": 64}))
    assert len(closed) == 1
    with pytest.raises(ConfigError, match=r"^sac\.buffer_size: "):
        make_trainer({"algo": "sac", "env": {"id": "Pendulum-v1", "num_envs": 1}, "sandbox": {"memory_limit": "4GB"},
                      "sac": {"buffer_size": 2**30}})  # (~38 GB of replay: beyond the limit on any machine)
    assert len(closed) == 2


def test_save_after_an_update_was_interrupted_is_refused(tmp_path, small_cfg):
    """A KeyboardInterrupt out of the update left parameters updated (or half) under the old step counter, which save
    wrote as a checkpoint. A complete iteration after it makes the trainer savable again."""
    tr = PPOTrainer(small_cfg)
    try:
        tr.learn(until=64)
        real = tr.runner.run
        tr.runner.run = lambda *args: (_ for _ in ()).throw(KeyboardInterrupt)
        with pytest.raises(KeyboardInterrupt):
            tr.learn(until=128)
        tr.runner.run = real
        with pytest.raises(CheckpointError, match=r"^save: learn\(\) of this PPOTrainer was interrupted inside an "
                                                  r"iteration \(after step 64\), its state partly updated"):
            tr.save(str(tmp_path / "torn"))
        tr.learn(until=128)  # (a complete iteration: savable again)
        assert tr.global_step == 128 and tr.save(str(tmp_path / "ok"))
    finally:
        tr.close()


def test_a_rank_above_0_loading_a_checkpoint_without_in_flight_state_gets_its_own_stream(tmp_path, small_cfg):
    """(data parallel: the checkpoint's sampling stream is rank 0's; every rank drew the same noise as rank 0)"""
    a = PPOTrainer(small_cfg)
    path = a.save(str(tmp_path / "start"))  # (before any env step: no in-flight state)
    b = PPOTrainer(small_cfg)
    try:
        b.dist.rank, b.dist.world_size = 1, 2  # (as an msrun rank 1 of 2 sees itself)
        b.load(path)
        assert b.collector.obs is None
        assert b.collector.rng.bit_generator.state != a.collector.rng.bit_generator.state
        b.dist.rank = 0
        b.load(path)
        assert b.collector.rng.bit_generator.state == a.collector.rng.bit_generator.state
    finally:
        b.dist.rank, b.dist.world_size = 0, 1
        a.close()
        b.close()
