"""A checkpoint's files as a user of ``save``/``load_trainer`` handles them: fixed names saved again, names of
their own, files renamed together, a failed save."""
import json
import os
import resource
import signal

import mindspore as ms
import pytest

from conftest import small_config
from scalebox_ms import CheckpointError
from scalebox_ms.trainers import PPOTrainer, load_trainer
from scalebox_ms.trainers.checkpoint import write_checkpoint


@pytest.fixture(scope="module")
def trainer():
    t = PPOTrainer(small_config())
    t.learn(until=64)
    yield t
    t.close()


def _file_size_limit(limit):
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # (the write fails with EFBIG instead)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))

    def restore():
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)
    return restore


def test_a_failed_save_to_a_name_in_use_leaves_the_earlier_checkpoint_as_it_was(tmp_path, trainer):
    """A save to a fixed name ("latest") that failed (a full disk) deleted the sidecar first and every file of the
    name afterwards: the good checkpoint there was lost with the failed one."""
    prefix = str(tmp_path / "latest")
    trainer.save(prefix)
    before = {n: (tmp_path / n).read_bytes() for n in os.listdir(tmp_path)}
    assert {"latest.ckpt", "latest.json", "latest.env.pkl"} <= set(before)
    restore = _file_size_limit(3000)  # (the .ckpt is larger)
    try:
        with pytest.raises(CheckpointError, match=f"cannot write checkpoint {prefix}: File too large"):
            trainer.save(prefix)
    finally:
        restore()
    assert {n: (tmp_path / n).read_bytes() for n in os.listdir(tmp_path)} == before  # no temporaries either
    back = load_trainer(prefix)
    assert back.parameters_sha256() == trainer.parameters_sha256()
    back.close()


def test_a_failed_sidecar_write_leaves_the_earlier_checkpoint_as_it_was(tmp_path, trainer, monkeypatch):
    """The sidecar was written after the earlier checkpoint's files were replaced: a disk full there lost both."""
    import errno

    from scalebox_ms.trainers import checkpoint

    prefix = str(tmp_path / "latest")
    trainer.save(prefix)
    before = {n: (tmp_path / n).read_bytes() for n in os.listdir(tmp_path)}

    def full(obj):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint, "json_text", full)
    with pytest.raises(CheckpointError, match=f"^cannot write checkpoint {prefix}: No space left on device$"):
        trainer.save(prefix)
    assert {n: (tmp_path / n).read_bytes() for n in os.listdir(tmp_path)} == before


def test_a_save_to_a_name_in_use_replaces_every_file_of_it(tmp_path, trainer):
    """The new checkpoint has no env state file: the earlier one's is removed, not left beside it."""
    prefix = str(tmp_path / "latest")
    trainer.save(prefix)
    sidecar = trainer.save(prefix)
    assert sorted(os.listdir(tmp_path)) == ["latest.ckpt", "latest.env.pkl", "latest.json"]
    assert json.load(open(sidecar))["env_state"]["sha256"]
    (tmp_path / "latest.env.pkl").write_bytes(b"stale")
    write_checkpoint(prefix, [{"name": "w", "data": ms.Tensor([1.0])}], {"global_step": 0})
    assert sorted(os.listdir(tmp_path)) == ["latest.ckpt", "latest.json"]


def test_a_checkpoints_files_renamed_together_load(tmp_path, trainer):
    """The sidecar named the env state (and replay) file by the name it was saved under: renamed files were
    refused naming a file the user no longer had, and a copy of only .ckpt and .json read the original's env
    state."""
    trainer.save(str(tmp_path / "orig"))
    for ext in ("ckpt", "json", "env.pkl"):
        os.rename(tmp_path / f"orig.{ext}", tmp_path / f"best.{ext}")
    back = load_trainer(str(tmp_path / "best"))
    assert back.parameters_sha256() == trainer.parameters_sha256()
    back.close()
    for ext in ("ckpt", "json", "env.pkl"):
        (tmp_path / f"orig.{ext}").write_bytes((tmp_path / f"best.{ext}").read_bytes())
    for ext in ("ckpt", "json"):
        (tmp_path / f"snap.{ext}").write_bytes((tmp_path / f"best.{ext}").read_bytes())
    with pytest.raises(CheckpointError, match=r"checkpoint env state .*snap\.env\.pkl is missing or corrupt"):
        load_trainer(str(tmp_path / "snap"))


def test_names_of_a_users_own_and_the_latest_of_a_directory(tmp_path, trainer):
    """``save("ckpt_1")`` could not be loaded (its step, 64, is not 1), and ``load_trainer(directory)`` took
    ``ckpt_best`` as the latest (names sorted as text)."""
    from scalebox_ms.trainers.checkpoint import list_checkpoints, resolve_checkpoint

    for name in ("ckpt_1", "ckpt_best", "ckpt_10", "ckpt_9"):
        trainer.save(str(tmp_path / name))
    trainer.save(str(tmp_path) + "/")  # ckpt_000000000064
    assert [os.path.basename(p) for p in list_checkpoints(str(tmp_path))] == [
        "ckpt_1", "ckpt_9", "ckpt_10", "ckpt_000000000064"]
    for name in ("ckpt_1", "ckpt_best"):
        back = load_trainer(str(tmp_path / name))
        assert back.global_step == 64
        back.close()
    assert resolve_checkpoint(str(tmp_path)) == str(tmp_path / "ckpt_000000000064")
    os.unlink(tmp_path / "ckpt_000000000064.json")
    assert resolve_checkpoint(str(tmp_path)) == str(tmp_path / "ckpt_10")  # (load_trainer's "latest")
    with pytest.raises(CheckpointError, match=r"^save: ckpt_000000000032 is the name of a run's checkpoint at step "
                                              r"32 \(this trainer is at step 64\)"):
        trainer.save(str(tmp_path / "ckpt_000000000032"))
    assert not (tmp_path / "ckpt_000000000032.json").exists()


def test_a_checkpoint_file_name_that_is_a_directory_is_one_line(tmp_path, trainer):
    for ext in ("json", "ckpt", "env.pkl"):
        (tmp_path / f"x{ext}.{ext}").mkdir()
        with pytest.raises(CheckpointError, match=rf"^cannot write checkpoint .*x{ext}: .*x{ext}\.{ext} is a "
                                                  "directory$"):
            trainer.save(str(tmp_path / f"x{ext}"))
        assert os.listdir(tmp_path / f"x{ext}.{ext}") == []
    assert sorted(os.listdir(tmp_path)) == ["xckpt.ckpt", "xenv.pkl.env.pkl", "xjson.json"]
