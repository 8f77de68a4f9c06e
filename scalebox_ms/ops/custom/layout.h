// Column layouts of the PPO update's two packed arrays, mirroring scalebox_ms/ops/layout.py name for name
// (FEATURE_COLUMNS -> kFeat*, STAT_COLUMNS -> kStat*, N_FEATURES, N_STATS, RAN); tests/test_custom_update.py
// parses this file and fails if the two disagree. Part of every kernel's cache key (build.py hashes *.h).
#pragma once

// The packed minibatch features (B, obs_dim + kNFeatures): the observation, then these columns (offsets after
// the obs_dim observation columns).
constexpr int kFeatOldLogProb = 0;
constexpr int kFeatOldValue = 1;
constexpr int kFeatAdvantage = 2;
constexpr int kFeatReturns = 3;
constexpr int kFeatMask = 4;
constexpr int kNFeatures = 5;

// The statistics of one minibatch update (kNStats,).
constexpr int kStatLoss = 0;
constexpr int kStatPolicyLoss = 1;
constexpr int kStatValueLoss = 2;
constexpr int kStatEntropyLoss = 3;
constexpr int kStatApproxKl = 4;
constexpr int kStatClipFraction = 5;
constexpr int kStatKlOk = 6;
constexpr int kStatFinite = 7;
constexpr int kStatLossScale = 8;
constexpr int kNStats = 9;
// The all-epochs call's extra column (rows of kNStats + 1): 1 if the minibatch row was processed.
constexpr int kRan = 9;
