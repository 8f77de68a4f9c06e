"""The host side of one off-policy training phase: ``train_freq`` vector-env steps of acting (uniformly random
before ``learning_starts``, else the policy with exploration), stepping and episode accounting, their transitions
gathered for the phase's replay add (the true final observation of a truncated episode as ``next_obs``: the
collector steps the env with autoreset after it)."""
from __future__ import annotations

import numpy as np

from ..envs.isolated import restarted


def collect_phase(trainer, rng, clock):
    """``((obs, action, reward, next_obs, terminated, valid), acting seconds, env seconds)`` of one phase of
    ``trainer`` (an :class:`~.offpolicy.OffPolicyTrainer`), each array ``(train_freq, num_envs, ...)``; advances
    ``trainer.global_step`` and the collector's observations."""
    c, o, N, T = trainer.collector, trainer.config.algo_config, trainer.num_envs, trainer._phase_steps
    obs_shape, obs_dtype = trainer.spec.obs_shape, (np.uint8 if trainer.spec.image else np.float32)
    act_shape, act_dtype = trainer._replay_action_spec()
    obs_b = np.zeros((T, N) + obs_shape, obs_dtype)
    next_b = np.zeros((T, N) + obs_shape, obs_dtype)
    act_b = np.zeros((T, N) + act_shape, act_dtype)
    rew_b = np.zeros((T, N), np.float32)
    term_b = np.zeros((T, N), np.float32)
    valid_b = np.zeros((T, N), np.int32)
    t_act = t_env = 0.0
    for t in range(T):
        t0 = clock()
        if trainer.global_step < o.learning_starts:
            trainer._pending = None
            buf_a, env_a = trainer._random_actions(rng, N)
        else:
            buf_a, env_a = trainer._explore(trainer._policy, rng, N)
        t1 = clock()
        raw, reward, terminated, truncated, info = c.step_env(env_a, trainer.global_step)
        t_env += clock() - t1
        t_act += t1 - t0
        c._check_finite(raw, reward, trainer.global_step)
        valid = c.valid
        reward = np.asarray(reward, np.float64)
        terminated = np.asarray(terminated, bool) & valid
        done = terminated | (np.asarray(truncated, bool) & valid)
        cut = restarted(c.env, N)  # (a restarted env worker's step is no transition: not stored)
        valid = valid & ~cut
        c._account_step(reward, done, valid, info, cut)
        obs_b[t], next_b[t], act_b[t] = c.raw_obs, raw, buf_a
        rew_b[t], term_b[t], valid_b[t] = reward, terminated, valid
        c.raw_obs = raw
        c.obs = c.normalize_obs(raw, update=True, rows=~cut if cut.any() else None)  # (a restart's: no new obs)
        c.valid = ~done
        trainer.global_step += N
    return (obs_b, act_b, rew_b, next_b, term_b, valid_b), t_act, t_env
