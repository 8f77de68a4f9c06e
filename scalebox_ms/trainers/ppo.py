"""PPOTrainer: the collect -> advantages -> update loop.

The trainer composes four parts, each in its own module:

* :class:`~.collector.RolloutCollector` -- env, normalisation, episode accounting, in-flight state;
* :class:`~.update_runner.UpdateRunner` -- the epochs x minibatches of an update on the compiled
  :class:`~.ppo_update.PPOUpdateStep` (all of PPO's maths) or the C++ update kernel, behind one interface;
* :mod:`.kernels` -- which acting and update implementation runs (``policy.act_kernel``, ``ppo.update_kernel``);
* :mod:`.state` -- what a checkpoint holds and how it is restored.

Python->graph calls per iteration (gymnasium path, ``n_steps`` = T, ``n_epochs`` = E, rollout B = T*N,
``batch_size`` = b): T acting calls (action, log-prob and value for all N envs at once), 1 bootstrap value call,
and E * B/b update calls with the compiled update graph -- or ONE with the C++ update kernel (E with
``target_kl``). With ``env.backend: native`` and ``env.compiled_rollout`` the T acting calls, the env steps and
the bootstrap value become one call (:mod:`.native_rollout`). Everything random (sampling noise, minibatch
permutations) is drawn from one numpy ``PCG64`` Generator seeded from ``run.seed`` and saved in checkpoints, so
runs are reproducible and resumable bit for bit.
"""
from __future__ import annotations

import copy
import logging
import time
from typing import Optional, Sequence, Union

import numpy as np

from ..config import Config, micro_batches
from ..errors import ConfigError
from ..sandbox import Sandbox


class Callback:
    """Hooks into :meth:`PPOTrainer.learn`. Return False from ``on_iteration_end`` to stop training."""

    def on_training_start(self, trainer: "PPOTrainer") -> None:
        pass

    def on_iteration_end(self, trainer: "PPOTrainer", metrics: dict) -> Optional[bool]:
        return None

    def on_training_end(self, trainer: "PPOTrainer") -> None:
        pass


def schedule_value(initial: float, kind: str, progress_remaining: float) -> float:
    """SB3-style schedules: 'constant' or 'linear' (initial * progress_remaining, 1 -> 0 over the run)."""
    if kind == "linear":
        return initial * progress_remaining
    return initial


class PPOTrainer:
    """Proximal Policy Optimization on a gymnasium vector env, compiled with MindSpore.

    Args:
        config: a :class:`~scalebox_ms.config.Config` (copied: the caller's object is never changed), a dict in
            the YAML layout, or None for defaults.
        sandbox: an existing :class:`~scalebox_ms.Sandbox`; built from ``config.sandbox`` when omitted.

    Attributes users embed: ``model`` (the :class:`~scalebox_ms.models.ActorCritic` ``nn.Cell``),
    ``act_step``/``value_step``/``deterministic_step`` (compiled entry points), ``update_step`` (the
    compiled PPO minibatch update or the C++ kernel, which owns the Adam optimizer state).
    """

    def __init__(self, config: Union[Config, dict, None] = None, sandbox: Optional[Sandbox] = None, **ppo):
        if config is None:
            config = Config()
        elif isinstance(config, dict):
            config = Config.from_dict(config)
        elif not isinstance(config, Config):
            raise ConfigError(f"config: expected Config, dict or None, got {type(config).__name__}")
        else:
            config = copy.deepcopy(config)
        if ppo:  # keyword overrides of the ppo section, e.g. PPOTrainer(cfg, batch_size="auto", max_batch=512)
            data = config.to_dict()
            data["ppo"].update(ppo)
            config = Config.from_dict(data)
        self.config = config
        self.log = logging.getLogger("scalebox_ms")
        if sandbox is None:
            sandbox = _sandbox_for(config)
        self.sandbox = sandbox

        from ..amp import AutoMixedPrecision, check_backend
        from ..models import DeterministicStep, ValueStep, build_model
        from ..parallel import init_distributed
        from .collector import RolloutCollector
        from .kernels import build_act_steps, select_update_kernel
        from .memory import check_fits, rollout_bytes
        from .ppo_update import PPOUpdateStep
        from .state import ParameterValues, named_state
        from .update_runner import GraphMinibatches, KernelMinibatches, UpdateRunner

        device = getattr(sandbox, "device", "CPU")
        if config.parallel.pipeline_stages > 1:
            raise ConfigError(_pipeline_refusal(device, config.parallel.pipeline_stages))
        self.amp = AutoMixedPrecision.from_config(config.amp)
        check_backend(self.amp, device)
        # data parallel: inside an msrun worker this joins the job (HCCL / NCCL / MCCL); else rank 0 of 1
        self.dist = init_distributed(device)
        W = self.dist.world_size
        if W > 1 and config.parallel.workers == 1:  # started by the user's own msrun line without --workers
            data = config.to_dict()
            data["parallel"]["workers"] = W
            try:
                self.config = config = Config.from_dict(data)  # re-validated for W ranks
            except ConfigError as exc:
                raise ConfigError(f"{exc} (under msrun with {W} ranks detected)") from None
        e, p = config.env, config.ppo
        if W > 1 and e.num_envs % W:
            raise ConfigError(f"env.num_envs: ({e.num_envs}) must be divisible by the {W} msrun workers")
        n_local = e.num_envs // W  # this rank's shard of the envs
        reducer = None
        if W > 1:  # running statistics merged over all ranks' envs: every rank normalises identically
            from ..parallel.context import moments_reducer

            reducer = moments_reducer(self.dist)
        # rank r draws from stream r of the seed (rank 0 = the single-process stream)
        rng = np.random.Generator(np.random.PCG64(config.run.seed).jumped(self.dist.rank))
        self.collector = RolloutCollector(config, sandbox, rng, n_local, rank=self.dist.rank, reducer=reducer)
        self.spec = self.collector.spec
        width = 1 if self.spec.discrete else self.spec.action_dim
        check_fits("ppo.n_steps", f"a rollout of ppo.n_steps x env.num_envs = {p.n_steps} x {n_local} samples",
                   rollout_bytes(p.n_steps * n_local, self.spec.obs_dim, width),
                   getattr(sandbox, "memory_limit_bytes", None))
        self.model = build_model(self.spec, config.policy)
        if self.amp is not None:
            self.amp.apply(self.model)
        # acting: MindSpore ops, or the C++ fused-MLP kernel per policy.act_kernel (trainers.kernels)
        self.act_step, self._act_packed = build_act_steps(self.model, config.policy, n_local)
        self.value_step = ValueStep(self.model)
        self.deterministic_step = DeterministicStep(self.model)
        self.update_step = PPOUpdateStep(self.model, p, micro_batches=micro_batches(config), amp=self.amp,
                                         world_size=W)
        kernel = select_update_kernel(config, self.model, self.update_step.optimizer, self.amp, W, device)
        if kernel is not None:  # same model Parameters and Adam state, the whole update in one C++ call
            self.update_step = kernel
            run_minibatches = KernelMinibatches(kernel)
        else:
            run_minibatches = GraphMinibatches(self.update_step, p.target_kl is not None)
        self._values = ParameterValues(named_state(self.model, self.update_step))
        self.runner = UpdateRunner(run_minibatches, p, self.collector, W, self.amp, self._values.snapshot,
                                   self._values.restore, obs_dim=self.spec.obs_dim,
                                   hidden=list(config.policy.pi_layers) + list(config.policy.vf_layers),
                                   memory_budget=self._memory_budget)
        self.global_step = 0
        self.iteration = 0
        self.wall_time_s = 0.0  # accumulated over sessions (resume)
        self._last_metrics: dict = {}
        # stochastic predict(): its own stream of the run's seed (never the training stream)
        self._predict_rng = np.random.Generator(np.random.PCG64([config.run.seed, 1]))

    # ------------------------------------------------------------------ the parts, as attributes users know
    env = property(lambda self: self.collector.env)
    obs_normalizer = property(lambda self: self.collector.obs_normalizer)
    reward_scaler = property(lambda self: self.collector.reward_scaler)
    episodes = property(lambda self: self.collector.episodes)
    episode_returns = property(lambda self: self.collector.episode_returns)
    episode_lengths = property(lambda self: self.collector.episode_lengths)
    batch_size = property(lambda self: self.runner.batch_size)
    auto_batch = property(lambda self: self.runner.auto_batch)
    _compiled_rollout = property(lambda self: self.collector.compiled)

    @property
    def rng(self) -> np.random.Generator:
        """The training Generator (sampling noise, minibatch permutations)."""
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

    def _memory_budget(self):
        limit = getattr(self.sandbox, "memory_limit_bytes", None)
        if limit and self.sandbox.device == "CPU":  # host memory left under the sandbox's limit
            from ..sandbox import current_rss_bytes

            return max(0, limit - current_rss_bytes())
        return None

    def normalize_obs(self, obs: np.ndarray, update: bool = False) -> np.ndarray:
        return self.collector.normalize_obs(obs, update=update)

    def update_calls_per_iteration(self) -> int:
        """Update graph/kernel calls per iteration without a target_kl stop."""
        return self.runner.calls_per_update(self.config.ppo.n_steps * self.num_envs)

    # ------------------------------------------------------------------ the loop
    def learn(self, total_steps: Optional[int] = None, callbacks: Sequence[Callback] = (),
              until: Optional[int] = None) -> "PPOTrainer":
        """Train until ``global_step`` reaches ``total_steps`` (default ``run.total_steps``).

        ``total_steps`` is also the horizon of the linear schedules (it becomes this trainer's
        ``config.run.total_steps``; the caller's Config is not changed). ``until`` pauses earlier (at the first
        iteration boundary at or past it) without changing the schedules, e.g. to train a run in chunks.
        """
        import mindspore as ms

        from ..buffers import RolloutStorage, compute_gae

        if total_steps is not None:
            if int(total_steps) < 1:
                raise ConfigError(f"total_steps: must be >= 1, got {total_steps}")
            self.config.run.total_steps = int(total_steps)
        horizon = self.config.run.total_steps
        stop_at = horizon if until is None else min(int(until), horizon)
        workers = self.config.parallel.workers
        if self.dist.world_size != workers and workers > 1:
            raise ConfigError(f"parallel.workers: {workers} workers are configured but this process is not one "
                              f"of {workers} msrun ranks; launch with `python -m scalebox_ms.train --workers "
                              f"{workers}` or your own msrun command line")
        c = self.collector
        if c.obs is None:
            c.reset(seed=self._env_seed(self.config.run.seed), step=self.global_step)
        for cb in callbacks:
            cb.on_training_start(self)
        p = self.config.ppo
        act_shape = () if self.spec.discrete else (self.spec.action_dim,)
        storage = RolloutStorage(p.n_steps, self.num_envs, self.spec.obs_dim, act_shape,
                                 np.int32 if self.spec.discrete else np.float32)
        kl_limit = ms.Tensor(np.float32(np.inf if p.target_kl is None else 1.5 * p.target_kl))
        clip_vf = ms.Tensor(np.float32(p.clip_range_vf if p.clip_range_vf is not None else np.inf))
        while self.global_step < stop_at:
            t_iter = time.perf_counter()
            progress_remaining = max(0.0, 1.0 - self.global_step / horizon)
            lr = schedule_value(p.learning_rate, p.lr_schedule, progress_remaining)
            clip = schedule_value(p.clip_range, p.clip_schedule, progress_remaining)

            t0 = time.perf_counter()
            if c.compiled:
                t_act, t_env, last_values = c.collect_compiled(storage, self.model, self.global_step)
            else:
                t_act, t_env = c.collect(storage, self._act_packed, self.global_step)
                t1 = time.perf_counter()
                last_values = self.value_step(ms.Tensor(c.obs)).asnumpy()
                t_act += time.perf_counter() - t1
            advantages, returns = compute_gae(storage.rewards, storage.values, last_values, storage.terminated,
                                              storage.truncated, storage.valid, p.gamma, p.gae_lambda)
            t_rollout = time.perf_counter() - t0

            t0 = time.perf_counter()
            stats = self.runner.run(storage.flat(advantages, returns), lr, clip, clip_vf, kl_limit, self.global_step)
            t_update = time.perf_counter() - t0
            t_comm = (min(t_update, self.runner.comm_time(self.dist, stats["minibatch_steps"]))
                      if self.dist.distributed else 0.0)

            steps = p.n_steps * self.config.env.num_envs  # all ranks' env steps
            self.global_step += steps
            self.iteration += 1
            dt = time.perf_counter() - t_iter
            self.wall_time_s += dt
            valid = storage.valid
            metrics = {
                "iteration": self.iteration,
                "global_step": self.global_step,
                "wall_time_s": self.wall_time_s,
                "steps_per_second": steps / dt,
                "episode_return_mean": float(np.mean(c.episode_returns)) if c.episode_returns else float("nan"),
                "episode_length_mean": float(np.mean(c.episode_lengths)) if c.episode_lengths else float("nan"),
                "episodes": c.episodes,
                "learning_rate": lr,
                "clip_range": clip,
                **stats,
                "explained_variance": _explained_variance(storage.values[valid], returns[valid]),
                "rollout_time_s": t_rollout,
                "update_time_s": t_update,
                # where the iteration's wall time went (shares sum to 1); single process: no communication
                "share_env": t_env / dt,
                "share_act": t_act / dt,
                "share_update": (t_update - t_comm) / dt,
                "share_comm": t_comm / dt,
                "comm_time_s": t_comm,
                "share_other": max(0.0, 1.0 - (t_env + t_act + t_update) / dt),
                "update_samples_per_s": stats["n_updates"] * self.batch_size / t_update if t_update > 0 else 0.0,
                "batch_size": self.batch_size,
                "world_size": self.dist.world_size,
            }
            if self.amp is not None:
                metrics["amp_skipped_steps"] = int(self.update_step.skipped_steps.asnumpy())
            if getattr(c.env, "events", None) is not None:
                metrics["env_restarts"] = len(c.env.events)
            self._last_metrics = metrics
            if hasattr(self.sandbox, "check_memory"):
                self.sandbox.check_memory()
            stop = False
            for cb in callbacks:
                if cb.on_iteration_end(self, metrics) is False:
                    stop = True
            if stop:
                break
        for cb in callbacks:
            cb.on_training_end(self)
        return self

    # ------------------------------------------------------------------ inference
    def predict(self, obs, deterministic: bool = True, rng: Optional[np.random.Generator] = None) -> np.ndarray:
        """Actions for one observation (obs_dim,) or a batch (B, obs_dim), normalised with the run's statistics.

        Stochastic actions draw their noise from ``rng``, or from the trainer's own predict stream (seeded from
        ``run.seed``, separate from the training stream)."""
        import mindspore as ms

        obs = np.asarray(obs, np.float32)
        single = obs.ndim == len(self.env.single_observation_space.shape)
        batch = self.normalize_obs(obs[None] if single else obs, update=False)
        if deterministic:
            actions = self.deterministic_step(ms.Tensor(batch)).asnumpy()
        else:
            noise = self.collector.noise(batch.shape[0], rng=self._predict_rng if rng is None else rng)
            actions = self.act_step(ms.Tensor(batch), ms.Tensor(noise))[0].asnumpy()
        actions = self.collector.env_actions(actions)
        return actions[0] if single else actions

    # ------------------------------------------------------------------ state
    def parameters_sha256(self) -> str:
        """SHA-256 of the policy/value parameters in the logical layout (see :func:`.state.parameters_sha256`)."""
        from .state import parameters_sha256

        return parameters_sha256(self.model)

    def _named_state(self):
        return self._values.named

    def save(self, prefix: str) -> str:
        """Write a checkpoint at ``prefix`` (see :mod:`.checkpoint`); returns the sidecar path."""
        from .state import save

        return save(self, prefix)

    def load(self, path: str) -> "PPOTrainer":
        """Restore parameters, optimizer, statistics, counters, RNG and env state from a checkpoint."""
        from .state import load

        return load(self, path)

    @classmethod
    def from_checkpoint(cls, path: str, sandbox: Optional[Sandbox] = None) -> "PPOTrainer":
        """Build a trainer with the checkpoint's own config and restore its state."""
        from ..errors import CheckpointError
        from .checkpoint import read_checkpoint

        sc = read_checkpoint(path)["sidecar"]
        try:
            cfg = Config.from_dict(sc["config"])
        except (ConfigError, KeyError) as exc:
            raise CheckpointError(f"checkpoint {path}: its config is invalid ({exc})") from None
        return cls(cfg, sandbox=sandbox).load(path)

    def close(self) -> None:
        self.collector.close()


def _sandbox_for(config: Config) -> Sandbox:
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


def _pipeline_refusal(device: str, stages: int) -> str:
    if device == "CPU":
        return (f"parallel.pipeline_stages: {stages} needs Ascend or GPU; MindSpore has no pipeline parallelism "
                "on CPU (use parallel.workers for data parallelism)")
    return (f"parallel.pipeline_stages: {stages} is not supported by scalebox_ms yet on {device}: PPO's policy "
            "and value MLPs have 2-3 layers, too few to split into pipeline stages (use parallel.workers)")


def _explained_variance(y_pred: np.ndarray, y_true: np.ndarray) -> float:
    var_y = np.var(y_true)
    return float("nan") if var_y == 0 or len(y_true) == 0 else float(1.0 - np.var(y_true - y_pred) / var_y)
