// The shared decoder-only transformer (see decoder.h), and a dense one's multi-token-prediction
// head read from a companion file (Model::AttachMtp).
#include "model/decoder.h"

#include <cmath>
#include <utility>

#include "kernels/matmul.h"
#include "kernels/ops.h"
#include "model/blocks.h"
#include "model/hparams.h"
#include "model/moe.h"
#include "model/weight_loader.h"

namespace lamina {

namespace {

class Decoder final : public Model {
 public:
  Status Init(std::unique_ptr<gguf::File> file, std::unique_ptr<Tokenizer> tokenizer,
              const DecoderOptions& options, bool repack) {
    options_ = options;
    repack_ = repack;
    Status st = InitHparams(std::move(file), std::move(tokenizer), options.rope_style,
                            /*q_rows_per_head_dim=*/1, options.fused_gate_up ? 2 : 1);
    if (!st.ok()) return st;
    if (options.mistral3) {
      st = ReadMistral3Hparams();  // may turn options_.moe on
      if (!st.ok()) return st;
    }
    if (options_.moe) {
      Result<MoeHparams> moe =
          ReadMoeHparams(*file_, hparams_, options_.moe_norm_topk, options_.moe_shared_expert,
                         options_.moe_experts_n_ff);
      if (!moe.ok()) return moe.error();
      moe_ = *moe;
      moe_.gate_optional = options.mistral3;  // llama.cpp: ffn_gate_exps not required
    }
    if (options.phimoe && file_->FindTensor("output.weight") == nullptr) {
      return Error{file_->path() + ": missing tensor output.weight (phimoe's head is not tied)"};
    }
    WeightLoader L(*file_, RepackTarget());
    LoadEmbeddingAndHead(L);
    if (options.phimoe) {
      output_norm_b_ = L.Vector("output_norm.bias", hparams_.n_embd);
      output_b_ = L.Vector("output.bias", hparams_.n_vocab);
    }
    LoadRopeFactors(L);
    LayerBiases biases;
    biases.qkv = options.attn_bias;
    biases.out = options.mistral3 || options.phimoe;
    biases.ffn = options.mistral3;
    biases.norm = biases.required = options.phimoe;
    layers_.resize(hparams_.n_layer);
    uint64_t expert_bytes = 0;
    for (int i = 0; i < hparams_.n_layer; ++i) {
      LoadAttentionWeights(L, hparams_, i, biases, options.qk_norm, &layers_[i].attn,
                           options.fused_qkv);
      if (options_.moe) {
        expert_bytes += LoadMoeWeights(L, hparams_, moe_, i, &layers_[i].moe, "ffn_norm",
                                       /*with_bias=*/false, /*with_norm_bias=*/biases.norm);
      } else {
        LoadFfnWeights(L, hparams_, i, &layers_[i].ffn, "ffn_norm", options.fused_gate_up,
                       biases.ffn);
      }
      if (!L.status().ok()) return L.status();  // the first error; later layers add nothing
    }
    // A decoded token reads k of the n_expert experts of each MoE layer.
    const uint64_t unread =
        options_.moe ? expert_bytes / moe_.n_expert * (moe_.n_expert - moe_.n_expert_used) : 0;
    return Finish(L, unread);
  }

  void Forward(const ForwardBatch& batch, AttentionContext& attention, RecurrentContext&,
               ForwardScratch& s, ThreadPool& pool, float* logits) const override {
    PrepareScratch(hparams_, batch.n_tokens, s);
    EmbedTokens(token_embd_, batch, s.x.data());
    // Each block names the matrices read after it, which its last loop prefetches while the
    // threads wait (the head's, then the first layer's for the next step).
    for (int i = 0; i < hparams_.n_layer; ++i) {
      const NextWeights after_ffn =
          i + 1 < hparams_.n_layer ? FirstWeights(layers_[i + 1].attn) : NextWeights{&output_};
      AttentionBlock(hparams_, layers_[i].attn, i, batch, attention, s, pool,
                     options_.moe ? NextWeights{} : FirstWeights(layers_[i].ffn));
      if (options_.moe) {
        MoeBlock(hparams_, moe_, layers_[i].moe, batch, s, pool);
      } else {
        FfnBlock(hparams_, layers_[i].ffn, batch, s, pool, after_ffn);
      }
    }
    if (!layers_.empty()) PrefetchNext(pool, FirstWeights(layers_[0].attn));
    if (batch.hidden != nullptr) {
      NormBatch(hparams_, output_norm_, output_norm_b_, batch.n_tokens, s.x.data(), batch.hidden,
                &pool);
    }
    OutputHead(hparams_, output_norm_, output_, batch, s, pool, logits, &output_norm_b_,
               &output_b_);
  }

  const Model* mtp() const override { return mtp_model_.get(); }

  Status AttachMtp(std::unique_ptr<gguf::File> file) override {
    if (options_.moe || options_.phimoe) {
      return Error{file->path() + ": an MTP head file needs a dense model"};
    }
    if (mtp_ != nullptr) return Error{file->path() + ": the model already has an MTP head"};
    Status st = CheckMtpHparams(*file);
    if (!st.ok()) return st;
    const Hparams& hp = hparams_;
    const int il = hp.n_layer;
    const std::string p = "blk." + std::to_string(il) + ".";
    auto m = std::make_unique<MtpHead>();
    WeightLoader L(*file, RepackTarget());
    m->eh_proj = L.Matrix(p + "nextn.eh_proj.weight", 2 * hp.n_embd, hp.n_embd);
    m->enorm = L.Vector(p + "nextn.enorm.weight", hp.n_embd);
    m->hnorm = L.Vector(p + "nextn.hnorm.weight", hp.n_embd);
    m->head_norm = L.Vector(p + "nextn.shared_head_norm.weight", hp.n_embd, /*required=*/false);
    LoadAttentionWeights(L, hp, il, options_.attn_bias, options_.qk_norm, &m->attn);
    LoadFfnWeights(L, hp, il, &m->ffn);
    if (!L.status().ok()) return L.status();
    // The head as a one-layer model for its own session (cache layer 0, the trunk's RoPE).
    Hparams mh = hp;
    mh.n_layer = 1;
    mh.n_layer_kv = 1;
    mh.swa_layers.clear();
    m->hparams = mh;
    m->file = std::move(file);
    mtp_ = std::move(m);
    mtp_model_ = std::make_unique<MtpModel>(*this, mtp_->hparams);
    return Status::Ok();
  }

 private:
  // The head file's hyper-parameters against the trunk's: the same architecture, width, FFN,
  // heads and vocabulary, block_count = n_layer + nextn_predict_layers (at least one block).
  Status CheckMtpHparams(const gguf::File& f) const {
    const Hparams& hp = hparams_;
    Result<std::string> arch = f.GetString("general.architecture");
    if (!arch.ok()) return Error{f.path() + ": missing general.architecture"};
    if (*arch != hp.arch) {
      return Error{f.path() + ": general.architecture is \"" + *arch + "\", the model's is \"" +
                   hp.arch + "\""};
    }
    const std::string nextn_key = ArchKey(hp.arch, "nextn_predict_layers");
    Result<int64_t> nextn = f.GetInt(nextn_key);
    if (!nextn.ok()) return Error{f.path() + ": missing " + nextn_key};
    if (*nextn < 1) return HparamError(f, nextn_key, *nextn, "an MTP head file needs a block");
    const struct {
      const char* key;
      int64_t want;
    } keys[] = {{"block_count", hp.n_layer + *nextn},
                {"embedding_length", hp.n_embd},
                {"feed_forward_length", hp.n_ff},
                {"attention.head_count", hp.n_head},
                {"attention.head_count_kv", hp.n_head_kv}};
    for (const auto& k : keys) {
      const std::string key = ArchKey(hp.arch, k.key);
      Result<int64_t> v = f.GetInt(key);
      if (!v.ok()) return Error{f.path() + ": missing " + key};
      if (*v != k.want) {
        return HparamError(f, key, *v, "the model's is " + std::to_string(k.want));
      }
    }
    return Status::Ok();
  }

  // The MTP head over tokens x_p at positions p, each paired with b.embd's h_{p-1} (zeros at
  // p = 0): eh_proj([enorm(embed(x_p)) | hnorm(h_{p-1})]), one decoder layer in `attention`'s
  // layer 0, the head norm and the trunk's output head.
  void ForwardMtp(const ForwardBatch& b, AttentionContext& attention, ForwardScratch& s,
                  ThreadPool& pool, float* logits) const {
    const Hparams& hp = mtp_->hparams;
    const int n = b.n_tokens;
    const int64_t d = hp.n_embd;
    LAMINA_CHECK(b.embd != nullptr);
    PrepareScratch(hp, n, s);
    GrowTo(s.hybrid.cat, n * 2 * d);
    EmbedTokens(token_embd_, b, s.x.data());
    for (int t = 0; t < n; ++t) {
      float* cat = s.hybrid.cat.data() + t * 2 * d;  // [2 * n_embd]
      RmsNorm(s.x.data() + t * d, mtp_->enorm.data(), d, hp.rms_eps, cat);
      RmsNorm(b.embd + t * d, mtp_->hnorm.data(), d, hp.rms_eps, cat + d);
    }
    MatMul(mtp_->eh_proj, s.hybrid.cat.data(), 2 * d, n, s.x.data(), d, s.matmul, pool);
    AttentionBlock(hp, mtp_->attn, 0, b, attention, s, pool);
    FfnBlock(hp, mtp_->ffn, b, s, pool);
    const std::vector<float>& norm = mtp_->head_norm.empty() ? output_norm_ : mtp_->head_norm;
    if (b.hidden != nullptr) NormRows(hp, norm, b, s.x.data(), b.hidden);
    OutputHead(hp, norm, output_, b, s, pool, logits);
  }

  // Model::mtp(): runs Decoder::ForwardMtp.
  class MtpModel final : public Model {
   public:
    MtpModel(const Decoder& trunk, const Hparams& hp) : trunk_(trunk) { hparams_ = hp; }
    void Forward(const ForwardBatch& b, AttentionContext& attention, RecurrentContext&,
                 ForwardScratch& s, ThreadPool& pool, float* logits) const override {
      trunk_.ForwardMtp(b, attention, s, pool, logits);
    }

   private:
    const Decoder& trunk_;
  };

  struct MtpHead {
    std::unique_ptr<gguf::File> file;  // the companion file the weights map
    Hparams hparams;                   // the trunk's, one layer
    WeightMatrix eh_proj;              // [n_embd x 2*n_embd] over [enorm(e) | hnorm(h)]
    std::vector<float> enorm, hnorm;   // [n_embd]
    std::vector<float> head_norm;      // [n_embd] optional (else output_norm)
    AttentionWeights attn;
    FfnWeights ffn;
  };

  struct Layer {
    AttentionWeights attn;
    FfnWeights ffn;  // dense layers
    MoeWeights moe;  // MoE layers
  };
  // RoPE frequency factors (DecoderOptions::rope_factors) into rope_factors_, pointed to by
  // hparams_.rope (and so by every copy of it: the KV cache's anchors included). One per rotated
  // pair, but phimoe's are one per pair of the whole head (llama.cpp's phimoe loader sizes them
  // head_dim / 2 whatever rope.dimension_count says; ggml's RoPE reads the first n_rot / 2).
  void LoadRopeFactors(WeightLoader& L) {
    Hparams& hp = hparams_;
    const int n = options_.phimoe ? hp.head_dim / 2 : hp.rope.n_rot / 2;
    if (options_.rope_factors == RopeFactors::kFreqs) {
      rope_factors_ = L.Vector("rope_freqs.weight", n, /*required=*/false);
    } else if (options_.rope_factors == RopeFactors::kShortLong) {
      // The short factors up to the original context, the long ones past it (llama.cpp).
      rope_factors_ = L.Vector("rope_factors_short.weight", n, /*required=*/false);
      long_factors_ = L.Vector("rope_factors_long.weight", n, false);
    }
    if (!rope_factors_.empty()) hp.rope.freq_factors = rope_factors_.data();
    if (!long_factors_.empty() && long_factors_ != rope_factors_) {
      hp.rope_short_ctx = hp.rope_scaling.n_ctx_orig;
      hp.rope_long = hp.rope;
      hp.rope_long.freq_factors = long_factors_.data();
    }
  }

  // mistral3: temperature tuning, YaRN's log multiplier, and the experts when expert_count > 0
  // (options_.moe); what llama.cpp would not run (partial RoPE, a shared expert) is refused by
  // name.
  Status ReadMistral3Hparams() {
    Hparams& hp = hparams_;
    const gguf::File& f = *file_;
    const std::string temp_key = ArchKey(hp.arch, "attention.temperature_scale");
    const std::string log_key = ArchKey(hp.arch, "rope.scaling.yarn_log_multiplier");
    Result<double> temp = f.GetFloatOr(temp_key, 0.0);
    if (!temp.ok()) return temp.error();
    Result<double> log_mul = f.GetFloatOr(log_key, 0.0);
    if (!log_mul.ok()) return log_mul.error();
    for (const auto& [key, v] : {std::pair{temp_key, *temp}, std::pair{log_key, *log_mul}}) {
      if (!std::isfinite(v) || v < 0.0 || v > 1e6) {
        return Error{f.path() + ": metadata key \"" + key + "\" = " + std::to_string(v) +
                     " is out of range [0, 1e6]"};
      }
    }
    hp.attn_temp_scale = static_cast<float>(*temp);
    hp.attn_temp_floor = hp.rope_scaling.n_ctx_orig;  // the file's, not --yarn-orig-ctx
    hp.rope_scaling.yarn_log_mul = static_cast<float>(*log_mul);
    hp.rope = ResolveRope(hp.rope, hp.rope_scaling, RopeOverrides{});
    if (hp.rope.n_rot != hp.head_dim) {
      return HparamError(f, ArchKey(hp.arch, "rope.dimension_count"), hp.rope.n_rot,
                         "mistral3 turns the whole head (" + std::to_string(hp.head_dim) +
                             "; llama.cpp's graph asserts it), partial RoPE is not supported");
    }
    // As llama.cpp: experts when expert_count says so (its loader reads no shared expert).
    Result<int64_t> n_expert = f.GetIntOr(ArchKey(hp.arch, "expert_count"), 0);
    if (!n_expert.ok()) return n_expert.error();
    if (*n_expert != 0) {
      options_.moe = true;
      options_.moe_norm_topk = true;
      options_.moe_experts_n_ff = true;
    }
    for (const char* t : {"ffn_gate_shexp.weight", "ffn_up_shexp.weight", "ffn_down_shexp.weight",
                          "ffn_gate_inp_shexp.weight"}) {
      int layer = 0;
      if (FirstLayerTensor(f, hp.n_layer, t, &layer) != nullptr) {
        return Error{f.path() + ": tensor blk." + std::to_string(layer) + "." + t +
                     " is not supported for mistral3 (llama.cpp reads no shared expert there)"};
      }
    }
    return Status::Ok();
  }

  DecoderOptions options_;
  MoeHparams moe_;
  std::vector<Layer> layers_;
  std::unique_ptr<MtpHead> mtp_;
  std::unique_ptr<MtpModel> mtp_model_;
  std::vector<float> output_norm_b_;  // [n_embd] phimoe's output_norm.bias; empty: none
  std::vector<float> output_b_;       // [n_vocab] phimoe's output.bias; empty: none
  std::vector<float> rope_factors_;   // [n_rot / 2] RoPE frequency factors; empty: none
  std::vector<float> long_factors_;   // [n_rot / 2] phi3's rope_factors_long; empty: none
};

}  // namespace

Result<std::unique_ptr<Model>> LoadDecoder(std::unique_ptr<gguf::File> file,
                                           std::unique_ptr<Tokenizer> tokenizer,
                                           const DecoderOptions& options, bool repack) {
  auto model = std::make_unique<Decoder>();
  Status st = model->Init(std::move(file), std::move(tokenizer), options, repack);
  if (!st.ok()) return st.error();
  return std::unique_ptr<Model>(std::move(model));
}

}  // namespace lamina
