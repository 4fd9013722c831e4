// gpt-oss's "harmony" output in generated chat text: after the prompt's `<|start|>assistant`
// the model writes messages `[<|start|>assistant][ to=RECIPIENT]<|channel|>CHANNEL[ to=RECIPIENT]
// [ [<|constrain|>]TYPE]<|message|>BODY` ended by `<|end|>`, `<|return|>` or `<|call|>`. The
// `analysis` channel is the reasoning; a message to `functions.NAME` is a tool call whose body
// is the JSON arguments; `final` (and `commentary` without a recipient, a preamble the user
// sees) is the content. Pure text in, text out, whole or streamed; the HTTP edge turns the parts
// into `reasoning_content`, `content` and `tool_calls`. Generated text is untrusted: text outside
// the message structure stays content, and a call's arguments are kept as generated (a call
// whose arguments are not one JSON value stays content, as tool_calls.h keeps a malformed call).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "chat/tool_calls.h"

namespace lamina::chat {

// The special-token texts of the format.
inline constexpr std::string_view kHarmonyStart = "<|start|>";
inline constexpr std::string_view kHarmonyChannel = "<|channel|>";
inline constexpr std::string_view kHarmonyMessage = "<|message|>";
inline constexpr std::string_view kHarmonyConstrain = "<|constrain|>";
inline constexpr std::string_view kHarmonyEnd = "<|end|>";
inline constexpr std::string_view kHarmonyReturn = "<|return|>";
inline constexpr std::string_view kHarmonyCall = "<|call|>";

// Whether a chat template text renders harmony (its channel and message markers).
bool IsHarmonyTemplate(std::string_view template_text);

struct HarmonyParse {
  std::string reasoning;        // the analysis messages' bodies, joined by "\n" (no recipient)
  std::string content;          // final and preamble bodies, and any text outside the structure
  std::vector<ToolCall> calls;  // messages to functions.NAME, in order
};

// The parts of a whole answer (the text generated after the prompt's `<|start|>assistant`).
// A message cut off by the end of the text counts as ended there.
HarmonyParse ParseHarmony(std::string_view text);

// The same, streamed: Push the answer piece by piece; each call returns what is new. Reasoning
// and content come out as they are generated (text that may be the start of a marker is held
// back); a tool call comes out whole once its message ends (`<|call|>`, `<|end|>`, the next
// `<|start|>`) or at Flush.
class HarmonyStream {
 public:
  HarmonyParse Push(std::string_view text);
  HarmonyParse Flush();  // the end of the answer

 private:
  HarmonyParse Delta(bool final);

  std::string all_;  // the answer so far
  size_t reasoning_out_ = 0, content_out_ = 0, calls_out_ = 0;
};

}  // namespace lamina::chat
