// The decoder-only transformer every supported architecture is an instance of: token embedding,
// per layer a pre-norm GQA attention block and a pre-norm FFN block (SwiGLU or mixture of
// experts), final norm and output head. Architectures differ only in the options below; each
// row of the architecture table (architectures.h) documents its choice, and LoadModel calls
// LoadDecoder with it.
#pragma once

#include "model/model.h"

namespace lamina {

struct DecoderOptions {
  RopeStyle rope_style = RopeStyle::kNormal;
  bool attn_bias = false;      // Q/K/V biases (loaded when present)
  bool qk_norm = false;        // per-head RMSNorm of Q and K before RoPE
  bool moe = false;            // mixture-of-experts FFN instead of SwiGLU
  bool moe_norm_topk = false;  // default for renormalising the top-k weights (metadata overrides)
  bool moe_shared_expert = false;
};

Result<std::unique_ptr<Model>> LoadDecoder(std::unique_ptr<gguf::File> file,
                                           std::unique_ptr<Tokenizer> tokenizer,
                                           const DecoderOptions& options);

}  // namespace lamina
