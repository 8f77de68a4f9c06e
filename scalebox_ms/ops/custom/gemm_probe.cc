// A stand-alone probe of mlp.h's GEMM micro-kernel (not a MindSpore op): builds with any tiling
// (-DSBX_TILE_ROWS=R overrides simd.h's kRows) so that tests can check that the tiling never changes a result and
// benchmarks/gemm_tiles.py can time the tilings on the shapes the PPO update and acting kernels run.
//
//   gemm_probe dump OUT   writes every case below (inputs and output) to the binary file OUT
//   gemm_probe time       prints one line per timed shape: name rows N K best_seconds
//
// dump format, per case: int32 rows, N, K, act, has_bias, a_transposed; then float32 A (rows, K) (logical, dense,
// row-major, whatever layout the GEMM read), B (K, N), bias (N) if has_bias, C (rows, N).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <utility>
#include <vector>

namespace {

#include "simd.h"
#include "mlp.h"

// Deterministic inputs in [-1, 1) (a 32-bit LCG), so every build of the probe sees the same numbers.
struct Lcg {
  uint32_t s;
  float next() {
    s = s * 1664525u + 1013904223u;
    return static_cast<float>(s >> 8) / 8388608.0f - 1.0f;
  }
};

struct Case {
  int rows, N, K, act;
  bool bias, a_transposed;
};

// A as the GEMM reads it: row-major (rows, K), or A^T (K, rows) when a_transposed; sets the strides.
std::vector<float> stored_a(const Case &c, const std::vector<float> &a, int64_t &sar, int64_t &sak) {
  if (!c.a_transposed) {
    sar = c.K;
    sak = 1;
    return a;
  }
  std::vector<float> t(a.size());
  for (int r = 0; r < c.rows; ++r)
    for (int k = 0; k < c.K; ++k) t[static_cast<size_t>(k) * c.rows + r] = a[static_cast<size_t>(r) * c.K + k];
  sar = 1;
  sak = c.rows;
  return t;
}

// C = act(bias + A B) for one case; A stored row-major (rows, K), or as A^T (K, rows) when a_transposed (the
// backward's dW = delta^T H layout). Returns A (logical), B, bias, C.
void run_case(const Case &c, uint32_t seed, std::vector<float> &a, std::vector<float> &b, std::vector<float> &bias,
              std::vector<float> &out) {
  Lcg g{seed};
  a.resize(static_cast<size_t>(c.rows) * c.K);
  b.resize(static_cast<size_t>(c.K) * c.N);
  bias.resize(c.N);
  for (float &x : a) x = g.next();
  for (float &x : b) x = g.next() * 0.5f;
  for (float &x : bias) x = g.next() * 0.1f;
  int64_t sar, sak;
  const std::vector<float> stored = stored_a(c, a, sar, sak);
  out.assign(static_cast<size_t>(c.rows) * c.N, 0.0f);
  gemm(c.rows, c.N, c.K, stored.data(), sar, sak, b.data(), c.N, out.data(), c.N, c.bias ? bias.data() : nullptr,
       c.act);
}

int dump(const char *path) {
  std::vector<Case> cases;
  for (int rows : {1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 13, 64, 130, 512})
    for (const std::pair<int, int> nk : {std::pair<int, int>{16, 4}, {64, 4}, {64, 64}, {16, 64}, {48, 33}, {256, 17}})
      for (int act : {kActNone, kActTanh, kActRelu}) cases.push_back({rows, nk.first, nk.second, act, act != kActNone, false});
  for (int rows : {2, 4, 6, 13, 64})
    for (int K : {1, 7, 130, 512}) cases.push_back({rows, 64, K, kActNone, false, true});
  FILE *f = std::fopen(path, "wb");
  if (!f) return 1;
  std::vector<float> a, b, bias, out;
  uint32_t seed = 1;
  for (const Case &c : cases) {
    run_case(c, seed++, a, b, bias, out);
    const int32_t head[6] = {c.rows, c.N, c.K, c.act, c.bias, c.a_transposed};
    std::fwrite(head, sizeof(head), 1, f);
    std::fwrite(a.data(), sizeof(float), a.size(), f);
    std::fwrite(b.data(), sizeof(float), b.size(), f);
    if (c.bias) std::fwrite(bias.data(), sizeof(float), bias.size(), f);
    std::fwrite(out.data(), sizeof(float), out.size(), f);
  }
  return std::fclose(f) == 0 ? 0 : 1;
}

double seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The GEMMs of one 512-row block of the PPO update kernel on CartPole's 64-64 tanh MLPs, and the MuJoCo presets'
// 256-256 layers: best of `reps` calls each (one thread).
int time_shapes() {
  struct Shape {
    const char *name;
    Case c;
  };
  const Shape shapes[] = {
      {"forward_64x64_tanh", {512, 64, 64, kActTanh, true, false}},
      {"forward_64x64", {512, 64, 64, kActNone, true, false}},
      {"forward_in4_tanh", {512, 64, 4, kActTanh, true, false}},
      {"forward_head16", {512, 16, 64, kActNone, true, false}},
      {"grad_w_64x64", {64, 64, 512, kActNone, false, true}},
      {"grad_x_64x64", {512, 64, 64, kActNone, false, false}},
      {"grad_w_in4", {4, 64, 512, kActNone, false, true}},
      {"forward_256x256_relu", {256, 256, 256, kActRelu, true, false}},
  };
  std::vector<float> a, b, bias, out;
  for (const Shape &s : shapes) {
    run_case(s.c, 7, a, b, bias, out);  // inputs and warm-up
    int64_t sar, sak;
    const std::vector<float> stored = stored_a(s.c, a, sar, sak);
    const int reps = 300;
    double best = 1e30;
    for (int i = 0; i < reps; ++i) {
      const double t0 = seconds();
      gemm(s.c.rows, s.c.N, s.c.K, stored.data(), sar, sak, b.data(), s.c.N, out.data(), s.c.N,
           s.c.bias ? bias.data() : nullptr, s.c.act);
      best = std::min(best, seconds() - t0);
    }
    std::printf("%s %d %d %d %.9g\n", s.name, s.c.rows, s.c.N, s.c.K, best);
  }
  return 0;
}

}  // namespace

int main(int argc, char **argv) {
  if (argc == 3 && std::strcmp(argv[1], "dump") == 0) return dump(argv[2]);
  if (argc == 2 && std::strcmp(argv[1], "time") == 0) return time_shapes();
  std::fprintf(stderr, "usage: gemm_probe dump OUT | gemm_probe time\n");
  return 2;
}
