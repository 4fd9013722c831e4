// Mixture-of-experts feed-forward shared by qwen2moe, qwen3moe, mistral3, phimoe and gpt-oss: a
// softmax router over all experts (gpt-oss: top-k on the router logits, softmax over the k
// chosen), top-k selection, SiLU-gated experts stored as 3-D tensors (gpt-oss: swiglu_oai, with
// per-expert biases; mistral3 without ffn_gate_exps: SiLU(up), ungated), and an optional shared
// expert gated by sigmoid(w·x). Only the selected experts' rows are read.
#pragma once

#include <cstdint>
#include <vector>

#include "model/blocks.h"

namespace lamina {

// Experts per layer: the router's softmax and top-k run over all of them per token; published
// models have at most a few hundred.
constexpr int64_t kMaxExperts = 1024;
// Width of one expert's (or the shared expert's) FFN.
constexpr int64_t kMaxExpertFeedForward = int64_t{1} << 20;

struct MoeHparams {
  int n_expert = 0;        // experts per layer
  int n_expert_used = 0;   // k experts chosen per token
  int n_ff_exp = 0;        // width of one expert's FFN
  int n_ff_shexp = 0;      // width of the shared expert's FFN (0: no shared expert)
  bool norm_topk = false;  // renormalise the k chosen weights to sum 1
  // gpt-oss (llama.cpp's SOFTMAX_WEIGHT gating): the k largest router logits are chosen and
  // their weights are the softmax over those k logits alone.
  bool softmax_selected = false;
  // gpt-oss's experts: SwigluOaiMul(gate, up, oai_alpha, oai_limit) instead of SiLU(gate) * up.
  bool swiglu_oai = false;
  float oai_alpha = 1.702f;
  float oai_limit = 7.0f;
  // mistral3 (llama.cpp loads its ffn_gate_exps as optional): a layer without ffn_gate_exps runs
  // each expert as down(SiLU(up(x))), what build_moe_ffn does with a null gate.
  bool gate_optional = false;
};

// Reads `<arch>.expert_count`, `expert_used_count`, `expert_feed_forward_length` (default
// n_ff / k, as llama.cpp), `expert_shared_feed_forward_length` (when with_shared, default n_ff)
// and `expert_weights_norm` (default `default_norm_topk`). Only softmax gating is supported.
// With `experts_n_ff` (llama.cpp's mistral3 and phimoe) the experts are feed_forward_length
// wide and the routing is the architecture's: expert_feed_forward_length, expert_weights_norm
// and expert_gating_func are not read (norm_topk = default_norm_topk).
// The counts are checked against the first layer's expert tensors (ffn_gate_exps, or
// ffn_up_exps in a file without it: [n_embd, n_ff_exp, n_expert]; ffn_gate_inp: [n_embd,
// n_expert]; ffn_gate_shexp: [n_embd, n_ff_shexp])
// and feed_forward_length, which only sizes scratch here, against the experts' total width.
Result<MoeHparams> ReadMoeHparams(const gguf::File& file, const Hparams& hp, bool default_norm_topk,
                                  bool with_shared, bool experts_n_ff = false);

struct MoeWeights {
  std::vector<float> norm;              // [n_embd]
  std::vector<float> norm_b;            // [n_embd] optional norm bias (phimoe; empty: none)
  WeightMatrix router;                  // [n_expert x n_embd] (ffn_gate_inp)
  std::vector<WeightMatrix> gate, up;   // n_expert x [n_ff_exp x n_embd]; gate empty: ungated
  std::vector<WeightMatrix> down;       // n_expert x [n_embd x n_ff_exp]
  WeightMatrix shared_gate_inp;         // [1 x n_embd]; invalid without a shared expert
  WeightMatrix shared_gate, shared_up;  // [n_ff_shexp x n_embd]
  WeightMatrix shared_down;             // [n_embd x n_ff_shexp]
  // Optional biases (gpt-oss; empty when absent): the router's and each expert's.
  std::vector<float> router_b;  // [n_expert]
  std::vector<float> gate_b;    // [n_expert, n_ff_exp]
  std::vector<float> up_b;      // [n_expert, n_ff_exp]
  std::vector<float> down_b;    // [n_expert, n_embd]
};

// Loads layer `layer`'s MoE tensors (the pre-FFN norm is `blk.N.<norm_name>.weight`; with
// `with_bias` the router's and experts' biases `ffn_gate_inp.bias`, `ffn_{gate,up,down}_exps.bias`
// too, required; with `with_norm_bias` the norm's `.bias`, required; `ffn_gate_exps` may be absent
// only with moe.gate_optional); returns the bytes of the
// routed expert tensors (the part of which a token reads only k / n_expert).
uint64_t LoadMoeWeights(WeightLoader& loader, const Hparams& hp, const MoeHparams& moe, int layer,
                        MoeWeights* out, const char* norm_name = "ffn_norm", bool with_bias = false,
                        bool with_norm_bias = false);

// Router: for each token, softmax over probs [n_tokens, n_expert] (in place, logits in), then
// the k largest (ties to the lower id) into ids/weights [n_tokens, k], best first; with
// norm_topk the k weights are divided by their sum (clamped to >= 2^-14, as llama.cpp). With
// softmax_selected the k largest logits are chosen first and the softmax runs over them alone.
void RouteTopK(float* probs, int n_tokens, int n_expert, int k, bool norm_topk, int32_t* ids,
               float* weights, bool softmax_selected = false);

// x += sum_j w_j · expert_j(norm(x) [+ norm bias]) [+ sigmoid(g·norm(x)) · shared(norm(x))] for the
// batch. Tokens are grouped by chosen expert and each expert runs once, matrix-matrix, over its
// tokens; unselected experts are not read.
void MoeBlock(const Hparams& hp, const MoeHparams& moe, const MoeWeights& w,
              const ForwardBatch& batch, ForwardScratch& s, ThreadPool& pool);

}  // namespace lamina
