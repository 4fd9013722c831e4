// Values of the Jinja engine (jinja.h): the Value class, and values printed as Python's str()
// and repr() and as JSON (the tojson filter).
#include <charconv>
#include <cmath>
#include <cstdio>

#include "chat/jinja.h"
#include "chat/jinja_internal.h"

namespace lamina::chat::jinja {

Value::~Value() {
  if (!a_ && !o_) return;
  // Detach children whose last owner is being freed, so each container frees only leaves.
  std::vector<std::shared_ptr<Array>> arrays;
  std::vector<std::shared_ptr<Object>> objects;
  auto take = [&](Value& v) {
    if (v.a_ && v.a_.use_count() == 1) arrays.push_back(std::move(v.a_));
    if (v.o_ && v.o_.use_count() == 1) objects.push_back(std::move(v.o_));
  };
  take(*this);
  while (!arrays.empty() || !objects.empty()) {
    if (!arrays.empty()) {
      std::shared_ptr<Array> a = std::move(arrays.back());
      arrays.pop_back();
      for (Value& x : *a) take(x);
    } else {
      std::shared_ptr<Object> o = std::move(objects.back());
      objects.pop_back();
      for (auto& [k, x] : *o) take(x);
    }
  }
}

Value Value::None() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}

Value Value::MakeArray(Array a) {
  Value v;
  v.kind_ = Kind::kArray;
  v.a_ = std::make_shared<Array>(std::move(a));
  return v;
}

Value Value::MakeObject(Object o) {
  Value v;
  v.kind_ = Kind::kObject;
  v.o_ = std::make_shared<Object>(std::move(o));
  return v;
}

Value Value::MakeMacro(const void* macro) {
  Value v;
  v.kind_ = Kind::kMacro;
  v.macro_ = macro;
  return v;
}

const Value* Value::Find(std::string_view key) const {
  if (kind_ != Kind::kObject) return nullptr;
  for (const auto& [k, v] : *o_) {
    if (k == key) return &v;
  }
  return nullptr;
}

void Value::Set(std::string key, Value v) {
  LAMINA_CHECK(kind_ == Kind::kObject);
  for (auto& [k, old] : *o_) {
    if (k == key) {
      old = std::move(v);
      return;
    }
  }
  o_->emplace_back(std::move(key), std::move(v));
}

bool Value::Truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return b_;
    case Kind::kInt:
      return i_ != 0;
    case Kind::kFloat:
      return d_ != 0.0;
    case Kind::kString:
      return !s_.empty();
    case Kind::kArray:
      return !a_->empty();
    case Kind::kObject:
      return !o_->empty();
    case Kind::kMacro:
      return true;
  }
  return false;
}

namespace internal {
namespace {

// Python's float repr (shortest round trip, ".0" on integral values).
std::string PyFloat(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), d);
  std::string s(buf, r.ptr);
  if (s.find_first_of(".en") == std::string::npos) s += ".0";
  return s;
}

void JsonString(const std::string& s, std::string* out) {
  out->push_back('"');
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        *out += "\\\"";
        break;
      case '\\':
        *out += "\\\\";
        break;
      case '\n':
        *out += "\\n";
        break;
      case '\r':
        *out += "\\r";
        break;
      case '\t':
        *out += "\\t";
        break;
      case '\b':
        *out += "\\b";
        break;
      case '\f':
        *out += "\\f";
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          *out += buf;
        } else {
          out->push_back(static_cast<char>(c));
        }
    }
  }
  out->push_back('"');
}

void JsonValue(const Value& v, int indent, int level, std::string* out) {
  auto newline = [&](int lvl) {
    out->push_back('\n');
    out->append(static_cast<size_t>(indent) * lvl, ' ');
  };
  switch (v.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
    case Value::Kind::kMacro:
      *out += "null";
      return;
    case Value::Kind::kBool:
      *out += v.as_bool() ? "true" : "false";
      return;
    case Value::Kind::kInt:
      *out += std::to_string(v.as_int());
      return;
    case Value::Kind::kFloat: {
      const double d = v.as_double();
      *out += std::isnan(d)   ? "NaN"
              : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity")
                              : PyFloat(d);
      return;
    }
    case Value::Kind::kString:
      JsonString(v.str(), out);
      return;
    case Value::Kind::kArray: {
      const Array& a = v.array();
      if (a.empty()) {
        *out += "[]";
        return;
      }
      out->push_back('[');
      for (size_t i = 0; i < a.size(); ++i) {
        if (i > 0) *out += indent >= 0 ? "," : ", ";
        if (indent >= 0) newline(level + 1);
        JsonValue(a[i], indent, level + 1, out);
      }
      if (indent >= 0) newline(level);
      out->push_back(']');
      return;
    }
    case Value::Kind::kObject: {
      const Object& o = v.object();
      if (o.empty()) {
        *out += "{}";
        return;
      }
      out->push_back('{');
      for (size_t i = 0; i < o.size(); ++i) {
        if (i > 0) *out += indent >= 0 ? "," : ", ";
        if (indent >= 0) newline(level + 1);
        JsonString(o[i].first, out);
        *out += ": ";
        JsonValue(o[i].second, indent, level + 1, out);
      }
      if (indent >= 0) newline(level);
      out->push_back('}');
      return;
    }
  }
}

}  // namespace

void PyStr(const Value& v, std::string* out) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return;
    case Value::Kind::kNone:
      *out += "None";
      return;
    case Value::Kind::kBool:
      *out += v.as_bool() ? "True" : "False";
      return;
    case Value::Kind::kInt:
      *out += std::to_string(v.as_int());
      return;
    case Value::Kind::kFloat:
      *out += PyFloat(v.as_double());
      return;
    case Value::Kind::kString:
      *out += v.str();
      return;
    case Value::Kind::kArray:
    case Value::Kind::kObject:
      PyRepr(v, out);
      return;
    case Value::Kind::kMacro:
      *out += "<macro>";
      return;
  }
}

void PyRepr(const Value& v, std::string* out) {
  if (v.is_string()) {
    const std::string& s = v.str();
    const char q =
        s.find('\'') != std::string::npos && s.find('"') == std::string::npos ? '"' : '\'';
    out->push_back(q);
    for (char c : s) {
      if (c == q || c == '\\') {
        out->push_back('\\');
        out->push_back(c);
      } else if (c == '\n') {
        *out += "\\n";
      } else if (c == '\r') {
        *out += "\\r";
      } else if (c == '\t') {
        *out += "\\t";
      } else {
        out->push_back(c);
      }
    }
    out->push_back(q);
  } else if (v.is_array()) {
    out->push_back('[');
    for (size_t i = 0; i < v.array().size(); ++i) {
      if (i > 0) *out += ", ";
      PyRepr(v.array()[i], out);
    }
    out->push_back(']');
  } else if (v.is_object()) {
    out->push_back('{');
    for (size_t i = 0; i < v.object().size(); ++i) {
      if (i > 0) *out += ", ";
      PyRepr(Value(v.object()[i].first), out);
      *out += ": ";
      PyRepr(v.object()[i].second, out);
    }
    out->push_back('}');
  } else {
    PyStr(v, out);
  }
}

std::string ToStr(const Value& v) {
  std::string s;
  PyStr(v, &s);
  return s;
}

}  // namespace internal

std::string ToJson(const Value& v, int indent) {
  std::string out;
  internal::JsonValue(v, indent, 0, &out);
  return out;
}

}  // namespace lamina::chat::jinja
