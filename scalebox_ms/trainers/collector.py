"""Rollout collection: the vector env, observation/reward normalisation and episode accounting.

:class:`RolloutCollector` owns everything between the policy and the env: it steps the env with the acting
call's actions, normalises observations, scales rewards, keeps the in-flight state between rollouts (the next
observation, which envs autoreset next, the running episode returns) and the episode statistics. Autoreset
semantics are those of :mod:`scalebox_ms.buffers.rollout`. Every observation and reward is checked: a
non-finite value stops the run with a one-line :class:`TrainingError` naming the env, the env index and the
step, before any update can see it.

All random numbers (sampling noise; the native envs' reset noise comes from the env's own generator) come from
``rng``, the trainer's one seeded Generator, in a fixed order, so a rollout is reproducible bit for bit.
"""
from __future__ import annotations

import collections
import logging
import time
from typing import Optional

import numpy as np

from ..envs.factory import close_env
from ..envs.isolated import restarted
from ..errors import ScaleboxError, TrainingError, first_line, user_code_origin


class RolloutCollector:
    """Collect rollouts of ``num_envs`` envs (this process's share) into a :class:`RolloutStorage`."""

    def __init__(self, config, rng: np.random.Generator, num_envs: int, rank: int = 0, reducer=None):
        from ..envs import ObsNormalizer, RewardScaler, make_vec_env, space_spec
        from ..envs.obs_encoding import ObsEncoder

        e = config.env
        self.env_id = e.id
        self.num_envs = num_envs
        self.rank = rank
        #: global env steps per vector step (every rank's envs: data parallelism), for the steps errors name
        self.step_stride = num_envs * max(1, config.parallel.workers)
        self.rng = rng
        from ..sandbox import env_isolation

        # (isolated as the config says: Trainer checked that a given Sandbox agrees)
        self.env = make_vec_env(e.id, num_envs, e.kwargs, **env_isolation(config.sandbox), backend=e.backend,
                                preprocess=e.preprocess)
        if hasattr(self.env, "index_offset"):  # (isolated: its restart warnings number envs as the run does)
            self.env.index_offset = rank * num_envs
        from ..envs.atari import resolve

        # Atari: episode statistics are whole games with raw rewards (info["game_return"], envs.atari.GameStats),
        # not the lives with clipped rewards that training sees as episodes
        self.game_stats = resolve(e.preprocess, e.id, e.kwargs) == "atari"
        features = config.policy.features
        try:
            self.spec = space_spec(self.env.single_observation_space, self.env.single_action_space, e.id, features)
        except Exception:
            close_env(self.env, e.id)
            raise
        #: gymnasium observations -> flat float32 vectors (one-hot Discrete parts, Dict/Tuple side by side), or
        #: uint8 (C, H, W) images
        self.encoder = ObsEncoder(self.env.single_observation_space, e.id, features)
        from ..envs.normalize import Float32Resolution

        self._resolution = Float32Resolution(self.encoder, self.env.single_observation_space, e.id)
        self._env_obs = None  # what the env returned last (before encoding: for error messages)
        if self.spec.action_kind == "box":  # the Box's dtype and bounds, for the actions the env gets
            space = self.env.single_action_space
            self._box = (space.dtype, np.asarray(space.low), np.asarray(space.high))
        # images are never normalised (the CNN scales them by 1/255)
        self.obs_normalizer = (ObsNormalizer(self.spec.obs_dim, e.clip_obs, mask=self.encoder.normalize_mask)
                               if e.normalize_obs and not self.spec.image else None)
        self.reward_scaler = (RewardScaler(num_envs, config.ppo.gamma, e.clip_reward) if e.normalize_reward
                              else None)
        if reducer is not None:  # data parallel: statistics merged over all ranks' envs
            for norm in (self.obs_normalizer, self.reward_scaler):
                if norm is not None:
                    norm.rms.reduce = reducer
        self.compiled = e.backend == "native" and e.compiled_rollout
        self._rollout_cell = None
        self.episode_returns: collections.deque = collections.deque(maxlen=100)
        self.episode_lengths: collections.deque = collections.deque(maxlen=100)
        self.episodes = 0
        # in-flight env state between rollouts
        self.obs: Optional[np.ndarray] = None             # normalised obs the policy sees next
        self.raw_obs: Optional[np.ndarray] = None         # the same, encoded but not normalised (replay buffers)
        self.valid = np.ones(num_envs, bool)              # False: the next step is an autoreset step
        self.ep_return = np.zeros(num_envs, np.float64)
        self.ep_length = np.zeros(num_envs, np.int64)

    # ------------------------------------------------------------------ observations and actions
    def encode(self, obs, what: Optional[str] = None) -> np.ndarray:
        """A batch of observations as the env returns them -> float32 (batch, obs_dim) (:mod:`..envs.obs_encoding`;
        ``what``: the caller that passed ``obs``, blamed instead of the env for a value outside the space)."""
        return self.encoder.encode(obs, what)

    def normalize_obs(self, obs: np.ndarray, update: bool = False, rows=None) -> np.ndarray:
        """Normalise an encoded (batch, obs_dim) batch (unchanged without ``env.normalize_obs``, and images); with
        ``update``, its ``rows`` (bool mask; None: all) update the statistics first."""
        if self.spec.image:
            return obs
        obs = np.asarray(obs, np.float32).reshape(obs.shape[0], -1)
        if self.obs_normalizer is None:
            return obs
        return self.obs_normalizer(obs, update=update, rows=rows)

    def normalizer_inputs(self):
        """(mean, 1 / std, clip) float32 for :func:`scalebox_ms.ops.clip.normalize_obs` in a graph, the same rule as
        :meth:`normalize_obs`: a scalar clip, or per column when a mask leaves encoded one-hots/bits alone (mean 0,
        1/std 1, clip inf there); no normaliser: the identity."""
        norm, D = self.obs_normalizer, self.spec.obs_dim
        if norm is None:
            return np.zeros(D, np.float32), np.ones(D, np.float32), np.float32(np.inf)
        if norm.mask is not None:
            mean, inv_std, _, high = norm.constants()
            return mean, inv_std, high
        rms = norm.rms
        return (rms.mean.astype(np.float32), (1.0 / np.sqrt(rms.var + norm.epsilon)).astype(np.float32),
                np.float32(norm.clip))

    def noise(self, n: int, rng: Optional[np.random.Generator] = None) -> np.ndarray:
        """Sampling noise for ``n`` actions: Gumbel (Categorical, one per logit), standard logistic (Bernoulli) or
        standard normal (Gaussian)."""
        rng = self.rng if rng is None else rng
        kind, width = self.spec.action_kind, self.spec.logits_dim
        if kind in ("discrete", "multidiscrete"):
            return rng.gumbel(size=(n, width)).astype(np.float32)
        if kind == "multibinary":
            return rng.logistic(size=(n, width)).astype(np.float32)
        return rng.standard_normal(size=(n, width)).astype(np.float32)

    def env_actions(self, actions: np.ndarray) -> np.ndarray:
        kind = self.spec.action_kind
        if kind == "discrete":
            return actions.astype(np.int64)
        if kind == "multidiscrete":
            return actions.astype(np.int64) + np.asarray(self.spec.action_start, np.int64)
        if kind == "multibinary":
            return actions.astype(np.int8)
        return self.box_to_env(actions)

    def box_to_env(self, actions: np.ndarray) -> np.ndarray:
        """Box actions as the env's space has them: its dtype, clipped to its bounds in that dtype (float32
        actions clipped to float32(0.1) were above a float64 space's bound 0.1)."""
        dtype, low, high = self._box
        return np.clip(np.asarray(actions).astype(dtype), low, high)

    def unpack_actions(self, packed: np.ndarray) -> np.ndarray:
        """The action columns of a packed ``[action | log_prob | value]`` acting output, in the storage dtype."""
        if self.spec.action_kind == "discrete":
            return packed[:, 0].astype(np.int32)
        return packed[:, :-2].astype(np.int32) if self.spec.integer_actions else packed[:, :-2]

    def step_env(self, actions, step: int):
        """``env.step(actions)`` with the observations encoded. An exception from the env (a bug in a user's env: a
        wrong observation shape, a crash in its ``step``) becomes a one-line :class:`TrainingError` naming the env,
        the step, the exception and where the env's code raised it (the original is chained as ``__cause__``)."""
        try:
            raw, reward, terminated, truncated, info = self.env.step(actions)
        except (ScaleboxError, MemoryError):
            raise
        except Exception as exc:
            raise self._env_raised(exc, "step", step) from exc
        return self._encode_returned(raw, "step", step), reward, terminated, truncated, info

    def _encode_returned(self, raw, call: str, step: int) -> np.ndarray:
        self._env_obs = raw
        try:
            obs = self.encode(raw)
        except TrainingError as exc:  # (a value outside its space: which call, which step)
            raise TrainingError(f"{exc}, from {call}() at step {step}; the run stops") from None
        except (ScaleboxError, MemoryError):
            raise
        except Exception as exc:  # (its observation does not fit the observation space it declares)
            raise self._env_raised(exc, call, step, returned=True) from exc
        if self._resolution.active:
            self._resolution.add(raw, logging.getLogger("scalebox_ms").warning)
        return obs

    def _env_raised(self, exc: Exception, call: str, step: int, returned: bool = False) -> TrainingError:
        message = first_line(exc)
        what = (f"{call}() returned an observation that does not fit its observation space ({type(exc).__name__}"
                if returned else f"{call}() raised {type(exc).__name__}")
        isolated = getattr(self.env, "events", None) is not None
        hint = "" if isolated else "; sandbox.isolation_level: process restarts a failing env instead"
        return TrainingError(f"env {self.env_id!r}: {what}{')' if returned else ''} at step {step}"
                             f"{user_code_origin(exc)}: {message}; the run stops (the latest checkpoint resumes "
                             f"it{hint})")

    def _check_finite(self, raw_obs, reward, step: int) -> None:
        big = float(np.finfo(np.float32).max)  # (a reward beyond it is inf once cast to float32 for the update)
        for what, value in (("observation", raw_obs), ("reward", reward)):
            ranged = what == "reward" and self.reward_scaler is None  # (scaled in float64 first; RewardScaler stops
            # the run where its return variance overflows float64)
            if value is None or (np.isfinite(value).all() and (not ranged or (np.abs(value) <= big).all())):
                continue  # (the common case: no copy)
            arr = np.asarray(value, np.float64).reshape(self.num_envs, -1)
            ok = np.isfinite(arr) & (np.abs(arr) <= big) if ranged else np.isfinite(arr)
            bad = ~ok.all(axis=1)
            if bad.any():
                i = int(np.flatnonzero(bad)[0])
                v = arr[i][~ok[i]][0]
                if what == "observation" and np.isinf(v) and self._env_obs is not None:  # (once cast to float32?)
                    v = self._env_value(i, v)
                kind = (f"a non-finite {what}" if not np.isfinite(v) else
                        f"{'an' if what == 'observation' else 'a'} {what} beyond float32's range")
                raise TrainingError(f"env {self.env_id!r} returned {kind} ({v}) at env index "
                                    f"{self.rank * self.num_envs + i}, step {step}; the run stops before the update "
                                    f"sees it")

    def _env_value(self, row: int, encoded: float) -> float:
        """The first value of env ``row``'s last observation that is finite but beyond float32's range (it was
        ``encoded`` as inf), else ``encoded``."""
        big = float(np.finfo(np.float32).max)
        for leaf in self.encoder.leaves:
            if leaf.kind == "box":
                x = np.asarray(self.encoder._leaf_value(self._env_obs, leaf), np.float64).reshape(self.num_envs, -1)
                hit = np.isfinite(x[row]) & (np.abs(x[row]) > big)
                if hit.any():
                    return float(x[row][hit][0])
        return encoded

    def reset(self, seed: Optional[int], step: int = 0, update_statistics: bool = True) -> None:
        """Reset every env (seeded); the first observations update the normalisation statistics unless
        ``update_statistics`` is False (a checkpoint being loaded: its statistics stay as saved)."""
        try:
            obs, _ = self.env.reset(seed=seed)
        except (ScaleboxError, MemoryError):
            raise
        except Exception as exc:
            raise self._env_raised(exc, "reset", step) from exc
        obs = self._encode_returned(obs, "reset", step)
        self._check_finite(obs, None, step)
        self.raw_obs = obs
        self.obs = self.normalize_obs(obs, update=update_statistics)
        self.valid[:] = True
        self.ep_return[:] = 0.0
        self.ep_length[:] = 0

    # ------------------------------------------------------------------ collection
    def collect(self, storage, act_packed, step: int):
        """Fill ``storage`` with one rollout, acting with ``act_packed(obs, noise)`` (the packed ActStep, or a
        ``host_call`` one that takes and returns numpy arrays); ``step`` is the global step at its start (for error
        messages). Returns (seconds acting, seconds in env.step)."""
        import mindspore as ms

        N = self.num_envs
        t_act = t_env = 0.0
        clock = time.perf_counter
        host = getattr(act_packed, "host_call", False)
        for t in range(storage.n_steps):
            obs = self.obs
            t0 = clock()
            out = (act_packed(obs, self.noise(N)) if host else
                   act_packed(ms.Tensor(obs), ms.Tensor(self.noise(N))).asnumpy())
            t1 = clock()
            action = self.unpack_actions(out)
            log_prob, value = out[:, -2], out[:, -1]
            raw_obs, reward, terminated, truncated, info = self.step_env(self.env_actions(action),
                                                                         step + t * self.step_stride)
            t_env += clock() - t1
            t_act += t1 - t0
            self._check_finite(raw_obs, reward, step + t * self.step_stride)
            valid = self.valid
            reward = np.asarray(reward, np.float64)
            terminated = np.asarray(terminated, bool) & valid
            truncated = np.asarray(truncated, bool) & valid
            done = terminated | truncated
            cut = restarted(self.env, N)  # (a restarted env worker's step: no transition to learn from)
            valid = valid & ~cut
            storage.rewards[t] = self._account_step(reward, done, valid, info, cut)
            storage.obs[t] = obs
            storage.actions[t] = action
            storage.log_probs[t] = log_prob
            storage.values[t] = value
            storage.terminated[t] = terminated
            storage.truncated[t] = truncated
            storage.valid[t] = valid

            # (a restarted worker's repeated observation is no new one: not counted in the statistics)
            self.obs = self.normalize_obs(raw_obs, update=True, rows=~cut if cut.any() else None)
            self.valid = ~done
        return t_act, t_env

    def _account_step(self, reward: np.ndarray, done: np.ndarray, valid: np.ndarray, info=None,
                      cut=None) -> np.ndarray:
        """Episode statistics (raw rewards; Atari: whole games from ``info``) and the training reward (scaled if
        configured, 0 on autoreset steps). Episodes ended by ``cut`` (a restarted env worker) are not counted: their
        return is a fragment (as evaluation discards them)."""
        self.ep_return += np.where(valid, reward, 0.0)
        self.ep_length += valid
        if self.game_stats:
            ended = np.flatnonzero(info.get("_game_return", ())) if info else ()
            for i in ended:
                self.episode_returns.append(float(info["game_return"][i]))
                self.episode_lengths.append(int(info["game_length"][i]))
                self.episodes += 1
        else:
            for i in np.flatnonzero(done if cut is None else done & ~cut):
                self.episode_returns.append(float(self.ep_return[i]))
                self.episode_lengths.append(int(self.ep_length[i]))
                self.episodes += 1
        self.ep_return[done] = 0.0
        self.ep_length[done] = 0
        train_reward = (self.reward_scaler(reward, done, valid) if self.reward_scaler is not None
                        else reward.astype(np.float32))
        return np.where(valid, train_reward, 0.0)

    def collect_compiled(self, storage, model, step: int, act_kernel: str = "builtin"):
        """Native envs: one graph call runs all T steps (:mod:`.native_rollout`, acting with ``act_kernel``:
        ``builtin`` or ``custom``); then the same host bookkeeping as :meth:`collect`. Returns (seconds in the graph
        call, 0.0, V(last observation))."""
        import mindspore as ms

        from ..ops.custom.status import custom_op_errors
        from .native_rollout import CompiledRollout

        T, N = storage.n_steps, self.num_envs
        if self._rollout_cell is None:
            self._rollout_cell = CompiledRollout(model, self.env, T, normalize=self.obs_normalizer is not None,
                                                 act_kernel=act_kernel)
        cell = self._rollout_cell
        t0 = time.perf_counter()
        # drawn in the order the step-by-step loop draws them: same streams, same rollout
        act_noise = np.stack([self.noise(N) for _ in range(T)])
        reset_noise = np.stack([self.env.rng.random((N, self.env._dyn_cls.noise_dim)).astype(np.float32)
                                for _ in range(T)])
        mean, inv_std, clip = self.normalizer_inputs()
        with custom_op_errors():  # (a C++ kernel's return code inside the graph: one line naming it)
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
        last_raw = last_raw.asnumpy()
        t_graph = time.perf_counter() - t0
        if not (np.isfinite(obs_raw).all() and np.isfinite(rewards).all()):  # find the first bad step
            for t in range(T):
                self._check_finite(obs_raw[t], rewards[t], step + t * self.step_stride)
        self._check_finite(last_raw, None, step + T * self.step_stride)
        for t in range(T):
            storage.rewards[t] = self._account_step(rewards[t], terminated[t] | truncated[t], valid_all[t])
        storage.terminated[:] = terminated
        storage.truncated[:] = truncated
        storage.valid[:] = valid_all
        if self.obs_normalizer is not None:  # the observations the T steps returned, each once, as the step loop
            self.obs_normalizer.rms.update(returned_observations(obs_raw, last_raw, self.spec.obs_dim))
        self.raw_obs = last_raw
        self.obs = self.normalize_obs(last_raw, update=False)
        self.valid = ~(terminated[-1] | truncated[-1])
        return t_graph, 0.0, last_value

    # ------------------------------------------------------------------ state
    def inflight_state(self) -> Optional[dict]:
        if self.obs is None:
            return None
        return {"obs": self.obs.tolist(), "valid": self.valid.tolist(), "ep_return": self.ep_return.tolist(),
                "ep_length": self.ep_length.tolist()}

    def restore_inflight(self, env, inflight: dict) -> None:
        self.env = env
        self._rollout_cell = None  # a compiled rollout is bound to the previous env's Parameters
        self.obs = np.asarray(inflight["obs"], np.float32)
        self.valid = np.asarray(inflight["valid"], bool)
        self.ep_return = np.asarray(inflight["ep_return"], np.float64)
        self.ep_length = np.asarray(inflight["ep_length"], np.int64)

    def close(self) -> None:
        close_env(self.env, self.env_id)


def returned_observations(obs_raw: np.ndarray, last_raw: np.ndarray, obs_dim: int) -> np.ndarray:
    """The raw observations a compiled run of T steps got back from its envs, ((T x N), obs_dim): those of steps
    1 .. T-1 (``obs_raw[t]`` is the observation step t acted on) and the last one. The statistics count each
    observation once, as the step loop does: ``obs_raw`` itself counted the run's first observation twice (the reset's
    or the previous run's last, counted there) and never the last."""
    return np.concatenate([obs_raw[1:].reshape(-1, obs_dim), np.asarray(last_raw).reshape(-1, obs_dim)])

