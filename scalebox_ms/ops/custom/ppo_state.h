// ppo_update.cc's inputs, its per-call state (Ctx), the per-thread state of a block of rows (Worker) and the
// block / thread split of large minibatches. Included inside ppo_update.cc's anonymous namespace after mlp.h.
#pragma once

// Input slots of PPOUpdate / PPOUpdateEpochs (params[i]); the model's layers follow from kInLayers.
enum Input : int {
  kInFeatures,      // float32 (B, obs_dim + kNFeatures), columns as layout.h
  kInActions,       // int32 (B,) (discrete) or float32 (B, act_dim)
  kInIndices,       // int32 (M,) one minibatch, or (n_mb, M) for PPOUpdateEpochs
  kInLearningRate,  // float32 scalars (first element read)
  kInClipRange,
  kInClipRangeVf,
  kInKlLimit,
  kInMeta,          // int32: MlpMeta, PPOMeta, then the layer widths
  kInHyper,         // float32: Hyper
  kInLrParam,       // Adam's learning_rate Parameter (written)
  kInBeta1Power,    // written when the step is applied
  kInBeta2Power,
  kInGlobalStep,    // int32, written when the step is applied
  kInLogStd,        // (act_dim,) and its moment1, moment2 (ignored for discrete actions)
  kInLogStdM1,
  kInLogStdM2,
  kInLayers,        // W_0, b_0, W_1, b_1, ... (policy then value layers), then their moment1s, then moment2s
};

// meta fields after MlpMeta (update.py builds them in this order); the layer widths follow.
enum PPOMeta : int { kMetaNormalizeAdv = kNMlpMeta, kMetaClipValue, kMetaKlStop, kNPPOMeta };

// The hyper input, float32 (update.py builds it in this order).
enum Hyper : int { kHypEntCoef, kHypVfCoef, kHypMaxGradNorm, kHypBeta1, kHypBeta2, kHypEps, kNHyper };

constexpr int kMinSplitRows = 2048;  // smaller minibatches: one block, no threads (the original code path)
#ifndef SBX_BLOCK_ROWS
#define SBX_BLOCK_ROWS 512
#endif
constexpr int kBlockRows = SBX_BLOCK_ROWS;  // larger ones: blocks of <= kBlockRows rows (activations stay in L2)

// A trained Dense layer: the padded copies (Dense, with wp), its Parameters and Adam moments (written in place,
// nn.Dense layout) and the whole minibatch's gradient (all blocks combined).
struct Layer : Dense {
  float *w = nullptr, *b = nullptr, *mw = nullptr, *mb = nullptr, *vw = nullptr, *vb = nullptr;
  std::vector<float> gw, gb;  // dL/dW (out, in), dL/db (out,)
};

// The sums over rows that make the minibatch's loss terms.
struct Sums {
  double pol = 0, val = 0, ent = 0, kl = 0, clip = 0;

  void add(const Sums &o) {
    pol += o.pol;
    val += o.val;
    ent += o.ent;
    kl += o.kl;
    clip += o.clip;
  }
};

// Thread-private state of one block of rows: layer buffers, loss gradients and partial sums.
struct Worker {
  std::vector<LayerBuf> pi, vf;
  std::vector<float> dpi, dv, tmp, p, ls;
  std::vector<double> g_log_std;
  Sums sums;
};

// The partial results of one block of rows (gradients in pi/vf[l].gw, .gbd; h unused), moved out of the Worker
// that computed it.
struct BlockAcc {
  std::vector<LayerBuf> pi, vf;
  std::vector<double> g_log_std;
  Sums sums;
};

// Everything one kernel call needs: the inputs, the network (pointers into the Parameters plus padded copies)
// and scratch buffers that persist across the minibatches of one call (allocated once, sized for M rows).
struct Ctx {
  int n_pi = 0, n_vf = 0, nl = 0, discrete = 0, act = 0, obs_dim = 0, act_dim = 0, fw = 0;
  int threads = 1;  // kernel_threads(), read once per call
  bool normalize_adv = false, clip_value = false, kl_stop = false;
  int64_t B = 0;
  const float *features = nullptr;
  const void *actions = nullptr;
  float lr = 0, clip = 0, clip_vf = 0, kl_limit = 0;
  float ent_coef = 0, vf_coef = 0, max_norm = 0, beta1 = 0, beta2 = 0, eps = 0;
  float *lr_param = nullptr, *beta1_power = nullptr, *beta2_power = nullptr;
  int32_t *global_step = nullptr;
  float *log_std = nullptr, *m_log_std = nullptr, *v_log_std = nullptr;
  std::vector<Layer> pi, vf;
  // scratch: the gathered minibatch (shared, read-only while the blocks run), per-thread workers
  std::vector<float> x, old_lp, old_v, adv, ret, mask, a_cont, inv_std, gls;
  std::vector<int32_t> a_disc;
  float n = 1.0f, gauss_ent = 0.0f;
  std::vector<Worker> workers;  // one per thread
  std::vector<BlockAcc> blocks;  // one per block (split minibatches)

  Layer &layer(int k) { return k < n_pi ? pi[k] : vf[k - n_pi]; }
};

// Blocks of rows for a minibatch of M rows: 1 (the single-thread path) below kMinSplitRows rows, else
// ceil(M / kBlockRows) near-equal contiguous blocks. Depends on M only, never on the thread count.
inline int blocks_for(int M) { return M < kMinSplitRows ? 1 : (M + kBlockRows - 1) / kBlockRows; }

// Threads for a minibatch of M rows: min(threads, blocks_for(M)); 1 starts no thread.
inline int threads_for(int threads, int M) { return std::max(1, std::min(threads, blocks_for(M))); }
