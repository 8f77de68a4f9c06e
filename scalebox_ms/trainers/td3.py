"""TD3 (Fujimoto et al. 2018) as SB3 runs it: clipped double-Q, delayed actor updates, target policy smoothing.

All of TD3's maths is here, as graph code run inside the off-policy core's compiled training phase
(:mod:`.offpolicy`). One gradient step on a batch (s, a, r, s', d) -- d is *terminated* only --, with
eps ~ N(0, 1) drawn by the trainer's seeded Generator::

    a'      = clip(mu_target(s') + clip(target_policy_noise * eps, -target_noise_clip, target_noise_clip), -1, 1)
    y       = r + gamma * (1 - d) * min_k Q_target_k(s', a')
    J(Q)    = sum_k mean((Q_k(s, a) - y)^2)                             critic step
    every policy_delay-th update (counted over the whole run):
      J(mu) = -mean(Q_1(s, mu(s)))                                      actor step
      Q_target <- (1 - tau) Q_target + tau Q;  mu_target likewise

Exploration adds Gaussian noise of std ``action_noise`` to mu(s) in [-1, 1] space (clipped), on the host.
"""
from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn, ops

from ..models.offpolicy import AdamGroup, DeterministicActor, Learner, TwinCritic, cnn_kwargs, guarded_update, polyak
from .offpolicy import OffPolicyTrainer


class _CriticLoss(nn.Cell):
    def __init__(self, critic):
        super().__init__(auto_prefix=False)
        self.critic = critic

    def construct(self, obs, action, y, scale):
        q = self.critic(obs, action)  # (2, B): both critics
        loss = 2.0 * ((q - y) ** 2).mean()  # = sum_k mean_k
        return loss * scale, loss, q[0].mean()


class _ActorLoss(nn.Cell):
    def __init__(self, actor, critic):
        super().__init__(auto_prefix=False)
        self.actor, self.critic = actor, critic

    def construct(self, obs, scale):
        loss = -self.critic.first(obs, self.actor(obs)).mean()
        return loss * scale, loss


def _target_copy(target, source):
    for t, s in zip(target.get_parameters(), source.get_parameters()):
        t.set_data(s.data.copy())
        t.requires_grad = False


class TD3Learner(Learner):
    STATS = ("critic_loss", "actor_loss", "q_values", "actor_updates", "nonfinite")

    def __init__(self, spec, policy_cfg, cfg, amp=None):
        super().__init__()
        A = spec.action_dim
        common = (policy_cfg.activation, policy_cfg.ortho_init, cnn_kwargs(spec, policy_cfg))  # (images: CNNs)
        self.actor = DeterministicActor(spec.obs_dim, A, policy_cfg.pi_layers, *common)
        self.actor_target = DeterministicActor(spec.obs_dim, A, policy_cfg.pi_layers, *common)
        self.critic = TwinCritic(spec.obs_dim, A, policy_cfg.vf_layers, *common)
        self.critic_target = TwinCritic(spec.obs_dim, A, policy_cfg.vf_layers, *common)
        _target_copy(self.actor_target, self.actor)
        _target_copy(self.critic_target, self.critic)
        self.target_params = ms.ParameterTuple(list(self.critic_target.get_parameters())
                                               + list(self.actor_target.get_parameters()))
        self.online_params = ms.ParameterTuple(list(self.critic.get_parameters()) + list(self.actor.get_parameters()))
        self.n_updates = Parameter(Tensor(0, ms.int32), name="n_updates", requires_grad=False)
        self.gamma, self.tau = float(cfg.gamma), float(cfg.tau)
        self.policy_delay = int(cfg.policy_delay)
        self.noise_std, self.noise_clip = float(cfg.target_policy_noise), float(cfg.target_noise_clip)
        self.actor_optimizer = AdamGroup(self.actor.trainable_params(), "actor_optimizer", cfg.adam_eps)
        self.critic_optimizer = AdamGroup(self.critic.trainable_params(), "critic_optimizer", cfg.adam_eps)
        self.critic_grad = ms.value_and_grad(_CriticLoss(self.critic), None, self.critic_optimizer.params,
                                             has_aux=True)
        self.actor_grad = ms.value_and_grad(_ActorLoss(self.actor, self.critic), None, self.actor_optimizer.params,
                                            has_aux=True)
        if amp is not None:
            self.use_amp(amp, [self.actor, self.actor_target, self.critic, self.critic_target])

    def before_phase(self, n_target):
        return n_target

    def train_step(self, obs, action, reward, next_obs, terminated, noise, i, lr):
        n = self.n_updates + 1
        ops.assign(self.n_updates, n)
        smoothing = ops.clip_by_value(noise * self.noise_std, -self.noise_clip, self.noise_clip)
        next_action = ops.clip_by_value(self.actor_target(next_obs) + smoothing, -1.0, 1.0)
        next_q = self.critic_target(next_obs, next_action).min(0)
        y = ops.stop_gradient(reward + self.gamma * (1.0 - terminated) * next_q)
        scale, inv_scale = self.scale(), self.inv_scale()  # (AMP loss scale; 1 and None in float32)
        (_, critic_loss, q_mean), critic_grads = self.critic_grad(obs, action, y, scale)
        ok = guarded_update(self.critic_optimizer, critic_grads, critic_loss, lr, None, inv_scale)
        actor_ok = ops.ones((), ms.bool_)
        actor_loss = ops.zeros((), ms.float32)
        delayed = n % self.policy_delay == 0
        if delayed:
            (_, actor_loss), actor_grads = self.actor_grad(obs, scale)
            actor_ok = guarded_update(self.actor_optimizer, actor_grads, actor_loss, lr, None, inv_scale)
            polyak(self.target_params, self.online_params, self.tau, self.polyak_kernel)
        self.end_step(ops.logical_and(ok, actor_ok))
        return ops.stack([critic_loss, actor_loss, q_mean, delayed.astype(ms.float32),
                          self.nonfinite(ok, (critic_loss,))])

    @property
    def features(self):
        """The actor's NatureCNN (image observations) or None: what INT8 export quantizes before the MLP."""
        return self.actor.features

    def policy(self, obs, noise):
        return self.actor(obs)

    def policy_mlp(self):
        return self.actor.mu, "tanh"

    def deterministic(self, obs):
        return self.actor(obs)


class TD3Trainer(OffPolicyTrainer):
    """TD3 on a Box action space. See :class:`~.offpolicy.OffPolicyTrainer` for the API."""

    algo = "td3"
    learner_class = TD3Learner

    def _train_noise(self, rng, steps, batch):
        return rng.standard_normal((steps, batch, self.spec.action_dim)).astype(np.float32)
