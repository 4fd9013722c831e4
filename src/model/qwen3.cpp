// The qwen3 architecture: NeoX RoPE attention without biases but with a per-head RMSNorm of Q and
// K before RoPE; head_dim comes from attention.key_length and may differ from n_embd / n_head.
// The output head is tied to the embedding when output.weight is absent.
#include "model/architectures.h"
#include "model/layers.h"

namespace lamina {

namespace {

class Qwen3Model final : public DecoderModel {
 public:
  Status Init(std::unique_ptr<gguf::File> file, std::unique_ptr<Tokenizer> tokenizer) {
    Status st = InitHparams(std::move(file), std::move(tokenizer), RopeStyle::kNeox);
    if (!st.ok()) return st;
    WeightLoader L(*file_);
    LoadEmbeddingAndHead(L);
    layers_.resize(hparams_.n_layer);
    for (int i = 0; i < hparams_.n_layer; ++i) {
      LoadAttentionWeights(L, hparams_, i, /*with_bias=*/false, /*with_qk_norm=*/true,
                           &layers_[i].attn);
      LoadFfnWeights(L, hparams_, i, &layers_[i].ffn);
    }
    return Finish(L, /*unread_bytes=*/0);
  }

  void Forward(const ForwardBatch& batch, AttentionContext& attention, ForwardScratch& s,
               ThreadPool& pool, float* logits) const override {
    PrepareScratch(hparams_, batch.n_tokens, s);
    EmbedTokens(token_embd_, batch, s.x.data());
    for (int i = 0; i < hparams_.n_layer; ++i) {
      AttentionBlock(hparams_, layers_[i].attn, i, batch, attention, s, pool);
      FfnBlock(hparams_, layers_[i].ffn, batch, s, pool);
    }
    OutputHead(hparams_, output_norm_, output_, batch, s, pool, logits);
  }

 private:
  struct Layer {
    AttentionWeights attn;
    FfnWeights ffn;
  };
  std::vector<Layer> layers_;
};

}  // namespace

Result<std::unique_ptr<Model>> LoadQwen3(std::unique_ptr<gguf::File> file,
                                         std::unique_ptr<Tokenizer> tokenizer) {
  auto model = std::make_unique<Qwen3Model>();
  Status st = model->Init(std::move(file), std::move(tokenizer));
  if (!st.ok()) return st.error();
  return std::unique_ptr<Model>(std::move(model));
}

}  // namespace lamina
