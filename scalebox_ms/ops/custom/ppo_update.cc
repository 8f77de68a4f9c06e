// Whole PPO minibatch update as one MindSpore ops.Custom(func_type="aot") kernel on CPU.
//
// One call does what scalebox_ms.trainers.ppo_update.PPOUpdateStep does in ~220 MindSpore kernels: gather the
// minibatch rows, forward the policy and value MLPs, the PPO loss (masked means, advantage normalisation,
// clipped surrogate, optional SB3 value clipping, entropy bonus), the manual backward for every parameter, the
// global grad-norm clip and MindSpore nn.Adam's update (P.Adam's CPU formula), skipped when approx_kl > kl_limit
// and target_kl is set. The model's Parameters and Adam's state are inputs that the kernel WRITES IN PLACE (on
// CPU graph mode MindSpore hands an aot kernel the Parameters' own memory; update.py and the tests check that
// other graphs and Parameter.asnumpy() see the writes).
//
// Files: mlp.h (GEMM micro-kernel, MLP forward/backward, shared with fused_actor_mlp.cc), ppo_state.h (the inputs:
// enum Input, the meta and hyper fields; the per-call and per-thread state; the block / thread split), ppo_loss.h
// (the loss and its gradient at the heads, per block of rows), ppo_optim.h (gradient combination, norm clip, Adam),
// layout.h (the feature and statistics columns), status.h (the return codes). This file: input checks, the
// minibatch step with its threads, and the entry points.
//
// PPOUpdate: inputs as enum Input (params[0 .. nparam-2]); output (params[nparam-1]) float32 (kNStats,): the
// statistics of layout.h (kStatFinite is 0 for a step skipped as non-finite; kStatLossScale is always 1).
//
// PPOUpdateEpochs (same inputs): indices int32 (n_mb, M), one minibatch per row in the order they are to run
// (epoch-major); output float32 (n_mb, kNStats + 1): per row the statistics and kRan (1 if the row ran). The rows
// run sequentially through the same per-minibatch code as PPOUpdate (bit-identical to n_mb PPOUpdate calls); with
// kl_stop the first row whose kl_ok is 0 (step skipped, statistics reported) ends the call and the later rows are
// all 0. Scratch buffers are allocated once per call. Every index is checked before anything is written.
//
// Threads (large minibatches only): a minibatch of M >= kMinSplitRows rows is split into ceil(M / kBlockRows)
// contiguous blocks of rows whose partial sums and gradients are combined in the fixed block order, the blocks
// shared out to T threads (T = SCALEBOX_MS_KERNEL_THREADS if set to an integer >= 1, else
// std::thread::hardware_concurrency() capped at 8; read on every kernel call; never more threads than blocks).
// Results are deterministic and do not depend on T (nor on scheduling): T = 1 and T = 8 give bit-identical results.
// The block split itself changes the float summation order against one pass over all M rows (differences ~1e-7
// relative per step). Smaller minibatches (e.g. CartPole's 256) run the original single-thread code with no thread
// started. Blocks of kBlockRows rows also keep the activations in L2 (faster even on one thread).
// PPOUpdateThreads(rows) / PPOUpdateBlocks(rows) (extern "C", ctypes) report the T and block count a minibatch
// would use.
//
// Denormals are flushed to zero for the whole call (FlushDenormals, simd.h; the caller's FP mode is restored).
#include <algorithm>
#include <atomic>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <thread>
#include <utility>
#include <vector>

#include "layout.h"  // kFeat*, kStat*, kNFeatures, kNStats, kRan
#include "status.h"  // return codes, guarded

namespace {

#include "simd.h"       // kCols, round_up, vf, loadv/storev, tanhv (SIMD width from -march)
#include "threads.h"    // kernel_threads, run_parallel
#include "mlp.h"        // gemm, Dense, forward, backward, MlpMeta, Activation
#include "ppo_state.h"  // Input, PPOMeta, Hyper, Layer, Worker, BlockAcc, Ctx, blocks_for, threads_for
#include "ppo_loss.h"   // run_block
#include "ppo_optim.h"  // apply_update

// Reads and checks every input but the indices and the output, and loads the layers' padded weight copies (Ctx
// scratch); no input is written. idx_ndim: 1 (one minibatch) or 2 (n_mb minibatches). Returns kOk or an error.
int setup(Ctx &c, int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, int idx_ndim) {
  if (nparam < kInLayers + 1) return kErrInputCount;
  // (every size the kernel reads or writes is checked against the inputs' shapes: a short scalar, hyper, meta,
  // Adam moment or step counter was read or written past its end)
  if (ndims[kInMeta] != 1 || std::strcmp(dtypes[kInMeta], "int32") != 0 || shapes[kInMeta][0] < kNPPOMeta)
    return kErrMeta;
  const int32_t *meta = static_cast<const int32_t *>(params[kInMeta]);
  c.n_pi = meta[kMetaNPi];
  c.n_vf = meta[kMetaNVf];
  c.discrete = meta[kMetaDiscrete];
  c.act = meta[kMetaActivation];
  c.obs_dim = meta[kMetaObsDim];
  c.act_dim = meta[kMetaActDim];
  c.normalize_adv = meta[kMetaNormalizeAdv] != 0;
  c.clip_value = meta[kMetaClipValue] != 0;
  c.kl_stop = meta[kMetaKlStop] != 0;
  if (c.n_pi < 1 || c.n_vf < 1 || c.n_pi > kMaxLayers || c.n_vf > kMaxLayers) return kErrLayerCount;
  const int n_pi = c.n_pi, nl = c.nl = c.n_pi + c.n_vf, discrete = c.discrete, obs_dim = c.obs_dim,
            act_dim = c.act_dim;
  if (shapes[kInMeta][0] != kNPPOMeta + nl || (c.act != kActTanh && c.act != kActRelu)) return kErrMeta;
  if (nparam != kInLayers + 6 * nl + 1) return kErrParamCount;
  for (int i = 0; i < nparam; ++i) {
    const bool is_int = i == kInIndices || i == kInMeta || i == kInGlobalStep || (i == kInActions && discrete);
    if (std::strcmp(dtypes[i], is_int ? "int32" : "float32") != 0) return kErrDtype;
  }
  const int fw = c.fw = obs_dim + kNFeatures;
  if (ndims[kInFeatures] != 2 || shapes[kInFeatures][1] != fw || ndims[kInIndices] != idx_ndim) return kErrShape;
  const int64_t B = c.B = shapes[kInFeatures][0];
  const int64_t *as = shapes[kInActions];
  if (discrete ? (ndims[kInActions] != 1 || as[0] != B) : (ndims[kInActions] != 2 || as[0] != B || as[1] != act_dim))
    return kErrShape;
  if (!discrete && (ndims[kInLogStd] != 1 || shapes[kInLogStd][0] != act_dim)) return kErrShape;
  if (!discrete && (!same_shape(kInLogStdM1, kInLogStd, ndims, shapes) ||
                    !same_shape(kInLogStdM2, kInLogStd, ndims, shapes)))
    return kErrShape;
  for (int i : {kInLearningRate, kInClipRange, kInClipRangeVf, kInKlLimit, kInLrParam, kInBeta1Power, kInBeta2Power,
                kInGlobalStep})
    if (numel(ndims[i], shapes[i]) != 1) return kErrShape;
  if (numel(ndims[kInHyper], shapes[kInHyper]) != kNHyper) return kErrShape;

  c.threads = kernel_threads();
  c.features = static_cast<const float *>(params[kInFeatures]);
  c.actions = params[kInActions];
  c.lr = *static_cast<const float *>(params[kInLearningRate]);
  c.clip = *static_cast<const float *>(params[kInClipRange]);
  c.clip_vf = *static_cast<const float *>(params[kInClipRangeVf]);
  c.kl_limit = *static_cast<const float *>(params[kInKlLimit]);
  const float *hyper = static_cast<const float *>(params[kInHyper]);
  c.ent_coef = hyper[kHypEntCoef];
  c.vf_coef = hyper[kHypVfCoef];
  c.max_norm = hyper[kHypMaxGradNorm];
  c.beta1 = hyper[kHypBeta1];
  c.beta2 = hyper[kHypBeta2];
  c.eps = hyper[kHypEps];
  c.lr_param = static_cast<float *>(params[kInLrParam]);
  c.beta1_power = static_cast<float *>(params[kInBeta1Power]);
  c.beta2_power = static_cast<float *>(params[kInBeta2Power]);
  c.global_step = static_cast<int32_t *>(params[kInGlobalStep]);
  c.log_std = static_cast<float *>(params[kInLogStd]);
  c.m_log_std = static_cast<float *>(params[kInLogStdM1]);
  c.v_log_std = static_cast<float *>(params[kInLogStdM2]);

  c.pi.assign(n_pi, Layer());
  c.vf.assign(c.n_vf, Layer());
  for (int k = 0; k < nl; ++k) {
    Layer &L = c.layer(k);
    const int pw = kInLayers + 2 * k, pb = pw + 1;  // W_k, b_k; their moment1s 2 nl and moment2s 4 nl slots later
    const bool first = (k == 0 || k == n_pi);
    const int in = first ? obs_dim : c.layer(k - 1).out, out = meta[kNPPOMeta + k];
    if (ndims[pw] != 2 || ndims[pb] != 1 || shapes[pw][0] != out || shapes[pw][1] != in || shapes[pb][0] != out)
      return kErrLayerShape;
    for (int m : {2 * nl, 4 * nl})  // its Adam moments, written with the layer's sizes
      if (!same_shape(pw + m, pw, ndims, shapes) || !same_shape(pb + m, pb, ndims, shapes)) return kErrLayerShape;
    L.shape(in, out, !first);  // the first layers' input gradient is not needed
    L.w = static_cast<float *>(params[pw]);
    L.b = static_cast<float *>(params[pb]);
    L.mw = static_cast<float *>(params[pw + 2 * nl]);
    L.mb = static_cast<float *>(params[pb + 2 * nl]);
    L.vw = static_cast<float *>(params[pw + 4 * nl]);
    L.vb = static_cast<float *>(params[pb + 4 * nl]);
  }
  if (c.pi.back().out != act_dim || c.vf.back().out != 1) return kErrHeadShape;
  // the GEMMs' padded copies of the Parameters' current values, once per call; each applied Adam step refreshes them
  for (int k = 0; k < nl; ++k) c.layer(k).load(c.layer(k).w, c.layer(k).in, c.layer(k).b);
  return kOk;
}

// Checks that every index is a row of the rollout (and its discrete action is valid) before anything is written.
int check_indices(const Ctx &c, const int32_t *idx, int64_t n) {
  for (int64_t r = 0; r < n; ++r) {
    const int64_t row = idx[r];
    if (row < 0 || row >= c.B) return kErrIndex;
    if (c.discrete) {
      const int32_t a = static_cast<const int32_t *>(c.actions)[row];
      if (a < 0 || a >= c.act_dim) return kErrAction;
    }
  }
  return kOk;
}

// The minibatch rows idx[0 .. M-1] into c's scratch: observations, the feature columns, actions.
void gather(Ctx &c, const int32_t *idx, int M) {
  const int obs_dim = c.obs_dim, act_dim = c.act_dim, discrete = c.discrete;
  c.x.resize(static_cast<size_t>(M) * obs_dim);
  c.old_lp.resize(M);
  c.old_v.resize(M);
  c.adv.resize(M);
  c.ret.resize(M);
  c.mask.resize(M);
  c.a_disc.resize(discrete ? M : 0);
  c.a_cont.resize(discrete ? 0 : static_cast<size_t>(M) * act_dim);
  for (int r = 0; r < M; ++r) {
    const int64_t row = idx[r];
    const float *f = c.features + row * c.fw;
    std::memcpy(c.x.data() + static_cast<int64_t>(r) * obs_dim, f, sizeof(float) * obs_dim);
    const float *cols = f + obs_dim;
    c.old_lp[r] = cols[kFeatOldLogProb];
    c.old_v[r] = cols[kFeatOldValue];
    c.adv[r] = cols[kFeatAdvantage];
    c.ret[r] = cols[kFeatReturns];
    c.mask[r] = cols[kFeatMask];
    if (discrete) {
      c.a_disc[r] = static_cast<const int32_t *>(c.actions)[row];
    } else {
      std::memcpy(c.a_cont.data() + static_cast<int64_t>(r) * act_dim,
                  static_cast<const float *>(c.actions) + row * act_dim, sizeof(float) * act_dim);
    }
  }
}

// The minibatch-wide quantities every block reads: the valid-row count n, the normalised advantages, 1 / std and
// the entropy of the Gaussian head.
void minibatch_statistics(Ctx &c, int M) {
  const std::vector<float> &mask = c.mask;
  std::vector<float> &adv = c.adv;
  double msum = 0.0;
  for (int r = 0; r < M; ++r) msum += mask[r];
  const float n = c.n = std::max(static_cast<float>(msum), 1.0f);
  if (c.normalize_adv) {
    double s = 0.0;
    for (int r = 0; r < M; ++r) s += static_cast<double>(adv[r]) * mask[r];
    const float mean = static_cast<float>(s / n);
    double sq = 0.0;
    for (int r = 0; r < M; ++r) sq += static_cast<double>(adv[r] - mean) * (adv[r] - mean) * mask[r];
    const float stdv = std::sqrt(static_cast<float>(sq / std::max(n - 1.0f, 1.0f)));
    for (int r = 0; r < M; ++r) adv[r] = (adv[r] - mean) / (stdv + 1e-8f);
  }
  c.inv_std.assign(c.act_dim, 1.0f);
  float gauss_ent = 0.0f;
  if (!c.discrete) {
    for (int j = 0; j < c.act_dim; ++j) {
      c.inv_std[j] = std::exp(-c.log_std[j]);
      gauss_ent += 0.5f + kHalfLog2Pi + c.log_std[j];
    }
  }
  c.gauss_ent = gauss_ent;
}

// Runs the NB blocks of a split minibatch (forward, loss, backward each) on T threads (T - 1 std::threads plus the
// caller): thread t runs blocks NB*t/T .. NB*(t+1)/T - 1 in order on its own Worker and moves each block's results
// to c.blocks[b]. Returns the loss sums combined in block order.
Sums run_split(Ctx &c, int M, int NB, int T) {
  if (static_cast<int>(c.blocks.size()) < NB) c.blocks.resize(NB);
  auto run_blocks = [&c, M, NB, T](int t) {
    Worker &w = c.workers[t];
    const int b1 = static_cast<int>(static_cast<int64_t>(NB) * (t + 1) / T);
    for (int b = static_cast<int>(static_cast<int64_t>(NB) * t / T); b < b1; ++b) {
      const int r0 = static_cast<int>(static_cast<int64_t>(M) * b / NB);
      const int r1 = static_cast<int>(static_cast<int64_t>(M) * (b + 1) / NB);
      run_block(c, w, r0, r1 - r0, true);
      BlockAcc &acc = c.blocks[b];
      acc.pi.resize(w.pi.size());
      acc.vf.resize(w.vf.size());
      for (size_t l = 0; l < w.pi.size(); ++l) {
        acc.pi[l].gw.swap(w.pi[l].gw);
        acc.pi[l].gbd.swap(w.pi[l].gbd);
      }
      for (size_t l = 0; l < w.vf.size(); ++l) {
        acc.vf[l].gw.swap(w.vf[l].gw);
        acc.vf[l].gbd.swap(w.vf[l].gbd);
      }
      acc.g_log_std.swap(w.g_log_std);
      acc.sums = w.sums;
    }
  };
  run_parallel(T, true, run_blocks);  // (threads.h)
  Sums s = c.blocks[0].sums;
  for (int b = 1; b < NB; ++b) s.add(c.blocks[b].sums);
  return s;
}

// One minibatch update (rows idx[0 .. M-1], already checked); writes the kNStats statistics to out. noinline:
// both entry points run the very same code, so their results are bit-identical.
//
// Threads: the minibatch-wide quantities (gather, mask count, advantage mean/std) are computed first. Minibatches
// of at least kMinSplitRows rows are then split into NB = blocks_for(M) contiguous blocks of <= kBlockRows rows;
// each block runs forward, loss terms and backward (speculatively: its gradients are unused when the KL early stop
// skips the step) into its own partial sums and gradients (BlockAcc), and these are combined in the fixed block
// order 0, 1, ..., NB-1. T = threads_for(c.threads, M) threads each take a contiguous run of blocks. Results
// depend on M only: not on T, nor on scheduling. Smaller minibatches are one block: no thread, the original
// single-thread code path and results.
__attribute__((noinline)) void step(Ctx &c, const int32_t *idx, int M, float *out) {
  gather(c, idx, M);
  minibatch_statistics(c, M);

  const int NB = blocks_for(M), T = threads_for(c.threads, M);
  if (static_cast<int>(c.workers.size()) < T) c.workers.resize(T);
  Sums s;
  if (NB == 1) {
    run_block(c, c.workers[0], 0, M, false);  // backward only if the step is applied (below)
    s = c.workers[0].sums;
  } else {
    s = run_split(c, M, NB, T);
  }
  const float n = c.n;
  const float policy_loss = -static_cast<float>(s.pol / n);
  const float value_loss = static_cast<float>(s.val / n);
  const float entropy_loss = -static_cast<float>(s.ent / n);
  const float approx_kl = static_cast<float>(s.kl / n);
  const float clip_fraction = static_cast<float>(s.clip / n);
  const bool kl_ok = approx_kl <= c.kl_limit;
  out[kStatLoss] = policy_loss + c.ent_coef * entropy_loss + c.vf_coef * value_loss;
  out[kStatPolicyLoss] = policy_loss;
  out[kStatValueLoss] = value_loss;
  out[kStatEntropyLoss] = entropy_loss;
  out[kStatApproxKl] = approx_kl;
  out[kStatClipFraction] = clip_fraction;
  out[kStatKlOk] = kl_ok ? 1.0f : 0.0f;
  // as PPOUpdateStep: a non-finite loss or gradient skips the step; the graph sums each term's rows in float32,
  // so a sum beyond float32's range is non-finite here too (the double sums kept training on returns of ~1e18)
  const bool sums_fit = std::fabs(s.pol) <= FLT_MAX && std::fabs(s.val) <= FLT_MAX && std::fabs(s.ent) <= FLT_MAX;
  out[kStatFinite] = sums_fit && std::isfinite(out[kStatLoss]) ? 1.0f : 0.0f;
  out[kStatLossScale] = 1.0f;
  *c.lr_param = c.lr;
  if (out[kStatFinite] == 0.0f) return;  // nothing changes (the trainer counts and bounds these)
  if (c.kl_stop && !kl_ok) return;       // SB3's early stop: nothing changes

  std::vector<std::vector<LayerBuf> *> bpi, bvf;
  std::vector<const std::vector<double> *> bls;
  if (NB == 1) {
    Worker &w = c.workers[0];
    backward(c.pi, w.pi, c.x.data(), c.obs_dim, M, c.act, w.dpi, w.tmp);
    backward(c.vf, w.vf, c.x.data(), c.obs_dim, M, c.act, w.dv, w.tmp);
    bpi.push_back(&w.pi);
    bvf.push_back(&w.vf);
    bls.push_back(&w.g_log_std);
  } else {
    for (int b = 0; b < NB; ++b) {
      bpi.push_back(&c.blocks[b].pi);
      bvf.push_back(&c.blocks[b].vf);
      bls.push_back(&c.blocks[b].g_log_std);
    }
  }
  if (!apply_update(c, bpi, bvf, bls)) out[kStatFinite] = 0.0f;
}

// One minibatch: indices int32 (M,), output float32 (kNStats,).
int update_one(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes) {
  Ctx c;
  if (const int err = setup(c, nparam, params, ndims, shapes, dtypes, 1)) return err;
  if (ndims[nparam - 1] != 1 || shapes[nparam - 1][0] != kNStats) return kErrShape;
  const int32_t *idx = static_cast<const int32_t *>(params[kInIndices]);
  const int M = static_cast<int>(shapes[kInIndices][0]);
  if (const int err = check_indices(c, idx, M)) return err;
  step(c, idx, M, static_cast<float *>(params[nparam - 1]));
  return kOk;
}

// All minibatches of an update: indices int32 (n_mb, M) (row i: the i-th minibatch, epoch-major), output float32
// (n_mb, kNStats + 1): the statistics of PPOUpdate and kRan. The rows run in order, exactly as n_mb PPOUpdate
// calls; with kl_stop, the first row whose kl_ok is 0 (its step skipped) is the last one run: later rows are all 0.
int update_epochs(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes) {
  constexpr int kWidth = kNStats + 1;
  Ctx c;
  if (const int err = setup(c, nparam, params, ndims, shapes, dtypes, 2)) return err;
  const int64_t n_mb = shapes[kInIndices][0];
  const int M = static_cast<int>(shapes[kInIndices][1]);
  if (ndims[nparam - 1] != 2 || shapes[nparam - 1][0] != n_mb || shapes[nparam - 1][1] != kWidth) return kErrShape;
  const int32_t *idx = static_cast<const int32_t *>(params[kInIndices]);
  if (const int err = check_indices(c, idx, n_mb * M)) return err;
  float *out = static_cast<float *>(params[nparam - 1]);
  std::fill(out, out + n_mb * kWidth, 0.0f);
  for (int64_t i = 0; i < n_mb; ++i) {
    float *row = out + i * kWidth;
    step(c, idx + i * M, M, row);
    row[kRan] = 1.0f;
    if (c.kl_stop && row[kStatKlOk] == 0.0f && row[kStatFinite] != 0.0f) break;
  }
  return kOk;
}

}  // namespace

// The entry points return a Status (status.h); MindSpore raises "... is N" for any but kOk. No exception leaves
// the kernel (guarded): one would call std::terminate and kill the process.
extern "C" int PPOUpdate(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *stream,
                         void *extra) {
  (void)stream;
  (void)extra;
  const FlushDenormals ftz;  // for the whole call; the caller's FP mode is restored on return
  return guarded([&] { return update_one(nparam, params, ndims, shapes, dtypes); });
}

extern "C" int PPOUpdateEpochs(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                               void *stream, void *extra) {
  (void)stream;
  (void)extra;
  const FlushDenormals ftz;
  return guarded([&] { return update_epochs(nparam, params, ndims, shapes, dtypes); });
}

// Threads PPOUpdate / PPOUpdateEpochs would use for a minibatch of `rows` rows under the current environment
// (SCALEBOX_MS_KERNEL_THREADS, hardware threads); for tests and benchmarks (ctypes), not a MindSpore op.
extern "C" int PPOUpdateThreads(int rows) { return threads_for(kernel_threads(), rows); }

// Blocks of rows (partial sums combined in block order) for a minibatch of `rows` rows; ctypes, like above.
extern "C" int PPOUpdateBlocks(int rows) { return blocks_for(rows); }
