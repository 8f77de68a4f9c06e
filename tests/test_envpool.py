"""env.backend: envpool -- EnvPool's C++ envs behind the gymnasium vector API (the [envpool] extra, in [test])."""
import json
import os
import sys

import gymnasium as gym
import numpy as np
import pytest

from conftest import REPO, run_module
from scalebox_ms.errors import ConfigError


def test_spaces_are_gymnasiums_and_autoreset_is_next_step():
    import gymnasium as gym

    from scalebox_ms.envs import make_vec_env

    env = make_vec_env("CartPole-v1", 3, backend="envpool")
    ref = gym.make("CartPole-v1")
    try:
        assert env.single_action_space == ref.action_space
        assert env.single_observation_space.shape == ref.observation_space.shape
        np.testing.assert_allclose(env.single_observation_space.high, ref.observation_space.high)
        assert env.action_space.shape == (3,)
        obs, _ = env.reset(seed=1)
        again, _ = env.reset(seed=1)
        other, _ = env.reset(seed=2)
        np.testing.assert_array_equal(obs, again)
        assert not np.array_equal(obs, other)
        assert obs.shape == (3, 4) and np.all(np.abs(obs) <= 0.05)  # CartPole's reset noise
        rng = np.random.default_rng(0)
        ended = np.zeros(3, bool)
        seen_reset_step = False
        for t in range(600):
            obs, reward, term, trunc, _ = env.step(rng.integers(0, 2, 3))
            if ended.any():  # NEXT_STEP: the step after an end is the reset, reward 0, not an end
                assert np.all(reward[ended] == 0) and not (term | trunc)[ended].any()
                assert np.all(np.abs(obs[ended]) <= 0.05)
                seen_reset_step = True
            assert np.all(reward[~ended] == 1)
            ended = term | trunc
        assert seen_reset_step
    finally:
        env.close()


def test_truncates_at_the_time_limit():
    from scalebox_ms.envs import make_vec_env

    env = make_vec_env("Pendulum-v1", 2, backend="envpool")
    try:
        env.reset(seed=0)
        for t in range(200):
            _, _, term, trunc, _ = env.step(np.zeros((2, 1), np.float32))
            assert not term.any()
            assert trunc.all() == (t == 199)
    finally:
        env.close()


@pytest.mark.parametrize("env_id, culprit", [
    ("NoSuchEnv-v0", "env.backend: envpool has no 'NoSuchEnv-v0'"),
    ("ALE/NoSuchGame-v5", "env.backend: envpool has no 'ALE/NoSuchGame-v5'"),
    ("BreakoutNoFrameskip-v4", r"envpool has no 'BreakoutNoFrameskip-v4' \(EnvPool runs ale-py's v5 games"),
])
def test_ids_envpool_cannot_run_are_one_line_errors(env_id, culprit):
    from scalebox_ms.envs import make_vec_env

    with pytest.raises(ConfigError, match=culprit) as info:
        make_vec_env(env_id, 2, backend="envpool", preprocess="auto")
    assert "\n" not in str(info.value)


def test_atari_ram_observations_are_refused_by_envpool():
    from scalebox_ms.envs import make_vec_env

    with pytest.raises(ConfigError, match="env.kwargs.obs_type: ram is not available with env.backend envpool"):
        make_vec_env("ALE/Breakout-v5", 2, {"obs_type": "ram"}, backend="envpool", preprocess="auto")


@pytest.mark.parametrize("key, value", [("batch_size", 2), ("task", "breakout"), ("max_num_players", 2),
                                        ("env_seed", [5, 5, 5, 5])])
def test_pool_settings_in_env_kwargs_are_refused(key, value):
    """batch_size 2 of 4 envs made EnvPool asynchronous (steps of 2 envs, a MindSpore shape error later); task
    trained another game under env.id's name; env_seed overrode every seeded reset."""
    from scalebox_ms.envs import make_vec_env

    with pytest.raises(ConfigError, match=rf"^env.kwargs.{key}: an EnvPool pool setting, not an env option"):
        make_vec_env("CartPole-v1", 4, {key: value}, backend="envpool", preprocess="auto")


@pytest.mark.parametrize("limit", [0, -2, 2.5, True, "10"])
def test_a_max_episode_steps_gymnasium_refuses_is_refused(limit):
    """0 or -2 made EnvPool truncate every other step, silently (the gymnasium backend refuses them)."""
    from scalebox_ms.envs import make_vec_env

    with pytest.raises(ConfigError, match=r"^env.kwargs.max_episode_steps: must be a whole number in \[1, 2147483647\] "
                                          r"\(or -1: no limit, null: the env's own\), got "):
        make_vec_env("CartPole-v1", 2, {"max_episode_steps": limit}, backend="envpool")


def test_max_episode_steps_null_is_the_envs_own_limit():
    """null is gym.make's "the registered limit"; EnvPool refused it (incompatible constructor arguments)."""
    from scalebox_ms.envs import make_vec_env

    env = make_vec_env("Pendulum-v1", 1, {"max_episode_steps": None}, backend="envpool")
    try:
        env.reset(seed=0)
        for step in range(1, 300):  # (Pendulum never terminates: cut by its own 200 steps)
            _, _, terminated, truncated, _ = env.step(np.zeros((1, 1), np.float32))
            if terminated.any() or truncated.any():
                break
        assert step == 200 and truncated.all() and not terminated.any()
    finally:
        env.close()


def test_max_episode_steps_minus_one_means_no_limit_as_in_gymnasium():
    """EnvPool took -1 as a limit: every other step truncated."""
    from scalebox_ms.envs import make_vec_env

    env = make_vec_env("CartPole-v1", 2, {"max_episode_steps": -1}, backend="envpool")
    try:
        env.reset(seed=0)
        for _ in range(5):
            _, _, terminated, truncated, _ = env.step(np.zeros(2, np.int64))
            assert not truncated.any() and not terminated.any()
    finally:
        env.close()


def test_seeds_beyond_int32_are_taken():
    """run.seed goes up to 2**32 - 1: EnvPool asserted 'Seed should be in range of int32' at the run's first reset,
    after the run directory was made (the probe resets with seed 0)."""
    from scalebox_ms.envs import make_vec_env

    env = make_vec_env("CartPole-v1", 2, backend="envpool")
    try:
        high, _ = env.reset(seed=2**32 - 1)
        assert high.shape == (2, 4)
        np.testing.assert_array_equal(env.reset(seed=2**31 + 7)[0], env.reset(seed=7)[0])  # (the int32 it maps to)
    finally:
        env.close()


def test_without_the_extra_the_error_names_it(monkeypatch):
    from scalebox_ms.envs import make_vec_env

    monkeypatch.setitem(sys.modules, "envpool", None)  # import envpool -> ImportError
    with pytest.raises(ConfigError, match=r"env.backend: envpool needs the optional extra: pip install -e \".\[envpool\]\""):
        make_vec_env("CartPole-v1", 2, backend="envpool")


def test_an_episode_ending_itself_on_its_last_step_stays_terminated():
    """EnvPool reports an episode that ends on its max_episode_steps-th step as truncated only; gymnasium's TimeLimit
    keeps terminated, and PPO/DQN must not bootstrap from such a step (they did with env.backend envpool)."""
    from scalebox_ms.envs import make_vec_env

    theta_max = gym.make("CartPole-v1").unwrapped.theta_threshold_radians  # (x stays within 2.4 in 10 steps)
    env = make_vec_env("CartPole-v1", 64, {"max_episode_steps": 10}, backend="envpool")
    both = 0
    try:
        env.reset(seed=0)
        rng = np.random.default_rng(0)
        for _ in range(300):
            obs, _, terminated, truncated, _ = env.step(rng.integers(0, 2, 64))
            fallen = np.abs(obs[:, 2]) > theta_max
            np.testing.assert_array_equal(terminated[truncated], fallen[truncated])
            both += int((terminated & truncated).sum())
    finally:
        env.close()
    assert both > 0  # (the case was met: ~3% of the truncations here)


def test_a_broken_envpool_install_is_named_in_one_line(monkeypatch, tmp_path):
    """An envpool whose import raises something else than ImportError (a protobuf it was not built for) was a
    traceback."""
    from scalebox_ms.envs import make_vec_env

    (tmp_path / "envpool").mkdir()
    (tmp_path / "envpool" / "__init__.py").write_text('raise TypeError("Descriptors cannot be created directly.")\n')
    monkeypatch.delitem(sys.modules, "envpool", raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match=r"^env.backend: envpool is installed but its import fails \(TypeError: "
                                          r"Descriptors cannot be created directly.\); reinstall it"):
        make_vec_env("CartPole-v1", 2, backend="envpool")


@pytest.mark.parametrize("sets, culprit", [
    ({"env": {"backend": "envpool"}, "sandbox": {"isolation_level": "process"}}, "sandbox.isolation_level"),
    ({"env": {"backend": "envpool", "preprocess": "atari"}}, "env.preprocess: atari needs an ale-py env id"),
    ({"env": {"backend": "envpool", "id": "ALE/Breakout-v5", "preprocess": "none"}},
     "env.preprocess: none with env.backend envpool"),
])
def test_config_errors(sets, culprit):
    from scalebox_ms import Config

    with pytest.raises(ConfigError, match=culprit):
        Config.from_dict(sets)


def test_same_layout_compares_kinds_and_shapes_part_by_part_not_dtypes():
    from gymnasium import spaces

    from scalebox_ms.trainers.evaluation import same_layout

    box = spaces.Box(-1.0, 1.0, (3,), np.float32)
    assert same_layout(box, spaces.Box(-np.inf, np.inf, (3,), np.float64))
    assert not same_layout(box, spaces.Box(-1.0, 1.0, (4,), np.float32))
    assert not same_layout(spaces.Box(0, 31, (3,), np.int32),
                           spaces.Tuple((spaces.Discrete(32), spaces.Discrete(11), spaces.Discrete(2))))
    assert same_layout(spaces.Dict({"a": box, "n": spaces.Discrete(3)}), spaces.Dict({"a": box, "n": spaces.Discrete(3)}))
    assert not same_layout(spaces.Dict({"a": box, "n": spaces.Discrete(3)}),
                           spaces.Dict({"a": box, "n": spaces.Discrete(3, start=1)}))
    assert not same_layout(spaces.MultiDiscrete([2, 3]), spaces.MultiDiscrete([3, 2]))


def test_ppo_on_envpool_cartpole_reaches_475_on_gymnasiums_env():
    from scalebox_ms.config import load_config
    from scalebox_ms.trainers import PPOTrainer
    from scalebox_ms.trainers.callbacks import EvalCallback
    cfg = load_config(os.path.join(REPO, "configs", "ppo_cartpole.yaml"),
                      ["env.backend=envpool", "run.progress=false", "run.eval_episodes=0", "run.checkpoint_every=0"])
    stop = EvalCallback(every_steps=8192, episodes=10, threshold=475)
    trainer = PPOTrainer(cfg)
    trainer.learn(callbacks=[stop])
    assert stop.solved is not None, stop.history  # evaluated on gymnasium's CartPole-v1
    assert stop.solved["mean"] >= 475 and trainer.global_step < cfg.run.total_steps


@pytest.mark.integration
def test_halfcheetah_runs_and_resumes_with_fresh_episodes(tmp_path):
    common = ["--config", os.path.join(REPO, "configs", "ppo_halfcheetah.yaml"), "--set", "env.backend=envpool", "--set", "ppo.n_steps=128",
              "--set", "ppo.batch_size=64", "--set", "ppo.n_epochs=1", "--set", "run.eval_episodes=0",
              "--set", "run.checkpoint_every=256", "--no-progress", "--total-steps", 512]
    half = run_module("train", *common, "--until", 256, "--run-dir", tmp_path / "run")
    assert half.returncode == 0, half.stderr[-2000:]
    sidecar = json.loads(next((tmp_path / "run").rglob("ckpt_*256.json")).read_text())
    assert sidecar["inflight"] == {"fresh_episodes": True}
    resumed = run_module("train", "--resume", tmp_path / "run", "--no-progress")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert json.loads(resumed.stdout)["global_step"] == 512



def test_no_float64_precision_warnings_from_envpools_spaces():
    """EnvPool builds Box spaces from float64 bounds on every reset and step: gymnasium's 'precision lowered'
    warning was printed 2-4 times per run."""
    import warnings

    from scalebox_ms.envs import make_vec_env

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        env = make_vec_env("Pendulum-v1", 2, backend="envpool")
        env.reset(seed=1)
        for _ in range(3):
            env.step(env.action_space.sample())
        env.close()
    assert not [w for w in seen if "precision lowered" in str(w.message)]


def test_loading_a_fresh_episodes_checkpoint_keeps_its_observation_statistics(tmp_path):
    """The fresh episodes a checkpoint of unpicklable envs restarts used to update env.normalize_obs' statistics
    while loading: evaluate and export then normalised with other statistics than the run's (other actions, other
    eval returns, another sidecar in the exported file)."""
    from scalebox_ms.trainers import PPOTrainer, load_trainer

    cfg = {"env": {"id": "Pendulum-v1", "backend": "envpool", "num_envs": 4, "normalize_obs": True},
           "ppo": {"n_steps": 32, "batch_size": 64, "n_epochs": 1}, "run": {"total_steps": 128}}
    a = PPOTrainer(cfg)
    try:
        a.learn()
        path = a.save(str(tmp_path / "ck"))
        saved = json.loads(open(path).read())
        assert saved["inflight"] == {"fresh_episodes": True}
        obs = np.random.default_rng(0).uniform(-1, 1, (16, 3)).astype(np.float32)
        b = load_trainer(path)
        try:
            assert b.collector.obs_normalizer.state_dict() == a.collector.obs_normalizer.state_dict()
            np.testing.assert_array_equal(b.predict(obs), a.predict(obs))
        finally:
            b.close()
    finally:
        a.close()


# ---------------------------------------------------------------------------------------------- Atari
def test_atari_preprocesses_like_the_gymnasium_pipeline_and_reports_whole_games():
    """EnvPool's Atari (ALE/Breakout-v5 -> Breakout-v5) gives the gymnasium pipeline's spaces; a lost life ends a
    training episode, rewards are clipped, and a game's unclipped return is reported once, when it is over."""
    from scalebox_ms.envs import make_vec_env

    ep = make_vec_env("ALE/Breakout-v5", 4, backend="envpool", preprocess="auto")
    gym_env = make_vec_env("ALE/Breakout-v5", 1, preprocess="auto")
    try:
        assert ep.single_observation_space == gym_env.single_observation_space  # uint8 (4, 84, 84)
        assert ep.single_action_space == gym_env.single_action_space
        obs, _ = ep.reset(seed=0)
        assert obs.shape == (4, 4, 84, 84) and obs.dtype == np.uint8
        rng = np.random.default_rng(0)
        raw = np.zeros(4)
        games = life_ends = 0
        lives = np.full(4, 5)
        for _ in range(2500):
            obs, reward, term, trunc, info = ep.step(rng.integers(0, 4, 4))
            assert set(np.unique(reward)) <= {-1.0, 0.0, 1.0}  # clipped to its sign
            raw += info["reward"]  # EnvPool's unclipped reward
            over = (info["terminated"] > 0) | trunc
            life_ends += int((term & ~over).sum())
            ended = info.get("_game_return", np.zeros(4, bool))
            assert not (over & ~ended).any()  # every game over is reported ...
            for i in np.flatnonzero(ended & over):
                assert info["game_return"][i] == raw[i]
                assert info["game_length"][i] == 4 * info["elapsed_step"][i]
                raw[i] = 0.0
                games += 1
            for i in np.flatnonzero(ended & ~over):  # ... and one that ended inside a reset's no-ops, once
                assert info["lives"][i] > lives[i] and info["game_return"][i] == raw[i] - info["reward"][i]
                raw[i] = info["reward"][i]
                games += 1
            lives = np.where(over, 5, info["lives"])
        assert games >= 4 and life_ends >= 4 * games  # Breakout: 5 lives per game
        with pytest.raises(ConfigError, match="env.kwargs.noop_max: EnvPool's Atari preprocessing is fixed"):
            make_vec_env("ALE/Breakout-v5", 1, {"noop_max": 0}, backend="envpool", preprocess="auto")
        # sticky actions, an ale-py option gymnasium's evaluation env takes too: set on both (it was refused)
        sticky = make_vec_env("ALE/Breakout-v5", 1, {"repeat_action_probability": 0.0}, backend="envpool",
                              preprocess="auto")
        try:
            assert sticky._options["repeat_action_probability"] == 0.0
        finally:
            sticky.close()
        with pytest.raises(ConfigError, match=r"env.kwargs.repeat_action_probability: must be a number in \[0, 1\]"):
            make_vec_env("ALE/Breakout-v5", 1, {"repeat_action_probability": 2.0}, backend="envpool",
                         preprocess="auto")
    finally:
        ep.close()
        gym_env.close()


def test_ppo_trains_on_envpool_breakout_and_counts_games(tmp_path):
    from scalebox_ms import Config
    from scalebox_ms.trainers import PPOTrainer

    tr = PPOTrainer(Config.from_dict({
        "env": {"id": "ALE/Breakout-v5", "num_envs": 4, "backend": "envpool"},
        "policy": {"pi_layers": [], "vf_layers": [], "cnn_channels": [8, 16, 16], "cnn_features_dim": 64},
        "ppo": {"n_steps": 128, "batch_size": 128, "n_epochs": 1},
        "run": {"seed": 0, "total_steps": 2048, "progress": False}}))
    try:
        assert type(tr.collector.env).__name__ == "EnvPoolVectorEnv"
        tr.learn()
        c = tr.collector
        assert c.episodes >= 1 and min(c.episode_lengths) > 100  # whole games (frames), not lives
    finally:
        tr.close()


def test_a_run_that_does_not_evaluate_is_warned_and_evaluate_refuses_in_one_line(tmp_path, caplog, capsys):
    """EnvPool's Blackjack-v1 observes a Box where gymnasium's has a Tuple: a run without evaluations trained without
    a word, then `evaluate` failed on an observation 'of shape (3, 2)' and `export --int8` while calibrating."""
    import logging

    from conftest import small_config
    from scalebox_ms import evaluate, export
    from scalebox_ms.trainers.run import train_run

    cfg = small_config(env={"id": "Blackjack-v1", "backend": "envpool", "num_envs": 4},
                       run={"eval_episodes": 0, "eval_every": 0, "total_steps": 128})
    run_dir = str(tmp_path / "run")
    with caplog.at_level(logging.WARNING, logger="scalebox_ms"):
        assert train_run(cfg, run_dir=run_dir, log=lambda *a: None)["status"] == "completed"
    line = ("env.backend: envpool's Blackjack-v1 has the observation space Box(0, 31, (3,), int32), gymnasium's "
            "(which evaluation plays) Tuple(Discrete(32), Discrete(11), Discrete(2))")
    assert [r.getMessage() for r in caplog.records if "envpool's" in r.getMessage()] == [
        f"warning: {line}: the policy would be evaluated on observations of another kind than it was trained on: "
        "`evaluate` and `export --int8` of this run will fail"]
    capsys.readouterr()
    for tool, args in ((evaluate, ["--run", run_dir, "--episodes", "2"]), (export, ["--run", run_dir, "--int8"])):
        assert tool.main(args) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: {line}") and err.endswith("; train with env.backend gymnasium\n"), err
    assert not os.path.exists(os.path.join(run_dir, "policy_int8_L1.mindir"))
