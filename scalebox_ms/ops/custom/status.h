// Return codes of the scalebox_ms C++ kernels (MindSpore raises a RuntimeError "... is N" for any code but 0;
// scalebox_ms/ops/custom/status.py maps each to a CustomOpError message, and a test checks the two list the same
// codes), and `guarded`, which turns C++ exceptions into codes: an exception leaving an aot kernel would call
// std::terminate and kill the process. Part of every kernel's cache key (build.py hashes *.h).
#pragma once

#include <cstdint>
#include <new>

enum Status : int {
  kOk = 0,
  kErrInputCount = 1,   // fewer inputs than the kernel's fixed ones
  kErrLayerCount = 2,   // meta: layers per MLP outside 1 .. kMaxLayers
  kErrParamCount = 3,   // the number of inputs does not match meta's layer counts
  kErrDtype = 4,        // an input has the wrong dtype
  kErrShape = 5,        // features/obs, actions/noise, indices, log_std (+ moments), a scalar, hyper or the output
  kErrLayerShape = 6,   // a weight or bias (or its Adam moments) does not match meta's layer sizes
  kErrHeadShape = 7,    // the policy head is not act_dim wide or the value head not 1
  kErrIndex = 8,        // a minibatch index outside the rollout (nothing written)
  kErrAction = 9,       // a discrete action outside the action space (nothing written)
  kErrNoMemory = 10,    // std::bad_alloc
  kErrException = 11,   // any other C++ exception
  kErrLibrary = 12,     // a library the kernel calls (oneDNN) refused the work
  kErrMeta = 13,        // meta is not int32 of its length, or names an unknown activation (nothing written)
};

// Elements of an input of `ndim` dimensions (1 for a scalar).
inline int64_t numel(int ndim, const int64_t *shape) {
  int64_t n = 1;
  for (int d = 0; d < ndim; ++d) n *= shape[d];
  return n;
}

// Inputs i and j have the same shape (an Adam moment and its Parameter).
inline bool same_shape(int i, int j, const int *ndims, int64_t *const *shapes) {
  if (ndims[i] != ndims[j]) return false;
  for (int d = 0; d < ndims[i]; ++d)
    if (shapes[i][d] != shapes[j][d]) return false;
  return true;
}

template <class F>
int guarded(F body) {
  try {
    return body();
  } catch (const std::bad_alloc &) {
    return kErrNoMemory;
  } catch (...) {
    return kErrException;
  }
}
