"""SAC (Haarnoja et al. 2018, with the learned temperature of the 2019 version) as SB3 runs it.

All of SAC's maths is here, as graph code run inside the off-policy core's compiled training phase
(:mod:`.offpolicy`). One gradient step on a batch (s, a, r, s', d) -- d is *terminated* only --, with a~ ~ pi(.|s)
and a' ~ pi(.|s') reparameterised samples of the tanh-squashed Gaussian actor::

    alpha      = exp(log_alpha)                                   (before its own update)
    J(alpha)   = -mean(log_alpha * (log pi(a~|s) + H_target))      temperature step (ent_coef 'auto')
    y          = r + gamma * (1 - d) * (min_k Q_target_k(s', a') - alpha * log pi(a'|s'))
    J(Q)       = 0.5 * sum_k mean((Q_k(s, a) - y)^2)               critic step
    J(pi)      = mean(alpha * log pi(a~|s) - min_k Q_k(s, a~))      actor step (with the updated critics)
    Q_target  <- (1 - tau) Q_target + tau Q                         every target_update_interval steps

Each of the three has its own Adam (same learning rate). The temperature step is the same as SB3's, which makes it
first: it reads log pi(a~|s) of the actor loss's forward pass (the actor before its update, so the same numbers)
and runs after the actor step, saving one actor forward pass; nothing before it reads the updated temperature.
The standard-normal noise of both samples is drawn by the trainer's seeded Generator and passed in, so runs are
reproducible and resumable bit for bit. Each of the three updates is skipped (weights untouched, see
:func:`~scalebox_ms.models.offpolicy.guarded_update`) when its loss or gradients are not finite
(``nonfinite_updates`` counts steps whose critic or actor update was skipped). Actions are in [-1, 1]; the
trainer maps them to the Box.
"""
from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn, ops

from ..config_offpolicy import entropy_coefficient
from ..models.offpolicy import (AdamGroup, CellChain, Learner, SquashedGaussianActor, TwinCritic, cnn_kwargs,
                                guarded_update, polyak)
from .offpolicy import OffPolicyTrainer


class _TemperatureLoss(nn.Cell):
    def __init__(self, log_alpha):
        super().__init__(auto_prefix=False)
        self.log_alpha = log_alpha

    def construct(self, log_prob_plus_target, scale):
        loss = -(self.log_alpha * log_prob_plus_target).mean()
        return loss * scale, loss


class _CriticLoss(nn.Cell):
    def __init__(self, critic):
        super().__init__(auto_prefix=False)
        self.critic = critic

    def construct(self, obs, action, y, scale):
        q = self.critic(obs, action)  # (2, B): both critics
        loss = ((q - y) ** 2).mean()  # = 0.5 * sum_k mean_k
        return loss * scale, loss, q[0].mean()


class _ActorLoss(nn.Cell):
    def __init__(self, actor, critic):
        super().__init__(auto_prefix=False)
        self.actor, self.critic = actor, critic

    def construct(self, obs, eps, alpha, scale):
        action, log_prob = self.actor.action_log_prob(obs, eps)
        loss = (alpha * log_prob - self.critic(obs, action).min(0)).mean()
        return loss * scale, loss, log_prob


class SACLearner(Learner):
    STATS = ("critic_loss", "actor_loss", "ent_coef", "ent_coef_loss", "q_values", "entropy", "nonfinite")

    def __init__(self, spec, policy_cfg, cfg, amp=None):
        super().__init__()
        A = spec.action_dim
        common = (policy_cfg.activation, policy_cfg.ortho_init, cnn_kwargs(spec, policy_cfg))  # (images: CNNs)
        self.actor = SquashedGaussianActor(spec.obs_dim, A, policy_cfg.pi_layers, *common)
        self.critic = TwinCritic(spec.obs_dim, A, policy_cfg.vf_layers, *common)
        self.critic_target = TwinCritic(spec.obs_dim, A, policy_cfg.vf_layers, *common)
        for t, s in zip(self.critic_target.get_parameters(), self.critic.get_parameters()):
            t.set_data(s.data.copy())
            t.requires_grad = False
        self.target_params = ms.ParameterTuple(list(self.critic_target.get_parameters()))
        self.online_params = ms.ParameterTuple(list(self.critic.get_parameters()))
        self.learn_alpha, init = entropy_coefficient(cfg.ent_coef)
        self.log_alpha = Parameter(Tensor(np.log(np.float32(init)).reshape(1)), name="log_ent_coef",
                                   requires_grad=self.learn_alpha)
        self.target_entropy = float(-A if cfg.target_entropy == "auto" else cfg.target_entropy)
        self.gamma, self.tau = float(cfg.gamma), float(cfg.tau)
        self.target_every = int(cfg.target_update_interval)
        if amp is not None:
            self.use_amp(amp, [self.actor, self.critic, self.critic_target])
        self.actor_optimizer = AdamGroup(self.actor.trainable_params(), "actor_optimizer", cfg.adam_eps)
        self.critic_optimizer = AdamGroup(self.critic.trainable_params(), "critic_optimizer", cfg.adam_eps)
        self.critic_grad = ms.value_and_grad(_CriticLoss(self.critic), None, self.critic_optimizer.params,
                                             has_aux=True)
        self.actor_grad = ms.value_and_grad(_ActorLoss(self.actor, self.critic), None, self.actor_optimizer.params,
                                            has_aux=True)
        if self.learn_alpha:
            self.alpha_optimizer = AdamGroup([self.log_alpha], "ent_coef_optimizer", cfg.adam_eps)
            self.alpha_grad = ms.value_and_grad(_TemperatureLoss(self.log_alpha), None,
                                                self.alpha_optimizer.params, has_aux=True)

    def before_phase(self, n_target):
        return n_target

    def train_step(self, obs, action, reward, next_obs, terminated, noise, i, lr):
        eps_pi, eps_next = noise[0], noise[1]
        alpha = ops.exp(self.log_alpha)[0]  # (the temperature before its update is used throughout the step)
        scale, inv_scale = self.scale(), self.inv_scale()  # (AMP loss scale; 1 and None in float32)
        next_action, next_log_prob = self.actor.action_log_prob(next_obs, eps_next)
        next_q = self.critic_target(next_obs, next_action).min(0)
        y = ops.stop_gradient(reward + self.gamma * (1.0 - terminated) * (next_q - alpha * next_log_prob))
        (_, critic_loss, q_mean), critic_grads = self.critic_grad(obs, action, y, scale)
        critic_ok = guarded_update(self.critic_optimizer, critic_grads, critic_loss, lr, None, inv_scale)
        (_, actor_loss, log_prob), actor_grads = self.actor_grad(obs, eps_pi, alpha, scale)
        actor_ok = guarded_update(self.actor_optimizer, actor_grads, actor_loss, lr, None, inv_scale)
        # J(alpha) last: it reads log pi(a~|s) of the actor loss's forward pass (the actor before its update, the
        # same numbers as a separate forward pass at the start, which SB3 makes) and changes nothing used above
        log_prob = ops.stop_gradient(log_prob)
        mean_log_prob = log_prob.mean()
        alpha_loss = ops.zeros((), ms.float32)
        alpha_ok = ops.ones((), ms.bool_)
        if self.learn_alpha:  # (static)
            (_, alpha_loss), alpha_grads = self.alpha_grad(log_prob + self.target_entropy, scale)
            alpha_ok = guarded_update(self.alpha_optimizer, alpha_grads, alpha_loss, lr, None, inv_scale)
        self.end_step(ops.logical_and(alpha_ok, ops.logical_and(critic_ok, actor_ok)))
        if self.target_every == 1:  # (static: no graph branch in the common case)
            polyak(self.target_params, self.online_params, self.tau, self.polyak_kernel)
        elif i % self.target_every == 0:
            polyak(self.target_params, self.online_params, self.tau, self.polyak_kernel)
        bad = self.nonfinite(ops.logical_and(critic_ok, actor_ok), (critic_loss, actor_loss))
        return ops.stack([critic_loss, actor_loss, alpha, alpha_loss, q_mean, -mean_log_prob, bad])

    @property
    def features(self):
        """The actor's NatureCNN (image observations) or None: what INT8 export quantizes before the MLP."""
        return self.actor.features

    def policy(self, obs, noise):
        """A sampled action in [-1, 1] for standard-normal ``noise``."""
        return self.actor.action_log_prob(obs, noise)[0]

    def policy_mlp(self):
        """The deterministic action's MLP: the trunk and the mean head (tanh applied after)."""
        return CellChain(list(self.actor.latent_pi.cells()) + [self.actor.mu]), "tanh"

    def deterministic(self, obs):
        return self.actor(obs)


class SACTrainer(OffPolicyTrainer):
    """SAC on a Box action space. See :class:`~.offpolicy.OffPolicyTrainer` for the API."""

    algo = "sac"
    learner_class = SACLearner

    def load(self, path: str, replay: bool = True):
        """As the other trainers' (restore everything from a checkpoint); a fixed ``sac.ent_coef`` (a number) stays
        this trainer's: fine-tuning a checkpoint with another temperature trained on with the checkpoint's."""
        out = super().load(path, replay=replay)
        learner = self.learner
        if not learner.learn_alpha:
            want = np.log(np.float32(entropy_coefficient(self.config.sac.ent_coef)[1])).reshape(1)
            had = learner.log_alpha.asnumpy()
            if not np.array_equal(had, want):
                from ..ops import AssignParameters

                AssignParameters([learner.log_alpha]).write([ms.Tensor(want)])
                self._weights_changed()
                self.log.info(f"sac.ent_coef: {self.config.sac.ent_coef} (this trainer's config; the checkpoint "
                              f"trained with {float(np.exp(had[0])):.6g})")
        return out

    def _train_noise(self, rng, steps, batch):
        return rng.standard_normal((steps, 2, batch, self.spec.action_dim)).astype(np.float32)

    def _act_noise(self, rng, n):
        return rng.standard_normal((n, self.spec.action_dim)).astype(np.float32)
