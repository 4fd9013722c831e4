// The qwen2moe architecture: qwen2 attention (Q/K/V biases, NeoX RoPE) and a mixture-of-experts
// FFN: softmax router over all experts, top-k weights used as they are (not renormalised),
// plus a shared expert gated by sigmoid(ffn_gate_inp_shexp · x).
#include "model/architectures.h"
#include "model/decoder.h"

namespace lamina {

Result<std::unique_ptr<Model>> LoadQwen2Moe(std::unique_ptr<gguf::File> file,
                                            std::unique_ptr<Tokenizer> tokenizer) {
  DecoderOptions o;
  o.rope_style = RopeStyle::kNeox;
  o.attn_bias = true;
  o.qk_norm = false;
  o.moe = true;
  o.moe_norm_topk = false;
  o.moe_shared_expert = true;
  return LoadDecoder(std::move(file), std::move(tokenizer), o);
}

}  // namespace lamina
