"""Long learning runs (marked slow; run with `pytest -m slow`). The numbers are recorded in docs/performance.md."""
import os

import numpy as np
import pytest

from scalebox_ms.config import load_config
from scalebox_ms.trainers import PPOTrainer, make_trainer
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
@pytest.mark.parametrize("preset,threshold", [("ppo_cartpole.yaml", 475), ("ppo_pendulum.yaml", -300)])
def test_the_plain_compiled_graph_path_learns(preset, threshold):
    """The presets run the C++ kernels; this keeps MindSpore's own graphs (float32 nn.Dense, autodiff update,
    builtin acting) under a learning test."""
    trainer = PPOTrainer(load_config(os.path.join(REPO, "configs", preset),
                                     ["run.seed=0", "run.progress=false", "ppo.update_kernel=builtin",
                                      "policy.act_kernel=builtin", "policy.layer=dense", "amp.level=O0"]))
    assert type(trainer.update_step).__name__ == "PPOUpdateStep" and trainer.act_step.kernel == "builtin"
    trainer.learn()
    mean = float(np.mean(evaluate_policy(trainer, episodes=20, seed=10_000)))
    trainer.close()
    assert mean >= threshold


@pytest.mark.slow
def test_pendulum_reaches_minus_300():
    assert train_and_eval("ppo_pendulum.yaml", seed=0) >= -300


@pytest.mark.slow
def test_cartpole_fp16_amp_still_learns():
    assert train_and_eval("ppo_cartpole.yaml", seed=0, **{"amp.level": "O2"}) >= 475


@pytest.mark.slow
def test_cartpole_fused_dense_solves_at_100k_steps():
    assert train_and_eval("ppo_cartpole.yaml", seed=0, **{"policy.layer": "fused"}) >= 475


@pytest.mark.integration
@pytest.mark.slow
def test_cartpole_two_workers_learn_with_identical_ranks(tmp_path):
    import json
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=REPO)
    r = subprocess.run([sys.executable, "-m", "scalebox_ms.train", "--workers", "2", "--no-progress",
                        "--run-dir", str(tmp_path / "run")], cwd=str(tmp_path), env=env, capture_output=True, text=True,
                       timeout=1200)
    assert r.returncode == 0, r.stderr[-2000:]
    summary = json.loads(r.stdout)
    assert summary["world_size"] == 2 and len(set(summary["param_sha256_per_rank"])) == 1
    assert summary["eval_mean_return"] >= 475


@pytest.mark.slow
def test_native_cartpole_solves_on_gymnasiums_env():
    """Native env + compiled rollout + update kernel (2 calls per iteration), evaluated on gymnasium's CartPole."""
    assert train_and_eval("ppo_cartpole_native.yaml", seed=0) >= 475


@pytest.mark.slow
def test_native_pendulum_reaches_minus_300_on_gymnasiums_env():
    assert train_and_eval("ppo_pendulum_native.yaml", seed=0) >= -300


def _offpolicy_eval(preset, seed, *sets):
    sets = [f"run.seed={seed}", "run.progress=false", *sets]
    trainer = make_trainer(load_config(os.path.join(REPO, "configs", preset), sets))
    trainer.learn()
    mean = float(np.mean(evaluate_policy(trainer, episodes=20, seed=10_000 + seed)))
    trainer.close()
    return mean


@pytest.mark.slow
def test_dqn_cartpole_solves_within_the_budget_for_two_of_three_seeds():
    """rl-zoo3's DQN settings and step budget (50k), stopped at the first evaluation (every 2,500 steps, 20 episodes)
    at >= 475, as SB3's EvalCallback + StopTrainingOnRewardThreshold; the issue's bar is 2 of 3 seeds. The model at
    the end of the budget is not asked to: DQN on CartPole forgets (docs/off_policy.md#measured-scores)."""
    stop = ["run.eval_every=2500", "run.eval_episodes=20", "run.stop_return=475"]
    assert sum(_offpolicy_eval("dqn_cartpole.yaml", seed, *stop) >= 475 for seed in (0, 1, 2)) >= 2


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["sac_pendulum.yaml", "td3_pendulum.yaml"])
def test_sac_and_td3_pendulum_reach_minus_200_at_20k_steps(preset):
    assert _offpolicy_eval(preset, 0) >= -200
