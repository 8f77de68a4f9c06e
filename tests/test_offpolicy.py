"""Off-policy DQN/SAC/TD3: config sections, the replay buffer's masked adds, SAC's squashed log-probability,
truncation handling, checkpoints and resume, MindIR export of the actor (the compiled DQN phase against a
step-by-step PyNative reference: test_offpolicy_kernels.py)."""
import json
import logging
import math
import os
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest

from scalebox_ms import Config, ConfigError, load_config

from conftest import REPO, run_module


def dqn_config(**dqn):
    return Config.from_dict({
        "algo": "dqn", "env": {"id": "CartPole-v1", "num_envs": 2},
        "dqn": {"train_freq": 16, "gradient_steps": 4, "batch_size": 16, "learning_starts": 40, "buffer_size": 5000,
                "target_update_interval": 50, **dqn},
        "run": {"seed": 1, "total_steps": 2000, "progress": False}})


def sac_config(algo="sac", **section):
    return Config.from_dict({
        "algo": algo, "env": {"id": "Pendulum-v1", "num_envs": 1},
        "policy": {"pi_layers": [32, 32], "vf_layers": [32, 32]},
        algo: {"batch_size": 32, "learning_starts": 50, "buffer_size": 5000, **section},
        "run": {"seed": 2, "total_steps": 2000, "progress": False}})


# ---------------------------------------------------------------------- config
def test_algo_sections_and_defaults():
    cfg = Config().with_overrides(["algo=sac"])
    assert cfg.algo == "sac" and cfg.policy.pi_layers == [256, 256] and cfg.policy.activation == "relu"
    assert "ppo" not in cfg.to_dict() and "sac" in cfg.to_dict()
    assert Config.from_dict(cfg.to_dict()) == cfg
    td3 = cfg.with_overrides(["policy.vf_layers=[8]", "algo=td3"])
    assert td3.policy.pi_layers == [400, 300] and td3.policy.vf_layers == [8]  # the user's change is kept
    assert Config().to_dict()["algo"] == "ppo" and "dqn" not in Config().to_dict()
    # in Python as from a file: Config(algo=...) and cfg.algo = ... kept PPO's 64-64 tanh networks for SAC
    by_attribute = Config()
    by_attribute.algo = "sac"
    assert by_attribute == Config(algo="sac") == cfg
    by_attribute.policy.vf_layers = [8]
    by_attribute.algo = "td3"
    assert by_attribute == td3 and Config(algo="td3") != td3
    # a policy given explicitly is the caller's: neither replaced by the algorithm's defaults nor changed
    import dataclasses

    from scalebox_ms.config import PolicyConfig

    mine = PolicyConfig()
    assert Config(algo="sac", policy=mine).policy.pi_layers == [64, 64] and mine.pi_layers == [64, 64]
    small = Config(algo="sac")
    small.policy.pi_layers = [64, 64]
    assert dataclasses.replace(small, algo="sac").policy.pi_layers == [64, 64] == small.policy.pi_layers
    switched = dataclasses.replace(small)
    switched.algo = "td3"  # (switching one config leaves the other's shared policy as it was)
    assert switched.policy.vf_layers == [400, 300] and small.policy.vf_layers == [256, 256]


@pytest.mark.parametrize("data, message", [
    ({"algo": "dqn", "sac": {}}, "sac: a section of algo sac, but this config trains algo dqn"),
    ({"algo": "ddpg"}, "algo: 'ddpg' is not one of ppo, dqn, sac, td3"),
    ({"algo": "sac", "sac": {"tau": 0}}, "sac.tau: must be in (0, 1]"),
    ({"algo": "sac", "sac": {"ent_coef": "auto_x"}}, "sac.ent_coef: expected 'auto'"),
    ({"algo": "dqn", "dqn": {"gradient_steps": 0}}, "dqn.gradient_steps: must be >= 1, or -1"),
    # (an int32 constant in the graph: 2**31 wrapped to a negative delay)
    ({"algo": "td3", "td3": {"policy_delay": 2**31}}, "td3.policy_delay: must be in [1, 2**31 - 1], got 2147483648"),
    ({"algo": "sac", "sac": {"buffer_size": 2**31}}, "sac.buffer_size: must be in [1, 2**31 - 1], got 2147483648"),
    ({"algo": "dqn", "dqn": {"batch_size": 10, "buffer_size": 5}}, "dqn.batch_size: must be in [1, dqn.buffer_size"),
    ({"algo": "td3", "policy": {"layer": "fused"}}, "policy.layer: 'fused' applies to ppo only"),
    ({"algo": "sac", "parallel": {"workers": 2}, "env": {"num_envs": 2}}, "parallel.workers: data parallelism"),
    ({"algo": "dqn", "parallel": {"micro_batch_size": 4}}, "parallel.micro_batch_size: applies to ppo only"),
    ({"algo": "dqn", "parallel": {"gradient_accumulation": 2}}, "parallel.gradient_accumulation: applies to ppo only"),
    ({"algo": "sac", "parallel": {"pipeline_stages": 2}}, "parallel.pipeline_stages: scalebox_ms has no pipeline "
                                                          "parallelism"),  # (was accepted and ignored)
    ({"algo": "dqn", "env": {"normalize_reward": True}}, "env.normalize_reward: not supported with algo dqn"),
])
def test_bad_off_policy_configs_name_the_key(data, message):
    with pytest.raises(ConfigError) as exc:
        Config.from_dict(data)
    assert message in str(exc.value) and "\n" not in str(exc.value)


def test_set_key_of_another_algorithm_is_refused():
    with pytest.raises(ConfigError, match=r"--set dqn.tau: a key of algo dqn, but this config trains algo ppo"):
        Config().with_overrides(["dqn.tau=0.5"])


@pytest.mark.parametrize("algo, env_id, what", [("dqn", "Pendulum-v1", "Discrete"), ("sac", "CartPole-v1", "Box"),
                                                 ("td3", "CartPole-v1", "Box")])
def test_algorithm_refuses_the_wrong_action_space(algo, env_id, what):
    from scalebox_ms.trainers import make_trainer

    with pytest.raises(ConfigError, match=f"algo: {algo} needs a {what} action space"):
        make_trainer(Config.from_dict({"algo": algo, "env": {"id": env_id, "num_envs": 1}}))


class _HugeBox(gym.Env):
    """Pendulum-like observations; actions in a Box whose high - low (6.8e38) overflows float32."""
    observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    action_space = gym.spaces.Box(-3.4e38, 3.4e38, (1,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(3, np.float32), {}

    def step(self, action):
        return np.zeros(3, np.float32), 0.0, False, False, {}


@pytest.mark.parametrize("algo", ["sac", "td3"])
def test_an_action_box_wider_than_float32_is_refused(algo):
    """The actor's [-1, 1] maps onto the bounds with 0.5 * (high - low) in float32: inf there, so the exported
    MindIR and the native cycle gave inf actions where predict (float64) gave finite ones."""
    from scalebox_ms.trainers import make_trainer

    if "HugeBox-v0" not in gym.registry:
        gym.register("HugeBox-v0", entry_point=_HugeBox, max_episode_steps=50)
    with pytest.raises(ConfigError, match=rf"^algo: {algo} maps its actions in \[-1, 1\] onto the Box's bounds in "
                                          r"float32, and HugeBox-v0's action space has high - low beyond"):
        make_trainer(Config.from_dict({"algo": algo, "env": {"id": "HugeBox-v0", "num_envs": 1}}))


# ---------------------------------------------------------------------- replay buffer
@pytest.mark.parametrize("sac, culprit", [
    ({"ent_coef": "auto_inf"}, "sac.ent_coef: expected 'auto', 'auto_<initial value>' with a value in"),
    ({"ent_coef": "auto_1e39"}, "sac.ent_coef: expected 'auto', 'auto_<initial value>' with a value in"),
    # (0 in float32: its log, the learned Parameter, -inf; the temperature never moved, ent_coef_loss nan unnoticed)
    ({"ent_coef": "auto_1e-50"}, r"sac.ent_coef: expected 'auto', 'auto_<initial value>' with a value in \[1.2e-38, "
                                 r"1e38\] \(its float32 log finite both ways\), or such a number, got 'auto_1e-50'$"),
    ({"ent_coef": 1e-50}, r"sac.ent_coef: must be in \[1.2e-38, 1e38\] \(its float32 log finite both ways\), got "
                          r"1e-50$"),
    ({"ent_coef": 3.4e38}, r"sac.ent_coef: must be in \[1.2e-38, 1e38\]"),  # (exp(float32 log) of it: inf)
    ({"ent_coef": 1e39}, r"sac.ent_coef: expected a number finite in float32 \(\|x\| <= 3.4e38\)"),
    ({"target_entropy": 1e39}, r"sac.target_entropy: expected a number finite in float32"),
    ({"ent_coef": [1]}, r"sac.ent_coef: expected a number or 'auto'/'auto_<initial value>', got \[1\]$"),
    ({"learning_rate": 1e39}, r"sac.learning_rate: expected a number finite in float32 \(\|x\| <= 3.4e38\)"),
])
def test_values_beyond_float32_are_refused_at_config_time(sac, culprit):
    """They passed as finite float64 and became inf in the float32 graphs: the run directory was made, then every
    training phase was skipped as non-finite (ent_coef), or the temperature froze silently (target_entropy)."""
    with pytest.raises(ConfigError, match="^" + culprit):
        Config.from_dict({"algo": "sac", "env": {"id": "Pendulum-v1"}, "sac": sac})


def test_sac_with_a_linear_actor_trains():
    """policy.pi_layers: [] (a linear policy, as for TD3 and PPO) used to fail with IndexError in the actor."""
    from scalebox_ms.trainers import make_trainer

    tr = make_trainer(Config.from_dict({"algo": "sac", "env": {"id": "Pendulum-v1", "num_envs": 1},
                                        "policy": {"pi_layers": [], "vf_layers": [32]},
                                        "sac": {"learning_starts": 32, "batch_size": 16, "buffer_size": 256},
                                        "run": {"total_steps": 64, "progress": False}}))
    try:
        tr.learn()
        assert tr.global_step == 64 and np.isfinite(tr.predict(np.zeros(3, np.float32))).all()
        assert [n for n, _ in tr.model.actor.parameters_and_names() if "latent_pi" in n] == []
    finally:
        tr.close()


@pytest.mark.parametrize("config", ["configs/sac_pendulum.yaml", 3, ["algo", "sac"]])
def test_make_trainer_refuses_what_is_not_a_config_in_one_line(config):
    """make_trainer used to fail with AttributeError ('str' object has no attribute 'algo') where the trainer
    classes give a ConfigError."""
    from scalebox_ms.trainers import make_trainer

    hint = r" \(a YAML file: load_config\(path\)\)" if isinstance(config, str) else "$"
    with pytest.raises(ConfigError, match=rf"^config: expected Config, dict or None, got {type(config).__name__}{hint}"):
        make_trainer(config)


def test_masked_add_matches_a_numpy_ring_buffer():
    from scalebox_ms.buffers import ReplayBuffer
    from scalebox_ms.sandbox import Sandbox

    Sandbox(device="cpu", seed=0)
    import mindspore as ms

    buf = ReplayBuffer(10, {"x": ((2,), np.float32), "a": ((), np.int32)}, spare_row=True)
    phase = _MaskedAdd(buf)
    rng = np.random.default_rng(0)
    ref = []
    for _ in range(5):  # 5 x 6 rows with a random mask: wraps around the ring of 10 twice
        x = rng.standard_normal((6, 2)).astype(np.float32)
        a = rng.integers(0, 100, 6).astype(np.int32)
        valid = (rng.random(6) < 0.7).astype(np.int32)
        phase(ms.mutable((ms.Tensor(x), ms.Tensor(a))), ms.Tensor(valid))
        ref += [(xi, ai) for xi, ai, v in zip(x, a, valid) if v]
    kept = ref[-10:]
    pos = len(ref) % 10
    order = kept[-pos:] + kept[:-pos] if pos else kept  # ring order: slot i holds item i mod 10
    st = buf.state_dict()
    assert int(st["_size"]) == 10 and int(st["_position"]) == pos
    np.testing.assert_array_equal(st["x"], np.stack([r[0] for r in order]))
    np.testing.assert_array_equal(st["a"], np.array([r[1] for r in order]))


class _MaskedAdd:
    def __init__(self, buf):
        import mindspore as ms
        from mindspore import nn

        class Add(nn.Cell):
            def __init__(self):
                super().__init__(auto_prefix=False)
                self.buf = buf

            @ms.jit
            def construct(self, items, valid):
                return self.buf.add_masked(items, valid)

        self.cell = Add()

    def __call__(self, items, valid):
        return self.cell(items, valid)


def test_sac_log_prob_matches_numpy():
    from mindspore import Tensor

    from scalebox_ms.models.offpolicy import SquashedGaussianActor
    from scalebox_ms.sandbox import Sandbox

    Sandbox(device="cpu", seed=0)
    actor = SquashedGaussianActor(3, 2, [16, 16])
    rng = np.random.default_rng(0)
    obs = rng.standard_normal((5, 3)).astype(np.float32)
    eps = rng.standard_normal((5, 2)).astype(np.float32)
    action, log_prob = (x.asnumpy() for x in actor.action_log_prob(Tensor(obs), Tensor(eps)))
    w = {n: p.asnumpy() for n, p in actor.parameters_and_names()}
    h = np.maximum(obs @ w["latent_pi.0.weight"].T + w["latent_pi.0.bias"], 0)
    h = np.maximum(h @ w["latent_pi.2.weight"].T + w["latent_pi.2.bias"], 0)
    mean = h @ w["mu.weight"].T + w["mu.bias"]
    log_std = np.clip(h @ w["log_std.weight"].T + w["log_std.bias"], -20, 2)
    u = mean + np.exp(log_std) * eps
    ref_logp = (-0.5 * ((u - mean) / np.exp(log_std)) ** 2 - log_std - 0.5 * np.log(2 * np.pi)).sum(1)
    ref_logp -= np.log(1 - np.tanh(u) ** 2 + 1e-6).sum(1)
    # float32 MLP in MindSpore vs float32 numpy: ~10 ulp apart on this 2-core AVX-512 machine (MindSpore's tanh)
    np.testing.assert_allclose(action, np.tanh(u), atol=5e-6)
    np.testing.assert_allclose(log_prob, ref_logp, rtol=1e-5, atol=1e-5)


def test_squashed_actions_and_log_prob_follow_float64_tanh_where_mindspores_saturates():
    """MindSpore 2.10's CPU Tanh returns up to 1.0000098 near |u| = 5 (SAC's log(1 - a^2 + 1e-6) was NaN there and
    the gradient step was skipped) and exactly 1.0, gradient 0, from |u| of about 4.97 on, where float32's tanh is
    0.99990: the log-probability was up to 5.2 nats too high and the actor got no gradient out of saturation.
    u = eps here (zero weights, log-std 0); the reference is numpy in float64."""
    from mindspore import Tensor, nn, ops

    from scalebox_ms.models.offpolicy import DeterministicActor, SquashedGaussianActor
    from scalebox_ms.sandbox import Sandbox

    Sandbox(device="cpu", seed=0)
    actor = SquashedGaussianActor(3, 1, [16])
    for p in actor.get_parameters():
        p.set_data(Tensor(np.zeros(p.shape, np.float32)))
    u = np.concatenate([np.linspace(-30, 30, 6001), np.linspace(4.95, 5.05, 101), [0.0]]).astype(np.float32)[:, None]
    obs = Tensor(np.zeros((len(u), 3), np.float32))
    action, log_prob = (x.asnumpy() for x in actor.action_log_prob(obs, Tensor(u)))

    class LogProbSum(nn.Cell):
        def construct(self, eps):
            return actor.action_log_prob(obs, eps)[1].sum()

    grad = ops.GradOperation()(LogProbSum())(Tensor(u)).asnumpy()
    u64 = u.astype(np.float64)
    t = np.tanh(u64)
    ref_logp = (-0.5 * u64 ** 2 - 0.5 * np.log(2 * np.pi) - np.log(1 - t ** 2 + 1e-6)).sum(1)
    ref_grad = -u64 + 2 * t * (1 - t ** 2) / (1 - t ** 2 + 1e-6)
    assert np.abs(action).max() <= 1.0 and np.isfinite(log_prob).all()
    np.testing.assert_allclose(action, t, atol=3e-6)
    np.testing.assert_allclose(log_prob, ref_logp, rtol=1e-6, atol=2e-5)
    np.testing.assert_allclose(grad, ref_grad, rtol=1e-6, atol=2e-5)
    td3 = DeterministicActor(3, 1, [])
    for p in td3.get_parameters():
        p.set_data(Tensor(np.full(p.shape, 6.0 if p.ndim == 1 else 0.0, np.float32)))
    np.testing.assert_allclose(td3(Tensor(np.zeros((2, 3), np.float32))).asnumpy(), np.tanh(6.0), atol=3e-7)


# ---------------------------------------------------------------------- the loop
def test_truncation_stores_the_true_final_observation():
    """CartPole cut at 5 steps: every stored transition's next_obs is the env's own next observation; at a
    truncation it is the final observation (not the reset one) and terminated is 0; autoreset steps are skipped."""
    from scalebox_ms.trainers import make_trainer

    cfg = Config.from_dict({"algo": "dqn", "env": {"id": "CartPole-v1", "num_envs": 1, "kwargs": {"max_episode_steps": 5}},
                            "dqn": {"train_freq": 12, "learning_starts": 10_000, "buffer_size": 2000},
                            "run": {"seed": 0, "total_steps": 1000, "progress": False}})
    t = make_trainer(cfg)
    t.learn(until=t.steps_per_iteration)
    st = t.replay.state_dict()
    steps = t.global_step
    n_episodes = t.episodes
    assert len(t.replay) == steps - (steps // 6)  # every 6th step is an autoreset step, not stored
    assert n_episodes >= 100 and st["terminated"].sum() < n_episodes  # most episodes were truncated
    o, no = st["obs"], st["next_obs"]
    cont = np.arange(len(o) - 1) % 5 != 4  # within an episode, next_obs is the next row's obs
    np.testing.assert_array_equal(no[:-1][cont], o[1:][cont])
    trunc_rows = np.flatnonzero(~cont)
    assert not np.array_equal(no[trunc_rows], o[trunc_rows + 1])  # the final obs, not the next episode's first
    t.close()


def _train_run(cfg, run_dir, **kw):
    from scalebox_ms.trainers.run import train_run

    return train_run(cfg, run_dir=None if run_dir is None else str(run_dir), progress=False, log=lambda *a: None,
                     **kw)


def _vec(cfg, num_envs):
    cfg.env.num_envs = num_envs
    return cfg


def _native(cfg):
    cfg.env.backend = "native"
    return cfg


@pytest.mark.parametrize("make", [dqn_config, lambda: _vec(sac_config(train_freq=4, gradient_steps=2), 4),
                                  lambda: _vec(sac_config("td3", action_noise=0.1, train_freq=4, gradient_steps=2), 4),
                                  lambda: _native(_vec(sac_config(train_freq=4, gradient_steps=2), 2))],
                         ids=["dqn", "sac", "td3", "sac-native"])
def test_until_then_resume_is_bit_identical(make, tmp_path, monkeypatch):
    """(SAC/TD3 on 4 envs: replay adds of several rows per step, and a quarter of the acting calls; the pause falls
    inside every env's first Pendulum episode. Iterations of at least 200 env steps, so the run has several.
    Native: the compiled training cycle steps the env's own Parameters, which a resume must refill, not replace.)"""
    from scalebox_ms.trainers import checkpoint

    monkeypatch.setattr(checkpoint, "OFFPOLICY_ITERATION_STEPS", 200)
    cfg = make()
    cfg.run.total_steps = 960
    full = _train_run(cfg, tmp_path / "full")
    half = _train_run(cfg, tmp_path / "half", until=480)
    assert half["status"] == "paused" and half["global_step"] < full["global_step"] and full["iterations"] >= 4
    ck = sorted(os.listdir(tmp_path / "half" / "checkpoints"))
    assert any(f.endswith(".replay.npz") for f in ck)
    resumed = _train_run(None, None, resume=str(tmp_path / "half"))
    assert resumed["status"] == "completed"
    assert resumed["param_sha256"] == full["param_sha256"]
    assert resumed["episodes"] == full["episodes"] > half["episodes"]


@pytest.mark.parametrize("algo", ["td3", "dqn"])
def test_warmup_rows_in_one_call_per_iteration_train_as_one_phase_call_each(algo, tmp_path, monkeypatch):
    """Before learning_starts a phase only adds its rows to the replay: the trainer adds them in one call per
    iteration. Replay, weights and metrics equal those of one phase call per train_freq (the reference), with far
    fewer phase calls; a pause inside the warm-up resumes bit-identically. (Iterations of at least 200 env steps
    instead of 1,000: the same code paths, a fifth of the phase calls.)"""
    from scalebox_ms.trainers import Callback, checkpoint, make_trainer
    from scalebox_ms.trainers.offpolicy import OffPolicyTrainer

    monkeypatch.setattr(checkpoint, "OFFPOLICY_ITERATION_STEPS", 200)
    learning_starts, total = 260, 320  # a whole warm-up iteration, then one that starts learning part-way

    class Rows(Callback):
        def __init__(self):
            self.rows = []

        def on_iteration_end(self, trainer, metrics):
            self.rows.append(dict(metrics))

    def make():
        cfg = sac_config("td3", train_freq=1, learning_starts=learning_starts) if algo == "td3" else dqn_config(
            learning_starts=learning_starts)
        cfg.run.total_steps = total
        return cfg

    seen = {}
    for batching in (False, True):
        monkeypatch.setattr(OffPolicyTrainer, "warmup_batching", batching)
        tr = make_trainer(make())
        calls, phase = [], tr.phase
        tr.phase = lambda *args: calls.append(1) or phase(*args)
        rows = Rows()
        tr.learn(callbacks=[rows])
        seen[batching] = (tr.parameters_sha256(), tr.replay.state_dict(), rows.rows, len(calls), tr.global_step)
        assert tr.steps_per_iteration == (200 if algo == "td3" else 224)  # (DQN: 7 phases of 16 steps x 2 envs)
        tr.close()
    (sha0, replay0, rows0, calls0, steps0), (sha1, replay1, rows1, calls1, steps1) = seen[False], seen[True]
    assert steps0 == steps1 == total and sha1 == sha0 and len(rows0) == 2
    assert set(replay1) == set(replay0) and int(replay1["_size"]) == int(replay0["_size"]) > learning_starts
    for k in replay0:
        np.testing.assert_array_equal(replay1[k], replay0[k], err_msg=k)
    drop = ("wall_time_s", "steps_per_second", "update_time_s", "share_env", "share_act", "share_update",
            "share_other", "update_samples_per_s")
    # (repr: the warm-up iteration's statistics are nan, and nan equals nan there)
    assert repr([{k: v for k, v in r.items() if k not in drop} for r in rows1]) == \
        repr([{k: v for k, v in r.items() if k not in drop} for r in rows0])
    # no gradient step in the first iteration: no loss to report (it read 0.0; SAC's ent_coef too), and then some
    loss = "critic_loss" if algo == "td3" else "loss"
    assert rows0[0]["n_updates"] == 0 and math.isnan(rows0[0][loss]) and math.isnan(rows0[0]["q_values"])
    assert rows0[1]["n_updates"] > 0 and math.isfinite(rows0[1][loss])
    if algo == "td3":  # one phase call per env step, none for the phases that end before learning_starts
        assert (calls0, calls1) == (total, total - (learning_starts - 1))
    else:  # DQN's warm-up phases that copy the target network (every 25 steps per env here) still run
        assert calls1 <= calls0
    cfg = make()
    half = _train_run(cfg, tmp_path / "half", until=230)  # inside the warm-up part of the second iteration
    # the warm-up rows are in the checkpoint's replay (one row fewer per episode end: gymnasium's autoreset step)
    steps = half["global_step"]  # (the first phase boundary at or past 230: DQN's phases are 32 rows here)
    assert half["status"] == "paused" and 230 <= steps < min(learning_starts, 230 + 32)
    assert steps - half["episodes"] <= half["replay_size"] < steps
    assert _train_run(None, None, resume=str(tmp_path / "half"))["param_sha256"] == sha1


def test_save_replay_false_writes_no_replay_and_resume_refills(tmp_path):
    cfg = dqn_config()
    cfg.run.save_replay = False
    cfg.run.total_steps = 2000
    _train_run(cfg, tmp_path / "r", until=1000)
    assert not [f for f in os.listdir(tmp_path / "r" / "checkpoints") if f.endswith(".replay.npz")]
    out = _train_run(None, None, resume=str(tmp_path / "r"))
    assert out["status"] == "completed" and out["replay_size"] < out["global_step"] - 1000 + 64


@pytest.mark.parametrize("algo", ["dqn", "sac"])
def test_loading_into_a_trainer_that_trained_on_restarts_from_the_checkpoint(tmp_path, algo):
    """A checkpoint saved before any step (no in-flight state) and without its replay, loaded into a trainer that
    has trained since: the trainer kept its own episodes and replay rows (the log said the buffer starts empty),
    so learning on differed from the checkpoint's own continuation."""
    from scalebox_ms.trainers import make_trainer

    cfg = dqn_config() if algo == "dqn" else _vec(sac_config(train_freq=4, gradient_steps=2), 2)
    cfg.run.save_replay = False
    fresh = make_trainer(cfg)
    fresh.learn(until=400)
    t = make_trainer(cfg)
    try:
        start = t.save(str(tmp_path / "start"))
        t.learn(until=400)
        assert len(t.replay) > 0
        t.load(start)
        assert len(t.replay) == 0 and t.global_step == 0
        t.learn(until=400)
        assert t.parameters_sha256() == fresh.parameters_sha256() and len(t.replay) == len(fresh.replay)
    finally:
        t.close()
        fresh.close()


def test_a_checkpoint_fine_tuned_with_another_train_freq_loads_again(tmp_path):
    """train_freq 1 to step 60, then train_freq 8 to step 124: that checkpoint was refused ('global_step 124 does not
    fit iteration 2 of 1000 env steps per iteration')."""
    from scalebox_ms.trainers import load_trainer, make_trainer

    a = make_trainer(sac_config(learning_starts=20))
    b = make_trainer(sac_config(learning_starts=20, train_freq=8))
    try:
        a.learn(until=60)
        b.load(a.save(str(tmp_path / "a")))
        b.learn(until=124)
        c = load_trainer(b.save(str(tmp_path / "b")))
        assert (c.global_step, c.steps_base) == (124, (60, 1))
        c.close()
    finally:
        a.close(), b.close()


def test_a_fixed_ent_coef_stays_the_trainers_own_after_load(tmp_path):
    """A checkpoint of sac.ent_coef 0.5 loaded into a trainer of 0.01 (fine-tuning) trained on with 0.5: the
    temperature lives in a Parameter, which load restored."""
    from scalebox_ms.trainers import make_trainer

    a = make_trainer(sac_config(ent_coef=0.5, learning_starts=20))
    b = make_trainer(sac_config(ent_coef=0.01, learning_starts=20))
    try:
        a.learn(until=40)
        b.load(a.save(str(tmp_path / "a")))
        assert np.exp(b.learner.log_alpha.asnumpy()[0]) == pytest.approx(0.01, rel=1e-6)
        b.learn(until=60)
        assert b._last_metrics["ent_coef"] == pytest.approx(0.01, rel=1e-5)
    finally:
        a.close(), b.close()


def test_a_checkpoint_of_another_parameter_set_is_refused_before_anything_is_loaded(tmp_path):
    """ent_coef 'auto' (a temperature optimizer) into a trainer of a fixed ent_coef: load overwrote the weights, the
    counters and the replay, then failed with 'restored parameters do not hash to the recorded param_sha256', and the
    half-loaded trainer trained and saved on."""
    from scalebox_ms.errors import CheckpointError
    from scalebox_ms.trainers import make_trainer

    a = make_trainer(sac_config(learning_starts=20))
    b = make_trainer(sac_config(ent_coef=0.5, learning_starts=20))
    try:
        a.learn(until=40)
        path = a.save(str(tmp_path / "a"))
        before = b.get_parameters()
        with pytest.raises(CheckpointError, match=r"it holds model\.alpha_optimizer\..* and 2 more, which this model "
                                                  r"has no place for; it was trained with another config \(sac\.ent_coef="
                                                  r"auto -> 0\.5: checkpoint -> this trainer\)"):
            b.load(path)
        assert b.global_step == 0 and len(b.replay) == 0
        assert all(np.array_equal(before[n], v) for n, v in b.get_parameters().items())
        with pytest.raises(CheckpointError, match=r"missing model\.alpha_optimizer.*sac\.ent_coef=0\.5 -> auto"):
            a.load(b.save(str(tmp_path / "b")))
    finally:
        a.close(), b.close()


def test_save_after_learn_was_interrupted_mid_phase_is_refused_in_one_line(tmp_path):
    """A KeyboardInterrupt inside a training phase (Ctrl-C in one's own script) left global_step between phase
    boundaries: save wrote a checkpoint that load then refused ("global_step 53 does not fit iteration 0").
    save now says so at once; loading a checkpoint makes the trainer savable again."""
    from scalebox_ms.errors import CheckpointError
    from scalebox_ms.trainers import make_trainer

    t = make_trainer(dqn_config())
    try:
        t.learn(until=64)
        good = t.save(str(tmp_path / "good"))
        real, calls = t.collector.step_env, []

        def ctrl_c_after_the_first(*args):  # (the envs moved, the step counter not yet)
            calls.append(1)
            out = real(*args)
            if len(calls) == 1:
                raise KeyboardInterrupt
            return out

        t.collector.step_env = ctrl_c_after_the_first
        with pytest.raises(KeyboardInterrupt):
            t.learn(until=400)
        t.collector.step_env = real
        assert t.global_step == 64
        with pytest.raises(CheckpointError, match=r"^save: learn\(\) of this DQNTrainer was interrupted inside an "
                                                  r"iteration \(after step 64\)"):
            t.save(str(tmp_path / "torn"))
        assert not list(tmp_path.glob("torn*"))
        t.load(good)
        assert t.save(str(tmp_path / "again")) and t.global_step == 64
    finally:
        t.close()


def test_corrupt_replay_file_is_refused(tmp_path):
    from scalebox_ms.errors import CheckpointError

    cfg = dqn_config()
    _train_run(cfg, tmp_path / "r", until=1000)
    ckdir = tmp_path / "r" / "checkpoints"
    replay = sorted(f for f in os.listdir(ckdir) if f.endswith(".replay.npz"))[-1]
    with open(ckdir / replay, "r+b") as f:
        f.seek(200)
        f.write(b"\x00\x01\x02")
    with pytest.raises(CheckpointError, match=r"\.replay\.npz \(its replay buffer\) is missing or corrupt; to continue "
                                              r"from ckpt_\d+ with an empty buffer that refills"):
        _train_run(None, None, resume=str(tmp_path / "r"), checkpoint=str(ckdir / replay[: -len(".replay.npz")]))


@pytest.mark.parametrize("learning_starts, warned", [(64, True), (40, False)])
def test_a_run_that_never_reaches_learning_starts_says_so(caplog, learning_starts, warned):
    """A run whose learning_starts is at or past its total_steps completed with n_updates 0, without a word."""
    from scalebox_ms.trainers import make_trainer

    t = make_trainer(dqn_config(learning_starts=learning_starts))
    try:
        with caplog.at_level(logging.WARNING, logger="scalebox_ms"):
            t.learn(64)
        words = "dqn.learning_starts 64 >= run.total_steps 64: every step of this run is a random warm-up action"
        assert (words in caplog.text) is warned and (t.n_updates == 0) is warned
    finally:
        t.close()


def test_a_lost_replay_file_refused_on_resume_unless_the_run_does_without_its_replay(tmp_path, caplog):
    """The latest checkpoint's replay file damaged or deleted (the disk, a user freeing space): the resume was
    refused even with run.save_replay: false in config.yaml, so the run could only go back to an older checkpoint.
    The refusal now says how to go on from it with an empty buffer, and with save_replay false it does."""
    import yaml

    from scalebox_ms.errors import CheckpointError

    cfg = dqn_config()
    cfg.run.total_steps = 2000
    run = tmp_path / "r"
    first = _train_run(cfg, run, until=1000)
    name = f"ckpt_{first['global_step']:012d}"
    os.remove(run / "checkpoints" / f"{name}.replay.npz")
    with pytest.raises(CheckpointError) as refused:
        _train_run(None, None, resume=str(run))
    assert str(refused.value) == (
        f"--resume {run}: {name}.replay.npz (its replay buffer) is missing or corrupt; to continue from {name} with an "
        "empty buffer that refills (not bit-identical), set run.save_replay: false in the run's config.yaml; or go "
        f"back to the newest intact checkpoint: --checkpoint {run / 'checkpoints' / 'ckpt_000000000000'}.json")
    with open(run / "config.yaml") as f:
        saved = yaml.safe_load(f)
    saved["run"]["save_replay"] = False
    with open(run / "config.yaml", "w") as f:
        yaml.safe_dump(saved, f)
    with caplog.at_level(logging.WARNING, logger="scalebox_ms"):
        out = _train_run(None, None, resume=str(run))
    assert "its replay buffer file is missing or corrupt; with run.save_replay: false the buffer starts empty" in \
        caplog.text
    assert out["status"] == "completed" and out["replay_size"] < out["global_step"] - first["global_step"] + 64


def test_evaluate_and_export_neither_read_nor_allocate_the_replay_buffer(tmp_path, monkeypatch):
    """The trainer evaluate/export build acts only: the checkpoint's replay (as large as training's) stays on disk
    and the buffer is the least one training phase needs, yet the policy is the checkpoint's."""
    from scalebox_ms.buffers.device import ReplayBuffer
    from scalebox_ms.trainers import acting_trainer
    from scalebox_ms.trainers.evaluation import evaluate_policy

    cfg = dqn_config()
    out = _train_run(cfg, tmp_path / "r", until=1000)
    monkeypatch.setattr(ReplayBuffer, "load_state_dict", lambda *a: pytest.fail("the replay buffer was read"))
    trainer, prefix = acting_trainer(load_config(str(tmp_path / "r" / "config.yaml")), str(tmp_path / "r"))
    try:
        assert os.path.exists(prefix + ".replay.npz")
        assert trainer.replay.capacity == max(cfg.dqn.batch_size, cfg.dqn.train_freq * cfg.env.num_envs) < 5000
        assert len(trainer.replay) == 0 and trainer.parameters_sha256() == out["param_sha256"]
        assert len(evaluate_policy(trainer, episodes=2, seed=3)) == 2
    finally:
        trainer.close()


def test_the_acting_trainer_refuses_to_train_or_save_and_says_nothing_of_an_unsaved_replay(tmp_path, caplog):
    """acting_trainer's DQN has a one-phase replay buffer and no optimizer kernels: learn() trained with it and save()
    wrote a checkpoint whose config claimed a buffer_size the run never had. Loading a checkpoint written without
    its replay warned that 'the buffer starts empty' also for evaluate/export, which never read it."""
    import logging

    from scalebox_ms.errors import ConfigError
    from scalebox_ms.trainers import acting_trainer, make_trainer

    cfg = dqn_config()
    cfg.run.save_replay = False
    _train_run(cfg, tmp_path / "r", until=1000)
    with caplog.at_level(logging.WARNING, logger="scalebox_ms"):
        trainer, prefix = acting_trainer(load_config(str(tmp_path / "r" / "config.yaml")), str(tmp_path / "r"))
    try:
        assert "without its replay buffer" not in caplog.text
        for call in (lambda: trainer.learn(until=2000), lambda: trainer.save(str(tmp_path / "x"))):
            with pytest.raises(ConfigError, match=r"^(learn|save): this DQNTrainer was built by acting_trainer"):
                call()
        assert trainer.global_step == int(prefix[-12:]) and not list(tmp_path.glob("x*"))
    finally:
        trainer.close()
    full = make_trainer(load_config(str(tmp_path / "r" / "config.yaml")))
    try:
        with caplog.at_level(logging.WARNING, logger="scalebox_ms"):
            full.load(prefix)  # a trainer that will train on: told its buffer starts empty
        assert "checkpoint was saved without its replay buffer" in caplog.text
    finally:
        full.close()


def test_the_acting_trainer_takes_the_config_that_trained_the_run_as_python_built_it(tmp_path):
    """A config built in Python with tuples (policy.pi_layers=(32, 32)) was refused against its own checkpoint,
    whose JSON sidecar holds lists; kernel choices edited into config.yaml (same outputs and checkpoints) too."""
    from scalebox_ms.trainers import acting_trainer

    cfg = dqn_config()
    cfg.policy.pi_layers = (32, 32)
    cfg.policy.vf_layers = (32, 32)
    _train_run(cfg, tmp_path / "r", until=500)
    trainer, prefix = acting_trainer(cfg, str(tmp_path / "r"))
    trainer.close()
    edited = load_config(str(tmp_path / "r" / "config.yaml"))
    edited.dqn.optimizer_kernel, edited.dqn.host_acting = "builtin", False
    trainer, again = acting_trainer(edited, str(tmp_path / "r"))
    trainer.close()
    assert again == prefix


def test_cli_trains_evaluates_and_exports_sac(tmp_path, monkeypatch):
    run = tmp_path / "run"
    r = run_module("train", "--config", os.path.join(REPO, "configs", "sac_pendulum.yaml"), "--run-dir", run,
                   "--set", "run.total_steps=400", "--set", "sac.learning_starts=100", "--set", "run.eval_episodes=0",
                   "--set", "policy.pi_layers=[16]", "--set", "policy.vf_layers=[16]", "--set", "sac.batch_size=32",
                   "--set", "sac.optimizer_kernel=custom", "--no-progress")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "sac.optimizer_kernel custom: C++ kernel" in r.stderr
    # evaluate and export run no optimizer step: they work where the run's `custom` kernels cannot be built
    monkeypatch.setenv("SCALEBOX_MS_CUSTOM_OPS_CACHE", str(tmp_path / "empty"))
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-g++"))
    summary = json.loads((run / "summary.json").read_text())
    assert summary["algo"] == "sac" and summary["global_step"] == 400  # (the run's end cuts the iteration short)
    header = (run / "metrics.csv").read_text().splitlines()[0]
    assert "critic_loss" in header and "ent_coef" in header
    r = run_module("evaluate", "--run", run, "--episodes", 2, "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    # (the float export is test_exported_sac_actor_runs_without_scalebox_ms's, in-process; the CLI path is the same)
    r = run_module("export", "--run", run, "--int8", "--calibrate-steps", 32, "--output", tmp_path / "q.mindir")
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads((tmp_path / "q.mindir.json").read_text())["quantization"]["level"] == "L1"


def test_exported_sac_actor_runs_without_scalebox_ms(tmp_path):
    from scalebox_ms.export import export_mindir
    from scalebox_ms.trainers import make_trainer

    t = make_trainer(sac_config(train_freq=8, gradient_steps=2))
    t.learn(until=200)
    path = str(tmp_path / "actor.mindir")
    export_mindir(t, path)
    obs = np.random.default_rng(0).standard_normal((6, 3)).astype(np.float32)
    expected = t.predict(obs, deterministic=True)
    np.save(tmp_path / "obs.npy", obs)
    code = ("import sys, numpy as np, mindspore as ms\n"
            "ms.set_device('CPU')\n"
            f"g = ms.nn.GraphCell(ms.load({path!r}))\n"
            f"out = g(ms.Tensor(np.load({str(tmp_path / 'obs.npy')!r}))).asnumpy()\n"
            "assert 'scalebox_ms' not in sys.modules\n"
            f"np.save({str(tmp_path / 'out.npy')!r}, out)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr[-2000:]
    np.testing.assert_allclose(np.load(tmp_path / "out.npy"), expected, atol=1e-5)
    assert np.all(np.abs(expected) <= 2.0)
    t.close()


def test_preset_files_load():
    for name in ("dqn_cartpole", "dqn_cartpole_fast", "dqn_acrobot", "dqn_acrobot_fast", "sac_pendulum",
                 "sac_pendulum_native", "sac_pendulum_fast", "td3_pendulum", "td3_pendulum_fast", "sac_halfcheetah"):
        cfg = load_config(os.path.join(REPO, "configs", f"{name}.yaml"))
        assert cfg.algo == name.split("_")[0]


def test_dqn_host_acting_matches_the_compiled_graph():
    """The numpy copy of the Q-network (dqn.host_acting) picks the compiled graph's greedy action (apart from
    near-ties), and is re-synced after training phases."""
    from mindspore import Tensor

    from scalebox_ms.trainers import make_trainer

    t = make_trainer(dqn_config(learning_starts=0))
    assert t.host_q is not None  # auto: a small MLP acts on the host
    t.learn(until=1)
    obs = np.random.default_rng(3).standard_normal((500, 4)).astype(np.float32) * 2
    q = t.learner.q(Tensor(obs)).asnumpy()
    graph = t.policy_call(Tensor(obs), Tensor(np.zeros((500, 1), np.float32))).asnumpy()
    t.host_q.sync()
    host = t.host_q(obs)
    clear = np.abs(q[:, 0] - q[:, 1]) > 1e-4
    assert clear.sum() > 400
    np.testing.assert_array_equal(host[clear], graph[clear])
    before = [w.copy() for w, _, _ in t.host_q.weights]
    t.learn(until=t.global_step + 1)
    t._policy()  # syncs the copy after the phases
    assert any(not np.array_equal(a, w) for a, (w, _, _) in zip(before, t.host_q.weights))
    assert make_trainer(dqn_config(host_acting=False)).host_q is None


# (SAC/TD3 below: a gradient step per 4 env steps, not per step: the tests need trained weights, not learning)
@pytest.mark.parametrize("make", [lambda: dqn_config(learning_starts=0),
                                  lambda: sac_config(train_freq=8, gradient_steps=2),
                                  lambda: sac_config("td3", learning_starts=0, train_freq=8, gradient_steps=2)],
                         ids=["dqn", "sac", "td3"])
def test_int8_export_of_the_off_policy_actor(make, tmp_path):
    """INT8 (L1) quantizes the deterministic policy's MLP (DQN's Q-network, SAC's trunk + mean head, TD3's actor):
    its actions stay close to the float policy's, and the learner's parameters (names, hash) are untouched."""
    import mindspore as ms

    from scalebox_ms.export import export_mindir
    from scalebox_ms.trainers import make_trainer

    t = make_trainer(make())
    t.learn(until=300)
    digest = t.parameters_sha256()
    names = [n for n, _ in t.learner.parameters_and_names()]
    out = export_mindir(t, str(tmp_path / "q.mindir"), int8=True, calibrate_steps=64)
    assert out["quantization"]["level"] == "L1" and out["param_sha256"] == digest
    assert [n for n, _ in t.learner.parameters_and_names()] == names
    obs = np.random.default_rng(0).standard_normal((64, t.spec.obs_dim)).astype(np.float32)
    graph = ms.nn.GraphCell(ms.load(str(tmp_path / "q.mindir")))
    got = graph(ms.Tensor(obs)).asnumpy()
    want = t.predict(obs, deterministic=True)
    if t.spec.discrete:
        assert (got == want).mean() >= 0.9
    else:
        assert np.abs(got - want).max() < 0.1 * 4.0  # Pendulum's Box is [-2, 2]
    t.close()


@pytest.mark.parametrize("make, level", [(lambda: dqn_config(learning_starts=0), "O1"),
                                         (lambda: sac_config(train_freq=8, gradient_steps=2), "O2"),
                                         (lambda: sac_config("td3", learning_starts=0, train_freq=8, gradient_steps=2),
                                          "O2")],
                         ids=["dqn-O1", "sac-O2", "td3-O2"])
def test_amp_trains_every_loss_with_the_loss_scaler(make, level):
    """float16 networks, one dynamic loss scale for all of a step's losses: training stays finite, the scaler's
    state is reported and checkpointed, and the weights move. A loss scale far too large overflows for a few dozen
    steps while the scaler backs off: those steps are the scaler's (amp_skipped_steps), not non-finite updates (10
    phases of them stopped the run: 'only non-finite losses or gradients')."""
    from scalebox_ms.trainers import make_trainer

    cfg = make()
    cfg.amp.level = level
    cfg.amp.init_scale = 2.0**40
    t = make_trainer(cfg)
    before = t.parameters_sha256()
    t.learn(until=300)
    m = t._last_metrics
    assert m["loss_scale"] >= 1 and m["amp_skipped_steps"] >= 20 and m["n_updates"] > 0
    assert m["nonfinite_updates"] == 0
    assert all(math.isfinite(v) for k, v in m.items() if k.endswith("loss") and isinstance(v, float))
    names = [n for n, _ in t._named_state()]
    assert "model.loss_scale" in names or any(n.endswith("loss_scale") for n in names)
    assert t.parameters_sha256() != before
    assert np.all(np.isfinite(t.predict(np.zeros(t.spec.obs_dim, np.float32))))
    if cfg.algo == "dqn":  # (host_acting auto: the graph acts, in float16 as it trains; not the float32 numpy copy)
        assert t.host_q is None
    t.close()


def test_stochastic_predict_takes_a_legacy_random_state():
    from scalebox_ms.trainers import make_trainer

    t = make_trainer(dqn_config())
    try:
        obs = np.zeros((3, 4), np.float32)
        a = t.predict(obs, deterministic=False, rng=np.random.RandomState(3))  # (DQN: AttributeError 'integers')
        np.testing.assert_array_equal(a, t.predict(obs, deterministic=False, rng=np.random.RandomState(3)))
    finally:
        t.close()


def test_dqn_host_acting_true_under_amp_acts_with_the_graph_and_says_so(caplog):
    """(a warning, not a refusal: runs trained so before must still resume, evaluate and export)"""
    import logging

    from scalebox_ms.trainers import make_trainer

    cfg = dqn_config(host_acting=True)
    cfg.amp.level = "O1"
    with caplog.at_level(logging.WARNING):
        t = make_trainer(cfg)
    try:
        assert t.host_q is None
        assert any("dqn.host_acting true: compiled graph (amp.level O1" in r.getMessage() for r in caplog.records)
    finally:
        t.close()


@pytest.mark.parametrize("choice", ["auto", True])
def test_dqn_host_acting_on_native_compiled_envs_says_it_is_not_used(caplog, choice):
    """The compiled native cycle acts inside its graph: auto used to log "numpy copy" and true said nothing, though
    the copy never acted."""
    import logging

    from scalebox_ms.trainers import make_trainer

    with caplog.at_level(logging.INFO):
        t = make_trainer(_native(dqn_config(host_acting=choice)))
    try:
        assert t.native_cycle is not None and t.host_q is None
        said = [r for r in caplog.records if r.getMessage().startswith("dqn.host_acting")]
        assert [r.getMessage() for r in said] == [f"dqn.host_acting {'auto' if choice == 'auto' else 'true'}: not "
                                                  "used (env.backend native with env.compiled_rollout: the actions "
                                                  "are taken inside the training cycle's graph)"]
        assert said[0].levelno == (logging.INFO if choice == "auto" else logging.WARNING)
    finally:
        t.close()


@pytest.mark.parametrize("algo, env_id", [("sac", "Pendulum-v1"), ("dqn", "CartPole-v1")])
def test_native_cycle_matches_stepping_the_native_env(algo, env_id):
    """env.backend native: a whole phase (acting, env steps, replay add, gradient steps) is one graph call. Its
    staged transitions and replay rows equal those of the same native env stepped from Python with the same actions
    and reset noise (the slow reference)."""
    import copy

    from scalebox_ms.envs.native.vector import NativeVectorEnv
    from scalebox_ms.trainers import make_trainer
    from scalebox_ms.trainers.offpolicy_native import native_phase

    cfg = Config.from_dict({"algo": algo, "env": {"id": env_id, "backend": "native", "num_envs": 2},
                            "policy": {"pi_layers": [16], "vf_layers": [16]},
                            algo: {"train_freq": 150, "gradient_steps": 2, "batch_size": 8, "learning_starts": 100,
                                   "buffer_size": 1000},
                            "run": {"seed": 4, "total_steps": 1000, "progress": False}})
    t = make_trainer(cfg)
    assert t.native_cycle is not None
    c = t.collector
    c.reset(seed=4)
    # (copies: asnumpy() of a CPU Parameter may share its memory, and the cycle moves the env on)
    state = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in c.env.__getstate__().items()}
    env_rng = copy.deepcopy(c.env.rng)
    acc, n_grad = native_phase(t)
    assert n_grad == 2 and np.isfinite(acc).all()
    cyc = t.native_cycle
    acts = cyc.actions.asnumpy()
    ref = NativeVectorEnv(env_id, 2)
    ref.__setstate__(state)
    ref.rng = env_rng
    spec = t.spec
    rows = []
    raw_obs = cyc.obs_raw.asnumpy()
    for k in range(150):
        a = acts[k] if spec.discrete else np.asarray(spec.low) + (acts[k] + 1.0) * 0.5 * (np.asarray(spec.high) - np.asarray(spec.low))
        valid = ~ref._step.needs_reset.asnumpy()
        before = raw_obs[k]
        nxt, reward, term, trunc, _ = ref.step(a)
        np.testing.assert_allclose(cyc.next_raw.asnumpy()[k], nxt, atol=1e-5, err_msg=f"step {k}")
        np.testing.assert_allclose(cyc.rewards.asnumpy()[k], reward, atol=1e-4)
        np.testing.assert_array_equal(cyc.terminated.asnumpy()[k] > 0, term)
        for i in np.flatnonzero(valid):
            rows.append((before[i], acts[k][i], nxt[i], float(term[i])))
    st = t.replay.state_dict()
    assert len(rows) == len(t.replay)
    np.testing.assert_allclose(st["obs"], np.stack([r[0] for r in rows]), atol=1e-5)
    np.testing.assert_allclose(st["next_obs"], np.stack([r[2] for r in rows]), atol=1e-5)
    np.testing.assert_array_equal(st["terminated"], np.array([r[3] for r in rows], np.float32))
    assert t.global_step == 300
    t.close()


def test_runs_stop_at_the_phase_boundary_and_resume_from_a_cut_iteration(tmp_path, monkeypatch):
    """total_steps and until stop at the first training-phase boundary at or past them (SB3's train_freq
    granularity), not at the next whole iteration; a checkpoint after a cut-short iteration resumes bit for bit.
    (Iterations of at least 200 env steps instead of 1,000: the same rules at a fifth of the steps.)"""
    from scalebox_ms.trainers import checkpoint
    from scalebox_ms.trainers.checkpoint import steps_match

    monkeypatch.setattr(checkpoint, "OFFPOLICY_ITERATION_STEPS", 200)
    cfg = sac_config(train_freq=4, gradient_steps=1)  # phases of 4 steps, iterations of 200
    cfg.run.total_steps = 282
    full = _train_run(cfg, tmp_path / "full")
    assert full["global_step"] == 284 and full["iterations"] == 2
    rows = (tmp_path / "full" / "metrics.csv").read_text().splitlines()
    assert [int(r.split(",")[1]) for r in rows[1:]] == [200, 284]
    half = _train_run(cfg, tmp_path / "half", until=121)
    assert half["status"] == "paused" and half["global_step"] == 124
    resumed = _train_run(None, None, resume=str(tmp_path / "half"))
    assert resumed["status"] == "completed" and resumed["global_step"] == 284
    assert resumed["param_sha256"] == full["param_sha256"]
    d = cfg.to_dict()  # (the sidecar's check: whole phases, at most an iteration's worth each, at least one each)
    assert steps_match(d, 124, 1) and steps_match(d, 284, 2) and steps_match(d, 0, 0)
    assert not steps_match(d, 284, 1) and not steps_match(d, 122, 1) and not steps_match(d, 4, 2)


def test_set_parameters_reaches_the_off_policy_actor_graphs(tmp_path):
    """The shared trainer core's set_parameters, on an off-policy learner (actor, critics, targets, log_alpha), by
    the names of the .ckpt file (get_parameters named the twin critics' ensemble tensors, the file each critic)."""
    import mindspore as ms

    from scalebox_ms.trainers import make_trainer

    def sac(seed):
        return make_trainer(Config.from_dict({"algo": "sac", "env": {"id": "Pendulum-v1", "num_envs": 1},
                                              "sac": {"learning_starts": 32, "batch_size": 16},
                                              "run": {"seed": seed, "total_steps": 64, "progress": False}}))

    a, b = sac(0), sac(1)
    try:
        a.learn(until=64)  # (its graphs have run)
        obs = np.random.default_rng(0).normal(size=(8, 3)).astype(np.float32)
        assert not np.array_equal(a.predict(obs), b.predict(obs))
        b.save(str(tmp_path / "b"))
        from_file = ms.load_checkpoint(str(tmp_path / "b.ckpt"))
        assert set(b.get_parameters()) == set(from_file) and any(".qf1." in n for n in from_file)
        a.set_parameters(from_file)
        np.testing.assert_array_equal(a.predict(obs), b.predict(obs))
        assert a.parameters_sha256() == b.parameters_sha256()
        # one critic's slice: the other critic keeps its weights
        name = next(n for n in from_file if ".qf1." in n and n.startswith("model.critic.") and n.endswith("weight"))
        before = a.get_parameters()
        a.set_parameters({name: before[name] + 1})
        after = a.get_parameters()
        assert [n for n in before if not np.array_equal(before[n], after[n])] == [name]
        with pytest.raises(ValueError, match=r"has shape \(2,\), this trainer's has"):
            a.set_parameters({name: np.zeros(2, np.float32)})
    finally:
        a.close(), b.close()


@pytest.mark.parametrize("host_acting", [False, True])
def test_the_next_action_after_set_parameters_comes_from_the_new_weights(host_acting):
    """A training phase leaves the policy output for the current observation (and DQN its numpy Q-network copy):
    after set_parameters the next learn() acted once with the old weights."""
    from scalebox_ms.trainers import make_trainer

    a = make_trainer(Config.from_dict({"algo": "dqn", "env": {"num_envs": 4},
                                       "dqn": {"learning_starts": 64, "batch_size": 16, "train_freq": 16,
                                               "host_acting": host_acting},
                                       "run": {"total_steps": 256, "progress": False}}))
    try:
        a.learn(until=128)  # (a phase: the greedy action for the current observation is pending)
        name = "model.q.q_net.4.bias"  # the online Q-network's output bias
        assert a.get_parameters()[name].shape == (2,)
        assert (a._policy() == 0).any()  # (its own weights: not all 1 here)
        a.learn(until=192)
        a.set_parameters({name: np.asarray([0.0, 1e3], np.float32)})  # Q(s, 1) wins everywhere
        np.testing.assert_array_equal(a._policy(), [1, 1, 1, 1])
    finally:
        a.close()
