// A chat answer's reasoning, content and harmony calls, whole or streamed.
#include "chat/answer.h"

#include <utility>

namespace lamina::chat {

namespace {

AnswerParts FromHarmony(HarmonyParse p) {
  return {std::move(p.reasoning), std::move(p.content), std::move(p.calls)};
}

AnswerParts FromThink(ReasoningDelta d) {
  return {std::move(d.reasoning), std::move(d.content), {}};
}

}  // namespace

AnswerSplitter::AnswerSplitter(const AnswerFormat& format)
    : harmony_(format.harmony),
      think_(format.harmony ? ReasoningFormat::kNone : format.reasoning_format,
             !format.harmony && format.thinking_at_start) {}

AnswerParts AnswerSplitter::Push(std::string_view text) {
  if (harmony_) return FromHarmony(harmony_stream_.Push(text));
  return FromThink(think_.Push(text));
}

AnswerParts AnswerSplitter::Flush() {
  if (harmony_) return FromHarmony(harmony_stream_.Flush());
  return FromThink(think_.Flush());
}

AnswerParts SplitAnswer(const AnswerFormat& format, std::string_view text) {
  if (format.harmony) return FromHarmony(ParseHarmony(text));
  AnswerSplitter s(format);
  AnswerParts a = s.Push(text);
  AnswerParts b = s.Flush();
  return {a.reasoning + b.reasoning, a.content + b.content, {}};
}

}  // namespace lamina::chat
