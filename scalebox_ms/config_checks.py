"""Every check of a config value, one message per key naming it (:func:`validate`).

One function per section plus the checks that relate sections. Classes that users may also build by hand
(``AutoMixedPrecision``, ``Sandbox``, ``ActorCritic``) run their section's checks on their arguments through
:func:`checked_section` rather than repeating them. The dataclasses themselves are in :mod:`scalebox_ms.config`.
"""
from __future__ import annotations

from .config import (AmpConfig, Config, EnvConfig, ParallelConfig, PolicyConfig, PPOConfig, RunConfig,
                     SandboxConfig, parse_bytes)
from .config_offpolicy import ALGOS, OFF_POLICY, SECTION_CHECKS, check_off_policy
from .config_yaml import check_positive, set_field
from .errors import ConfigError, short_repr

_CHOICES = {
    ("policy", "activation"): ("tanh", "relu"),
    ("ppo", "lr_schedule"): ("constant", "linear"),
    ("ppo", "clip_schedule"): ("constant", "linear"),
    ("sandbox", "device"): ("auto", "cpu", "gpu", "ascend"),
    ("sandbox", "isolation_level"): ("none", "process", "strict"),
    ("env", "backend"): ("gymnasium", "native", "envpool"),
    ("policy", "layer"): ("dense", "fused"),
    ("policy", "act_kernel"): ("builtin", "custom", "auto"),
    ("policy", "conv_kernel"): ("builtin", "custom", "auto"),
    ("policy", "conv_backend"): ("im2col", "onednn", "auto"),
    ("ppo", "update_kernel"): ("builtin", "custom", "auto"),
    ("policy", "features"): ("auto", "mlp", "nature_cnn"),
    ("env", "preprocess"): ("auto", "atari", "none"),
    ("amp", "level"): ("O0", "O1", "O2", "O3"),
    ("amp", "dtype"): ("float16", "bfloat16"),
}

#: the most CPU threads sandbox.threads may ask for (MindSpore's CPU thread setters take a 32-bit int)
MAX_THREADS = 4096


def validate(cfg: Config) -> None:
    """Every check of a config value (one message per key, naming it): each section's own checks, then the
    checks that relate sections. Classes that library users may build directly validate their arguments with
    :func:`checked_section`, which runs the same section checks."""
    for name, check in _SECTION_CHECKS.items():
        if name not in ALGOS or name == cfg.algo:
            check(getattr(cfg, name))
    if cfg.algo in OFF_POLICY:
        check_off_policy(cfg)
    else:
        _check_rollout(cfg.ppo, cfg.env)
        _check_parallel(cfg)
    e, s = cfg.env, cfg.sandbox
    if e.backend == "native":
        from .envs.native import SUPPORTED

        _check(e.id in SUPPORTED, "env.backend", f"native has no {short_repr(e.id)} (it has {', '.join(SUPPORTED)})")
        _check(not e.kwargs, "env.kwargs", "not supported with env.backend native")
        _check(e.preprocess != "atari", "env.preprocess", "atari applies to ale-py envs, not env.backend native")
        _check(s.isolation_level == "none", "sandbox.isolation_level",
               "process isolation applies to gymnasium envs; native envs run inside MindSpore graphs")
    if e.backend == "envpool":
        from .envs.atari import is_atari, require_atari_id

        if e.preprocess == "atari":
            require_atari_id(e.id)
        _check(e.preprocess != "none" or not is_atari(e.id), "env.preprocess",
               f"none with env.backend envpool: EnvPool's Atari envs always preprocess ({short_repr(e.id)}); use auto "
               "(or env.backend gymnasium for raw frames)")
        _check(s.isolation_level == "none", "sandbox.isolation_level",
               "process isolation applies to gymnasium envs; EnvPool runs its envs in its own C++ threads")
    if (cfg.amp.level != "O0" or (cfg.algo not in OFF_POLICY and cfg.parallel.workers > 1)) and \
            cfg.policy.features != "mlp" and _atari_frames(e):
        key = "amp.level" if cfg.amp.level != "O0" else "parallel.workers"
        raise ConfigError(f"{key}: image observations (NatureCNN, the frames of {short_repr(e.id)}) train in float32 "
                          "in one process only for now")
    _check(cfg.policy.act_kernel != "custom" or cfg.amp.level == "O0", "policy.act_kernel",
           f"the custom kernel computes in float32 and cannot run a model cast by amp.level {cfg.amp.level}; "
           "use act_kernel builtin or auto")


def checked_section(name: str, **values):
    """The ``name`` section dataclass with ``values`` set, type-converted and checked exactly as a config file's
    (:class:`ConfigError` naming ``name.key``), e.g. ``checked_section("amp", level="O2", growth_interval=0)``
    raises ``amp.growth_interval: must be in [1, 2**31 - 1], got 0``. For classes users may construct directly
    (:class:`~scalebox_ms.amp.AutoMixedPrecision`, :class:`~scalebox_ms.sandbox.Sandbox`, the actor-critic)."""
    section = type(getattr(Config(), name))()  # (a fresh section: PPO's policy defaults, as before algo existed)
    for key, value in values.items():
        set_field(section, name, key, value)
    _SECTION_CHECKS[name](section)
    return section


def _choices(section: str, obj) -> None:
    for (where, key), choices in _CHOICES.items():
        if where == section and getattr(obj, key) not in choices:
            raise ConfigError(f"{section}.{key}: {short_repr(getattr(obj, key))} is not one of {', '.join(choices)}")


#: the most envs a run may step: the memory check of the rollout/replay comes after the envs are built, and
#: 1e9 of them took the host's memory first (per-env Python objects and seeds: ~240 bytes each), killing the process
MAX_NUM_ENVS = 2**20


def _check_env(e: EnvConfig) -> None:
    _choices("env", e)
    _check(e.id.strip() != "", "env.id", "must not be empty")
    _check(1 <= e.num_envs <= MAX_NUM_ENVS, "env.num_envs",
           f"must be in [1, {MAX_NUM_ENVS:,}], got {short_repr(e.num_envs)}")
    check_positive("env.clip_obs", e.clip_obs)
    check_positive("env.clip_reward", e.clip_reward)
    _check_plain(e.kwargs, "env.kwargs")


def _check_plain(value, path: str) -> None:
    """``value`` is what config.yaml and the checkpoints' JSON hold as it is: None, true/false, numbers, strings,
    lists (tuples) and mappings with string keys. A YAML date, set or binary, or a numpy scalar, failed when the run
    wrote its files, with a traceback and a half-written run directory."""
    if value is None or type(value) in (bool, int, float, str):
        return
    if type(value) in (list, tuple):
        for i, item in enumerate(value):
            _check_plain(item, f"{path}[{i}]")
        return
    if type(value) is dict:
        for key, item in value.items():
            _check(type(key) is str, path, f"keys must be strings, got {short_repr(key)}")
            _check_plain(item, f"{path}.{key}")
        return
    raise ConfigError(f"{path}: {short_repr(value)} (a {type(value).__name__}) cannot be saved with the run "
                      "(config.yaml, checkpoints); give a string, a number, true/false, a list or a mapping")


def _check_policy(p: PolicyConfig) -> None:
    _choices("policy", p)
    for key in ("pi_layers", "vf_layers"):
        layers = getattr(p, key)
        _check(all(n >= 1 for n in layers), f"policy.{key}", f"layer sizes must be >= 1, got {short_repr(layers)}")
    _check(1 <= p.align <= 1024, "policy.align", f"must be in [1, 1024], got {short_repr(p.align)}")
    _check(len(p.cnn_channels) == 3 and all(n >= 1 for n in p.cnn_channels), "policy.cnn_channels",
           f"must be 3 channel counts >= 1, got {short_repr(p.cnn_channels)}")
    _check(p.cnn_features_dim >= 1, "policy.cnn_features_dim", f"must be >= 1, got {short_repr(p.cnn_features_dim)}")


def _check_ppo(o: PPOConfig) -> None:
    _choices("ppo", o)
    _check(o.n_steps >= 1, "ppo.n_steps", f"must be >= 1, got {short_repr(o.n_steps)}")
    _check(o.n_epochs >= 1, "ppo.n_epochs", f"must be >= 1, got {short_repr(o.n_epochs)}")
    # (used by batch_size: auto only, but a bad value is refused whatever the batch size: it waits for a switch)
    _check(o.min_batch >= 1, "ppo.min_batch", f"must be >= 1, got {short_repr(o.min_batch)}")
    _check(o.max_batch >= o.min_batch, "ppo.max_batch", f"({o.max_batch}) must be >= ppo.min_batch ({o.min_batch})")
    if isinstance(o.batch_size, str):
        _check(o.batch_size == "auto", "ppo.batch_size",
               f"must be an integer or 'auto', got {short_repr(o.batch_size)}")
    else:
        _check(o.batch_size >= 1, "ppo.batch_size", f"must be >= 1, got {short_repr(o.batch_size)}")
    _check(0.0 <= o.gamma <= 1.0, "ppo.gamma", f"must be in [0, 1], got {short_repr(o.gamma)}")
    _check(0.0 <= o.gae_lambda <= 1.0, "ppo.gae_lambda", f"must be in [0, 1], got {short_repr(o.gae_lambda)}")
    check_positive("ppo.learning_rate", o.learning_rate)
    check_positive("ppo.clip_range", o.clip_range)
    check_positive("ppo.clip_range_vf", o.clip_range_vf, null=True)
    _check(o.ent_coef >= 0, "ppo.ent_coef", f"must be >= 0, got {short_repr(o.ent_coef)}")
    _check(o.vf_coef >= 0, "ppo.vf_coef", f"must be >= 0, got {short_repr(o.vf_coef)}")
    check_positive("ppo.max_grad_norm", o.max_grad_norm)
    check_positive("ppo.target_kl", o.target_kl, null=True)
    check_positive("ppo.adam_eps", o.adam_eps)


def _check_rollout(o: PPOConfig, e: EnvConfig) -> None:
    rollout = o.n_steps * e.num_envs
    if o.batch_size == "auto":
        _check(any(rollout % b == 0 for b in range(o.min_batch, min(o.max_batch, rollout) + 1)), "ppo.batch_size",
               f"auto: no size in [ppo.min_batch, ppo.max_batch] = [{o.min_batch}, {o.max_batch}] divides "
               f"ppo.n_steps * env.num_envs ({rollout})")
    else:
        _check(rollout % o.batch_size == 0, "ppo.batch_size",
               f"({o.batch_size}) must divide ppo.n_steps * env.num_envs ({rollout})")


def _check_run(r: RunConfig) -> None:
    _check(0 <= r.seed < 2**32, "run.seed", f"must be in [0, 2**32), got {short_repr(r.seed)}")
    _check(r.total_steps >= 1, "run.total_steps", f"must be >= 1, got {short_repr(r.total_steps)}")
    _check(r.checkpoint_every >= 0, "run.checkpoint_every", f"must be >= 0, got {short_repr(r.checkpoint_every)}")
    _check(r.keep_checkpoints >= 1, "run.keep_checkpoints", f"must be >= 1, got {short_repr(r.keep_checkpoints)}")
    _check(r.eval_episodes >= 0, "run.eval_episodes", f"must be >= 0, got {short_repr(r.eval_episodes)}")
    _check(r.eval_every >= 0, "run.eval_every", f"must be >= 0 (0: only at the end), got {short_repr(r.eval_every)}")
    _check(r.eval_every == 0 or r.eval_episodes >= 1, "run.eval_every", "needs run.eval_episodes >= 1")
    _check(r.stop_return is None or r.eval_every >= 1, "run.stop_return", "needs run.eval_every >= 1")


def _check_sandbox(s: SandboxConfig) -> None:
    _choices("sandbox", s)
    _check(s.threads >= 0, "sandbox.threads", f"must be >= 0 (0: automatic), got {short_repr(s.threads)}")
    _check(s.threads <= MAX_THREADS, "sandbox.threads",  # (MindSpore's setter took 2**32 as a TypeError traceback)
           f"must be <= {MAX_THREADS}, got {short_repr(s.threads)}")
    _check(s.device_id >= 0, "sandbox.device_id", f"must be >= 0, got {short_repr(s.device_id)}")
    _check(s.step_timeout > 0, "sandbox.step_timeout", f"must be > 0, got {short_repr(s.step_timeout)}")
    parse_bytes(s.memory_limit, "sandbox.memory_limit")
    worker = parse_bytes(s.worker_memory_limit, "sandbox.worker_memory_limit")
    _check(worker is None or worker >= 256 * 2**20, "sandbox.worker_memory_limit",
           f"must be at least 256MB (a Python worker with gymnasium needs ~100 MB), got "
           f"{short_repr(s.worker_memory_limit)}")


def _check_amp(a: AmpConfig) -> None:
    _choices("amp", a)
    _check(a.init_scale >= 1, "amp.init_scale",
           f"must be >= 1 (the scale never backs off below 1), got {short_repr(a.init_scale)}")
    _check(a.growth_factor >= 1.0, "amp.growth_factor", f"must be >= 1, got {short_repr(a.growth_factor)}")
    _check(0.0 < a.backoff_factor < 1.0, "amp.backoff_factor", f"must be in (0, 1), got {short_repr(a.backoff_factor)}")
    # (the graphs count clean steps in int32: 2**31 wrapped to a negative interval, the scale grew on every step)
    _check(1 <= a.growth_interval <= 2**31 - 1, "amp.growth_interval",
           f"must be in [1, 2**31 - 1], got {short_repr(a.growth_interval)}")


def _check_parallel_section(par: ParallelConfig) -> None:
    _check(1 <= par.workers <= 1024, "parallel.workers", f"must be in [1, 1024], got {short_repr(par.workers)}")
    _check(par.timeout > 0, "parallel.timeout", f"must be > 0, got {short_repr(par.timeout)}")
    _check(par.hang_timeout >= 0, "parallel.hang_timeout", f"must be >= 0 (0: off), got {short_repr(par.hang_timeout)}")
    _check(par.pipeline_stages >= 1, "parallel.pipeline_stages", f"must be >= 1, got {short_repr(par.pipeline_stages)}")
    _check(par.gradient_accumulation >= 1, "parallel.gradient_accumulation",
           f"must be >= 1, got {short_repr(par.gradient_accumulation)}")


_SECTION_CHECKS = {"env": _check_env, "policy": _check_policy, "ppo": _check_ppo, "run": _check_run,
                   "sandbox": _check_sandbox, "amp": _check_amp, "parallel": _check_parallel_section,
                   **SECTION_CHECKS}


def _check_parallel(cfg: Config) -> None:
    par, e, o = cfg.parallel, cfg.env, cfg.ppo
    w = par.workers
    if w > 1:
        _check(e.num_envs % w == 0, "env.num_envs", f"({e.num_envs}) must be divisible by parallel.workers ({w})")
        _check(o.batch_size != "auto", "ppo.batch_size", "'auto' is not supported with parallel.workers > 1")
        # (the trainer's own check came ~12 s after msrun had started the ranks: known before any of them starts)
        _check(o.update_kernel != "custom", "ppo.update_kernel",
               "custom cannot run with data parallelism (the kernel has no all-reduce); use builtin or auto")
    if isinstance(o.batch_size, int):
        _check(o.batch_size % w == 0, "ppo.batch_size", f"({o.batch_size}) must be divisible by parallel.workers ({w})")
        per_rank = o.batch_size // w
        if par.micro_batch_size is not None:
            m = par.micro_batch_size
            _check(m >= 1 and per_rank % m == 0, "parallel.micro_batch_size",
                   f"({m}) must divide the per-rank minibatch ppo.batch_size / parallel.workers ({per_rank})")
            _check(par.gradient_accumulation in (1, per_rank // m), "parallel.gradient_accumulation",
                   f"({par.gradient_accumulation}) contradicts parallel.micro_batch_size ({m}): "
                   f"{per_rank} / {m} = {per_rank // m} micro-batches")
        else:
            k = par.gradient_accumulation
            _check(per_rank % k == 0, "parallel.gradient_accumulation",
                   f"({k}) must divide the per-rank minibatch ppo.batch_size / parallel.workers ({per_rank})")
    elif par.micro_batch_size is not None or par.gradient_accumulation > 1:
        key = "parallel.micro_batch_size" if par.micro_batch_size is not None else "parallel.gradient_accumulation"
        raise ConfigError(f"{key}: needs a fixed ppo.batch_size, not 'auto'")


def _atari_frames(e: EnvConfig) -> bool:
    """An ale-py env whose observations are images for a NatureCNN (with ``policy.features`` auto): Atari's
    preprocessed frame stacks, or raw RGB screens; not RAM, nor raw grayscale screens (2-D: an MLP's). Known before
    any env is built, so ``--workers`` and ``amp.level``, which images cannot use yet, are refused before msrun
    starts (a custom image env is refused by the trainer, once its spaces are known)."""
    obs_type = (e.kwargs or {}).get("obs_type", "rgb")
    if e.backend == "native" or obs_type == "ram":
        return False
    from .envs.atari import is_atari, resolve

    return is_atari(e.id) and (resolve(e.preprocess, e.id, e.kwargs) == "atari" or obs_type != "grayscale")


def _check(ok: bool, key: str, msg: str) -> None:
    if not ok:
        raise ConfigError(f"{key}: {msg}")
