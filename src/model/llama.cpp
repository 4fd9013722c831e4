// The llama architecture: token embedding, pre-norm GQA attention with "normal" (adjacent
// pair) RoPE, SwiGLU FFN, RMSNorm, output head tied to the embedding when output.weight is absent.
// Q/K/V biases are loaded when a file has them.
#include "model/llama.h"
#include "model/decoder.h"

namespace lamina {

Result<std::unique_ptr<Model>> LoadLlama(std::unique_ptr<gguf::File> file,
                                         std::unique_ptr<Tokenizer> tokenizer) {
  DecoderOptions o;
  o.rope_style = RopeStyle::kNormal;
  o.attn_bias = true;
  o.qk_norm = false;
  o.moe = false;
  o.moe_norm_topk = false;
  o.moe_shared_expert = false;
  return LoadDecoder(std::move(file), std::move(tokenizer), o);
}

}  // namespace lamina
