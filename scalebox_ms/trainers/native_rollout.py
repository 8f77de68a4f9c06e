"""Compiled rollout for native envs: T vector steps of (observe -> act -> env step -> store) in ONE graph call.

With ``env.backend: native`` the env's state already lives in MindSpore Parameters, so the whole rollout can
stay on the device: a graph ``while`` loop over a Tensor counter (its compile time does not grow with T)
writes each step into a device-resident :class:`~scalebox_ms.buffers.RolloutBuffer` by Tensor index (slice assignment of a
Parameter inside a graph is silently dropped on MindSpore 2.10, see docs/design.md). The trainer then copies the
buffers to the host once per iteration for GAE and the update. Python->graph calls per iteration drop from
T + 1 to 1 (plus the update calls).

Noise (Gumbel/normal action noise, reset noise) is drawn by the trainer's and the env's numpy Generators for
all T steps at once, in the same order the step-by-step loop draws it, so both paths produce the same rollout
(tested). Observation normalisation uses the statistics frozen at the start of the rollout; the trainer updates
them afterwards with all T*N observations (SB3 updates them every step: a small, documented difference).

The acting call inside the loop follows ``policy.act_kernel`` as resolved for the trainer's acting step: MindSpore
ops (``model.act``, ~20 kernels per step), or the C++ fused-MLP kernel (:class:`~scalebox_ms.ops.custom.FusedActorKernel`,
one kernel per step; the same noise, the same results to float tolerance).
"""
from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn, ops

from ..buffers.device import RolloutBuffer
from ..envs.native.vector import transition
from ..ops.clip import normalize_obs


def _buffer(shape, dtype, name):
    return Parameter(Tensor(np.zeros(shape, dtype)), name=name, requires_grad=False)


class CompiledRollout(nn.Cell):
    """``rollout(act_noise (T,N,A), reset_noise (T,N,k), obs_mean, obs_inv_std, obs_clip)`` fills the buffers and
    returns (last raw obs, V(last normalised obs))."""

    def __init__(self, model, env, n_steps: int, normalize: bool, act_kernel: str = "builtin"):
        super().__init__(auto_prefix=False)
        T, N = int(n_steps), env.num_envs
        spec = model.spec
        self.model = model
        self.env_cell = env._step  # shares the env's state Parameters: checkpoints and the Python API see them
        self.dyn = env._dyn
        self.n_steps = T
        self.normalize = normalize
        self.discrete = spec.discrete
        if not spec.discrete:  # the env gets actions clipped to the Box, the buffer keeps the sample (as _collect)
            self.low = Tensor(np.asarray(spec.low, np.float32))
            self.high = Tensor(np.asarray(spec.high, np.float32))
        self.buffer = RolloutBuffer(T, N, spec.obs_dim, () if spec.discrete else (spec.action_dim,), spec.discrete)
        self.obs_raw = _buffer((T, N, spec.obs_dim), np.float32, "rollout_obs_raw")  # for the obs statistics
        self.act_kernel = act_kernel
        self.custom = act_kernel == "custom"
        if self.custom:  # (raises CustomOpError where it cannot run; the trainer's ActStep already built it)
            from ..ops.custom import FusedActorKernel

            self.fused = FusedActorKernel(model)
            self.width = self.fused.width

    def act(self, obs, noise):
        """(action, log_prob, value) for the env batch: ``model.act``, or the fused C++ kernel's packed output."""
        if self.custom:
            return self.fused.unpack(self.fused(obs, noise))
        return self.model.act(obs, noise)

    @ms.jit
    def construct(self, act_noise, reset_noise, obs_mean, obs_inv_std, obs_clip):
        env = self.env_cell
        t = Tensor(0, ms.int32)
        while t < self.n_steps:
            raw = self.dyn.observe(env.state)
            obs = normalize_obs(self.normalize, raw, obs_mean, obs_inv_std, obs_clip)
            action, log_prob, value = self.act(obs, act_noise[t])
            valid = ~env.needs_reset
            # store what was observed BEFORE the env state is overwritten: measured on MindSpore 2.10, a value
            # read from a Parameter may otherwise be materialised after a later assign to that Parameter
            self.obs_raw[t] = raw
            self.buffer.store_observation(t, obs, action, log_prob, value, valid)
            env_action = action if self.discrete else ops.clip_by_value(action, self.low, self.high)
            ns, steps, done, reward, terminated, truncated = transition(
                self.dyn, env.state, env.steps, env.needs_reset, env_action, reset_noise[t])
            self.buffer.store_outcome(t, reward, terminated, truncated)
            ops.assign(env.state, ns)
            ops.assign(env.steps, steps)
            ops.assign(env.needs_reset, done)
            t = t + 1
        raw = self.dyn.observe(env.state)
        return raw, self.model.value(normalize_obs(self.normalize, raw, obs_mean, obs_inv_std, obs_clip))
