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

// C[r, n0:n1] = act((bias | 0) + sum_k A(r, k) * B[k, n0:n1]) for ROWS rows; A(r, k) = A[r * sar + k * sak];
// (n1 - n0) % (NV * kVec) == 0. NV * kVec columns at a time in ROWS x NV vector accumulators (the compiler keeps
// them in registers); k ascending, no reassociation (so no -ffast-math), the activation applied lane-wise at the
// store. Every output is the same chain of FMAs whatever ROWS and NV are: the tiling never changes a result.
template <int ROWS, int NV>
SBX_INLINE void tile(int K, const float *__restrict A, int64_t sar, int64_t sak, const float *__restrict B, int ldb,
                     float *__restrict C, int64_t ldc, int n0, int n1, const float *__restrict bias, int act) {
  for (; n0 < n1; n0 += NV * kVec) {
    vf acc[ROWS][NV];
    for (int v = 0; v < NV; ++v) {
      const vf b = bias ? loadv(bias + n0 + v * kVec) : vf{};
      for (int r = 0; r < ROWS; ++r) acc[r][v] = b;
    }
    for (int k = 0; k < K; ++k) {
      const float *bp = B + static_cast<int64_t>(k) * ldb + n0;
      vf bv[NV];
      for (int v = 0; v < NV; ++v) bv[v] = loadv(bp + v * kVec);
      for (int r = 0; r < ROWS; ++r) {
        const float a = A[r * sar + k * sak];
        for (int v = 0; v < NV; ++v) acc[r][v] += a * bv[v];
      }
    }
    for (int r = 0; r < ROWS; ++r) {
      for (int v = 0; v < NV; ++v) {
        vf a = acc[r][v];
        if (act == kActTanh) a = tanhv(a);
        else if (act == kActRelu) a = a > 0.0f ? a : 0.0f;
        storev(C + r * ldc + n0 + v * kVec, a);
      }
    }
  }
}

// Vector accumulators a tile of fewer than kRows rows may keep in registers: half the vector registers (32 with
// AVX-512 and on AArch64, 16 with AVX), leaving the rest for the B row and the broadcasts. A tile needs ~8+
// independent FMA chains to hide the FMA latency, so tiles of few rows get wider (up to 4 vectors per row). The
// full kRows-row tiles are kNV vectors wide (simd.h: 12 accumulators with AVX2).
#if defined(__AVX512F__) || defined(__aarch64__)
constexpr int kAccRegs = 16;
#else
constexpr int kAccRegs = 8;
#endif
template <int ROWS>
constexpr int wide_vectors() { return std::max(kNV, std::min(4, kAccRegs / ROWS)); }

// ROWS rows of C: the widest column tiles (wide_vectors<ROWS>() vectors) over as many columns as they cover, then
// kCols-wide strips for the rest.
template <int ROWS>
SBX_INLINE void tile_row(int K, const float *A, int64_t sar, int64_t sak, const float *B, int ldb, float *C,
                         int64_t ldc, int N, const float *bias, int act) {
  constexpr int NV = wide_vectors<ROWS>();
  const int nw = N / (NV * kVec) * (NV * kVec);
  tile<ROWS, NV>(K, A, sar, sak, B, ldb, C, ldc, 0, nw, bias, act);
  if (NV != kNV) tile<ROWS, kNV>(K, A, sar, sak, B, ldb, C, ldc, nw, N, bias, act);
}

// C (rows, N) = act((bias | 0) + A B), N % kCols == 0: tiles of kRows rows, then the remainder in tiles of 4, 2
// and 1 rows.
inline void gemm(int rows, int N, int K, const float *A, int64_t sar, int64_t sak, const float *B, int ldb, float *C,
                 int64_t ldc, const float *bias, int act = kActNone) {
  int r = 0;
  for (; r + kRows <= rows; r += kRows)
    tile_row<kRows>(K, A + r * sar, sar, sak, B, ldb, C + r * ldc, ldc, N, bias, act);
  if (kRows > 4 && r + 4 <= rows) {
    tile_row<4>(K, A + r * sar, sar, sak, B, ldb, C + r * ldc, ldc, N, bias, act);
    r += 4;
  }
  if (r + 2 <= rows) {
    tile_row<2>(K, A + r * sar, sar, sak, B, ldb, C + r * ldc, ldc, N, bias, act);
    r += 2;
  }
  if (r < rows) tile_row<1>(K, A + r * sar, sar, sak, B, ldb, C + r * ldc, ldc, N, bias, act);
}

// One Dense layer as the GEMMs read it: W^T (in, outp) and the bias (outp,), the outputs zero-padded to kCols;
// with_rows also W (out, inp) for the backward to the layer input: W's own storage when its rows need no padding
// (in % kCols == 0, stored densely), else a copy with the inputs zero-padded (wp).
struct Dense {
  int in = 0, out = 0, inp = 0, outp = 0;  // logical sizes and sizes rounded up to kCols
  bool with_rows = false;
  std::vector<float> wt, bias, wp;
  const float *rows = nullptr;  // W (out, inp) as the backward reads it: wp, or W itself (set by load)

  void shape(int n_in, int n_out, bool rows_needed) {
    in = n_in;
    out = n_out;
    inp = round_up(in, kCols);
    outp = round_up(out, kCols);
    with_rows = rows_needed;
    wt.assign(static_cast<size_t>(in) * outp, 0.0f);  // the padding stays zero; load fills the rest
    bias.assign(outp, 0.0f);
    wp.clear();
  }

  // dL/dW is computed as W is stored, (out, in), when the inputs need no padding; else transposed, (in, outp).
  bool grad_rows() const { return in == inp; }

  // From nn.Dense's W (out, in) stored with row stride ld (>= in: padded FusedDense storage) and b (out,). wt is
  // W's transpose, written in kTr x kTr blocks so that reads and writes both stay within a few cache lines (an
  // o-major loop strides wt by outp floats per element: a cache miss each on 256-wide layers).
  void load(const float *w, int64_t ld, const float *b) {
    constexpr int kTr = 16;
    std::memcpy(bias.data(), b, sizeof(float) * out);
    for (int o0 = 0; o0 < out; o0 += kTr) {
      const int o1 = std::min(out, o0 + kTr);
      for (int i0 = 0; i0 < in; i0 += kTr) {
        const int i1 = std::min(in, i0 + kTr);
        for (int i = i0; i < i1; ++i) {
          float *dst = wt.data() + static_cast<size_t>(i) * outp;
          for (int o = o0; o < o1; ++o) dst[o] = w[o * ld + i];
        }
      }
    }
    if (!with_rows) return;
    if (in == inp && ld == inp) {
      rows = w;
      return;
    }
    if (wp.empty()) wp.assign(static_cast<size_t>(out) * inp, 0.0f);  // once: the padding stays zero
    for (int o = 0; o < out; ++o) std::memcpy(wp.data() + static_cast<size_t>(o) * inp, w + o * ld, sizeof(float) * in);
    rows = wp.data();
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
  std::vector<float> gw;   // this block's dL/dW: (out, in) if the layer's grad_rows(), else transposed (in, outp)
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

// Backward of forward(): delta is dL/d(head output) (M, outp of the head); fills gw, gbd of every layer's buf.
// The layers need their W rows (Dense::shape(..., rows_needed = true)). Either layout of dW sums the same products
// in the same order (k = row ascending, one FMA each), so the two give identical values.
template <class Net>
void backward(const Net &net, std::vector<LayerBuf> &buf, const float *x, int ldx, int M, int act,
              std::vector<float> &delta, std::vector<float> &tmp) {
  for (int l = static_cast<int>(net.size()) - 1; l >= 0; --l) {
    const Dense &L = net[l];
    LayerBuf &Bf = buf[l];
    const float *in = l == 0 ? x : buf[l - 1].h.data();
    const int ldi = l == 0 ? ldx : net[l - 1].outp;
    if (L.grad_rows()) {
      // dW (out, in) = delta^T (out, M) @ H_in (M, in)
      Bf.gw.resize(static_cast<size_t>(L.out) * L.in);
      gemm(L.out, L.in, M, delta.data(), 1, L.outp, in, ldi, Bf.gw.data(), L.in, nullptr);
    } else {
      // dW^T (in, outp) = H_in^T (in, M) @ delta (M, outp)
      Bf.gw.resize(static_cast<size_t>(L.in) * L.outp);
      gemm(L.in, L.outp, M, in, 1, ldi, delta.data(), L.outp, Bf.gw.data(), L.outp, nullptr);
    }
    std::vector<double> &gb = Bf.gbd;
    gb.assign(L.outp, 0.0);
    for (int r = 0; r < M; ++r) {
      const float *d = delta.data() + static_cast<int64_t>(r) * L.outp;
      for (int o = 0; o < L.out; ++o) gb[o] += d[o];
    }
    if (l == 0) break;
    // dL/dH_in (M, inp) = delta (M, out) @ W (out, inp), then through the activation of layer l-1
    tmp.resize(static_cast<size_t>(M) * L.inp);
    gemm(M, L.inp, L.out, delta.data(), L.outp, 1, L.rows, L.inp, tmp.data(), L.inp, nullptr);
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
