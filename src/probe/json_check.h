// A strict JSON reader (RFC 8259: UTF-8 checked, no trailing commas, no comments) for the JSON
// probe, which grades a model's answer: whether it parses and which scalar each top-level field
// holds. Nested values are checked and then dropped. Duplicate keys: the last one wins.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

namespace lamina::probe {

// A top-level field's value as the probe compares it.
struct JsonScalar {
  enum class Kind { kNull, kBool, kInteger, kFloat, kString, kArray, kObject };
  Kind kind = Kind::kNull;
  bool boolean = false;
  int64_t integer = 0;  // kInteger: the value, when it fits int64 (else it is kept as kFloat)
  double number = 0.0;  // kFloat
  std::string text;     // kString, escapes decoded
};

// The fields of `text` when it is exactly one JSON object (surrounding whitespace allowed);
// nullopt when it is anything else or not valid JSON.
std::optional<std::map<std::string, JsonScalar>> ParseJsonObject(std::string_view text);

// Whether a field equals an integer (a float of the same value counts, as in JSON's number).
bool JsonEquals(const JsonScalar& value, int64_t integer);
// Whether a field is this string.
bool JsonEquals(const JsonScalar& value, const std::string& text);

// `text` as a JSON string literal (quotes added; ", \ and control characters escaped).
std::string JsonQuote(const std::string& text);

}  // namespace lamina::probe
