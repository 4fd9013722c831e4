// The qwen3moe architecture: qwen3 attention (per-head Q/K RMSNorm before NeoX RoPE, head_dim
// from attention.key_length) and a mixture-of-experts FFN without a shared expert. The top-k
// weights are renormalised to sum 1: llama.cpp hard-codes this for qwen3moe (the real models'
// norm_topk_prob), and expert_weights_norm, when present, overrides it.
#include "model/architectures.h"
#include "model/decoder.h"

namespace lamina {

Result<std::unique_ptr<Model>> LoadQwen3Moe(std::unique_ptr<gguf::File> file,
                                            std::unique_ptr<Tokenizer> tokenizer) {
  DecoderOptions o;
  o.rope_style = RopeStyle::kNeox;
  o.attn_bias = false;
  o.qk_norm = true;
  o.moe = true;
  o.moe_norm_topk = true;
  o.moe_shared_expert = false;
  return LoadDecoder(std::move(file), std::move(tokenizer), o);
}

}  // namespace lamina
