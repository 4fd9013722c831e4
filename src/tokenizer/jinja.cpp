// The Jinja engine of jinja.h: lexer (text and tags with whitespace control), recursive-descent
// parser to an AST, and a renderer that counts every step against the template's limits.
#include "tokenizer/jinja.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <limits>

namespace lamina::jinja {

// ---------------------------------------------------------------------------------------------
// Values

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

void PyRepr(const Value& v, std::string* out);

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

}  // namespace

std::string ToJson(const Value& v, int indent) {
  std::string out;
  JsonValue(v, indent, 0, &out);
  return out;
}

// ---------------------------------------------------------------------------------------------
// Lexer

namespace {

enum class Tok {
  kText,
  kVarBegin,
  kVarEnd,
  kBlockBegin,
  kBlockEnd,
  kName,
  kString,
  kInt,
  kFloat,
  kOp,
  kEof
};

struct Token {
  Tok type;
  std::string text;  // text, name, string value or operator
  int64_t i = 0;
  double f = 0.0;
  size_t pos = 0;  // offset in the source
};

// Line and column (1-based) of source offsets.
class Positions {
 public:
  explicit Positions(std::string_view src) {
    starts_.push_back(0);
    for (size_t i = 0; i < src.size(); ++i) {
      if (src[i] == '\n') starts_.push_back(i + 1);
    }
  }
  std::string Where(size_t pos) const {
    const auto it = std::upper_bound(starts_.begin(), starts_.end(), pos);
    const size_t line = static_cast<size_t>(it - starts_.begin());
    const size_t col = pos - starts_[line - 1] + 1;
    return "line " + std::to_string(line) + ", column " + std::to_string(col);
  }

 private:
  std::vector<size_t> starts_;
};

bool IsSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}
bool IsNameStart(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool IsDigit(char c) { return c >= '0' && c <= '9'; }

void AppendUtf8(uint32_t cp, std::string* s) {
  if (cp < 0x80) {
    s->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    s->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    s->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    s->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    s->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    s->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    s->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    s->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    s->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    s->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

class Lexer {
 public:
  Lexer(std::string_view src, const Positions& pos) : src_(src), pos_(pos) {}

  Result<std::vector<Token>> Run() {
    size_t i = 0;
    bool strip_leading = false;  // after "-%}" / "-}}"
    bool trim_newline = false;   // trim_blocks: after "%}" / "#}"
    while (i <= src_.size()) {
      size_t j = i;
      while (true) {
        j = src_.find('{', j);
        if (j == std::string_view::npos || j + 1 >= src_.size()) {
          j = src_.size();
          break;
        }
        const char n = src_[j + 1];
        if (n == '{' || n == '%' || n == '#') break;
        ++j;
      }
      size_t b = i;
      if (strip_leading) {
        while (b < j && IsSpace(src_[b])) ++b;
      } else if (trim_newline) {
        if (b < j && src_[b] == '\n') {
          ++b;
        } else if (b + 1 < j && src_[b] == '\r' && src_[b + 1] == '\n') {
          b += 2;
        }
      }
      size_t e = j;
      if (j < src_.size()) {
        const char kind = src_[j + 1];
        const char mark = j + 2 < src_.size() ? src_[j + 2] : '\0';
        if (mark == '-') {
          while (e > b && IsSpace(src_[e - 1])) --e;
        } else if (mark != '+' && kind != '{') {  // lstrip_blocks
          size_t k = e;
          while (k > b && (src_[k - 1] == ' ' || src_[k - 1] == '\t')) --k;
          if (k == 0 || src_[k - 1] == '\n') e = k;
        }
      }
      if (e > b) out_.push_back(Token{Tok::kText, std::string(src_.substr(b, e - b)), 0, 0, b});
      if (j >= src_.size()) break;
      strip_leading = trim_newline = false;
      const char kind = src_[j + 1];
      if (kind == '#') {
        const size_t end = src_.find("#}", j + 2);
        if (end == std::string_view::npos) return Fail(j, "unclosed comment");
        if (end > j + 2 && src_[end - 1] == '-') {
          strip_leading = true;
        } else {
          trim_newline = true;
        }
        i = end + 2;
        continue;
      }
      const bool block = kind == '%';
      if (block) {
        char close_mark = '\0';
        const size_t after = MatchTag(j, "raw", &close_mark);
        if (after != std::string_view::npos) {
          Result<size_t> end = LexRaw(j, after, close_mark, &strip_leading, &trim_newline);
          if (!end.ok()) return end.error();
          i = *end;
          continue;
        }
      }
      out_.push_back(Token{block ? Tok::kBlockBegin : Tok::kVarBegin, "", 0, 0, j});
      size_t p = j + 2;
      if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) ++p;
      Result<size_t> end = LexTag(p, block, j, &strip_leading, &trim_newline);
      if (!end.ok()) return end.error();
      i = *end;
    }
    out_.push_back(Token{Tok::kEof, "", 0, 0, src_.size()});
    return std::move(out_);
  }

 private:
  Error Fail(size_t at, const std::string& what) const {
    return Error{pos_.Where(at) + ": " + what};
  }

  // When the block tag at `open` ("{%") is `{% word %}` (with any whitespace control), the
  // offset after it and its closing mark ('-', '+' or '\0'); npos otherwise.
  size_t MatchTag(size_t open, std::string_view word, char* close_mark) const {
    size_t p = open + 2;
    if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) ++p;
    while (p < src_.size() && IsSpace(src_[p])) ++p;
    if (src_.substr(p, word.size()) != word) return std::string_view::npos;
    p += word.size();
    if (p < src_.size() && (IsNameStart(src_[p]) || IsDigit(src_[p]))) {
      return std::string_view::npos;
    }
    while (p < src_.size() && IsSpace(src_[p])) ++p;
    *close_mark = '\0';
    if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) *close_mark = src_[p++];
    if (src_.substr(p, 2) != "%}") return std::string_view::npos;
    return p + 2;
  }

  // {% raw %}...{% endraw %}: the text between the tags, untouched but for the whitespace
  // control of the two tags (as for any block tag). Returns the offset after "{% endraw %}".
  Result<size_t> LexRaw(size_t open, size_t start, char raw_close, bool* strip_leading,
                        bool* trim_newline) {
    size_t end_open = start;
    size_t after = std::string_view::npos;
    char end_close = '\0';
    while (true) {
      end_open = src_.find("{%", end_open);
      if (end_open == std::string_view::npos) {
        return Fail(open, "unclosed 'raw' block (expected '{% endraw %}')");
      }
      after = MatchTag(end_open, "endraw", &end_close);
      if (after != std::string_view::npos) break;
      end_open += 2;
    }
    size_t b = start, e = end_open;
    if (raw_close == '-') {
      while (b < e && IsSpace(src_[b])) ++b;
    } else if (raw_close != '+') {
      if (b < e && src_[b] == '\n') {
        ++b;
      } else if (b + 1 < e && src_[b] == '\r' && src_[b + 1] == '\n') {
        b += 2;
      }
    }
    const char end_mark = end_open + 2 < src_.size() ? src_[end_open + 2] : '\0';
    if (end_mark == '-') {
      while (e > b && IsSpace(src_[e - 1])) --e;
    } else if (end_mark != '+') {  // lstrip_blocks
      size_t k = e;
      while (k > b && (src_[k - 1] == ' ' || src_[k - 1] == '\t')) --k;
      if (k == 0 || src_[k - 1] == '\n') e = k;
    }
    if (e > b) out_.push_back(Token{Tok::kText, std::string(src_.substr(b, e - b)), 0, 0, b});
    *strip_leading = end_close == '-';
    *trim_newline = end_close != '-' && end_close != '+';
    return after;
  }

  // Lexes the inside of a tag from p; returns the offset after its closing delimiter.
  Result<size_t> LexTag(size_t p, bool block, size_t open, bool* strip_leading,
                        bool* trim_newline) {
    int depth = 0;
    const char close = block ? '%' : '}';
    while (true) {
      while (p < src_.size() && IsSpace(src_[p])) ++p;
      if (p >= src_.size()) {
        return Fail(open, std::string(block ? "unclosed '{%' tag" : "unclosed '{{' tag") +
                              (depth > 0 ? " (a bracket inside it is not closed)" : ""));
      }
      const char c = src_[p];
      if (depth == 0) {
        // "-%}" / "+%}" / "%}" (or the "}}" forms) end the tag.
        size_t q = p;
        char mark = '\0';
        if ((c == '-' || c == '+') && q + 1 < src_.size() && src_[q + 1] == close) {
          mark = c;
          ++q;
        }
        if (q + 1 < src_.size() && src_[q] == close && src_[q + 1] == '}') {
          out_.push_back(Token{block ? Tok::kBlockEnd : Tok::kVarEnd, "", 0, 0, p});
          if (mark == '-') {
            *strip_leading = true;
          } else if (block && mark != '+') {
            *trim_newline = true;
          }
          return q + 2;
        }
      }
      if (IsNameStart(c)) {
        size_t q = p;
        while (q < src_.size() && (IsNameStart(src_[q]) || IsDigit(src_[q]))) ++q;
        out_.push_back(Token{Tok::kName, std::string(src_.substr(p, q - p)), 0, 0, p});
        p = q;
      } else if (IsDigit(c)) {
        size_t q = p;
        while (q < src_.size() && IsDigit(src_[q])) ++q;
        bool is_float = false;
        if (q + 1 < src_.size() && src_[q] == '.' && IsDigit(src_[q + 1])) {
          is_float = true;
          ++q;
          while (q < src_.size() && IsDigit(src_[q])) ++q;
        }
        if (q < src_.size() && (src_[q] == 'e' || src_[q] == 'E')) {
          size_t r = q + 1;
          if (r < src_.size() && (src_[r] == '+' || src_[r] == '-')) ++r;
          if (r < src_.size() && IsDigit(src_[r])) {
            is_float = true;
            q = r;
            while (q < src_.size() && IsDigit(src_[q])) ++q;
          }
        }
        const std::string text(src_.substr(p, q - p));
        Token t{is_float ? Tok::kFloat : Tok::kInt, text, 0, 0, p};
        if (is_float) {
          t.f = std::strtod(text.c_str(), nullptr);
        } else {
          auto r = std::from_chars(text.data(), text.data() + text.size(), t.i);
          if (r.ec != std::errc()) return Fail(p, "integer literal out of range");
        }
        out_.push_back(std::move(t));
        p = q;
      } else if (c == '\'' || c == '"') {
        std::string s;
        size_t q = p + 1;
        while (true) {
          if (q >= src_.size()) return Fail(p, "unterminated string literal");
          const char d = src_[q];
          if (d == c) break;
          if (d == '\\' && q + 1 < src_.size()) {
            const char x = src_[q + 1];
            q += 2;
            switch (x) {
              case 'n':
                s += '\n';
                break;
              case 't':
                s += '\t';
                break;
              case 'r':
                s += '\r';
                break;
              case '0':
                s += '\0';
                break;
              case '\\':
              case '\'':
              case '"':
                s += x;
                break;
              case '\n':
                break;
              case 'u':
              case 'x': {
                const size_t n = x == 'u' ? 4 : 2;
                if (q + n > src_.size()) return Fail(q - 2, "bad escape in string literal");
                uint32_t cp = 0;
                for (size_t k = 0; k < n; ++k) {
                  const char h = src_[q + k];
                  cp <<= 4;
                  if (IsDigit(h)) {
                    cp |= h - '0';
                  } else if (h >= 'a' && h <= 'f') {
                    cp |= h - 'a' + 10;
                  } else if (h >= 'A' && h <= 'F') {
                    cp |= h - 'A' + 10;
                  } else {
                    return Fail(q - 2, "bad escape in string literal");
                  }
                }
                q += n;
                AppendUtf8(cp, &s);
                break;
              }
              default:
                s += '\\';
                s += x;
            }
            continue;
          }
          s += d;
          ++q;
        }
        out_.push_back(Token{Tok::kString, std::move(s), 0, 0, p});
        p = q + 1;
      } else {
        static constexpr std::string_view kTwo[] = {"//", "**", "==", "!=", "<=", ">="};
        std::string op;
        for (std::string_view t : kTwo) {
          if (src_.substr(p, 2) == t) op = std::string(t);
        }
        if (op.empty()) {
          if (std::string_view("+-*/%~<>=()[]{},.:|").find(c) == std::string_view::npos) {
            return Fail(p, std::string("unexpected character '") + c + "'");
          }
          op = std::string(1, c);
          if (c == '(' || c == '[' || c == '{') ++depth;
          if ((c == ')' || c == ']' || c == '}') && depth > 0) --depth;
        }
        out_.push_back(Token{Tok::kOp, op, 0, 0, p});
        p += op.size();
      }
    }
  }

  std::string_view src_;
  const Positions& pos_;
  std::vector<Token> out_;
};

// ---------------------------------------------------------------------------------------------
// AST

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class K {
    kLiteral,
    kName,
    kAttr,    // args[0].name
    kItem,    // args[0][args[1]]
    kSlice,   // args[0][args[1]:args[2]:args[3]] (null parts)
    kCall,    // args[0](args[1..], kwargs)
    kFilter,  // args[0] | name(args[1..], kwargs)
    kTest,    // args[0] is [not] name(args[1..])
    kUnary,   // op args[0]: "-", "+", "not"
    kBinary,  // args[0] op args[1]
    kAnd,
    kOr,
    kTernary,  // args[1] if args[0] else args[2] (null: undefined)
    kList,
    kDict,        // args: key, value, key, value, ...
    kBlockValue,  // the text a {% filter %} block rendered (the start of its filter chain)
  };
  K k;
  size_t pos;
  Value lit;
  std::string name;  // name, attribute, filter or test, operator
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  bool negated = false;
};

struct Stmt;
using Body = std::vector<std::unique_ptr<Stmt>>;

struct Stmt {
  enum class K {
    kText,
    kOutput,
    kIf,
    kFor,
    kSet,
    kSetBlock,
    kMacro,
    kBreak,
    kContinue,
    kBlock,
    kDo,
    kFilterBlock,  // {% filter f|g(x) %}: expr is the chain applied to the body's text
    kCallBlock,    // {% call(params) macro(args) %}: expr is the call, body is caller()
    kWith,         // {% with a = 1, b = 2 %}: vars and defaults hold the names and values
  };
  K k;
  size_t pos;
  std::string text;                                // kText
  ExprPtr expr;                                    // output, set value, for iterable, do
  std::vector<std::pair<ExprPtr, Body>> branches;  // kIf: condition (null: else) and body
  std::vector<std::string> vars;                   // for targets; set target (one name)
  std::string attr;                                // set ns.attr
  ExprPtr cond;                                    // for ... if cond
  Body body, else_body;
  std::string name;  // macro
  std::vector<std::string> params;
  std::vector<ExprPtr> defaults;  // per param, null when none
  bool recursive = false;         // for ... recursive
};

}  // namespace

struct Template::Impl {
  std::string source;
  Limits limits;
  std::unique_ptr<Positions> positions;
  Body body;
};

// ---------------------------------------------------------------------------------------------
// Parser

namespace {

class Parser {
 public:
  Parser(const std::vector<Token>& toks, const Positions& pos, const Limits& limits)
      : t_(toks), pos_(pos), limits_(limits) {}

  bool ParseTemplate(Body* out) {
    std::string stop;
    if (!ParseBody(out, {}, &stop, nullptr)) return false;
    return true;
  }
  const Error& error() const { return err_; }

 private:
  const Token& Peek(int ahead = 0) const {
    const size_t i = std::min(p_ + ahead, t_.size() - 1);
    return t_[i];
  }
  const Token& Next() {
    const Token& t = t_[p_];
    if (p_ + 1 < t_.size()) ++p_;
    return t;
  }
  bool IsOp(std::string_view op, int ahead = 0) const {
    const Token& t = Peek(ahead);
    return t.type == Tok::kOp && t.text == op;
  }
  bool IsName(std::string_view n, int ahead = 0) const {
    const Token& t = Peek(ahead);
    return t.type == Tok::kName && t.text == n;
  }
  bool Fail(size_t at, const std::string& what) {
    if (err_.message.empty()) err_.message = pos_.Where(at) + ": " + what;
    return false;
  }
  bool Expect(std::string_view op) {
    if (IsOp(op)) {
      Next();
      return true;
    }
    return Fail(Peek().pos, "expected '" + std::string(op) + "'" + Found());
  }
  std::string Found() const {
    const Token& t = Peek();
    switch (t.type) {
      case Tok::kName:
      case Tok::kOp:
        return ", found '" + t.text + "'";
      case Tok::kString:
        return ", found a string";
      case Tok::kInt:
      case Tok::kFloat:
        return ", found a number";
      case Tok::kBlockEnd:
        return ", found the end of the tag";
      case Tok::kVarEnd:
        return ", found '}}'";
      case Tok::kEof:
        return ", found the end of the template";
      default:
        return "";
    }
  }
  bool ExpectBlockEnd() {
    if (Peek().type == Tok::kBlockEnd) {
      Next();
      return true;
    }
    return Fail(Peek().pos, "expected the end of the tag ('%}')" + Found());
  }
  bool ExpectName(std::string* out) {
    if (Peek().type != Tok::kName) return Fail(Peek().pos, "expected a name" + Found());
    *out = Next().text;
    return true;
  }

  struct Depth {
    explicit Depth(Parser* p) : p(p) { ++p->depth_; }
    ~Depth() { --p->depth_; }
    Parser* p;
  };
  // Chains of operators, postfixes and filters (a + b + c, x.y[0].z, x|f|g) build left-deep
  // trees: the links along the current path count against four times the nesting limit (what
  // rendering allows), so the tree stays shallow enough to walk and free recursively.
  struct Chain {
    explicit Chain(Parser* p) : p(p), saved(p->links_) {}
    ~Chain() { p->links_ = saved; }
    bool Link(size_t at) {
      if (++p->links_ > p->limits_.max_nesting * 4) {
        return p->Fail(at, "an expression chains more operations than the limit of " +
                               std::to_string(p->limits_.max_nesting * 4));
      }
      return true;
    }
    Parser* p;
    int saved;
  };

  bool CheckDepth(size_t at) {
    if (depth_ > limits_.max_nesting) {
      return Fail(at, "nesting deeper than the limit of " + std::to_string(limits_.max_nesting));
    }
    return true;
  }

  // Parses statements until a block tag whose keyword is in `stops` (consumed up to the
  // keyword; *stop receives it). An empty `stops` parses to the end of the template.
  bool ParseBody(Body* out, const std::vector<std::string_view>& stops, std::string* stop,
                 const Token* opener) {
    while (true) {
      const Token& t = Peek();
      if (t.type == Tok::kEof) {
        if (stops.empty()) return true;
        return Fail(opener->pos, "unclosed '" + opener->text + "' block (expected '{% " +
                                     std::string(stops.back()) + " %}')");
      }
      if (t.type == Tok::kText) {
        auto s = std::make_unique<Stmt>();
        s->k = Stmt::K::kText;
        s->pos = t.pos;
        s->text = t.text;
        out->push_back(std::move(s));
        Next();
        continue;
      }
      if (t.type == Tok::kVarBegin) {
        Next();
        auto s = std::make_unique<Stmt>();
        s->k = Stmt::K::kOutput;
        s->pos = t.pos;
        if (!ParseExpr(&s->expr)) return false;
        if (Peek().type != Tok::kVarEnd) return Fail(Peek().pos, "expected '}}'" + Found());
        Next();
        out->push_back(std::move(s));
        continue;
      }
      if (t.type != Tok::kBlockBegin) return Fail(t.pos, "unexpected token" + Found());
      const Token& kw = Peek(1);
      if (kw.type != Tok::kName) return Fail(kw.pos, "expected a statement keyword" + Found());
      for (std::string_view s : stops) {
        if (kw.text == s) {
          Next();
          Next();
          *stop = kw.text;
          return true;
        }
      }
      Next();
      Next();
      Depth d(this);
      if (!CheckDepth(kw.pos)) return false;
      if (!ParseStatement(kw, out)) return false;
    }
  }

  bool ParseStatement(const Token& kw, Body* out) {
    auto s = std::make_unique<Stmt>();
    s->pos = kw.pos;
    const std::string& k = kw.text;
    std::string stop;
    if (k == "if") {
      s->k = Stmt::K::kIf;
      ExprPtr cond;
      if (!ParseExpr(&cond) || !ExpectBlockEnd()) return false;
      while (true) {
        Body body;
        if (!ParseBody(&body, {"elif", "else", "endif"}, &stop, &kw)) return false;
        s->branches.emplace_back(std::move(cond), std::move(body));
        if (stop == "endif") break;
        if (stop == "elif") {
          if (!ParseExpr(&cond) || !ExpectBlockEnd()) return false;
          continue;
        }
        // else
        if (!ExpectBlockEnd()) return false;
        Body else_body;
        if (!ParseBody(&else_body, {"endif"}, &stop, &kw)) return false;
        s->branches.emplace_back(nullptr, std::move(else_body));
        break;
      }
      if (!ExpectBlockEnd()) return false;
    } else if (k == "for") {
      s->k = Stmt::K::kFor;
      while (true) {
        std::string v;
        if (!ExpectName(&v)) return false;
        s->vars.push_back(v);
        if (!IsOp(",")) break;
        Next();
      }
      if (!IsName("in")) return Fail(Peek().pos, "expected 'in'" + Found());
      Next();
      if (!ParseOr(&s->expr)) return false;
      if (IsName("if")) {
        Next();
        if (!ParseOr(&s->cond)) return false;
      }
      if (IsName("recursive")) {
        Next();
        s->recursive = true;
      }
      if (!ExpectBlockEnd()) return false;
      if (!ParseBody(&s->body, {"else", "endfor"}, &stop, &kw)) return false;
      if (stop == "else") {
        if (!ExpectBlockEnd()) return false;
        if (!ParseBody(&s->else_body, {"endfor"}, &stop, &kw)) return false;
      }
      if (!ExpectBlockEnd()) return false;
    } else if (k == "set") {
      std::string target;
      if (!ExpectName(&target)) return false;
      s->vars.push_back(target);
      if (IsOp(".")) {
        Next();
        if (!ExpectName(&s->attr)) return false;
      }
      while (IsOp(",") && s->attr.empty()) {  // {% set a, b = ... %}
        Next();
        std::string v;
        if (!ExpectName(&v)) return false;
        s->vars.push_back(std::move(v));
      }
      if ((Peek().type == Tok::kBlockEnd || IsOp("|")) && s->vars.size() == 1) {
        if (!s->attr.empty()) return Fail(Peek().pos, "expected '='");
        s->k = Stmt::K::kSetBlock;  // {% set x %}...{% endset %}, {% set x | f %}...
        if (IsOp("|") && !ParseFilterChain(&s->expr)) return false;
        if (!ExpectBlockEnd() || !ParseBody(&s->body, {"endset"}, &stop, &kw) ||
            !ExpectBlockEnd()) {
          return false;
        }
      } else {
        s->k = Stmt::K::kSet;
        if (!Expect("=") || !ParseExpr(&s->expr)) return false;
        if (IsOp(",")) {  // a bare tuple: {% set t = 1, 2 %}
          ExprPtr e = Make(Expr::K::kList, s->expr->pos);
          e->args.push_back(std::move(s->expr));
          while (IsOp(",")) {
            Next();
            if (Peek().type == Tok::kBlockEnd) break;
            ExprPtr x;
            if (!ParseExpr(&x)) return false;
            e->args.push_back(std::move(x));
          }
          s->expr = std::move(e);
        }
        if (!ExpectBlockEnd()) return false;
      }
    } else if (k == "macro") {
      s->k = Stmt::K::kMacro;
      if (!ExpectName(&s->name) || !Expect("(") || !ParseParams(s.get())) return false;
      if (!ExpectBlockEnd()) return false;
      if (!ParseBody(&s->body, {"endmacro"}, &stop, &kw)) return false;
      if (Peek().type == Tok::kName) Next();  // {% endmacro name %}
      if (!ExpectBlockEnd()) return false;
    } else if (k == "break" || k == "continue") {
      s->k = k == "break" ? Stmt::K::kBreak : Stmt::K::kContinue;
      if (!ExpectBlockEnd()) return false;
    } else if (k == "generation") {  // transformers' assistant-mask marker: renders its body
      s->k = Stmt::K::kBlock;
      if (!ExpectBlockEnd() || !ParseBody(&s->body, {"endgeneration"}, &stop, &kw) ||
          !ExpectBlockEnd()) {
        return false;
      }
    } else if (k == "filter") {
      s->k = Stmt::K::kFilterBlock;
      if (!ParseFilterChain(&s->expr)) return false;
      if (!ExpectBlockEnd() || !ParseBody(&s->body, {"endfilter"}, &stop, &kw) ||
          !ExpectBlockEnd()) {
        return false;
      }
    } else if (k == "call") {
      s->k = Stmt::K::kCallBlock;
      if (IsOp("(")) {  // {% call(item) macro() %}: the parameters of caller()
        Next();
        if (!ParseParams(s.get())) return false;
      }
      const size_t at = Peek().pos;
      if (!ParseExpr(&s->expr)) return false;
      if (s->expr->k != Expr::K::kCall) return Fail(at, "expected a macro call after 'call'");
      if (!ExpectBlockEnd() || !ParseBody(&s->body, {"endcall"}, &stop, &kw) || !ExpectBlockEnd()) {
        return false;
      }
    } else if (k == "with") {
      s->k = Stmt::K::kWith;
      while (Peek().type == Tok::kName) {
        std::string v;
        ExprPtr value;
        if (!ExpectName(&v) || !Expect("=") || !ParseExpr(&value)) return false;
        s->vars.push_back(std::move(v));
        s->defaults.push_back(std::move(value));
        if (!IsOp(",")) break;
        Next();
      }
      if (!ExpectBlockEnd() || !ParseBody(&s->body, {"endwith"}, &stop, &kw) || !ExpectBlockEnd()) {
        return false;
      }
    } else if (k == "do") {
      s->k = Stmt::K::kDo;
      if (!ParseExpr(&s->expr) || !ExpectBlockEnd()) return false;
    } else {
      return Fail(kw.pos, "unknown statement '" + k + "'");
    }
    out->push_back(std::move(s));
    return true;
  }

  // The filters of {% filter f|g(x) %} and {% set x | f %}: a chain over the block's text.
  bool ParseFilterChain(ExprPtr* out) {
    ExprPtr chain = Make(Expr::K::kBlockValue, Peek().pos);
    int filters = 0;
    do {
      if (IsOp("|")) Next();
      if (++filters > limits_.max_nesting) {
        return Fail(Peek().pos,
                    "nesting deeper than the limit of " + std::to_string(limits_.max_nesting));
      }
      ExprPtr e = Make(Expr::K::kFilter, Peek().pos);
      if (!ExpectName(&e->name)) return false;
      e->args.push_back(std::move(chain));
      if (IsOp("(")) {
        Next();
        if (!ParseArgs(e.get())) return false;
      }
      chain = std::move(e);
    } while (IsOp("|"));
    *out = std::move(chain);
    return true;
  }

  // Macro or caller parameters after '(' up to and including ')': names with optional defaults.
  bool ParseParams(Stmt* s) {
    while (!IsOp(")")) {
      std::string p;
      if (!ExpectName(&p)) return false;
      s->params.push_back(p);
      ExprPtr def;
      if (IsOp("=")) {
        Next();
        if (!ParseExpr(&def)) return false;
      }
      s->defaults.push_back(std::move(def));
      if (!IsOp(",")) break;
      Next();
    }
    return Expect(")");
  }

  ExprPtr Make(Expr::K k, size_t pos) {
    auto e = std::make_unique<Expr>();
    e->k = k;
    e->pos = pos;
    return e;
  }

  // expr := or ['if' or ['else' expr]]
  bool ParseExpr(ExprPtr* out) {
    Depth d(this);
    if (!CheckDepth(Peek().pos)) return false;
    ExprPtr value;
    if (!ParseOr(&value)) return false;
    if (!IsName("if")) {
      *out = std::move(value);
      return true;
    }
    const size_t at = Next().pos;
    ExprPtr e = Make(Expr::K::kTernary, at);
    ExprPtr cond, other;
    if (!ParseOr(&cond)) return false;
    if (IsName("else")) {
      Next();
      if (!ParseExpr(&other)) return false;
    }
    e->args.push_back(std::move(cond));
    e->args.push_back(std::move(value));
    e->args.push_back(std::move(other));
    *out = std::move(e);
    return true;
  }

  bool ParseOr(ExprPtr* out) {
    Chain c(this);
    if (!ParseAnd(out)) return false;
    while (IsName("or")) {
      if (!c.Link(Peek().pos)) return false;
      ExprPtr e = Make(Expr::K::kOr, Next().pos);
      ExprPtr rhs;
      if (!ParseAnd(&rhs)) return false;
      e->args.push_back(std::move(*out));
      e->args.push_back(std::move(rhs));
      *out = std::move(e);
    }
    return true;
  }

  bool ParseAnd(ExprPtr* out) {
    Chain c(this);
    if (!ParseNot(out)) return false;
    while (IsName("and")) {
      if (!c.Link(Peek().pos)) return false;
      ExprPtr e = Make(Expr::K::kAnd, Next().pos);
      ExprPtr rhs;
      if (!ParseNot(&rhs)) return false;
      e->args.push_back(std::move(*out));
      e->args.push_back(std::move(rhs));
      *out = std::move(e);
    }
    return true;
  }

  bool ParseNot(ExprPtr* out) {
    if (IsName("not")) {
      Depth d(this);
      if (!CheckDepth(Peek().pos)) return false;
      ExprPtr e = Make(Expr::K::kUnary, Next().pos);
      e->name = "not";
      ExprPtr x;
      if (!ParseNot(&x)) return false;
      e->args.push_back(std::move(x));
      *out = std::move(e);
      return true;
    }
    return ParseCompare(out);
  }

  bool ParseCompare(ExprPtr* out) {
    Chain c(this);
    if (!ParseMath1(out)) return false;
    while (true) {
      const Token& t = Peek();
      std::string op;
      if (t.type == Tok::kOp && (t.text == "==" || t.text == "!=" || t.text == "<" ||
                                 t.text == "<=" || t.text == ">" || t.text == ">=")) {
        op = t.text;
        Next();
      } else if (IsName("in")) {
        op = "in";
        Next();
      } else if (IsName("not") && IsName("in", 1)) {
        op = "not in";
        Next();
        Next();
      } else {
        return true;
      }
      if (!c.Link(t.pos)) return false;
      ExprPtr e = Make(Expr::K::kBinary, t.pos);
      e->name = op;
      ExprPtr rhs;
      if (!ParseMath1(&rhs)) return false;
      e->args.push_back(std::move(*out));
      e->args.push_back(std::move(rhs));
      *out = std::move(e);
    }
  }

  bool ParseBinaryLevel(ExprPtr* out, std::initializer_list<std::string_view> ops,
                        bool (Parser::*next)(ExprPtr*)) {
    Chain c(this);
    if (!(this->*next)(out)) return false;
    while (true) {
      const Token& t = Peek();
      bool match = false;
      for (std::string_view op : ops) match = match || (t.type == Tok::kOp && t.text == op);
      if (!match) return true;
      if (!c.Link(t.pos)) return false;
      Next();
      ExprPtr e = Make(Expr::K::kBinary, t.pos);
      e->name = t.text;
      ExprPtr rhs;
      if (!(this->*next)(&rhs)) return false;
      e->args.push_back(std::move(*out));
      e->args.push_back(std::move(rhs));
      *out = std::move(e);
    }
  }
  bool ParseMath1(ExprPtr* out) { return ParseBinaryLevel(out, {"+", "-"}, &Parser::ParseConcat); }
  bool ParseConcat(ExprPtr* out) { return ParseBinaryLevel(out, {"~"}, &Parser::ParseMath2); }
  bool ParseMath2(ExprPtr* out) {
    return ParseBinaryLevel(out, {"*", "/", "//", "%"}, &Parser::ParsePow);
  }
  bool ParsePow(ExprPtr* out) { return ParseBinaryLevel(out, {"**"}, &Parser::ParseUnary); }

  bool ParseUnary(ExprPtr* out) {
    Depth d(this);
    if (!CheckDepth(Peek().pos)) return false;
    if (IsOp("-") || IsOp("+")) {
      ExprPtr e = Make(Expr::K::kUnary, Peek().pos);
      e->name = Next().text;
      ExprPtr x;
      if (!ParseUnary(&x)) return false;
      e->args.push_back(std::move(x));
      *out = std::move(e);
      return true;
    }
    if (!ParsePrimary(out) || !ParsePostfix(out)) return false;
    return ParseFilters(out);
  }

  bool ParseArgs(Expr* e) {  // after '(' up to and including ')'
    while (!IsOp(")")) {
      if (Peek().type == Tok::kName && IsOp("=", 1)) {
        std::string key = Next().text;
        Next();
        ExprPtr v;
        if (!ParseExpr(&v)) return false;
        e->kwargs.emplace_back(std::move(key), std::move(v));
      } else {
        ExprPtr v;
        if (!ParseExpr(&v)) return false;
        e->args.push_back(std::move(v));
      }
      if (!IsOp(",")) break;
      Next();
    }
    return Expect(")");
  }

  bool ParsePostfix(ExprPtr* out) {
    Chain c(this);
    while (true) {
      if ((IsOp(".") || IsOp("[") || IsOp("(")) && !c.Link(Peek().pos)) return false;
      if (IsOp(".")) {
        ExprPtr e = Make(Expr::K::kAttr, Next().pos);
        if (Peek().type == Tok::kInt) {  // foo.0
          e->k = Expr::K::kItem;
          ExprPtr idx = Make(Expr::K::kLiteral, Peek().pos);
          idx->lit = Value(Next().i);
          e->args.push_back(std::move(*out));
          e->args.push_back(std::move(idx));
        } else {
          if (!ExpectName(&e->name)) return false;
          e->args.push_back(std::move(*out));
        }
        *out = std::move(e);
      } else if (IsOp("[")) {
        const size_t at = Next().pos;
        ExprPtr parts[3];
        bool slice = false;
        for (int i = 0; i < 3; ++i) {
          if (!IsOp(":") && !IsOp("]")) {
            if (!ParseExpr(&parts[i])) return false;
          }
          if (i < 2 && IsOp(":")) {
            Next();
            slice = true;
          } else {
            break;
          }
        }
        if (!Expect("]")) return false;
        ExprPtr e = Make(slice ? Expr::K::kSlice : Expr::K::kItem, at);
        if (!slice && !parts[0]) return Fail(at, "expected an index");
        e->args.push_back(std::move(*out));
        e->args.push_back(std::move(parts[0]));
        if (slice) {
          e->args.push_back(std::move(parts[1]));
          e->args.push_back(std::move(parts[2]));
        }
        *out = std::move(e);
      } else if (IsOp("(")) {
        ExprPtr e = Make(Expr::K::kCall, Next().pos);
        e->args.push_back(std::move(*out));
        if (!ParseArgs(e.get())) return false;
        *out = std::move(e);
      } else {
        return true;
      }
    }
  }

  bool ParseFilters(ExprPtr* out) {
    Chain c(this);
    while (true) {
      if ((IsOp("|") || IsName("is")) && !c.Link(Peek().pos)) return false;
      if (IsOp("|")) {
        ExprPtr e = Make(Expr::K::kFilter, Next().pos);
        if (!ExpectName(&e->name)) return false;
        e->args.push_back(std::move(*out));
        if (IsOp("(")) {
          Next();
          if (!ParseArgs(e.get())) return false;
        }
        *out = std::move(e);
      } else if (IsName("is")) {
        ExprPtr e = Make(Expr::K::kTest, Next().pos);
        if (IsName("not")) {
          Next();
          e->negated = true;
        }
        // Tests named by keywords: none, true, false, in.
        if (Peek().type != Tok::kName) return Fail(Peek().pos, "expected a test name" + Found());
        e->name = Next().text;
        e->args.push_back(std::move(*out));
        if (IsOp("(")) {
          Next();
          if (!ParseArgs(e.get())) return false;
        } else if (Peek().type == Tok::kString || Peek().type == Tok::kInt ||
                   Peek().type == Tok::kFloat ||
                   (Peek().type == Tok::kName && !IsName("and") && !IsName("or") && !IsName("if") &&
                    !IsName("else") && !IsName("is") && !IsName("not") && !IsName("in"))) {
          ExprPtr arg;  // `x is divisibleby 3`, `x is sameas none`
          if (!ParsePrimary(&arg)) return false;
          e->args.push_back(std::move(arg));
        }
        *out = std::move(e);
      } else {
        return true;
      }
    }
  }

  bool ParsePrimary(ExprPtr* out) {
    const Token& t = Peek();
    switch (t.type) {
      case Tok::kName: {
        Next();
        ExprPtr e = Make(Expr::K::kLiteral, t.pos);
        if (t.text == "true" || t.text == "True") {
          e->lit = Value(true);
        } else if (t.text == "false" || t.text == "False") {
          e->lit = Value(false);
        } else if (t.text == "none" || t.text == "None") {
          e->lit = Value::None();
        } else {
          e->k = Expr::K::kName;
          e->name = t.text;
        }
        *out = std::move(e);
        return true;
      }
      case Tok::kString: {
        ExprPtr e = Make(Expr::K::kLiteral, t.pos);
        std::string s;
        while (Peek().type == Tok::kString) s += Next().text;  // 'a' 'b' is 'ab'
        e->lit = Value(std::move(s));
        *out = std::move(e);
        return true;
      }
      case Tok::kInt:
      case Tok::kFloat: {
        Next();
        ExprPtr e = Make(Expr::K::kLiteral, t.pos);
        e->lit = t.type == Tok::kInt ? Value(t.i) : Value(t.f);
        *out = std::move(e);
        return true;
      }
      case Tok::kOp:
        if (t.text == "(") {
          Next();
          ExprPtr first;
          if (IsOp(")")) {  // the empty tuple
            Next();
            *out = Make(Expr::K::kList, t.pos);
            return true;
          }
          if (!ParseExpr(&first)) return false;
          if (IsOp(",")) {  // a tuple, as a list
            ExprPtr e = Make(Expr::K::kList, t.pos);
            e->args.push_back(std::move(first));
            while (IsOp(",")) {
              Next();
              if (IsOp(")")) break;
              ExprPtr v;
              if (!ParseExpr(&v)) return false;
              e->args.push_back(std::move(v));
            }
            first = std::move(e);
          }
          if (!Expect(")")) return false;
          *out = std::move(first);
          return true;
        }
        if (t.text == "[" || t.text == "{") {
          const bool dict = t.text == "{";
          const std::string close = dict ? "}" : "]";
          Next();
          ExprPtr e = Make(dict ? Expr::K::kDict : Expr::K::kList, t.pos);
          while (!IsOp(close)) {
            ExprPtr v;
            if (!ParseExpr(&v)) return false;
            e->args.push_back(std::move(v));
            if (dict) {
              if (!Expect(":")) return false;
              ExprPtr val;
              if (!ParseExpr(&val)) return false;
              e->args.push_back(std::move(val));
            }
            if (!IsOp(",")) break;
            Next();
          }
          if (!Expect(close)) return false;
          *out = std::move(e);
          return true;
        }
        break;
      default:
        break;
    }
    return Fail(t.pos, "expected an expression" + Found());
  }

  const std::vector<Token>& t_;
  const Positions& pos_;
  const Limits& limits_;
  size_t p_ = 0;
  int depth_ = 0;
  int links_ = 0;  // chain links on the current path (Chain)
  Error err_;
};

}  // namespace

Result<Template> Template::Parse(std::string_view source, const Limits& limits) {
  if (source.size() > limits.max_template_bytes) {
    return Error{"template of " + std::to_string(source.size()) +
                 " bytes is over the size limit of " + std::to_string(limits.max_template_bytes)};
  }
  auto impl = std::make_shared<Impl>();
  impl->source = std::string(source);
  impl->limits = limits;
  impl->positions = std::make_unique<Positions>(impl->source);
  Lexer lexer(impl->source, *impl->positions);
  Result<std::vector<Token>> toks = lexer.Run();
  if (!toks.ok()) return toks.error();
  Parser parser(*toks, *impl->positions, impl->limits);
  if (!parser.ParseTemplate(&impl->body)) return parser.error();
  return Template(std::move(impl));
}

// ---------------------------------------------------------------------------------------------
// Renderer

namespace {

#define JINJA_TRY(x)        \
  do {                      \
    if (!(x)) return false; \
  } while (0)

enum class Flow { kNormal, kBreak, kContinue };

class Renderer {
  using Impl = Template::Impl;

 public:
  Renderer(const Impl& impl, const Value& context, const RenderOptions& options)
      : impl_(impl), lim_(impl.limits), context_(context), options_(options) {
    frames_.emplace_back();
  }

  bool Run(std::string* out) {
    JINJA_TRY(CheckContext());
    Flow flow = Flow::kNormal;
    JINJA_TRY(RenderBody(impl_.body, &flow));
    *out = std::move(out_);
    return true;
  }
  const Error& error() const { return err_; }

 private:
  using Frame = std::vector<std::pair<std::string, Value>>;
  struct ActiveLoop {
    const Stmt* s;
    Value obj;  // its `loop` object of this iteration (kept alive: compared by address)
    int64_t depth;
    Value last;  // loop.changed()'s last values
    bool has_last;
  };
  struct CallerScope {
    const Stmt* s;  // the call block
    Frame frame;    // the variables its body sees
  };

  bool Fail(size_t pos, const std::string& what) {
    if (err_.message.empty()) err_.message = impl_.positions->Where(pos) + ": " + what;
    return false;
  }

  bool Charge(size_t pos, int64_t units) {
    work_ += units;
    if (work_ > lim_.max_work) {
      return Fail(pos, "the template work limit of " + std::to_string(lim_.max_work) +
                           " steps is exceeded");
    }
    return true;
  }
  bool CheckSize(size_t pos, size_t n) {
    if (n > lim_.max_output_bytes) {
      return Fail(pos, "a value of " + std::to_string(n) + " bytes is over the output limit of " +
                           std::to_string(lim_.max_output_bytes) + " bytes");
    }
    return Charge(pos, static_cast<int64_t>(n / 16));
  }
  bool CheckCount(size_t pos, int64_t n) {
    if (n > lim_.max_loop_iterations) {
      return Fail(pos, "a list of " + std::to_string(n) + " items is over the loop limit of " +
                           std::to_string(lim_.max_loop_iterations) + " iterations");
    }
    return Charge(pos, n);
  }

  struct DepthGuard {
    explicit DepthGuard(int* d) : d(d) { ++*d; }
    ~DepthGuard() { --*d; }
    int* d;
  };
  bool CheckDepth(size_t pos) {
    if (depth_ > lim_.max_nesting * 4) {
      return Fail(
          pos, "rendering nests deeper than the limit of " + std::to_string(lim_.max_nesting * 4));
    }
    return true;
  }

  bool Emit(size_t pos, std::string_view s) {
    if (out_.size() + s.size() > lim_.max_output_bytes) {
      return Fail(pos, "the output is over the limit of " + std::to_string(lim_.max_output_bytes) +
                           " bytes");
    }
    out_ += s;
    return Charge(pos, static_cast<int64_t>(s.size() / 16 + 1));
  }

  // ---- variables

  const Value* Lookup(const std::string& name) const {
    for (size_t i = frames_.size(); i-- > floor_;) {
      for (const auto& [k, v] : frames_[i]) {
        if (k == name) return &v;
      }
    }
    if (floor_ > 0) {
      for (const auto& [k, v] : frames_[0]) {
        if (k == name) return &v;
      }
    }
    return context_.Find(name);
  }
  void Assign(const std::string& name, Value v) {
    Frame& f = frames_.back();
    for (auto& [k, old] : f) {
      if (k == name) {
        old = std::move(v);
        return;
      }
    }
    f.emplace_back(name, std::move(v));
  }

  // ---- statements

  bool RenderBody(const Body& body, Flow* flow) {
    DepthGuard g(&depth_);
    for (const auto& s : body) {
      JINJA_TRY(RenderStmt(*s, flow));
      if (*flow != Flow::kNormal) return true;
    }
    return true;
  }

  bool RenderStmt(const Stmt& s, Flow* flow) {
    JINJA_TRY(CheckDepth(s.pos));
    JINJA_TRY(Charge(s.pos, 1));
    switch (s.k) {
      case Stmt::K::kText:
        return Emit(s.pos, s.text);
      case Stmt::K::kOutput: {
        Value v;
        JINJA_TRY(Eval(*s.expr, &v));
        return EmitValue(s.pos, v);
      }
      case Stmt::K::kIf:
        for (const auto& [cond, body] : s.branches) {
          bool take = true;
          if (cond) {
            Value c;
            JINJA_TRY(Eval(*cond, &c));
            take = c.Truthy();
          }
          if (take) return RenderBody(body, flow);
        }
        return true;
      case Stmt::K::kFor:
        return RenderFor(s, flow);
      case Stmt::K::kSet: {
        Value v;
        JINJA_TRY(Eval(*s.expr, &v));
        const Value* target = s.attr.empty() ? nullptr : Lookup(s.vars[0]);
        JINJA_TRY(CheckStored(
            s.pos, v, target != nullptr && target->is_object() ? &target->object() : nullptr, 0));
        if (s.vars.size() > 1) {
          if (!v.is_array() || v.array().size() != s.vars.size()) {
            return Fail(s.pos,
                        "cannot unpack a value into " + std::to_string(s.vars.size()) + " names");
          }
          for (size_t i = 0; i < s.vars.size(); ++i) Assign(s.vars[i], v.array()[i]);
          return true;
        }
        if (s.attr.empty()) {
          Assign(s.vars[0], std::move(v));
          return true;
        }
        if (target == nullptr || !target->is_object()) {
          return Fail(s.pos, "'" + s.vars[0] + "' is not a namespace");
        }
        Value ns = *target;  // shares the object
        ns.Set(s.attr, std::move(v));
        return true;
      }
      case Stmt::K::kSetBlock: {
        std::string text;
        JINJA_TRY(Capture(s.body, &text));
        if (!s.expr) {
          Assign(s.vars[0], Value(std::move(text)));
          return true;
        }
        block_value_ = std::move(text);
        Value v;
        JINJA_TRY(Eval(*s.expr, &v));
        block_value_.clear();
        Assign(s.vars[0], std::move(v));
        return true;
      }
      case Stmt::K::kMacro:
        Assign(s.name, Value::MakeMacro(&s));
        return true;
      case Stmt::K::kBreak:
        *flow = Flow::kBreak;
        return true;
      case Stmt::K::kContinue:
        *flow = Flow::kContinue;
        return true;
      case Stmt::K::kBlock:
        return RenderBody(s.body, flow);
      case Stmt::K::kDo: {
        Value v;
        return Eval(*s.expr, &v);
      }
      case Stmt::K::kFilterBlock: {
        std::string text;
        JINJA_TRY(Capture(s.body, &text));
        // The chain's first filter reads the text before any of its arguments is evaluated,
        // so a filter block inside an argument cannot replace it first.
        block_value_ = std::move(text);
        Value v;
        JINJA_TRY(Eval(*s.expr, &v));
        block_value_.clear();
        return EmitValue(s.pos, v);
      }
      case Stmt::K::kCallBlock:
        return RenderCallBlock(s);
      case Stmt::K::kWith: {
        Frame f;
        for (size_t i = 0; i < s.vars.size(); ++i) {
          Value v;
          JINJA_TRY(Eval(*s.defaults[i], &v));
          JINJA_TRY(CheckStored(s.pos, v, nullptr, 0));
          f.emplace_back(s.vars[i], std::move(v));
        }
        frames_.push_back(std::move(f));
        struct Pop {
          ~Pop() { r->frames_.pop_back(); }
          Renderer* r;
        } pop{this};
        return RenderBody(s.body, flow);
      }
    }
    return true;
  }

  bool EmitValue(size_t pos, const Value& v) {
    if (v.is_string()) return Emit(pos, v.str());
    std::string text;
    PyStr(v, &text);
    return Emit(pos, text);
  }

  // {% call(params) macro(args) %}body{% endcall %}: the macro runs with `caller` bound to the
  // body, which renders in a copy of the variables seen at the call block.
  bool RenderCallBlock(const Stmt& s) {
    const Expr& call = *s.expr;
    const Expr& callee = *call.args[0];
    Value fn;
    if (callee.k == Expr::K::kAttr) {
      Value obj;
      JINJA_TRY(Eval(*callee.args[0], &obj));
      if (const Value* m = obj.Find(callee.name)) fn = *m;
    } else {
      JINJA_TRY(Eval(callee, &fn));
    }
    if (!fn.is_macro()) return Fail(call.pos, "'call' needs a macro to call");
    Args args;
    JINJA_TRY(EvalArgs(call, 1, &args));
    Frame scope;
    auto add = [&](const Frame& f) {
      for (const auto& [k, v] : f) {
        bool found = false;
        for (auto& [k2, v2] : scope) {
          if (k2 == k) {
            v2 = v;
            found = true;
            break;
          }
        }
        if (!found) scope.emplace_back(k, v);
      }
    };
    if (floor_ > 0) add(frames_[0]);
    for (size_t i = floor_; i < frames_.size(); ++i) add(frames_[i]);
    JINJA_TRY(Charge(s.pos, static_cast<int64_t>(scope.size() * scope.size() / 16 + 1)));
    callers_.push_back(CallerScope{&s, std::move(scope)});
    Value out;
    const bool ok = CallMacro(call.pos, fn, args, &out, &s);
    callers_.pop_back();
    JINJA_TRY(ok);
    return EmitValue(s.pos, out);
  }

  // The variables a render starts with: nested at most kMaxValueDepth, checked without
  // recursion (each visit charged as work, so shared sub-values cannot make it unbounded).
  bool CheckContext() {
    std::vector<std::pair<const Value*, int>> todo{{&context_, 0}};
    while (!todo.empty()) {
      auto [v, depth] = todo.back();
      todo.pop_back();
      if (!v->is_array() && !v->is_object()) continue;
      if (depth >= kMaxValueDepth) {
        return Fail(0, "the template's variables nest deeper than the limit of " +
                           std::to_string(kMaxValueDepth));
      }
      if (v->is_array()) {
        JINJA_TRY(Charge(0, static_cast<int64_t>(v->array().size())));
        for (const Value& x : v->array()) todo.push_back({&x, depth + 1});
      } else {
        JINJA_TRY(Charge(0, static_cast<int64_t>(v->object().size())));
        for (const auto& [k, x] : v->object()) todo.push_back({&x, depth + 1});
      }
    }
    return true;
  }

  // A value stored by `set`: bounded nesting, and a namespace never inside itself (so values
  // stay acyclic and every walk over them ends).
  bool CheckStored(size_t pos, const Value& v, const Object* forbid, int depth) {
    if (depth > kMaxValueDepth) {
      return Fail(pos, "values nest deeper than the limit of " + std::to_string(kMaxValueDepth));
    }
    if (v.is_array()) {
      JINJA_TRY(Charge(pos, static_cast<int64_t>(v.array().size())));
      for (const Value& x : v.array()) JINJA_TRY(CheckStored(pos, x, forbid, depth + 1));
    } else if (v.is_object()) {
      if (&v.object() == forbid) return Fail(pos, "a namespace cannot hold itself");
      JINJA_TRY(Charge(pos, static_cast<int64_t>(v.object().size())));
      for (const auto& [k, x] : v.object()) JINJA_TRY(CheckStored(pos, x, forbid, depth + 1));
    }
    return true;
  }

  bool Capture(const Body& body, std::string* text) {
    std::string saved = std::move(out_);
    out_.clear();
    Flow flow = Flow::kNormal;
    const bool ok = RenderBody(body, &flow);
    *text = std::move(out_);
    out_ = std::move(saved);
    return ok;
  }

  bool Iterable(size_t pos, const Value& v, Array* items) {
    if (v.is_array()) {
      *items = v.array();
    } else if (v.is_object()) {
      for (const auto& [k, unused] : v.object()) items->emplace_back(k);
    } else if (v.is_string()) {
      for (char c : v.str()) items->emplace_back(std::string(1, c));
    } else if (v.is_undefined() || v.is_none()) {
      if (v.is_none()) return Fail(pos, "'None' is not iterable");
    } else {
      return Fail(pos, "a value of this type is not iterable");
    }
    return true;
  }

  bool RenderFor(const Stmt& s, Flow* flow) {
    Value seq;
    JINJA_TRY(Eval(*s.expr, &seq));
    return RenderLoop(s, s.expr->pos, seq, 1, flow);
  }

  // One level of a for loop over `seq`; depth is 1 for the loop itself and one more for each
  // loop(...) call of a recursive loop.
  bool RenderLoop(const Stmt& s, size_t pos, const Value& seq, int64_t depth, Flow* flow) {
    Array items;
    JINJA_TRY(Iterable(pos, seq, &items));
    frames_.emplace_back();
    loops_.push_back(ActiveLoop{&s, Value(), depth, Value(), false});
    struct Pop {
      ~Pop() {
        r->frames_.pop_back();
        r->loops_.pop_back();
      }
      Renderer* r;
    } pop{this};
    auto bind = [&](const Value& item) -> bool {
      if (s.vars.size() == 1) {
        Assign(s.vars[0], item);
        return true;
      }
      if (!item.is_array() || item.array().size() != s.vars.size()) {
        return Fail(s.pos, "cannot unpack an item into " + std::to_string(s.vars.size()) +
                               " loop variables");
      }
      for (size_t i = 0; i < s.vars.size(); ++i) Assign(s.vars[i], item.array()[i]);
      return true;
    };
    if (s.cond) {  // `for x in xs if cond`: the loop sees only the items that pass
      Array kept;
      for (const Value& item : items) {
        JINJA_TRY(CountIteration(s.pos));
        JINJA_TRY(bind(item));
        Value c;
        JINJA_TRY(Eval(*s.cond, &c));
        if (c.Truthy()) kept.push_back(item);
      }
      items = std::move(kept);
    }
    const int64_t n = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < n; ++i) {
      JINJA_TRY(CountIteration(s.pos));
      JINJA_TRY(bind(items[i]));
      Object loop = {{"index", Value(i + 1)},
                     {"index0", Value(i)},
                     {"revindex", Value(n - i)},
                     {"revindex0", Value(n - i - 1)},
                     {"first", Value(i == 0)},
                     {"last", Value(i == n - 1)},
                     {"length", Value(n)},
                     {"previtem", i > 0 ? items[i - 1] : Value()},
                     {"nextitem", i + 1 < n ? items[i + 1] : Value()},
                     {"depth", Value(depth)},
                     {"depth0", Value(depth - 1)}};
      Value lv = Value::MakeObject(std::move(loop));
      loops_.back().obj = lv;
      Assign("loop", std::move(lv));
      Flow f = Flow::kNormal;
      JINJA_TRY(RenderBody(s.body, &f));
      if (f == Flow::kBreak) break;
    }
    if (n == 0) return RenderBody(s.else_body, flow);
    return true;
  }

  bool CountIteration(size_t pos) {
    if (++iterations_ > lim_.max_loop_iterations) {
      return Fail(pos, "the loop limit of " + std::to_string(lim_.max_loop_iterations) +
                           " iterations is exceeded");
    }
    return Charge(pos, 1);
  }

  // ---- expressions

  bool Eval(const Expr& e, Value* out) {
    DepthGuard g(&depth_);
    JINJA_TRY(CheckDepth(e.pos));
    JINJA_TRY(Charge(e.pos, 1));
    switch (e.k) {
      case Expr::K::kLiteral:
        *out = e.lit;
        return true;
      case Expr::K::kName: {
        const Value* v = Lookup(e.name);
        *out = v != nullptr ? *v : Value();
        return true;
      }
      case Expr::K::kAttr: {
        Value obj;
        JINJA_TRY(Eval(*e.args[0], &obj));
        const Value* v = obj.Find(e.name);
        *out = v != nullptr ? *v : Value();
        return true;
      }
      case Expr::K::kItem: {
        Value obj, key;
        JINJA_TRY(Eval(*e.args[0], &obj));
        JINJA_TRY(Eval(*e.args[1], &key));
        return GetItem(obj, key, out);
      }
      case Expr::K::kSlice:
        return EvalSlice(e, out);
      case Expr::K::kCall:
        return EvalCall(e, out);
      case Expr::K::kFilter:
        return EvalFilter(e, out);
      case Expr::K::kTest: {
        bool r = false;
        JINJA_TRY(EvalTest(e, &r));
        *out = Value(r != e.negated);
        return true;
      }
      case Expr::K::kUnary: {
        Value x;
        JINJA_TRY(Eval(*e.args[0], &x));
        if (e.name == "not") {
          *out = Value(!x.Truthy());
          return true;
        }
        if (x.is_bool()) x = Value(static_cast<int64_t>(x.as_bool()));
        if (x.is_int()) {
          if (e.name == "-" && x.as_int() == std::numeric_limits<int64_t>::min()) {
            return Fail(e.pos, "integer overflow");
          }
          *out = Value(e.name == "-" ? -x.as_int() : x.as_int());
          return true;
        }
        if (x.is_float()) {
          *out = Value(e.name == "-" ? -x.as_double() : x.as_double());
          return true;
        }
        return Fail(e.pos, "bad operand for unary '" + e.name + "'");
      }
      case Expr::K::kAnd:
      case Expr::K::kOr: {
        Value a;
        JINJA_TRY(Eval(*e.args[0], &a));
        if (a.Truthy() == (e.k == Expr::K::kOr)) {
          *out = std::move(a);
          return true;
        }
        return Eval(*e.args[1], out);
      }
      case Expr::K::kTernary: {
        Value c;
        JINJA_TRY(Eval(*e.args[0], &c));
        if (c.Truthy()) return Eval(*e.args[1], out);
        if (e.args[2]) return Eval(*e.args[2], out);
        *out = Value();
        return true;
      }
      case Expr::K::kList: {
        Array a;
        for (const auto& x : e.args) {
          Value v;
          JINJA_TRY(Eval(*x, &v));
          a.push_back(std::move(v));
        }
        *out = Value::MakeArray(std::move(a));
        return true;
      }
      case Expr::K::kDict: {
        *out = Value::MakeObject();
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          Value k, v;
          JINJA_TRY(Eval(*e.args[i], &k));
          JINJA_TRY(Eval(*e.args[i + 1], &v));
          if (!k.is_string()) {
            std::string ks;
            PyStr(k, &ks);
            k = Value(ks);
          }
          out->Set(k.str(), std::move(v));
        }
        return true;
      }
      case Expr::K::kBinary:
        return EvalBinary(e, out);
      case Expr::K::kBlockValue:
        *out = Value(block_value_);
        return true;
    }
    return Fail(e.pos, "bad expression");
  }

  bool GetItem(const Value& obj, const Value& key, Value* out) {
    *out = Value();
    if (obj.is_object()) {
      std::string k;
      if (key.is_string()) {
        k = key.str();
      } else {
        PyStr(key, &k);
      }
      if (const Value* v = obj.Find(k)) *out = *v;
    } else if ((obj.is_array() || obj.is_string()) && (key.is_int() || key.is_bool())) {
      const int64_t n = obj.is_array() ? static_cast<int64_t>(obj.array().size())
                                       : static_cast<int64_t>(obj.str().size());
      int64_t i = key.is_bool() ? key.as_bool() : key.as_int();
      if (i < 0) i += n;
      if (i >= 0 && i < n) {
        *out = obj.is_array() ? obj.array()[i] : Value(std::string(1, obj.str()[i]));
      }
    }
    return true;
  }

  bool SliceIndex(const Expr* e, int64_t* out, bool* given) {
    *given = false;
    if (e == nullptr) return true;
    Value v;
    JINJA_TRY(Eval(*e, &v));
    if (v.is_none()) return true;
    if (!v.is_int()) return Fail(e->pos, "slice indices must be integers");
    *out = v.as_int();
    *given = true;
    return true;
  }

  bool EvalSlice(const Expr& e, Value* out) {
    Value obj;
    JINJA_TRY(Eval(*e.args[0], &obj));
    int64_t start = 0, stop = 0, step = 1;
    bool has_start, has_stop, has_step;
    JINJA_TRY(SliceIndex(e.args[1].get(), &start, &has_start));
    JINJA_TRY(SliceIndex(e.args[2].get(), &stop, &has_stop));
    JINJA_TRY(SliceIndex(e.args[3].get(), &step, &has_step));
    if (!has_step) step = 1;
    if (step == 0) return Fail(e.pos, "slice step cannot be zero");
    if (!obj.is_array() && !obj.is_string()) {
      *out = Value();
      return true;
    }
    const int64_t n = obj.is_array() ? static_cast<int64_t>(obj.array().size())
                                     : static_cast<int64_t>(obj.str().size());
    // Python's slice.indices.
    auto fix = [&](int64_t v, bool given, int64_t dflt) {
      if (!given) return dflt;
      if (v < 0) {
        v += n;
        if (v < 0) v = step < 0 ? -1 : 0;
      } else if (v >= n) {
        v = step < 0 ? n - 1 : n;
      }
      return v;
    };
    start = fix(start, has_start, step < 0 ? n - 1 : 0);
    stop = fix(stop, has_stop, step < 0 ? -1 : n);
    Array a;
    std::string s;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
      if (obj.is_array()) {
        a.push_back(obj.array()[i]);
      } else {
        s.push_back(obj.str()[i]);
      }
    }
    JINJA_TRY(Charge(e.pos, static_cast<int64_t>(a.size() + s.size() / 16)));
    *out = obj.is_array() ? Value::MakeArray(std::move(a)) : Value(std::move(s));
    return true;
  }

  static bool Equal(const Value& a, const Value& b) {
    const bool an = a.is_number() || a.is_bool(), bn = b.is_number() || b.is_bool();
    if (an && bn) {
      auto num = [](const Value& v) {
        return v.is_bool() ? static_cast<double>(v.as_bool()) : v.as_double();
      };
      if ((a.is_int() || a.is_bool()) && (b.is_int() || b.is_bool())) {
        return (a.is_bool() ? a.as_bool() : a.as_int()) == (b.is_bool() ? b.as_bool() : b.as_int());
      }
      return num(a) == num(b);
    }
    if (a.kind() != b.kind()) return false;
    switch (a.kind()) {
      case Value::Kind::kString:
        return a.str() == b.str();
      case Value::Kind::kArray: {
        if (a.array().size() != b.array().size()) return false;
        for (size_t i = 0; i < a.array().size(); ++i) {
          if (!Equal(a.array()[i], b.array()[i])) return false;
        }
        return true;
      }
      case Value::Kind::kObject: {
        if (a.object().size() != b.object().size()) return false;
        for (const auto& [k, v] : a.object()) {
          const Value* w = b.Find(k);
          if (w == nullptr || !Equal(v, *w)) return false;
        }
        return true;
      }
      case Value::Kind::kMacro:
        return a.macro() == b.macro();
      default:
        return true;  // undefined == undefined, none == none
    }
  }

  // -1, 0, 1; false when the values do not order.
  static bool Compare(const Value& a, const Value& b, int* cmp) {
    const bool an = a.is_number() || a.is_bool(), bn = b.is_number() || b.is_bool();
    if (an && bn) {
      if ((a.is_int() || a.is_bool()) && (b.is_int() || b.is_bool())) {
        const int64_t x = a.is_bool() ? a.as_bool() : a.as_int();
        const int64_t y = b.is_bool() ? b.as_bool() : b.as_int();
        *cmp = x < y ? -1 : x > y ? 1 : 0;
        return true;
      }
      const double x = a.is_bool() ? a.as_bool() : a.as_double();
      const double y = b.is_bool() ? b.as_bool() : b.as_double();
      *cmp = x < y ? -1 : x > y ? 1 : 0;
      return true;
    }
    if (a.is_string() && b.is_string()) {
      const int c = a.str().compare(b.str());
      *cmp = c < 0 ? -1 : c > 0 ? 1 : 0;
      return true;
    }
    if (a.is_array() && b.is_array()) {
      const size_t n = std::min(a.array().size(), b.array().size());
      for (size_t i = 0; i < n; ++i) {
        if (!Compare(a.array()[i], b.array()[i], cmp)) return false;
        if (*cmp != 0) return true;
      }
      *cmp = a.array().size() < b.array().size() ? -1 : a.array().size() > b.array().size() ? 1 : 0;
      return true;
    }
    return false;
  }

  bool Contains(size_t pos, const Value& hay, const Value& needle, bool* r) {
    *r = false;
    if (hay.is_string()) {
      if (!needle.is_string()) return Fail(pos, "'in <string>' needs a string on the left");
      *r = hay.str().find(needle.str()) != std::string::npos;
    } else if (hay.is_array()) {
      for (const Value& v : hay.array()) {
        if (Equal(v, needle)) {
          *r = true;
          break;
        }
      }
    } else if (hay.is_object()) {
      *r = needle.is_string() && hay.Find(needle.str()) != nullptr;
    } else if (!hay.is_undefined() && !hay.is_none()) {
      return Fail(pos, "the right side of 'in' is not a container");
    } else if (hay.is_none()) {
      return Fail(pos, "argument of type 'NoneType' is not iterable");
    }
    return true;
  }

  bool Arith(size_t pos, const std::string& op, Value a, Value b, Value* out) {
    if (op == "%" && a.is_string()) return PercentFormat(pos, a.str(), b, out);
    if (a.is_bool()) a = Value(static_cast<int64_t>(a.as_bool()));
    if (b.is_bool()) b = Value(static_cast<int64_t>(b.as_bool()));
    if (op == "+") {
      if (a.is_string() && b.is_string()) {
        JINJA_TRY(CheckSize(pos, a.str().size() + b.str().size()));
        *out = Value(a.str() + b.str());
        return true;
      }
      if (a.is_array() && b.is_array()) {
        JINJA_TRY(CheckCount(pos, static_cast<int64_t>(a.array().size() + b.array().size())));
        Array r = a.array();
        r.insert(r.end(), b.array().begin(), b.array().end());
        *out = Value::MakeArray(std::move(r));
        return true;
      }
    }
    if (op == "*" && ((a.is_string() || a.is_array()) && b.is_int())) std::swap(a, b);
    if (op == "*" && a.is_int() && (b.is_string() || b.is_array())) {
      const int64_t n = std::max<int64_t>(0, a.as_int());
      if (b.is_string()) {
        if (n > 0 && b.str().size() > lim_.max_output_bytes / static_cast<uint64_t>(n)) {
          return CheckSize(pos, lim_.max_output_bytes + 1);
        }
        JINJA_TRY(CheckSize(pos, b.str().size() * n));
        std::string r;
        for (int64_t i = 0; i < n; ++i) r += b.str();
        *out = Value(std::move(r));
      } else {
        if (n > 0 && b.array().size() > static_cast<uint64_t>(lim_.max_loop_iterations) / n) {
          return CheckCount(pos, lim_.max_loop_iterations + 1);
        }
        JINJA_TRY(CheckCount(pos, static_cast<int64_t>(b.array().size()) * n));
        Array r;
        for (int64_t i = 0; i < n; ++i) r.insert(r.end(), b.array().begin(), b.array().end());
        *out = Value::MakeArray(std::move(r));
      }
      return true;
    }
    if (!a.is_number() || !b.is_number()) {
      return Fail(pos, "unsupported operand types for '" + op + "'");
    }
    if (a.is_int() && b.is_int() && op != "/") {
      const int64_t x = a.as_int(), y = b.as_int();
      int64_t r = 0;
      if (op == "+") {
        if (__builtin_add_overflow(x, y, &r)) return Fail(pos, "integer overflow");
      } else if (op == "-") {
        if (__builtin_sub_overflow(x, y, &r)) return Fail(pos, "integer overflow");
      } else if (op == "*") {
        if (__builtin_mul_overflow(x, y, &r)) return Fail(pos, "integer overflow");
      } else if (op == "//" || op == "%") {
        if (y == 0) return Fail(pos, "division by zero");
        if (x == std::numeric_limits<int64_t>::min() && y == -1) {
          if (op == "%") {
            r = 0;
          } else {
            return Fail(pos, "integer overflow");
          }
        } else {
          int64_t q = x / y, m = x % y;
          if (m != 0 && ((m < 0) != (y < 0))) {
            --q;
            m += y;
          }
          r = op == "//" ? q : m;
        }
      } else if (op == "**") {
        if (y < 0) {
          *out = Value(std::pow(static_cast<double>(x), static_cast<double>(y)));
          return true;
        }
        r = 1;
        for (int64_t i = 0; i < y; ++i) {
          if (__builtin_mul_overflow(r, x, &r)) return Fail(pos, "integer overflow");
          if (r == 0 || r == 1) break;
          if (r == -1) {
            r = (y % 2 == 0) ? 1 : -1;
            break;
          }
        }
      }
      *out = Value(r);
      return true;
    }
    const double x = a.as_double(), y = b.as_double();
    double r = 0;
    if (op == "+") {
      r = x + y;
    } else if (op == "-") {
      r = x - y;
    } else if (op == "*") {
      r = x * y;
    } else if (op == "/") {
      if (y == 0) return Fail(pos, "division by zero");
      r = x / y;
    } else if (op == "//") {
      if (y == 0) return Fail(pos, "division by zero");
      r = std::floor(x / y);
    } else if (op == "%") {
      if (y == 0) return Fail(pos, "division by zero");
      r = std::fmod(x, y);
      if (r != 0 && ((r < 0) != (y < 0))) r += y;
    } else if (op == "**") {
      r = std::pow(x, y);
    }
    *out = Value(r);
    return true;
  }

  // Python's printf-style formatting, fmt % values: a list (a tuple) gives the values in order,
  // a mapping the values of %(key)s, anything else the one value. Unless `exact`, a list given
  // to a format that takes one value, when the list does not hold exactly one, is that value.
  bool PercentFormat(size_t pos, const std::string& fmt, const Value& values, Value* out,
                     bool exact = false) {
    Array vals;
    const Value* mapping = nullptr;
    if (values.is_array()) {
      vals = values.array();
      size_t need = 0;  // values the format takes: one per conversion and one per '*'
      for (size_t i = 0; i + 1 < fmt.size(); ++i) {
        if (fmt[i] != '%') continue;
        if (fmt[i + 1] == '%') {
          ++i;
          continue;
        }
        ++need;
        for (++i; i < fmt.size() &&
                  std::string_view("-+ #0123456789.*hlL").find(fmt[i]) != std::string_view::npos;
             ++i) {
          need += fmt[i] == '*';
        }
      }
      if (!exact && need == 1 && vals.size() != 1) vals = Array{values};
    } else if (values.is_object()) {
      mapping = &values;
    } else {
      vals.push_back(values);
    }
    size_t next = 0;
    std::string r;
    const size_t n = fmt.size();
    auto take_int = [&](int64_t* v) -> bool {
      if (next >= vals.size()) return Fail(pos, "not enough arguments for format string");
      const Value& x = vals[next++];
      if (!x.is_int()) return Fail(pos, "* wants an integer");
      *v = x.as_int();
      return true;
    };
    for (size_t i = 0; i < n; ++i) {
      if (fmt[i] != '%') {
        r.push_back(fmt[i]);
        continue;
      }
      if (++i >= n) return Fail(pos, "incomplete format");
      std::string key;
      bool keyed = false;
      if (fmt[i] == '(') {
        const size_t close = fmt.find(')', i);
        if (close == std::string::npos) return Fail(pos, "incomplete format key");
        key = fmt.substr(i + 1, close - i - 1);
        keyed = true;
        i = close + 1;
      }
      bool left = false, plus = false, space = false, alt = false, zero = false;
      for (; i < n; ++i) {
        const char c = fmt[i];
        if (c == '-') {
          left = true;
        } else if (c == '+') {
          plus = true;
        } else if (c == ' ') {
          space = true;
        } else if (c == '#') {
          alt = true;
        } else if (c == '0') {
          zero = true;
        } else {
          break;
        }
      }
      int64_t width = 0, prec = -1;
      if (i < n && fmt[i] == '*') {
        JINJA_TRY(take_int(&width));
        if (width < 0) {
          left = true;
          width = -width;
        }
        ++i;
      } else {
        for (; i < n && IsDigit(fmt[i]); ++i)
          width = std::min<int64_t>(width * 10 + (fmt[i] - '0'), 1LL << 40);
      }
      if (i < n && fmt[i] == '.') {
        ++i;
        prec = 0;
        if (i < n && fmt[i] == '*') {
          JINJA_TRY(take_int(&prec));
          prec = std::max<int64_t>(prec, 0);
          ++i;
        } else {
          for (; i < n && IsDigit(fmt[i]); ++i)
            prec = std::min<int64_t>(prec * 10 + (fmt[i] - '0'), 1LL << 40);
        }
      }
      while (i < n && (fmt[i] == 'h' || fmt[i] == 'l' || fmt[i] == 'L')) ++i;
      if (i >= n) return Fail(pos, "incomplete format");
      const char conv = fmt[i];
      if (conv == '%') {
        r.push_back('%');
        continue;
      }
      Value v;
      if (keyed) {
        if (mapping == nullptr) return Fail(pos, "format requires a mapping");
        const Value* x = mapping->Find(key);
        if (x == nullptr) return Fail(pos, "format key '" + key + "' is missing");
        v = *x;
      } else {
        if (mapping != nullptr) return Fail(pos, "format requires a tuple, not a mapping");
        if (next >= vals.size()) return Fail(pos, "not enough arguments for format string");
        v = vals[next++];
      }
      if (width > static_cast<int64_t>(lim_.max_output_bytes) ||
          prec > static_cast<int64_t>(lim_.max_output_bytes)) {
        return CheckSize(pos, lim_.max_output_bytes + 1);
      }
      std::string body;  // the converted value without its sign
      std::string sign;  // "-", "+", " " or "" (and 0x / 0o prefixes)
      bool numeric = false;
      if (v.is_bool() && conv != 's' && conv != 'r' && conv != 'a') {
        v = Value(static_cast<int64_t>(v.as_bool()));
      }
      switch (conv) {
        case 's':
        case 'r':
        case 'a':
          if (conv == 's') {
            PyStr(v, &body);
          } else {
            PyRepr(v, &body);
          }
          if (prec >= 0) {  // at most prec characters (UTF-8 aware)
            size_t chars = 0, at = 0;
            while (at < body.size() && chars < static_cast<size_t>(prec)) {
              ++at;
              while (at < body.size() && (static_cast<unsigned char>(body[at]) & 0xC0) == 0x80)
                ++at;
              ++chars;
            }
            body.resize(at);
          }
          break;
        case 'd':
        case 'i':
        case 'u':
        case 'x':
        case 'X':
        case 'o': {
          int64_t x = 0;
          if (v.is_int()) {
            x = v.as_int();
          } else if (v.is_float() && (conv == 'd' || conv == 'i' || conv == 'u')) {
            const double d = v.as_double();
            if (!std::isfinite(d) || std::fabs(d) >= 9.2e18) {
              return Fail(pos, "cannot convert float to integer in format");
            }
            x = static_cast<int64_t>(d);
          } else {
            return Fail(pos, std::string("%") + conv + " format: a number is required");
          }
          numeric = true;
          const uint64_t mag = x < 0 ? 0 - static_cast<uint64_t>(x) : static_cast<uint64_t>(x);
          char buf[32];
          const int base = conv == 'o' ? 8 : (conv == 'x' || conv == 'X') ? 16 : 10;
          auto res = std::to_chars(buf, buf + sizeof(buf), mag, base);
          body.assign(buf, res.ptr);
          if (conv == 'X') {
            for (char& c : body) c = Upper(c);
          }
          if (prec > static_cast<int64_t>(body.size())) {
            body.insert(0, static_cast<size_t>(prec) - body.size(), '0');
          }
          sign = x < 0 ? "-" : plus ? "+" : space ? " " : "";
          if (alt && base != 10) sign += conv == 'o' ? "0o" : conv == 'x' ? "0x" : "0X";
          break;
        }
        case 'f':
        case 'F':
        case 'e':
        case 'E':
        case 'g':
        case 'G': {
          if (!v.is_number()) {
            return Fail(pos, std::string("%") + conv + " format: a number is required");
          }
          numeric = true;
          const double d = v.as_double();
          const std::string cfmt = std::string("%") + (alt ? "#" : "") + ".*" + conv;
          const int p = static_cast<int>(std::min<int64_t>(prec < 0 ? 6 : prec, 400));
          char buf[512];
          const int len = std::snprintf(buf, sizeof(buf), cfmt.c_str(), p, std::fabs(d));
          if (len < 0 || len >= static_cast<int>(sizeof(buf))) {
            return Fail(pos, "a formatted number is too long");
          }
          body.assign(buf, static_cast<size_t>(len));
          sign = std::signbit(d) && !std::isnan(d) ? "-" : plus ? "+" : space ? " " : "";
          break;
        }
        case 'c':
          if (v.is_int()) {
            if (v.as_int() < 0 || v.as_int() > 0x10FFFF) return Fail(pos, "%c arg not in range");
            AppendUtf8(static_cast<uint32_t>(v.as_int()), &body);
          } else if (v.is_string()) {
            body = v.str();
          } else {
            return Fail(pos, "%c requires an integer or a character");
          }
          break;
        default:
          return Fail(pos, std::string("unsupported format character '") + conv + "'");
      }
      const size_t len = sign.size() + body.size();
      const size_t w = static_cast<size_t>(width);
      if (len >= w) {
        r += sign;
        r += body;
      } else if (left) {
        r += sign;
        r += body;
        r.append(w - len, ' ');
      } else if (zero && numeric) {
        r += sign;
        r.append(w - len, '0');
        r += body;
      } else {
        r.append(w - len, ' ');
        r += sign;
        r += body;
      }
      JINJA_TRY(CheckSize(pos, r.size()));
    }
    if (mapping == nullptr && next < vals.size()) {
      return Fail(pos, "not all arguments converted during string formatting");
    }
    *out = Value(std::move(r));
    return true;
  }

  bool EvalBinary(const Expr& e, Value* out) {
    Value a, b;
    JINJA_TRY(Eval(*e.args[0], &a));
    JINJA_TRY(Eval(*e.args[1], &b));
    const std::string& op = e.name;
    if (op == "~") {
      std::string s;
      PyStr(a, &s);
      PyStr(b, &s);
      JINJA_TRY(CheckSize(e.pos, s.size()));
      *out = Value(std::move(s));
      return true;
    }
    if (op == "==" || op == "!=") {
      *out = Value(Equal(a, b) == (op == "=="));
      return true;
    }
    if (op == "in" || op == "not in") {
      bool r = false;
      JINJA_TRY(Contains(e.pos, b, a, &r));
      *out = Value(r == (op == "in"));
      return true;
    }
    if (op == "<" || op == "<=" || op == ">" || op == ">=") {
      int c = 0;
      if (!Compare(a, b, &c)) return Fail(e.pos, "cannot compare these values with '" + op + "'");
      *out = Value(op == "<" ? c < 0 : op == "<=" ? c <= 0 : op == ">" ? c > 0 : c >= 0);
      return true;
    }
    return Arith(e.pos, op, std::move(a), std::move(b), out);
  }

  // ---- calls

  struct Args {
    Array pos;
    Object kw;
    const Value* Get(size_t i, std::string_view name) const {
      for (const auto& [k, v] : kw) {
        if (k == name) return &v;
      }
      return i < pos.size() ? &pos[i] : nullptr;
    }
  };

  bool EvalArgs(const Expr& e, size_t first, Args* args) {
    for (size_t i = first; i < e.args.size(); ++i) {
      Value v;
      JINJA_TRY(Eval(*e.args[i], &v));
      args->pos.push_back(std::move(v));
    }
    for (const auto& [k, x] : e.kwargs) {
      Value v;
      JINJA_TRY(Eval(*x, &v));
      args->kw.emplace_back(k, std::move(v));
    }
    return true;
  }

  bool EvalCall(const Expr& e, Value* out) {
    const Expr& callee = *e.args[0];
    Args args;
    if (callee.k == Expr::K::kAttr) {
      Value obj;
      JINJA_TRY(Eval(*callee.args[0], &obj));
      JINJA_TRY(EvalArgs(e, 1, &args));
      if (ActiveLoop* l = FindLoop(obj)) {
        if (callee.name == "cycle" || callee.name == "changed") {
          return LoopMethod(e.pos, l, obj, callee.name, args, out);
        }
      }
      const Value* member = obj.Find(callee.name);
      if (member != nullptr && member->is_macro()) return CallMacro(e.pos, *member, args, out);
      return CallMethod(e.pos, obj, callee.name, args, out);
    }
    Value fn;
    JINJA_TRY(Eval(callee, &fn));
    JINJA_TRY(EvalArgs(e, 1, &args));
    if (fn.is_macro()) return CallMacro(e.pos, fn, args, out);
    if (const ActiveLoop* l = FindLoop(fn)) return RecurseLoop(e.pos, *l, args, out);
    if (callee.k == Expr::K::kName && fn.is_undefined()) {
      return CallGlobal(e.pos, callee.name, args, out);
    }
    return Fail(e.pos, "the value called is not callable");
  }

  // The loop in progress whose `loop` object `v` is (nullptr when it is none).
  ActiveLoop* FindLoop(const Value& v) {
    if (!v.is_object()) return nullptr;
    for (size_t i = loops_.size(); i-- > 0;) {
      if (loops_[i].obj.is_object() && &loops_[i].obj.object() == &v.object()) return &loops_[i];
    }
    return nullptr;
  }

  bool LoopMethod(size_t pos, ActiveLoop* l, const Value& loop, const std::string& name,
                  const Args& args, Value* out) {
    if (name == "cycle") {
      if (args.pos.empty()) return Fail(pos, "loop.cycle() takes at least one value");
      const Value* i = loop.Find("index0");
      const int64_t k = i != nullptr && i->is_int() ? i->as_int() : 0;
      *out = args.pos[static_cast<size_t>(k) % args.pos.size()];
      return true;
    }
    // changed(*values): true on the first call and whenever the values differ from the last.
    Value now = Value::MakeArray(args.pos);
    *out = Value(!l->has_last || !Equal(l->last, now));
    l->last = std::move(now);
    l->has_last = true;
    return true;
  }

  // loop(items) inside a recursive loop: the loop's body over items, one level deeper.
  bool RecurseLoop(size_t pos, const ActiveLoop& l, const Args& args, Value* out) {
    if (!l.s->recursive) {
      return Fail(pos,
                  "loop() is called in a loop that is not recursive (add 'recursive' to its "
                  "'for')");
    }
    if (args.pos.size() != 1 || !args.kw.empty()) {
      return Fail(pos, "loop() takes one iterable");
    }
    if (call_depth_ >= lim_.max_call_depth) {
      return Fail(pos, "recursive loop calls nest deeper than the limit of " +
                           std::to_string(lim_.max_call_depth));
    }
    JINJA_TRY(CheckStored(pos, args.pos[0], nullptr, 0));
    const Stmt& s = *l.s;
    const int64_t depth = l.depth + 1;
    ++call_depth_;
    std::string saved = std::move(out_);
    out_.clear();
    Flow flow = Flow::kNormal;
    const bool ok = RenderLoop(s, pos, args.pos[0], depth, &flow);
    std::string text = std::move(out_);
    out_ = std::move(saved);
    --call_depth_;
    JINJA_TRY(ok);
    *out = Value(std::move(text));
    return true;
  }

  // Calls a macro, or a call block's body (caller()). `caller_block`: the call block whose
  // body the macro's `caller` renders.
  bool CallMacro(size_t pos, const Value& fn, const Args& args, Value* out,
                 const Stmt* caller_block = nullptr) {
    const Stmt& m = *static_cast<const Stmt*>(fn.macro());
    if (call_depth_ >= lim_.max_call_depth) {
      return Fail(pos, std::string(m.k == Stmt::K::kCallBlock ? "caller() and macro" : "macro") +
                           " calls nest deeper than the limit of " +
                           std::to_string(lim_.max_call_depth));
    }
    const size_t base = frames_.size();
    if (m.k == Stmt::K::kCallBlock) {
      const CallerScope* scope = nullptr;
      for (size_t i = callers_.size(); i-- > 0;) {
        if (callers_[i].s == &m) {
          scope = &callers_[i];
          break;
        }
      }
      if (scope == nullptr) return Fail(pos, "caller() is called outside its 'call' block");
      JINJA_TRY(Charge(pos, static_cast<int64_t>(scope->frame.size())));
      Frame copy = scope->frame;
      frames_.push_back(std::move(copy));
    }
    Frame frame;
    for (size_t i = 0; i < m.params.size(); ++i) {
      const Value* v = args.Get(i, m.params[i]);
      if (v != nullptr) {
        JINJA_TRY(CheckStored(pos, *v, nullptr, 0));  // depth could grow call by call
        frame.emplace_back(m.params[i], *v);
      } else if (m.defaults[i]) {
        Value d;
        JINJA_TRY(Eval(*m.defaults[i], &d));
        frame.emplace_back(m.params[i], std::move(d));
      } else {
        frame.emplace_back(m.params[i], Value());
      }
    }
    if (caller_block != nullptr) frame.emplace_back("caller", Value::MakeMacro(caller_block));
    const size_t saved_floor = floor_;
    frames_.push_back(std::move(frame));
    floor_ = base;
    ++call_depth_;
    std::string text;
    const bool ok = Capture(m.body, &text);
    --call_depth_;
    frames_.resize(base);
    floor_ = saved_floor;
    JINJA_TRY(ok);
    *out = Value(std::move(text));
    return true;
  }

  bool CallGlobal(size_t pos, const std::string& name, const Args& args, Value* out) {
    if (name == "raise_exception") {
      const Value* msg = args.Get(0, "message");
      return Fail(pos, "raise_exception: " + (msg != nullptr ? ToStr(*msg) : std::string()));
    }
    if (name == "range") {
      int64_t start = 0, stop = 0, step = 1;
      for (const Value& v : args.pos) {
        if (!v.is_int()) return Fail(pos, "range() takes integers");
      }
      if (args.pos.size() == 1) {
        stop = args.pos[0].as_int();
      } else if (args.pos.size() == 2 || args.pos.size() == 3) {
        start = args.pos[0].as_int();
        stop = args.pos[1].as_int();
        if (args.pos.size() == 3) step = args.pos[2].as_int();
      } else {
        return Fail(pos, "range() takes 1 to 3 arguments");
      }
      if (step == 0) return Fail(pos, "range() step must not be zero");
      const long double count = step > 0
                                    ? std::ceil((static_cast<long double>(stop) - start) / step)
                                    : std::ceil((static_cast<long double>(start) - stop) / -step);
      if (count > static_cast<long double>(lim_.max_loop_iterations)) {
        return Fail(pos, "range() of more than the loop limit of " +
                             std::to_string(lim_.max_loop_iterations) + " iterations");
      }
      Array a;
      for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) a.emplace_back(i);
      JINJA_TRY(Charge(pos, static_cast<int64_t>(a.size())));
      *out = Value::MakeArray(std::move(a));
      return true;
    }
    if (name == "namespace" || name == "dict") {
      *out = Value::MakeObject();
      for (const Value& v : args.pos) {  // dict(other)
        if (v.is_object()) {
          for (const auto& [k, x] : v.object()) out->Set(k, x);
        }
      }
      for (const auto& [k, v] : args.kw) out->Set(k, v);
      return true;
    }
    if (name == "strftime_now") {
      const Value* fmt = args.Get(0, "format");
      if (fmt == nullptr || !fmt->is_string()) return Fail(pos, "strftime_now() takes a format");
      if (fmt->str().size() > 256) return Fail(pos, "strftime_now() format too long");
      std::tm tm{};
      if (options_.now_unix) {
        const std::time_t t = static_cast<std::time_t>(*options_.now_unix);
        gmtime_r(&t, &tm);
      } else {
        const std::time_t t = std::time(nullptr);
        localtime_r(&t, &tm);
      }
      char buf[1024];
      const size_t n = std::strftime(buf, sizeof(buf), fmt->str().c_str(), &tm);
      *out = Value(std::string(buf, n));
      return true;
    }
    return Fail(pos, "unknown function '" + name + "'");
  }

  static std::string_view StripSet(std::string_view s, std::string_view chars, bool l, bool r) {
    auto in = [&](char c) {
      return chars.empty() ? IsSpace(c) : chars.find(c) != std::string_view::npos;
    };
    while (l && !s.empty() && in(s.front())) s.remove_prefix(1);
    while (r && !s.empty() && in(s.back())) s.remove_suffix(1);
    return s;
  }

  static int64_t Utf8Length(const std::string& s) {
    int64_t n = 0;
    for (unsigned char c : s) n += (c & 0xC0) != 0x80;
    return n;
  }
  // The first n characters (code points) of s.
  static std::string Utf8Prefix(const std::string& s, int64_t n) {
    size_t at = 0;
    for (int64_t k = 0; k < n && at < s.size(); ++k) {
      ++at;
      while (at < s.size() && (static_cast<unsigned char>(s[at]) & 0xC0) == 0x80) ++at;
    }
    return s.substr(0, at);
  }

  static char Upper(char c) { return c >= 'a' && c <= 'z' ? c - 32 : c; }
  static char Lower(char c) { return c >= 'A' && c <= 'Z' ? c + 32 : c; }
  static bool IsAlpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

  static std::string Title(const std::string& s) {
    std::string r = s;
    bool prev_alpha = false;
    for (char& c : r) {
      c = prev_alpha ? Lower(c) : Upper(c);
      prev_alpha = IsAlpha(c) || IsDigit(c) || c == '\'';
    }
    return r;
  }
  static std::string Capitalize(const std::string& s) {
    std::string r = s;
    for (size_t i = 0; i < r.size(); ++i) r[i] = i == 0 ? Upper(r[i]) : Lower(r[i]);
    return r;
  }

  bool Replace(size_t pos, const std::string& s, const std::string& from, const std::string& to,
               int64_t count, Value* out) {
    std::string r;
    int64_t done = 0;
    if (from.empty()) {
      for (size_t i = 0; i <= s.size(); ++i) {
        if (count < 0 || done < count) {
          r += to;
          ++done;
        }
        if (i < s.size()) r += s[i];
        JINJA_TRY(CheckSize(pos, r.size()));
      }
    } else {
      size_t at = 0;
      while (true) {
        const size_t f = (count >= 0 && done >= count) ? std::string::npos : s.find(from, at);
        if (f == std::string::npos) {
          r.append(s, at, std::string::npos);
          break;
        }
        r.append(s, at, f - at);
        r += to;
        ++done;
        at = f + from.size();
        JINJA_TRY(CheckSize(pos, r.size()));
      }
    }
    JINJA_TRY(CheckSize(pos, r.size()));
    *out = Value(std::move(r));
    return true;
  }

  bool Split(size_t pos, const std::string& s, const Value* sep, int64_t maxsplit, Value* out) {
    Array parts;
    if (sep == nullptr || sep->is_none()) {
      size_t i = 0;
      while (true) {
        while (i < s.size() && IsSpace(s[i])) ++i;
        if (i >= s.size()) break;
        if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) >= maxsplit) {
          size_t e = s.size();
          while (e > i && IsSpace(s[e - 1])) --e;
          parts.emplace_back(s.substr(i, e - i));
          break;
        }
        size_t j = i;
        while (j < s.size() && !IsSpace(s[j])) ++j;
        parts.emplace_back(s.substr(i, j - i));
        i = j;
      }
    } else {
      if (!sep->is_string() || sep->str().empty())
        return Fail(pos, "split() needs a non-empty separator");
      const std::string& d = sep->str();
      size_t at = 0;
      while (true) {
        const size_t f = (maxsplit >= 0 && static_cast<int64_t>(parts.size()) >= maxsplit)
                             ? std::string::npos
                             : s.find(d, at);
        if (f == std::string::npos) {
          parts.emplace_back(s.substr(at));
          break;
        }
        parts.emplace_back(s.substr(at, f - at));
        at = f + d.size();
      }
    }
    JINJA_TRY(CheckCount(pos, static_cast<int64_t>(parts.size())));
    *out = Value::MakeArray(std::move(parts));
    return true;
  }

  bool CallMethod(size_t pos, const Value& obj, const std::string& name, const Args& args,
                  Value* out) {
    if (obj.is_string()) {
      const std::string& s = obj.str();
      const Value* a0 = args.Get(0, "");
      if (name == "strip" || name == "lstrip" || name == "rstrip") {
        const std::string chars = a0 != nullptr && a0->is_string() ? a0->str() : "";
        *out = Value(std::string(StripSet(s, chars, name != "rstrip", name != "lstrip")));
        return true;
      }
      if (name == "upper" || name == "lower") {
        std::string r = s;
        for (char& c : r) c = name == "upper" ? Upper(c) : Lower(c);
        *out = Value(std::move(r));
        return true;
      }
      if (name == "title") {
        *out = Value(Title(s));
        return true;
      }
      if (name == "capitalize") {
        *out = Value(Capitalize(s));
        return true;
      }
      if (name == "startswith" || name == "endswith") {
        if (a0 == nullptr) return Fail(pos, name + "() takes an argument");
        Array prefixes = a0->is_array() ? a0->array() : Array{*a0};
        bool r = false;
        for (const Value& p : prefixes) {
          if (!p.is_string()) return Fail(pos, name + "() takes strings");
          r = r || (name == "startswith" ? s.starts_with(p.str()) : s.ends_with(p.str()));
        }
        *out = Value(r);
        return true;
      }
      if (name == "split" || name == "rsplit") {
        const Value* sep = args.Get(0, "sep");
        const Value* max = args.Get(1, "maxsplit");
        const int64_t maxsplit = max != nullptr && max->is_int() ? max->as_int() : -1;
        if (name == "rsplit" && maxsplit >= 0)
          return Fail(pos, "rsplit() with maxsplit is not supported");
        return Split(pos, s, sep, maxsplit, out);
      }
      if (name == "replace") {
        const Value* from = args.Get(0, "old");
        const Value* to = args.Get(1, "new");
        const Value* count = args.Get(2, "count");
        if (from == nullptr || to == nullptr || !from->is_string() || !to->is_string()) {
          return Fail(pos, "replace() takes two strings");
        }
        return Replace(pos, s, from->str(), to->str(),
                       count != nullptr && count->is_int() ? count->as_int() : -1, out);
      }
      if (name == "find" || name == "count") {
        if (a0 == nullptr || !a0->is_string()) return Fail(pos, name + "() takes a string");
        if (name == "find") {
          const size_t f = s.find(a0->str());
          *out = Value(f == std::string::npos ? int64_t{-1} : static_cast<int64_t>(f));
        } else {
          int64_t n = 0;
          if (a0->str().empty()) {
            n = static_cast<int64_t>(s.size()) + 1;
          } else {
            for (size_t at = s.find(a0->str()); at != std::string::npos;
                 at = s.find(a0->str(), at + a0->str().size())) {
              ++n;
            }
          }
          *out = Value(n);
        }
        return true;
      }
      if (name == "join") {
        if (a0 == nullptr) return Fail(pos, "join() takes a list");
        Array items;
        JINJA_TRY(Iterable(pos, *a0, &items));
        std::string r;
        for (size_t i = 0; i < items.size(); ++i) {
          if (i > 0) r += s;
          PyStr(items[i], &r);
          JINJA_TRY(CheckSize(pos, r.size()));
        }
        *out = Value(std::move(r));
        return true;
      }
      if (name == "format") {  // str.format: {} / {0} / {name} fields, {{ and }}; no specs
        std::string r;
        size_t next = 0;
        for (size_t i = 0; i < s.size(); ++i) {
          const char c = s[i];
          if (c == '}') {
            if (i + 1 < s.size() && s[i + 1] == '}') {
              r.push_back('}');
              ++i;
              continue;
            }
            return Fail(pos, "single '}' encountered in format string");
          }
          if (c != '{') {
            r.push_back(c);
            continue;
          }
          if (i + 1 < s.size() && s[i + 1] == '{') {
            r.push_back('{');
            ++i;
            continue;
          }
          const size_t close = s.find('}', i);
          if (close == std::string::npos)
            return Fail(pos, "single '{' encountered in format string");
          const std::string field = s.substr(i + 1, close - i - 1);
          i = close;
          if (field.find_first_of(":!.[") != std::string::npos) {
            return Fail(pos, "str.format() supports only {}, {N} and {name} fields");
          }
          const Value* v = nullptr;
          if (field.empty()) {
            v = next < args.pos.size() ? &args.pos[next] : nullptr;
            ++next;
          } else if (std::all_of(field.begin(), field.end(), IsDigit)) {
            const size_t k = field.size() < 6 ? std::stoul(field) : args.pos.size();
            v = k < args.pos.size() ? &args.pos[k] : nullptr;
          } else {
            for (const auto& [k, x] : args.kw) {
              if (k == field) v = &x;
            }
          }
          if (v == nullptr) return Fail(pos, "str.format() has no value for {" + field + "}");
          PyStr(*v, &r);
          JINJA_TRY(CheckSize(pos, r.size()));
        }
        *out = Value(std::move(r));
        return true;
      }
      if (name == "splitlines") {
        Array lines;
        size_t at = 0;
        while (at < s.size()) {
          size_t e = s.find('\n', at);
          if (e == std::string::npos) e = s.size();
          std::string line = s.substr(at, e - at);
          if (!line.empty() && line.back() == '\r') line.pop_back();
          lines.emplace_back(std::move(line));
          at = e + 1;
        }
        *out = Value::MakeArray(std::move(lines));
        return true;
      }
    } else if (obj.is_object()) {
      if (name == "get") {
        const Value* key = args.Get(0, "key");
        if (key == nullptr || !key->is_string()) return Fail(pos, "get() takes a key");
        const Value* v = obj.Find(key->str());
        const Value* dflt = args.Get(1, "default");
        *out = v != nullptr ? *v : dflt != nullptr ? *dflt : Value::None();
        return true;
      }
      if (name == "items" || name == "keys" || name == "values") {
        JINJA_TRY(Charge(pos, static_cast<int64_t>(obj.object().size())));
        Array r;
        for (const auto& [k, v] : obj.object()) {
          if (name == "items") {
            r.push_back(Value::MakeArray({Value(k), v}));
          } else {
            r.push_back(name == "keys" ? Value(k) : v);
          }
        }
        *out = Value::MakeArray(std::move(r));
        return true;
      }
    }
    return Fail(pos, "unknown method '" + name + "'");
  }

  // ---- filters

  bool Attribute(const Value& item, const std::string& path, Value* out) {
    *out = item;
    size_t at = 0;
    while (at <= path.size()) {
      size_t dot = path.find('.', at);
      if (dot == std::string::npos) dot = path.size();
      const std::string part = path.substr(at, dot - at);
      const Value* v = out->Find(part);
      if (v != nullptr) {
        *out = *v;
      } else if (out->is_array() && !part.empty() &&
                 std::all_of(part.begin(), part.end(), IsDigit) && part.size() < 10) {
        Value next;
        JINJA_TRY(GetItem(*out, Value(static_cast<int64_t>(std::stoll(part))), &next));
        *out = next;
      } else {
        *out = Value();
      }
      at = dot + 1;
    }
    return true;
  }

  bool ApplyTest(size_t pos, const std::string& name, const Value& v, const Array& targs, bool* r);

  // The key sort, dictsort, unique, min and max compare: the item or its attribute, strings
  // lowercased unless case_sensitive.
  bool SortKey(const Value& x, const Value* attr, const Value* case_sensitive, Value* key) {
    *key = x;
    if (attr != nullptr && !attr->is_none() && !attr->is_undefined()) {
      JINJA_TRY(Attribute(x, ToStr(*attr), key));
    }
    if (key->is_string() && (case_sensitive == nullptr || !case_sensitive->Truthy())) {
      std::string low = key->str();
      for (char& c : low) c = Lower(c);
      *key = Value(std::move(low));
    }
    return true;
  }

  bool EvalFilter(const Expr& e, Value* out) {
    Value v;
    JINJA_TRY(Eval(*e.args[0], &v));
    Args args;
    JINJA_TRY(EvalArgs(e, 1, &args));
    return ApplyFilter(e.pos, e.name, v, args, out);
  }

  bool ApplyFilter(size_t pos, const std::string& f, const Value& v, const Args& args, Value* out) {
    const Value* a0 = args.Get(0, "");
    if (f == "trim") {
      if (!v.is_string()) {
        *out = Value(std::string(StripSet(ToStr(v), "", true, true)));
        return true;
      }
      const Value* chars = args.Get(0, "chars");
      *out = Value(std::string(StripSet(
          v.str(), chars != nullptr && chars->is_string() ? chars->str() : "", true, true)));
      return true;
    }
    if (f == "length" || f == "count") {
      if (v.is_string()) {
        int64_t n = 0;
        for (unsigned char c : v.str()) n += (c & 0xC0) != 0x80;
        *out = Value(n);
      } else if (v.is_array()) {
        *out = Value(static_cast<int64_t>(v.array().size()));
      } else if (v.is_object()) {
        *out = Value(static_cast<int64_t>(v.object().size()));
      } else if (v.is_undefined()) {
        *out = Value(int64_t{0});
      } else {
        return Fail(pos, "length of a value without one");
      }
      return true;
    }
    if (f == "tojson") {
      const Value* indent = args.Get(0, "indent");
      int n = -1;
      if (indent != nullptr && indent->is_int())
        n = static_cast<int>(std::clamp<int64_t>(indent->as_int(), 0, 16));
      std::string s = ToJson(v, n);
      JINJA_TRY(CheckSize(pos, s.size()));
      *out = Value(std::move(s));
      return true;
    }
    if (f == "upper" || f == "lower" || f == "title" || f == "capitalize") {
      Args none;
      return CallMethod(pos, Value(ToStr(v)), f, none, out);
    }
    if (f == "string") {
      *out = Value(ToStr(v));
      return true;
    }
    if (f == "safe" || f == "e" || f == "escape" || f == "forceescape") {
      if (f == "safe") {
        *out = v;
        return true;
      }
      std::string r;
      for (char c : ToStr(v)) {
        switch (c) {
          case '&':
            r += "&amp;";
            break;
          case '<':
            r += "&lt;";
            break;
          case '>':
            r += "&gt;";
            break;
          case '"':
            r += "&#34;";
            break;
          case '\'':
            r += "&#39;";
            break;
          default:
            r += c;
        }
      }
      *out = Value(std::move(r));
      return true;
    }
    if (f == "join") {
      const Value* sep = args.Get(0, "d");
      const Value* attr = args.Get(1, "attribute");
      Array items;
      JINJA_TRY(Iterable(pos, v, &items));
      const std::string d = sep != nullptr ? ToStr(*sep) : "";
      std::string r;
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) r += d;
        Value item = items[i];
        if (attr != nullptr && attr->is_string())
          JINJA_TRY(Attribute(items[i], attr->str(), &item));
        PyStr(item, &r);
        JINJA_TRY(CheckSize(pos, r.size()));
      }
      *out = Value(std::move(r));
      return true;
    }
    if (f == "default" || f == "d") {
      const Value* dflt = args.Get(0, "default_value");
      const Value* boolean = args.Get(1, "boolean");
      const bool use = v.is_undefined() || (boolean != nullptr && boolean->Truthy() && !v.Truthy());
      *out = use ? (dflt != nullptr ? *dflt : Value(std::string())) : v;
      return true;
    }
    if (f == "first" || f == "last") {
      *out = Value();
      if (v.is_array() && !v.array().empty()) {
        *out = f == "first" ? v.array().front() : v.array().back();
      } else if (v.is_string() && !v.str().empty()) {
        *out = Value(std::string(1, f == "first" ? v.str().front() : v.str().back()));
      }
      return true;
    }
    if (f == "replace") {
      const Value* to = args.Get(1, "new");
      const Value* count = args.Get(2, "count");
      if (a0 == nullptr || to == nullptr) return Fail(pos, "replace takes two arguments");
      return Replace(pos, ToStr(v), ToStr(*a0), ToStr(*to),
                     count != nullptr && count->is_int() ? count->as_int() : -1, out);
    }
    if (f == "int") {
      const Value* dflt = args.Get(0, "default");
      Value fallback = dflt != nullptr ? *dflt : Value(int64_t{0});
      if (v.is_int()) {
        *out = v;
      } else if (v.is_bool()) {
        *out = Value(static_cast<int64_t>(v.as_bool()));
      } else if (v.is_float()) {
        const double d = v.as_double();
        *out =
            std::isfinite(d) && std::fabs(d) < 9.2e18 ? Value(static_cast<int64_t>(d)) : fallback;
      } else if (v.is_string()) {
        int64_t i = 0;
        std::string_view s = StripSet(v.str(), "", true, true);
        auto r = std::from_chars(s.data(), s.data() + s.size(), i);
        *out = r.ec == std::errc() && r.ptr == s.data() + s.size() ? Value(i) : fallback;
      } else {
        *out = fallback;
      }
      return true;
    }
    if (f == "float") {
      if (v.is_number()) {
        *out = Value(v.as_double());
      } else if (v.is_bool()) {
        *out = Value(v.as_bool() ? 1.0 : 0.0);
      } else if (v.is_string()) {
        const std::string s(StripSet(v.str(), "", true, true));
        char* end = nullptr;
        const double d = std::strtod(s.c_str(), &end);
        *out = !s.empty() && end == s.c_str() + s.size() ? Value(d) : Value(0.0);
      } else {
        *out = Value(0.0);
      }
      return true;
    }
    if (f == "abs") {
      if (v.is_int() && v.as_int() != std::numeric_limits<int64_t>::min()) {
        *out = Value(v.as_int() < 0 ? -v.as_int() : v.as_int());
      } else if (v.is_number()) {
        *out = Value(std::fabs(v.as_double()));
      } else {
        return Fail(pos, "abs of a non-number");
      }
      return true;
    }
    if (f == "round") {
      const Value* prec = args.Get(0, "precision");
      const Value* method = args.Get(1, "method");
      if (!v.is_number()) return Fail(pos, "round of a non-number");
      const int p = prec != nullptr && prec->is_int()
                        ? static_cast<int>(std::clamp<int64_t>(prec->as_int(), -20, 20))
                        : 0;
      const double m = std::pow(10.0, p);
      const std::string how = method != nullptr ? ToStr(*method) : "common";
      const double x = v.as_double() * m;
      const double r = how == "floor"  ? std::floor(x)
                       : how == "ceil" ? std::ceil(x)
                                       : std::round(x);
      *out = Value(r / m);
      return true;
    }
    if (f == "list") {
      Array items;
      JINJA_TRY(Iterable(pos, v, &items));
      *out = Value::MakeArray(std::move(items));
      return true;
    }
    if (f == "items" || f == "dictitems") {
      if (!v.is_object()) {
        *out = Value::MakeArray();
        return v.is_undefined() || v.is_none() ? true : Fail(pos, "items of a non-mapping");
      }
      return CallMethod(pos, v, "items", Args{}, out);
    }
    if (f == "reverse") {
      if (v.is_string()) {
        *out = Value(std::string(v.str().rbegin(), v.str().rend()));
        return true;
      }
      Array items;
      JINJA_TRY(Iterable(pos, v, &items));
      std::reverse(items.begin(), items.end());
      *out = Value::MakeArray(std::move(items));
      return true;
    }
    if (f == "unique") {  // unique(case_sensitive=false, attribute=none)
      const Value* cs = args.Get(0, "case_sensitive");
      const Value* attr = args.Get(1, "attribute");
      Array items, r, keys;
      JINJA_TRY(Iterable(pos, v, &items));
      JINJA_TRY(Charge(pos, static_cast<int64_t>(items.size() * items.size() / 16)));
      for (const Value& x : items) {
        Value k;
        JINJA_TRY(SortKey(x, attr, cs, &k));
        bool seen = false;
        for (const Value& y : keys) seen = seen || Equal(k, y);
        if (!seen) {
          r.push_back(x);
          keys.push_back(std::move(k));
        }
      }
      *out = Value::MakeArray(std::move(r));
      return true;
    }
    // sort(reverse=false, case_sensitive=false, attribute=none);
    // dictsort(case_sensitive=false, by='key', reverse=false): the (key, value) pairs.
    if (f == "sort" || f == "dictsort") {
      const bool dict = f == "dictsort";
      Array items;
      if (dict) {
        if (!v.is_object() && !v.is_undefined() && !v.is_none()) {
          return Fail(pos, "dictsort of a non-mapping");
        }
        JINJA_TRY(CallMethod(pos, v.is_object() ? v : Value::MakeObject(), "items", Args{}, out));
        items = out->array();
      } else {
        JINJA_TRY(Iterable(pos, v, &items));
      }
      const Value* rev = args.Get(dict ? 2 : 0, "reverse");
      const Value* cs = args.Get(dict ? 0 : 1, "case_sensitive");
      const Value* attr = dict ? nullptr : args.Get(2, "attribute");
      size_t pick = 0;
      if (dict) {
        const Value* by = args.Get(1, "by");
        if (by != nullptr && !(by->is_string() && (by->str() == "key" || by->str() == "value"))) {
          return Fail(pos, "dictsort can only sort by 'key' or 'value'");
        }
        pick = by != nullptr && by->str() == "value" ? 1 : 0;
      }
      const bool reverse = rev != nullptr && rev->Truthy();
      JINJA_TRY(Charge(pos, static_cast<int64_t>(items.size()) * 20));
      std::vector<std::pair<Value, Value>> keyed;
      for (const Value& x : items) {
        Value k;
        JINJA_TRY(SortKey(dict ? x.array()[pick] : x, attr, cs, &k));
        keyed.emplace_back(std::move(k), x);
      }
      bool bad = false;
      // Stable in both directions, as Python's sorted(reverse=True).
      std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
        int c = 0;
        if (!Compare(a.first, b.first, &c)) bad = true;
        return reverse ? c > 0 : c < 0;
      });
      if (bad) return Fail(pos, "sort of values that do not order");
      Array r;
      for (auto& [k, x] : keyed) r.push_back(std::move(x));
      *out = Value::MakeArray(std::move(r));
      return true;
    }
    if (f == "selectattr" || f == "rejectattr" || f == "select" || f == "reject") {
      const bool attr_form = f == "selectattr" || f == "rejectattr";
      const bool keep_if = f == "selectattr" || f == "select";
      Array items, r;
      JINJA_TRY(Iterable(pos, v, &items));
      size_t next = 0;
      std::string attr;
      if (attr_form) {
        if (args.pos.empty() || !args.pos[0].is_string())
          return Fail(pos, f + " takes an attribute name");
        attr = args.pos[0].str();
        next = 1;
      }
      std::string test;
      if (next < args.pos.size()) {
        if (!args.pos[next].is_string()) return Fail(pos, f + " takes a test name");
        test = args.pos[next].str();
      }
      Array targs(args.pos.begin() + std::min(args.pos.size(), next + 1), args.pos.end());
      for (const Value& item : items) {
        JINJA_TRY(Charge(pos, 1));
        Value x = item;
        if (attr_form) JINJA_TRY(Attribute(item, attr, &x));
        bool pass = x.Truthy();
        if (!test.empty()) JINJA_TRY(ApplyTest(pos, test, x, targs, &pass));
        if (pass == keep_if) r.push_back(item);
      }
      *out = Value::MakeArray(std::move(r));
      return true;
    }
    if (f == "map") {
      Array items, r;
      JINJA_TRY(Iterable(pos, v, &items));
      const Value* attr = nullptr;
      for (const auto& [k, x] : args.kw) {
        if (k == "attribute") attr = &x;
      }
      const Value* dflt = nullptr;
      for (const auto& [k, x] : args.kw) {
        if (k == "default") dflt = &x;
      }
      for (const Value& item : items) {
        JINJA_TRY(Charge(pos, 1));
        Value x;
        if (attr != nullptr) {
          JINJA_TRY(Attribute(item, ToStr(*attr), &x));
          if (x.is_undefined() && dflt != nullptr) x = *dflt;
        } else {
          if (args.pos.empty() || !args.pos[0].is_string())
            return Fail(pos, "map takes a filter name");
          Args rest;
          rest.pos.assign(args.pos.begin() + 1, args.pos.end());
          JINJA_TRY(ApplyFilter(pos, args.pos[0].str(), item, rest, &x));
        }
        r.push_back(std::move(x));
      }
      *out = Value::MakeArray(std::move(r));
      return true;
    }
    if (f == "indent") {
      const Value* width = args.Get(0, "width");
      const Value* first = args.Get(1, "first");
      const Value* blank = args.Get(2, "blank");
      const std::string pad = width != nullptr && width->is_string()
                                  ? width->str()
                                  : std::string(width != nullptr && width->is_int()
                                                    ? std::clamp<int64_t>(width->as_int(), 0, 64)
                                                    : 4,
                                                ' ');
      const std::string s = ToStr(v);
      std::string r;
      size_t at = 0;
      bool line0 = true;
      while (true) {
        size_t e = s.find('\n', at);
        const std::string line = s.substr(at, e == std::string::npos ? std::string::npos : e - at);
        const bool indent_it = (!line0 || (first != nullptr && first->Truthy())) &&
                               (!line.empty() || (blank != nullptr && blank->Truthy()));
        if (indent_it) r += pad;
        r += line;
        JINJA_TRY(CheckSize(pos, r.size()));
        if (e == std::string::npos) break;
        r += '\n';
        at = e + 1;
        line0 = false;
      }
      *out = Value(std::move(r));
      return true;
    }
    if (f == "attr") {
      if (a0 == nullptr) return Fail(pos, "attr takes a name");
      const Value* x = v.Find(ToStr(*a0));
      *out = x != nullptr ? *x : Value();
      return true;
    }
    if (f == "sum") {
      Array items;
      JINJA_TRY(Iterable(pos, v, &items));
      Value acc(int64_t{0});
      for (const Value& x : items) JINJA_TRY(Arith(pos, "+", acc, x, &acc));
      *out = acc;
      return true;
    }
    if (f == "min" || f == "max") {  // min(case_sensitive=false, attribute=none)
      const Value* cs = args.Get(0, "case_sensitive");
      const Value* attr = args.Get(1, "attribute");
      Array items;
      JINJA_TRY(Iterable(pos, v, &items));
      *out = Value();
      Value best;
      for (const Value& x : items) {
        Value k;
        JINJA_TRY(SortKey(x, attr, cs, &k));
        int c = 0;
        if (out->is_undefined()) {
          *out = x;
          best = std::move(k);
        } else if (!Compare(k, best, &c)) {
          return Fail(pos, f + " of values that do not order");
        } else if ((f == "min" && c < 0) || (f == "max" && c > 0)) {
          *out = x;
          best = std::move(k);
        }
      }
      return true;
    }
    if (f == "batch" || f == "slice") {  // batch(size, fill_with), slice(count, fill_with)
      const Value* nv = args.Get(0, f == "batch" ? "linecount" : "slices");
      const Value* fill = args.Get(1, "fill_with");
      if (nv == nullptr || !nv->is_int() || nv->as_int() <= 0) {
        return Fail(pos, f + " takes a positive integer");
      }
      Array items, r;
      JINJA_TRY(Iterable(pos, v, &items));
      const int64_t n = nv->as_int(), len = static_cast<int64_t>(items.size());
      const bool filling = fill != nullptr && !fill->is_none() && !fill->is_undefined();
      if (f == "batch") {
        for (int64_t at = 0; at < len; at += n) {
          Array part(items.begin() + at, items.begin() + std::min(len, at + n));
          while (filling && static_cast<int64_t>(part.size()) < n) part.push_back(*fill);
          r.push_back(Value::MakeArray(std::move(part)));
        }
      } else {
        JINJA_TRY(CheckCount(pos, n));
        const int64_t per = len / n, extra = len % n;
        int64_t offset = 0;
        for (int64_t k = 0; k < n; ++k) {  // Jinja's slice: the first `extra` get one more
          const int64_t start = offset + k * per;
          if (k < extra) ++offset;
          const int64_t end = offset + (k + 1) * per;
          Array part(items.begin() + start, items.begin() + end);
          if (filling && k >= extra) part.push_back(*fill);
          r.push_back(Value::MakeArray(std::move(part)));
        }
      }
      *out = Value::MakeArray(std::move(r));
      return true;
    }
    if (f == "center") {  // center(width=80), as Python's str.center
      const Value* wv = args.Get(0, "width");
      const std::string str = ToStr(v);
      const int64_t width = wv != nullptr && wv->is_int() ? wv->as_int() : 80;
      const int64_t len = Utf8Length(str);
      if (width > static_cast<int64_t>(lim_.max_output_bytes)) {
        return CheckSize(pos, lim_.max_output_bytes + 1);
      }
      if (width <= len) {
        *out = Value(str);
        return true;
      }
      const int64_t pad = width - len;
      const int64_t left = pad / 2 + (pad & width & 1);
      *out = Value(std::string(static_cast<size_t>(left), ' ') + str +
                   std::string(static_cast<size_t>(pad - left), ' '));
      return true;
    }
    if (f == "truncate") {  // truncate(length=255, killwords=false, end='...', leeway=5)
      const Value* lv = args.Get(0, "length");
      const Value* kill = args.Get(1, "killwords");
      const Value* ev = args.Get(2, "end");
      const Value* lw = args.Get(3, "leeway");
      const std::string str = ToStr(v);
      const int64_t length = lv != nullptr && lv->is_int() ? lv->as_int() : 255;
      const std::string end = ev != nullptr ? ToStr(*ev) : "...";
      const int64_t leeway = lw != nullptr && lw->is_int() ? lw->as_int() : 5;
      if (length < Utf8Length(end)) return Fail(pos, "truncate: length is shorter than the end");
      if (Utf8Length(str) <= length + leeway) {
        *out = Value(str);
        return true;
      }
      std::string head = Utf8Prefix(str, length - Utf8Length(end));
      if (kill == nullptr || !kill->Truthy()) {
        const size_t sp = head.rfind(' ');
        if (sp != std::string::npos) head.resize(sp);
      }
      *out = Value(head + end);
      return true;
    }
    if (f == "format") {
      if (!args.pos.empty() && !args.kw.empty()) {
        return Fail(pos, "format takes positional or keyword arguments, not both");
      }
      const Value values =
          args.kw.empty() ? Value::MakeArray(args.pos) : Value::MakeObject(args.kw);
      return PercentFormat(pos, ToStr(v), values, out, /*exact=*/true);
    }
    if (f == "wordcount") {
      Value parts;
      JINJA_TRY(Split(pos, ToStr(v), nullptr, -1, &parts));
      *out = Value(static_cast<int64_t>(parts.array().size()));
      return true;
    }
    return Fail(pos, "unknown filter '" + f + "'");
  }

  bool EvalTest(const Expr& e, bool* r) {
    const Expr& subject = *e.args[0];
    Value v;
    JINJA_TRY(Eval(subject, &v));
    Array targs;
    for (size_t i = 1; i < e.args.size(); ++i) {
      Value a;
      JINJA_TRY(Eval(*e.args[i], &a));
      targs.push_back(std::move(a));
    }
    // The global functions are defined callables (`strftime_now is defined`, as Llama 3.2's
    // template asks before it calls it), unless a variable of the same name hides them.
    if (v.is_undefined() && subject.k == Expr::K::kName && IsGlobalFunction(subject.name) &&
        (e.name == "defined" || e.name == "undefined" || e.name == "callable")) {
      *r = e.name != "undefined";
      return true;
    }
    return ApplyTest(e.pos, e.name, v, targs, r);
  }

  static bool IsGlobalFunction(const std::string& name) {
    return name == "raise_exception" || name == "range" || name == "namespace" || name == "dict" ||
           name == "strftime_now";
  }

  static bool Int(const Value& v, int64_t* out) {
    if (v.is_int()) {
      *out = v.as_int();
      return true;
    }
    return false;
  }

  const Impl& impl_;
  const Limits& lim_;
  const Value& context_;
  const RenderOptions& options_;
  std::string out_;
  std::vector<Frame> frames_;
  size_t floor_ = 0;         // frames below this (except the template's own, 0) are a caller's
  std::string block_value_;  // the text of the {% filter %} block being filtered
  std::vector<ActiveLoop> loops_;     // loops in progress, innermost last
  std::vector<CallerScope> callers_;  // call blocks in progress, innermost last
  int depth_ = 0;
  int call_depth_ = 0;
  int64_t iterations_ = 0;
  int64_t work_ = 0;
  Error err_;
};

bool Renderer::ApplyTest(size_t pos, const std::string& t, const Value& v, const Array& a,
                         bool* r) {
  const Value* a0 = a.empty() ? nullptr : &a[0];
  if (t == "defined") {
    *r = !v.is_undefined();
  } else if (t == "undefined") {
    *r = v.is_undefined();
  } else if (t == "none") {
    *r = v.is_none();
  } else if (t == "boolean") {
    *r = v.is_bool();
  } else if (t == "true" || t == "false") {
    *r = v.is_bool() && v.as_bool() == (t == "true");
  } else if (t == "integer") {
    *r = v.is_int();
  } else if (t == "float") {
    *r = v.is_float();
  } else if (t == "number") {
    *r = v.is_number();
  } else if (t == "string") {
    *r = v.is_string();
  } else if (t == "mapping") {
    *r = v.is_object();
  } else if (t == "iterable") {
    *r = v.is_array() || v.is_object() || v.is_string();
  } else if (t == "sequence") {
    *r = v.is_array() || v.is_string() || v.is_object();
  } else if (t == "callable") {
    *r = v.is_macro();
  } else if (t == "lower" || t == "upper") {
    *r = v.is_string() && std::none_of(v.str().begin(), v.str().end(), [&](char c) {
           return t == "lower" ? (c >= 'A' && c <= 'Z') : (c >= 'a' && c <= 'z');
         });
  } else if (t == "odd" || t == "even" || t == "divisibleby") {
    int64_t x = 0, d = 2;
    if (!Int(v, &x)) return Fail(pos, "'" + t + "' tests an integer");
    if (t == "divisibleby" && (a0 == nullptr || !Int(*a0, &d) || d == 0)) {
      return Fail(pos, "'divisibleby' takes a non-zero integer");
    }
    const int64_t m = d == -1 ? 0 : x % d;
    *r = t == "odd" ? m != 0 : m == 0;
  } else if (t == "eq" || t == "equalto" || t == "==" || t == "sameas") {
    if (a0 == nullptr) return Fail(pos, "'" + t + "' takes a value");
    *r = t == "sameas" ? v.kind() == a0->kind() && Equal(v, *a0) : Equal(v, *a0);
  } else if (t == "ne" || t == "!=") {
    if (a0 == nullptr) return Fail(pos, "'" + t + "' takes a value");
    *r = !Equal(v, *a0);
  } else if (t == "lt" || t == "le" || t == "gt" || t == "ge" || t == "lessthan" ||
             t == "greaterthan") {
    int c = 0;
    if (a0 == nullptr || !Compare(v, *a0, &c)) return Fail(pos, "'" + t + "' cannot compare");
    *r = (t == "lt" || t == "lessthan")      ? c < 0
         : t == "le"                         ? c <= 0
         : (t == "gt" || t == "greaterthan") ? c > 0
                                             : c >= 0;
  } else if (t == "in") {
    if (a0 == nullptr) return Fail(pos, "'in' takes a container");
    return Contains(pos, *a0, v, r);
  } else {
    return Fail(pos, "unknown test '" + t + "'");
  }
  return true;
}

#undef JINJA_TRY

}  // namespace

Result<std::string> Template::Render(const Value& context, const RenderOptions& options) const {
  LAMINA_CHECK(impl_ != nullptr);
  const Value empty = Value::MakeObject();
  Renderer r(*impl_, context.is_object() ? context : empty, options);
  std::string out;
  if (!r.Run(&out)) return r.error();
  return out;
}

}  // namespace lamina::jinja
