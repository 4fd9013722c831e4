// A chat answer's parts, whatever the template: the one place that decides how generated text
// splits into reasoning, content and (for gpt-oss's harmony) tool calls, whole or streamed. A
// harmony answer (ChatSetup::harmony) goes through chat/harmony.h; any other through the `<think>`
// splitter of chat/reasoning.h, its tool calls left in the content for chat/tool_calls.h. Every
// route of the server and the CLI read answers through it, so each gets the same parts.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "chat/harmony.h"
#include "chat/reasoning.h"
#include "chat/tool_calls.h"

namespace lamina::chat {

// How an answer is written.
struct AnswerFormat {
  bool harmony = false;  // gpt-oss's channels (reasoning_format and thinking_at_start unused)
  ReasoningFormat reasoning_format = ReasoningFormat::kNone;  // a `<think>` block
  bool thinking_at_start = false;  // the prompt opened the block (PromptOpensThinking)
};

struct AnswerParts {
  std::string reasoning;
  std::string content;
  std::vector<ToolCall> calls;  // harmony's calls (empty for other formats)
};

// Streamed: Push each generated piece, then Flush at the end; each returns what is new. The
// pieces of all calls joined are SplitAnswer of the whole text.
class AnswerSplitter {
 public:
  explicit AnswerSplitter(const AnswerFormat& format);
  AnswerParts Push(std::string_view text);
  AnswerParts Flush();

 private:
  bool harmony_;
  HarmonyStream harmony_stream_;
  ReasoningSplitter think_;
};

// The parts of a whole answer.
AnswerParts SplitAnswer(const AnswerFormat& format, std::string_view text);

}  // namespace lamina::chat
