// The supported architectures as rows of one table: a name (general.architecture) and the
// DecoderOptions the shared decoder (decoder.h) runs it with, or the factory of an architecture
// with its own loader. LoadModel (load.cpp) dispatches on this table.
#pragma once

#include "model/decoder.h"
#include "model/model.h"

namespace lamina {

// repack: whether matrices are repacked into their interleaved layouts (false: CheckModelFile's
// load, every check and no repacking).
using ModelFactory = Result<std::unique_ptr<Model>> (*)(std::unique_ptr<gguf::File> file,
                                                        std::unique_ptr<Tokenizer> tokenizer,
                                                        bool repack);

// The qwen3next hybrid (qwen3next.cpp): Gated DeltaNet and gated-attention layers.
Result<std::unique_ptr<Model>> LoadQwen3Next(std::unique_ptr<gguf::File> file,
                                             std::unique_ptr<Tokenizer> tokenizer, bool repack);

// qwen35 (dense SwiGLU FFN) and qwen35moe (MoE FFN with a shared expert): the same hybrid
// in the Qwen3.5 file layout (qwen3next.cpp).
Result<std::unique_ptr<Model>> LoadQwen35(std::unique_ptr<gguf::File> file,
                                          std::unique_ptr<Tokenizer> tokenizer, bool repack);
Result<std::unique_ptr<Model>> LoadQwen35Moe(std::unique_ptr<gguf::File> file,
                                             std::unique_ptr<Tokenizer> tokenizer, bool repack);

// gemma3 (gemma3.cpp): sliding-window and global attention layers, sandwich norms, GELU FFN.
Result<std::unique_ptr<Model>> LoadGemma3(std::unique_ptr<gguf::File> file,
                                          std::unique_ptr<Tokenizer> tokenizer, bool repack);

// gpt-oss (gptoss.cpp): attention sinks, alternating sliding-window layers, biases, a MoE of
// swiglu_oai experts weighted by the softmax of the chosen router logits.
Result<std::unique_ptr<Model>> LoadGptOss(std::unique_ptr<gguf::File> file,
                                          std::unique_ptr<Tokenizer> tokenizer, bool repack);

struct Architecture {
  const char* name;        // general.architecture
  DecoderOptions options;  // the shared decoder's options (unused when factory is set)
  ModelFactory factory;    // nullptr: LoadDecoder(file, tokenizer, options)
};

// clang-format off
inline constexpr Architecture kArchitectures[] = {
    // name       rope style          attn_bias qk_norm moe    moe_norm_topk moe_shared_expert
    // llama: token embedding, pre-norm GQA attention with "normal" (adjacent pair) RoPE, SwiGLU
    // FFN, RMSNorm, output head tied to the embedding when output.weight is absent. Q/K/V biases
    // are loaded when a file has them, and rope_freqs (Llama 3.1's scaling, which converters
    // store as per-pair frequency factors) when present.
    {"llama",     {RopeStyle::kNormal, true,     false,  false, false,        false,
                   /*fused_qkv=*/false, /*fused_gate_up=*/false, RopeFactors::kFreqs,
                   /*mistral3=*/false},                                              nullptr},
    // qwen2: llama's layout with Q/K/V biases and NeoX (half-split) RoPE; the output head is
    // tied to the embedding when output.weight is absent.
    {"qwen2",     {RopeStyle::kNeox,   true,     false,  false, false,        false}, nullptr},
    // qwen2moe: qwen2 attention (Q/K/V biases, NeoX RoPE) and a mixture-of-experts FFN: softmax
    // router over all experts, top-k weights used as they are (not renormalised), plus a shared
    // expert gated by sigmoid(ffn_gate_inp_shexp · x).
    {"qwen2moe",  {RopeStyle::kNeox,   true,     false,  true,  false,        true},  nullptr},
    // qwen3: NeoX RoPE attention without biases but with a per-head RMSNorm of Q and K before
    // RoPE; head_dim comes from attention.key_length and may differ from n_embd / n_head. The
    // output head is tied to the embedding when output.weight is absent.
    {"qwen3",     {RopeStyle::kNeox,   false,    true,   false, false,        false}, nullptr},
    // qwen3moe: qwen3 attention (per-head Q/K RMSNorm before NeoX RoPE, head_dim from
    // attention.key_length) and a mixture-of-experts FFN without a shared expert. The top-k
    // weights are renormalised to sum 1: llama.cpp hard-codes this for qwen3moe (the real
    // models' norm_topk_prob), and expert_weights_norm, when present, overrides it.
    {"qwen3moe",  {RopeStyle::kNeox,   false,    true,   true,  true,         false}, nullptr},
    // phi3 (Phi-3, Phi-3.5, Phi-4-mini): NeoX RoPE, possibly on part of the head
    // (rope.dimension_count), a fused attn_qkv (Q, K, V rows) and a fused ffn_up (gate rows,
    // then up rows, SwiGLU), LongRoPE's rope_factors_short (rope_factors_long in a session
    // whose context exceeds rope.scaling.original_context_length) with
    // rope.scaling.attn_factor on cos and sin; attention.sliding_window is ignored, as llama.cpp
    // does (it disables Phi's window). Output head tied when output.weight is absent.
    {"phi3",      {RopeStyle::kNeox,   true,     false,  false, false,        false,
                   /*fused_qkv=*/true, /*fused_gate_up=*/true, RopeFactors::kShortLong,
                   /*mistral3=*/false},                                              nullptr},
    // mistral3 (Ministral 3, Mistral Small 3.x, Devstral): llama's layout and "normal" RoPE on
    // the whole head (partial RoPE refused: llama.cpp's graph asserts n_rot = head_dim), YaRN as
    // the file says with rope.scaling.yarn_log_multiplier's attention factor, llama 4's
    // attention temperature tuning (attention.temperature_scale: queries scaled by
    // 1 + s ln(floor(p / original context) + 1)), rope_freqs when present; Q/K/V (or attn_qkv),
    // attn_output and dense ffn_{gate,up,down} biases when present; with expert_count > 0 a MoE
    // FFN as llama.cpp builds it: softmax router, top-k weights renormalised to sum 1, experts
    // feed_forward_length wide, no shared expert, ffn_gate_exps optional (a layer without it runs
    // SiLU(up) experts).
    {"mistral3",  {RopeStyle::kNormal, true,     false,  false, false,        false,
                   /*fused_qkv=*/true, /*fused_gate_up=*/false, RopeFactors::kFreqs,
                   /*mistral3=*/true},                                               nullptr},
    // phimoe (Phi-3.5-MoE): phi3's attention (NeoX RoPE, LongRoPE's short/long factors and
    // attention factor, attn_qkv or attn_q/k/v with optional biases, the window ignored; the
    // factors one per pair of the whole head even when rope.dimension_count is smaller) with
    // attn_output.bias, RMS norms with a bias each (llama.cpp builds them as RMS norms, not
    // layer norms), and a MoE FFN: softmax router, top-k weights renormalised to sum 1, experts
    // feed_forward_length wide (llama.cpp's softmax top-k, not the reference's sparsemixer); a
    // separate output head with its bias.
    {"phimoe",    {RopeStyle::kNeox,   true,     false,  true,  true,         false,
                   /*fused_qkv=*/true, /*fused_gate_up=*/false, RopeFactors::kShortLong,
                   /*mistral3=*/false, /*phimoe=*/true, /*moe_experts_n_ff=*/true},  nullptr},
    // qwen3next: the hybrid of Gated DeltaNet and gated full attention with a MoE FFN, its own
    // loader (qwen3next.cpp documents it).
    {"qwen3next", {},                                                                 LoadQwen3Next},
    // qwen35: qwen3next's hybrid (the same code) with a dense SwiGLU FFN after
    // post_attention_norm, ssm_beta / ssm_alpha instead of the fused ssm_ba, V heads tiled over
    // the K heads, interleaved multi-section RoPE (rope.dimension_sections, NeoX for text);
    // multi-token-prediction blocks (nextn_predict_layers) are not loaded.
    {"qwen35",    {},                                                                 LoadQwen35},
    // qwen35moe: qwen35 with qwen3next's MoE FFN (softmax top-k, renormalised, and a
    // sigmoid-gated shared expert).
    {"qwen35moe", {},                                                                 LoadQwen35Moe},
    // gemma3: per-head Q/K RMSNorm and NeoX RoPE; sliding-window layers (every 6th layer, or
    // as attention.sliding_window_pattern says, is global) with their own RoPE base; norms
    // after attention and FFN too, GELU(tanh)-gated FFN, embeddings scaled by sqrt(n_embd), its
    // own loader (gemma3.cpp documents it).
    {"gemma3",    {},                                                                 LoadGemma3},
    // gpt-oss: NeoX RoPE (YaRN when the file says so) on every layer, Q/K/V and output biases,
    // a learned sink logit per query head in every softmax, sliding-window layers alternating
    // with global ones (sliding_window_pattern, default 2), post_attention_norm before a MoE
    // FFN with router and expert biases, top-k on the router logits weighted by the softmax of
    // the k chosen, clamped swiglu_oai experts; its own loader (gptoss.cpp documents it).
    {"gpt-oss",   {},                                                                 LoadGptOss},
};
// clang-format on

}  // namespace lamina
