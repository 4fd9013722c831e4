// gpt-oss's harmony answers on every route: chat::AnswerSplitter (the one place that splits an
// answer into reasoning, content and calls) streamed in any pieces adds up to the whole, and the
// Anthropic, Responses and Ollama formatters (tools/server/protocols.cpp, compiled in) map the
// analysis channel, the final channel and calls to their own shapes, streamed parts joined equal
// to the whole answer's, with no harmony marker left in the text.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "chat/answer.h"
#include "route_parts.h"
#include "server/protocols.h"

namespace lamina {
namespace {

using chat::AnswerFormat;
using chat::AnswerParts;
using testing_util::RouteKind;
using testing_util::RouteParts;

struct Answer {
  std::string text;  // generated after the prompt's `<|start|>assistant`
  RouteParts parts;  // what every route returns (calls: compact JSON arguments)
};

std::vector<Answer> Answers() {
  return {
      {"<|channel|>analysis<|message|>User greets.<|end|><|start|>assistant<|channel|>final"
       "<|message|>Hello there.<|return|>",
       {"User greets.", "Hello there.", {}}},
      {"<|channel|>analysis<|message|>Need the time.<|end|><|start|>assistant<|channel|>"
       "commentary to=functions.get_time <|constrain|>json<|message|>{\"tz\": \"UTC\"}<|call|>",
       {"Need the time.", "", {{"get_time", "{\"tz\":\"UTC\"}"}}}},
      {"<|channel|>final<|message|>Just this.", {"", "Just this.", {}}},
  };
}

AnswerParts Join(const AnswerFormat& f, const std::string& text, size_t piece) {
  chat::AnswerSplitter s(f);
  AnswerParts sum;
  auto add = [&](AnswerParts d) {
    sum.reasoning += d.reasoning;
    sum.content += d.content;
    for (chat::ToolCall& c : d.calls) sum.calls.push_back(std::move(c));
  };
  for (size_t i = 0; i < text.size(); i += piece) add(s.Push(text.substr(i, piece)));
  add(s.Flush());
  return sum;
}

TEST(AnswerSplitter, HarmonyStreamedInAnyPiecesIsTheWhole) {
  const AnswerFormat harmony{true, chat::ReasoningFormat::kDeepseek, false};
  for (const Answer& a : Answers()) {
    const AnswerParts whole = chat::SplitAnswer(harmony, a.text);
    EXPECT_EQ(whole.reasoning, a.parts.reasoning) << a.text;
    EXPECT_EQ(whole.content, a.parts.content) << a.text;
    ASSERT_EQ(whole.calls.size(), a.parts.calls.size()) << a.text;
    for (size_t piece : {1, 2, 5, 64}) {
      const AnswerParts s = Join(harmony, a.text, piece);
      EXPECT_EQ(s.reasoning, whole.reasoning) << piece;
      EXPECT_EQ(s.content, whole.content) << piece;
      ASSERT_EQ(s.calls.size(), whole.calls.size()) << piece;
      for (size_t c = 0; c < s.calls.size(); ++c) {
        EXPECT_EQ(s.calls[c].name, whole.calls[c].name);
        EXPECT_EQ(s.calls[c].arguments, whole.calls[c].arguments);
      }
    }
  }
}

TEST(AnswerSplitter, ThinkBlocksAsBefore) {
  const std::string text = "<think>\nHmm.\n</think>\n\nYes.";
  const AnswerFormat think{false, chat::ReasoningFormat::kDeepseek, false};
  const AnswerParts whole = chat::SplitAnswer(think, text);
  EXPECT_EQ(whole.reasoning, "Hmm.");
  EXPECT_EQ(whole.content, "Yes.");
  EXPECT_TRUE(whole.calls.empty());
  for (size_t piece : {1, 3}) {
    const AnswerParts s = Join(think, text, piece);
    EXPECT_EQ(s.reasoning, "Hmm.");
    EXPECT_EQ(s.content, "Yes.");
  }
  // Without a reasoning format the text is the content; harmony's markers outside harmony too.
  EXPECT_EQ(chat::SplitAnswer({}, text).content, text);
  const std::string h = Answers()[0].text;
  EXPECT_EQ(chat::SplitAnswer({}, h).content, h);
}

std::unique_ptr<cli::protocols::Formatter> Make(RouteKind k) {
  cli::protocols::AnswerInfo info;
  info.model = "m";
  info.parse_tool_calls = true;
  info.tool_names = {"get_time"};
  info.reasoning_format = chat::ReasoningFormat::kDeepseek;
  info.harmony = true;
  switch (k) {
    case RouteKind::kAnthropic:
      return cli::protocols::MakeAnthropicFormatter(info);
    case RouteKind::kResponses:
      return cli::protocols::MakeResponsesFormatter(info, nlohmann::json::object());
    case RouteKind::kOllamaChat:
      return cli::protocols::MakeOllamaFormatter(info, false);
    case RouteKind::kOllamaGenerate:
      return cli::protocols::MakeOllamaFormatter(info, true);
  }
  return nullptr;
}

TEST(HarmonyRoutes, EveryProtocolMapsTheChannelsWholeAndStreamed) {
  serve::Event done;
  done.kind = serve::Event::Kind::kDone;
  done.reason = StopReason::kEos;
  for (RouteKind k : {RouteKind::kAnthropic, RouteKind::kResponses, RouteKind::kOllamaChat,
                      RouteKind::kOllamaGenerate}) {
    for (const Answer& a : Answers()) {
      RouteParts want = a.parts;
      if (k == RouteKind::kOllamaGenerate) want.calls.clear();  // /api/generate has no calls
      const std::string where = "route " + std::to_string(static_cast<int>(k)) + ": " + a.text;
      const RouteParts whole = testing_util::WholeParts(k, Make(k)->Whole(a.text, done));
      EXPECT_EQ(whole, want) << where << "\n" << testing_util::DumpParts(whole);
      for (size_t piece : {1, 4, 1000}) {
        auto f = Make(k);
        std::string stream = f->Start();
        for (size_t i = 0; i < a.text.size(); i += piece)
          stream += f->Text(a.text.substr(i, piece));
        stream += f->Done(done);
        const RouteParts streamed = testing_util::StreamParts(k, stream);
        EXPECT_EQ(streamed, whole) << where << " piece " << piece << "\n" << stream;
        EXPECT_FALSE(testing_util::ShowsMarkers(streamed)) << stream;
      }
    }
  }
}

}  // namespace
}  // namespace lamina
