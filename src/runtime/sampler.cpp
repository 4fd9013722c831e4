// Sampler implementation.
#include "runtime/sampler.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <unordered_set>

#include "tokenizer/tokenizer.h"

namespace lamina {

int32_t ArgMax(const float* logits, int n) {
  int32_t best = 0;
  for (int i = 1; i < n; ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  return best;
}

const std::vector<SamplerStage>& DefaultSamplerStages() {
  static const std::vector<SamplerStage> kDefault = {
      SamplerStage::kPenalties, SamplerStage::kDry,        SamplerStage::kTopK,
      SamplerStage::kTypicalP,  SamplerStage::kTopP,       SamplerStage::kMinP,
      SamplerStage::kXtc,       SamplerStage::kTemperature};
  return kDefault;
}

bool SamplerStageFromName(const std::string& name, SamplerStage* out) {
  static const std::pair<const char*, SamplerStage> kNames[] = {
      {"penalties", SamplerStage::kPenalties},
      {"dry", SamplerStage::kDry},
      {"top_k", SamplerStage::kTopK},
      {"typ_p", SamplerStage::kTypicalP},
      {"typical_p", SamplerStage::kTypicalP},
      {"top_p", SamplerStage::kTopP},
      {"min_p", SamplerStage::kMinP},
      {"xtc", SamplerStage::kXtc},
      {"temperature", SamplerStage::kTemperature},
      {"temp", SamplerStage::kTemperature}};
  for (const auto& [n, stage] : kNames) {
    if (name == n) {
      *out = stage;
      return true;
    }
  }
  return false;
}

const char* SamplerStageName(SamplerStage stage) {
  switch (stage) {
    case SamplerStage::kPenalties:
      return "penalties";
    case SamplerStage::kDry:
      return "dry";
    case SamplerStage::kTopK:
      return "top_k";
    case SamplerStage::kTypicalP:
      return "typ_p";
    case SamplerStage::kTopP:
      return "top_p";
    case SamplerStage::kMinP:
      return "min_p";
    case SamplerStage::kXtc:
      return "xtc";
    case SamplerStage::kTemperature:
      return "temperature";
  }
  return "?";
}

DryBreakers MakeDryBreakers(const std::vector<std::string>& breakers, const Tokenizer& tokenizer) {
  // llama.cpp's get_overlapping_token_sequences.
  DryBreakers out;
  const int32_t n_vocab = tokenizer.vocab_size();
  std::vector<std::string> pieces(n_vocab);
  for (int32_t id = 0; id < n_vocab; ++id) pieces[id] = tokenizer.TokenToPiece(id, true);
  for (std::string str : breakers) {
    if (str.size() > kMaxDryBreakerBytes) str.resize(kMaxDryBreakerBytes);
    if (str.empty()) continue;
    for (int32_t id = 0; id < n_vocab; ++id) {
      const std::string& word = pieces[id];
      if (word.find(str) != std::string::npos) {
        out.emplace(id, std::vector<int32_t>());
        continue;
      }
      size_t pos = std::string::npos;
      while ((pos = word.find(str[0], pos + 1)) != std::string::npos) {
        bool match = true;
        size_t i = 1;
        for (; i < str.size() && i + pos < word.size(); ++i) {
          if (word[pos + i] != str[i]) {
            match = false;
            break;
          }
        }
        if (!match) continue;
        std::vector<int32_t> tail = tokenizer.Encode(str.substr(i), false, false);
        if (tail.size() > kMaxDryBreakerTailTokens) tail.resize(kMaxDryBreakerTailTokens);
        bool found = false;
        auto range = out.equal_range(id);
        for (auto it = range.first; it != range.second; ++it) found |= it->second == tail;
        if (!found) out.emplace(id, std::move(tail));
      }
    }
  }
  return out;
}

Sampler::Sampler(const SamplerConfig& config, const Tokenizer* tokenizer)
    : config_(config),
      rng_(static_cast<uint32_t>(config.seed)),
      xtc_rng_(static_cast<uint32_t>(config.seed)),
      mu_(2.0f * config.mirostat_tau) {
  if (tokenizer && config_.dry_multiplier != 0.0f && !config_.dry_sequence_breakers.empty()) {
    dry_breakers_ = MakeDryBreakers(config_.dry_sequence_breakers, *tokenizer);
  }
}

// Removes the tokens that may not be sampled (logit -inf: a logit bias of false, a grammar's
// mask; or NaN); +inf becomes the largest finite logit (it would make the softmax NaN).
void Sampler::Prepare() {
  if (prepared_) return;
  prepared_ = true;
  candidates_.erase(std::remove_if(candidates_.begin(), candidates_.end(),
                                   [](const Candidate& c) { return !(c.logit > -INFINITY); }),
                    candidates_.end());
  for (Candidate& c : candidates_) c.logit = std::min(c.logit, FLT_MAX);
}

bool Sampler::ByLogit(const Candidate& a, const Candidate& b) {
  return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
}

void Sampler::EnsureSorted() {
  if (sorted_) return;
  std::sort(candidates_.begin(), candidates_.end(), ByLogit);
  sorted_ = true;
}

// Probabilities at temperature `temp` (candidates sorted, the first the largest logit).
void Sampler::Softmax(float temp) {
  const float max = candidates_[0].logit;
  double sum = 0.0;
  for (auto& c : candidates_) {
    c.p = std::exp((c.logit - max) / temp);
    sum += c.p;
  }
  for (auto& c : candidates_) c.p = static_cast<float>(c.p / sum);
}

void Sampler::ApplyPenalties(const std::vector<int32_t>& history, int n_vocab) {
  const bool repeat = config_.repeat_penalty != 1.0f;
  const bool openai = config_.frequency_penalty != 0.0f || config_.presence_penalty != 0.0f;
  if ((!repeat && !openai) || config_.repeat_last_n == 0) return;
  const size_t n = config_.repeat_last_n < 0
                       ? history.size()
                       : std::min<size_t>(history.size(), config_.repeat_last_n);
  counts_.clear();
  for (auto it = history.end() - n; it != history.end(); ++it) {
    if (*it >= 0 && *it < n_vocab) ++counts_[*it];
  }
  auto penalize = [&](float& l, int count) {
    if (repeat) l = l > 0 ? l / config_.repeat_penalty : l * config_.repeat_penalty;
    if (openai) {
      l -= static_cast<float>(count) * config_.frequency_penalty + config_.presence_penalty;
    }
  };
  if (!prepared_) {  // indexed by id
    for (const auto& [id, count] : counts_) penalize(candidates_[id].logit, count);
  } else {
    for (Candidate& c : candidates_) {
      auto it = counts_.find(c.id);
      if (it != counts_.end()) penalize(c.logit, it->second);
    }
  }
  sorted_ = false;
}

// llama.cpp's DRY (llama_sampler_dry_apply), over the last dry_penalty_last_n tokens of history.
void Sampler::ApplyDry(const std::vector<int32_t>& history, int n_vocab) {
  if (config_.dry_multiplier == 0.0f || config_.dry_base < 1.0f ||
      config_.dry_penalty_last_n == 0) {
    return;
  }
  const int window = config_.dry_penalty_last_n < 0
                         ? kMaxDryLastN
                         : std::min(config_.dry_penalty_last_n, kMaxDryLastN);
  const int last_n = static_cast<int>(std::min<size_t>(history.size(), window));
  if (last_n <= config_.dry_allowed_length) return;
  // rat(i): the i-th token from the end (0: the last).
  const int32_t* end = history.data() + history.size() - 1;
  auto rat = [end](int i) { return *(end - i); };
  // Step 1: the closest sequence breaker limits the length of a repeat.
  int rep_limit = last_n;
  for (int i = 0; i < last_n; ++i) {
    auto range = dry_breakers_.equal_range(rat(i));
    if (range.first == range.second) continue;
    int longest = -1;
    for (auto it = range.first; it != range.second; ++it) {
      const int seq_len = static_cast<int>(it->second.size());
      if (seq_len > longest && seq_len <= i) {
        bool match = true;
        for (int off = 0; off < seq_len && match; ++off)
          match = it->second[off] == rat(i - off - 1);
        if (match) longest = seq_len;
      }
    }
    if (longest >= 0) {
      rep_limit = i - longest;
      break;
    }
  }
  if (rep_limit < config_.dry_allowed_length) return;
  // Step 2: dry_repeat_[last - k] = the length of the longest suffix of the window that also
  // ends k tokens before its end (the Z-algorithm, backwards), at most rep_limit.
  dry_repeat_.assign(last_n, 0);
  const int last = last_n - 1;
  int rt = 0, lt = 0;
  for (int k = 1; k < last_n; ++k) {
    if (k > rt) {
      int n = 0;
      while (n + k < last_n && rat(n) == rat(n + k)) ++n;
      dry_repeat_[last - k] = std::min(n, rep_limit);
      if (n > 0) {
        lt = k;
        rt = k + n - 1;
      }
    } else {
      const int p = k - lt;
      const int right_part_len = rt - k + 1;
      if (dry_repeat_[last - p] < right_part_len) {
        dry_repeat_[last - k] = std::min(dry_repeat_[last - p], rep_limit);
      } else {
        int i = rt + 1;
        while (i < last_n && rat(i) == rat(i - k)) ++i;
        dry_repeat_[last - k] = std::min(i - k, rep_limit);
        lt = k;
        rt = i - 1;
      }
    }
  }
  // Step 3: the longest repeat each next token would extend.
  counts_.clear();
  for (int i = 0; i < last_n - 1; ++i) {
    const int len = dry_repeat_[i];
    if (len < config_.dry_allowed_length) continue;
    const int32_t token = rat(last_n - 2 - i);
    if (token < 0 || token >= n_vocab) continue;
    auto [it, added] = counts_.emplace(token, len);
    if (!added) it->second = std::max(it->second, len);
  }
  // Step 4: the penalties; the exponent is clamped so that the power stays a finite float.
  constexpr float kFloatMaxLog = 88.7228391f;
  int max_exponent = 0;
  if (config_.dry_base > 1.000001f) max_exponent = kFloatMaxLog / std::log(config_.dry_base);
  auto penalize = [&](Candidate& c, int len) {
    auto range = dry_breakers_.equal_range(c.id);
    for (auto it = range.first; it != range.second; ++it) {
      if (it->second.empty()) return;  // a single-token breaker
    }
    int exp = len - config_.dry_allowed_length;
    if (max_exponent > 0 && exp > max_exponent) exp = max_exponent;
    c.logit -= config_.dry_multiplier * std::pow(config_.dry_base, exp);
  };
  if (!prepared_) {
    for (const auto& [id, len] : counts_) penalize(candidates_[id], len);
  } else {
    for (Candidate& c : candidates_) {
      auto it = counts_.find(c.id);
      if (it != counts_.end()) penalize(c, it->second);
    }
  }
  sorted_ = false;
}

void Sampler::TopK() {
  if (config_.top_k > 0 && static_cast<size_t>(config_.top_k) < candidates_.size()) {
    if (!sorted_) {
      std::partial_sort(candidates_.begin(), candidates_.begin() + config_.top_k, candidates_.end(),
                        ByLogit);
      sorted_ = true;
    }
    candidates_.resize(config_.top_k);
  }
  EnsureSorted();
}

// llama.cpp's typical sampling: keep the tokens whose surprise is closest to the entropy until
// their probabilities pass typical_p.
void Sampler::TypicalP() {
  if (config_.typical_p >= 1.0f) return;
  EnsureSorted();
  Softmax(1.0f);
  float entropy = 0.0f;
  for (const Candidate& c : candidates_) {
    if (c.p > 0.0f) entropy += -c.p * std::log(c.p);
  }
  std::vector<std::pair<float, size_t>> shifted(candidates_.size());
  for (size_t i = 0; i < candidates_.size(); ++i) {
    shifted[i] = {std::fabs(-std::log(candidates_[i].p) - entropy), i};
  }
  std::stable_sort(shifted.begin(), shifted.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  float cum = 0.0f;
  size_t keep = shifted.size();
  for (size_t i = 0; i < shifted.size(); ++i) {
    cum += candidates_[shifted[i].second].p;
    if (cum > config_.typical_p) {
      keep = i + 1;
      break;
    }
  }
  std::vector<Candidate> kept(keep);
  for (size_t i = 0; i < keep; ++i) kept[i] = candidates_[shifted[i].second];
  candidates_.swap(kept);
  sorted_ = false;
  EnsureSorted();
}

// llama.cpp's top-p and min-p, float sums and all, so that a seed draws what it draws there.
void Sampler::TopP() {
  if (config_.top_p >= 1.0f) return;
  EnsureSorted();
  const float max = candidates_[0].logit;
  float sum = 0.0f;
  for (auto& c : candidates_) {
    c.p = std::exp(c.logit - max);
    sum += c.p;
  }
  float cum = 0.0f;
  size_t keep = candidates_.size();
  for (size_t i = 0; i < candidates_.size(); ++i) {
    cum += candidates_[i].p / sum;
    if (cum >= config_.top_p) {
      keep = i + 1;
      break;
    }
  }
  candidates_.resize(std::max<size_t>(1, keep));
}

void Sampler::MinP() {
  if (config_.min_p <= 0.0f) return;
  EnsureSorted();
  // p_i >= min_p * p_max, on the logits.
  const float min_logit = candidates_[0].logit + std::log(config_.min_p);
  size_t keep = 1;
  while (keep < candidates_.size() && candidates_[keep].logit >= min_logit) ++keep;
  candidates_.resize(keep);
}

// llama.cpp's XTC: with probability xtc_probability, drop the tokens of probability >=
// xtc_threshold but the least likely of them.
void Sampler::Xtc() {
  if (config_.xtc_probability <= 0.0f || config_.xtc_threshold > 0.5f || candidates_.size() < 2) {
    return;
  }
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  if (uniform(xtc_rng_) > config_.xtc_probability) return;
  EnsureSorted();
  Softmax(1.0f);
  size_t last = 0;
  for (size_t i = 0; i < candidates_.size(); ++i) {
    if (candidates_[i].p >= config_.xtc_threshold) {
      last = i;
    } else {
      break;
    }
  }
  if (last > 0) candidates_.erase(candidates_.begin(), candidates_.begin() + last);
}

// llama.cpp's mirostat (v1, with m = 100) and mirostat v2 truncation at mu_; the update of mu_
// after the draw is UpdateMu.
void Sampler::Mirostat(int n_vocab) {
  EnsureSorted();
  Softmax(config_.temperature);
  if (config_.mirostat == 1) {
    constexpr int kM = 100;
    float sum_ti_bi = 0.0f, sum_ti_sq = 0.0f;
    for (size_t i = 0; i < size_t{kM - 1} && i + 1 < candidates_.size(); ++i) {
      const float t_i = std::log(static_cast<float>(i + 2) / static_cast<float>(i + 1));
      const float b_i = std::log(candidates_[i].p / candidates_[i + 1].p);
      sum_ti_bi += t_i * b_i;
      sum_ti_sq += t_i * t_i;
    }
    const float s_hat = sum_ti_bi / sum_ti_sq;
    const float epsilon_hat = s_hat - 1;
    const float k = std::pow((epsilon_hat * std::pow(2.0f, mu_)) /
                                 (1 - std::pow(static_cast<float>(n_vocab), -epsilon_hat)),
                             1 / s_hat);
    // NaN (one candidate, or equal probabilities) keeps one.
    const size_t keep = k >= 1.0f ? static_cast<size_t>(std::min(k, 1e9f)) : 1;
    if (keep < candidates_.size()) candidates_.resize(keep);
  } else {
    size_t keep = 0;
    while (keep < candidates_.size() && !(-std::log2(candidates_[keep].p) > mu_)) ++keep;
    candidates_.resize(std::max<size_t>(1, keep));
  }
  Softmax(config_.temperature);
}

void Sampler::UpdateMu(int32_t id) {
  if (config_.mirostat == 0 || config_.temperature <= 0.0f) return;
  float p = 0.0f;
  for (const TokenProb& t : dist_) {
    if (t.id == id) p = t.p;
  }
  const float surprise = -std::log2(p);
  mu_ -= config_.mirostat_eta * (surprise - config_.mirostat_tau);
}

const std::vector<TokenProb>& Sampler::Distribution(const float* logits, int n_vocab,
                                                    const std::vector<int32_t>& history) {
  candidates_.resize(n_vocab);
  for (int i = 0; i < n_vocab; ++i) candidates_[i] = {i, logits[i], 0.0f};
  prepared_ = false;
  sorted_ = false;
  dist_.clear();
  const std::vector<SamplerStage>& order =
      config_.samplers.empty() ? DefaultSamplerStages() : config_.samplers;
  const bool greedy = config_.temperature <= 0.0f;
  if (greedy || config_.mirostat != 0) {
    // Greedy: the arg max after the penalties and DRY. Mirostat (llama.cpp's chain of
    // temperature and mirostat alone) takes no other step.
    if (greedy) {
      for (SamplerStage stage : order) {
        if (stage == SamplerStage::kPenalties) ApplyPenalties(history, n_vocab);
        if (stage == SamplerStage::kDry) ApplyDry(history, n_vocab);
      }
    }
    Prepare();
    if (candidates_.empty()) return dist_;  // nothing may be sampled
    if (greedy) {
      size_t best = 0;
      for (size_t i = 1; i < candidates_.size(); ++i) {
        if (candidates_[i].logit > candidates_[best].logit) best = i;
      }
      dist_.push_back({candidates_[best].id, 1.0f});
      return dist_;
    }
    Mirostat(n_vocab);
    for (const auto& c : candidates_) dist_.push_back({c.id, c.p});
    return dist_;
  }
  // The temperature scales the final softmax when it is the last step (the default), else the
  // logits where it stands.
  float final_temp = 1.0f;
  for (size_t i = 0; i < order.size(); ++i) {
    const SamplerStage stage = order[i];
    if (stage == SamplerStage::kPenalties) {
      ApplyPenalties(history, n_vocab);
      continue;
    }
    if (stage == SamplerStage::kDry) {
      ApplyDry(history, n_vocab);
      continue;
    }
    if (!prepared_) {
      Prepare();
      if (candidates_.empty()) return dist_;
    }
    switch (stage) {
      case SamplerStage::kTopK:
        TopK();
        break;
      case SamplerStage::kTypicalP:
        TypicalP();
        break;
      case SamplerStage::kTopP:
        TopP();
        break;
      case SamplerStage::kMinP:
        MinP();
        break;
      case SamplerStage::kXtc:
        Xtc();
        break;
      case SamplerStage::kTemperature:
        if (i + 1 == order.size()) {
          final_temp = config_.temperature;
        } else {
          for (Candidate& c : candidates_) c.logit /= config_.temperature;
        }
        break;
      default:
        break;
    }
  }
  Prepare();
  if (candidates_.empty()) return dist_;
  EnsureSorted();
  Softmax(final_temp);
  final_temp_ = final_temp;
  for (const auto& c : candidates_) dist_.push_back({c.id, c.p});
  return dist_;
}

namespace {

// Inverse-CDF draw from probabilities summing to `total`. Rounding that leaves r past the last
// sum draws the last token of non-zero probability, never one of probability 0.
int32_t DrawInverseCdf(const std::vector<TokenProb>& dist, double total, double u) {
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
  return Draw(dist);
}

int32_t Sampler::Draw(const std::vector<TokenProb>& dist) {
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  const double u = uniform(rng_);
  int32_t id;
  if (config_.mirostat != 0) {
    id = DrawInverseCdf(dist, 1.0, u);
  } else {
    // llama.cpp's dist sampler: weights exp(l_i / t - l_0 / t) of the sorted candidates, the
    // first whose running sum reaches u times their total.
    // (A logit near FLT_MAX over a small temperature overflows: then the differences are scaled.)
    const float first = candidates_[0].logit / final_temp_;
    const bool overflow = !std::isfinite(first);
    double total = 0.0;
    for (Candidate& c : candidates_) {
      c.p = overflow ? std::exp((c.logit - candidates_[0].logit) / final_temp_)
                     : std::exp(c.logit / final_temp_ - first);
      total += c.p;
    }
    const double target = total * u;
    double run = 0.0;
    id = candidates_.back().id;
    for (const Candidate& c : candidates_) {
      run += c.p;
      if (run >= target && c.p > 0.0f) {
        id = c.id;
        break;
      }
    }
  }
  UpdateMu(id);
  return id;
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
  if (q == nullptr) {
    // A deterministic draft: the token is drawn exactly as Sample draws it (one uniform, the
    // same chain), accepted when it is the draft — exact for a one-hot q, and the same tokens
    // as decoding without a draft for the same seed.
    const int32_t id = Draw(dist);
    *accepted = id == draft;
    return id;
  }
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  const double u_accept = uniform(rng_);
  const double u_draw = uniform(rng_);
  const int32_t id = AcceptOrResample(dist, draft, q, u_accept, u_draw, accepted, &residual_);
  UpdateMu(id);
  return id;
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
  if (scratch->empty()) return DrawInverseCdf(p, 1.0, u_draw);
  return DrawInverseCdf(*scratch, total, u_draw);
}

}  // namespace lamina
