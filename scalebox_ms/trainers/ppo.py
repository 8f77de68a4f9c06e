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

import time
from typing import Optional, Sequence, Union

import numpy as np

from ..config import Config, micro_batches
from ..errors import ConfigError, images_in_one_process
from ..sandbox import Sandbox
from .core import Callback, Trainer, closes_envs_on_error

__all__ = ["Callback", "PPOTrainer", "schedule_value"]


def schedule_value(initial: float, kind: str, progress_remaining: float) -> float:
    """SB3-style schedules: 'constant' or 'linear' (initial * progress_remaining, 1 -> 0 over the run)."""
    if kind == "linear":
        return initial * progress_remaining
    return initial


class PPOTrainer(Trainer):
    """Proximal Policy Optimization on a gymnasium vector env, compiled with MindSpore.

    Args:
        config: a :class:`~scalebox_ms.config.Config` (copied: the caller's object is never changed), a dict in
            the YAML layout, or None for defaults.
        sandbox: an existing :class:`~scalebox_ms.Sandbox`; built from ``config.sandbox`` when omitted.

    Attributes users embed: ``model`` (the :class:`~scalebox_ms.models.ActorCritic` ``nn.Cell``),
    ``act_step``/``value_step``/``deterministic_step`` (compiled entry points), ``update_step`` (the
    compiled PPO minibatch update or the C++ kernel, which owns the Adam optimizer state).
    """

    algo = "ppo"

    @closes_envs_on_error
    def __init__(self, config: Union[Config, dict, None] = None, sandbox: Optional[Sandbox] = None, **ppo):
        # keyword overrides of the ppo section, e.g. PPOTrainer(cfg, batch_size="auto", max_batch=512)
        super().__init__(config, sandbox, ppo)
        config, sandbox = self.config, self.sandbox

        from ..amp import AutoMixedPrecision, check_backend
        from ..models import DeterministicStep, ValueStep, build_model
        from ..parallel import init_distributed
        from .kernels import (build_act_steps, direct_acting, select_conv_backend, select_conv_kernel,
                              select_update_kernel)
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
            self._config_built = config.to_dict()  # (the config this trainer is built with)
        e, p = config.env, config.ppo
        if W > 1 and e.num_envs % W:
            raise ConfigError(f"env.num_envs: ({e.num_envs}) must be divisible by the {W} msrun workers")
        n_local = e.num_envs // W  # this rank's shard of the envs
        reducer = None
        if W > 1:  # running statistics merged over all ranks' envs: every rank normalises identically
            from ..parallel.context import moments_reducer

            reducer = moments_reducer(self.dist)
        self._make_collector(n_local, rank=self.dist.rank, reducer=reducer)
        if self.spec.cnn and (self.amp is not None or W > 1):
            raise images_in_one_process("amp.level" if self.amp is not None else "parallel.workers")
        if self.spec.action_kind == "box" and any(lo > 0 or hi < 0 for lo, hi in zip(self.spec.low, self.spec.high)):
            self.log.warning(f"warning: {e.id}: Box action bounds {list(self.spec.low)}..{list(self.spec.high)} "
                             "exclude 0: PPO's Gaussian starts at mean 0, clipped to a bound, and may not learn "
                             "(rescale the actions to [-1, 1]: gymnasium.wrappers.RescaleAction)")
        width = self.spec.action_width
        check_fits("ppo.n_steps", f"a rollout of ppo.n_steps x env.num_envs = {p.n_steps} x {n_local} samples",
                   rollout_bytes(p.n_steps * n_local, self.spec.obs_dim, width, image=self.spec.image),
                   getattr(sandbox, "memory_limit_bytes", None))
        self.model = build_model(self.spec, config.policy)
        if self.amp is not None:
            self.amp.apply(self.model)
        self.conv_backend = select_conv_backend(config.policy, self.model, device)  # images: the convolutions
        self.conv_kernel = select_conv_kernel(config.policy, self.model, device)  # images: first-layer patches
        # acting: MindSpore ops, or the C++ fused-MLP kernel per policy.act_kernel (trainers.kernels)
        self.act_step, self._act_packed = build_act_steps(self.model, config.policy, n_local)
        self._act_direct = direct_acting(self.act_step, self.model)  # the C++ kernel without a graph call
        self.value_step = ValueStep(self.model)
        self.deterministic_step = DeterministicStep(self.model)
        self.update_step = PPOUpdateStep(self.model, p, micro_batches=micro_batches(config), amp=self.amp,
                                         world_size=W, rollout_rows=p.n_steps * n_local)
        kernel = select_update_kernel(config, self.model, self.update_step.optimizer, self.amp, W, device)
        if kernel is not None:  # same model Parameters and Adam state, the whole update in one C++ call
            self.update_step = kernel
            run_minibatches = KernelMinibatches(kernel)
        else:
            run_minibatches = GraphMinibatches(self.update_step, p.target_kl is not None)
        self._values = ParameterValues(named_state(self.model, self.update_step))
        self.runner = UpdateRunner(run_minibatches, p, self.collector, W, self.amp, self._values.snapshot,
                                   self._values.restore, obs_dim=self.spec.obs_dim,
                                   hidden=list(config.policy.pi_layers) + list(config.policy.vf_layers) + (
                                       [] if self.model.features is None else  # the CNNs' patches, activations
                                       self.model.features.activation_sizes() * (1 if self.model.shared else 2)),
                                   memory_budget=self._memory_budget)

    # ------------------------------------------------------------------ the parts, as attributes users know
    batch_size = property(lambda self: self.runner.batch_size)
    auto_batch = property(lambda self: self.runner.auto_batch)
    _compiled_rollout = property(lambda self: self.collector.compiled)

    def _memory_budget(self):
        limit = getattr(self.sandbox, "memory_limit_bytes", None)
        if limit and self.sandbox.device == "CPU":  # host memory left under the sandbox's limit
            from ..sandbox import current_rss_bytes

            return max(0, limit - current_rss_bytes())
        return None

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

        workers = self.config.parallel.workers
        if self.dist.world_size != workers and workers > 1:
            raise ConfigError(f"parallel.workers: {workers} workers are configured but this process is not one "
                              f"of {workers} msrun ranks; launch with `python -m scalebox_ms.train --workers "
                              f"{workers}` or your own msrun command line")
        stop_at, callbacks = self._start_learning(total_steps, until, callbacks)
        horizon, c = self.config.run.total_steps, self.collector
        p = self.config.ppo
        storage = RolloutStorage(p.n_steps, self.num_envs, self.spec.obs_shape, self.spec.action_shape,
                                 np.int32 if self.spec.integer_actions else np.float32,
                                 np.uint8 if self.spec.image else np.float32)
        kl_limit = ms.Tensor(np.float32(np.inf if p.target_kl is None else 1.5 * p.target_kl))
        clip_vf = ms.Tensor(np.float32(p.clip_range_vf if p.clip_range_vf is not None else np.inf))
        while self.global_step < stop_at:
            t_iter = time.perf_counter()
            # (read before the rollout; SB3 reads it after: docs/training.md, differences from SB3's PPO)
            progress_remaining = max(0.0, 1.0 - self.global_step / horizon)
            lr = schedule_value(p.learning_rate, p.lr_schedule, progress_remaining)
            clip = schedule_value(p.clip_range, p.clip_schedule, progress_remaining)

            t0 = time.perf_counter()
            if c.compiled:
                t_act, t_env, last_values = c.collect_compiled(storage, self.model, self.global_step,
                                                               getattr(self.act_step, "kernel", "builtin"))
            else:
                if self._act_direct is not None:
                    self._act_direct.sync()  # (the weights change between rollouts only)
                t_act, t_env = c.collect(storage, self._act_direct or self._act_packed, self.global_step)
                t1 = time.perf_counter()
                last_values = self.value_step(ms.Tensor(c.obs)).asnumpy()
                t_act += time.perf_counter() - t1
            advantages, returns = compute_gae(storage.rewards, storage.values, last_values, storage.terminated,
                                              storage.truncated, storage.valid, p.gamma, p.gae_lambda)
            t_rollout = time.perf_counter() - t0

            t0 = time.perf_counter()
            self._torn_at = self.global_step  # (an exception in the update: parameters without their counters)
            stats = self.runner.run(storage.flat(advantages, returns), lr, clip, clip_vf, kl_limit, self.global_step)
            t_update = time.perf_counter() - t0
            t_comm = (min(t_update, self.runner.comm_time(self.dist, stats["minibatch_steps"]))
                      if self.dist.distributed else 0.0)

            steps = p.n_steps * self.config.env.num_envs  # all ranks' env steps
            self.global_step += steps
            self.iteration += 1
            self._torn_at = None
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
            if self._end_iteration(callbacks, metrics):
                break
        for cb in callbacks:
            cb.on_training_end(self)
        return self

    # ------------------------------------------------------------------ inference
    def _act_deterministic(self, batch: np.ndarray) -> np.ndarray:
        import mindspore as ms

        return self.collector.env_actions(self.deterministic_step(ms.Tensor(batch)).asnumpy())

    def _act_stochastic(self, batch: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        import mindspore as ms

        noise = self.collector.noise(batch.shape[0], rng=rng)
        return self.collector.env_actions(self.act_step(ms.Tensor(batch), ms.Tensor(noise))[0].asnumpy())

    def _summary_extra(self) -> dict:
        """PPO's entries of summary.json."""
        out = {"batch_size": self.batch_size,
               "graph_calls_per_iteration": None if self.batch_size is None else
               (1 if self._compiled_rollout else self.config.ppo.n_steps + 1) + self.update_calls_per_iteration(),
               "update_kernel": type(self.update_step).__name__,
               "act_kernel": getattr(self.act_step, "kernel", "builtin")}
        if self.auto_batch is not None:
            out["auto_batch"] = self.auto_batch
        return out

    # ------------------------------------------------------------------ state
    def _sidecar_extra(self) -> dict:
        return {"batch_size": self.batch_size, "auto_batch": self.auto_batch}

    def _restore_extra(self, sc: dict) -> None:
        runner = self.runner
        if self.config.ppo.batch_size == "auto" and sc.get("batch_size"):
            runner.batch_size = int(sc["batch_size"])  # resume with the size chosen before, no new probe
            runner.auto_batch = sc.get("auto_batch") or {"chosen": runner.batch_size, "table": [], "events": []}


def _pipeline_refusal(device: str, stages: int) -> str:
    where = "MindSpore has none on CPU, and on Ascend/GPU " if device == "CPU" else ""
    return (f"parallel.pipeline_stages: {stages}: scalebox_ms has no pipeline parallelism on any device ({where}PPO's "
            "2-3-layer MLPs are too small to split into stages); use parallel.workers for data parallelism")


def _explained_variance(y_pred: np.ndarray, y_true: np.ndarray) -> float:
    if len(y_true) == 0:  # (a rollout without a valid sample: np.var warned "Degrees of freedom <= 0" on stderr)
        return float("nan")
    var_y = np.var(y_true)
    return float("nan") if var_y == 0 else float(1.0 - np.var(y_true - y_pred) / var_y)
