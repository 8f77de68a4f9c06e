"""Typed run configuration.

A run is described by one :class:`Config` made of dataclass sections (``env``, ``policy``, ``ppo``,
``run``, ``sandbox``). YAML files map onto it key by key; ``--set section.key=value`` overrides use YAML
syntax for the value. Unknown keys, wrong types and bad values raise :class:`ConfigError` naming the key.
"""
from __future__ import annotations

import copy
import dataclasses
import difflib
import hashlib
import json
import math
import typing
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Union

import yaml

from .errors import ConfigError


@dataclass
class EnvConfig:
    id: str = "CartPole-v1"
    num_envs: int = 8
    #: 'gymnasium' (gymnasium's own envs) or 'native' (MindSpore graph dynamics: CartPole-v1, Acrobot-v1,
    #: MountainCar-v0, MountainCarContinuous-v0, Pendulum-v1)
    backend: str = "gymnasium"
    #: with backend native: run each rollout (T vector steps) as one compiled graph call
    compiled_rollout: bool = True
    #: running mean/std observation normalisation (SB3 VecNormalize semantics)
    normalize_obs: bool = False
    #: scale rewards by the running std of the discounted return
    normalize_reward: bool = False
    clip_obs: float = 10.0
    clip_reward: float = 10.0
    #: extra keyword arguments for ``gymnasium.make``
    kwargs: Dict[str, Any] = field(default_factory=dict)


@dataclass
class PolicyConfig:
    pi_layers: List[int] = field(default_factory=lambda: [64, 64])
    vf_layers: List[int] = field(default_factory=lambda: [64, 64])
    activation: str = "tanh"
    ortho_init: bool = True
    #: initial log standard deviation of the Gaussian head (continuous actions)
    log_std_init: float = 0.0
    #: 'dense' (nn.Dense + activation cells) or 'fused' (scalebox_ms.ops.FusedDense: Linear + bias +
    #: activation as one operator, storage padded to ``align`` elements; same outputs and checkpoints)
    layer: str = "dense"
    #: alignment (elements) of FusedDense storage; 1 disables padding
    align: int = 16
    #: acting-call kernel: 'builtin' (MindSpore ops), 'custom' (the C++ fused-MLP aot kernel of
    #: scalebox_ms.ops.custom; inference only), 'auto' (custom where benchmarks/acting_kernels.py measured it faster)
    act_kernel: str = "builtin"


@dataclass
class PPOConfig:
    n_steps: int = 2048
    #: minibatch size, or "auto": probe the sizes in [min_batch, max_batch] that divide the rollout in the
    #: first iteration and keep the one with the highest measured update throughput (see trainers.autobatch)
    batch_size: Union[int, str] = 64
    min_batch: int = 64
    max_batch: int = 1024
    n_epochs: int = 10
    gamma: float = 0.99
    gae_lambda: float = 0.95
    learning_rate: float = 3e-4
    lr_schedule: str = "constant"
    clip_range: float = 0.2
    clip_schedule: str = "constant"
    #: clip the value function update around the old value (None: no value clipping)
    clip_range_vf: Optional[float] = None
    ent_coef: float = 0.0
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    #: stop the epochs of an update once approx-KL exceeds 1.5 * target_kl (None: never)
    target_kl: Optional[float] = None
    normalize_advantage: bool = True
    adam_eps: float = 1e-5
    #: minibatch update: 'builtin' (the compiled PPOUpdateStep graph), 'custom' (the C++ kernel of
    #: scalebox_ms.ops.custom.PPOUpdateKernel: the whole update in one call; CPU, float32, dense layers, one
    #: process), 'auto' (custom where benchmarks/update_kernel.py measured it faster, else builtin)
    update_kernel: str = "builtin"


@dataclass
class RunConfig:
    seed: int = 0
    total_steps: int = 100_000
    #: write a checkpoint every this many env steps (0: only at the end)
    checkpoint_every: int = 0
    #: how many checkpoints to keep (oldest removed first)
    keep_checkpoints: int = 3
    #: deterministic evaluation episodes at the end of training (0: none)
    eval_episodes: int = 0
    progress: bool = True


@dataclass
class SandboxConfig:
    device: str = "auto"
    device_id: int = 0
    threads: int = 0
    deterministic: bool = True
    #: 'none': envs in this process; 'process': each env in a worker process, restarted on crash/hang;
    #: 'strict': 'process' + worker_memory_limit + deterministic kernels
    isolation_level: str = "none"
    #: limit for this process ("512MB", "16GB"; null: none). Device memory on GPU/Ascend; RSS watch on CPU
    memory_limit: Optional[Union[int, str]] = None
    #: address-space limit of each env worker under isolation_level 'strict' (bytes or "1GB")
    worker_memory_limit: Optional[Union[int, str]] = "2GB"
    #: seconds an env worker may take for one step before it is restarted (isolation 'process'/'strict')
    step_timeout: float = 10.0


@dataclass
class AmpConfig:
    #: amp level (scalebox_ms.amp): 'O0' (off, float32), 'O1' (Dense/FusedDense cells in low precision),
    #: 'O2' (the MLPs in low precision; distributions and loss in float32), 'O3' (O2 + distribution heads in low
    #: precision)
    level: str = "O0"
    #: 'float16' or 'bfloat16' (bfloat16 MatMul is unsupported on CPU: refused at start-up there)
    dtype: str = "float16"
    #: dynamic loss scaling: initial scale, growth after growth_interval finite steps, backoff on overflow
    init_scale: float = 1024.0
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000


@dataclass
class ParallelConfig:
    #: data-parallel worker processes launched with msrun (1: single process). env.num_envs and
    #: ppo.batch_size are global: each rank steps num_envs / workers envs and computes batch_size / workers
    #: samples of each minibatch; gradients are averaged across ranks (HCCL / NCCL / MCCL)
    workers: int = 1
    #: accumulate the gradient of each minibatch over this many micro-batches before one optimizer step
    gradient_accumulation: int = 1
    #: alternatively the micro-batch size (per rank); must divide the per-rank minibatch
    micro_batch_size: Optional[int] = None
    #: > 1: MindSpore pipeline parallelism (Ascend/GPU only; refused on CPU)
    pipeline_stages: int = 1
    #: seconds to wait for the other ranks before the job is declared failed
    timeout: float = 300.0


@dataclass
class Config:
    env: EnvConfig = field(default_factory=EnvConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    ppo: PPOConfig = field(default_factory=PPOConfig)
    run: RunConfig = field(default_factory=RunConfig)
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    amp: AmpConfig = field(default_factory=AmpConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)

    # ------------------------------------------------------------------ conversion
    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def hash(self) -> str:
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()

    @classmethod
    def from_dict(cls, data: Optional[Dict[str, Any]]) -> "Config":
        cfg = cls()
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise ConfigError(f"config: expected a mapping of sections, got {type(data).__name__}")
        sections = {f.name: f for f in dataclasses.fields(cls)}
        for name, value in data.items():
            if name not in sections:
                raise ConfigError(_unknown("config", name, sections))
            if value is None:
                continue
            if not isinstance(value, dict):
                raise ConfigError(f"config: section '{name}' must be a mapping, got {type(value).__name__}")
            section = getattr(cfg, name)
            for key, v in value.items():
                _set_field(section, name, key, v)
        validate(cfg)
        return cfg

    def with_overrides(self, overrides: List[str]) -> "Config":
        """Apply ``section.key=value`` strings (values parsed as YAML); returns a new Config."""
        data = self.to_dict()
        for item in overrides:
            if "=" not in item:
                raise ConfigError(f"--set {item!r}: expected section.key=value")
            path, raw = item.split("=", 1)
            parts = path.strip().split(".")
            if len(parts) != 2 or not all(parts):
                raise ConfigError(f"--set {item!r}: key must be section.key, e.g. ppo.n_steps=64")
            try:
                value = yaml.safe_load(raw)
            except yaml.YAMLError as exc:
                raise ConfigError(f"--set {path}: value {raw!r} is not valid YAML ({_first_line(exc)})") from None
            section, key = parts
            if section not in data:
                raise ConfigError(_unknown("config", section, data))
            data[section][key] = value
        return Config.from_dict(data)


def load_config(path: Optional[str], overrides: Optional[List[str]] = None) -> Config:
    """Load a YAML config file (None: defaults) and apply ``--set`` overrides."""
    if path is None:
        cfg = Config()
    else:
        try:
            with open(path, "r", encoding="utf-8") as f:
                data = yaml.safe_load(f)
        except FileNotFoundError:
            raise ConfigError(f"config file not found: {path}") from None
        except IsADirectoryError:
            raise ConfigError(f"config file is a directory: {path}") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {path}: invalid YAML ({_first_line(exc)})") from None
        except UnicodeDecodeError:
            raise ConfigError(f"config file {path}: not UTF-8 text") from None
        except OSError as exc:
            raise ConfigError(f"config file {path}: cannot read ({exc.strerror})") from None
        cfg = Config.from_dict(data)
    if overrides:
        cfg = cfg.with_overrides(overrides)
    return cfg


# ---------------------------------------------------------------------- validation
_CHOICES = {
    ("policy", "activation"): ("tanh", "relu"),
    ("ppo", "lr_schedule"): ("constant", "linear"),
    ("ppo", "clip_schedule"): ("constant", "linear"),
    ("sandbox", "device"): ("auto", "cpu", "gpu", "ascend"),
    ("sandbox", "isolation_level"): ("none", "process", "strict"),
    ("env", "backend"): ("gymnasium", "native"),
    ("policy", "layer"): ("dense", "fused"),
    ("policy", "act_kernel"): ("builtin", "custom", "auto"),
    ("ppo", "update_kernel"): ("builtin", "custom", "auto"),
    ("amp", "level"): ("O0", "O1", "O2", "O3"),
    ("amp", "dtype"): ("float16", "bfloat16"),
}


def parse_bytes(text: Optional[str], key: str) -> Optional[int]:
    """'512MB', '16GB', '1.5G', '1024' (bytes) -> int bytes; None stays None."""
    if text is None:
        return None
    units = {"": 1, "B": 1, "K": 2**10, "KB": 2**10, "M": 2**20, "MB": 2**20, "G": 2**30, "GB": 2**30,
             "T": 2**40, "TB": 2**40}
    s = str(text).strip().upper().replace(" ", "")
    num = s.rstrip("KMGTB")
    unit = s[len(num):]
    try:
        value = float(num)
    except ValueError:
        value = -1.0
    if unit not in units or value <= 0 or not math.isfinite(value) or int(value * units[unit]) < 1:
        raise ConfigError(f"{key}: expected a size like '512MB' or '16GB', got {text!r}")
    return int(value * units[unit])


def validate(cfg: Config) -> None:
    e, p, o, r, s = cfg.env, cfg.policy, cfg.ppo, cfg.run, cfg.sandbox
    for (section, key), choices in _CHOICES.items():
        value = getattr(getattr(cfg, section), key)
        if value not in choices:
            raise ConfigError(f"{section}.{key}: {value!r} is not one of {', '.join(choices)}")
    _check(e.id.strip() != "", "env.id", "must not be empty")
    _check(e.num_envs >= 1, "env.num_envs", f"must be >= 1, got {e.num_envs}")
    if e.backend == "native":
        from .envs.native import SUPPORTED

        _check(e.id in SUPPORTED, "env.backend", f"native has no {e.id!r} (it has {', '.join(SUPPORTED)})")
        _check(not e.kwargs, "env.kwargs", "not supported with env.backend native")
        _check(s.isolation_level == "none", "sandbox.isolation_level",
               "process isolation applies to gymnasium envs; native envs run inside MindSpore graphs")
    _check(e.clip_obs > 0, "env.clip_obs", f"must be > 0, got {e.clip_obs}")
    _check(e.clip_reward > 0, "env.clip_reward", f"must be > 0, got {e.clip_reward}")
    for key in ("pi_layers", "vf_layers"):
        layers = getattr(p, key)
        _check(all(n >= 1 for n in layers), f"policy.{key}", f"layer sizes must be >= 1, got {layers}")
    _check(1 <= p.align <= 1024, "policy.align", f"must be in [1, 1024], got {p.align}")
    _check(o.n_steps >= 1, "ppo.n_steps", f"must be >= 1, got {o.n_steps}")
    _check(o.n_epochs >= 1, "ppo.n_epochs", f"must be >= 1, got {o.n_epochs}")
    rollout = o.n_steps * e.num_envs
    if isinstance(o.batch_size, str):
        _check(o.batch_size == "auto", "ppo.batch_size", f"must be an integer or 'auto', got {o.batch_size!r}")
        _check(o.min_batch >= 1, "ppo.min_batch", f"must be >= 1, got {o.min_batch}")
        _check(o.max_batch >= o.min_batch, "ppo.max_batch", f"({o.max_batch}) must be >= ppo.min_batch ({o.min_batch})")
        _check(any(rollout % b == 0 for b in range(o.min_batch, min(o.max_batch, rollout) + 1)), "ppo.batch_size",
               f"auto: no size in [ppo.min_batch, ppo.max_batch] = [{o.min_batch}, {o.max_batch}] divides "
               f"ppo.n_steps * env.num_envs ({rollout})")
    else:
        _check(o.batch_size >= 1, "ppo.batch_size", f"must be >= 1, got {o.batch_size}")
        _check(rollout % o.batch_size == 0, "ppo.batch_size",
               f"({o.batch_size}) must divide ppo.n_steps * env.num_envs ({rollout})")
    _check(0.0 <= o.gamma <= 1.0, "ppo.gamma", f"must be in [0, 1], got {o.gamma}")
    _check(0.0 <= o.gae_lambda <= 1.0, "ppo.gae_lambda", f"must be in [0, 1], got {o.gae_lambda}")
    _check(o.learning_rate > 0, "ppo.learning_rate", f"must be > 0, got {o.learning_rate}")
    _check(o.clip_range > 0, "ppo.clip_range", f"must be > 0, got {o.clip_range}")
    _check(o.clip_range_vf is None or o.clip_range_vf > 0, "ppo.clip_range_vf", f"must be > 0 or null, got {o.clip_range_vf}")
    _check(o.ent_coef >= 0, "ppo.ent_coef", f"must be >= 0, got {o.ent_coef}")
    _check(o.vf_coef >= 0, "ppo.vf_coef", f"must be >= 0, got {o.vf_coef}")
    _check(o.max_grad_norm > 0, "ppo.max_grad_norm", f"must be > 0, got {o.max_grad_norm}")
    _check(o.target_kl is None or o.target_kl > 0, "ppo.target_kl", f"must be > 0 or null, got {o.target_kl}")
    _check(o.adam_eps > 0, "ppo.adam_eps", f"must be > 0, got {o.adam_eps}")
    _check(0 <= r.seed < 2**32, "run.seed", f"must be in [0, 2**32), got {r.seed}")
    _check(r.total_steps >= 1, "run.total_steps", f"must be >= 1, got {r.total_steps}")
    _check(r.checkpoint_every >= 0, "run.checkpoint_every", f"must be >= 0, got {r.checkpoint_every}")
    _check(r.keep_checkpoints >= 1, "run.keep_checkpoints", f"must be >= 1, got {r.keep_checkpoints}")
    _check(r.eval_episodes >= 0, "run.eval_episodes", f"must be >= 0, got {r.eval_episodes}")
    _check(s.threads >= 0, "sandbox.threads", f"must be >= 0 (0: automatic), got {s.threads}")
    _check(s.device_id >= 0, "sandbox.device_id", f"must be >= 0, got {s.device_id}")
    _check(s.step_timeout > 0, "sandbox.step_timeout", f"must be > 0, got {s.step_timeout}")
    a = cfg.amp
    _check(a.init_scale >= 1, "amp.init_scale", f"must be >= 1 (the scale never backs off below 1), got {a.init_scale}")
    _check(a.growth_factor >= 1.0, "amp.growth_factor", f"must be >= 1, got {a.growth_factor}")
    _check(0.0 < a.backoff_factor < 1.0, "amp.backoff_factor", f"must be in (0, 1), got {a.backoff_factor}")
    _check(a.growth_interval >= 1, "amp.growth_interval", f"must be >= 1, got {a.growth_interval}")
    _validate_parallel(cfg)
    parse_bytes(s.memory_limit, "sandbox.memory_limit")
    worker = parse_bytes(s.worker_memory_limit, "sandbox.worker_memory_limit")
    _check(worker is None or worker >= 256 * 2**20, "sandbox.worker_memory_limit",
           f"must be at least 256MB (a Python worker with gymnasium needs ~100 MB), got {s.worker_memory_limit!r}")


def _validate_parallel(cfg: Config) -> None:
    par, e, o = cfg.parallel, cfg.env, cfg.ppo
    w = par.workers
    _check(1 <= w <= 1024, "parallel.workers", f"must be in [1, 1024], got {w}")
    _check(par.timeout > 0, "parallel.timeout", f"must be > 0, got {par.timeout}")
    _check(par.pipeline_stages >= 1, "parallel.pipeline_stages", f"must be >= 1, got {par.pipeline_stages}")
    _check(par.gradient_accumulation >= 1, "parallel.gradient_accumulation",
           f"must be >= 1, got {par.gradient_accumulation}")
    if w > 1:
        _check(e.num_envs % w == 0, "env.num_envs", f"({e.num_envs}) must be divisible by parallel.workers ({w})")
        _check(o.batch_size != "auto", "ppo.batch_size", "'auto' is not supported with parallel.workers > 1")
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
        raise ConfigError("parallel.gradient_accumulation: needs a fixed ppo.batch_size, not 'auto'")


def micro_batches(cfg: Config) -> int:
    """Number of micro-batches each rank splits its minibatch into (1: no accumulation)."""
    par = cfg.parallel
    if par.micro_batch_size is not None and isinstance(cfg.ppo.batch_size, int):
        return cfg.ppo.batch_size // par.workers // par.micro_batch_size
    return par.gradient_accumulation


def _check(ok: bool, key: str, msg: str) -> None:
    if not ok:
        raise ConfigError(f"{key}: {msg}")


def _unknown(where: str, key: str, known) -> str:
    names = list(known)
    hint = difflib.get_close_matches(str(key), names, n=1)
    suffix = f" (did you mean '{hint[0]}'?)" if hint else f" (known: {', '.join(names)})"
    return f"{where}: unknown key '{key}'{suffix}"


def _first_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def _set_field(section_obj, section: str, key: str, value: Any) -> None:
    fields = {f.name: f for f in dataclasses.fields(section_obj)}
    if key not in fields:
        raise ConfigError(_unknown(section, key, fields))
    hints = typing.get_type_hints(type(section_obj))
    setattr(section_obj, key, _coerce(f"{section}.{key}", hints[key], value))


def _coerce(name: str, tp, value: Any) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Union:  # Optional[X] or Union[int, str]
        if value is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        if len(options) == 1:
            return _coerce(name, options[0], value)
        for option in options:
            try:
                return _coerce(name, option, value)
            except ConfigError:
                pass
        names = {int: "an integer", float: "a number", str: "a string", bool: "true/false"}
        raise ConfigError(f"{name}: expected {' or '.join(names.get(o, str(o)) for o in options)}, got {value!r}")
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{name}: expected true/false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
            return int(value)  # YAML writes 1e5 as a float
        raise ConfigError(f"{name}: expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(float(value)):
                raise ConfigError(f"{name}: expected a finite number, got {value!r}")
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads "1e-3" (no dot) as a string
            try:
                f = float(value)
            except ValueError:
                pass
            else:
                if math.isfinite(f):
                    return f
        raise ConfigError(f"{name}: expected a number, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{name}: expected a string, got {value!r}")
    if origin in (list, List):
        if not isinstance(value, list):
            raise ConfigError(f"{name}: expected a list, got {value!r}")
        return [_coerce(f"{name}[{i}]", args[0], v) for i, v in enumerate(value)]
    if origin in (dict, Dict):
        if not isinstance(value, dict):
            raise ConfigError(f"{name}: expected a mapping, got {value!r}")
        return copy.deepcopy(value)
    raise TypeError(f"unsupported config field type {tp} for {name}")  # programming error
