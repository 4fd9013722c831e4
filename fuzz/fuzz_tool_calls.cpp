// Fuzz target: the tool-call parser of generated text (src/chat/tool_calls). Input: the
// generated text. Every call found must have a name and arguments that are one JSON value; the
// streaming hold-back must stay within the text and never move backwards as the text grows.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "chat/tool_calls.h"

namespace {

void Check(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "fuzz_tool_calls: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  for (const auto& names : {std::vector<std::string>{}, std::vector<std::string>{"f", "get"}}) {
    const lamina::chat::ToolCallParse p = lamina::chat::ParseToolCalls(text, names);
    for (const lamina::chat::ToolCall& c : p.calls) {
      Check(!c.name.empty(), "a call without a name");
      Check(lamina::chat::IsJson(c.arguments), "arguments that are not JSON");
    }
    Check(!p.calls.empty() || p.content == text, "no calls but the content changed");
    Check(p.content.size() <= text.size(), "content longer than the text");
  }
  size_t last = 0;
  for (size_t n = 0; n <= size; n += 1 + n / 16) {
    const size_t safe = lamina::chat::ToolCallSafePrefix(text.substr(0, n));
    Check(safe <= n, "a safe prefix past the text");
    Check(safe >= last || last > n, "the safe prefix moved backwards");
    last = safe;
  }
  return 0;
}
