"""The trainers' Python API as code that embeds them uses it: what it passes wrongly is a one-line error."""
import pytest

from conftest import small_config
from scalebox_ms import ConfigError
from scalebox_ms.trainers import PPOTrainer, load_trainer, make_trainer


@pytest.mark.parametrize("sandbox", ["cpu", {"device": "gpu"}, 0])
def test_a_sandbox_that_is_not_one_is_refused(sandbox):
    """``sandbox="cpu"`` or a dict were taken silently: no Sandbox was configured (the device setting ignored)
    and run.seed no longer decided the initial weights."""
    with pytest.raises(ConfigError, match=r"^sandbox: expected a scalebox_ms\.Sandbox or None, got "
                                          rf"{type(sandbox).__name__} "):
        make_trainer(small_config(), sandbox=sandbox)


def test_the_envs_are_isolated_as_the_config_says_and_a_sandbox_that_differs_is_refused():
    """A Sandbox(isolation_level="process") isolated the envs of a config that said none (its checkpoints said none),
    a config's isolation was dropped with a default Sandbox, and a native env, whose config refuses isolation, was
    trained unisolated under such a Sandbox."""
    from scalebox_ms import Sandbox

    isolated = small_config(sandbox={"isolation_level": "process"})
    with Sandbox(device="cpu", seed=0) as default:  # (no isolation settings of its own: the config's apply)
        tr = PPOTrainer(isolated, sandbox=default)
        try:
            assert type(tr.env).__name__ == "IsolatedVectorEnv"
        finally:
            tr.close()
    with Sandbox(device="cpu", seed=0, isolation_level="process") as sb:
        for cfg in (small_config(), small_config(env={"id": "CartPole-v1", "backend": "native"})):
            with pytest.raises(ConfigError, match=r"^sandbox: this Sandbox has isolation_level='process', the "
                                                  r"config's sandbox section isolation_level='none': the envs are "
                                                  r"isolated as the config says"):
                PPOTrainer(cfg, sandbox=sb)
        tr = PPOTrainer(isolated, sandbox=sb)  # (the two agree)
        tr.close()
    with Sandbox(device="cpu", seed=0, isolation_level="process", step_timeout=3.0) as sb:
        with pytest.raises(ConfigError, match=r"this Sandbox has step_timeout=3.0, the config's sandbox section "
                                              r"step_timeout=10.0: "):
            PPOTrainer(isolated, sandbox=sb)
    # only what the Sandbox sets, and what matters, is compared: its default step timeout against the config's 30 s,
    # a timeout without isolation on either side
    with Sandbox(device="cpu", seed=0, isolation_level="process") as sb:
        PPOTrainer(small_config(sandbox={"isolation_level": "process", "step_timeout": 30.0}), sandbox=sb).close()
    with Sandbox(device="cpu", seed=0, step_timeout=5.0) as sb:
        PPOTrainer(small_config(), sandbox=sb).close()
    # (deterministic kernels are process-wide: a second Sandbox with deterministic=False conflicts with the first,
    # so the check is called as a trainer calls it)
    with pytest.raises(ConfigError, match=r"^sandbox: the config's sandbox.isolation_level 'strict' needs "
                                          r"deterministic kernels, and this Sandbox has deterministic=False"):
        sb = Sandbox.__new__(Sandbox)
        sb._section, sb.deterministic = Sandbox(device="cpu", seed=0)._section, False
        sb.check_env_isolation(small_config(sandbox={"isolation_level": "strict"}).sandbox)


def test_learn_refuses_a_total_steps_beyond_64_bits_before_training(tmp_path):
    """``learn(10**20)`` ("until solved") trained, and its checkpoint was then refused: run.total_steps is a
    64-bit integer."""
    t = PPOTrainer(small_config())
    try:
        for value in (10**20, 2**63, 1e19, 10**400):
            with pytest.raises(ConfigError, match=r"^total_steps: expected a 64-bit integer, got "):
                t.learn(value, until=64)
        assert t.global_step == 0 and t.config.run.total_steps == small_config().run.total_steps
        t.learn(2**63 - 1, until=64)
        back = load_trainer(t.save(str(tmp_path / "far")))
        assert back.global_step == 64 and back.config.run.total_steps == 2**63 - 1
        back.close()
    finally:
        t.close()


def test_trainer_config_changed_after_the_trainer_was_built_is_refused(tmp_path):
    """``trainer.config.env.num_envs = 4`` counted 4 envs' steps for the 2 that ran; ``train_freq`` changed
    wrote a checkpoint that did not load. The keys a resume may change still may."""
    t = PPOTrainer(small_config())
    try:
        t.learn(until=64)
        t.config.env.num_envs = 8
        for call in (t.learn, lambda: t.save(str(tmp_path / "x"))):
            with pytest.raises(ConfigError, match=r"^(learn|save): trainer\.config was changed after the trainer "
                                                  r"was built \(env\.num_envs=4 -> 8\), which it does not follow"):
                call()
        assert t.global_step == 64 and not list(tmp_path.iterdir())
        t.config.env.num_envs = 4
        t.config.run.eval_episodes, t.config.run.checkpoint_every = 3, 7
        t.config.ppo.learning_rate, t.config.ppo.lr_schedule = 1e-4, "constant"  # (learn reads them anew)
        t.learn(until=128)
        assert t.global_step == 128 and t._last_metrics["learning_rate"] == pytest.approx(1e-4)
    finally:
        t.close()


@pytest.mark.parametrize("key, value, words", [
    ("ppo.learning_rate", -0.01, r"ppo\.learning_rate: "), ("ppo.lr_schedule", "cosine", r"ppo\.lr_schedule: "),
    ("ppo.clip_range", -0.2, r"ppo\.clip_range: "), ("ppo.learning_rate", "fast", r"ppo\.learning_rate: "),
    ("run.eval_every", -1, r"run\.eval_every: "), ("run.stop_return", "x", r"run\.stop_return: ")])
def test_keys_that_may_change_between_learn_calls_are_checked_as_a_files(tmp_path, key, value, words):
    """A negative learning rate trained by gradient ascent, 'cosine' ran as constant, a string learning rate failed
    deep inside (TypeError); save wrote a checkpoint its own loader refused as invalid."""
    t = PPOTrainer(small_config())
    try:
        t.learn(until=64)
        section, name = key.split(".")
        setattr(getattr(t.config, section), name, value)
        for call in (t.learn, lambda: t.save(str(tmp_path / "x"))):
            with pytest.raises(ConfigError, match=r"^(learn|save): trainer\.config: " + words):
                call()
        assert t.global_step == 64 and not list(tmp_path.iterdir())
    finally:
        t.close()


def test_a_number_set_as_a_string_between_learn_calls_is_read_as_a_files():
    """ppo.learning_rate = "1e-3" failed deep inside learn (TypeError: can't multiply sequence by float)."""
    t = PPOTrainer(small_config())
    try:
        t.learn(until=64)
        t.config.ppo.learning_rate, t.config.ppo.lr_schedule = "1e-3", "constant"
        t.learn(until=128)
        assert t.config.ppo.learning_rate == 1e-3 and t._last_metrics["learning_rate"] == pytest.approx(1e-3)
    finally:
        t.close()


@pytest.mark.parametrize("algo", ["ppo", "sac"])
def test_a_callback_changing_the_learning_rate_mid_learn_is_checked_before_the_next_iteration(algo, monkeypatch):
    """A callback setting a negative learning rate mid-learn trained by gradient ascent to the end (checked at the
    next learn or save only); one set as a string failed deep inside. Now both are read as a file's value would be
    before the next iteration reads them."""
    from scalebox_ms import Config
    from scalebox_ms.trainers import Callback, checkpoint, make_trainer

    monkeypatch.setattr(checkpoint, "OFFPOLICY_ITERATION_STEPS", 200)
    ppo = small_config(ppo={"lr_schedule": "constant"}, run={"total_steps": 1024})
    cfg = ppo if algo == "ppo" else Config.from_dict({
        "algo": "sac", "env": {"id": "Pendulum-v1", "num_envs": 1}, "policy": {"pi_layers": [8], "vf_layers": [8]},
        "sac": {"batch_size": 8, "learning_starts": 50, "buffer_size": 1000, "train_freq": 50},
        "run": {"seed": 0, "total_steps": 2000, "progress": False}})

    class SetRate(Callback):
        def __init__(self, value):
            self.value, self.rates = value, []

        def on_iteration_end(self, trainer, metrics):
            self.rates.append(metrics["learning_rate"])
            setattr(trainer.config.algo_config, "learning_rate", self.value)

    t = make_trainer(cfg)
    try:
        step = t.steps_per_iteration if algo == "sac" else 64
        set_to = SetRate("5e-4")
        t.learn(until=3 * step, callbacks=[set_to])
        assert set_to.rates[1:] == [pytest.approx(5e-4)] * 2 and t.config.algo_config.learning_rate == 5e-4
        with pytest.raises(ConfigError, match=rf"^learn: trainer\.config: {algo}\.learning_rate: "):
            t.learn(until=6 * step, callbacks=[SetRate(-0.01)])
        assert t.global_step == 4 * step  # (stopped after the iteration whose callback set it)

        class SetAtStart(Callback):
            def on_training_start(self, trainer):
                trainer.config.algo_config.learning_rate = -0.01

        t.config.algo_config.learning_rate = 5e-4
        with pytest.raises(ConfigError, match=rf"^learn: trainer\.config: {algo}\.learning_rate: "):
            t.learn(until=6 * step, callbacks=[SetAtStart()])
        assert t.global_step == 4 * step  # (before the first iteration)
        t.config.algo_config.learning_rate = 5e-4

        class SetKey(Callback):  # (a key the trainer does not follow: SAC's batch_size was read by the next phase)
            def __init__(self, section, key, value):
                self.section, self.key, self.value = section, key, value

            def on_iteration_end(self, trainer, metrics):
                setattr(getattr(trainer.config, self.section), self.key, self.value)

        with pytest.raises(ConfigError, match=rf"^learn: trainer\.config was changed .*\({algo}\.batch_size="):
            t.learn(until=6 * step, callbacks=[SetKey(algo, "batch_size", 16)])
        assert t.global_step == 5 * step
        t.config.algo_config.batch_size = cfg.algo_config.batch_size
        with pytest.raises(ConfigError, match=r"^learn: trainer\.config: run\.total_steps: must be >= 1"):
            t.learn(until=7 * step, callbacks=[SetKey("run", "total_steps", 0)])  # (DQN: a ZeroDivisionError)
        assert t.global_step == 6 * step
    finally:
        t.close()


def test_a_refused_learn_call_leaves_the_horizon_and_a_close_at_the_start_trains_nothing():
    """learn(total_steps=..., until=-1) was refused after it had moved run.total_steps (the schedules' horizon); a
    callback closing the trainer in on_training_start still ran an iteration on the closed envs."""
    from scalebox_ms.trainers import Callback

    t = PPOTrainer(small_config(run={"total_steps": 1024}))
    try:
        with pytest.raises(ConfigError, match="until: must be >= 0"):
            t.learn(total_steps=100_000, until=-1)
        assert t.config.run.total_steps == 1024

        class CloseAtStart(Callback):
            def on_training_start(self, trainer):
                trainer.close()

        t.learn(callbacks=[CloseAtStart()])
        assert t.global_step == 0
    finally:
        t.close()


def test_stochastic_predict_checks_a_changed_config_as_learn_does():
    """TD3's action noise changed after the build was used by predict(deterministic=False), unchecked ('abc': a
    numpy ValueError); learn refused it only later."""
    import numpy as np

    from scalebox_ms import Config

    t = make_trainer(Config.from_dict({
        "algo": "td3", "env": {"id": "Pendulum-v1", "num_envs": 1}, "policy": {"pi_layers": [8], "vf_layers": [8]},
        "td3": {"batch_size": 8, "learning_starts": 50, "buffer_size": 1000}, "run": {"total_steps": 1000}}))
    try:
        obs = np.zeros(3, np.float32)
        t.predict(obs, deterministic=False, rng=0)
        t.config.td3.action_noise = 5.0
        with pytest.raises(ConfigError, match=r"^predict: trainer\.config was changed .*td3\.action_noise"):
            t.predict(obs, deterministic=False, rng=0)
        t.predict(obs)  # (the deterministic action reads no such key)
        t.config.td3.action_noise = None
        t.config.td3.learning_rate = 5e-4  # (a live key: checked, allowed)
        t.predict(obs, deterministic=False, rng=0)
    finally:
        t.close()


def test_a_config_built_by_the_user_and_changed_later_does_not_reach_the_trainer():
    """(the trainer keeps its own copy: the check above concerns trainer.config only)"""
    cfg = small_config()
    t = PPOTrainer(cfg)
    try:
        cfg.env.num_envs = 8
        t.learn(until=64)
        assert t.global_step == 64 and t.config.env.num_envs == 4
    finally:
        t.close()


def test_another_algorithms_checkpoint_is_named_as_such(tmp_path):
    """``PPOTrainer.load`` of a DQN checkpoint blamed the first differing env or policy key (env.num_envs)."""
    from scalebox_ms import CheckpointError, Config

    dqn = make_trainer(Config.from_dict({"algo": "dqn", "env": {"id": "CartPole-v1", "num_envs": 4},
                                         "policy": {"activation": "tanh"}, "run": {"progress": False}}))
    try:
        path = dqn.save(str(tmp_path / "dqn"))
    finally:
        dqn.close()
    t = PPOTrainer(small_config())
    try:
        with pytest.raises(CheckpointError, match=r"^checkpoint .*dqn is a DQN checkpoint, this is a PPOTrainer; "
                                                  r"load_trainer\(path\) builds the trainer of its algorithm$"):
            t.load(path)
    finally:
        t.close()
    back = load_trainer(path)
    assert back.algo == "dqn"
    back.close()


def test_callbacks_one_or_a_list_and_what_is_not_one_is_one_line():
    """``learn(callbacks=MyCallback())`` raised "TypeError: 'MyCallback' object is not iterable", a function an
    AttributeError from deep inside learn."""
    from scalebox_ms.trainers import Callback

    class Count(Callback):
        n = 0

        def on_iteration_end(self, trainer, metrics):
            Count.n += 1

    t = PPOTrainer(small_config())
    try:
        t.learn(until=64, callbacks=Count())
        t.learn(until=128, callbacks=(cb for cb in [Count()]))
        assert Count.n == 2
        for bad, name in ((print, "<built-in function print>"), ([Count(), 3], "3")):
            with pytest.raises(ConfigError, match=rf"^callbacks: {name} has no on_training_start method"):
                t.learn(until=192, callbacks=bad)
        for bad in (Count, [Count]):  # (the parentheses forgotten)
            with pytest.raises(ConfigError, match=r"^callbacks: Count is a class; pass an instance: Count\(\)$"):
                t.learn(until=192, callbacks=bad)
        assert t.global_step == 128
    finally:
        t.close()


def test_a_set_parameters_round_trip_between_learn_calls_leaves_training_as_it_was(tmp_path, monkeypatch):
    """SAC's next action (computed by the last phase call) was dropped by set_parameters and computed again with
    noise drawn anew from the training stream: set_parameters(get_parameters()) changed the rest of training. Its
    noise is in checkpoints, so a round trip before a save or after a load changes nothing either. (Iterations of
    200 env steps instead of 1,000: the same code paths.)"""
    from scalebox_ms import Config
    from scalebox_ms.trainers import checkpoint

    monkeypatch.setattr(checkpoint, "OFFPOLICY_ITERATION_STEPS", 200)
    cfg = Config.from_dict({"algo": "sac", "env": {"id": "Pendulum-v1", "num_envs": 1},
                            "policy": {"pi_layers": [16], "vf_layers": [16]},
                            "sac": {"batch_size": 16, "learning_starts": 50, "buffer_size": 1000, "train_freq": 50,
                                    "gradient_steps": 5},
                            "run": {"seed": 2, "total_steps": 1000, "progress": False}})

    def round_trip(t):
        t.set_parameters(t.get_parameters())
        return t

    def reloaded(t):
        path = t.save(str(tmp_path / f"ck{len(hashes)}"))
        t.close()
        return load_trainer(path)

    hashes = []
    for between in ([], [round_trip], [round_trip, reloaded], [reloaded, round_trip]):
        t = make_trainer(cfg)
        try:
            t.learn(until=400)
            for step in between:
                t = step(t)
            t.learn(until=800)
            hashes.append(t.parameters_sha256())
        finally:
            t.close()
    assert hashes[1:] == hashes[:1] * 3


def test_a_callback_that_closes_the_trainer_ends_learn():
    """learn went on stepping the closed envs to the end of the run."""
    from scalebox_ms.trainers import Callback

    class CloseIt(Callback):
        def on_iteration_end(self, trainer, metrics):
            trainer.close()

    t = PPOTrainer(small_config())
    t.learn(callbacks=[CloseIt()])
    assert t.global_step == 64
    with pytest.raises(ConfigError, match="^learn: this PPOTrainer was closed"):
        t.learn()
