// Fuzz target: gpt-oss's harmony answer parser (src/chat/harmony) and the answer splitter every
// route reads through (src/chat/answer). Input: the generated text. Every call found must have a
// name; streamed in pieces of 1 to 1,000 bytes (and of sizes the input picks), the deltas must add
// up to the whole parse, and no delta of reasoning or content may hold more bytes than the text;
// the splitter's harmony parts are the parser's.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "chat/answer.h"
#include "chat/harmony.h"

namespace {

void Check(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "fuzz_harmony: %s\n", what);
  std::abort();
}

bool SameCalls(const lamina::chat::HarmonyParse& a, const lamina::chat::HarmonyParse& b) {
  if (a.calls.size() != b.calls.size()) return false;
  for (size_t i = 0; i < a.calls.size(); ++i) {
    if (a.calls[i].name != b.calls[i].name || a.calls[i].arguments != b.calls[i].arguments) {
      return false;
    }
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const lamina::chat::HarmonyParse whole = lamina::chat::ParseHarmony(text);
  for (const lamina::chat::ToolCall& c : whole.calls)
    Check(!c.name.empty(), "a call without a name");
  Check(whole.content.size() + whole.reasoning.size() <= text.size() + text.size() / 2 + 1,
        "more text out than in");
  // Fixed piece sizes from 1 to 1,000 bytes, and (piece 0) sizes of 1..13 bytes read from the
  // text itself, so every split shape is tried.
  for (size_t piece : {size_t{0}, size_t{1}, size_t{2}, size_t{3}, size_t{7}, size_t{16},
                       size_t{61}, size_t{256}, size_t{1000}}) {
    lamina::chat::HarmonyStream stream;
    lamina::chat::HarmonyParse sum;
    auto add = [&](const lamina::chat::HarmonyParse& d) {
      Check(d.reasoning.size() + d.content.size() <= size + size / 2 + 1, "a delta too long");
      sum.reasoning += d.reasoning;
      sum.content += d.content;
      for (const lamina::chat::ToolCall& c : d.calls) sum.calls.push_back(c);
    };
    for (size_t i = 0; i < size;) {
      const size_t n = piece > 0 ? piece : 1 + data[i] % 13;
      add(stream.Push(text.substr(i, n)));
      i += n;
    }
    add(stream.Flush());
    Check(sum.reasoning == whole.reasoning, "streamed reasoning differs from the whole parse");
    Check(sum.content == whole.content, "streamed content differs from the whole parse");
    Check(SameCalls(sum, whole), "streamed calls differ from the whole parse");
  }
  const lamina::chat::AnswerFormat harmony{true};
  const lamina::chat::AnswerParts split = lamina::chat::SplitAnswer(harmony, text);
  Check(split.reasoning == whole.reasoning && split.content == whole.content &&
            SameCalls({split.reasoning, split.content, split.calls}, whole),
        "the answer splitter differs from the harmony parse");
  lamina::chat::AnswerSplitter splitter(harmony);
  lamina::chat::AnswerParts a = splitter.Push(text), b = splitter.Flush();
  Check(a.reasoning + b.reasoning == whole.reasoning && a.content + b.content == whole.content &&
            a.calls.size() + b.calls.size() == whole.calls.size(),
        "the streamed answer splitter differs from the harmony parse");
  return 0;
}
