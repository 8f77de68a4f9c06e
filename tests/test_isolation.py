"""Sandbox isolation: env workers that crash, hang or overrun their memory are restarted, not fatal."""
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from conftest import REPO, small_config
from scalebox_ms import ConfigError, ScaleboxError
from scalebox_ms.config import parse_bytes
from scalebox_ms.envs import IsolatedVectorEnv

TESTS = os.path.dirname(os.path.abspath(__file__))
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)


def drive(env, steps=12):
    env.reset(seed=0)
    flags = []
    for _ in range(steps):
        obs, rew, term, trunc, _ = env.step(np.zeros(env.num_envs, np.int64))
        assert obs.shape == (env.num_envs, 4)
        flags.append((term.copy(), trunc.copy(), rew.copy()))
    return flags


@pytest.mark.parametrize("env_id, kind, kwargs", [
    ("faulty_envs:CrashingCartPole-v0", "crash", {}),
    ("faulty_envs:RaisingCartPole-v0", "crash", {}),
    ("faulty_envs:HangingCartPole-v0", "timeout", {"step_timeout": 2.0}),
    ("faulty_envs:MemoryHogCartPole-v0", "memory", {"memory_limit_bytes": 1 * 2**30}),
])
def test_faulty_worker_is_restarted_and_its_episode_truncated(env_id, kind, kwargs):
    env = IsolatedVectorEnv(env_id, 2, **kwargs)
    try:
        flags = drive(env, steps=9)  # a restarted worker would fault again at its own 5th step (step 11)
        # both workers fault at their 5th step: truncated, reward 0, then the NEXT_STEP autoreset step
        term, trunc, rew = flags[4]
        assert trunc.all() and not term.any() and (rew == 0).all()
        assert {e["kind"] for e in env.events} == {kind} and len(env.events) == 2
        assert all(w.proc.is_alive() for w in env._workers)  # fresh workers carry on
        assert all(f[2].all() for f in flags[6:9])  # normal rewards again after the restart
    finally:
        env.close()


def test_restart_warnings_number_envs_as_the_run_does_under_data_parallelism(caplog):
    """Rank 1 of 2 (2 envs each) warned 'isolated env 0' for the run's env 2, which its non-finite errors name so."""
    from scalebox_ms.trainers.collector import RolloutCollector

    cfg = small_config(env={"id": "faulty_envs:CrashingCartPole-v0", "num_envs": 4}, parallel={"workers": 2},
                       sandbox={"isolation_level": "process"})
    c = RolloutCollector(cfg, np.random.default_rng(0), 2, rank=1)
    try:
        with caplog.at_level("WARNING", logger="scalebox_ms"):
            drive(c.env, steps=6)
        warned = sorted(int(r.getMessage().split()[3]) for r in caplog.records if "worker restarted" in r.getMessage())
        assert warned == [2, 3]
        assert sorted(e["env"] for e in c.env.events) == [0, 1]  # (the env's own indices, as evaluation reads them)
    finally:
        c.close()


def test_workers_hanging_on_the_same_step_are_all_timed_out_within_one_step_timeout():
    """Each hung worker was polled with a fresh step_timeout after the previous one's: N workers hanging on one
    step held it N x step_timeout (and a Ctrl-C's iteration end with it)."""
    env = IsolatedVectorEnv("faulty_envs:HangingCartPole-v0", 3, step_timeout=2.0)
    try:
        env.reset(seed=0)
        for _ in range(4):
            env.step(np.zeros(3, np.int64))
        t0 = time.monotonic()
        _, _, _, trunc, _ = env.step(np.zeros(3, np.int64))  # every worker's 5th step hangs
        took = time.monotonic() - t0
        assert trunc.all() and [e["kind"] for e in env.events] == ["timeout"] * 3
        assert took < 4.5, took  # one step_timeout of 2 s (and the restarts), not three (6 s)
    finally:
        env.close()


def test_isolated_env_matches_gymnasium_sync_vector_env_without_faults():
    import gymnasium as gym

    a = IsolatedVectorEnv("CartPole-v1", 2)
    b = gym.make_vec("CartPole-v1", 2, vectorization_mode="sync")  # also seeds sub-env i with seed + i
    try:
        oa, _ = a.reset(seed=5)
        ob, _ = b.reset(seed=5)
        np.testing.assert_array_equal(oa, ob)
        ends = 0
        for _ in range(60):  # several episodes: the autoresets go on with the envs' own RNG, as gymnasium's do (a
            act = np.array([0, 1])  # seed drawn for every autoreset made ale-py's EpisodicLife restart the game)
            ra, rb = a.step(act), b.step(act)
            np.testing.assert_allclose(ra[0], rb[0], rtol=1e-6)
            assert (ra[2] == rb[2]).all() and (ra[3] == rb[3]).all()
            ends += int(ra[2].sum() + ra[3].sum())
        assert ends >= 4
    finally:
        a.close(), b.close()


def test_trainer_survives_crashing_envs_and_logs_restarts(tmp_path):
    from scalebox_ms.trainers import PPOTrainer

    cfg = small_config(env={"id": "faulty_envs:CrashingCartPole-v0", "num_envs": 2}, ppo={"batch_size": 16},
                       sandbox={"isolation_level": "strict", "worker_memory_limit": "1GB"}, run={"total_steps": 64})
    tr = PPOTrainer(cfg)
    assert tr.sandbox.worker_memory_limit_bytes == 2**30 and tr.sandbox.deterministic
    tr.learn()
    assert tr.global_step == 64 and tr._last_metrics["env_restarts"] >= 2
    tr.close()


def test_worker_restarts_are_counted_across_a_checkpoint(tmp_path):
    """summary.json's env_events and metrics' env_restarts covered only the session since the last resume (the
    count went back to 0 in metrics.csv), while episodes and evaluations were carried over."""
    from scalebox_ms.trainers import PPOTrainer

    cfg = small_config(env={"id": "faulty_envs:CrashingCartPole-v0", "num_envs": 2}, ppo={"batch_size": 16},
                       sandbox={"isolation_level": "process"}, run={"total_steps": 128})
    tr = PPOTrainer(cfg)
    tr.learn(until=64)
    before = list(tr.env.events)
    assert len(before) >= 2
    tr.save(str(tmp_path / "ck"))
    tr.close()
    tr = PPOTrainer(cfg)
    tr.load(str(tmp_path / "ck"))
    assert tr.env.events[:len(before)] == before
    tr.learn()
    assert tr._last_metrics["env_restarts"] == len(tr.env.events) > len(before)  # (the fresh workers crash again)
    tr.close()


def test_a_restarted_workers_step_is_no_transition_for_ppo_or_the_replay_buffer(monkeypatch):
    """A worker restart is reported as a truncated step with reward 0 and the previous observation: no transition
    the env made. PPO trained on it (bootstrapping from the same observation) and DQN/SAC/TD3 stored it in the replay
    buffer as (s, a, 0, s, not terminated). CartPole pays 1 at every real step."""
    import scalebox_ms.buffers as buffers
    from scalebox_ms.config import Config
    from scalebox_ms.trainers import PPOTrainer, make_trainer

    seen, real_gae = [], buffers.compute_gae

    def gae(rewards, values, last_values, terminated, truncated, valid, *args):
        seen.append((rewards.copy(), truncated.copy(), valid.copy()))
        return real_gae(rewards, values, last_values, terminated, truncated, valid, *args)

    monkeypatch.setattr(buffers, "compute_gae", gae)  # (the trainer imports it from there on each iteration)
    tr = PPOTrainer(small_config(env={"id": "faulty_envs:CrashingCartPole-v0", "num_envs": 2},
                                 ppo={"batch_size": 16}, sandbox={"isolation_level": "process"}))
    try:
        tr.learn(until=32)  # one rollout of 16 steps: both workers crash at their 5th step (and fresh ones at theirs)
        rewards, truncated, valid = seen[0]
        assert truncated.sum() >= 4 and not valid[truncated].any()  # the restart steps (no real truncation here)
        assert (rewards[valid] == 1.0).all()
        assert tr.collector.episodes == 0  # (the fragments cut by restarts are no episodes, as in evaluation)
    finally:
        tr.close()
    # nor does its repeated observation count in env.normalize_obs' statistics (PPO and the off-policy collector)
    for algo in ("ppo", "dqn"):
        cfg = Config.from_dict({"algo": algo, "env": {"id": "faulty_envs:CrashingCartPole-v0", "num_envs": 2,
                                                      "normalize_obs": True},
                                "sandbox": {"isolation_level": "process"}, "run": {"total_steps": 64, "progress": False},
                                **({"ppo": {"n_steps": 16, "batch_size": 16}} if algo == "ppo" else
                                   {"dqn": {"train_freq": 16, "learning_starts": 1000, "buffer_size": 1000}})})
        tr = make_trainer(cfg)
        try:
            tr.learn(until=0)  # (the first reset's observations)
            before = tr.collector.obs_normalizer.rms.count
            tr.learn(until=32)  # 16 steps of 2 envs: one PPO rollout, one off-policy training phase
            assert tr.global_step == 32
            restarts = len(tr.env.events)
            assert restarts >= 4, algo
            assert tr.collector.obs_normalizer.rms.count - before == pytest.approx(32 - restarts), algo
        finally:
            tr.close()
    # an env of one's own whose info happens to carry such a key is not taken for restarted (in-process envs never are)
    import gymnasium as gym
    from gymnasium.envs.classic_control.cartpole import CartPoleEnv

    class Infos(CartPoleEnv):
        def step(self, action):
            obs, reward, terminated, truncated, _ = super().step(action)
            return obs, reward, terminated, truncated, {"env_restart": True, "restarted": True}

    if "InfoCartPole-v0" not in gym.registry:
        gym.register("InfoCartPole-v0", entry_point=Infos, max_episode_steps=500)
    seen.clear()
    plain = PPOTrainer(small_config(env={"id": "InfoCartPole-v0", "num_envs": 2}, ppo={"batch_size": 16}))
    try:
        plain.learn(until=32)
        assert seen[0][2].sum() >= 30  # (all valid but autoreset steps after an episode's end)
    finally:
        plain.close()
    cfg = Config.from_dict({"algo": "dqn", "env": {"id": "faulty_envs:CrashingCartPole-v0", "num_envs": 2},
                            "dqn": {"train_freq": 16, "gradient_steps": 1, "batch_size": 16, "learning_starts": 1000,
                                    "buffer_size": 1000},
                            "sandbox": {"isolation_level": "process"}, "run": {"total_steps": 2000, "progress": False}})
    dqn = make_trainer(cfg)
    try:
        dqn.learn(until=64)
        arrays = dqn.replay.state_dict()
        n = len(dqn.replay)
        assert dqn._last_metrics["env_restarts"] >= 2 and 0 < n < 64
        assert (np.asarray(arrays["reward"])[:n] == 1.0).all()
    finally:
        dqn.close()


def test_memory_limit_parsing_and_rss_watch():
    assert parse_bytes("512MB", "k") == 512 * 2**20 and parse_bytes("1.5G", "k") == int(1.5 * 2**30)
    assert parse_bytes(1073741824, "k") == 2**30
    assert small_config(sandbox={"memory_limit": 2**33}).sandbox.memory_limit == 2**33
    for bad in ("lots", "-1GB", "12XB", "0", "0.5B"):
        with pytest.raises(ConfigError, match="expected a size"):
            parse_bytes(bad, "sandbox.memory_limit")
    with pytest.raises(ConfigError, match="worker_memory_limit"):
        small_config(sandbox={"worker_memory_limit": "10MB"})
    from scalebox_ms.trainers import PPOTrainer

    tr = PPOTrainer(small_config())
    tr.sandbox.memory_limit_bytes = 50 * 2**20  # far below MindSpore's own footprint
    with pytest.raises(ScaleboxError, match="sandbox.memory_limit"):
        tr.learn()
    tr.close()


def test_peak_rss_is_the_processs_own_not_its_parents():
    """summary.json's peak_rss_mb: a run started by a large process (a test runner, a notebook) reports its own peak
    (getrusage's ru_maxrss would report the parent's: Linux carries it over exec)."""
    from scalebox_ms.sandbox import current_rss_bytes, peak_rss_bytes

    ballast = np.ones(96 * 2**20)  # 768 MB of touched pages in this (the parent) process
    assert current_rss_bytes() <= peak_rss_bytes() and peak_rss_bytes() > ballast.nbytes
    code = "from scalebox_ms.sandbox import peak_rss_bytes; print(peak_rss_bytes())"
    child = int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert 0 < child < ballast.nbytes // 4
    del ballast


def test_conflicting_sandbox_is_refused():
    from scalebox_ms.sandbox import Sandbox

    Sandbox(device="auto")
    with pytest.raises(ConfigError, match="conflicts"):
        Sandbox(device="cpu", threads=1)
    with pytest.raises(ConfigError, match="not available"):
        Sandbox(device="ascend")
    # on CPU, memory_limit (this Sandbox's own check of rollout sizes) and device_id (unused) may differ
    if Sandbox(device="auto").device == "CPU":
        assert Sandbox(device="auto", memory_limit="1GB", device_id=1).memory_limit_bytes == 2**30
    else:  # (on GPU/Ascend they are MindSpore's per process)
        with pytest.raises(ConfigError, match="conflicts"):
            Sandbox(device="auto", memory_limit="1GB", device_id=1)


def test_a_cpu_thread_count_the_user_set_before_is_a_config_error():
    """MindSpore refuses to set its CPU thread count twice: a raw RuntimeError from deep in the Sandbox."""
    code = textwrap.dedent("""\
        import mindspore as ms
        ms.device_context.cpu.op_tuning.threads_num(1)
        from scalebox_ms import ConfigError
        from scalebox_ms.sandbox import Sandbox
        try:
            Sandbox(threads=2)
        except ConfigError as exc:
            print(exc)
        """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": REPO}).stdout.strip().splitlines()
    assert out and out[-1].startswith("sandbox.threads: 2: MindSpore's CPU thread count was set before in this "
                                      "process and cannot be set again"), out


def test_workers_inherit_no_file_descriptors(tmp_path):
    secret = open(tmp_path / "parent-only.txt", "w")
    env = IsolatedVectorEnv("CartPole-v1", 1)
    try:
        pid = env._workers[0].proc.pid
        targets = []
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                targets.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
            except OSError:
                pass
        assert str(tmp_path / "parent-only.txt") not in targets
        assert not any(t.endswith(".ckpt") or "parent-only" in t for t in targets)
    finally:
        env.close()
        secret.close()


@pytest.mark.integration
def test_cli_honours_sandbox_section(tmp_path):
    import json

    from conftest import run_module

    run_dir = tmp_path / "run"
    r = run_module("train", "--total-steps", 64, "--run-dir", run_dir, "--no-progress", "--set", "env.num_envs=2",
                   "--set", "ppo.n_steps=32", "--set", "ppo.batch_size=32", "--set", "run.eval_episodes=0",
                   "--set", "sandbox.isolation_level=process", "--set", "sandbox.memory_limit=8GB")
    assert r.returncode == 0, r.stderr[-2000:]
    env = json.loads((run_dir / "environment.json").read_text())
    assert "isolation_level='process'" in env["sandbox"] and env["packages"]["mindspore"].startswith("2.10")
    assert json.loads(r.stdout)["env_events"] == []


def test_autoreset_seeds_follow_the_reset_seed():
    """Episodes after the first differ between run seeds (and repeat for the same seed)."""
    def second_episode_start(seed):
        env = IsolatedVectorEnv("CartPole-v1", 1)
        try:
            env.reset(seed=seed)
            while True:
                obs, _, term, trunc, _ = env.step(np.zeros(1, np.int64))
                if term[0] or trunc[0]:
                    return env.step(np.zeros(1, np.int64))[0]  # the autoreset observation
        finally:
            env.close()

    a, b, c = second_episode_start(0), second_episode_start(123), second_episode_start(0)
    assert not np.array_equal(a, b) and np.array_equal(a, c)


def test_env_that_cannot_reset_stops_with_a_clear_error():
    from faulty_envs import FaultyCartPole  # noqa: F401  (registers the ids in this process too)

    env = IsolatedVectorEnv("faulty_envs:ResetCrashingCartPole-v0", 2)
    try:
        with pytest.raises(ScaleboxError, match="failed to reset 3 times"):
            env.reset(seed=0)
        assert len(env.events) >= 3
    finally:
        env.close()


def test_an_env_whose_every_step_fails_stops_with_a_clear_error():
    """Its workers were restarted forever: a run "completed" with 0 episodes, having learned nothing."""
    from faulty_envs import FaultyCartPole  # noqa: F401  (registers the ids in this process too)

    env = IsolatedVectorEnv("faulty_envs:RaisingCartPole-v0", 2, {"at": 1})
    try:
        env.reset(seed=0)
        with pytest.raises(ScaleboxError, match=r"^env 'faulty_envs:RaisingCartPole-v0': sub-env\(s\) \[0, 1\] "
                                                r"failed to step 3 times in fresh workers \(crash: ValueError: env bug"):
            for _ in range(10):  # (a failed step, then the fresh worker's reset step, then its first step again)
                env.step(np.zeros(2, np.int64))
        assert len(env.events) == 6
    finally:
        env.close()


def test_info_values_a_worker_cannot_pickle_are_left_out():
    """Every step failed to reach the parent (TypeError: cannot pickle '_thread.lock' object): 8 steps/s of
    restarts."""
    from faulty_envs import FaultyCartPole  # noqa: F401

    env = IsolatedVectorEnv("faulty_envs:LockInfoCartPole-v0", 2)
    try:
        env.reset(seed=0)
        for _ in range(3):
            _, _, _, _, info = env.step(np.zeros(2, np.int64))
        assert env.events == [] and "lock" not in info and list(info["plain"]) == [7, 7]
    finally:
        env.close()


def test_a_hanging_reset_gets_step_timeout_not_the_start_timeout():
    """A reset that hangs used to be waited for 60 s (the worker start's timeout) per attempt, whatever
    sandbox.step_timeout said: 3 minutes per env before the one-line error. A fresh worker gets the start timeout
    to build its env, then step_timeout for the reset."""
    from faulty_envs import FaultyCartPole  # noqa: F401  (registers the ids in this process too)

    env = IsolatedVectorEnv("faulty_envs:ResetHangingCartPole-v0", 1, step_timeout=1.0)
    try:
        with pytest.raises(ScaleboxError, match="failed to reset 3 times"):
            env.reset(seed=0)
        assert [e["detail"] for e in env.events] == ["no answer to 'reset' within 1 s"] * 3
    finally:
        env.close()


def test_worker_start_failure_is_a_config_error():
    from scalebox_ms.envs import make_vec_env

    with pytest.raises(ConfigError, match="ResetCrashingCartPole-v0' with env.kwargs={} cannot reset .*failed to "
                                          "reset"):
        make_vec_env("faulty_envs:ResetCrashingCartPole-v0", 1, isolation="process")


def test_an_env_whose_close_raises_too_leaves_the_reset_error():
    """A close() that raised in the error path replaced the one-line ConfigError with its own traceback."""
    from scalebox_ms.envs import make_vec_env

    with pytest.raises(ConfigError, match=r"ResetAndCloseRaisingCartPole-v0' with env.kwargs=\{\} cannot reset "
                                          r"\(RuntimeError: reset boom\)"):
        make_vec_env("faulty_envs:ResetAndCloseRaisingCartPole-v0", 1)


def isolated_trainer(env_id, env_kwargs=None, **sandbox):
    from scalebox_ms.trainers import PPOTrainer

    cfg = small_config(env={"id": env_id, "num_envs": 2, "kwargs": env_kwargs or {}},
                       sandbox={"isolation_level": "process", **sandbox})
    return PPOTrainer(cfg)


@pytest.mark.parametrize("fault, kind, sandbox", [
    ("Crashing", "crash", {}),
    ("Raising", "crash", {}),
    ("Hanging", "timeout", {"step_timeout": 1.0}),
])
def test_evaluation_survives_a_faulty_env_and_replays_the_spoilt_episode(tmp_path, fault, kind, sandbox):
    from scalebox_ms.trainers.evaluation import evaluate_policy

    # the eval worker that first reaches its 5th step faults, once: one spoilt episode
    tr = isolated_trainer(f"faulty_envs:{fault}CartPole-v0", {"once": str(tmp_path / "fired")}, **sandbox)
    try:
        rets = evaluate_policy(tr, episodes=4, seed=1)
        assert (tmp_path / "fired").exists()
        assert [e["kind"] for e in rets.env_events] == [kind] and rets.replayed == 1
        # four whole episodes: the fragment cut at the 4th eval step (return < 4) is not among them
        assert len(rets) == 4 and min(rets) >= 8, list(rets)
        assert isinstance(rets, list) and all(isinstance(r, float) for r in rets)
    finally:
        tr.close()


def test_evaluation_gives_up_after_one_restart_per_episode(tmp_path):
    from scalebox_ms.trainers.evaluation import EvaluationError, evaluate_policy

    tr = isolated_trainer("faulty_envs:CrashingCartPole-v0")  # every worker crashes at its 5th step
    try:
        with pytest.raises(EvaluationError, match=r"evaluation of 'faulty_envs:CrashingCartPole-v0': 4 env worker "
                                                  r"restarts, more than the 2 allowed \(0 of 2 episodes done\); "
                                                  r"last: crash: worker process died") as info:
            evaluate_policy(tr, episodes=2, seed=1)
        assert len(str(info.value).splitlines()) == 1
        assert info.value.returns == [] and len(info.value.env_events) == 4
        assert isinstance(info.value, ScaleboxError)  # the CLIs print it as one line and exit 2
    finally:
        tr.close()


def test_evaluation_without_isolation_reports_no_restarts():
    from scalebox_ms.trainers import PPOTrainer
    from scalebox_ms.trainers.evaluation import evaluate_policy

    tr = PPOTrainer(small_config())
    try:
        rets = evaluate_policy(tr, episodes=3, seed=1)
        assert len(rets) == 3 and rets.env_events == [] and rets.replayed == 0
        assert type(tr.env).__name__ != "IsolatedVectorEnv"
    finally:
        tr.close()


def test_int8_calibration_runs_in_isolated_workers_too():
    from scalebox_ms.quant import collect_calibration_data

    tr = isolated_trainer("faulty_envs:CrashingCartPole-v0")  # every worker crashes at its 5th step
    try:
        data = collect_calibration_data(tr, 24)
        assert data.shape == (24, 4) and np.isfinite(data).all()
    finally:
        tr.close()


def test_a_script_without_a_main_guard_is_told_why_its_isolated_workers_die(tmp_path):
    """Spawned env workers import the main module: a script that builds its trainer at the top level made every
    worker fail at start-up, and the error (wrapped twice: "cannot create ... (env.id: ... cannot start ...)") only
    suggested the memory limit and step timeout."""
    script = tmp_path / "noguard.py"
    script.write_text(textwrap.dedent("""\
        from scalebox_ms import Config
        from scalebox_ms.trainers import PPOTrainer
        PPOTrainer(Config.from_dict({"env": {"num_envs": 1}, "sandbox": {"isolation_level": "process"}}))
        """))
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=str(tmp_path),
                       env={**os.environ, "PYTHONPATH": REPO})
    last = r.stderr.strip().splitlines()[-1]
    assert r.returncode == 1 and last.startswith("scalebox_ms.errors.ConfigError: env.id: 'CartPole-v1' cannot start "
                                                 "in an isolated worker (crash: "), last
    assert last.endswith("; or, if noguard.py builds the trainer at its top level, put that under 'if __name__ == "
                         "\"__main__\":' (each isolated worker imports the main module)"), last


def test_an_env_registered_in_the_script_only_is_told_to_be_given_as_module_and_id(tmp_path):
    """An env registered under the script's main guard does not exist in the spawned workers: the error suggested
    the memory limit, the step timeout and the main guard it already had."""
    script = tmp_path / "guarded.py"
    script.write_text(textwrap.dedent("""\
        if __name__ == "__main__":
            import gymnasium as gym
            from scalebox_ms import Config
            from scalebox_ms.trainers import PPOTrainer
            gym.register("OnlyHere-v0", entry_point="gymnasium.envs.classic_control.cartpole:CartPoleEnv")
            PPOTrainer(Config.from_dict({"env": {"id": "OnlyHere-v0", "num_envs": 1},
                                         "sandbox": {"isolation_level": "process"}}))
        """))
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=str(tmp_path),
                       env={**os.environ, "PYTHONPATH": REPO})
    last = r.stderr.strip().splitlines()[-1]
    assert r.returncode == 1 and "cannot start in an isolated worker (crash: NameNotFound" in last, last
    assert last.endswith("each worker is a fresh Python process: register the env when a module is imported and "
                         "give env.id as 'module:EnvName-v0' (the worker imports the module)"), last
