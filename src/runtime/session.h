// A session: one model, one KV cache, scratch buffers and a thread pool reference. Prefill
// processes a prompt in one batch (or in chunks); Decode feeds one token. Both reach the cache
// only through KvCache::Write, via the model's AttentionContext.
#pragma once

#include <memory>
#include <vector>

#include "model/model.h"
#include "runtime/attention.h"
#include "runtime/kv_cache.h"

namespace lamina {

struct SessionConfig {
  int n_ctx = 0;  // 0: the model's training context, capped at 4096
  KvType kv_type = KvType::kF16;
  KvRounding v_rounding = KvRounding::kNearest;
  uint64_t kv_seed = 0;
};

// The cache configuration a session would use; an error when the mode cannot hold the model's
// head_dim (call before constructing a Session with user-chosen options).
Result<KvCacheConfig> MakeKvCacheConfig(const Hparams& hp, const SessionConfig& config);

class Session {
 public:
  Session(const Model& model, const SessionConfig& config, ThreadPool& pool);

  const Model& model() const { return model_; }
  const KvCache& cache() const { return cache_; }
  KvCache& mutable_cache() { return cache_; }
  int n_ctx() const { return cache_.config().n_ctx; }
  int n_past() const { return n_past_; }

  // Appends tokens at positions n_past()..; returns logits [n, n_vocab] if all_logits, else
  // the last token's [n_vocab]. Fails if the context would overflow, or if a K/V value was
  // non-finite (the cache refuses to store it).
  Result<const float*> Eval(const std::vector<int32_t>& tokens, bool all_logits);
  Result<const float*> Eval(const int32_t* tokens, int n, bool all_logits);

  // Drops positions >= n_keep.
  void Truncate(int n_keep);

  // Appends n cells of random K/V (unit-variance Gaussian rows, through the cache's writer) to
  // every layer without running the model: lets benchmarks measure decode at a long depth
  // without first processing a long prompt.
  void FillWithRandomCells(int n, uint64_t seed);

 private:
  class CacheAttention;
  const Model& model_;
  ThreadPool& pool_;
  KvCache cache_;
  ForwardScratch scratch_;
  AttentionScratch attention_scratch_;
  std::vector<float> logits_;  // [n_tokens or 1, n_vocab]
  int n_past_ = 0;
};

}  // namespace lamina
