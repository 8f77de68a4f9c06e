"""The compiled graph cells of the off-policy core (:mod:`.offpolicy`): one training phase per call (gymnasium envs:
:class:`TrainingPhase`; native envs: :class:`NativeCycle`, env steps included), the acting call, the exported policy.
"""
from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn, ops

from ..envs.native.vector import transition
from ..ops.clip import normalize_obs


def add_and_train(cell, items, valid, n_grad, n_target, u, noise, lr, obs_mean, obs_inv_std, obs_clip):
    """Graph code shared by both phase cells: replay add, the learner's target updates, then ``n_grad`` gradient
    steps, each on a batch sampled inside the graph; returns the summed statistics.

    With ``cell.batched_targets`` (a learner whose TD target depends only on networks that stay fixed during the
    phase: DQN's target network, see ``DQNLearner.batches_targets``) all ``u.shape[0]`` batches are sampled at
    once and their targets computed in one batched pass before the loop: the same batches and targets as
    sampling per step, with a quarter fewer kernels per gradient step."""
    cell.replay.add_masked(items, valid)
    cell.learner.before_phase(n_target)
    acc = ops.zeros((cell.n_stats,), ms.float32)
    i = ops.zeros((), ms.int32)
    if cell.batched_targets:  # (DQN: every batch of the phase sampled and its TD targets computed in one pass)
        G, b = u.shape
        obs, action, reward, next_obs, terminated = cell.replay.gather(u.reshape((-1,)))
        obs = normalize_obs(cell.normalize, obs, obs_mean, obs_inv_std, obs_clip)
        next_obs = normalize_obs(cell.normalize, next_obs, obs_mean, obs_inv_std, obs_clip)
        y = cell.learner.td_target(reward, next_obs, terminated).reshape((G, b))
        obs, action = obs.reshape((G, b) + obs.shape[1:]), action.reshape((G, b) + action.shape[1:])
        while i < n_grad:
            acc = acc + cell.learner.train_on_targets(obs[i], action[i], y[i], lr)
            i = i + 1
        return acc
    while i < n_grad:
        obs, action, reward, next_obs, terminated = cell.replay.gather(u[i])
        obs = normalize_obs(cell.normalize, obs, obs_mean, obs_inv_std, obs_clip)
        next_obs = normalize_obs(cell.normalize, next_obs, obs_mean, obs_inv_std, obs_clip)
        acc = acc + cell.learner.train_step(obs, action, reward, next_obs, terminated, noise[i], i, lr)
        i = i + 1
    return acc


NONFINITE_LIMIT = 10  # training phases in a row whose every gradient step was non-finite (skipped): stop


class TrainingPhase(nn.Cell):
    """``(items, valid, n_grad, n_target, u, noise, lr, obs_mean, obs_inv_std, obs_clip, act_obs, act_noise)`` ->
    ``(policy output for act_obs, summed statistics of the gradient steps)``, one compiled call."""

    def __init__(self, learner, replay, normalize: bool, batched_targets: bool = False):
        super().__init__(auto_prefix=False)
        self.learner, self.replay, self.normalize = learner, replay, normalize
        self.n_stats = len(learner.STATS)
        self.batched_targets = bool(batched_targets)

    @ms.jit
    def construct(self, items, valid, n_grad, n_target, u, noise, lr, obs_mean, obs_inv_std, obs_clip, act_obs,
                  act_noise):
        acc = add_and_train(self, items, valid, n_grad, n_target, u, noise, lr, obs_mean, obs_inv_std, obs_clip)
        return self.learner.policy(act_obs, act_noise), acc


class NativeCycle(nn.Cell):
    """A whole training phase on a native env (``env.backend: native``) as ONE graph call: ``train_freq`` vector
    steps of observe -> act -> env step -> stage in a graph ``while`` loop, then the replay add and the gradient
    steps of :class:`TrainingPhase`.

    Acting in the graph: ``a = use_random ? rand : policy(obs, act_eps)``, then (Box) ``clip(a + act_noise, -1,
    1)`` mapped to the Box -- what the host loop's exploration computes, with every random input drawn by the
    trainer's Generator beforehand (DQN: ``use_random`` is epsilon's per-env coin, ``rand`` the random actions).
    Returns (statistics, last raw obs); the host reads the staged steps (``obs_raw``, ``rewards``, ``terminated``,
    ``truncated``, ``valid``) for the episode and observation statistics."""

    def __init__(self, learner, replay, env, n_steps: int, normalize: bool, discrete: bool,
                 batched_targets: bool = False):
        super().__init__(auto_prefix=False)
        from ..buffers.device import _param

        self.batched_targets = bool(batched_targets)
        T, N = int(n_steps), env.num_envs
        D = env.single_observation_space.shape[0]
        self.learner, self.replay, self.normalize, self.discrete = learner, replay, normalize, discrete
        self.env_cell, self.dyn = env._step, env._dyn  # the env's own state Parameters
        self.n_steps, self.num_envs, self.n_stats = T, N, len(learner.STATS)
        act_shape = () if discrete else (env.single_action_space.shape[0],)
        if not discrete:
            low = np.asarray(env.single_action_space.low, np.float32)
            high = np.asarray(env.single_action_space.high, np.float32)
            self.low, self.half_range = Tensor(low), Tensor(0.5 * (high - low))
        self.obs_raw = _param((T, N, D), np.float32, "cycle_obs")
        self.next_raw = _param((T, N, D), np.float32, "cycle_next_obs")
        self.actions = _param((T, N) + act_shape, np.int32 if discrete else np.float32, "cycle_actions")
        self.rewards = _param((T, N), np.float32, "cycle_rewards")
        self.terminated = _param((T, N), np.float32, "cycle_terminated")
        self.truncated = _param((T, N), np.float32, "cycle_truncated")
        self.valid = _param((T, N), np.int32, "cycle_valid")

    @ms.jit
    def construct(self, use_random, rand, act_eps, act_noise, reset_noise, n_grad, n_target, u, noise, lr, obs_mean,
                  obs_inv_std, obs_clip):
        env = self.env_cell
        t = ops.zeros((), ms.int32)
        while t < self.n_steps:
            raw = self.dyn.observe(env.state)
            policy = self.learner.policy(normalize_obs(self.normalize, raw, obs_mean, obs_inv_std, obs_clip), act_eps[t])
            if self.discrete:
                a = ops.select(use_random[t] > 0, rand[t], policy)
                env_action = a
            else:
                a = ops.select(ops.broadcast_to(use_random[t].expand_dims(-1), policy.shape) > 0, rand[t], policy)
                a = ops.clip_by_value(a + act_noise[t], -1.0, 1.0)
                env_action = self.low + (a + 1.0) * self.half_range
            valid = ~env.needs_reset
            self.obs_raw[t] = raw  # (stored before the env state is overwritten, as in native_rollout)
            self.actions[t] = a
            self.valid[t] = valid.astype(ms.int32)
            ns, steps, done, reward, terminated, truncated = transition(
                self.dyn, env.state, env.steps, env.needs_reset, env_action, reset_noise[t])
            self.next_raw[t] = self.dyn.observe(ns)
            self.rewards[t] = reward
            self.terminated[t] = terminated.astype(ms.float32)
            self.truncated[t] = truncated.astype(ms.float32)
            ops.assign(env.state, ns)
            ops.assign(env.steps, steps)
            ops.assign(env.needs_reset, done)
            t = t + 1
        T, N = self.n_steps, self.num_envs
        items = (self.obs_raw.reshape((T * N, -1)), self.actions.reshape((T * N,) + self.actions.shape[2:]),
                 self.rewards.reshape((-1,)), self.next_raw.reshape((T * N, -1)), self.terminated.reshape((-1,)))
        acc = add_and_train(self, items, self.valid.reshape((-1,)), n_grad, n_target, u, noise, lr, obs_mean,
                            obs_inv_std, obs_clip)
        return acc, self.dyn.observe(env.state)


class PolicyCall(nn.Cell):
    """``(obs, noise) -> policy output`` (the acting call between phases), or the deterministic action."""

    def __init__(self, learner, deterministic: bool):
        super().__init__(auto_prefix=False)
        self.learner, self.is_deterministic = learner, deterministic

    @ms.jit
    def construct(self, obs, noise):
        if self.is_deterministic:
            return self.learner.deterministic(obs)
        return self.learner.policy(obs, noise)


class DeployActor(nn.Cell):
    """obs -> the env action of the deterministic policy: argmax Q (DQN), or the actor's tanh action mapped to the
    Box bounds (SAC: tanh of the mean; TD3: the actor). What ``export`` writes to MindIR."""

    def __init__(self, learner, spec):
        super().__init__(auto_prefix=False)
        self.learner = learner
        self.discrete = spec.discrete
        if not spec.discrete:
            self.low = Tensor(np.asarray(spec.low, np.float32))
            self.scale = Tensor(0.5 * (np.asarray(spec.high, np.float32) - np.asarray(spec.low, np.float32)))

    def construct(self, obs):
        a = self.learner.deterministic(obs)
        if self.discrete:
            return a
        return self.low + (a + 1.0) * self.scale
