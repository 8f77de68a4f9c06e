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

from ..amp import all_finite, update_scale
from ..ops import clip_grad_norm, global_norm
from ..ops.layout import FEAT, FEATURE_COLUMNS, LOSS_TERMS, STAT


def masked_mean(x, mask, count):
    return (x * mask).sum() / count


def normalize_advantages(advantages, mask, count, total=None, sq_dev_sum=None):
    """(A - mean) / (std + 1e-8) over the valid samples, std unbiased as torch.std.

    ``total``/``sq_dev_sum`` override the local sums (data parallel: the all-reduced sums of every rank)."""
    mean = (masked_mean(advantages, mask, count) if total is None else total / count)
    if sq_dev_sum is None:
        sq_dev_sum = ((advantages - mean) ** 2 * mask).sum()
    var = sq_dev_sum / ops.maximum(count - 1.0, 1.0)
    return (advantages - mean) / (ops.sqrt(var) + 1e-8)


class PPOLoss(nn.Cell):
    """loss(theta) on one minibatch; returns (loss, (policy_loss, value_loss, entropy_loss, approx_kl, clip_fraction)).

    :meth:`objective` is the same loss with the advantages already normalised and the mean taken as
    ``sum / count`` with an external ``count``: summing it over micro-batches (gradient accumulation) or ranks
    (data parallel), with the count and advantage statistics of the whole minibatch, gives exactly the loss of
    the whole minibatch.
    """

    def __init__(self, model, ent_coef: float, vf_coef: float, clip_value: bool, normalize_advantage: bool):
        super().__init__(auto_prefix=False)
        self.model = model
        self.ent_coef = ent_coef
        self.vf_coef = vf_coef
        self.clip_value = clip_value
        self.normalize_advantage = normalize_advantage

    def construct(self, obs, actions, old_log_prob, old_values, advantages, returns, mask, clip_range, clip_range_vf):
        n = ops.maximum(mask.sum(), 1.0)
        if self.normalize_advantage:
            advantages = normalize_advantages(advantages, mask, n)
        return self.objective(obs, actions, old_log_prob, old_values, advantages, returns, mask, n, clip_range,
                              clip_range_vf)

    def objective(self, obs, actions, old_log_prob, old_values, advantages, returns, mask, n, clip_range, clip_range_vf):
        log_prob, entropy, values = self.model.evaluate_actions(obs, actions)

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


class _Objective(nn.Cell):
    """PPOLoss.objective as a Cell for ``value_and_grad``; with AMP the loss is multiplied by the loss scale."""

    def __init__(self, loss: PPOLoss, scaled: bool):
        super().__init__(auto_prefix=False)
        self.loss = loss
        self.scaled = scaled

    def construct(self, obs, actions, old_log_prob, old_values, advantages, returns, mask, n, clip_range,
                  clip_range_vf, scale):
        loss, aux = self.loss.objective(obs, actions, old_log_prob, old_values, advantages, returns, mask, n,
                                        clip_range, clip_range_vf)
        if self.scaled:
            loss = loss * scale
        return loss, aux


STAT_NAMES = LOSS_TERMS  # the loss terms of the statistics vector (scalebox_ms.ops.layout.STAT_COLUMNS)


class PPOUpdateStep(nn.Cell):
    """One compiled minibatch step: gather the minibatch, loss + grads, global-norm clip, Adam.

    The whole rollout is passed once per iteration as two device Tensors and the minibatch is gathered in the
    graph from ``indices``: ``features`` (B, obs_dim + 5) float32 packs ``[obs | old_log_prob | old_value |
    advantage | return | mask]`` (see :func:`pack_features`; one gather instead of six), ``actions`` is (B,)
    int32 or (B, act_dim) float32. Learning rate, clip ranges and the KL limit enter as Tensors, so
    schedules never recompile. With ``target_kl`` set, the optimizer step is skipped inside the graph when
    ``approx_kl > kl_limit`` (``1.5 * target_kl``), which is SB3's early stop: the trainer then ends the update.
    Without it the graph has no branch and ``kl_limit`` is ignored.

    Options (all static: they shape the graph):

    * ``micro_batches`` k > 1 -- gradient accumulation: the minibatch is split into k equal micro-batches whose
      gradients are summed (each micro-batch loss is its share of the minibatch mean, with the minibatch's
      advantage statistics), then one optimizer step. Equal to the k = 1 update up to float rounding.
    * ``amp`` -- an :class:`~scalebox_ms.amp.AutoMixedPrecision`: scaled loss, unscaled grads, all-finite check;
      on overflow the optimizer step is skipped and the scale backs off (see :mod:`scalebox_ms.amp`).
    * ``world_size`` W > 1 -- data parallel: ``indices`` select this rank's share of the minibatch; the sample
      count, advantage sums, gradients (one flat all-reduce) and the reported statistics are summed over ranks
      with ``ops.AllReduce`` (HCCL / NCCL / MCCL), so every rank applies the same update, the one a single
      process would compute on the whole minibatch.

    Returns a float32 vector: [loss, policy_loss, value_loss, entropy_loss, approx_kl, clip_fraction,
    kl_ok, finite, loss_scale] (:data:`scalebox_ms.ops.layout.STAT_COLUMNS`); the optimizer step was applied iff
    ``kl_ok and finite`` (``kl_ok`` is 1 without target_kl; ``finite`` is 0 when the loss or a gradient is not
    finite, or without AMP the gradients' global norm overflows float32 (above ~1.8e19) -- with AMP also on a
    loss-scale overflow -- and ``loss_scale`` is 1 without AMP).
    """

    def __init__(self, model, ppo_cfg, micro_batches: int = 1, amp=None, world_size: int = 1,
                 rollout_rows: int = 0):
        super().__init__(auto_prefix=False)
        self.model = model
        self.obs_dim = model.spec.obs_dim
        # image observations stay uint8 in a device store of the whole rollout (``rollout_rows`` frames), written
        # once per update by load_rollout_obs; the packed features then carry no observation columns
        self.image = model.spec.image
        if self.image:
            import numpy as np
            from mindspore import Parameter, Tensor

            self.obs_dim = 0
            self.rollout_obs = Parameter(Tensor(np.zeros((rollout_rows,) + tuple(model.spec.image_shape), np.uint8)),
                                         name="rollout_obs", requires_grad=False)
            self._obs_writer = None
        self.loss_fn = PPOLoss(model, ppo_cfg.ent_coef, ppo_cfg.vf_coef, ppo_cfg.clip_range_vf is not None,
                               ppo_cfg.normalize_advantage)
        self.normalize_advantage = ppo_cfg.normalize_advantage
        self.optimizer = nn.Adam(model.trainable_params(), learning_rate=float(ppo_cfg.learning_rate),
                                 eps=ppo_cfg.adam_eps)
        # Adam keeps its own learning-rate Parameter (it copies whatever it is given): assign into that one
        self.learning_rate = self.optimizer.learning_rate
        self.max_grad_norm = float(ppo_cfg.max_grad_norm)
        self.kl_stop = ppo_cfg.target_kl is not None
        self.micro_batches = int(micro_batches)
        self.world_size = int(world_size)
        self.distributed = self.world_size > 1
        if self.distributed:
            self.all_reduce = ops.AllReduce()
        self.use_amp = amp is not None
        if self.use_amp:
            from ..amp import LossScaler

            self.amp = amp
            scaler = LossScaler(amp)
            self.loss_scale, self.good_steps, self.skipped_steps = scaler.parameters()
        self.objective = _Objective(self.loss_fn, self.use_amp)
        self.grad_fn = ms.value_and_grad(self.objective, None, self.optimizer.parameters, has_aux=True)

    def load_rollout_obs(self, obs) -> None:
        """Image observations: write the rollout's uint8 frames (rows in the order of the features) to the store."""
        from ..ops.assign import AssignParameters

        if self._obs_writer is None:
            self._obs_writer = AssignParameters([self.rollout_obs])
        self._obs_writer.write([ms.Tensor(obs)])

    def state_parameters(self):
        """Parameters besides the model's and Adam's that belong in a checkpoint (the loss scaler's)."""
        return [self.loss_scale, self.good_steps, self.skipped_steps] if self.use_amp else []

    def _sum(self, x):
        return self.all_reduce(x) if self.distributed else x

    @ms.jit
    def construct(self, features, actions, indices, learning_rate, clip_range, clip_range_vf, kl_limit):
        ops.assign(self.learning_rate, learning_rate)
        f = ops.gather(features, indices, 0)
        a = ops.gather(actions, indices, 0)
        d = self.obs_dim
        obs = ops.gather(self.rollout_obs, indices, 0) if self.image else f[:, :d]
        old_log_prob, old_values = f[:, d + FEAT.old_log_prob], f[:, d + FEAT.old_value]
        adv, returns, mask = f[:, d + FEAT.advantage], f[:, d + FEAT.returns], f[:, d + FEAT.mask]
        # minibatch statistics (over all ranks' shares when distributed)
        if self.distributed:
            sums = self.all_reduce(ops.stack([mask.sum(), (adv * mask).sum()]))
            n = ops.maximum(sums[0], 1.0)
            if self.normalize_advantage:
                mean = sums[1] / n
                sq_dev = self.all_reduce(((adv - mean) ** 2 * mask).sum().reshape(1))[0]
                adv = normalize_advantages(adv, mask, n, sums[1], sq_dev)
        else:
            n = ops.maximum(mask.sum(), 1.0)
            if self.normalize_advantage:
                adv = normalize_advantages(adv, mask, n)
        scale = self.loss_scale if self.use_amp else ops.ones((), ms.float32)

        k = self.micro_batches
        m = indices.shape[0] // k
        grads = None
        terms = None
        for i in range(k):  # static unroll; k = 1 is the plain step
            s, e = i * m, (i + 1) * m
            (loss, aux), g = self.grad_fn(obs[s:e], a[s:e], old_log_prob[s:e], old_values[s:e], adv[s:e],
                                          returns[s:e], mask[s:e], n, clip_range, clip_range_vf, scale)
            t = ops.stack((loss,) + tuple(aux))
            if i == 0:
                grads, terms = g, t
            else:
                grads = tuple(x + y for x, y in zip(grads, g))
                terms = terms + t
        if self.distributed:  # one flat all-reduce for all gradients and the statistics
            flat = self.all_reduce(ops.concat([x.reshape(-1) for x in grads] + [terms]))
            out, offset = [], 0
            for x in grads:
                size = x.size
                out.append(flat[offset:offset + size].reshape(x.shape))
                offset += size
            grads = tuple(out)
            terms = flat[offset:]
        if self.use_amp:
            inv = 1.0 / scale
            grads = tuple(x * inv for x in grads)
            terms = ops.concat([terms[:1] * inv, terms[1:]])
        norm = global_norm(grads)  # (the clip's)
        if self.use_amp:  # (mindspore.amp.all_finite: on Ascend it also reads the device's overflow status)
            finite = all_finite(grads)
            new_scale, new_good, new_skipped = update_scale(self.loss_scale, self.good_steps, self.skipped_steps,
                                                            finite, self.amp)
            ops.assign(self.loss_scale, new_scale)
            ops.assign(self.good_steps, new_good)
            ops.assign(self.skipped_steps, new_skipped)
        else:  # a non-finite loss or gradient (e.g. NaN inputs) skips the step, as an AMP overflow does; the global
            # norm is the gradients' check (NaN or inf anywhere makes it non-finite; one reduction instead of
            # all_finite's IsFinite + ReduceAll over every gradient, ~4 ms of a NatureCNN minibatch step on CPU)
            finite = ops.logical_and(ops.isfinite(norm), ops.isfinite(terms[STAT.loss]))
            new_scale = ops.ones((), ms.float32)
        kl_ok = terms[STAT.approx_kl] <= kl_limit
        if self.kl_stop:  # static branch: without target_kl the KL is only reported
            if ops.logical_and(kl_ok, finite):
                self._apply(grads, norm)
            if not self.use_amp:  # a step the KL stops is judged by its loss alone, as SB3 checks the KL before its
                # backward pass and the C++ kernel skips it (NaN gradients at a finite loss went on with the epochs)
                finite = ops.logical_or(ops.logical_and(kl_ok, finite),
                                        ops.logical_and(ops.logical_not(kl_ok), ops.isfinite(terms[STAT.loss])))
        elif finite:
            self._apply(grads, norm)
        return ops.concat([terms, ops.stack([kl_ok.astype(ms.float32), finite.astype(ms.float32), new_scale])])

    def _apply(self, grads, norm):
        grads, _ = clip_grad_norm(grads, self.max_grad_norm, norm)
        return self.optimizer(grads)


def pack_features(obs, old_log_prob, old_values, advantages, returns, mask):
    """numpy (B, obs_dim + N_FEATURES) float32 matrix: the observation, then the columns of
    :data:`scalebox_ms.ops.layout.FEATURE_COLUMNS` in their order (what :class:`PPOUpdateStep` and the C++ kernel
    read)."""
    import numpy as np

    cols = dict(old_log_prob=old_log_prob, old_value=old_values, advantage=advantages, returns=returns, mask=mask)
    return np.concatenate([obs.reshape(obs.shape[0], -1)] + [np.asarray(cols[name]).reshape(-1, 1)
                                                              for name in FEATURE_COLUMNS], axis=1).astype(np.float32)
