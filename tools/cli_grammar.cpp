// Constrained output on the command line: --grammar / --grammar-file (GBNF) and
// --json-schema / --json-schema-file (converted to GBNF) become the generation's grammar.
#include <cstdio>
#include <filesystem>
#include <system_error>

#include "cli_common.h"
#include "json_schema.h"
#include "server/json_limits.h"

namespace lamina::cli {

namespace {

// A value that names an existing file is read from it; otherwise it is the text itself.
bool TextOrFile(const std::string& value, const std::string& file, const char* option,
                std::string* text, bool* from_file, int* exit_code) {
  std::string path = file;
  std::error_code ec;
  if (path.empty() && !value.empty() && value.size() < 4096 &&
      std::filesystem::is_regular_file(value, ec)) {
    path = value;
  }
  *from_file = !path.empty();
  if (path.empty()) {
    *text = value;
    return true;
  }
  std::string err;
  if (!ReadTextFile(path, text, &err)) {
    std::fprintf(stderr, "lamina: %s: %s\n", option, err.c_str());
    *exit_code = kExitBadInput;
    return false;
  }
  return true;
}

}  // namespace

bool MakeGrammar(const RunOptions& o, std::shared_ptr<const Grammar>* out, int* exit_code) {
  out->reset();
  const bool has_grammar = !o.grammar.empty() || !o.grammar_file.empty();
  const bool has_schema = !o.json_schema.empty() || !o.json_schema_file.empty();
  if (!has_grammar && !has_schema) return true;
  if (has_grammar && has_schema) {
    std::fprintf(stderr, "lamina: give either a grammar or a JSON schema, not both\n");
    *exit_code = kExitUsage;
    return false;
  }
  std::string text;
  bool from_file = false;
  if (has_grammar) {
    if (!TextOrFile(o.grammar, o.grammar_file, "--grammar-file", &text, &from_file, exit_code)) {
      return false;
    }
  } else {
    if (!TextOrFile(o.json_schema, o.json_schema_file, "--json-schema-file", &text, &from_file,
                    exit_code)) {
      return false;
    }
    nlohmann::ordered_json schema;
    std::string error;
    if (!ParseJsonBounded(text, kMaxJsonDepth, &schema, &error, "the JSON schema")) {
      std::fprintf(stderr, "lamina: %s\n", error.c_str());
      *exit_code = from_file ? kExitBadInput : kExitUsage;
      return false;
    }
    Result<std::string> gbnf = JsonSchemaToGbnf(schema);
    if (!gbnf.ok()) {
      std::fprintf(stderr, "lamina: %s\n", gbnf.error().message.c_str());
      *exit_code = from_file ? kExitBadInput : kExitUsage;
      return false;
    }
    text = std::move(*gbnf);
  }
  Result<std::shared_ptr<const Grammar>> g = Grammar::Parse(text);
  if (!g.ok()) {
    std::fprintf(stderr, "lamina: %s\n", g.error().message.c_str());
    *exit_code = from_file ? kExitBadInput : kExitUsage;
    return false;
  }
  *out = std::move(*g);
  return true;
}

}  // namespace lamina::cli
