// Valid (unpadded), strided 2-D convolutions through oneDNN, the library MindSpore's CPU wheel ships
// (mindspore/lib/libdnnl.so.3), for MindSpore ops.Custom(func_type="aot") on CPU.
//
// Why: MindSpore 2.10's CPU Conv2D kernel hands oneDNN fixed NCHW/OIHW layouts, for which oneDNN falls back to its
// reference convolution ("jit_uni_ncsp:conv+ref:any" under ONEDNN_VERBOSE=1, ~0.6 GFLOP/s for NatureCNN's first
// layer). Here oneDNN picks its own layouts (format "any") and so its JIT kernels (avx2 / avx512_core / brgconv);
// the tensors MindSpore hands over stay plain NCHW / OIHW and are reordered in and out.
//
// Nothing is derived by hand: the three entry points are oneDNN's own primitives, the convolution's forward pass
// and its two backward passes (data and weights), which the Python side (onednn_conv.py) registers as the op's
// bprop, the way MindSpore registers Conv2DBackpropInput / Conv2DBackpropFilter for Conv2D.
//
//   OneDNNConvForward         inputs x (N, C, H, W), w (O, C, k, k), b (O,), meta (3,) int32 = [k, s, pixels]
//                             output y (N, O, OH, OW), OH = (H - k) / s + 1, OW = (W - k) / s + 1
//                             (also as OneDNNConvForwardNoInputGrad: the op whose bprop skips the input gradient)
//                             pixels = 1: x holds pixel values 0..255, uint8 or float32, and the convolution reads
//                             x / 255 (a first layer on the frames themselves: oneDNN's reorder of x into the
//                             primitive's layout converts and scales in the same pass); pixels = 0: float32 x
//   OneDNNConvBackwardData    inputs dy (N, O, OH, OW), w (O, C, k, k), x (N, C, H, W) (its shape only), meta
//                             (pixels = 0: a pixel input has no gradient) output dx (N, C, H, W)
//   OneDNNConvBackwardWeights inputs x (N, C, H, W), dy (N, O, OH, OW), w (its shape only), meta
//                             outputs dw (O, C, k, k), db (O,)
//
// All float32 but a pixel input (oneDNN's fpmath mode strict). Primitives are created once per shape and kept, the
// least recently used beyond 32 dropped (a mutex guards the cache, another each entry's buffers and stream). oneDNN
// runs on kernel_threads() threads (threads.h, read once, by the first call) through its threadpool interface, which
// MindSpore's build of oneDNN uses (DNNL_CPU_RUNTIME=THREADPOOL; another build, or not oneDNN 3, makes every call
// return kErrLibrary). Returns a Status (status.h): kErrLibrary when oneDNN refuses a primitive; no exception leaves
// the kernel.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "status.h"  // return codes, guarded

#include "onednn_api.h"  // the oneDNN C API declarations used here

namespace {

#include "simd.h"     // FlushDenormals (which threads.h names)
#include "threads.h"  // kernel_threads, run_parallel

void *const kAllocate = reinterpret_cast<void *>(static_cast<size_t>(-1));  // DNNL_MEMORY_ALLOCATE
// primitives kept (each with buffers as large as its tensors): the least recently used beyond this are dropped
constexpr size_t kMaxCachedPrimitives = 32;

thread_local bool in_pool = false;

// parallel_for(n, fn) runs fn(i, n) for i = 0 .. n-1 on T threads (the caller and T-1 started ones, threads.h).
class Pool final : public dnnl::threadpool_interop::threadpool_iface {
 public:
  explicit Pool(int threads) : threads_(threads) {}
  int get_num_threads() const override { return threads_; }
  bool get_in_parallel() const override { return in_pool; }
  uint64_t get_flags() const override { return 0; }  // synchronous
  void parallel_for(int n, const std::function<void(int, int)> &fn) override {
    const int T = std::max(1, std::min(threads_, n));
    run_parallel(T, false, [&](int t) {
      const bool outer = in_pool;
      in_pool = true;
      for (int i = t; i < n; i += T) fn(i, n);
      in_pool = outer;
    });
  }

 private:
  int threads_;
};

// The engine, the threadpool and the checks that this libdnnl is one the kernel can use: oneDNN 3 built with the
// threadpool CPU runtime (MindSpore's wheel); anything else makes every call return kErrLibrary.
struct Library {
  dnnl_engine_t engine = nullptr;
  Pool *pool = nullptr;
  dnnl_primitive_attr_t attr = nullptr;  // fpmath mode strict: float32 stays float32 whatever the environment says
  bool avx512 = false;                   // oneDNN runs avx512_core code here (the NHWC choice below)
  bool ok = false;
};

Library &library() {  // created on the first call (thread-safe static initialisation); deliberately never destroyed:
  // at process exit oneDNN's own statics may be gone, or MindSpore's threads still running kernels
  static Library *lib = [] {
    Library *l = new Library();
    const dnnl_version_t *v = dnnl_version();
    if (v == nullptr || v->major != 3 || v->cpu_runtime != kDnnlRuntimeThreadpool) return l;
    l->pool = new Pool(kernel_threads());
    l->avx512 = dnnl_get_effective_cpu_isa() >= kDnnlIsaAvx512Core;
    l->ok = dnnl_engine_create(&l->engine, kDnnlCpu, 0) == 0 && dnnl_primitive_attr_create(&l->attr) == 0 &&
            dnnl_primitive_attr_set_fpmath_mode(l->attr, kDnnlFpmathStrict) == 0;
    return l;
  }();
  return *lib;
}

struct Desc {  // an owned memory descriptor
  dnnl_memory_desc_t md = nullptr;
  ~Desc() {
    if (md) dnnl_memory_desc_destroy(md);
  }
};

bool plain(Desc &d, std::initializer_list<int64_t> dims, int dtype = kDnnlF32) {  // row-major (NCHW / OIHW / X)
  dnnl_dims_t dd = {0}, st = {0};
  int n = 0;
  for (int64_t v : dims) dd[n++] = v;
  int64_t stride = 1;
  for (int i = n - 1; i >= 0; --i) {
    st[i] = stride;
    stride *= dd[i];
  }
  return dnnl_memory_desc_create_with_strides(&d.md, n, dd, dtype, st) == 0;
}

bool channels_last(Desc &d, int64_t N, int64_t C, int64_t H, int64_t W) {  // NHWC float32
  const dnnl_dims_t dd = {N, C, H, W}, st = {H * W * C, 1, W * C, C};
  return dnnl_memory_desc_create_with_strides(&d.md, 4, dd, kDnnlF32, st) == 0;
}

bool any(Desc &d, std::initializer_list<int64_t> dims) {
  dnnl_dims_t dd = {0};
  int n = 0;
  for (int64_t v : dims) dd[n++] = v;
  return dnnl_memory_desc_create_with_tag(&d.md, n, dd, kDnnlF32, kDnnlFormatAny) == 0;
}

// One tensor as MindSpore holds it (plain, the call's pointer) and as the primitive wants it; when the two differ
// (layout, data type) or an input is scaled, an owned buffer and the reorder between them.
struct Port {
  dnnl_memory_t user = nullptr, inner = nullptr, scale = nullptr;
  dnnl_primitive_t reorder = nullptr;  // user -> inner for inputs (times scale_value), inner -> user for outputs
  bool input = true;
  float scale_value = 1.0f;

  bool init(Library &lib, const_dnnl_memory_desc_t user_md, const_dnnl_memory_desc_t inner_md, bool is_input,
            float input_scale = 1.0f) {
    input = is_input;
    scale_value = input_scale;
    const bool scaled = is_input && input_scale != 1.0f;
    if (dnnl_memory_create(&user, user_md, lib.engine, nullptr) != 0) return false;
    if (!scaled && dnnl_memory_desc_equal(user_md, inner_md)) return true;
    if (dnnl_memory_create(&inner, inner_md, lib.engine, kAllocate) != 0) return false;
    dnnl_primitive_attr_t attr = nullptr;  // the reorder's: dst = src_scale * src (one float32 multiply)
    if (scaled) {
      Desc one;
      if (!plain(one, {1}) || dnnl_memory_create(&scale, one.md, lib.engine, &scale_value) != 0 ||
          dnnl_primitive_attr_create(&attr) != 0 || dnnl_primitive_attr_set_scales_mask(attr, kDnnlArgSrc, 0) != 0) {
        if (attr) dnnl_primitive_attr_destroy(attr);
        return false;
      }
    }
    dnnl_primitive_desc_t pd = nullptr;
    const bool made = is_input ? dnnl_reorder_primitive_desc_create(&pd, user_md, lib.engine, inner_md, lib.engine,
                                                                    attr) == 0
                               : dnnl_reorder_primitive_desc_create(&pd, inner_md, lib.engine, user_md, lib.engine,
                                                                    attr) == 0;
    if (attr) dnnl_primitive_attr_destroy(attr);
    if (!made) return false;
    const bool ok = dnnl_primitive_create(&reorder, pd) == 0;
    dnnl_primitive_desc_destroy(pd);
    return ok;
  }
  dnnl_memory_t arg() const { return inner ? inner : user; }
  bool bind(dnnl_stream_t stream, void *data) {  // before the primitive: the call's pointer; inputs reordered in
    if (dnnl_memory_set_data_handle(user, data) != 0) return false;
    if (!reorder || !input) return true;
    dnnl_exec_arg_t args[3] = {{kDnnlArgSrc, user}, {kDnnlArgDst, inner}, {kDnnlArgAttrScales | kDnnlArgSrc, scale}};
    return dnnl_primitive_execute(reorder, stream, scale ? 3 : 2, args) == 0;
  }
  bool finish(dnnl_stream_t stream) {  // after the primitive: an output is reordered out
    if (!reorder || input) return true;
    dnnl_exec_arg_t args[2] = {{kDnnlArgSrc, inner}, {kDnnlArgDst, user}};
    return dnnl_primitive_execute(reorder, stream, 2, args) == 0;
  }
  ~Port() {
    if (reorder) dnnl_primitive_destroy(reorder);
    if (scale) dnnl_memory_destroy(scale);
    if (inner) dnnl_memory_destroy(inner);
    if (user) dnnl_memory_destroy(user);
  }
};

enum Kind : int { kForward = 0, kBackwardData = 1, kBackwardWeights = 2 };

// The cached primitive of one (kind, shape): its ports in execute-argument order, and its own stream (entries may
// run at the same time from different MindSpore threads; one entry's calls are serialised by its mutex).
struct Entry {
  std::mutex mutex;
  dnnl_stream_t stream = nullptr;
  dnnl_primitive_t primitive = nullptr;
  std::vector<int> args;                   // DNNL_ARG_* of each port
  std::vector<std::unique_ptr<Port>> ports;
  std::string impl;                        // oneDNN's implementation name (the tests and benchmarks read it)
  ~Entry() {
    ports.clear();
    if (primitive) dnnl_primitive_destroy(primitive);
    if (stream) dnnl_stream_destroy(stream);
  }
};

// (kind, N, C, H, W, O, k, s, pixels, x is uint8)
using Key = std::tuple<int, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool, bool>;

// Builds the primitive for `kind` and its ports; nullptr when oneDNN refuses.
std::shared_ptr<Entry> build(Library &lib, int kind, int64_t N, int64_t C, int64_t H, int64_t W, int64_t O,
                             int64_t k, int64_t s, bool pixels, bool u8) {
  // oneDNN plans its work split for this many threads (thread-local, so set on every build): the pool's
  dnnl_threadpool_interop_set_max_concurrency(lib.pool->get_num_threads());
  const int64_t oh = (H - k) / s + 1, ow = (W - k) / s + 1;
  Desc x_plain, w_plain, b_plain, y_plain, x_any, w_any, y_any;
  if (!plain(x_plain, {N, C, H, W}, u8 ? kDnnlU8 : kDnnlF32) || !plain(w_plain, {O, C, k, k}) ||
      !plain(b_plain, {O}) || !plain(y_plain, {N, O, oh, ow}) || !any(x_any, {N, C, H, W}) || !any(w_any, {O, C, k, k}) ||
      !any(y_any, {N, O, oh, ow})) {
    return nullptr;
  }
  const dnnl_dims_t strides = {s, s}, dilates = {0, 0}, pad = {0, 0};
  dnnl_primitive_desc_t fwd = nullptr, pd = nullptr;
  if (dnnl_convolution_forward_primitive_desc_create(&fwd, lib.engine, kDnnlForwardTraining, kDnnlConvolutionDirect, x_any.md,
                                                     w_any.md, b_plain.md, y_any.md, strides, dilates, pad, pad,
                                                     lib.attr) != 0) {
    return nullptr;
  }
  std::vector<std::pair<int, const_dnnl_memory_desc_t>> plan;  // (argument, its plain layout), inputs first
  std::vector<bool> inputs;
  const float x_scale = pixels ? 1.0f / 255.0f : 1.0f;  // on the port of x (kDnnlArgSrc): the pixels' 1/255
  if (kind == kForward) {
    pd = fwd;
    fwd = nullptr;
    plan = {{kDnnlArgSrc, x_plain.md}, {kDnnlArgWeights, w_plain.md}, {kDnnlArgBias, b_plain.md}, {kDnnlArgDst, y_plain.md}};
    inputs = {true, true, true, false};
  } else if (kind == kBackwardData) {
    if (dnnl_convolution_backward_data_primitive_desc_create(&pd, lib.engine, kDnnlConvolutionDirect, x_any.md, w_any.md,
                                                             y_any.md, strides, dilates, pad, pad, fwd,
                                                             lib.attr) != 0) {
      pd = nullptr;
    }
    plan = {{kDnnlArgDiffDst, y_plain.md}, {kDnnlArgWeights, w_plain.md}, {kDnnlArgDiffSrc, x_plain.md}};
    inputs = {true, true, false};
  } else {
    // Few input channels (the frames of a first layer): with its own choice of the input's layout oneDNN runs the
    // weight gradient on slow code (jit:avx2 on AVX-512, 42 ms for NatureCNN's first layer at batch 256); given
    // NHWC it runs jit:avx512_core (12 ms). With 16 or more channels its blocked layouts are as fast. (Measured on
    // AVX-512 only: elsewhere oneDNN keeps its own choice.)
    Desc x_nhwc;
    if (C < 16 && lib.avx512 && channels_last(x_nhwc, N, C, H, W)) std::swap(x_any.md, x_nhwc.md);
    if (dnnl_convolution_backward_weights_primitive_desc_create(&pd, lib.engine, kDnnlConvolutionDirect, x_any.md,
                                                                w_any.md, b_plain.md, y_any.md, strides, dilates,
                                                                pad, pad, fwd, lib.attr) != 0) {
      pd = nullptr;
    }
    plan = {{kDnnlArgSrc, x_plain.md}, {kDnnlArgDiffDst, y_plain.md}, {kDnnlArgDiffWeights, w_plain.md},
            {kDnnlArgDiffBias, b_plain.md}};
    inputs = {true, true, false, false};
  }
  if (fwd) dnnl_primitive_desc_destroy(fwd);
  if (!pd) return nullptr;
  std::shared_ptr<Entry> e(new Entry());
  bool ok = dnnl_threadpool_interop_stream_create(&e->stream, lib.engine, lib.pool) == 0 &&
            dnnl_primitive_create(&e->primitive, pd) == 0;
  const char *impl = nullptr;
  if (ok && dnnl_primitive_desc_query(pd, kDnnlQueryImplInfo, 0, &impl) == 0 && impl) e->impl = impl;
  for (size_t i = 0; ok && i < plan.size(); ++i) {
    const_dnnl_memory_desc_t inner = dnnl_primitive_desc_query_md(pd, kDnnlQueryExecArgMd, plan[i].first);
    e->ports.emplace_back(new Port());
    e->args.push_back(plan[i].first);
    const float scale = plan[i].first == kDnnlArgSrc ? x_scale : 1.0f;
    ok = inner != nullptr && e->ports.back()->init(lib, plan[i].second, inner, inputs[i], scale);
  }
  dnnl_primitive_desc_destroy(pd);
  return ok ? e : nullptr;
}

// The cached entry of (kind, shape), built on first use; the least recently used beyond kMaxCachedPrimitives are
// dropped (a caller still executing one keeps it alive through its shared_ptr). Never destroyed (see library()).
std::shared_ptr<Entry> entry(Library &lib, int kind, int64_t N, int64_t C, int64_t H, int64_t W, int64_t O,
                             int64_t k, int64_t s, bool pixels = false, bool u8 = false) {
  static std::mutex *mutex = new std::mutex();
  static auto *cache = new std::map<Key, std::pair<std::shared_ptr<Entry>, uint64_t>>();  // -> (entry, last use)
  static uint64_t clock = 0;
  const Key key{kind, N, C, H, W, O, k, s, pixels, u8};
  std::lock_guard<std::mutex> lock(*mutex);
  auto it = cache->find(key);
  if (it != cache->end()) {
    it->second.second = ++clock;
    return it->second.first;
  }
  std::shared_ptr<Entry> e = build(lib, kind, N, C, H, W, O, k, s, pixels, u8);
  if (!e) return nullptr;
  if (cache->size() >= kMaxCachedPrimitives) {
    auto oldest = cache->begin();
    for (auto c = cache->begin(); c != cache->end(); ++c) {
      if (c->second.second < oldest->second.second) oldest = c;
    }
    cache->erase(oldest);
  }
  cache->emplace(key, std::make_pair(e, ++clock));
  return e;
}

int execute(Entry *e, const std::vector<void *> &data) {
  std::lock_guard<std::mutex> lock(e->mutex);
  std::vector<dnnl_exec_arg_t> args;
  for (size_t i = 0; i < e->ports.size(); ++i) {
    if (!e->ports[i]->bind(e->stream, data[i])) return kErrLibrary;
    args.push_back({e->args[i], e->ports[i]->arg()});
  }
  if (dnnl_primitive_execute(e->primitive, e->stream, static_cast<int>(args.size()), args.data()) != 0) {
    return kErrLibrary;
  }
  for (auto &port : e->ports) {
    if (!port->finish(e->stream)) return kErrLibrary;
  }
  return dnnl_stream_wait(e->stream) == 0 ? kOk : kErrLibrary;
}

// Every parameter float32 but meta (int32) and a pixel input x (uint8 or float32).
bool dtypes_ok(int n, const char **dtypes, int meta_index, int x_index, bool pixels) {
  for (int i = 0; i < n; ++i) {
    if (i == x_index && pixels && std::strcmp(dtypes[i], "uint8") == 0) continue;
    const char *want = i == meta_index ? "int32" : "float32";
    if (std::strcmp(dtypes[i], want) != 0) return false;
  }
  return true;
}

// Shapes: x (N, C, H, W), w (O, C, k, k), y (N, O, OH, OW) for meta [k, s]; false if they do not fit together.
bool conv_shapes(const int64_t *x, const int64_t *w, const int64_t *y, const int32_t *meta, int64_t *dims) {
  const int64_t k = meta[0], s = meta[1];
  if (k < 1 || s < 1 || x[2] < k || x[3] < k) return false;
  const int64_t oh = (x[2] - k) / s + 1, ow = (x[3] - k) / s + 1;
  if (w[1] != x[1] || w[2] != k || w[3] != k || y[0] != x[0] || y[1] != w[0] || y[2] != oh || y[3] != ow) {
    return false;
  }
  const int64_t v[7] = {x[0], x[1], x[2], x[3], w[0], k, s};
  std::copy(v, v + 7, dims);
  return true;
}

int run(int kind, int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes) {
  // parameter positions: forward x, w, b, meta | y; backward data dy, w, x, meta | dx;
  // backward weights x, dy, w, meta | dw, db
  const int expected = kind == kBackwardWeights ? 6 : 5;
  if (nparam != expected) return kErrParamCount;
  const int meta_at = 3;
  if (std::strcmp(dtypes[meta_at], "int32") != 0) return kErrDtype;
  if (ndims[meta_at] != 1 || shapes[meta_at][0] != 3) return kErrShape;
  const int32_t *meta = static_cast<const int32_t *>(params[meta_at]);
  const bool pixels = meta[2] != 0;
  if ((meta[2] != 0 && meta[2] != 1) || (pixels && kind == kBackwardData)) return kErrShape;
  int ix, iw, iy;
  if (kind == kForward) {
    ix = 0, iw = 1, iy = 4;
  } else if (kind == kBackwardData) {
    ix = 2, iw = 1, iy = 0;
  } else {
    ix = 0, iw = 2, iy = 1;
  }
  if (!dtypes_ok(nparam, dtypes, meta_at, ix, pixels)) return kErrDtype;
  const bool u8 = std::strcmp(dtypes[ix], "uint8") == 0;
  if (ndims[ix] != 4 || ndims[iw] != 4 || ndims[iy] != 4) return kErrShape;
  int64_t d[7];
  if (!conv_shapes(shapes[ix], shapes[iw], shapes[iy], meta, d)) return kErrShape;
  const int64_t N = d[0], C = d[1], H = d[2], W = d[3], O = d[4], k = d[5], s = d[6];
  std::vector<void *> data;
  if (kind == kForward) {
    if (ndims[2] != 1 || shapes[2][0] != O) return kErrShape;
    data = {params[0], params[1], params[2], params[4]};
  } else if (kind == kBackwardData) {
    const int64_t *dx = shapes[4];
    if (ndims[4] != 4 || dx[0] != N || dx[1] != C || dx[2] != H || dx[3] != W) return kErrShape;
    data = {params[0], params[1], params[4]};
  } else {
    const int64_t *dw = shapes[4];
    if (ndims[4] != 4 || dw[0] != O || dw[1] != C || dw[2] != k || dw[3] != k || ndims[5] != 1 ||
        shapes[5][0] != O) {
      return kErrShape;
    }
    data = {params[0], params[1], params[4], params[5]};
  }
  if (N == 0) {  // (an empty batch: oneDNN refuses zero dims) no output, or zero weight gradients
    if (kind == kBackwardWeights) {
      std::fill_n(static_cast<float *>(params[4]), O * C * k * k, 0.0f);
      std::fill_n(static_cast<float *>(params[5]), O, 0.0f);
    }
    return kOk;
  }
  Library &lib = library();
  if (!lib.ok) return kErrLibrary;
  std::shared_ptr<Entry> e = entry(lib, kind, N, C, H, W, O, k, s, pixels, u8);
  if (!e) return kErrLibrary;
  return execute(e.get(), data);
}

}  // namespace

extern "C" int OneDNNConvForward(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                                 void *, void *) {
  return guarded([&] { return run(kForward, nparam, params, ndims, shapes, dtypes); });
}

// The same forward pass under a second name: MindSpore (graph mode) keeps one bprop per aot function, and the op
// without an input gradient (a first layer's) registers another bprop (onednn_conv.py).
extern "C" int OneDNNConvForwardNoInputGrad(int nparam, void **params, int *ndims, int64_t **shapes,
                                            const char **dtypes, void *stream, void *extra) {
  return OneDNNConvForward(nparam, params, ndims, shapes, dtypes, stream, extra);
}

extern "C" int OneDNNConvBackwardData(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                                      void *, void *) {
  return guarded([&] { return run(kBackwardData, nparam, params, ndims, shapes, dtypes); });
}

extern "C" int OneDNNConvBackwardWeights(int nparam, void **params, int *ndims, int64_t **shapes,
                                         const char **dtypes, void *, void *) {
  return guarded([&] { return run(kBackwardWeights, nparam, params, ndims, shapes, dtypes); });
}

// The implementation oneDNN chose for a (kind, shape), for tests and benchmarks (not a MindSpore op): writes its
// name into `out` (at most `size` bytes, NUL-terminated); returns 0, or kErrLibrary if oneDNN refused the shape.
extern "C" int OneDNNConvImplementation(int kind, int64_t N, int64_t C, int64_t H, int64_t W, int64_t O, int64_t k,
                                        int64_t s, char *out, int64_t size) {
  return guarded([&] {
    Library &lib = library();
    if (!lib.ok || size < 1 || kind < kForward || kind > kBackwardWeights || k < 1 || s < 1 || H < k || W < k) {
      return static_cast<int>(kErrLibrary);
    }
    std::shared_ptr<Entry> e = entry(lib, kind, N, C, H, W, O, k, s);
    if (!e) return static_cast<int>(kErrLibrary);
    std::strncpy(out, e->impl.c_str(), static_cast<size_t>(size - 1));
    out[size - 1] = '\0';
    return static_cast<int>(kOk);
  });
}
