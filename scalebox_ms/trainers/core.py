"""What every trainer shares: config handling, the Sandbox, the env side, counters, predict, checkpoints.

:class:`Trainer` is the one base of :class:`~.ppo.PPOTrainer` and :class:`~.offpolicy.OffPolicyTrainer` (DQN, SAC,
TD3). It holds the parts that do not depend on the algorithm -- the config (a checked copy), the Sandbox, the
:class:`~.collector.RolloutCollector` (env, observation normalisation, episode accounting, non-finite checks),
the counters ``global_step``/``iteration``/``wall_time_s``, :meth:`predict`, :meth:`save`/:meth:`load`/
:meth:`from_checkpoint` (:mod:`.state`) and :meth:`close` -- and asks the algorithm for what does: its model,
its acting calls and its extra checkpoint state. The training loop (``learn``) is the algorithm's.
"""
from __future__ import annotations

import copy
import logging
import os
from typing import Optional, Union

import numpy as np

from ..config import Config
from ..errors import ConfigError, short_repr
from ..sandbox import Sandbox
from .hooks import Callback, _callback_list, _stops, _whole  # noqa: F401 (Callback: public here too)


def coerce_config(config: Union[Config, dict, None], algo: str, overrides: dict) -> Config:
    """A private Config from a Config (:meth:`~scalebox_ms.config.Config.checked_copy`), a dict in the YAML layout
    or None (defaults for ``algo``), with keyword ``overrides`` of the algorithm's section."""
    if config is None:
        config = Config.from_dict({"algo": algo})
    elif isinstance(config, dict):
        config = Config.from_dict({"algo": algo, **config})
    elif not isinstance(config, Config):
        raise ConfigError(f"config: expected Config, dict or None, got {type(config).__name__}"
                          + (" (a YAML file: load_config(path))" if isinstance(config, (str, os.PathLike)) else ""))
    else:
        config = config.checked_copy()  # (attributes set after the Config was built are checked as a file's)
    if config.algo != algo:
        raise ConfigError(f"algo: the config trains {config.algo}, not {algo} (scalebox_ms.trainers.make_trainer "
                          "picks the trainer by algo)")
    if overrides:  # keyword overrides of the algorithm's section, e.g. PPOTrainer(cfg, batch_size="auto")
        data = config.to_dict()
        data[algo].update(overrides)
        config = Config.from_dict(data)
    return config


def sandbox_for(config: Config) -> Sandbox:
    """The Sandbox of ``config.sandbox``; inside msrun, each rank takes its share of the cores and its device."""
    from ..parallel.context import in_msrun, local_rank, msrun_world_size

    sb_cfg = config.sandbox
    if in_msrun():
        import os

        sb_cfg = copy.copy(sb_cfg)
        if sb_cfg.threads == 0:  # ranks share this machine's cores instead of each taking all
            sb_cfg.threads = max(1, (os.cpu_count() or 1) // msrun_world_size())
        # one accelerator per rank: sandbox.device_id is rank 0's device, rank r takes the r-th after it
        # (ignored on CPU)
        sb_cfg.device_id = sb_cfg.device_id + local_rank()
    return Sandbox.from_config(sb_cfg, config.run.seed)


class Trainer:
    """The shared core. Subclasses set ``algo``, build ``self.collector`` with :meth:`_make_collector` and their
    model, and implement ``learn``, ``_act_deterministic``, ``_act_stochastic`` and the state hooks."""

    algo = ""

    def __init__(self, config: Union[Config, dict, None], sandbox: Optional[Sandbox], overrides: dict):
        if sandbox is not None and not isinstance(sandbox, Sandbox):  # ("cpu", {"device": "gpu"}: ignored silently)
            raise ConfigError(f"sandbox: expected a scalebox_ms.Sandbox or None, got {type(sandbox).__name__} "
                              f"{short_repr(sandbox)} (the config's section goes into the config: config.sandbox, or "
                              "{'sandbox': {...}} in a dict)")
        self.config = coerce_config(config, self.algo, overrides)
        self._config_built = self.config.to_dict()  # (see _refuse_if_config_changed)
        self.log = logging.getLogger("scalebox_ms")
        self.sandbox = sandbox if sandbox is not None else sandbox_for(self.config)
        self.sandbox.check_env_isolation(self.config.sandbox)  # (the envs follow the config's section)
        if hasattr(sandbox, "reseed"):  # run.seed decides the initial parameters, whatever ran in the process before
            sandbox.reseed(self.config.run.seed)
        self.global_step = 0
        self.iteration = 0
        self.steps_base = (0, 0)  # (global_step, iteration) where this config's iterations began (see load)
        self.wall_time_s = 0.0  # accumulated over sessions (resume)
        self.evaluations: list = []  # EvalCallback's results while training (run.eval_every), kept in checkpoints
        self._last_metrics: dict = {}
        self._closed = False
        #: off-policy: the step at which learn() was interrupted inside an iteration (see save)
        self._torn_at: Optional[int] = None
        #: set by :func:`~scalebox_ms.trainers.acting_trainer`: for evaluate/export, it must not train or save
        self._acting_only = False
        # stochastic predict(): its own stream of the run's seed (never the training stream)
        self._predict_rng = np.random.Generator(np.random.PCG64([self.config.run.seed, 1]))

    def _make_collector(self, num_envs: int, rank: int = 0, reducer=None, stream=None):
        from .collector import RolloutCollector
        from .memory import check_fits, network_bytes

        # rank r draws from stream r of the seed (rank 0 = the single-process stream); ``stream`` picks another
        # stream of the seed (PCG64([seed, stream])), independent of the envs' own generators
        seed = self.config.run.seed
        rng = np.random.Generator(np.random.PCG64(seed if stream is None else [seed, stream]).jumped(rank))
        self.collector = RolloutCollector(self.config, rng, num_envs, rank=rank, reducer=reducer)
        self.spec = self.collector.spec
        p = self.config.policy  # (a layer of 10**12 units: numpy's MemoryError traceback, 14.6 TiB, while building)
        check_fits("policy.pi_layers/vf_layers", f"a policy of {p.pi_layers} and a value net of {p.vf_layers}",
                   network_bytes(self.spec, p),
                   getattr(self.sandbox, "memory_limit_bytes", None))
        return self.collector

    # ------------------------------------------------------------------ the parts, as attributes users know
    env = property(lambda self: self.collector.env)
    obs_normalizer = property(lambda self: self.collector.obs_normalizer)
    reward_scaler = property(lambda self: self.collector.reward_scaler)
    episodes = property(lambda self: self.collector.episodes)
    episode_returns = property(lambda self: self.collector.episode_returns)
    episode_lengths = property(lambda self: self.collector.episode_lengths)

    @property
    def rng(self) -> np.random.Generator:
        """The training Generator (sampling noise, minibatch permutations, replay sampling)."""
        return self.collector.rng

    @property
    def num_envs(self) -> int:
        """Envs this process steps (``env.num_envs`` / world size under data parallelism)."""
        return self.collector.num_envs

    @property
    def world_size(self) -> int:
        return self.dist.world_size

    def _env_seed(self, seed: int) -> int:
        """Rank r's vector env gets seeds seed + r * n_local + i: the union over ranks is the single-process set."""
        return seed + self.dist.rank * self.num_envs

    def normalize_obs(self, obs, update: bool = False) -> np.ndarray:
        """One observation or a batch, as the env returns them (arrays, or dicts/tuples of arrays for Dict/Tuple
        spaces) -> the encoded, normalised float32 ``(obs_dim,)`` or ``(batch, obs_dim)`` the networks take
        (images: uint8 CHW frames, never normalised)."""
        batch, single = self._as_batch(obs, "normalize_obs")
        out = self.collector.normalize_obs(self.collector.encode(batch, "normalize_obs"), update=update)
        return out[0] if single else out

    def _as_batch(self, obs, what: str):
        """(batch, single): see :meth:`~scalebox_ms.envs.obs_encoding.ObsEncoder.as_batch`."""
        return self.collector.encoder.as_batch(obs, what)

    def _refuse_if_config_changed(self, what: str) -> None:
        """``trainer.config`` is the config the trainer was built with: its envs, networks, buffers and compiled
        graphs came from it. A key changed on it afterwards (``trainer.config.env.num_envs = 4``) reached some of
        them and not others (the step counters counted envs that did not exist, a checkpoint did not load again):
        refused, but for the keys a resume may change too (``run.total_steps``, ``run.eval_every``, ...) and those
        ``learn`` reads on every iteration (:data:`LIVE_KEYS`: a learning-rate decay of one's own). Those are checked
        as a file's values would be (a negative learning rate trained by gradient ascent, and a save wrote a checkpoint
        its own loader refused)."""
        from .lifecycle import RESUMABLE_KEYS, config_changes

        changed = config_changes(self._config_built, self.config.to_dict(), free=RESUMABLE_KEYS + LIVE_KEYS)
        if changed:
            raise ConfigError(f"{what}: trainer.config was changed after the trainer was built ({changed[0]}"
                              f"{', ...' if len(changed) > 1 else ''}), which it does not follow (only the run.* "
                              "bookkeeping keys and the learning rate (PPO: and clip range) may change); set it back, "
                              "or "
                              "build a trainer of the changed config and load() a checkpoint of this one into it")
        try:
            checked = self.config.checked_copy()
        except ConfigError as exc:
            raise ConfigError(f"{what}: trainer.config: {exc}") from None
        for key in RESUMABLE_KEYS + LIVE_KEYS:  # (as parsed: "1e-3" is read as a file's 1e-3 would be, a number)
            section, name = key.split(".")
            if getattr(checked, section, None) is not None and getattr(self.config, section, None) is not None:
                setattr(getattr(self.config, section), name, getattr(getattr(checked, section), name))

    def _check_horizon(self, total_steps: Optional[int], until: Optional[int]) -> int:
        """Apply ``learn(total_steps)`` to this trainer's config; returns the step to stop at. Both are checked
        before the config changes (a call refused for its ``until`` had moved the schedules' horizon)."""
        if total_steps is not None:
            total_steps = _whole("total_steps", total_steps)
            if total_steps < 1:
                raise ConfigError(f"total_steps: must be >= 1, got {total_steps}")
        until = None if until is None else _whole("until", until)
        if until is not None and until < 0:
            raise ConfigError(f"until: must be >= 0 (0: only the envs' first reset), got {until}")
        if total_steps is not None:
            self.config.run.total_steps = total_steps
        horizon = self.config.run.total_steps
        return horizon if until is None else min(int(until), horizon)

    def _start_learning(self, total_steps: Optional[int], until: Optional[int], callbacks) -> tuple:
        """The start of ``learn``: the horizon, the envs' first reset, the callbacks told. With ``run.eval_every >
        0`` and no :class:`EvalCallback` among ``callbacks``, one is added from the config (``run.eval_every``,
        ``run.eval_episodes``, ``run.stop_return``; logged): the config's keys hold for ``learn`` as for the CLI.
        Returns (the step to stop at, the callbacks)."""
        from .callbacks import EvalCallback

        if self._closed:
            raise ConfigError(f"learn: this {type(self).__name__} was closed (its envs are gone); build a new one, "
                              "e.g. load_trainer(checkpoint)")
        self._refuse_if_acting_only("learn")
        self._refuse_if_config_changed("learn")
        self._live = self._live_values()
        callbacks = _callback_list(callbacks)
        stop_at = self._check_horizon(total_steps, until)
        if self.collector.obs is None:
            self.collector.reset(seed=self._env_seed(self.config.run.seed), step=self.global_step)
        if self.config.run.eval_every > 0 and not any(isinstance(cb, EvalCallback) for cb in callbacks):
            callbacks.append(EvalCallback.from_config(self.config, log=self.log.info))
        for cb in callbacks:
            cb.on_training_start(self)
        if self._closed:  # (a callback closed it: no iteration on envs that are gone)
            return self.global_step, callbacks
        self._check_live()  # (a callback's on_training_start may set them too)
        return stop_at, callbacks

    def _end_iteration(self, callbacks, metrics: dict) -> bool:
        """After an iteration of ``learn``: the memory limit, then the callbacks; True: stop. A key a callback
        changed is checked before the next iteration reads it: a key of :data:`LIVE_KEYS` as a file's (a negative
        learning rate set mid-learn trained by gradient ascent to the end), any other of the algorithm's section or
        ``run.total_steps`` refused (the off-policy trainers read batch_size, learning_starts, exploration and
        action noise as they go: a change trained on unchecked until save refused it)."""
        if hasattr(self.sandbox, "check_memory"):
            self.sandbox.check_memory()
        stop = False
        for cb in callbacks:
            if _stops(cb.on_iteration_end(self, metrics)):
                stop = True
        if stop or self._closed:  # (a callback closed the trainer: its envs are gone)
            return True
        self._check_live()
        return False

    def _check_live(self, what: str = "learn") -> None:
        """The whole config check (:meth:`_refuse_if_config_changed`) if the algorithm's section or
        ``run.total_steps`` changed since the last check (cheap: their reprs compared)."""
        if self._live_values() != getattr(self, "_live", None):
            self._refuse_if_config_changed(what)
            self._live = self._live_values()

    def _live_values(self) -> list:
        return [self.config.algo, repr(self.config.algo_config), repr(self.config.run.total_steps)]

    # ------------------------------------------------------------------ inference
    def predict(self, obs, deterministic: bool = True, rng: Optional[np.random.Generator] = None) -> np.ndarray:
        """Actions for one observation or a batch, as the env returns them (Dict/Tuple spaces: a dict/tuple of
        parts), encoded and normalised with the run's statistics.

        Stochastic actions draw their noise from ``rng`` (a ``numpy.random.Generator``, or an int seed of a fresh
        one), or from the trainer's own predict stream (seeded from ``run.seed``, separate from the training
        stream). Observations that are not numbers, not of the space's shape, outside a discrete space, or not
        finite are a one-line ValueError."""
        if not isinstance(deterministic, (bool, np.bool_)):
            raise TypeError(f"predict: deterministic must be True or False, got {deterministic!r}")
        if rng is not None and not isinstance(rng, (np.random.Generator, np.random.RandomState)):
            if isinstance(rng, (bool, np.bool_)) or not isinstance(rng, (int, np.integer)) or rng < 0:
                got = repr(rng) if isinstance(rng, (int, np.integer)) else type(rng).__name__
                raise TypeError(f"predict: rng must be a numpy.random.Generator, an int seed >= 0 or None, got {got}")
            rng = np.random.default_rng(int(rng))
        elif isinstance(rng, np.random.RandomState) and not deterministic:  # (drawn with Generator methods)
            rng = np.random.default_rng(rng.randint(0, 2**63, dtype=np.int64))
        obs, single = self._as_batch(obs, "predict")
        from ..envs.obs_encoding import check_finite

        encoded = self.collector.encode(obs, "predict")
        check_finite(encoded, "predict", single)
        batch = self.collector.normalize_obs(encoded, update=False)
        if deterministic:
            actions = self._act_deterministic(batch)
        else:  # (reads exploration / action noise from the config: checked as learn checks it)
            self._check_live("predict")
            actions = self._act_stochastic(batch, self._predict_rng if rng is None else rng)
        return actions[0] if single else actions

    # ------------------------------------------------------------------ state
    def parameters_sha256(self) -> str:
        """SHA-256 of the model's parameters in the logical layout (see :func:`.state.parameters_sha256`)."""
        from .state import parameters_sha256

        return parameters_sha256(self.model)

    def get_parameters(self) -> dict:
        """``{name: numpy array}`` of everything a checkpoint holds of the networks, by its checkpoint names
        (``model.*``: the networks, targets included; ``optimizer.*``: Adam's state; ``amp.*``: the loss scaler), in
        the logical ``nn.Dense`` layout (the off-policy twin critics per critic, ``qf0.*``/``qf1.*``, as the
        ``.ckpt`` file holds them); copies."""
        items = getattr(self.model, "checkpoint_items", None)
        out = {}
        for name, param in self._named_state():
            array = np.array(self.model.to_logical(name, param.asnumpy()))
            out.update((n, np.array(a)) for n, a in (items(name, array) if items is not None else [(name, array)]))
        return out

    def set_parameters(self, values) -> None:
        """Write some or all of :meth:`get_parameters`' entries (a dict or (name, value) pairs, e.g. a ``.ckpt``
        file's ``ms.load_checkpoint``; numpy arrays, Tensors or Parameters; ``model.`` may be left out of a network's
        name) so that the compiled graphs see them: MindSpore 2.10's ``Parameter.set_data``, and so
        ``ms.load_param_into_net(trainer.model, ...)``, are not seen by a graph that already ran (``predict`` would
        go on acting with the old weights). An unknown name, a wrong shape or a value that is not a finite number is
        a ValueError, and then nothing is written."""
        import mindspore as ms

        from ..ops import AssignParameters

        named = dict(self._named_state())
        items = getattr(self.model, "checkpoint_items", None)
        logical = {key: np.array(self.model.to_logical(key, param.asnumpy())) for key, param in named.items()}
        member = {}  # checkpoint name of one twin critic's slice -> (the stored ensemble name, its index)
        for key, array in logical.items():
            for k, (n, _) in enumerate(items(key, array) if items is not None else []):
                if n != key:
                    member[n] = (key, k)
        written = {}
        for name, value in (values.items() if isinstance(values, dict) else values):
            key = name if not isinstance(name, str) or name in named or name in member else "model." + name
            stored, k = member.get(key, (key, None))
            if stored not in named:
                raise ValueError(f"set_parameters: {name!r} is none of this trainer's parameters (get_parameters() "
                                 f"names them)")
            array = np.asarray(value.asnumpy() if hasattr(value, "asnumpy") else value)
            want = logical[stored].shape if k is None else logical[stored].shape[1:]
            if array.shape != want:
                raise ValueError(f"set_parameters: {name!r} has shape {array.shape}, this trainer's has {want}")
            if array.dtype.kind not in "biuf":
                raise ValueError(f"set_parameters: {name!r} holds {array.dtype} values, not real numbers")
            if not np.isfinite(array).all():  # (predict then acted on NaN weights: all zeros, without a word)
                raise ValueError(f"set_parameters: {name!r} holds NaN or infinity")
            if k is None:
                written[stored] = array
            else:  # (one critic's slice of the ensemble tensor: the other critic's stays as it is)
                written.setdefault(stored, logical[stored].copy())[k] = array
        if written:
            params = [named[key] for key in written]
            AssignParameters(params).write([
                ms.Tensor(np.asarray(self.model.to_storage(key, array), dtype=named[key].asnumpy().dtype))
                for key, array in written.items()])
            self._weights_changed()

    def _weights_changed(self) -> None:
        """The parameters were written from outside training (:meth:`set_parameters`): drop what was computed from
        the old ones."""

    def _named_state(self):
        return self._values.named

    def _sidecar_extra(self) -> dict:
        """Algorithm-specific sidecar entries."""
        return {}

    def _restore_extra(self, sidecar: dict) -> None:
        pass

    def _replay_state(self):
        """Arrays of the replay buffer to checkpoint (None: no replay buffer, or not saved)."""
        return None

    def _restore_replay(self, arrays) -> None:
        """The checkpoint's replay buffer contents (None: none saved or read)."""

    def _refuse_if_acting_only(self, what: str) -> None:
        if self._acting_only:
            raise ConfigError(f"{what}: this {type(self).__name__} was built by acting_trainer for evaluate/export "
                              "(off-policy: without its replay buffer and optimizer kernels); "
                              "load_trainer(checkpoint) builds one that trains")

    def save(self, prefix: str) -> str:
        """Write a checkpoint at ``prefix`` (see :mod:`.checkpoint`); returns the sidecar path. Refused (one-line
        :class:`CheckpointError`) after ``learn`` was interrupted where the trainer's state is partly updated: PPO
        inside its update (parameters without their counters), DQN/SAC/TD3 anywhere inside an iteration (the cut
        phase's transitions are lost, the counters lie between phase boundaries)."""
        from .state import save

        self._refuse_if_acting_only("save")
        self._refuse_if_config_changed("save")
        if self._torn_at is not None:
            from ..errors import CheckpointError

            raise CheckpointError(f"save: learn() of this {type(self).__name__} was interrupted inside an iteration "
                                  f"(after step {self._torn_at}), its state partly updated: it cannot be checkpointed; "
                                  "load the last checkpoint, or stop learn() at an iteration boundary (until=, a "
                                  "Callback returning False, the CLI's Ctrl-C)")

        return save(self, prefix)

    def load(self, path: str, replay: bool = True):
        """Restore parameters, optimizer, statistics, counters, RNG and env state from a checkpoint; off-policy
        also the replay buffer's contents, unless ``replay=False`` (a trainer that only acts: it stays empty)."""
        from .state import load

        return load(self, path, replay=replay)

    @classmethod
    def from_checkpoint(cls, path: str, sandbox: Optional[Sandbox] = None):
        """Build a trainer with the checkpoint's own config and restore its state."""
        from ..errors import CheckpointError
        from .checkpoint import read_checkpoint

        sc = read_checkpoint(path)["sidecar"]
        try:
            cfg = Config.from_dict(sc["config"])
        except (ConfigError, KeyError) as exc:
            raise CheckpointError(f"checkpoint {path}: its config is invalid ({exc})") from None
        trainer = cls(cfg, sandbox=sandbox)
        try:
            return trainer.load(path)
        except BaseException:  # (its envs, isolated worker processes included, go with it)
            trainer.close()
            raise

    def close(self) -> None:
        self._closed = True
        self.collector.close()


#: keys ``learn`` reads from ``trainer.config`` on every iteration (they may change between ``learn`` calls)
LIVE_KEYS = ("ppo.learning_rate", "ppo.lr_schedule", "ppo.clip_range", "ppo.clip_schedule", "dqn.learning_rate",
             "sac.learning_rate", "td3.learning_rate")


def closes_envs_on_error(init):
    """For a trainer's ``__init__``: a failure after its envs are built (a refusal, the memory check) closes
    them before it propagates (isolated env workers outlived the error)."""
    import functools

    @functools.wraps(init)
    def wrapper(self, *args, **kwargs):
        try:
            init(self, *args, **kwargs)
        except BaseException:
            collector = self.__dict__.get("collector")
            if collector is not None:
                collector.close()
            raise

    return wrapper
