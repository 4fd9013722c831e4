// The Jinja renderer's library (jinja_internal.h): filters, tests, global functions, string
// and dict methods, and Python's printf-style % formatting.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <limits>

#include "chat/jinja.h"
#include "chat/jinja_internal.h"

namespace lamina::chat::jinja::internal {

namespace {

std::string_view StripSet(std::string_view s, std::string_view chars, bool l, bool r) {
  auto in = [&](char c) {
    return chars.empty() ? IsSpace(c) : chars.find(c) != std::string_view::npos;
  };
  while (l && !s.empty() && in(s.front())) s.remove_prefix(1);
  while (r && !s.empty() && in(s.back())) s.remove_suffix(1);
  return s;
}

int64_t Utf8Length(const std::string& s) {
  int64_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

// The first n characters (code points) of s.
std::string Utf8Prefix(const std::string& s, int64_t n) {
  size_t at = 0;
  for (int64_t k = 0; k < n && at < s.size(); ++k) {
    ++at;
    while (at < s.size() && (static_cast<unsigned char>(s[at]) & 0xC0) == 0x80) ++at;
  }
  return s.substr(0, at);
}

char Upper(char c) { return c >= 'a' && c <= 'z' ? c - 32 : c; }
char Lower(char c) { return c >= 'A' && c <= 'Z' ? c + 32 : c; }
bool IsAlpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

std::string Title(const std::string& s) {
  std::string r = s;
  bool prev_alpha = false;
  for (char& c : r) {
    c = prev_alpha ? Lower(c) : Upper(c);
    prev_alpha = IsAlpha(c) || IsDigit(c) || c == '\'';
  }
  return r;
}

std::string Capitalize(const std::string& s) {
  std::string r = s;
  for (size_t i = 0; i < r.size(); ++i) r[i] = i == 0 ? Upper(r[i]) : Lower(r[i]);
  return r;
}

bool IsGlobalFunction(const std::string& name) {
  return name == "raise_exception" || name == "range" || name == "namespace" || name == "dict" ||
         name == "strftime_now";
}

bool Int(const Value& v, int64_t* out) {
  if (v.is_int()) {
    *out = v.as_int();
    return true;
  }
  return false;
}

// How many values a printf-style format takes: one per conversion and one per '*'.
size_t FormatValueCount(const std::string& fmt) {
  size_t need = 0;
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
  return need;
}

}  // namespace

// ---- % formatting

// Python's printf-style formatting, fmt % values: a list (a tuple) gives the values in order,
// a mapping the values of %(key)s, anything else the one value. Unless `exact`, a list given
// to a format that takes one value, when the list does not hold exactly one, is that value.
bool Renderer::PercentFormat(size_t pos, const std::string& fmt, const Value& values, Value* out,
                             bool exact) {
  Array vals;
  const Value* mapping = nullptr;
  if (values.is_array()) {
    vals = values.array();
    const size_t need = FormatValueCount(fmt);
    if (!exact && need == 1 && vals.size() != 1) vals = Array{values};
  } else if (values.is_object()) {
    mapping = &values;
  } else {
    vals.push_back(values);
  }
  size_t next = 0;
  std::string r;
  const size_t n = fmt.size();
  for (size_t i = 0; i < n; ++i) {
    if (fmt[i] != '%') {
      r.push_back(fmt[i]);
      continue;
    }
    FormatSpec spec;
    JINJA_TRY(ParseFormatSpec(pos, fmt, vals, &next, &i, &spec));
    if (spec.conv == '%') {
      r.push_back('%');
      continue;
    }
    Value v;
    if (spec.keyed) {
      if (mapping == nullptr) return Fail(pos, "format requires a mapping");
      const Value* x = mapping->Find(spec.key);
      if (x == nullptr) return Fail(pos, "format key '" + spec.key + "' is missing");
      v = *x;
    } else {
      if (mapping != nullptr) return Fail(pos, "format requires a tuple, not a mapping");
      if (next >= vals.size()) return Fail(pos, "not enough arguments for format string");
      v = vals[next++];
    }
    if (spec.width > static_cast<int64_t>(lim_.max_output_bytes) ||
        spec.prec > static_cast<int64_t>(lim_.max_output_bytes)) {
      return CheckSize(pos, lim_.max_output_bytes + 1);
    }
    std::string body;  // the converted value without its sign
    std::string sign;  // "-", "+", " " or "" (and 0x / 0o prefixes)
    bool numeric = false;
    JINJA_TRY(FormatConversion(pos, spec, std::move(v), &body, &sign, &numeric));
    const size_t len = sign.size() + body.size();
    const size_t w = static_cast<size_t>(spec.width);
    if (len >= w) {
      r += sign;
      r += body;
    } else if (spec.left) {
      r += sign;
      r += body;
      r.append(w - len, ' ');
    } else if (spec.zero && numeric) {
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

// The conversion spec after the '%' at *at, which ends at its conversion character (*at is left
// there); a '*' width or precision takes the next of `vals` (*next counts the values taken).
bool Renderer::ParseFormatSpec(size_t pos, const std::string& fmt, const Array& vals, size_t* next,
                               size_t* at, FormatSpec* spec) {
  const size_t n = fmt.size();
  size_t i = *at;
  auto take_int = [&](int64_t* v) -> bool {
    if (*next >= vals.size()) return Fail(pos, "not enough arguments for format string");
    const Value& x = vals[(*next)++];
    if (!x.is_int()) return Fail(pos, "* wants an integer");
    *v = x.as_int();
    return true;
  };
  if (++i >= n) return Fail(pos, "incomplete format");
  if (fmt[i] == '(') {
    const size_t close = fmt.find(')', i);
    if (close == std::string::npos) return Fail(pos, "incomplete format key");
    spec->key = fmt.substr(i + 1, close - i - 1);
    spec->keyed = true;
    i = close + 1;
  }
  for (; i < n; ++i) {
    const char c = fmt[i];
    if (c == '-') {
      spec->left = true;
    } else if (c == '+') {
      spec->plus = true;
    } else if (c == ' ') {
      spec->space = true;
    } else if (c == '#') {
      spec->alt = true;
    } else if (c == '0') {
      spec->zero = true;
    } else {
      break;
    }
  }
  if (i < n && fmt[i] == '*') {
    JINJA_TRY(take_int(&spec->width));
    if (spec->width < 0) {
      spec->left = true;
      spec->width = -spec->width;
    }
    ++i;
  } else {
    for (; i < n && IsDigit(fmt[i]); ++i)
      spec->width = std::min<int64_t>(spec->width * 10 + (fmt[i] - '0'), 1LL << 40);
  }
  if (i < n && fmt[i] == '.') {
    ++i;
    spec->prec = 0;
    if (i < n && fmt[i] == '*') {
      JINJA_TRY(take_int(&spec->prec));
      spec->prec = std::max<int64_t>(spec->prec, 0);
      ++i;
    } else {
      for (; i < n && IsDigit(fmt[i]); ++i)
        spec->prec = std::min<int64_t>(spec->prec * 10 + (fmt[i] - '0'), 1LL << 40);
    }
  }
  while (i < n && (fmt[i] == 'h' || fmt[i] == 'l' || fmt[i] == 'L')) ++i;
  if (i >= n) return Fail(pos, "incomplete format");
  spec->conv = fmt[i];
  *at = i;
  return true;
}

// One value converted by spec.conv: the digits or text in *body, the sign (and 0x / 0o
// prefix) apart in *sign, *numeric when '0' padding applies.
bool Renderer::FormatConversion(size_t pos, const FormatSpec& spec, Value v, std::string* body,
                                std::string* sign, bool* numeric) {
  const char conv = spec.conv;
  if (v.is_bool() && conv != 's' && conv != 'r' && conv != 'a') {
    v = Value(static_cast<int64_t>(v.as_bool()));
  }
  switch (conv) {
    case 's':
    case 'r':
    case 'a':
      if (conv == 's') {
        PyStr(v, body);
      } else {
        PyRepr(v, body);
      }
      if (spec.prec >= 0) {  // at most prec characters (UTF-8 aware)
        size_t chars = 0, at = 0;
        while (at < body->size() && chars < static_cast<size_t>(spec.prec)) {
          ++at;
          while (at < body->size() && (static_cast<unsigned char>((*body)[at]) & 0xC0) == 0x80)
            ++at;
          ++chars;
        }
        body->resize(at);
      }
      return true;
    case 'd':
    case 'i':
    case 'u':
    case 'x':
    case 'X':
    case 'o':
      JINJA_TRY(FormatInteger(pos, spec, v, body, sign));
      *numeric = true;
      return true;
    case 'f':
    case 'F':
    case 'e':
    case 'E':
    case 'g':
    case 'G':
      JINJA_TRY(FormatFloat(pos, spec, v, body, sign));
      *numeric = true;
      return true;
    case 'c':
      if (v.is_int()) {
        if (v.as_int() < 0 || v.as_int() > 0x10FFFF) return Fail(pos, "%c arg not in range");
        AppendUtf8(static_cast<uint32_t>(v.as_int()), body);
      } else if (v.is_string()) {
        *body = v.str();
      } else {
        return Fail(pos, "%c requires an integer or a character");
      }
      return true;
    default:
      return Fail(pos, std::string("unsupported format character '") + conv + "'");
  }
}

// %d %i %u %x %X %o.
bool Renderer::FormatInteger(size_t pos, const FormatSpec& spec, const Value& v, std::string* body,
                             std::string* sign) {
  const char conv = spec.conv;
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
  const uint64_t mag = x < 0 ? 0 - static_cast<uint64_t>(x) : static_cast<uint64_t>(x);
  char buf[32];
  const int base = conv == 'o' ? 8 : (conv == 'x' || conv == 'X') ? 16 : 10;
  auto res = std::to_chars(buf, buf + sizeof(buf), mag, base);
  body->assign(buf, res.ptr);
  if (conv == 'X') {
    for (char& c : *body) c = Upper(c);
  }
  if (spec.prec > static_cast<int64_t>(body->size())) {
    body->insert(0, static_cast<size_t>(spec.prec) - body->size(), '0');
  }
  *sign = x < 0 ? "-" : spec.plus ? "+" : spec.space ? " " : "";
  if (spec.alt && base != 10) *sign += conv == 'o' ? "0o" : conv == 'x' ? "0x" : "0X";
  return true;
}

// %f %F %e %E %g %G, through the C library's printf.
bool Renderer::FormatFloat(size_t pos, const FormatSpec& spec, const Value& v, std::string* body,
                           std::string* sign) {
  const char conv = spec.conv;
  if (!v.is_number()) {
    return Fail(pos, std::string("%") + conv + " format: a number is required");
  }
  const double d = v.as_double();
  const std::string cfmt = std::string("%") + (spec.alt ? "#" : "") + ".*" + conv;
  const int p = static_cast<int>(std::min<int64_t>(spec.prec < 0 ? 6 : spec.prec, 400));
  char buf[512];
  const int len = std::snprintf(buf, sizeof(buf), cfmt.c_str(), p, std::fabs(d));
  if (len < 0 || len >= static_cast<int>(sizeof(buf))) {
    return Fail(pos, "a formatted number is too long");
  }
  body->assign(buf, static_cast<size_t>(len));
  *sign = std::signbit(d) && !std::isnan(d) ? "-" : spec.plus ? "+" : spec.space ? " " : "";
  return true;
}

// ---- global functions and methods

bool Renderer::CallGlobal(size_t pos, const std::string& name, const Args& args, Value* out) {
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

bool Renderer::CallMethod(size_t pos, const Value& obj, const std::string& name, const Args& args,
                          Value* out) {
  if (obj.is_string()) return CallStringMethod(pos, obj.str(), name, args, out);
  if (obj.is_object()) return CallDictMethod(pos, obj, name, args, out);
  return Fail(pos, "unknown method '" + name + "'");
}

// Python's str methods.
bool Renderer::CallStringMethod(size_t pos, const std::string& s, const std::string& name,
                                const Args& args, Value* out) {
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
  if (name == "find" || name == "count") return StrCountOrFind(pos, s, name, a0, out);
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
  if (name == "format") return StrFormat(pos, s, args, out);
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
  return Fail(pos, "unknown method '" + name + "'");
}

// Python's dict methods get, items, keys and values.
bool Renderer::CallDictMethod(size_t pos, const Value& obj, const std::string& name,
                              const Args& args, Value* out) {
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
  return Fail(pos, "unknown method '" + name + "'");
}

// str.find(sub) and str.count(sub).
bool Renderer::StrCountOrFind(size_t pos, const std::string& s, const std::string& name,
                              const Value* a0, Value* out) {
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

// str.format: {} / {0} / {name} fields, {{ and }}; no format specs.
bool Renderer::StrFormat(size_t pos, const std::string& s, const Args& args, Value* out) {
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
    if (close == std::string::npos) return Fail(pos, "single '{' encountered in format string");
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

bool Renderer::Replace(size_t pos, const std::string& s, const std::string& from,
                       const std::string& to, int64_t count, Value* out) {
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

bool Renderer::Split(size_t pos, const std::string& s, const Value* sep, int64_t maxsplit,
                     Value* out) {
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

// ---- filters

bool Renderer::Attribute(const Value& item, const std::string& path, Value* out) {
  *out = item;
  size_t at = 0;
  while (at <= path.size()) {
    size_t dot = path.find('.', at);
    if (dot == std::string::npos) dot = path.size();
    const std::string part = path.substr(at, dot - at);
    const Value* v = out->Find(part);
    if (v != nullptr) {
      *out = *v;
    } else if (out->is_array() && !part.empty() && std::all_of(part.begin(), part.end(), IsDigit) &&
               part.size() < 10) {
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

// The key sort, dictsort, unique, min and max compare: the item or its attribute, strings
// lowercased unless case_sensitive.
bool Renderer::SortKey(const Value& x, const Value* attr, const Value* case_sensitive, Value* key) {
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

bool Renderer::EvalFilter(const Expr& e, Value* out) {
  Value v;
  JINJA_TRY(Eval(*e.args[0], &v));
  Args args;
  JINJA_TRY(EvalArgs(e, 1, &args));
  return ApplyFilter(e.pos, e.name, v, args, out);
}

bool Renderer::ApplyFilter(size_t pos, const std::string& f, const Value& v, const Args& args,
                           Value* out) {
  if (f == "trim") return FilterTrim(v, args, out);
  if (f == "length" || f == "count") return FilterLength(pos, v, out);
  if (f == "tojson") return FilterToJson(pos, v, args, out);
  if (f == "upper" || f == "lower" || f == "title" || f == "capitalize") {
    Args none;
    return CallMethod(pos, Value(ToStr(v)), f, none, out);
  }
  if (f == "string") {
    *out = Value(ToStr(v));
    return true;
  }
  if (f == "safe" || f == "e" || f == "escape" || f == "forceescape") {
    return FilterEscape(f, v, out);
  }
  if (f == "join") return FilterJoin(pos, v, args, out);
  if (f == "default" || f == "d") return FilterDefault(v, args, out);
  if (f == "first" || f == "last") return FilterFirstLast(f, v, out);
  if (f == "replace") return FilterReplace(pos, v, args, out);
  if (f == "int") return FilterInt(v, args, out);
  if (f == "float") return FilterFloat(v, out);
  if (f == "abs") return FilterAbs(pos, v, out);
  if (f == "round") return FilterRound(pos, v, args, out);
  if (f == "list") return FilterList(pos, v, out);
  if (f == "items" || f == "dictitems") return FilterItems(pos, v, out);
  if (f == "reverse") return FilterReverse(pos, v, out);
  if (f == "unique") return FilterUnique(pos, v, args, out);
  if (f == "sort" || f == "dictsort") return FilterSort(pos, f, v, args, out);
  if (f == "selectattr" || f == "rejectattr" || f == "select" || f == "reject") {
    return FilterSelect(pos, f, v, args, out);
  }
  if (f == "map") return FilterMap(pos, v, args, out);
  if (f == "indent") return FilterIndent(pos, v, args, out);
  if (f == "attr") return FilterAttr(pos, v, args, out);
  if (f == "sum") return FilterSum(pos, v, out);
  if (f == "min" || f == "max") return FilterMinMax(pos, f, v, args, out);
  if (f == "batch" || f == "slice") return FilterBatchOrSlice(pos, f, v, args, out);
  if (f == "center") return FilterCenter(pos, v, args, out);
  if (f == "truncate") return FilterTruncate(pos, v, args, out);
  if (f == "format") return FilterFormat(pos, v, args, out);
  if (f == "wordcount") return FilterWordcount(pos, v, out);
  return Fail(pos, "unknown filter '" + f + "'");
}

// trim(chars=none).
bool Renderer::FilterTrim(const Value& v, const Args& args, Value* out) {
  if (!v.is_string()) {
    *out = Value(std::string(StripSet(ToStr(v), "", true, true)));
    return true;
  }
  const Value* chars = args.Get(0, "chars");
  *out = Value(std::string(
      StripSet(v.str(), chars != nullptr && chars->is_string() ? chars->str() : "", true, true)));
  return true;
}

// length / count: characters (code points), items or keys.
bool Renderer::FilterLength(size_t pos, const Value& v, Value* out) {
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

// tojson(indent=none).
bool Renderer::FilterToJson(size_t pos, const Value& v, const Args& args, Value* out) {
  const Value* indent = args.Get(0, "indent");
  int n = -1;
  if (indent != nullptr && indent->is_int())
    n = static_cast<int>(std::clamp<int64_t>(indent->as_int(), 0, 16));
  std::string s = ToJson(v, n);
  JINJA_TRY(CheckSize(pos, s.size()));
  *out = Value(std::move(s));
  return true;
}

// safe (the value as is), e / escape / forceescape (HTML escapes).
bool Renderer::FilterEscape(const std::string& f, const Value& v, Value* out) {
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

// join(d='', attribute=none).
bool Renderer::FilterJoin(size_t pos, const Value& v, const Args& args, Value* out) {
  const Value* sep = args.Get(0, "d");
  const Value* attr = args.Get(1, "attribute");
  Array items;
  JINJA_TRY(Iterable(pos, v, &items));
  const std::string d = sep != nullptr ? ToStr(*sep) : "";
  std::string r;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) r += d;
    Value item = items[i];
    if (attr != nullptr && attr->is_string()) JINJA_TRY(Attribute(items[i], attr->str(), &item));
    PyStr(item, &r);
    JINJA_TRY(CheckSize(pos, r.size()));
  }
  *out = Value(std::move(r));
  return true;
}

// default / d(default_value='', boolean=false).
bool Renderer::FilterDefault(const Value& v, const Args& args, Value* out) {
  const Value* dflt = args.Get(0, "default_value");
  const Value* boolean = args.Get(1, "boolean");
  const bool use = v.is_undefined() || (boolean != nullptr && boolean->Truthy() && !v.Truthy());
  *out = use ? (dflt != nullptr ? *dflt : Value(std::string())) : v;
  return true;
}

// first / last: of a list or a string.
bool Renderer::FilterFirstLast(const std::string& f, const Value& v, Value* out) {
  *out = Value();
  if (v.is_array() && !v.array().empty()) {
    *out = f == "first" ? v.array().front() : v.array().back();
  } else if (v.is_string() && !v.str().empty()) {
    *out = Value(std::string(1, f == "first" ? v.str().front() : v.str().back()));
  }
  return true;
}

// replace(old, new, count=none).
bool Renderer::FilterReplace(size_t pos, const Value& v, const Args& args, Value* out) {
  const Value* a0 = args.Get(0, "");
  const Value* to = args.Get(1, "new");
  const Value* count = args.Get(2, "count");
  if (a0 == nullptr || to == nullptr) return Fail(pos, "replace takes two arguments");
  return Replace(pos, ToStr(v), ToStr(*a0), ToStr(*to),
                 count != nullptr && count->is_int() ? count->as_int() : -1, out);
}

// int(default=0).
bool Renderer::FilterInt(const Value& v, const Args& args, Value* out) {
  const Value* dflt = args.Get(0, "default");
  Value fallback = dflt != nullptr ? *dflt : Value(int64_t{0});
  if (v.is_int()) {
    *out = v;
  } else if (v.is_bool()) {
    *out = Value(static_cast<int64_t>(v.as_bool()));
  } else if (v.is_float()) {
    const double d = v.as_double();
    *out = std::isfinite(d) && std::fabs(d) < 9.2e18 ? Value(static_cast<int64_t>(d)) : fallback;
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

// float: 0.0 when the value is no number.
bool Renderer::FilterFloat(const Value& v, Value* out) {
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

// abs.
bool Renderer::FilterAbs(size_t pos, const Value& v, Value* out) {
  if (v.is_int() && v.as_int() != std::numeric_limits<int64_t>::min()) {
    *out = Value(v.as_int() < 0 ? -v.as_int() : v.as_int());
  } else if (v.is_number()) {
    *out = Value(std::fabs(v.as_double()));
  } else {
    return Fail(pos, "abs of a non-number");
  }
  return true;
}

// round(precision=0, method='common').
bool Renderer::FilterRound(size_t pos, const Value& v, const Args& args, Value* out) {
  const Value* prec = args.Get(0, "precision");
  const Value* method = args.Get(1, "method");
  if (!v.is_number()) return Fail(pos, "round of a non-number");
  const int p = prec != nullptr && prec->is_int()
                    ? static_cast<int>(std::clamp<int64_t>(prec->as_int(), -20, 20))
                    : 0;
  const double m = std::pow(10.0, p);
  const std::string how = method != nullptr ? ToStr(*method) : "common";
  const double x = v.as_double() * m;
  const double r = how == "floor" ? std::floor(x) : how == "ceil" ? std::ceil(x) : std::round(x);
  *out = Value(r / m);
  return true;
}

// list.
bool Renderer::FilterList(size_t pos, const Value& v, Value* out) {
  Array items;
  JINJA_TRY(Iterable(pos, v, &items));
  *out = Value::MakeArray(std::move(items));
  return true;
}

// items / dictitems: the (key, value) pairs of a mapping.
bool Renderer::FilterItems(size_t pos, const Value& v, Value* out) {
  if (!v.is_object()) {
    *out = Value::MakeArray();
    return v.is_undefined() || v.is_none() ? true : Fail(pos, "items of a non-mapping");
  }
  return CallMethod(pos, v, "items", Args{}, out);
}

// reverse.
bool Renderer::FilterReverse(size_t pos, const Value& v, Value* out) {
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

// unique(case_sensitive=false, attribute=none).
bool Renderer::FilterUnique(size_t pos, const Value& v, const Args& args, Value* out) {
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
bool Renderer::FilterSort(size_t pos, const std::string& f, const Value& v, const Args& args,
                          Value* out) {
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

// select / reject(test, args...), selectattr / rejectattr(attribute, test, args...).
bool Renderer::FilterSelect(size_t pos, const std::string& f, const Value& v, const Args& args,
                            Value* out) {
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

// map(attribute=name, default=value) or map(filter, args...).
bool Renderer::FilterMap(size_t pos, const Value& v, const Args& args, Value* out) {
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
      if (args.pos.empty() || !args.pos[0].is_string()) return Fail(pos, "map takes a filter name");
      Args rest;
      rest.pos.assign(args.pos.begin() + 1, args.pos.end());
      JINJA_TRY(ApplyFilter(pos, args.pos[0].str(), item, rest, &x));
    }
    r.push_back(std::move(x));
  }
  *out = Value::MakeArray(std::move(r));
  return true;
}

// indent(width=4, first=false, blank=false).
bool Renderer::FilterIndent(size_t pos, const Value& v, const Args& args, Value* out) {
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

// attr(name).
bool Renderer::FilterAttr(size_t pos, const Value& v, const Args& args, Value* out) {
  const Value* a0 = args.Get(0, "");
  if (a0 == nullptr) return Fail(pos, "attr takes a name");
  const Value* x = v.Find(ToStr(*a0));
  *out = x != nullptr ? *x : Value();
  return true;
}

// sum: the items added with +.
bool Renderer::FilterSum(size_t pos, const Value& v, Value* out) {
  Array items;
  JINJA_TRY(Iterable(pos, v, &items));
  Value acc(int64_t{0});
  for (const Value& x : items) JINJA_TRY(Arith(pos, "+", acc, x, &acc));
  *out = acc;
  return true;
}

// min / max(case_sensitive=false, attribute=none).
bool Renderer::FilterMinMax(size_t pos, const std::string& f, const Value& v, const Args& args,
                            Value* out) {
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

// batch(linecount, fill_with=none), slice(slices, fill_with=none).
bool Renderer::FilterBatchOrSlice(size_t pos, const std::string& f, const Value& v,
                                  const Args& args, Value* out) {
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

// center(width=80), as Python's str.center.
bool Renderer::FilterCenter(size_t pos, const Value& v, const Args& args, Value* out) {
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

// truncate(length=255, killwords=false, end='...', leeway=5).
bool Renderer::FilterTruncate(size_t pos, const Value& v, const Args& args, Value* out) {
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

// format(values...): printf-style, as the % operator with exactly these values.
bool Renderer::FilterFormat(size_t pos, const Value& v, const Args& args, Value* out) {
  if (!args.pos.empty() && !args.kw.empty()) {
    return Fail(pos, "format takes positional or keyword arguments, not both");
  }
  const Value values = args.kw.empty() ? Value::MakeArray(args.pos) : Value::MakeObject(args.kw);
  return PercentFormat(pos, ToStr(v), values, out, /*exact=*/true);
}

// wordcount.
bool Renderer::FilterWordcount(size_t pos, const Value& v, Value* out) {
  Value parts;
  JINJA_TRY(Split(pos, ToStr(v), nullptr, -1, &parts));
  *out = Value(static_cast<int64_t>(parts.array().size()));
  return true;
}

// ---- tests

bool Renderer::EvalTest(const Expr& e, bool* r) {
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

}  // namespace lamina::chat::jinja::internal
