// Sampler implementation.
#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <unordered_set>

namespace lamina {

int32_t ArgMax(const float* logits, int n) {
  int32_t best = 0;
  for (int i = 1; i < n; ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  return best;
}

Sampler::Sampler(const SamplerConfig& config) : config_(config), rng_(config.seed) {}

int32_t Sampler::Sample(const float* logits, int n_vocab, const std::vector<int32_t>& history) {
  candidates_.resize(n_vocab);
  for (int i = 0; i < n_vocab; ++i) candidates_[i] = {i, logits[i], 0.0f};
  if (config_.repeat_penalty != 1.0f && config_.repeat_last_n != 0) {
    const size_t n = config_.repeat_last_n < 0 ? history.size()
                                               : std::min<size_t>(history.size(), config_.repeat_last_n);
    std::unordered_set<int32_t> seen(history.end() - n, history.end());
    for (int32_t id : seen) {
      if (id < 0 || id >= n_vocab) continue;
      float& l = candidates_[id].logit;
      l = l > 0 ? l / config_.repeat_penalty : l * config_.repeat_penalty;
    }
  }
  if (config_.temperature <= 0.0f) {
    int32_t best = 0;
    for (int i = 1; i < n_vocab; ++i) {
      if (candidates_[i].logit > candidates_[best].logit) best = i;
    }
    return best;
  }
  auto by_logit = [](const Candidate& a, const Candidate& b) {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
  };
  size_t n = candidates_.size();
  if (config_.top_k > 0 && static_cast<size_t>(config_.top_k) < n) {
    std::partial_sort(candidates_.begin(), candidates_.begin() + config_.top_k, candidates_.end(), by_logit);
    n = config_.top_k;
  } else {
    std::sort(candidates_.begin(), candidates_.end(), by_logit);
  }
  candidates_.resize(n);
  // Probabilities at temperature 1 for the top-p / min-p filters.
  auto softmax = [&](float temp) {
    const float max = candidates_[0].logit;
    double sum = 0.0;
    for (auto& c : candidates_) {
      c.p = std::exp((c.logit - max) / temp);
      sum += c.p;
    }
    for (auto& c : candidates_) c.p = static_cast<float>(c.p / sum);
  };
  softmax(1.0f);
  if (config_.top_p < 1.0f) {
    double cum = 0.0;
    size_t keep = candidates_.size();
    for (size_t i = 0; i < candidates_.size(); ++i) {
      cum += candidates_[i].p;
      if (cum >= config_.top_p) {
        keep = i + 1;
        break;
      }
    }
    candidates_.resize(std::max<size_t>(1, keep));
  }
  if (config_.min_p > 0.0f) {
    const float threshold = candidates_[0].p * config_.min_p;
    size_t keep = 1;
    while (keep < candidates_.size() && candidates_[keep].p >= threshold) ++keep;
    candidates_.resize(keep);
  }
  softmax(config_.temperature);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  const double r = uniform(rng_);
  double cum = 0.0;
  for (const auto& c : candidates_) {
    cum += c.p;
    if (r < cum) return c.id;
  }
  return candidates_.back().id;
}

}  // namespace lamina
