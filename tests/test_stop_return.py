"""Evaluation while training (``run.eval_every``) and stopping once solved (``run.stop_return``)."""
import json
import os

import pytest
import yaml

from scalebox_ms.config import Config
from scalebox_ms.errors import ConfigError
from scalebox_ms.trainers.run import train_run


def _config(**run):
    return Config.from_dict({
        "algo": "dqn", "env": {"id": "CartPole-v1", "num_envs": 2},
        "dqn": {"train_freq": 16, "gradient_steps": 4, "batch_size": 16, "learning_starts": 40, "buffer_size": 5000,
                "target_update_interval": 50},
        "run": {"seed": 1, "total_steps": 960, "progress": False, **run}})


def _run(cfg, run_dir=None, **kw):
    return train_run(cfg, run_dir=None if run_dir is None else str(run_dir), progress=False, log=lambda *a: None, **kw)


def test_evaluations_leave_training_unchanged_and_a_solved_run_stops_resumably(tmp_path, monkeypatch):
    from scalebox_ms.trainers import checkpoint

    monkeypatch.setattr(checkpoint, "OFFPOLICY_ITERATION_STEPS", 200)  # several iterations, so several evaluations
    plain = _run(_config(), tmp_path / "plain")
    evaluated = _run(_config(eval_every=300, eval_episodes=2), tmp_path / "evaluated")
    assert evaluated["status"] == plain["status"] == "completed"
    assert evaluated["param_sha256"] == plain["param_sha256"]  # evaluating draws nothing from the run's RNGs
    steps = [e["step"] for e in evaluated["evaluations"]]
    assert len(steps) >= 3 and steps == sorted(steps) and all(s % 32 == 0 for s in steps)  # at iteration ends
    assert all(e["mean"] >= 1 for e in evaluated["evaluations"])  # CartPole: every episode returns >= 1

    # any CartPole return reaches 1: the first evaluation stops the run, with a checkpoint and the final evaluation
    solved = _run(_config(eval_every=300, eval_episodes=2, stop_return=1.0), tmp_path / "solved")
    first = solved["evaluations"][0]
    assert solved["status"] == "solved" and len(solved["evaluations"]) == 1
    assert solved["global_step"] == first["step"] == steps[0] < 960
    assert solved["eval_episodes"] == 2 and solved["eval_mean_return"] is not None
    ckpts = sorted(os.listdir(tmp_path / "solved" / "checkpoints"))
    assert ckpts[-1].startswith(f"ckpt_{solved['global_step']:012d}")
    with open(tmp_path / "solved" / "summary.json") as f:
        assert json.load(f)["status"] == "solved"

    # resumed with the bar still in its config: nothing more to train (it used to train on to the next evaluation)
    again = _run(None, resume=str(tmp_path / "solved"))
    assert again["status"] == "solved" and again["global_step"] == solved["global_step"]
    assert again["param_sha256"] == solved["param_sha256"] and again["evaluations"] == solved["evaluations"]
    assert sorted(os.listdir(tmp_path / "solved" / "checkpoints")) == ckpts

    # resumed without the bar (config.yaml edited), the run goes on to the same parameters as the plain one
    cfg_path = tmp_path / "solved" / "config.yaml"
    edited = yaml.safe_load(cfg_path.read_text())
    edited["run"]["stop_return"] = None
    cfg_path.write_text(yaml.safe_dump(edited))
    resumed = _run(None, resume=str(tmp_path / "solved"))
    assert resumed["status"] == "completed" and resumed["param_sha256"] == plain["param_sha256"]
    # summary.json keeps the first session's evaluation (the checkpoint carries it): the same evaluations as the
    # run that never stopped
    assert resumed["evaluations"][0] == first
    assert [e["step"] for e in resumed["evaluations"]] == steps
    assert [e["mean"] for e in resumed["evaluations"]] == [e["mean"] for e in evaluated["evaluations"]]


@pytest.mark.parametrize("run, extra, culprit", [
    ({"stop_return": 475}, {}, "run.stop_return: needs run.eval_every >= 1"),
    ({"eval_every": 1000}, {}, "run.eval_every: needs run.eval_episodes >= 1"),
    ({"eval_every": -1, "eval_episodes": 2}, {}, "run.eval_every: must be >= 0"),
])
def test_bad_evaluation_settings_name_the_key(run, extra, culprit):
    with pytest.raises(ConfigError) as exc:
        Config.from_dict({"run": run, **extra})
    assert culprit in str(exc.value)


def test_learn_takes_its_evaluations_from_the_config_unless_given_one(monkeypatch):
    from scalebox_ms.trainers import checkpoint, make_trainer
    from scalebox_ms.trainers.callbacks import EvalCallback
    from scalebox_ms.trainers.checkpoint import sidecar_digest

    monkeypatch.setattr(checkpoint, "OFFPOLICY_ITERATION_STEPS", 200)
    cfg = _config(eval_every=300, eval_episodes=2, stop_return=1.0)
    trainer = make_trainer(cfg)
    trainer.learn()  # the library API honours run.eval_every / run.stop_return as the CLI does
    assert 300 <= trainer.global_step < 960
    trainer.close()
    own = EvalCallback(10_000, 1)  # a caller's own EvalCallback replaces the config's
    trainer = make_trainer(cfg)
    trainer.learn(callbacks=[own])
    assert trainer.global_step == 960 and own.history == []
    trainer.close()



def test_checkpoints_keep_the_evaluations_made_up_to_their_step(tmp_path, monkeypatch):
    """A checkpoint carries trainer.evaluations (what summary.json's "evaluations" lists); one from before this
    field existed loads with none. train_s counts this learn call's training time, evaluations excluded."""
    from scalebox_ms.trainers import checkpoint, make_trainer
    from scalebox_ms.trainers.callbacks import EvalCallback
    from scalebox_ms.trainers.checkpoint import sidecar_digest

    monkeypatch.setattr(checkpoint, "OFFPOLICY_ITERATION_STEPS", 64)  # an evaluation at every iteration end

    cfg = _config(total_steps=320)
    trainer = make_trainer(cfg)
    every = EvalCallback(every_steps=64, episodes=1)
    trainer.learn(until=192, callbacks=[every])
    assert [e["step"] for e in trainer.evaluations] == [64, 128, 192] and trainer.evaluations == every.history
    assert 0 <= every.history[0]["train_s"] < every.history[1]["train_s"] < every.history[2]["train_s"]
    trainer.learn(until=256, callbacks=[every])  # a second learn call: train_s starts again, eval_s adds up
    assert len(every.history) == 4 and every.history[3]["train_s"] < every.history[2]["train_s"]
    trainer.save(str(tmp_path / "ck"))
    again = make_trainer(cfg)
    again.load(str(tmp_path / "ck"))
    assert again.evaluations == trainer.evaluations
    sidecar = tmp_path / "ck.json"
    data = json.loads(sidecar.read_text())
    del data["evaluations"]
    data["sidecar_sha256"] = sidecar_digest(data)  # (as a checkpoint written before the field existed)
    sidecar.write_text(json.dumps(data))
    older = make_trainer(cfg)
    older.load(str(tmp_path / "ck"))
    assert older.evaluations == []
