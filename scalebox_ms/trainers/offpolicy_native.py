"""The host side of an off-policy training phase on a native env (``env.backend: native``): draw the phase's random
inputs in a fixed order, make the ONE :class:`~.offpolicy_graph.NativeCycle` call (env steps, replay add, gradient
steps), then the episode and observation statistics from the staged steps. Called by
:meth:`~.offpolicy.OffPolicyTrainer._iteration`."""
from __future__ import annotations

import numpy as np
from mindspore import Tensor

from .collector import returned_observations


def native_phase(trainer):
    """One training phase on a native env: ``train_freq`` vector steps (observe, act, env step, stage) and the
    phase's replay add and gradient steps in ONE graph call (:class:`NativeCycle`); then the host bookkeeping
    (episode statistics, observation statistics, non-finite checks) from the returned arrays."""
    o, c, rng, N = trainer.config.algo_config, trainer.collector, trainer.rng, trainer.num_envs
    T, A = trainer._phase_steps, trainer.spec.action_dim
    steps_before = trainer.global_step
    # the exploration inputs of the T steps, drawn in a fixed order (see NativeCycle)
    use_random = np.zeros((T, N), np.float32)
    for t in range(T):
        use_random[t] = trainer._random_mask(rng, N, steps_before + t * N)
    rand = trainer._random_batch(rng, T * N).reshape((T, N) + (() if trainer.spec.discrete else (A,)))
    act_eps = np.stack([trainer._act_noise_or_zeros(rng, N) for _ in range(T)])
    sigma = getattr(o, "action_noise", None)
    act_noise = (rng.normal(0.0, sigma, (T, N, A)).astype(np.float32) if sigma and not trainer.spec.discrete
                 else np.zeros((T, N, 1), np.float32))
    reset_noise = c.env.rng.random((T, N, c.env._dyn_cls.noise_dim)).astype(np.float32)
    trainer.global_step += T * N
    # the replay rows this phase adds are only known after the call: count the env's valid steps first
    valid_now = c.valid.copy()
    mean, inv_std, clip = trainer._obs_stats()
    trainer._replay_rows = min(trainer._replay_rows + int(valid_now.sum()) + (T - 1) * N, o.buffer_size)  # upper bound
    n_grad, n_target, u, noise = trainer._train_inputs(rng, steps_before)
    out = trainer.native_cycle(Tensor(use_random), Tensor(rand), Tensor(act_eps), Tensor(act_noise),
                            Tensor(reset_noise), Tensor(np.int32(n_grad)), Tensor(np.int32(n_target)), Tensor(u),
                            Tensor(noise), Tensor(np.float32(o.learning_rate)), Tensor(mean), Tensor(inv_std),
                            Tensor(clip))
    acc, last_raw = out[0].asnumpy(), out[1].asnumpy()
    cyc = trainer.native_cycle
    raw_obs, rewards, terminated, truncated, valid = (p.asnumpy() for p in (
        cyc.obs_raw, cyc.rewards, cyc.terminated, cyc.truncated, cyc.valid))
    trainer._replay_rows = len(trainer.replay)
    rewards = rewards.astype(np.float64)
    if not (np.isfinite(raw_obs).all() and np.isfinite(rewards).all()):
        for t in range(T):
            c._check_finite(raw_obs[t], rewards[t], steps_before + t * N)
    c._check_finite(last_raw, None, trainer.global_step)
    valid = valid.astype(bool)
    for t in range(T):
        c._account_step(rewards[t], (terminated[t] > 0) | (truncated[t] > 0), valid[t])
    if c.obs_normalizer is not None:  # (each observation the phase's steps returned, once)
        c.obs_normalizer.rms.update(returned_observations(raw_obs, last_raw, trainer.spec.obs_dim))
    c.raw_obs = last_raw
    c.obs = c.normalize_obs(last_raw, update=False)
    c.valid = ~((terminated[-1] > 0) | (truncated[-1] > 0))
    trainer._pending = None
    trainer._after_phase()
    return acc, n_grad
