// The library's generation loop: prefix reuse gives exactly the cold run's tokens, stop strings
// cut the text before them (also when the streamed pieces split them), the token budget and a
// full context end generation, and the streamed pieces add up to the final text.
#include "runtime/generate.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "model/model.h"

namespace lamina {
namespace {

const std::string kModel = std::string(LAMINA_SOURCE_DIR) + "/models/lamina-counter.gguf";

class GenerateTest : public testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(kModel)) GTEST_SKIP() << kModel << " is absent";
    Result<std::unique_ptr<Model>> m = LoadModel(kModel);
    ASSERT_TRUE(m.ok()) << m.error().message;
    model_ = std::move(*m);
  }
  std::vector<int32_t> Encode(const std::string& text) {
    return model_->tokenizer().Encode(text, true, true);
  }
  GenerateOptions Greedy(int n) {
    GenerateOptions o;
    o.params.sampler.temperature = 0.0f;
    o.params.n_predict = n;
    return o;
  }
  std::unique_ptr<Model> model_;
  ThreadPool pool_{2};
};

TEST_F(GenerateTest, ReusedPrefixGivesTheColdRunsTokens) {
  SessionConfig sc;
  sc.n_ctx = 512;
  const std::vector<int32_t> a = Encode("Count from 1 to 40, one number per line.\n");
  std::vector<int32_t> ab = a;
  for (int32_t t : Encode("1\n2\n3\n")) {
    if (t != model_->tokenizer().bos()) ab.push_back(t);
  }
  Session warm(*model_, sc, pool_);
  Result<GenerateResult> first = Generate(warm, 0, a, Greedy(30));
  ASSERT_TRUE(first.ok()) << first.error().message;
  EXPECT_EQ(first->n_cached, 0);
  Result<GenerateResult> reused = Generate(warm, 0, ab, Greedy(30));
  ASSERT_TRUE(reused.ok());
  EXPECT_EQ(reused->n_cached, static_cast<int>(a.size()));
  Session cold(*model_, sc, pool_);
  Result<GenerateResult> fresh = Generate(cold, 0, ab, Greedy(30));
  ASSERT_TRUE(fresh.ok());
  EXPECT_EQ(reused->tokens, fresh->tokens);
  EXPECT_EQ(reused->text, fresh->text);
  // The same prompt again reuses all but its last token.
  Result<GenerateResult> again = Generate(warm, 0, ab, Greedy(30));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->n_cached, static_cast<int>(ab.size()) - 1);
  EXPECT_EQ(again->tokens, fresh->tokens);
}

TEST_F(GenerateTest, StopStringsCutTheTextBeforeThem) {
  SessionConfig sc;
  sc.n_ctx = 512;
  const std::vector<int32_t> prompt = Encode("Count from 1 to 40, one number per line.\n");
  Session s(*model_, sc, pool_);
  Result<GenerateResult> plain = Generate(s, 0, prompt, Greedy(60));
  ASSERT_TRUE(plain.ok());
  const std::string& text = plain->text;
  ASSERT_GT(text.size(), 30u) << text;
  EXPECT_EQ(plain->reason, StopReason::kLimit);
  for (const std::string& stop :
       std::vector<std::string>{"\n12\n", "7\n8", "\n", text.substr(text.size() / 2, 4)}) {
    GenerateOptions o = Greedy(60);
    o.params.stop = {"never appears", stop};
    std::string streamed;
    Result<GenerateResult> r = Generate(s, 0, prompt, o, [&](const std::string& piece) {
      streamed += piece;
      return true;
    });
    ASSERT_TRUE(r.ok());
    const size_t at = text.find(stop);
    ASSERT_NE(at, std::string::npos) << stop;
    EXPECT_EQ(r->text, text.substr(0, at)) << "stop " << stop;
    EXPECT_EQ(streamed, r->text);
    EXPECT_EQ(r->reason, StopReason::kStopString);
    EXPECT_EQ(r->stop_word, stop);
  }
}

TEST_F(GenerateTest, BudgetAndContextEndGeneration) {
  SessionConfig sc;
  sc.n_ctx = 40;
  const std::vector<int32_t> prompt = Encode("Count from 1 to 300, one number per line.\n");
  Session s(*model_, sc, pool_);
  Result<GenerateResult> none = Generate(s, 0, prompt, Greedy(0));
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->tokens.empty());
  EXPECT_EQ(none->reason, StopReason::kLimit);
  Result<GenerateResult> full = Generate(s, 0, prompt, Greedy(-1));
  ASSERT_TRUE(full.ok());
  EXPECT_EQ(full->reason, StopReason::kContextFull);
  EXPECT_EQ(static_cast<int>(prompt.size() + full->tokens.size()), sc.n_ctx + 1);
  Result<GenerateResult> cancelled =
      Generate(s, 0, prompt, Greedy(-1), [](const std::string&) { return false; });
  ASSERT_TRUE(cancelled.ok());
  EXPECT_EQ(cancelled->reason, StopReason::kCancelled);
  EXPECT_LE(cancelled->tokens.size(), 3u);
}

}  // namespace
}  // namespace lamina
