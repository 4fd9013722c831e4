// Token sampling: greedy, or repetition penalty → top-k → top-p → min-p → temperature → a
// draw from a seeded RNG (the order llama.cpp's default chain uses). Deterministic for a seed.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace lamina {

struct SamplerConfig {
  float temperature = 0.8f;  // <= 0: greedy
  int top_k = 40;            // <= 0: off
  float top_p = 0.95f;       // >= 1: off
  float min_p = 0.05f;       // <= 0: off
  float repeat_penalty = 1.0f;  // 1: off
  int repeat_last_n = 64;
  uint64_t seed = 0;
};

class Sampler {
 public:
  explicit Sampler(const SamplerConfig& config);
  // Picks a token from logits [n_vocab]; `history` is the context so far (for the penalty).
  int32_t Sample(const float* logits, int n_vocab, const std::vector<int32_t>& history);

 private:
  struct Candidate {
    int32_t id;
    float logit;
    float p;
  };
  SamplerConfig config_;
  std::mt19937_64 rng_;
  std::vector<Candidate> candidates_;
};

// Index of the largest value (ties: the lowest index).
int32_t ArgMax(const float* logits, int n);

}  // namespace lamina
