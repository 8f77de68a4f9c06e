"""The command-line front ends, each in a fresh process: artefacts, resume, reproducibility, bad input."""
import csv
import json
import os
import subprocess
import sys

import pytest

from conftest import REPO, as_from_a_terminal, run_module
from scalebox_ms.errors import ConfigError

TINY = ["--set", "env.num_envs=4", "--set", "ppo.n_steps=16", "--set", "ppo.batch_size=32",
        "--set", "ppo.n_epochs=2", "--set", "run.eval_episodes=3", "--no-progress"]
from scalebox_ms.trainers.run import TIMING_COLUMNS as TIMING


def train(*args, **kw):
    r = run_module("train", *TINY, *args, **kw)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout)


def metrics_rows(run_dir):
    with open(os.path.join(run_dir, "metrics.csv"), newline="") as f:
        return [{k: v for k, v in row.items() if k not in TIMING} for row in csv.DictReader(f)]


@pytest.mark.integration
def test_cli_run_writes_every_artefact(tmp_path):
    run_dir = tmp_path / "run"
    summary = train("--total-steps", 2048, "--run-dir", run_dir, "--seed", 5)
    names = set(os.listdir(run_dir))
    assert {"config.yaml", "metrics.csv", "checkpoints", "learning_curve.png", "summary.json"} <= names
    with open(run_dir / "summary.json") as f:
        on_disk = json.load(f)
    for key in ("global_step", "wall_time_s", "steps_per_second", "episode_return_mean", "peak_rss_mb",
                "param_sha256"):
        assert on_disk[key] is not None, key
    assert on_disk["global_step"] == 2048 and on_disk["status"] == "completed"
    assert summary["param_sha256"] == on_disk["param_sha256"]
    # the preset's kernels (auto on CPU): 16 acting calls + 1 bootstrap value + 1 call for the whole update
    assert on_disk["update_kernel"] == "PPOUpdateKernel" and on_disk["act_kernel"] == "custom"
    assert on_disk["graph_calls_per_iteration"] == 16 + 1 + 1
    assert on_disk["eval_episodes"] == 3 and on_disk["peak_rss_mb"] < 1024
    rows = metrics_rows(run_dir)
    assert len(rows) == 2048 // 64
    for col in ("global_step", "episode_return_mean", "policy_loss", "value_loss", "approx_kl", "clip_fraction",
                "learning_rate"):
        assert col in rows[0]
    with open(run_dir / "learning_curve.png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    ckpts = os.listdir(run_dir / "checkpoints")
    assert "ckpt_000000002048.ckpt" in ckpts and "ckpt_000000002048.json" in ckpts
    assert not [n for n in names | set(ckpts) if n.startswith(".tmp-")], "no temporary files left behind"

    env = {k: v for k, v in os.environ.items() if k != "GLOG_v"}  # (as in a fresh shell; this process sets it)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, "-m", "scalebox_ms.evaluate", "--run", str(run_dir), "--episodes", "4",
                        "--json"], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""  # (MindSpore's import printed ~10 WARNING lines here unless GLOG_v was set)
    ev = json.loads(r.stdout)
    assert ev["episodes"] == 4 and set(ev) >= {"mean_return", "std_return", "episodes"}
    # a stdout that cannot take the result is an error naming stdout (it printed a traceback, or exited 0 silently)
    with open("/dev/full", "w") as full:
        r = subprocess.run([sys.executable, "-m", "scalebox_ms.evaluate", "--run", str(run_dir), "--episodes", "2"],
                           stdout=full, stderr=subprocess.PIPE, text=True, env=env, timeout=300)
    assert (r.returncode, r.stderr) == (2, "error: stdout: No space left on device: the result was not printed\n")
    out = tmp_path / "p.mindir"
    r = subprocess.run([sys.executable, "-m", "scalebox_ms.export", "--run", str(run_dir), "--output", str(out),
                        "--json"], stderr=subprocess.PIPE, text=True, env=env, timeout=300,
                       preexec_fn=lambda: os.close(1))
    assert (r.returncode, r.stderr) == (2, f"error: stdout is closed: the result was not printed ({out} and "
                                           f"{out}.json written)\n")
    assert out.exists()
    # Ctrl-C while MindSpore compiles the first graph (loading the checkpoint): MindSpore's compiler printed ~30
    # lines of errors and left rank_0/om/analyze_fail.ir in the working directory
    driver = tmp_path / "ctrl_c_in_compile.py"
    driver.write_text(CTRL_C_IN_COMPILE)
    for module, args in (("evaluate", []), ("export", ["--output", str(tmp_path / "q.mindir")])):
        r = subprocess.run([sys.executable, str(driver), module, "--run", str(run_dir), *args], capture_output=True,
                           text=True, env=env, timeout=300, cwd=str(tmp_path), preexec_fn=as_from_a_terminal)
        assert (r.returncode, r.stdout, r.stderr) == (130, "", "interrupted\n"), (module, r.stderr[-2000:])
        assert not (tmp_path / "rank_0").exists() and not (tmp_path / "q.mindir").exists()


CTRL_C_IN_COMPILE = """
import os, signal, sys, time
from scalebox_ms import import_mindspore
import_mindspore()
import mindspore.graph._parse.parser as parser
original = parser.get_obj_type
def get_obj_type(obj):  # (MindSpore's compiler calls it while it parses a Cell)
    if parser.get_obj_type is get_obj_type:
        parser.get_obj_type = original
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.5)  # (the handler runs here, inside the compile)
    return original(obj)
parser.get_obj_type = get_obj_type
module = __import__("scalebox_ms." + sys.argv[1], fromlist=["main"])
sys.exit(module.main(sys.argv[2:]))
"""


@pytest.mark.integration
def test_resume_is_bit_identical_and_same_seed_reproduces(tmp_path):
    full = train("--total-steps", 1024, "--run-dir", tmp_path / "full")
    half = train("--total-steps", 1024, "--until", 512, "--run-dir", tmp_path / "half")
    assert half["status"] == "paused" and half["global_step"] == 512
    r = run_module("train", "--resume", tmp_path / "half", "--no-progress")
    assert r.returncode == 0, r.stderr[-2000:]
    resumed = json.loads(r.stdout)
    assert resumed["global_step"] == 1024 and resumed["status"] == "completed"
    assert resumed["param_sha256"] == full["param_sha256"]
    assert metrics_rows(tmp_path / "half") == metrics_rows(tmp_path / "full")
    r = run_module("train", "--resume", tmp_path / "half", "--no-progress")  # (completed: no iteration to run)
    again = json.loads(r.stdout)
    assert again["status"] == "completed" and again["global_step"] == 1024, r.stderr[-2000:]
    assert again["episode_return_mean"] == resumed["episode_return_mean"] is not None  # (was null)
    # same seed, fresh process: identical parameters and metrics
    again = train("--total-steps", 1024, "--run-dir", tmp_path / "again")
    assert again["param_sha256"] == full["param_sha256"]
    assert metrics_rows(tmp_path / "again") == metrics_rows(tmp_path / "full")


@pytest.mark.parametrize("args, culprit", [
    (["--set", "ppo.n_step=3"], "unknown key 'n_step'"),
    (["--set", "ppo.gamma=2"], "ppo.gamma"),
    (["--set", "env.id=NoSuchEnv-v9"], "NoSuchEnv-v9"),
    (["--set", "env.id=tests.space_envs:WordsObs-v0"], "observation part words of type Text"),
    (["--set", "env.id=tests.space_envs:OffSpaceObs-v0"],  # at the first reset: no run dir yet
     "flag = 7 at env index 0, outside its space (discrete [2], start [0]), from reset() at step 0; the run stops"),
    (["--set", "env.backend=envpool", "--set", "env.id=Taxi-v3"], "evaluation plays gymnasium's"),
    # (EnvPool's Blackjack observes a Box(3,), gymnasium's a Tuple: the run trained, then its evaluation failed, or
    # with 3 episodes read the Tuple as a batch of 3 observations and reported a return)
    (["--set", "env.backend=envpool", "--set", "env.id=Blackjack-v1"],
     "env.backend: envpool's Blackjack-v1 has the observation space Box(0, 31, (3,), int32), gymnasium's (which "
     "evaluation plays) Tuple(Discrete(32), Discrete(11), Discrete(2))"),
    (["--config", "/nonexistent/cfg.yaml"], "config file not found"),
    (["--total-steps", "0"], "run.total_steps"),
    (["--bogus-flag"], "--bogus-flag"),
    (["--seed", "abc"], "--seed"),
    (["--seed", str(2**32)], "run.seed"),
    (["--until", str(10**23)], "--until: expected a 64-bit integer"),  # (was refused after ckpt_0 was written)
    (["--seed", "1", "--set", "run.seed=2"], "--seed 1 and --set run.seed=2: both set run.seed"),  # (the flag won)
    (["--workers", "2", "--set", " parallel.workers=1"], "--workers 2 and --set  parallel.workers=1: both set"),
    (["--set", "env.kwargs={max_episode_steps: x}"],  # (8 envs: gymnasium's CartPoleVectorEnv; checked by one env)
     "cannot create 'CartPole-v1' with env.kwargs={'max_episode_steps': 'x'} (Expect the `max_episode_steps` to be "
     "an integer"),
])
@pytest.mark.integration
def test_bad_input_one_line_exit_2_and_no_run_dir(tmp_path, args, culprit):
    run_dir = tmp_path / "run"
    r = run_module("train", *args, "--run-dir", run_dir, "--no-progress")
    assert r.returncode == 2
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    errors = [l for l in lines if l.startswith("error:")]  # (a trainer that was built logs its choices first)
    assert errors == lines[-1:] and culprit in errors[0] and "Traceback" not in r.stderr, r.stderr
    assert not run_dir.exists()


@pytest.mark.parametrize("tool, args", [("train", ["--run-dir", "run", "--no-progress"]),
                                        ("evaluate", ["--mindir", "x.mindir"])])
def test_a_mindspore_that_cannot_be_imported_is_one_line(tmp_path, monkeypatch, tool, args):
    """A MindSpore whose import fails (a broken install; GLOG_v=abc raises there too, in some environments) was a
    traceback."""
    broken = tmp_path / "site" / "mindspore"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise RuntimeError('libmindspore.so: broken (test)')\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "site"))  # (run_module puts the repository before it)
    r = run_module(tool, *args)
    assert r.returncode == 2, r.stderr
    assert r.stderr == ("error: mindspore cannot be imported (RuntimeError: libmindspore.so: broken (test)); python -m "
                        "scalebox_ms.doctor checks the installation\n")
    assert os.listdir(tmp_path) == ["site"]


def test_a_sys_path_entry_the_graph_compiler_cannot_take_is_refused(monkeypatch):
    """A non-ASCII current directory under a non-UTF-8 locale (LC_ALL=C with UTF-8 mode off) reaches sys.path as
    surrogate escapes, which MindSpore's graph compiler cannot convert: every compile raised 'Unable to cast Python
    instance of type str' (a traceback, and a run directory without its summary)."""
    from scalebox_ms.cli_common import import_mindspore

    monkeypatch.setattr(sys, "path", ["/tmp/d\udcc3\udca9"] + sys.path)
    with pytest.raises(ConfigError, match=r"^sys.path entry '/tmp/d\\udcc3\\udca9' \(the current directory or "
                                          r"PYTHONPATH\) cannot be encoded as UTF-8"):
        import_mindspore()


@pytest.mark.parametrize("tool, args, words", [
    ("train", ["--run-dir", " ", "--no-progress"], "--run-dir: empty"),
    ("train", ["--resume", "x", "--checkpoint", "", "--no-progress"], "--checkpoint: empty"),
    ("evaluate", ["--run", "x", "--checkpoint", ""], "--checkpoint: empty"),
    ("evaluate", ["--mindir", "x.mindir", "--checkpoint", " "], "--checkpoint: empty"),
    ("export", ["--run", "x", "--checkpoint", ""], "--checkpoint: empty")])
def test_empty_paths_are_refused_not_taken_for_the_default(tmp_path, tool, args, words):
    """--run-dir "" trained into the default directory; --checkpoint "" said: no checkpoint found in . (train), and
    evaluated or exported the run's latest checkpoint (evaluate, export; evaluate --mindir ignored it)."""
    r = run_module(tool, *args)
    assert r.returncode == 2 and r.stderr.startswith(f"error: {words}"), r.stderr
    assert os.listdir(tmp_path) == []


def test_a_file_given_as_run_dir_is_named_as_a_file(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    r = run_module("train", "--run-dir", tmp_path / "notes.txt", "--no-progress")
    assert r.returncode == 2 and r.stderr == f"error: --run-dir {tmp_path / 'notes.txt'}: is a file, not a directory\n"
    assert (tmp_path / "notes.txt").read_text() == "mine"


@pytest.mark.integration
def test_resume_and_evaluate_refuse_bad_paths(tmp_path):
    r = run_module("train", "--resume", tmp_path / "nothing", "--no-progress")
    assert r.returncode == 2 and "not a run directory" in r.stderr
    r = run_module("evaluate", "--run", tmp_path / "nothing")
    assert r.returncode == 2 and "not a run directory" in r.stderr


@pytest.mark.integration
def test_corrupt_checkpoint_refused_by_cli(tmp_path):
    run_dir = tmp_path / "run"
    train("--total-steps", 128, "--run-dir", run_dir, "--set", "run.eval_episodes=0")
    ckpt = run_dir / "checkpoints" / "ckpt_000000000128.ckpt"
    ckpt.write_bytes(ckpt.read_bytes()[:-10])
    r = run_module("evaluate", "--run", run_dir)
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "corrupt" in r.stderr
    r = run_module("train", "--resume", run_dir, "--no-progress")
    assert r.returncode == 2 and "corrupt" in r.stderr


@pytest.mark.integration
def test_existing_run_dir_is_not_overwritten(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "keep.txt").write_text("x")
    r = run_module("train", "--run-dir", run_dir, "--no-progress")
    assert r.returncode == 2 and "already exists" in r.stderr
    assert os.listdir(run_dir) == ["keep.txt"]


@pytest.mark.integration
def test_resume_refuses_a_checkpoint_of_another_env_count(tmp_path):
    run_dir = tmp_path / "run"
    train("--total-steps", 128, "--until", 64, "--run-dir", run_dir, "--set", "run.eval_episodes=0")
    cfg = (run_dir / "config.yaml").read_text().replace("num_envs: 4", "num_envs: 2")
    (run_dir / "config.yaml").write_text(cfg)
    r = run_module("train", "--resume", run_dir, "--no-progress")
    assert r.returncode == 2 and "env.num_envs=4" in r.stderr, r.stderr


@pytest.mark.integration
def test_evaluate_and_export_refuse_a_config_edited_since_the_checkpoint(tmp_path):
    """An edited policy.activation in config.yaml loaded the tanh-trained weights into a ReLU network: evaluate
    reported another policy's return and export wrote it, both with exit 0. How the policy is computed (its
    kernels) may still differ."""
    run_dir = tmp_path / "run"
    train("--total-steps", 64, "--run-dir", run_dir, "--set", "run.eval_episodes=0")
    original = (run_dir / "config.yaml").read_text()
    assert "activation: tanh" in original and "act_kernel: auto" in original
    (run_dir / "config.yaml").write_text(original.replace("activation: tanh", "activation: relu"))
    for args in (("evaluate", "--run", run_dir, "--episodes", 1), ("export", "--run", run_dir)):
        r = run_module(*args)
        assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr[-2000:]
        assert "config.yaml differs from the config ckpt_000000000064 was trained with: policy.activation=tanh " \
               "-> relu" in r.stderr, r.stderr
    assert not (run_dir / "policy.mindir").exists()
    (run_dir / "config.yaml").write_text(original.replace("act_kernel: auto", "act_kernel: builtin"))
    r = run_module("evaluate", "--run", run_dir, "--episodes", 1, "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["global_step"] == 64, r.stderr[-2000:]


@pytest.mark.integration
def test_torn_metrics_row_is_dropped_on_resume(tmp_path):
    run_dir = tmp_path / "run"
    train("--total-steps", 256, "--until", 128, "--run-dir", run_dir, "--set", "run.eval_episodes=0")
    with open(run_dir / "metrics.csv", "a") as f:
        f.write("3,19")  # a crash mid-write
    r = run_module("train", "--resume", run_dir, "--no-progress")
    assert r.returncode == 0, r.stderr[-2000:]
    rows = metrics_rows(run_dir)
    assert [int(r["global_step"]) for r in rows] == [64, 128, 192, 256]


def test_crash_before_first_interval_checkpoint_is_resumable(tmp_path):
    run_dir = tmp_path / "run"
    train("--total-steps", 256, "--until", 1, "--run-dir", run_dir, "--set", "run.eval_episodes=0")
    assert "ckpt_000000000000.json" in os.listdir(run_dir / "checkpoints")


@pytest.mark.integration
def test_profile_flag_writes_mindspore_profiler_output(tmp_path):
    run_dir = tmp_path / "run"
    train("--total-steps", 256, "--run-dir", run_dir, "--profile", 2, "--set", "run.eval_episodes=0")
    found = [os.path.join(d, f) for d, _, files in os.walk(run_dir / "profile") for f in files]
    assert any(f.endswith("cpu_op_type_info_0.csv") for f in found), found
    r = run_module("train", "--profile", "-1", "--run-dir", tmp_path / "bad", "--no-progress")
    assert r.returncode == 2 and "--profile" in r.stderr and not (tmp_path / "bad").exists()


def test_auto_batch_from_the_cli_is_recorded(tmp_path):
    run_dir = tmp_path / "run"
    summary = train("--total-steps", 128, "--run-dir", run_dir, "--set", "ppo.batch_size=auto",
                    "--set", "ppo.min_batch=16", "--set", "ppo.max_batch=64", "--set", "run.eval_episodes=0")
    assert summary["batch_size"] in (16, 32, 64)
    assert [r["batch_size"] for r in summary["auto_batch"]["table"]] == [16, 32, 64]
    rows = metrics_rows(run_dir)
    assert all(int(r["batch_size"]) == summary["batch_size"] for r in rows)


@pytest.mark.integration
def test_resume_is_bit_identical_for_sync_vector_envs_with_normalisation(tmp_path):
    """Pendulum runs on gymnasium's SyncVectorEnv (its sub-envs are checkpointed) with obs/reward statistics."""
    args = ["--set", "env.id=Pendulum-v1", "--set", "env.num_envs=2", "--set", "ppo.n_steps=32",
            "--set", "ppo.batch_size=32", "--set", "env.normalize_obs=true", "--set", "env.normalize_reward=true",
            "--set", "run.eval_episodes=0", "--total-steps", 256]
    full = train(*args, "--run-dir", tmp_path / "full")
    train(*args, "--until", 128, "--run-dir", tmp_path / "half")
    r = run_module("train", "--resume", tmp_path / "half", "--no-progress")
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout)["param_sha256"] == full["param_sha256"]
    assert metrics_rows(tmp_path / "half") == metrics_rows(tmp_path / "full")


def test_checkpoint_flag_needs_resume(capsys):
    from scalebox_ms.train import main

    assert main(["--checkpoint", "x.json", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--checkpoint: only with --resume" in err


@pytest.mark.integration
def test_resume_with_a_torn_sidecar_names_the_intact_checkpoint_and_continues_from_it(tmp_path):
    run_dir = tmp_path / "run"
    train("--total-steps", 256, "--until", 128, "--run-dir", run_dir, "--set", "run.eval_episodes=0")
    sidecar = run_dir / "checkpoints" / "ckpt_000000000128.json"
    sidecar.write_text(sidecar.read_text()[:200])  # not valid JSON any more
    r = run_module("train", "--resume", run_dir, "--no-progress")
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:"), r.stderr[-2000:]
    assert "ckpt_000000000128" in lines[0] and "newest intact one is ckpt_000000000000" in lines[0]
    r = run_module("train", "--resume", run_dir, "--checkpoint", run_dir / "checkpoints" / "ckpt_000000000000.json",
                   "--no-progress")
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout)["global_step"] == 256
    assert [int(r["global_step"]) for r in metrics_rows(run_dir)] == [64, 128, 192, 256]


def test_data_parallel_launch_holds_the_run_lock_for_its_ranks(tmp_path, monkeypatch, capsys):
    """The launching process (not its msrun ranks) holds the run directory's lock while msrun runs."""
    import scalebox_ms.parallel.launcher as launcher
    from scalebox_ms.errors import ConfigError
    from scalebox_ms.runlock import HELD_ENV, RunLock, held_by_launcher
    from scalebox_ms.train import main

    seen = {}

    def fake_launch(worker_args, workers, run_dir, timeout, stream=None, hang_timeout=None):
        seen["held_by_launcher"] = held_by_launcher(run_dir)
        seen["timeouts"] = (timeout, hang_timeout)
        with pytest.raises(ConfigError, match=f"pid {os.getpid()}"):
            RunLock(run_dir).acquire()
        with open(os.path.join(run_dir, "summary.json"), "w") as f:
            json.dump({"status": "completed"}, f)
        return 0

    monkeypatch.setattr(launcher, "launch", fake_launch)
    run_dir = tmp_path / "run"
    assert main(["--workers", "2", "--run-dir", str(run_dir), "--no-progress", "--set",
                 "parallel.hang_timeout=42"]) == 0
    assert seen == {"held_by_launcher": True, "timeouts": (300.0, 42.0)}  # the config's, to the launcher
    assert HELD_ENV not in os.environ and not (run_dir / "train.lock").exists()
    assert json.loads(capsys.readouterr().out)["status"] == "completed"


@pytest.mark.integration
def test_the_final_evaluation_and_evaluate_use_the_seed_of_the_evaluations_while_training(tmp_path):
    """With run.seed 1 the evaluation at the last step (eval_every, seed run.seed + 10000) and the final one
    (eval_mean_return, seed 10000) of the same weights disagreed: a run "solved" at a bar its own final evaluation
    missed; evaluate --run reproduced only the final one."""
    from scalebox_ms.config import load_config
    from scalebox_ms.trainers.run import train_run

    cfg = load_config(os.path.join(REPO, "configs", "ppo_cartpole.yaml"),
                      ["run.seed=1", "run.total_steps=512", "run.eval_every=512", "run.eval_episodes=3",
                       "env.num_envs=2", "ppo.n_steps=256", "ppo.batch_size=64", "ppo.n_epochs=1"])
    summary = train_run(cfg, run_dir=str(tmp_path / "run"), progress=False, log=lambda s: None)
    last = summary["evaluations"][-1]
    assert last["step"] == summary["global_step"] == 512 and summary["eval_seed"] == 10001
    assert summary["eval_mean_return"] == pytest.approx(last["mean"])
    r = run_module("evaluate", "--run", tmp_path / "run", "--episodes", "3", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    result = json.loads(r.stdout)
    assert result["seed"] == 10001 and result["mean_return"] == pytest.approx(summary["eval_mean_return"])


def test_progress_is_plain_lines_off_a_terminal_and_lines_logged_under_a_bar_start_on_their_own(capsys):
    """Off a terminal (a log file, a scheduler's output) the tqdm bar was one ever-growing line of carriage returns;
    on a terminal, a warning or a signal's notice landed at the end of the bar's line."""
    from types import SimpleNamespace

    from scalebox_ms.cli_common import say
    from scalebox_ms.trainers.progress import ProgressBar

    trainer = SimpleNamespace(global_step=0, config=SimpleNamespace(env=SimpleNamespace(id="E-v0")))
    lines = []
    bar = ProgressBar(1000, lines.append, terminal=False)
    bar.on_training_start(trainer)
    for step in (64, 256, 320, 512, 768, 1024):
        bar.on_iteration_end(trainer, {"global_step": step, "episode_return_mean": 1.5, "steps_per_second": 99.0})
    bar.on_training_end(trainer)
    assert lines == [f"E-v0: step {s} of 1,000 ({p}%), 99 steps/s, return 1.5"
                     for s, p in (("256", 25), ("320", 32), ("512", 51), ("768", 76), ("1,024", 100))]
    assert capsys.readouterr().err == ""

    bar = ProgressBar(1000, lines.append, terminal=True)
    bar.on_training_start(trainer)
    bar.on_iteration_end(trainer, {"global_step": 512, "episode_return_mean": 1.5, "steps_per_second": 99.0})
    bar.bar.refresh()
    say("warning: something")
    bar.on_iteration_end(trainer, {"global_step": 1024, "episode_return_mean": 2.0, "steps_per_second": 99.0})
    bar.on_training_end(trainer)
    err = capsys.readouterr().err
    segment = next(s for s in err.split("\n") if "warning: something" in s)
    assert segment.split("\r")[-1] == "warning: something", repr(segment)
    assert "100%" in err.split("\r")[-1]  # (the last iteration ran past total: the bar still ends at 100%)
    import types

    sys.modules["tqdm"], real = types.ModuleType("tqdm"), sys.modules["tqdm"]  # (a stand-in without tqdm.tqdm)
    try:
        say("still said")
    finally:
        sys.modules["tqdm"] = real
    assert capsys.readouterr().err == "still said\n"


def test_a_kernel_fallback_is_a_warning_line(caplog):
    import logging

    from scalebox_ms.trainers.kernels import _report

    with caplog.at_level(logging.INFO, logger="scalebox_ms"):
        _report("policy.act_kernel", "auto", "builtin", "the custom kernel cannot be built: x", fallback=True)
        _report("policy.act_kernel", "builtin", "builtin", "as configured")
    assert [r.getMessage() for r in caplog.records] == [
        "warning: policy.act_kernel auto: builtin (the custom kernel cannot be built: x)",
        "policy.act_kernel: builtin (as configured)"]


def test_a_summary_stdout_cannot_take_is_a_warning_and_a_pause_says_how_to_go_on(capsys, monkeypatch):
    """`train > /dev/full` exited 0 without a word (evaluate and doctor said 'error: stdout: ...'); `--until` ended
    on the progress line, the pause only in the JSON."""
    from scalebox_ms import train
    from scalebox_ms.cli_common import say_out

    class Full:
        def write(self, text):
            raise OSError(28, "No space left on device")

        def flush(self):
            pass

        def fileno(self):
            raise ValueError("no descriptor")

    monkeypatch.setattr(sys, "stdout", Full())
    say_out("{}", "run/summary.json")
    assert capsys.readouterr().err == ("warning: stdout: No space left on device: the summary was not printed; it is "
                                       "in run/summary.json\n")
    monkeypatch.undo()
    assert train._exit_code({"status": "paused", "global_step": 512, "run_dir": "run"}) == 0
    assert capsys.readouterr().err == "paused at step 512 (--until; checkpoint written); continue with --resume run\n"


def test_flag_errors_name_the_flag_first_and_usage_names_the_command_as_run(capsys, monkeypatch):
    """'error: python -m scalebox_ms.train: unrecognized arguments: --bogus' put the program before the culprit,
    unlike every other error; `scalebox-train --help` showed the module form."""
    from scalebox_ms import train

    with pytest.raises(SystemExit) as stop:
        train.build_parser().parse_args(["--bogus"])
    assert stop.value.code == 2 and capsys.readouterr().err == "error: unrecognized arguments: --bogus\n"
    monkeypatch.setattr(sys, "argv", ["/venv/bin/scalebox-train", "--help"])
    assert train.build_parser().format_usage().startswith("usage: scalebox-train [-h] [--config FILE]")
    monkeypatch.setattr(sys, "argv", ["/repo/scalebox_ms/train.py"])
    assert train.build_parser().format_usage().startswith("usage: python -m scalebox_ms.train [-h] [--config FILE]")


@pytest.mark.parametrize("tool", ["train", "evaluate"])
def test_a_deleted_working_directory_is_one_line(tmp_path, tool):
    """MindSpore's import failed on it ('mindspore cannot be imported (FileNotFoundError ...)', the doctor advised),
    then the interpreter aborted (exit 134)."""
    gone = tmp_path / "gone"
    gone.mkdir()
    env = {**os.environ, "PYTHONPATH": REPO}
    args = "--total-steps 256 --run-dir x" if tool == "train" else "--mindir x.mindir"
    r = subprocess.run(["sh", "-c", f"cd {gone} && rmdir {gone} && exec {sys.executable} -m scalebox_ms.{tool} {args}"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 2, r.stderr[-2000:]
    assert r.stderr == "error: the current directory no longer exists (deleted or moved): cd to another one\n"
