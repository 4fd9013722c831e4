// Hyper-parameters read from GGUF metadata: the llama-like `<arch>.*` keys every architecture
// shares, RoPE scaling as recorded, and the kernel's RoPE parameters with overrides applied.
//
// Every count read from metadata is checked against the tensors present (or, where no tensor
// pins it down, against a hard cap below) before anything is sized from it: a file that claims
// millions of layers, heads or experts its tensors do not hold is refused at once with the key,
// its value and what contradicts it (docs/ROBUSTNESS.md, "Hyper-parameters against tensors").
#pragma once

#include <cstdint>
#include <string>

#include "model/model.h"

namespace lamina {

// "<arch>.<suffix>": a GGUF metadata key of an architecture.
inline std::string ArchKey(const std::string& arch, const char* suffix) {
  return arch + "." + suffix;
}

// Hard caps for counts that no tensor shape bounds (or before the tensors are looked at).
// The longest training context accepted: the CLI's largest --ctx-size. The value only picks the
// default context (at most 4,096) and YaRN's original context, but 2^31 would not fit its int.
constexpr int64_t kMaxContextLength = int64_t{1} << 30;
// Attention heads per layer: keeps n_head * head_dim (and the K/V widths) well inside an int;
// published models have at most a few hundred.
constexpr int64_t kMaxHeads = int64_t{1} << 16;
// Longest K/V row of one head (what the KV modes and attention kernels are built for).
constexpr int64_t kMaxHeadDim = 1024;
// Any other integer hyper-parameter is kept in an int.
constexpr int64_t kMaxHparamInt = INT32_MAX;

// "<path>: metadata key "<key>" = <value>, but <why>": a count that the tensors (or a cap)
// contradict. `how_defaulted`, when the key is absent and the value was derived, says from what.
Error HparamError(const gguf::File& file, const std::string& key, int64_t value,
                  const std::string& why, const std::string& how_defaulted = "");

// The first tensor `blk.N.<suffix>` over the layers 0..n_layer-1 (n_layer already checked by
// CheckLayerCount), with its layer in *layer; nullptr when no layer has one.
const gguf::TensorInfo* FirstLayerTensor(const gguf::File& file, int n_layer,
                                         const std::string& suffix, int* layer = nullptr);

// `key` (block_count) against the `blk.N.*` tensors present: their layer indices must be
// exactly 0..n_layer-1. Costs one pass over the tensor table, whatever the value claims.
Status CheckLayerCount(const gguf::File& file, const std::string& key, int64_t n_layer);

// Reads `<arch>.*` hyper-parameters common to llama-like architectures. Missing required keys
// are an error naming the key. Each count is checked against the tensors present: block_count
// against the blk.N layers, embedding_length against token_embd.weight, head_count,
// head_count_kv and key_length against the first attn_q / attn_k weights (whose rows are
// q_rows_per_head_dim x head_count x head_dim: 2 when attn_q also holds a per-head output gate),
// feed_forward_length against the first dense ffn_up weight (up_rows_per_ff x n_ff rows: 2 when
// it holds the gate too, phi3).
Result<Hparams> ReadLlamaLikeHparams(const gguf::File& file, RopeStyle rope_style,
                                     int q_rows_per_head_dim = 1, int up_rows_per_ff = 1);

// Reads `<arch>.rope.scaling.*` (and the older `rope.scale_linear`) as llama.cpp does.
Result<RopeScalingConfig> ReadRopeScaling(const gguf::File& file, const std::string& arch,
                                          int n_ctx_train);

// The kernel's RoPE parameters from the model's n_rot/base/style and scaling config, with
// command-line overrides applied as llama.cpp's context parameters do.
RopeParams ResolveRope(const RopeParams& base, const RopeScalingConfig& scaling,
                       const RopeOverrides& overrides);

// The RoPE of sliding-window layers (llama.cpp): the global layers' parameters with the base
// freq_base_swa and no linear scaling (freq_scale 1).
RopeParams SlidingWindowRope(const RopeParams& global, float freq_base_swa);

// How an architecture's sliding-window layers default (llama.cpp's per-architecture rules).
struct SlidingWindowRules {
  int default_period = 6;  // sliding_window_pattern when absent (gemma3 6, gpt-oss 2)
  // false (gemma3): the local layers' RoPE base defaults to 10000 and they never scale
  // (SlidingWindowRope). true (gpt-oss): they rotate with the global RoPE, its scaling included,
  // the base rope.freq_base_swa when present.
  bool global_rope = false;
  bool required = false;  // attention.sliding_window must be present
};

// Sliding-window attention as llama.cpp reads it: `<arch>.attention.sliding_window` (absent or
// 0: none; else at most kMaxContextLength), the period P of
// `<arch>.attention.sliding_window_pattern` (default rules.default_period; layer il is a
// sliding-window layer when P == 0 or il % P < P - 1, so every P-th layer is global) and
// `<arch>.rope.freq_base_swa` (default: see SlidingWindowRules). Fills hp->n_swa, swa_layers and
// rope_swa (from hp->rope, already read). A value out of range, an array pattern or a
// non-positive base is an error naming the key.
Status ReadSlidingWindow(const gguf::File& file, Hparams* hp,
                         const SlidingWindowRules& rules = SlidingWindowRules{});

// Reads the required `<arch>.rope.dimension_sections` (qwen35: interleaved multi-section RoPE,
// RopeParams::sections) into hp->rope: 4 integers (or one for all four), each >= 0, summing to
// at most the head dimension, t, h and w not all 0 (ggml's rules).
Status ReadRopeSections(const gguf::File& file, Hparams* hp);

}  // namespace lamina
