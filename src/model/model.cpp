// The Model base class: ForwardBatch::n_outputs and the hyper-parameters, embedding and output
// head every architecture loads alike.
#include "model/model.h"

#include "model/hparams.h"
#include "model/weight_loader.h"

namespace lamina {

int ForwardBatch::n_outputs() const {
  if (output == nullptr) return n_tokens > 0 ? 1 : 0;
  int n = 0;
  for (int t = 0; t < n_tokens; ++t) n += output[t] != 0;
  return n;
}

Status Model::InitHparams(std::unique_ptr<gguf::File> file, std::unique_ptr<Tokenizer> tokenizer,
                          RopeStyle rope_style, int q_rows_per_head_dim, int up_rows_per_ff) {
  file_ = std::move(file);
  tokenizer_ = std::move(tokenizer);
  Result<Hparams> hp =
      ReadLlamaLikeHparams(*file_, rope_style, q_rows_per_head_dim, up_rows_per_ff);
  if (!hp.ok()) return hp.error();
  hparams_ = *hp;
  const gguf::TensorInfo* embd = file_->FindTensor("token_embd.weight");
  if (embd == nullptr) return Error{file_->path() + ": missing tensor token_embd.weight"};
  // The vocabulary is the token array (its length is what the file holds); the embedding rows
  // and <arch>.vocab_size, when present, must agree with it.
  const int64_t n_tokens = tokenizer_->vocab_size();
  if (embd->ne[1] != n_tokens) {
    return Error{file_->path() + ": token_embd.weight has " + std::to_string(embd->ne[1]) +
                 " rows but tokenizer.ggml.tokens has " + std::to_string(n_tokens) + " tokens"};
  }
  const std::string vocab_key = ArchKey(hparams_.arch, "vocab_size");
  Result<int64_t> vocab_size = file_->GetIntOr(vocab_key, n_tokens);
  if (!vocab_size.ok()) return vocab_size.error();
  if (*vocab_size != n_tokens) {
    return HparamError(*file_, vocab_key, *vocab_size,
                       "tokenizer.ggml.tokens has " + std::to_string(n_tokens) + " tokens");
  }
  hparams_.n_vocab = static_cast<int>(n_tokens);
  return Status::Ok();
}

void Model::LoadEmbeddingAndHead(WeightLoader& L) {
  const uint64_t before = L.n_bytes();
  token_embd_ = L.Matrix("token_embd.weight", hparams_.n_embd, hparams_.n_vocab, /*required=*/true,
                         WeightUse::kRows);
  embd_bytes_ = L.n_bytes() - before;
  output_norm_ = L.Vector("output_norm.weight", hparams_.n_embd);
  output_ = L.Matrix("output.weight", hparams_.n_embd, hparams_.n_vocab, /*required=*/false);
  tied_ = !output_.valid();
  if (tied_) {
    // llama.cpp refuses (asserts on) a tied NVFP4 head with output.scale: the embedding's rows
    // are not scaled, so the scale could not apply to one use of the matrix only.
    L.RefuseScales("output.weight", "output.weight is absent (the head is tied to token_embd)");
    output_ = token_embd_;
  }
}

Status Model::Finish(const WeightLoader& L, uint64_t unread_bytes) {
  if (!L.status().ok()) return L.status();
  n_params_ = L.n_params();
  weight_bytes_per_token_ = L.n_bytes() - embd_bytes_ + (tied_ ? embd_bytes_ : 0) - unread_bytes;
  return Status::Ok();
}

}  // namespace lamina
