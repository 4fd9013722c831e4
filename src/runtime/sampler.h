// Token sampling: greedy, or repetition penalty → top-k → top-p → min-p → temperature → a
// draw from a seeded RNG (the order llama.cpp's default chain uses). Deterministic for a seed.
// SampleWithDraft is the speculative-sampling step: it accepts a drafted token with
// probability min(1, p/q) and otherwise draws from the normalised residual max(0, p − q), so
// the emitted tokens follow the target distribution p whatever the draft.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace lamina {

struct SamplerConfig {
  float temperature = 0.8f;     // <= 0: greedy
  int top_k = 40;               // <= 0: off
  float top_p = 0.95f;          // >= 1: off
  float min_p = 0.05f;          // <= 0: off
  float repeat_penalty = 1.0f;  // 1: off
  int repeat_last_n = 64;
  uint64_t seed = 0;
};

// One token of a sampling distribution.
struct TokenProb {
  int32_t id;
  float p;
};

// What Sample and SampleWithDraft return when no token may be sampled: every logit is -inf
// (or NaN), e.g. a logit bias of false on every token, or on every token a grammar allows.
inline constexpr int32_t kNoToken = -1;

class Sampler {
 public:
  explicit Sampler(const SamplerConfig& config);
  // Picks a token from logits [n_vocab]; `history` is the context so far (for the penalty).
  // Never a token whose logit is -inf or NaN; kNoToken when every one is.
  int32_t Sample(const float* logits, int n_vocab, const std::vector<int32_t>& history);

  // The distribution Sample draws from, after the whole chain: the candidates that survive,
  // probabilities summing to 1, most likely first (greedy: the arg max alone, p = 1). Tokens of
  // logit -inf or NaN are never candidates; empty when no token is.
  const std::vector<TokenProb>& Distribution(const float* logits, int n_vocab,
                                             const std::vector<int32_t>& history);

  // Speculative step for a drafted token. q: the drafter's distribution for this position
  // (nullptr: a deterministic draft, q one-hot on `draft`). Returns the emitted token and sets
  // *accepted when it is the draft. Greedy: the arg max, accepted when it equals the draft.
  // kNoToken (not accepted) when no token may be sampled.
  int32_t SampleWithDraft(const float* logits, int n_vocab, const std::vector<int32_t>& history,
                          int32_t draft, const std::vector<TokenProb>* q, bool* accepted);

  // The distribution the last Sample / SampleWithDraft / Distribution call drew from (after the
  // whole chain; greedy: the arg max alone).
  const std::vector<TokenProb>& last_distribution() const { return dist_; }

 private:
  struct Candidate {
    int32_t id;
    float logit;
    float p;
  };
  SamplerConfig config_;
  std::mt19937_64 rng_;
  std::vector<Candidate> candidates_;
  std::vector<TokenProb> dist_;      // [candidates] Distribution's result
  std::vector<TokenProb> residual_;  // [candidates] SampleWithDraft's max(0, p - q)
};

// Index of the largest value (ties: the lowest index).
int32_t ArgMax(const float* logits, int n);

// The speculative accept rule on explicit uniforms u_accept, u_draw in [0, 1): accept `draft`
// when u_accept < min(1, p(draft) / q(draft)), else draw by inverse CDF from the normalised
// residual max(0, p − q). p, q: distributions (q nullptr: one-hot on draft).
int32_t AcceptOrResample(const std::vector<TokenProb>& p, int32_t draft,
                         const std::vector<TokenProb>* q, double u_accept, double u_draw,
                         bool* accepted, std::vector<TokenProb>* scratch);

}  // namespace lamina
