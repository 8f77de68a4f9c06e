"""Column layouts of the PPO update's two packed arrays, named once.

Mirrored, name for name, by ``ops/custom/layout.h`` for the C++ update kernel (a test compares the two).

* The packed minibatch features, float32 ``(B, obs_dim + len(FEATURE_COLUMNS))``: the observation in the first
  ``obs_dim`` columns, then one column per name of :data:`FEATURE_COLUMNS`; ``obs_dim + FEAT.advantage`` is the
  advantage column.
* The update statistics, float32 ``(len(STAT_COLUMNS),)`` per minibatch step: ``out[STAT.approx_kl]``. The
  kernel's all-epochs call returns ``(n_minibatches, len(STAT_COLUMNS) + 1)`` rows, the last column ``RAN``.
"""
from __future__ import annotations

from collections import namedtuple

FEATURE_COLUMNS = ("old_log_prob", "old_value", "advantage", "returns", "mask")
STAT_COLUMNS = ("loss", "policy_loss", "value_loss", "entropy_loss", "approx_kl", "clip_fraction",
                "kl_ok", "finite", "loss_scale")

#: offsets after the observation columns: ``features[:, obs_dim + FEAT.mask]``
FEAT = namedtuple("FeatureColumns", FEATURE_COLUMNS)(*range(len(FEATURE_COLUMNS)))
#: ``stats[STAT.kl_ok]``
STAT = namedtuple("StatColumns", STAT_COLUMNS)(*range(len(STAT_COLUMNS)))
N_FEATURES = len(FEATURE_COLUMNS)
N_STATS = len(STAT_COLUMNS)
#: the all-epochs kernel call's extra column: 1.0 if the minibatch row was processed
RAN = N_STATS
#: the loss terms averaged into the metrics (the statistics before the flags)
LOSS_TERMS = STAT_COLUMNS[:STAT.kl_ok]
