// The PPO loss of ppo_update.cc, per row: L^CLIP, the (optionally clipped) value loss and the entropy bonus, their
// sums over a block of rows, and the gradient of the loss at the policy head, log_std and the value head, derived
// by hand from scalebox_ms.trainers.ppo_update.PPOLoss (MindSpore's conventions at ties and clip bounds); then
// the backward through the MLPs (mlp.h). Included inside ppo_update.cc's anonymous namespace after ppo_state.h.
#pragma once

// d clip_by_value(x, lo, hi) / dx as MindSpore computes it (0.5 at the bounds).
inline float clip_grad(float x, float lo, float hi) {
  if (x > lo && x < hi) return 1.0f;
  if (x == lo || x == hi) return 0.5f;
  return 0.0f;
}

inline float clampf(float x, float lo, float hi) { return std::min(std::max(x, lo), hi); }

// Forward, per-row loss terms and (with_backward) backward of rows r0 .. r0+m-1 of the gathered minibatch into w
// (its layer buffers, partial sums and partial gradients). Reads only shared read-only state of c.
void run_block(const Ctx &c, Worker &w, int r0, int m, bool with_backward) {
  const int discrete = c.discrete, act = c.act, obs_dim = c.obs_dim, act_dim = c.act_dim;
  const float clip = c.clip, clip_vf = c.clip_vf, ent_coef = c.ent_coef, vf_coef = c.vf_coef, n = c.n;
  const float *log_std = c.log_std, *inv_std = c.inv_std.data();
  const float gauss_ent = c.gauss_ent;
  const float *x = c.x.data() + static_cast<int64_t>(r0) * obs_dim;
  const float *old_lp = c.old_lp.data() + r0, *old_v = c.old_v.data() + r0, *adv = c.adv.data() + r0,
              *ret = c.ret.data() + r0, *mask = c.mask.data() + r0;
  const int32_t *a_disc = discrete ? c.a_disc.data() + r0 : nullptr;
  const float *a_cont = discrete ? nullptr : c.a_cont.data() + static_cast<int64_t>(r0) * act_dim;
  w.pi.resize(c.pi.size());
  w.vf.resize(c.vf.size());
  forward(c.pi, w.pi, x, obs_dim, m, act);
  forward(c.vf, w.vf, x, obs_dim, m, act);
  const float *head = w.pi.back().h.data();
  const int hp = c.pi.back().outp;
  const float *vout = w.vf.back().h.data();
  const int vp = c.vf.back().outp;

  const float lo = 1.0f - clip, hi = 1.0f + clip;
  std::vector<float> &dpi = w.dpi, &dv = w.dv;
  dpi.assign(static_cast<size_t>(m) * hp, 0.0f);
  dv.assign(static_cast<size_t>(m) * vp, 0.0f);
  std::vector<double> &g_log_std = w.g_log_std;
  g_log_std.assign(act_dim, 0.0);
  std::vector<float> &p = w.p, &ls = w.ls;
  p.resize(act_dim);
  ls.resize(act_dim);
  double s_pol = 0.0, s_val = 0.0, s_ent = 0.0, s_kl = 0.0, s_clip = 0.0;
  for (int r = 0; r < m; ++r) {
    const float *h = head + static_cast<int64_t>(r) * hp;
    const float mk = mask[r], wt = mk / n;
    float lp, ent;
    if (discrete) {
      float mx = h[0];
      for (int j = 1; j < act_dim; ++j) mx = std::max(mx, h[j]);
      float s = 0.0f;
      for (int j = 0; j < act_dim; ++j) s += std::exp(h[j] - mx);
      const float lse = mx + std::log(s);
      ent = 0.0f;
      for (int j = 0; j < act_dim; ++j) {
        ls[j] = h[j] - lse;
        p[j] = std::exp(ls[j]);
        ent -= p[j] * ls[j];
      }
      lp = ls[a_disc[r]];
    } else {
      lp = 0.0f;
      const float *a = a_cont + static_cast<int64_t>(r) * act_dim;
      for (int j = 0; j < act_dim; ++j) {
        const float z = (a[j] - h[j]) * inv_std[j];
        lp += -0.5f * z * z - log_std[j] - kHalfLog2Pi;
      }
      ent = gauss_ent;
    }
    const float log_ratio = lp - old_lp[r];
    const float ratio = std::exp(log_ratio);
    const float s1 = ratio * adv[r], s2 = clampf(ratio, lo, hi) * adv[r];
    s_pol += static_cast<double>(std::min(s1, s2)) * mk;
    s_kl += static_cast<double>((ratio - 1.0f) - log_ratio) * mk;
    s_clip += (std::fabs(ratio - 1.0f) > clip ? 1.0 : 0.0) * mk;
    s_ent += static_cast<double>(ent) * mk;
    // d min(s1, s2) / d ratio (MindSpore's Minimum splits ties; clip_by_value passes 0.5 at its bounds)
    const float cg = clip_grad(ratio, lo, hi);
    const float dmin = s1 < s2 ? adv[r] : (s1 > s2 ? adv[r] * cg : 0.5f * adv[r] + 0.5f * adv[r] * cg);
    const float c_lp = -wt * dmin * ratio;  // dL/dlog_prob
    const float c_ent = -ent_coef * wt;     // dL/dentropy
    float *d = dpi.data() + static_cast<int64_t>(r) * hp;
    if (discrete) {
      for (int j = 0; j < act_dim; ++j)
        d[j] = c_lp * ((j == a_disc[r] ? 1.0f : 0.0f) - p[j]) + c_ent * (-p[j] * (ls[j] + ent));
    } else {
      const float *a = a_cont + static_cast<int64_t>(r) * act_dim;
      for (int j = 0; j < act_dim; ++j) {
        const float z = (a[j] - h[j]) * inv_std[j];
        d[j] = c_lp * z * inv_std[j];
        g_log_std[j] += static_cast<double>(c_lp) * (z * z - 1.0f) + c_ent;
      }
    }
    // value loss
    const float v = vout[static_cast<int64_t>(r) * vp];
    float vc = v, dvc = 1.0f;
    if (c.clip_value) {
      vc = old_v[r] + clampf(v - old_v[r], -clip_vf, clip_vf);
      dvc = clip_grad(v - old_v[r], -clip_vf, clip_vf);
    }
    const float err = ret[r] - vc;
    s_val += static_cast<double>(err) * err * mk;
    dv[static_cast<int64_t>(r) * vp] = vf_coef * wt * 2.0f * (vc - ret[r]) * dvc;
  }
  w.sums = Sums{s_pol, s_val, s_ent, s_kl, s_clip};
  if (with_backward) {
    backward(c.pi, w.pi, x, obs_dim, m, act, w.dpi, w.tmp);
    backward(c.vf, w.vf, x, obs_dim, m, act, w.dv, w.tmp);
  }
}
