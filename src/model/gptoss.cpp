// The gpt-oss decoder as llama.cpp runs it ("gpt-oss", LLM_ARCH_OPENAI_MOE): per layer pre-norm
// attention with Q/K/V and output biases, NeoX RoPE (YaRN when the file says so) on every layer,
// sliding-window layers alternating with full ones (attention.sliding_window_pattern, default 2:
// even layers local), a learned sink logit per query head joining each softmax's denominator,
// scale 1 / sqrt(rope dimensions); then, after post_attention_norm, a mixture of experts whose
// router has a bias, whose top k are chosen on the router logits and weighted by the softmax of
// those k alone, and whose experts have biases and the clamped swiglu_oai activation (alpha
// 1.702, limit 7). Final norm and a separate output head.
#include <cmath>

#include "model/architectures.h"
#include "model/blocks.h"
#include "model/hparams.h"
#include "model/moe.h"
#include "model/weight_loader.h"

namespace lamina {

namespace {

class GptOss final : public Model {
 public:
  Status Init(std::unique_ptr<gguf::File> file, std::unique_ptr<Tokenizer> tokenizer, bool repack) {
    repack_ = repack;
    Status st = InitHparams(std::move(file), std::move(tokenizer), RopeStyle::kNeox);
    if (!st.ok()) return st;
    st = ReadGptOssHparams();
    if (!st.ok()) return st;
    WeightLoader L(*file_, RepackTarget());
    LoadEmbeddingAndHead(L);
    layers_.resize(hparams_.n_layer);
    uint64_t expert_bytes = 0;
    for (int i = 0; i < hparams_.n_layer; ++i) {
      const std::string p = "blk." + std::to_string(i) + ".";
      Layer& l = layers_[i];
      LayerBiases biases;
      biases.qkv = biases.out = biases.required = true;
      LoadAttentionWeights(L, hparams_, i, biases, /*with_qk_norm=*/false, &l.attn);
      l.sinks = L.Vector(p + "attn_sinks.weight", hparams_.n_head);
      expert_bytes += LoadMoeWeights(L, hparams_, moe_, i, &l.moe, "post_attention_norm",
                                     /*with_bias=*/true);
      if (!L.status().ok()) return L.status();
    }
    if (!L.status().ok()) return L.status();
    // A decoded token reads k of the n_expert experts of each layer.
    return Finish(L, expert_bytes / moe_.n_expert * (moe_.n_expert - moe_.n_expert_used));
  }

  void Forward(const ForwardBatch& batch, AttentionContext& attention, RecurrentContext&,
               ForwardScratch& s, ThreadPool& pool, float* logits) const override {
    const Hparams& hp = hparams_;
    PrepareScratch(hp, batch.n_tokens, s);
    EmbedTokens(token_embd_, batch, s.x.data());
    for (int i = 0; i < hp.n_layer; ++i) {
      const Layer& l = layers_[i];
      AttentionBlock(hp, l.attn, i, batch, attention, s, pool);  // its output bias included
      MoeBlock(hp, moe_, l.moe, batch, s, pool);
    }
    OutputHead(hp, output_norm_, output_, batch, s, pool, logits);
  }

  const float* AttentionSinks(int layer) const override { return layers_[layer].sinks.data(); }

 private:
  struct Layer {
    AttentionWeights attn;     // with attn_output.bias (bo)
    std::vector<float> sinks;  // [n_head] attn_sinks.weight
    MoeWeights moe;            // its norm is post_attention_norm
  };

  // The sliding window (required; period 2; the local layers rotate like the global ones), the
  // attention scale, and the experts (expert_feed_forward_length required, as llama.cpp).
  Status ReadGptOssHparams() {
    Hparams& hp = hparams_;
    SlidingWindowRules rules;
    rules.default_period = 2;
    rules.global_rope = true;
    rules.required = true;
    Status st = ReadSlidingWindow(*file_, &hp, rules);
    if (!st.ok()) return st;
    hp.attn_scale = 1.0f / std::sqrt(static_cast<float>(hp.rope.n_rot));
    const std::string ff_exp_key = ArchKey(hp.arch, "expert_feed_forward_length");
    if (file_->Find(ff_exp_key) == nullptr) {
      return Error{file_->path() + ": missing required key " + ff_exp_key};
    }
    Result<MoeHparams> moe = ReadMoeHparams(*file_, hp, /*default_norm_topk=*/false,
                                            /*with_shared=*/false);
    if (!moe.ok()) return moe.error();
    moe_ = *moe;
    // As llama.cpp: the gating and the activation are the architecture's, not the file's.
    moe_.norm_topk = false;
    moe_.softmax_selected = true;
    moe_.swiglu_oai = true;
    return Status::Ok();
  }

  MoeHparams moe_;
  std::vector<Layer> layers_;
};

}  // namespace

Result<std::unique_ptr<Model>> LoadGptOss(std::unique_ptr<gguf::File> file,
                                          std::unique_ptr<Tokenizer> tokenizer, bool repack) {
  auto model = std::make_unique<GptOss>();
  Status st = model->Init(std::move(file), std::move(tokenizer), repack);
  if (!st.ok()) return st.error();
  return std::unique_ptr<Model>(std::move(model));
}

}  // namespace lamina
