// Causal grouped-query attention over the KV cache, for a batch of queries at consecutive
// positions of one sequence. Work items are (KV head, block of tokens, chunk of cells): each
// decodes a tile of cells once and reuses it for every query head of the GQA group and every
// token of the block.
// Two passes (scores, then the V sum) keep softmax exact in f32 with normalised weights, which
// is how GGML's non-flash path rounds with an f16 cache (query and softmax weights rounded to
// f16). Rotated K: the query is rotated too; rotated V: the output is rotated back once per
// query head. int8 / q4_0 K with head_dim % 32 == 0 is scored from its codes against an int16
// query when the CPU has AVX-512 VNNI (kv_decode.h), without decoding K.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/kv_cache.h"
#include "util/thread_pool.h"

namespace lamina {

// Cells per work item. A token block whose queries see more cells is split at multiples of
// this (fixed by cell index, never by thread count or batch): each chunk runs the two passes
// over its cells with weights normalised within the chunk, and the chunks' results are merged
// in chunk order, weighted by their softmax mass. So a long context spreads over every thread
// even with few KV heads, and a context within one chunk keeps the single-pass bits.
inline constexpr int kAttentionCellChunk = 4096;

struct AttentionShape {
  int n_head = 0;
  int n_head_kv = 0;
  int head_dim = 0;
  float scale = 1.0f;  // applied to Q·K
  // Sliding-window attention (llama.cpp's standard SWA): a query at position p sees the cells
  // [p - sliding_window + 1, p] only; 0: every cell up to p. Cells below a query's window are
  // neither scored nor summed, so its result is the same whatever else the cache holds there.
  int sliding_window = 0;
  // Attention sinks (gpt-oss): per query head a learned logit that joins its softmax's
  // denominator only, as exp(sink - max) beside the cells' exp(score - max) (the sink is not
  // scaled and has no V row). [n_head]; nullptr: none.
  const float* sinks = nullptr;
};

struct AttentionScratch {
  std::vector<float> per_thread;      // [n_threads][per-thread floats, see attention.cpp]
  std::vector<int16_t> per_thread_q;  // [n_threads][queries per item][head_dim] int16 queries
  std::vector<float> chunks;          // [stored chunks][see attention.cpp] split-context results
};

// out[t, h*head_dim..] = attention of query (t, h) over cells [0, pos0 + t] of `seq` (with a
// sliding window: over its window's cells of them).
// q: [n_tokens, n_head * head_dim]; out: same shape.
void CausalAttention(const KvCache& cache, int layer, int seq, int pos0, int n_tokens,
                     const float* q, float* out, const AttentionShape& shape,
                     AttentionScratch& scratch, ThreadPool& pool);

// A run of a batch's tokens continuing one sequence: batch rows [begin, begin + n) at
// positions pos0.. of `seq`.
struct AttentionSegment {
  int seq = 0;
  int pos0 = 0;
  int begin = 0;
  int n = 0;
};
// The same for several segments of one batch in one parallel pass (work items over every
// segment's KV heads and token blocks): each row's result is the one CausalAttention gives its
// segment alone. q, out: [batch rows, n_head * head_dim].
void CausalAttentionSegments(const KvCache& cache, int layer, const AttentionSegment* segments,
                             int n_segments, const float* q, float* out,
                             const AttentionShape& shape, AttentionScratch& scratch,
                             ThreadPool& pool);

}  // namespace lamina
