// Mixture-of-experts routing and expert FFNs (numerics of llama.cpp's build_moe_ffn).
#include "model/moe.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "model/hparams.h"

namespace lamina {

Result<MoeHparams> ReadMoeHparams(const gguf::File& f, const Hparams& hp, bool default_norm_topk,
                                  bool with_shared, bool experts_n_ff) {
  MoeHparams m;
  const std::string& a = hp.arch;
  const std::string count_key = ArchKey(a, "expert_count");
  const std::string used_key = ArchKey(a, "expert_used_count");
  Result<int64_t> n_expert = f.GetInt(count_key);
  if (!n_expert.ok()) return Error{f.path() + ": missing or invalid required key " + count_key};
  Result<int64_t> n_used = f.GetInt(used_key);
  if (!n_used.ok()) return Error{f.path() + ": missing or invalid required key " + used_key};
  if (*n_expert <= 0 || *n_expert > kMaxExperts) {
    return HparamError(f, count_key, *n_expert,
                       "it must be in [1, " + std::to_string(kMaxExperts) + "]");
  }
  if (*n_used <= 0 || *n_used > *n_expert) {
    return HparamError(f, used_key, *n_used,
                       "it must be in [1, " + count_key + " " + std::to_string(*n_expert) + "]");
  }
  m.n_expert = static_cast<int>(*n_expert);
  m.n_expert_used = static_cast<int>(*n_used);
  // The first layer's expert tensors pin the counts down before anything is sized from them.
  int exps_layer = 0;
  int router_layer = 0;
  // ffn_gate_exps, or ffn_up_exps in a file without gates (mistral3's are optional).
  const char* exps_tensor = "ffn_gate_exps.weight";
  const gguf::TensorInfo* exps = FirstLayerTensor(f, hp.n_layer, exps_tensor, &exps_layer);
  if (exps == nullptr) {
    exps_tensor = "ffn_up_exps.weight";
    exps = FirstLayerTensor(f, hp.n_layer, exps_tensor, &exps_layer);
  }
  const gguf::TensorInfo* router =
      FirstLayerTensor(f, hp.n_layer, "ffn_gate_inp.weight", &router_layer);
  const std::string exps_name = "blk." + std::to_string(exps_layer) + "." + exps_tensor;
  if (exps != nullptr && exps->ne[2] != m.n_expert) {
    return HparamError(f, count_key, m.n_expert,
                       exps_name + " holds " + std::to_string(exps->ne[2]) + " experts");
  }
  if (router != nullptr && router->ne[1] != m.n_expert) {
    return HparamError(f, count_key, m.n_expert,
                       "blk." + std::to_string(router_layer) + ".ffn_gate_inp.weight routes to " +
                           std::to_string(router->ne[1]) + " experts");
  }
  const std::string ff_exp_key =
      ArchKey(a, experts_n_ff ? "feed_forward_length" : "expert_feed_forward_length");
  Result<int64_t> ff_exp =
      experts_n_ff ? Result<int64_t>(hp.n_ff) : f.GetIntOr(ff_exp_key, hp.n_ff / m.n_expert_used);
  if (!ff_exp.ok()) return ff_exp.error();
  const std::string ff_exp_default = experts_n_ff ? ""
                                                  : "feed_forward_length " +
                                                        std::to_string(hp.n_ff) + " / " + used_key +
                                                        " " + std::to_string(m.n_expert_used);
  if (exps != nullptr && exps->ne[1] != *ff_exp) {
    return HparamError(f, ff_exp_key, *ff_exp,
                       exps_name + " has " + std::to_string(exps->ne[1]) + " rows per expert",
                       ff_exp_default);
  }
  if (*ff_exp <= 0 || *ff_exp > kMaxExpertFeedForward) {
    return HparamError(f, ff_exp_key, *ff_exp,
                       "it must be in [1, " + std::to_string(kMaxExpertFeedForward) + "]",
                       ff_exp_default);
  }
  m.n_ff_exp = static_cast<int>(*ff_exp);
  if (with_shared) {
    const std::string ff_sh_key = ArchKey(a, "expert_shared_feed_forward_length");
    const std::string ff_sh_default = "feed_forward_length " + std::to_string(hp.n_ff);
    Result<int64_t> ff_sh = f.GetIntOr(ff_sh_key, hp.n_ff);
    if (!ff_sh.ok()) return ff_sh.error();
    int sh_layer = 0;
    if (const gguf::TensorInfo* sh =
            FirstLayerTensor(f, hp.n_layer, "ffn_gate_shexp.weight", &sh_layer);
        sh != nullptr && sh->ne[1] != *ff_sh) {
      return HparamError(f, ff_sh_key, *ff_sh,
                         "blk." + std::to_string(sh_layer) + ".ffn_gate_shexp.weight has " +
                             std::to_string(sh->ne[1]) + " rows",
                         ff_sh_default);
    }
    if (*ff_sh <= 0 || *ff_sh > kMaxExpertFeedForward) {
      return HparamError(f, ff_sh_key, *ff_sh,
                         "it must be in [1, " + std::to_string(kMaxExpertFeedForward) + "]",
                         ff_sh_default);
    }
    m.n_ff_shexp = static_cast<int>(*ff_sh);
  }
  // feed_forward_length has no tensor in a MoE model (it is the dense equivalent's width, and
  // the default of the widths above) but sizes the dense FFN scratch: it may not exceed all the
  // experts together.
  const int64_t experts_width =
      static_cast<int64_t>(m.n_expert) * m.n_ff_exp + static_cast<int64_t>(m.n_ff_shexp);
  if (hp.n_ff > experts_width) {
    return HparamError(
        f, ArchKey(a, "feed_forward_length"), hp.n_ff,
        "the experts together are " + std::to_string(experts_width) + " wide (" + count_key + " " +
            std::to_string(m.n_expert) + " x " + std::to_string(m.n_ff_exp) +
            (m.n_ff_shexp > 0 ? " + shared " + std::to_string(m.n_ff_shexp) : "") + ")");
  }
  if (experts_n_ff) {  // as llama.cpp: the routing is the architecture's, whatever the keys say
    m.norm_topk = default_norm_topk;
    return m;
  }
  Result<bool> norm = f.GetBoolOr(ArchKey(a, "expert_weights_norm"), default_norm_topk);
  if (!norm.ok()) return norm.error();
  m.norm_topk = *norm;
  // llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE: 1 = softmax (the Qwen default), 2 = sigmoid.
  Result<int64_t> gating = f.GetIntOr(ArchKey(a, "expert_gating_func"), 1);
  if (!gating.ok()) return gating.error();
  if (*gating != 1) {
    return Error{f.path() + ": " + ArchKey(a, "expert_gating_func") + " = " +
                 std::to_string(*gating) + " is not supported (softmax gating only)"};
  }
  return m;
}

uint64_t LoadMoeWeights(WeightLoader& L, const Hparams& hp, const MoeHparams& m, int layer,
                        MoeWeights* w, const char* norm_name, bool with_bias, bool with_norm_bias) {
  const std::string p = "blk." + std::to_string(layer) + ".";
  w->norm = L.Vector(p + norm_name + ".weight", hp.n_embd);
  if (with_norm_bias) w->norm_b = L.Vector(p + norm_name + ".bias", hp.n_embd);
  w->router = L.Matrix(p + "ffn_gate_inp.weight", hp.n_embd, m.n_expert);
  const uint64_t before = L.n_bytes();
  w->gate = L.Stacked(p + "ffn_gate_exps.weight", hp.n_embd, m.n_ff_exp, m.n_expert,
                      /*required=*/!m.gate_optional);
  w->up = L.Stacked(p + "ffn_up_exps.weight", hp.n_embd, m.n_ff_exp, m.n_expert);
  w->down = L.Stacked(p + "ffn_down_exps.weight", m.n_ff_exp, hp.n_embd, m.n_expert);
  if (with_bias) {
    w->gate_b = L.Table(p + "ffn_gate_exps.bias", m.n_ff_exp, m.n_expert);
    w->up_b = L.Table(p + "ffn_up_exps.bias", m.n_ff_exp, m.n_expert);
    w->down_b = L.Table(p + "ffn_down_exps.bias", hp.n_embd, m.n_expert);
  }
  const uint64_t expert_bytes = L.n_bytes() - before;
  if (with_bias) w->router_b = L.Vector(p + "ffn_gate_inp.bias", m.n_expert);
  if (m.n_ff_shexp > 0) {
    // A 1-D [n_embd] tensor read as a one-row matrix, so its dot product runs like any matmul.
    w->shared_gate_inp = L.Matrix(p + "ffn_gate_inp_shexp.weight", hp.n_embd, 1);
    w->shared_gate = L.Matrix(p + "ffn_gate_shexp.weight", hp.n_embd, m.n_ff_shexp);
    w->shared_up = L.Matrix(p + "ffn_up_shexp.weight", hp.n_embd, m.n_ff_shexp);
    w->shared_down = L.Matrix(p + "ffn_down_shexp.weight", m.n_ff_shexp, hp.n_embd);
  }
  return expert_bytes;
}

void RouteTopK(float* probs, int n_tokens, int n_expert, int k, bool norm_topk, int32_t* ids,
               float* weights, bool softmax_selected) {
  std::vector<int32_t> idx(n_expert);  // [n_expert] expert ids sorted by probability
  for (int t = 0; t < n_tokens; ++t) {
    float* p = probs + static_cast<int64_t>(t) * n_expert;
    if (!softmax_selected) Softmax(p, n_expert);
    std::iota(idx.begin(), idx.end(), 0);
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                      [p](int32_t a, int32_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
    int32_t* id = ids + static_cast<int64_t>(t) * k;
    float* wt = weights + static_cast<int64_t>(t) * k;
    for (int j = 0; j < k; ++j) {
      id[j] = idx[j];
      wt[j] = p[idx[j]];
    }
    if (softmax_selected) Softmax(wt, k);
    if (norm_topk) {
      double sum = 0.0;  // ggml_sum_rows accumulates in double
      for (int j = 0; j < k; ++j) sum += wt[j];
      const float denom = std::max(static_cast<float>(sum), 6.103515625e-5f);
      for (int j = 0; j < k; ++j) wt[j] /= denom;
    }
  }
}

namespace {
// rows[j] += bias row e, for n rows of width ([n_expert, width] bias; empty: none).
void AddExpertBias(const std::vector<float>& bias, int e, int n, int64_t width, float* rows) {
  if (bias.empty()) return;
  const float* b = bias.data() + static_cast<int64_t>(e) * width;
  for (int j = 0; j < n; ++j) AddInPlace(rows + j * width, b, width);
}
}  // namespace

void MoeBlock(const Hparams& hp, const MoeHparams& m, const MoeWeights& w, const ForwardBatch& b,
              ForwardScratch& s, ThreadPool& pool) {
  const int n = b.n_tokens;
  const int k = m.n_expert_used;
  const int64_t d = hp.n_embd;
  const int64_t ff_max = std::max(m.n_ff_exp, m.n_ff_shexp);
  ForwardScratch::Moe& ms = s.moe;
  GrowTo(ms.probs, static_cast<size_t>(n) * m.n_expert);
  GrowTo(ms.ids, static_cast<size_t>(n) * k);
  GrowTo(ms.weights, static_cast<size_t>(n) * k);
  GrowTo(ms.order, static_cast<size_t>(n) * k);
  GrowTo(ms.in, static_cast<size_t>(n) * d);
  GrowTo(ms.gate, static_cast<size_t>(n) * ff_max);
  GrowTo(ms.up, static_cast<size_t>(n) * ff_max);
  GrowTo(ms.out, static_cast<size_t>(n) * d);
  GrowTo(ms.slots, static_cast<size_t>(n) * k * d);
  GrowTo(ms.shared_g, static_cast<size_t>(n));

  NormBatch(hp, w.norm, w.norm_b, n, s.x.data(), s.xn.data(), &pool);
  MatMul(w.router, s.xn.data(), d, n, ms.probs.data(), m.n_expert, s.matmul, pool);
  if (!w.router_b.empty()) {
    for (int t = 0; t < n; ++t) {
      AddInPlace(ms.probs.data() + static_cast<int64_t>(t) * m.n_expert, w.router_b.data(),
                 m.n_expert);
    }
  }
  RouteTopK(ms.probs.data(), n, m.n_expert, k, m.norm_topk, ms.ids.data(), ms.weights.data(),
            m.softmax_selected);

  // Group the (token, slot) pairs by expert with a counting sort; order[] holds token * k + slot.
  std::vector<int32_t> start(m.n_expert + 1, 0);  // [n_expert + 1] offsets into order
  for (int i = 0; i < n * k; ++i) ++start[ms.ids[i] + 1];
  for (int e = 0; e < m.n_expert; ++e) start[e + 1] += start[e];
  {
    std::vector<int32_t> fill(start.begin(), start.end() - 1);  // [n_expert] next free slot
    for (int i = 0; i < n * k; ++i) ms.order[fill[ms.ids[i]]++] = i;
  }

  const int64_t ff = m.n_ff_exp;
  for (int e = 0; e < m.n_expert; ++e) {
    const int n_sel = start[e + 1] - start[e];
    if (n_sel == 0) continue;  // this expert's weights are never touched
    const int32_t* sel = ms.order.data() + start[e];
    for (int j = 0; j < n_sel; ++j) {
      const int t = sel[j] / k;
      std::copy_n(s.xn.data() + t * d, d, ms.in.data() + j * d);
    }
    MatMul(w.up[e], ms.in.data(), d, n_sel, ms.up.data(), ff, s.matmul, pool);
    AddExpertBias(w.up_b, e, n_sel, ff, ms.up.data());
    if (w.gate.empty()) {  // ungated (mistral3 without ffn_gate_exps): SiLU(up)
      Silu(ms.up.data(), static_cast<int64_t>(n_sel) * ff, ms.gate.data());
    } else {
      MatMul(w.gate[e], ms.in.data(), d, n_sel, ms.gate.data(), ff, s.matmul, pool);
      AddExpertBias(w.gate_b, e, n_sel, ff, ms.gate.data());
      if (m.swiglu_oai) {
        SwigluOaiMul(ms.gate.data(), ms.up.data(), static_cast<int64_t>(n_sel) * ff, m.oai_alpha,
                     m.oai_limit, ms.gate.data());
      } else {
        SiluMul(ms.gate.data(), ms.up.data(), static_cast<int64_t>(n_sel) * ff, ms.gate.data());
      }
    }
    MatMul(w.down[e], ms.gate.data(), ff, n_sel, ms.out.data(), d, s.matmul, pool);
    AddExpertBias(w.down_b, e, n_sel, d, ms.out.data());
    for (int j = 0; j < n_sel; ++j) {
      std::copy_n(ms.out.data() + j * d, d, ms.slots.data() + static_cast<int64_t>(sel[j]) * d);
    }
  }

  const bool shared = w.shared_gate_inp.valid();
  if (shared) {
    const int64_t sff = m.n_ff_shexp;
    MatMul(w.shared_gate_inp, s.xn.data(), d, n, ms.shared_g.data(), 1, s.matmul, pool);
    MatMul(w.shared_gate, s.xn.data(), d, n, ms.gate.data(), sff, s.matmul, pool);
    MatMul(w.shared_up, s.xn.data(), d, n, ms.up.data(), sff, s.matmul, pool);
    SiluMul(ms.gate.data(), ms.up.data(), static_cast<int64_t>(n) * sff, ms.gate.data());
    MatMul(w.shared_down, ms.gate.data(), sff, n, ms.out.data(), d, s.matmul, pool);
  }

  // Mix in llama.cpp's order: w_0·e_0 + w_1·e_1 + ... (+ gate · shared), then the residual.
  for (int t = 0; t < n; ++t) {
    float* x = s.x.data() + t * d;
    float* acc = s.xn.data() + t * d;  // the normed input is no longer needed
    const float* wt = ms.weights.data() + static_cast<int64_t>(t) * k;
    const float* e0 = ms.slots.data() + static_cast<int64_t>(t) * k * d;
    for (int64_t i = 0; i < d; ++i) acc[i] = e0[i] * wt[0];
    for (int j = 1; j < k; ++j) {
      const float* ej = e0 + j * d;
      for (int64_t i = 0; i < d; ++i) acc[i] += ej[i] * wt[j];
    }
    if (shared) {
      // sigmoid computed as silu(g) / g, as llama.cpp's graph does.
      const float g = ms.shared_g[t];
      const float gate = g == 0.0f ? 0.5f : (g / (1.0f + std::exp(-g))) / g;
      const float* sh = ms.out.data() + t * d;
      for (int64_t i = 0; i < d; ++i) acc[i] += sh[i] * gate;
    }
    AddInPlace(x, acc, d);
  }
}

}  // namespace lamina
