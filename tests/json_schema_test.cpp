// JSON Schema → GBNF: the converted grammar accepts valid documents and refuses invalid ones;
// malformed schemas are errors naming their path; and on real models, generation under random
// schemas (objects, arrays, enums, nested, patterns) always ends in schema-valid JSON.
#include "json_schema.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <random>
#include <regex>

#include "engine/generate.h"
#include "model/model.h"
#include "runtime/generate.h"
#include "runtime/grammar.h"
#include "server/json_limits.h"
#include "tokenizer/unicode.h"

namespace lamina {
namespace {

using ojson = nlohmann::ordered_json;
using json = nlohmann::json;

std::shared_ptr<const Grammar> FromSchema(const ojson& schema) {
  Result<std::string> gbnf = cli::JsonSchemaToGbnf(schema);
  EXPECT_TRUE(gbnf.ok()) << schema.dump() << "\n" << (gbnf.ok() ? "" : gbnf.error().message);
  if (!gbnf.ok()) return nullptr;
  Result<std::shared_ptr<const Grammar>> g = Grammar::Parse(*gbnf);
  EXPECT_TRUE(g.ok()) << *gbnf << "\n" << (g.ok() ? "" : g.error().message);
  return g.ok() ? *g : nullptr;
}

bool Matches(const std::shared_ptr<const Grammar>& g, const std::string& text) {
  GrammarMatcher m(g);
  return m.AcceptBytes(text) && m.CanEnd();
}

// A validator for the subset the converter supports (the reference the tests check against).
bool Valid(const json& v, const ojson& s, const ojson& root, std::string* why) {
  auto fail = [&](const std::string& w) {
    *why = w + " (value " + v.dump() + ", schema " + s.dump() + ")";
    return false;
  };
  if (s.is_boolean()) return s.get<bool>() || fail("false schema");
  if (s.contains("$ref")) {
    const std::string ref = s["$ref"];
    return Valid(v, root.at(ojson::json_pointer(ref.substr(1))), root, why);
  }
  if (s.contains("const")) return json::parse(s["const"].dump()) == v || fail("const");
  if (s.contains("enum")) {
    for (const auto& e : s["enum"]) {
      if (json::parse(e.dump()) == v) return true;
    }
    return fail("enum");
  }
  if (s.contains("anyOf")) {
    for (const auto& sub : s["anyOf"]) {
      std::string w;
      if (Valid(v, sub, root, &w)) return true;
    }
    return fail("anyOf");
  }
  if (!s.contains("type")) return true;
  const std::string type = s["type"];
  if (type == "null") return v.is_null() || fail("null");
  if (type == "boolean") return v.is_boolean() || fail("boolean");
  if (type == "integer") return v.is_number_integer() || fail("integer");
  if (type == "number") return v.is_number() || fail("number");
  if (type == "string") {
    if (!v.is_string()) return fail("string");
    const std::string str = v.get<std::string>();
    const size_t n = unicode::Decode(str).size();
    if (s.contains("minLength") && n < s["minLength"].get<size_t>()) return fail("minLength");
    if (s.contains("maxLength") && n > s["maxLength"].get<size_t>()) return fail("maxLength");
    if (s.contains("pattern") &&
        !std::regex_match(str, std::regex(s["pattern"].get<std::string>()))) {
      return fail("pattern");
    }
    return true;
  }
  if (type == "array") {
    if (!v.is_array()) return fail("array");
    if (s.contains("minItems") && v.size() < s["minItems"].get<size_t>()) return fail("minItems");
    if (s.contains("maxItems") && v.size() > s["maxItems"].get<size_t>()) return fail("maxItems");
    if (s.contains("items")) {
      for (const auto& item : v) {
        if (!Valid(item, s["items"], root, why)) return false;
      }
    }
    return true;
  }
  if (type == "object") {
    if (!v.is_object()) return fail("object");
    const ojson props = s.value("properties", ojson::object());
    for (const auto& r : s.value("required", ojson::array())) {
      if (!v.contains(r.get<std::string>())) return fail("required " + r.dump());
    }
    for (const auto& [k, sub] : v.items()) {
      if (props.contains(k)) {
        if (!Valid(sub, props[k], root, why)) return false;
      } else if (!props.empty() && !s.value("additionalProperties", false)) {
        return fail("additional property " + k);
      }
    }
    return true;
  }
  return fail("unknown type");
}

TEST(JsonSchema, AcceptsValidAndRefusesInvalidDocuments) {
  const ojson person = ojson::parse(R"({
    "type": "object",
    "properties": {
      "name": {"type": "string", "minLength": 1, "maxLength": 8},
      "age": {"type": "integer"},
      "tags": {"type": "array", "items": {"enum": ["a", "b", 3]}, "minItems": 1, "maxItems": 2},
      "email": {"type": "string", "pattern": "^[a-z]+@[a-z]+\\.(com|org)$"},
      "nick": {"type": ["string", "null"]}
    },
    "required": ["name", "tags"]
  })");
  auto g = FromSchema(person);
  ASSERT_TRUE(g);
  EXPECT_TRUE(Matches(g, R"({"name": "Ann", "age": 31, "tags": ["a", 3]})"));
  EXPECT_TRUE(Matches(g, R"({"name":"Bo","tags":["b"],"email":"bo@x.org","nick":null})"));
  EXPECT_TRUE(Matches(g, "{\n  \"name\": \"Ann\",\n  \"tags\": [\"a\"]\n}"));
  EXPECT_FALSE(Matches(g, R"({"tags": ["a"]})"));                         // name required
  EXPECT_FALSE(Matches(g, R"({"name": "", "tags": ["a"]})"));             // minLength
  EXPECT_FALSE(Matches(g, R"({"name": "Ann", "tags": []})"));             // minItems
  EXPECT_FALSE(Matches(g, R"({"name": "Ann", "tags": ["a", "b", 3]})"));  // maxItems
  EXPECT_FALSE(Matches(g, R"({"name": "Ann", "tags": ["c"]})"));          // enum
  EXPECT_FALSE(Matches(g, R"({"name": "Ann", "tags": ["a"], "x": 1})"));  // additional
  EXPECT_FALSE(Matches(g, R"({"name": "Ann", "tags": ["a"], "email": "a@b.net"})"));
  EXPECT_FALSE(Matches(g, R"({"tags": ["a"], "name": "Ann"})"));  // the schema's order
  EXPECT_FALSE(Matches(g, R"({"name": "Ann", "age": 1.5, "tags": ["a"]})"));

  auto any = FromSchema(ojson::object());
  EXPECT_TRUE(Matches(any, R"([1, "x", {"a": null}])"));
  EXPECT_TRUE(Matches(any, "true"));
  auto tree = FromSchema(ojson::parse(R"({
    "$defs": {"node": {"type": "object", "properties": {
      "v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
      "required": ["v"]}},
    "$ref": "#/$defs/node"})"));
  EXPECT_TRUE(Matches(tree, R"({"v": 1, "kids": [{"v": 2}, {"v": 3, "kids": []}]})"));
  EXPECT_FALSE(Matches(tree, R"({"v": 1, "kids": [{"w": 2}]})"));
  auto dates = FromSchema(ojson::parse(
      R"({"type":"array","prefixItems":[{"type":"string","format":"date"},{"format":"uuid"}]})"));
  EXPECT_TRUE(Matches(dates, R"(["2026-12-03", "123e4567-e89b-12d3-a456-426614174000"])"));
  EXPECT_FALSE(Matches(dates, R"(["2026-13-03", "123e4567-e89b-12d3-a456-426614174000"])"));
  auto open =
      FromSchema(ojson::parse(R"({"type":"object","additionalProperties":{"type":"number"}})"));
  EXPECT_TRUE(Matches(open, R"({"x": 1, "y": 2.5})"));
  EXPECT_FALSE(Matches(open, R"({"x": "1"})"));
  auto quoted = FromSchema(ojson::parse(R"({"type":"string","pattern":"^a\"[^x]\\d{2}$"})"));
  EXPECT_TRUE(Matches(quoted, R"("a\"y12")"));
  EXPECT_FALSE(Matches(quoted, R"("a\"x12")"));
}

TEST(JsonSchema, MalformedSchemasNameTheirPath) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"type": "widget"})", "json_schema at /type: unsupported type \"widget\""},
      {R"({"type": "object", "properties": {"a": {"type": 7}}})", "/properties/a/type"},
      {R"({"type": "array", "minItems": -1})", "/minItems"},
      {R"({"type": "array", "minItems": 3, "maxItems": 2})", "maxItems < minItems"},
      {R"({"enum": []})", "/enum"},
      {R"({"$ref": "#/$defs/missing"})", "points nowhere"},
      {R"({"$ref": "http://x/y"})", "only local $ref"},
      {R"j({"type": "string", "pattern": "(?=a)"})j", "/pattern"},
      {R"({"type": "object", "required": ["b"], "properties": {"a": {}}})", "\"b\" is required"},
      {R"({"allOf": [{}, {}]})", "allOf"},
      {R"(false)", "allows nothing"},
  };
  for (const auto& [text, want] : cases) {
    Result<std::string> g = cli::JsonSchemaToGbnf(ojson::parse(text));
    ASSERT_FALSE(g.ok()) << text;
    EXPECT_NE(g.error().message.find(want), std::string::npos)
        << text << "\n got: " << g.error().message;
  }
}

std::string Repeat(std::string_view s, size_t n) {
  std::string out;
  out.reserve(s.size() * n);
  for (size_t i = 0; i < n; ++i) out += s;
  return out;
}

// The converter's error for `schema` (empty when it converts).
std::string SchemaError(const ojson& schema) {
  Result<std::string> g = cli::JsonSchemaToGbnf(schema);
  return g.ok() ? "" : g.error().message;
}

// Deep nesting of every kind is an error naming the pointer and the limit, never a stack
// overflow; just under each limit the schema still converts to a grammar that parses.
TEST(JsonSchema, DeepPatternsAreErrorsNotCrashes) {
  auto pattern = [](const std::string& re) {
    return ojson{{"type", "object"},
                 {"properties", {{"a", {{"type", "string"}, {"pattern", re}}}}}};
  };
  // 100,000 parentheses: refused by length before anything recurses.
  std::string e = SchemaError(pattern(Repeat("(", 100000) + "a" + Repeat(")", 100000)));
  EXPECT_NE(e.find("json_schema at /properties/a/pattern: the pattern is 200001 bytes, over the "
                   "limit of 16384"),
            std::string::npos)
      << e;
  // Short enough, but nested past the limit (also unclosed ones).
  for (const std::string& re : {Repeat("(", 5000) + "a" + Repeat(")", 5000), Repeat("(?:", 65),
                                Repeat("(a|", 65) + Repeat(")", 65)}) {
    e = SchemaError(pattern(re));
    EXPECT_NE(e.find("json_schema at /properties/a/pattern: the pattern nests groups deeper "
                     "than 64 at offset "),
              std::string::npos)
        << e;
  }
  // 64 groups, each with alternation and a quantifier: converts, parses and matches.
  const std::string at_limit = Repeat("(x|", 64) + "a" + Repeat(")+", 64);
  auto g = FromSchema(pattern(at_limit));
  ASSERT_NE(g, nullptr);
  EXPECT_TRUE(Matches(g, R"({"a": "aaa"})"));
  EXPECT_TRUE(Matches(g, R"({"a": "xax"})"));
  EXPECT_FALSE(Matches(g, R"({"a": "ab"})"));
  // Repetitions: counts over the grammar's limit, and totals over its element cap.
  e = SchemaError(pattern("a{10001}"));
  EXPECT_NE(e.find("/properties/a/pattern: repetition count over the limit of 10000"),
            std::string::npos)
      << e;
  e = SchemaError(pattern("a{99999999999999999999}"));
  EXPECT_NE(e.find("repetition count over the limit"), std::string::npos) << e;
  e = SchemaError(pattern(Repeat("(a{10000}){10000}", 60)));
  EXPECT_NE(e.find("the pattern's repetitions expand to over 1048576 grammar elements"),
            std::string::npos)
      << e;
  e = SchemaError(pattern("a{1000}{1000}"));
  EXPECT_NE(e.find("nothing to repeat"), std::string::npos) << e;
  for (const char* bad : {"a{,3}", "a{1,2,3}", "a{3,1}", "a{x}"}) {
    EXPECT_NE(SchemaError(pattern(bad)).find("/properties/a/pattern"), std::string::npos) << bad;
  }
  // Nested repetitions add (each group is one rule), so they stay within the cap.
  g = FromSchema(pattern("((a{100}){100}){100}"));
  ASSERT_NE(g, nullptr);
  EXPECT_FALSE(Matches(g, R"({"a": "aaa"})"));
}

TEST(JsonSchema, DeepSchemasAreErrorsNotCrashes) {
  // const / enum values nested 100,000 deep: refused before anything dumps or copies them.
  const ojson deep_array = ojson::parse(Repeat("[", 100000) + Repeat("]", 100000));
  for (const char* key : {"const", "enum"}) {
    ojson schema = {{"type", "object"}, {"properties", {{"a", ojson::object()}}}};
    schema["properties"]["a"][key] = deep_array;
    const std::string e = SchemaError(schema);
    EXPECT_EQ(e, "json_schema at /: the schema nests deeper than 128 levels of JSON") << key;
  }
  // Schema levels: items, properties, anyOf, additionalProperties, prefixItems, allOf, type
  // lists and $ref chains, each 100,000 deep (JSON past its limit) and 65 deep (schema levels
  // past theirs, JSON within).
  struct Kind {
    std::string open, close;
  };
  const std::vector<Kind> kinds = {
      {R"({"items":)", "}"},         {R"({"properties":{"p":)", "}}"},
      {R"({"anyOf":[)", "]}"},       {R"({"additionalProperties":)", "}"},
      {R"({"prefixItems":[)", "]}"}, {R"({"allOf":[)", "]}"},
  };
  for (const Kind& k : kinds) {
    const ojson deep = ojson::parse(Repeat(k.open, 100000) + "{}" + Repeat(k.close, 100000));
    EXPECT_EQ(SchemaError(deep),
              "json_schema at /: the schema nests deeper than 128 levels of JSON")
        << k.open;
    // (Kinds taking two JSON levels per schema level reach the JSON limit first.)
    const ojson over = ojson::parse(Repeat(k.open, 65) + "{}" + Repeat(k.close, 65));
    std::string e = SchemaError(over);
    EXPECT_NE(e.find(k.close.size() == 1 ? "the schema nests deeper than 64 levels"
                                         : "the schema nests deeper than 128 levels of JSON"),
              std::string::npos)
        << k.open << " " << e;
    const ojson under = ojson::parse(Repeat(k.open, 40) + "{}" + Repeat(k.close, 40));
    EXPECT_NE(FromSchema(under), nullptr) << k.open;
  }
  // A chain of 2,000 $refs (each definition shallow, the chain long).
  ojson defs = ojson::object();
  for (int i = 0; i < 2000; ++i) {
    defs["d" + std::to_string(i)] = {{"$ref", "#/$defs/d" + std::to_string(i + 1)}};
  }
  defs["d2000"] = {{"type", "integer"}};
  ojson chain = {{"$defs", defs}, {"$ref", "#/$defs/d0"}};
  std::string e = SchemaError(chain);
  EXPECT_NE(e.find("json_schema at /$defs/d64: the schema nests deeper than 64 levels"),
            std::string::npos)
      << e;
  chain["$ref"] = "#/$defs/d1950";
  auto g = FromSchema(chain);
  ASSERT_NE(g, nullptr);
  EXPECT_TRUE(Matches(g, "42"));
  // Nested type lists visit the schema once per listed type: no copies, distinct types only.
  e = SchemaError(ojson::parse(R"({"type":["string","string"]})"));
  EXPECT_NE(e.find("json_schema at /type/1: repeats a type"), std::string::npos) << e;
  ojson typed = ojson::parse(R"({"type":["integer","null"]})");
  for (int i = 0; i < 30; ++i) typed = {{"type", {"object", "array", "null"}}, {"items", typed}};
  g = FromSchema(typed);
  ASSERT_NE(g, nullptr);
  EXPECT_TRUE(Matches(g, "[[null, [[]]], {}]"));
  EXPECT_FALSE(Matches(g, "[[\"x\"]]"));
  g = FromSchema(ojson::parse(
      R"({"type":["object","array","null"],"properties":{"a":{"type":["integer","string"]}},"items":{"type":"boolean"}})"));
  ASSERT_NE(g, nullptr);
  EXPECT_TRUE(Matches(g, R"({"a": 1})"));
  EXPECT_TRUE(Matches(g, R"({"a": "x"})"));
  EXPECT_TRUE(Matches(g, "[true, false]"));
  EXPECT_TRUE(Matches(g, "null"));
  EXPECT_FALSE(Matches(g, "[1]"));
  // Long property names do not make every rule long: 256 properties of 4 KiB names end in a
  // bounded grammar or the size error, quickly.
  ojson wide = {{"type", "object"}, {"properties", ojson::object()}};
  for (int i = 0; i < 256; ++i) {
    wide["properties"][std::to_string(i) + std::string(4096, 'k')] = {{"type", "integer"}};
  }
  Result<std::string> w = cli::JsonSchemaToGbnf(wide);
  if (w.ok()) {
    EXPECT_LE(w->size(), kMaxGrammarBytes);
  } else {
    EXPECT_NE(w.error().message.find("a grammar of over 1048576 bytes"), std::string::npos)
        << w.error().message;
  }
}

// The bounded parser: the same values as json::parse, and deep or malformed text refused with
// a message naming the limit.
TEST(JsonLimits, ParseJsonBoundedRefusesDeepText) {
  std::string error;
  json out;
  ASSERT_TRUE(cli::ParseJsonBounded(R"({"a": [1, {"b": null}], "c": "x"})", cli::kMaxJsonDepth,
                                    &out, &error))
      << error;
  EXPECT_EQ(out, json::parse(R"({"a": [1, {"b": null}], "c": "x"})"));
  for (const auto& [open, close] :
       std::vector<std::pair<std::string, std::string>>{{"[", "]"}, {R"({"a":)", "}"}}) {
    for (size_t n : {size_t{100000}, size_t{129}}) {
      ojson o;
      EXPECT_FALSE(cli::ParseJsonBounded(Repeat(open, n) + Repeat(close, n), cli::kMaxJsonDepth, &o,
                                         &error));
      EXPECT_EQ(error, "the request body nests deeper than 128 levels");
      EXPECT_TRUE(o.is_null());
    }
    // Unclosed: refused at the first level too deep, before the end is read.
    ojson o;
    EXPECT_FALSE(cli::ParseJsonBounded(Repeat(open, 100000), cli::kMaxJsonDepth, &o, &error));
    EXPECT_EQ(error, "the request body nests deeper than 128 levels");
    ASSERT_TRUE(cli::ParseJsonBounded(Repeat(open, 128) + "1" + Repeat(close, 128),
                                      cli::kMaxJsonDepth, &o, &error))
        << error;
    EXPECT_TRUE(cli::JsonDepthWithin(o, 128));
    EXPECT_FALSE(cli::JsonDepthWithin(o, 127));
    EXPECT_EQ(o.dump().size(), 128 * (open.size() + close.size()) + 1);
  }
  EXPECT_FALSE(cli::ParseJsonBounded("{\"a\": [1,}", 8, &out, &error, "the JSON schema"));
  EXPECT_EQ(error.rfind("the JSON schema is not valid JSON: ", 0), 0u) << error;
  EXPECT_FALSE(cli::ParseJsonBounded("", 8, &out, &error));
  EXPECT_EQ(error.rfind("the request body is not valid JSON", 0), 0u) << error;
  EXPECT_TRUE(cli::JsonDepthWithin(json(5), 0));
  EXPECT_FALSE(cli::JsonDepthWithin(json::array(), 0));
}

// Random schemas in which every sentence is bounded (strings and arrays have maxima), so a
// constrained generation always ends.
ojson RandomSchema(std::mt19937& rng, int depth) {
  auto pick = [&](int n) { return static_cast<int>(rng() % n); };
  const int kind = depth >= 2 ? 3 + pick(6) : pick(9);
  switch (kind) {
    case 0:
    case 1: {
      ojson props = ojson::object();
      ojson required = ojson::array();
      const int n = 1 + pick(3);
      static const char* kNames[] = {"id", "name", "items", "ok", "score", "kind", "tags"};
      for (int i = 0; i < n; ++i) {
        const std::string key = kNames[(i * 3 + pick(3)) % 7];
        if (props.contains(key)) continue;
        props[key] = RandomSchema(rng, depth + 1);
        if (pick(2)) required.push_back(key);
      }
      return {{"type", "object"}, {"properties", props}, {"required", required}};
    }
    case 2: {
      const int min = pick(3);
      return {{"type", "array"},
              {"items", RandomSchema(rng, depth + 1)},
              {"minItems", min},
              {"maxItems", min + pick(3)}};
    }
    case 3:
      return {{"enum", {"red", "green", "blue", 7, nullptr}}};
    case 4:
      return {{"type", "string"}, {"maxLength", 1 + pick(6)}};
    case 5:
      return {{"type", "integer"}};
    case 6:
      return {{"type", "boolean"}};
    case 7: {
      static const char* kPatterns[] = {"^[A-Z][a-z]{1,5}$", "^\\d{3}-\\d{4}$", "^(yes|no)$",
                                        "^[a-f0-9]{4}$"};
      return {{"type", "string"}, {"pattern", kPatterns[pick(4)]}};
    }
    default:
      return {{"anyOf", {{{"type", "number"}}, {{"type", "null"}}}}};
  }
}

class JsonSchemaModel : public testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(GetParam())) GTEST_SKIP() << GetParam() << " is absent";
    Result<std::unique_ptr<Model>> m = LoadModel(GetParam());
    ASSERT_TRUE(m.ok()) << m.error().message;
    model_ = std::move(*m);
  }
  std::unique_ptr<Model> model_;
  ThreadPool pool_{2};
};

// 100 random schemas per model, greedy and sampled: every output is valid JSON of its schema.
TEST_P(JsonSchemaModel, RandomSchemasAlwaysGiveValidJson) {
  std::mt19937 rng(20261203);
  const Tokenizer& tok = model_->tokenizer();
  const std::vector<int32_t> prompt = tok.Encode("Write a JSON object:\n", true, false);
  SessionConfig sc;
  sc.n_ctx = 1536;
  Session session(*model_, sc, pool_);
  for (int i = 0; i < 100; ++i) {
    const ojson schema = RandomSchema(rng, 0);
    auto g = FromSchema(schema);
    ASSERT_TRUE(g);
    GenerateOptions o;
    o.params.grammar = g;
    o.params.n_predict = 1200;
    o.params.sampler.temperature = i % 4 == 0 ? 0.0f : 0.8f;
    o.params.sampler.seed = i;
    Result<GenerateResult> r = engine::Generate(session, 0, prompt, o);
    ASSERT_TRUE(r.ok()) << r.error().message;
    ASSERT_EQ(r->reason, StopReason::kEos) << schema.dump() << "\n" << r->text;
    json doc;
    try {
      doc = json::parse(r->text);
    } catch (const json::exception& e) {
      FAIL() << "not JSON: " << r->text << "\nschema " << schema.dump();
    }
    std::string why;
    EXPECT_TRUE(Valid(doc, schema, schema, &why)) << why << "\ntext " << r->text;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Models, JsonSchemaModel,
    testing::Values(std::string(LAMINA_SOURCE_DIR) + "/models/lamina-counter.gguf",
                    std::string(LAMINA_SHARED_DIR) + "/models/stories260K.gguf"),
    [](const testing::TestParamInfo<std::string>& info) {
      return info.index == 0 ? std::string("shipped") : std::string("stories260K");
    });

}  // namespace
}  // namespace lamina
