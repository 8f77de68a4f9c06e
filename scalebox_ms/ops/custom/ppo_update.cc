// Whole PPO minibatch update as one MindSpore ops.Custom(func_type="aot") kernel on CPU.
//
// One call does what scalebox_ms.trainers.ppo_update.PPOUpdateStep does in ~220 MindSpore kernels: gather the
// minibatch rows, forward the policy and value MLPs, the PPO loss (masked means, advantage normalisation,
// clipped surrogate, optional SB3 value clipping, entropy bonus), the manual backward for every parameter, the
// global grad-norm clip and MindSpore nn.Adam's update (P.Adam's CPU formula), skipped when approx_kl > kl_limit
// and target_kl is set. The model's Parameters and Adam's state are inputs that the kernel WRITES IN PLACE (on
// CPU graph mode MindSpore hands an aot kernel the Parameters' own memory; update.py and the tests check that
// other graphs and Parameter.asnumpy() see the writes).
//
// Inputs (params[0 .. nparam-2]), float32 unless noted:
//   0 features (B, obs_dim + 5) [obs | old_log_prob | old_value | advantage | return | mask]
//   1 actions  int32 (B,) (discrete) or (B, act_dim)
//   2 indices  int32 (M,) minibatch rows
//   3 learning_rate, 4 clip_range, 5 clip_range_vf, 6 kl_limit: scalars (any shape, first element read)
//   7 meta int32: n_pi, n_vf, discrete, activation (0 tanh, 1 relu), obs_dim, act_dim, normalize_advantage,
//     clip_value, kl_stop, then the output width of every policy layer, then of every value layer
//   8 hyper: ent_coef, vf_coef, max_grad_norm, beta1, beta2, eps
//   9 Adam learning_rate Parameter (written: learning_rate), 10 beta1_power, 11 beta2_power (written when the
//     step is applied), 12 global_step int32 (written when applied)
//   13 log_std (act_dim,), 14 its moment1, 15 its moment2 (ignored for discrete actions)
//   16 ..: W_0, b_0, W_1, b_1, ... (policy layers, then value layers; nn.Dense layout W (out, in)), then the
//     moment1 of each in the same order, then the moment2 of each
// Output (params[nparam-1]): float32 (9,) [loss, policy_loss, value_loss, entropy_loss, approx_kl,
//   clip_fraction, kl_ok, finite (1), loss_scale (1)].
//
// PPOUpdateEpochs (second entry point, same inputs): indices int32 (n_mb, M), one minibatch per row in the order
// they are to run (epoch-major); output float32 (n_mb, 10): per row the 9 statistics above and `ran` (1 if the row
// ran). The rows run sequentially through the same per-minibatch code as PPOUpdate (bit-identical to n_mb
// PPOUpdate calls); with kl_stop the first row whose kl_ok is 0 (step skipped, statistics reported) ends the call
// and the later rows are all 0. Scratch buffers are allocated once per call. Every index is checked before
// anything is written.
//
// Threads (large minibatches only): a minibatch of M >= 2048 rows is split into ceil(M / 512) contiguous blocks of
// rows whose partial sums and gradients are combined in the fixed block order, the blocks shared out to T threads
// (T = SCALEBOX_MS_KERNEL_THREADS if set to an integer >= 1, else std::thread::hardware_concurrency() capped at 8;
// read on every kernel call; never more threads than blocks). Results are deterministic and do not depend on T
// (nor on scheduling): T = 1 and T = 8 give bit-identical results. The block split itself changes the float
// summation order against one pass over all M rows (differences ~1e-7 relative per step). Minibatches under 2048
// rows (e.g. CartPole's 256) run the original single-thread code with no thread started. Blocks of 512 rows also
// keep the activations in L2: single-threaded, 4096 rows take ~3.9 ms in blocks vs ~8.6 ms in one pass.
// PPOUpdateThreads(rows) / PPOUpdateBlocks(rows) (extern "C", ctypes) report the T and block count a minibatch
// would use.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <atomic>
#include <new>
#include <stdexcept>
#include <thread>
#include <vector>

namespace {

constexpr int kCols = 16;  // outputs per micro-tile; every activation / gradient buffer is padded to it
constexpr int kMaxLayers = 16;
constexpr int N_STATS_OUT = 9;  // statistics per minibatch
constexpr int kMinSplitRows = 2048;  // smaller minibatches: one block, no threads (the original code path)
#ifndef SBX_BLOCK_ROWS
#define SBX_BLOCK_ROWS 512
#endif
constexpr int kBlockRows = SBX_BLOCK_ROWS;  // larger ones: blocks of <= kBlockRows rows (activations stay in L2)

#include "simd.h"  // round_up, vf, loadv/storev, tanhv (SIMD width from -march)

// C[r, :N] = (bias | 0) + sum_k A(r, k) * B[k, :N] for ROWS rows; A(r, k) = A[r * sar + k * sak]; N % kCols == 0.
template <int ROWS>
SBX_INLINE void tile(int K, const float *__restrict A, int64_t sar, int64_t sak, const float *__restrict B, int ldb,
                     float *__restrict C, int ldc, int N, const float *__restrict bias) {
  for (int n0 = 0; n0 < N; n0 += kCols) {
    vf acc[ROWS][kNV];
    for (int v = 0; v < kNV; ++v) {
      const vf b = bias ? loadv(bias + n0 + v * kVec) : vf{} ;
      for (int r = 0; r < ROWS; ++r) acc[r][v] = b;
    }
    for (int k = 0; k < K; ++k) {
      const float *bp = B + static_cast<int64_t>(k) * ldb + n0;
      vf bv[kNV];
      for (int v = 0; v < kNV; ++v) bv[v] = loadv(bp + v * kVec);
      for (int r = 0; r < ROWS; ++r) {
        const float a = A[r * sar + k * sak];
        for (int v = 0; v < kNV; ++v) acc[r][v] += a * bv[v];
      }
    }
    for (int r = 0; r < ROWS; ++r)
      for (int v = 0; v < kNV; ++v) storev(C + static_cast<int64_t>(r) * ldc + n0 + v * kVec, acc[r][v]);
  }
}

void gemm(int rows, int N, int K, const float *A, int64_t sar, int64_t sak, const float *B, int ldb, float *C,
          int ldc, const float *bias) {
  int r = 0;
  for (; r + kRows <= rows; r += kRows) tile<kRows>(K, A + r * sar, sar, sak, B, ldb, C + static_cast<int64_t>(r) * ldc, ldc, N, bias);
  for (; r < rows; ++r) tile<1>(K, A + r * sar, sar, sak, B, ldb, C + static_cast<int64_t>(r) * ldc, ldc, N, bias);
}

struct Layer {
  int in, out, inp, outp;         // logical sizes and sizes rounded up to kCols
  float *w, *b, *mw, *mb, *vw, *vb;  // Parameters (in place), nn.Dense layout
  std::vector<float> wt;          // W transposed (in, outp), zero-padded
  std::vector<float> wp;          // W (out, inp), zero-padded (backward to the layer input)
  std::vector<float> bias;        // (outp,)
  std::vector<float> gw, gb;      // dL/dW (out, in), dL/db (out,): the whole minibatch's (all blocks combined)
};

// Per-thread buffers of one layer for a block of rows (thread-private; the weights above are shared, read-only).
struct LayerBuf {
  std::vector<float> h;           // layer output after activation (rows, outp)
  std::vector<float> gwt;         // this block's dL/dW transposed (in, outp)
  std::vector<double> gbd;        // this block's dL/db (outp,)
};

void forward(const std::vector<Layer> &net, std::vector<LayerBuf> &buf, const float *x, int ldx, int M, int act) {
  const float *cur = x;
  int ld = ldx;
  for (size_t l = 0; l < net.size(); ++l) {
    const Layer &L = net[l];
    LayerBuf &Bf = buf[l];
    Bf.h.resize(static_cast<size_t>(M) * L.outp);
    gemm(M, L.outp, L.in, cur, ld, 1, L.wt.data(), L.outp, Bf.h.data(), L.outp, L.bias.data());
    if (l + 1 < net.size()) {
      float *h = Bf.h.data();
      const int64_t n = static_cast<int64_t>(M) * L.outp;
      if (act == 0) {
        for (int64_t i = 0; i < n; i += kVec) storev(h + i, tanhv(loadv(h + i)));
      } else {
        for (int64_t i = 0; i < n; ++i) h[i] = h[i] > 0.0f ? h[i] : 0.0f;
      }
    }
    cur = Bf.h.data();
    ld = L.outp;
  }
}

// delta: dL/d(last layer pre-activation output) (M, outp of the last layer); fills gwt, gbd of every layer's buf.
void backward(const std::vector<Layer> &net, std::vector<LayerBuf> &buf, const float *x, int ldx, int M, int act,
              std::vector<float> &delta, std::vector<float> &tmp) {
  for (int l = static_cast<int>(net.size()) - 1; l >= 0; --l) {
    const Layer &L = net[l];
    LayerBuf &Bf = buf[l];
    const float *in = l == 0 ? x : buf[l - 1].h.data();
    const int ldi = l == 0 ? ldx : net[l - 1].outp;
    // dW^T (in, outp) = H_in^T (in, M) @ delta (M, outp)
    Bf.gwt.resize(static_cast<size_t>(L.in) * L.outp);
    gemm(L.in, L.outp, M, in, 1, ldi, delta.data(), L.outp, Bf.gwt.data(), L.outp, nullptr);
    std::vector<double> &gb = Bf.gbd;
    gb.assign(L.outp, 0.0);
    for (int r = 0; r < M; ++r) {
      const float *d = delta.data() + static_cast<int64_t>(r) * L.outp;
      for (int o = 0; o < L.out; ++o) gb[o] += d[o];
    }
    if (l == 0) break;
    // dL/dH_in (M, inp) = delta (M, out) @ W (out, inp), then through the activation of layer l-1
    tmp.resize(static_cast<size_t>(M) * L.inp);
    gemm(M, L.inp, L.out, delta.data(), L.outp, 1, L.wp.data(), L.inp, tmp.data(), L.inp, nullptr);
    const float *h = buf[l - 1].h.data();
    const int64_t n = static_cast<int64_t>(M) * L.inp;
    float *t = tmp.data();
    if (act == 0) {
      for (int64_t i = 0; i < n; ++i) t[i] *= 1.0f - h[i] * h[i];
    } else {
      for (int64_t i = 0; i < n; ++i) t[i] = h[i] > 0.0f ? t[i] : 0.0f;
    }
    delta.swap(tmp);
  }
}

// gw, gb of every layer from the T blocks' partial gradients, summed in the fixed order block 0, 1, ..., T-1 (gwt
// in float, gbd in double); with one block this is exactly that block's gradient (the single-thread path).
void combine_grads(std::vector<Layer> &net, const std::vector<std::vector<LayerBuf> *> &bufs) {
  const size_t T = bufs.size();
  for (size_t l = 0; l < net.size(); ++l) {
    Layer &L = net[l];
    L.gw.resize(static_cast<size_t>(L.out) * L.in);
    L.gb.resize(L.out);
    for (int o = 0; o < L.out; ++o) {
      double gb = (*bufs[0])[l].gbd[o];
      for (size_t t = 1; t < T; ++t) gb += (*bufs[t])[l].gbd[o];
      L.gb[o] = static_cast<float>(gb);
      for (int i = 0; i < L.in; ++i) {
        const size_t k = static_cast<size_t>(i) * L.outp + o;
        float g = (*bufs[0])[l].gwt[k];
        for (size_t t = 1; t < T; ++t) g += (*bufs[t])[l].gwt[k];
        L.gw[static_cast<size_t>(o) * L.in + i] = g;
      }
    }
  }
}

// d clip_by_value(x, lo, hi) / dx as MindSpore computes it (0.5 at the bounds).
inline float clip_grad(float x, float lo, float hi) {
  if (x > lo && x < hi) return 1.0f;
  if (x == lo || x == hi) return 0.5f;
  return 0.0f;
}

inline float clampf(float x, float lo, float hi) { return std::min(std::max(x, lo), hi); }

// MindSpore P.Adam (CPU): m += (g - m)(1 - b1); v += (g^2 - v)(1 - b2); w -= lr_t m / (sqrt(v) + eps).
inline void adam(float *w, float *m, float *v, const float *g, int64_t n, float coef, float lr_t, float beta1,
                 float beta2, float eps) {
  const float c1 = 1.0f - beta1, c2 = 1.0f - beta2;
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i] * coef;
    m[i] += (gi - m[i]) * c1;
    v[i] += (gi * gi - v[i]) * c2;
    w[i] -= lr_t * m[i] / (std::sqrt(v[i]) + eps);
  }
}

// Thread-private state of one block of rows: layer buffers, loss gradients and partial sums.
struct Worker {
  std::vector<LayerBuf> pi, vf;
  std::vector<float> dpi, dv, tmp, p, ls;
  std::vector<double> g_log_std;
  double s_pol = 0, s_val = 0, s_ent = 0, s_kl = 0, s_clip = 0;
};

// The partial results of one block of rows (gradients in pi/vf[l].gwt, .gbd; h unused), moved out of the Worker
// that computed it.
struct BlockAcc {
  std::vector<LayerBuf> pi, vf;
  std::vector<double> g_log_std;
  double s_pol = 0, s_val = 0, s_ent = 0, s_kl = 0, s_clip = 0;
};

// Everything one kernel call needs: the inputs, the network (pointers into the Parameters plus padded copies)
// and scratch buffers that persist across the minibatches of one call (allocated once, sized for M rows).
struct Ctx {
  int n_pi = 0, n_vf = 0, nl = 0, discrete = 0, act = 0, obs_dim = 0, act_dim = 0, fw = 0;
  int threads = 1;  // kernel_threads(), read once per call
  bool normalize_adv = false, clip_value = false, kl_stop = false;
  int64_t B = 0;
  const float *features = nullptr;
  const void *actions = nullptr;
  float lr = 0, clip = 0, clip_vf = 0, kl_limit = 0;
  float ent_coef = 0, vf_coef = 0, max_norm = 0, beta1 = 0, beta2 = 0, eps = 0;
  float *lr_param = nullptr, *beta1_power = nullptr, *beta2_power = nullptr;
  int32_t *global_step = nullptr;
  float *log_std = nullptr, *m_log_std = nullptr, *v_log_std = nullptr;
  std::vector<Layer> pi, vf;
  // scratch: the gathered minibatch (shared, read-only while the blocks run), per-thread workers
  std::vector<float> x, old_lp, old_v, adv, ret, mask, a_cont, inv_std, gls;
  std::vector<int32_t> a_disc;
  float n = 1.0f, gauss_ent = 0.0f;
  std::vector<Worker> workers;  // one per thread
  std::vector<BlockAcc> blocks;  // one per block (split minibatches)
};

// Threads the kernel may use: SCALEBOX_MS_KERNEL_THREADS if it is an integer >= 1 (at most 64), else
// std::thread::hardware_concurrency() capped at 8.
int kernel_threads() {
  if (const char *e = std::getenv("SCALEBOX_MS_KERNEL_THREADS")) {
    char *end = nullptr;
    const long v = std::strtol(e, &end, 10);
    if (end != e && *end == '\0' && v >= 1) return static_cast<int>(std::min(v, 64L));
  }
  const unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : static_cast<int>(std::min(hw, 8u));
}

// Blocks of rows for a minibatch of M rows: 1 (the single-thread path) below kMinSplitRows rows, else
// ceil(M / kBlockRows) near-equal contiguous blocks. Depends on M only, never on the thread count.
inline int blocks_for(int M) { return M < kMinSplitRows ? 1 : (M + kBlockRows - 1) / kBlockRows; }

// Threads for a minibatch of M rows: min(threads, blocks_for(M)); 1 starts no thread.
inline int threads_for(int threads, int M) { return std::max(1, std::min(threads, blocks_for(M))); }

// Reads and checks every input but the indices and the output; nothing is written. idx_ndim: 1 (one minibatch)
// or 2 (n_mb minibatches). Returns 0 or an error code.
int setup(Ctx &c, int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, int idx_ndim) {
  if (nparam < 17) return 1;
  const int32_t *meta = static_cast<const int32_t *>(params[7]);
  c.n_pi = meta[0];
  c.n_vf = meta[1];
  c.discrete = meta[2];
  c.act = meta[3];
  c.obs_dim = meta[4];
  c.act_dim = meta[5];
  c.normalize_adv = meta[6] != 0;
  c.clip_value = meta[7] != 0;
  c.kl_stop = meta[8] != 0;
  if (c.n_pi < 1 || c.n_vf < 1 || c.n_pi > kMaxLayers || c.n_vf > kMaxLayers) return 2;
  const int n_pi = c.n_pi, nl = c.nl = c.n_pi + c.n_vf, discrete = c.discrete, obs_dim = c.obs_dim,
            act_dim = c.act_dim;
  if (nparam != 16 + 6 * nl + 1) return 3;
  for (int i = 0; i < nparam; ++i) {
    const bool is_int = i == 2 || i == 7 || i == 12 || (i == 1 && discrete);
    if (std::strcmp(dtypes[i], is_int ? "int32" : "float32") != 0) return 4;
  }
  const int fw = c.fw = obs_dim + 5;
  if (ndims[0] != 2 || shapes[0][1] != fw || ndims[2] != idx_ndim) return 5;
  const int64_t B = c.B = shapes[0][0];
  if (discrete ? (ndims[1] != 1 || shapes[1][0] != B) : (ndims[1] != 2 || shapes[1][0] != B || shapes[1][1] != act_dim))
    return 5;
  if (!discrete && (ndims[13] != 1 || shapes[13][0] != act_dim)) return 5;

  c.threads = kernel_threads();
  c.features = static_cast<const float *>(params[0]);
  c.actions = params[1];
  c.lr = *static_cast<const float *>(params[3]);
  c.clip = *static_cast<const float *>(params[4]);
  c.clip_vf = *static_cast<const float *>(params[5]);
  c.kl_limit = *static_cast<const float *>(params[6]);
  const float *hyper = static_cast<const float *>(params[8]);
  c.ent_coef = hyper[0];
  c.vf_coef = hyper[1];
  c.max_norm = hyper[2];
  c.beta1 = hyper[3];
  c.beta2 = hyper[4];
  c.eps = hyper[5];
  c.lr_param = static_cast<float *>(params[9]);
  c.beta1_power = static_cast<float *>(params[10]);
  c.beta2_power = static_cast<float *>(params[11]);
  c.global_step = static_cast<int32_t *>(params[12]);
  c.log_std = static_cast<float *>(params[13]);
  c.m_log_std = static_cast<float *>(params[14]);
  c.v_log_std = static_cast<float *>(params[15]);

  c.pi.assign(n_pi, Layer());
  c.vf.assign(c.n_vf, Layer());
  for (int k = 0; k < nl; ++k) {
    Layer &L = k < n_pi ? c.pi[k] : c.vf[k - n_pi];
    const int pw = 16 + 2 * k, pb = pw + 1;
    const bool first = (k == 0 || k == n_pi);
    L.in = first ? obs_dim : (k < n_pi ? c.pi[k - 1].out : c.vf[k - n_pi - 1].out);
    L.out = meta[9 + k];
    if (ndims[pw] != 2 || ndims[pb] != 1 || shapes[pw][0] != L.out || shapes[pw][1] != L.in || shapes[pb][0] != L.out)
      return 6;
    L.inp = round_up(L.in, kCols);
    L.outp = round_up(L.out, kCols);
    L.w = static_cast<float *>(params[pw]);
    L.b = static_cast<float *>(params[pb]);
    L.mw = static_cast<float *>(params[pw + 2 * nl]);
    L.mb = static_cast<float *>(params[pb + 2 * nl]);
    L.vw = static_cast<float *>(params[pw + 4 * nl]);
    L.vb = static_cast<float *>(params[pb + 4 * nl]);
    L.wt.assign(static_cast<size_t>(L.in) * L.outp, 0.0f);  // the padding stays zero; load_weights fills the rest
    L.wp.assign(static_cast<size_t>(L.out) * L.inp, 0.0f);
    L.bias.assign(L.outp, 0.0f);
  }
  if (c.pi.back().out != act_dim || c.vf.back().out != 1) return 7;
  return 0;
}

// Checks that every index is a row of the rollout (and its discrete action is valid) before anything is written.
int check_indices(const Ctx &c, const int32_t *idx, int64_t n) {
  for (int64_t r = 0; r < n; ++r) {
    const int64_t row = idx[r];
    if (row < 0 || row >= c.B) return 8;
    if (c.discrete) {
      const int32_t a = static_cast<const int32_t *>(c.actions)[row];
      if (a < 0 || a >= c.act_dim) return 9;
    }
  }
  return 0;
}

// The padded copies the GEMMs read, from the Parameters' current values.
void load_weights(std::vector<Layer> &net) {
  for (Layer &L : net) {
    for (int o = 0; o < L.out; ++o) {
      L.bias[o] = L.b[o];
      for (int i = 0; i < L.in; ++i) {
        const float w = L.w[static_cast<size_t>(o) * L.in + i];
        L.wt[static_cast<size_t>(i) * L.outp + o] = w;
        L.wp[static_cast<size_t>(o) * L.inp + i] = w;
      }
    }
  }
}

// Forward, per-row loss terms and (with_backward) backward of rows r0 .. r0+m-1 of the gathered minibatch into w
// (its layer buffers, partial sums and partial gradients). Reads only shared read-only state of c.
void run_block(const Ctx &c, Worker &w, int r0, int m, bool with_backward) {
  const int discrete = c.discrete, act = c.act, obs_dim = c.obs_dim, act_dim = c.act_dim;
  const float clip = c.clip, clip_vf = c.clip_vf, ent_coef = c.ent_coef, vf_coef = c.vf_coef, n = c.n;
  const float *log_std = c.log_std, *inv_std = c.inv_std.data();
  const float gauss_ent = c.gauss_ent;
  const float *x = c.x.data() + static_cast<int64_t>(r0) * obs_dim;
  const float *old_lp = c.old_lp.data() + r0, *old_v = c.old_v.data() + r0, *adv = c.adv.data() + r0,
              *ret = c.ret.data() + r0, *mask = c.mask.data() + r0;
  const int32_t *a_disc = discrete ? c.a_disc.data() + r0 : nullptr;
  const float *a_cont = discrete ? nullptr : c.a_cont.data() + static_cast<int64_t>(r0) * act_dim;
  w.pi.resize(c.pi.size());
  w.vf.resize(c.vf.size());
  forward(c.pi, w.pi, x, obs_dim, m, act);
  forward(c.vf, w.vf, x, obs_dim, m, act);
  const float *head = w.pi.back().h.data();
  const int hp = c.pi.back().outp;
  const float *vout = w.vf.back().h.data();
  const int vp = c.vf.back().outp;

  static const float kHalfLog2Pi = 0.918938533204672741780329736406f;
  const float lo = 1.0f - clip, hi = 1.0f + clip;
  std::vector<float> &dpi = w.dpi, &dv = w.dv;
  dpi.assign(static_cast<size_t>(m) * hp, 0.0f);
  dv.assign(static_cast<size_t>(m) * vp, 0.0f);
  std::vector<double> &g_log_std = w.g_log_std;
  g_log_std.assign(act_dim, 0.0);
  std::vector<float> &p = w.p, &ls = w.ls;
  p.resize(act_dim);
  ls.resize(act_dim);
  double s_pol = 0.0, s_val = 0.0, s_ent = 0.0, s_kl = 0.0, s_clip = 0.0;
  for (int r = 0; r < m; ++r) {
    const float *h = head + static_cast<int64_t>(r) * hp;
    const float mk = mask[r], wt = mk / n;
    float lp, ent;
    if (discrete) {
      float mx = h[0];
      for (int j = 1; j < act_dim; ++j) mx = std::max(mx, h[j]);
      float s = 0.0f;
      for (int j = 0; j < act_dim; ++j) s += std::exp(h[j] - mx);
      const float lse = mx + std::log(s);
      ent = 0.0f;
      for (int j = 0; j < act_dim; ++j) {
        ls[j] = h[j] - lse;
        p[j] = std::exp(ls[j]);
        ent -= p[j] * ls[j];
      }
      lp = ls[a_disc[r]];
    } else {
      lp = 0.0f;
      const float *a = a_cont + static_cast<int64_t>(r) * act_dim;
      for (int j = 0; j < act_dim; ++j) {
        const float z = (a[j] - h[j]) * inv_std[j];
        lp += -0.5f * z * z - log_std[j] - kHalfLog2Pi;
      }
      ent = gauss_ent;
    }
    const float log_ratio = lp - old_lp[r];
    const float ratio = std::exp(log_ratio);
    const float s1 = ratio * adv[r], s2 = clampf(ratio, lo, hi) * adv[r];
    s_pol += static_cast<double>(std::min(s1, s2)) * mk;
    s_kl += static_cast<double>((ratio - 1.0f) - log_ratio) * mk;
    s_clip += (std::fabs(ratio - 1.0f) > clip ? 1.0 : 0.0) * mk;
    s_ent += static_cast<double>(ent) * mk;
    // d min(s1, s2) / d ratio (MindSpore's Minimum splits ties; clip_by_value passes 0.5 at its bounds)
    const float cg = clip_grad(ratio, lo, hi);
    const float dmin = s1 < s2 ? adv[r] : (s1 > s2 ? adv[r] * cg : 0.5f * adv[r] + 0.5f * adv[r] * cg);
    const float c_lp = -wt * dmin * ratio;  // dL/dlog_prob
    const float c_ent = -ent_coef * wt;     // dL/dentropy
    float *d = dpi.data() + static_cast<int64_t>(r) * hp;
    if (discrete) {
      for (int j = 0; j < act_dim; ++j)
        d[j] = c_lp * ((j == a_disc[r] ? 1.0f : 0.0f) - p[j]) + c_ent * (-p[j] * (ls[j] + ent));
    } else {
      const float *a = a_cont + static_cast<int64_t>(r) * act_dim;
      for (int j = 0; j < act_dim; ++j) {
        const float z = (a[j] - h[j]) * inv_std[j];
        d[j] = c_lp * z * inv_std[j];
        g_log_std[j] += static_cast<double>(c_lp) * (z * z - 1.0f) + c_ent;
      }
    }
    // value loss
    const float v = vout[static_cast<int64_t>(r) * vp];
    float vc = v, dvc = 1.0f;
    if (c.clip_value) {
      vc = old_v[r] + clampf(v - old_v[r], -clip_vf, clip_vf);
      dvc = clip_grad(v - old_v[r], -clip_vf, clip_vf);
    }
    const float err = ret[r] - vc;
    s_val += static_cast<double>(err) * err * mk;
    dv[static_cast<int64_t>(r) * vp] = vf_coef * wt * 2.0f * (vc - ret[r]) * dvc;
  }
  w.s_pol = s_pol;
  w.s_val = s_val;
  w.s_ent = s_ent;
  w.s_kl = s_kl;
  w.s_clip = s_clip;
  if (with_backward) {
    backward(c.pi, w.pi, x, obs_dim, m, act, w.dpi, w.tmp);
    backward(c.vf, w.vf, x, obs_dim, m, act, w.dv, w.tmp);
  }
}

// One minibatch update (rows idx[0 .. M-1], already checked); writes the 9 statistics to out. noinline: both entry
// points run the very same code, so their results are bit-identical.
//
// Threads: the minibatch-wide quantities (gather, mask count, advantage mean/std) are computed first. Minibatches
// of at least kMinSplitRows rows are then split into NB = blocks_for(M) contiguous blocks of <= kBlockRows rows;
// each block runs forward, loss terms and backward (speculatively: its gradients are unused when the KL early stop
// skips the step) into its own partial sums and gradients (BlockAcc), and these are combined in the fixed block
// order 0, 1, ..., NB-1. T = threads_for(c.threads, M) threads (T - 1 std::threads plus the caller) each take a
// contiguous run of blocks. Results depend on M only: not on T, nor on scheduling. Smaller minibatches are one
// block: no thread, the original single-thread code path and results.
__attribute__((noinline)) void step(Ctx &c, const int32_t *idx, int M, float *out) {
  const int n_pi = c.n_pi, nl = c.nl, discrete = c.discrete, obs_dim = c.obs_dim, act_dim = c.act_dim, fw = c.fw;
  const float ent_coef = c.ent_coef, vf_coef = c.vf_coef;
  std::vector<Layer> &pi = c.pi, &vf = c.vf;
  load_weights(pi);
  load_weights(vf);

  // gather the minibatch
  std::vector<float> &x = c.x, &old_lp = c.old_lp, &old_v = c.old_v, &adv = c.adv, &ret = c.ret, &mask = c.mask;
  x.resize(static_cast<size_t>(M) * obs_dim);
  old_lp.resize(M);
  old_v.resize(M);
  adv.resize(M);
  ret.resize(M);
  mask.resize(M);
  std::vector<int32_t> &a_disc = c.a_disc;
  std::vector<float> &a_cont = c.a_cont;
  a_disc.resize(discrete ? M : 0);
  a_cont.resize(discrete ? 0 : static_cast<size_t>(M) * act_dim);
  for (int r = 0; r < M; ++r) {
    const int64_t row = idx[r];
    const float *f = c.features + row * fw;
    std::memcpy(x.data() + static_cast<int64_t>(r) * obs_dim, f, sizeof(float) * obs_dim);
    old_lp[r] = f[obs_dim];
    old_v[r] = f[obs_dim + 1];
    adv[r] = f[obs_dim + 2];
    ret[r] = f[obs_dim + 3];
    mask[r] = f[obs_dim + 4];
    if (discrete) {
      a_disc[r] = static_cast<const int32_t *>(c.actions)[row];
    } else {
      std::memcpy(a_cont.data() + static_cast<int64_t>(r) * act_dim,
                  static_cast<const float *>(c.actions) + row * act_dim, sizeof(float) * act_dim);
    }
  }
  double msum = 0.0;
  for (int r = 0; r < M; ++r) msum += mask[r];
  const float n = c.n = std::max(static_cast<float>(msum), 1.0f);
  if (c.normalize_adv) {
    double s = 0.0;
    for (int r = 0; r < M; ++r) s += static_cast<double>(adv[r]) * mask[r];
    const float mean = static_cast<float>(s / n);
    double sq = 0.0;
    for (int r = 0; r < M; ++r) sq += static_cast<double>(adv[r] - mean) * (adv[r] - mean) * mask[r];
    const float stdv = std::sqrt(static_cast<float>(sq / std::max(n - 1.0f, 1.0f)));
    for (int r = 0; r < M; ++r) adv[r] = (adv[r] - mean) / (stdv + 1e-8f);
  }
  std::vector<float> &inv_std = c.inv_std;
  inv_std.assign(act_dim, 1.0f);
  static const float kHalfLog2Pi = 0.918938533204672741780329736406f;
  float gauss_ent = 0.0f;
  if (!discrete) {
    for (int j = 0; j < act_dim; ++j) {
      inv_std[j] = std::exp(-c.log_std[j]);
      gauss_ent += 0.5f + kHalfLog2Pi + c.log_std[j];
    }
  }
  c.gauss_ent = gauss_ent;

  const int NB = blocks_for(M), T = threads_for(c.threads, M);
  if (static_cast<int>(c.workers.size()) < T) c.workers.resize(T);
  double s_pol, s_val, s_ent, s_kl, s_clip;
  if (NB == 1) {
    run_block(c, c.workers[0], 0, M, false);  // backward only if the step is applied (below)
    const Worker &w = c.workers[0];
    s_pol = w.s_pol, s_val = w.s_val, s_ent = w.s_ent, s_kl = w.s_kl, s_clip = w.s_clip;
  } else {
    if (static_cast<int>(c.blocks.size()) < NB) c.blocks.resize(NB);
    // thread t runs blocks nb*t/T .. nb*(t+1)/T - 1 in order on its own Worker; each block's results move to c.blocks
    auto run_blocks = [&c, M, NB, T](int t) {
      Worker &w = c.workers[t];
      const int b1 = static_cast<int>(static_cast<int64_t>(NB) * (t + 1) / T);
      for (int b = static_cast<int>(static_cast<int64_t>(NB) * t / T); b < b1; ++b) {
        const int r0 = static_cast<int>(static_cast<int64_t>(M) * b / NB);
        const int r1 = static_cast<int>(static_cast<int64_t>(M) * (b + 1) / NB);
        run_block(c, w, r0, r1 - r0, true);
        BlockAcc &acc = c.blocks[b];
        acc.pi.resize(w.pi.size());
        acc.vf.resize(w.vf.size());
        for (size_t l = 0; l < w.pi.size(); ++l) {
          acc.pi[l].gwt.swap(w.pi[l].gwt);
          acc.pi[l].gbd.swap(w.pi[l].gbd);
        }
        for (size_t l = 0; l < w.vf.size(); ++l) {
          acc.vf[l].gwt.swap(w.vf[l].gwt);
          acc.vf[l].gbd.swap(w.vf[l].gbd);
        }
        acc.g_log_std.swap(w.g_log_std);
        acc.s_pol = w.s_pol, acc.s_val = w.s_val, acc.s_ent = w.s_ent, acc.s_kl = w.s_kl, acc.s_clip = w.s_clip;
      }
    };
    std::vector<std::thread> threads;
    std::vector<int> inline_runs;  // threads that could not be started: their blocks run here, same results
    std::atomic<bool> worker_failed{false};  // an exception must not escape a std::thread (std::terminate)
    threads.reserve(T - 1);
    for (int t = 1; t < T; ++t) {
      try {
        threads.emplace_back([&run_blocks, &worker_failed, t] {
          try {
            run_blocks(t);
          } catch (...) {
            worker_failed = true;
          }
        });
      } catch (...) {
        inline_runs.push_back(t);
      }
    }
    try {
      run_blocks(0);
      for (int t : inline_runs) run_blocks(t);
    } catch (...) {
      for (std::thread &th : threads) th.join();
      throw;
    }
    for (std::thread &th : threads) th.join();
    if (worker_failed) throw std::bad_alloc();
    const BlockAcc &a0 = c.blocks[0];
    s_pol = a0.s_pol, s_val = a0.s_val, s_ent = a0.s_ent, s_kl = a0.s_kl, s_clip = a0.s_clip;
    for (int b = 1; b < NB; ++b) {
      const BlockAcc &a = c.blocks[b];
      s_pol += a.s_pol;
      s_val += a.s_val;
      s_ent += a.s_ent;
      s_kl += a.s_kl;
      s_clip += a.s_clip;
    }
  }
  const float policy_loss = -static_cast<float>(s_pol / n);
  const float value_loss = static_cast<float>(s_val / n);
  const float entropy_loss = -static_cast<float>(s_ent / n);
  const float approx_kl = static_cast<float>(s_kl / n);
  const float clip_fraction = static_cast<float>(s_clip / n);
  const bool kl_ok = approx_kl <= c.kl_limit;
  out[0] = policy_loss + ent_coef * entropy_loss + vf_coef * value_loss;
  out[1] = policy_loss;
  out[2] = value_loss;
  out[3] = entropy_loss;
  out[4] = approx_kl;
  out[5] = clip_fraction;
  out[6] = kl_ok ? 1.0f : 0.0f;
  out[7] = 1.0f;
  out[8] = 1.0f;
  *c.lr_param = c.lr;
  if (c.kl_stop && !kl_ok) return;  // SB3's early stop: nothing changes

  std::vector<std::vector<LayerBuf> *> bpi, bvf;
  std::vector<const std::vector<double> *> bls;
  if (NB == 1) {
    Worker &w = c.workers[0];
    backward(pi, w.pi, x.data(), obs_dim, M, c.act, w.dpi, w.tmp);
    backward(vf, w.vf, x.data(), obs_dim, M, c.act, w.dv, w.tmp);
    bpi.push_back(&w.pi);
    bvf.push_back(&w.vf);
    bls.push_back(&w.g_log_std);
  } else {
    for (int b = 0; b < NB; ++b) {
      bpi.push_back(&c.blocks[b].pi);
      bvf.push_back(&c.blocks[b].vf);
      bls.push_back(&c.blocks[b].g_log_std);
    }
  }
  combine_grads(pi, bpi);  // block order 0, 1, ..., NB-1
  combine_grads(vf, bvf);
  std::vector<double> g_log_std(act_dim, 0.0);
  if (!discrete) {
    for (int j = 0; j < act_dim; ++j) {
      g_log_std[j] = (*bls[0])[j];
      for (int b = 1; b < NB; ++b) g_log_std[j] += (*bls[b])[j];
    }
  }
  std::vector<float> &gls = c.gls;
  gls.resize(act_dim);
  double sq = 0.0;
  for (int k = 0; k < nl; ++k) {
    const Layer &L = k < n_pi ? pi[k] : vf[k - n_pi];
    for (float g : L.gw) sq += static_cast<double>(g) * g;
    for (float g : L.gb) sq += static_cast<double>(g) * g;
  }
  if (!discrete) {
    for (int j = 0; j < act_dim; ++j) {
      gls[j] = static_cast<float>(g_log_std[j]);
      sq += static_cast<double>(gls[j]) * gls[j];
    }
  }
  const float norm = static_cast<float>(std::sqrt(sq));
  const float coef = std::min(c.max_norm / (norm + 1e-6f), 1.0f);

  const float beta1 = c.beta1, beta2 = c.beta2, eps = c.eps, lr = c.lr;
  const float b1p = *c.beta1_power * beta1, b2p = *c.beta2_power * beta2;
  *c.beta1_power = b1p;
  *c.beta2_power = b2p;
  c.global_step[0] += 1;
  const float lr_t = static_cast<float>(lr * std::sqrt(1.0 - b2p) / (1 - b1p));
  for (int k = 0; k < nl; ++k) {
    Layer &L = k < n_pi ? pi[k] : vf[k - n_pi];
    adam(L.w, L.mw, L.vw, L.gw.data(), static_cast<int64_t>(L.out) * L.in, coef, lr_t, beta1, beta2, eps);
    adam(L.b, L.mb, L.vb, L.gb.data(), L.out, coef, lr_t, beta1, beta2, eps);
  }
  if (!discrete) adam(c.log_std, c.m_log_std, c.v_log_std, gls.data(), act_dim, coef, lr_t, beta1, beta2, eps);
}

}  // namespace

// Error codes returned to MindSpore (it raises "... return value ... is N"): 1-9 bad inputs (see setup /
// check_indices; 8, 9: an index or action out of range, nothing written), 10: out of memory, 11: another C++
// exception. No exception leaves the kernel: one would call std::terminate and kill the process.
template <class F>
static int guarded(F body) {
  try {
    return body();
  } catch (const std::bad_alloc &) {
    return 10;
  } catch (...) {
    return 11;
  }
}

static int update_one(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes);
static int update_epochs(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes);

// One minibatch: indices int32 (M,), output float32 (9,).
extern "C" int PPOUpdate(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *stream,
                         void *extra) {
  (void)stream;
  (void)extra;
  return guarded([&] { return update_one(nparam, params, ndims, shapes, dtypes); });
}

static int update_one(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes) {
  Ctx c;
  if (const int err = setup(c, nparam, params, ndims, shapes, dtypes, 1)) return err;
  if (ndims[nparam - 1] != 1 || shapes[nparam - 1][0] != N_STATS_OUT) return 5;
  const int32_t *idx = static_cast<const int32_t *>(params[2]);
  const int M = static_cast<int>(shapes[2][0]);
  if (const int err = check_indices(c, idx, M)) return err;
  step(c, idx, M, static_cast<float *>(params[nparam - 1]));
  return 0;
}

// All minibatches of an update: indices int32 (n_mb, M) (row i: the i-th minibatch, epoch-major), output float32
// (n_mb, 10): the 9 statistics of PPOUpdate and `ran`. The rows run in order, exactly as n_mb PPOUpdate calls;
// with kl_stop, the first row whose kl_ok is 0 (its step skipped) is the last one run: later rows are all 0.
extern "C" int PPOUpdateEpochs(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                               void *stream, void *extra) {
  (void)stream;
  (void)extra;
  return guarded([&] { return update_epochs(nparam, params, ndims, shapes, dtypes); });
}

static int update_epochs(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes) {
  Ctx c;
  if (const int err = setup(c, nparam, params, ndims, shapes, dtypes, 2)) return err;
  const int64_t n_mb = shapes[2][0];
  const int M = static_cast<int>(shapes[2][1]);
  if (ndims[nparam - 1] != 2 || shapes[nparam - 1][0] != n_mb || shapes[nparam - 1][1] != N_STATS_OUT + 1) return 5;
  const int32_t *idx = static_cast<const int32_t *>(params[2]);
  if (const int err = check_indices(c, idx, n_mb * M)) return err;
  float *out = static_cast<float *>(params[nparam - 1]);
  std::fill(out, out + n_mb * (N_STATS_OUT + 1), 0.0f);
  for (int64_t i = 0; i < n_mb; ++i) {
    float *row = out + i * (N_STATS_OUT + 1);
    step(c, idx + i * M, M, row);
    row[N_STATS_OUT] = 1.0f;
    if (c.kl_stop && row[6] == 0.0f) break;
  }
  return 0;
}


// Blocks (threads) PPOUpdate / PPOUpdateEpochs would use for a minibatch of `rows` rows under the current
// environment (SCALEBOX_MS_KERNEL_THREADS, hardware threads); for tests and benchmarks (ctypes), not a MindSpore op.
extern "C" int PPOUpdateThreads(int rows) { return threads_for(kernel_threads(), rows); }

// Blocks of rows (partial sums combined in block order) for a minibatch of `rows` rows; ctypes, like above.
extern "C" int PPOUpdateBlocks(int rows) { return blocks_for(rows); }
