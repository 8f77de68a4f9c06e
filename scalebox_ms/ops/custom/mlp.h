// MLP building blocks shared by the scalebox_ms C++ kernels: a register-blocked GEMM micro-kernel, the padded
// transposed weight copies it reads, and the layer-by-layer forward (both kernels) and backward (ppo_update.cc) of
// an MLP of Dense layers with one hidden activation and a linear head.
//
// Included inside each kernel's anonymous namespace after simd.h (kCols, kRows, kVec, vf), once <algorithm>,
// <cstdint>, <utility> and <vector> are included. Part of every kernel's cache key (build.py hashes *.h).
#pragma once

constexpr int kMaxLayers = 16;  // layers per MLP (scalebox_ms.ops.custom.actor.MAX_LAYERS)

// The int32 meta input both kernels start with (built by actor.py / update.py): these fields, then each kernel's
// own, then the output width of every policy layer, then of every value layer.
enum MlpMeta : int { kMetaNPi, kMetaNVf, kMetaDiscrete, kMetaActivation, kMetaObsDim, kMetaActDim, kNMlpMeta };

constexpr float kHalfLog2Pi = 0.918938533204672741780329736406f;  // log(2 pi) / 2: the Gaussian head's log-prob

// meta's activation ids (scalebox_ms.ops.custom.actor.ACT_IDS); kActNone: the linear head
enum Activation : int { kActNone = -1, kActTanh = 0, kActRelu = 1 };

// C[r, :N] = act((bias | 0) + sum_k A(r, k) * B[k, :N]) for ROWS rows; A(r, k) = A[r * sar + k * sak];
// N % kCols == 0. One kCols-wide column strip at a time in ROWS x kNV vector accumulators (the compiler keeps them
// in registers); k ascending, no reassociation (so no -ffast-math), the activation applied lane-wise at the store.
template <int ROWS>
SBX_INLINE void tile(int K, const float *__restrict A, int64_t sar, int64_t sak, const float *__restrict B, int ldb,
                     float *__restrict C, int64_t ldc, int N, const float *__restrict bias, int act) {
  for (int n0 = 0; n0 < N; n0 += kCols) {
    vf acc[ROWS][kNV];
    for (int v = 0; v < kNV; ++v) {
      const vf b = bias ? loadv(bias + n0 + v * kVec) : vf{};
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
    for (int r = 0; r < ROWS; ++r) {
      for (int v = 0; v < kNV; ++v) {
        vf a = acc[r][v];
        if (act == kActTanh) a = tanhv(a);
        else if (act == kActRelu) a = a > 0.0f ? a : 0.0f;
        storev(C + r * ldc + n0 + v * kVec, a);
      }
    }
  }
}

// tile over `rows` rows: kRows at a time, then one by one.
inline void gemm(int rows, int N, int K, const float *A, int64_t sar, int64_t sak, const float *B, int ldb, float *C,
                 int64_t ldc, const float *bias, int act = kActNone) {
  int r = 0;
  for (; r + kRows <= rows; r += kRows) tile<kRows>(K, A + r * sar, sar, sak, B, ldb, C + r * ldc, ldc, N, bias, act);
  for (; r < rows; ++r) tile<1>(K, A + r * sar, sar, sak, B, ldb, C + r * ldc, ldc, N, bias, act);
}

// One Dense layer as the GEMMs read it: W^T (in, outp) and the bias (outp,), the outputs zero-padded to kCols;
// with_wp also W (out, inp), the inputs zero-padded (the backward to the layer input).
struct Dense {
  int in = 0, out = 0, inp = 0, outp = 0;  // logical sizes and sizes rounded up to kCols
  std::vector<float> wt, bias, wp;

  void shape(int n_in, int n_out, bool with_wp) {
    in = n_in;
    out = n_out;
    inp = round_up(in, kCols);
    outp = round_up(out, kCols);
    wt.assign(static_cast<size_t>(in) * outp, 0.0f);  // the padding stays zero; load fills the rest
    bias.assign(outp, 0.0f);
    wp.assign(with_wp ? static_cast<size_t>(out) * inp : 0, 0.0f);
  }

  // From nn.Dense's W (out, in) stored with row stride ld (>= in: padded FusedDense storage) and b (out,).
  void load(const float *w, int64_t ld, const float *b) {
    const bool with_wp = !wp.empty();
    for (int o = 0; o < out; ++o) {
      bias[o] = b[o];
      for (int i = 0; i < in; ++i) {
        const float x = w[o * ld + i];
        wt[static_cast<size_t>(i) * outp + o] = x;
        if (with_wp) wp[static_cast<size_t>(o) * inp + i] = x;
      }
    }
  }
};

// The MLP `net` (act after every hidden layer, linear head) on M rows of x (row stride ldx): layer l writes the
// buffer dst(l) returns as {pointer, row stride}. Returns the head's output.
template <class Net, class Dst>
const float *mlp_forward(const Net &net, const float *x, int64_t ldx, int M, int act, Dst dst) {
  const float *cur = x;
  int64_t ld = ldx;
  for (size_t l = 0; l < net.size(); ++l) {
    const Dense &L = net[l];
    const std::pair<float *, int64_t> y = dst(l);
    gemm(M, L.outp, L.in, cur, ld, 1, L.wt.data(), L.outp, y.first, y.second, L.bias.data(),
         l + 1 < net.size() ? act : kActNone);
    cur = y.first;
    ld = y.second;
  }
  return cur;
}

// One thread's buffers of one layer for a block of rows (the weights are shared, read-only).
struct LayerBuf {
  std::vector<float> h;    // layer output after activation (rows, outp)
  std::vector<float> gwt;  // this block's dL/dW transposed (in, outp)
  std::vector<double> gbd; // this block's dL/db (outp,)
};

// The forward of `net` keeping every layer's output in buf[l].h (for backward).
template <class Net>
void forward(const Net &net, std::vector<LayerBuf> &buf, const float *x, int ldx, int M, int act) {
  mlp_forward(net, x, ldx, M, act, [&](size_t l) {
    buf[l].h.resize(static_cast<size_t>(M) * net[l].outp);
    return std::pair<float *, int64_t>(buf[l].h.data(), net[l].outp);
  });
}

// Backward of forward(): delta is dL/d(head output) (M, outp of the head); fills gwt, gbd of every layer's buf.
// The layers need wp (Dense::shape(..., with_wp = true)).
template <class Net>
void backward(const Net &net, std::vector<LayerBuf> &buf, const float *x, int ldx, int M, int act,
              std::vector<float> &delta, std::vector<float> &tmp) {
  for (int l = static_cast<int>(net.size()) - 1; l >= 0; --l) {
    const Dense &L = net[l];
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
    if (act == kActTanh) {
      for (int64_t i = 0; i < n; ++i) t[i] *= 1.0f - h[i] * h[i];
    } else {
      for (int64_t i = 0; i < n; ++i) t[i] = h[i] > 0.0f ? t[i] : 0.0f;
    }
    delta.swap(tmp);
  }
}
