// The sampler never picks a banned token (logit -inf, or NaN): with some tokens banned it draws
// among the others under every chain setting, and with every token banned it says so
// (kNoToken), on which the generation loop ends as at an end-of-generation token, with or
// without a grammar and a drafted token, instead of emitting a banned one.
#include "runtime/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <limits>
#include <random>
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

}  // namespace
}  // namespace lamina
