"""The PPO objective and the compiled update step -- all of PPO's maths in one place.

Notation follows Schulman et al. (2017), "Proximal Policy Optimization Algorithms":

    r_t(theta)  = pi_theta(a_t|s_t) / pi_theta_old(a_t|s_t)                      (probability ratio)
    L^CLIP      = E_t[ min(r_t A_t, clip(r_t, 1 - eps, 1 + eps) A_t) ]           (clipped surrogate)
    L^VF        = E_t[ (V_theta(s_t) - V_t^targ)^2 ]                             (value loss; optionally clipped)
    S           = E_t[ entropy(pi_theta(.|s_t)) ]                                (entropy bonus)
    loss        = -L^CLIP + c1 L^VF - c2 S                                       (minimised)

A_t are GAE advantages (:func:`scalebox_ms.buffers.compute_gae`), normalised per minibatch; V_t^targ = A_t +
V_old(s_t). E_t is a mean over *valid* samples only: every term is weighted by ``mask`` (0 for the autoreset
steps of NEXT_STEP vector envs), so fixed-shape minibatches stay exact.
"""
from __future__ import annotations

import mindspore as ms
from mindspore import nn, ops

from ..ops import clip_grad_norm


def masked_mean(x, mask, count):
    return (x * mask).sum() / count


class PPOLoss(nn.Cell):
    """loss(theta) on one minibatch; returns (loss, (policy_loss, value_loss, entropy_loss, approx_kl, clip_fraction))."""

    def __init__(self, model, ent_coef: float, vf_coef: float, clip_value: bool, normalize_advantage: bool):
        super().__init__(auto_prefix=False)
        self.model = model
        self.ent_coef = ent_coef
        self.vf_coef = vf_coef
        self.clip_value = clip_value
        self.normalize_advantage = normalize_advantage

    def construct(self, obs, actions, old_log_prob, old_values, advantages, returns, mask, clip_range, clip_range_vf):
        log_prob, entropy, values = self.model.evaluate_actions(obs, actions)
        n = ops.maximum(mask.sum(), 1.0)

        if self.normalize_advantage:  # unbiased std over the valid samples, as torch.std
            mean = masked_mean(advantages, mask, n)
            var = ((advantages - mean) ** 2 * mask).sum() / ops.maximum(n - 1.0, 1.0)
            advantages = (advantages - mean) / (ops.sqrt(var) + 1e-8)

        # clipped surrogate objective L^CLIP
        log_ratio = log_prob - old_log_prob
        ratio = ops.exp(log_ratio)
        surrogate = ratio * advantages
        surrogate_clipped = ops.clip_by_value(ratio, 1.0 - clip_range, 1.0 + clip_range) * advantages
        policy_loss = -masked_mean(ops.minimum(surrogate, surrogate_clipped), mask, n)

        # value loss L^VF (SB3's clipping: the prediction is kept within clip_range_vf of the old value)
        if self.clip_value:
            values = old_values + ops.clip_by_value(values - old_values, -clip_range_vf, clip_range_vf)
        value_loss = masked_mean((returns - values) ** 2, mask, n)

        # entropy bonus S (as a loss: its negative)
        entropy_loss = -masked_mean(entropy, mask, n)

        loss = policy_loss + self.ent_coef * entropy_loss + self.vf_coef * value_loss

        # diagnostics (no gradient flows through the aux outputs)
        approx_kl = masked_mean((ratio - 1.0) - log_ratio, mask, n)  # Schulman's k3 estimator
        clip_fraction = masked_mean((ops.abs(ratio - 1.0) > clip_range).astype(ms.float32), mask, n)
        return loss, (policy_loss, value_loss, entropy_loss, approx_kl, clip_fraction)


class PPOUpdateStep(nn.Cell):
    """One compiled minibatch step: gather the minibatch, loss + grads, global-norm clip, Adam.

    The whole rollout is passed once per iteration as two device Tensors and the minibatch is gathered in the
    graph from ``indices``: ``features`` (B, obs_dim + 5) float32 packs ``[obs | old_log_prob | old_value |
    advantage | return | mask]`` (see :func:`pack_features`; one gather instead of six), ``actions`` is (B,)
    int32 or (B, act_dim) float32. Learning rate, clip ranges and the KL limit enter as Tensors, so
    schedules never recompile. With ``target_kl`` set, the optimizer step is skipped inside the graph when
    ``approx_kl > kl_limit`` (``1.5 * target_kl``), which is SB3's early stop: the trainer then ends the update.
    Without it the graph has no branch and ``kl_limit`` is ignored.

    Returns a float32 vector: [loss, policy_loss, value_loss, entropy_loss, approx_kl, clip_fraction, applied].
    """

    def __init__(self, model, ppo_cfg):
        super().__init__(auto_prefix=False)
        self.model = model
        self.obs_dim = model.spec.obs_dim
        self.loss_fn = PPOLoss(model, ppo_cfg.ent_coef, ppo_cfg.vf_coef, ppo_cfg.clip_range_vf is not None,
                               ppo_cfg.normalize_advantage)
        self.optimizer = nn.Adam(model.trainable_params(), learning_rate=float(ppo_cfg.learning_rate),
                                 eps=ppo_cfg.adam_eps)
        # Adam keeps its own learning-rate Parameter (it copies whatever it is given): assign into that one
        self.learning_rate = self.optimizer.learning_rate
        self.max_grad_norm = float(ppo_cfg.max_grad_norm)
        self.kl_stop = ppo_cfg.target_kl is not None
        self.grad_fn = ms.value_and_grad(self.loss_fn, None, self.optimizer.parameters, has_aux=True)

    @ms.jit
    def construct(self, features, actions, indices, learning_rate, clip_range, clip_range_vf, kl_limit):
        ops.assign(self.learning_rate, learning_rate)
        f = ops.gather(features, indices, 0)
        a = ops.gather(actions, indices, 0)
        d = self.obs_dim
        (loss, aux), grads = self.grad_fn(f[:, :d], a, f[:, d], f[:, d + 1], f[:, d + 2], f[:, d + 3], f[:, d + 4],
                                          clip_range, clip_range_vf)
        policy_loss, value_loss, entropy_loss, approx_kl, clip_fraction = aux
        applied = approx_kl <= kl_limit
        if self.kl_stop:  # static: without target_kl the graph has no control flow
            if applied:
                grads, _ = clip_grad_norm(grads, self.max_grad_norm)
                self.optimizer(grads)
        else:
            grads, _ = clip_grad_norm(grads, self.max_grad_norm)
            self.optimizer(grads)
        return ops.stack([loss, policy_loss, value_loss, entropy_loss, approx_kl, clip_fraction,
                          applied.astype(ms.float32)])


def pack_features(obs, old_log_prob, old_values, advantages, returns, mask):
    """numpy (B, obs_dim + 5) float32 matrix in the column order :class:`PPOUpdateStep` expects."""
    import numpy as np

    cols = [old_log_prob, old_values, advantages, returns, mask]
    return np.concatenate([obs.reshape(obs.shape[0], -1)] + [np.asarray(c).reshape(-1, 1) for c in cols],
                          axis=1).astype(np.float32)
