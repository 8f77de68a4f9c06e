"""Long learning runs (marked slow; run with `pytest -m slow`). The numbers are recorded in README."""
import os

import numpy as np
import pytest

from scalebox_ms.config import load_config
from scalebox_ms.trainers import PPOTrainer
from scalebox_ms.trainers.evaluation import evaluate_policy

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def train_and_eval(preset, seed, episodes=20, **overrides):
    sets = [f"run.seed={seed}", "run.progress=false"] + [f"{k}={v}" for k, v in overrides.items()]
    trainer = PPOTrainer(load_config(os.path.join(REPO, "configs", preset), sets))
    trainer.learn()
    mean = float(np.mean(evaluate_policy(trainer, episodes=episodes, seed=10_000 + seed)))
    trainer.close()
    return mean


@pytest.mark.slow
def test_cartpole_solves_at_100k_steps():
    assert train_and_eval("ppo_cartpole.yaml", seed=0) >= 475


@pytest.mark.slow
def test_pendulum_reaches_minus_300():
    assert train_and_eval("ppo_pendulum.yaml", seed=0) >= -300
