// The part of oneDNN's C API (v3, include/oneapi/dnnl/*.h) that onednn_conv.cc uses, declared from the library's
// documentation and headers, so that no oneDNN headers are needed to build it: the library itself comes with
// MindSpore's CPU wheel (mindspore/lib/libdnnl.so.3). Enum values and argument indices are oneDNN's (stable since
// v1), named here with a k prefix. Part of every kernel's cache key (build.py hashes *.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

extern "C" {
typedef int dnnl_status_t;  // dnnl_success = 0
typedef int64_t dnnl_dim_t;
typedef dnnl_dim_t dnnl_dims_t[12];  // DNNL_MAX_NDIMS
typedef struct dnnl_engine *dnnl_engine_t;
typedef struct dnnl_stream *dnnl_stream_t;
typedef struct dnnl_memory_desc *dnnl_memory_desc_t;
typedef const struct dnnl_memory_desc *const_dnnl_memory_desc_t;
typedef struct dnnl_memory *dnnl_memory_t;
typedef struct dnnl_primitive_desc *dnnl_primitive_desc_t;
typedef const struct dnnl_primitive_desc *const_dnnl_primitive_desc_t;
typedef struct dnnl_primitive *dnnl_primitive_t;
typedef const struct dnnl_primitive *const_dnnl_primitive_t;
typedef struct dnnl_primitive_attr *dnnl_primitive_attr_t;
typedef const struct dnnl_primitive_attr *const_dnnl_primitive_attr_t;
typedef struct {
  int arg;
  dnnl_memory_t memory;
} dnnl_exec_arg_t;
typedef struct {
  int major, minor, patch;
  const char *hash;
  unsigned cpu_runtime, gpu_runtime;
} dnnl_version_t;

const dnnl_version_t *dnnl_version(void);
int dnnl_get_effective_cpu_isa(void);
dnnl_status_t dnnl_threadpool_interop_set_max_concurrency(int max_concurrency);
dnnl_status_t dnnl_engine_create(dnnl_engine_t *engine, int kind, size_t index);
dnnl_status_t dnnl_threadpool_interop_stream_create(dnnl_stream_t *stream, dnnl_engine_t engine, void *threadpool);
dnnl_status_t dnnl_stream_wait(dnnl_stream_t stream);
dnnl_status_t dnnl_stream_destroy(dnnl_stream_t stream);
dnnl_status_t dnnl_memory_desc_create_with_strides(dnnl_memory_desc_t *md, int ndims, const dnnl_dims_t dims,
                                                   int data_type, const dnnl_dims_t strides);
dnnl_status_t dnnl_memory_desc_create_with_tag(dnnl_memory_desc_t *md, int ndims, const dnnl_dims_t dims,
                                               int data_type, int tag);
dnnl_status_t dnnl_memory_desc_destroy(dnnl_memory_desc_t md);
int dnnl_memory_desc_equal(const_dnnl_memory_desc_t lhs, const_dnnl_memory_desc_t rhs);
dnnl_status_t dnnl_memory_create(dnnl_memory_t *memory, const_dnnl_memory_desc_t md, dnnl_engine_t engine,
                                 void *handle);
dnnl_status_t dnnl_memory_set_data_handle(dnnl_memory_t memory, void *handle);
dnnl_status_t dnnl_memory_destroy(dnnl_memory_t memory);
dnnl_status_t dnnl_primitive_attr_create(dnnl_primitive_attr_t *attr);
dnnl_status_t dnnl_primitive_attr_destroy(dnnl_primitive_attr_t attr);
dnnl_status_t dnnl_primitive_attr_set_fpmath_mode(dnnl_primitive_attr_t attr, int mode);
dnnl_status_t dnnl_primitive_attr_set_scales_mask(dnnl_primitive_attr_t attr, int arg, int mask);
const_dnnl_memory_desc_t dnnl_primitive_desc_query_md(const_dnnl_primitive_desc_t pd, int what, int index);
dnnl_status_t dnnl_primitive_desc_query(const_dnnl_primitive_desc_t pd, int what, int index, void *result);
dnnl_status_t dnnl_primitive_desc_destroy(dnnl_primitive_desc_t pd);
dnnl_status_t dnnl_primitive_create(dnnl_primitive_t *primitive, const_dnnl_primitive_desc_t pd);
dnnl_status_t dnnl_primitive_execute(const_dnnl_primitive_t primitive, dnnl_stream_t stream, int nargs,
                                     const dnnl_exec_arg_t *args);
dnnl_status_t dnnl_primitive_destroy(dnnl_primitive_t primitive);
dnnl_status_t dnnl_reorder_primitive_desc_create(dnnl_primitive_desc_t *pd, const_dnnl_memory_desc_t src_md,
                                                 dnnl_engine_t src_engine, const_dnnl_memory_desc_t dst_md,
                                                 dnnl_engine_t dst_engine, const_dnnl_primitive_attr_t attr);
dnnl_status_t dnnl_convolution_forward_primitive_desc_create(
    dnnl_primitive_desc_t *pd, dnnl_engine_t engine, int prop_kind, int alg_kind, const_dnnl_memory_desc_t src_md,
    const_dnnl_memory_desc_t weights_md, const_dnnl_memory_desc_t bias_md, const_dnnl_memory_desc_t dst_md,
    const dnnl_dims_t strides, const dnnl_dims_t dilates, const dnnl_dims_t padding_l, const dnnl_dims_t padding_r,
    const_dnnl_primitive_attr_t attr);
dnnl_status_t dnnl_convolution_backward_data_primitive_desc_create(
    dnnl_primitive_desc_t *pd, dnnl_engine_t engine, int alg_kind, const_dnnl_memory_desc_t diff_src_md,
    const_dnnl_memory_desc_t weights_md, const_dnnl_memory_desc_t diff_dst_md, const dnnl_dims_t strides,
    const dnnl_dims_t dilates, const dnnl_dims_t padding_l, const dnnl_dims_t padding_r,
    const_dnnl_primitive_desc_t hint_fwd_pd, const_dnnl_primitive_attr_t attr);
dnnl_status_t dnnl_convolution_backward_weights_primitive_desc_create(
    dnnl_primitive_desc_t *pd, dnnl_engine_t engine, int alg_kind, const_dnnl_memory_desc_t src_md,
    const_dnnl_memory_desc_t diff_weights_md, const_dnnl_memory_desc_t diff_bias_md,
    const_dnnl_memory_desc_t diff_dst_md, const dnnl_dims_t strides, const dnnl_dims_t dilates,
    const dnnl_dims_t padding_l, const dnnl_dims_t padding_r, const_dnnl_primitive_desc_t hint_fwd_pd,
    const_dnnl_primitive_attr_t attr);
}

namespace dnnl {
namespace threadpool_interop {
// oneDNN's abstract threadpool (dnnl_threadpool_iface.hpp): the same virtual functions in the same order, so that
// the library calls an implementation's.
struct threadpool_iface {
  virtual int get_num_threads() const = 0;
  virtual bool get_in_parallel() const = 0;
  virtual void parallel_for(int n, const std::function<void(int, int)> &fn) = 0;
  virtual uint64_t get_flags() const = 0;
  static constexpr uint64_t ASYNCHRONOUS = 1;
  virtual ~threadpool_iface() = default;
};
}  // namespace threadpool_interop
}  // namespace dnnl

constexpr int kDnnlF32 = 3;                   // dnnl_f32
constexpr int kDnnlU8 = 6;                    // dnnl_u8
constexpr int kDnnlFormatAny = 1;             // dnnl_format_tag_any
constexpr int kDnnlCpu = 1;                   // dnnl_cpu
constexpr int kDnnlForwardTraining = 64;      // dnnl_forward_training
constexpr int kDnnlConvolutionDirect = 1;     // dnnl_convolution_direct
constexpr int kDnnlQueryImplInfo = 8;         // dnnl_query_impl_info_str
constexpr int kDnnlQueryExecArgMd = 255;      // dnnl_query_exec_arg_md
constexpr int kDnnlFpmathStrict = 0;          // dnnl_fpmath_mode_strict: no implicit down-conversion of f32
constexpr unsigned kDnnlRuntimeThreadpool = 8u;  // DNNL_RUNTIME_THREADPOOL (dnnl_version_t::cpu_runtime)
constexpr int kDnnlIsaAvx512Core = 0x27;      // dnnl_cpu_isa_avx512_core
constexpr int kDnnlArgSrc = 1, kDnnlArgDst = 17, kDnnlArgWeights = 33, kDnnlArgBias = 41;
constexpr int kDnnlArgAttrScales = 4096;      // DNNL_ARG_ATTR_SCALES (| the argument it scales)
constexpr int kDnnlArgDiffSrc = 129, kDnnlArgDiffDst = 145, kDnnlArgDiffWeights = 161, kDnnlArgDiffBias = 169;
