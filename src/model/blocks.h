// The transformer blocks shared by the architectures: their weights and loaders, scratch
// sizing, the embedding lookup, the pre-norm attention and SwiGLU FFN blocks and the output head.
#pragma once

#include <vector>

#include "model/model.h"
#include "model/weight_loader.h"

namespace lamina {

// Grows a reusable scratch buffer to at least n elements (never shrinks it).
template <typename T>
void GrowTo(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
}

struct AttentionWeights {
  std::vector<float> norm;      // [n_embd]
  std::vector<float> norm_b;    // [n_embd] optional norm bias (phimoe; empty when absent)
  WeightMatrix wq, wk, wv, wo;  // [q_dim x n_embd], [kv_dim x n_embd] x2, [n_embd x q_dim]
  // A fused attn_qkv ([q_dim + 2 kv_dim x n_embd]: Q rows, then K, then V) instead of wq, wk,
  // wv (phi3); invalid when the file holds them apart.
  WeightMatrix wqkv;
  std::vector<float> bq, bk, bv;      // optional biases (empty when absent)
  std::vector<float> bo;              // [n_embd] optional attn_output.bias (empty when absent)
  std::vector<float> q_norm, k_norm;  // optional per-head RMSNorm weights [head_dim]
};

struct FfnWeights {
  std::vector<float> norm;  // [n_embd]
  // [n_ff x n_embd] x2, [n_embd x n_ff]. A fused FFN (phi3) has no gate and an up of
  // [2 n_ff x n_embd]: per token its first n_ff outputs are the gate, the rest the up.
  WeightMatrix gate, up, down;
  // Optional biases (mistral3; empty when absent), added to each matmul's output.
  std::vector<float> gate_b, up_b;  // [n_ff]
  std::vector<float> down_b;        // [n_embd]
};

// Which optional biases a layer's loader reads (each only when the file has it, unless said).
struct LayerBiases {
  bool qkv = false;       // attn_q / attn_k / attn_v (or the fused attn_qkv's) biases
  bool out = false;       // attn_output.bias
  bool ffn = false;       // ffn_gate / ffn_up / ffn_down biases of a dense FFN
  bool norm = false;      // attn_norm.bias (and the FFN's norm bias, in its own loader)
  bool required = false;  // out and norm are required, not optional (phimoe)
};

// The attention weights of `layer`: attn_q / attn_k / attn_v, or (with_fused_qkv, when the file
// has it) the fused attn_qkv and its optional bias; `biases` says which others are read.
void LoadAttentionWeights(WeightLoader& loader, const Hparams& hp, int layer,
                          const LayerBiases& biases, bool with_qk_norm, AttentionWeights* out,
                          bool with_fused_qkv = false);
// Q/K/V biases only (biases.qkv = with_bias).
void LoadAttentionWeights(WeightLoader& loader, const Hparams& hp, int layer, bool with_bias,
                          bool with_qk_norm, AttentionWeights* out, bool with_fused_qkv = false);
// The FFN's pre-norm is `blk.N.<norm_name>.weight`; `fused_up`: no ffn_gate, an ffn_up of
// 2 n_ff rows (gate then up); with_bias: the optional ffn_{gate,up,down}.bias.
void LoadFfnWeights(WeightLoader& loader, const Hparams& hp, int layer, FfnWeights* out,
                    const char* norm_name = "ffn_norm", bool fused_up = false,
                    bool with_bias = false);

// out[t] = RmsNorm(x[t]) * weight (+ bias when non-empty: phimoe's norms) for n rows
// ([n, n_embd] each); with a pool, the rows are split over its threads (each row computed as
// alone, so the bits do not depend on the split).
void NormBatch(const Hparams& hp, const std::vector<float>& weight, const std::vector<float>& bias,
               int n, const float* x, float* out, ThreadPool* pool = nullptr);

// The matrices the step reads first after a block (the next block's), up to two, for the
// block's last loop to prefetch while its threads wait (ThreadPool::PrefetchWhileIdle);
// empty: none. A hint only: results never depend on it.
struct NextWeights {
  const WeightMatrix* a = nullptr;
  const WeightMatrix* b = nullptr;
};

// Sets the pool's prefetch hint to the given matrices' data (invalid or null ones skipped).
void PrefetchNext(ThreadPool& pool, const NextWeights& next);

// Grows the scratch buffers for n_tokens.
void PrepareScratch(const Hparams& hp, int n_tokens, ForwardScratch& s);

// Token embedding lookup: x[t] = row tokens[t] of the embedding table (dequantized).
void EmbedTokens(const WeightMatrix& embd, const ForwardBatch& batch, float* x);

// s.xn = Wo · attention(RoPE(Wq·norm(x)), RoPE(Wk·norm(x)), Wv·norm(x)) (+ bo) for the whole
// batch ([n_tokens, n_embd]; x is left alone), Q and K rotated with the layer's RoPE (its
// frequency factors included), each query then multiplied by Hparams::attention_temperature.
// `next`: what the step reads after Wo (prefetched during its loop).
void AttentionOutput(const Hparams& hp, const AttentionWeights& w, int layer,
                     const ForwardBatch& batch, AttentionContext& attention, ForwardScratch& s,
                     ThreadPool& pool, const NextWeights& next = {});

// x += AttentionOutput(...).
void AttentionBlock(const Hparams& hp, const AttentionWeights& w, int layer,
                    const ForwardBatch& batch, AttentionContext& attention, ForwardScratch& s,
                    ThreadPool& pool, const NextWeights& next = {});

enum class FfnActivation { kSilu, kGeluTanh };

// s.xn = down(act(gate·norm(x)) * up·norm(x)) ([n_tokens, n_embd]; x is left alone), each
// matmul's bias added when the weights have one; `next`: what the step reads after the down
// projection (prefetched during its loop).
void FfnOutput(const Hparams& hp, const FfnWeights& w, FfnActivation act, const ForwardBatch& batch,
               ForwardScratch& s, ThreadPool& pool, const NextWeights& next = {});

// x += down(silu(gate·norm(x)) * up·norm(x)).
void FfnBlock(const Hparams& hp, const FfnWeights& w, const ForwardBatch& batch, ForwardScratch& s,
              ThreadPool& pool, const NextWeights& next = {});

// The first matrices of an attention block (Q, or the fused QKV) and of an FFN block (gate
// and up, or the fused up), for NextWeights.
NextWeights FirstWeights(const AttentionWeights& w);
NextWeights FirstWeights(const FfnWeights& w);

// hidden[t] = RmsNorm(x[t], norm) for every token of the batch ([n_tokens, n_embd] each): the
// normed final state ForwardBatch::hidden asks for.
void NormRows(const Hparams& hp, const std::vector<float>& norm, const ForwardBatch& batch,
              const float* x, float* hidden);

// Final norm and output head into logits ([batch.n_outputs(), n_vocab], in batch order);
// norm_b ([n_embd]) and output_b ([n_vocab]), when non-null, are phimoe's biases.
void OutputHead(const Hparams& hp, const std::vector<float>& norm, const WeightMatrix& output,
                const ForwardBatch& batch, ForwardScratch& s, ThreadPool& pool, float* logits,
                const std::vector<float>* norm_b = nullptr,
                const std::vector<float>* output_b = nullptr);

}  // namespace lamina
