// The Jinja lexer: template text and tags (whitespace control, raw blocks, comments) into
// tokens, and the line / column positions errors name.
#include <algorithm>
#include <charconv>
#include <cstdlib>

#include "chat/jinja.h"
#include "chat/jinja_internal.h"

namespace lamina::chat::jinja::internal {

Positions::Positions(std::string_view src) {
  starts_.push_back(0);
  for (size_t i = 0; i < src.size(); ++i) {
    if (src[i] == '\n') starts_.push_back(i + 1);
  }
}

std::string Positions::Where(size_t pos) const {
  const auto it = std::upper_bound(starts_.begin(), starts_.end(), pos);
  const size_t line = static_cast<size_t>(it - starts_.begin());
  const size_t col = pos - starts_[line - 1] + 1;
  return "line " + std::to_string(line) + ", column " + std::to_string(col);
}

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

namespace {

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
    while (true) {
      while (p < src_.size() && IsSpace(src_[p])) ++p;
      if (p >= src_.size()) {
        return Fail(open, std::string(block ? "unclosed '{%' tag" : "unclosed '{{' tag") +
                              (depth > 0 ? " (a bracket inside it is not closed)" : ""));
      }
      const char c = src_[p];
      size_t end = 0;
      if (depth == 0 && LexTagEnd(p, block, strip_leading, trim_newline, &end)) return end;
      Result<size_t> next = p;
      if (IsNameStart(c)) {
        next = LexName(p);
      } else if (IsDigit(c)) {
        next = LexNumber(p);
      } else if (c == '\'' || c == '"') {
        next = LexString(p);
      } else {
        next = LexOperator(p, &depth);
      }
      if (!next.ok()) return next.error();
      p = *next;
    }
  }

  // Whether "-%}" / "+%}" / "%}" (or the "}}" forms) end the tag at p; if so, emits the end
  // token, sets the whitespace control of the text after it and *end past it.
  bool LexTagEnd(size_t p, bool block, bool* strip_leading, bool* trim_newline, size_t* end) {
    const char close = block ? '%' : '}';
    const char c = src_[p];
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
      *end = q + 2;
      return true;
    }
    return false;
  }

  // A name at p; returns the offset after it.
  size_t LexName(size_t p) {
    size_t q = p;
    while (q < src_.size() && (IsNameStart(src_[q]) || IsDigit(src_[q]))) ++q;
    out_.push_back(Token{Tok::kName, std::string(src_.substr(p, q - p)), 0, 0, p});
    return q;
  }

  // An integer or float literal at p; returns the offset after it.
  Result<size_t> LexNumber(size_t p) {
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
    return q;
  }

  // A quoted string literal at p; returns the offset after its closing quote.
  Result<size_t> LexString(size_t p) {
    const char c = src_[p];
    std::string s;
    size_t q = p + 1;
    while (true) {
      if (q >= src_.size()) return Fail(p, "unterminated string literal");
      const char d = src_[q];
      if (d == c) break;
      if (d == '\\' && q + 1 < src_.size()) {
        Result<size_t> next = LexEscape(q, &s);
        if (!next.ok()) return next.error();
        q = *next;
        continue;
      }
      s += d;
      ++q;
    }
    out_.push_back(Token{Tok::kString, std::move(s), 0, 0, p});
    return q + 1;
  }

  // The escape sequence at q (a backslash) appended to *s; returns the offset after it.
  Result<size_t> LexEscape(size_t q, std::string* s) {
    const char x = src_[q + 1];
    q += 2;
    switch (x) {
      case 'n':
        *s += '\n';
        break;
      case 't':
        *s += '\t';
        break;
      case 'r':
        *s += '\r';
        break;
      case '0':
        *s += '\0';
        break;
      case '\\':
      case '\'':
      case '"':
        *s += x;
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
        AppendUtf8(cp, s);
        break;
      }
      default:
        *s += '\\';
        *s += x;
    }
    return q;
  }

  // An operator at p (brackets counted in *depth); returns the offset after it.
  Result<size_t> LexOperator(size_t p, int* depth) {
    const char c = src_[p];
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
      if (c == '(' || c == '[' || c == '{') ++*depth;
      if ((c == ')' || c == ']' || c == '}') && *depth > 0) --*depth;
    }
    out_.push_back(Token{Tok::kOp, op, 0, 0, p});
    return p + op.size();
  }

  std::string_view src_;
  const Positions& pos_;
  std::vector<Token> out_;
};

}  // namespace

Result<std::vector<Token>> Lex(std::string_view src, const Positions& pos) {
  Lexer lexer(src, pos);
  return lexer.Run();
}

}  // namespace lamina::chat::jinja::internal
