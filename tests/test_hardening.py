"""Defects found by a hostile user in the trainer: memory estimate, non-finite data, OOM matching, config copy."""
import logging
import re

import numpy as np
import pytest

from conftest import as_from_a_terminal, run_module, small_config
from scalebox_ms.errors import ConfigError, TrainingError


# ---------------------------------------------------------------------- rollout memory estimated up front
def test_a_rollout_larger_than_memory_is_refused_at_construction():
    from scalebox_ms.trainers import PPOTrainer

    with pytest.raises(ConfigError, match=r"^ppo\.n_steps: .*1000000000000 x 4 .*needs about .* more than"):
        PPOTrainer(small_config(ppo={"n_steps": 10**12, "batch_size": 32}))


@pytest.mark.parametrize("algo", ["ppo", "sac"])
def test_networks_larger_than_memory_are_refused_at_construction(algo):
    """A layer of 10**12 units ended in numpy's MemoryError traceback (14.6 TiB) while the networks were built."""
    from scalebox_ms import Config
    from scalebox_ms.envs.spaces import SpaceSpec
    from scalebox_ms.trainers import make_trainer
    from scalebox_ms.trainers.memory import network_bytes

    env = "CartPole-v1" if algo == "ppo" else "Pendulum-v1"
    cfg = Config.from_dict({"algo": algo, "env": {"id": env, "num_envs": 1}, "policy": {"pi_layers": [10**12]}})
    with pytest.raises(ConfigError, match=r"^policy\.pi_layers/vf_layers: a policy of \[1000000000000\] and a value "
                                          r"net of \[.*\] needs about .* more than"):
        make_trainer(cfg)
    spec = SpaceSpec(obs_dim=4, discrete=True, action_dim=2)
    policy = Config().policy
    assert network_bytes(spec, policy) < 2**20  # (the presets' networks: far below any machine)
    raw_atari = SpaceSpec(obs_dim=3 * 210 * 160, discrete=True, action_dim=4, image_shape=(3, 210, 160))
    policy.pi_layers = policy.vf_layers = [512, 512]  # (the MLPs read the CNN's 512 features, not 100,800 pixels)
    assert network_bytes(raw_atari, policy) == network_bytes(SpaceSpec(obs_dim=512, discrete=True, action_dim=4),
                                                             policy) < 2**26


def test_sandbox_memory_limit_bounds_the_estimate():
    from scalebox_ms.trainers.memory import available_bytes, check_fits

    avail = available_bytes()
    assert avail and avail > 2**20
    check_fits("k.key", "a thing", 2**20)  # fits
    with pytest.raises(ConfigError, match=r"^k\.key: a thing needs about 1\.0 MB .* more than the 512\.0 KB allowed "
                                          r"by sandbox\.memory_limit$"):
        check_fits("k.key", "a thing", 2**20, limit=2**19)
    with pytest.raises(ConfigError, match=r"available on this machine"):
        check_fits("k.key", "a thing", 4 * avail, limit=8 * avail)


@pytest.mark.integration
@pytest.mark.parametrize("n_steps,extra,source", [
    ("1000000000000", [], "available on this machine"),
    ("1e8", [], "available on this machine"),
    ("4194304", ["--set", "sandbox.memory_limit=1GB"], "allowed by sandbox.memory_limit"),  # ~2 GB for 8 envs
])
def test_cli_refuses_a_huge_rollout_in_one_line_and_writes_nothing(tmp_path, n_steps, extra, source):
    run_dir = tmp_path / "run"
    r = run_module("train", "--set", f"ppo.n_steps={n_steps}", *extra, "--run-dir", run_dir, "--no-progress")
    assert r.returncode == 2, r.stderr
    lines = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "ppo.n_steps" in lines[0] and "needs about" in lines[0], r.stderr
    assert source in lines[0], lines[0]
    assert "Traceback" not in r.stderr
    assert not run_dir.exists()


# ---------------------------------------------------------------------- non-finite observations and rewards
@pytest.mark.parametrize("env_id,what", [("nan_envs:NaNObsCartPole-v0", "a non-finite observation"),
                                         ("nan_envs:NaNRewardCartPole-v0", "a non-finite reward"),
                                         ("nan_envs:HugeRewardCartPole-v0", "a reward beyond float32's range")])
def test_non_finite_env_output_stops_the_run_before_the_weights_change(env_id, what):
    """(1e39 is finite in float64, where the check ran, and inf as the float32 the update takes: it got through)"""
    from scalebox_ms.trainers import PPOTrainer

    tr = PPOTrainer(small_config(env={"id": env_id, "num_envs": 4}))
    before = tr.parameters_sha256()
    with pytest.raises(TrainingError, match=rf"env '{env_id}' returned {what} .* at env index \d, step \d+"):
        tr.learn()
    assert tr.parameters_sha256() == before  # the NaN never reached an update
    assert tr.global_step == 0
    tr.close()


def test_a_run_stopped_by_an_error_says_so_in_its_summary(tmp_path, monkeypatch):
    """A run a TrainingError stopped wrote no summary.json (or kept its previous session's 'paused'): a sweep
    reading summaries took it for one still running. The same for any other error (a full disk)."""
    import json

    from scalebox_ms.trainers import metrics_file
    from scalebox_ms.trainers.run import train_run

    run_dir = tmp_path / "run"
    cfg = small_config(env={"id": "nan_envs:NaNObsCartPole-v0", "num_envs": 4})
    with pytest.raises(TrainingError) as e:
        train_run(cfg, run_dir=str(run_dir), progress=False, log=lambda *a: None)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["error"] == str(e.value)
    assert summary["resume_step"] == 0 and summary["env_id"] == "nan_envs:NaNObsCartPole-v0"

    run_dir = tmp_path / "paused"
    cfg = small_config(run={"checkpoint_every": 64, "eval_episodes": 0})
    assert train_run(cfg, run_dir=str(run_dir), until=128, log=lambda *a: None)["status"] == "paused"
    calls = []

    def full_disk(self, trainer, metrics):
        calls.append(1)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(metrics_file.MetricsWriter, "on_iteration_end", full_disk)
    with pytest.raises(OSError):
        train_run(resume=str(run_dir), log=lambda *a: None)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["error"] == "[Errno 28] No space left on device"
    assert summary["resume_step"] == 192  # (the resumed session's first iteration was checkpointed)


def test_an_observation_beyond_float32_is_named_with_its_value():
    """A finite float64 observation of -1e300 was reported as 'a non-finite observation (-inf)', its value once
    cast to float32: the env never returned inf."""
    from scalebox_ms.trainers import PPOTrainer

    tr = PPOTrainer(small_config(env={"id": "nan_envs:HugeObsCartPole-v0", "num_envs": 4}))
    with pytest.raises(TrainingError, match=r"returned an observation beyond float32's range \(-1e\+300\) at env "
                                            r"index \d, step \d+"):
        tr.learn()
    tr.close()


@pytest.mark.parametrize("offset, warned", [(1e8, True), (1e3, False)])
def test_float64_observations_that_float32_rounds_away_are_a_warning(offset, warned, caplog):
    """float64 observations near 1e8 that vary by ~1 reach the policy (and its normalisation) as float32, 8 apart
    there: PPO trained on noise with exit 0 and no word (SB3's VecNormalize subtracts the mean in float64)."""
    import logging

    from scalebox_ms.trainers import PPOTrainer

    cfg = small_config(env={"id": "nan_envs:OffsetObs-v0", "num_envs": 4, "kwargs": {"offset": offset},
                            "normalize_obs": True}, run={"total_steps": 1024})
    tr = PPOTrainer(cfg)
    with caplog.at_level(logging.WARNING, logger="scalebox_ms"):
        tr.learn(until=448)  # (the check takes the first 512 rows: 4 reset rows + 448 env steps are not enough)
        assert not [r for r in caplog.records if "float32" in r.getMessage()]
        tr.learn(until=576)
    lines = [r.getMessage() for r in caplog.records if "float32" in r.getMessage()]
    tr.close()
    if not warned:
        assert lines == []
        return
    assert len(lines) == 1, lines
    assert lines[0].startswith("warning: env 'nan_envs:OffsetObs-v0': observation column 0 (float64) holds values "
                               "near 1e+08 that vary by 0.5")
    assert "(3 such column(s))" in lines[0] and "subtract the offset in the env" in lines[0]


def test_the_float32_resolution_check_copies_what_it_keeps_and_skips_rows_beyond_float32():
    """An env that writes each observation into the same array made every kept row the last one (std 0: never a
    warning); a row beyond float32's range ended in 'rounds them by up to inf' and numpy's overflow warning."""
    import gymnasium as gym

    from scalebox_ms.envs.normalize import Float32Resolution
    from scalebox_ms.envs.obs_encoding import ObsEncoder

    space = gym.spaces.Dict({"pos": gym.spaces.Box(-np.inf, np.inf, (2,), np.float64),
                             "flag": gym.spaces.Discrete(2)})
    check = Float32Resolution(ObsEncoder(space), space, "E-v0")
    lines, rng = [], np.random.default_rng(0)
    buffer = {"pos": np.zeros((1, 2)), "flag": np.zeros(1, np.int64)}
    for i in range(Float32Resolution.ROWS):
        buffer["pos"][:] = 1e8 + rng.uniform(-1, 1, (1, 2))
        if i == Float32Resolution.ROWS - 1:
            buffer["pos"][0, 1] = 1e39
        check.add(buffer, lines.append)
    assert not check.active and len(lines) == 1
    assert lines[0].startswith("warning: env 'E-v0': observation part pos column 0 (float64) holds values near 1e+08")
    assert "(2 such column(s))" in lines[0] and "inf" not in lines[0]


def test_an_env_whose_close_raises_does_not_turn_a_finished_run_into_a_traceback(tmp_path, caplog):
    """train completed and wrote summary.json, then the env's close() error came out as a traceback, exit 1 (and
    hid a one-line step() error that had stopped the run): it is a logged warning now."""
    import logging

    from scalebox_ms.trainers.run import train_run

    cfg = small_config(env={"id": "nan_envs:CloseRaisingCartPole-v0", "num_envs": 2}, run={"eval_episodes": 2})
    with caplog.at_level(logging.WARNING):
        summary = train_run(cfg, run_dir=str(tmp_path / "run"), progress=False, log=lambda *a: None)
    assert summary["status"] == "completed" and summary["eval_episodes"] == 2
    assert any("close() raised RuntimeError: close bug" in r.getMessage() for r in caplog.records)


def test_a_non_finite_observation_during_evaluation_is_an_evaluation_error():
    """predict refuses a NaN observation; coming from the evaluation env it used to escape as a bare ValueError
    (a traceback after training, and no summary.json): it is the evaluation's one-line EvaluationError."""
    from scalebox_ms.trainers import PPOTrainer
    from scalebox_ms.trainers.evaluation import EvaluationError, run_episodes

    tr = PPOTrainer(small_config())
    try:
        with pytest.raises(EvaluationError, match=r"^evaluation of 'nan_envs:NaNObsCartPole-v0': the observation "
                                                  r"at index \d is not finite as float32"):
            run_episodes("nan_envs:NaNObsCartPole-v0", {}, lambda obs: tr.predict(obs), 2, 0, 2)
    finally:
        tr.close()


def _nan_batch(tr, B=64):
    rng = np.random.default_rng(0)
    d = tr.spec.obs_dim
    batch = {"obs": rng.standard_normal((B, d)).astype(np.float32),
             "actions": rng.integers(0, 2, B).astype(np.int32),
             "log_probs": np.full(B, -0.69, np.float32), "values": np.zeros(B, np.float32),
             "advantages": rng.standard_normal(B).astype(np.float32), "returns": np.zeros(B, np.float32),
             "mask": np.ones(B, np.float32)}
    batch["returns"][:] = np.nan  # non-finite value targets: every minibatch loss is NaN
    return batch


@pytest.mark.parametrize("kernel", ["builtin", "custom"])
def test_a_non_finite_loss_skips_the_update_and_repeated_ones_stop_the_run(kernel, kernel_cache):
    import mindspore as ms

    from scalebox_ms.trainers import PPOTrainer
    from scalebox_ms.trainers.update_runner import NONFINITE_LIMIT

    tr = PPOTrainer(small_config(ppo={"update_kernel": kernel, "n_epochs": 2, "batch_size": 32}))
    state = [p.copy() for p in tr._values.snapshot()]
    args = (0.001, 0.2, ms.Tensor(np.float32(np.inf)), ms.Tensor(np.float32(np.inf)), 0)
    stats = tr.runner.run(_nan_batch(tr), *args)
    assert stats["nonfinite_updates"] == stats["minibatch_steps"] == 4 and stats["n_updates"] == 0
    for a, b in zip(state, tr._values.snapshot()):  # weights and Adam state untouched
        np.testing.assert_array_equal(a, b)
    with pytest.raises(TrainingError, match=rf"non-finite in {NONFINITE_LIMIT} consecutive minibatch steps .* lower "
                                            r"ppo.learning_rate, in a new run \(--resume keeps the run's config\)$"):
        for _ in range(NONFINITE_LIMIT):
            tr.runner.run(_nan_batch(tr), *args)
    assert all(np.isfinite(v).all() for v in tr._values.snapshot())
    tr.close()


# ---------------------------------------------------------------------- out-of-memory detection
def test_oom_detection_matches_mindsporess_messages_only():
    from scalebox_ms.trainers.autobatch import is_oom_error

    assert is_oom_error(MemoryError())
    for text in ("Memory not enough: current free memory size[0] is smaller than required size[1048576]",
                 "Device(id:0) memory isn't enough and alloc failed, kernel name: MatMul",
                 "Allocate memory failed, maybe device memory(device id:0) isn't enough",
                 "CUDA out of memory."):
        assert is_oom_error(RuntimeError(text)), text
    for text in ("no room left in the tuple", "zoom factor must be positive", "broom", "memory pool stats: ok"):
        assert not is_oom_error(RuntimeError(text)), text


# ---------------------------------------------------------------------- the caller's config is not mutated
def test_learn_with_total_steps_does_not_change_the_callers_config():
    from scalebox_ms.trainers import PPOTrainer

    cfg = small_config()
    tr = PPOTrainer(cfg)
    tr.learn(total_steps=128)
    assert cfg.run.total_steps == 256 and tr.config.run.total_steps == 128
    assert tr.config is not cfg
    tr.close()


# ---------------------------------------------------------------------- stochastic predict is seeded
def test_stochastic_predict_is_reproducible_per_seed():
    from scalebox_ms.trainers import PPOTrainer

    obs = np.random.default_rng(1).standard_normal((256, 4)).astype(np.float32)
    a = PPOTrainer(small_config()).predict(obs, deterministic=False)
    b = PPOTrainer(small_config()).predict(obs, deterministic=False)
    np.testing.assert_array_equal(a, b)
    tr = PPOTrainer(small_config())
    c = tr.predict(obs, deterministic=False, rng=np.random.default_rng(5))
    d = tr.predict(obs, deterministic=False, rng=np.random.default_rng(5))
    np.testing.assert_array_equal(c, d)
    assert not np.array_equal(c, tr.predict(obs, deterministic=False, rng=np.random.default_rng(6)))


@pytest.mark.parametrize("obs, kwargs, error, message", [
    ([[0, 0, 0, 0], [0, 0, 0]], {}, ValueError, "predict: observation is a ragged nesting of sequences"),
    ("abc", {}, ValueError, "predict: observation must hold numbers, got <U3 values"),
    ({"a": 1}, {}, ValueError, "predict: observation must hold numbers, got object values"),
    (np.full(4, 1 + 2j), {}, ValueError, "predict: observation must hold numbers, got complex128 values"),
    (np.array([0, np.nan, 0, 0]), {}, ValueError, "predict: the observation is not finite as float32 (NaN, "),
    (np.array([[0, 0, 0, 0], [0, np.inf, 0, 0]]), {}, ValueError,
     "predict: the observation at index 1 is not finite as float32"),
    (np.array([1e39, 0, 0, 0]), {}, ValueError, "predict: the observation is not finite as float32 (NaN, infinity, "
                                                "or beyond +-3.4e38)"),
    (np.zeros(4), {"deterministic": "no"}, TypeError, "predict: deterministic must be True or False, got 'no'"),
    (np.zeros(4), {"deterministic": False, "rng": "x"}, TypeError,
     "predict: rng must be a numpy.random.Generator, an int seed >= 0 or None, got str"),
    (np.zeros(4), {"deterministic": False, "rng": -1}, TypeError,
     "predict: rng must be a numpy.random.Generator, an int seed >= 0 or None, got -1"),
])
def test_predict_refuses_bad_input_in_one_line(obs, kwargs, error, message):
    """Each used to be a numpy error from deep inside (or, for NaN/inf and 'no', no error at all)."""
    from scalebox_ms.trainers import PPOTrainer

    tr = PPOTrainer(small_config())
    try:
        with pytest.raises(error, match="^" + re.escape(message)):
            tr.predict(obs, **kwargs)
    finally:
        tr.close()


def test_predict_takes_an_int_seed_as_rng_and_evaluation_an_integer_episode_count():
    from scalebox_ms.trainers import PPOTrainer
    from scalebox_ms.trainers.evaluation import evaluate_policy

    obs = np.random.default_rng(1).standard_normal((256, 4)).astype(np.float32)
    tr = PPOTrainer(small_config())
    try:
        a = tr.predict(obs, deterministic=False, rng=5)
        np.testing.assert_array_equal(a, tr.predict(obs, deterministic=False, rng=np.random.default_rng(5)))
        legacy = tr.predict(obs, deterministic=False, rng=np.random.RandomState(5))  # (duck-typed before: kept)
        np.testing.assert_array_equal(legacy, tr.predict(obs, deterministic=False, rng=np.random.RandomState(5)))
        with pytest.raises(ValueError, match=r"^episodes: must be an integer >= 1, got '3'$"):
            evaluate_policy(tr, episodes="3")
    finally:
        tr.close()


# ---------------------------------------------------------------------- kernel choices are logged
def test_both_auto_kernel_rules_log_their_choice_and_reason(caplog, kernel_cache):
    from scalebox_ms.trainers import PPOTrainer

    with caplog.at_level(logging.INFO, logger="scalebox_ms"):
        PPOTrainer(small_config(ppo={"update_kernel": "auto"}, policy={"act_kernel": "auto"})).close()
        PPOTrainer(small_config(ppo={"update_kernel": "auto", "target_kl": 0.01, "clip_range_vf": 0.2},
                                amp={"level": "O2"}, policy={"act_kernel": "auto"})).close()
    lines = [r.getMessage() for r in caplog.records]
    assert "policy.act_kernel auto: custom (" in "\n".join(lines)
    assert "ppo.update_kernel auto: C++ kernel (" in "\n".join(lines)
    assert any(m.startswith("ppo.update_kernel auto: compiled graph (amp.level O2") for m in lines), lines
    assert any(m.startswith("policy.act_kernel auto: builtin (amp.level O2") for m in lines), lines


def test_stochastic_evaluation_is_reproducible_per_seed():
    from scalebox_ms.trainers import PPOTrainer
    from scalebox_ms.trainers.evaluation import evaluate_policy

    tr = PPOTrainer(small_config())
    runs = [list(evaluate_policy(tr, episodes=6, seed=s, deterministic=False)) for s in (7, 7, 8)]
    tr.close()
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]


# ---------------------------------------------------------------------- an env that raises (not isolated)
@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_an_env_that_raises_mid_training_is_a_one_line_training_error(algo):
    """A bug in a user's env (here ValueError in its step, at its 5th step) stops the run with a TrainingError
    naming the env, the call, the step and the line of the env's code, not a traceback through gymnasium."""
    from scalebox_ms import Config
    from scalebox_ms.trainers import make_trainer

    cfg = (small_config(env={"id": "faulty_envs:RaisingCartPole-v0", "num_envs": 2}, run={"total_steps": 256})
           if algo == "ppo" else
           Config.from_dict({"algo": "dqn", "env": {"id": "faulty_envs:RaisingCartPole-v0", "num_envs": 1},
                             "dqn": {"learning_starts": 0, "buffer_size": 100, "train_freq": 4, "gradient_steps": 1},
                             "run": {"total_steps": 64, "progress": False}}))
    tr = make_trainer(cfg)
    try:
        with pytest.raises(TrainingError) as exc:
            tr.learn()
    finally:
        tr.close()
    message = str(exc.value)
    assert "\n" not in message and isinstance(exc.value.__cause__, ValueError)
    assert re.match(r"env 'faulty_envs:RaisingCartPole-v0': step\(\) raised ValueError at step \d+ "
                    r"\(faulty_envs\.py:\d+ in step\): env bug; the run stops", message), message


def test_an_observation_of_the_wrong_shape_is_explained_not_just_numpys_message():
    """gymnasium's vector env batches observations with numpy, whose error says only 'Output array is the wrong
    shape': the message says what it means."""
    from scalebox_ms.trainers import PPOTrainer

    tr = PPOTrainer(small_config(env={"id": "faulty_envs:WrongShapeCartPole-v0", "num_envs": 2},
                                 run={"total_steps": 256}))
    try:
        with pytest.raises(TrainingError) as exc:
            tr.learn()
    finally:
        tr.close()
    assert re.match(r"env 'faulty_envs:WrongShapeCartPole-v0': step\(\) raised ValueError at step \d+.*: Output array "
                    r"is the wrong shape \(an observation whose shape differs from the env's observation_space\); "
                    r"the run stops", str(exc.value)), exc.value


def test_an_env_that_raises_during_evaluation_is_an_evaluation_error():
    from scalebox_ms.trainers.evaluation import EvaluationError, run_episodes

    with pytest.raises(EvaluationError) as exc:
        run_episodes("faulty_envs:RaisingCartPole-v0", None, lambda obs: np.zeros(len(obs), np.int64), episodes=2)
    assert re.match(r"evaluation of 'faulty_envs:RaisingCartPole-v0': the env raised ValueError "
                    r"\(faulty_envs\.py:\d+ in step\): env bug \(0 of 2 episodes done\)", str(exc.value)), exc.value


# ---------------------------------------------------------------------- the end-of-run evaluation never kills a run
def test_a_run_whose_evaluation_gives_up_still_completes_with_a_summary(tmp_path):
    import json

    from scalebox_ms.trainers.run import train_run

    cfg = small_config(env={"id": "faulty_envs:CrashingCartPole-v0", "num_envs": 2},
                       ppo={"n_steps": 16, "batch_size": 32}, run={"total_steps": 32, "eval_episodes": 2},
                       sandbox={"isolation_level": "process"})
    run_dir = tmp_path / "run"
    summary = train_run(cfg, run_dir=str(run_dir), progress=False, log=lambda s: None)
    on_disk = json.loads((run_dir / "summary.json").read_text())
    assert on_disk["status"] == summary["status"] == "completed"
    assert "CrashingCartPole" in on_disk["eval_error"] and on_disk["eval_episodes"] == 0
    assert on_disk["eval_env_events"] and on_disk["env_events"]  # training survived its crashes too


@pytest.mark.integration
@pytest.mark.parametrize("tool, name", [("evaluate", "SIGINT"), ("export", "SIGINT"), ("evaluate", "SIGTERM")])
def test_ctrl_c_during_evaluate_or_export_is_a_clean_interrupt(tmp_path, tool, name, monkeypatch):
    """MindSpore 2.10 turns SIGINT into SIGTERM while a graph runs; evaluate/export route Ctrl-C around it as
    train does: 'interrupted', exit 130, instead of being killed. SIGTERM (a scheduler's) stops them the same way,
    exit 143 (it killed them without a word)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from conftest import REPO

    tests = os.path.dirname(os.path.abspath(__file__))  # faulty_envs: a CartPole that marks its 5th step
    monkeypatch.setenv("PYTHONPATH", tests + os.pathsep + os.environ.get("PYTHONPATH", ""))
    run_dir = tmp_path / "run"
    r = run_module("train", "--total-steps", 64, "--run-dir", run_dir, "--no-progress", "--set", "env.num_envs=4",
                   "--set", "ppo.n_steps=16", "--set", "ppo.batch_size=32", "--set", "run.eval_episodes=0",
                   "--set", "env.id=faulty_envs:MarkingCartPole-v0")
    assert r.returncode == 0, r.stderr
    args = (["--run", str(run_dir), "--episodes", "1000000"] if tool == "evaluate" else
            ["--run", str(run_dir), "--int8", "--quant-level", "L2", "--calibrate-steps", "1000000"])
    mark = tmp_path / "stepping"
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + tests, FAULTY_ENVS_MARK=str(mark))

    proc = subprocess.Popen([sys.executable, "-m", f"scalebox_ms.{tool}", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=as_from_a_terminal)
    try:
        deadline = time.time() + 120  # imports, trainer, checkpoint: then it steps envs through graph calls
        while not mark.exists() and time.time() < deadline:
            assert proc.poll() is None, proc.communicate()[1][-2000:]
            time.sleep(0.2)
        assert mark.exists(), "the tool never stepped its env"
        time.sleep(1.0)  # well inside the loop of graph calls
        proc.send_signal(getattr(signal, name))
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + getattr(signal, name), (proc.returncode, err[-2000:])
    assert err.strip().splitlines()[-1] == "interrupted"


@pytest.mark.parametrize("signum", [2, 15])
def test_a_signal_while_the_flags_are_parsed_is_a_clean_interrupt(capsys, signum):
    """SIGTERM between stop_at_once_on_termination and the run (the flags' parsing) was a traceback."""
    from scalebox_ms.cli_common import OneLineArgumentParser
    from scalebox_ms.errors import Interrupted

    def signalled(text):
        raise Interrupted(signum) if signum != 2 else KeyboardInterrupt

    p = OneLineArgumentParser("tool")
    p.add_argument("--n", type=signalled)
    try:
        p.parse_args(["--n", "1"])
    except SystemExit as stop:
        code = stop.code
    except KeyboardInterrupt:  # (not raised on: it would stop the test session)
        pytest.fail("the signal escaped parse_args")
    assert code == 128 + signum and capsys.readouterr().err == "interrupted\n"
    assert p.parse_args([]).n is None


@pytest.mark.integration
@pytest.mark.parametrize("nth", [300, 900])
def test_ctrl_c_while_mindspore_is_imported_is_a_clean_interrupt(tmp_path, nth):
    """A Ctrl-C in the ~1.5 s MindSpore takes to import used to interrupt the import half-way; the interpreter then
    aborted on its way out (SIGABRT, exit 134, "Fatal Python error"). Here the CLI's own path (SIGINT routed around
    MindSpore, then import_mindspore) gets SIGINT while the nth of MindSpore's ~1,200 modules is being imported."""
    import os
    import subprocess
    import sys

    from conftest import REPO

    script = tmp_path / "ctrl_c_in_import.py"
    script.write_text(
        "import os, signal, sys\n"
        "from scalebox_ms import import_mindspore, route_sigint_around_mindspore  # (python_api.md's names)\n"
        "from scalebox_ms.cli_common import run_cli\n"
        "route_sigint_around_mindspore()\n"
        "class CtrlC:  # a meta path finder that only watches: SIGINT once, inside MindSpore's import\n"
        "    seen = 0\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.startswith('mindspore.'):\n"
        "            CtrlC.seen += 1\n"
        f"            if CtrlC.seen == {nth}:\n"
        "                os.kill(os.getpid(), signal.SIGINT)\n"
        "        return None\n"
        "sys.meta_path.insert(0, CtrlC())\n"
        "def go():\n"
        "    import_mindspore()\n"
        "    print('not interrupted')\n"
        "sys.exit(run_cli(go))\n")

    r = subprocess.run([sys.executable, str(script)], env=dict(os.environ, PYTHONPATH=REPO),
                       capture_output=True, text=True, timeout=120, preexec_fn=as_from_a_terminal)
    assert r.returncode == 130, r.stderr[-2000:]
    assert r.stderr.strip() == "interrupted" and r.stdout == ""


@pytest.mark.integration
@pytest.mark.parametrize("name, package, nth, sigint", [
    ("SIGINT", "numpy", 5, "default"), ("SIGINT", "numpy", 40, "default"), ("SIGTERM", "numpy", 5, "default"),
    ("SIGTERM", "mindspore", 300, "default"), ("SIGHUP", "mindspore", 900, "default"),
    ("SIGTERM", "mindspore", 300, "ignored")])  # (`train &` from a script: SIGTERM held all the same)
def test_a_signal_while_train_imports_stops_the_run(tmp_path, name, package, nth, sigint):
    """numpy's import (train's first, ~0.1 s after start) lost a KeyboardInterrupt raised inside it: the Ctrl-C was
    ignored and the run trained to the end (exit 0). SIGTERM and SIGHUP before the run's own handlers (its first
    ~2 s) killed train without a word (exit 143/129). Now each is held until the import is done, then stops train
    as Ctrl-C does: 'interrupted', 128 + the signal's number, no run directory (and no SIGABRT from a MindSpore
    import cut half-way; SIGTERM during numpy's import exited 130, and with SIGINT ignored it was not held)."""
    import os
    import signal
    import subprocess
    import sys

    from conftest import REPO

    run_dir = tmp_path / "run"
    script = tmp_path / "signal_in_import.py"
    script.write_text(
        "import os, signal, sys\n"
        + ("signal.signal(signal.SIGINT, signal.SIG_IGN)\n" if sigint == "ignored" else "") +
        "from scalebox_ms.train import main\n"
        "class Signal:  # a meta path finder that only watches: one signal, inside the package's import\n"
        "    seen = 0\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        f"        if name.startswith({package + '.'!r}):\n"
        "            Signal.seen += 1\n"
        f"            if Signal.seen == {nth}:\n"
        f"                os.kill(os.getpid(), signal.{name})\n"
        "        return None\n"
        "sys.meta_path.insert(0, Signal())\n"
        f"sys.argv = ['train', '--total-steps', '64', '--no-progress', '--run-dir', {str(run_dir)!r},\n"
        "            '--set', 'ppo.n_steps=16', '--set', 'ppo.batch_size=32', '--set', 'run.eval_episodes=0']\n"
        "sys.exit(main())\n")

    r = subprocess.run([sys.executable, str(script)], env=dict(os.environ, PYTHONPATH=REPO), cwd=tmp_path,
                       capture_output=True, text=True, timeout=300, preexec_fn=as_from_a_terminal)
    assert r.returncode == 128 + getattr(signal, name), (r.returncode, r.stderr[-2000:])
    assert r.stderr.strip().splitlines()[-1] == "interrupted" and not run_dir.exists()


@pytest.mark.integration
def test_import_held_leaves_an_ignored_sigint_ignored(tmp_path):
    """A command started with SIGINT ignored (``cmd &`` from a non-interactive shell) keeps ignoring it while
    import_held imports."""
    import os
    import subprocess
    import sys

    from conftest import REPO

    script = tmp_path / "ignored.py"
    script.write_text(
        "import os, signal, sys\n"
        "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
        "from scalebox_ms.cli_common import import_held\n"
        "class CtrlC:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'numpy.linalg':\n"
        "            os.kill(os.getpid(), signal.SIGINT)\n"
        "        return None\n"
        "sys.meta_path.insert(0, CtrlC())\n"
        "import_held('numpy')\n"
        "print('went on', signal.getsignal(signal.SIGINT) is signal.SIG_IGN)\n")
    r = subprocess.run([sys.executable, str(script)], env=dict(os.environ, PYTHONPATH=REPO), capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "went on True", (r.returncode, r.stderr[-2000:])


def test_a_non_finite_reward_in_evaluation_is_an_evaluation_error():
    """Evaluation summed it: eval_mean_return null with no eval_error in summary.json, and evaluate --json printed
    NaN (not JSON)."""
    from scalebox_ms.trainers.evaluation import EvaluationError, run_episodes

    with pytest.raises(EvaluationError, match=r"^evaluation of 'nan_envs:NaNRewardCartPole-v0': the env returned a "
                                              r"non-finite reward \(inf\) at env index 0 \(0 of 2 episodes done\)$"):
        run_episodes("nan_envs:NaNRewardCartPole-v0", {"at": 3}, lambda obs: np.zeros(len(obs), np.int64), 2)
    assert len(run_episodes("nan_envs:NaNRewardCartPole-v0", {"at": 10**6},
                            lambda obs: np.zeros(len(obs), np.int64), 2)) == 2


def test_the_step_an_env_error_names_counts_every_ranks_envs():
    """Under data parallelism the collector counted its own envs only: rank 1 of 2 with 2 envs each named "step 2"
    for a failure at the global step 4 (steps move in multiples of 4)."""
    from scalebox_ms.buffers.rollout import RolloutStorage
    from scalebox_ms.trainers.collector import RolloutCollector

    cfg = small_config(env={"id": "nan_envs:NaNRewardCartPole-v0", "num_envs": 4, "kwargs": {"at": 4}},
                       parallel={"workers": 2})
    c = RolloutCollector(cfg, np.random.default_rng(0), 2, rank=1)
    try:
        c.reset(seed=0)
        storage = RolloutStorage(4, 2, (4,), (), np.int32, np.float32)

        def act(obs, noise):  # (a packed [action | log_prob | value] batch; the env's probe step was its first,
            return np.zeros((len(obs), 3), np.float32)  # so its 4th is the rollout's third: t = 2)
        act.host_call = True
        with pytest.raises(TrainingError, match=r"returned a non-finite reward \(inf\) at env index 2, step 108;"):
            c.collect(storage, act, 100)
    finally:
        c.close()
