"""The off-policy core shared by DQN, SAC and TD3: act -> env step -> replay -> training phase.

:class:`OffPolicyTrainer` owns what the three algorithms share -- the env side (the :class:`~.collector.
RolloutCollector`: env, observation normalisation, episode accounting, non-finite checks), the device-resident
:class:`~scalebox_ms.buffers.ReplayBuffer`, the run loop with callbacks and metrics, checkpoints (the replay
buffer in its own file) -- and takes the maths from an algorithm module (:mod:`.dqn`, :mod:`.sac`, :mod:`.td3`):
its *learner* Cell (networks, targets, optimizers; ``train_step``, ``policy``, ``deterministic``) and its host-side
exploration.

One training phase is ONE compiled graph call (:class:`TrainingPhase`): it appends the ``train_freq x num_envs``
transitions collected since the last phase to the replay buffer, runs ``gradient_steps`` updates in a graph ``while``
loop -- each samples its batch inside the graph (row draws by the trainer's Generator) --, and computes the policy's
output for the next observation, so the step after a phase needs no acting call. Between phases, acting is one
compiled call per vector step (skipped while actions are random): with SAC/TD3's ``train_freq: 1``, one graph call
per env step in all.

Transitions are stored as (obs, action, reward, next_obs, terminated) with the raw observations (normalised inside the
graph with the running statistics at sampling time, as SB3's VecNormalize does) and actions in the algorithm's space
(DQN: the index; SAC/TD3: scaled to [-1, 1]). ``next_obs`` is the observation the env returned for the step -- the true
final observation when an episode is truncated (gymnasium's next-step autoreset), so truncation bootstraps and
termination does not; the autoreset steps themselves are not stored.

An *iteration* (a metrics row, and where checkpoints and ``--until`` stop) is a whole number of phases adding up to at
least 1,000 env steps (:func:`.checkpoint.steps_per_iteration`), or fewer phases when the run's end or ``until`` comes
first: a run stops at the first phase boundary at or past it.
"""
from __future__ import annotations

import time
from typing import Optional, Sequence, Union

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn

from ..buffers.device import sample_draws
from ..config import Config
from ..config_offpolicy import space_refusal, warn_if_warm_up_only
from ..errors import ConfigError, TrainingError
from ..sandbox import Sandbox
from . import checkpoint
from .core import Callback, Trainer, closes_envs_on_error
from .kernels import select_conv_backend, select_conv_kernel, select_optimizer_kernel
from .offpolicy_collect import collect_phase
from .offpolicy_graph import NONFINITE_LIMIT, DeployActor, NativeCycle, PolicyCall, TrainingPhase
from .offpolicy_native import native_phase


class OffPolicyTrainer(Trainer):
    """The shared off-policy trainer; use :class:`~.dqn.DQNTrainer`, :class:`~.sac.SACTrainer` or
    :class:`~.td3.TD3Trainer` (or :func:`scalebox_ms.trainers.make_trainer`).

    Args:
        config: a :class:`~scalebox_ms.config.Config` (copied), a dict in the YAML layout, or None for defaults.
        sandbox: an existing :class:`~scalebox_ms.Sandbox`; built from ``config.sandbox`` when omitted.
        **overrides: keys of the algorithm's section, e.g. ``SACTrainer(cfg, learning_starts=1000)``.

    Attributes users embed: ``learner`` (the ``nn.Cell`` with the networks, targets and optimizers; also
    ``model``), ``replay`` (the :class:`~scalebox_ms.buffers.ReplayBuffer`), ``phase`` (the compiled training
    phase), ``policy_call``/``deterministic_call`` (compiled acting entry points).
    """

    learner_class = None
    #: add the rows of the warm-up phases (before ``learning_starts``) in one replay call per iteration instead of
    #: one training-phase call each (same replay contents; False: the per-phase calls, the reference in the tests)
    warmup_batching = True

    @closes_envs_on_error
    def __init__(self, config: Union[Config, dict, None] = None, sandbox: Optional[Sandbox] = None, **overrides):
        super().__init__(config, sandbox, overrides)
        from ..buffers import ReplayBuffer
        from ..parallel import init_distributed
        from .memory import check_fits
        from .state import ParameterValues

        cfg, algo = self.config, self.algo
        o = cfg.algo_config
        self.dist = init_distributed(getattr(self.sandbox, "device", "CPU"))
        if self.dist.world_size > 1:
            raise ConfigError(f"parallel.workers: data parallelism is not supported with algo {algo} yet "
                              f"(started under msrun with {self.dist.world_size} ranks)")
        from ..amp import AutoMixedPrecision, check_backend

        self.amp = AutoMixedPrecision.from_config(cfg.amp)
        check_backend(self.amp, getattr(self.sandbox, "device", "CPU"))
        # the training stream is PCG64([seed, 2]): PCG64(seed) is also what gymnasium and the native envs derive
        # env 0's generator from, so it would replay env 0's reset noise as exploration noise
        c = self._make_collector(cfg.env.num_envs, stream=2)
        spec = self.spec
        refusal = space_refusal(algo, spec, cfg.env.id) or self._refusal(spec)
        if spec.cnn and self.amp is not None:
            refusal = "amp.level: image observations (NatureCNN) train in float32 only for now"
        if refusal:  # (before the replay buffer is allocated)
            raise ConfigError(refusal)
        N = c.num_envs
        self.phase_rows = o.train_freq * N
        if self.phase_rows > o.buffer_size:
            raise ConfigError(f"{algo}.buffer_size: ({o.buffer_size}) must hold one training phase of "
                              f"{algo}.train_freq x env.num_envs = {self.phase_rows} transitions")
        self.gradient_steps = o.gradient_steps if o.gradient_steps > 0 else self.phase_rows
        act_shape, act_dtype = self._replay_action_spec()
        obs_shape, obs_dtype = spec.obs_shape, (np.uint8 if spec.image else np.float32)  # (images stay uint8)
        fields = {"obs": (obs_shape, obs_dtype), "action": (act_shape, act_dtype), "reward": ((), np.float32),
                  "next_obs": (obs_shape, obs_dtype), "terminated": ((), np.float32)}
        row = sum(int(np.prod(s, dtype=np.int64)) * np.dtype(d).itemsize for s, d in fields.values())
        check_fits(f"{algo}.buffer_size", f"a replay buffer of {algo}.buffer_size = {o.buffer_size} transitions",
                   (o.buffer_size + 1) * row, getattr(self.sandbox, "memory_limit_bytes", None))
        self.replay_row_bytes = row
        self.learner = self.learner_class(spec, cfg.policy, o, amp=self.amp)
        self.model = self.learner
        device = getattr(self.sandbox, "device", "CPU")
        self.optimizer_kernel = select_optimizer_kernel(cfg, self.learner, self.amp, device)
        self.conv_backend = select_conv_backend(cfg.policy, self.learner, device)  # images: the convolutions
        self.conv_kernel = select_conv_kernel(cfg.policy, self.learner, device)  # images: first-layer patches
        self.replay = ReplayBuffer(o.buffer_size, fields, spare_row=True)
        normalize = c.obs_normalizer is not None
        batched = self.learner.batches_targets(self.gradient_steps * o.batch_size)
        self.phase = TrainingPhase(self.learner, self.replay, normalize, batched)
        self.native_cycle = (NativeCycle(self.learner, self.replay, c.env, o.train_freq, normalize,
                                         self.spec.discrete, batched) if c.compiled else None)
        self.policy_call = PolicyCall(self.learner, deterministic=False)
        self.deterministic_call = PolicyCall(self.learner, deterministic=True)
        self._values = ParameterValues([("model." + n, p) for n, p in self.learner.parameters_and_names()])
        self.steps_per_iteration = checkpoint.steps_per_iteration(cfg.to_dict())  # (the sidecar check's own rule)
        self.phases_per_iteration = self.steps_per_iteration // self.phase_rows
        self._phase_steps = o.train_freq
        self._pending: Optional[np.ndarray] = None  # the policy output for the observation _pending_obs
        self._pending_obs: Optional[np.ndarray] = None
        self._pending_noise: Optional[np.ndarray] = None  # the acting noise _pending was computed with
        self._redo_noise: Optional[np.ndarray] = None  # that noise, after the weights changed (see _weights_changed)
        # zeros in the shapes of the noise inputs, for phases without gradient steps or policy output
        self._no_train_noise = np.zeros_like(self._train_noise(np.random.default_rng(0), self.gradient_steps,
                                                               o.batch_size))
        self._no_act_noise = np.zeros_like(self._act_noise_or_zeros(np.random.default_rng(0), N))
        self.n_updates = 0
        self._replay_rows = 0  # host mirror of len(self.replay), updated per phase without a device read
        self._nonfinite_phases = 0
        if not spec.discrete:
            self._low = np.asarray(spec.low, np.float64)
            self._high = np.asarray(spec.high, np.float64)

    # ------------------------------------------------------------------ algorithm hooks (Box defaults)
    def _refusal(self, spec) -> Optional[str]:
        """The algorithm's own one-line refusal of this config on these spaces, or None."""
        return None

    def _replay_action_spec(self):
        return (self.spec.action_dim,), np.float32

    def _to_env(self, scaled: np.ndarray) -> np.ndarray:
        """[-1, 1] -> the Box bounds (SB3's unscale_action)."""
        return self.collector.box_to_env(self._low + 0.5 * (scaled.astype(np.float64) + 1.0) * (self._high - self._low))

    def _noisy(self, scaled: np.ndarray, rng) -> np.ndarray:
        sigma = self.config.algo_config.action_noise
        if sigma:
            scaled = np.clip(scaled + rng.normal(0.0, sigma, scaled.shape), -1.0, 1.0)
        return scaled.astype(np.float32)

    def _random_actions(self, rng, n):
        a = self._noisy(rng.uniform(-1.0, 1.0, (n, self.spec.action_dim)), rng)
        return a, self._to_env(a)

    def _explore(self, policy, rng, n):
        a = self._noisy(policy(), rng)
        return a, self._to_env(a)

    def _train_noise(self, rng, steps, batch):
        return np.zeros((steps, 1), np.float32)

    def _random_mask(self, rng, n, step):
        """Native cycle: 1 where the env at ``step`` acts at random (before learning_starts)."""
        return np.full(n, float(step < self.config.algo_config.learning_starts), np.float32)

    def _random_batch(self, rng, n):
        """Native cycle: ``n`` uniformly random actions in the replay's action space."""
        return rng.uniform(-1.0, 1.0, (n, self.spec.action_dim)).astype(np.float32)

    def _act_noise(self, rng, n):
        return None

    def _target_updates(self, steps_before: int, steps_after: int) -> int:
        return 0

    def _phase_metrics(self) -> dict:
        return {}

    def _after_phase(self) -> None:
        """Called after every training phase call (the weights changed)."""

    # ------------------------------------------------------------------ acting
    def _act_noise_or_zeros(self, rng, n):
        noise = self._act_noise(rng, n)
        return np.zeros((n, 1), np.float32) if noise is None else noise

    def _policy(self):
        """The policy output for the current observation: from the last phase call, or one acting call."""
        obs = self.collector.obs
        out, self._pending = self._pending, None
        noise, self._redo_noise = self._redo_noise, None
        if out is None or not np.array_equal(self._pending_obs, obs):  # (new episodes since: recompute)
            if noise is None or not np.array_equal(self._pending_obs, obs):
                noise = self._act_noise_or_zeros(self.rng, self.num_envs)
            out = self.policy_call(Tensor(obs), Tensor(noise)).asnumpy()
        return out

    def deploy_policy(self) -> nn.Cell:
        """The Cell :func:`scalebox_ms.export.export_mindir` exports (see :class:`DeployActor`)."""
        return DeployActor(self.learner, self.spec)

    def policy_mlp(self):
        """(the deterministic policy as one Dense/activation ``nn.SequentialCell``, its output mapping) for INT8
        post-training quantization (:class:`scalebox_ms.quant.DynamicQuantizer`)."""
        return self.learner.policy_mlp()

    def _act_deterministic(self, batch: np.ndarray) -> np.ndarray:
        out = self.deterministic_call(Tensor(batch), Tensor(np.zeros((len(batch), 1), np.float32))).asnumpy()
        return self._to_env(out)

    def _act_stochastic(self, batch: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        def policy():
            noise = self._act_noise_or_zeros(rng, len(batch))
            return self.policy_call(Tensor(batch), Tensor(noise)).asnumpy()

        return self._explore(policy, rng, len(batch))[1]

    # ------------------------------------------------------------------ the loop
    def learn(self, total_steps: Optional[int] = None, callbacks: Sequence[Callback] = (),
              until: Optional[int] = None) -> "OffPolicyTrainer":
        """Train until ``global_step`` reaches ``total_steps`` (default ``run.total_steps``); ``until`` pauses
        earlier without changing the schedules. Both stop at the first training-phase boundary at or past them
        (``train_freq x num_envs`` env steps; the last iteration is cut short)."""
        stop_at, callbacks = self._start_learning(total_steps, until, callbacks)
        warn_if_warm_up_only(self.config, self.log, stop_at > self.global_step)
        while self.global_step < stop_at:
            # (an exception out of the iteration, Ctrl-C in your own script or an env's error, leaves it cut: the
            # envs and the training stream may have moved before the counters did; see Trainer.save)
            self._torn_at = self.global_step
            metrics = self._iteration(stop_at)
            self._torn_at = None
            if self._end_iteration(callbacks, metrics):
                break
        for cb in callbacks:
            cb.on_training_end(self)
        return self

    def _iteration(self, stop_at: Optional[int] = None) -> dict:
        """One iteration: ``phases_per_iteration`` training phases, fewer where ``stop_at`` (the run's end or
        ``until``) comes first, so a run stops at the first phase boundary at or past it (SB3's ``train_freq``
        granularity), not at the next whole iteration."""
        o, c, rng, N = self.config.algo_config, self.collector, self.rng, self.num_envs
        phases = self.phases_per_iteration
        if stop_at is not None:
            phases = max(1, min(phases, -(-(int(stop_at) - self.global_step) // self.phase_rows)))
        T, obs_shape = self._phase_steps, self.spec.obs_shape
        act_shape = self._replay_action_spec()[0]
        clock = time.perf_counter
        t_iter = clock()
        t_env = t_act = t_update = 0.0
        stats = np.zeros(len(self.learner.STATS))
        grad_steps = 0
        # warm-up phases (no gradient step, no target update, no policy output: before learning_starts) only add
        # their rows to the replay, so their rows are added in one call per iteration, in the same order
        # (``_flush_warmup``), instead of one phase graph call each; bit-identical (no weight changes, no draws)
        warmup, warmup_rows = [], self.phases_per_iteration * self.phase_rows  # (also in a cut-short iteration)
        batch_warmup = self.warmup_batching and warmup_rows <= o.buffer_size
        for _ in range(phases):
            if self.native_cycle is not None:  # native env: the whole cycle is one graph call
                t0 = clock()
                acc, n_grad = native_phase(self)  # (one graph call: env steps included)
                t_update += clock() - t0
                stats += acc
                grad_steps += n_grad
                self._check_nonfinite(acc, n_grad)
                continue
            steps_before = self.global_step
            (obs_b, act_b, rew_b, next_b, term_b, valid_b), dt_act, dt_env = collect_phase(self, rng, clock)
            t_act += dt_act
            t_env += dt_env
            # the training phase: replay add + gradient steps + the policy output for the next observation
            t0 = clock()
            self._replay_rows = min(self._replay_rows + int(valid_b.sum()), o.buffer_size)
            n_grad, n_target, u, noise = self._train_inputs(rng, steps_before)
            needs_policy = self.global_step >= o.learning_starts
            if batch_warmup and not (n_grad or n_target or needs_policy):
                warmup.append((obs_b, act_b, rew_b, next_b, term_b, valid_b))
                self._pending, self._pending_obs = None, c.obs
                self._nonfinite_phases = 0
                t_update += clock() - t0
                continue
            self._flush_warmup(warmup, warmup_rows)
            act_noise = self._act_noise_or_zeros(rng, N) if needs_policy else self._no_act_noise
            mean, inv_std, clip = self._obs_stats()
            items = ms.mutable((Tensor(obs_b.reshape((T * N,) + obs_shape)),
                                Tensor(act_b.reshape((T * N,) + act_shape)), Tensor(rew_b.reshape(-1)),
                                Tensor(next_b.reshape((T * N,) + obs_shape)), Tensor(term_b.reshape(-1))))
            # (items is mutable: a plain tuple argument is a compile-time constant, recompiled every call)
            out, acc = self.phase(items, Tensor(valid_b.reshape(-1)), Tensor(np.int32(n_grad)),
                                  Tensor(np.int32(n_target)), Tensor(u), Tensor(noise),
                                  Tensor(np.float32(o.learning_rate)), Tensor(mean), Tensor(inv_std), Tensor(clip),
                                  Tensor(c.obs), Tensor(act_noise))
            self._pending = out.asnumpy() if needs_policy else None
            self._pending_obs, self._pending_noise, self._redo_noise = c.obs, act_noise, None
            self._after_phase()
            acc = acc.asnumpy()
            t_update += clock() - t0
            stats += acc
            grad_steps += n_grad
            self._check_nonfinite(acc, n_grad)
        t0 = clock()
        self._flush_warmup(warmup, warmup_rows)
        t_update += clock() - t0
        self.n_updates += grad_steps
        self.iteration += 1
        dt = clock() - t_iter
        self.wall_time_s += dt
        steps = phases * self.phase_rows
        # (no gradient step in the iteration: no statistic, NaN; 0 read as a zero loss, and SAC's ent_coef of 0)
        per_step = stats / grad_steps if grad_steps else np.full_like(stats, np.nan)
        names = self.learner.STATS
        if "actor_updates" in names:  # TD3: the actor loss averaged over the steps that updated the actor
            actor_updates = stats[names.index("actor_updates")]
            per_step[names.index("actor_loss")] = stats[names.index("actor_loss")] / actor_updates if actor_updates \
                else np.nan
            per_step[names.index("actor_updates")] = actor_updates
        metrics = {
            "iteration": self.iteration,
            "global_step": self.global_step,
            "wall_time_s": self.wall_time_s,
            "steps_per_second": steps / dt,
            "episode_return_mean": float(np.mean(c.episode_returns)) if c.episode_returns else float("nan"),
            "episode_length_mean": float(np.mean(c.episode_lengths)) if c.episode_lengths else float("nan"),
            "episodes": c.episodes,
            "learning_rate": o.learning_rate,
            **{k: float(v) for k, v in zip(self.learner.STATS, per_step) if k != "nonfinite"},
            "nonfinite_updates": int(round(stats[self.learner.STATS.index("nonfinite")])),
            "n_updates": grad_steps,
            "replay_size": len(self.replay),
            "update_time_s": t_update,
            "share_env": t_env / dt,
            "share_act": t_act / dt,
            "share_update": t_update / dt,
            "share_other": max(0.0, 1.0 - (t_env + t_act + t_update) / dt),
            "update_samples_per_s": grad_steps * o.batch_size / t_update if t_update > 0 and grad_steps else 0.0,
            "batch_size": o.batch_size,
            "world_size": 1,
            **self._phase_metrics(),
        }
        if self.amp is not None:
            metrics["loss_scale"] = float(self.learner.loss_scale.asnumpy())
            metrics["amp_skipped_steps"] = int(self.learner.skipped_steps.asnumpy())
        if getattr(c.env, "events", None) is not None:
            metrics["env_restarts"] = len(c.env.events)
        self._last_metrics = metrics
        return metrics

    def _flush_warmup(self, warmup: list, rows: int) -> None:
        """Add the rows of the warm-up phases collected so far to the replay in one call (padded to ``rows`` with
        invalid rows, so one graph serves every iteration), as their phase calls would have added them."""
        if not warmup:
            return
        parts = [np.concatenate([p[k].reshape((-1,) + p[k].shape[2:]) for p in warmup]) for k in range(6)]
        pad = rows - len(parts[-1])
        if pad:
            parts = [np.concatenate([a, np.zeros((pad,) + a.shape[1:], a.dtype)]) for a in parts]
        *fields, valid = parts  # (the phase's order: obs, action, reward, next_obs, terminated)
        self.replay.add_batch_masked(valid, **dict(zip(("obs", "action", "reward", "next_obs", "terminated"), fields)))
        warmup.clear()

    def _check_nonfinite(self, acc, n_grad) -> None:
        bad = int(round(acc[self.learner.STATS.index("nonfinite")]))
        self._nonfinite_phases = self._nonfinite_phases + 1 if n_grad and bad == n_grad else 0
        if self._nonfinite_phases >= NONFINITE_LIMIT:
            raise TrainingError(f"{NONFINITE_LIMIT} training phases in a row had only non-finite losses or "
                                f"gradients (every step skipped) at step {self.global_step}; the run stops")

    def _train_inputs(self, rng, steps_before: int):
        """(n_grad, n_target, u, noise) of a phase ending at the current global step."""
        o = self.config.algo_config
        # (never sample an empty buffer: e.g. resumed without its replay file at an episode boundary)
        train = self.global_step > o.learning_starts and self._replay_rows > 0
        G, b = self.gradient_steps, o.batch_size
        u = sample_draws(rng, (G, b)) if train else np.zeros((G, b), np.int32)  # (replay rows: draw mod size)
        noise = self._train_noise(rng, G, b) if train else self._no_train_noise
        return (G if train else 0), self._target_updates(steps_before, self.global_step), u, noise

    def _obs_stats(self):
        return self.collector.normalizer_inputs()

    def _summary_extra(self) -> dict:
        return {"batch_size": self.config.algo_config.batch_size, "n_updates": self.n_updates,
                "replay_size": len(self.replay), "replay_row_bytes": self.replay_row_bytes,
                "graph_calls_per_iteration": None}

    # ------------------------------------------------------------------ state
    #: sidecar keys that belong to the episodes in flight (None in checkpoints whose resume starts fresh episodes)
    INFLIGHT_EXTRA = ("raw_obs", "pending", "pending_noise")

    def _sidecar_extra(self) -> dict:
        c = self.collector
        # the acting noise of the pending action (or of the one set_parameters dropped: computed again with it)
        noise = self._pending_noise if self._pending is not None else self._redo_noise
        return {"raw_obs": None if c.raw_obs is None else c.raw_obs.tolist(),
                "pending": None if self._pending is None else self._pending.tolist(),
                "pending_noise": None if noise is None else noise.tolist(),
                "n_updates": self.n_updates, "replay_size": len(self.replay),
                "replay_saved": bool(self.config.run.save_replay)}

    def _restore_extra(self, sc: dict) -> None:
        self._torn_at = None  # (a checkpoint's state: whole phases)
        self.n_updates = int(sc.get("n_updates", 0))
        if sc.get("raw_obs") is not None:
            self.collector.raw_obs = np.asarray(sc["raw_obs"], np.uint8 if self.spec.image else np.float32)
        act_shape, act_dtype = self._replay_action_spec()
        self._pending = None if sc.get("pending") is None else np.asarray(sc["pending"], act_dtype)
        noise = None if sc.get("pending_noise") is None else np.asarray(sc["pending_noise"], np.float32)
        self._pending_noise, self._redo_noise = (noise, None) if self._pending is not None else (None, noise)
        inflight = sc.get("inflight") or {}
        self._pending_obs = None if inflight.get("obs") is None else np.asarray(inflight["obs"], np.float32)

    def _weights_changed(self) -> None:
        # the last phase's action for the current observation came from the old weights: computed again from the
        # new ones with the same noise (no new draw from the training stream: set_parameters(get_parameters())
        # leaves training as it was)
        if self._pending is not None:
            self._redo_noise = self._pending_noise
        self._pending = None

    def _restore_replay(self, arrays) -> None:
        """The checkpoint's replay contents, or (None) an empty buffer."""
        if arrays is not None:
            self.replay.load_state_dict(arrays)  # (another buffer_size: oldest first, the newest that fit)
            if len(self.replay) < int(arrays["_size"]):
                self.log.warning(f"warning: replay: the checkpoint holds {int(arrays['_size'])} transitions, more "
                                 f"than this trainer's buffer_size {self.replay.capacity}: the newest "
                                 f"{len(self.replay)} are kept")
        elif self._replay_rows or len(self.replay):
            self.replay.clear()
        self._replay_rows = len(self.replay)

    def _replay_state(self):
        return self.replay.state_dict() if self.config.run.save_replay else None
