// Tool calls in generated text: the Hermes / Qwen form (`<tool_call>{"name": ..., "arguments":
// ...}</tool_call>`, one or more), Llama-3.x's bare JSON object (`{"name": ..., "parameters":
// ...}` as the whole output) and Mistral's `[TOOL_CALLS][{...}, ...]`. Pure text in, text out:
// the HTTP edge (tools/server) turns the calls into OpenAI's `tool_calls`. Generated text is
// untrusted: JSON is read strictly (RFC 8259, nesting capped) and a malformed call stays
// content.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace lamina::chat {

struct ToolCall {
  std::string name;
  std::string arguments;  // JSON text of the arguments (an object, as generated); "{}" if absent
};

struct ToolCallParse {
  std::vector<ToolCall> calls;
  // The text outside the calls, in order (not trimmed); the whole text when there are none.
  std::string content;
};

// The calls in `text`. `names`: the tools the request offered; a bare JSON object (the Llama-3
// form) counts as a call only when it names one of them (any name when `names` is empty). The
// tagged forms take any name.
ToolCallParse ParseToolCalls(std::string_view text, const std::vector<std::string>& names = {});

// Streaming: how many leading bytes of `text` (the output so far) are content for sure, i.e.
// cannot belong to a tool call: everything before the first opener (`<tool_call>`,
// `[TOOL_CALLS]`) or before a trailing prefix of one; nothing while the output is blank or
// starts with `{` (it may become a bare JSON call).
size_t ToolCallSafePrefix(std::string_view text);

// Whether `text` is exactly one JSON value (surrounding whitespace allowed), read strictly.
bool IsJson(std::string_view text);

}  // namespace lamina::chat
