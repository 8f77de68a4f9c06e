"""The presets tuned for time to solve reach their bar on gymnasium's envs, evaluated as benchmarks/time_to_solve.py
does (10 deterministic episodes every eval_every steps); their wall times are measured there, not asserted here."""
import os

import pytest

from conftest import REPO


@pytest.mark.parametrize("preset, threshold, every, seed", [
    ("ppo_cartpole_fast.yaml", 475, 8192, 0),
    ("ppo_cartpole_fast.yaml", 475, 8192, 1),
    ("ppo_cartpole_fast.yaml", 475, 8192, 2),
    ("ppo_acrobot_fast.yaml", -100, 16384, 0),
    ("ppo_pendulum_fast.yaml", -200, 8192, 0),
])
def test_fast_preset_reaches_its_bar(preset, threshold, every, seed):
    from scalebox_ms.config import load_config
    from scalebox_ms.trainers import PPOTrainer
    from scalebox_ms.trainers.callbacks import EvalCallback

    cfg = load_config(os.path.join(REPO, "configs", preset),
                      [f"run.seed={seed}", "run.progress=false", "run.eval_episodes=0", "run.checkpoint_every=0"])
    stop = EvalCallback(every, episodes=10, threshold=threshold, seed=10_000 + seed)
    trainer = PPOTrainer(cfg)
    trainer.learn(callbacks=[stop])
    assert stop.solved is not None, [round(h["mean"]) for h in stop.history]
    assert trainer.global_step < cfg.run.total_steps


@pytest.mark.parametrize("preset", [
    "dqn_cartpole_fast.yaml",
    pytest.param("dqn_acrobot_fast.yaml", marks=pytest.mark.slow),
    pytest.param("sac_pendulum_fast.yaml", marks=pytest.mark.slow),
    pytest.param("td3_pendulum_fast.yaml", marks=pytest.mark.slow),
])
def test_off_policy_fast_preset_stops_solved_at_its_own_bar(preset, tmp_path):
    """The off-policy fast presets evaluate while training (run.eval_every) and stop at their bar (run.stop_return):
    DQN on CartPole, for one, falls far below the bar again by the end of its 50k steps."""
    from scalebox_ms.config import load_config
    from scalebox_ms.trainers.run import train_run

    cfg = load_config(os.path.join(REPO, "configs", preset), ["run.progress=false"])
    summary = train_run(cfg, run_dir=str(tmp_path / "run"), progress=False, log=lambda *a: None)
    assert summary["status"] == "solved", [round(e["mean"]) for e in summary["evaluations"]]
    assert summary["evaluations"][-1]["mean"] >= cfg.run.stop_return and summary["global_step"] < cfg.run.total_steps
