// The qwen3 architecture: NeoX RoPE attention without biases but with a per-head RMSNorm of Q and
// K before RoPE; head_dim comes from attention.key_length and may differ from n_embd / n_head.
// The output head is tied to the embedding when output.weight is absent.
#include "model/architectures.h"
#include "model/decoder.h"

namespace lamina {

Result<std::unique_ptr<Model>> LoadQwen3(std::unique_ptr<gguf::File> file,
                                         std::unique_ptr<Tokenizer> tokenizer) {
  DecoderOptions o;
  o.rope_style = RopeStyle::kNeox;
  o.attn_bias = false;
  o.qk_norm = true;
  o.moe = false;
  o.moe_norm_topk = false;
  o.moe_shared_expert = false;
  return LoadDecoder(std::move(file), std::move(tokenizer), o);
}

}  // namespace lamina
