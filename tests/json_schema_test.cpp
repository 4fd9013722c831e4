// JSON Schema → GBNF: the converted grammar accepts valid documents and refuses invalid ones;
// malformed schemas are errors naming their path; and on real models, generation under random
// schemas (objects, arrays, enums, nested, patterns) always ends in schema-valid JSON.
#include "json_schema.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <random>
#include <regex>

#include "model/model.h"
#include "runtime/generate.h"
#include "runtime/grammar.h"
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
    Result<GenerateResult> r = Generate(session, 0, prompt, o);
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
