// Return codes of the scalebox_ms C++ kernels (MindSpore raises a RuntimeError "... is N" for any code but 0;
// scalebox_ms/ops/custom/status.py maps each to a CustomOpError message, and a test checks the two list the same
// codes), and `guarded`, which turns C++ exceptions into codes: an exception leaving an aot kernel would call
// std::terminate and kill the process. Part of every kernel's cache key (build.py hashes *.h).
#pragma once

#include <new>

enum Status : int {
  kOk = 0,
  kErrInputCount = 1,   // fewer inputs than the kernel's fixed ones
  kErrLayerCount = 2,   // meta: layers per MLP outside 1 .. kMaxLayers
  kErrParamCount = 3,   // the number of inputs does not match meta's layer counts
  kErrDtype = 4,        // an input has the wrong dtype
  kErrShape = 5,        // features/obs, actions/noise, indices, log_std or the output has the wrong shape
  kErrLayerShape = 6,   // a weight or bias does not match meta's layer sizes
  kErrHeadShape = 7,    // the policy head is not act_dim wide or the value head not 1
  kErrIndex = 8,        // a minibatch index outside the rollout (nothing written)
  kErrAction = 9,       // a discrete action outside the action space (nothing written)
  kErrNoMemory = 10,    // std::bad_alloc
  kErrException = 11,   // any other C++ exception
  kErrLibrary = 12,     // a library the kernel calls (oneDNN) refused the work
};

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
