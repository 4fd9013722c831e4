// The Qwen hybrids of Gated DeltaNet and gated full attention: qwen3next, qwen35 (dense) and
// qwen35moe. Every `full_attention_interval`-th layer is gated full attention (qwen3 Q/K norms,
// partial NeoX RoPE, a sigmoid output gate fused into attn_q per head), the others are Gated
// DeltaNet linear attention (input projections, a short causal conv, L2-normalised q/k, the
// gated delta rule over a per-head state, a gated RMSNorm and the output projection); each
// layer's FFN, after post_attention_norm, is a softmax top-k MoE with a sigmoid-gated shared
// expert (qwen3next, qwen35moe) or a dense SwiGLU (qwen35). The qwen35 pair differs from
// qwen3next in its file layout alone: separate ssm_beta / ssm_alpha projections in V-head order,
// V heads tiled over the K heads (V head j reads K head j % n_k_heads), and interleaved
// multi-section RoPE (rope.dimension_sections) that text positions reduce to NeoX over the
// pairs its sections cover. A qwen35 or qwen35moe file's multi-token-prediction block
// (`nextn_predict_layers`, appended after the trunk's layers) is loaded as Model::mtp(): the
// normed embedding of x_{p+1} and the normed trunk state h_p, concatenated in that order and
// projected (nextn.eh_proj), then one gated full-attention block with the trunk's kind of FFN
// and the (optionally its own) head norm and output head; qwen3next leaves it unread. The
// recurrent part runs in the runtime's RecurrentContext, as attention runs in its
// AttentionContext.
#include <algorithm>
#include <cmath>

#include "model/architectures.h"
#include "model/blocks.h"
#include "model/hparams.h"
#include "model/moe.h"
#include "model/weight_loader.h"

namespace lamina {

namespace {

float Sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// What tells the hybrids apart (the rest of the layer is one code path).
struct HybridVariant {
  bool moe;     // MoE FFN with a shared expert (qwen3next, qwen35moe); else a dense SwiGLU FFN
  bool qwen35;  // the qwen35 layout: ssm_beta and ssm_alpha apart in V-head order, V heads tiled
                // over the K heads, rope.dimension_sections required; else qwen3next's fused
                // ssm_ba (per K head [beta (r) | alpha (r)]), grouped V heads and NeoX RoPE
};

class HybridModel final : public Model {
 public:
  explicit HybridModel(HybridVariant variant) : variant_(variant) {}

  Status Init(std::unique_ptr<gguf::File> file, std::unique_ptr<Tokenizer> tokenizer, bool repack) {
    repack_ = repack;
    // attn_q holds each head's query and output gate: 2 x head_dim rows per head.
    Status st = InitHparams(std::move(file), std::move(tokenizer), RopeStyle::kNeox,
                            /*q_rows_per_head_dim=*/2);
    if (!st.ok()) return st;
    st = ReadHybridHparams();
    if (!st.ok()) return st;
    if (variant_.moe) {
      Result<MoeHparams> moe = ReadMoeHparams(*file_, hparams_, /*default_norm_topk=*/true,
                                              /*with_shared=*/true);
      if (!moe.ok()) return moe.error();
      moe_ = *moe;
    }
    WeightLoader L(*file_, RepackTarget());
    LoadEmbeddingAndHead(L);
    uint64_t expert_bytes = 0;
    for (int i = 0; i < hparams_.n_layer; ++i) {
      Layer& l = layers_[i];
      const std::string p = "blk." + std::to_string(i) + ".";
      l.norm = L.Vector(p + "attn_norm.weight", hparams_.n_embd);
      if (l.recurrent >= 0) {
        LoadDeltaNet(L, p, &l);
      } else {
        LoadGatedAttention(L, p, &l);
      }
      if (variant_.moe) {
        expert_bytes += LoadMoeWeights(L, hparams_, moe_, i, &l.moe, "post_attention_norm");
      } else {
        LoadFfnWeights(L, hparams_, i, &l.ffn, "post_attention_norm");
      }
      if (!L.status().ok()) return L.status();
    }
    uint64_t unread =
        variant_.moe ? expert_bytes / moe_.n_expert * (moe_.n_expert - moe_.n_expert_used) : 0;
    if (n_nextn_ > 0 && variant_.qwen35) {
      unread += LoadMtp(L);
      if (!L.status().ok()) return L.status();
    }
    return Finish(L, unread);
  }

  void Forward(const ForwardBatch& b, AttentionContext& attention, RecurrentContext& recurrent,
               ForwardScratch& s, ThreadPool& pool, float* logits) const override {
    PrepareScratch(hparams_, b.n_tokens, s);
    EmbedTokens(token_embd_, b, s.x.data());
    for (const Layer& l : layers_) {
      if (l.recurrent >= 0) {
        DeltaNetBlock(l, b, recurrent, s, pool);
      } else {
        GatedAttentionBlock(l, b, attention, s, pool);
      }
      if (variant_.moe) {
        MoeBlock(hparams_, moe_, l.moe, b, s, pool);
      } else {
        FfnBlock(hparams_, l.ffn, b, s, pool);
      }
    }
    if (b.hidden != nullptr) NormRows(b, output_norm_, s.x.data(), b.hidden);
    OutputHead(hparams_, output_norm_, output_, b, s, pool, logits);
  }

  // The MTP block over a batch of tokens x_p at positions p, each paired with b.embd's h_{p-1}
  // (zeros at p = 0); its attention is `attention`'s layer 0.
  void ForwardMtp(const ForwardBatch& b, AttentionContext& attention, ForwardScratch& s,
                  ThreadPool& pool, float* logits) const {
    const Hparams& hp = hparams_;
    const int n = b.n_tokens;
    const int64_t d = hp.n_embd;
    LAMINA_CHECK(mtp_ != nullptr && b.embd != nullptr);
    PrepareScratch(hp, n, s);
    GrowTo(s.hybrid.cat, n * 2 * d);
    EmbedTokens(mtp_->embd.valid() ? mtp_->embd : token_embd_, b, s.x.data());
    for (int t = 0; t < n; ++t) {
      float* cat = s.hybrid.cat.data() + t * 2 * d;
      RmsNorm(s.x.data() + t * d, mtp_->enorm.data(), d, hp.rms_eps, cat);
      RmsNorm(b.embd + t * d, mtp_->hnorm.data(), d, hp.rms_eps, cat + d);
    }
    MatMul(mtp_->eh_proj, s.hybrid.cat.data(), 2 * d, n, s.x.data(), d, s.matmul, pool);
    GatedAttentionBlock(mtp_->layer, b, attention, s, pool);
    if (variant_.moe) {
      MoeBlock(hp, moe_, mtp_->layer.moe, b, s, pool);
    } else {
      FfnBlock(hp, mtp_->layer.ffn, b, s, pool);
    }
    const std::vector<float>& norm = mtp_->head_norm.empty() ? output_norm_ : mtp_->head_norm;
    if (b.hidden != nullptr) NormRows(b, norm, s.x.data(), b.hidden);
    OutputHead(hp, norm, mtp_->head.valid() ? mtp_->head : output_, b, s, pool, logits);
  }

  const Model* mtp() const override { return mtp_model_.get(); }

 private:
  struct Layer {
    int recurrent = -1;       // index among the recurrent layers; -1: an attention layer
    int kv = -1;              // index among the attention layers (the KV cache's layer)
    std::vector<float> norm;  // [n_embd] attn_norm
    // Gated DeltaNet.
    WeightMatrix ssm_in;            // [qkvz x n_embd] fused, per K head [q | k | v | z]; or
    WeightMatrix qkv, gate;         // [conv_channels x n_embd], [n_v_heads*head_v x n_embd]
    std::vector<float> conv;        // [conv_channels, conv_kernel]
    std::vector<float> dt_bias, a;  // [n_v_heads]
    WeightMatrix ba;                // [2*n_v_heads x n_embd] per K head [beta (r) | alpha (r)]
    WeightMatrix beta, alpha;       // qwen35: [n_v_heads x n_embd] each, in V-head order
    std::vector<float> ssm_norm;    // [head_v]
    WeightMatrix ssm_out;           // [n_embd x n_v_heads*head_v]
    // Gated attention.
    WeightMatrix wq;                    // [2*q_dim x n_embd] per head [q (head_dim) | gate]
    WeightMatrix wk, wv, wo;            // [kv_dim x n_embd] x2, [n_embd x q_dim]
    std::vector<float> q_norm, k_norm;  // [head_dim]
    MoeWeights moe;                     // norm = post_attention_norm (MoE variants)
    FfnWeights ffn;                     // norm = post_attention_norm (dense variant)
  };

  void LoadDeltaNet(WeightLoader& L, const std::string& p, Layer* l) const {
    const Hparams& hp = hparams_;
    const RecurrentShape& r = hp.recurrent;
    const int C = r.conv_channels();
    const int vd = r.n_v_heads * r.head_v;
    if (!variant_.qwen35 && file_->FindTensor(p + "ssm_in.weight") != nullptr) {
      l->ssm_in = L.Matrix(p + "ssm_in.weight", hp.n_embd, C + vd);
    } else {
      l->qkv = L.Matrix(p + "attn_qkv.weight", hp.n_embd, C);
      l->gate = L.Matrix(p + "attn_gate.weight", hp.n_embd, vd);
    }
    WeightMatrix conv =
        L.Matrix(p + "ssm_conv1d.weight", r.conv_kernel, C, /*required=*/true, WeightUse::kRows);
    if (conv.valid()) {
      l->conv.resize(static_cast<size_t>(C) * r.conv_kernel);  // [C, conv_kernel]
      for (int c = 0; c < C; ++c) DequantizeRow(conv, c, l->conv.data() + c * r.conv_kernel);
    }
    l->dt_bias = L.Vector(p + "ssm_dt.bias", r.n_v_heads);
    l->a = L.Vector(p + "ssm_a", r.n_v_heads);
    if (variant_.qwen35) {
      l->beta = L.Matrix(p + "ssm_beta.weight", hp.n_embd, r.n_v_heads);
      l->alpha = L.Matrix(p + "ssm_alpha.weight", hp.n_embd, r.n_v_heads);
    } else {
      l->ba = L.Matrix(p + "ssm_ba.weight", hp.n_embd, 2 * r.n_v_heads);
    }
    l->ssm_norm = L.Vector(p + "ssm_norm.weight", r.head_v);
    l->ssm_out = L.Matrix(p + "ssm_out.weight", vd, hp.n_embd);
  }

  void LoadGatedAttention(WeightLoader& L, const std::string& p, Layer* l) const {
    const Hparams& hp = hparams_;
    l->wq = L.Matrix(p + "attn_q.weight", hp.n_embd, 2 * hp.q_dim());
    l->wk = L.Matrix(p + "attn_k.weight", hp.n_embd, hp.kv_dim());
    l->wv = L.Matrix(p + "attn_v.weight", hp.n_embd, hp.kv_dim());
    l->wo = L.Matrix(p + "attn_output.weight", hp.q_dim(), hp.n_embd);
    l->q_norm = L.Vector(p + "attn_q_norm.weight", hp.head_dim);
    l->k_norm = L.Vector(p + "attn_k_norm.weight", hp.head_dim);
  }

  Status ReadHybridHparams() {
    const gguf::File& f = *file_;
    const std::string& a = hparams_.arch;
    auto req = [&](const char* suffix, int64_t lo, int64_t hi, int* out) -> Status {
      Result<int64_t> v = f.GetInt(ArchKey(a, suffix));
      if (!v.ok())
        return Error{f.path() + ": missing or invalid required key " + ArchKey(a, suffix)};
      if (*v < lo || *v > hi) {
        return Error{f.path() + ": key " + ArchKey(a, suffix) +
                     " out of range: " + std::to_string(*v)};
      }
      *out = static_cast<int>(*v);
      return Status::Ok();
    };
    Status trunk = ReadTrunkLayers();
    if (!trunk.ok()) return trunk;
    if (variant_.qwen35) {
      Status sections = ReadRopeSections(f, &hparams_);
      if (!sections.ok()) return sections;
    }
    RecurrentShape& r = hparams_.recurrent;
    r.v_tiled = variant_.qwen35;
    int inner = 0, interval = 0;
    for (Status st :
         {req("ssm.conv_kernel", 1, 64, &r.conv_kernel), req("ssm.state_size", 1, 4096, &r.head_k),
          req("ssm.group_count", 1, 4096, &r.n_k_heads),
          req("ssm.time_step_rank", 1, 4096, &r.n_v_heads),
          req("ssm.inner_size", 1, 1 << 20, &inner)}) {
      if (!st.ok()) return st;
    }
    Result<int64_t> iv = f.GetIntOr(ArchKey(a, "full_attention_interval"), 4);
    if (!iv.ok()) return iv.error();
    if (*iv < 1 || *iv > hparams_.n_layer) {
      return Error{f.path() + ": " + ArchKey(a, "full_attention_interval") + " = " +
                   std::to_string(*iv) + " leaves no full-attention layer among " +
                   std::to_string(hparams_.n_layer)};
    }
    interval = static_cast<int>(*iv);
    if (r.n_v_heads % r.n_k_heads != 0) {
      return Error{f.path() + ": inconsistent head counts: " + ArchKey(a, "ssm.time_step_rank") +
                   " (V heads) = " + std::to_string(r.n_v_heads) + " is not a multiple of " +
                   ArchKey(a, "ssm.group_count") + " (K heads) = " + std::to_string(r.n_k_heads)};
    }
    if (inner % r.n_v_heads != 0) {
      return Error{f.path() + ": inconsistent head counts: " + ArchKey(a, "ssm.inner_size") +
                   " = " + std::to_string(inner) + " is not a multiple of " +
                   ArchKey(a, "ssm.time_step_rank") + " = " + std::to_string(r.n_v_heads)};
    }
    r.head_v = inner / r.n_v_heads;
    r.l2_eps = hparams_.rms_eps;
    Status shapes = CheckHybridShapes(interval, inner);
    if (!shapes.ok()) return shapes;
    layers_.resize(hparams_.n_layer);
    for (int i = 0; i < hparams_.n_layer; ++i) {
      if ((i + 1) % interval != 0) {
        layers_[i].recurrent = r.n_layer++;
      } else {
        layers_[i].kv = hparams_.n_layer_kv++;
      }
    }
    return Status::Ok();
  }

  // block_count counts the multi-token-prediction blocks appended after the trunk
  // (`nextn_predict_layers`, llama.cpp's NextN/MTP layers: blk.<trunk> ..): the trunk runs
  // without them; the first is Model::mtp() (qwen35, qwen35moe), the others stay unread.
  Status ReadTrunkLayers() {
    const gguf::File& f = *file_;
    const std::string key = ArchKey(hparams_.arch, "nextn_predict_layers");
    Result<int64_t> nextn = f.GetIntOr(key, 0);
    if (!nextn.ok()) return nextn.error();
    if (*nextn < 0 || *nextn >= hparams_.n_layer) {
      return HparamError(f, key, *nextn,
                         "block_count is " + std::to_string(hparams_.n_layer) +
                             " and the trunk before the prediction blocks needs a layer");
    }
    hparams_.n_layer -= static_cast<int>(*nextn);
    n_nextn_ = static_cast<int>(*nextn);
    return Status::Ok();
  }

  // The hybrid's counts against the tensors present (n_layer is already checked against the
  // blk.N layers): the attention layers full_attention_interval picks are the ones with
  // attn_q.weight, and the first Gated DeltaNet layer's ssm_a, ssm_norm and conv shapes match
  // the ssm.* keys (value heads and their width first, so the conv's channel count, which
  // depends on all of them, names state_size only when the others agree).
  Status CheckHybridShapes(int interval, int inner) const {
    const gguf::File& f = *file_;
    const std::string& a = hparams_.arch;
    const RecurrentShape& r = hparams_.recurrent;
    for (int i = 0; i < hparams_.n_layer; ++i) {
      const bool attention = (i + 1) % interval == 0;
      const std::string q = "blk." + std::to_string(i) + ".attn_q.weight";
      if (attention != (f.FindTensor(q) != nullptr)) {
        return HparamError(f, ArchKey(a, "full_attention_interval"), interval,
                           "it makes blk." + std::to_string(i) + " a " +
                               (attention ? "full-attention layer, and " + q + " is missing"
                                          : "Gated DeltaNet layer, and it has " + q),
                           "4 by default");
      }
    }
    int layer = 0;
    const auto name = [&layer](const char* suffix) {
      return "blk." + std::to_string(layer) + "." + suffix;
    };
    if (const gguf::TensorInfo* ssm_a = FirstLayerTensor(f, hparams_.n_layer, "ssm_a", &layer);
        ssm_a != nullptr && static_cast<int64_t>(ssm_a->n_elements) != r.n_v_heads) {
      return HparamError(f, ArchKey(a, "ssm.time_step_rank"), r.n_v_heads,
                         name("ssm_a") + " has " + std::to_string(ssm_a->n_elements) + " heads");
    }
    if (const gguf::TensorInfo* norm =
            FirstLayerTensor(f, hparams_.n_layer, "ssm_norm.weight", &layer);
        norm != nullptr && norm->ne[0] != r.head_v) {
      return HparamError(f, ArchKey(a, "ssm.inner_size"), inner,
                         "it gives " + std::to_string(r.n_v_heads) + " value heads of " +
                             std::to_string(r.head_v) + ", and " + name("ssm_norm.weight") +
                             " has " + std::to_string(norm->ne[0]));
    }
    if (const gguf::TensorInfo* conv =
            FirstLayerTensor(f, hparams_.n_layer, "ssm_conv1d.weight", &layer)) {
      if (conv->ne[0] != r.conv_kernel) {
        return HparamError(
            f, ArchKey(a, "ssm.conv_kernel"), r.conv_kernel,
            name("ssm_conv1d.weight") + " has " + std::to_string(conv->ne[0]) + " taps");
      }
      if (conv->ne[1] != r.conv_channels()) {
        return HparamError(f, ArchKey(a, "ssm.state_size"), r.head_k,
                           "with ssm.group_count " + std::to_string(r.n_k_heads) +
                               " and ssm.inner_size " + std::to_string(inner) +
                               " the convolution has 2 x " + std::to_string(r.n_k_heads) + " x " +
                               std::to_string(r.head_k) + " + " + std::to_string(inner) + " = " +
                               std::to_string(r.conv_channels()) + " channels, and " +
                               name("ssm_conv1d.weight") + " has " + std::to_string(conv->ne[1]));
      }
    }
    return Status::Ok();
  }

  void DeltaNetBlock(const Layer& l, const ForwardBatch& b, RecurrentContext& recurrent,
                     ForwardScratch& s, ThreadPool& pool) const {
    const Hparams& hp = hparams_;
    const RecurrentShape& r = hp.recurrent;
    const int n = b.n_tokens;
    const int64_t d = hp.n_embd, C = r.conv_channels(), nv = r.n_v_heads;
    const int64_t vd = nv * r.head_v, rr = r.n_v_heads / r.n_k_heads;
    ForwardScratch::Hybrid& h = s.hybrid;
    GrowTo(h.qkv, n * C);
    GrowTo(h.z, n * vd);
    GrowTo(h.ba, n * 2 * nv);
    GrowTo(h.decay, n * nv);
    GrowTo(h.beta, n * nv);
    GrowTo(h.out, n * vd);
    for (int t = 0; t < n; ++t) {
      RmsNorm(s.x.data() + t * d, l.norm.data(), d, hp.rms_eps, s.xn.data() + t * d);
    }
    if (l.ssm_in.valid()) {
      // Fused: per K head g, [q_g (head_k) | k_g (head_k) | v (r heads) | z (r heads)].
      GrowTo(h.qg, n * (C + vd));
      MatMul(l.ssm_in, s.xn.data(), d, n, h.qg.data(), C + vd, s.matmul, pool);
      const int64_t hk = r.head_k, gv = rr * r.head_v, per = 2 * hk + 2 * gv;
      for (int t = 0; t < n; ++t) {
        const float* src = h.qg.data() + t * (C + vd);
        float* qkv = h.qkv.data() + t * C;
        float* z = h.z.data() + t * vd;
        for (int g = 0; g < r.n_k_heads; ++g) {
          const float* p = src + g * per;
          std::copy_n(p, hk, qkv + g * hk);
          std::copy_n(p + hk, hk, qkv + (r.n_k_heads + g) * hk);
          std::copy_n(p + 2 * hk, gv, qkv + 2 * r.n_k_heads * hk + g * gv);
          std::copy_n(p + 2 * hk + gv, gv, z + g * gv);
        }
      }
    } else {
      MatMul(l.qkv, s.xn.data(), d, n, h.qkv.data(), C, s.matmul, pool);
      MatMul(l.gate, s.xn.data(), d, n, h.z.data(), vd, s.matmul, pool);
    }
    // Beta and alpha logits per V head j into h.beta and h.decay: qwen35's two projections in
    // V-head order, or qwen3next's fused one, per K head g [beta (r) | alpha (r)] (j = g*r + i).
    if (variant_.qwen35) {
      MatMul(l.beta, s.xn.data(), d, n, h.beta.data(), nv, s.matmul, pool);
      MatMul(l.alpha, s.xn.data(), d, n, h.decay.data(), nv, s.matmul, pool);
    } else {
      MatMul(l.ba, s.xn.data(), d, n, h.ba.data(), 2 * nv, s.matmul, pool);
      for (int t = 0; t < n; ++t) {
        const float* ba = h.ba.data() + t * 2 * nv;
        for (int64_t j = 0; j < nv; ++j) {
          const int64_t g = j / rr, i = j % rr;
          h.beta[t * nv + j] = ba[g * 2 * rr + i];
          h.decay[t * nv + j] = ba[g * 2 * rr + rr + i];
        }
      }
    }
    // beta = sigmoid(b), decay = exp(softplus(alpha + dt_bias) * a) (a < 0).
    for (int t = 0; t < n; ++t) {
      for (int64_t j = 0; j < nv; ++j) {
        const float al = h.decay[t * nv + j] + l.dt_bias[j];
        const float sp = al > 20.0f ? al : std::log1p(std::exp(al));
        h.beta[t * nv + j] = Sigmoid(h.beta[t * nv + j]);
        h.decay[t * nv + j] = std::exp(sp * l.a[j]);
      }
    }
    recurrent.Scan(l.recurrent, l.conv.data(), h.qkv.data(), h.decay.data(), h.beta.data(),
                   h.out.data());
    // Gated RMSNorm per V head: rms(o, ssm_norm) * silu(z).
    for (int t = 0; t < n; ++t) {
      for (int j = 0; j < nv; ++j) {
        float* o = h.out.data() + t * vd + j * r.head_v;
        const float* z = h.z.data() + t * vd + j * r.head_v;
        RmsNorm(o, l.ssm_norm.data(), r.head_v, hp.rms_eps, o);
        for (int i = 0; i < r.head_v; ++i) o[i] *= z[i] / (1.0f + std::exp(-z[i]));
      }
    }
    MatMul(l.ssm_out, h.out.data(), vd, n, s.xn.data(), d, s.matmul, pool);
    AddInPlace(s.x.data(), s.xn.data(), static_cast<int64_t>(n) * d);
  }

  void GatedAttentionBlock(const Layer& l, const ForwardBatch& b, AttentionContext& attention,
                           ForwardScratch& s, ThreadPool& pool) const {
    const Hparams& hp = hparams_;
    const int n = b.n_tokens;
    const int64_t d = hp.n_embd, qd = hp.q_dim(), kvd = hp.kv_dim(), hd = hp.head_dim;
    ForwardScratch::Hybrid& h = s.hybrid;
    GrowTo(h.qg, n * 2 * qd);
    for (int t = 0; t < n; ++t) {
      RmsNorm(s.x.data() + t * d, l.norm.data(), d, hp.rms_eps, s.xn.data() + t * d);
    }
    MatMul(l.wq, s.xn.data(), d, n, h.qg.data(), 2 * qd, s.matmul, pool);
    MatMul(l.wk, s.xn.data(), d, n, s.k.data(), kvd, s.matmul, pool);
    MatMul(l.wv, s.xn.data(), d, n, s.v.data(), kvd, s.matmul, pool);
    pool.ParallelFor(n, 4, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        float* q = s.q.data() + t * qd;
        float* k = s.k.data() + t * kvd;
        const float* qg = h.qg.data() + t * 2 * qd;
        for (int j = 0; j < hp.n_head; ++j) {
          RmsNorm(qg + j * 2 * hd, l.q_norm.data(), hd, hp.rms_eps, q + j * hd);
        }
        for (int j = 0; j < hp.n_head_kv; ++j) {
          RmsNorm(k + j * hd, l.k_norm.data(), hd, hp.rms_eps, k + j * hd);
        }
        float* cs = s.rope.data() + t * hp.rope.n_rot;
        RopeCache(hp.rope, b.pos[t], cs);
        ApplyRope(hp.rope, cs, q, hp.n_head, hd);
        ApplyRope(hp.rope, cs, k, hp.n_head_kv, hd);
      }
    });
    attention.Attend(l.kv, s.q.data(), s.k.data(), s.v.data(), s.attn.data());
    for (int t = 0; t < n; ++t) {
      float* o = s.attn.data() + t * qd;
      const float* qg = h.qg.data() + t * 2 * qd;
      for (int j = 0; j < hp.n_head; ++j) {
        for (int i = 0; i < hd; ++i) o[j * hd + i] *= Sigmoid(qg[j * 2 * hd + hd + i]);
      }
    }
    MatMul(l.wo, s.attn.data(), qd, n, s.xn.data(), d, s.matmul, pool);
    AddInPlace(s.x.data(), s.xn.data(), static_cast<int64_t>(n) * d);
  }

  // hidden[t] = RmsNorm(x[t], norm) for every token ([n_tokens, n_embd] each).
  void NormRows(const ForwardBatch& b, const std::vector<float>& norm, const float* x,
                float* hidden) const {
    const int64_t d = hparams_.n_embd;
    for (int t = 0; t < b.n_tokens; ++t) {
      RmsNorm(x + t * d, norm.data(), d, hparams_.rms_eps, hidden + t * d);
    }
  }

  // The multi-token-prediction block blk.<n_layer> (qwen35, qwen35moe): its nextn.* tensors, a
  // gated full-attention layer and the trunk's kind of FFN (dense, or experts with the shared
  // expert). Returns the bytes read (none per trunk token).
  uint64_t LoadMtp(WeightLoader& L) {
    const Hparams& hp = hparams_;
    const uint64_t before = L.n_bytes();
    const std::string p = "blk." + std::to_string(hp.n_layer) + ".";
    mtp_ = std::make_unique<Mtp>();
    Mtp& m = *mtp_;
    m.layer.kv = 0;
    m.layer.norm = L.Vector(p + "attn_norm.weight", hp.n_embd);
    LoadGatedAttention(L, p, &m.layer);
    if (variant_.moe) {
      LoadMoeWeights(L, hp, moe_, hp.n_layer, &m.layer.moe, "post_attention_norm");
    } else {
      LoadFfnWeights(L, hp, hp.n_layer, &m.layer.ffn, "post_attention_norm");
    }
    m.eh_proj = L.Matrix(p + "nextn.eh_proj.weight", 2 * hp.n_embd, hp.n_embd);
    m.enorm = L.Vector(p + "nextn.enorm.weight", hp.n_embd);
    m.hnorm = L.Vector(p + "nextn.hnorm.weight", hp.n_embd);
    m.embd = L.Matrix(p + "nextn.embed_tokens.weight", hp.n_embd, hp.n_vocab, /*required=*/false,
                      WeightUse::kRows);
    m.head = L.Matrix(p + "nextn.shared_head_head.weight", hp.n_embd, hp.n_vocab,
                      /*required=*/false);
    m.head_norm = L.Vector(p + "nextn.shared_head_norm.weight", hp.n_embd, /*required=*/false);
    // The block as a one-layer model for its own session: one attention layer, no recurrent
    // state.
    Hparams mh = hp;
    mh.n_layer = 1;
    mh.n_layer_kv = 1;
    mh.recurrent = RecurrentShape{};
    mtp_model_ = std::make_unique<MtpModel>(*this, mh);
    return L.n_bytes() - before;
  }

  // Model::mtp(): runs HybridModel::ForwardMtp.
  class MtpModel final : public Model {
   public:
    MtpModel(const HybridModel& trunk, const Hparams& hp) : trunk_(trunk) { hparams_ = hp; }
    void Forward(const ForwardBatch& b, AttentionContext& attention, RecurrentContext&,
                 ForwardScratch& s, ThreadPool& pool, float* logits) const override {
      trunk_.ForwardMtp(b, attention, s, pool, logits);
    }

   private:
    const HybridModel& trunk_;
  };

  struct Mtp {
    Layer layer;                      // gated attention (cache layer 0) and the trunk's FFN
    WeightMatrix eh_proj;             // [n_embd x 2*n_embd] over [enorm(e) | hnorm(h)]
    std::vector<float> enorm, hnorm;  // [n_embd]
    WeightMatrix embd;                // [n_vocab x n_embd] optional (else token_embd)
    WeightMatrix head;                // [n_vocab x n_embd] optional (else output)
    std::vector<float> head_norm;     // [n_embd] optional (else output_norm)
  };

  HybridVariant variant_;
  MoeHparams moe_;
  std::vector<Layer> layers_;
  int n_nextn_ = 0;  // nextn_predict_layers
  std::unique_ptr<Mtp> mtp_;
  std::unique_ptr<MtpModel> mtp_model_;
};

Result<std::unique_ptr<Model>> LoadHybrid(HybridVariant variant, std::unique_ptr<gguf::File> file,
                                          std::unique_ptr<Tokenizer> tokenizer, bool repack) {
  auto model = std::make_unique<HybridModel>(variant);
  Status st = model->Init(std::move(file), std::move(tokenizer), repack);
  if (!st.ok()) return st.error();
  return std::unique_ptr<Model>(std::move(model));
}

}  // namespace

Result<std::unique_ptr<Model>> LoadQwen3Next(std::unique_ptr<gguf::File> file,
                                             std::unique_ptr<Tokenizer> tokenizer, bool repack) {
  return LoadHybrid({/*moe=*/true, /*qwen35=*/false}, std::move(file), std::move(tokenizer),
                    repack);
}

Result<std::unique_ptr<Model>> LoadQwen35(std::unique_ptr<gguf::File> file,
                                          std::unique_ptr<Tokenizer> tokenizer, bool repack) {
  return LoadHybrid({/*moe=*/false, /*qwen35=*/true}, std::move(file), std::move(tokenizer),
                    repack);
}

Result<std::unique_ptr<Model>> LoadQwen35Moe(std::unique_ptr<gguf::File> file,
                                             std::unique_ptr<Tokenizer> tokenizer, bool repack) {
  return LoadHybrid({/*moe=*/true, /*qwen35=*/true}, std::move(file), std::move(tokenizer), repack);
}

}  // namespace lamina
