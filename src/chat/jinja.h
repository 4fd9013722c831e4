// A small Jinja engine for chat templates: the subset GGUF chat templates use (expressions,
// filters, tests, for (recursive too) / if / set / macro / call / filter / with / raw blocks,
// namespaces, % and str.format formatting, string and dict methods, raise_exception,
// strftime_now; the list: docs/SERVER.md), rendered the way Hugging Face renders chat templates
// (trim_blocks and lstrip_blocks on, tojson as json.dumps). Templates are untrusted input: parsing
// and rendering run under hard limits and fail with an Error naming the line and column.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "util/status.h"

namespace lamina::chat::jinja {

class Value;
using Array = std::vector<Value>;
using Object = std::vector<std::pair<std::string, Value>>;  // keys in insertion order

// A template value: undefined, none, bool, int, float, string, array, object or macro. Arrays
// and objects are shared on copy (a namespace set through one copy is seen by all).
class Value {
 public:
  enum class Kind : uint8_t {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kArray,
    kObject,
    kMacro
  };

  Value() = default;  // undefined
  Value(const Value&) = default;
  Value(Value&&) = default;
  Value& operator=(const Value&) = default;
  Value& operator=(Value&&) = default;
  // Frees nested arrays and objects with a work list, not recursion: a value nested as deep as
  // memory allows (built by a caller from untrusted data) is freed without overflowing the stack.
  ~Value();
  Value(bool b) : kind_(Kind::kBool), b_(b) {}                      // NOLINT
  Value(int i) : kind_(Kind::kInt), i_(i) {}                        // NOLINT
  Value(int64_t i) : kind_(Kind::kInt), i_(i) {}                    // NOLINT
  Value(double d) : kind_(Kind::kFloat), d_(d) {}                   // NOLINT
  Value(std::string s) : kind_(Kind::kString), s_(std::move(s)) {}  // NOLINT
  Value(const char* s) : kind_(Kind::kString), s_(s) {}             // NOLINT
  static Value None();
  static Value MakeArray(Array a = {});
  static Value MakeObject(Object o = {});
  static Value MakeMacro(const void* macro);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_int() const { return kind_ == Kind::kInt; }
  bool is_float() const { return kind_ == Kind::kFloat; }
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_array() const { return kind_ == Kind::kArray; }
  bool is_object() const { return kind_ == Kind::kObject; }
  bool is_macro() const { return kind_ == Kind::kMacro; }

  bool as_bool() const { return b_; }
  int64_t as_int() const { return i_; }
  double as_double() const { return kind_ == Kind::kInt ? static_cast<double>(i_) : d_; }
  const std::string& str() const { return s_; }
  const Array& array() const { return *a_; }
  Array& array() { return *a_; }
  const Object& object() const { return *o_; }
  Object& object() { return *o_; }
  const void* macro() const { return macro_; }

  // Object helpers: the value under key (nullptr when absent), insert or replace.
  const Value* Find(std::string_view key) const;
  void Set(std::string key, Value v);
  // Array helper: appends.
  void Push(Value v) { a_->push_back(std::move(v)); }

  // Python truthiness (undefined and none are false).
  bool Truthy() const;

 private:
  Kind kind_ = Kind::kUndefined;
  bool b_ = false;
  int64_t i_ = 0;
  double d_ = 0.0;
  std::string s_;
  std::shared_ptr<Array> a_;
  std::shared_ptr<Object> o_;
  const void* macro_ = nullptr;
};

// The deepest nesting of arrays and objects a render accepts in its context, stores with `set`
// or binds to macro and loop() arguments: the walks over values (tojson, printing, ==, `in`)
// recurse per level, and an expression adds at most a few hundred levels to what it reads.
inline constexpr int kMaxValueDepth = 128;

// Hard caps of one template: its size and nesting when parsed, and what one render may do.
struct Limits {
  size_t max_template_bytes = 1 << 20;
  int max_nesting = 100;                 // nested blocks and expressions
  int max_call_depth = 50;               // macro calls in progress at once
  int64_t max_loop_iterations = 100000;  // iterations of all loops of one render
  size_t max_output_bytes = 4 << 20;     // the result, and any one string or list built
  int64_t max_work = 50'000'000;         // evaluation steps plus bytes built, per render
};

// Rendering inputs besides the variables: the time strftime_now formats (Unix seconds, shown
// in UTC) instead of the current local time, so tests can fix the date.
struct RenderOptions {
  std::optional<int64_t> now_unix;
};

class Template {
 public:
  // Parses `source`; an Error names the line and column ("line 3, column 7: ...").
  static Result<Template> Parse(std::string_view source, const Limits& limits = {});
  // Renders with `context` (an object: its keys are the template's variables). raise_exception
  // and every exceeded limit give an Error naming the template position.
  Result<std::string> Render(const Value& context, const RenderOptions& options = {}) const;

  struct Impl;

 private:
  explicit Template(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

// JSON text of a value as Python's json.dumps(ensure_ascii=False) writes it (", " and ": "
// separators; indent > 0: one item per line and "," / ": "); the tojson filter.
std::string ToJson(const Value& v, int indent = -1);

}  // namespace lamina::chat::jinja
