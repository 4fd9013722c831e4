// The Jinja engine: each feature, malformed templates and the limits, the built-in chat
// templates and the templates found in GGUF files rendered byte for byte.
#include "chat/jinja.h"

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <string>

#include "chat/chat_template.h"
#include "gguf/gguf.h"

namespace lamina::chat {
namespace {

using jinja::Array;
using jinja::Object;
using jinja::Template;
using jinja::Value;

const std::string kShared = LAMINA_SHARED_DIR;
const std::string kSource = LAMINA_SOURCE_DIR;
constexpr int64_t kJuly26th2024 = 1721952000;  // 2024-07-26 00:00:00 UTC

Result<std::string> TryRender(const std::string& src, const Value& ctx = Value::MakeObject(),
                              const jinja::Limits& limits = {}) {
  Result<Template> t = Template::Parse(src, limits);
  if (!t.ok()) return t.error();
  jinja::RenderOptions ro;
  ro.now_unix = kJuly26th2024;
  return t->Render(ctx, ro);
}

std::string R(const std::string& src, const Value& ctx = Value::MakeObject()) {
  Result<std::string> r = TryRender(src, ctx);
  EXPECT_TRUE(r.ok()) << src << "\n -> " << (r.ok() ? "" : r.error().message);
  return r.ok() ? *r : "<error>";
}

std::string Err(const std::string& src, const Value& ctx = Value::MakeObject(),
                const jinja::Limits& limits = {}) {
  Result<std::string> r = TryRender(src, ctx, limits);
  EXPECT_FALSE(r.ok()) << src << " rendered " << (r.ok() ? *r : "");
  return r.ok() ? "" : r.error().message;
}

TEST(Jinja, TextCommentsAndWhitespaceControl) {
  EXPECT_EQ(R("Hello {{ name }}!", Value::MakeObject({{"name", "World"}})), "Hello World!");
  EXPECT_EQ(R("a {#- note -#} b"), "ab");
  EXPECT_EQ(R("a {# note #} b"), "a  b");
  EXPECT_EQ(R("x  {%- if true -%}  \n y {%- endif %}"), "xy");
  EXPECT_EQ(R("{{- ' a ' -}}  "), " a ");
  // trim_blocks and lstrip_blocks, as Hugging Face renders chat templates.
  EXPECT_EQ(R("{% if true %}\nx\n{% endif %}\ny"), "x\ny");
  EXPECT_EQ(R("  {% if true %}x{% endif %}"), "x");
  EXPECT_EQ(R("  {%+ if true %}x{% endif +%}\n"), "  x\n");
  EXPECT_EQ(R("a  {{ 1 }}\n"), "a  1\n");  // expressions are not stripped
}

TEST(Jinja, LiteralsAndArithmetic) {
  EXPECT_EQ(R("{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 2 ** 10 }} {{ -3 }}"), "7 9 1024 -3");
  EXPECT_EQ(R("{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 4 / 2 }}"),
            "3 -4 1 2 3.5 2.0");
  EXPECT_EQ(R("{{ 1.0 }} {{ 0.1 + 0.2 }} {{ 1e3 }} {{ 2.5 * 2 }}"),
            "1.0 0.30000000000000004 1000.0 5.0");
  EXPECT_EQ(R("{{ 'a' ~ 1 ~ none ~ true ~ false }}"), "a1NoneTrueFalse");
  EXPECT_EQ(R("{{ 'a' + 'b' }}{{ \"q\" 'r' }}{{ 'x' * 3 }}{{ [1] + [2] }}"), "abqrxxx[1, 2]");
  EXPECT_EQ(R("{{ [1, 'a', none, true, [2]] }} {{ {'k': 'v', 'n': 1} }} {{ (1, 2) }}"),
            "[1, 'a', None, True, [2]] {'k': 'v', 'n': 1} [1, 2]");
  EXPECT_EQ(R("{{ 'it\\'s' }} {{ \"a\\nb\" }} {{ '\\u00e9' }}"), "it's a\nb \xc3\xa9");
  EXPECT_EQ(R("{{ none }}|{{ undefined_name }}|{{ True }}"), "None||True");
  EXPECT_NE(Err("{{ 'a' + 1 }}").find("unsupported operand"), std::string::npos);
  EXPECT_NE(Err("{{ 1 // 0 }}").find("division by zero"), std::string::npos);
  EXPECT_NE(Err("{{ 9223372036854775807 + 1 }}").find("overflow"), std::string::npos);
}

TEST(Jinja, ComparisonsLogicAndMembership) {
  EXPECT_EQ(R("{{ 1 < 2 and 'b' > 'a' }} {{ not 1 == 1 }} {{ 1 == 1.0 }} {{ [1, 2] == [1, 2] }}"),
            "True False True True");
  EXPECT_EQ(R("{{ 'ell' in 'hello' }} {{ 3 not in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 2 in [1] }}"),
            "True True True False");
  EXPECT_EQ(R("{{ 0 or 'x' }} {{ 1 and 'y' }} {{ none or [] }} {{ 2 >= 2 != false }}"),
            "x y [] True");
  EXPECT_EQ(R("{{ 'a' if true else 'b' }}{{ 'c' if false }}{{ 'd' if 0 else 'e' if 1 else 'f' }}"),
            "ae");
}

TEST(Jinja, Tests) {
  const Value ctx = Value::MakeObject({{"x", 1}, {"n", Value::None()}});
  EXPECT_EQ(R("{{ x is defined }} {{ y is undefined }} {{ y is defined }} {{ n is none }} "
              "{{ x is not none }}",
              ctx),
            "True True False True True");
  EXPECT_EQ(R("{{ 's' is string }} {{ 1 is string }} {{ {} is mapping }} {{ [] is iterable }} "
              "{{ 1.5 is number }} {{ true is boolean }} {{ 3 is odd }} {{ 4 is even }} "
              "{{ 9 is divisibleby(3) }} {{ 'a' is in 'abc' }} {{ 1 is eq 1 }}"),
            "True False True True True True True True True True True");
  EXPECT_EQ(R("{{ not x is defined }}", ctx), "False");
  EXPECT_EQ(
      R("{{ strftime_now is defined }}{{ raise_exception is undefined }}{{ range is callable }}"
        "{% set range = 1 %}{{ range is callable }}"),
      "TrueFalseTrueFalse");
}

TEST(Jinja, AttributesItemsAndSlices) {
  const Value m = Value::MakeObject({{"role", "user"},
                                     {"list", Value::MakeArray({1, 2, 3, 4})},
                                     {"nested", Value::MakeObject({{"k", "v"}})}});
  const Value ctx = Value::MakeObject({{"m", m}});
  EXPECT_EQ(R("{{ m.role }}{{ m['role'] }}{{ m.list[-1] }}{{ m.list.0 }}{{ m.nested.k }}", ctx),
            "useruser41v");
  EXPECT_EQ(R("{{ m.list[1:3] }}{{ m.list[::-1] }}{{ m.list[-2:] }}{{ m.list[:1] }}", ctx),
            "[2, 3][4, 3, 2, 1][3, 4][1]");
  EXPECT_EQ(R("{{ 'hello'[1:4] }}{{ 'hello'[-1] }}{{ 'hello'[::2] }}"), "ellohlo");
  EXPECT_EQ(
      R("{{ m.missing is defined }}{{ m.missing.deeper is defined }}{{ m.list[10] is defined }}",
        ctx),
      "FalseFalseFalse");
}

TEST(Jinja, Filters) {
  EXPECT_EQ(
      R("{{ '  a  '|trim }}|{{ [1, 2]|length }}|{{ 'h\xc3\xa9llo'|length }}|{{ 'ab'|upper }}|"
        "{{ 'AB'|lower }}|{{ [1, 2, 3]|join(', ') }}|{{ x|default('d') }}|{{ ''|default('e', true) "
        "}}|"
        "{{ [1, 2, 3]|first }}{{ [1, 2, 3]|last }}|{{ 'aXbX'|replace('X', '-') }}|"
        "{{ 12|string ~ '' }}|{{ '42'|int + 1 }}|{{ 'x'|int }}|{{ 'ab'|list }}|"
        "{{ {'a': 1}|items|list }}|{{ 'hello WORLD'|capitalize }}|{{ 'hello world'|title }}"),
      "a|2|5|AB|ab|1, 2, 3|d|e|13|a-b-|12|43|0|['a', 'b']|[['a', 1]]|Hello world|Hello World");
  EXPECT_EQ(R("{{ 'a' | upper | replace('A', 'b') ~ 'c' }}"), "bc");
  EXPECT_EQ(
      R("{{ [3, 1, 2]|sort }}{{ [1, 2]|reverse|list }}{{ [1, 1, 2]|unique|list }}{{ [1, 2]|sum }}"),
      "[1, 2, 3][2, 1][1, 2]3");
  const Value msgs = Value::MakeObject(
      {{"ms", Value::MakeArray({Value::MakeObject({{"role", "system"}, {"content", "s"}}),
                                Value::MakeObject({{"role", "user"}, {"content", "u"}})})}});
  EXPECT_EQ(
      R("{{ ms|selectattr('role', 'equalto', 'user')|map(attribute='content')|join }}"
        "{{ ms|rejectattr('role', 'eq', 'user')|list|length }}{{ ms|map(attribute='role')|list }}",
        msgs),
      "u1['system', 'user']");
  EXPECT_EQ(R("{{ 'a\nb'|indent(2) }}|{{ 'a\nb'|indent(2, true) }}"), "a\n  b|  a\n  b");
}

TEST(Jinja, ToJson) {
  EXPECT_EQ(R("{{ {'a': [1, 2.5, 'x\"y\\n', none, true], 'b': {}}|tojson }}"),
            "{\"a\": [1, 2.5, \"x\\\"y\\n\", null, true], \"b\": {}}");
  EXPECT_EQ(R("{{ {'a': [1, 2], 'b': {}, 'c': []}|tojson(indent=2) }}"),
            "{\n  \"a\": [\n    1,\n    2\n  ],\n  \"b\": {},\n  \"c\": []\n}");
  EXPECT_EQ(R("{{ '\xc3\xa9\\t'|tojson }}"), "\"\xc3\xa9\\t\"");  // ensure_ascii=False
  EXPECT_EQ(jinja::ToJson(Value::MakeObject({{"k", Value::MakeArray({1.0, "\x01"})}})),
            "{\"k\": [1.0, \"\\u0001\"]}");
}

TEST(Jinja, ForLoops) {
  EXPECT_EQ(R("{% for x in [1, 2, 3] %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}"
              "{{ loop.last }}{{ loop.length }}{{ loop.revindex }};{% endfor %}"),
            "10TrueFalse33;21FalseFalse32;32FalseTrue31;");
  EXPECT_EQ(R("{% for x in [] %}a{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(R("{% for x in [1, 2, 3, 4] if x is even %}{{ x }}{{ loop.length }}{% endfor %}"),
            "2242");
  EXPECT_EQ(R("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %}"),
            "a=1;b=2;");
  EXPECT_EQ(R("{% for k in {'a': 1, 'b': 2} %}{{ k }}{% endfor %}{% for c in 'xy' %}{{ c }}.{% "
              "endfor %}"),
            "abx.y.");
  EXPECT_EQ(R("{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}"
              "{% if x == 4 %}{% break %}{% endif %}{{ x }}{% endfor %}"),
            "013");
  EXPECT_EQ(R("{% for i in range(2) %}{% for j in range(1, 3) %}{{ loop.index }}{% endfor %}"
              "{{ loop.index }}{% endfor %}"),
            "121122");
  EXPECT_EQ(R("{% for x in [1, 2] %}{{ loop.previtem is defined }}{{ loop.nextitem }}{% endfor %}"),
            "False2True");
}

TEST(Jinja, IfElifElse) {
  EXPECT_EQ(R("{% for x in [1, 2, 3] %}{% if x == 1 %}a{% elif x == 2 %}b{% else %}c{% endif %}"
              "{% endfor %}"),
            "abc");
}

TEST(Jinja, SetNamespacesAndScopes) {
  EXPECT_EQ(R("{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{{ x }}{% endfor %}{{ x }}"), "21");
  EXPECT_EQ(R("{% if true %}{% set y = 3 %}{% endif %}{{ y }}"), "3");
  EXPECT_EQ(
      R("{% set ns = namespace(n=0, s='') %}{% for i in [1, 2, 3] %}"
        "{% set ns.n = ns.n + i %}{% set ns.s = ns.s ~ i %}{% endfor %}{{ ns.n }} {{ ns.s }}"),
      "6 123");
  EXPECT_EQ(R("{% set b %}hi {{ 1 }}{% endset %}[{{ b }}]"), "[hi 1]");
  EXPECT_EQ(R("{% set messages = [1, 2, 3] %}{{ messages[1:]|length }}"), "2");
  EXPECT_NE(Err("{% set x = 1 %}{% set x.a = 2 %}").find("not a namespace"), std::string::npos);
}

TEST(Jinja, Macros) {
  EXPECT_EQ(R("{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}"
              "{{ greet('A') }} {{ greet('B', punct='?') }} {{ greet(name='C') }}"),
            "Hi A! Hi B? Hi C!");
  // A recursive macro with a base case; macros see the template's variables, not the caller's.
  EXPECT_EQ(R("{% set top = 'T' %}{% macro count(n) %}{{ n }}{% if n > 0 %}{{ count(n - 1) }}"
              "{% endif %}{{ top }}{{ local is defined }}{% endmacro %}"
              "{% for local in [1] %}{{ count(2) }}{% endfor %}"),
            "210TFalseTFalseTFalse");
  EXPECT_EQ(R("{% macro render(v) %}{% if v is mapping %}{% for k, x in v.items() %}{{ k }}:"
              "{{ render(x) }};{% endfor %}{% else %}{{ v }}{% endif %}{% endmacro %}"
              "{{ render({'a': {'b': 1}, 'c': 2}) }}"),
            "a:b:1;;c:2;");
}

TEST(Jinja, StringAndDictMethods) {
  EXPECT_EQ(R("{{ '  x  '.strip() }}|{{ 'xxaxx'.lstrip('x') }}|{{ 'xxaxx'.rstrip('x') }}|"
              "{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'a b c'.split(' ', 1) }}|"
              "{{ 'abc'.startswith('ab') }}|{{ 'abc'.endswith(('x', 'c')) }}|{{ 'Ab'.upper() }}"
              "{{ 'Ab'.lower() }}|{{ 'aaa'.replace('a', 'b', 2) }}|{{ 'a b'.title() }}|"
              "{{ ', '.join(['x', 'y']) }}"),
            "x|axx|xxa|['a', 'b', '', 'c']|['a', 'b']|['a', 'b c']|True|True|ABab|bba|A B|x, y");
  EXPECT_EQ(R("{{ 'a<think>r</think>\\n\\nanswer'.split('</think>')[-1].lstrip('\\n') }}"),
            "answer");
  EXPECT_EQ(R("{% set d = {'a': 1} %}{{ d.get('a') }}{{ d.get('z', 'no') }}{{ d.get('z') }}"
              "{{ d.keys()|list }}{{ d.values()|list }}{{ d.items()|list }}"),
            "1noNone['a'][1][['a', 1]]");
  EXPECT_NE(Err("{{ 'a'.nosuch() }}").find("unknown method 'nosuch'"), std::string::npos);
}

TEST(Jinja, RaiseExceptionAndStrftime) {
  const std::string e =
      Err("ok\n{% if true %}{{ raise_exception('Roles must alternate') }}{% endif %}");
  EXPECT_NE(e.find("Roles must alternate"), std::string::npos) << e;
  EXPECT_NE(e.find("line 2, column"), std::string::npos) << e;
  EXPECT_EQ(R("{{ strftime_now('%d %b %Y') }}|{{ strftime_now('%Y-%m-%d') }}"),
            "26 Jul 2024|2024-07-26");
  // Without a fixed time: today's date, in the format asked for.
  Result<Template> t = Template::Parse("{{ strftime_now('%Y') }}");
  ASSERT_TRUE(t.ok());
  Result<std::string> year = t->Render(Value::MakeObject());
  ASSERT_TRUE(year.ok());
  EXPECT_EQ(year->size(), 4u);
}

TEST(Jinja, MalformedTemplatesNameLineAndColumn) {
  struct Case {
    const char* src;
    const char* want;
  };
  const Case cases[] = {
      {"{% if x %}abc", "line 1, column 4: unclosed 'if' block"},
      {"a\n{% for m in messages %}\n{{ m }}", "line 2, column 4: unclosed 'for' block"},
      {"hello\n{{ 1 + }}", "line 2, column 8: expected an expression"},
      {"{{ 'abc }}", "line 1, column 4: unterminated string literal"},
      {"{{ x", "line 1, column 1: unclosed '{{' tag"},
      {"{# never closed", "line 1, column 1: unclosed comment"},
      {"{% for x in %}{% endfor %}", "line 1, column 13: expected an expression"},
      {"{% endfor %}", "line 1, column 4: unknown statement 'endfor'"},
      {"{% foo %}", "unknown statement 'foo'"},
      {"{{ a b }}", "line 1, column 6: expected '}}'"},
      {"{{ [1, 2 }}", "line 1, column 1: unclosed '{{' tag"},
      {"{{ (1, 2", "line 1, column 1: unclosed '{{' tag (a bracket inside it is not closed)"},
      {"{{ f(1, 2 ] }}", "line 1, column 11: expected ')'"},
      {"{% if true %}{% else %}{% elif %}{% endif %}", "unknown statement 'elif'"},
      {"{{ x | }}", "expected a name"},
      {"{{ 1 $ 2 }}", "line 1, column 6: unexpected character '$'"},
      {"{% set %}", "expected a name"},
  };
  for (const Case& c : cases) {
    Result<Template> t = Template::Parse(c.src);
    ASSERT_FALSE(t.ok()) << c.src;
    EXPECT_NE(t.error().message.find(c.want), std::string::npos)
        << c.src << "\n got: " << t.error().message << "\n want: " << c.want;
  }
}

double Seconds(const std::chrono::steady_clock::time_point& t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

TEST(Jinja, LimitsStopRunawayTemplatesQuickly) {
  auto t0 = std::chrono::steady_clock::now();
  std::string e = Err("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
  EXPECT_NE(e.find("macro calls nest deeper than the limit of 50"), std::string::npos) << e;
  e = Err("{% for i in range(100000000) %}x{% endfor %}");
  EXPECT_NE(e.find("loop limit"), std::string::npos) << e;
  e = Err("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}");
  EXPECT_NE(e.find("the loop limit of 100000 iterations is exceeded"), std::string::npos) << e;
  e =
      Err("{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}"
          "{% endfor %}");
  EXPECT_NE(e.find("output limit"), std::string::npos) << e;
  e = Err("{% for i in range(100000) %}{{ 'y' * 1000 }}{% endfor %}");
  EXPECT_NE(e.find("the output is over the limit"), std::string::npos) << e;
  e = Err("{{ 'x' * 9223372036854775807 }}");
  EXPECT_NE(e.find("output limit"), std::string::npos) << e;
  e = Err("{% set ns = namespace() %}{% set ns.me = ns %}");
  EXPECT_NE(e.find("cannot hold itself"), std::string::npos) << e;
  e = Err(
      "{% set ns = namespace(v=1) %}{% for i in range(1000) %}{% set ns.v = [ns.v] %}{% endfor %}");
  EXPECT_NE(e.find("values nest deeper"), std::string::npos) << e;
  EXPECT_LT(Seconds(t0), 5.0);

  // Parse-time caps: size and nesting.
  jinja::Limits small;
  small.max_template_bytes = 100;
  Result<Template> big = Template::Parse(std::string(101, 'a'), small);
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.error().message.find("size limit of 100"), std::string::npos);
  const std::string deep = "{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}";
  Result<Template> nested = Template::Parse(deep);
  ASSERT_FALSE(nested.ok());
  EXPECT_NE(nested.error().message.find("nesting deeper than the limit"), std::string::npos);
  // Long chains of operators, postfixes and filters: a parse error, not a deep tree.
  for (const std::string link : {"+1", " and 1", " is odd", ".b", "[0]", "|trim", "()"}) {
    std::string chain = "{{ a";
    for (int i = 0; i < 100000; ++i) chain += link;
    Result<Template> t = Template::Parse(chain + " }}");
    ASSERT_FALSE(t.ok()) << link;
    EXPECT_NE(t.error().message.find("chains more operations than the limit of 400"),
              std::string::npos)
        << t.error().message;
  }
  std::string sum = "{{ 1";
  for (int i = 0; i < 300; ++i) sum += " + 1";
  EXPECT_EQ(R(sum + " }}"), "301");
  std::string blocks;
  for (int i = 0; i < 5000; ++i) blocks += "{% if true %}";
  Result<Template> deep_blocks = Template::Parse(blocks);
  ASSERT_FALSE(deep_blocks.ok());
  EXPECT_NE(deep_blocks.error().message.find("nesting deeper"), std::string::npos);
}

std::string Times(std::string_view s, size_t n) {
  std::string out;
  for (size_t i = 0; i < n; ++i) out += s;
  return out;
}

// 100,000-deep nestings of every kind the parser and renderer recurse on end in an error
// naming line and column (or render, just under the limits), never in a stack overflow.
TEST(Jinja, DeepNestingIsAnErrorNotACrash) {
  constexpr size_t kDeep = 100000;
  const std::vector<std::pair<std::string, std::string>> parse_cases = {
      {"{{ " + Times("(", kDeep) + "1" + Times(")", kDeep) + " }}", "nesting deeper"},
      {"{{ " + Times("[", kDeep) + Times("]", kDeep) + " }}", "nesting deeper"},
      {"{{ " + Times("{'a': ", kDeep) + "1" + Times("}", kDeep) + " }}", "nesting deeper"},
      {"{{ " + Times("not ", kDeep) + "1 }}", "nesting deeper"},
      {"{{ " + Times("-", kDeep) + "1 }}", "nesting deeper"},
      {"{{ " + Times("1 if x else ", kDeep) + "1 }}", "nesting deeper"},
      {"{{ " + Times("f(", kDeep) + Times(")", kDeep) + " }}", "nesting deeper"},
      {"{{ x" + Times("[x", kDeep) + Times("]", kDeep) + " }}", "nesting deeper"},
      {"{{ " + Times("1 + ", kDeep) + "1 }}", "chains more operations"},
      {"{{ " + Times("1 ~ ", kDeep) + "1 }}", "chains more operations"},
      {"{{ 1 " + Times("< 1 ", kDeep) + "}}", "chains more operations"},
      {"{{ x" + Times("|f", kDeep) + " }}", "chains more operations"},
      {Times("{% if x %}", kDeep), "nesting deeper"},
      {Times("{% for x in y %}", kDeep), "nesting deeper"},
      {Times("{% macro m() %}", kDeep), "nesting deeper"},
      {Times("{% with a = 1 %}", kDeep), "nesting deeper"},
      {Times("{% filter upper %}", kDeep), "nesting deeper"},
      {Times("{% call m() %}", kDeep), "nesting deeper"},
      {"{% filter " + Times("upper|", kDeep) + "upper %}{% endfilter %}", "nesting deeper"},
  };
  jinja::Limits roomy;  // past the size cap too, so nesting is what stops each
  roomy.max_template_bytes = 4 << 20;
  for (const auto& [src, want] : parse_cases) {
    Result<Template> t = Template::Parse(src, roomy);
    ASSERT_FALSE(t.ok()) << src.substr(0, 40);
    EXPECT_EQ(t.error().message.rfind("line 1, column ", 0), 0u) << t.error().message;
    EXPECT_NE(t.error().message.find(want), std::string::npos)
        << src.substr(0, 40) << ": " << t.error().message;
  }
  // Just under the parse limits (a bracket costs two levels: an expression and an operand).
  EXPECT_EQ(R("{{ " + Times("(", 48) + "1" + Times(")", 48) + " }}"), "1");
  EXPECT_EQ(R("{{ " + Times("[", 48) + Times("]", 48) + " | length }}"), "1");
  EXPECT_EQ(R(Times("{% if true %}", 90) + "y" + Times("{% endif %}", 90)), "y");

  // Data 100,000 deep in the variables (as messages' content could be): refused before any
  // walk over it; the value itself is built and freed without recursion.
  Value deep = Value::MakeArray();
  for (size_t i = 0; i < kDeep; ++i) deep = Value::MakeArray({deep});
  for (const char* src : {"{{ x | tojson }}", "{{ x }}", "{{ x == x }}", "{{ 1 in x }}",
                          "{{ x | length }}", "{{ x | string }}", "hi"}) {
    const std::string e = Err(src, Value::MakeObject({{"x", deep}}));
    EXPECT_EQ(e, "line 1, column 1: the template's variables nest deeper than the limit of 128")
        << src;
  }
  Value messages = Value::MakeArray();
  Value content = Value("x");
  for (size_t i = 0; i < kDeep; ++i) content = Value::MakeObject({{"text", content}});
  messages.Push(Value::MakeObject({{"role", "user"}, {"content", content}}));
  EXPECT_NE(Err("{% for m in messages %}{{ m.content | tojson }}{% endfor %}",
                Value::MakeObject({{"messages", messages}}))
                .find("nest deeper than the limit of 128"),
            std::string::npos);
  // Just under: the object itself (level 1), then 126 arrays.
  Value ok = Value::MakeArray();
  for (int i = 0; i < 125; ++i) ok = Value::MakeArray({ok});
  EXPECT_EQ(R("{{ x | tojson | length }}", Value::MakeObject({{"x", ok}})), "252");

  // Depth grown during a render: through set, macro arguments, loop() and with.
  std::string e =
      Err("{% macro f(x, n) %}{% if n > 0 %}{{ f([[[[[[[[[[x]]]]]]]]]], n - 1) }}{% else %}"
          "{{ x | tojson }}{% endif %}{% endmacro %}{{ f(1, 49) }}");
  EXPECT_NE(e.find("values nest deeper than the limit of 128"), std::string::npos) << e;
  EXPECT_EQ(R("{% macro f(x, n) %}{% if n > 0 %}{{ f([[[[[[[[[[x]]]]]]]]]], n - 1) }}{% else %}"
              "{{ x | tojson | length }}{% endif %}{% endmacro %}{{ f(1, 12) }}"),
            "241");
  e =
      Err("{% for x in [[1]] recursive %}{% if loop.depth < 49 %}{{ loop([[[[[[[[[[x]]]]]]]]]]) }}"
          "{% endif %}{% endfor %}");
  EXPECT_NE(e.find("values nest deeper than the limit of 128"), std::string::npos) << e;
  e = Err("{% set x = 1 %}" + Times("{% with x = [[[[[[[[[[x]]]]]]]]]] %}", 20) + "{{ x }}" +
          Times("{% endwith %}", 20));
  EXPECT_NE(e.find("values nest deeper than the limit of 128"), std::string::npos) << e;
  // Recursive macros stop at the call limit.
  e = Err("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}");
  EXPECT_NE(e.find("macro calls nest deeper than the limit of 50"), std::string::npos) << e;
}

// Every prefix and many single-byte corruptions of a real template parse or fail cleanly, and
// render or fail cleanly.
TEST(Jinja, TruncatedAndCorruptedTemplatesFailCleanly) {
  const std::string src(BuiltinJinjaTemplate("deepseek3"));
  const Value ctx = Value::MakeObject(
      {{"messages", Value::MakeArray({Value::MakeObject({{"role", "user"}, {"content", "hi"}})})},
       {"add_generation_prompt", true}});
  const std::string junk = "{}%#-+()[]'\"|.,:~ \n0aZ";
  size_t ok = 0;
  for (size_t n = 0; n <= src.size(); ++n) {
    Result<std::string> r = TryRender(src.substr(0, n), ctx);
    ok += r.ok();
    std::string bad = src;
    bad[n % src.size()] = junk[n % junk.size()];
    ok += TryRender(bad, ctx).ok();
  }
  EXPECT_GT(ok, 0u);
}

bool Has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

TEST(Jinja, FilterBlocks) {
  EXPECT_EQ(R("{% filter upper %}hi {{ 'there' }}{% endfilter %}!"), "HI THERE!");
  EXPECT_EQ(R("{% filter trim | replace('a', 'b') %}  aa  {% endfilter %}|"), "bb|");
  EXPECT_EQ(R("{% filter indent(2, true) %}x\ny{% endfilter %}"), "  x\n  y");
  EXPECT_EQ(R("{% for i in [1, 2] %}{% filter upper %}{% filter trim %} a{{ i }} {% endfilter %}"
              "b{% endfilter %}{% endfor %}"),
            "A1BA2B");
  // trim_blocks / lstrip_blocks apply to its tags like any block tag.
  EXPECT_EQ(R("  {% filter upper %}\nx\n  {% endfilter %}\ny"), "X\ny");
  EXPECT_TRUE(Has(Err("{% filter nosuch %}x{% endfilter %}"),
                  "line 1, column 11: unknown filter 'nosuch'"));
  EXPECT_TRUE(Has(Err("{% filter %}x{% endfilter %}"), "expected a name"));
  EXPECT_TRUE(Has(Err("{% filter upper %}x"), "line 1, column 4: unclosed 'filter' block"));
}

TEST(Jinja, CallBlocks) {
  EXPECT_EQ(R("{% macro box(title) %}[{{ title }}: {{ caller() }}]{% endmacro %}"
              "{% call box('T') %}body {{ 1 + 1 }}{% endcall %}"),
            "[T: body 2]");
  // caller() with arguments; the body sees the call block's variables, not the macro's.
  EXPECT_EQ(R("{% macro each(xs) %}{% set p = 'macro' %}{% for x in xs %}{{ caller(x) }}"
              "{% endfor %}{% endmacro %}{% set p = '-' %}"
              "{% call(item, sep='.') each([1, 2]) %}{{ p }}{{ item }}{{ sep }}{% endcall %}"),
            "-1.-2.");
  EXPECT_EQ(R("{% macro twice() %}{{ caller() }}{{ caller() }}{% endmacro %}"
              "{% for i in [1, 2] %}{% call twice() %}{{ i }}{% endcall %}{% endfor %}"),
            "1122");
  // Nested call blocks, and a macro reached through a namespace.
  EXPECT_EQ(R("{% macro wrap(t) %}<{{ t }}>{{ caller() }}</{{ t }}>{% endmacro %}"
              "{% set ns = namespace(w=wrap) %}"
              "{% call ns.w('a') %}{% call wrap('b') %}x{% endcall %}{% endcall %}"),
            "<a><b>x</b></a>");
  EXPECT_TRUE(Has(Err("{% macro m() %}{{ caller() }}{% endmacro %}{{ m() }}"), "'caller'"));
  EXPECT_TRUE(Has(Err("{% set x = 1 %}{% call x() %}{% endcall %}"), "'call' needs a macro"));
  EXPECT_TRUE(Has(TryRender("{% call 1 + 2 %}{% endcall %}").error().message,
                  "line 1, column 9: expected a macro call after 'call'"));
  // Runaway call / caller nesting stops at the macro depth limit with the position.
  auto t0 = std::chrono::steady_clock::now();
  std::string e = Err("{% macro r() %}{% call r() %}x{% endcall %}{% endmacro %}{{ r() }}");
  EXPECT_TRUE(Has(e, "nest deeper than the limit of 50")) << e;
  EXPECT_TRUE(Has(e, "line 1, column")) << e;
  e =
      Err("{% macro m() %}{{ caller() }}{% endmacro %}\n"
          "{% macro r() %}{% call m() %}{{ r() }}{% endcall %}{% endmacro %}{{ r() }}");
  EXPECT_TRUE(
      Has(e, "line 1, column 25: caller() and macro calls nest deeper than the limit of 50"))
      << e;
  jinja::Limits small;
  small.max_call_depth = 3;
  e =
      Err("{% macro m() %}{{ caller() }}{% endmacro %}"
          "{% call m() %}{% call m() %}{% call m() %}x{% endcall %}{% endcall %}{% endcall %}",
          Value::MakeObject(), small);
  EXPECT_TRUE(Has(e, "calls nest deeper than the limit of 3")) << e;
  EXPECT_LT(Seconds(t0), 5.0);
}

TEST(Jinja, LoopHelpers) {
  EXPECT_EQ(R("{% for x in range(5) %}{{ loop.cycle('a', 'b', 'c') }}{% endfor %}"), "abcab");
  EXPECT_EQ(R("{% for x in [1, 2] %}{{ loop.depth }}{{ loop.depth0 }}"
              "{% for y in [1] %}{{ loop.depth }}{% endfor %}{% endfor %}"),
            "101101");
  EXPECT_EQ(R("{% for x in [1, 1, 2, 2, 3, 1] %}{% if loop.changed(x) %}{{ x }}{% endif %}"
              "{% endfor %}"),
            "1231");
  EXPECT_EQ(R("{% for x in ['a', 'b', 'c'] %}{{ loop.previtem or '^' }}{{ x }}"
              "{{ loop.nextitem or '$' }}{{ loop.length }} {% endfor %}"),
            "^ab3 abc3 bc$3 ");
  // The outer loop's helpers through a variable.
  EXPECT_EQ(R("{% for x in [1, 2] %}{% set outer = loop %}{% for y in [1, 2] %}"
              "{{ outer.cycle('o', 'e') }}{% endfor %}{% endfor %}"),
            "ooee");
  // Replacing `loop` in the body does not free the loop's object under its helpers.
  EXPECT_EQ(R("{% for x in [1, 2] %}{% set outer = loop %}{% set loop = {} %}"
              "{{ outer.cycle('a', 'b') }}{{ loop.index }}{% endfor %}"),
            "ab");
  EXPECT_TRUE(Has(Err("{% for x in [1] %}{{ loop.cycle() }}{% endfor %}"),
                  "loop.cycle() takes at least one value"));
}

TEST(Jinja, RecursiveLoops) {
  auto node = [](const char* name, Array children) {
    return Value::MakeObject({{"name", name}, {"children", Value::MakeArray(std::move(children))}});
  };
  const Value tree = Value::MakeObject(
      {{"items", Value::MakeArray(
                     {node("a", {node("b", {}), node("c", {node("d", {})})}), node("e", {})})}});
  EXPECT_EQ(R("{% for x in items recursive %}{{ x.name }}{{ loop.depth }}"
              "{% if x.children %}({{ loop(x.children) }}){% endif %}{% endfor %}",
              tree),
            "a1(b2c2(d3))e1");
  EXPECT_EQ(R("{% for x in items recursive %}{{ '  ' * loop.depth0 }}- {{ x.name }}"
              "{{ loop.index }}/{{ loop.length }};{% if x.children %}{{ loop(x.children) }}"
              "{% endif %}{% endfor %}",
              tree),
            "- a1/2;  - b1/2;  - c2/2;    - d1/1;- e2/2;");
  EXPECT_TRUE(Has(Err("{% for x in [1] %}{{ loop([2]) }}{% endfor %}"), "not recursive"));
  EXPECT_TRUE(Has(Err("{% for x in [1] recursive %}{{ loop() }}{% endfor %}"),
                  "loop() takes one iterable"));
  // Runaway recursion stops at the call depth limit, wide recursion at the loop limit.
  auto t0 = std::chrono::steady_clock::now();
  std::string e = Err("{% for x in [1] recursive %}\n  {{ loop([x]) }}{% endfor %}");
  EXPECT_TRUE(Has(e, "line 2, column 10: recursive loop calls nest deeper than the limit of 50"))
      << e;
  e =
      Err("{% for x in range(1000) recursive %}{{ loop(range(1000)) if loop.depth < 3 }}"
          "{% endfor %}");
  EXPECT_TRUE(Has(e, "the loop limit of 100000 iterations is exceeded")) << e;
  e = Err("{% for x in range(2) recursive %}{{ loop([x] * 2) ~ 'x' * 100000 }}{% endfor %}");
  EXPECT_TRUE(Has(e, "limit")) << e;
  EXPECT_LT(Seconds(t0), 5.0);
}

TEST(Jinja, PercentFormatting) {
  EXPECT_EQ(R("{{ '%s: %d' % ('a', 3) }}|{{ '%s!' % 'hi' }}|{{ '100%%' % () }}|{{ 7 % 3 }}"),
            "a: 3|hi!|100%|1");
  EXPECT_EQ(R("{{ '%5.2f|%-4d|%04d|%x|%#x|%X|%o|%+d|% d|%e|%g|%.3d|%-5s|%5s' % (3.14159, 7, 42, "
              "255, 255, 255, 8, 5, 5, 12345.678, 0.0001, 7, 'ab', 'ab') }}"),
            " 3.14|7   |0042|ff|0xff|FF|10|+5| 5|1.234568e+04|0.0001|007|ab   |   ab");
  EXPECT_EQ(
      R("{{ '%(name)s is %(age)d' % {'name': 'Ann', 'age': 30} }}|{{ '%s' % [1, 2] }}|"
        "{{ '%s' % none }}|{{ '%s' % true }}|{{ '%d' % true }}|{{ '%r' % 'x' }}|"
        "{{ '%.2s' % 'h\xc3\xa9llo' }}|{{ '%c' % 65 }}|{{ '%d' % -3.7 }}|{{ '%06.1f' % -2.25 }}"
        "|{{ '%*d' % (4, 1) }}"),
      "Ann is 30|[1, 2]|None|True|1|'x'|h\xc3\xa9|A|-3|-002.2|   1");
  EXPECT_EQ(R("{{ '%s - %s'|format('a', 'b') }}|{{ '%(x)s'|format(x=1) }}|{{ '%s'|format([1]) }}"),
            "a - b|1|[1]");
  EXPECT_TRUE(Has(Err("{{ '%s %s' % ('a',) }}"), "line 1, column 12: not enough arguments"));
  EXPECT_TRUE(Has(Err("{{ '%d %d' % (1, 2, 3) }}"), "not all arguments converted"));
  EXPECT_TRUE(Has(Err("{{ 'x' % 1 }}"), "not all arguments converted"));
  EXPECT_TRUE(Has(Err("{{ '%d' % 'x' }}"), "%d format: a number is required"));
  EXPECT_TRUE(Has(Err("{{ '%q' % 1 }}"), "unsupported format character 'q'"));
  EXPECT_TRUE(Has(Err("{{ '%(k)s' % 1 }}"), "format requires a mapping"));
  EXPECT_TRUE(Has(Err("{{ '%(k)s' % {} }}"), "format key 'k' is missing"));
  EXPECT_TRUE(Has(Err("{{ '%' % () }}"), "incomplete format"));
  EXPECT_TRUE(Has(Err("{{ '%s'|format(1, x=2) }}"), "not both"));
  EXPECT_TRUE(Has(Err("{{ '%s'|format(1, 2) }}"), "not all arguments converted"));
  EXPECT_TRUE(Has(Err("{{ '%999999999d' % 1 }}"), "output limit"));
  EXPECT_TRUE(Has(Err("{{ '%.999999999f' % 1.0 }}"), "output limit"));
}

TEST(Jinja, SortUniqueMinMaxFoldCaseLikeJinja) {
  EXPECT_EQ(R("{{ ['b', 'A', 'a', 'C']|sort }}{{ ['b', 'A', 'C']|sort(case_sensitive=true) }}"
              "{{ [1, 3, 2]|sort(true) }}{{ ['b', 'a', 'B']|sort(reverse=true) }}"),
            "['A', 'a', 'b', 'C']['A', 'C', 'b'][3, 2, 1]['b', 'B', 'a']");
  const Value ctx =
      Value::MakeObject({{"d", Value::MakeObject({{"b", 1}, {"A", 3}, {"c", 2}})},
                         {"ps", Value::MakeArray({Value::MakeObject({{"n", "x"}, {"age", 30}}),
                                                  Value::MakeObject({{"n", "y"}, {"age", 20}})})}});
  EXPECT_EQ(R("{{ d|dictsort }}{{ d|dictsort(true) }}{{ d|dictsort(by='value') }}"
              "{{ d|dictsort(reverse=true) }}",
              ctx),
            "[['A', 3], ['b', 1], ['c', 2]][['A', 3], ['b', 1], ['c', 2]]"
            "[['b', 1], ['c', 2], ['A', 3]][['c', 2], ['b', 1], ['A', 3]]");
  EXPECT_EQ(R("{{ ps|sort(attribute='age')|map(attribute='n')|join }}"
              "{{ (ps|min(attribute='age')).n }}{{ (ps|max(attribute='age')).n }}"
              "{{ ['a', 'B', 'c']|max }}{{ ['a', 'B', 'c']|min(case_sensitive=true) }}",
              ctx),
            "yxyxcB");
  EXPECT_EQ(R("{{ ['a', 'A', 'b']|unique|list }}{{ ['a', 'A']|unique(true)|list }}"
              "{{ ps|unique(attribute='n')|length }}",
              ctx),
            "['a', 'b']['a', 'A']2");
  EXPECT_TRUE(Has(Err("{{ {'a': 1}|dictsort(by='x') }}"), "only sort by 'key' or 'value'"));
}

TEST(Jinja, TupleAndFilteredSet) {
  EXPECT_EQ(R("{% set a, b = 1, 'x' %}{{ a }}{{ b }}{% set t = 1, 2 %}{{ t }}"
              "{% set p, q = [3, 4] %}{{ p + q }}"),
            "1x[1, 2]7");
  EXPECT_EQ(R("{% set s | upper | trim %} hi {{ 1 }} {% endset %}[{{ s }}]"), "[HI 1]");
  EXPECT_TRUE(Has(Err("{% set a, b = [1, 2, 3] %}"), "cannot unpack a value into 2 names"));
}

TEST(Jinja, BatchSliceCenterTruncate) {
  EXPECT_EQ(R("{{ [1, 2, 3, 4, 5]|batch(2)|list }}{{ [1, 2, 3]|batch(2, 0)|list }}"),
            "[[1, 2], [3, 4], [5]][[1, 2], [3, 0]]");
  EXPECT_EQ(R("{{ [1, 2, 3, 4, 5]|slice(3)|list }}{{ [1, 2, 3, 4]|slice(3, 'x')|list }}"),
            "[[1, 2], [3, 4], [5]][[1, 2], [3, 'x'], [4, 'x']]");
  EXPECT_EQ(R("[{{ 'ab'|center(7) }}][{{ 'abc'|center(6) }}][{{ 'long'|center(2) }}]"),
            "[   ab  ][ abc  ][long]");
  EXPECT_EQ(R("{{ 'foo bar baz qux'|truncate(9, leeway=0) }}|{{ 'foo bar baz'|truncate(9, true, "
              "leeway=0) }}|{{ 'short'|truncate(9) }}|{{ 'h\xc3\xa9llo world'|truncate(8, true, "
              "'~', 0) }}"),
            "foo...|foo ba...|short|h\xc3\xa9llo w~");
  EXPECT_TRUE(Has(Err("{{ [1]|batch(0) }}"), "batch takes a positive integer"));
  EXPECT_TRUE(Has(Err("{{ [1]|slice(1000000) }}"), "loop limit"));
  EXPECT_TRUE(Has(Err("{{ 'x'|center(999999999) }}"), "output limit"));
}

TEST(Jinja, RawBlocks) {
  EXPECT_EQ(R("{% raw %}{{ x }}{% if %}{# c #}{% endraw %}!"), "{{ x }}{% if %}{# c #}!");
  EXPECT_EQ(R("a\n  {% raw %}\n{{ b }}\n  {% endraw %}\nc"), "a\n{{ b }}\nc");
  EXPECT_EQ(R("[{%- raw -%}  {{x}}  {%- endraw %}]"), "[{{x}}]");
  EXPECT_EQ(R("{% raw %}{% endraw x %}{%endraw%}"), "{% endraw x %}");
  EXPECT_TRUE(Has(TryRender("ok\n{% raw %}{{ never closed").error().message,
                  "line 2, column 1: unclosed 'raw' block"));
  EXPECT_TRUE(Has(TryRender("{% rawx %}").error().message, "unknown statement 'rawx'"));
}

TEST(Jinja, StrFormat) {
  EXPECT_EQ(R("{{ '{} + {} = {}'.format(1, 2, 3) }}|{{ '{1}{0}{1}'.format('a', 'b') }}|"
              "{{ '{name}: {0}'.format(true, name='x') }}|{{ '{{{}}}'.format(none) }}"),
            "1 + 2 = 3|bab|x: True|{None}");
  EXPECT_TRUE(Has(Err("{{ '{:>5}'.format(1) }}"), "only {}, {N} and {name}"));
  EXPECT_TRUE(Has(Err("{{ '{} {}'.format(1) }}"), "no value for {}"));
  EXPECT_TRUE(Has(Err("{{ 'a}'.format() }}"), "single '}'"));
  EXPECT_TRUE(Has(Err("{{ '{a'.format() }}"), "single '{'"));
}

TEST(Jinja, WithBlocks) {
  EXPECT_EQ(R("{% with a = 1, b = 'x' %}{{ a }}{{ b }}{% set a = 2 %}{{ a }}{% endwith %}"
              "{{ a is defined }}"),
            "1x2False");
  EXPECT_EQ(R("{% for i in [1, 2] %}{% with j = i * 10 %}{% if j > 10 %}{% break %}{% endif %}"
              "{{ j }}{% endwith %}{% endfor %}"),
            "10");
}

// ---------------------------------------------------------------------------------------------
// Chat templates

std::vector<ChatMessage> ThreeTurns(bool system) {
  std::vector<ChatMessage> m;
  if (system) m.push_back({"system", "You are a helpful assistant."});
  m.push_back({"user", "Hello"});
  m.push_back({"assistant", "Hi there!"});
  m.push_back({"user", "How are you?"});
  return m;
}

ChatSetup JinjaSetup(std::string_view source, std::string bos, std::string eos) {
  Result<Template> t = Template::Parse(source);
  EXPECT_TRUE(t.ok()) << (t.ok() ? "" : t.error().message);
  ChatSetup s;
  s.format = ChatFormat::kJinja;
  if (t.ok()) s.jinja = std::make_shared<const Template>(std::move(*t));
  s.bos_token = std::move(bos);
  s.eos_token = std::move(eos);
  s.render.now_unix = kJuly26th2024;
  return s;
}

std::string Chat(const ChatSetup& s, const std::vector<ChatMessage>& m, bool gen = true,
                 bool thinking = true) {
  if (s.jinja == nullptr) return "<no template>";
  Result<std::string> r = RenderChatJinja(s, m, gen, thinking);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
  return r.ok() ? *r : "<error>";
}

TEST(JinjaChat, BuiltinTemplatesByteForByte) {
  const auto m = ThreeTurns(true);
  EXPECT_EQ(Chat(JinjaSetup(BuiltinJinjaTemplate("gemma"), "<bos>", "<eos>"), m),
            "<bos><start_of_turn>user\nYou are a helpful assistant.\n\nHello<end_of_turn>\n"
            "<start_of_turn>model\nHi there!<end_of_turn>\n<start_of_turn>user\nHow are you?"
            "<end_of_turn>\n<start_of_turn>model\n");
  EXPECT_EQ(Chat(JinjaSetup(BuiltinJinjaTemplate("phi3"), "<s>", "</s>"), m),
            "<|system|>\nYou are a helpful assistant.<|end|>\n<|user|>\nHello<|end|>\n"
            "<|assistant|>\nHi there!<|end|>\n<|user|>\nHow are you?<|end|>\n<|assistant|>\n");
  EXPECT_EQ(Chat(JinjaSetup(BuiltinJinjaTemplate("mistral-v7"), "<s>", "</s>"), m),
            "<s>[SYSTEM_PROMPT] You are a helpful assistant.[/SYSTEM_PROMPT][INST] Hello[/INST] "
            "Hi there!</s>[INST] How are you?[/INST]");
  EXPECT_EQ(Chat(JinjaSetup(BuiltinJinjaTemplate("deepseek3"), "<｜begin▁of▁sentence｜>",
                            "<｜end▁of▁sentence｜>"),
                 m),
            "<｜begin▁of▁sentence｜>You are a helpful assistant.<｜User｜>Hello<｜Assistant｜>"
            "Hi there!<｜end▁of▁sentence｜><｜User｜>How are you?<｜Assistant｜>");
  // No system turn; no generation prompt.
  EXPECT_EQ(
      Chat(JinjaSetup(BuiltinJinjaTemplate("gemma"), "<bos>", "<eos>"), ThreeTurns(false), false),
      "<bos><start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\nHi there!"
      "<end_of_turn>\n<start_of_turn>user\nHow are you?<end_of_turn>\n");
  const std::string e =
      RenderChatJinja(JinjaSetup(BuiltinJinjaTemplate("mistral-v7"), "<s>", "</s>"),
                      {{"tool", "x"}}, true, true)
          .error()
          .message;
  EXPECT_NE(e.find("mistral-v7: unsupported role tool"), std::string::npos) << e;
}

// Llama 3.1's prompt layout (its model card's example): the system header with the knowledge
// cutoff and today's date from strftime_now, tools as indented JSON when given. The template
// below follows the published one's structure (system message pulled out of messages, tools
// check, trimmed contents).
constexpr std::string_view kLlama31Style = R"({{- bos_token }}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}
{%- if not date_string is defined %}
    {%- set date_string = strftime_now("%d %b %Y") %}
{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if tools is not none %}
    {{- "Environment: ipython\n" }}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{%- if tools is not none %}
    {{- "You have access to the following functions.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- for message in messages %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
)";

TEST(JinjaChat, Llama31DatePreambleAndTools) {
  ChatSetup s = JinjaSetup(kLlama31Style, "<|begin_of_text|>", "<|eot_id|>");
  EXPECT_EQ(Chat(s, {{"system", "You are a helpful assistant."}, {"user", "What is 2+2?"}}),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
            "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"
            "You are a helpful assistant.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n"
            "What is 2+2?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
  // With a tool: the context is built by hand (RenderChatJinja passes tools = none).
  const Value tool = Value::MakeObject(
      {{"type", "function"},
       {"function",
        Value::MakeObject({{"name", "get_time"}, {"parameters", Value::MakeObject()}})}});
  const Value ctx = Value::MakeObject(
      {{"messages", Value::MakeArray({Value::MakeObject({{"role", "user"}, {"content", " Hi "}})})},
       {"bos_token", "<|begin_of_text|>"},
       {"add_generation_prompt", false},
       {"tools", Value::MakeArray({tool})}});
  jinja::RenderOptions ro;
  ro.now_unix = kJuly26th2024;
  Result<std::string> r = s.jinja->Render(ctx, ro);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(
      *r,
      "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
      "Environment: ipython\nCutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"
      "You have access to the following functions.\n\n"
      "{\n    \"type\": \"function\",\n    \"function\": {\n        \"name\": \"get_time\",\n"
      "        \"parameters\": {}\n    }\n}\n\n"
      "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>");
}

// Qwen3's template logic (the last real user query, reasoning kept only after it, the think
// block, tool responses folded into user turns, enable_thinking), written the way the
// published template does it: a namespace, a reversed scan, split / strip chains.
constexpr std::string_view kQwen3Style = R"({%- if messages[0].role == 'system' %}
    {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set content = message.content %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is defined and message.reasoning_content is not none %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in message.content %}
                {%- set content = message.content.split('</think>')[-1].lstrip('\n') %}
                {%- set reasoning_content = message.content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %})";

TEST(JinjaChat, Qwen3ThinkingMatchesTheNativeRenderer) {
  ChatSetup s = JinjaSetup(kQwen3Style, "", "<|im_end|>");
  const std::vector<ChatMessage> m = {{"system", "Be brief."},
                                      {"user", "What is 2+2?"},
                                      {"assistant", "<think>\nadd them\n</think>\n\n4"},
                                      {"user", "And 3+3?"}};
  EXPECT_EQ(Chat(s, m, true, /*thinking=*/false),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
            "<|im_start|>assistant\n4<|im_end|>\n<|im_start|>user\nAnd 3+3?<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\n");
  EXPECT_EQ(Chat(s, m, true, /*thinking=*/true),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
            "<|im_start|>assistant\n4<|im_end|>\n<|im_start|>user\nAnd 3+3?<|im_end|>\n"
            "<|im_start|>assistant\n");
  // The same conversations through the native Qwen3 renderer, including reasoning after the
  // last query and tool responses.
  const std::vector<std::vector<ChatMessage>> convs = {
      m,
      {{"user", "Q"}, {"assistant", "<think>r1</think>A1"}},
      {{"user", "Q"},
       {"assistant", "call"},
       {"tool", "r1"},
       {"tool", "r2"},
       {"assistant", "<think>\nx\n</think>\n\nok"}},
      {{"system", "S"}, {"user", "<tool_response>\nt\n</tool_response>"}, {"system", "S2"}},
  };
  for (const auto& c : convs) {
    for (bool think : {false, true}) {
      for (bool gen : {false, true}) {
        EXPECT_EQ(Chat(s, c, gen, think), RenderChat(ChatFormat::kQwen3, c, gen, think));
      }
    }
  }
}

// The templates stored in GGUF files: the vocabulary files of ../shared and the shipped model.
struct GgufTemplate {
  std::string path;
  std::string source, bos, eos;
};

std::vector<GgufTemplate> TemplatesInGgufs() {
  std::vector<GgufTemplate> out;
  std::vector<std::filesystem::path> files;
  for (const char* dir : {"/vocab", "/models"}) {
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(kShared + dir, ec)) {
      if (e.path().extension() == ".gguf") files.push_back(e.path());
    }
  }
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(kSource + "/models", ec)) {
    if (e.path().extension() == ".gguf") files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  for (const auto& p : files) {
    Result<std::unique_ptr<gguf::File>> f = gguf::File::Open(p.string());
    if (!f.ok()) continue;
    Result<std::string> t = (*f)->GetString("tokenizer.chat_template");
    if (!t.ok()) continue;
    out.push_back(GgufTemplate{p.string(), *t, "", ""});
  }
  return out;
}

std::string FindTemplate(const std::vector<GgufTemplate>& all, std::string_view file) {
  for (const GgufTemplate& g : all) {
    if (g.path.ends_with(file)) return g.source;
  }
  return {};
}

TEST(JinjaChat, GgufTemplatesByteForByte) {
  const auto all = TemplatesInGgufs();
  const std::string llama3 = FindTemplate(all, "ggml-vocab-llama-bpe.gguf");
  const std::string phi3 = FindTemplate(all, "ggml-vocab-phi-3.gguf");
  const std::string qwen2 = FindTemplate(all, "ggml-vocab-qwen2.gguf");
  if (llama3.empty() || phi3.empty() || qwen2.empty()) {
    GTEST_SKIP() << "the vocabulary GGUFs of " << kShared << "/vocab are absent";
  }
  const auto m = ThreeTurns(true);
  // Llama 3 Instruct.
  const std::string want_llama3 =
      "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are a helpful "
      "assistant.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"
      "<|start_header_id|>assistant<|end_header_id|>\n\nHi there!<|eot_id|>"
      "<|start_header_id|>user<|end_header_id|>\n\nHow are you?<|eot_id|>"
      "<|start_header_id|>assistant<|end_header_id|>\n\n";
  EXPECT_EQ(Chat(JinjaSetup(llama3, "<|begin_of_text|>", "<|end_of_text|>"), m), want_llama3);
  EXPECT_EQ(want_llama3, RenderChat(ChatFormat::kLlama3, m, true));
  // Phi-3 mini: user and assistant turns only (this template drops system turns).
  EXPECT_EQ(Chat(JinjaSetup(phi3, "<s>", "<|endoftext|>"), m),
            "<s><|user|>\nHello<|end|>\n<|assistant|>\nHi there!<|end|>\n<|user|>\nHow are you?"
            "<|end|>\n<|assistant|>\n");
  // Qwen2 / Qwen2.5 instruct ChatML with its default system turn.
  const std::string want_qwen2_nosys =
      "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHello"
      "<|im_end|>\n<|im_start|>assistant\nHi there!<|im_end|>\n<|im_start|>user\nHow are you?"
      "<|im_end|>\n<|im_start|>assistant\n";
  EXPECT_EQ(Chat(JinjaSetup(qwen2, "", "<|endoftext|>"), ThreeTurns(false)), want_qwen2_nosys);
  EXPECT_EQ(Chat(JinjaSetup(qwen2, "", "<|endoftext|>"), m), want_qwen2_nosys);
  EXPECT_EQ(want_qwen2_nosys, RenderChat(ChatFormat::kChatML, ThreeTurns(false), true, true,
                                         DefaultSystemPrompt(qwen2)));
}

TEST(JinjaChat, EveryGgufTemplateRendersThreeTurns) {
  const auto all = TemplatesInGgufs();
  if (all.empty()) GTEST_SKIP() << "no GGUF with a chat template under " << kShared;
  for (const GgufTemplate& g : all) {
    const ChatSetup s = JinjaSetup(g.source, "<s>", "</s>");
    const std::string out = Chat(s, ThreeTurns(true));
    EXPECT_NE(out.find("How are you?"), std::string::npos) << g.path << ": " << out;
    // A template lamina also renders natively gives the same text both ways.
    const ChatSetup native = ChatSetupFromTemplate(g.source);
    if (native.format == ChatFormat::kChatML || native.format == ChatFormat::kQwen3) {
      // Thinking is on here: a ChatML template that opens the block then (the shipped model's)
      // ends with it, as RenderChatPrompt adds it to the native rendering.
      EXPECT_EQ(out,
                RenderChat(native.format, ThreeTurns(true), true, true, native.default_system) +
                    (native.opens_thinking ? "<think>\n" : ""))
          << g.path;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Published chat templates, byte for byte. Each template below is the model's published
// artifact (its tokenizer_config.json chat_template, as copied by the source named above it);
// each expected string is written from the model card's documented prompt layout.

// A template rendered with a hand-built context (messages of any shape, tools), time fixed.
Result<std::string> RenderTemplate(std::string_view source, const Value& ctx,
                                   int64_t now = kJuly26th2024) {
  Result<Template> t = Template::Parse(source);
  if (!t.ok()) return t.error();
  jinja::RenderOptions ro;
  ro.now_unix = now;
  return t->Render(ctx, ro);
}

std::string Rendered(std::string_view source, const Value& ctx, int64_t now = kJuly26th2024) {
  Result<std::string> r = RenderTemplate(source, ctx, now);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
  return r.ok() ? *r : "<error>";
}

std::string ChatError(std::string_view source, const std::vector<ChatMessage>& m) {
  Result<std::string> r = RenderChatJinja(JinjaSetup(source, "<s>", "</s>"), m, true, true);
  EXPECT_FALSE(r.ok());
  return r.ok() ? "" : r.error().message;
}

Value Msg(const char* role, Value content) {
  return Value::MakeObject({{"role", role}, {"content", std::move(content)}});
}

// The get_weather tool of the tool-use tests, in the OpenAI layout chat templates take.
Value WeatherTool() {
  return Value::MakeObject(
      {{"type", "function"},
       {"function",
        Value::MakeObject(
            {{"name", "get_weather"},
             {"description", "Get the weather"},
             {"parameters",
              Value::MakeObject(
                  {{"type", "object"},
                   {"properties",
                    Value::MakeObject({{"city", Value::MakeObject({{"type", "string"}})}})},
                   {"required", Value::MakeArray({"city"})}})}})}});
}

// mistralai/Mistral-Nemo-Instruct-2407 (ggml-org/llama.cpp, models/templates/
// mistralai-Mistral-Nemo-Instruct-2407.jinja).
constexpr std::string_view kMistralNemo = R"tpl({%- if messages[0]["role"] == "system" %}
    {%- set system_message = messages[0]["content"] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}
{%- set user_messages = loop_messages | selectattr("role", "equalto", "user") | list %}

{#- This block checks for alternating user/assistant messages, skipping tool calling messages #}
{%- set ns = namespace() %}
{%- set ns.index = 0 %}
{%- for message in loop_messages %}
    {%- if not (message.role == "tool" or message.role == "tool_results" or (message.tool_calls is defined and message.tool_calls is not none)) %}
        {%- if (message["role"] == "user") != (ns.index % 2 == 0) %}
            {{- raise_exception("After the optional system message, conversation roles must alternate user/assistant/user/assistant/...") }}
        {%- endif %}
        {%- set ns.index = ns.index + 1 %}
    {%- endif %}
{%- endfor %}

{{- bos_token }}
{%- for message in loop_messages %}
    {%- if message["role"] == "user" %}
        {%- if tools is not none and (message == user_messages[-1]) %}
            {{- "[AVAILABLE_TOOLS][" }}
            {%- for tool in tools %}
                {%- set tool = tool.function %}
                {{- '{"type": "function", "function": {' }}
                {%- for key, val in tool.items() if key != "return" %}
                    {%- if val is string %}
                        {{- '"' + key + '": "' + val + '"' }}
                    {%- else %}
                        {{- '"' + key + '": ' + val|tojson }}
                    {%- endif %}
                    {%- if not loop.last %}
                        {{- ", " }}
                    {%- endif %}
                {%- endfor %}
                {{- "}}" }}
                {%- if not loop.last %}
                    {{- ", " }}
                {%- else %}
                    {{- "]" }}
                {%- endif %}
            {%- endfor %}
            {{- "[/AVAILABLE_TOOLS]" }}
            {%- endif %}
        {%- if loop.last and system_message is defined %}
            {{- "[INST]" + system_message + "\n\n" + message["content"] + "[/INST]" }}
        {%- else %}
            {{- "[INST]" + message["content"] + "[/INST]" }}
        {%- endif %}
    {%- elif (message.tool_calls is defined and message.tool_calls is not none) %}
        {{- "[TOOL_CALLS][" }}
        {%- for tool_call in message.tool_calls %}
            {%- set out = tool_call.function|tojson %}
            {{- out[:-1] }}
            {%- if not tool_call.id is defined or tool_call.id|length != 9 %}
                {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}
            {%- endif %}
            {{- ', "id": "' + tool_call.id + '"}' }}
            {%- if not loop.last %}
                {{- ", " }}
            {%- else %}
                {{- "]" + eos_token }}
            {%- endif %}
        {%- endfor %}
    {%- elif message["role"] == "assistant" %}
        {{- message["content"] + eos_token}}
    {%- elif message["role"] == "tool_results" or message["role"] == "tool" %}
        {%- if message.content is defined and message.content.content is defined %}
            {%- set content = message.content.content %}
        {%- else %}
            {%- set content = message.content %}
        {%- endif %}
        {{- '[TOOL_RESULTS]{"content": ' + content|string + ", " }}
        {%- if not message.tool_call_id is defined or message.tool_call_id|length != 9 %}
            {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}
        {%- endif %}
        {{- '"call_id": "' + message.tool_call_id + '"}[/TOOL_RESULTS]' }}
    {%- else %}
        {{- raise_exception("Only user and assistant roles are supported, with the exception of an initial optional system message!") }}
    {%- endif %}
{%- endfor %}
)tpl";

// google/gemma-2-2b-it (ggml-org/llama.cpp, models/templates/google-gemma-2-2b-it.jinja).
constexpr std::string_view kGemma2 =
    R"tpl({{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '
' + message['content'] | trim + '<end_of_turn>
' }}{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model
'}}{% endif %})tpl";

// google/gemma-3 instruct (tokenizer_config.json of google/gemma-3-4b-it, bos_token "<bos>";
// the copy quoted in ShishirPatil/gorilla's BFCL Gemma handler).
constexpr std::string_view kGemma3 = R"tpl({{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '

' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '

' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '
' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>
' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model
'}}
{%- endif -%}
)tpl";

// deepseek-ai/DeepSeek-R1-Distill-Qwen-32B (ggml-org/llama.cpp, models/templates/
// deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja).
constexpr std::string_view kDeepSeekR1Distill = R"tpl({% if not add_generation_prompt is defined -%}
  {%- set add_generation_prompt = false -%}
{%- endif -%}
{%- set ns = namespace(is_first=false, is_tool=false, is_output_first=true, system_prompt='') -%}
{%- for message in messages -%}
  {%- if message['role'] == 'system' -%}
    {%- set ns.system_prompt = message['content'] -%}
  {%- endif -%}
{%- endfor -%}{{bos_token}}{{ns.system_prompt}}
{%- for message in messages -%}
  {%- if message['role'] == 'user' -%}
    {%- set ns.is_tool = false -%}{{'<｜User｜>' + message['content']}}
  {%- endif -%}
  {%- if message['role'] == 'assistant' and message['tool_calls'] -%}
    {%- set ns.is_tool = false -%}
    {%- for tool in message['tool_calls']-%}
      {%- if not ns.is_first -%}
        {{'<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + tool['function']['name'] + '\n' + '```json' + '\n' + tool['function']['arguments'] + '\n' + '```' + '<｜tool▁call▁end｜>'}}
        {%- set ns.is_first = true -%}
      {%- else -%}
        {{'\n' + '<｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + tool['function']['name'] + '\n' + '```json' + '\n' + tool['function']['arguments'] + '\n' + '```' + '<｜tool▁call▁end｜>'}}
      {%- endif -%}
    {%- endfor -%}
    {{'<｜tool▁calls▁end｜><｜end▁of▁sentence｜>'}}
  {%- endif -%}
  {%- if message['role'] == 'assistant' and message['content'] is not none -%}
    {%- if ns.is_tool -%}{{'<｜tool▁outputs▁end｜>' + message['content'] + '<｜end▁of▁sentence｜>'}}
      {%- set ns.is_tool = false -%}
    {%- else -%}
      {%- set content = message['content'] -%}
      {%- if '</think>' in content -%}
        {%- set content = content.split('</think>')[-1] -%}
      {%- endif -%}{{'<｜Assistant｜>' + content + '<｜end▁of▁sentence｜>'}}
    {%- endif -%}
  {%- endif -%}
  {%- if message['role'] == 'tool' -%}
    {%- set ns.is_tool = true -%}
    {%- if ns.is_output_first -%}{{'<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>' + message['content'] + '<｜tool▁output▁end｜>'}}
      {%- set ns.is_output_first = false -%}
      {%- else -%}{{'\n<｜tool▁output▁begin｜>' + message['content'] + '<｜tool▁output▁end｜>'}}
    {%- endif -%}
  {%- endif -%}
{%- endfor -%}
{%- if ns.is_tool -%}{{'<｜tool▁outputs▁end｜>'}}
{%- endif -%}
{%- if add_generation_prompt and not ns.is_tool -%}{{'<｜Assistant｜><think>\n'}}
{%- endif %})tpl";

// microsoft/Phi-3.5-mini-instruct (ggml-org/llama.cpp, models/templates/
// microsoft-Phi-3.5-mini-instruct.jinja).
constexpr std::string_view kPhi35Mini =
    R"tpl({% for message in messages %}{% if message['role'] == 'system' and message['content'] %}{{'<|system|>
' + message['content'] + '<|end|>
'}}{% elif message['role'] == 'user' %}{{'<|user|>
' + message['content'] + '<|end|>
'}}{% elif message['role'] == 'assistant' %}{{'<|assistant|>
' + message['content'] + '<|end|>
'}}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>
' }}{% else %}{{ eos_token }}{% endif %})tpl";

// meta-llama/Llama-3.2-3B-Instruct (ggml-org/llama.cpp, models/templates/
// meta-llama-Llama-3.2-3B-Instruct.jinja).
constexpr std::string_view kLlama32 = R"tpl({{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- if strftime_now is defined %}
        {%- set date_string = strftime_now("%d %b %Y") %}
    {%- else %}
        {%- set date_string = "26 Jul 2024" %}
    {%- endif %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- System message #}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if tools is not none %}
    {{- "Environment: ipython\n" }}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}

{#- Custom tools are passed in a user message with some extra guidance #}
{%- if tools_in_user_message and not tools is none %}
    {#- Extract the first user message so we can plug it in here #}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
{%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\n\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\n\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}

{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
        {{- '{"name": "' + tool_call.name + '", ' }}
        {{- '"parameters": ' }}
        {{- tool_call.arguments | tojson }}
        {{- "}" }}
        {{- "<|eot_id|>" }}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\n\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
)tpl";

// Mistral's instruct layout: <s>[INST]user[/INST]answer</s>[INST]user[/INST]; Nemo's template
// puts no space after [INST] and folds the system prompt into the last user turn.
TEST(PublishedTemplates, MistralNemo) {
  const ChatSetup s = JinjaSetup(kMistralNemo, "<s>", "</s>");
  const std::string want =
      "<s>[INST]Hello[/INST]Hi there!</s>[INST]You are a helpful assistant.\n\nHow are you?[/INST]";
  EXPECT_EQ(Chat(s, ThreeTurns(true), true), want);
  EXPECT_EQ(Chat(s, ThreeTurns(true), false), want);  // no generation prompt of its own
  EXPECT_EQ(Chat(s, ThreeTurns(false), true),
            "<s>[INST]Hello[/INST]Hi there!</s>[INST]How are you?[/INST]");
  std::string e = ChatError(kMistralNemo, {{"user", "a"}, {"user", "b"}});
  EXPECT_TRUE(Has(e,
                  "After the optional system message, conversation roles must alternate "
                  "user/assistant/user/assistant/..."))
      << e;
  e = ChatError(kMistralNemo, {{"user", "a"}, {"critic", "b"}});
  EXPECT_TRUE(Has(e, "Only user and assistant roles are supported")) << e;

  // Tools: [AVAILABLE_TOOLS] before the last user turn, [TOOL_CALLS] and [TOOL_RESULTS] turns.
  const Value call = Value::MakeObject(
      {{"id", "abcdef123"},
       {"type", "function"},
       {"function", Value::MakeObject({{"name", "get_weather"},
                                       {"arguments", Value::MakeObject({{"city", "Paris"}})}})}});
  Value tool_msg = Msg("tool", "22C");
  tool_msg.Set("tool_call_id", "abcdef123");
  Value call_msg = Msg("assistant", Value::None());
  call_msg.Set("tool_calls", Value::MakeArray({call}));
  const Value ctx = Value::MakeObject(
      {{"messages",
        Value::MakeArray({Msg("user", "What's the weather in Paris?"), call_msg, tool_msg,
                          Msg("assistant", "It is 22C in Paris."), Msg("user", "And in Rome?")})},
       {"tools", Value::MakeArray({WeatherTool()})},
       {"bos_token", "<s>"},
       {"eos_token", "</s>"},
       {"add_generation_prompt", true}});
  EXPECT_EQ(Rendered(kMistralNemo, ctx),
            "<s>[INST]What's the weather in Paris?[/INST]"
            "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}, "
            "\"id\": \"abcdef123\"}]</s>"
            "[TOOL_RESULTS]{\"content\": 22C, \"call_id\": \"abcdef123\"}[/TOOL_RESULTS]"
            "It is 22C in Paris.</s>"
            "[AVAILABLE_TOOLS][{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", "
            "\"description\": \"Get the weather\", \"parameters\": {\"type\": \"object\", "
            "\"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}}}]"
            "[/AVAILABLE_TOOLS][INST]And in Rome?[/INST]");
  tool_msg.Set("tool_call_id", "short");
  e = RenderTemplate(kMistralNemo, ctx).error().message;
  EXPECT_TRUE(Has(e, "Tool call IDs should be alphanumeric strings with length 9!")) << e;
}

// Gemma's turns: <start_of_turn>user\n...<end_of_turn>\n, the assistant's role named "model".
TEST(PublishedTemplates, Gemma2) {
  const ChatSetup s = JinjaSetup(kGemma2, "<bos>", "<eos>");
  const std::string turns =
      "<bos><start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\nHi there!"
      "<end_of_turn>\n<start_of_turn>user\nHow are you?<end_of_turn>\n";
  EXPECT_EQ(Chat(s, ThreeTurns(false), true), turns + "<start_of_turn>model\n");
  EXPECT_EQ(Chat(s, ThreeTurns(false), false), turns);
  // Contents are trimmed.
  EXPECT_EQ(Chat(s, {{"user", "  Hi \n"}}, true),
            "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n");
  // Gemma 2 has no system role, and turns must alternate.
  EXPECT_TRUE(Has(ChatError(kGemma2, ThreeTurns(true)), "System role not supported"));
  EXPECT_TRUE(Has(ChatError(kGemma2, {{"user", "a"}, {"user", "b"}}),
                  "Conversation roles must alternate user/assistant/user/assistant/..."));
}

// Gemma 3: the same turns; a system prompt opens the first user turn, followed by a blank line.
TEST(PublishedTemplates, Gemma3) {
  const ChatSetup s = JinjaSetup(kGemma3, "<bos>", "<eos>");
  const std::string turns =
      "<bos><start_of_turn>user\nYou are a helpful assistant.\n\nHello<end_of_turn>\n"
      "<start_of_turn>model\nHi there!<end_of_turn>\n<start_of_turn>user\nHow are you?"
      "<end_of_turn>\n";
  EXPECT_EQ(Chat(s, ThreeTurns(true), true), turns + "<start_of_turn>model\n");
  EXPECT_EQ(Chat(s, ThreeTurns(true), false), turns);
  EXPECT_EQ(Chat(s, ThreeTurns(false), true),
            "<bos><start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\nHi there!"
            "<end_of_turn>\n<start_of_turn>user\nHow are you?<end_of_turn>\n"
            "<start_of_turn>model\n");
  // Multimodal contents: an image part is <start_of_image>, text parts are trimmed.
  const Value parts = Value::MakeArray(
      {Value::MakeObject({{"type", "image"}}),
       Value::MakeObject({{"type", "text"}, {"text", " What is in this image? "}})});
  const Value sys_parts =
      Value::MakeArray({Value::MakeObject({{"type", "text"}, {"text", "Be brief."}})});
  const Value ctx = Value::MakeObject(
      {{"messages", Value::MakeArray({Msg("system", sys_parts), Msg("user", parts)})},
       {"bos_token", "<bos>"},
       {"add_generation_prompt", true}});
  EXPECT_EQ(Rendered(kGemma3, ctx),
            "<bos><start_of_turn>user\nBe brief.\n\n<start_of_image>What is in this image?"
            "<end_of_turn>\n<start_of_turn>model\n");
  EXPECT_TRUE(Has(ChatError(kGemma3, {{"system", "s"}, {"assistant", "a"}}),
                  "Conversation roles must alternate user/assistant/user/assistant/..."));
  const Value bad = Value::MakeObject({{"messages", Value::MakeArray({Msg("user", 5)})}});
  EXPECT_TRUE(Has(RenderTemplate(kGemma3, bad).error().message, "Invalid content type"));
}

// DeepSeek-R1 distills: the system prompt right after BOS, <｜User｜> / <｜Assistant｜> turns,
// earlier answers without their reasoning, and the generation prompt opening a think block.
TEST(PublishedTemplates, DeepSeekR1Distill) {
  const ChatSetup s =
      JinjaSetup(kDeepSeekR1Distill, "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>");
  const std::string turns =
      "<｜begin▁of▁sentence｜>You are a helpful assistant.<｜User｜>Hello<｜Assistant｜>Hi there!"
      "<｜end▁of▁sentence｜><｜User｜>How are you?";
  EXPECT_EQ(Chat(s, ThreeTurns(true), true), turns + "<｜Assistant｜><think>\n");
  EXPECT_EQ(Chat(s, ThreeTurns(true), false), turns);
  EXPECT_EQ(
      Chat(s,
           {{"user", "Hello"},
            {"assistant", "<think>\nhmm\n</think>\n\nHi there!"},
            {"user", "How are you?"}},
           true),
      "<｜begin▁of▁sentence｜><｜User｜>Hello<｜Assistant｜>\n\nHi there!<｜end▁of▁sentence｜>"
      "<｜User｜>How are you?<｜Assistant｜><think>\n");
  // Tool calls and tool outputs.
  const Value call = Value::MakeObject(
      {{"type", "function"},
       {"function",
        Value::MakeObject({{"name", "get_weather"}, {"arguments", "{\"city\": \"Paris\"}"}})}});
  Value call_msg = Msg("assistant", Value::None());
  call_msg.Set("tool_calls", Value::MakeArray({call}));
  const Value ctx = Value::MakeObject(
      {{"messages",
        Value::MakeArray({Msg("user", "Weather in Paris?"), call_msg, Msg("tool", "22C"),
                          Msg("assistant", "It is 22C."), Msg("user", "Thanks")})},
       {"bos_token", "<｜begin▁of▁sentence｜>"},
       {"add_generation_prompt", true}});
  EXPECT_EQ(Rendered(kDeepSeekR1Distill, ctx),
            "<｜begin▁of▁sentence｜><｜User｜>Weather in Paris?"
            "<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>"
            "get_weather\n```json\n{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜>"
            "<｜tool▁calls▁end｜><｜end▁of▁sentence｜>"
            "<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>22C<｜tool▁output▁end｜>"
            "<｜tool▁outputs▁end｜>It is 22C.<｜end▁of▁sentence｜><｜User｜>Thanks"
            "<｜Assistant｜><think>\n");
}

// Phi-3.5: <|role|>\ncontent<|end|>\n per turn; without a generation prompt the text ends
// with the EOS token.
TEST(PublishedTemplates, Phi35Mini) {
  const ChatSetup s = JinjaSetup(kPhi35Mini, "<s>", "<|endoftext|>");
  const std::string turns =
      "<|system|>\nYou are a helpful assistant.<|end|>\n<|user|>\nHello<|end|>\n<|assistant|>\n"
      "Hi there!<|end|>\n<|user|>\nHow are you?<|end|>\n";
  EXPECT_EQ(Chat(s, ThreeTurns(true), true), turns + "<|assistant|>\n");
  EXPECT_EQ(Chat(s, ThreeTurns(true), false), turns + "<|endoftext|>");
  EXPECT_EQ(Chat(s, {{"system", ""}, {"user", "Hi"}}, true),
            "<|user|>\nHi<|end|>\n<|assistant|>\n");
}

// Llama 3.2: the system header with the knowledge cutoff and today's date (strftime_now),
// tools as indented JSON in the first user turn, ipython turns for tool outputs.
TEST(PublishedTemplates, Llama32) {
  const ChatSetup s = JinjaSetup(kLlama32, "<|begin_of_text|>", "<|eot_id|>");
  const std::string head =
      "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
      "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n";
  const std::string turns =
      "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"
      "<|start_header_id|>assistant<|end_header_id|>\n\nHi there!<|eot_id|>"
      "<|start_header_id|>user<|end_header_id|>\n\nHow are you?<|eot_id|>";
  const std::string gen = "<|start_header_id|>assistant<|end_header_id|>\n\n";
  EXPECT_EQ(Chat(s, ThreeTurns(true), true),
            head + "You are a helpful assistant.<|eot_id|>" + turns + gen);
  EXPECT_EQ(Chat(s, ThreeTurns(true), false),
            head + "You are a helpful assistant.<|eot_id|>" + turns);
  EXPECT_EQ(Chat(s, ThreeTurns(false), true), head + "<|eot_id|>" + turns + gen);
  // Today's date comes from strftime_now (2025-01-15 here), not the template's fallback.
  const Value plain = Value::MakeObject(
      {{"messages", Value::MakeArray({Msg("user", "Hi")})}, {"bos_token", "<|begin_of_text|>"}});
  EXPECT_TRUE(Has(Rendered(kLlama32, plain, 1736899200), "Today Date: 15 Jan 2025\n"));

  Value call_msg = Msg("assistant", Value::None());
  call_msg.Set("tool_calls",
               Value::MakeArray({Value::MakeObject(
                   {{"type", "function"},
                    {"function", Value::MakeObject(
                                     {{"name", "get_weather"},
                                      {"arguments", Value::MakeObject({{"city", "Paris"}})}})}})}));
  const Value ctx =
      Value::MakeObject({{"messages", Value::MakeArray({Msg("user", "What's the weather in Paris?"),
                                                        call_msg, Msg("tool", "22C")})},
                         {"tools", Value::MakeArray({WeatherTool()})},
                         {"bos_token", "<|begin_of_text|>"},
                         {"add_generation_prompt", true}});
  EXPECT_EQ(Rendered(kLlama32, ctx),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
            "Environment: ipython\nCutting Knowledge Date: December 2023\n"
            "Today Date: 26 Jul 2024\n\n<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\n"
            "Given the following functions, please respond with a JSON for a function call with "
            "its proper arguments that best answers the given prompt.\n\n"
            "Respond in the format {\"name\": function name, \"parameters\": dictionary of "
            "argument name and its value}.Do not use variables.\n\n"
            "{\n    \"type\": \"function\",\n    \"function\": {\n"
            "        \"name\": \"get_weather\",\n        \"description\": \"Get the weather\",\n"
            "        \"parameters\": {\n            \"type\": \"object\",\n"
            "            \"properties\": {\n                \"city\": {\n"
            "                    \"type\": \"string\"\n                }\n            },\n"
            "            \"required\": [\n                \"city\"\n            ]\n"
            "        }\n    }\n}\n\n"
            "What's the weather in Paris?<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n"
            "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}<|eot_id|>"
            "<|start_header_id|>ipython<|end_header_id|>\n\n\"22C\"<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

// mistralai/Mistral-Small-3.1-24B-Instruct-2503 (ggml-org/llama.cpp, models/templates/
// mistralai-Mistral-Small-3.1-24B-Instruct-2503.jinja).
constexpr std::string_view kMistralSmall31 = R"tpl({%- set today = strftime_now("%Y-%m-%d") %}
{%- set default_system_message = "You are Mistral Small 3, a Large Language Model (LLM) created by Mistral AI, a French startup headquartered in Paris.\
Your knowledge base was last updated on 2023-10-01. The current date is " + today + ".\
\
When you're not sure about some information, you say that you don't have the information and don't make up anything.\
If the user's question is not clear, ambiguous, or does not provide enough context for you to accurately answer the question, you do not try to answer it right away and you rather ask the user to clarify their request (e.g. \"What are some good restaurants around me?\" => \"Where are you?\" or \"When is the next flight to Tokyo\" => \"Where do you travel from?\")" %}

{{- bos_token }}

{%- if messages[0]['role'] == 'system' %}
    {%- if messages[0]['content'] is string %}
        {%- set system_message = messages[0]['content'] %}
        {%- set loop_messages = messages[1:] %}
    {%- else %}
        {%- set system_message = messages[0]['content'][0]['text'] %}
        {%- set loop_messages = messages[1:] %}
    {%- endif %}
{%- else %}
    {%- set system_message = default_system_message %}
    {%- set loop_messages = messages %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- elif tools is not none %}
    {%- set parallel_tool_prompt = "You are a helpful assistant that can call tools. If you call one or more tools, format them in a single JSON array or objects, where each object is a tool call, not as separate objects outside of an array or multiple arrays. Use the format [{\"name\": tool call name, \"arguments\": tool call arguments}, additional tool calls] if you call more than one tool. If you call tools, do not attempt to interpret them or otherwise provide a response until you receive a tool call result that you can interpret for the user." %}
    {%- if system_message is defined %}
        {%- set system_message = parallel_tool_prompt + "\
\
" + system_message %}
    {%- else %}
        {%- set system_message = parallel_tool_prompt %}
    {%- endif %}
{%- endif %}
{{- '[SYSTEM_PROMPT]' + system_message + '[/SYSTEM_PROMPT]' }}

{%- set user_messages = loop_messages | selectattr("role", "equalto", "user") | list %}

{%- set filtered_messages = [] %}
{%- for message in loop_messages %}
    {%- if message["role"] not in ["tool", "tool_results"] and not message.get("tool_calls") %}
        {%- set filtered_messages = filtered_messages + [message] %}
    {%- endif %}
{%- endfor %}

{%- for message in filtered_messages %}
    {%- if (message["role"] == "user") != (loop.index0 % 2 == 0) %}
        {{- raise_exception("After the optional system message, conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif %}
{%- endfor %}

{%- for message in loop_messages %}
    {%- if message["role"] == "user" %}
        {%- if tools is not none and (message == user_messages[-1]) %}
            {{- "[AVAILABLE_TOOLS] [" }}
            {%- for tool in tools %}
                {%- set tool = tool.function %}
                {{- '{"type": "function", "function": {' }}
                {%- for key, val in tool.items() if key != "return" %}
                    {%- if val is string %}
                        {{- '"' + key + '": "' + val + '"' }}
                    {%- else %}
                        {{- '"' + key + '": ' + val|tojson }}
                    {%- endif %}
                    {%- if not loop.last %}
                        {{- ", " }}
                    {%- endif %}
                {%- endfor %}
                {{- "}}" }}
                {%- if not loop.last %}
                    {{- ", " }}
                {%- else %}
                    {{- "]" }}
                {%- endif %}
            {%- endfor %}
            {{- "[/AVAILABLE_TOOLS]" }}
        {%- endif %}
        {%- if message['content'] is string %}
        {{- '[INST]' + message['content'] + '[/INST]' }}
        {%- else %}
                {{- '[INST]' }}
                {%- for block in message['content'] %}
                        {%- if block['type'] == 'text' %}
                                {{- block['text'] }}
                        {%- elif block['type'] == 'image' or block['type'] == 'image_url' %}
                                {{- '[IMG]' }}
                            {%- else %}
                                {{- raise_exception('Only text and image blocks are supported in message content!') }}
                            {%- endif %}
                    {%- endfor %}
                {{- '[/INST]' }}
            {%- endif %}
    {%- elif message["role"] == "tool_calls" or message.tool_calls is defined %}
        {%- if message.tool_calls is defined %}
            {%- set tool_calls = message.tool_calls %}
        {%- else %}
            {%- set tool_calls = message.content %}
        {%- endif %}
        {{- "[TOOL_CALLS] [" }}
        {%- for tool_call in tool_calls %}
            {%- set out = tool_call.function|tojson %}
            {{- out[:-1] }}
            {%- if not tool_call.id is defined or tool_call.id|length < 9 %}
                {{- raise_exception("Tool call IDs should be alphanumeric strings with length >= 9! (1)" + tool_call.id) }}
            {%- endif %}
            {{- ', "id": "' + tool_call.id[-9:] + '"}' }}
            {%- if not loop.last %}
                {{- ", " }}
            {%- else %}
                {{- "]" + eos_token }}
            {%- endif %}
        {%- endfor %}
    {%- elif message['role'] == 'assistant' %}
        {%- if message['content'] is string %}
            {{- message['content'] + eos_token }}
        {%- else %}
            {{- message['content'][0]['text'] + eos_token }}
        {%- endif %}
    {%- elif message["role"] == "tool_results" or message["role"] == "tool" %}
        {%- if message.content is defined and message.content.content is defined %}
            {%- set content = message.content.content %}
        {%- else %}
            {%- set content = message.content %}
        {%- endif %}
        {{- '[TOOL_RESULTS] {"content": ' + content|string + ", " }}
        {%- if not message.tool_call_id is defined or message.tool_call_id|length < 9 %}
            {{- raise_exception("Tool call IDs should be alphanumeric strings with length >= 9! (2)" + message.tool_call_id) }}
        {%- endif %}
        {{- '"call_id": "' + message.tool_call_id[-9:] + '"}[/TOOL_RESULTS]' }}
    {%- else %}
        {{- raise_exception("Only user and assistant roles are supported, with the exception of an initial optional system message!") }}
    {%- endif %}
{%- endfor %}
)tpl";

// Mistral Small 3.1: [SYSTEM_PROMPT]...[/SYSTEM_PROMPT] after BOS (its default system prompt,
// with today's date, when the conversation has none), then [INST] turns. A backslash before a
// line break inside the template's strings continues the line (Python's string escapes), so the
// default prompt's sentences and the tool prompt join without line breaks.
TEST(PublishedTemplates, MistralSmall31) {
  const ChatSetup s = JinjaSetup(kMistralSmall31, "<s>", "</s>");
  const std::string want =
      "<s>[SYSTEM_PROMPT]You are a helpful assistant.[/SYSTEM_PROMPT][INST]Hello[/INST]Hi there!"
      "</s>[INST]How are you?[/INST]";
  EXPECT_EQ(Chat(s, ThreeTurns(true), true), want);
  EXPECT_EQ(Chat(s, ThreeTurns(true), false), want);
  EXPECT_EQ(
      Chat(s, {{"user", "Hello"}}, true),
      "<s>[SYSTEM_PROMPT]You are Mistral Small 3, a Large Language Model (LLM) created by "
      "Mistral AI, a French startup headquartered in Paris.Your knowledge base was last "
      "updated on 2023-10-01. The current date is 2024-07-26.When you're not sure about some "
      "information, you say that you don't have the information and don't make up anything."
      "If the user's question is not clear, ambiguous, or does not provide enough context for "
      "you to accurately answer the question, you do not try to answer it right away and you "
      "rather ask the user to clarify their request (e.g. \"What are some good restaurants "
      "around me?\" => \"Where are you?\" or \"When is the next flight to Tokyo\" => \"Where "
      "do you travel from?\")[/SYSTEM_PROMPT][INST]Hello[/INST]");
  // Its alternation check never fires: the list it checks is built by `set` inside a for
  // loop, which in Jinja does not outlive the loop, so the list is empty (as in Jinja).
  EXPECT_TRUE(Chat(s, {{"assistant", "a"}}, true).ends_with("[/SYSTEM_PROMPT]a</s>"));
  EXPECT_TRUE(Has(ChatError(kMistralSmall31, {{"user", "a"}, {"critic", "b"}}),
                  "Only user and assistant roles are supported"));

  // Content blocks: text and images; a system prompt given as blocks.
  const Value user_parts =
      Value::MakeArray({Value::MakeObject({{"type", "text"}, {"text", "Describe this:"}}),
                        Value::MakeObject({{"type", "image"}})});
  const Value sys_parts =
      Value::MakeArray({Value::MakeObject({{"type", "text"}, {"text", "Be brief."}})});
  Value ctx = Value::MakeObject(
      {{"messages", Value::MakeArray({Msg("system", sys_parts), Msg("user", user_parts)})},
       {"bos_token", "<s>"},
       {"eos_token", "</s>"}});
  EXPECT_EQ(Rendered(kMistralSmall31, ctx),
            "<s>[SYSTEM_PROMPT]Be brief.[/SYSTEM_PROMPT][INST]Describe this:[IMG][/INST]");

  // Tools: the tool prompt before the system prompt, [AVAILABLE_TOOLS] before the last user
  // turn, call IDs cut to their last nine characters.
  const Value call = Value::MakeObject(
      {{"id", "call_abcdef123"},
       {"type", "function"},
       {"function", Value::MakeObject({{"name", "get_weather"},
                                       {"arguments", Value::MakeObject({{"city", "Paris"}})}})}});
  Value call_msg = Msg("assistant", Value::None());
  call_msg.Set("tool_calls", Value::MakeArray({call}));
  Value tool_msg = Msg("tool", "22C");
  tool_msg.Set("tool_call_id", "call_abcdef123");
  ctx = Value::MakeObject(
      {{"messages",
        Value::MakeArray({Msg("system", "You are a helpful assistant."),
                          Msg("user", "What's the weather in Paris?"), call_msg, tool_msg,
                          Msg("assistant", "It is 22C in Paris."), Msg("user", "And in Rome?")})},
       {"tools", Value::MakeArray({WeatherTool()})},
       {"bos_token", "<s>"},
       {"eos_token", "</s>"},
       {"add_generation_prompt", true}});
  EXPECT_EQ(Rendered(kMistralSmall31, ctx),
            "<s>[SYSTEM_PROMPT]You are a helpful assistant that can call tools. If you call one or "
            "more tools, format them in a single JSON array or objects, where each object is a "
            "tool call, not as separate objects outside of an array or multiple arrays. Use the "
            "format [{\"name\": tool call name, \"arguments\": tool call arguments}, additional "
            "tool calls] if you call more than one tool. If you call tools, do not attempt to "
            "interpret them or otherwise provide a response until you receive a tool call result "
            "that you can interpret for the user.You are a helpful assistant.[/SYSTEM_PROMPT]"
            "[INST]What's the weather in Paris?[/INST]"
            "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}, "
            "\"id\": \"abcdef123\"}]</s>"
            "[TOOL_RESULTS] {\"content\": 22C, \"call_id\": \"abcdef123\"}[/TOOL_RESULTS]"
            "It is 22C in Paris.</s>"
            "[AVAILABLE_TOOLS] [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", "
            "\"description\": \"Get the weather\", \"parameters\": {\"type\": \"object\", "
            "\"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}}}]"
            "[/AVAILABLE_TOOLS][INST]And in Rome?[/INST]");
  tool_msg.Set("tool_call_id", "abc");
  const std::string e = RenderTemplate(kMistralSmall31, ctx).error().message;
  EXPECT_TRUE(Has(e, "Tool call IDs should be alphanumeric strings with length >= 9! (2)abc")) << e;
}

// zai-org/GLM-4.6 (ggml-org/llama.cpp, models/templates/GLM-4.6.jinja).
constexpr std::string_view kGlm46 = R"tpl([gMASK]<sop>
{%- if tools -%}
<|system|>
# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{% for tool in tools %}
{{ tool | tojson(ensure_ascii=False) }}
{% endfor %}
</tools>

For each function call, output the function name and arguments within the following XML format:
<tool_call>{function-name}
<arg_key>{arg-key-1}</arg_key>
<arg_value>{arg-value-1}</arg_value>
<arg_key>{arg-key-2}</arg_key>
<arg_value>{arg-value-2}</arg_value>
...
</tool_call>{%- endif -%}
{%- macro visible_text(content) -%}
    {%- if content is string -%}
        {{- content }}
    {%- elif content is iterable and content is not mapping -%}
        {%- for item in content -%}
            {%- if item is mapping and item.type == 'text' -%}
                {{- item.text }}
            {%- elif item is string -%}
                {{- item }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{- content }}
    {%- endif -%}
{%- endmacro -%}
{%- set ns = namespace(last_user_index=-1) %}
{%- for m in messages %}
    {%- if m.role == 'user' %}
        {% set ns.last_user_index = loop.index0 -%}
    {%- endif %}
{%- endfor %}
{% for m in messages %}
{%- if m.role == 'user' -%}<|user|>
{{ visible_text(m.content) }}
{{- '/nothink' if (enable_thinking is defined and not enable_thinking and not visible_text(m.content).endswith("/nothink")) else '' -}}
{%- elif m.role == 'assistant' -%}
<|assistant|>
{%- set reasoning_content = '' %}
{%- set content = visible_text(m.content) %}
{%- if m.reasoning_content is string %}
    {%- set reasoning_content = m.reasoning_content %}
{%- else %}
    {%- if '</think>' in content %}
        {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
        {%- set content = content.split('</think>')[-1].lstrip('\n') %}
    {%- endif %}
{%- endif %}
{%- if loop.index0 > ns.last_user_index and reasoning_content -%}
{{ '\n<think>' + reasoning_content.strip() +  '</think>'}}
{%- else -%}
{{ '\n<think></think>' }}
{%- endif -%}
{%- if content.strip() -%}
{{ '\n' + content.strip() }}
{%- endif -%}
{% if m.tool_calls %}
{% for tc in m.tool_calls %}
{%- if tc.function %}
    {%- set tc = tc.function %}
{%- endif %}
{{ '\n<tool_call>' + tc.name }}
{% set _args = tc.arguments or {} %}
{% for k, v in _args.items() %}
<arg_key>{{ k }}</arg_key>
<arg_value>{{ v | tojson(ensure_ascii=False) if v is not string else v }}</arg_value>
{% endfor %}
</tool_call>{% endfor %}
{% endif %}
{%- elif m.role == 'tool' -%}
{%- if m.content is string -%}
{%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
    {{- '<|observation|>' }}
{%- endif %}
{{- '\n<tool_response>\n' }}
{{- m.content }}
{{- '\n</tool_response>' }}
{%- else -%}
<|observation|>{% for tr in m.content %}

<tool_response>
{{ tr.output if tr.output is defined else tr }}
</tool_response>{% endfor -%}
{% endif -%}
{%- elif m.role == 'system' -%}
<|system|>
{{ visible_text(m.content) }}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    <|assistant|>{{- '\n<think></think>' if (enable_thinking is defined and not enable_thinking) else '' -}}
{%- endif -%}
)tpl";

// GLM-4.6: [gMASK]<sop>, then <|system|> / <|user|> / <|assistant|> / <|observation|> turns
// with no newline after the content; every answer opens with its think block (empty unless it
// follows the last user turn), enable_thinking=false appends /nothink to user turns, tools are
// listed as JSON lines in a system block, calls as <tool_call>name / <arg_key> / <arg_value>.
TEST(PublishedTemplates, Glm46) {
  const ChatSetup s = JinjaSetup(kGlm46, "", "<|endoftext|>");
  const std::string turns =
      "[gMASK]<sop><|system|>\nYou are a helpful assistant.<|user|>\nHello<|assistant|>\n"
      "<think></think>\nHi there!<|user|>\nHow are you?";
  EXPECT_EQ(Chat(s, ThreeTurns(true), true), turns + "<|assistant|>");
  EXPECT_EQ(Chat(s, ThreeTurns(true), false), turns);
  EXPECT_EQ(Chat(s, ThreeTurns(false), true, /*thinking=*/false),
            "[gMASK]<sop><|user|>\nHello/nothink<|assistant|>\n<think></think>\nHi there!"
            "<|user|>\nHow are you?/nothink<|assistant|>\n<think></think>");
  EXPECT_EQ(Chat(s, {{"user", "2+2?"}, {"assistant", "<think>\nadd\n</think>\n\n4"}}, false),
            "[gMASK]<sop><|user|>\n2+2?<|assistant|>\n<think>add</think>\n4");

  Value call_msg = Msg("assistant", "");
  call_msg.Set("tool_calls",
               Value::MakeArray({Value::MakeObject(
                   {{"function", Value::MakeObject(
                                     {{"name", "get_weather"},
                                      {"arguments", Value::MakeObject({{"city", "Paris"}})}})}})}));
  const Value ctx = Value::MakeObject(
      {{"messages",
        Value::MakeArray({Msg("user", "Weather in Paris?"), call_msg, Msg("tool", "22C")})},
       {"tools", Value::MakeArray({WeatherTool()})},
       {"add_generation_prompt", true}});
  EXPECT_EQ(
      Rendered(kGlm46, ctx),
      "[gMASK]<sop><|system|>\n# Tools\n\nYou may call one or more functions to assist with "
      "the user query.\n\nYou are provided with function signatures within <tools></tools> "
      "XML tags:\n<tools>\n"
      "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": "
      "\"Get the weather\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": "
      "{\"type\": \"string\"}}, \"required\": [\"city\"]}}}\n"
      "</tools>\n\nFor each function call, output the function name and arguments within "
      "the following XML format:\n<tool_call>{function-name}\n<arg_key>{arg-key-1}</arg_key>\n"
      "<arg_value>{arg-value-1}</arg_value>\n<arg_key>{arg-key-2}</arg_key>\n"
      "<arg_value>{arg-value-2}</arg_value>\n...\n</tool_call>"
      "<|user|>\nWeather in Paris?<|assistant|>\n<think></think>\n<tool_call>get_weather\n"
      "<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>"
      "<|observation|>\n<tool_response>\n22C\n</tool_response><|assistant|>");
}

}  // namespace
}  // namespace lamina::chat
