// Building blocks shared by the architectures: reading hyper-parameters and weights from GGUF
// with shape checks, and the pre-norm attention and SwiGLU feed-forward blocks.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "model/model.h"

namespace lamina {

// "<arch>.<suffix>": a GGUF metadata key of an architecture.
inline std::string ArchKey(const std::string& arch, const char* suffix) {
  return arch + "." + suffix;
}

// Grows a reusable scratch buffer to at least n elements (never shrinks it).
template <typename T>
void GrowTo(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
}

// Reads `<arch>.*` hyper-parameters common to llama-like architectures. Missing required keys
// are an error naming the key.
Result<Hparams> ReadLlamaLikeHparams(const gguf::File& file, RopeStyle rope_style);

// Reads `<arch>.rope.scaling.*` (and the older `rope.scale_linear`) as llama.cpp does.
Result<RopeScalingConfig> ReadRopeScaling(const gguf::File& file, const std::string& arch,
                                          int n_ctx_train);

// The kernel's RoPE parameters from the model's n_rot/base/style and scaling config, with
// command-line overrides applied as llama.cpp's context parameters do.
RopeParams ResolveRope(const RopeParams& base, const RopeScalingConfig& scaling,
                       const RopeOverrides& overrides);

// Resolves tensors by name with shape and type checks; remembers the first error.
class WeightLoader {
 public:
  explicit WeightLoader(const gguf::File& file) : file_(file) {}
  // A 2-D weight with ne = {cols, rows}; invalid (data == nullptr) when absent and !required.
  WeightMatrix Matrix(const std::string& name, int64_t cols, int64_t rows, bool required = true);
  // A 3-D tensor of n_mat stacked 2-D matrices (ne = {cols, rows, n_mat}), one WeightMatrix per
  // matrix pointing into the mapped data; empty when absent and !required.
  std::vector<WeightMatrix> Stacked(const std::string& name, int64_t cols, int64_t rows,
                                    int64_t n_mat, bool required = true);
  // A 1-D f32 vector of n elements, dequantized into an owned copy.
  std::vector<float> Vector(const std::string& name, int64_t n, bool required = true);
  const Status& status() const { return status_; }
  uint64_t n_params() const { return n_params_; }
  uint64_t n_bytes() const { return n_bytes_; }

 private:
  const gguf::TensorInfo* Find(const std::string& name, bool required);
  void Fail(const std::string& message);
  const gguf::File& file_;
  Status status_;
  uint64_t n_params_ = 0;
  uint64_t n_bytes_ = 0;
};

struct AttentionWeights {
  std::vector<float> norm;            // [n_embd]
  WeightMatrix wq, wk, wv, wo;        // [q_dim x n_embd], [kv_dim x n_embd] x2, [n_embd x q_dim]
  std::vector<float> bq, bk, bv;      // optional biases (empty when absent)
  std::vector<float> q_norm, k_norm;  // optional per-head RMSNorm weights [head_dim]
};

struct FfnWeights {
  std::vector<float> norm;      // [n_embd]
  WeightMatrix gate, up, down;  // [n_ff x n_embd] x2, [n_embd x n_ff]
};

void LoadAttentionWeights(WeightLoader& loader, const Hparams& hp, int layer, bool with_bias,
                          bool with_qk_norm, AttentionWeights* out);
void LoadFfnWeights(WeightLoader& loader, const Hparams& hp, int layer, FfnWeights* out);

// Grows the scratch buffers for n_tokens.
void PrepareScratch(const Hparams& hp, int n_tokens, ForwardScratch& s);

// Token embedding lookup: x[t] = row tokens[t] of the embedding table (dequantized).
void EmbedTokens(const WeightMatrix& embd, const ForwardBatch& batch, float* x);

// x += Wo · attention(RoPE(Wq·norm(x)), RoPE(Wk·norm(x)), Wv·norm(x)) for the whole batch.
void AttentionBlock(const Hparams& hp, const AttentionWeights& w, int layer,
                    const ForwardBatch& batch, AttentionContext& attention, ForwardScratch& s,
                    ThreadPool& pool);

// x += down(silu(gate·norm(x)) * up·norm(x)).
void FfnBlock(const Hparams& hp, const FfnWeights& w, const ForwardBatch& batch, ForwardScratch& s,
              ThreadPool& pool);

// Final norm and output head into logits ([batch.n_outputs(), n_vocab], in batch order).
void OutputHead(const Hparams& hp, const std::vector<float>& norm, const WeightMatrix& output,
                const ForwardBatch& batch, ForwardScratch& s, ThreadPool& pool, float* logits);

// What every decoder-only architecture loads the same way: hyper-parameters, the embedding,
// the final norm and the output head (tied to the embedding when output.weight is absent).
// An architecture derives from it and adds its layers between LoadEmbeddingAndHead and Finish.
class DecoderModel : public Model {
 protected:
  // Takes ownership, reads the llama-like hyper-parameters and checks the vocabulary size.
  Status InitHparams(std::unique_ptr<gguf::File> file, std::unique_ptr<Tokenizer> tokenizer,
                     RopeStyle rope_style);
  // Loads token_embd, output_norm and output, remembering the embedding's bytes.
  void LoadEmbeddingAndHead(WeightLoader& loader);
  // Records the parameter count and the bytes a decoded token reads: everything but the
  // embedding table (unless tied) minus `unread_bytes` (e.g. experts a token does not select).
  Status Finish(const WeightLoader& loader, uint64_t unread_bytes);

  WeightMatrix token_embd_;
  WeightMatrix output_;
  std::vector<float> output_norm_;

 private:
  uint64_t embd_bytes_ = 0;
  bool tied_ = false;
};

}  // namespace lamina
