"""Running observation normalisation and return-based reward scaling (SB3 ``VecNormalize`` semantics).

Their statistics are plain numpy arrays with ``state_dict``/``load_state_dict`` so that checkpoints hold
them and a resumed run normalises exactly as the uninterrupted one would.
"""
from __future__ import annotations

import numpy as np


def combine_moments(moments):
    """Mean, variance and count of the union of batches given as [(mean, var, count), ...] (Chan et al.)."""
    mean = var = None
    count = 0.0
    for b_mean, b_var, b_count in moments:
        if b_count <= 0:
            continue
        b_mean, b_var = np.asarray(b_mean, np.float64), np.asarray(b_var, np.float64)
        if mean is None:
            mean, var, count = b_mean, b_var, float(b_count)
            continue
        delta = b_mean - mean
        total = count + b_count
        mean = mean + delta * b_count / total
        var = (var * count + b_var * b_count + delta**2 * count * b_count / total) / total
        count = total
    return mean, var, count


class RunningMeanStd:
    """Streaming mean/variance (Chan et al. parallel update), float64.

    ``reduce`` (data parallel): a function mapping this rank's batch to the (mean, var, count) of the batches
    of all ranks, so every rank's statistics stay identical (see :meth:`scalebox_ms.parallel.DistContext.moments`).
    """

    def __init__(self, shape=(), epsilon: float = 1e-4, reduce=None):
        self.mean = np.zeros(shape, np.float64)
        self.var = np.ones(shape, np.float64)
        self.count = float(epsilon)
        self.reduce = reduce

    def update(self, batch: np.ndarray) -> None:
        batch = np.asarray(batch, np.float64)
        if self.reduce is not None:
            b_mean, b_var, b_count = self.reduce(batch.reshape((batch.shape[0],) + self.mean.shape))
            if b_count <= 0:
                return
        elif batch.shape[0] == 0:
            return
        elif batch.shape[0] == 1:  # one env: the row is its mean and its variance is 0, exactly what mean/var give
            b_mean, b_var, b_count = batch[0], np.zeros_like(batch[0]), 1  # (~60 us less per env step)
        else:
            b_mean, b_var, b_count = batch.mean(axis=0), batch.var(axis=0), batch.shape[0]
        delta = b_mean - self.mean
        total = self.count + b_count
        self.mean = self.mean + delta * b_count / total
        m2 = self.var * self.count + b_var * b_count + delta**2 * self.count * b_count / total
        self.var = m2 / total
        self.count = total

    def state_dict(self) -> dict:
        return {"mean": self.mean.tolist(), "var": self.var.tolist(), "count": self.count}

    def load_state_dict(self, state: dict) -> None:
        self.mean = np.asarray(state["mean"], np.float64).reshape(self.mean.shape)
        self.var = np.asarray(state["var"], np.float64).reshape(self.var.shape)
        self.count = float(state["count"])


class ObsNormalizer:
    """obs -> clip((obs - mean) / sqrt(var + eps), -clip, clip) with running statistics.

    ``mask`` (bool, ``(obs_dim,)``): only these columns are normalised; the others (one-hots and bits of
    encoded Discrete/MultiDiscrete/MultiBinary observations, :mod:`.obs_encoding`) pass through unchanged.
    Statistics are kept for every column either way."""

    def __init__(self, obs_dim: int, clip: float = 10.0, epsilon: float = 1e-8, mask=None):
        self.rms = RunningMeanStd((obs_dim,))
        self.clip, self.epsilon = float(clip), float(epsilon)
        self.mask = None if mask is None or np.all(mask) else np.asarray(mask, bool)

    def __call__(self, obs: np.ndarray, update: bool = True, rows=None) -> np.ndarray:
        """Normalise ``obs``; with ``update``, the statistics take in its ``rows`` first (bool mask; None: all)."""
        if update:
            self.rms.update(obs if rows is None else obs[rows])
        out = np.clip((obs - self.rms.mean) / np.sqrt(self.rms.var + self.epsilon), -self.clip, self.clip)
        if self.mask is not None:
            out = np.where(self.mask, out, obs)
        return out.astype(np.float32)

    def constants(self):
        """(mean, 1 / std, low, high) float32 per column, for normalising in a graph as
        ``clip((obs - mean) * inv_std, low, high)``; columns outside ``mask`` get 0, 1, -inf, inf."""
        mean = np.asarray(self.rms.mean, np.float32)
        inv_std = (1.0 / np.sqrt(self.rms.var + self.epsilon)).astype(np.float32)
        low = np.full(mean.shape, -self.clip, np.float32)
        high = np.full(mean.shape, self.clip, np.float32)
        if self.mask is not None:
            off = ~self.mask
            mean[off], inv_std[off], low[off], high[off] = 0.0, 1.0, -np.inf, np.inf
        return mean, inv_std, low, high

    def state_dict(self) -> dict:
        return {"rms": self.rms.state_dict(), "clip": self.clip, "epsilon": self.epsilon}

    def load_state_dict(self, state: dict) -> None:
        self.rms.load_state_dict(state["rms"])
        self.clip, self.epsilon = float(state["clip"]), float(state["epsilon"])


class Float32Resolution:
    """Warns once when float32 rounds away what a float64 Box observation varies by, judged on its first ``ROWS``
    rows: the policy and its exported graph take float32 observations, so values near 1e8 that vary by ~1 reach
    the normalisation as a few float32 steps (8 apart there) and train on noise, silently. SB3's VecNormalize
    subtracts the mean in float64 first; here the remedy is the env's (subtract the offset in a wrapper).

    A column is flagged when the float32 cast moves some value by more than ``TOLERANCE`` of the column's
    standard deviation, unless that deviation is float64 rounding noise (below ``NOISE`` of the values: MuJoCo's
    Humanoid and Pusher have such columns) or 0 (a constant column loses nothing)."""

    ROWS = 512
    TOLERANCE = 0.01
    NOISE = 1e-12

    def __init__(self, encoder, space, env_id: str):
        self.encoder, self.env_id = encoder, env_id
        self.leaves = [leaf for leaf in encoder.leaves
                       if leaf.kind == "box" and encoder._leaf_value(space, leaf).dtype == np.float64]
        self._rows = [[] for _ in self.leaves]
        self._count = 0

    @property
    def active(self) -> bool:
        return bool(self.leaves) and self._count < self.ROWS

    def add(self, raw_obs, log) -> None:
        """Take in one batch the env returned (before encoding); at ``ROWS`` rows, check them and warn with ``log``."""
        if not self.active:
            return
        for rows, leaf in zip(self._rows, self.leaves):
            x = np.array(self.encoder._leaf_value(raw_obs, leaf), np.float64)  # (a copy: an env may reuse its array)
            rows.append(x.reshape(-1, leaf.width))
        self._count += len(self._rows[0][-1])
        if self._count >= self.ROWS:
            for rows, leaf in zip(self._rows, self.leaves):
                x = np.concatenate(rows)
                # (rows not finite in float32: the collector's own check stops the run on them)
                x = x[(np.abs(x) <= np.finfo(np.float32).max).all(axis=1)]
                if not len(x):
                    continue
                std, moved, scale = x.std(axis=0), np.abs(x - x.astype(np.float32)).max(axis=0), np.abs(x).max(axis=0)
                lost = np.flatnonzero((std > self.NOISE * scale) & (moved > self.TOLERANCE * std))
                if lost.size:
                    j = int(lost[0])
                    where = f"observation part {leaf.name}" if leaf.path else "observation"
                    log(f"warning: env {self.env_id!r}: {where} column {j} (float64) holds values near "
                        f"{np.mean(x[:, j]):.6g} that vary by {std[j]:.3g} (std over the first {len(x)} rows), "
                        f"and float32, which the policy takes, rounds them by up to {moved[j]:.3g} there "
                        f"({lost.size} such column(s)): that variation is lost to the policy; subtract the offset "
                        "in the env (a gymnasium ObservationWrapper)")
            self._rows = []


class RewardScaler:
    """Divide rewards by the running std of the discounted return (not centred), then clip."""

    def __init__(self, num_envs: int, gamma: float, clip: float = 10.0, epsilon: float = 1e-8):
        self.rms = RunningMeanStd(())
        self.returns = np.zeros(num_envs, np.float64)
        self.gamma, self.clip, self.epsilon = float(gamma), float(clip), float(epsilon)

    def __call__(self, rewards: np.ndarray, dones: np.ndarray, valid: np.ndarray) -> np.ndarray:
        """Scale one vector step; ``valid`` False marks autoreset steps, which neither update nor count."""
        self.returns = np.where(valid, self.returns * self.gamma + rewards, self.returns)
        if valid.any() or self.rms.reduce is not None:  # data parallel: every rank joins the collective, even empty
            with np.errstate(over="ignore", invalid="ignore"):  # (an overflow is the error below, not a warning)
                self.rms.update(self.returns[valid])
        if not np.isfinite(self.rms.var).all():  # (a reward of ~1e155 squares beyond float64: every later scaled
            from ..errors import TrainingError  # reward was 0, silently)

            big = float(np.max(np.abs(rewards)))
            raise TrainingError(f"env.normalize_reward: the discounted return's variance overflowed float64 (a reward "
                                f"of {big:.3g} in this step); the run stops before the update sees it")
        scaled = np.clip(rewards / np.sqrt(self.rms.var + self.epsilon), -self.clip, self.clip)
        self.returns[dones] = 0.0
        return scaled.astype(np.float32)

    def state_dict(self) -> dict:
        return {"rms": self.rms.state_dict(), "returns": self.returns.tolist(), "gamma": self.gamma,
                "clip": self.clip, "epsilon": self.epsilon}

    def load_state_dict(self, state: dict) -> None:
        """The statistics and the per-env returns; ``gamma``, ``clip`` and ``epsilon`` stay this scaler's (its
        trainer's config, which may differ from a checkpoint's when fine-tuning)."""
        self.rms.load_state_dict(state["rms"])
        self.returns = np.asarray(state["returns"], np.float64)
