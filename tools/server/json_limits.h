// Bounded JSON for untrusted text: a parse that refuses nesting past a depth limit before
// building anything deeper, and a non-recursive depth check for values already parsed, so that
// recursive walks over the result (dump, copies, comparisons) stay shallow.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace lamina::cli {

// The deepest nesting of arrays and objects accepted in untrusted JSON text (request bodies,
// JSON schemas, tool arguments). A request's JSON schema sits a few levels down its body, so
// this leaves the schema converter's own limit (64 schema levels) reachable; every recursive
// walk of nlohmann::json (dump, copy, ==) stays a few hundred frames deep at most.
inline constexpr size_t kMaxJsonDepth = 128;
// Members of one object (the largest legitimate one, a logit_bias object, has at most 4096), and
// the key comparisons of all objects together (ordered_json inserts by a linear search, so an
// object of n members costs n^2/2): about 0.1 s of parsing at most.
inline constexpr size_t kMaxJsonObjectMembers = 8192;
inline constexpr size_t kMaxJsonMemberWork = size_t{1} << 25;

// Parses `text` into *out. False with *error set when it is not valid JSON ("<subject> is not
// valid JSON: ...") or nests arrays and objects deeper than max_depth ("<subject> nests deeper
// than <max_depth> levels"); the parse stops at the first level too deep. Scalars are depth 0,
// [] and {} depth 1.
bool ParseJsonBounded(std::string_view text, size_t max_depth, nlohmann::json* out,
                      std::string* error, std::string_view subject = "the request body");
bool ParseJsonBounded(std::string_view text, size_t max_depth, nlohmann::ordered_json* out,
                      std::string* error, std::string_view subject = "the request body");

// Whether `value` nests arrays and objects at most max_depth deep (checked without recursion).
bool JsonDepthWithin(const nlohmann::json& value, size_t max_depth);
bool JsonDepthWithin(const nlohmann::ordered_json& value, size_t max_depth);

}  // namespace lamina::cli
