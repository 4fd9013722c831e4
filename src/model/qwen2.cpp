// The qwen2 architecture: llama's layout with Q/K/V biases and NeoX (half-split) RoPE; the
// output head is tied to the embedding when output.weight is absent.
#include "model/architectures.h"
#include "model/decoder.h"

namespace lamina {

Result<std::unique_ptr<Model>> LoadQwen2(std::unique_ptr<gguf::File> file,
                                         std::unique_ptr<Tokenizer> tokenizer) {
  DecoderOptions o;
  o.rope_style = RopeStyle::kNeox;
  o.attn_bias = true;
  o.qk_norm = false;
  o.moe = false;
  o.moe_norm_topk = false;
  o.moe_shared_expert = false;
  return LoadDecoder(std::move(file), std::move(tokenizer), o);
}

}  // namespace lamina
