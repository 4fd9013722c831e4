// The decoder-only transformer every supported architecture is an instance of: token embedding,
// per layer a pre-norm GQA attention block and a pre-norm FFN block (SwiGLU or mixture of
// experts), final norm and output head. Architectures differ only in the options below; each
// row of the architecture table (architectures.h) documents its choice, and LoadModel calls
// LoadDecoder with it.
#pragma once

#include "model/model.h"

namespace lamina {

// Where a file's per-pair RoPE frequency factors come from (RopeParams::freq_factors).
enum class RopeFactors {
  kNone,
  // phi3's LongRoPE: rope_factors_short.weight and rope_factors_long.weight ([n_rot / 2]),
  // llama.cpp taking the long ones when the context per sequence exceeds
  // rope.scaling.original_context_length (Hparams::rope_short_ctx).
  kShortLong,
  // rope_freqs.weight ([n_rot / 2], llama-3-style scaling as a tensor), when present.
  kFreqs,
};

struct DecoderOptions {
  RopeStyle rope_style = RopeStyle::kNormal;
  bool attn_bias = false;      // Q/K/V biases (loaded when present)
  bool qk_norm = false;        // per-head RMSNorm of Q and K before RoPE
  bool moe = false;            // mixture-of-experts FFN instead of SwiGLU
  bool moe_norm_topk = false;  // default for renormalising the top-k weights (metadata overrides)
  bool moe_shared_expert = false;
  bool fused_qkv = false;      // a fused attn_qkv (Q, K, V rows) accepted for attn_q/k/v
  bool fused_gate_up = false;  // no ffn_gate: ffn_up's 2 n_ff rows are the gate, then the up
  RopeFactors rope_factors = RopeFactors::kNone;
  // mistral3's extras: attention.temperature_scale (Hparams::attn_temp_scale) and
  // rope.scaling.yarn_log_multiplier (RopeScalingConfig::yarn_log_mul); attn_output.bias and a
  // dense FFN's ffn_{gate,up,down}.bias when present; a MoE FFN when expert_count > 0 (softmax
  // router, top-k renormalised, experts feed_forward_length wide, no shared expert, as
  // llama.cpp). RoPE must turn every head dimension (llama.cpp's graph asserts it), and
  // shared-expert tensors (which llama.cpp never reads) are refused by name.
  bool mistral3 = false;
  // phimoe: RMS norms with biases (attn_norm, ffn_norm, output_norm), attn_output.bias and
  // output.bias, all required, and a separate output.weight (never tied), as llama.cpp loads it.
  bool phimoe = false;
  // The experts are feed_forward_length wide and the routing the row's (ReadMoeHparams'
  // experts_n_ff: expert_feed_forward_length, expert_weights_norm, expert_gating_func unread).
  bool moe_experts_n_ff = false;
};

Result<std::unique_ptr<Model>> LoadDecoder(std::unique_ptr<gguf::File> file,
                                           std::unique_ptr<Tokenizer> tokenizer,
                                           const DecoderOptions& options, bool repack = true);

}  // namespace lamina
