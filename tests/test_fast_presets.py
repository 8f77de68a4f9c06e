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
