// A loaded model: hyper-parameters and weights read from GGUF metadata, a tokenizer, and a
// forward pass. Each architecture is a row of the table in architectures.h over the shared
// building blocks in blocks.h. The model knows nothing of how K/V or recurrent state are
// stored: the runtime passes an AttentionContext that owns the KV cache and a RecurrentContext
// that owns the Gated DeltaNet state of hybrid models.
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "kernels/matmul.h"
#include "kernels/ops.h"
#include "tokenizer/tokenizer.h"
#include "util/huge_pages.h"
#include "util/status.h"
#include "util/thread_pool.h"

namespace lamina {

class WeightLoader;  // weight_loader.h

// A 64-byte-aligned weight buffer the model owns (weights repacked at load); its interior 2 MiB
// extents are advised as transparent huge pages before the repacked bytes are written, so the
// matmuls stream them with one TLB entry per 2 MiB (huge_pages.h).
struct AlignedDelete {
  void operator()(uint8_t* p) const { ::operator delete[](p, std::align_val_t(64)); }
};
using WeightBuffer = std::unique_ptr<uint8_t[], AlignedDelete>;
inline WeightBuffer NewWeightBuffer(size_t n) {
  WeightBuffer buf(static_cast<uint8_t*>(::operator new[](n, std::align_val_t(64))));
  AdviseHugePages(buf.get(), n);
  return buf;
}

enum class RopeScalingType { kNone, kLinear, kYarn };

// RoPE scaling as the GGUF metadata records it (`<arch>.rope.scaling.*`), before any
// command-line override; ResolveRope (hparams.h) turns it into the kernel's RopeParams.
struct RopeScalingConfig {
  RopeScalingType type = RopeScalingType::kLinear;  // llama.cpp's default when the key is absent
  float factor = 1.0f;       // context extension factor s (freq_scale = 1 / s)
  int n_ctx_orig = 0;        // YaRN: original training context
  float attn_factor = 1.0f;  // rope.scaling.attn_factor, multiplies YaRN's 0.1 ln(s) + 1
  float ext_factor = -1.0f;  // rope.scaling.yarn_ext_factor (< 0: 1 for yarn, 0 otherwise)
  float beta_fast = 32.0f;   // rotations above which dimensions are extrapolated
  float beta_slow = 1.0f;    // rotations below which dimensions are interpolated
  // rope.scaling.yarn_log_multiplier (mistral3; 0: none): with YaRN, the attention factor
  // becomes mscale(s, 1) / mscale(s, this) / (1 + 0.1 ln s) times attn_factor, as llama.cpp's
  // context sets it (mscale(s, m) = 1 + 0.1 m ln s for s > 1, else 1).
  float yarn_log_mul = 0.0f;
};

// Command-line overrides of the model's RoPE scaling (--rope-scaling, --rope-scale,
// --yarn-orig-ctx); unset fields keep the model's values.
struct RopeOverrides {
  std::optional<RopeScalingType> type;
  float scale = 0.0f;     // context extension factor; 0: the model's
  int yarn_orig_ctx = 0;  // 0: the model's
  bool empty() const { return !type && scale == 0.0f && yarn_orig_ctx == 0; }
};

// The recurrent (Gated DeltaNet) layers of a hybrid model such as qwen3next; n_layer 0 for a
// pure transformer. Per sequence and recurrent layer the runtime keeps a conv tail
// [conv_kernel - 1, conv_channels()] and a delta state [n_v_heads, head_k, head_v].
struct RecurrentShape {
  int n_layer = 0;       // recurrent layers
  int conv_kernel = 0;   // taps of the causal depthwise convolution
  int n_k_heads = 0;     // query/key heads
  int n_v_heads = 0;     // value heads (a multiple of n_k_heads, r = n_v_heads / n_k_heads)
  int head_k = 0;        // query/key head dimension
  int head_v = 0;        // value head dimension
  float l2_eps = 1e-6f;  // epsilon of the L2 normalisation of q and k
  // Which K head a V head reads: false, grouped (qwen3next: V head j reads K head j / r); true,
  // tiled (qwen35, whose converter reorders the V heads: V head j reads K head j % n_k_heads).
  bool v_tiled = false;
  int conv_channels() const { return 2 * n_k_heads * head_k + n_v_heads * head_v; }
  int64_t conv_floats() const { return static_cast<int64_t>(conv_kernel - 1) * conv_channels(); }
  int64_t state_floats() const { return static_cast<int64_t>(n_v_heads) * head_v * head_k; }
};

struct Hparams {
  std::string arch;
  int n_vocab = 0;
  int n_embd = 0;
  int n_layer = 0;
  int n_head = 0;
  int n_head_kv = 0;
  int head_dim = 0;  // key/value row length per head
  int n_ff = 0;
  int n_ctx_train = 0;
  float rms_eps = 1e-5f;
  RopeParams rope;
  RopeScalingConfig rope_scaling;
  // Layers with a KV cache: n_layer for a pure transformer; a hybrid model's attention layers
  // are numbered 0..n_layer_kv-1 in the cache.
  int n_layer_kv = 0;
  RecurrentShape recurrent;
  // Q·K scale of attention; 0: 1 / sqrt(head_dim).
  float attn_scale = 0.0f;
  // Sliding-window attention (gemma3): the layers flagged in swa_layers ([kv_layers()], empty:
  // none) see the n_swa most recent positions only (a query at p sees keys p - n_swa + 1 .. p)
  // and rotate with rope_swa instead of rope. The cache keeps a ring of their recent cells
  // (KvCacheConfig::sliding_window), or every cell with --swa-full.
  int n_swa = 0;
  std::vector<uint8_t> swa_layers;
  RopeParams rope_swa;
  // gpt-oss: rope_swa is the global RoPE (its scaling included) with its own base; false
  // (gemma3): SlidingWindowRope's, which never scales.
  bool swa_global_rope = false;
  // Final logits become c * tanh(logits / c) (0: not capped).
  float final_logit_softcap = 0.0f;
  // Attention temperature tuning (mistral3's attention.temperature_scale, llama 4's rule; 0:
  // off): after RoPE a query at position p is multiplied by
  // 1 + attn_temp_scale * ln(floor(p / attn_temp_floor) + 1), attn_temp_floor being the file's
  // original context (rope.scaling.original_context_length, else context_length).
  float attn_temp_scale = 0.0f;
  int attn_temp_floor = 0;
  // phi3 LongRoPE: `rope` carries the short factors, which serve contexts of up to this many
  // tokens per sequence (rope.scaling.original_context_length); a session with a longer context
  // rotates with rope_long (the long factors) instead, as llama.cpp does (ForwardBatch::long_rope,
  // chosen by the session). 0: one RoPE for any context.
  int rope_short_ctx = 0;
  RopeParams rope_long;
  // Whether a context of n_ctx tokens per sequence rotates with rope_long.
  bool uses_long_rope(int n_ctx) const { return rope_short_ctx > 0 && n_ctx > rope_short_ctx; }
  // The query multiplier at position `pos` (1 when tuning is off).
  float attention_temperature(int32_t pos) const {
    if (attn_temp_scale == 0.0f) return 1.0f;
    const double steps = std::floor(static_cast<float>(pos) / static_cast<float>(attn_temp_floor));
    return static_cast<float>(std::log(steps + 1.0) * attn_temp_scale + 1.0);
  }
  int kv_layers() const { return n_layer_kv > 0 ? n_layer_kv : n_layer; }
  bool is_swa(int layer) const { return !swa_layers.empty() && swa_layers[layer] != 0; }
  // The sliding window of a cache layer (0: full causal attention).
  int sliding_window(int layer) const { return is_swa(layer) ? n_swa : 0; }
  const RopeParams& layer_rope(int layer, bool long_rope = false) const {
    return is_swa(layer) ? rope_swa : long_rope && rope_short_ctx > 0 ? rope_long : rope;
  }
  float attention_scale() const {
    return attn_scale > 0.0f ? attn_scale : 1.0f / std::sqrt(static_cast<float>(head_dim));
  }
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
  virtual void Attend(int layer, const float* q, const float* k, const float* v, float* out) = 0;
};

// Implemented by the runtime (recurrent state store). For the current batch and recurrent layer
// `layer` (0..recurrent.n_layer-1), Scan runs, per run of one sequence's tokens and continuing
// that sequence's state: the causal convolution (conv_w [conv_channels, conv_kernel]) with
// SiLU over qkv, L2 normalisation of q and k, and the gated delta rule, writing the state
// through the store's single writer. qkv: [n_tokens, conv_channels] = [q | k | v] before the
// convolution; decay, beta: [n_tokens, n_v_heads] (decay = exp(g)); out: [n_tokens, n_v_heads *
// head_v].
class RecurrentContext {
 public:
  virtual ~RecurrentContext() = default;
  virtual void Scan(int layer, const float* conv_w, const float* qkv, const float* decay,
                    const float* beta, float* out) = 0;
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
  // A multi-token-prediction block's second input (Model::mtp()): the trunk's normed final
  // hidden state h_p paired with each token x_{p+1} ([n_tokens, n_embd]); unused by trunks.
  const float* embd = nullptr;
  // When set, receives every token's normed final hidden state (a trunk's output_norm, an MTP
  // block's head norm) ([n_tokens, n_embd]), what an MTP block pairs with the next token.
  float* hidden = nullptr;
  // The session's context rotates with Hparams::rope_long (phi3 past its original context).
  bool long_rope = false;
  int n_outputs() const;
  bool wants_output(int t) const { return output != nullptr ? output[t] != 0 : t == n_tokens - 1; }
};

// Per-session scratch buffers, grown on demand (explicit and owned by the session).
struct ForwardScratch {
  std::vector<float> x;     // [n_tokens, n_embd] residual stream
  std::vector<float> xn;    // [n_tokens, n_embd] normed
  std::vector<float> q;     // [n_tokens, q_dim]
  std::vector<float> k;     // [n_tokens, kv_dim]
  std::vector<float> v;     // [n_tokens, kv_dim]
  std::vector<float> attn;  // [n_tokens, q_dim]
  std::vector<float> gate;  // [n_tokens, n_ff]
  std::vector<float> up;    // [n_tokens, n_ff]
  std::vector<float> rope;  // [n_tokens, n_rot]
  // The dense blocks' RoPE tables (RopeCache per token), kept across a step's layers: a layer
  // whose RoPE parameters and positions match the last table's reuses it (the same function of
  // the same inputs, so the same bits); any other layer recomputes it.
  struct RopeTables {
    std::vector<float> cos_sin;  // [n_tokens, n_rot]
    std::vector<int32_t> pos;    // [n_tokens] the positions the table holds
    RopeParams params;           // the parameters it was computed with
    bool valid = false;
  } rope_tables;
  // A fused matmul's output before its split (phi3): [n_tokens, q_dim + 2 kv_dim] (attn_qkv)
  // or [n_tokens, 2 n_ff] (ffn_up holding gate and up); empty for other models.
  std::vector<float> fused;
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
  // Gated DeltaNet and gated attention (hybrid models); empty otherwise.
  struct Hybrid {
    std::vector<float> qkv;    // [n_tokens, conv_channels] (fused ssm_in: [n_tokens, qkvz])
    std::vector<float> z;      // [n_tokens, n_v_heads * head_v] output gate
    std::vector<float> ba;     // [n_tokens, 2 * n_v_heads] beta and alpha logits
    std::vector<float> decay;  // [n_tokens, n_v_heads]
    std::vector<float> beta;   // [n_tokens, n_v_heads]
    std::vector<float> out;    // [n_tokens, n_v_heads * head_v]
    std::vector<float> qg;     // [n_tokens, 2 * q_dim] attention query and gate, per head
    std::vector<float> cat;    // [n_tokens, 2 * n_embd] MTP [enorm(embedding) | hnorm(h)]
  } hybrid;
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
  // `recurrent` serves the Gated DeltaNet layers of hybrid models (unused by the others).
  virtual void Forward(const ForwardBatch& batch, AttentionContext& attention,
                       RecurrentContext& recurrent, ForwardScratch& scratch, ThreadPool& pool,
                       float* logits) const = 0;

  // The attention sinks of cache layer `layer` (gpt-oss): per query head a logit that joins
  // the softmax's denominator, [n_head]; nullptr for none (every other architecture).
  virtual const float* AttentionSinks(int /*layer*/) const { return nullptr; }

  // The model's multi-token-prediction block (a GGUF's `nextn_predict_layers`), as a one-layer
  // model of its own that a Session can run: its Forward reads ForwardBatch::embd (the trunk's
  // hidden state h_{p-1} for each token x_p at position p, zeros at p = 0) and gives the logits
  // of x_{p+1}; its one attention layer is its KV cache's layer 0. nullptr: none.
  virtual const Model* mtp() const { return nullptr; }

  // Reads a multi-token-prediction head from a companion file (LoadMtpHead): a dense decoder's
  // `blk.<n_layer>` nextn block; the error names the key or tensor that does not fit.
  virtual Status AttachMtp(std::unique_ptr<gguf::File> file) {
    return Error{file->path() + ": " + hparams_.arch + " models take no MTP head file"};
  }

 protected:
  // Applies RopeOverrides after the architecture has read its hyper-parameters.
  friend Result<std::unique_ptr<Model>> LoadModel(const std::string& path,
                                                  const RopeOverrides& overrides);

  // What every architecture loads the same way (model.cpp): hyper-parameters, the embedding,
  // the final norm and the output head (tied to the embedding when output.weight is absent).
  // An architecture derives from Model and adds its layers between LoadEmbeddingAndHead and
  // Finish.

  // Takes ownership, reads the llama-like hyper-parameters (each count checked against the
  // tensors present: ReadLlamaLikeHparams, whose q_rows_per_head_dim and up_rows_per_ff this
  // passes on) and checks
  // the vocabulary size.
  Status InitHparams(std::unique_ptr<gguf::File> file, std::unique_ptr<Tokenizer> tokenizer,
                     RopeStyle rope_style, int q_rows_per_head_dim = 1, int up_rows_per_ff = 1);
  // Loads token_embd, output_norm and output, remembering the embedding's bytes.
  void LoadEmbeddingAndHead(WeightLoader& loader);
  // Records the parameter count and the bytes a decoded token reads: everything but the
  // embedding table (unless tied) minus `unread_bytes` (e.g. experts a token does not select).
  Status Finish(const WeightLoader& loader, uint64_t unread_bytes);

  // Where a WeightLoader repacks matrices: interleaved_, or nowhere when the load only checks
  // (CheckModelFile; repack_ is set before the weights are read).
  std::vector<WeightBuffer>* RepackTarget() { return repack_ ? &interleaved_ : nullptr; }

  Hparams hparams_;
  bool repack_ = true;
  std::unique_ptr<gguf::File> file_;
  std::unique_ptr<Tokenizer> tokenizer_;
  uint64_t weight_bytes_per_token_ = 0;
  uint64_t n_params_ = 0;
  // Weights repacked at load (WeightLoader's interleaved layouts); matrices point into them.
  std::vector<WeightBuffer> interleaved_;
  WeightMatrix token_embd_;
  WeightMatrix output_;
  std::vector<float> output_norm_;

 private:
  uint64_t embd_bytes_ = 0;
  bool tied_ = false;
};

// Opens a GGUF file and builds the model for its general.architecture.
Result<std::unique_ptr<Model>> LoadModel(const std::string& path);
// Same, with the RoPE scaling of the metadata overridden.
Result<std::unique_ptr<Model>> LoadModel(const std::string& path, const RopeOverrides& overrides);

// Whether LoadModel(path) would load the file: the same load (the architecture, its metadata,
// every tensor's name, shape and type, each refusal by name) without repacking any weight; the
// Error is LoadModel's. `lamina inspect`'s verdict.
Status CheckModelFile(const std::string& path);

// Gives `model` the multi-token-prediction head of a companion GGUF (`<model>-mtp.gguf`:
// <arch>.nextn_predict_layers, block_count = the trunk's layers + 1 and the trunk's widths,
// tensors blk.<n_layer>.nextn.{eh_proj,enorm,hnorm,shared_head_norm} and one decoder layer;
// models/README.md); afterwards model.mtp() runs it.
Status LoadMtpHead(Model& model, const std::string& path);

}  // namespace lamina
