"""env.backend: envpool -- EnvPool's C++ envs behind the gymnasium vector API (the [envpool] extra, in [test])."""
import json
import os
import sys

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
    ("ALE/Breakout-v5", "env.backend: envpool is not used for Atari"),
])
def test_ids_envpool_cannot_run_are_one_line_errors(env_id, culprit):
    from scalebox_ms.envs import make_vec_env

    with pytest.raises(ConfigError, match=culprit) as info:
        make_vec_env(env_id, 2, backend="envpool")
    assert "\n" not in str(info.value)


def test_without_the_extra_the_error_names_it(monkeypatch):
    from scalebox_ms.envs import make_vec_env

    monkeypatch.setitem(sys.modules, "envpool", None)  # import envpool -> ImportError
    with pytest.raises(ConfigError, match=r"env.backend: envpool needs the optional extra: pip install -e \".\[envpool\]\""):
        make_vec_env("CartPole-v1", 2, backend="envpool")


@pytest.mark.parametrize("sets, culprit", [
    ({"env": {"backend": "envpool"}, "sandbox": {"isolation_level": "process"}}, "sandbox.isolation_level"),
    ({"env": {"backend": "envpool", "preprocess": "atari"}}, "env.preprocess"),
])
def test_config_errors(sets, culprit):
    from scalebox_ms import Config

    with pytest.raises(ConfigError, match=culprit):
        Config.from_dict(sets)


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

