// The qwen3moe architecture: qwen3 attention (per-head Q/K RMSNorm before NeoX RoPE, head_dim
// from attention.key_length) and a mixture-of-experts FFN without a shared expert. The top-k
// weights are renormalised to sum 1: llama.cpp hard-codes this for qwen3moe (the real models'
// norm_topk_prob), and expert_weights_norm, when present, overrides it.
#include "model/architectures.h"
#include "model/moe.h"

namespace lamina {

namespace {

class Qwen3MoeModel final : public DecoderModel {
 public:
  Status Init(std::unique_ptr<gguf::File> file, std::unique_ptr<Tokenizer> tokenizer) {
    Status st = InitHparams(std::move(file), std::move(tokenizer), RopeStyle::kNeox);
    if (!st.ok()) return st;
    Result<MoeHparams> moe = ReadMoeHparams(*file_, hparams_, /*default_norm_topk=*/true,
                                            /*with_shared=*/false);
    if (!moe.ok()) return moe.error();
    moe_ = *moe;
    WeightLoader L(*file_);
    LoadEmbeddingAndHead(L);
    layers_.resize(hparams_.n_layer);
    uint64_t expert_bytes = 0;
    for (int i = 0; i < hparams_.n_layer; ++i) {
      LoadAttentionWeights(L, hparams_, i, /*with_bias=*/false, /*with_qk_norm=*/true,
                           &layers_[i].attn);
      expert_bytes += LoadMoeWeights(L, hparams_, moe_, i, &layers_[i].moe);
    }
    // A decoded token reads k of the n_expert experts of each layer.
    const uint64_t unread = expert_bytes / moe_.n_expert * (moe_.n_expert - moe_.n_expert_used);
    return Finish(L, unread);
  }

  void Forward(const ForwardBatch& batch, AttentionContext& attention, ForwardScratch& s,
               ThreadPool& pool, float* logits) const override {
    PrepareScratch(hparams_, batch.n_tokens, s);
    EmbedTokens(token_embd_, batch, s.x.data());
    for (int i = 0; i < hparams_.n_layer; ++i) {
      AttentionBlock(hparams_, layers_[i].attn, i, batch, attention, s, pool);
      MoeBlock(hparams_, moe_, layers_[i].moe, batch, s, pool);
    }
    OutputHead(hparams_, output_norm_, output_, batch, s, pool, logits);
  }

 private:
  struct Layer {
    AttentionWeights attn;
    MoeWeights moe;
  };
  MoeHparams moe_;
  std::vector<Layer> layers_;
};

}  // namespace

Result<std::unique_ptr<Model>> LoadQwen3Moe(std::unique_ptr<gguf::File> file,
                                            std::unique_ptr<Tokenizer> tokenizer) {
  auto model = std::make_unique<Qwen3MoeModel>();
  Status st = model->Init(std::move(file), std::move(tokenizer));
  if (!st.ok()) return st.error();
  return std::unique_ptr<Model>(std::move(model));
}

}  // namespace lamina
