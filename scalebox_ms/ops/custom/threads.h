// Threads of the scalebox_ms C++ kernels: how many a call may use, and running T parts of a call at once.
// Included inside each kernel's anonymous namespace after simd.h (FlushDenormals), once <algorithm>, <atomic>,
// <cstdlib>, <new>, <thread> and <vector> are included. Part of every kernel's cache key (build.py hashes *.h).
#pragma once

// Threads a kernel call may use: SCALEBOX_MS_KERNEL_THREADS if it is an integer >= 1 (at most 64), else
// std::thread::hardware_concurrency() capped at 8. Read on every call (a Sandbox sets the variable).
inline int kernel_threads() {
  if (const char *e = std::getenv("SCALEBOX_MS_KERNEL_THREADS")) {
    char *end = nullptr;
    const long v = std::strtol(e, &end, 10);
    if (end != e && *end == '\0' && v >= 1) return static_cast<int>(std::min(v, 64L));
  }
  const unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : static_cast<int>(std::min(hw, 8u));
}

// Runs part(t) for t = 0 .. T-1: parts 1 .. T-1 on std::threads, part 0 on the caller, which then also runs any
// part whose thread could not be started (same results: a part never depends on the thread that runs it). With
// flush_denormals the started threads run under FlushDenormals, as a kernel's entry point does. An exception
// must not escape a std::thread (std::terminate): a failed part is reported as std::bad_alloc once all joined;
// one on the caller is rethrown after joining.
template <class Part>
void run_parallel(int T, bool flush_denormals, const Part &part) {
  std::vector<std::thread> threads;
  std::vector<int> inline_runs;
  std::atomic<bool> failed{false};
  threads.reserve(T > 1 ? T - 1 : 0);
  inline_runs.reserve(T > 1 ? T - 1 : 0);  // (so that recording a thread that could not start cannot throw)
  for (int t = 1; t < T; ++t) {
    try {
      threads.emplace_back([&part, &failed, flush_denormals, t] {
        try {
          if (flush_denormals) {
            const FlushDenormals ftz;
            part(t);
          } else {
            part(t);
          }
        } catch (...) {
          failed = true;
        }
      });
    } catch (...) {
      inline_runs.push_back(t);
    }
  }
  try {
    part(0);
    for (int t : inline_runs) part(t);
  } catch (...) {
    for (std::thread &th : threads) th.join();
    throw;
  }
  for (std::thread &th : threads) th.join();
  if (failed) throw std::bad_alloc();
}
