// The optimizer half of ppo_update.cc's minibatch step: the gradient of the whole minibatch from the blocks'
// partial gradients, the global-norm clip g * min(1, max_norm / (norm + 1e-6)) and MindSpore nn.Adam's update
// (P.Adam's CPU formula, beta powers, global_step). Included inside ppo_update.cc's anonymous namespace after
// ppo_state.h.
#pragma once

// gw, gb of every layer from the T blocks' partial gradients, summed in the fixed order block 0, 1, ..., T-1 (gw
// in float, gbd in double); with one block this is exactly that block's gradient (the single-thread path, which
// takes the block's buffer instead of copying it when it is already laid out as W).
void combine_grads(std::vector<Layer> &net, const std::vector<std::vector<LayerBuf> *> &bufs) {
  const size_t T = bufs.size();
  for (size_t l = 0; l < net.size(); ++l) {
    Layer &L = net[l];
    L.gb.resize(L.out);
    for (int o = 0; o < L.out; ++o) {
      double gb = (*bufs[0])[l].gbd[o];
      for (size_t t = 1; t < T; ++t) gb += (*bufs[t])[l].gbd[o];
      L.gb[o] = static_cast<float>(gb);
    }
    const int64_t n = static_cast<int64_t>(L.out) * L.in;
    if (L.grad_rows() && T == 1) {
      L.gw.swap((*bufs[0])[l].gw);
      continue;
    }
    L.gw.resize(n);
    float *gw = L.gw.data();
    if (L.grad_rows()) {
      std::memcpy(gw, (*bufs[0])[l].gw.data(), sizeof(float) * n);
      for (size_t t = 1; t < T; ++t) {
        const float *g = (*bufs[t])[l].gw.data();
        for (int64_t k = 0; k < n; ++k) gw[k] += g[k];
      }
      continue;
    }
    for (int o = 0; o < L.out; ++o) {  // transposed partial gradients (in, outp): small first layers only
      for (int i = 0; i < L.in; ++i) {
        const size_t k = static_cast<size_t>(i) * L.outp + o;
        float g = (*bufs[0])[l].gw[k];
        for (size_t t = 1; t < T; ++t) g += (*bufs[t])[l].gw[k];
        gw[static_cast<size_t>(o) * L.in + i] = g;
      }
    }
  }
}

#include "reduce.h"  // sum_squares

// MindSpore P.Adam (CPU): m += (g - m)(1 - b1); v += (g^2 - v)(1 - b2); w -= lr_t m / (sqrt(v) + eps).
inline void adam(float *__restrict w, float *__restrict m, float *__restrict v, const float *__restrict g, int64_t n,
                 float coef, float lr_t, float beta1, float beta2, float eps) {
  const float c1 = 1.0f - beta1, c2 = 1.0f - beta2;
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i] * coef;
    m[i] += (gi - m[i]) * c1;
    v[i] += (gi * gi - v[i]) * c2;
    w[i] -= lr_t * m[i] / (std::sqrt(v[i]) + eps);
  }
}

// The optimizer step from the blocks' partial gradients (pi, vf: one LayerBuf vector per block; log_std: one
// double vector per block, unused for discrete actions): combine, clip by the global norm, Adam (in place).
// Returns false, changing nothing, when a gradient is not finite (the global norm is then inf or nan).
using BlockGrads = std::vector<std::vector<LayerBuf> *>;
bool apply_update(Ctx &c, const BlockGrads &bpi, const BlockGrads &bvf,
                  const std::vector<const std::vector<double> *> &bls) {
  const int act_dim = c.act_dim, NB = static_cast<int>(bls.size());
  combine_grads(c.pi, bpi);  // block order 0, 1, ..., NB-1
  combine_grads(c.vf, bvf);
  std::vector<double> g_log_std(act_dim, 0.0);
  if (!c.discrete) {
    for (int j = 0; j < act_dim; ++j) {
      g_log_std[j] = (*bls[0])[j];
      for (int b = 1; b < NB; ++b) g_log_std[j] += (*bls[b])[j];
    }
  }
  std::vector<float> &gls = c.gls;
  gls.resize(act_dim);
  double sq = 0.0;
  for (int k = 0; k < c.nl; ++k) {
    const Layer &L = c.layer(k);
    sq += sum_squares(L.gw.data(), static_cast<int64_t>(L.gw.size()));
    sq += sum_squares(L.gb.data(), static_cast<int64_t>(L.gb.size()));
  }
  if (!c.discrete) {
    for (int j = 0; j < act_dim; ++j) {
      gls[j] = static_cast<float>(g_log_std[j]);
      sq += static_cast<double>(gls[j]) * gls[j];
    }
  }
  if (!(sq <= FLT_MAX)) return false;  // (as the graph's float32 global norm: beyond ~1.8e19 it is inf; NaN too)
  const float norm = static_cast<float>(std::sqrt(sq));
  const float coef = std::min(c.max_norm / (norm + 1e-6f), 1.0f);

  const float beta1 = c.beta1, beta2 = c.beta2, eps = c.eps, lr = c.lr;
  const float b1p = *c.beta1_power * beta1, b2p = *c.beta2_power * beta2;
  *c.beta1_power = b1p;
  *c.beta2_power = b2p;
  c.global_step[0] += 1;
  const float lr_t = static_cast<float>(lr * std::sqrt(1.0 - b2p) / (1 - b1p));
  for (int k = 0; k < c.nl; ++k) {
    Layer &L = c.layer(k);
    adam(L.w, L.mw, L.vw, L.gw.data(), static_cast<int64_t>(L.out) * L.in, coef, lr_t, beta1, beta2, eps);
    adam(L.b, L.mb, L.vb, L.gb.data(), L.out, coef, lr_t, beta1, beta2, eps);
    L.load(L.w, L.in, L.b);  // the GEMMs' copies of the new weights, while they are in cache
  }
  if (!c.discrete) adam(c.log_std, c.m_log_std, c.v_log_std, gls.data(), act_dim, coef, lr_t, beta1, beta2, eps);
  return true;
}
