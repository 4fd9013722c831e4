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
// `<|start|>`) or at Flush. Incremental: each byte is scanned a bounded number of times, so a
// whole answer costs time linear in its length, whatever the piece sizes.
class HarmonyStream {
 public:
  HarmonyParse Push(std::string_view text);
  HarmonyParse Flush();  // the end of the answer

 private:
  // The unit being read at pos_: not yet known, text outside the structure, a message header,
  // or a message body.
  enum class Unit { kStart, kOutside, kHeader, kBody };
  // Where a body's text goes.
  enum class Sink { kReasoning, kContent, kCall, kDropped };

  HarmonyParse Run(bool final);
  bool Step(std::string_view s, bool final, HarmonyParse* out);  // false: wait for more text
  bool StepOutside(std::string_view s, bool final, HarmonyParse* out);
  bool StepHeader(std::string_view s, bool final, HarmonyParse* out);
  bool StepBody(std::string_view s, bool final, HarmonyParse* out);
  void EmitBody(std::string_view text, HarmonyParse* out);

  std::string all_;  // the answer so far
  Unit unit_ = Unit::kStart;
  size_t pos_ = 0;      // where the unit starts
  size_t scan_ = 0;     // searches for the unit's end resume here (less a marker's length)
  size_t emitted_ = 0;  // outside text or a body: released up to here
  size_t message_ = 0;  // a header's `<|message|>` (npos: not found yet)
  size_t body_ = 0;     // a body's first byte
  Sink sink_ = Sink::kContent;
  std::string call_name_;       // kCall: the function's name
  bool reasoning_any_ = false;  // reasoning released so far (the "\n" between messages)
  bool body_started_ = false;   // this body released some reasoning
};

}  // namespace lamina::chat
