// Reductions shared by the scalebox_ms C++ kernels' optimizer steps (ppo_optim.h, offpolicy_optim.cc), included
// inside each kernel's anonymous namespace once <cstdint> is included. Part of every kernel's cache key (build.py
// hashes *.h).
#pragma once

// sum of g[i]^2 in double, in kLanes interleaved partial sums (independent FMA chains) added up in a fixed order.
inline double sum_squares(const float *g, int64_t n) {
  constexpr int kLanes = 8;
  double part[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) part[j] += static_cast<double>(g[i + j]) * g[i + j];
  }
  for (int j = 0; i < n; ++i, ++j) part[j] += static_cast<double>(g[i]) * g[i];
  double s = 0.0;
  for (int j = 0; j < kLanes; ++j) s += part[j];
  return s;
}
