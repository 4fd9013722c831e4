// Fuzz target: JSON Schema → GBNF (and its regex → GBNF translation). The first byte picks the
// input's kind: bit 0 clear, the rest is a JSON schema text read by the bounded parser (as the
// server reads requests); set, read by nlohmann's plain parser (as deep as the text nests: the
// converter must refuse it itself); bit 1 set, the rest is a `pattern` of a string schema
// instead. A converted schema must always parse as GBNF (or reach a grammar limit); every input
// must end in a grammar or an Error, never a crash, a hang or an abort.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "json_schema.h"
#include "runtime/grammar.h"
#include "server/json_limits.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0 || size > (64 << 10)) return 0;
  const std::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);
  nlohmann::ordered_json schema;
  if (data[0] & 2) {
    schema = {{"type", "string"}, {"pattern", std::string(body)}};
  } else if (data[0] & 1) {
    schema = nlohmann::ordered_json::parse(body.begin(), body.end(), nullptr,
                                           /*allow_exceptions=*/false);
    if (schema.is_discarded()) return 0;
  } else {
    std::string error;
    if (!lamina::cli::ParseJsonBounded(body, lamina::cli::kMaxJsonDepth, &schema, &error)) {
      if (error.empty()) std::abort();
      return 0;
    }
  }
  lamina::Result<std::string> gbnf = lamina::cli::JsonSchemaToGbnf(schema);
  if (!gbnf.ok()) {
    if (gbnf.error().message.rfind("json_schema at ", 0) != 0) std::abort();
    return 0;
  }
  auto g = lamina::Grammar::Parse(*gbnf);
  // The converter's output is a grammar, or its error is a limit the grammar reached (never
  // nesting: the converter bounds what it nests).
  if (!g.ok() && g.error().message.find("expands to over") == std::string::npos &&
      g.error().message.find("left-recursive") == std::string::npos) {
    std::abort();
  }
  if (!g.ok()) return 0;
  for (std::string_view text :
       {std::string_view("\"abc\""), std::string_view("{\"a\": [1, null]}"), body.substr(0, 128)}) {
    lamina::GrammarMatcher m(*g);
    for (size_t i = 0; i < text.size(); ++i) {
      if (!m.AcceptBytes(text.substr(i, 1))) break;
    }
    (void)m.CanEnd();
  }
  return 0;
}
