// A loaded model: hyper-parameters and weights read from GGUF metadata, a tokenizer, and a
// forward pass. Each architecture lives in its own file (llama.cpp, ...) over the shared
// building blocks in layers.h. The model knows nothing of how K/V are stored: the runtime
// passes an AttentionContext that owns the cache.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "kernels/matmul.h"
#include "kernels/ops.h"
#include "tokenizer/tokenizer.h"
#include "util/status.h"
#include "util/thread_pool.h"

namespace lamina {

enum class RopeScalingType { kNone, kLinear, kYarn };

// RoPE scaling as the GGUF metadata records it (`<arch>.rope.scaling.*`), before any
// command-line override; ResolveRope (layers.h) turns it into the kernel's RopeParams.
struct RopeScalingConfig {
  RopeScalingType type = RopeScalingType::kLinear;  // llama.cpp's default when the key is absent
  float factor = 1.0f;       // context extension factor s (freq_scale = 1 / s)
  int n_ctx_orig = 0;        // YaRN: original training context
  float attn_factor = 1.0f;  // rope.scaling.attn_factor, multiplies YaRN's 0.1 ln(s) + 1
  float ext_factor = -1.0f;  // rope.scaling.yarn_ext_factor (< 0: 1 for yarn, 0 otherwise)
  float beta_fast = 32.0f;   // rotations above which dimensions are extrapolated
  float beta_slow = 1.0f;    // rotations below which dimensions are interpolated
};

// Command-line overrides of the model's RoPE scaling (--rope-scaling, --rope-scale,
// --yarn-orig-ctx); unset fields keep the model's values.
struct RopeOverrides {
  std::optional<RopeScalingType> type;
  float scale = 0.0f;     // context extension factor; 0: the model's
  int yarn_orig_ctx = 0;  // 0: the model's
  bool empty() const { return !type && scale == 0.0f && yarn_orig_ctx == 0; }
};

struct Hparams {
  std::string arch;
  int n_vocab = 0;
  int n_embd = 0;
  int n_layer = 0;
  int n_head = 0;
  int n_head_kv = 0;
  int head_dim = 0;   // key/value row length per head
  int n_ff = 0;
  int n_ctx_train = 0;
  float rms_eps = 1e-5f;
  RopeParams rope;
  RopeScalingConfig rope_scaling;
  int q_dim() const { return n_head * head_dim; }
  int kv_dim() const { return n_head_kv * head_dim; }
};

// Implemented by the runtime (KV cache + attention). For the current batch, Attend stores the
// batch's K and V rows through the cache's single writer (each token in its own sequence, at
// its own position), then computes causal attention of every query over the cells of its
// sequence up to its position. The runtime knows the batch's sequences; the model does not.
class AttentionContext {
 public:
  virtual ~AttentionContext() = default;
  // q: [n_tokens, n_head * head_dim] after RoPE; k, v: [n_tokens, n_head_kv * head_dim] (k
  // after RoPE); out: [n_tokens, n_head * head_dim].
  virtual void Attend(int layer, const float* q, const float* k, const float* v,
                      float* out) = 0;
};

// A batch of tokens from one or more sequences, the shape of llama.cpp's llama_batch: every
// token carries its position (for RoPE) and its sequence (for attention, which the runtime
// handles). Weight matmuls run over all tokens at once; a token's result never depends on the
// other tokens of the batch (batch invariance), only on its own sequence's earlier cells.
struct ForwardBatch {
  const int32_t* tokens = nullptr;  // [n_tokens]
  const int32_t* pos = nullptr;     // [n_tokens] position of each token in its sequence
  const int32_t* seq = nullptr;     // [n_tokens] sequence of each token (nullptr: all 0)
  // [n_tokens] nonzero where logits are wanted; nullptr: only the last token's. Logits rows
  // come out in batch order, one per flagged token.
  const uint8_t* output = nullptr;
  int n_tokens = 0;
  int n_outputs() const;
  bool wants_output(int t) const { return output != nullptr ? output[t] != 0 : t == n_tokens - 1; }
};

// Per-session scratch buffers, grown on demand (explicit and owned by the session).
struct ForwardScratch {
  std::vector<float> x;       // [n_tokens, n_embd] residual stream
  std::vector<float> xn;      // [n_tokens, n_embd] normed
  std::vector<float> q;       // [n_tokens, q_dim]
  std::vector<float> k;       // [n_tokens, kv_dim]
  std::vector<float> v;       // [n_tokens, kv_dim]
  std::vector<float> attn;    // [n_tokens, q_dim]
  std::vector<float> gate;    // [n_tokens, n_ff]
  std::vector<float> up;      // [n_tokens, n_ff]
  std::vector<float> rope;    // [n_tokens, n_rot]
  MatMulScratch matmul;
  // Mixture-of-experts feed-forward (moe.h); empty for dense models.
  struct Moe {
    std::vector<float> probs;     // [n_tokens, n_expert] router logits, then probabilities
    std::vector<int32_t> ids;     // [n_tokens, n_expert_used] chosen experts, best first
    std::vector<float> weights;   // [n_tokens, n_expert_used] their mixing weights
    std::vector<int32_t> order;   // [n_tokens * n_expert_used] (token, slot) grouped by expert
    std::vector<float> in;        // [n_sel, n_embd] inputs gathered for one expert
    std::vector<float> gate;      // [n_tokens, max(n_ff_exp, n_ff_shexp)]
    std::vector<float> up;        // [n_tokens, max(n_ff_exp, n_ff_shexp)]
    std::vector<float> out;       // [n_tokens, n_embd] one expert's (or the shared) output
    std::vector<float> slots;     // [n_tokens, n_expert_used, n_embd] output per (token, slot)
    std::vector<float> shared_g;  // [n_tokens] shared-expert gate logits
  } moe;
};

class Model {
 public:
  virtual ~Model() = default;
  const Hparams& hparams() const { return hparams_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  const gguf::File& file() const { return *file_; }
  // Bytes of weights read per decoded token (all tensors except the embedding table).
  uint64_t WeightBytesPerToken() const { return weight_bytes_per_token_; }
  uint64_t ParameterCount() const { return n_params_; }

  // Runs the batch; writes logits [batch.n_outputs(), n_vocab] to `logits`.
  virtual void Forward(const ForwardBatch& batch, AttentionContext& attention,
                       ForwardScratch& scratch, ThreadPool& pool, float* logits) const = 0;

 protected:
  // Applies RopeOverrides after the architecture has read its hyper-parameters.
  friend Result<std::unique_ptr<Model>> LoadModel(const std::string& path,
                                                  const RopeOverrides& overrides);

  Hparams hparams_;
  std::unique_ptr<gguf::File> file_;
  std::unique_ptr<Tokenizer> tokenizer_;
  uint64_t weight_bytes_per_token_ = 0;
  uint64_t n_params_ = 0;
};

// Opens a GGUF file and builds the model for its general.architecture.
Result<std::unique_ptr<Model>> LoadModel(const std::string& path);
// Same, with the RoPE scaling of the metadata overridden.
Result<std::unique_ptr<Model>> LoadModel(const std::string& path, const RopeOverrides& overrides);

}  // namespace lamina
