"""Typed run configuration.

A run is described by one :class:`Config` made of dataclass sections (``env``, ``policy``, ``ppo``,
``run``, ``sandbox``, ``amp``, ``parallel``). YAML files map onto it key by key; ``--set section.key=value``
overrides use YAML syntax for the value. Both are read by :func:`scalebox_ms.config_yaml.load_yaml`, which
refuses duplicate keys and alias bombs. Unknown keys, wrong types and bad values raise :class:`ConfigError`
naming the key; user values in messages are shortened (:func:`scalebox_ms.errors.short_repr`).

All checks of config values live in :mod:`scalebox_ms.config_checks` (:func:`validate`, re-exported here): one function per section plus the checks that
relate sections. Classes that users may also build by hand (``AutoMixedPrecision``, ``Sandbox``, ``ActorCritic``)
run their section's checks on their arguments through :func:`checked_section` rather than repeating them.
"""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import logging
import math
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Union

import yaml

from .config_offpolicy import ALGOS, POLICY_DEFAULTS, DQNConfig, SACConfig, TD3Config
from .config_yaml import KeysOnly, coerce, dump_yaml, load_yaml, set_field, unknown_key, yaml_problem
from .errors import ConfigError, short_repr


@dataclass
class EnvConfig(KeysOnly):
    SECTION = "env"
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
    #: 'auto' (Atari's standard preprocessing for ale-py envs, else none), 'atari' or 'none' (docs/spaces.md)
    preprocess: str = "auto"


@dataclass
class PolicyConfig(KeysOnly):
    SECTION = "policy"
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
    #: feature extractor: 'auto' (NatureCNN for image observations, one per image inside a Dict/Tuple, else the
    #: MLP on the encoded vector), 'mlp' (images flattened too) or 'nature_cnn' (observations with images only)
    features: str = "auto"
    #: one CNN for the policy and the value function (else one each); the MLP path always has separate networks
    share_features: bool = True
    #: NatureCNN sizes: output channels of its three convolutions (8x8/4, 4x4/2, 3x3/1) and of its Dense layer
    cnn_channels: List[int] = field(default_factory=lambda: [32, 64, 64])
    cnn_features_dim: int = 512
    #: NatureCNN's first-layer patches on CPU: 'builtin' (ops.unfold), 'custom' (the C++ im2col kernel of
    #: scalebox_ms.ops.custom.patches: reads the uint8 frames, same values bit for bit), 'auto' (custom on CPU when
    #: the kernel can be built, else builtin). builtin by default: in PPO on Breakout the kernel measured no faster
    #: end to end (docs/performance.md, CNN section)
    conv_kernel: str = "builtin"
    #: NatureCNN's convolutions on CPU: 'im2col' (MindSpore ops: unfold + one batched matmul per layer), 'onednn'
    #: (oneDNN's own forward and backward convolution primitives, from the library inside MindSpore's CPU wheel,
    #: as aot ops: scalebox_ms.ops.custom.onednn_conv), 'auto' (onednn on CPU when it can be built, else im2col)
    conv_backend: str = "auto"


@dataclass
class PPOConfig(KeysOnly):
    SECTION = "ppo"
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
class RunConfig(KeysOnly):
    SECTION = "run"
    seed: int = 0
    total_steps: int = 100_000
    #: write a checkpoint every this many env steps (0: only at the end)
    checkpoint_every: int = 0
    #: how many checkpoints to keep (oldest removed first)
    keep_checkpoints: int = 3
    #: deterministic evaluation episodes at the end of training (0: none)
    eval_episodes: int = 0
    #: also evaluate eval_episodes episodes every this many env steps while training (at the first iteration end
    #: past each multiple; 0: only at the end); each result is in summary.json's "evaluations"
    eval_every: int = 0
    #: stop training ("status": "solved") at the first of those evaluations whose mean return reaches this
    #: (null: train for run.total_steps)
    stop_return: Optional[float] = None
    progress: bool = True
    #: off-policy algorithms: save the replay buffer with each checkpoint (false: a resumed run refills it)
    save_replay: bool = True


@dataclass
class SandboxConfig(KeysOnly):
    SECTION = "sandbox"
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
class AmpConfig(KeysOnly):
    SECTION = "amp"
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
class ParallelConfig(KeysOnly):
    SECTION = "parallel"
    #: data-parallel worker processes launched with msrun (1: single process). env.num_envs and
    #: ppo.batch_size are global: each rank steps num_envs / workers envs and computes batch_size / workers
    #: samples of each minibatch; gradients are averaged across ranks (HCCL / NCCL / MCCL)
    workers: int = 1
    #: accumulate the gradient of each minibatch over this many micro-batches before one optimizer step
    gradient_accumulation: int = 1
    #: alternatively the micro-batch size (per rank); must divide the per-rank minibatch
    micro_batch_size: Optional[int] = None
    #: 1 only: scalebox_ms has no pipeline parallelism (> 1 is refused on every device)
    pipeline_stages: int = 1
    #: seconds to wait for the other ranks before the job is declared failed
    timeout: float = 300.0
    #: ``--workers``: seconds without an iteration ending on any rank (timed from the end of the first) before the
    #: launcher declares the job hung, has each rank print its Python stack into its log and stops it (0: never)
    hang_timeout: float = 1800.0


@dataclass
class Config(KeysOnly):
    #: the algorithm: 'ppo', 'dqn', 'sac' or 'td3' (its section holds its settings; the others' are absent)
    algo: str = "ppo"
    env: EnvConfig = field(default_factory=EnvConfig)
    #: (None: the algorithm's default networks, see __post_init__)
    policy: PolicyConfig = None  # type: ignore[assignment]
    ppo: PPOConfig = field(default_factory=PPOConfig)
    dqn: DQNConfig = field(default_factory=DQNConfig)
    sac: SACConfig = field(default_factory=SACConfig)
    td3: TD3Config = field(default_factory=TD3Config)
    run: RunConfig = field(default_factory=RunConfig)
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    amp: AmpConfig = field(default_factory=AmpConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)

    def __post_init__(self):
        if self.policy is None:  # Config(algo="sac"): SAC's default networks, as from a file saying algo: sac
            self.policy = PolicyConfig()
            self._apply_policy_defaults("ppo", self.algo)

    def __setattr__(self, name, value):
        """``cfg.algo = "sac"`` switches the algorithm as ``--set algo=sac`` does: policy settings left at the old
        algorithm's defaults take the new one's (PPO's 64-64 tanh networks trained SAC otherwise)."""
        old = self.__dict__.get("algo")
        super().__setattr__(name, value)
        if name == "algo" and self.__dict__.get("policy") is not None and old != value:
            self._apply_policy_defaults(old, value)

    def _apply_policy_defaults(self, old, new) -> None:
        """Policy settings at ``old``'s defaults take ``new``'s, in a new PolicyConfig (the old object may be
        another config's too: ``dataclasses.replace`` shares it)."""
        if old in ALGOS and new in ALGOS and old != new:  # (an unknown name is refused when the config is checked)
            changes = {key: copy.deepcopy(POLICY_DEFAULTS[new][key]) for key, default in POLICY_DEFAULTS[old].items()
                       if getattr(self.policy, key) == default}
            self.policy = dataclasses.replace(self.policy, **changes)

    @property
    def algo_config(self):
        """The active algorithm's section (``cfg.ppo``, ``cfg.dqn``, ...)."""
        return getattr(self, self.algo)

    # ------------------------------------------------------------------ conversion
    def to_dict(self) -> Dict[str, Any]:
        """All sections except the inactive algorithms'."""
        return {k: v for k, v in dataclasses.asdict(self).items() if k not in ALGOS or k == self.algo}

    def to_yaml(self) -> str:
        return dump_yaml(self.to_dict())

    def hash(self) -> str:
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()

    @classmethod
    def from_dict(cls, data: Optional[Dict[str, Any]]) -> "Config":
        cfg = cls()
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise ConfigError(f"config: expected a mapping of sections, got {type(data).__name__}")
        algo = coerce("algo", str, data.get("algo", "ppo"))
        if algo not in ALGOS:
            raise ConfigError(f"algo: {short_repr(algo)} is not one of {', '.join(ALGOS)}")
        cfg.algo = algo  # (with the algorithm's default networks, SB3's: see __setattr__)
        sections = {f.name: f for f in dataclasses.fields(cls)}
        for name, value in data.items():
            if name == "algo":
                continue
            if name not in sections:
                raise ConfigError(unknown_key("config", name, sections))
            if name in ALGOS and name != algo:
                raise ConfigError(f"{name}: a section of algo {name}, but this config trains algo {algo} "
                                  f"(set algo: {name}, or remove the section)")
            if value is None:
                continue
            if not isinstance(value, dict):
                raise ConfigError(f"config: section '{name}' must be a mapping, got {type(value).__name__}")
            section = getattr(cfg, name)
            for key, v in value.items():
                set_field(section, name, key, v)
        validate(cfg)
        return cfg

    def checked_copy(self) -> "Config":
        """A copy that went through :meth:`from_dict`'s parsing and checks again: values set on the attributes after
        the config was built (``cfg.ppo.batch_size = 7``) are refused as a file's would be (tuples and numpy arrays
        count as lists, numpy scalars as numbers; ``env.kwargs`` go to the env as they are)."""
        data = self.to_dict()
        kwargs = data["env"].pop("kwargs")  # (passed to the env as they are, as from_dict does: ALE's tuples)
        data = _plain(data)
        data["env"]["kwargs"] = kwargs
        return Config.from_dict(data)

    def with_overrides(self, overrides: List[str]) -> "Config":
        """Apply ``section.key=value`` strings (values parsed as YAML), ``section.key.name=value`` for one entry of
        a mapping (``env.kwargs.is_slippery=false``) and ``algo=name``; returns a new Config.

        ``algo=name`` switches the algorithm: the old algorithm's section goes, and policy settings that were at
        the old algorithm's defaults take the new one's."""
        data = self.to_dict()
        for item in overrides:
            if "=" not in item:
                raise ConfigError(f"--set {short_repr(item)}: expected section.key=value")
            path, raw = item.split("=", 1)
            parts = path.strip().split(".")
            if parts != ["algo"] and (len(parts) not in (2, 3) or not all(parts)):
                raise ConfigError(f"--set {short_repr(item)}: key must be section.key, e.g. ppo.n_steps=64 (or "
                                  f"section.key.name for a mapping, e.g. env.kwargs.is_slippery=false)")
            try:
                value = load_yaml(raw, f"--set {path.strip()}", lines=False)
            except yaml.YAMLError as exc:
                raise ConfigError(f"--set {path}: value {short_repr(raw)} is not valid YAML "
                                  f"({yaml_problem(exc)})") from None
            if parts == ["algo"]:
                _switch_algo(data, value)
                continue
            section, key, *name = parts
            if section not in data and section in ALGOS:
                raise ConfigError(f"--set {path.strip()}: a key of algo {section}, but this config trains algo "
                                  f"{data['algo']} (add --set algo={section} before it)")
            if section == "algo":
                raise ConfigError(f"--set {path.strip()}: algo is a key of its own, e.g. --set algo=sac")
            if section not in data:  # (this config's sections and the other algorithms')
                raise ConfigError(unknown_key("config", section, [k for k in data if k != "algo"]
                                              + [a for a in ALGOS if a not in data]))
            if name and key in data[section]:  # one entry of a mapping-valued key (env.kwargs)
                if not isinstance(data[section][key], dict):
                    raise ConfigError(f"--set {path.strip()}: {section}.{key} is not a mapping (only a mapping such "
                                      f"as env.kwargs takes a third part); use --set {section}.{key}=VALUE")
                value = {**data[section][key], name[0]: value}
            data[section][key] = value
        return Config.from_dict(data)


def _switch_algo(data: Dict[str, Any], algo: Any) -> None:
    old = data.get("algo", "ppo")
    if algo == old:
        return
    if algo not in ALGOS:
        raise ConfigError(f"algo: {short_repr(algo)} is not one of {', '.join(ALGOS)}")
    data.pop(old, None)
    data["algo"] = algo
    data[algo] = {}
    policy = data.get("policy", {})
    for key, value in POLICY_DEFAULTS[old].items():
        if policy.get(key) == value:  # left at the old algorithm's default: the new algorithm's default applies
            policy.pop(key)


PRESETS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs")


def preset_path(path: str) -> str:
    """``path``, or the packaged preset it names where no such file exists: ``ppo_pendulum``, ``ppo_pendulum.yaml``
    or ``configs/ppo_pendulum.yaml`` (the docs' form, run outside a source checkout) -> scalebox_ms/configs/."""
    if os.path.exists(path):
        return path
    head, name = os.path.split(path)
    name = name if name.endswith((".yaml", ".yml")) else name + ".yaml"
    packaged = os.path.join(PRESETS_DIR, name)
    if (not head or os.path.basename(os.path.normpath(head)) in (".", "configs")) and os.path.isfile(packaged):
        logging.getLogger("scalebox_ms").info(f"config: no file {path} here; using the packaged preset {packaged}")
        return packaged
    return path


def _plain(value):
    """``value`` with tuples and numpy arrays as lists, numpy scalars as Python numbers (as YAML would give them)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "tolist") and hasattr(value, "shape"):  # (numpy scalars and arrays)
        return value.tolist()
    return value


def load_config(path: Optional[str], overrides: Optional[List[str]] = None) -> Config:
    """Load a YAML config file (None: defaults) and apply ``--set`` overrides. A ``path`` that does not exist but
    names a packaged preset (:func:`preset_path`) loads that preset."""
    if path is None:
        cfg = Config()
    else:
        path = preset_path(os.fspath(path))
        try:
            with open(path, "r", encoding="utf-8") as f:
                data = load_yaml(f, f"config file {path}")
        except FileNotFoundError:
            raise ConfigError(f"config file not found: {path} (a packaged preset is named by its file name alone, "
                              f"e.g. --config ppo_cartpole.yaml; the presets: {PRESETS_DIR})") from None
        except IsADirectoryError:
            raise ConfigError(f"config file is a directory: {path}") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {path}: invalid YAML ({yaml_problem(exc)})") from None
        except UnicodeDecodeError:
            raise ConfigError(f"config file {path}: not UTF-8 text") from None
        except OSError as exc:
            raise ConfigError(f"config file {path}: cannot read ({exc.strerror})") from None
        run = os.path.isdir(os.path.join(os.path.dirname(path), "checkpoints"))  # (a run's config.yaml, --resume)
        if data is None:  # (an empty file, or comments only: most likely not the file meant)
            raise ConfigError(f"config file {path}: empty (no settings); " + (
                "the config each checkpoint was trained with is in its checkpoints/ckpt_<step>.json ('config')"
                if run else "leave out --config for the defaults"))
        if not isinstance(data, dict):  # (e.g. a text file that is one YAML string)
            raise ConfigError(f"config file {path}: expected a mapping of sections (env:, ppo:, run:, ...), got "
                              f"{type(data).__name__}")
        try:
            cfg = Config.from_dict(data)
        except ConfigError as exc:  # (a key or value of the file: name the file, as for its syntax)
            raise ConfigError(f"config file {path}: {exc}") from None
    if overrides:
        cfg = cfg.with_overrides(overrides)
    return cfg


# ---------------------------------------------------------------------- validation
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
        raise ConfigError(f"{key}: expected a size like '512MB' or '16GB', got {short_repr(text)}")
    return int(value * units[unit])


def micro_batches(cfg: Config) -> int:
    """Number of micro-batches each rank splits its minibatch into (1: no accumulation)."""
    par = cfg.parallel
    if par.micro_batch_size is not None and isinstance(cfg.ppo.batch_size, int):
        return cfg.ppo.batch_size // par.workers // par.micro_batch_size
    return par.gradient_accumulation


# the checks live in config_checks.py; imported last (config_checks reads the dataclasses above)
from .config_checks import checked_section, validate  # noqa: E402
