// Image patches (im2col) of observations for NatureCNN's first convolution, for MindSpore ops.Custom(func_type="aot")
// on CPU. Forward-only data movement with no Parameters: the input is the observation (nothing takes its gradient),
// so the op has no backward; the caller puts ops.stop_gradient on its output (models/cnn.py).
//
// ImagePatches:
//   Inputs (params[0 .. 2]):
//     kInX     (B, C, H, W)  uint8 (frames as the env gives them) or float32 (pixel values, e.g. unpacked)
//     kInMeta  (2,) int32    kernel size k and stride s of a valid (unpadded) convolution
//     kInScale (1,) float32  the factor applied to every value (1/255 for frames)
//   Output (params[3]): float32 (B, C*k*k, OH*OW), OH = (H - k) / s + 1, OW = (W - k) / s + 1:
//     out[b, (c*k + i)*k + j, oy*OW + ox] = float(x[b, c, oy*s + i, ox*s + j]) * scale
//   -- ops.unfold(x.astype(float32) * scale, k, 1, 0, s)'s values and layout, bit for bit (one float multiply per
//   value, in the same order; for uint8 through a 256-entry table of those products).
//   Rows of the batch are split over kernel_threads() threads (threads.h).
// Returns a Status (status.h); no exception leaves the kernel.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <thread>
#include <vector>

#include "status.h"  // return codes, guarded

namespace {

#include "simd.h"     // FlushDenormals (which threads.h names)
#include "threads.h"  // kernel_threads, run_parallel

enum Input : int { kInX = 0, kInMeta, kInScale, kNumInputs };

template <class T, class Convert>
void patches(const T *x, float *out, int64_t b0, int64_t b1, int64_t C, int64_t H, int64_t W, int64_t k, int64_t s,
             int64_t oh, int64_t ow, const Convert &convert) {
  const int64_t rows = C * k * k, cols = oh * ow;
  for (int64_t b = b0; b < b1; ++b) {
    const T *xb = x + b * C * H * W;
    float *ob = out + b * rows * cols;
    for (int64_t c = 0; c < C; ++c) {
      for (int64_t i = 0; i < k; ++i) {
        for (int64_t j = 0; j < k; ++j) {
          float *__restrict row = ob + ((c * k + i) * k + j) * cols;
          const T *src = xb + c * H * W + i * W + j;
          for (int64_t oy = 0; oy < oh; ++oy) {
            const T *line = src + oy * s * W;
            float *__restrict dst = row + oy * ow;
            for (int64_t ox = 0; ox < ow; ++ox) dst[ox] = convert(line[ox * s]);
          }
        }
      }
    }
  }
}

int run(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes) {
  if (nparam != kNumInputs + 1) return kErrParamCount;
  const bool u8 = std::strcmp(dtypes[kInX], "uint8") == 0;
  if (!u8 && std::strcmp(dtypes[kInX], "float32") != 0) return kErrDtype;
  if (std::strcmp(dtypes[kInMeta], "int32") != 0 || std::strcmp(dtypes[kInScale], "float32") != 0 ||
      std::strcmp(dtypes[kNumInputs], "float32") != 0) {
    return kErrDtype;
  }
  if (ndims[kInX] != 4 || ndims[kInMeta] != 1 || shapes[kInMeta][0] != 2 || ndims[kInScale] != 1 ||
      shapes[kInScale][0] != 1 || ndims[kNumInputs] != 3) {
    return kErrShape;
  }
  const int32_t *meta = static_cast<const int32_t *>(params[kInMeta]);
  const int64_t k = meta[0], s = meta[1];
  const int64_t B = shapes[kInX][0], C = shapes[kInX][1], H = shapes[kInX][2], W = shapes[kInX][3];
  if (k < 1 || s < 1 || H < k || W < k) return kErrShape;
  const int64_t oh = (H - k) / s + 1, ow = (W - k) / s + 1;
  const int64_t *o = shapes[kNumInputs];
  if (o[0] != B || o[1] != C * k * k || o[2] != oh * ow) return kErrShape;
  const float scale = *static_cast<const float *>(params[kInScale]);
  float *out = static_cast<float *>(params[kNumInputs]);
  if (B == 0) return kOk;

  float table[256];  // uint8 value -> float(value) * scale: the same product as the graph's cast and multiply
  for (int v = 0; v < 256; ++v) table[v] = static_cast<float>(v) * scale;
  // (at least 8 images per thread: below that the thread start costs more than the copy)
  const int T = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(kernel_threads(), B / 8)));
  run_parallel(T, false, [&](int t) {  // (denormals kept, as MindSpore's multiply keeps them)
    const int64_t b0 = B * t / T, b1 = B * (t + 1) / T;
    if (u8) {
      patches(static_cast<const uint8_t *>(params[kInX]), out, b0, b1, C, H, W, k, s, oh, ow,
              [&table](uint8_t v) { return table[v]; });
    } else {
      patches(static_cast<const float *>(params[kInX]), out, b0, b1, C, H, W, k, s, oh, ow,
              [scale](float v) { return v * scale; });
    }
  });
  return kOk;
}

}  // namespace

extern "C" int ImagePatches(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                            void *stream, void *extra) {
  (void)stream;
  (void)extra;
  return guarded([&] { return run(nparam, params, ndims, shapes, dtypes); });
}
