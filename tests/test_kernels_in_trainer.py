"""ppo.update_kernel / policy.act_kernel as the trainer resolves them (the kernels themselves: test_custom_*.py)."""
import numpy as np
import pytest
from conftest import small_config

from scalebox_ms.errors import ConfigError
from scalebox_ms.ops.custom import PPOUpdateKernel
from scalebox_ms.trainers import PPOTrainer
from scalebox_ms.trainers.ppo_update import PPOUpdateStep


def _params(tr):
    return {n: p.asnumpy().copy() for n, p in tr._named_state()}


def test_update_kernel_trains_like_the_builtin_graph():
    """One iteration from the same seed: identical rollout, then the C++ update vs the compiled graph."""
    builtin = PPOTrainer(small_config(ppo={"update_kernel": "builtin"}))
    custom = PPOTrainer(small_config(ppo={"update_kernel": "custom"}))
    assert isinstance(builtin.update_step, PPOUpdateStep) and isinstance(custom.update_step, PPOUpdateKernel)
    before = _params(custom)
    for tr in (builtin, custom):
        tr.learn(total_steps=64)  # 4 envs x 16 steps, 2 epochs x 2 minibatches
    a, b = _params(builtin), _params(custom)
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_allclose(b[name], a[name], rtol=1e-4, atol=2e-6, err_msg=name)
    assert any(not np.array_equal(before[n], b[n]) for n in b)
    for key in ("loss", "approx_kl", "clip_fraction", "n_updates"):
        assert custom._last_metrics[key] == pytest.approx(builtin._last_metrics[key], rel=1e-3, abs=1e-6)
    builtin.close()
    custom.close()


def test_rollouts_call_the_act_kernel_directly_and_train_as_through_the_graph():
    """act_kernel custom: rollouts call the C++ kernel without a graph (synced each rollout); the run is the one the
    acting graph gives, bit for bit (same kernel code), and builtin acting has no direct call."""
    direct = PPOTrainer(small_config(policy={"act_kernel": "custom"}))
    graph = PPOTrainer(small_config(policy={"act_kernel": "custom"}))
    builtin = PPOTrainer(small_config(policy={"act_kernel": "builtin"}))
    try:
        assert direct._act_direct is not None and builtin._act_direct is None
        graph._act_direct = None  # the rollout then calls the packed ActStep graph
        for tr in (direct, graph):
            tr.learn(total_steps=192)  # 3 rollouts: the later ones act with updated weights
        assert direct.parameters_sha256() == graph.parameters_sha256()
    finally:
        for tr in (direct, graph, builtin):
            tr.close()


@pytest.mark.parametrize("extra,blocker", [
    ({"amp": {"level": "O2"}}, "amp.level O2"),
    ({"parallel": {"gradient_accumulation": 2}}, "gradient accumulation"),
    ({"policy": {"layer": "fused"}}, "policy.layer fused"),
])
def test_update_kernel_refusals_and_auto_fallbacks(extra, blocker):
    with pytest.raises(ConfigError, match=f"ppo.update_kernel: custom cannot run with {blocker}"):
        PPOTrainer(small_config(ppo={"update_kernel": "custom"}, **extra))
    tr = PPOTrainer(small_config(ppo={"update_kernel": "auto"}, **extra))
    assert isinstance(tr.update_step, PPOUpdateStep)  # auto: the builtin graph where the kernel cannot run
    tr.close()


def test_update_kernel_auto_follows_the_measured_batch_rule():
    from scalebox_ms.trainers.kernels import AUTO_UPDATE_MAX_BATCH

    ok = PPOTrainer(small_config(ppo={"update_kernel": "auto"}))
    assert isinstance(ok.update_step, PPOUpdateKernel)
    n = 2 * AUTO_UPDATE_MAX_BATCH
    big = PPOTrainer(small_config(env={"num_envs": 4}, ppo={"update_kernel": "auto", "n_steps": n // 2,
                                                            "batch_size": n}))
    assert isinstance(big.update_step, PPOUpdateStep)
    ok.close()
    big.close()


def test_auto_kernels_fall_back_without_a_compiler(tmp_path, monkeypatch):
    monkeypatch.setenv("SCALEBOX_MS_CUSTOM_OPS_CACHE", str(tmp_path / "empty"))
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-g++"))
    tr = PPOTrainer(small_config(ppo={"update_kernel": "auto"}, policy={"act_kernel": "auto"}))
    assert isinstance(tr.update_step, PPOUpdateStep) and tr.act_step.kernel == "builtin"
    tr.learn(total_steps=64)  # and trains
    tr.close()
    from scalebox_ms.errors import CustomOpError

    with pytest.raises(CustomOpError, match=r"^ppo\.update_kernel: custom: .*not found.*\(ppo\.update_kernel: builtin\)$"):
        PPOTrainer(small_config(ppo={"update_kernel": "custom"}))
    with pytest.raises(CustomOpError, match=r"^policy\.act_kernel: custom: .*not found.*\(policy\.act_kernel: builtin\)$"):
        PPOTrainer(small_config(policy={"act_kernel": "custom"}))


def test_a_setting_the_kernel_does_not_implement_selects_the_graph(monkeypatch, caplog):
    """A new PPOConfig option the C++ kernel ignores: auto trains with the compiled graph (and says why), custom
    refuses -- the kernel never silently trains something else."""
    import logging

    from scalebox_ms.ops.custom import update

    monkeypatch.setattr(update, "unsupported_settings", lambda ppo, policy=None: ["ppo.new_loss_term=0.5"])
    with caplog.at_level(logging.INFO, logger="scalebox_ms"):
        tr = PPOTrainer(small_config(ppo={"update_kernel": "auto"}))
    assert isinstance(tr.update_step, PPOUpdateStep)
    tr.close()
    assert any("ppo.update_kernel auto: compiled graph (ppo.new_loss_term=0.5 (not implemented by the kernel)"
               in r.getMessage() for r in caplog.records)
    with pytest.raises(ConfigError, match=r"ppo\.update_kernel: custom cannot run with ppo\.new_loss_term=0\.5"):
        PPOTrainer(small_config(ppo={"update_kernel": "custom"}))


def test_kernel_and_builtin_checkpoints_are_interchangeable(tmp_path):
    custom = PPOTrainer(small_config(ppo={"update_kernel": "custom"}))
    custom.learn(total_steps=64)
    path = custom.save(str(tmp_path / "ck"))
    builtin = PPOTrainer(small_config(ppo={"update_kernel": "builtin"})).load(path)
    assert builtin.parameters_sha256() == custom.parameters_sha256()
    a, b = _params(custom), _params(builtin)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    custom.close()
    builtin.close()


@pytest.mark.parametrize("target_kl", [None, 1e-4])
def test_one_call_update_equals_the_minibatch_loop_with_early_stop(target_kl):
    """The kernel runs all epochs x minibatches in one call; with a target_kl that stops mid-update the trainer
    must end in the state (parameters, counters, RNG stream) of the builtin per-minibatch loop."""
    cfg = dict(ppo={"target_kl": target_kl, "n_epochs": 4, "batch_size": 16})
    builtin = PPOTrainer(small_config(**{**cfg, "ppo": {**cfg["ppo"], "update_kernel": "builtin"}}))
    custom = PPOTrainer(small_config(**{**cfg, "ppo": {**cfg["ppo"], "update_kernel": "custom"}}))
    calls = []
    real = custom.runner.run_minibatches  # the kernel: all rows it is given in one call
    custom.runner.run_minibatches = lambda *a: calls.append(len(a[2])) or real(*a)
    for tr in (builtin, custom):
        tr.learn(total_steps=64)  # one iteration: 4 epochs x 4 minibatches
    mb, mc = builtin._last_metrics, custom._last_metrics
    # one call for the whole update; with target_kl one per epoch started (no permutation drawn beyond the stop)
    assert calls == ([16] if target_kl is None else [4] * ((mb["minibatch_steps"] - 1) // 4 + 1)), calls
    assert mc["minibatch_steps"] == mb["minibatch_steps"] and mc["early_stopped"] == mb["early_stopped"]
    assert mc["n_updates"] == mb["n_updates"]
    if target_kl is not None:
        assert mb["early_stopped"] == 1 and 1 <= mb["minibatch_steps"] < 16, mb  # the case this test is about
    else:
        assert mb["minibatch_steps"] == 16
    assert custom.rng.bit_generator.state == builtin.rng.bit_generator.state
    a, b = _params(builtin), _params(custom)
    for name in a:
        np.testing.assert_allclose(b[name], a[name], rtol=1e-4, atol=2e-6, err_msg=name)
    builtin.close()
    custom.close()


@pytest.mark.parametrize("kernel,target_kl,calls", [
    ("builtin", None, 2 * 2), ("builtin", 0.01, 2 * 2),  # small_config: 2 epochs x 2 minibatches of 32
    ("custom", None, 1), ("custom", 0.01, 2),            # kernel: one call, or one per epoch with target_kl
])
def test_update_calls_per_iteration_follow_the_implementation(kernel, target_kl, calls):
    tr = PPOTrainer(small_config(ppo={"update_kernel": kernel, "target_kl": target_kl, "n_epochs": 2}))
    assert tr.update_calls_per_iteration() == calls
    tr.close()
