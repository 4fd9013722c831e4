// Tool-call parsing over a small strict JSON reader (see tool_calls.h).
#include "chat/tool_calls.h"

#include <algorithm>
#include <cstdint>
#include <optional>

namespace lamina::chat {

namespace {

constexpr int kMaxDepth = 64;  // nesting of one generated JSON value

constexpr std::string_view kHermesOpen = "<tool_call>";
constexpr std::string_view kHermesClose = "</tool_call>";
constexpr std::string_view kMistralOpen = "[TOOL_CALLS]";
constexpr std::string_view kPythonTag = "<|python_tag|>";

bool IsWs(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

void AppendUtf8(uint32_t cp, std::string* out) {
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

// A strict JSON reader over one string: each method consumes a value at pos or fails.
struct Reader {
  std::string_view s;
  size_t pos = 0;

  bool AtEnd() const { return pos >= s.size(); }
  void Ws() {
    while (pos < s.size() && IsWs(s[pos])) ++pos;
  }
  bool Lit(std::string_view w) {
    if (s.substr(pos, w.size()) != w) return false;
    pos += w.size();
    return true;
  }
  bool Hex4(uint32_t* v) {
    if (pos + 4 > s.size()) return false;
    *v = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = s[pos++];
      const int d = c >= '0' && c <= '9'   ? c - '0'
                    : c >= 'a' && c <= 'f' ? c - 'a' + 10
                    : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                           : -1;
      if (d < 0) return false;
      *v = *v * 16 + static_cast<uint32_t>(d);
    }
    return true;
  }
  // A string literal; its decoded text into *out when out is not null.
  bool String(std::string* out) {
    if (!Lit("\"")) return false;
    while (pos < s.size()) {
      const unsigned char c = static_cast<unsigned char>(s[pos]);
      if (c == '"') {
        ++pos;
        return true;
      }
      if (c < 0x20) return false;
      if (c != '\\') {
        if (out) *out += static_cast<char>(c);
        ++pos;
        continue;
      }
      if (++pos >= s.size()) return false;
      const char e = s[pos++];
      char plain = 0;
      switch (e) {
        case '"':
        case '\\':
        case '/':
          plain = e;
          break;
        case 'b':
          plain = '\b';
          break;
        case 'f':
          plain = '\f';
          break;
        case 'n':
          plain = '\n';
          break;
        case 'r':
          plain = '\r';
          break;
        case 't':
          plain = '\t';
          break;
        case 'u': {
          uint32_t cp;
          if (!Hex4(&cp)) return false;
          if (cp >= 0xD800 && cp < 0xDC00 && s.substr(pos, 2) == "\\u") {
            const size_t save = pos;
            pos += 2;
            uint32_t lo;
            if (Hex4(&lo) && lo >= 0xDC00 && lo < 0xE000) {
              cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            } else {
              pos = save;
            }
          }
          if (cp >= 0xD800 && cp < 0xE000) cp = 0xFFFD;  // a lone surrogate
          if (out) AppendUtf8(cp, out);
          continue;
        }
        default:
          return false;
      }
      if (out) *out += plain;
    }
    return false;
  }
  bool Digits() {
    const size_t start = pos;
    while (pos < s.size() && s[pos] >= '0' && s[pos] <= '9') ++pos;
    return pos > start;
  }
  bool Number() {
    Lit("-");
    if (Lit("0")) {
    } else if (pos < s.size() && s[pos] >= '1' && s[pos] <= '9') {
      Digits();
    } else {
      return false;
    }
    if (Lit(".") && !Digits()) return false;
    if (pos < s.size() && (s[pos] == 'e' || s[pos] == 'E')) {
      ++pos;
      if (!Lit("+")) Lit("-");
      if (!Digits()) return false;
    }
    return true;
  }
  bool Value(int depth) {
    if (depth > kMaxDepth || AtEnd()) return false;
    const char c = s[pos];
    if (c == '"') return String(nullptr);
    if (c == '{') return Object(depth, nullptr);
    if (c == '[') {
      ++pos;
      Ws();
      if (Lit("]")) return true;
      for (;;) {
        Ws();
        if (!Value(depth + 1)) return false;
        Ws();
        if (Lit("]")) return true;
        if (!Lit(",")) return false;
      }
    }
    if (c == 't') return Lit("true");
    if (c == 'f') return Lit("false");
    if (c == 'n') return Lit("null");
    return Number();
  }
  struct Field {
    std::string key;
    size_t begin, end;  // the value's bytes in s
  };
  // An object; its members (keys decoded, values as spans) into *fields when not null.
  bool Object(int depth, std::vector<Field>* fields) {
    if (depth > kMaxDepth || !Lit("{")) return false;
    Ws();
    if (Lit("}")) return true;
    for (;;) {
      Ws();
      std::string key;
      if (!String(fields ? &key : nullptr)) return false;
      Ws();
      if (!Lit(":")) return false;
      Ws();
      const size_t begin = pos;
      if (!Value(depth + 1)) return false;
      if (fields) fields->push_back({std::move(key), begin, pos});
      Ws();
      if (Lit("}")) return true;
      if (!Lit(",")) return false;
    }
  }
};

// One call object {"name": "...", "arguments" | "parameters": {...} or "<JSON text>"}.
std::optional<ToolCall> CallFromObject(std::string_view obj) {
  Reader r{obj};
  std::vector<Reader::Field> fields;
  if (!r.Object(0, &fields)) return std::nullopt;
  std::optional<ToolCall> call;
  const Reader::Field* name = nullptr;
  const Reader::Field* args = nullptr;
  for (const Reader::Field& f : fields) {  // duplicate keys: the last one wins
    if (f.key == "name") name = &f;
    if (f.key == "arguments" || f.key == "parameters") args = &f;
  }
  if (!name) return std::nullopt;
  ToolCall c;
  Reader nr{obj, name->begin};
  if (!nr.String(&c.name) || c.name.empty()) return std::nullopt;
  if (!args) {
    c.arguments = "{}";
  } else if (obj[args->begin] == '{') {
    c.arguments = std::string(obj.substr(args->begin, args->end - args->begin));
  } else if (obj[args->begin] == '"') {
    // Arguments written as a JSON string holding the object's text (OpenAI's own shape).
    Reader ar{obj, args->begin};
    std::string text;
    if (!ar.String(&text) || !IsJson(text)) return std::nullopt;
    c.arguments = std::move(text);
  } else {
    return std::nullopt;
  }
  return c;
}

// The end of the JSON value starting at `at` (after whitespace), or npos when none parses.
size_t ValueEnd(std::string_view text, size_t at, int depth = 0) {
  Reader r{text, at};
  r.Ws();
  if (!r.Value(depth)) return std::string_view::npos;
  return r.pos;
}

bool ParseHermes(std::string_view text, ToolCallParse* out) {
  size_t at = 0;
  bool found = false;
  for (;;) {
    const size_t open = text.find(kHermesOpen, at);
    if (open == std::string_view::npos) break;
    Reader r{text, open + kHermesOpen.size()};
    r.Ws();
    const size_t begin = r.pos;
    std::optional<ToolCall> call;
    size_t end = std::string_view::npos;
    if (r.Object(0, nullptr)) {
      call = CallFromObject(text.substr(begin, r.pos - begin));
      r.Ws();
      // The closing tag, or the end of the output (a stop string may have cut it).
      if (r.Lit(kHermesClose) || r.AtEnd()) end = r.pos;
    }
    if (!call || end == std::string_view::npos) {  // malformed: stays content
      out->content += text.substr(at, open + kHermesOpen.size() - at);
      at = open + kHermesOpen.size();
      continue;
    }
    out->content += text.substr(at, open - at);
    out->calls.push_back(std::move(*call));
    found = true;
    at = end;
  }
  out->content += text.substr(at);
  return found;
}

bool ParseMistral(std::string_view text, ToolCallParse* out) {
  const size_t open = text.find(kMistralOpen);
  if (open == std::string_view::npos) return false;
  Reader r{text, open + kMistralOpen.size()};
  r.Ws();
  std::vector<ToolCall> calls;
  if (!r.Lit("[")) return false;
  r.Ws();
  if (r.Lit("]")) return false;
  for (;;) {
    r.Ws();
    const size_t begin = r.pos;
    if (!r.Object(0, nullptr)) return false;
    std::optional<ToolCall> call = CallFromObject(text.substr(begin, r.pos - begin));
    if (!call) return false;
    calls.push_back(std::move(*call));
    r.Ws();
    if (r.Lit("]")) break;
    if (!r.Lit(",")) return false;
  }
  out->content = std::string(text.substr(0, open)) + std::string(text.substr(r.pos));
  out->calls = std::move(calls);
  return true;
}

bool ParseBareJson(std::string_view text, const std::vector<std::string>& names,
                   ToolCallParse* out) {
  size_t first = 0;
  while (first < text.size() && IsWs(text[first])) ++first;
  if (text.substr(first).starts_with(kPythonTag)) first += kPythonTag.size();
  Reader r{text, first};
  r.Ws();
  const size_t begin = r.pos;
  if (!r.Object(0, nullptr)) return false;
  const size_t end = r.pos;
  r.Ws();
  if (!r.AtEnd()) return false;
  std::optional<ToolCall> call = CallFromObject(text.substr(begin, end - begin));
  if (!call) return false;
  if (!names.empty() && std::find(names.begin(), names.end(), call->name) == names.end()) {
    return false;
  }
  out->calls.push_back(std::move(*call));
  out->content.clear();
  return true;
}

}  // namespace

bool IsJson(std::string_view text) {
  const size_t end = ValueEnd(text, 0);
  if (end == std::string_view::npos) return false;
  Reader r{text, end};
  r.Ws();
  return r.AtEnd();
}

ToolCallParse ParseToolCalls(std::string_view text, const std::vector<std::string>& names) {
  ToolCallParse out;
  if (text.find(kHermesOpen) != std::string_view::npos) {
    if (ParseHermes(text, &out)) return out;
    out = {};
  }
  if (ParseMistral(text, &out)) return out;
  out = {};
  if (ParseBareJson(text, names, &out)) return out;
  out = {};
  out.content = std::string(text);
  return out;
}

size_t ToolCallSafePrefix(std::string_view text) {
  size_t first = 0;
  while (first < text.size() && IsWs(text[first])) ++first;
  const std::string_view rest = text.substr(first);
  if (rest.empty() || rest[0] == '{') return 0;
  if (rest.starts_with(kPythonTag) ||
      (rest.size() < kPythonTag.size() && kPythonTag.starts_with(rest))) {
    return 0;
  }
  size_t cut = text.size();
  for (std::string_view opener : {kHermesOpen, kMistralOpen}) {
    cut = std::min(cut, text.find(opener));
    // A trailing partial opener.
    const size_t longest = std::min(opener.size() - 1, text.size());
    for (size_t k = longest; k > 0; --k) {
      if (text.ends_with(opener.substr(0, k))) {
        cut = std::min(cut, text.size() - k);
        break;
      }
    }
  }
  return cut;
}

}  // namespace lamina::chat
