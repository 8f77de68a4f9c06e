"""Trainers: the policy-scheduling layer. PPO on-policy; DQN, SAC and TD3 off-policy on one shared core."""
from ..config import PPOConfig
from .core import Callback, Trainer
from .lifecycle import StopOnSignal
from .ppo import PPOTrainer, schedule_value


def __getattr__(name):  # the off-policy trainers import on use
    if name in ("DQNTrainer", "SACTrainer", "TD3Trainer", "OffPolicyTrainer"):
        from . import dqn, offpolicy, sac, td3

        return {"DQNTrainer": dqn.DQNTrainer, "SACTrainer": sac.SACTrainer, "TD3Trainer": td3.TD3Trainer,
                "OffPolicyTrainer": offpolicy.OffPolicyTrainer}[name]
    raise AttributeError(name)


def trainer_class(algo: str):
    """The trainer class of ``algo`` ('ppo', 'dqn', 'sac', 'td3')."""
    from ..errors import ConfigError

    names = {"ppo": "PPOTrainer", "dqn": "DQNTrainer", "sac": "SACTrainer", "td3": "TD3Trainer"}
    if algo not in names:
        raise ConfigError(f"algo: {algo!r} is not one of {', '.join(names)}")
    return PPOTrainer if algo == "ppo" else __getattr__(names[algo])


def make_trainer(config=None, sandbox=None, **overrides):
    """The trainer of ``config.algo`` (a Config, a dict in the YAML layout, or None: PPO defaults)."""
    from ..config import Config

    if isinstance(config, dict):
        config = Config.from_dict(config)
    algo = config.algo if isinstance(config, Config) else "ppo"  # (anything else: PPOTrainer's ConfigError)
    return trainer_class(algo)(config, sandbox=sandbox, **overrides)


def load_trainer(path: str, sandbox=None):
    """A trainer of the right algorithm, built from a checkpoint's config and restored from it."""
    from .checkpoint import read_sidecar, resolve_checkpoint

    sc = read_sidecar(resolve_checkpoint(path))
    return trainer_class(sc["config"].get("algo", "ppo")).from_checkpoint(path, sandbox=sandbox)


#: config keys a run's config.yaml may differ in from its checkpoint's for evaluate and export (besides resume's): how
#: the policy is computed (kernels, device, threads, the update's own kernels), not what it computes
ACTING_FREE_KEYS = ("policy.act_kernel", "policy.conv_kernel", "policy.conv_backend", "policy.layer", "policy.align",
                    "env.compiled_rollout", "ppo.update_kernel",
                    "dqn.optimizer_kernel", "sac.optimizer_kernel", "td3.optimizer_kernel", "dqn.host_acting",
                    "sandbox.device", "sandbox.device_id", "sandbox.threads", "sandbox.memory_limit",
                    "sandbox.worker_memory_limit", "sandbox.step_timeout", "sandbox.isolation_level")


def acting_trainer(cfg, run_dir: str, checkpoint=None):
    """``(trainer, checkpoint prefix)``: the trainer of ``cfg`` (a run's config) restored from ``checkpoint`` or
    ``run_dir``'s latest, for evaluate and export: it acts, it never trains. So an off-policy trainer builds no
    optimizer kernels and neither reads the checkpoint's replay buffer nor allocates one of the run's size (a
    1e6-transition buffer would double the memory training needed just to evaluate). A checkpoint trained with
    another config than ``cfg`` (but for :data:`ACTING_FREE_KEYS` and the resume's bookkeeping keys) is refused."""
    import copy

    from ..config import Config
    from .checkpoint import load_into
    from .lifecycle import RESUMABLE_KEYS

    cfg = Config.from_dict(cfg) if isinstance(cfg, dict) else copy.deepcopy(cfg)  # (the caller's stays as it was)
    run_config = cfg.to_dict()  # (compared with the checkpoint's before the changes below)
    if cfg.algo != "ppo":
        o = cfg.algo_config
        o.optimizer_kernel = "builtin"
        o.buffer_size = max(o.batch_size, o.train_freq * cfg.env.num_envs)  # (the least a valid config allows)
    trainer = make_trainer(cfg)
    trainer._acting_only = True
    try:
        return trainer, load_into(trainer, checkpoint, run_dir, replay=False, run_config=run_config,
                                  free_keys=RESUMABLE_KEYS + ACTING_FREE_KEYS)
    except BaseException:
        trainer.close()
        raise


__all__ = ["acting_trainer", "Callback", "DQNTrainer", "OffPolicyTrainer", "PPOConfig", "PPOTrainer", "SACTrainer",
           "StopOnSignal", "TD3Trainer", "Trainer", "load_trainer", "make_trainer", "schedule_value", "trainer_class"]
