// chat::ReasoningSplitter: the thinking block apart from the content, whole or streamed in any
// pieces (the same parts either way), from a block the answer opens or the prompt opened, in
// llama-server's deepseek, deepseek-legacy and none formats.
#include "chat/reasoning.h"

#include <gtest/gtest.h>

#include <string>

namespace lamina::chat {
namespace {

ReasoningDelta Whole(ReasoningFormat f, bool inside, const std::string& text) {
  ReasoningSplitter s(f, inside);
  ReasoningDelta a = s.Push(text), b = s.Flush();
  return {a.reasoning + b.reasoning, a.content + b.content};
}

// Pushed in pieces of `n` bytes.
ReasoningDelta Pieces(ReasoningFormat f, bool inside, const std::string& text, size_t n) {
  ReasoningSplitter s(f, inside);
  ReasoningDelta out;
  for (size_t at = 0; at < text.size(); at += n) {
    ReasoningDelta d = s.Push(text.substr(at, n));
    out.reasoning += d.reasoning;
    out.content += d.content;
  }
  ReasoningDelta d = s.Flush();
  return {out.reasoning + d.reasoning, out.content + d.content};
}

struct Case {
  ReasoningFormat format;
  bool inside;
  std::string text, reasoning, content;
};

TEST(ReasoningSplitter, WholeAndStreamedGiveTheSameParts) {
  const ReasoningFormat kDs = ReasoningFormat::kDeepseek;
  const ReasoningFormat kLegacy = ReasoningFormat::kDeepseekLegacy;
  const Case cases[] = {
      {kDs, false, "<think>\nLet me count.\n</think>\n\n1\n2", "Let me count.", "1\n2"},
      {kDs, false, "  <think>a b</think>c", "a b", "c"},
      {kDs, true, "\nplan  \n</think>\n\nanswer", "plan", "answer"},
      {kDs, true, "still thinking when cut", "still thinking when cut", ""},
      {kDs, false, "no block <think>x</think>", "", "no block <think>x</think>"},
      {kDs, false, "<thin", "", "<thin"},
      {kDs, false, "<think>\n\n</think>\n\nok", "", "ok"},
      {kDs, false, "</think>", "", "</think>"},
      {kDs, true, "a</thin", "a</thin", ""},
      {kLegacy, false, "<think>r</think>\nc", "r", "<think>r</think>\nc"},
      {kLegacy, true, "r\n</think>c", "r", "r\n</think>c"},
      {ReasoningFormat::kNone, false, "<think>r</think>c", "", "<think>r</think>c"},
  };
  for (const Case& c : cases) {
    const ReasoningDelta whole = Whole(c.format, c.inside, c.text);
    EXPECT_EQ(whole.reasoning, c.reasoning) << c.text;
    EXPECT_EQ(whole.content, c.content) << c.text;
    for (size_t n : {1, 2, 3, 5, 8}) {
      const ReasoningDelta streamed = Pieces(c.format, c.inside, c.text, n);
      EXPECT_EQ(streamed.reasoning, c.reasoning) << c.text << " in pieces of " << n;
      EXPECT_EQ(streamed.content, c.content) << c.text << " in pieces of " << n;
    }
  }
}

TEST(ReasoningSplitter, NothingIsHeldBackLongerThanATag) {
  ReasoningSplitter s(ReasoningFormat::kDeepseek, true);
  EXPECT_EQ(s.Push("one two").reasoning, "one two");
  EXPECT_EQ(s.Push(" three</th").reasoning, " three");
  ReasoningDelta d = s.Push("ink>\nfour");
  EXPECT_EQ(d.reasoning, "");
  EXPECT_EQ(d.content, "four");
}

TEST(ReasoningPrompt, OpenTagAtTheEndOfThePrompt) {
  EXPECT_TRUE(PromptOpensThinking("<|im_start|>assistant\n<think>\n"));
  EXPECT_TRUE(PromptOpensThinking("x<think>"));
  EXPECT_FALSE(PromptOpensThinking("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  EXPECT_FALSE(PromptOpensThinking("<|im_start|>assistant\n"));
}

TEST(ReasoningFormatNames, LlamaServersNames) {
  ReasoningFormat f;
  EXPECT_TRUE(ReasoningFormatFromName("auto", &f));
  EXPECT_EQ(f, ReasoningFormat::kDeepseek);
  EXPECT_TRUE(ReasoningFormatFromName("deepseek-legacy", &f));
  EXPECT_EQ(f, ReasoningFormat::kDeepseekLegacy);
  EXPECT_TRUE(ReasoningFormatFromName("none", &f));
  EXPECT_EQ(f, ReasoningFormat::kNone);
  EXPECT_FALSE(ReasoningFormatFromName("deepseek2", &f));
}

}  // namespace
}  // namespace lamina::chat
