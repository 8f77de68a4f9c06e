"""NativeVectorEnv: a batch of classic-control envs whose state lives in MindSpore Parameters and whose step is
one compiled graph (dynamics, time limit, NEXT_STEP autoreset).

The Python API matches gymnasium 1.x vector envs in ``AutoresetMode.NEXT_STEP`` (what PPOTrainer expects), so
``env.backend: native`` swaps it in without other changes. Reset noise is drawn by a numpy Generator seeded in
``reset(seed)`` and passed into the graph (MindSpore 2.10's in-graph random ops are unreliable on CPU, see
docs/design.md); the env pickles to plain arrays, so checkpoints resume it mid-episode.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
from mindspore import ops


def transition(dyn, state, steps, needs_reset, action, reset_noise):
    """One vector step as graph ops: dynamics, gymnasium's TimeLimit, NEXT_STEP autoreset.

    Returns (next_state, next_steps, next_needs_reset, reward, terminated, truncated). Sub-envs whose episode
    ended on the previous step (``needs_reset``) reset now from ``reset_noise``, with reward 0 and both flags
    False. Used by :class:`NativeVectorEnv`'s step graph and by the compiled rollout.
    """
    ns, reward, terminated = dyn.step(state, action)
    steps = steps + 1
    truncated = steps >= dyn.max_steps  # gymnasium's TimeLimit (also when terminated)
    r = needs_reset
    ns = ops.where(r.expand_dims(-1), dyn.initial_state(reset_noise), ns)
    reward = ops.where(r, ops.zeros_like(reward), reward)
    terminated = terminated & ~r
    truncated = truncated & ~r
    steps = ops.where(r, ops.zeros_like(steps), steps)
    return ns, steps, terminated | truncated, reward, terminated, truncated


def _build(dynamics, num_envs: int):
    import mindspore as ms
    from mindspore import Parameter, Tensor, nn, ops

    dyn = dynamics()

    class NativeStep(nn.Cell):
        def __init__(self):
            super().__init__()
            self.state = Parameter(Tensor(np.zeros((num_envs, dyn.state_dim), np.float32)), name="state",
                                   requires_grad=False)
            self.steps = Parameter(Tensor(np.zeros(num_envs, np.int32)), name="steps", requires_grad=False)
            self.needs_reset = Parameter(Tensor(np.zeros(num_envs, np.bool_)), name="needs_reset", requires_grad=False)
            self.max_steps = dyn.max_steps

        @ms.jit
        def construct(self, action, reset_noise):
            ns, steps, done, reward, terminated, truncated = transition(
                dyn, self.state, self.steps, self.needs_reset, action, reset_noise)
            ops.assign(self.state, ns)
            ops.assign(self.steps, steps)
            ops.assign(self.needs_reset, done)
            return dyn.observe(ns), reward, terminated, truncated

    class NativeReset(nn.Cell):
        def __init__(self, step_cell):
            super().__init__(auto_prefix=False)
            self.cell = step_cell

        @ms.jit
        def construct(self, state, steps, needs_reset):
            ops.assign(self.cell.state, state)
            ops.assign(self.cell.steps, steps)
            ops.assign(self.cell.needs_reset, needs_reset)
            return dyn.observe(state)

    step = NativeStep()
    return dyn, step, NativeReset(step)


class NativeVectorEnv:
    """``num_envs`` copies of a classic-control env stepped by one compiled MindSpore graph per vector step."""

    def __init__(self, env_id: str, num_envs: int):
        import gymnasium as gym
        from gymnasium.vector import AutoresetMode
        from gymnasium.vector.utils import batch_space

        from .dynamics import DYNAMICS

        self.env_id, self.num_envs = env_id, int(num_envs)
        self._dyn_cls = DYNAMICS[env_id]
        probe = gym.make(env_id)  # spaces exactly as gymnasium defines them
        self.single_observation_space = probe.observation_space
        self.single_action_space = probe.action_space
        probe.close()
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self.metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP}
        self.discrete = hasattr(self.single_action_space, "n")
        self.rng = np.random.default_rng()
        self._dyn, self._step, self._reset = _build(self._dyn_cls, self.num_envs)

    # -- gymnasium vector API -------------------------------------------------------------------
    def reset(self, seed: Optional[int] = None, options=None):
        import mindspore as ms

        if seed is not None:
            self.rng = np.random.default_rng(np.random.SeedSequence(int(seed)))
        noise = self.rng.random((self.num_envs, self._dyn_cls.noise_dim)).astype(np.float32)
        state = self._dyn.initial_state(ms.Tensor(noise)).asnumpy()
        return self.set_state(state), {}

    def step(self, actions):
        import mindspore as ms

        actions = np.asarray(actions)
        a = actions.astype(np.int32) if self.discrete else actions.astype(np.float32).reshape(self.num_envs, -1)
        noise = self.rng.random((self.num_envs, self._dyn_cls.noise_dim)).astype(np.float32)
        obs, reward, terminated, truncated = self._step(ms.Tensor(a), ms.Tensor(noise))
        return (obs.asnumpy(), reward.asnumpy().astype(np.float64), terminated.asnumpy(), truncated.asnumpy(), {})

    def close(self) -> None:
        return None

    # -- state access (teacher forcing, checkpoints) ---------------------------------------------
    def set_state(self, state: np.ndarray, steps: Optional[np.ndarray] = None) -> np.ndarray:
        """Set every sub-env's physical state (and elapsed steps); returns the observations."""
        import mindspore as ms

        state = np.asarray(state, np.float32).reshape(self.num_envs, self._dyn_cls.state_dim)
        steps = np.zeros(self.num_envs, np.int32) if steps is None else np.asarray(steps, np.int32)
        obs = self._reset(ms.Tensor(state), ms.Tensor(steps), ms.Tensor(np.zeros(self.num_envs, np.bool_)))
        return obs.asnumpy()

    @property
    def state(self) -> np.ndarray:
        return self._step.state.asnumpy().copy()

    def take_state(self, other: "NativeVectorEnv") -> None:
        """Continue ``other``'s episodes (same env id and size; e.g. one unpickled from a checkpoint) in this env's
        own Parameters and generator, so graphs compiled against them (PPO's compiled rollout, the off-policy
        training cycle) go on stepping the restored episodes."""
        import mindspore as ms

        if (other.env_id, other.num_envs) != (self.env_id, self.num_envs):
            raise ValueError(f"take_state: {other.env_id} x {other.num_envs} into {self.env_id} x {self.num_envs}")
        self.rng.bit_generator.state = other.rng.bit_generator.state
        self._reset(ms.Tensor(other._step.state.asnumpy()), ms.Tensor(other._step.steps.asnumpy()),
                    ms.Tensor(other._step.needs_reset.asnumpy()))

    def __getstate__(self):
        return {"env_id": self.env_id, "num_envs": self.num_envs, "rng": self.rng.bit_generator.state,
                "state": self._step.state.asnumpy(), "steps": self._step.steps.asnumpy(),
                "needs_reset": self._step.needs_reset.asnumpy()}

    def __setstate__(self, d):
        import mindspore as ms

        self.__init__(d["env_id"], d["num_envs"])
        self.rng.bit_generator.state = d["rng"]
        self._reset(ms.Tensor(d["state"]), ms.Tensor(d["steps"]), ms.Tensor(d["needs_reset"]))
