// Fused actor-critic acting kernel for MindSpore ops.Custom(func_type="aot") on CPU.
//
// One call computes, for every row of the observation batch: the policy MLP (all layers + activations +
// action head), the value MLP, the action sample from externally drawn noise (Gumbel-max for Categorical,
// mean + exp(log_std) * noise for the diagonal Gaussian) and its log-probability. Inference only: there is no
// backward; scalebox_ms registers no bprop, so differentiating through it fails at graph compile time.
//
// Inputs (params[0 .. nparam-2]) as enum Input, all float32 unless noted:
//   kInObs     (B, obs_dim)
//   kInNoise   (B, act_dim)          Gumbel noise (discrete) or standard normal noise (continuous)
//   kInMeta    int32 (kNMlpMeta + n_pi + n_vf,): MlpMeta (mlp.h), then the logical output width of every policy
//              layer, then of every value layer
//   kInLogStd  (act_dim,)            ignored for discrete actions
//   kInLayers  W_0, b_0, W_1, b_1, ... policy layers, then value layers; W (rows, cols) row-major with
//              rows >= logical out and cols >= logical in (FusedDense storage is zero-padded; only the logical
//              block is read, using cols as the row stride)
// Output (params[nparam-1]): float32 (B, W + 2) = [action(s) | log_prob | value], W = 1 (discrete) or act_dim.
// Returns a Status (status.h); no exception leaves the kernel.
//
// Layout of the computation: rows are processed in blocks of kBlock through all layers (activations stay in
// L1). Each layer's logical weight is transposed once per call into scratch (in, outp) with the output
// dimension zero-padded to a multiple of kCols, so the inner loop is mlp.h's register-blocked kRows x kCols
// outer-product update (a small GEMM micro-kernel the compiler vectorises; no reassociation, so no -ffast-math).
// Batches of at least kSplitRows rows (a compiled rollout over thousands of envs) share their blocks out to
// kernel_threads() threads (threads.h: SCALEBOX_MS_KERNEL_THREADS, else the hardware threads capped at 8), each a
// contiguous run of whole blocks; every row's outputs depend on that row only, so the results do not depend on the
// thread count. Batches of at most kDirectRows rows (one env acting per call: the MuJoCo presets) skip that transpose, which
// then costs more than the arithmetic: each output is a dot product over the stored W row, in the same k order
// from the bias, and the activation runs through the same vector code on the zero-padded row.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <thread>
#include <utility>
#include <vector>

#include "status.h"  // return codes, guarded

namespace {

#include "simd.h"     // kCols, round_up, vf, loadv/storev, tanhv (SIMD width from -march)
#include "threads.h"  // kernel_threads, run_parallel
#include "mlp.h"      // gemm, Dense, mlp_forward, MlpMeta, Activation

constexpr int kBlock = kRows == 6 ? 24 : 16;  // rows per pass through the MLPs (whole micro-tiles)
constexpr int kDirectRows = 4;  // batches up to this many rows read W as stored (no transposed copy)
constexpr int kSplitRows = 2048;  // larger batches: their row blocks shared out to kernel_threads() threads

// One stored layer as the direct path reads it: W (out, in) with row stride ld, b (out,).
struct StoredDense {
  const float *w = nullptr, *b = nullptr;
  int64_t ld = 0;
  int in = 0, out = 0;
};

// The MLP on one row x: returns the head's output (padded to a multiple of kCols) in buf0 or buf1 (maxw wide).
inline const float *direct_mlp(const std::vector<StoredDense> &layers, const float *x, float *buf0, float *buf1,
                               int act) {
  const float *cur = x;
  float *bufs[2] = {buf0, buf1};
  for (size_t l = 0; l < layers.size(); ++l) {
    const StoredDense &L = layers[l];
    float *y = bufs[l & 1];
    const int outp = round_up(L.out, kCols);
    int o = 0;
    // kChains outputs at a time: independent FMA chains, so the core overlaps them instead of waiting out each
    // FMA's latency (one chain of 256 FMAs per output of a 256-wide layer); each output is still its own chain
    // from the bias in k order, so the results are those of one output at a time.
    constexpr int kChains = 8;
    for (; o + kChains <= L.out; o += kChains) {
      float acc[kChains];
      const float *w[kChains];
      for (int j = 0; j < kChains; ++j) {
        acc[j] = L.b[o + j];
        w[j] = L.w + static_cast<int64_t>(o + j) * L.ld;
      }
      for (int k = 0; k < L.in; ++k) {
        const float xk = cur[k];
        for (int j = 0; j < kChains; ++j) acc[j] += xk * w[j][k];
      }
      for (int j = 0; j < kChains; ++j) y[o + j] = acc[j];
    }
    for (; o < L.out; ++o) {
      const float *w = L.w + o * L.ld;
      float acc = L.b[o];
      for (int k = 0; k < L.in; ++k) acc += cur[k] * w[k];
      y[o] = acc;
    }
    for (int o = L.out; o < outp; ++o) y[o] = 0.0f;
    const int a = l + 1 < layers.size() ? act : kActNone;
    if (a == kActTanh) {
      for (int o = 0; o < outp; o += kVec) storev(y + o, tanhv(loadv(y + o)));
    } else if (a == kActRelu) {
      for (int o = 0; o < L.out; ++o) y[o] = y[o] > 0.0f ? y[o] : 0.0f;
    }
    cur = y;
  }
  return cur;
}

enum Input : int { kInObs, kInNoise, kInMeta, kInLogStd, kInLayers };

// Runs an MLP over a block of rows: x (nrows, in0) -> returned buffer (nrows, last outp), row stride maxw.
inline const float *run_mlp(const std::vector<Dense> &layers, const float *x, int xs, int nrows, float *buf0,
                            float *buf1, int maxw, int act) {
  float *bufs[2] = {buf0, buf1};
  return mlp_forward(layers, x, xs, nrows, act,
                     [&](size_t l) { return std::pair<float *, int64_t>(bufs[l & 1], maxw); });
}

int act(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes) {
  if (nparam < kInLayers + 2) return kErrInputCount;
  // (every size the kernel reads or writes is checked against the inputs' shapes: a short log_std, meta or output
  // was read or written past its end)
  if (ndims[kInMeta] != 1 || std::strcmp(dtypes[kInMeta], "int32") != 0 || shapes[kInMeta][0] < kNMlpMeta)
    return kErrMeta;
  const int32_t *meta = static_cast<const int32_t *>(params[kInMeta]);
  const int n_pi = meta[kMetaNPi], n_vf = meta[kMetaNVf], discrete = meta[kMetaDiscrete],
            activation = meta[kMetaActivation], obs_dim = meta[kMetaObsDim], act_dim = meta[kMetaActDim];
  if (n_pi < 1 || n_vf < 1 || n_pi > kMaxLayers || n_vf > kMaxLayers) return kErrLayerCount;
  if (shapes[kInMeta][0] != kNMlpMeta + n_pi + n_vf || (activation != kActTanh && activation != kActRelu))
    return kErrMeta;
  if (nparam != kInLayers + 2 * (n_pi + n_vf) + 1) return kErrParamCount;
  for (int i = 0; i < nparam; ++i) {
    if (i == kInMeta) continue;
    if (std::strcmp(dtypes[i], "float32") != 0) return kErrDtype;
  }
  if (ndims[kInObs] != 2 || shapes[kInObs][1] != obs_dim || ndims[kInNoise] != 2 || shapes[kInNoise][1] != act_dim ||
      shapes[kInNoise][0] != shapes[kInObs][0])  // (fewer noise rows: the kernel read past their end)
    return kErrShape;
  const int64_t batch = shapes[kInObs][0];
  const float *obs = static_cast<const float *>(params[kInObs]);
  const float *noise = static_cast<const float *>(params[kInNoise]);
  const float *log_std = static_cast<const float *>(params[kInLogStd]);
  float *out = static_cast<float *>(params[nparam - 1]);
  const int width = discrete ? 1 : act_dim;
  const int out_stride = width + 2;
  if ((!discrete && numel(ndims[kInLogStd], shapes[kInLogStd]) != act_dim) || ndims[nparam - 1] != 2 ||
      shapes[nparam - 1][0] != batch || shapes[nparam - 1][1] != out_stride)
    return kErrShape;

  const bool direct = batch <= kDirectRows;
  std::vector<Dense> pi(direct ? 0 : n_pi), vf(direct ? 0 : n_vf);
  std::vector<StoredDense> spi(n_pi), svf(n_vf);
  int maxw = kCols;
  for (int k = 0; k < n_pi + n_vf; ++k) {
    StoredDense &S = k < n_pi ? spi[k] : svf[k - n_pi];
    const int pw = kInLayers + 2 * k, pb = pw + 1;
    if (ndims[pw] != 2 || ndims[pb] != 1) return kErrLayerShape;
    const int64_t cols = shapes[pw][1];  // storage row stride (>= logical in for padded FusedDense storage)
    const int out_k = meta[kNMlpMeta + k];
    const bool first = (k == 0 || k == n_pi);
    const int in_k = first ? obs_dim : (k < n_pi ? spi[k - 1].out : svf[k - n_pi - 1].out);
    if (out_k < 1 || out_k > shapes[pw][0] || in_k > cols || out_k > shapes[pb][0]) return kErrLayerShape;
    S = StoredDense{static_cast<const float *>(params[pw]), static_cast<const float *>(params[pb]), cols, in_k, out_k};
    maxw = std::max(maxw, round_up(out_k, kCols));
    if (!direct) {
      Dense &L = k < n_pi ? pi[k] : vf[k - n_pi];
      L.shape(in_k, out_k, false);
      L.load(S.w, cols, S.b);
    }
  }
  if (spi.back().out != act_dim || svf.back().out != 1) return kErrHeadShape;

  float ls_sum = 0.0f;
  std::vector<float> std_(act_dim), inv_std(act_dim);
  if (!discrete) {
    for (int j = 0; j < act_dim; ++j) {
      std_[j] = std::exp(log_std[j]);
      inv_std[j] = std::exp(-log_std[j]);
      ls_sum += log_std[j];
    }
  }
  // Rows r_begin .. r_end-1 in blocks of kBlock through both MLPs, then the per-row sampling; each row's outputs
  // depend on that row only, so how the rows are shared out to threads never changes a result.
  auto run_rows = [&](int64_t r_begin, int64_t r_end) {
    std::vector<float> buf(static_cast<size_t>(4) * kBlock * maxw);
    float *b0 = buf.data(), *b1 = b0 + kBlock * maxw, *b2 = b1 + kBlock * maxw, *b3 = b2 + kBlock * maxw;
    for (int64_t r0 = r_begin; r0 < r_end; r0 += kBlock) {
      const int nrows = static_cast<int>(std::min<int64_t>(kBlock, r_end - r0));
      const float *x = obs + r0 * obs_dim;
      const float *head = direct ? nullptr : run_mlp(pi, x, obs_dim, nrows, b0, b1, maxw, activation);
      const float *val = direct ? nullptr : run_mlp(vf, x, obs_dim, nrows, b2, b3, maxw, activation);
      for (int r = 0; r < nrows; ++r) {
        const float *h = direct ? direct_mlp(spi, x + r * obs_dim, b0, b1, activation) : head + r * maxw;
        const float v = direct ? direct_mlp(svf, x + r * obs_dim, b2, b3, activation)[0] : val[r * maxw];
        const float *nz = noise + (r0 + r) * act_dim;
        float *o = out + (r0 + r) * out_stride;
        if (discrete) {
          int best = 0;
          float best_v = h[0] + nz[0], mx = h[0];
          for (int j = 1; j < act_dim; ++j) {
            const float v = h[j] + nz[j];
            if (v > best_v) { best_v = v; best = j; }
            mx = std::max(mx, h[j]);
          }
          float s = 0.0f;
          for (int j = 0; j < act_dim; ++j) s += std::exp(h[j] - mx);
          o[0] = static_cast<float>(best);
          o[1] = h[best] - mx - std::log(s);
        } else {
          float lp = 0.0f;
          for (int j = 0; j < act_dim; ++j) {
            const float a = h[j] + std_[j] * nz[j];
            const float z = (a - h[j]) * inv_std[j];
            o[j] = a;
            lp += -0.5f * z * z;
          }
          o[width] = lp - ls_sum - kHalfLog2Pi * act_dim;
        }
        o[width + 1] = v;
      }
    }
  };
  const int64_t blocks = (batch + kBlock - 1) / kBlock;
  const int T = batch < kSplitRows ? 1 : static_cast<int>(std::min<int64_t>(kernel_threads(), blocks));
  if (T == 1) {
    run_rows(0, batch);
  } else {  // thread t: a contiguous run of whole blocks
    run_parallel(T, false, [&](int t) {
      run_rows(std::min(batch, blocks * t / T * kBlock), std::min(batch, blocks * (t + 1) / T * kBlock));
    });
  }
  return kOk;
}

}  // namespace

extern "C" int FusedActorMLP(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                             void *stream, void *extra) {
  (void)stream;
  (void)extra;
  return guarded([&] { return act(nparam, params, ndims, shapes, dtypes); });
}
