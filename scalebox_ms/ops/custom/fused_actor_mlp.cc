// Fused actor-critic acting kernel for MindSpore ops.Custom(func_type="aot") on CPU.
//
// One call computes, for every row of the observation batch: the policy MLP (all layers + activations +
// action head), the value MLP, the action sample from externally drawn noise (Gumbel-max for Categorical,
// mean + exp(log_std) * noise for the diagonal Gaussian) and its log-probability. Inference only: there is no
// backward; scalebox_ms registers no bprop, so differentiating through it fails at graph compile time.
//
// Inputs (params[0 .. nparam-2]), all float32 unless noted:
//   0 obs     (B, obs_dim)
//   1 noise   (B, act_dim)          Gumbel noise (discrete) or standard normal noise (continuous)
//   2 meta    int32 (6 + n_pi + n_vf,): n_pi, n_vf, discrete, activation (0 tanh, 1 relu), obs_dim, act_dim,
//             then the logical output width of every policy layer, then of every value layer
//   3 log_std (act_dim,)            ignored for discrete actions
//   4 ..      W_0, b_0, W_1, b_1, ... policy layers, then value layers; W (rows, cols) row-major with
//             rows >= logical out and cols >= logical in (FusedDense storage is zero-padded; only the logical
//             block is read, using cols as the row stride)
// Output (params[nparam-1]): float32 (B, W + 2) = [action(s) | log_prob | value], W = 1 (discrete) or act_dim.
//
// Layout of the computation: rows are processed in blocks of kBlock through all layers (activations stay in
// L1). Each layer's logical weight is transposed once per call into scratch (in, out16) with the output
// dimension zero-padded to a multiple of kCols, so the inner loop is a register-blocked kRows x kCols
// outer-product update (a small GEMM micro-kernel the compiler vectorises; no reassociation, so no -ffast-math).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

constexpr int kBlock = 16;  // rows per pass through the MLPs
constexpr int kCols = 16;   // outputs per micro-tile
constexpr int kMaxLayers = 16;

#include "simd.h"  // round_up, vf, loadv/storev, tanhv (SIMD width from -march)

struct Layer {
  int in, out, outp;       // logical sizes; outp = out rounded up to kCols
  std::vector<float> wt;   // logical weight transposed, (in, outp), zero-padded columns
  std::vector<float> bias; // (outp,), zero-padded
};

// y[r, :outp] = act(bias + x[r, :in] @ wt) for ROWS rows starting at x / y (ROWS x kCols accumulators).
template <int ROWS>
SBX_INLINE void tile_rows(const Layer &L, const float *__restrict x, int xs, float *__restrict y, int ys, int act) {
  const int in = L.in, outp = L.outp;
  const float *__restrict wt = L.wt.data();
  for (int o0 = 0; o0 < outp; o0 += kCols) {
    vf acc[ROWS][kNV];
    for (int v = 0; v < kNV; ++v) {
      const vf b = loadv(L.bias.data() + o0 + v * kVec);
      for (int r = 0; r < ROWS; ++r) acc[r][v] = b;
    }
    for (int i = 0; i < in; ++i) {
      const float *w = wt + static_cast<int64_t>(i) * outp + o0;
      vf wv[kNV];
      for (int v = 0; v < kNV; ++v) wv[v] = loadv(w + v * kVec);
      for (int r = 0; r < ROWS; ++r) {
        const float xv = x[r * xs + i];
        for (int v = 0; v < kNV; ++v) acc[r][v] += xv * wv[v];
      }
    }
    for (int r = 0; r < ROWS; ++r) {
      for (int v = 0; v < kNV; ++v) {
        vf a = acc[r][v];
        if (act == 0) a = tanhv(a);
        else if (act == 1) a = a > 0.0f ? a : 0.0f;
        storev(y + r * ys + o0 + v * kVec, a);
      }
    }
  }
}

inline void affine(const Layer &L, const float *x, int xs, int nrows, float *y, int ys, int act) {
  int r = 0;
  for (; r + kRows <= nrows; r += kRows) tile_rows<kRows>(L, x + r * xs, xs, y + r * ys, ys, act);
  for (; r < nrows; ++r) tile_rows<1>(L, x + r * xs, xs, y + r * ys, ys, act);
}

// Runs an MLP over a block of rows: x (nrows, in0) -> returned buffer (nrows, last outp), row stride maxw.
inline const float *run_mlp(const std::vector<Layer> &layers, const float *x, int xs, int nrows, float *buf0,
                            float *buf1, int maxw, int act) {
  const float *cur = x;
  int cur_stride = xs;
  float *bufs[2] = {buf0, buf1};
  for (size_t l = 0; l < layers.size(); ++l) {
    float *dst = bufs[l & 1];
    affine(layers[l], cur, cur_stride, nrows, dst, maxw, l + 1 < layers.size() ? act : -1);
    cur = dst;
    cur_stride = maxw;
  }
  return cur;
}

}  // namespace

extern "C" int FusedActorMLP(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                             void *stream, void *extra) {
  (void)stream;
  (void)extra;
  if (nparam < 6) return 1;
  const int32_t *meta = static_cast<const int32_t *>(params[2]);
  const int n_pi = meta[0], n_vf = meta[1], discrete = meta[2], act = meta[3], obs_dim = meta[4],
            act_dim = meta[5];
  if (n_pi < 1 || n_vf < 1 || n_pi > kMaxLayers || n_vf > kMaxLayers) return 2;
  if (nparam != 4 + 2 * (n_pi + n_vf) + 1) return 3;
  for (int i = 0; i < nparam; ++i) {
    if (i == 2) continue;
    if (std::strcmp(dtypes[i], "float32") != 0) return 4;
  }
  if (ndims[0] != 2 || shapes[0][1] != obs_dim || ndims[1] != 2 || shapes[1][1] != act_dim) return 5;
  const int64_t batch = shapes[0][0];
  const float *obs = static_cast<const float *>(params[0]);
  const float *noise = static_cast<const float *>(params[1]);
  const float *log_std = static_cast<const float *>(params[3]);
  float *out = static_cast<float *>(params[nparam - 1]);
  const int width = discrete ? 1 : act_dim;
  const int out_stride = width + 2;

  std::vector<Layer> pi(n_pi), vf(n_vf);
  int maxw = kCols;
  for (int k = 0; k < n_pi + n_vf; ++k) {
    Layer &L = k < n_pi ? pi[k] : vf[k - n_pi];
    const int pw = 4 + 2 * k, pb = pw + 1;
    if (ndims[pw] != 2 || ndims[pb] != 1) return 6;
    const float *w = static_cast<const float *>(params[pw]);
    const float *b = static_cast<const float *>(params[pb]);
    const int64_t cols = shapes[pw][1];  // storage row stride (>= logical in for padded FusedDense storage)
    L.out = meta[6 + k];
    const bool first = (k == 0 || k == n_pi);
    L.in = first ? obs_dim : (k < n_pi ? pi[k - 1].out : vf[k - n_pi - 1].out);
    if (L.out < 1 || L.out > shapes[pw][0] || L.in > cols || L.out > shapes[pb][0]) return 7;
    L.outp = round_up(L.out, kCols);
    L.wt.assign(static_cast<size_t>(L.in) * L.outp, 0.0f);
    L.bias.assign(L.outp, 0.0f);
    for (int o = 0; o < L.out; ++o) {
      L.bias[o] = b[o];
      for (int i = 0; i < L.in; ++i) L.wt[static_cast<size_t>(i) * L.outp + o] = w[o * cols + i];
    }
    maxw = std::max(maxw, L.outp);
  }
  if (pi.back().out != act_dim || vf.back().out != 1) return 8;

  static const float kHalfLog2Pi = 0.918938533204672741780329736406f;
  std::vector<float> buf(static_cast<size_t>(4) * kBlock * maxw);
  float *b0 = buf.data(), *b1 = b0 + kBlock * maxw, *b2 = b1 + kBlock * maxw, *b3 = b2 + kBlock * maxw;
  float ls_sum = 0.0f;
  std::vector<float> std_(act_dim), inv_std(act_dim);
  if (!discrete) {
    for (int j = 0; j < act_dim; ++j) {
      std_[j] = std::exp(log_std[j]);
      inv_std[j] = std::exp(-log_std[j]);
      ls_sum += log_std[j];
    }
  }
  for (int64_t r0 = 0; r0 < batch; r0 += kBlock) {
    const int nrows = static_cast<int>(std::min<int64_t>(kBlock, batch - r0));
    const float *x = obs + r0 * obs_dim;
    const float *head = run_mlp(pi, x, obs_dim, nrows, b0, b1, maxw, act);
    const float *val = run_mlp(vf, x, obs_dim, nrows, b2, b3, maxw, act);
    for (int r = 0; r < nrows; ++r) {
      const float *h = head + r * maxw;
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
      o[width + 1] = val[r * maxw];
    }
  }
  return 0;
}
