// The gemma3 decoder as llama.cpp runs it: embeddings scaled by sqrt(n_embd); per layer
// attention with per-head Q/K RMSNorm and NeoX RoPE (sliding-window layers with their own base
// and window, global ones with the model's RoPE and scaling), its output RMS-normed
// (post_attention_norm) before the residual add, a GELU(tanh)-gated FFN likewise normed
// (post_ffw_norm); final norm, output head (tied to the embedding when output.weight is absent)
// and an optional final logit soft-cap. The file's norm weights already hold Gemma's 1 + w.
#include <cmath>

#include "model/architectures.h"
#include "model/blocks.h"
#include "model/hparams.h"
#include "model/weight_loader.h"

namespace lamina {

namespace {

class Gemma3 final : public Model {
 public:
  Status Init(std::unique_ptr<gguf::File> file, std::unique_ptr<Tokenizer> tokenizer, bool repack) {
    repack_ = repack;
    Status st = InitHparams(std::move(file), std::move(tokenizer), RopeStyle::kNeox);
    if (!st.ok()) return st;
    st = ReadGemma3Hparams();
    if (!st.ok()) return st;
    WeightLoader L(*file_);
    LoadEmbeddingAndHead(L);
    layers_.resize(hparams_.n_layer);
    for (int i = 0; i < hparams_.n_layer; ++i) {
      const std::string p = "blk." + std::to_string(i) + ".";
      Layer& l = layers_[i];
      LoadAttentionWeights(L, hparams_, i, /*with_bias=*/false, /*with_qk_norm=*/true, &l.attn);
      l.post_attn_norm = L.Vector(p + "post_attention_norm.weight", hparams_.n_embd);
      LoadFfnWeights(L, hparams_, i, &l.ffn);
      l.post_ffn_norm = L.Vector(p + "post_ffw_norm.weight", hparams_.n_embd);
      if (!L.status().ok()) return L.status();
    }
    return Finish(L, 0);
  }

  void Forward(const ForwardBatch& batch, AttentionContext& attention, RecurrentContext&,
               ForwardScratch& s, ThreadPool& pool, float* logits) const override {
    const Hparams& hp = hparams_;
    const int n = batch.n_tokens;
    const int64_t d = hp.n_embd;
    PrepareScratch(hp, n, s);
    EmbedTokens(token_embd_, batch, s.x.data());
    const float embd_scale = std::sqrt(static_cast<float>(hp.n_embd));
    for (int64_t i = 0; i < n * d; ++i) s.x[i] *= embd_scale;
    for (int i = 0; i < hp.n_layer; ++i) {
      const Layer& l = layers_[i];
      AttentionOutput(hp, l.attn, i, batch, attention, s, pool);
      AddNormed(l.post_attn_norm, n, s);
      FfnOutput(hp, l.ffn, FfnActivation::kGeluTanh, batch, s, pool);
      AddNormed(l.post_ffn_norm, n, s);
    }
    OutputHead(hp, output_norm_, output_, batch, s, pool, logits);
    if (hp.final_logit_softcap > 0.0f) {
      const float cap = hp.final_logit_softcap, inv = 1.0f / cap;
      const int64_t count = static_cast<int64_t>(batch.n_outputs()) * hp.n_vocab;
      for (int64_t i = 0; i < count; ++i) logits[i] = std::tanh(logits[i] * inv) * cap;
    }
  }

 private:
  struct Layer {
    AttentionWeights attn;
    std::vector<float> post_attn_norm;  // [n_embd]
    FfnWeights ffn;
    std::vector<float> post_ffn_norm;  // [n_embd]
  };

  // The sliding window, the attention scale and the logit soft-cap.
  Status ReadGemma3Hparams() {
    Hparams& hp = hparams_;
    Status st = ReadSlidingWindow(*file_, &hp);
    if (!st.ok()) return st;
    // As llama.cpp (after gemma_pytorch): query_pre_attn_scalar is n_embd / n_head for the
    // 62-layer 27B model and head_dim otherwise; the file does not record it.
    const int scalar = hp.n_layer == 62 ? hp.n_embd / hp.n_head : hp.head_dim;
    hp.attn_scale = 1.0f / std::sqrt(static_cast<float>(scalar));
    const std::string cap_key = ArchKey(hp.arch, "final_logit_softcapping");
    Result<double> cap = file_->GetFloatOr(cap_key, 0.0);
    if (!cap.ok()) return cap.error();
    if (!(*cap >= 0.0) || !std::isfinite(*cap)) {
      return Error{file_->path() + ": metadata key \"" + cap_key + "\" = " + std::to_string(*cap) +
                   " is not a soft-cap (>= 0; 0: none)"};
    }
    hp.final_logit_softcap = static_cast<float>(*cap);
    return Status::Ok();
  }

  // x += RMSNorm(xn) * w, row by row (xn: a block's output, [n, n_embd]).
  void AddNormed(const std::vector<float>& w, int n, ForwardScratch& s) const {
    const int64_t d = hparams_.n_embd;
    for (int t = 0; t < n; ++t) {
      float* y = s.xn.data() + t * d;
      RmsNorm(y, w.data(), d, hparams_.rms_eps, y);
    }
    AddInPlace(s.x.data(), s.xn.data(), static_cast<int64_t>(n) * d);
  }

  std::vector<Layer> layers_;
};

}  // namespace

Result<std::unique_ptr<Model>> LoadGemma3(std::unique_ptr<gguf::File> file,
                                          std::unique_ptr<Tokenizer> tokenizer, bool repack) {
  auto model = std::make_unique<Gemma3>();
  Status st = model->Init(std::move(file), std::move(tokenizer), repack);
  if (!st.ok()) return st.error();
  return std::unique_ptr<Model>(std::move(model));
}

}  // namespace lamina
