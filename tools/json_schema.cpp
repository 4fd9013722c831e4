// JSON Schema → GBNF: one rule per schema node, primitives shared, objects keeping their
// properties' order with optional ones skippable, arrays with item counts, string patterns
// through a small regex → GBNF translation.
#include "json_schema.h"

#include <algorithm>
#include <map>
#include <set>
#include <vector>

#include "runtime/grammar.h"
#include "server/json_limits.h"
#include "tokenizer/unicode.h"

namespace lamina::cli {
namespace {

using json = nlohmann::ordered_json;

// Untrusted schemas (requests, tool parameters, --json-schema files) are converted under these
// caps; each refusal is an error naming the schema's JSON pointer and the limit.
constexpr int kMaxDepth = 64;  // schema levels (properties, items, anyOf, $ref, ...) nested
constexpr size_t kMaxRules = 10000;
constexpr size_t kMaxProperties = 256;
constexpr int64_t kMaxCount = kMaxGrammarRepeat;  // the grammar's repetition limit
constexpr size_t kMaxTypes = 7;                   // distinct names in a "type" array
// Rule names are made from the path of property names; longer prefixes are cut here (a number
// keeps them apart), so a long key cannot make every rule mentioning it long.
constexpr size_t kMaxNameHint = 48;
// Regex `pattern`s: groups nested (the converter recurses per group, and each regex level
// becomes at most three GBNF group levels, inside the grammar parser's kMaxGrammarNesting),
// their length, and the elements their repetitions expand to (the grammar parser's cap).
constexpr int kMaxRegexNesting = 64;
constexpr size_t kMaxPatternBytes = 16 << 10;
constexpr uint64_t kMaxRegexElements = kMaxGrammarElements;

// A GBNF string literal for the bytes of `text`.
std::string Literal(const std::string& text) {
  std::string out = "\"";
  for (unsigned char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20 || c == 0x7F) {
          static const char* kHex = "0123456789ABCDEF";
          out += "\\x";
          out += kHex[c >> 4];
          out += kHex[c & 15];
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

// A code point inside a GBNF character class.
std::string ClassChar(uint32_t cp) {
  if (cp == ']' || cp == '[' || cp == '\\' || cp == '-' || cp == '^' || cp == '"') {
    return std::string("\\") + static_cast<char>(cp);
  }
  if (cp < 0x20 || cp == 0x7F) {
    char buf[8];
    snprintf(buf, sizeof(buf), "\\x%02X", cp);
    return buf;
  }
  std::string out;
  unicode::AppendUtf8(cp, &out);
  return out;
}

const char* kSpace = R"(| " " | "\n" [ \t]{0,20})";
const std::map<std::string, std::pair<std::string, std::vector<std::string>>>& Primitives() {
  // name → (body, the rules it uses)
  static const auto* p = new std::map<std::string,
                                      std::pair<std::string, std::vector<std::string>>>{
      {"space", {kSpace, {}}},
      {"boolean", {R"(("true" | "false") space)", {"space"}}},
      {"null", {R"("null" space)", {"space"}}},
      {"integral-part", {R"([0] | [1-9] [0-9]{0,15})", {}}},
      {"decimal-part", {R"([0-9]{1,16})", {}}},
      {"integer", {R"(("-"? integral-part) space)", {"integral-part", "space"}}},
      {"number",
       {R"(("-"? integral-part) ("." decimal-part)? ([eE] [-+]? integral-part)? space)",
        {"integral-part", "decimal-part", "space"}}},
      {"char", {R"([^"\\\x7F\x00-\x1F] | [\\] (["\\/bfnrt] | "u" [0-9a-fA-F]{4}))", {}}},
      {"string", {R"("\"" char* "\"" space)", {"char", "space"}}},
      {"value",
       {"object | array | string | number | boolean | null",
        {"object", "array", "string", "number", "boolean", "null"}}},
      {"object",
       {R"("{" space ( string ":" space value ("," space string ":" space value)* )? "}" space)",
        {"string", "value", "space"}}},
      {"array", {R"("[" space ( value ("," space value)* )? "]" space)", {"value", "space"}}},
      {"date",
       {R"([0-9]{4} "-" ( "0" [1-9] | "1" [0-2] ) "-" ( "0" [1-9] | [1-2] [0-9] | "3" [0-1] ))",
        {}}},
      {"time",
       {R"(([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]{3} )? ( "Z" | ( "+" | "-" ) ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] ))",
        {}}},
      {"date-time", {R"(date "T" time)", {"date", "time"}}},
      {"date-string", {R"("\"" date "\"" space)", {"date", "space"}}},
      {"time-string", {R"("\"" time "\"" space)", {"time", "space"}}},
      {"date-time-string", {R"("\"" date-time "\"" space)", {"date-time", "space"}}},
      {"uuid",
       {R"("\"" [0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{12} "\"" space)",
        {"space"}}},
  };
  return *p;
}

// The pattern of a `pattern` keyword as a GBNF expression over the JSON string's text
// (characters JSON escapes appear escaped). Supports literals, escapes, ., classes, groups,
// alternation and quantifiers; ^ and $ only at the ends (a pattern is matched whole).
class RegexToGbnf {
 public:
  explicit RegexToGbnf(const std::string& re) : re_(re) {}
  Result<std::string> Convert() {
    if (re_.size() > kMaxPatternBytes) {
      return Error{"the pattern is " + std::to_string(re_.size()) + " bytes, over the limit of " +
                   std::to_string(kMaxPatternBytes)};
    }
    if (pos_ < re_.size() && re_[pos_] == '^') ++pos_;
    std::string out;
    uint64_t size = 0;
    if (!Alt(&out, &size)) return Error{error_};
    if (pos_ < re_.size())
      return Error{"unexpected '" + std::string(1, re_[pos_]) + "' at " + std::to_string(pos_)};
    return out;
  }

 private:
  bool Fail(const std::string& what) {
    if (error_.empty()) error_ = what + " at offset " + std::to_string(pos_);
    return false;
  }
  bool AtEnd() const { return pos_ >= re_.size(); }
  // $ at the very end is the anchor; elsewhere it is unsupported.
  bool AtAnchorEnd() const { return pos_ + 1 == re_.size() && re_[pos_] == '$'; }

  // *size: the grammar elements the expression expands to once its repetitions are written
  // out (capped just past kMaxRegexElements).
  bool Alt(std::string* out, uint64_t* size) {
    std::vector<std::string> alts;
    *size = 0;
    while (true) {
      std::string seq;
      uint64_t seq_size = 0;
      if (!Seq(&seq, &seq_size)) return false;
      *size = std::min(*size + seq_size, kMaxRegexElements + 1);
      alts.push_back(seq.empty() ? "\"\"" : seq);
      if (!AtEnd() && re_[pos_] == '|') {
        ++pos_;
        continue;
      }
      break;
    }
    if (alts.size() == 1) {
      *out = alts[0];
    } else {
      *out = "(";
      for (size_t i = 0; i < alts.size(); ++i) *out += (i ? " | " : "") + alts[i];
      *out += ")";
    }
    if (AtAnchorEnd()) ++pos_;
    return true;
  }

  bool Seq(std::string* out, uint64_t* size) {
    while (!AtEnd() && re_[pos_] != '|' && re_[pos_] != ')' && !AtAnchorEnd()) {
      std::string atom;
      uint64_t atom_size = 1;
      if (!Atom(&atom, &atom_size)) return false;
      if (!AtEnd()) {
        const char q = re_[pos_];
        if (q == '*' || q == '+' || q == '?') {
          atom = "(" + atom + ")" + q;
          atom_size += 3;  // the group's rule reference and a helper rule
          ++pos_;
        } else if (q == '{') {
          const size_t at = pos_;
          const size_t close = re_.find('}', pos_);
          if (close == std::string::npos) return Fail("unclosed '{'");
          const std::string body = re_.substr(pos_ + 1, close - pos_ - 1);
          // {m}, {m,} or {m,n}, each count at most the grammar's repetition limit.
          const size_t comma = body.find(',');
          const std::string lo = body.substr(0, comma);
          const std::string hi = comma == std::string::npos ? lo : body.substr(comma + 1);
          auto count = [](const std::string& digits, uint64_t* v) {
            if (digits.empty()) return false;
            *v = 0;
            for (char c : digits) {
              if (c < '0' || c > '9') return false;
              *v = std::min<uint64_t>(*v * 10 + (c - '0'), UINT32_MAX);  // saturates
            }
            return true;
          };
          uint64_t min = 0, max = 0;
          if (!count(lo, &min) || (!hi.empty() && !count(hi, &max)) ||
              (comma != std::string::npos && hi.find(',') != std::string::npos)) {
            return Fail("bad repetition '{" + body + "}'");
          }
          if (hi.empty()) max = min;  // {m,}: m copies and a loop
          if (std::max(min, max) > static_cast<uint64_t>(kMaxCount)) {
            pos_ = at;
            return Fail("repetition count over the limit of " + std::to_string(kMaxCount));
          }
          if (!hi.empty() && max < min) return Fail("repetition {m,n} with n < m");
          atom = "(" + atom + "){" + body + "}";
          // The unit is a group (one rule reference), written out max(m, n) times plus a
          // helper rule per optional copy: the grammar parser's count, so nesting adds.
          atom_size += 2 * std::max<uint64_t>(std::max(min, max), 1) + 1;
          pos_ = close + 1;
        }
        if (!AtEnd() && re_[pos_] == '?') ++pos_;  // lazy: the same language
      }
      *size = std::min(*size + atom_size, kMaxRegexElements + 1);
      if (*size > kMaxRegexElements) {
        return Fail("the pattern's repetitions expand to over " +
                    std::to_string(kMaxRegexElements) + " grammar elements");
      }
      if (!out->empty()) *out += " ";
      *out += atom;
    }
    return true;
  }

  // One code point of the pattern (raw UTF-8).
  bool Codepoint(uint32_t* cp) {
    size_t at = pos_;
    if (!unicode::DecodeOne(re_, &at, cp)) return Fail("invalid UTF-8");
    pos_ = at;
    return true;
  }

  // A literal code point as the JSON text that encodes it.
  static std::string JsonChar(uint32_t cp) {
    switch (cp) {
      case '"':
        return Literal("\\\"");
      case '\\':
        return Literal("\\\\");
      case '\n':
        return Literal("\\n");
      case '\r':
        return Literal("\\r");
      case '\t':
        return Literal("\\t");
      default:
        break;
    }
    if (cp < 0x20) {
      char buf[8];
      snprintf(buf, sizeof(buf), "\\u%04x", cp);
      return Literal(buf);
    }
    std::string s;
    unicode::AppendUtf8(cp, &s);
    return Literal(s);
  }

  static constexpr const char* kJsonUnescaped = "\"\\\\\\x7F\\x00-\\x1F";  // class tail

  bool Atom(std::string* out, uint64_t* size) {
    const char c = re_[pos_];
    if (c == '(') {
      if (depth_ >= kMaxRegexNesting) {
        return Fail("the pattern nests groups deeper than " + std::to_string(kMaxRegexNesting));
      }
      ++pos_;
      if (re_.compare(pos_, 2, "?:") == 0) {
        pos_ += 2;
      } else if (pos_ < re_.size() && re_[pos_] == '?') {
        return Fail("lookarounds and named groups are not supported");
      }
      std::string inner;
      ++depth_;
      const bool ok = Alt(&inner, size);
      --depth_;
      if (!ok) return false;
      if (AtEnd() || re_[pos_] != ')') return Fail("unclosed '('");
      ++pos_;
      *out = "(" + inner + ")";
      return true;
    }
    if (c == '[') return Class(out);
    if (c == '.') {
      ++pos_;
      *out = "char";
      uses_char_ = true;
      return true;
    }
    if (c == '\\') {
      ++pos_;
      if (AtEnd()) return Fail("trailing backslash");
      const char e = re_[pos_++];
      switch (e) {
        case 'd':
          *out = "[0-9]";
          return true;
        case 'w':
          *out = "[a-zA-Z0-9_]";
          return true;
        case 's':
          *out = R"(([ ] | "\\t" | "\\n" | "\\r"))";
          return true;
        case 'D':
          *out = std::string("[^0-9") + kJsonUnescaped + "]";
          return true;
        case 'W':
          *out = std::string("[^a-zA-Z0-9_") + kJsonUnescaped + "]";
          return true;
        case 'S':
          *out = std::string("[^ ") + kJsonUnescaped + "]";
          return true;
        default: {
          uint32_t cp;
          if (!EscapedChar(e, "", &cp)) return false;
          *out = JsonChar(cp);
          return true;
        }
      }
    }
    if (c == '*' || c == '+' || c == '?' || c == '{') return Fail("nothing to repeat");
    if (c == '^' || c == '$') return Fail("anchors are supported only at the ends");
    uint32_t cp;
    if (!Codepoint(&cp)) return false;
    *out = JsonChar(cp);
    return true;
  }

  bool ClassEscape(uint32_t* cp, std::string* named) {
    ++pos_;
    if (AtEnd()) return Fail("trailing backslash");
    const char e = re_[pos_++];
    switch (e) {
      case 'd':
        *named = "0-9";
        return true;
      case 'w':
        *named = "a-zA-Z0-9_";
        return true;
      case 's':
        *named = " ";
        return true;
      default:
        return EscapedChar(e, " in a class", cp);
    }
  }

  // The character of an escape that is not a class shorthand: \n, \t, \r, or punctuation as
  // itself; other letters and digits (back-references, \b, ...) are unsupported.
  bool EscapedChar(char e, const char* where, uint32_t* cp) {
    if (e == 'n' || e == 't' || e == 'r') {
      *cp = e == 'n' ? '\n' : e == 't' ? '\t' : '\r';
      return true;
    }
    if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z') || (e >= '0' && e <= '9')) {
      return Fail(std::string("unsupported escape '\\") + e + "'" + where);
    }
    *cp = static_cast<uint8_t>(e);
    return true;
  }

  bool Class(std::string* out) {
    ++pos_;
    bool negated = false;
    if (!AtEnd() && re_[pos_] == '^') {
      negated = true;
      ++pos_;
    }
    std::string body;
    std::vector<std::string> escaped;  // members JSON writes escaped (positive classes)
    bool first = true;
    while (!AtEnd() && (re_[pos_] != ']' || first)) {
      first = false;
      uint32_t lo = 0;
      std::string named;
      if (re_[pos_] == '\\') {
        if (!ClassEscape(&lo, &named)) return false;
      } else if (!Codepoint(&lo)) {
        return false;
      }
      if (!named.empty()) {
        body += named;
        continue;
      }
      uint32_t hi = lo;
      if (pos_ + 1 < re_.size() && re_[pos_] == '-' && re_[pos_ + 1] != ']') {
        ++pos_;
        if (re_[pos_] == '\\') {
          if (!ClassEscape(&hi, &named)) return false;
          if (!named.empty()) return Fail("a class shorthand cannot end a range");
        } else if (!Codepoint(&hi)) {
          return false;
        }
        if (hi < lo) return Fail("backwards range in a class");
      }
      // Members JSON must escape are matched as their escapes (positive classes), or simply
      // excluded (negated classes exclude them all below).
      for (uint32_t special :
           {uint32_t('"'), uint32_t('\\'), uint32_t('\n'), uint32_t('\r'), uint32_t('\t')}) {
        if (!negated && special >= lo && special <= hi) escaped.push_back(JsonChar(special));
      }
      uint32_t a = std::max<uint32_t>(lo, 0x20);
      // Split around '"' and '\\'.
      auto add = [&](uint32_t x, uint32_t y) {
        if (x > y) return;
        body += ClassChar(x);
        if (y > x) body += "-" + ClassChar(y);
      };
      if (hi < a) continue;
      uint32_t cut1 = '"', cut2 = '\\';
      if (a <= cut1 && hi >= cut1) {
        add(a, cut1 - 1);
        a = cut1 + 1;
      }
      if (a <= cut2 && hi >= cut2) {
        add(a, cut2 - 1);
        a = cut2 + 1;
      }
      add(a, hi);
    }
    if (AtEnd()) return Fail("unclosed '['");
    ++pos_;
    if (negated) {
      *out = "[^" + body + kJsonUnescaped + "]";
      return true;
    }
    std::vector<std::string> alts;
    if (!body.empty()) alts.push_back("[" + body + "]");
    alts.insert(alts.end(), escaped.begin(), escaped.end());
    if (alts.empty()) return Fail("empty class");
    if (alts.size() == 1) {
      *out = alts[0];
    } else {
      *out = "(";
      for (size_t i = 0; i < alts.size(); ++i) *out += (i ? " | " : "") + alts[i];
      *out += ")";
    }
    return true;
  }

 public:
  bool uses_char_ = false;

 private:
  const std::string re_;
  size_t pos_ = 0;
  int depth_ = 0;  // groups open at pos_
  std::string error_;
};

class Converter {
 public:
  explicit Converter(const json& root) : root_(root) {}

  Result<std::string> Run() {
    std::string top;
    if (!Visit(root_, "root", "", 0, &top)) return Error{error_};
    std::string out;
    // root first, then the rest in name order.
    auto it = rules_.find("root");
    if (it == rules_.end() || top != "root") {
      out += "root ::= " + top + "\n";
    } else {
      out += "root ::= " + it->second + "\n";
    }
    for (const auto& [name, body] : rules_) {
      if (name != "root") out += name + " ::= " + body + "\n";
    }
    return out;
  }

 private:
  bool Fail(const std::string& path, const std::string& what) {
    if (error_.empty()) error_ = "json_schema at " + (path.empty() ? "/" : path) + ": " + what;
    return false;
  }

  static std::string Sanitize(const std::string& name) {
    std::string out;
    for (char c : name.substr(0, kMaxNameHint)) {
      const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
      out += ok ? c : '-';
    }
    return out.empty() ? "r" : out;
  }

  // Adds a primitive rule and those it uses; returns its name.
  std::string Primitive(const std::string& name) {
    if (rules_.count(name)) return name;
    const auto& [body, deps] = Primitives().at(name);
    rules_[name] = body;
    for (const std::string& d : deps) Primitive(d);
    return name;
  }

  // A new rule named after `hint`; returns its name (body set by the caller via rules_).
  std::string NewName(const std::string& hint) {
    std::string base = Sanitize(hint);
    if (Primitives().count(base)) base += "-";
    std::string name = base;
    for (int i = 1; rules_.count(name) || reserved_.count(name); ++i) {
      name = base + "-" + std::to_string(i);
    }
    reserved_.insert(name);
    return name;
  }

  bool Add(const std::string& name, const std::string& body) {
    rules_[name] = body;
    if (rules_.size() > kMaxRules) {
      return Fail("", "the schema needs over " + std::to_string(kMaxRules) + " rules");
    }
    bytes_ += name.size() + body.size() + 6;
    if (bytes_ > kMaxGrammarBytes) {
      return Fail(
          "", "the schema needs a grammar of over " + std::to_string(kMaxGrammarBytes) + " bytes");
    }
    return true;
  }

  static std::string JsonLiteral(const json& v) { return Literal(v.dump()) + " space"; }

  bool GetCount(const json& s, const char* key, const std::string& path, int64_t* out) {
    auto it = s.find(key);
    if (it == s.end()) return true;
    if (!it->is_number_integer() && !it->is_number_unsigned()) {
      return Fail(path + "/" + key, "must be a non-negative integer");
    }
    const int64_t v = it->is_number_unsigned()
                          ? static_cast<int64_t>(std::min<uint64_t>(it->get<uint64_t>(), INT64_MAX))
                          : it->get<int64_t>();
    if (v < 0) return Fail(path + "/" + key, "must be a non-negative integer");
    *out = v;
    return true;
  }

  // Repetition suffix for min..max (max -1: unbounded) of a unit that follows one already
  // written: {lo,hi} in GBNF.
  static std::string Reps(int64_t min, int64_t max) {
    if (max < 0) return min == 0 ? "*" : (min == 1 ? "+" : "{" + std::to_string(min) + ",}");
    if (min == max) return "{" + std::to_string(min) + "}";
    return "{" + std::to_string(min) + "," + std::to_string(max) + "}";
  }

  bool ResolveRef(const std::string& ref, const std::string& path, const json** target) {
    if (ref.rfind("#", 0) != 0) return Fail(path, "only local $ref (\"#/...\") is supported");
    json::json_pointer ptr;
    try {
      ptr = json::json_pointer(ref.substr(1));
    } catch (const json::exception&) {
      return Fail(path, "malformed $ref \"" + ref + "\"");
    }
    if (!root_.contains(ptr)) return Fail(path, "$ref \"" + ref + "\" points nowhere");
    *target = &root_.at(ptr);
    return true;
  }

  // Visits schema node `s` at JSON pointer `path`; *rule = a rule name (or a primitive's).
  bool Visit(const json& s, const std::string& hint, const std::string& path, int depth,
             std::string* rule) {
    if (depth > kMaxDepth) {
      return Fail(path, "the schema nests deeper than " + std::to_string(kMaxDepth) + " levels");
    }
    if (s.is_boolean()) {
      if (!s.get<bool>()) return Fail(path, "the schema false allows nothing");
      *rule = Primitive("value");
      return true;
    }
    if (!s.is_object()) return Fail(path, "a schema must be an object or a boolean");
    if (auto it = s.find("$ref"); it != s.end()) {
      if (!it->is_string()) return Fail(path + "/$ref", "must be a string");
      const std::string ref = it->get<std::string>();
      auto known = refs_.find(ref);
      if (known != refs_.end()) {
        *rule = known->second;
        return true;
      }
      const json* target;
      if (!ResolveRef(ref, path, &target)) return false;
      const size_t slash = ref.find_last_of('/');
      const std::string name = NewName(slash == std::string::npos ? ref : ref.substr(slash + 1));
      refs_[ref] = name;
      std::string inner;
      if (!Visit(*target, name + "-def", ref.substr(1), depth + 1, &inner)) return false;
      *rule = name;
      return Add(name, inner);
    }
    std::string body;
    if (!Body(s, hint, path, depth, &body)) return false;
    // A body that is just a primitive's name needs no rule of its own.
    if (Primitives().count(body) && rules_.count(body)) {
      *rule = body;
      return true;
    }
    *rule = NewName(hint);
    return Add(*rule, body);
  }

  bool Alternatives(const json& list, const char* key, const std::string& hint,
                    const std::string& path, int depth, std::string* body) {
    if (!list.is_array() || list.empty()) {
      return Fail(path + "/" + key, "must be a non-empty array");
    }
    std::string out;
    for (size_t i = 0; i < list.size(); ++i) {
      std::string r;
      if (!Visit(list[i], hint + "-" + std::to_string(i),
                 path + "/" + key + "/" + std::to_string(i), depth + 1, &r)) {
        return false;
      }
      out += (i ? " | " : "") + r;
    }
    *body = list.size() == 1 ? out : "(" + out + ")";
    return true;
  }

  bool Body(const json& s, const std::string& hint, const std::string& path, int depth,
            std::string* body) {
    if (auto it = s.find("const"); it != s.end()) {
      *body = JsonLiteral(*it);
      Primitive("space");
      return true;
    }
    if (auto it = s.find("enum"); it != s.end()) {
      if (!it->is_array() || it->empty()) return Fail(path + "/enum", "must be a non-empty array");
      std::string out;
      for (size_t i = 0; i < it->size(); ++i) out += (i ? " | " : "") + JsonLiteral((*it)[i]);
      *body = it->size() == 1 ? out : "(" + out + ")";
      Primitive("space");
      return true;
    }
    for (const char* key : {"anyOf", "oneOf"}) {
      if (auto it = s.find(key); it != s.end()) {
        return Alternatives(*it, key, hint, path, depth, body);
      }
    }
    if (auto it = s.find("allOf"); it != s.end()) {
      if (it->is_array() && it->size() == 1) {
        std::string r;
        if (!Visit((*it)[0], hint, path + "/allOf/0", depth + 1, &r)) return false;
        *body = r;
        return true;
      }
      return Fail(path + "/allOf", "allOf with more than one schema is not supported");
    }
    auto type_it = s.find("type");
    std::string type;
    if (type_it != s.end()) {
      if (type_it->is_array()) {
        // Each listed type with the rest of the schema (not copied: a copy per type of a large
        // schema, nested, would cost its size times the types at every level).
        if (type_it->empty()) return Fail(path + "/type", "must be a non-empty array");
        if (type_it->size() > kMaxTypes) {
          return Fail(path + "/type", "lists over " + std::to_string(kMaxTypes) + " types");
        }
        std::set<std::string> seen;
        std::string out;
        for (size_t i = 0; i < type_it->size(); ++i) {
          const json& t = (*type_it)[i];
          const std::string at = path + "/type/" + std::to_string(i);
          if (!t.is_string()) return Fail(at, "must be a string");
          if (!seen.insert(t.get<std::string>()).second) return Fail(at, "repeats a type");
          std::string alt, r;
          const std::string alt_hint = hint + "-" + std::to_string(i);
          if (!TypedBody(s, t.get<std::string>(), alt_hint, path, depth + 1, &alt)) return false;
          if (Primitives().count(alt) && rules_.count(alt)) {
            r = alt;
          } else {
            r = NewName(alt_hint);
            if (!Add(r, alt)) return false;
          }
          out += (i ? " | " : "") + r;
        }
        *body = type_it->size() == 1 ? out : "(" + out + ")";
        return true;
      }
      if (!type_it->is_string()) return Fail(path + "/type", "must be a string or an array");
      type = type_it->get<std::string>();
    } else if (s.contains("properties") || s.contains("additionalProperties") ||
               s.contains("required")) {
      type = "object";
    } else if (s.contains("items") || s.contains("prefixItems") || s.contains("minItems") ||
               s.contains("maxItems")) {
      type = "array";
    } else if (s.contains("pattern") || s.contains("minLength") || s.contains("maxLength") ||
               s.contains("format")) {
      type = "string";
    } else {
      *body = Primitive("value");
      return true;
    }
    return TypedBody(s, type, hint, path, depth, body);
  }

  // The body of schema `s` read as the one type `type` (its "type", or one of its list).
  bool TypedBody(const json& s, const std::string& type, const std::string& hint,
                 const std::string& path, int depth, std::string* body) {
    if (depth > kMaxDepth) {
      return Fail(path, "the schema nests deeper than " + std::to_string(kMaxDepth) + " levels");
    }
    if (type == "boolean" || type == "null" || type == "integer" || type == "number") {
      *body = Primitive(type);
      return true;
    }
    if (type == "string") return StringBody(s, hint, path, body);
    if (type == "array") return ArrayBody(s, hint, path, depth, body);
    if (type == "object") return ObjectBody(s, hint, path, depth, body);
    return Fail(path + "/type", "unsupported type \"" + type + "\"");
  }

  bool StringBody(const json& s, const std::string& hint, const std::string& path,
                  std::string* body) {
    if (auto it = s.find("pattern"); it != s.end()) {
      if (!it->is_string()) return Fail(path + "/pattern", "must be a string");
      RegexToGbnf re(it->get<std::string>());
      Result<std::string> g = re.Convert();
      if (!g.ok()) return Fail(path + "/pattern", g.error().message);
      if (re.uses_char_) Primitive("char");
      *body = "\"\\\"\" " + *g + " \"\\\"\" " + Primitive("space");
      return true;
    }
    if (auto it = s.find("format"); it != s.end() && it->is_string()) {
      const std::string f = it->get<std::string>();
      if (f == "date" || f == "time" || f == "date-time") {
        *body = Primitive(f + "-string");
        return true;
      }
      if (f == "uuid") {
        *body = Primitive("uuid");
        return true;
      }
      // Other formats (email, uri, ...) are not checked: any string.
    }
    int64_t min = 0, max = -1;
    if (!GetCount(s, "minLength", path, &min) || !GetCount(s, "maxLength", path, &max)) {
      return false;
    }
    if (min == 0 && max < 0) {
      *body = Primitive("string");
      return true;
    }
    if (min > kMaxCount) return Fail(path + "/minLength", "over " + std::to_string(kMaxCount));
    if (max > kMaxCount) max = -1;
    if (max >= 0 && max < min) return Fail(path, "maxLength < minLength");
    Primitive("char");
    *body = "\"\\\"\" char" + Reps(min, max) + " \"\\\"\" " + Primitive("space");
    return true;
  }

  bool ArrayBody(const json& s, const std::string& hint, const std::string& path, int depth,
                 std::string* body) {
    Primitive("space");
    // A tuple: prefixItems, or (draft 4's form, as llama.cpp reads it) items given as an array.
    auto tuple = s.find("prefixItems");
    const char* tuple_key = "prefixItems";
    if (tuple == s.end()) {
      if (auto items = s.find("items"); items != s.end() && items->is_array()) {
        tuple = items;
        tuple_key = "items";
      }
    }
    if (auto it = tuple; it != s.end()) {
      if (!it->is_array()) return Fail(path + "/prefixItems", "must be an array");
      std::string out = "\"[\" space";
      for (size_t i = 0; i < it->size(); ++i) {
        std::string r;
        if (!Visit((*it)[i], hint + "-" + std::to_string(i),
                   path + "/" + tuple_key + "/" + std::to_string(i), depth + 1, &r)) {
          return false;
        }
        out += (i ? " \",\" space " : " ") + r;
      }
      *body = out + " \"]\" space";
      return true;
    }
    std::string item = Primitive("value");
    if (auto it = s.find("items"); it != s.end()) {
      if (!Visit(*it, hint + "-item", path + "/items", depth + 1, &item)) return false;
    }
    int64_t min = 0, max = -1;
    if (!GetCount(s, "minItems", path, &min) || !GetCount(s, "maxItems", path, &max)) return false;
    if (min > kMaxCount) return Fail(path + "/minItems", "over " + std::to_string(kMaxCount));
    if (max > kMaxCount) max = -1;
    if (max >= 0 && max < min) return Fail(path, "maxItems < minItems");
    const std::string more = "(\",\" space " + item + ")";
    if (max == 0) {
      *body = "\"[\" space \"]\" space";
    } else if (min == 0) {
      const std::string rest = max < 0 ? "*" : (max == 1 ? "" : Reps(0, max - 1));
      *body = "\"[\" space (" + item + (rest.empty() ? "" : " " + more + rest) + ")? \"]\" space";
    } else {
      const std::string rest = max < 0 ? Reps(min - 1, -1) : Reps(min - 1, max - 1);
      const bool none = max == 1;
      *body = "\"[\" space " + item + (none ? "" : " " + more + rest) + " \"]\" space";
    }
    return true;
  }

  bool ObjectBody(const json& s, const std::string& hint, const std::string& path, int depth,
                  std::string* body) {
    Primitive("space");
    const json empty = json::object();
    const json* props = &empty;
    if (auto it = s.find("properties"); it != s.end()) {
      if (!it->is_object()) return Fail(path + "/properties", "must be an object");
      props = &*it;
    }
    if (props->size() > kMaxProperties) {
      return Fail(path + "/properties", "over " + std::to_string(kMaxProperties) + " properties");
    }
    std::set<std::string> required;
    if (auto it = s.find("required"); it != s.end()) {
      if (!it->is_array()) return Fail(path + "/required", "must be an array of names");
      for (const json& r : *it) {
        if (!r.is_string()) return Fail(path + "/required", "must be an array of names");
        required.insert(r.get<std::string>());
      }
    }
    // additionalProperties: absent with properties = none; absent without = any (an object of
    // any members); true or a schema = members beyond the listed ones, of that schema.
    std::string extra;  // the value rule of additional members, or "" for none
    if (auto it = s.find("additionalProperties"); it != s.end()) {
      if (it->is_boolean()) {
        if (it->get<bool>()) extra = Primitive("value");
      } else if (!Visit(*it, hint + "-additional", path + "/additionalProperties", depth + 1,
                        &extra)) {
        return false;
      }
    } else if (props->empty()) {
      extra = Primitive("value");
    }
    struct Member {
      std::string kv;
      bool required;
    };
    std::vector<Member> members;
    // Members come in the schema's order (the grammar enforces it, as llama-server's does).
    for (const auto& [key, sub] : props->items()) {
      std::string value;
      if (!Visit(sub, hint + "-" + key, path + "/properties/" + key, depth + 1, &value)) {
        return false;
      }
      const std::string kv = NewName(hint + "-" + key + "-kv");
      if (!Add(kv, Literal(json(key).dump()) + " space \":\" space " + value)) return false;
      members.push_back({kv, required.count(key) > 0});
    }
    for (const std::string& r : required) {
      if (!props->contains(r)) {
        return Fail(path + "/required", "\"" + r + "\" is required but not in properties");
      }
    }
    std::string extra_kv;
    if (!extra.empty()) {
      extra_kv = NewName(hint + "-additional-kv");
      if (!Add(extra_kv, Primitive("string") + " \":\" space " + extra)) return false;
    }
    const std::string extra_tail = extra_kv.empty() ? "" : " (\",\" space " + extra_kv + ")*";
    size_t first_required = members.size();
    for (size_t i = 0; i < members.size(); ++i) {
      if (members[i].required) {
        first_required = i;
        break;
      }
    }
    std::vector<std::string> alts;
    for (size_t j = 0; j < members.size() && j <= first_required; ++j) {
      std::string alt = members[j].kv;
      for (size_t k = j + 1; k < members.size(); ++k) {
        alt += members[k].required ? " \",\" space " + members[k].kv
                                   : " (\",\" space " + members[k].kv + ")?";
      }
      alts.push_back(alt + extra_tail);
    }
    const bool all_optional = first_required == members.size();
    if (all_optional && !extra_kv.empty()) alts.push_back(extra_kv + extra_tail);
    std::string inner;
    for (size_t i = 0; i < alts.size(); ++i) inner += (i ? " | " : "") + alts[i];
    if (alts.empty()) {
      *body = "\"{\" space \"}\" space";
    } else {
      *body = "\"{\" space (" + inner + ")" + (all_optional ? "?" : "") + " \"}\" space";
    }
    return true;
  }

  const json& root_;
  std::map<std::string, std::string> rules_;
  std::set<std::string> reserved_;
  std::map<std::string, std::string> refs_;
  size_t bytes_ = 0;  // the rules' text so far
  std::string error_;
};

}  // namespace

Result<std::string> JsonSchemaToGbnf(const nlohmann::ordered_json& schema) {
  // Before any recursive walk (dump of a const, a copy): the JSON itself is bounded.
  if (!JsonDepthWithin(schema, kMaxJsonDepth)) {
    return Error{"json_schema at /: the schema nests deeper than " + std::to_string(kMaxJsonDepth) +
                 " levels of JSON"};
  }
  return Converter(schema).Run();
}

}  // namespace lamina::cli
