// Fuzz target: GBNF grammars and JSON schemas. The first byte picks the input's kind: even, a
// GBNF source (parsed; when it parses, the matcher walks a few texts and the input itself);
// odd, a JSON schema (converted; a converted schema must always parse as GBNF). Every input
// must end in a grammar or an Error, never a crash, a hang or an abort.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "json_schema.h"
#include "runtime/grammar.h"

namespace {

void Walk(const std::shared_ptr<const lamina::Grammar>& g, std::string_view input) {
  for (std::string_view text :
       {std::string_view("{\"a\": [1, 2.5, \"x\"]}"), std::string_view("aaaaa"),
        std::string_view("\xce\xb1\xc1\xbb"), input.substr(0, 256)}) {
    lamina::GrammarMatcher m(g);
    for (size_t i = 0; i < text.size(); ++i) {
      if (!m.AcceptBytes(text.substr(i, 1))) break;
    }
    (void)m.CanEnd();
    (void)m.Complete();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0 || size > (64 << 10)) return 0;
  const std::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);
  if ((data[0] & 1) == 0) {
    auto g = lamina::Grammar::Parse(body);
    if (g.ok()) Walk(*g, body);
    return 0;
  }
  const nlohmann::ordered_json schema =
      nlohmann::ordered_json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (schema.is_discarded()) return 0;
  lamina::Result<std::string> gbnf = lamina::cli::JsonSchemaToGbnf(schema);
  if (!gbnf.ok()) return 0;
  auto g = lamina::Grammar::Parse(*gbnf);
  // The converter's output is a grammar, or its error is (a limit it reached).
  if (!g.ok() && g.error().message.find("over the limit") == std::string::npos &&
      g.error().message.find("left-recursive") == std::string::npos &&
      g.error().message.find("expands to over") == std::string::npos) {
    std::abort();
  }
  if (g.ok()) Walk(*g, body);
  return 0;
}
