// The shared decoder-only transformer (see decoder.h).
#include "model/decoder.h"

#include "model/blocks.h"
#include "model/moe.h"
#include "model/weight_loader.h"

namespace lamina {

namespace {

class Decoder final : public Model {
 public:
  Status Init(std::unique_ptr<gguf::File> file, std::unique_ptr<Tokenizer> tokenizer,
              const DecoderOptions& options) {
    options_ = options;
    Status st = InitHparams(std::move(file), std::move(tokenizer), options.rope_style);
    if (!st.ok()) return st;
    if (options.moe) {
      Result<MoeHparams> moe =
          ReadMoeHparams(*file_, hparams_, options.moe_norm_topk, options.moe_shared_expert);
      if (!moe.ok()) return moe.error();
      moe_ = *moe;
    }
    WeightLoader L(*file_, &interleaved_);
    LoadEmbeddingAndHead(L);
    layers_.resize(hparams_.n_layer);
    uint64_t expert_bytes = 0;
    for (int i = 0; i < hparams_.n_layer; ++i) {
      LoadAttentionWeights(L, hparams_, i, options.attn_bias, options.qk_norm, &layers_[i].attn);
      if (options.moe) {
        expert_bytes += LoadMoeWeights(L, hparams_, moe_, i, &layers_[i].moe);
      } else {
        LoadFfnWeights(L, hparams_, i, &layers_[i].ffn);
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
  DecoderOptions options_;
  MoeHparams moe_;
  std::vector<Layer> layers_;
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
