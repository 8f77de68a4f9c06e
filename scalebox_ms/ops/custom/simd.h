// Shared SIMD helpers of the scalebox_ms C++ kernels (included inside each kernel's anonymous namespace, once
// <cstring> is included). Part of every kernel's cache key (build.py hashes *.h).
#pragma once

constexpr int kCols = 16;  // outputs per GEMM micro-tile; every padded weight / activation row is a multiple of it

inline int round_up(int n, int m) { return (n + m - 1) / m * m; }

// SIMD vectors of kVec floats (GCC/Clang vector extension), sized to the widest registers -march gives us:
// 16 with AVX-512, 8 with AVX, else 4 (SSE/NEON). A micro-tile row holds kCols / kVec of them.
#if defined(__AVX512F__)
constexpr int kVec = 16;
#elif defined(__AVX__)
constexpr int kVec = 8;
#else
constexpr int kVec = 4;
#endif
constexpr int kNV = kCols / kVec;
// Rows per micro-tile: kRows x kNV accumulator registers. AVX2 (16 ymm registers): 6 x 2 = 12 accumulators, 2 B
// vectors and a broadcast, BLIS's 6x16 Haswell shape; on a Zen 3 core the 64x64 layers' GEMMs ran ~1.7x faster
// than with 4 x 2 (benchmarks/gemm_tiles.py). The tiling never changes a result (mlp.h: tile).
// SBX_TILE_ROWS overrides it (gemm_probe.cc builds one probe per tiling to compare them).
#ifdef SBX_TILE_ROWS
constexpr int kRows = SBX_TILE_ROWS;
#else
constexpr int kRows = kNV == 1 ? 8 : (kNV == 2 ? 6 : 4);
#endif
static_assert(kRows >= 1 && kRows <= 8, "mlp.h's gemm covers a remainder of at most 7 rows (4 + 2 + 1)");
typedef float vf __attribute__((vector_size(kVec * sizeof(float))));

#define SBX_INLINE inline __attribute__((always_inline))

SBX_INLINE vf loadv(const float *p) {
  vf v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

SBX_INLINE void storev(float *p, vf v) { std::memcpy(p, &v, sizeof(v)); }

// tanh as a [13/6] rational approximation on [-7.9053, 7.9053] (the form Eigen uses for float); max abs error
// ~1e-7 vs double tanh (MindSpore's CPU tanh is ~1e-6 off); branch-free, so it runs on whole vectors.
SBX_INLINE vf tanhv(vf x) {
  const float c = 7.90531110763549805f;
  vf xc = x < -c ? -c : x;
  xc = xc > c ? c : xc;
  const vf x2 = xc * xc;
  vf p = x2 * -2.76076847742355e-16f + 2.00018790482477e-13f;
  p = p * x2 + -8.60467152213735e-11f;
  p = p * x2 + 5.12229709037114e-08f;
  p = p * x2 + 1.48572235717979e-05f;
  p = p * x2 + 6.37261928875436e-04f;
  p = p * x2 + 4.89352455891786e-03f;
  p = p * xc;
  vf q = x2 * 1.19825839466702e-06f + 1.18534705686654e-04f;
  q = q * x2 + 2.26843463243900e-03f;
  q = q * x2 + 4.89352518554385e-03f;
  const vf r = p / q;
  const vf ax = x < 0.0f ? -x : x;
  return ax < 0.0004f ? x : r;
}

// Flushes denormal floats to zero (x86: MXCSR's FTZ and DAZ bits; AArch64: FPCR.FZ) while it lives, then
// restores the thread's previous mode: the update kernel runs under one (as TensorFlow's CPU kernels do), because
// Adam's moments of weights whose gradient stays ~0 (dead ReLU units) decay into the denormal range, and every
// arithmetic op touching a denormal then takes a microcode assist: measured 3x slower steps on HalfCheetah's
// 256-256 networks. Values below ~1.2e-38 become 0; nothing else changes.
class FlushDenormals {
 public:
#if defined(__x86_64__) || defined(__i386__)
  FlushDenormals() : saved_(__builtin_ia32_stmxcsr()) { __builtin_ia32_ldmxcsr(saved_ | 0x8040u); }
  ~FlushDenormals() { __builtin_ia32_ldmxcsr(saved_); }
#elif defined(__aarch64__)
  FlushDenormals() : saved_(__builtin_aarch64_get_fpcr64()) { __builtin_aarch64_set_fpcr64(saved_ | (1ull << 24)); }
  ~FlushDenormals() { __builtin_aarch64_set_fpcr64(saved_); }
#else
  FlushDenormals() = default;  // no control of the FP mode here: denormals are kept (slower, same maths otherwise)
#endif
  FlushDenormals(const FlushDenormals &) = delete;
  FlushDenormals &operator=(const FlushDenormals &) = delete;

 private:
#if defined(__x86_64__) || defined(__i386__)
  unsigned saved_;
#elif defined(__aarch64__)
  unsigned long long saved_;
#endif
};
