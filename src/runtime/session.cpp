// Session: batched prefill and decode over the KV cache.
#include "runtime/session.h"

#include <algorithm>
#include <cmath>
#include <random>

namespace lamina {

Result<KvCacheConfig> MakeKvCacheConfig(const Hparams& hp, const SessionConfig& c) {
  KvCacheConfig kc;
  kc.n_layer = hp.n_layer;
  kc.n_ctx = c.n_ctx > 0 ? c.n_ctx : std::min(hp.n_ctx_train, 4096);
  kc.n_kv_heads = hp.n_head_kv;
  kc.head_dim = hp.head_dim;
  kc.type = c.kv_type;
  kc.v_rounding = c.v_rounding;
  kc.seed = c.kv_seed;
  kc.rope = hp.rope;
  Status st = ValidateKvConfig(kc);
  if (!st.ok()) return st.error();
  return kc;
}

namespace {
KvCacheConfig CheckedCacheConfig(const Hparams& hp, const SessionConfig& c) {
  Result<KvCacheConfig> kc = MakeKvCacheConfig(hp, c);
  LAMINA_CHECK(kc.ok());
  return *kc;
}
}  // namespace

// Bridges the model's attention calls to the cache: write through the single writer, then read.
class Session::CacheAttention final : public AttentionContext {
 public:
  CacheAttention(Session& s, int pos0, int n_tokens) : s_(s), pos0_(pos0), n_tokens_(n_tokens) {}
  void Attend(int layer, const float* q, const float* k, const float* v, float* out) override {
    const Hparams& hp = s_.model_.hparams();
    s_.cache_.Write(layer, /*seq=*/0, pos0_, n_tokens_, k, v, &s_.pool_);
    AttentionShape shape{hp.n_head, hp.n_head_kv, hp.head_dim,
                         1.0f / std::sqrt(static_cast<float>(hp.head_dim))};
    CausalAttention(s_.cache_, layer, /*seq=*/0, pos0_, n_tokens_, q, out, shape,
                    s_.attention_scratch_, s_.pool_);
  }

 private:
  Session& s_;
  int pos0_;
  int n_tokens_;
};

Session::Session(const Model& model, const SessionConfig& config, ThreadPool& pool)
    : model_(model), pool_(pool), cache_(CheckedCacheConfig(model.hparams(), config)) {}

Result<const float*> Session::Eval(const std::vector<int32_t>& tokens, bool all_logits) {
  return Eval(tokens.data(), static_cast<int>(tokens.size()), all_logits);
}

Result<const float*> Session::Eval(const int32_t* tokens, int n, bool all_logits) {
  const Hparams& hp = model_.hparams();
  if (n <= 0) return Error{"empty batch"};
  if (n_past_ + n > n_ctx()) {
    return Error{"context overflow: " + std::to_string(n_past_) + " + " + std::to_string(n) +
                 " tokens exceed the context of " + std::to_string(n_ctx())};
  }
  for (int i = 0; i < n; ++i) {
    if (tokens[i] < 0 || tokens[i] >= hp.n_vocab) {
      return Error{"token id " + std::to_string(tokens[i]) + " out of range"};
    }
  }
  ForwardBatch batch;
  batch.tokens = tokens;
  batch.n_tokens = n;
  batch.pos0 = n_past_;
  batch.all_logits = all_logits;
  logits_.resize(static_cast<size_t>(all_logits ? n : 1) * hp.n_vocab);
  CacheAttention attention(*this, n_past_, n);
  model_.Forward(batch, attention, scratch_, pool_, logits_.data());
  n_past_ += n;
  if (!cache_.nonfinite_error().empty()) {
    const std::string msg = cache_.nonfinite_error();
    cache_.ClearNonfinite();
    return Error{msg};
  }
  return static_cast<const float*>(logits_.data());
}

void Session::FillWithRandomCells(int n, uint64_t seed) {
  LAMINA_CHECK(n >= 0 && n_past_ + n <= n_ctx());
  const int row = cache_.row_elems();
  const int chunk = 256;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> k(static_cast<size_t>(chunk) * row), v(k.size());  // [chunk, row]
  for (int p0 = 0; p0 < n; p0 += chunk) {
    const int m = std::min(chunk, n - p0);
    for (int layer = 0; layer < cache_.config().n_layer; ++layer) {
      for (size_t i = 0; i < static_cast<size_t>(m) * row; ++i) {
        k[i] = normal(rng);
        v[i] = normal(rng);
      }
      cache_.Write(layer, 0, n_past_ + p0, m, k.data(), v.data(), &pool_);
    }
  }
  n_past_ += n;
}

void Session::Truncate(int n_keep) {
  n_keep = std::max(0, std::min(n_keep, n_past_));
  cache_.Truncate(0, n_keep);
  n_past_ = n_keep;
}

}  // namespace lamina
