// Sampler implementation.
#include "runtime/sampler.h"

#include <algorithm>
#include <cfloat>
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

const std::vector<TokenProb>& Sampler::Distribution(const float* logits, int n_vocab,
                                                    const std::vector<int32_t>& history) {
  candidates_.resize(n_vocab);
  for (int i = 0; i < n_vocab; ++i) candidates_[i] = {i, logits[i], 0.0f};
  if (config_.repeat_penalty != 1.0f && config_.repeat_last_n != 0) {
    const size_t n = config_.repeat_last_n < 0
                         ? history.size()
                         : std::min<size_t>(history.size(), config_.repeat_last_n);
    std::unordered_set<int32_t> seen(history.end() - n, history.end());
    for (int32_t id : seen) {
      if (id < 0 || id >= n_vocab) continue;
      float& l = candidates_[id].logit;
      l = l > 0 ? l / config_.repeat_penalty : l * config_.repeat_penalty;
    }
  }
  dist_.clear();
  // A -inf logit (a logit bias of false, a grammar's mask) or a NaN one is no candidate; +inf
  // is the largest finite logit (it would make the softmax NaN).
  candidates_.erase(std::remove_if(candidates_.begin(), candidates_.end(),
                                   [](const Candidate& c) { return !(c.logit > -INFINITY); }),
                    candidates_.end());
  if (candidates_.empty()) return dist_;  // nothing may be sampled
  for (Candidate& c : candidates_) c.logit = std::min(c.logit, FLT_MAX);
  if (config_.temperature <= 0.0f) {
    size_t best = 0;
    for (size_t i = 1; i < candidates_.size(); ++i) {
      if (candidates_[i].logit > candidates_[best].logit) best = i;
    }
    dist_.push_back({candidates_[best].id, 1.0f});
    return dist_;
  }
  auto by_logit = [](const Candidate& a, const Candidate& b) {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
  };
  size_t n = candidates_.size();
  if (config_.top_k > 0 && static_cast<size_t>(config_.top_k) < n) {
    std::partial_sort(candidates_.begin(), candidates_.begin() + config_.top_k, candidates_.end(),
                      by_logit);
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
  for (const auto& c : candidates_) dist_.push_back({c.id, c.p});
  return dist_;
}

namespace {

// Inverse-CDF draw from probabilities summing to `total`. Rounding that leaves r past the last
// sum draws the last token of non-zero probability, never one of probability 0.
int32_t Draw(const std::vector<TokenProb>& dist, double total, double u) {
  const double r = u * total;
  double cum = 0.0;
  int32_t last = dist.front().id;
  for (const TokenProb& t : dist) {
    if (t.p <= 0.0f) continue;
    cum += t.p;
    last = t.id;
    if (r < cum) return t.id;
  }
  return last;
}

float ProbOf(const std::vector<TokenProb>& dist, int32_t id) {
  for (const TokenProb& t : dist) {
    if (t.id == id) return t.p;
  }
  return 0.0f;
}

}  // namespace

int32_t Sampler::Sample(const float* logits, int n_vocab, const std::vector<int32_t>& history) {
  const std::vector<TokenProb>& dist = Distribution(logits, n_vocab, history);
  if (dist.empty()) return kNoToken;
  if (config_.temperature <= 0.0f) return dist[0].id;
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  return Draw(dist, 1.0, uniform(rng_));
}

int32_t Sampler::SampleWithDraft(const float* logits, int n_vocab,
                                 const std::vector<int32_t>& history, int32_t draft,
                                 const std::vector<TokenProb>* q, bool* accepted) {
  const std::vector<TokenProb>& dist = Distribution(logits, n_vocab, history);
  if (dist.empty()) {
    *accepted = false;
    return kNoToken;
  }
  if (config_.temperature <= 0.0f) {
    *accepted = dist[0].id == draft;
    return dist[0].id;
  }
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  const double u_accept = uniform(rng_);
  const double u_draw = uniform(rng_);
  return AcceptOrResample(dist, draft, q, u_accept, u_draw, accepted, &residual_);
}

int32_t AcceptOrResample(const std::vector<TokenProb>& p, int32_t draft,
                         const std::vector<TokenProb>* q, double u_accept, double u_draw,
                         bool* accepted, std::vector<TokenProb>* scratch) {
  const double p_draft = ProbOf(p, draft);
  const double q_draft = q ? ProbOf(*q, draft) : 1.0;
  if (q_draft > 0.0 && u_accept < std::min(1.0, p_draft / q_draft)) {
    *accepted = true;
    return draft;
  }
  *accepted = false;
  scratch->clear();
  double total = 0.0;
  for (const TokenProb& t : p) {
    const double r = t.p - (q ? ProbOf(*q, t.id) : (t.id == draft ? 1.0 : 0.0));
    if (r > 0.0) {
      scratch->push_back({t.id, static_cast<float>(r)});
      total += static_cast<float>(r);
    }
  }
  // p <= q everywhere only when p == q, where the draft is always accepted; guard rounding.
  if (scratch->empty()) return Draw(p, 1.0, u_draw);
  return Draw(*scratch, total, u_draw);
}

}  // namespace lamina
