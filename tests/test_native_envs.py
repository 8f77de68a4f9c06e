"""Native MindSpore envs vs gymnasium's own envs, teacher-forced (the dynamics are chaotic, so free-running
trajectories in different precisions diverge; from the same state each step must agree)."""
import pickle

import gymnasium as gym
import numpy as np
import pytest

from scalebox_ms.envs.native import SUPPORTED, make_native
from scalebox_ms.sandbox import Sandbox


@pytest.fixture(autouse=True, scope="module")
def _sandbox():
    Sandbox(device="auto", seed=0)


def broad_state(env_id, rng):
    """States all over the state space, so terminal regions and clipping are exercised too."""
    if env_id == "CartPole-v1":
        return rng.uniform([-2.4, -3, -0.21, -3], [2.4, 3, 0.21, 3])
    if env_id.startswith("MountainCar"):
        return rng.uniform([-1.2, -0.07], [0.6, 0.07])
    if env_id == "Acrobot-v1":
        return rng.uniform([-np.pi, -np.pi, -4 * np.pi, -9 * np.pi], [np.pi, np.pi, 4 * np.pi, 9 * np.pi])
    return rng.uniform([-np.pi, -8], [np.pi, 8])  # Pendulum


def time_limit(env):
    while not isinstance(env, gym.wrappers.TimeLimit):
        env = env.env
    return env


# float32 RK4 at Acrobot's velocity limits differs from float64 by up to ~3e-3 (numpy float32 shows the same)
ATOL = {"Acrobot-v1": 5e-3}


@pytest.mark.parametrize("env_id", SUPPORTED)
def test_teacher_forced_steps_match_gymnasium(env_id, n=2500, batch=500):
    """``n`` transitions of gymnasium's env (state, elapsed steps, action -> obs, reward, term, trunc), replayed by
    the native env ``batch`` at a time: each of its envs is set to one recorded state and steps once."""
    ref = gym.make(env_id)
    rng = np.random.default_rng(1)
    ref.reset(seed=1)
    ref.action_space.seed(1)
    limit = time_limit(ref)
    t, rows = 0, []
    for i in range(n):
        if i % 7 == 3:  # jump somewhere else in the state space
            ref.unwrapped.state = broad_state(env_id, rng)
        if i % 53 == 17:  # and close to the time limit
            t = limit._elapsed_steps = limit._max_episode_steps - 1
        state = np.array(ref.unwrapped.state, np.float64)
        a = ref.action_space.sample()
        obs, rew, term, trunc, _ = ref.step(a)
        rows.append((state, t, a, obs, rew, term, trunc))
        t += 1
        if term or trunc:
            ref.reset()
            t = 0
    # the termination rule on the observation (what the EnvPool backend restores a lost flag with) is gymnasium's
    from scalebox_ms.envs.native.dynamics import DYNAMICS

    observed = np.array([r[3] for r in rows], np.float32)
    np.testing.assert_array_equal(DYNAMICS[env_id]().terminal(observed), np.array([r[5] for r in rows], bool))
    native = make_native(env_id, batch)
    for b0 in range(0, n, batch):
        state, steps, actions, obs, rew, term, trunc = (np.array(c) for c in zip(*rows[b0:b0 + batch]))
        native.set_state(state, steps=steps)
        nobs, nrew, nterm, ntrunc, _ = native.step(actions)
        for j in range(batch):
            np.testing.assert_allclose(nobs[j], obs[j], rtol=1e-5, atol=ATOL.get(env_id, 2e-5),
                                       err_msg=f"step {b0 + j}")
            assert nrew[j] == pytest.approx(rew[j], rel=1e-5, abs=1e-5), b0 + j
        np.testing.assert_array_equal(nterm.astype(bool), term)
        np.testing.assert_array_equal(ntrunc.astype(bool), trunc)
    assert sum(r[5] for r in rows) > 0 or env_id == "Pendulum-v1", "terminations must be exercised"
    assert sum(r[6] for r in rows) > 0, "truncations must be exercised"


def test_spaces_are_gymnasiums():
    for env_id in SUPPORTED:
        native, ref = make_native(env_id, 3), gym.make(env_id)
        assert native.single_observation_space == ref.observation_space
        assert native.single_action_space == ref.action_space


def test_time_limit_and_next_step_autoreset():
    env = make_native("Pendulum-v1", 2)
    obs, _ = env.reset(seed=3)
    assert obs.shape == (2, 3)
    for t in range(1, 201):
        obs, rew, term, trunc, _ = env.step(np.zeros((2, 1), np.float32))
        assert not term.any() and trunc.all() == (t == 200)
    obs, rew, term, trunc, _ = env.step(np.zeros((2, 1), np.float32))  # autoreset step
    assert (rew == 0).all() and not term.any() and not trunc.any()
    assert np.all(np.abs(np.arctan2(obs[:, 1], obs[:, 0])) <= np.pi) and np.all(np.abs(obs[:, 2]) <= 1)


def test_reset_is_seeded_and_pickle_resumes_mid_episode():
    a, b = make_native("CartPole-v1", 4), make_native("CartPole-v1", 4)
    np.testing.assert_array_equal(a.reset(seed=7)[0], b.reset(seed=7)[0])
    assert not np.array_equal(a.reset(seed=7)[0], b.reset(seed=8)[0])
    a.reset(seed=7)
    for _ in range(30):
        a.step(np.ones(4, np.int64))
    c = pickle.loads(pickle.dumps(a))
    for _ in range(30):
        ra, rc = a.step(np.zeros(4, np.int64)), c.step(np.zeros(4, np.int64))
        for x, y in zip(ra[:4], rc[:4]):
            np.testing.assert_array_equal(x, y)


@pytest.mark.integration
def test_native_backend_trains_resumes_and_evaluates_on_gymnasium(tmp_path):
    import json

    from conftest import run_module

    common = ["--set", "env.backend=native", "--set", "env.num_envs=4", "--set", "ppo.n_steps=16",
              "--set", "ppo.batch_size=32", "--set", "ppo.n_epochs=2", "--set", "run.eval_episodes=0",
              "--no-progress", "--total-steps", 512]
    full = run_module("train", *common, "--run-dir", tmp_path / "full")
    half = run_module("train", *common, "--until", 256, "--run-dir", tmp_path / "half")
    assert full.returncode == 0 and half.returncode == 0, full.stderr[-1500:] + half.stderr[-1500:]
    resumed = run_module("train", "--resume", tmp_path / "half", "--no-progress")
    assert resumed.returncode == 0, resumed.stderr[-1500:]
    assert json.loads(resumed.stdout)["param_sha256"] == json.loads(full.stdout)["param_sha256"]
    # the preset's update_kernel: auto -> compiled rollout + the C++ update: 2 calls per iteration
    summary = json.loads(full.stdout)
    assert summary["update_kernel"] == "PPOUpdateKernel" and summary["graph_calls_per_iteration"] == 2
    ev = run_module("evaluate", "--run", tmp_path / "full", "--episodes", 3, "--json")  # gymnasium's env
    assert ev.returncode == 0 and json.loads(ev.stdout)["episodes"] == 3


@pytest.mark.parametrize("sets, culprit", [
    ({"env": {"backend": "native", "id": "LunarLander-v3"}}, "native has no 'LunarLander-v3'"),
    ({"env": {"backend": "native", "id": "Pendulum-v1", "kwargs": {"g": 9.0}}}, "env.kwargs: not supported"),
    ({"env": {"backend": "native"}, "sandbox": {"isolation_level": "process"}}, "sandbox.isolation_level"),
    ({"env": {"backend": "jax"}}, "env.backend: 'jax' is not one of"),
])
def test_native_backend_config_errors(sets, culprit):
    from scalebox_ms import Config, ConfigError

    with pytest.raises(ConfigError, match=culprit.replace("(", r"\(").replace(")", r"\)")):
        Config.from_dict(sets)


@pytest.mark.parametrize("env_id, extra, act_kernel", [
    ("CartPole-v1", {}, "builtin"), ("CartPole-v1", {}, "custom"), ("Pendulum-v1", {"normalize_reward": True}, "builtin"),
    ("MountainCarContinuous-v0", {}, "custom")])  # (MountainCar: the reward uses the clipped action)
def test_compiled_rollout_equals_the_step_by_step_loop(env_id, extra, act_kernel):
    """One graph call for the whole rollout gives the same rollouts, so the same parameters, as T calls; with
    ``policy.act_kernel: custom`` the loop acts with the C++ kernel as the step-by-step path does, bit for bit."""
    from conftest import small_config
    from scalebox_ms.trainers import Callback, PPOTrainer

    class Keep(Callback):
        def __init__(self):
            self.rows = []

        def on_iteration_end(self, trainer, metrics):
            self.rows.append({k: metrics[k] for k in ("episode_return_mean", "episodes", "loss")})

    runs = []
    for compiled in (True, False):
        cfg = small_config(env={"id": env_id, "backend": "native", "num_envs": 4, "compiled_rollout": compiled,
                                **extra}, ppo={"n_steps": 32, "batch_size": 32}, policy={"act_kernel": act_kernel})
        tr, keep = PPOTrainer(cfg), Keep()
        tr.learn(until=256, callbacks=[keep])
        assert tr._compiled_rollout == compiled
        if compiled:
            assert tr.collector._rollout_cell.act_kernel == act_kernel
        runs.append((tr.parameters_sha256(), keep.rows, tr.env.state))
        tr.close()
    (h1, rows1, s1), (h2, rows2, s2) = runs
    np.testing.assert_array_equal(s1, s2)
    assert repr(rows1) == repr(rows2)  # repr: nan (no episode finished yet) equals nan
    assert h1 == h2


@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_compiled_runs_count_each_returned_observation_once_in_the_statistics(algo, monkeypatch):
    """With env.normalize_obs a compiled rollout (PPO) or training phase (DQN) updated the statistics with the
    observations its steps acted on: its first one, already counted at the reset (or as the previous run's last),
    twice, and its last one never. Now they get what the steps returned, as the step loop does: the reset batch, then
    per run T x N rows that end with the observation the next run starts from."""
    from conftest import small_config
    from scalebox_ms import Config
    from scalebox_ms.trainers import Callback, checkpoint, make_trainer

    monkeypatch.setattr(checkpoint, "OFFPOLICY_ITERATION_STEPS", 8)  # (DQN: one phase of 4 steps x 2 envs each)
    if algo == "ppo":
        cfg = small_config(env={"id": "CartPole-v1", "backend": "native", "num_envs": 2, "normalize_obs": True},
                           ppo={"n_steps": 4, "batch_size": 8})
    else:
        cfg = Config.from_dict({"algo": "dqn", "env": {"id": "CartPole-v1", "backend": "native", "num_envs": 2,
                                                       "normalize_obs": True},
                                "policy": {"pi_layers": [8], "vf_layers": [8]},
                                "dqn": {"train_freq": 4, "gradient_steps": 1, "learning_starts": 0, "batch_size": 4,
                                        "buffer_size": 100}, "run": {"total_steps": 1000}})
    tr = make_trainer(cfg)
    rms = tr.collector.obs_normalizer.rms
    batches, starts = [], []
    update = rms.update
    rms.update = lambda rows: (batches.append(np.array(rows)), update(rows))[1]

    class Start(Callback):  # (the observation the next run starts from: the collector's, raw)
        def on_iteration_end(self, trainer, metrics):
            starts.append(np.array(trainer.collector.raw_obs))

    try:
        tr.learn(until=24, callbacks=[Start()])
    finally:
        tr.close()
    assert [b.shape[0] for b in batches] == [2, 8, 8, 8]  # the reset's 2 rows, then 4 steps x 2 envs per run
    for k in range(1, 4):
        np.testing.assert_array_equal(batches[k][-2:], starts[k - 1])  # ends with the next run's start ...
        assert not np.array_equal(batches[k][:2], batches[k - 1][-2:])  # ... which that run does not count again
