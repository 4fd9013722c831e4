// The library's generation loop: prefix reuse gives exactly the cold run's tokens, stop strings
// cut the text before them (also when the streamed pieces split them), the token budget and a
// full context end generation, the streamed pieces add up to the final text, and a thinking
// budget forces the close tag after exactly its number of tokens.
#include "engine/generate.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "model/model.h"
#include "runtime/generate.h"

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
  Result<GenerateResult> first = engine::Generate(warm, 0, a, Greedy(30));
  ASSERT_TRUE(first.ok()) << first.error().message;
  EXPECT_EQ(first->n_cached, 0);
  Result<GenerateResult> reused = engine::Generate(warm, 0, ab, Greedy(30));
  ASSERT_TRUE(reused.ok());
  EXPECT_EQ(reused->n_cached, static_cast<int>(a.size()));
  Session cold(*model_, sc, pool_);
  Result<GenerateResult> fresh = engine::Generate(cold, 0, ab, Greedy(30));
  ASSERT_TRUE(fresh.ok());
  EXPECT_EQ(reused->tokens, fresh->tokens);
  EXPECT_EQ(reused->text, fresh->text);
  // The same prompt again reuses all but its last token.
  Result<GenerateResult> again = engine::Generate(warm, 0, ab, Greedy(30));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->n_cached, static_cast<int>(ab.size()) - 1);
  EXPECT_EQ(again->tokens, fresh->tokens);
}

TEST_F(GenerateTest, StopStringsCutTheTextBeforeThem) {
  SessionConfig sc;
  sc.n_ctx = 512;
  // The model counts when asked in its chat format (a bare prompt is not what it was trained on).
  const std::vector<int32_t> prompt = Encode(
      "<|im_start|>user\nCount from 1 to 40, one number per line.<|im_end|>\n"
      "<|im_start|>assistant\n");
  Session s(*model_, sc, pool_);
  Result<GenerateResult> plain = engine::Generate(s, 0, prompt, Greedy(60));
  ASSERT_TRUE(plain.ok());
  const std::string& text = plain->text;
  ASSERT_GT(text.size(), 30u) << text;
  EXPECT_EQ(plain->reason, StopReason::kLimit);
  for (const std::string& stop :
       std::vector<std::string>{"\n12\n", "7\n8", "\n", text.substr(text.size() / 2, 4)}) {
    GenerateOptions o = Greedy(60);
    o.params.stop = {"never appears", stop};
    std::string streamed;
    Result<GenerateResult> r = engine::Generate(s, 0, prompt, o, [&](const std::string& piece) {
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
  Result<GenerateResult> none = engine::Generate(s, 0, prompt, Greedy(0));
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->tokens.empty());
  EXPECT_EQ(none->reason, StopReason::kLimit);
  Result<GenerateResult> full = engine::Generate(s, 0, prompt, Greedy(-1));
  ASSERT_TRUE(full.ok());
  EXPECT_EQ(full->reason, StopReason::kContextFull);
  EXPECT_EQ(static_cast<int>(prompt.size() + full->tokens.size()), sc.n_ctx + 1);
  Result<GenerateResult> cancelled =
      engine::Generate(s, 0, prompt, Greedy(-1), [](const std::string&) { return false; });
  ASSERT_TRUE(cancelled.ok());
  EXPECT_EQ(cancelled->reason, StopReason::kCancelled);
  EXPECT_LE(cancelled->tokens.size(), 3u);
}

// The thinking budget, to the token: a generator that would think forever (the logits always
// pick one token) gets exactly `budget` tokens inside the block, then the close tag's tokens, then
// content; with the block opened by the answer itself too; budget 0 closes it at once.
TEST_F(GenerateTest, ThinkingBudgetForcesTheCloseTagAfterExactlyItsTokens) {
  const Tokenizer& tok = model_->tokenizer();
  const int n_vocab = tok.vocab_size();
  const std::vector<int32_t> close = tok.Encode("</think>", false, true);
  const std::vector<int32_t> open = tok.Encode("<think>", false, true);
  const int32_t word = tok.Encode("Lily", false, false).back();
  ASSERT_FALSE(close.empty());
  // Plays `script` (token by token), then `word` for ever.
  auto run = [&](int budget, bool at_start, const std::vector<int32_t>& script) {
    GenerateParams p;
    p.sampler.temperature = 0.0f;
    p.n_predict = 24;
    p.reasoning_budget = budget;
    p.thinking_at_start = at_start;
    p.think_close = close;
    Generator gen(tok, p, Encode("Hi"));
    std::vector<float> logits(n_vocab, 0.0f);
    std::vector<int32_t> out;
    for (size_t step = 0; !gen.done(); ++step) {
      const int32_t want = step < script.size() ? script[step] : word;
      std::fill(logits.begin(), logits.end(), 0.0f);
      logits[want] = 10.0f;
      Generator::Step s = gen.Next(logits.data(), n_vocab);
      if (s.token >= 0) out.push_back(s.token);
    }
    return out;
  };
  auto expect = [&](std::vector<int32_t> head, int n_word, bool closed) {
    for (int i = 0; i < n_word; ++i) head.push_back(word);
    if (closed) head.insert(head.end(), close.begin(), close.end());
    while (head.size() < 24) head.push_back(word);
    return head;
  };
  EXPECT_EQ(run(3, true, {}), expect({}, 3, true));
  EXPECT_EQ(run(0, true, {}), expect({}, 0, true));
  EXPECT_EQ(run(2, false, open), expect(open, 2, true));
  EXPECT_EQ(run(-1, true, {}), expect({}, 24, false));  // no budget: nothing forced
  EXPECT_EQ(run(2, false, {}), expect({}, 24, false));  // no block: nothing forced
  // The model's own close tag within the budget ends the block: nothing is forced after it.
  std::vector<int32_t> own = {word};
  own.insert(own.end(), close.begin(), close.end());
  EXPECT_EQ(run(5, true, own), expect(own, 0, false));
}

}  // namespace
}  // namespace lamina
