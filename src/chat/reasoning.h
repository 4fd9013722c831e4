// Reasoning ("thinking") in generated chat text: a `<think>...</think>` block at the start of an
// answer (or an answer that starts inside one, when the prompt opened it) is the reasoning, the
// rest the content — llama-server's "deepseek" reasoning format. Pure text in, text out, streamed
// or whole; the HTTP edge turns the parts into `reasoning_content` and `content`.
#pragma once

#include <string>
#include <string_view>

namespace lamina::chat {

// What to do with a thinking block (llama-server's --reasoning-format).
enum class ReasoningFormat {
  kNone,            // left in the content as generated
  kDeepseek,        // reasoning_content apart, the content without the block
  kDeepseekLegacy,  // reasoning_content apart, the content keeps the block as generated
};
// "none", "deepseek", "deepseek-legacy" (and "auto", llama-server's default: deepseek); false for
// any other name.
bool ReasoningFormatFromName(std::string_view name, ReasoningFormat* out);

inline constexpr std::string_view kThinkOpen = "<think>";
inline constexpr std::string_view kThinkClose = "</think>";

// Whether a rendered prompt leaves the answer inside a thinking block: it ends with the open tag
// (and white space), as templates that open the block for the model do.
bool PromptOpensThinking(std::string_view prompt);

struct ReasoningDelta {
  std::string reasoning;
  std::string content;
};

// Splits text pushed piece by piece. The reasoning loses the white space after the open tag and
// before the close tag; the content the white space after the close tag. Text that may be a tag
// or trailing white space of the reasoning is held back until it is known (Flush releases it).
// A `<think>` later in the answer is content.
class ReasoningSplitter {
 public:
  // starts_inside: the prompt opened the block (PromptOpensThinking).
  ReasoningSplitter(ReasoningFormat format, bool starts_inside);
  ReasoningDelta Push(std::string_view text);
  ReasoningDelta Flush();  // the end of the answer

 private:
  enum class State { kStart, kReasoning, kContentStart, kContent };
  ReasoningDelta Run(bool final);

  ReasoningFormat format_;
  State state_;
  bool reasoning_started_ = false;  // past the white space after the open tag
  std::string held_;                // text not yet placed
};

}  // namespace lamina::chat
