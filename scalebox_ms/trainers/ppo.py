"""PPOTrainer: the collect -> advantages -> update loop.

Python->graph calls per iteration (gymnasium path, ``n_steps`` = T, ``n_epochs`` = E, rollout B = T*N,
``batch_size`` = b):

* T acting calls (:class:`~scalebox_ms.models.ActStep`: action, log-prob and value for all N envs at once),
* 1 bootstrap value call (:class:`~scalebox_ms.models.ValueStep`),
* E * B/b update calls (:class:`~scalebox_ms.trainers.ppo_update.PPOUpdateStep`: loss + grads + Adam),
  fewer when ``target_kl`` stops the update early -- or ONE call with ``ppo.update_kernel`` custom/auto where the
  C++ :class:`~scalebox_ms.ops.custom.PPOUpdateKernel` runs (``run_epochs``: all epochs and minibatches).

CartPole with rl-zoo3's settings (T=32, E=20, B=b=256): 32 + 1 + 20 = 53 calls per 256 env steps with the
compiled update graph, 32 + 1 + 1 = 34 with the update kernel (the preset's ``auto`` on CPU). With
``env.backend: native`` and ``env.compiled_rollout`` the T acting calls, the env steps and the bootstrap value
become one call (:mod:`.native_rollout`): 1 + 20 = 21 calls. Everything
random (sampling noise, minibatch permutations) is drawn from one numpy ``PCG64`` Generator seeded from
``run.seed`` and saved in checkpoints, so runs are reproducible and resumable bit for bit.
"""
from __future__ import annotations

import collections
import hashlib
import logging
import time
from typing import List, Optional, Sequence, Union

import numpy as np

from ..config import Config, micro_batches
from ..errors import CheckpointError, ConfigError
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
        config: a :class:`~scalebox_ms.config.Config`, a dict in the YAML layout, or None for defaults.
        sandbox: an existing :class:`~scalebox_ms.Sandbox`; built from ``config.sandbox`` when omitted.

    Attributes users embed: ``model`` (the :class:`~scalebox_ms.models.ActorCritic` ``nn.Cell``),
    ``act_step``/``value_step``/``deterministic_step`` (compiled entry points), ``update_step`` (the
    compiled PPO minibatch update, which owns the Adam optimizer).
    """

    def __init__(self, config: Union[Config, dict, None] = None, sandbox: Optional[Sandbox] = None, **ppo):
        if config is None:
            config = Config()
        elif isinstance(config, dict):
            config = Config.from_dict(config)
        elif not isinstance(config, Config):
            raise ConfigError(f"config: expected Config, dict or None, got {type(config).__name__}")
        if ppo:  # keyword overrides of the ppo section, e.g. PPOTrainer(cfg, batch_size="auto", max_batch=512)
            data = config.to_dict()
            data["ppo"].update(ppo)
            config = Config.from_dict(data)
        self.config = config
        self.log = logging.getLogger("scalebox_ms")
        seed = config.run.seed
        if sandbox is None:
            sb_cfg = config.sandbox
            from ..parallel.context import in_msrun, msrun_world_size

            if in_msrun():
                import copy
                import os

                from ..parallel.context import local_rank

                sb_cfg = copy.copy(sb_cfg)
                if sb_cfg.threads == 0:  # ranks share this machine's cores instead of each taking all
                    sb_cfg.threads = max(1, (os.cpu_count() or 1) // msrun_world_size())
                # one accelerator per rank: sandbox.device_id is rank 0's device, rank r takes the r-th after it
                # (ignored on CPU)
                sb_cfg.device_id = sb_cfg.device_id + local_rank()
            sandbox = Sandbox.from_config(sb_cfg, seed)
        self.sandbox = sandbox

        from ..amp import AutoMixedPrecision, check_backend
        from ..envs import ObsNormalizer, RewardScaler, make_vec_env, space_spec
        from ..models import DeterministicStep, ValueStep, build_act_step, build_model
        from ..parallel import init_distributed
        from .ppo_update import PPOUpdateStep

        e, p = config.env, config.ppo
        sb = self.sandbox
        device = getattr(sb, "device", "CPU")
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
        self._num_envs = e.num_envs // W  # this rank's shard of the envs
        self.env = make_vec_env(e.id, self._num_envs, e.kwargs, isolation=getattr(sb, "isolation_level", "none"),
                                step_timeout=getattr(sb, "step_timeout", 10.0),
                                worker_memory_limit=getattr(sb, "worker_memory_limit_bytes", None), backend=e.backend)
        self.spec = space_spec(self.env.single_observation_space, self.env.single_action_space, e.id)
        self.model = build_model(self.spec, config.policy)
        if self.amp is not None:
            self.amp.apply(self.model)
        if not self.spec.discrete:  # Box bounds for clipping the sampled actions, once
            self._action_low = np.asarray(self.spec.low, np.float32)
            self._action_high = np.asarray(self.spec.high, np.float32)
        # acting: MindSpore ops, or the C++ fused-MLP kernel per policy.act_kernel (models.build_act_step)
        self.act_step = build_act_step(self.model, config.policy, self._num_envs)
        self._act_packed = build_act_step(self.model, config.policy, self._num_envs, packed=True)
        self.value_step = ValueStep(self.model)
        self.deterministic_step = DeterministicStep(self.model)
        self.update_step = PPOUpdateStep(self.model, p, micro_batches=micro_batches(config), amp=self.amp,
                                         world_size=W)
        kernel = _update_kernel(config, self.model, self.update_step, self.amp, W, device)
        if kernel is not None:  # same model Parameters and Adam state, the whole update in one C++ call
            self.update_step = kernel
        self.obs_normalizer = ObsNormalizer(self.spec.obs_dim, e.clip_obs) if e.normalize_obs else None
        self.reward_scaler = RewardScaler(self._num_envs, p.gamma, e.clip_reward) if e.normalize_reward else None
        if W > 1:  # running statistics merged over all ranks' envs: every rank normalises identically
            from ..parallel.context import moments_reducer

            for norm in (self.obs_normalizer, self.reward_scaler):
                if norm is not None:
                    norm.rms.reduce = moments_reducer(self.dist)
        # rank r draws from stream r of the seed (rank 0 = the single-process stream)
        self.rng = np.random.Generator(np.random.PCG64(seed).jumped(self.dist.rank))

        self.global_step = 0
        self.iteration = 0
        self.wall_time_s = 0.0  # accumulated over sessions (resume)
        self.episode_returns: collections.deque = collections.deque(maxlen=100)
        self.episode_lengths: collections.deque = collections.deque(maxlen=100)
        self.episodes = 0
        # in-flight env state between rollouts
        self._obs: Optional[np.ndarray] = None       # normalised obs the policy sees next
        self._valid = np.ones(self._num_envs, bool)       # False: the next step is an autoreset step
        self._ep_return = np.zeros(self._num_envs, np.float64)
        self._ep_length = np.zeros(self._num_envs, np.int64)
        self._last_metrics: dict = {}
        # minibatch size: fixed, or chosen by probing in the first update (ppo.batch_size: auto)
        self.batch_size: Optional[int] = None if config.ppo.batch_size == "auto" else int(config.ppo.batch_size)
        # native envs: the whole rollout as one graph call (trainers/native_rollout.py)
        self._compiled_rollout = e.backend == "native" and e.compiled_rollout
        self._rollout_cell = None
        self.auto_batch: Optional[dict] = None
        self._predict_rng = np.random.default_rng()

    # ------------------------------------------------------------------ helpers
    @property
    def num_envs(self) -> int:
        """Envs this process steps (``env.num_envs`` / world size under data parallelism)."""
        return self._num_envs

    @property
    def world_size(self) -> int:
        return self.dist.world_size

    def _env_seed(self, seed: int) -> int:
        """Rank r's vector env gets seeds seed + r * n_local + i: the union over ranks is the single-process set."""
        return seed + self.dist.rank * self._num_envs

    def normalize_obs(self, obs: np.ndarray, update: bool = False) -> np.ndarray:
        obs = np.asarray(obs, np.float32).reshape(obs.shape[0], -1)
        if self.obs_normalizer is None:
            return obs
        return self.obs_normalizer(obs, update=update)

    def _noise(self, n: int) -> np.ndarray:
        if self.spec.discrete:
            return self.rng.gumbel(size=(n, self.spec.action_dim)).astype(np.float32)
        return self.rng.standard_normal(size=(n, self.spec.action_dim)).astype(np.float32)

    def _env_actions(self, actions: np.ndarray) -> np.ndarray:
        if self.spec.discrete:
            return actions.astype(np.int64)
        return np.clip(actions, self._action_low, self._action_high)

    def _reset_envs(self, seed: Optional[int]) -> None:
        obs, _ = self.env.reset(seed=seed)
        self._obs = self.normalize_obs(obs, update=True)
        self._valid[:] = True
        self._ep_return[:] = 0.0
        self._ep_length[:] = 0

    # ------------------------------------------------------------------ the loop
    def learn(self, total_steps: Optional[int] = None, callbacks: Sequence[Callback] = (),
              until: Optional[int] = None) -> "PPOTrainer":
        """Train until ``global_step`` reaches ``total_steps`` (default ``run.total_steps``).

        ``total_steps`` is also the horizon of the linear schedules. ``until`` pauses earlier (at the first
        iteration boundary at or past it) without changing the schedules, e.g. to train a run in chunks.
        """
        import mindspore as ms

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
        if self._obs is None:
            self._reset_envs(seed=self._env_seed(self.config.run.seed))
        for cb in callbacks:
            cb.on_training_start(self)
        p = self.config.ppo
        from ..buffers import RolloutStorage, compute_gae

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
            if self._compiled_rollout:
                t_act, t_env, last_values = self._collect_compiled(storage)
            else:
                t_act, t_env = self._collect(storage)
                t1 = time.perf_counter()
                last_values = self.value_step(ms.Tensor(self._obs)).asnumpy()
                t_act += time.perf_counter() - t1
            advantages, returns = compute_gae(storage.rewards, storage.values, last_values, storage.terminated,
                                              storage.truncated, storage.valid, p.gamma, p.gae_lambda)
            t_rollout = time.perf_counter() - t0

            t0 = time.perf_counter()
            stats = self._update(storage.flat(advantages, returns), lr, clip, clip_vf, kl_limit)
            t_update = time.perf_counter() - t0
            t_comm = min(t_update, self._comm_time(stats)) if self.dist.distributed else 0.0

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
                "episode_return_mean": float(np.mean(self.episode_returns)) if self.episode_returns else float("nan"),
                "episode_length_mean": float(np.mean(self.episode_lengths)) if self.episode_lengths else float("nan"),
                "episodes": self.episodes,
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
            if getattr(self.env, "events", None) is not None:
                metrics["env_restarts"] = len(self.env.events)
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

    def _collect(self, storage):
        """Fill ``storage`` with one rollout; returns (seconds in acting calls, seconds in env.step)."""
        import mindspore as ms

        N = self.num_envs
        t_act = t_env = 0.0
        clock = time.perf_counter
        for t in range(storage.n_steps):
            obs = self._obs
            t0 = clock()
            out = self._act_packed(ms.Tensor(obs), ms.Tensor(self._noise(N))).asnumpy()
            t1 = clock()
            action = out[:, 0].astype(np.int32) if self.spec.discrete else out[:, :-2]
            log_prob, value = out[:, -2], out[:, -1]
            raw_obs, reward, terminated, truncated, _ = self.env.step(self._env_actions(action))
            t_env += clock() - t1
            t_act += t1 - t0
            valid = self._valid
            reward = np.asarray(reward, np.float64)
            terminated = np.asarray(terminated, bool) & valid
            truncated = np.asarray(truncated, bool) & valid
            done = terminated | truncated
            storage.rewards[t] = self._account_step(reward, done, valid)
            storage.obs[t] = obs
            storage.actions[t] = action
            storage.log_probs[t] = log_prob
            storage.values[t] = value
            storage.terminated[t] = terminated
            storage.truncated[t] = truncated
            storage.valid[t] = valid

            self._obs = self.normalize_obs(raw_obs, update=True)
            self._valid = ~done
        return t_act, t_env

    def _account_step(self, reward: np.ndarray, done: np.ndarray, valid: np.ndarray) -> np.ndarray:
        """Episode statistics (raw rewards) and the training reward (scaled if configured, 0 on autoreset steps)."""
        self._ep_return += np.where(valid, reward, 0.0)
        self._ep_length += valid
        for i in np.flatnonzero(done):
            self.episode_returns.append(float(self._ep_return[i]))
            self.episode_lengths.append(int(self._ep_length[i]))
            self.episodes += 1
        self._ep_return[done] = 0.0
        self._ep_length[done] = 0
        train_reward = (self.reward_scaler(reward, done, valid) if self.reward_scaler is not None
                        else reward.astype(np.float32))
        return np.where(valid, train_reward, 0.0)

    def _collect_compiled(self, storage):
        """Native envs: one graph call runs all T steps; then the same host bookkeeping as :meth:`_collect`."""
        import mindspore as ms

        from .native_rollout import CompiledRollout

        T, N = storage.n_steps, self.num_envs
        if self._rollout_cell is None:
            self._rollout_cell = CompiledRollout(self.model, self.env, T, normalize=self.obs_normalizer is not None)
        cell = self._rollout_cell
        t0 = time.perf_counter()
        # drawn in the order the step-by-step loop draws them: same streams, same rollout
        act_noise = np.stack([self._noise(N) for _ in range(T)])
        reset_noise = np.stack([self.env.rng.random((N, self.env._dyn_cls.noise_dim)).astype(np.float32)
                                for _ in range(T)])
        if self.obs_normalizer is not None:
            rms = self.obs_normalizer.rms
            mean = rms.mean.astype(np.float32)
            inv_std = (1.0 / np.sqrt(rms.var + self.obs_normalizer.epsilon)).astype(np.float32)
            clip = np.float32(self.obs_normalizer.clip)
        else:
            mean = np.zeros(self.spec.obs_dim, np.float32)
            inv_std = np.ones(self.spec.obs_dim, np.float32)
            clip = np.float32(np.inf)
        last_raw, last_value = cell(ms.Tensor(act_noise), ms.Tensor(reset_noise), ms.Tensor(mean),
                                    ms.Tensor(inv_std), ms.Tensor(clip))
        last_value = last_value.asnumpy()
        buf = cell.buffer
        storage.obs[:] = buf.obs.asnumpy()
        storage.actions[:] = buf.actions.asnumpy()
        storage.log_probs[:] = buf.log_probs.asnumpy()
        storage.values[:] = buf.values.asnumpy()
        rewards = buf.rewards.asnumpy().astype(np.float64)
        terminated = buf.terminated.asnumpy().astype(bool)
        truncated = buf.truncated.asnumpy().astype(bool)
        valid_all = buf.valid.asnumpy().astype(bool)
        obs_raw = cell.obs_raw.asnumpy()
        t_graph = time.perf_counter() - t0
        for t in range(T):
            storage.rewards[t] = self._account_step(rewards[t], terminated[t] | truncated[t], valid_all[t])
        storage.terminated[:] = terminated
        storage.truncated[:] = truncated
        storage.valid[:] = valid_all
        if self.obs_normalizer is not None:
            self.obs_normalizer.rms.update(obs_raw.reshape(-1, self.spec.obs_dim))
        self._obs = self.normalize_obs(last_raw.asnumpy(), update=False)
        self._valid = ~(terminated[-1] | truncated[-1])
        return t_graph, 0.0, last_value

    def _update(self, batch: dict, lr: float, clip: float, clip_vf, kl_limit) -> dict:
        import mindspore as ms

        from .autobatch import halve, is_oom_error
        from .ppo_update import pack_features

        p = self.config.ppo
        B = batch["obs"].shape[0]
        tensors = [ms.Tensor(pack_features(batch["obs"], batch["log_probs"], batch["values"], batch["advantages"],
                                           batch["returns"], batch["mask"])), ms.Tensor(batch["actions"])]
        scalars = [ms.Tensor(np.float32(lr)), ms.Tensor(np.float32(clip)), clip_vf, kl_limit]
        auto = p.batch_size == "auto"
        if self.batch_size is None:
            self.batch_size = self._probe_batch_size(tensors, scalars, B)
        if not auto:
            return self._run_epochs(tensors, scalars, B)
        state, rng_state = self._snapshot(), self.rng.bit_generator.state
        while True:
            try:
                return self._run_epochs(tensors, scalars, B)
            except Exception as exc:  # device out of memory: halve the minibatch and redo this update
                smaller = halve(self.batch_size, B, p.min_batch) if is_oom_error(exc) else None
                if smaller is None:
                    raise
                self.log.warning("dynamic batching: out of memory at batch %d, retrying with %d", self.batch_size, smaller)
                self.auto_batch["events"].append({"global_step": self.global_step, "oom_at": self.batch_size,
                                                  "retry_with": smaller})
                self.batch_size = smaller
                self._restore(state)
                self.rng.bit_generator.state = rng_state

    def _run_epochs(self, tensors, scalars, B: int) -> dict:
        import mindspore as ms

        p = self.config.ppo
        b = self.batch_size // self.dist.world_size  # this rank's share of each minibatch
        if hasattr(self.update_step, "run_epochs") and B % b == 0:
            return self._run_epochs_in_one_call(tensors, scalars, B, b)
        outputs: List = []
        early_stop = p.target_kl is not None
        stopped = False
        for _epoch in range(p.n_epochs):
            perm = self.rng.permutation(B).astype(np.int32)
            for start in range(0, B, b):
                out = self.update_step(*tensors, ms.Tensor(perm[start:start + b]), *scalars)
                outputs.append(out)
                if early_stop:
                    out = outputs[-1] = out.asnumpy()
                    if out[6] < 0.5 and out[7] > 0.5:  # approx_kl > 1.5 * target_kl (not an AMP overflow skip)
                        stopped = True
                        break
            if stopped:
                break
        return self._epoch_stats(outputs, stopped)

    def _run_epochs_in_one_call(self, tensors, scalars, B: int, b: int) -> dict:
        """The C++ update kernel: all epochs x minibatches in one call (same permutations, same maths, same RNG
        consumption as the per-minibatch loop, also when target_kl stops the update early)."""
        import mindspore as ms

        p = self.config.ppo
        nb = B // b
        state = self.rng.bit_generator.state
        perms = np.stack([self.rng.permutation(B).astype(np.int32) for _ in range(p.n_epochs)])
        out = self.update_step.run_epochs(*tensors, ms.Tensor(perms.reshape(-1, b)), *scalars).asnumpy()
        ran = out[:, 9] > 0.5
        rows = int(ran.sum())
        stopped = p.target_kl is not None and rows > 0 and out[rows - 1, 6] < 0.5
        if rows < len(out):  # stopped early: draw only the permutations the loop would have drawn
            self.rng.bit_generator.state = state
            for _ in range((rows - 1) // nb + 1):
                self.rng.permutation(B)
        return self._epoch_stats(list(out[:rows, :9]), stopped)

    def _epoch_stats(self, outputs, stopped: bool) -> dict:
        from .ppo_update import STAT_NAMES

        stats = np.stack([o if isinstance(o, np.ndarray) else o.asnumpy() for o in outputs]) if outputs else np.zeros((0, 9))
        finite = stats[:, 7] > 0.5
        ok = stats[finite]  # AMP overflow steps carry inf/nan losses: averaged over the finite steps
        result = {n: (float(ok[:, i].mean()) if len(ok) else float("nan")) for i, n in enumerate(STAT_NAMES)}
        result["n_updates"] = int(((stats[:, 6] > 0.5) & finite).sum())  # optimizer steps applied
        result["early_stopped"] = int(stopped)
        result["minibatch_steps"] = len(stats)
        if self.amp is not None:
            result["amp_overflows"] = int((~finite).sum())
            result["loss_scale"] = float(stats[-1, 8]) if len(stats) else float("nan")
        return result

    def _comm_time(self, stats: dict) -> float:
        """Seconds this update spent in collectives: the update's all-reduces (same sizes) timed on their own,
        times the minibatch steps run. Collectives run inside the compiled update graph, so they cannot be
        clocked there; this probe includes waiting for the slowest rank, as the real ones do."""
        n_params = sum(int(np.prod(prm.shape)) for prm in self.update_step.optimizer.parameters)
        sizes = [2, 1, n_params + 6] if self.config.ppo.normalize_advantage else [2, n_params + 6]
        return stats.get("minibatch_steps", 0) * self.dist.time_collectives(sizes)

    def _probe_batch_size(self, tensors, scalars, B: int, timed_steps: int = 6) -> int:
        """Time ``timed_steps`` optimizer steps at each candidate size on this rollout; state is restored after
        each probe. Returns the chosen size and records the table in ``self.auto_batch``."""
        import mindspore as ms

        from .autobatch import candidate_sizes, choose, estimate_bytes, is_oom_error

        p = self.config.ppo
        state = self._snapshot()
        probe_rng = np.random.default_rng(0)
        hidden = list(self.config.policy.pi_layers) + list(self.config.policy.vf_layers)
        table = []
        for b in candidate_sizes(B, p.min_batch, p.max_batch):
            row = {"batch_size": b, "est_bytes": estimate_bytes(b, self.spec.obs_dim, hidden)}
            try:
                idx = [ms.Tensor(probe_rng.permutation(B)[:b].astype(np.int32)) for _ in range(timed_steps + 1)]
                self.update_step(*tensors, idx[0], *scalars).asnumpy()  # compiles this shape
                t0 = time.perf_counter()
                for i in range(1, timed_steps + 1):
                    out = self.update_step(*tensors, idx[i], *scalars)
                out.asnumpy()
                dt = time.perf_counter() - t0
                row.update(status="ok", step_ms=1000 * dt / timed_steps, samples_per_s=timed_steps * b / dt)
            except Exception as exc:
                if not is_oom_error(exc):
                    raise
                row.update(status="oom", step_ms=None, samples_per_s=0.0)
            finally:
                self._restore(state)
            table.append(row)
        budget = None
        limit = getattr(self.sandbox, "memory_limit_bytes", None)
        if limit and self.sandbox.device == "CPU":  # host memory left under the sandbox's limit
            from ..sandbox import current_rss_bytes

            budget = max(0, limit - current_rss_bytes())
        try:
            chosen = choose(table, budget)
        except RuntimeError:  # nothing fits the budget by the rough estimate: take the smallest size that ran
            ran = [r["batch_size"] for r in table if r["status"] == "ok"]
            if not ran:
                raise
            chosen = min(ran)
            self.log.warning("dynamic batching: no size fits the %s-byte budget by estimate; using %d", budget, chosen)
        self.auto_batch = {"chosen": chosen, "table": table, "events": [], "memory_budget_bytes": budget}
        self.log.info("dynamic batching: chose minibatch %d of %d candidates (%s)", chosen, len(table),
                      ", ".join(f"{r['batch_size']}: {r['samples_per_s']:.0f}/s" for r in table))
        return chosen

    def _snapshot(self):
        return [param.asnumpy().copy() for _, param in self._named_state()]

    def _restore(self, values) -> None:
        """Write parameter/optimizer values (in ``_named_state`` order) so compiled graphs see them."""
        import mindspore as ms

        from ..ops import AssignParameters

        named = self._named_state()
        if getattr(self, "_writer", None) is None:
            self._writer = AssignParameters([param for _, param in named])
        self._writer.write(ms.Tensor(np.asarray(v, dtype=param.asnumpy().dtype)) for (_, param), v in zip(named, values))

    # ------------------------------------------------------------------ inference
    def predict(self, obs, deterministic: bool = True) -> np.ndarray:
        """Actions for one observation (obs_dim,) or a batch (B, obs_dim), normalised with the run's statistics."""
        import mindspore as ms

        obs = np.asarray(obs, np.float32)
        single = obs.ndim == len(self.env.single_observation_space.shape)
        batch = self.normalize_obs(obs[None] if single else obs, update=False)
        if deterministic:
            actions = self.deterministic_step(ms.Tensor(batch)).asnumpy()
        else:
            if self.spec.discrete:
                noise = self._predict_rng.gumbel(size=(batch.shape[0], self.spec.action_dim))
            else:
                noise = self._predict_rng.standard_normal(size=(batch.shape[0], self.spec.action_dim))
            actions = self.act_step(ms.Tensor(batch), ms.Tensor(noise.astype(np.float32)))[0].asnumpy()
        actions = self._env_actions(actions)
        return actions[0] if single else actions

    # ------------------------------------------------------------------ state
    def parameters_sha256(self) -> str:
        """SHA-256 over all policy/value parameters (name, dtype, shape, bytes), sorted by name, in the logical
        (nn.Dense) layout: a FusedDense model hashes like the dense model with the same weights."""
        h = hashlib.sha256()
        for name, value in sorted(self.model.logical_parameters(), key=lambda kv: kv[0]):
            arr = np.ascontiguousarray(value)
            h.update(name.encode())
            h.update(str(arr.dtype).encode())
            h.update(str(arr.shape).encode())
            h.update(arr.tobytes())
        return h.hexdigest()

    def _named_state(self):
        out = [("model." + n, p) for n, p in self.model.parameters_and_names()]
        model_ids = {id(p) for _, p in out}
        for name, param in self.update_step.optimizer.parameters_and_names():
            if id(param) not in model_ids:
                out.append(("optimizer." + name, param))
        out += [(param.name, param) for param in self.update_step.state_parameters()]  # amp.loss_scale, ...
        return out

    def save(self, prefix: str) -> str:
        """Write a checkpoint at ``prefix`` (see :mod:`.checkpoint`); returns the sidecar path."""
        import mindspore as ms

        from .checkpoint import write_checkpoint

        # stored in the logical (nn.Dense) layout whatever policy.layer/align: FusedDense padding is not saved
        tensors = [{"name": name, "data": ms.Tensor(self.model.to_logical(name, param.asnumpy()))}
                   for name, param in self._named_state()]
        sidecar = {
            "config": self.config.to_dict(),
            "global_step": self.global_step,
            "iteration": self.iteration,
            "wall_time_s": self.wall_time_s,
            "episodes": self.episodes,
            "episode_returns": list(self.episode_returns),
            "episode_lengths": list(self.episode_lengths),
            "rng": self.rng.bit_generator.state,
            "obs_normalizer": self.obs_normalizer.state_dict() if self.obs_normalizer else None,
            "reward_scaler": self.reward_scaler.state_dict() if self.reward_scaler else None,
            "inflight": None if self._obs is None else {
                "obs": self._obs.tolist(), "valid": self._valid.tolist(),
                "ep_return": self._ep_return.tolist(), "ep_length": self._ep_length.tolist()},
            "space_spec": self.spec.__dict__,
            "param_sha256": self.parameters_sha256(),
            "batch_size": self.batch_size,
            "auto_batch": self.auto_batch,
            "world_size": self.dist.world_size,
        }
        from ..envs import state as env_state

        snapshot = env_state.capture(self.env) if self._obs is not None else None
        if snapshot is None and self._obs is not None:
            sidecar["env_state_note"] = (f"{type(self.env).__name__} cannot be captured faithfully: "
                                         "a resumed run starts fresh episodes")
        return write_checkpoint(prefix, tensors, sidecar, env_obj=snapshot)

    def load(self, path: str) -> "PPOTrainer":
        """Restore parameters, optimizer, statistics, counters, RNG and env state from a checkpoint."""
        from .checkpoint import read_checkpoint

        ck = read_checkpoint(path)
        sc, tensors = ck["sidecar"], ck["tensors"]
        if sc.get("space_spec") != self.spec.__dict__ and _jsonable(sc.get("space_spec")) != _jsonable(self.spec.__dict__):
            raise CheckpointError(f"checkpoint {ck['prefix']} was made for spaces {sc.get('space_spec')}, "
                                  f"this trainer has {self.spec.__dict__}")
        ck_env = (sc.get("config") or {}).get("env", {})
        for key in ("id", "num_envs"):
            if ck_env.get(key) != getattr(self.config.env, key):
                raise CheckpointError(f"checkpoint {ck['prefix']} was made with env.{key}={ck_env.get(key)!r}, "
                                      f"this trainer has env.{key}={getattr(self.config.env, key)!r}")
        named = self._named_state()
        missing = [n for n, _ in named if n not in tensors]
        if missing:
            raise CheckpointError(f"checkpoint {ck['prefix']} does not match this model: missing {missing[0]}"
                                  + (f" and {len(missing) - 1} more" if len(missing) > 1 else ""))
        for name, param in named:
            arr = tensors[name] = self.model.to_storage(name, tensors[name])
            if tuple(arr.shape) != tuple(param.shape):
                raise CheckpointError(f"checkpoint {ck['prefix']}: {name} has shape {tuple(arr.shape)}, "
                                      f"the model expects {tuple(param.shape)}")
        self._restore([tensors[name] for name, _ in named])
        self.global_step = int(sc["global_step"])
        self.iteration = int(sc["iteration"])
        self.wall_time_s = float(sc["wall_time_s"])
        self.episodes = int(sc["episodes"])
        self.episode_returns = collections.deque(sc["episode_returns"], maxlen=100)
        self.episode_lengths = collections.deque(sc["episode_lengths"], maxlen=100)
        self.rng.bit_generator.state = sc["rng"]
        if self.config.ppo.batch_size == "auto" and sc.get("batch_size"):
            self.batch_size = int(sc["batch_size"])  # resume with the size chosen before, no new probe
            self.auto_batch = sc.get("auto_batch") or {"chosen": self.batch_size, "table": [], "events": []}
        if self.obs_normalizer is not None and sc.get("obs_normalizer"):
            self.obs_normalizer.load_state_dict(sc["obs_normalizer"])
        if self.reward_scaler is not None and sc.get("reward_scaler"):
            self.reward_scaler.load_state_dict(sc["reward_scaler"])
        inflight = sc.get("inflight")
        if self.dist.distributed and inflight is not None:
            # data parallel: rank 0's checkpoint holds rank 0's env state only; every rank restarts its episodes
            # from seeds derived from (seed, step, rank), and ranks > 0 their sampling stream likewise
            self._reset_envs(seed=self._env_seed(self.config.run.seed + self.global_step))
            if self.reward_scaler is not None:  # rank 0's per-env returns belong to episodes that no longer run
                self.reward_scaler.returns[:] = 0.0
            if self.dist.rank > 0:
                self.rng = np.random.Generator(np.random.PCG64([self.config.run.seed, self.global_step])
                                               .jumped(self.dist.rank))
        elif inflight is not None and ck["env"] is not None:
            from ..envs import state as env_state

            self.env = env_state.restore(self.env, ck["env"])
            self._rollout_cell = None  # a compiled rollout is bound to the previous env's Parameters
            self._obs = np.asarray(inflight["obs"], np.float32)
            self._valid = np.asarray(inflight["valid"], bool)
            self._ep_return = np.asarray(inflight["ep_return"], np.float64)
            self._ep_length = np.asarray(inflight["ep_length"], np.int64)
        elif inflight is not None:
            # env could not be pickled: start fresh episodes, seeded from (seed, step) so resume stays deterministic
            self._reset_envs(seed=self._env_seed(self.config.run.seed + self.global_step))
        if self.parameters_sha256() != sc.get("param_sha256"):
            raise CheckpointError(f"checkpoint {ck['prefix']}: restored parameters do not hash to the recorded param_sha256")
        return self

    @classmethod
    def from_checkpoint(cls, path: str, sandbox: Optional[Sandbox] = None) -> "PPOTrainer":
        """Build a trainer with the checkpoint's own config and restore its state."""
        from .checkpoint import read_checkpoint

        sc = read_checkpoint(path)["sidecar"]
        try:
            cfg = Config.from_dict(sc["config"])
        except (ConfigError, KeyError) as exc:
            raise CheckpointError(f"checkpoint {path}: its config is invalid ({exc})") from None
        return cls(cfg, sandbox=sandbox).load(path)

    def close(self) -> None:
        self.env.close()


# benchmarks/update_kernel.py (2-core CPU, CartPole and a 3-64-64-1 Gaussian model): the C++ update kernel took
# 0.2-0.42x the builtin step's time at minibatch 64-16384 (rows >= 2048 split over threads in 512-row blocks);
# larger minibatches were not measured, so 'auto' keeps the builtin step above 16384.
AUTO_UPDATE_KERNEL_MAX_BATCH = 16384


def _update_kernel(config, model, step, amp, world_size: int, device: str):
    """The PPOUpdateKernel replacing ``step`` per ``ppo.update_kernel``, or None for the builtin graph."""
    choice = config.ppo.update_kernel
    if choice == "builtin":
        return None
    blockers = []
    if device != "CPU":
        blockers.append(f"the {device} backend (the kernel is CPU code)")
    if amp is not None:
        blockers.append(f"amp.level {amp.level} (the kernel computes in float32)")
    if world_size > 1:
        blockers.append("data parallelism (the kernel has no all-reduce)")
    if micro_batches(config) > 1:
        blockers.append("gradient accumulation")
    if config.policy.layer != "dense":
        blockers.append(f"policy.layer {config.policy.layer}")
    batch = config.ppo.batch_size
    if choice == "custom":
        if blockers:
            raise ConfigError(f"ppo.update_kernel: custom cannot run with {blockers[0]}; use builtin or auto")
        from ..ops.custom import PPOUpdateKernel

        return PPOUpdateKernel(model, step.optimizer, config.ppo)
    if blockers or batch == "auto" or batch // world_size > AUTO_UPDATE_KERNEL_MAX_BATCH:
        return None
    from ..errors import CustomOpError
    from ..ops.custom import PPOUpdateKernel

    try:
        return PPOUpdateKernel(model, step.optimizer, config.ppo)
    except CustomOpError as exc:  # no compiler, unsupported model: the builtin graph
        logging.getLogger("scalebox_ms").warning("ppo.update_kernel auto: using the builtin update (%s)", exc)
        return None


def _pipeline_refusal(device: str, stages: int) -> str:
    if device == "CPU":
        return (f"parallel.pipeline_stages: {stages} needs Ascend or GPU; MindSpore has no pipeline parallelism "
                "on CPU (use parallel.workers for data parallelism)")
    return (f"parallel.pipeline_stages: {stages} is not supported by scalebox_ms yet on {device}: PPO's policy "
            "and value MLPs have 2-3 layers, too few to split into pipeline stages (use parallel.workers)")


def _explained_variance(y_pred: np.ndarray, y_true: np.ndarray) -> float:
    var_y = np.var(y_true)
    return float("nan") if var_y == 0 or len(y_true) == 0 else float(1.0 - np.var(y_true - y_pred) / var_y)


def _jsonable(obj):
    import json

    return json.loads(json.dumps(obj))
