"""MLP actor-critic ``nn.Cell`` for Box observations and Discrete or Box actions.

Separate policy and value MLPs (SB3's ``MlpPolicy`` layout for PPO), orthogonal initialisation with gains
sqrt(2) for hidden layers, 0.01 for the policy head and 1 for the value head. Continuous actions use a diagonal
Gaussian with a state-independent ``log_std`` Parameter.

The Cell's methods are plain graph code. The compiled entry points are the small wrapper Cells at the bottom
(:class:`ActStep`, :class:`ValueStep`, :class:`DeterministicStep`), each one ``@ms.jit`` graph, which users
can also embed in their own MindSpore code.
"""
from __future__ import annotations

import math
from typing import List, Optional

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn, ops
from mindspore.common.initializer import Orthogonal, Zero, initializer

from ..envs.spaces import SpaceSpec  # noqa: F401  (re-exported)
from ..ops import distributions as D


_ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU}


def mlp(in_dim: int, hidden: List[int], out_dim: int, activation: str, ortho: bool, out_gain: float) -> nn.SequentialCell:
    layers = []
    dims = [in_dim] + list(hidden)
    for a, b in zip(dims[:-1], dims[1:]):
        layers += [_dense(a, b, math.sqrt(2.0) if ortho else None), _ACTIVATIONS[activation]()]
    layers.append(_dense(dims[-1], out_dim, out_gain if ortho else None))
    return nn.SequentialCell(layers)


def _dense(a: int, b: int, gain: Optional[float]) -> nn.Dense:
    if gain is None:  # MindSpore's default initialisation
        return nn.Dense(a, b)
    return nn.Dense(a, b, weight_init=initializer(Orthogonal(gain=gain), [b, a], ms.float32),
                    bias_init=initializer(Zero(), [b], ms.float32))


class ActorCritic(nn.Cell):
    """Policy pi(a|s) and value V(s) networks.

    Args:
        spec: observation/action space description.
        pi_layers, vf_layers: hidden sizes of the policy and value MLPs.
        activation: 'tanh' or 'relu'.
        ortho_init: orthogonal initialisation (else MindSpore's default).
        log_std_init: initial log standard deviation (continuous actions only).
    """

    def __init__(self, spec: SpaceSpec, pi_layers=(64, 64), vf_layers=(64, 64), activation: str = "tanh",
                 ortho_init: bool = True, log_std_init: float = 0.0):
        super().__init__()
        self.spec = spec
        self.discrete = spec.discrete
        self.pi_net = mlp(spec.obs_dim, list(pi_layers), spec.action_dim, activation, ortho_init, 0.01)
        self.vf_net = mlp(spec.obs_dim, list(vf_layers), 1, activation, ortho_init, 1.0)
        if not self.discrete:
            self.log_std = Parameter(Tensor(np.full(spec.action_dim, log_std_init, np.float32)), name="log_std")
            self.low = Tensor(np.asarray(spec.low, np.float32))
            self.high = Tensor(np.asarray(spec.high, np.float32))

    # -- graph building blocks ------------------------------------------------------------------
    def value(self, obs):
        return self.vf_net(obs).squeeze(-1)

    def act(self, obs, noise):
        """Sample actions with externally drawn noise; return (action, log_prob, value)."""
        out = self.pi_net(obs)
        if self.discrete:
            action = D.categorical_sample(out, noise)
            log_prob = D.categorical_log_prob(out, action)
        else:
            action = D.gaussian_sample(out, self.log_std, noise)
            log_prob = D.gaussian_log_prob(out, self.log_std, action)
        return action, log_prob, self.value(obs)

    def evaluate_actions(self, obs, actions):
        """Return (log_prob, entropy, value) of given actions: the quantities of the PPO loss."""
        out = self.pi_net(obs)
        if self.discrete:
            log_prob = D.categorical_log_prob(out, actions)
            entropy = D.categorical_entropy(out)
        else:
            log_prob = D.gaussian_log_prob(out, self.log_std, actions)
            entropy = D.gaussian_entropy(self.log_std, out)
        return log_prob, entropy, self.value(obs)

    def deterministic_action(self, obs):
        """argmax for Categorical; the mean clipped to the Box bounds for Gaussian."""
        out = self.pi_net(obs)
        if self.discrete:
            return ops.argmax(out, -1).astype(ms.int32)
        return ops.clip_by_value(out, self.low, self.high)

    def construct(self, obs):
        return self.deterministic_action(obs)


class ActStep(nn.Cell):
    """Compiled acting call: (obs batch, noise) -> (action, log_prob, value) for all envs at once.

    With ``packed=True`` it returns one float32 (B, action_width + 2) Tensor ``[action | log_prob | value]``
    instead, so the trainer's rollout loop copies one buffer back per step rather than three.
    """

    def __init__(self, model: ActorCritic, packed: bool = False):
        super().__init__(auto_prefix=False)
        self.model = model
        self.packed = packed

    @ms.jit
    def construct(self, obs, noise):
        action, log_prob, value = self.model.act(obs, noise)
        if self.packed:
            if self.model.discrete:
                action = action.astype(ms.float32).expand_dims(-1)
            return ops.concat([action, log_prob.expand_dims(-1), value.expand_dims(-1)], -1)
        return action, log_prob, value


class ValueStep(nn.Cell):
    """Compiled V(s) for the bootstrap value at the end of a rollout."""

    def __init__(self, model: ActorCritic):
        super().__init__(auto_prefix=False)
        self.model = model

    @ms.jit
    def construct(self, obs):
        return self.model.value(obs)


class DeterministicStep(nn.Cell):
    """Compiled deterministic policy: obs -> action (used by predict and evaluation)."""

    def __init__(self, model: ActorCritic):
        super().__init__(auto_prefix=False)
        self.model = model

    @ms.jit
    def construct(self, obs):
        return self.model.deterministic_action(obs)


def build_model(spec: SpaceSpec, policy_cfg) -> ActorCritic:
    return ActorCritic(spec, pi_layers=policy_cfg.pi_layers, vf_layers=policy_cfg.vf_layers,
                       activation=policy_cfg.activation, ortho_init=policy_cfg.ortho_init,
                       log_std_init=policy_cfg.log_std_init)
