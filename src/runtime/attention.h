// Causal grouped-query attention over the KV cache, for a batch of queries at consecutive
// positions of one sequence. Numerics follow GGML's non-flash path: with an F16 cache the query
// is rounded to F16 for Q·K and the softmax weights are rounded to F16 for the V sum.
#pragma once

#include <vector>

#include "runtime/kv_cache.h"
#include "util/thread_pool.h"

namespace lamina {

struct AttentionShape {
  int n_head = 0;
  int n_head_kv = 0;
  int head_dim = 0;
  float scale = 1.0f;  // applied to Q·K
};

struct AttentionScratch {
  std::vector<float> per_thread;  // [n_threads][n_ctx + 2 * head_dim]
};

// out[t, h*head_dim..] = attention of query (t, h) over cells [0, pos0 + t] of `seq`.
// q: [n_tokens, n_head * head_dim]; out: same shape.
void CausalAttention(const KvCache& cache, int layer, int seq, int pos0, int n_tokens,
                     const float* q, float* out, const AttentionShape& shape,
                     AttentionScratch& scratch, ThreadPool& pool);

}  // namespace lamina
