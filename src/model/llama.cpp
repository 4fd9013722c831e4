// The llama architecture: token embedding, pre-norm GQA attention with "normal" (adjacent
// pair) RoPE, SwiGLU FFN, RMSNorm, output head tied to the embedding when output.weight is absent.
#include "model/llama.h"

#include "model/layers.h"

namespace lamina {

namespace {

class LlamaModel final : public Model {
 public:
  Status Init(std::unique_ptr<gguf::File> file, std::unique_ptr<Tokenizer> tokenizer) {
    file_ = std::move(file);
    tokenizer_ = std::move(tokenizer);
    Result<Hparams> hp = ReadLlamaLikeHparams(*file_, RopeStyle::kNormal);
    if (!hp.ok()) return hp.error();
    hparams_ = *hp;
    const gguf::TensorInfo* embd = file_->FindTensor("token_embd.weight");
    if (embd == nullptr) return Error{file_->path() + ": missing tensor token_embd.weight"};
    hparams_.n_vocab = static_cast<int>(embd->ne[1]);
    if (hparams_.n_vocab != tokenizer_->vocab_size()) {
      return Error{file_->path() + ": token_embd.weight has " + std::to_string(hparams_.n_vocab) +
                   " rows but the tokenizer has " + std::to_string(tokenizer_->vocab_size()) + " tokens"};
    }
    WeightLoader L(*file_);
    token_embd_ = L.Matrix("token_embd.weight", hparams_.n_embd, hparams_.n_vocab);
    const uint64_t embd_bytes = L.n_bytes();
    output_norm_ = L.Vector("output_norm.weight", hparams_.n_embd);
    output_ = L.Matrix("output.weight", hparams_.n_embd, hparams_.n_vocab, /*required=*/false);
    const bool tied = !output_.valid();
    if (tied) output_ = token_embd_;
    layers_.resize(hparams_.n_layer);
    for (int i = 0; i < hparams_.n_layer; ++i) {
      LoadAttentionWeights(L, hparams_, i, /*with_bias=*/true, /*with_qk_norm=*/false, &layers_[i].attn);
      LoadFfnWeights(L, hparams_, i, &layers_[i].ffn);
    }
    if (!L.status().ok()) return L.status();
    n_params_ = L.n_params();
    weight_bytes_per_token_ = L.n_bytes() - embd_bytes + (tied ? embd_bytes : 0);
    return Status::Ok();
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
  WeightMatrix token_embd_;
  WeightMatrix output_;
  std::vector<float> output_norm_;
  std::vector<Layer> layers_;
};

}  // namespace

Result<std::unique_ptr<Model>> LoadLlama(std::unique_ptr<gguf::File> file,
                                         std::unique_ptr<Tokenizer> tokenizer) {
  auto model = std::make_unique<LlamaModel>();
  Status st = model->Init(std::move(file), std::move(tokenizer));
  if (!st.ok()) return st.error();
  return std::unique_ptr<Model>(std::move(model));
}

}  // namespace lamina
