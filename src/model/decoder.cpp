// The shared decoder-only transformer (see decoder.h).
#include "model/decoder.h"

#include <cmath>
#include <utility>

#include "model/blocks.h"
#include "model/hparams.h"
#include "model/moe.h"
#include "model/weight_loader.h"

namespace lamina {

namespace {

class Decoder final : public Model {
 public:
  Status Init(std::unique_ptr<gguf::File> file, std::unique_ptr<Tokenizer> tokenizer,
              const DecoderOptions& options) {
    options_ = options;
    Status st = InitHparams(std::move(file), std::move(tokenizer), options.rope_style,
                            /*q_rows_per_head_dim=*/1, options.fused_gate_up ? 2 : 1);
    if (!st.ok()) return st;
    if (options.mistral3) {
      st = ReadMistral3Hparams();
      if (!st.ok()) return st;
    }
    if (options.moe) {
      Result<MoeHparams> moe =
          ReadMoeHparams(*file_, hparams_, options.moe_norm_topk, options.moe_shared_expert);
      if (!moe.ok()) return moe.error();
      moe_ = *moe;
    }
    WeightLoader L(*file_, &interleaved_);
    LoadEmbeddingAndHead(L);
    LoadRopeFactors(L);
    layers_.resize(hparams_.n_layer);
    uint64_t expert_bytes = 0;
    for (int i = 0; i < hparams_.n_layer; ++i) {
      LoadAttentionWeights(L, hparams_, i, options.attn_bias, options.qk_norm, &layers_[i].attn,
                           options.fused_qkv);
      if (options.moe) {
        expert_bytes += LoadMoeWeights(L, hparams_, moe_, i, &layers_[i].moe);
      } else {
        LoadFfnWeights(L, hparams_, i, &layers_[i].ffn, "ffn_norm", options.fused_gate_up);
      }
      if (!L.status().ok()) return L.status();  // the first error; later layers add nothing
    }
    // A decoded token reads k of the n_expert experts of each MoE layer.
    const uint64_t unread =
        options.moe ? expert_bytes / moe_.n_expert * (moe_.n_expert - moe_.n_expert_used) : 0;
    return Finish(L, unread);
  }

  void Forward(const ForwardBatch& batch, AttentionContext& attention, RecurrentContext&,
               ForwardScratch& s, ThreadPool& pool, float* logits) const override {
    PrepareScratch(hparams_, batch.n_tokens, s);
    EmbedTokens(token_embd_, batch, s.x.data());
    for (int i = 0; i < hparams_.n_layer; ++i) {
      AttentionBlock(hparams_, layers_[i].attn, i, batch, attention, s, pool);
      if (options_.moe) {
        MoeBlock(hparams_, moe_, layers_[i].moe, batch, s, pool);
      } else {
        FfnBlock(hparams_, layers_[i].ffn, batch, s, pool);
      }
    }
    OutputHead(hparams_, output_norm_, output_, batch, s, pool, logits);
  }

 private:
  struct Layer {
    AttentionWeights attn;
    FfnWeights ffn;  // dense layers
    MoeWeights moe;  // MoE layers
  };
  // RoPE frequency factors (DecoderOptions::rope_factors) into rope_factors_, pointed to by
  // hparams_.rope (and so by every copy of it: the KV cache's anchors included).
  void LoadRopeFactors(WeightLoader& L) {
    Hparams& hp = hparams_;
    const int n = hp.rope.n_rot / 2;
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

  // mistral3: temperature tuning and YaRN's log multiplier; what llama.cpp would read that this
  // decoder does not (biases, experts) is refused by name.
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
                         "mistral3 turns the whole head (" + std::to_string(hp.head_dim) + ")");
    }
    for (const char* t : {"attn_output.bias", "ffn_gate.bias", "ffn_up.bias", "ffn_down.bias",
                          "ffn_gate_inp.weight"}) {
      int layer = 0;
      if (FirstLayerTensor(f, hp.n_layer, t, &layer) != nullptr) {
        return Error{f.path() + ": tensor blk." + std::to_string(layer) + "." + t +
                     " is not supported for mistral3 (its biases and experts are not read)"};
      }
    }
    return Status::Ok();
  }

  DecoderOptions options_;
  MoeHparams moe_;
  std::vector<Layer> layers_;
  std::vector<float> rope_factors_;  // [n_rot / 2] RoPE frequency factors; empty: none
  std::vector<float> long_factors_;  // [n_rot / 2] phi3's rope_factors_long; empty: none
};

}  // namespace

Result<std::unique_ptr<Model>> LoadDecoder(std::unique_ptr<gguf::File> file,
                                           std::unique_ptr<Tokenizer> tokenizer,
                                           const DecoderOptions& options) {
  auto model = std::make_unique<Decoder>();
  Status st = model->Init(std::move(file), std::move(tokenizer), options);
  if (!st.ok()) return st.error();
  return std::unique_ptr<Model>(std::move(model));
}

}  // namespace lamina
