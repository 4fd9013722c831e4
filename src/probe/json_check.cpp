// The strict JSON reader of json_check.h: recursive descent over the text, one function per
// grammar rule.
#include "probe/json_check.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>

namespace lamina::probe {

namespace {

constexpr int kMaxDepth = 512;  // nesting deeper than this is refused

class Reader {
 public:
  explicit Reader(std::string_view text) : s_(text) {}

  std::optional<std::map<std::string, JsonScalar>> Object() {
    SkipSpace();
    if (!Peek('{')) return std::nullopt;
    std::map<std::string, JsonScalar> fields;
    if (!Members(&fields, 0)) return std::nullopt;
    SkipSpace();
    if (at_ != s_.size()) return std::nullopt;
    return fields;
  }

 private:
  bool Peek(char c) const { return at_ < s_.size() && s_[at_] == c; }
  void SkipSpace() {
    while (at_ < s_.size() &&
           (s_[at_] == ' ' || s_[at_] == '\t' || s_[at_] == '\n' || s_[at_] == '\r')) {
      ++at_;
    }
  }

  // '{' [member (',' member)*] '}'; fields is null below the top level.
  bool Members(std::map<std::string, JsonScalar>* fields, int depth) {
    ++at_;  // '{'
    SkipSpace();
    if (Peek('}')) {
      ++at_;
      return true;
    }
    while (true) {
      SkipSpace();
      std::string key;
      if (!Peek('"') || !String(&key)) return false;
      SkipSpace();
      if (!Peek(':')) return false;
      ++at_;
      JsonScalar value;
      if (!Value(&value, depth + 1)) return false;
      if (fields != nullptr) (*fields)[key] = value;
      SkipSpace();
      if (Peek(',')) {
        ++at_;
        continue;
      }
      if (!Peek('}')) return false;
      ++at_;
      return true;
    }
  }

  // '[' [value (',' value)*] ']'
  bool Elements(int depth) {
    ++at_;  // '['
    SkipSpace();
    if (Peek(']')) {
      ++at_;
      return true;
    }
    while (true) {
      JsonScalar ignored;
      if (!Value(&ignored, depth + 1)) return false;
      SkipSpace();
      if (Peek(',')) {
        ++at_;
        continue;
      }
      if (!Peek(']')) return false;
      ++at_;
      return true;
    }
  }

  bool Literal(std::string_view word) {
    if (s_.substr(at_, word.size()) != word) return false;
    at_ += word.size();
    return true;
  }

  bool Value(JsonScalar* out, int depth) {
    if (depth > kMaxDepth) return false;
    SkipSpace();
    if (at_ >= s_.size()) return false;
    const char c = s_[at_];
    if (c == '{') {
      out->kind = JsonScalar::Kind::kObject;
      return Members(nullptr, depth);
    }
    if (c == '[') {
      out->kind = JsonScalar::Kind::kArray;
      return Elements(depth);
    }
    if (c == '"') {
      out->kind = JsonScalar::Kind::kString;
      return String(&out->text);
    }
    if (c == 't' || c == 'f') {
      out->kind = JsonScalar::Kind::kBool;
      out->boolean = c == 't';
      return Literal(c == 't' ? "true" : "false");
    }
    if (c == 'n') {
      out->kind = JsonScalar::Kind::kNull;
      return Literal("null");
    }
    return Number(out);
  }

  bool Digits() {
    const size_t from = at_;
    while (at_ < s_.size() && s_[at_] >= '0' && s_[at_] <= '9') ++at_;
    return at_ > from;
  }

  // -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
  bool Number(JsonScalar* out) {
    const size_t from = at_;
    if (Peek('-')) ++at_;
    if (Peek('0')) {
      ++at_;
    } else if (at_ < s_.size() && s_[at_] >= '1' && s_[at_] <= '9') {
      Digits();
    } else {
      return false;
    }
    bool integral = true;
    if (Peek('.')) {
      ++at_;
      if (!Digits()) return false;
      integral = false;
    }
    if (Peek('e') || Peek('E')) {
      ++at_;
      if (Peek('+') || Peek('-')) ++at_;
      if (!Digits()) return false;
      integral = false;
    }
    const std::string lexeme(s_.substr(from, at_ - from));
    if (integral) {
      errno = 0;
      const long long v = std::strtoll(lexeme.c_str(), nullptr, 10);
      if (errno == 0) {
        out->kind = JsonScalar::Kind::kInteger;
        out->integer = v;
        return true;
      }
    }
    out->kind = JsonScalar::Kind::kFloat;
    out->number = std::strtod(lexeme.c_str(), nullptr);
    return true;
  }

  bool Hex4(uint32_t* out) {
    if (at_ + 4 > s_.size()) return false;
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = s_[at_++];
      v <<= 4;
      if (c >= '0' && c <= '9') {
        v |= c - '0';
      } else if (c >= 'a' && c <= 'f') {
        v |= c - 'a' + 10;
      } else if (c >= 'A' && c <= 'F') {
        v |= c - 'A' + 10;
      } else {
        return false;
      }
    }
    *out = v;
    return true;
  }

  static void AppendUtf8(uint32_t cp, std::string* out) {
    if (cp < 0x80) {
      *out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      *out += static_cast<char>(0xC0 | (cp >> 6));
      *out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      *out += static_cast<char>(0xE0 | (cp >> 12));
      *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      *out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      *out += static_cast<char>(0xF0 | (cp >> 18));
      *out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      *out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  // One well-formed UTF-8 character of two to four bytes (Unicode's table 3-7), copied to out.
  bool Utf8(std::string* out) {
    const auto byte = [&](size_t i) { return static_cast<unsigned char>(s_[i]); };
    const unsigned char b0 = byte(at_);
    int len = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // range of the second byte
    if (b0 >= 0xC2 && b0 <= 0xDF) {
      len = 2;
    } else if (b0 >= 0xE0 && b0 <= 0xEF) {
      len = 3;
      if (b0 == 0xE0) lo = 0xA0;
      if (b0 == 0xED) hi = 0x9F;
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
      len = 4;
      if (b0 == 0xF0) lo = 0x90;
      if (b0 == 0xF4) hi = 0x8F;
    } else {
      return false;
    }
    if (at_ + len > s_.size()) return false;
    for (int i = 1; i < len; ++i) {
      const unsigned char b = byte(at_ + i);
      if (i == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) return false;
    }
    out->append(s_.substr(at_, len));
    at_ += len;
    return true;
  }

  // '"' characters '"', escapes decoded into out.
  bool String(std::string* out) {
    ++at_;  // '"'
    while (at_ < s_.size()) {
      const unsigned char c = static_cast<unsigned char>(s_[at_]);
      if (c == '"') {
        ++at_;
        return true;
      }
      if (c < 0x20) return false;  // control characters must be escaped
      if (c >= 0x80) {
        if (!Utf8(out)) return false;
        continue;
      }
      ++at_;
      if (c != '\\') {
        *out += static_cast<char>(c);
        continue;
      }
      if (at_ >= s_.size()) return false;
      const char e = s_[at_++];
      switch (e) {
        case '"':
        case '\\':
        case '/':
          *out += e;
          break;
        case 'b':
          *out += '\b';
          break;
        case 'f':
          *out += '\f';
          break;
        case 'n':
          *out += '\n';
          break;
        case 'r':
          *out += '\r';
          break;
        case 't':
          *out += '\t';
          break;
        case 'u': {
          uint32_t cp = 0;
          if (!Hex4(&cp)) return false;
          if (cp >= 0xDC00 && cp <= 0xDFFF) return false;  // a lone low surrogate
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            uint32_t low = 0;
            if (!Literal("\\u") || !Hex4(&low) || low < 0xDC00 || low > 0xDFFF) return false;
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          }
          AppendUtf8(cp, out);
          break;
        }
        default:
          return false;
      }
    }
    return false;  // unterminated
  }

  std::string_view s_;
  size_t at_ = 0;
};

}  // namespace

std::optional<std::map<std::string, JsonScalar>> ParseJsonObject(std::string_view text) {
  return Reader(text).Object();
}

bool JsonEquals(const JsonScalar& value, int64_t integer) {
  if (value.kind == JsonScalar::Kind::kInteger) return value.integer == integer;
  if (value.kind == JsonScalar::Kind::kFloat) return value.number == static_cast<double>(integer);
  return false;
}

bool JsonEquals(const JsonScalar& value, const std::string& text) {
  return value.kind == JsonScalar::Kind::kString && value.text == text;
}

std::string JsonQuote(const std::string& text) {
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\b') {
      out += "\\b";
    } else if (c == '\f') {
      out += "\\f";
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

}  // namespace lamina::probe
