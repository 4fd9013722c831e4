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
  // rope.scaling.yarn_log_multiplier (RopeScalingConfig::yarn_log_mul); RoPE must turn every
  // head dimension; biases and experts (which llama.cpp would read) are refused by name.
  bool mistral3 = false;
};

Result<std::unique_ptr<Model>> LoadDecoder(std::unique_ptr<gguf::File> file,
                                           std::unique_ptr<Tokenizer> tokenizer,
                                           const DecoderOptions& options, bool repack = true);

}  // namespace lamina
