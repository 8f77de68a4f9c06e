"""A run's life on disk under hostile conditions: corrupt or edited checkpoints, edited configs, kills before the
first checkpoint, concurrent processes, errors mid-run, signals and a full disk."""
import csv
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time

import pytest

from conftest import REPO, as_from_a_terminal, small_config
from scalebox_ms.errors import CheckpointError, ConfigError
from scalebox_ms.runlock import RunLock
from scalebox_ms.trainers.checkpoint import list_checkpoints, read_checkpoint, sidecar_digest
from scalebox_ms.trainers.run import CheckpointSaver, MetricsWriter, train_run

EVERY_64 = {"eval_episodes": 0, "checkpoint_every": 64, "keep_checkpoints": 10}  # 64 env steps per iteration


def ckpt(run_dir, step, ext=".json"):
    return os.path.join(run_dir, "checkpoints", f"ckpt_{step:012d}{ext}")


def steps_in_metrics(run_dir):
    with open(os.path.join(run_dir, "metrics.csv"), newline="") as f:
        return [int(r["global_step"]) for r in csv.DictReader(f)]


def no_temporaries(run_dir):
    return [os.path.join(d, n) for d, _, files in os.walk(run_dir) for n in files if n.startswith(".tmp-")] == []


def quiet(*_):
    pass


@pytest.fixture(scope="module")
def paused_run(tmp_path_factory):
    """A run paused at step 192 with checkpoints at 0, 64, 128 and 192 (copy it before changing it)."""
    run_dir = str(tmp_path_factory.mktemp("paused") / "run")
    train_run(small_config(run=EVERY_64), run_dir=run_dir, until=192, log=quiet)
    return run_dir


@pytest.fixture
def run_copy(paused_run, tmp_path):
    dst = str(tmp_path / "run")
    shutil.copytree(paused_run, dst)
    return dst


def one_line(exc_info):
    msg = str(exc_info.value)
    assert "\n" not in msg, msg
    return msg


# ---------------------------------------------------------------- 2: a corrupt latest checkpoint
def test_corrupt_latest_sidecar_names_the_newest_intact_one_and_checkpoint_resumes_from_it(run_copy):
    with open(ckpt(run_copy, 192), "w") as f:
        f.write('{"format": "scalebox_ms.ppo.v1", ')  # torn JSON
    with open(os.path.join(run_copy, "checkpoints", ".tmp-ckpt_000000000256.ckpt-x1y2.tmp"), "wb") as f:
        f.write(b"\0" * 100)  # what a kill -9 mid-write leaves
    with pytest.raises(CheckpointError) as e:
        train_run(resume=run_copy, log=quiet)
    msg = one_line(e)
    assert "ckpt_000000000192" in msg and "ckpt_000000000128" in msg and "--checkpoint" in msg
    summary = train_run(resume=run_copy, checkpoint=ckpt(run_copy, 128), until=192, log=quiet)
    assert summary["global_step"] == 192 and summary["status"] == "paused"
    assert steps_in_metrics(run_copy) == [64, 128, 192]  # rows after 128 were dropped, then produced again
    assert read_checkpoint(ckpt(run_copy, 192))["sidecar"]["global_step"] == 192  # a fresh, intact one
    assert os.path.exists(os.path.join(run_copy, "checkpoints", "discarded", "ckpt_000000000192.json"))
    assert no_temporaries(run_copy)


def test_a_resume_removes_trains_own_temporaries_but_not_a_running_exports(run_copy):
    """export writes into the run directory without train's lock: a resume deleted a running export's temporary
    graph file (the export then failed: cannot write)."""
    live = os.path.join(run_copy, f".tmp-export-{os.getpid()}-a1b2c3d4.mindir")  # (this process: running)
    dead = os.path.join(run_copy, ".tmp-export-999999999-deadbeef.mindir")  # (no such process)
    sidecar = os.path.join(run_copy, ".tmp-policy.mindir.json-x1y2.json")  # (an export's sidecar being written)
    own = os.path.join(run_copy, ".tmp-summary.json-k1ll.json")  # (train killed while writing its summary)
    odd = [os.path.join(run_copy, f".tmp-export-{pid}-x.mindir") for pid in ("\u00b2", "2147483648000", "x")]
    for path in (live, dead, sidecar, own, *odd):
        with open(path, "wb") as f:
            f.write(b"\0" * 10)
    train_run(resume=run_copy, until=256, log=quiet)
    assert os.path.exists(live) and os.path.exists(sidecar)
    assert not os.path.exists(dead) and not os.path.exists(own)
    assert all(os.path.exists(path) for path in odd)  # (not an export's name: left alone, no traceback)


def test_a_trained_run_whose_checkpoints_are_gone_is_refused_not_restarted(run_copy, tmp_path):
    """A run whose checkpoints/ was deleted (or is a link to a disk not mounted) was restarted from step 0 with
    'no checkpoint yet', its metrics.csv cut to nothing."""
    metrics = open(os.path.join(run_copy, "metrics.csv")).read()
    ckpts = os.path.join(run_copy, "checkpoints")
    shutil.move(ckpts, str(tmp_path / "elsewhere"))
    with pytest.raises(CheckpointError) as e:
        train_run(resume=run_copy, log=quiet)
    assert one_line(e) == (f"--resume {run_copy}: {ckpts} is missing, but the run has trained (its metrics.csv and "
                           "summary.json): restore its checkpoints, or start a new run from its config in another "
                           f"directory: --config {run_copy}/config.yaml --run-dir <new dir>")
    os.symlink(str(tmp_path / "not-mounted"), ckpts)
    with pytest.raises(CheckpointError, match=r"checkpoints is a link to a missing directory, but the run has"):
        train_run(resume=run_copy, log=quiet)
    assert open(os.path.join(run_copy, "metrics.csv")).read() == metrics
    os.unlink(ckpts)
    shutil.move(str(tmp_path / "elsewhere"), ckpts)
    assert train_run(resume=run_copy, log=quiet)["global_step"] == 256


def test_a_checkpoint_copied_in_under_another_number_is_not_the_runs_latest(run_copy):
    """ckpt_000000000000 copied to ckpt_1000 (a number, not the run's 12-digit step) became the latest: evaluate
    used it and a resume rewound the run to step 0, moving its real latest checkpoint to discarded/."""
    from scalebox_ms import load_config
    from scalebox_ms.trainers import acting_trainer
    from scalebox_ms.trainers.checkpoint import resolve_checkpoint

    for ext in (".ckpt", ".json", ".env.pkl"):
        shutil.copy(ckpt(run_copy, 0, ext), os.path.join(run_copy, "checkpoints", "ckpt_1000" + ext))
    assert resolve_checkpoint(run_copy) == resolve_checkpoint(os.path.join(run_copy, "checkpoints")) == \
        ckpt(run_copy, 192, "")
    trainer, prefix = acting_trainer(load_config(os.path.join(run_copy, "config.yaml")), run_copy)  # (evaluate's)
    trainer.close()
    assert prefix == ckpt(run_copy, 192, "") and trainer.global_step == 192
    lines = []
    assert train_run(resume=run_copy, log=lines.append)["global_step"] == 256
    assert any(line.startswith(f"resumed {run_copy} at step 192 from ckpt_000000000192") for line in lines), lines
    assert not os.path.exists(os.path.join(run_copy, "checkpoints", "discarded"))


def test_a_run_directory_too_long_for_its_files_is_refused_before_anything_is_written(tmp_path):
    """A run-dir path near PATH_MAX got config.yaml and environment.json, then failed at ckpt_0 ('File name too
    long'): neither --resume nor a fresh start into it could continue."""
    base = str(tmp_path)
    run_dir = os.path.join(base, *["d" * 200] * ((4060 - len(base)) // 201))
    run_dir = os.path.join(run_dir, "r" * (4060 - len(run_dir) - 1))  # (4,060 bytes: the path itself is legal)
    assert len(run_dir) == 4060
    with pytest.raises(ConfigError) as e:
        train_run(small_config(), run_dir=run_dir, log=quiet)
    from scalebox_ms.trainers.lifecycle import LONGEST_RUN_PATH

    assert one_line(e).startswith("--run-dir /") and one_line(e).endswith(  # (the long path itself shortened)
        f": too long a path: the files a run writes below it need up to {4061 + len(LONGEST_RUN_PATH)} bytes, more "
        "than the system's limit of 4095")
    assert os.listdir(tmp_path) == []


def test_a_discarded_checkpoint_given_to_resume_says_where_it_went(run_copy):
    """It was refused as 'not one of the run's checkpoints': it is the run's own, moved aside by an earlier resume."""
    train_run(resume=run_copy, checkpoint=ckpt(run_copy, 64), until=128, log=quiet)
    discarded = os.path.join(run_copy, "checkpoints", "discarded", "ckpt_000000000192.json")
    assert os.path.exists(discarded)
    with pytest.raises(ConfigError) as e:
        train_run(resume=run_copy, checkpoint=discarded, log=quiet)
    assert one_line(e) == (f"--checkpoint {discarded}: a checkpoint an earlier resume moved to discarded/; move its "
                           f"files back into {os.path.join(run_copy, 'checkpoints')} to continue from it")


def test_a_run_moved_while_it_trains_is_not_created_again_by_its_failed_summary(tmp_path):
    from scalebox_ms.trainers.lifecycle import failed_summary

    run_dir = tmp_path / "moved"
    failed_summary(small_config(), str(run_dir), str(run_dir / "checkpoints"), RuntimeError("x"))
    assert not run_dir.exists()


def test_each_resumed_session_is_recorded_in_environment_json(run_copy):
    """environment.json was written by a run's first session only: a run continued by another version of the code
    (or of MindSpore) looked like one trained by the first."""
    import scalebox_ms

    path = os.path.join(run_copy, "environment.json")
    with open(path) as f:
        first = json.load(f)
    assert first["code"]["version"] == scalebox_ms.__version__ and "resumed" not in first
    lines = []
    train_run(resume=run_copy, log=lines.append)
    train_run(resume=run_copy, log=lines.append)  # (the run is complete: a session all the same)
    with open(path) as f:
        record = json.load(f)
    assert {k: v for k, v in record.items() if k != "resumed"} == first
    assert [s["step"] for s in record["resumed"]] == [192, 256]
    assert all(s["code"] == first["code"] and s["config_sha256"] == first["config_sha256"] for s in record["resumed"])
    with open(path, "w") as f:
        f.write("{torn")
    train_run(resume=run_copy, log=lines.append)
    assert f"warning: {path} was unreadable: it records this session only" in lines
    with open(path) as f:
        assert [s["step"] for s in json.load(f)["resumed"]] == [256]


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git (CI runs on a git clone)")
def test_the_code_record_names_the_checkout_it_runs_from(tmp_path, monkeypatch):
    """The version number did not change between commits whose training differs: a run from a git checkout records
    its commit and whether the package's files were modified or added; a package that is not at a checkout's top
    records none. A caller's GIT_DIR (a git hook running the tests) must not redirect it to another repository."""
    from scalebox_ms.trainers.lifecycle import code_record

    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}

    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t", "-c",
                        "commit.gpgsign=false", *args], check=True, capture_output=True, env=env)

    pkg = tmp_path / "scalebox_ms"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    git("init", "-q")
    git("add", ".")
    git("commit", "-qm", "x")
    head = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True, env=env).stdout.strip()
    monkeypatch.setenv("GIT_DIR", str(tmp_path / "elsewhere"))
    assert code_record(str(pkg))["git_commit"] == head and code_record(str(pkg))["git_modified"] is False
    (tmp_path / "README").write_text("outside the package")
    assert code_record(str(pkg))["git_modified"] is False
    (pkg / "new.py").write_text("")
    assert code_record(str(pkg))["git_modified"] is True
    (pkg / "new.py").unlink()
    (pkg / "__init__.py").write_text("x = 1\n")
    assert code_record(str(pkg))["git_modified"] is True
    inner = pkg / "lib" / "site-packages" / "scalebox_ms"  # (an install inside some other checkout)
    inner.mkdir(parents=True)
    assert code_record(str(inner))["git_commit"] is None


def test_a_run_without_an_intact_checkpoint_says_how_to_start_again_from_its_config(run_copy, tmp_path):
    """It said "start a new run", and starting one into the same directory was refused (it exists): the user was
    sent back and forth between the two commands."""
    from scalebox_ms import load_config

    for step in (0, 64, 128, 192):
        os.unlink(ckpt(run_copy, step, ".env.pkl"))
    config = os.path.join(run_copy, "config.yaml")
    with pytest.raises(CheckpointError) as e:
        train_run(resume=run_copy, log=quiet)
    assert one_line(e).endswith(f"; start a new run from its config in another directory: --config {config} "
                                "--run-dir <new dir>")
    summary = train_run(load_config(config), run_dir=str(tmp_path / "again"), until=64, log=quiet)
    assert summary["global_step"] == 64


def test_a_second_resume_from_an_earlier_checkpoint_overwrites_nothing_in_discarded(run_copy):
    discarded = os.path.join(run_copy, "checkpoints", "discarded")
    train_run(resume=run_copy, checkpoint=ckpt(run_copy, 64), until=128, log=quiet)  # moves 128 and 192 away
    with open(os.path.join(discarded, "ckpt_000000000192.json"), "a") as f:
        f.write(" ")  # tells the first discarded file apart from the second one of the same name
    first = open(os.path.join(discarded, "ckpt_000000000128.json")).read()
    train_run(resume=run_copy, checkpoint=ckpt(run_copy, 64), until=128, log=quiet)  # 128 again
    assert open(os.path.join(discarded, "ckpt_000000000128.json")).read() == first
    assert open(os.path.join(discarded, "ckpt_000000000192.json")).read().endswith(" ")
    assert os.path.exists(os.path.join(discarded, "2", "ckpt_000000000128.ckpt"))
    assert steps_in_metrics(run_copy) == [64, 128]


def test_resume_removes_the_files_of_checkpoints_without_their_sidecar(run_copy):
    """A process killed between a checkpoint's files (its sidecar is written last) or while pruning one (its
    sidecar removed first) left files no resume could use: a resume moved them into discarded/ (again each time)
    or left them in checkpoints/ for good (an off-policy run's replay file each time)."""
    ckpts = os.path.join(run_copy, "checkpoints")
    for ext in (".ckpt", ".env.pkl", ".replay.npz"):  # killed while writing step 320's checkpoint
        with open(os.path.join(ckpts, "ckpt_000000000320" + ext), "wb") as f:
            f.write(b"\0" * 100)
    os.unlink(ckpt(run_copy, 0))  # killed while pruning step 0's checkpoint
    for name in ("mine.ckpt", "ckpt_7.ckpt"):  # (not a run's names: left alone)
        with open(os.path.join(ckpts, name), "wb") as f:
            f.write(b"\0")
    lines = []
    summary = train_run(resume=run_copy, until=256, log=lines.append)
    assert summary["global_step"] == 256
    assert sorted(os.listdir(ckpts)) == sorted(["mine.ckpt", "ckpt_7.ckpt"] + [
        f"ckpt_{s:012d}{ext}" for s in (64, 128, 192, 256) for ext in (".ckpt", ".json", ".env.pkl")])
    assert ("removed ckpt_000000000000.ckpt, ckpt_000000000000.env.pkl, ckpt_000000000320.ckpt, "
            "ckpt_000000000320.env.pkl, ckpt_000000000320.replay.npz: files of checkpoint(s) without their sidecar "
            "(a process killed while writing or pruning them)") in lines


def test_checkpoint_of_another_run_is_refused(run_copy, paused_run):
    with pytest.raises(ConfigError, match="not one of"):
        train_run(resume=run_copy, checkpoint=ckpt(paused_run, 128), log=quiet)


# ---------------------------------------------------------------- 3: an edited sidecar
def _edit_sidecar(path, rehash, **changes):
    with open(path) as f:
        sidecar = json.load(f)
    sidecar.update(changes)
    if rehash:
        sidecar["sidecar_sha256"] = sidecar_digest(sidecar)
    with open(path, "w") as f:
        json.dump(sidecar, f)


@pytest.mark.parametrize("rehash, changes, culprit", [
    (False, {"global_step": 100}, "edited or is corrupt"),
    (False, {"episodes": 0}, "edited or is corrupt"),
    (True, {"global_step": 100}, "does not match the step 192 in its file name"),
    (True, {"world_size": 0}, "world_size must be an integer"),
    (True, {"iteration": 2}, "does not fit iteration 2 of 64 env steps per iteration"),
])
def test_edited_or_inconsistent_sidecar_is_refused(run_copy, rehash, changes, culprit):
    _edit_sidecar(ckpt(run_copy, 192), rehash, **changes)
    with pytest.raises(CheckpointError, match=culprit) as e:
        read_checkpoint(ckpt(run_copy, 192))
    one_line(e)
    with pytest.raises(CheckpointError, match="ckpt_000000000128"):  # resume: names the newest intact one
        train_run(resume=run_copy, log=quiet)


def test_sidecar_without_its_hash_is_refused(run_copy):
    path = ckpt(run_copy, 192)
    with open(path) as f:
        sidecar = json.load(f)
    del sidecar["sidecar_sha256"]
    with open(path, "w") as f:
        json.dump(sidecar, f)
    with pytest.raises(CheckpointError, match="no sidecar_sha256"):
        read_checkpoint(path)


# ---------------------------------------------------------------- 17: an edited config.yaml
def _edit_config(run_dir, old, new):
    path = os.path.join(run_dir, "config.yaml")
    with open(path) as f:
        text = f.read()
    assert old in text
    with open(path, "w") as f:
        f.write(text.replace(old, new))


def test_resume_refuses_an_edited_config_but_allows_more_total_steps(run_copy):
    _edit_config(run_copy, "n_steps: 16", "n_steps: 32")
    _edit_config(run_copy, "gamma: 0.98", "gamma: 0.9")
    with pytest.raises(ConfigError) as e:
        train_run(resume=run_copy, log=quiet)
    msg = one_line(e)
    assert "ppo.n_steps=16 -> 32" in msg and "ppo.gamma=0.98 -> 0.9" in msg
    _edit_config(run_copy, "n_steps: 32", "n_steps: 16")
    _edit_config(run_copy, "gamma: 0.9", "gamma: 0.98")
    _edit_config(run_copy, "total_steps: 256", "total_steps: 320")  # extending a run is allowed
    summary = train_run(resume=run_copy, log=quiet)
    assert summary["global_step"] == 320 and summary["total_steps"] == 320 and summary["status"] == "completed"


def test_an_edited_env_kwarg_is_named_alone_in_the_refusal():
    """The resume diff printed the whole env.kwargs dict on each side, and the error's length cap cut out exactly
    the part that differed."""
    from scalebox_ms import Config
    from scalebox_ms.trainers.lifecycle import config_changes

    def kwargs(**changed):
        return Config.from_dict({"env": {"kwargs": {"label": "x" * 300, "g": 9.8, **changed}}}).to_dict()

    assert config_changes(kwargs(), kwargs(g=3.7)) == ["env.kwargs.g=9.8 -> 3.7"]
    assert config_changes(kwargs(), Config().to_dict())[0].startswith("env.kwargs.g=9.8 -> (absent)")
    assert config_changes(Config().to_dict(), Config().to_dict()) == []


def test_a_run_stopped_by_its_memory_limit_resumes_with_another(run_copy):
    """sandbox.memory_limit was refused as an edit: a run stopped by its limit could neither resume with a higher
    one nor start again in its directory."""
    _edit_config(run_copy, "memory_limit: null", "memory_limit: 64GB")
    summary = train_run(resume=run_copy, log=quiet)
    assert summary["status"] == "completed" and summary["global_step"] == 256


def test_a_memory_limit_below_the_process_is_refused_before_anything_is_written(tmp_path):
    with pytest.raises(Exception, match=r"^sandbox\.memory_limit: this process uses \d+ MB, more than the limit"):
        train_run(small_config(sandbox={"memory_limit": "1MB"}), run_dir=str(tmp_path / "run"), log=quiet)
    assert not (tmp_path / "run").exists()


def _checkpoint_files(run_dir):
    return sorted(os.listdir(os.path.join(run_dir, "checkpoints")))


def test_a_resume_refused_for_its_memory_limit_or_metrics_file_has_changed_nothing(run_copy):
    """Both were refused after the resume had moved the later checkpoints to discarded/ and cut metrics.csv back
    (the memory limit even after a whole iteration without --checkpoint)."""
    files, metrics = _checkpoint_files(run_copy), open(os.path.join(run_copy, "metrics.csv")).read()
    _edit_config(run_copy, "memory_limit: null", "memory_limit: 1MB")
    with pytest.raises(Exception, match=r"^sandbox\.memory_limit: this process uses \d+ MB"):
        train_run(resume=run_copy, checkpoint=ckpt(run_copy, 64), log=quiet)
    assert _checkpoint_files(run_copy) == files and open(os.path.join(run_copy, "metrics.csv")).read() == metrics
    _edit_config(run_copy, "memory_limit: 1MB", "memory_limit: null")
    with open(os.path.join(run_copy, "metrics.csv"), "wb") as f:
        f.write(b"\xff\xfe\x00junk")
    with pytest.raises(CheckpointError, match=r"metrics.csv: not a metrics file"):
        train_run(resume=run_copy, checkpoint=ckpt(run_copy, 64), log=quiet)
    assert _checkpoint_files(run_copy) == files


def test_a_learning_curve_that_cannot_be_written_is_a_warning_and_the_run_completes(run_copy):
    """A learning_curve.png that was a directory ended a completed run with exit 2, an error naming the vanished
    temporary file, and no summary.json."""
    png = os.path.join(run_copy, "learning_curve.png")
    os.remove(png)
    os.mkdir(png)
    lines = []
    summary = train_run(resume=run_copy, log=lines.append)
    assert summary["status"] == "completed"
    assert json.load(open(os.path.join(run_copy, "summary.json")))["status"] == "completed"
    assert [l for l in lines if l.startswith("warning:")] == [
        f"warning: {png}: Is a directory: the learning curve was not written"]


def test_without_matplotlib_or_tqdm_the_run_completes_with_warnings(run_copy, monkeypatch):
    """A matplotlib that could not be imported ended a completed run with a traceback and no summary.json; a missing
    tqdm did so after the run directory was written (with the progress bar on, the default)."""
    from scalebox_ms.trainers import progress

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    monkeypatch.setitem(sys.modules, "tqdm", None)
    monkeypatch.setattr(progress, "stderr_is_a_terminal", lambda: True)  # (off a terminal tqdm is not imported)
    lines = []
    summary = train_run(resume=run_copy, log=lines.append, progress=True)
    assert summary["status"] == "completed"
    assert json.load(open(os.path.join(run_copy, "summary.json")))["status"] == "completed"
    warnings = [l for l in lines if l.startswith("warning:")]
    assert len(warnings) == 2, lines
    assert warnings[0].startswith("warning: tqdm cannot be imported") and "no progress bar" in warnings[0]
    assert warnings[1].startswith("warning: matplotlib cannot be imported") and "not written" in warnings[1]


def test_a_resume_with_nothing_to_train_says_so_and_how_to_train_on(run_copy):
    """--resume of a finished run, or with --until at or below its step, logged 'resumed ... at step N' and exited 0
    having trained nothing, without a word on why or how to go on."""
    lines = []
    assert train_run(resume=run_copy, until=128, log=lines.append)["global_step"] == 192
    assert "--until 128: the run is already at step 192: nothing to train" in lines
    assert train_run(resume=run_copy, log=quiet)["status"] == "completed"
    lines.clear()
    assert train_run(resume=run_copy, log=lines.append)["global_step"] == 256
    assert (f"the run is complete (run.total_steps 256): nothing to train; to train on, raise run.total_steps in "
            f"{os.path.join(run_copy, 'config.yaml')}") in lines


def test_resume_of_a_checkpoint_written_before_a_config_key_existed(run_copy):
    """A key added since the checkpoint was written (absent from its sidecar's config) takes its default instead of
    counting as an edit; the launcher's timeouts may be edited in config.yaml before a resume."""
    path = ckpt(run_copy, 192)
    with open(path) as f:
        config = json.load(f)["config"]
    del config["parallel"]["hang_timeout"]  # (added 2026-12-03)
    _edit_sidecar(path, True, config=config)
    _edit_config(run_copy, "hang_timeout: 1800.0", "hang_timeout: 3600.0")
    _edit_config(run_copy, "timeout: 300.0", "timeout: 600.0")
    summary = train_run(resume=run_copy, log=quiet)
    assert summary["status"] == "completed" and summary["global_step"] == 256
    _edit_config(run_copy, "gamma: 0.98", "gamma: 0.9")  # (still refused: a key of the maths)
    with pytest.raises(ConfigError, match="ppo.gamma=0.98 -> 0.9"):
        train_run(resume=run_copy, log=quiet)


# ---------------------------------------------------------------- 4 + 5: killed before the first checkpoint; locks
def test_resume_of_a_run_killed_before_its_first_checkpoint_starts_at_step_zero(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    cfg = small_config(run=EVERY_64)
    (run_dir / "config.yaml").write_text(cfg.to_yaml())
    (run_dir / "train.lock").write_text("999999999\n")  # left by the killed process: no flock held any more
    lines = []
    summary = train_run(resume=str(run_dir), until=64, log=lines.append)
    assert summary["global_step"] == 64 and any("no checkpoint yet" in l and "step 0" in l for l in lines)
    assert [os.path.basename(p) for p in list_checkpoints(run_dir / "checkpoints")][0] == "ckpt_000000000000"
    assert not (run_dir / "train.lock").exists()


def test_a_fresh_run_goes_into_a_directory_a_killed_run_left_before_its_config(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "train.lock").write_text("999999999\n")
    (run_dir / ".tmp-config.yaml-k1ll3d.yaml").write_text("env:\n")  # killed while writing config.yaml
    summary = train_run(small_config(run=EVERY_64), run_dir=str(run_dir), until=64, log=quiet)
    assert summary["global_step"] == 64 and no_temporaries(run_dir) and not (run_dir / "train.lock").exists()


def _hold_lock(path):
    """Another process holding the run directory's lock, as a train process does."""
    code = ("import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
            "fcntl.flock(fd, fcntl.LOCK_EX); os.ftruncate(fd, 0); os.write(fd, str(os.getpid()).encode()); "
            "print('locked', flush=True); time.sleep(120)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_a_locked_run_directory_is_refused_naming_the_holder(run_copy, tmp_path):
    holder = _hold_lock(os.path.join(run_copy, "train.lock"))
    try:
        with pytest.raises(ConfigError, match=f"in use by another train process \\(pid {holder.pid}\\)"):
            train_run(resume=run_copy, log=quiet)
        fresh = tmp_path / "fresh"
        fresh.mkdir()
        other = _hold_lock(fresh / "train.lock")
        try:
            with pytest.raises(ConfigError, match=f"pid {other.pid}"):
                train_run(small_config(run=EVERY_64), run_dir=str(fresh), until=64, log=quiet)
        finally:
            other.kill()
            other.wait()
    finally:
        holder.kill()
        holder.wait()
    assert steps_in_metrics(run_copy) == [64, 128, 192]  # untouched while locked


def test_a_lock_taken_a_moment_before_its_pid_is_written_still_names_the_holder(tmp_path):
    code = ("import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
            "fcntl.flock(fd, fcntl.LOCK_EX); print('locked', flush=True); time.sleep(0.05); "
            "os.write(fd, str(os.getpid()).encode()); time.sleep(120)")
    holder = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "train.lock")], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(ConfigError, match=f"\\(pid {holder.pid}\\)"):
            RunLock(str(tmp_path)).acquire()
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.integration
def test_two_processes_started_together_on_one_run_dir_one_wins(tmp_path):
    run_dir = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=REPO)
    args = [sys.executable, "-m", "scalebox_ms.train", "--run-dir", str(run_dir), "--total-steps", "512",
            "--set", "env.num_envs=4", "--set", "ppo.n_steps=16", "--set", "ppo.batch_size=32",
            "--set", "run.eval_episodes=0", "--no-progress"]
    procs = [subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    results = [(p.wait(timeout=300), p.communicate()[1]) for p in procs]
    codes = sorted(rc for rc, _ in results)
    assert codes == [0, 2], results
    loser = [err for rc, err in results if rc == 2][0]
    assert "in use by another train process" in loser or "already exists" in loser, loser
    assert len([line for line in loser.splitlines() if line.startswith("error:")]) == 1, loser
    assert "Traceback" not in loser, loser
    assert steps_in_metrics(run_dir) == list(range(64, 513, 64))


# ---------------------------------------------------------------- 8: an error mid-run
def test_a_run_that_raises_closes_its_trainer_and_releases_the_lock(tmp_path, monkeypatch):
    from scalebox_ms.trainers.ppo import PPOTrainer

    closed = []
    real_close = PPOTrainer.close
    monkeypatch.setattr(PPOTrainer, "close", lambda self: (closed.append(True), real_close(self)))

    def boom(self, trainer, metrics):
        raise RuntimeError("callback failed")

    monkeypatch.setattr(MetricsWriter, "on_iteration_end", boom)
    run_dir = tmp_path / "run"
    with pytest.raises(RuntimeError, match="callback failed"):
        train_run(small_config(run=EVERY_64), run_dir=str(run_dir), log=quiet)
    assert closed == [True] and not (run_dir / "train.lock").exists()


# ---------------------------------------------------------------- 13: signals
def _signal_at(monkeypatch, step, signums):
    real = MetricsWriter.on_iteration_end

    def send(self, trainer, metrics):
        real(self, trainer, metrics)
        if trainer.global_step == step:
            for s in signums:
                os.kill(os.getpid(), s)

    monkeypatch.setattr(MetricsWriter, "on_iteration_end", send)


def test_a_signal_stops_at_the_iteration_boundary_with_checkpoint_and_summary(tmp_path, monkeypatch):
    # (in a process where MindSpore already runs, a SIGINT may reach Python as SIGTERM: see the CLI test for SIGINT)
    _signal_at(monkeypatch, 128, [signal.SIGTERM])
    run_dir = tmp_path / "run"
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    lines = []
    summary = train_run(small_config(run={"eval_episodes": 0, "checkpoint_every": 0}), run_dir=str(run_dir),
                        log=lines.append)
    assert summary["status"] == "interrupted" and summary["interrupted_by"] == "SIGTERM"
    assert summary["global_step"] == 128 and any("SIGTERM" in l for l in lines)
    with open(run_dir / "summary.json") as f:
        assert json.load(f)["status"] == "interrupted"
    assert os.path.basename(list_checkpoints(run_dir / "checkpoints")[-1]) == "ckpt_000000000128"
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before  # handlers restored
    assert train_run(resume=str(run_dir), log=quiet)["global_step"] == 256


def test_sighup_stops_like_sigterm_unless_nohup_ignores_it(monkeypatch):
    """A closed terminal used to kill a run without a checkpoint (SIGHUP's default); under nohup (SIGHUP ignored)
    the run must stay deaf to it."""
    from scalebox_ms.trainers.lifecycle import StopOnSignal

    before = signal.signal(signal.SIGHUP, signal.SIG_DFL)
    try:
        stopper = StopOnSignal(quiet).install()
        os.kill(os.getpid(), signal.SIGHUP)
        assert stopper.name == "SIGHUP" and stopper.on_iteration_end(None, {}) is False
        stopper.restore()
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_DFL
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        stopper = StopOnSignal(quiet).install()
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
        os.kill(os.getpid(), signal.SIGHUP)
        assert stopper.signum is None
        stopper.restore()
    finally:
        signal.signal(signal.SIGHUP, before)


def test_a_second_signal_aborts_at_once(tmp_path, monkeypatch):
    _signal_at(monkeypatch, 64, [signal.SIGTERM, signal.SIGTERM])
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt):
        train_run(small_config(run={"eval_episodes": 0, "checkpoint_every": 0}), run_dir=str(tmp_path / "run"),
                  log=quiet)
    assert signal.getsignal(signal.SIGTERM) == before
    assert not (tmp_path / "run" / "summary.json").exists()


_SIGNAL_AT_THE_END = """
import os, signal, sys, time
from scalebox_ms import train
from scalebox_ms.trainers.core import Trainer

sig, where, run_dir = getattr(signal, sys.argv[1]), sys.argv[2], sys.argv[3]
def kill():
    os.kill(os.getpid(), sig)
    time.sleep(0.5)  # (the routed SIGINT arrives from another thread)
close, say_out = Trainer.close, train.say_out
def closing(self):
    if where == "close" and os.path.exists(os.path.join(run_dir, "summary.json")):
        kill()
        print("signalled in close", file=sys.stderr)
    close(self)
def printing(text, *kept_in):
    if where == "print":
        kill()
    say_out(text, *kept_in)
Trainer.close, train.say_out = closing, printing
sys.argv = ["train", "--run-dir", run_dir, "--total-steps", "128", "--set", "env.num_envs=4", "--set",
            "ppo.n_steps=16", "--set", "ppo.batch_size=32", "--set", "run.eval_episodes=0", "--no-progress"]
sys.exit(train.main())
"""


@pytest.mark.integration
@pytest.mark.parametrize("name", ["SIGTERM", "SIGINT", "SIGHUP"])
@pytest.mark.parametrize("where", ["close", "print"])
def test_a_signal_after_the_run_completed_leaves_it_completed(tmp_path, name, where):
    """Between summary.json and the exit (the envs closing, the summary printed) SIGTERM killed train (exit 143,
    no summary on stdout) and Ctrl-C gave "interrupted" (130) or a KeyboardInterrupt traceback from the
    interpreter's shutdown, for a run whose summary.json said completed."""
    run_dir = str(tmp_path / "run")
    r = subprocess.run([sys.executable, "-c", _SIGNAL_AT_THE_END, name, where, run_dir], cwd=tmp_path,
                       env=dict(os.environ, PYTHONPATH=REPO), capture_output=True, text=True, timeout=300,
                       preexec_fn=as_from_a_terminal)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout)["status"] == "completed" and "Traceback" not in r.stderr
    assert ("signalled in close" in r.stderr) == (where == "close")
    assert json.load(open(os.path.join(run_dir, "summary.json")))["status"] == "completed"


@pytest.mark.integration
@pytest.mark.parametrize("signum, code, isolation", [(signal.SIGINT, 130, "none"), (signal.SIGTERM, 143, "none"),
                                                     (signal.SIGHUP, 129, "none"), (signal.SIGINT, 130, "process")])
def test_a_signal_to_the_cli_checkpoints_and_exits_128_plus_signum(tmp_path, signum, code, isolation):
    """(isolation process: starting the env workers started multiprocessing's resource tracker, which unblocked SIGINT
    in the main thread: MindSpore's handler then turned Ctrl-C into SIGTERM, exit 143.)"""
    run_dir = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=REPO)
    proc = subprocess.Popen([sys.executable, "-m", "scalebox_ms.train", "--run-dir", str(run_dir), "--total-steps",
                             "10000000", "--set", "env.num_envs=4", "--set", "ppo.n_steps=16", "--set",
                             "ppo.batch_size=32", "--set", "run.checkpoint_every=0", "--set",
                             f"sandbox.isolation_level={isolation}", "--no-progress"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=as_from_a_terminal)
    try:
        deadline = time.time() + 240
        while time.time() < deadline and not (os.path.exists(run_dir / "metrics.csv")
                                               and len(steps_in_metrics(run_dir)) >= 2):
            assert proc.poll() is None, proc.communicate()[1][-2000:]
            time.sleep(0.2)
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    name = signal.Signals(signum).name
    assert proc.returncode == code, err[-2000:]
    assert f"interrupted by {name}" in err
    summary = json.loads(out)
    assert summary["status"] == "interrupted" and summary["interrupted_by"] == name
    latest = list_checkpoints(run_dir / "checkpoints")[-1]
    assert latest.endswith(f"{summary['global_step']:012d}") and summary["global_step"] > 0
    assert steps_in_metrics(run_dir)[-1] == summary["global_step"]


# ---------------------------------------------------------------- 16: disk full while checkpointing
def test_a_checkpoint_write_that_fails_leaves_the_previous_one_latest(tmp_path, monkeypatch, capfd):
    real_save = CheckpointSaver.save

    def save_with_small_disk(self, trainer):
        if trainer.global_step < 128:
            return real_save(self, trainer)
        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, hard))  # smaller than a .ckpt: writes fail (EFBIG)
        try:
            return real_save(self, trainer)
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))

    monkeypatch.setattr(CheckpointSaver, "save", save_with_small_disk)
    run_dir = tmp_path / "run"
    cfg = small_config(run={"eval_episodes": 0, "checkpoint_every": 64, "keep_checkpoints": 1})
    with pytest.raises(CheckpointError) as e:
        train_run(cfg, run_dir=str(run_dir), log=quiet)
    msg = one_line(e)
    assert "cannot write checkpoint" in msg and "ckpt_000000000128" in msg
    # (MindSpore's own CRITICAL line about it used to come before the one-line error)
    assert "Failed to save the checkpoint file" not in capfd.readouterr().err
    assert no_temporaries(run_dir)
    assert [os.path.basename(p) for p in list_checkpoints(run_dir / "checkpoints")] == ["ckpt_000000000064"]
    assert not os.path.exists(ckpt(run_dir, 128, ".ckpt"))
    monkeypatch.setattr(CheckpointSaver, "save", real_save)
    assert train_run(resume=str(run_dir), log=quiet)["global_step"] == 256


def test_replay_file_writer_round_trips_and_fails_without_a_stray_traceback(tmp_path):
    """The replay buffer's .npz: numpy.load reads it back; a write that fails (file size limit, a full disk)
    raises OSError and leaves no half-closed zip archive behind for the garbage collector (np.savez on a file
    object did: "Exception ignored ... seek of closed file" after the one-line error)."""
    import gc
    import sys

    import numpy as np

    from scalebox_ms.trainers.checkpoint import write_npz

    arrays = {"obs": np.arange(12, dtype=np.float32).reshape(4, 3), "action": np.array([1, 0, 1, 1], np.int32)}
    write_npz(str(tmp_path / "ok.npz"), arrays)
    with np.load(tmp_path / "ok.npz") as back:
        assert sorted(back.files) == ["action", "obs"]
        for k, v in arrays.items():
            np.testing.assert_array_equal(back[k], v)
    unraisable = []
    old_hook, sys.unraisablehook = sys.unraisablehook, unraisable.append
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, hard))
    try:
        with pytest.raises(OSError):
            write_npz(str(tmp_path / "big.npz"), {"obs": np.zeros(100_000, np.float32)})
        gc.collect()
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        sys.unraisablehook = old_hook
    assert unraisable == []


def test_a_signal_during_the_final_evaluation_stops_it_and_the_run_reads_interrupted(tmp_path, monkeypatch):
    """A signal used to be noted and then ignored while the final evaluation played on (exit 0, "completed").
    (SIGTERM: an in-process os.kill(SIGINT) reached the handler as SIGTERM under MindSpore here; the CLI's Ctrl-C
    is SIGINT, tested with a subprocess above.)"""
    from scalebox_ms.trainers import PPOTrainer

    real_predict, calls = PPOTrainer.predict, []

    def predict(self, obs, *a, **kw):
        calls.append(1)
        if len(calls) == 3:  # the evaluation's third step
            os.kill(os.getpid(), signal.SIGTERM)
        return real_predict(self, obs, *a, **kw)

    monkeypatch.setattr(PPOTrainer, "predict", predict)
    cfg = small_config(run={"eval_episodes": 20, "total_steps": 128})
    summary = train_run(cfg, run_dir=str(tmp_path / "run"), log=quiet)
    assert summary["status"] == "interrupted" and summary["interrupted_by"] == "SIGTERM"
    assert "eval_mean_return" not in summary and len(calls) == 3  # stopped at once, not after 20 episodes
    assert list_checkpoints(tmp_path / "run" / "checkpoints")[-1].endswith("000000000128")
    monkeypatch.setattr(PPOTrainer, "predict", real_predict)
    resumed = train_run(resume=str(tmp_path / "run"), log=quiet)  # evaluates what the interrupted run did not
    assert resumed["status"] == "completed" and resumed["eval_episodes"] == 20


CTRL_C_SCRIPT = '''
import faulthandler, signal, sys
faulthandler.register(signal.SIGUSR1, all_threads=True)  # (the test's stack dump if it hangs)
import scalebox_ms
scalebox_ms.route_sigint_around_mindspore()  # first: before numpy and MindSpore start their threads
sys.path.insert(0, sys.argv[2])
from conftest import small_config
from scalebox_ms.trainers import Callback, PPOTrainer

class Ready(Callback):
    def on_iteration_end(self, trainer, metrics):
        if metrics["iteration"] == 1:
            print("ready", flush=True)

trainer = PPOTrainer(small_config(run={"total_steps": 10**9}))
try:
    trainer.learn(callbacks=[Ready()])
except KeyboardInterrupt:
    trainer.save(sys.argv[1])
    print("saved at", trainer.global_step, flush=True)
'''

# docs/python_api.md's snippet: the CLI's stop at the iteration boundary, where save always works
STOP_ON_SIGNAL_SCRIPT = CTRL_C_SCRIPT.replace("Callback, PPOTrainer", "Callback, PPOTrainer, StopOnSignal").split(
    "try:")[0] + '''
with StopOnSignal(log=lambda line: print(line, file=sys.stderr)) as stop:
    trainer.learn(callbacks=[Ready(), stop])
assert stop.signum == 2 and trainer.global_step % 64 == 0, (stop.signum, trainer.global_step)
trainer.save(sys.argv[1])
print("saved at", trainer.global_step, flush=True)
'''


@pytest.mark.parametrize("script_text", [CTRL_C_SCRIPT, STOP_ON_SIGNAL_SCRIPT], ids=["keyboard_interrupt",
                                                                                   "stop_on_signal"])
def test_ctrl_c_in_a_script_of_ones_own_is_a_keyboard_interrupt_with_the_routing(tmp_path, script_text):
    """MindSpore turns SIGINT into SIGTERM while a graph runs (the process dies without a word); a script that calls
    scalebox_ms.route_sigint_around_mindspore() first gets Python's KeyboardInterrupt and can save; with
    StopOnSignal, learn() returns at the iteration boundary instead."""
    script = tmp_path / "train_mine.py"
    script.write_text(script_text)
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")

    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path / "mine"), os.path.join(REPO, "tests")],
                            cwd=str(tmp_path), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=as_from_a_terminal)
    try:
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read()[-2000:]
        proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:  # (where it hangs, for the record)
            proc.send_signal(signal.SIGUSR1)
            time.sleep(3)
            proc.kill()
            out, err = proc.communicate()
            pytest.fail(f"no exit 120 s after SIGINT; its threads' stacks:\n{err[-6000:]}")
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-2000:]
    assert out.startswith("saved at") and (tmp_path / "mine.json").exists()


def test_a_run_directory_removed_while_training_stops_at_the_next_checkpoint(tmp_path):
    """The checkpoint writes used to re-create the deleted directory (checkpoints only, no config.yaml): a
    directory that neither --resume nor a fresh start would take."""
    import shutil as _shutil

    from scalebox_ms.trainers import Callback

    run_dir = tmp_path / "run"

    class Remove(Callback):
        def on_iteration_end(self, trainer, metrics):
            if metrics["iteration"] == 1:
                _shutil.rmtree(run_dir)

    from scalebox_ms.trainers import run as run_module_

    real_learn_and_summarise = run_module_._learn_and_summarise

    def with_remove(trainer, *a, **kw):
        real = trainer.learn
        trainer.learn = lambda callbacks=(), until=None: real(callbacks=[Remove(), *callbacks], until=until)
        return real_learn_and_summarise(trainer, *a, **kw)

    run_module_._learn_and_summarise = with_remove
    try:
        cfg = small_config(run={"eval_episodes": 0, "checkpoint_every": 64})
        with pytest.raises((CheckpointError, OSError)) as e:
            train_run(cfg, run_dir=str(run_dir), log=quiet)
    finally:
        run_module_._learn_and_summarise = real_learn_and_summarise
    assert not run_dir.exists() or "config.yaml" in os.listdir(run_dir), os.listdir(run_dir)
    assert "\n" not in str(e.value)


def test_a_train_lock_that_is_a_symlink_is_refused_and_its_target_untouched(tmp_path):
    target = tmp_path / "precious.txt"
    target.write_text("precious data\n")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    os.symlink(target, run_dir / "train.lock")
    with pytest.raises(ConfigError, match=r"train.lock: is a symbolic link"):
        RunLock(str(run_dir)).acquire()
    assert target.read_text() == "precious data\n"


def test_a_damaged_metrics_file_is_a_one_line_error_on_resume(tmp_path):
    from scalebox_ms.trainers.lifecycle import truncate_metrics

    for content in (b"iteration,glob", b"\xff\xfe\x00junk"):
        path = tmp_path / "metrics.csv"
        path.write_bytes(content)
        with pytest.raises(CheckpointError, match=r"metrics.csv: .*move it aside to resume"):
            truncate_metrics(str(path), 0)


def test_a_write_that_fails_names_its_file(tmp_path):
    """A write or flush error (a full disk, a file size limit) names no file by itself: the CLI's one line read
    "error: No space left on device" for summary.json, metrics.csv and learning_curve.png."""
    from scalebox_ms.fileio import atomic_write_bytes

    writer = MetricsWriter(str(tmp_path / "metrics.csv"))
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, hard))
    try:
        with pytest.raises(OSError) as e:
            atomic_write_bytes(str(tmp_path / "summary.json"), b"x" * 10_000)
        assert e.value.filename == str(tmp_path / "summary.json")
        with pytest.raises(OSError) as e:
            for i in range(2000):
                writer.on_iteration_end(None, {"iteration": i, "global_step": i})
        assert e.value.filename == str(tmp_path / "metrics.csv")
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


def test_a_metrics_file_removed_while_training_starts_again_with_a_warning(tmp_path, caplog):
    """Rows went into the deleted file's open handle, silently lost to the end of the run."""
    import logging
    from types import SimpleNamespace

    path = tmp_path / "metrics.csv"
    writer = MetricsWriter(str(path))
    trainer = SimpleNamespace(log=logging.getLogger("scalebox_ms"))
    writer.on_iteration_end(trainer, {"iteration": 1, "global_step": 64})
    os.remove(path)
    with caplog.at_level(logging.WARNING, logger="scalebox_ms"):
        writer.on_iteration_end(trainer, {"iteration": 2, "global_step": 128})
    writer.close()
    rows = list(csv.DictReader(open(path)))
    assert [r["global_step"] for r in rows] == ["128"]
    assert f"warning: {path} was removed while training: a new one starts at step 128" in caplog.text


def test_an_abort_between_the_checkpoint_files_leaves_no_half_checkpoint(tmp_path, monkeypatch):
    """A second signal (abort at once) while a checkpoint's files are written used to leave its .ckpt/.env.pkl
    without a sidecar (only OSError cleaned up)."""
    from scalebox_ms.trainers import checkpoint
    from scalebox_ms.trainers.lifecycle import Interrupted

    def abort(*a, **kw):
        raise Interrupted(2)

    monkeypatch.setattr(checkpoint, "sidecar_digest", abort)  # (after the .ckpt and .env.pkl are written)
    prefix = str(tmp_path / "ckpt_000000000064")
    with pytest.raises(Interrupted):
        checkpoint.write_checkpoint(prefix, [{"name": "w", "data": __import__("mindspore").Tensor([1.0])}],
                                    {"format": checkpoint.FORMAT}, env_obj={"state": 1})
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("env_id, name", [("CartPole-v1", "CartPole-v1"), ("ALE/Breakout-v5", "ALE-Breakout-v5"),
                                          ("my_envs:Corridor-v0", "my_envs-Corridor-v0"),
                                          ("pkg.mod:My Env/v0", "pkg.mod-My-Env-v0")])
def test_the_default_run_directory_is_one_directory_named_after_the_env(env_id, name):
    """ALE/Breakout-v5 nested its runs under runs/ALE/, a module:Env id put a colon in the path."""
    from scalebox_ms.trainers.run import default_run_dir

    cfg = small_config(env={"id": env_id}, run={"seed": 4})
    head, tail = os.path.split(default_run_dir(cfg))
    assert head == "runs" and tail.startswith(f"{name}_seed4_") and ":" not in tail
    assert tail.endswith(f"_{os.getpid()}")  # (two runs started in the same second collided)
