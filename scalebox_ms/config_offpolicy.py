"""Config sections of the off-policy algorithms: ``dqn``, ``sac``, ``td3``.

Keys and defaults follow Stable-Baselines3 2.x (``DQN``, ``SAC``, ``TD3`` constructor arguments), so an rl-zoo3
hyper-parameter file maps key by key. Differences, each refused or documented rather than silently changed:

* ``train_freq`` counts vector-env steps (SB3's ``(n, "step")``); SB3's ``(n, "episode")`` form is not supported.
* ``action_noise`` is the standard deviation of Gaussian noise added to the actor's action in the [-1, 1]
  scaled action space (rl-zoo3's ``noise_type: normal`` + ``noise_std``); Ornstein-Uhlenbeck noise is not
  supported.
* ``ent_coef``: ``auto`` (learned, initial value 1), ``auto_<x>`` (learned, initial value x) or a fixed number.

The network sizes come from the ``policy`` section: ``policy.pi_layers`` is the actor (SAC, TD3) and
``policy.vf_layers`` the Q-network (DQN) or each critic (SAC, TD3); :data:`POLICY_DEFAULTS` holds SB3's default
architecture per algorithm, applied where the config does not set a key.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

from .config_yaml import FLOAT32_MAX, FLOAT32_TINY, KeysOnly, check_positive
from .errors import ConfigError, short_repr

ALGOS = ("ppo", "dqn", "sac", "td3")
OFF_POLICY = ("dqn", "sac", "td3")

#: SB3's default networks (MlpPolicy) per algorithm, for the keys the config leaves unset
POLICY_DEFAULTS = {
    "ppo": {"pi_layers": [64, 64], "vf_layers": [64, 64], "activation": "tanh", "ortho_init": True},
    "dqn": {"pi_layers": [64, 64], "vf_layers": [64, 64], "activation": "relu", "ortho_init": False},
    "sac": {"pi_layers": [256, 256], "vf_layers": [256, 256], "activation": "relu", "ortho_init": False},
    "td3": {"pi_layers": [400, 300], "vf_layers": [400, 300], "activation": "relu", "ortho_init": False},
}

#: the largest temperature (sac.ent_coef) whose float32 log maps back to a finite float32 (3.4e38 gives inf)
ENT_COEF_MAX = 1e38


@dataclass
class DQNConfig(KeysOnly):
    SECTION = "dqn"
    learning_rate: float = 1e-4
    buffer_size: int = 1_000_000
    #: env steps of uniformly random actions (and no gradient steps) before learning starts
    learning_starts: int = 100
    batch_size: int = 32
    #: Polyak coefficient of the target-network update (1.0: hard copy)
    tau: float = 1.0
    gamma: float = 0.99
    #: a training phase every train_freq vector-env steps
    train_freq: int = 4
    #: gradient steps per training phase (-1: as many as env steps collected in the phase)
    gradient_steps: int = 1
    #: env steps between target-network updates
    target_update_interval: int = 10_000
    exploration_fraction: float = 0.1
    exploration_initial_eps: float = 1.0
    exploration_final_eps: float = 0.05
    max_grad_norm: float = 10.0
    adam_eps: float = 1e-8
    #: the optimizer step (global-norm check/clip + Adam) and the target updates: 'builtin' (MindSpore graph ops),
    #: 'custom' (one C++ kernel each, CPU, float32) or 'auto' (custom where it can run, else builtin). Not SB3's.
    optimizer_kernel: str = "auto"
    #: greedy actions between training phases from a numpy copy of the Q-network (synced after every phase)
    #: instead of one compiled graph call per env step: true, false, or 'auto' (an MLP of at most
    #: HOST_ACTING_MAX_MACS multiply-adds per observation). Not an SB3 key.
    host_acting: Union[bool, str] = "auto"


#: 'auto' acts on the host up to this many multiply-adds per observation (a 4-256-256-2 MLP: 67,072)
HOST_ACTING_MAX_MACS = 1_000_000


@dataclass
class SACConfig(KeysOnly):
    SECTION = "sac"
    learning_rate: float = 3e-4
    buffer_size: int = 1_000_000
    learning_starts: int = 100
    batch_size: int = 256
    tau: float = 0.005
    gamma: float = 0.99
    train_freq: int = 1
    gradient_steps: int = 1
    #: 'auto' (learned, initial 1.0), 'auto_<x>' (learned, initial x) or a fixed number
    ent_coef: Union[float, str] = "auto"
    #: gradient steps between Polyak updates of the target critics
    target_update_interval: int = 1
    #: 'auto' (-action_dim) or a number
    target_entropy: Union[float, str] = "auto"
    #: std of Gaussian noise added to the sampled action in [-1, 1] space (null: none)
    action_noise: Optional[float] = None
    adam_eps: float = 1e-8
    #: the optimizer step (global-norm check/clip + Adam) and the target updates: 'builtin' (MindSpore graph ops),
    #: 'custom' (one C++ kernel each, CPU, float32) or 'auto' (custom where it can run, else builtin). Not SB3's.
    optimizer_kernel: str = "auto"


@dataclass
class TD3Config(KeysOnly):
    SECTION = "td3"
    learning_rate: float = 1e-3
    buffer_size: int = 1_000_000
    learning_starts: int = 100
    batch_size: int = 256
    tau: float = 0.005
    gamma: float = 0.99
    train_freq: int = 1
    gradient_steps: int = 1
    #: std of the Gaussian exploration noise in [-1, 1] action space (null: none)
    action_noise: Optional[float] = None
    #: actor and target updates every policy_delay critic updates
    policy_delay: int = 2
    target_policy_noise: float = 0.2
    target_noise_clip: float = 0.5
    adam_eps: float = 1e-8
    #: the optimizer step (global-norm check/clip + Adam) and the target updates: 'builtin' (MindSpore graph ops),
    #: 'custom' (one C++ kernel each, CPU, float32) or 'auto' (custom where it can run, else builtin). Not SB3's.
    optimizer_kernel: str = "auto"


def _check(ok: bool, key: str, msg: str) -> None:
    if not ok:
        raise ConfigError(f"{key}: {msg}")


def _check_common(name: str, o) -> None:
    check_positive(f"{name}.learning_rate", o.learning_rate)
    # (the replay's ring positions are int32 and its rows drawn from [0, 2**31 - 1): buffers.device.DRAW_RANGE)
    _check(1 <= o.buffer_size <= 2**31 - 1, f"{name}.buffer_size",
           f"must be in [1, 2**31 - 1], got {short_repr(o.buffer_size)}")
    _check(o.learning_starts >= 0, f"{name}.learning_starts", f"must be >= 0, got {short_repr(o.learning_starts)}")
    _check(1 <= o.batch_size <= o.buffer_size, f"{name}.batch_size",
           f"must be in [1, {name}.buffer_size ({o.buffer_size})], got {short_repr(o.batch_size)}")
    _check(FLOAT32_TINY <= o.tau <= 1.0, f"{name}.tau", "must be in (0, 1]"
           + (" (at least the smallest normal float32)" if 0 < o.tau < FLOAT32_TINY else "") + f", got {short_repr(o.tau)}")
    _check(0.0 <= o.gamma <= 1.0, f"{name}.gamma", f"must be in [0, 1], got {short_repr(o.gamma)}")
    _check(o.train_freq >= 1, f"{name}.train_freq", f"must be >= 1 (vector-env steps), got {short_repr(o.train_freq)}")
    _check(o.gradient_steps >= 1 or o.gradient_steps == -1, f"{name}.gradient_steps",
           f"must be >= 1, or -1 (as many as env steps per phase), got {short_repr(o.gradient_steps)}")
    check_positive(f"{name}.adam_eps", o.adam_eps)
    _check(o.optimizer_kernel in ("builtin", "custom", "auto"), f"{name}.optimizer_kernel",
           f"must be 'builtin', 'custom' or 'auto', got {short_repr(o.optimizer_kernel)}")
    noise = getattr(o, "action_noise", None)
    _check(noise is None or noise >= 0, f"{name}.action_noise",
           f"must be >= 0 (std of Gaussian noise in [-1, 1] action space) or null, got {short_repr(noise)}")


def check_dqn(o: DQNConfig) -> None:
    _check_common("dqn", o)
    _check(o.target_update_interval >= 1, "dqn.target_update_interval",
           f"must be >= 1, got {short_repr(o.target_update_interval)}")
    _check(0.0 <= o.exploration_fraction <= 1.0, "dqn.exploration_fraction",
           f"must be in [0, 1], got {short_repr(o.exploration_fraction)}")
    for key in ("exploration_initial_eps", "exploration_final_eps"):
        v = getattr(o, key)
        _check(0.0 <= v <= 1.0, f"dqn.{key}", f"must be in [0, 1], got {short_repr(v)}")
    check_positive("dqn.max_grad_norm", o.max_grad_norm)
    _check(o.host_acting in (True, False, "auto"), "dqn.host_acting",
           f"must be true, false or 'auto', got {short_repr(o.host_acting)}")


def entropy_coefficient(value) -> tuple:
    """(learned, initial value) of ``sac.ent_coef``: 'auto' -> (True, 1.0), 'auto_0.1' -> (True, 0.1), 0.2 ->
    (False, 0.2)."""
    if isinstance(value, str):
        if value == "auto":
            return True, 1.0
        if value.startswith("auto_"):
            try:
                init = float(value[5:])
            except ValueError:
                init = -1.0
            if FLOAT32_TINY <= init <= ENT_COEF_MAX:  # (its log is the learned float32 Parameter: 1e-50 is 0 there,
                return True, init  # log -inf, and the temperature silently never moved)
        raise ConfigError(f"sac.ent_coef: expected 'auto', 'auto_<initial value>' with a value in [1.2e-38, 1e38] "
                          f"(its float32 log finite both ways), or such a number, got {short_repr(value)}")
    if not FLOAT32_TINY <= value <= ENT_COEF_MAX:  # (the temperature enters as float32 log: 1e39 would be inf there)
        raise ConfigError(f"sac.ent_coef: must be in [1.2e-38, 1e38] (its float32 log finite both ways), got "
                          f"{short_repr(value)}")
    return False, float(value)


def check_sac(o: SACConfig) -> None:
    _check_common("sac", o)
    entropy_coefficient(o.ent_coef)
    _check(o.target_update_interval >= 1, "sac.target_update_interval",
           f"must be >= 1, got {short_repr(o.target_update_interval)}")
    _check(o.target_entropy == "auto" or not isinstance(o.target_entropy, str), "sac.target_entropy",
           f"expected 'auto' or a number, got {short_repr(o.target_entropy)}")


def check_td3(o: TD3Config) -> None:
    _check_common("td3", o)
    _check(1 <= o.policy_delay <= 2**31 - 1, "td3.policy_delay",  # (an int32 constant in the graph)
           f"must be in [1, 2**31 - 1], got {short_repr(o.policy_delay)}")
    _check(o.target_policy_noise >= 0, "td3.target_policy_noise",
           f"must be >= 0, got {short_repr(o.target_policy_noise)}")
    _check(o.target_noise_clip >= 0, "td3.target_noise_clip", f"must be >= 0, got {short_repr(o.target_noise_clip)}")


SECTION_CHECKS = {"dqn": check_dqn, "sac": check_sac, "td3": check_td3}


def check_off_policy(cfg) -> None:
    """What an off-policy algorithm cannot run (one line naming the key), checked after every section's own."""
    algo = cfg.algo
    policy, defaults = cfg.policy, {"layer": "dense", "act_kernel": "builtin"}
    for key, value in defaults.items():
        _check(getattr(policy, key) in (value, "auto"), f"policy.{key}",
               f"{short_repr(getattr(policy, key))} applies to ppo only; {algo} runs its networks as compiled "
               f"MindSpore graphs (use {value})")
    _check(policy.log_std_init == 0.0, "policy.log_std_init",
           f"applies to ppo only ({algo}: " + ("the SAC actor's log std is an output of the network)" if algo == "sac"
                                              else "no Gaussian policy head)"))
    _check(not cfg.env.normalize_reward, "env.normalize_reward",
           f"not supported with algo {algo} (rewards go into the replay buffer unscaled)")
    _check(cfg.algo_config.optimizer_kernel != "custom" or cfg.amp.level == "O0", f"{algo}.optimizer_kernel",
           f"custom computes in float32 without a loss scale, not with amp.level {cfg.amp.level}; use builtin or auto")
    par = cfg.parallel
    _check(par.workers == 1, "parallel.workers",
           f"data parallelism is not supported with algo {algo} yet (one process; see docs/off_policy.md)")
    _check(par.micro_batch_size is None, "parallel.micro_batch_size", f"applies to ppo only (algo {algo})")
    _check(par.gradient_accumulation == 1, "parallel.gradient_accumulation", f"applies to ppo only (algo {algo})")
    _check(par.pipeline_stages == 1, "parallel.pipeline_stages",
           f"scalebox_ms has no pipeline parallelism (algo {algo}); use parallel.workers for data parallelism")


def space_refusal(algo: str, spec, env_id: str) -> Optional[str]:
    """Why ``algo`` cannot train on spaces ``spec`` (a one-line message), or None: DQN needs Discrete actions, SAC
    and TD3 Box actions (all three take image observations: NatureCNN networks)."""
    names = {"discrete": "Discrete", "box": "Box", "multidiscrete": "MultiDiscrete", "multibinary": "MultiBinary"}
    has, needs = names[spec.action_kind], "Discrete" if algo == "dqn" else "Box"
    if has == needs:
        if has == "Box" and not all(h - lo <= FLOAT32_MAX for lo, h in zip(spec.low, spec.high)):
            return (f"algo: {algo} maps its actions in [-1, 1] onto the Box's bounds in float32, and {env_id}'s "
                    "action space has high - low beyond float32's range (3.4e38): its actions would be inf; give the "
                    "env an action space of narrower bounds")
        return None
    other = {"Discrete": "dqn or ppo", "Box": "sac or td3"}.get(has, "ppo")
    return f"algo: {algo} needs a {needs} action space; {env_id} has {has} actions (use {other})"


def warn_if_warm_up_only(cfg, log, training: bool) -> None:
    """Log a warning when ``learn`` is about to run (``training``) a run whose ``learning_starts`` is at or past its
    ``run.total_steps``: every step is a random warm-up action and no gradient step ever runs (the run completed
    with n_updates 0, without a word)."""
    o = cfg.algo_config
    if training and o.learning_starts >= cfg.run.total_steps:
        log.warning(f"warning: {cfg.algo}.learning_starts {o.learning_starts} >= run.total_steps "
                    f"{cfg.run.total_steps}: every step of this run is a random warm-up action and no gradient step "
                    "runs")
