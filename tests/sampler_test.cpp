// The sampler never picks a banned token (logit -inf, or NaN): with some tokens banned it draws
// among the others under every chain setting, and with every token banned it says so
// (kNoToken), on which the generation loop ends as at an end-of-generation token, with or
// without a grammar and a drafted token, instead of emitting a banned one.
#include "runtime/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "model/model.h"
#include "runtime/generate.h"
#include "runtime/grammar.h"

namespace lamina {
namespace {

// Chain settings that exercise every filter: greedy, plain draws, top-k, top-p, min-p, a hot
// temperature, the repetition penalty.
std::vector<SamplerConfig> Configs() {
  std::vector<SamplerConfig> out;
  for (float temp : {0.0f, 0.1f, 1.0f, 100.0f}) {
    for (int top_k : {0, 1, 40}) {
      for (float top_p : {0.5f, 1.0f}) {
        SamplerConfig c;
        c.temperature = temp;
        c.top_k = top_k;
        c.top_p = top_p;
        c.min_p = top_p < 1.0f ? 0.05f : 0.0f;
        c.repeat_penalty = top_k == 40 ? 1.3f : 1.0f;
        c.seed = out.size();
        out.push_back(c);
      }
    }
  }
  return out;
}

constexpr int kVocab = 64;

TEST(Sampler, EveryTokenBannedIsNoToken) {
  const std::vector<int32_t> history = {1, 2, 3};
  for (float banned : {-INFINITY, std::numeric_limits<float>::quiet_NaN()}) {
    const std::vector<float> logits(kVocab, banned);
    for (const SamplerConfig& c : Configs()) {
      Sampler s(c);
      EXPECT_EQ(s.Sample(logits.data(), kVocab, history), kNoToken) << c.temperature;
      EXPECT_TRUE(s.Distribution(logits.data(), kVocab, history).empty());
      bool accepted = true;
      EXPECT_EQ(s.SampleWithDraft(logits.data(), kVocab, history, 5, nullptr, &accepted), kNoToken);
      EXPECT_FALSE(accepted);
    }
  }
}

TEST(Sampler, NeverPicksABannedToken) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (int trial = 0; trial < 40; ++trial) {
    std::vector<float> logits(kVocab);
    for (float& l : logits) l = normal(rng);
    // Ban the likeliest tokens (the ones any filter keeps first), and a random few.
    std::vector<bool> banned(kVocab, false);
    for (int k = 0; k < 1 + trial % 8; ++k) {
      const int best = static_cast<int>(ArgMax(logits.data(), kVocab));
      banned[best] = true;
      logits[best] = -INFINITY;
    }
    for (int k = 0; k < trial % 5; ++k) {
      const int i = static_cast<int>(rng() % kVocab);
      banned[i] = true;
      logits[i] = trial % 2 ? -INFINITY : std::numeric_limits<float>::quiet_NaN();
    }
    // Sometimes a single token is left, far below where the banned ones were.
    if (trial % 10 == 9) {
      for (int i = 1; i < kVocab; ++i) {
        banned[i] = true;
        logits[i] = -INFINITY;
      }
      banned[0] = false;
      logits[0] = -1e30f;
    }
    for (const SamplerConfig& c : Configs()) {
      Sampler s(c);
      const std::vector<int32_t> history = {static_cast<int32_t>(trial % kVocab)};
      for (int draw = 0; draw < 20; ++draw) {
        const int32_t id = s.Sample(logits.data(), kVocab, history);
        ASSERT_GE(id, 0);
        ASSERT_LT(id, kVocab);
        EXPECT_FALSE(banned[id]) << "trial " << trial << " temperature " << c.temperature;
        for (const TokenProb& t : s.last_distribution()) EXPECT_FALSE(banned[t.id]);
        bool accepted = false;
        // A banned draft is never accepted (p = 0), and the resample avoids it too.
        int32_t draft = 0;
        while (draft < kVocab && !banned[draft]) ++draft;
        if (draft == kVocab) draft = 0;
        const int32_t spec =
            s.SampleWithDraft(logits.data(), kVocab, history, draft, nullptr, &accepted);
        ASSERT_GE(spec, 0);
        EXPECT_FALSE(banned[spec]);
        if (banned[draft]) EXPECT_FALSE(accepted);
      }
    }
  }
}

// +inf logits (a huge bias on a large logit) are the likeliest tokens, not a NaN softmax.
TEST(Sampler, InfiniteLogitsAreTheLikeliest) {
  std::vector<float> logits(kVocab, 0.0f);
  logits[9] = INFINITY;
  logits[3] = -INFINITY;
  for (const SamplerConfig& c : Configs()) {
    Sampler s(c);
    const int32_t id = s.Sample(logits.data(), kVocab, {});
    EXPECT_EQ(id, 9) << c.temperature;
    for (const TokenProb& t : s.last_distribution()) EXPECT_FALSE(std::isnan(t.p));
  }
}

const std::string kModel = std::string(LAMINA_SOURCE_DIR) + "/models/lamina-counter.gguf";

class GeneratorBans : public testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(kModel)) GTEST_SKIP() << kModel << " is absent";
    Result<std::unique_ptr<Model>> m = LoadModel(kModel);
    ASSERT_TRUE(m.ok()) << m.error().message;
    model_ = std::move(*m);
    n_vocab_ = model_->hparams().n_vocab;
  }
  // Biases of -inf on every token for which `ban` is true.
  GenerateParams Banning(float temperature, const std::function<bool(int)>& ban) {
    GenerateParams p;
    p.sampler.temperature = temperature;
    p.sampler.seed = 3;
    p.n_predict = 8;
    for (int i = 0; i < n_vocab_; ++i) {
      if (ban(i)) p.logit_bias.push_back({i, -INFINITY});
    }
    return p;
  }
  std::unique_ptr<Model> model_;
  int n_vocab_ = 0;
};

// Every token banned: the first step ends generation (kEos, nothing emitted); with a drafted
// token too.
TEST_F(GeneratorBans, AllBannedEndsGeneration) {
  std::vector<float> logits(n_vocab_);
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  for (float& l : logits) l = normal(rng);
  for (float temperature : {0.0f, 0.8f}) {
    for (bool drafted : {false, true}) {
      Generator gen(model_->tokenizer(), Banning(temperature, [](int) { return true; }), {1});
      bool accepted = true;
      const Generator::Step step =
          drafted ? gen.NextWithDraft(logits.data(), n_vocab_, 7, nullptr, &accepted)
                  : gen.Next(logits.data(), n_vocab_);
      EXPECT_EQ(step.token, -1);
      EXPECT_TRUE(step.done);
      EXPECT_TRUE(gen.done());
      EXPECT_EQ(gen.reason(), StopReason::kEos);
      EXPECT_TRUE(gen.generated().empty());
      if (drafted) EXPECT_FALSE(accepted);
    }
  }
}

// A grammar and biases that together leave nothing: the grammar allows digits only, the biases
// ban them all. Before, the sampler drew a banned token the grammar refused (a failed check).
TEST_F(GeneratorBans, GrammarAndBiasLeavingNothingEndGeneration) {
  Result<std::shared_ptr<const Grammar>> g = Grammar::Parse("root ::= [0-9]+");
  ASSERT_TRUE(g.ok()) << g.error().message;
  const Tokenizer& tok = model_->tokenizer();
  auto has_digit = [&](int id) {
    const std::string piece = tok.TokenToPiece(id, true);
    for (char c : piece) {
      if (c >= '0' && c <= '9') return true;
    }
    return false;
  };
  std::vector<float> logits(n_vocab_, 0.0f);
  for (float temperature : {0.0f, 0.8f}) {
    GenerateParams p = Banning(temperature, has_digit);
    p.grammar = *g;
    Generator gen(tok, p, {1});
    const Generator::Step step = gen.Next(logits.data(), n_vocab_);
    EXPECT_EQ(step.token, -1);
    EXPECT_TRUE(step.done);
    EXPECT_EQ(gen.reason(), StopReason::kEos);
  }
}

// Some tokens banned: generation goes on, and never emits one of them.
TEST_F(GeneratorBans, PartlyBannedNeverEmitsABannedToken) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  auto banned = [](int id) { return id % 3 != 0; };
  for (float temperature : {0.0f, 0.8f, 5.0f}) {
    GenerateParams p = Banning(temperature, banned);
    p.n_predict = 50;
    p.ignore_eos = true;
    Generator gen(model_->tokenizer(), p, {1});
    std::vector<float> logits(n_vocab_);
    while (!gen.done()) {
      for (float& l : logits) l = normal(rng);
      const Generator::Step step = gen.Next(logits.data(), n_vocab_);
      if (step.token >= 0) EXPECT_FALSE(banned(step.token)) << step.token;
    }
    EXPECT_EQ(gen.generated().size(), 50u);
  }
}

// ---- The chain's steps against scalar references ----

// A token and its probability, as the references produce them.
using Dist = std::map<int32_t, double>;

std::vector<float> RandomLogits(std::mt19937& rng, int n, float scale) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> logits(n);
  for (float& l : logits) l = normal(rng);
  return logits;
}

// Softmax at temperature `temp` over the tokens of `keep` (all when empty).
Dist SoftmaxOver(const std::vector<float>& logits, const std::vector<int32_t>& keep, double temp) {
  double max = -INFINITY;
  for (int32_t id : keep) max = std::max<double>(max, logits[id]);
  double sum = 0.0;
  Dist out;
  for (int32_t id : keep) {
    out[id] = std::exp((logits[id] - max) / temp);
    sum += out[id];
  }
  for (auto& [id, p] : out) p /= sum;
  return out;
}

std::vector<int32_t> AllTokens(int n) {
  std::vector<int32_t> out(n);
  for (int i = 0; i < n; ++i) out[i] = i;
  return out;
}

// Tokens by probability, most likely first (ties: the lower id).
std::vector<int32_t> ByProb(const Dist& d) {
  std::vector<int32_t> ids;
  for (const auto& [id, p] : d) ids.push_back(id);
  std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return d.at(a) > d.at(b); });
  return ids;
}

void ExpectSameDistribution(const std::vector<TokenProb>& got, const Dist& want,
                            const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  float last = 2.0f;
  for (const TokenProb& t : got) {
    ASSERT_TRUE(want.count(t.id)) << what << ": token " << t.id;
    EXPECT_NEAR(t.p, want.at(t.id), 2e-5) << what << ": token " << t.id;
    EXPECT_LE(t.p, last) << what << ": most likely first";
    last = t.p;
  }
}

// Only the step under test: no top-k, top-p, min-p; temperature 1.
SamplerConfig Plain() {
  SamplerConfig c;
  c.temperature = 1.0f;
  c.top_k = 0;
  c.top_p = 1.0f;
  c.min_p = 0.0f;
  return c;
}

// The chain before presence/frequency/typical/XTC/mirostat/DRY/samplers existed, as it was
// written: the defaults of the new settings must leave its results bit for bit.
std::vector<TokenProb> LegacyChain(const SamplerConfig& config, const float* logits, int n_vocab,
                                   const std::vector<int32_t>& history) {
  struct Candidate {
    int32_t id;
    float logit;
    float p;
  };
  std::vector<Candidate> cand(n_vocab);
  for (int i = 0; i < n_vocab; ++i) cand[i] = {i, logits[i], 0.0f};
  if (config.repeat_penalty != 1.0f && config.repeat_last_n != 0) {
    const size_t n = config.repeat_last_n < 0
                         ? history.size()
                         : std::min<size_t>(history.size(), config.repeat_last_n);
    std::set<int32_t> seen(history.end() - n, history.end());
    for (int32_t id : seen) {
      if (id < 0 || id >= n_vocab) continue;
      float& l = cand[id].logit;
      l = l > 0 ? l / config.repeat_penalty : l * config.repeat_penalty;
    }
  }
  std::vector<TokenProb> dist;
  cand.erase(std::remove_if(cand.begin(), cand.end(),
                            [](const Candidate& c) { return !(c.logit > -INFINITY); }),
             cand.end());
  if (cand.empty()) return dist;
  for (Candidate& c : cand) c.logit = std::min(c.logit, FLT_MAX);
  if (config.temperature <= 0.0f) {
    size_t best = 0;
    for (size_t i = 1; i < cand.size(); ++i) {
      if (cand[i].logit > cand[best].logit) best = i;
    }
    return {{cand[best].id, 1.0f}};
  }
  std::sort(cand.begin(), cand.end(), [](const Candidate& a, const Candidate& b) {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
  });
  if (config.top_k > 0 && static_cast<size_t>(config.top_k) < cand.size()) {
    cand.resize(config.top_k);
  }
  auto softmax = [&](float temp) {
    const float max = cand[0].logit;
    double sum = 0.0;
    for (auto& c : cand) {
      c.p = std::exp((c.logit - max) / temp);
      sum += c.p;
    }
    for (auto& c : cand) c.p = static_cast<float>(c.p / sum);
  };
  softmax(1.0f);
  if (config.top_p < 1.0f) {
    double cum = 0.0;
    size_t keep = cand.size();
    for (size_t i = 0; i < cand.size(); ++i) {
      cum += cand[i].p;
      if (cum >= config.top_p) {
        keep = i + 1;
        break;
      }
    }
    cand.resize(std::max<size_t>(1, keep));
  }
  if (config.min_p > 0.0f) {
    const float threshold = cand[0].p * config.min_p;
    size_t keep = 1;
    while (keep < cand.size() && cand[keep].p >= threshold) ++keep;
    cand.resize(keep);
  }
  softmax(config.temperature);
  for (const auto& c : cand) dist.push_back({c.id, c.p});
  return dist;
}

// The defaults of the new settings change nothing: the distribution bit for bit, and the draws
// (the same RNG stream), also with the default order given explicitly.
TEST(SamplerChain, DefaultsLeaveTheChainUnchanged) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<float> logits = RandomLogits(rng, kVocab, 1.0f + trial % 4);
    if (trial % 3 == 0) logits[trial % kVocab] = -INFINITY;
    std::vector<int32_t> history;
    for (int i = 0; i < 30; ++i) history.push_back(static_cast<int32_t>(rng() % kVocab));
    for (SamplerConfig c : Configs()) {
      c.repeat_last_n = trial % 2 ? 64 : -1;
      const std::vector<TokenProb> want = LegacyChain(c, logits.data(), kVocab, history);
      for (bool explicit_order : {false, true}) {
        SamplerConfig e = c;
        if (explicit_order) e.samplers = DefaultSamplerStages();
        Sampler s(e);
        const std::vector<TokenProb>& got = s.Distribution(logits.data(), kVocab, history);
        ASSERT_EQ(got.size(), want.size());
        for (size_t i = 0; i < got.size(); ++i) {
          EXPECT_EQ(got[i].id, want[i].id);
          EXPECT_EQ(got[i].p, want[i].p);
        }
      }
      // The draws: llama.cpp's (a 32-bit Mersenne twister seeded with the seed, the first
      // candidate whose running probability reaches the uniform) over the legacy distribution.
      Sampler s(c);
      std::mt19937 ref_rng(static_cast<uint32_t>(c.seed));
      for (int draw = 0; draw < 5; ++draw) {
        const int32_t id = s.Sample(logits.data(), kVocab, history);
        if (c.temperature <= 0.0f) {
          EXPECT_EQ(id, want[0].id);
          continue;
        }
        const double r = std::uniform_real_distribution<double>(0.0, 1.0)(ref_rng);
        double cum = 0.0;
        int32_t ref = want.back().id;
        for (const TokenProb& t : want) {
          cum += t.p;
          if (cum >= r) {
            ref = t.id;
            break;
          }
        }
        EXPECT_EQ(id, ref);
      }
    }
  }
}

// repeat_penalty, presence_penalty and frequency_penalty over the last repeat_last_n tokens:
// logit /= (or *=) repeat_penalty, then -= frequency * count + presence * (count > 0).
TEST(SamplerChain, PenaltiesMatchTheReference) {
  std::mt19937 rng(21);
  for (int trial = 0; trial < 60; ++trial) {
    const std::vector<float> logits = RandomLogits(rng, kVocab, 2.0f);
    std::vector<int32_t> history;
    for (int i = 0; i < 40; ++i) history.push_back(static_cast<int32_t>(rng() % 16));
    SamplerConfig c = Plain();
    c.repeat_penalty = trial % 3 == 0 ? 1.0f : 1.2f;
    c.presence_penalty = std::uniform_real_distribution<float>(-2.0f, 2.0f)(rng);
    c.frequency_penalty = std::uniform_real_distribution<float>(-2.0f, 2.0f)(rng);
    c.repeat_last_n = std::vector<int>{0, -1, 1, 8, 64}[trial % 5];
    std::vector<float> ref = logits;
    const size_t n =
        c.repeat_last_n < 0 ? history.size() : std::min<size_t>(history.size(), c.repeat_last_n);
    std::map<int32_t, int> count;
    for (size_t i = history.size() - n; i < history.size(); ++i) ++count[history[i]];
    for (const auto& [id, k] : count) {
      float& l = ref[id];
      l = l > 0 ? l / c.repeat_penalty : l * c.repeat_penalty;
      l -= k * c.frequency_penalty + c.presence_penalty;
    }
    Sampler s(c);
    ExpectSameDistribution(s.Distribution(logits.data(), kVocab, history),
                           SoftmaxOver(ref, AllTokens(kVocab), 1.0),
                           "trial " + std::to_string(trial));
  }
}

// Locally typical sampling: the tokens ordered by |surprise - entropy|, kept until their
// probabilities sum past typical_p.
TEST(SamplerChain, TypicalMatchesTheReference) {
  std::mt19937 rng(31);
  for (int trial = 0; trial < 60; ++trial) {
    const std::vector<float> logits = RandomLogits(rng, kVocab, 0.5f + trial % 5);
    SamplerConfig c = Plain();
    c.typical_p = std::vector<float>{0.0f, 0.2f, 0.5f, 0.9f, 0.99f, 1.0f}[trial % 6];
    c.temperature = trial % 2 ? 1.0f : 0.7f;
    const Dist p = SoftmaxOver(logits, AllTokens(kVocab), 1.0);
    std::vector<int32_t> keep = AllTokens(kVocab);
    if (c.typical_p < 1.0f) {
      double entropy = 0.0;
      for (const auto& [id, q] : p) entropy -= q * std::log(q);
      std::vector<int32_t> order = ByProb(p);
      std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
        return std::fabs(-std::log(p.at(a)) - entropy) < std::fabs(-std::log(p.at(b)) - entropy);
      });
      keep.clear();
      double cum = 0.0;
      for (int32_t id : order) {
        keep.push_back(id);
        cum += p.at(id);
        if (cum > c.typical_p) break;
      }
    }
    Sampler s(c);
    ExpectSameDistribution(s.Distribution(logits.data(), kVocab, {}),
                           SoftmaxOver(logits, keep, c.temperature),
                           "trial " + std::to_string(trial));
  }
}

// XTC at probability 1 always cuts: the tokens of probability >= threshold go, but the least
// likely of them. Above a threshold of 0.5 it never cuts.
TEST(SamplerChain, XtcMatchesTheReference) {
  std::mt19937 rng(41);
  for (int trial = 0; trial < 60; ++trial) {
    const std::vector<float> logits = RandomLogits(rng, kVocab, 1.0f + trial % 6);
    SamplerConfig c = Plain();
    c.xtc_probability = 1.0f;
    c.xtc_threshold = std::vector<float>{0.0f, 0.05f, 0.1f, 0.3f, 0.5f, 0.6f}[trial % 6];
    const Dist p = SoftmaxOver(logits, AllTokens(kVocab), 1.0);
    std::vector<int32_t> order = ByProb(p);
    size_t above = 0;
    while (above < order.size() && p.at(order[above]) >= c.xtc_threshold) ++above;
    std::vector<int32_t> keep = order;
    if (c.xtc_threshold <= 0.5f && above >= 2) keep.erase(keep.begin(), keep.begin() + above - 1);
    Sampler s(c);
    ExpectSameDistribution(s.Distribution(logits.data(), kVocab, {}), SoftmaxOver(logits, keep, 1),
                           "trial " + std::to_string(trial));
  }
}

// XTC's draws come from their own stream: a sampler's tokens depend on its seed alone, and an
// XTC that never cuts leaves the token draws as without it.
TEST(SamplerChain, XtcIsDeterministicPerSampler) {
  std::mt19937 rng(43);
  const std::vector<float> logits = RandomLogits(rng, kVocab, 2.0f);
  SamplerConfig c = Plain();
  c.xtc_probability = 0.5f;
  c.xtc_threshold = 0.05f;
  c.seed = 9;
  Sampler a(c), b(c);
  SamplerConfig never = c;
  never.xtc_threshold = 0.9f;  // above 0.5: off
  SamplerConfig off = Plain();
  off.seed = 9;
  Sampler n(never), o(off);
  std::vector<float> other = RandomLogits(rng, kVocab, 2.0f);
  for (int i = 0; i < 200; ++i) {
    const int32_t ta = a.Sample(logits.data(), kVocab, {});
    // Another sampler drawing in between changes nothing.
    Sampler noise(c);
    noise.Sample(other.data(), kVocab, {});
    EXPECT_EQ(ta, b.Sample(logits.data(), kVocab, {}));
    EXPECT_EQ(n.Sample(logits.data(), kVocab, {}), o.Sample(logits.data(), kVocab, {}));
  }
}

// Mirostat v2: softmax at the temperature, keep the tokens of surprise -log2 p <= mu (at least
// one), renormalise; after the draw mu -= eta * (-log2 p(token) - tau).
TEST(SamplerChain, MirostatV2MatchesTheReference) {
  std::mt19937 rng(51);
  for (int trial = 0; trial < 10; ++trial) {
    SamplerConfig c = Plain();
    c.mirostat = 2;
    c.mirostat_tau = std::vector<float>{0.5f, 2.0f, 3.0f, 5.0f, 8.0f}[trial % 5];
    c.mirostat_eta = trial % 2 ? 0.1f : 0.5f;
    c.temperature = trial % 3 ? 1.0f : 0.8f;
    c.top_k = 3;  // ignored under mirostat, as llama.cpp
    c.seed = trial;
    Sampler s(c);
    double mu = 2.0 * c.mirostat_tau;
    for (int step = 0; step < 30; ++step) {
      const std::vector<float> logits = RandomLogits(rng, kVocab, 1.0f + step % 4);
      const Dist p = SoftmaxOver(logits, AllTokens(kVocab), c.temperature);
      std::vector<int32_t> keep;
      for (int32_t id : ByProb(p)) {
        if (-std::log2(p.at(id)) > mu) break;
        keep.push_back(id);
      }
      if (keep.empty()) keep.push_back(ByProb(p)[0]);
      const Dist want = SoftmaxOver(logits, keep, c.temperature);
      const std::string what = "trial " + std::to_string(trial) + " step " + std::to_string(step);
      ExpectSameDistribution(s.Distribution(logits.data(), kVocab, {}), want, what);
      const int32_t id = s.Sample(logits.data(), kVocab, {});
      ASSERT_TRUE(want.count(id)) << what;
      mu -= c.mirostat_eta * (-std::log2(want.at(id)) - c.mirostat_tau);
      EXPECT_NEAR(s.mirostat_mu(), mu, 1e-3) << what;
    }
  }
}

// Mirostat v1 keeps at least one token and never a banned one.
TEST(SamplerChain, MirostatV1Samples) {
  std::mt19937 rng(53);
  SamplerConfig c = Plain();
  c.mirostat = 1;
  Sampler s(c);
  for (int step = 0; step < 50; ++step) {
    std::vector<float> logits = RandomLogits(rng, kVocab, 2.0f);
    logits[step % kVocab] = -INFINITY;
    const int32_t id = s.Sample(logits.data(), kVocab, {});
    ASSERT_GE(id, 0);
    EXPECT_NE(id, step % kVocab);
    EXPECT_TRUE(std::isfinite(s.mirostat_mu()));
  }
}

// DRY, by brute force: for every earlier position, the length of the longest run of tokens
// ending there that equals the end of the context (capped at the distance to the nearest
// sequence breaker); a token that followed a run of length >= allowed_length loses
// multiplier * base^(length - allowed_length) (the longest such run), unless it is a
// single-token breaker.
TEST(SamplerChain, DryMatchesTheReference) {
  std::mt19937 rng(61);
  for (int trial = 0; trial < 200; ++trial) {
    const std::vector<float> logits = RandomLogits(rng, kVocab, 1.0f);
    SamplerConfig c = Plain();
    c.dry_multiplier = 0.8f;
    c.dry_base = trial % 4 == 0 ? 1000.0f : 1.75f;
    c.dry_allowed_length = trial % 3 + 1;
    c.dry_penalty_last_n = std::vector<int>{-1, 10, 25, 200}[trial % 4];
    // A small alphabet repeats often; token 7 breaks sequences, and so do 8 then 9.
    std::vector<int32_t> history;
    const int len = 5 + static_cast<int>(rng() % 80);
    const int alphabet = 2 + trial % 6;
    for (int i = 0; i < len; ++i) history.push_back(static_cast<int32_t>(rng() % alphabet));
    if (trial % 2) {
      for (int i = 0; i < 2; ++i) history[rng() % len] = 7;
      const int at = static_cast<int>(rng() % (len - 1));
      history[at] = 8;
      history[at + 1] = 9;
    }
    DryBreakers breakers;
    breakers.emplace(7, std::vector<int32_t>());
    breakers.emplace(8, std::vector<int32_t>{9});
    // The window: the last dry_penalty_last_n tokens; rat(i) the i-th from its end.
    const int n = c.dry_penalty_last_n < 0 ? len : std::min(len, c.dry_penalty_last_n);
    auto rat = [&](int i) { return history[len - 1 - i]; };
    int limit = n;
    for (int i = 0; i < n; ++i) {
      if (rat(i) == 7) {
        limit = i;
        break;
      }
      if (rat(i) == 8 && i >= 1 && rat(i - 1) == 9) {
        limit = i - 1;
        break;
      }
    }
    std::vector<float> ref = logits;
    if (n > c.dry_allowed_length && limit >= c.dry_allowed_length) {
      std::map<int32_t, int> longest;
      for (int k = 1; k < n; ++k) {
        int m = 0;
        while (m + k < n && rat(m) == rat(m + k)) ++m;
        m = std::min(m, limit);
        if (m >= c.dry_allowed_length) longest[rat(k - 1)] = std::max(longest[rat(k - 1)], m);
      }
      const int max_exp = c.dry_base > 1.000001f ? 88.7228391f / std::log(c.dry_base) : 0;
      for (const auto& [id, m] : longest) {
        if (id == 7) continue;
        const int e =
            max_exp > 0 ? std::min(m - c.dry_allowed_length, max_exp) : m - c.dry_allowed_length;
        ref[id] -= c.dry_multiplier * std::pow(c.dry_base, e);
      }
    }
    Sampler s(c);
    s.SetDryBreakers(breakers);
    ExpectSameDistribution(s.Distribution(logits.data(), kVocab, history),
                           SoftmaxOver(ref, AllTokens(kVocab), 1.0),
                           "trial " + std::to_string(trial));
  }
}

// `samplers` reorders the chain: the temperature first scales the probabilities top-p sees.
TEST(SamplerChain, OrderMatchesTheReference) {
  std::mt19937 rng(71);
  for (int trial = 0; trial < 40; ++trial) {
    const std::vector<float> logits = RandomLogits(rng, kVocab, 2.0f);
    SamplerConfig c = Plain();
    c.temperature = trial % 2 ? 2.0f : 0.5f;
    c.top_p = 0.7f;
    c.samplers = {SamplerStage::kTemperature, SamplerStage::kTopP};
    std::vector<float> scaled = logits;
    for (float& l : scaled) l /= c.temperature;
    const Dist p = SoftmaxOver(scaled, AllTokens(kVocab), 1.0);
    std::vector<int32_t> keep;
    double cum = 0.0;
    for (int32_t id : ByProb(p)) {
      keep.push_back(id);
      cum += p.at(id);
      if (cum >= c.top_p) break;
    }
    Sampler s(c);
    ExpectSameDistribution(s.Distribution(logits.data(), kVocab, {}), SoftmaxOver(scaled, keep, 1),
                           "trial " + std::to_string(trial));
  }
  SamplerStage stage;
  EXPECT_TRUE(SamplerStageFromName("typ_p", &stage));
  EXPECT_EQ(stage, SamplerStage::kTypicalP);
  EXPECT_FALSE(SamplerStageFromName("top_n_sigma", &stage));
  for (SamplerStage st : DefaultSamplerStages()) {
    EXPECT_TRUE(SamplerStageFromName(SamplerStageName(st), &stage));
    EXPECT_EQ(stage, st);
  }
}

// Every new step keeps the ban: never a token of logit -inf or NaN.
TEST(SamplerChain, NewStepsNeverPickABannedToken) {
  std::mt19937 rng(81);
  std::vector<SamplerConfig> configs;
  for (int i = 0; i < 6; ++i) {
    SamplerConfig c;
    c.presence_penalty = 1.5f;
    c.frequency_penalty = -1.0f;
    c.typical_p = i % 2 ? 0.5f : 1.0f;
    c.xtc_probability = i % 3 ? 1.0f : 0.0f;
    c.xtc_threshold = 0.05f;
    c.mirostat = i == 4 ? 2 : (i == 5 ? 1 : 0);
    c.dry_multiplier = 1.0f;
    c.seed = i;
    configs.push_back(c);
  }
  for (int trial = 0; trial < 30; ++trial) {
    std::vector<float> logits = RandomLogits(rng, kVocab, 3.0f);
    std::vector<bool> banned(kVocab, false);
    for (int k = 0; k < 10; ++k) {
      const int i = static_cast<int>(rng() % kVocab);
      banned[i] = true;
      logits[i] = k % 2 ? -INFINITY : std::numeric_limits<float>::quiet_NaN();
    }
    std::vector<int32_t> history;
    for (int i = 0; i < 30; ++i) history.push_back(static_cast<int32_t>(rng() % 4));
    for (const SamplerConfig& c : configs) {
      Sampler s(c);
      for (int draw = 0; draw < 10; ++draw) {
        const int32_t id = s.Sample(logits.data(), kVocab, history);
        ASSERT_GE(id, 0);
        EXPECT_FALSE(banned[id]);
        for (const TokenProb& t : s.last_distribution()) EXPECT_FALSE(banned[t.id]);
      }
    }
  }
}

// DRY's breakers from a vocabulary: a token holding a breaker is one on its own.
TEST_F(GeneratorBans, DryBreakersFromTheTokenizer) {
  const Tokenizer& tok = model_->tokenizer();
  const DryBreakers b = MakeDryBreakers({"\n", ":"}, tok);
  for (int32_t id = 0; id < tok.vocab_size(); ++id) {
    const std::string piece = tok.TokenToPiece(id, true);
    if (piece.find('\n') != std::string::npos || piece.find(':') != std::string::npos) {
      auto range = b.equal_range(id);
      bool single = false;
      for (auto it = range.first; it != range.second; ++it) single |= it->second.empty();
      EXPECT_TRUE(single) << id;
    }
  }
}

}  // namespace
}  // namespace lamina
