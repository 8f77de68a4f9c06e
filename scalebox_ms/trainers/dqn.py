"""DQN (Mnih et al. 2015) as SB3 runs it: Huber TD loss against a target network, epsilon-greedy acting.

All of DQN's maths is here: :class:`DQNLearner` is graph code (the loss, one gradient step, the target update,
the greedy action), run inside the off-policy core's compiled training phase (:mod:`.offpolicy`); the host side
(:class:`DQNTrainer`'s exploration) decides per env between a uniformly random and the greedy action with
probability ``epsilon``, annealed linearly from ``exploration_initial_eps`` to ``exploration_final_eps`` over the
first ``exploration_fraction`` of ``run.total_steps``.

For a sampled batch (s, a, r, s', d) -- d is *terminated* only: a truncated episode bootstraps from the true next
observation --::

    y    = r + gamma * (1 - d) * max_a' Q_target(s', a')
    loss = Huber(Q(s, a) - y)                  (smooth L1, beta 1, mean over the batch)

Gradients are clipped to ``max_grad_norm`` (global norm), then Adam. The target network follows
``Q_target <- (1 - tau) Q_target + tau Q`` every ``target_update_interval`` env steps (``tau = 1``: a copy).
Differences from SB3: epsilon is drawn per env (SB3 draws one number for the whole vector env).
"""
from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import nn, ops

from ..models.offpolicy import AdamGroup, Learner, QNetwork, cnn_kwargs, guarded_update, polyak
from .offpolicy import OffPolicyTrainer


#: most bytes a phase's batched TD-target pass may hold (its sampled observations and target-network activations)
BATCHED_TARGETS_MAX_BYTES = 256 * 2**20


class _TDLoss(nn.Cell):
    def __init__(self, q):
        super().__init__(auto_prefix=False)
        self.q = q

    def construct(self, obs, action, y, scale):
        q = ops.gather_elements(self.q(obs), 1, action.reshape((-1, 1))).reshape((-1,))
        loss = ops.smooth_l1_loss(q, y, beta=1.0, reduction="mean")  # Huber: one fused kernel and its grad
        return loss * scale, loss, q.mean()  # (differentiated: the loss times the AMP loss scale, 1 in float32)


class DQNLearner(Learner):
    """The Q-network, its target and Adam; graph methods called by the core's compiled phase."""

    STATS = ("loss", "q_values", "nonfinite")

    def __init__(self, spec, policy_cfg, cfg, amp=None):
        super().__init__()
        args = (spec.obs_dim, spec.action_dim, policy_cfg.vf_layers, policy_cfg.activation, policy_cfg.ortho_init)
        cnn = cnn_kwargs(spec, policy_cfg)  # images: NatureCNN features, then the vf_layers MLP (SB3's CnnPolicy)
        self.q = QNetwork(*args, cnn=cnn)
        self.q_target = QNetwork(*args, cnn=cnn)
        for t, s in zip(self.q_target.get_parameters(), self.q.get_parameters()):
            t.set_data(s.data.copy())
            t.requires_grad = False
        self.target_params = ms.ParameterTuple(list(self.q_target.get_parameters()))
        self.online_params = ms.ParameterTuple(list(self.q.get_parameters()))
        self.optimizer = AdamGroup(self.q.trainable_params(), "q_optimizer", cfg.adam_eps)
        self.tau = float(cfg.tau)
        self.max_grad_norm = float(cfg.max_grad_norm)
        if amp is not None:
            self.use_amp(amp, [self.q, self.q_target])
        self.gamma = float(cfg.gamma)
        self.grad_fn = ms.value_and_grad(_TDLoss(self.q), None, self.optimizer.params, has_aux=True)
        self.widths = [spec.obs_dim] + list(policy_cfg.vf_layers) + [spec.action_dim]

    def batches_targets(self, rows: int) -> bool:
        """An MLP Q-network: the target network is fixed during a phase (its updates run in :meth:`before_phase`),
        so the phase's TD targets are computed in one pass, if its observations and activations for ``rows``
        transitions fit BATCHED_TARGETS_MAX_BYTES (image observations: per gradient step)."""
        return self.features is None and rows * 4 * (sum(self.widths) + self.widths[0]) <= BATCHED_TARGETS_MAX_BYTES

    def before_phase(self, n_target):
        """The target updates of the env steps collected since the last phase (SB3 does them while collecting)."""
        k = ops.zeros((), ms.int32)
        while k < n_target:
            polyak(self.target_params, self.online_params, self.tau, self.polyak_kernel)
            k = k + 1
        return k

    def td_target(self, reward, next_obs, terminated):
        """y = r + gamma (1 - d) max_a' Q_target(s', a') (no gradient)."""
        next_q = ops.amax(self.q_target(next_obs), 1)
        return ops.stop_gradient(reward + self.gamma * (1.0 - terminated) * next_q)

    def train_step(self, obs, action, reward, next_obs, terminated, noise, i, lr):
        return self.train_on_targets(obs, action, self.td_target(reward, next_obs, terminated), lr)

    def train_on_targets(self, obs, action, y, lr):
        """One gradient step of the Huber loss of Q(s, a) against the TD targets ``y``."""
        (_, loss, q_mean), grads = self.grad_fn(obs, action, y, self.scale())
        ok = guarded_update(self.optimizer, grads, loss, lr, self.max_grad_norm, self.inv_scale())  # (non-finite:
        self.end_step(ok)                                                                          # untouched)
        return ops.stack([loss, q_mean, self.nonfinite(ok, (loss,))])

    @property
    def features(self):
        """The Q-network's NatureCNN (image observations) or None: what INT8 export quantizes before ``q_net``."""
        return self.q.features

    def policy(self, obs, noise):
        """The greedy action (B,) int32 (``noise`` unused)."""
        return ops.argmax(self.q(obs), 1).astype(ms.int32)

    def policy_mlp(self):
        return self.q.q_net, "argmax"

    def deterministic(self, obs):
        return ops.argmax(self.q(obs), 1).astype(ms.int32)


class HostQNetwork:
    """A numpy copy of the Q-network's MLP for greedy acting between training phases.

    DQN acts once per env step and trains every ``train_freq`` steps; on CPU one compiled graph call costs
    ~0.3-1 ms whatever the network, while a 4-256-256-2 MLP takes ~30 us in numpy. The weights are read from the
    Parameters after every training phase and checkpoint load (:meth:`sync`), so the greedy action is the compiled
    graph's up to float rounding (tested against it; a near-tie of two Q values may resolve differently)."""

    def __init__(self, q_net: nn.SequentialCell):
        self.layers = []  # [(weight Parameter, bias Parameter, activation or None)]
        cells = list(q_net.cells())
        for i, cell in enumerate(cells):
            if isinstance(cell, nn.Dense):
                nxt = cells[i + 1] if i + 1 < len(cells) else None
                act = "relu" if isinstance(nxt, nn.ReLU) else "tanh" if isinstance(nxt, nn.Tanh) else None
                self.layers.append((cell.weight, cell.bias, act))
        self.weights = None
        self.macs = sum(int(np.prod(w.shape)) for w, _, _ in self.layers)

    def sync(self) -> None:
        self.weights = [(w.asnumpy().T.copy(), b.asnumpy().copy(), act) for w, b, act in self.layers]

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        h = obs
        for w, b, act in self.weights:
            h = h @ w + b
            if act == "relu":
                h = np.maximum(h, 0.0)
            elif act == "tanh":
                h = np.tanh(h)
        return np.argmax(h, axis=1).astype(np.int32)


class DQNTrainer(OffPolicyTrainer):
    """DQN on a Discrete action space. See :class:`~.offpolicy.OffPolicyTrainer` for the API."""

    algo = "dqn"
    learner_class = DQNLearner

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        from ..config_offpolicy import HOST_ACTING_MAX_MACS

        choice = self.config.dqn.host_acting
        # where the graph acts whatever dqn.host_acting says (true: a warning, not a refusal, so that such a run
        # still resumes and evaluates; images refuse true before this)
        if self.learner.features is not None:  # the numpy copy is an MLP
            graph_acts = "compiled graph (image observations: a NatureCNN Q-network)"
        elif self.native_cycle is not None:  # native envs, compiled: the cycle's graph acts, no per-step call
            graph_acts = ("not used (env.backend native with env.compiled_rollout: the actions are taken inside the "
                          "training cycle's graph)")
        elif self.amp is not None:  # the numpy copy computes in float32: it would not act as the graph does
            graph_acts = (f"compiled graph (amp.level {self.config.amp.level}: the Q-network computes in "
                          f"{self.config.amp.dtype}; the numpy copy would act in float32)")
        else:
            graph_acts = None
        if graph_acts is not None:
            self.host_q = None
            if choice is not False:
                (self.log.info if choice == "auto" else self.log.warning)(
                    "dqn.host_acting %s: %s", "auto" if choice == "auto" else "true", graph_acts)
        else:
            host = HostQNetwork(self.learner.q.q_net)
            use = choice is True or (choice == "auto" and host.macs <= HOST_ACTING_MAX_MACS)
            self.host_q = host if use else None
            if choice == "auto":
                self.log.info("dqn.host_acting auto: %s (Q-network %d multiply-adds per observation, limit %d)",
                              "numpy copy" if use else "compiled graph", host.macs, HOST_ACTING_MAX_MACS)
        self._host_stale = True

    def _refusal(self, spec):
        if spec.cnn and self.config.dqn.host_acting is True:
            return ("dqn.host_acting: true needs an MLP Q-network; image observations use a NatureCNN (set auto or "
                    "false)")
        return None

    def _policy(self):
        if self.host_q is None:
            return super()._policy()
        if self._host_stale:  # new weights since the last sync (a training phase, a checkpoint load)
            self.host_q.sync()
            self._host_stale = False
        self._pending = None
        return self.host_q(self.collector.obs)

    def _after_phase(self) -> None:
        self._host_stale = True

    def _weights_changed(self) -> None:
        super()._weights_changed()
        self._host_stale = True  # (the numpy copy of the Q-network: synced again before the next action)

    def _restore_extra(self, sc: dict) -> None:
        super()._restore_extra(sc)
        self._host_stale = True

    def _exploration_rate(self, step=None) -> float:
        o = self.config.dqn
        progress = (self.global_step if step is None else step) / self.config.run.total_steps
        if o.exploration_fraction == 0 or progress >= o.exploration_fraction:
            return o.exploration_final_eps
        return o.exploration_initial_eps + progress * (o.exploration_final_eps - o.exploration_initial_eps) \
            / o.exploration_fraction

    def _replay_action_spec(self):
        return (), np.int32

    def _random_actions(self, rng, n):
        a = rng.integers(0, self.spec.action_dim, size=n).astype(np.int32)
        return a, a.astype(np.int64)

    def _explore(self, policy, rng, n):
        eps = self._exploration_rate()
        explore = rng.random(n) < eps
        random = rng.integers(0, self.spec.action_dim, size=n).astype(np.int32)
        a = random if explore.all() else np.where(explore, random, policy())
        return a.astype(np.int32), a.astype(np.int64)

    def _random_mask(self, rng, n, step):
        if step < self.config.dqn.learning_starts:
            return np.ones(n, np.float32)
        return (rng.random(n) < self._exploration_rate(step)).astype(np.float32)

    def _random_batch(self, rng, n):
        return rng.integers(0, self.spec.action_dim, size=n).astype(np.int32)

    def _phase_metrics(self) -> dict:
        return {"exploration_rate": self._exploration_rate()}

    def _target_updates(self, steps_before: int, steps_after: int) -> int:
        """SB3 updates the target when its per-env step counter is a multiple of target_update_interval // n_envs."""
        every = max(self.config.dqn.target_update_interval // self.num_envs, 1)
        n = self.num_envs
        return steps_after // n // every - steps_before // n // every

    def _to_env(self, actions):
        return actions.astype(np.int64)
