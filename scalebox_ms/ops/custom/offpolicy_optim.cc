// The off-policy learners' update arithmetic after the gradients, for MindSpore ops.Custom(func_type="aot") on CPU;
// forward-only elementwise code (the gradients come from MindSpore's autodiff). Two entry points:
//
// GuardedAdam: one optimizer step of one AdamGroup (models/offpolicy.py: guarded_update + AdamGroup.apply) -- the
// global gradient norm, the finiteness check, the global-norm clip and MindSpore's Adam update (P.Adam's CPU formula).
//   Inputs (params[0 .. nparam-2]), float32:
//     kInHyper  (4,)  max_grad_norm (<= 0: no clip), beta1, beta2, eps
//     kInLr     ()    learning rate
//     kInLoss   ()    the step's loss: a non-finite loss skips the step like a non-finite gradient
//     kInStep   ()    AdamGroup.step (a float counter), written in place
//     then K weights w_k, K first moments m_k, K second moments v_k, K gradients g_k (K = (nparam - 5) / 4),
//     w, m, v written in place (MindSpore 2.10 CPU graph mode hands an aot kernel the Parameters' own memory).
//   Output (params[nparam-1]): float32 (1,): 1 if the step was finite, else 0.
//   What it computes, as the graph reference: sq = sum of g^2 over all gradients (here in double, so a clip
//   coefficient below 1 can differ from MindSpore's float ReduceSum in its last bits; MindSpore's vectorised Adam
//   also rounds a few elements 1 ulp apart from this loop); ok = sq and the loss finite;
//   coef = min(max_norm / (sqrt(sq) + 1e-6), 1) (1 without a clip); step += 1; b1p = beta1^step,
//   b2p = beta2^step; lr_t = lr sqrt(1 - b2p) / (1 - b1p); per element m += (c g - m)(1 - beta1),
//   v += ((c g)^2 - v)(1 - beta2), w -= lr_t m / (sqrt(v) + eps), with c = coef. A non-finite step applies zero
//   gradients at learning rate 0, as the reference does: the moments decay by one step, the counter advances and
//   the weights stay untouched.
//
// PolyakUpdate: target <- target * keep + source * tau for every (target, source) pair (models/offpolicy.py:
// polyak), the same two float multiplies and one add per element as the graph ops (FMA contraction switched off for
// this function), so results are bit-identical.
//   Inputs, float32: kInCoef (2,) keep = 1 - tau and tau (computed by the caller in double, then rounded, as
//   MindSpore rounds the Python constants); then K targets (written in place) and K sources of equal sizes.
//   Output: float32 (1,), always 1.
//
// Both return a Status (status.h); no exception leaves the kernel.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "status.h"  // return codes, guarded

namespace {

#include "reduce.h"  // sum_squares

enum Input : int { kInHyper = 0, kInLr, kInLoss, kInStep, kInTensors };

bool is_f32(const char *dtype) { return std::strcmp(dtype, "float32") == 0; }


// (no FMA contraction, lr_t in float: as close to MindSpore's CPU Adam as a plain loop gets)
__attribute__((optimize("fp-contract=off"))) int step(int nparam, void **params, int *ndims, int64_t **shapes,
                                                      const char **dtypes) {
  const int n_in = nparam - 1;
  if (n_in < kInTensors + 4 || (n_in - kInTensors) % 4 != 0) return kErrParamCount;
  for (int i = 0; i < nparam; ++i) {
    if (!is_f32(dtypes[i])) return kErrDtype;
  }
  if (numel(ndims[kInHyper], shapes[kInHyper]) != 4 || numel(ndims[kInLr], shapes[kInLr]) != 1 ||
      numel(ndims[kInLoss], shapes[kInLoss]) != 1 || numel(ndims[kInStep], shapes[kInStep]) != 1 ||
      numel(ndims[n_in], shapes[n_in]) != 1) {
    return kErrShape;
  }
  const int K = (n_in - kInTensors) / 4;
  for (int k = 0; k < K; ++k) {
    const int w = kInTensors + k;
    const int64_t n = numel(ndims[w], shapes[w]);
    for (int j = 1; j < 4; ++j) {
      if (numel(ndims[w + j * K], shapes[w + j * K]) != n) return kErrShape;
    }
  }
  const float *hyper = static_cast<const float *>(params[kInHyper]);
  const float max_norm = hyper[0], beta1 = hyper[1], beta2 = hyper[2], eps = hyper[3];
  const float lr = *static_cast<const float *>(params[kInLr]);
  const float loss = *static_cast<const float *>(params[kInLoss]);
  float *counter = static_cast<float *>(params[kInStep]);
  float *ok_out = static_cast<float *>(params[n_in]);

  double sq = 0.0;
  for (int k = 0; k < K; ++k) {
    const int g = kInTensors + 3 * K + k;
    sq += sum_squares(static_cast<const float *>(params[g]), numel(ndims[g], shapes[g]));
  }
  const float sqf = static_cast<float>(sq);
  const bool ok = std::isfinite(sqf) && std::isfinite(loss);
  float coef = 1.0f;
  if (ok && max_norm > 0.0f) coef = std::min(max_norm / (std::sqrt(sqf) + 1e-6f), 1.0f);
  const float t = *counter + 1.0f;
  *counter = t;
  const float b1p = std::pow(beta1, t), b2p = std::pow(beta2, t);
  const float lr_t = ok ? lr * std::sqrt(1.0f - b2p) / (1.0f - b1p) : 0.0f;
  const float c1 = 1.0f - beta1, c2 = 1.0f - beta2;
  for (int k = 0; k < K; ++k) {
    const int wi = kInTensors + k;
    const int64_t n = numel(ndims[wi], shapes[wi]);
    float *__restrict w = static_cast<float *>(params[wi]);
    float *__restrict m = static_cast<float *>(params[wi + K]);
    float *__restrict v = static_cast<float *>(params[wi + 2 * K]);
    const float *__restrict g = static_cast<const float *>(params[wi + 3 * K]);
    if (!ok) {  // zero gradients at learning rate 0
      for (int64_t i = 0; i < n; ++i) {
        m[i] += (0.0f - m[i]) * c1;
        v[i] += (0.0f - v[i]) * c2;
      }
      continue;
    }
    for (int64_t i = 0; i < n; ++i) {
      const float gi = g[i] * coef;
      m[i] += (gi - m[i]) * c1;
      v[i] += (gi * gi - v[i]) * c2;
      w[i] -= lr_t * m[i] / (std::sqrt(v[i]) + eps);
    }
  }
  *ok_out = ok ? 1.0f : 0.0f;
  return kOk;
}

enum PolyakInput : int { kInCoef = 0, kInPairs };

// (no FMA: t * keep + s * tau rounded after each multiply and the add, as MindSpore's Mul, Mul, Add; GCC would
// otherwise contract it under -march=native, 1 ulp off in about half the elements)
__attribute__((optimize("fp-contract=off"))) int polyak(int nparam, void **params, int *ndims, int64_t **shapes,
                                                        const char **dtypes) {
  const int n_in = nparam - 1;
  if (n_in < kInPairs + 2 || (n_in - kInPairs) % 2 != 0) return kErrParamCount;
  for (int i = 0; i < nparam; ++i) {
    if (!is_f32(dtypes[i])) return kErrDtype;
  }
  if (numel(ndims[kInCoef], shapes[kInCoef]) != 2 || numel(ndims[n_in], shapes[n_in]) != 1) return kErrShape;
  const int K = (n_in - kInPairs) / 2;
  for (int k = 0; k < K; ++k) {
    const int t = kInPairs + k;
    if (numel(ndims[t], shapes[t]) != numel(ndims[t + K], shapes[t + K])) return kErrShape;
  }
  const float *coef = static_cast<const float *>(params[kInCoef]);
  const float keep = coef[0], tau = coef[1];
  for (int k = 0; k < K; ++k) {
    const int ti = kInPairs + k;
    const int64_t n = numel(ndims[ti], shapes[ti]);
    float *__restrict t = static_cast<float *>(params[ti]);
    const float *__restrict s = static_cast<const float *>(params[ti + K]);
    for (int64_t i = 0; i < n; ++i) {
      const float a = t[i] * keep;
      const float b = s[i] * tau;
      t[i] = a + b;
    }
  }
  *static_cast<float *>(params[n_in]) = 1.0f;
  return kOk;
}

}  // namespace

extern "C" int PolyakUpdate(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *stream,
                            void *extra) {
  (void)stream;
  (void)extra;
  return guarded([&] { return polyak(nparam, params, ndims, shapes, dtypes); });
}

extern "C" int GuardedAdam(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *stream,
                           void *extra) {
  (void)stream;
  (void)extra;
  return guarded([&] { return step(nparam, params, ndims, shapes, dtypes); });
}
