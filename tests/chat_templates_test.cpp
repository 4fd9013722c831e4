// Every built-in chat template against awkward tool definitions and tool calls: each renders or
// returns a clean error, and the text matches llama.cpp's Jinja engine on the same template and
// variables (tests/fixtures/golden/chat_templates.txt, written by
// tests/fixtures/tools/render_template.cpp from the contexts this test dumps).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "chat/chat_template.h"
#include "chat/harmony.h"
#include "chat/jinja.h"

namespace lamina::chat {
namespace {

using jinja::Value;
using Json = nlohmann::ordered_json;

constexpr int64_t kJuly26th2024 = 1721952000;

Value FromJson(const Json& j) {
  switch (j.type()) {
    case Json::value_t::null:
      return Value::None();
    case Json::value_t::boolean:
      return Value(j.get<bool>());
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
      return Value(j.get<int64_t>());
    case Json::value_t::number_float:
      return Value(j.get<double>());
    case Json::value_t::string:
      return Value(j.get<std::string>());
    case Json::value_t::array: {
      jinja::Array a;
      for (const Json& e : j) a.push_back(FromJson(e));
      return Value::MakeArray(std::move(a));
    }
    case Json::value_t::object: {
      jinja::Object o;
      for (const auto& [k, v] : j.items()) o.emplace_back(k, FromJson(v));
      return Value::MakeObject(std::move(o));
    }
    default:
      return Value();
  }
}

// One tool in OpenAI's shape around a `function` object given as JSON text.
Json Tool(const char* function) {
  return Json{{"type", "function"}, {"function", Json::parse(function)}};
}

constexpr const char* kWeather = R"({"name": "get_weather", "description": "Weather for a city",
  "parameters": {"type": "object", "properties": {"city": {"type": "string",
  "description": "City name"}, "days": {"type": "integer"}}, "required": ["city"]}})";

struct Case {
  std::string name;
  Json tools;  // an array, or null for none
  std::vector<ChatMessage> messages;
};

std::vector<ChatMessage> Ask() {
  return {{"system", "You are terse."}, {"user", "What is the weather in Paris?"}};
}

// A conversation with one tool call answered by a tool turn; the call's arguments as given.
std::vector<ChatMessage> Called(Value arguments, bool content_null) {
  std::vector<ChatMessage> m = Ask();
  ChatMessage call("assistant", "");
  call.content_null = content_null;
  call.tool_calls.push_back({"call_1", "get_weather", std::move(arguments)});
  m.push_back(std::move(call));
  ChatMessage result("tool", R"({"temp": 21})");
  result.tool_call_id = "call_1";
  result.name = "get_weather";
  m.push_back(std::move(result));
  return m;
}

std::vector<Case> Cases() {
  std::vector<Case> c;
  c.push_back({"plain", Json(), Ask()});
  c.push_back({"tool_no_description",
               Json::array({Tool(R"({"name": "get_time", "parameters": {"type": "object",
                 "properties": {"tz": {"type": "string"}}}})")}),
               Ask()});
  c.push_back(
      {"tool_no_parameters",
       Json::array({Tool(R"({"name": "ping", "description": "Checks the link"})"), Tool(kWeather)}),
       Ask()});
  c.push_back({"tool_empty_properties",
               Json::array({Tool(R"({"name": "now", "description": "The time",
                 "parameters": {"type": "object", "properties": {}}})")}),
               Ask()});
  c.push_back({"tool_nested_object",
               Json::array({Tool(R"({"name": "search", "description": "Finds things",
                 "parameters": {"type": "object", "properties": {"filter": {"type": "object",
                 "description": "Narrowing", "properties": {"from": {"type": "string"},
                 "to": {"type": "object", "properties": {"year": {"type": "integer"}}}}}},
                 "required": ["filter"]}})")}),
               Ask()});
  c.push_back({"tool_enum", Json::array({Tool(R"({"name": "convert", "description": "Units",
                 "parameters": {"type": "object", "properties": {"unit": {"type": "string",
                 "enum": ["celsius", "fahrenheit"], "default": "celsius"},
                 "digits": {"type": "integer", "default": 1}}}})")}),
               Ask()});
  c.push_back({"tool_arrays", Json::array({Tool(R"({"name": "tag", "description": "Tags items",
                 "parameters": {"type": "object", "properties": {"tags": {"type": "array",
                 "items": {"type": "string"}}, "ids": {"type": "array", "items":
                 {"type": "integer"}}, "rows": {"type": "array", "items": {"type": "object"}},
                 "any": {"type": "array"}}, "required": ["tags"]}})")}),
               Ask()});
  c.push_back({"tool_name_escaping", Json::array({Tool(R"({"name": "say \"hi\"\\ <|end|>\nbye ünï",
                 "description": "Quotes \"and\" \\ slashes\tand <|call|>",
                 "parameters": {"type": "object", "properties": {"a\"b": {"type": "string",
                 "description": "quoted \"key\""}}}})")}),
               Ask()});
  c.push_back({"call_args_object", Json::array({Tool(kWeather)}),
               Called(FromJson(Json::parse(R"({"city": "Paris", "days": 2})")), true)});
  c.push_back(
      {"call_args_string", Json::array({Tool(kWeather)}), Called(Value("city=Paris"), false)});
  return c;
}

ChatSetup BuiltinSetup(std::string_view name) {
  const std::string_view source = BuiltinJinjaTemplate(name);
  Result<jinja::Template> t = jinja::Template::Parse(source);
  EXPECT_TRUE(t.ok()) << name << ": " << (t.ok() ? "" : t.error().message);
  ChatSetup s;
  s.format = ChatFormat::kJinja;
  if (t.ok()) s.jinja = std::make_shared<const jinja::Template>(std::move(*t));
  s.harmony = IsHarmonyTemplate(source);
  s.bos_token = "<s>";
  s.eos_token = "</s>";
  s.render.now_unix = kJuly26th2024;
  return s;
}

Value Tools(const Case& c) { return c.tools.is_null() ? Value() : FromJson(c.tools); }

// strftime_now's date, which llama.cpp takes from the clock: one placeholder in both texts.
std::string NormalizeDate(std::string s) {
  static constexpr std::string_view kDate = "Current date: ";
  for (size_t at = s.find(kDate); at != std::string::npos; at = s.find(kDate, at + 1)) {
    s.replace(at + kDate.size(), std::min<size_t>(10, s.size() - at - kDate.size()), "DATE");
  }
  return s;
}

struct Golden {
  bool ok = false;
  std::string body;
};

// The records of chat_templates.txt: "=== <template>/<case> ok|error <bytes>\n<bytes>\n".
std::map<std::string, Golden> ReadGoldens(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string all = ss.str();
  std::map<std::string, Golden> out;
  size_t at = 0;
  while (at < all.size()) {
    const size_t eol = all.find('\n', at);
    if (eol == std::string::npos) break;
    std::istringstream header(all.substr(at, eol - at));
    std::string marker, label, kind;
    size_t bytes = 0;
    header >> marker >> label >> kind >> bytes;
    if (marker != "===" || eol + 1 + bytes > all.size()) {
      ADD_FAILURE() << "malformed golden record at byte " << at;
      break;
    }
    out[label] = Golden{kind == "ok", all.substr(eol + 1, bytes)};
    at = eol + 1 + bytes + 1;
  }
  return out;
}

TEST(ChatTemplates, RegistryListsEveryBuiltin) {
  const std::vector<std::string_view> names = BuiltinJinjaTemplateNames();
  ASSERT_FALSE(names.empty());
  for (std::string_view n : names) {
    EXPECT_FALSE(BuiltinJinjaTemplate(n).empty()) << n;
    EXPECT_NE(ChatTemplateNames().find(n), std::string::npos) << n;
  }
}

// Every built-in × every case: a text or an Error, never an exception or a crash.
TEST(ChatTemplates, EveryBuiltinRendersOrFailsCleanly) {
  for (std::string_view name : BuiltinJinjaTemplateNames()) {
    const ChatSetup setup = BuiltinSetup(name);
    ASSERT_NE(setup.jinja, nullptr) << name;
    for (const Case& c : Cases()) {
      SCOPED_TRACE(std::string(name) + "/" + c.name);
      try {
        Result<std::string> r = RenderChatJinja(setup, c.messages, true, std::nullopt, Tools(c));
        if (r.ok()) {
          EXPECT_FALSE(r->empty());
        } else {
          EXPECT_TRUE(r.error().message.starts_with("chat template: ")) << r.error().message;
        }
      } catch (...) {
        ADD_FAILURE() << "an exception escaped the render";
      }
    }
  }
}

// The native formats (chatml, qwen3, llama3: the other names --chat-template takes) with the same
// cases: a text, never an exception (RenderChatPrompt refuses tools for llama3 before this).
TEST(ChatTemplates, EveryNativeFormatRendersTheCases) {
  for (ChatFormat f : {ChatFormat::kChatML, ChatFormat::kQwen3, ChatFormat::kLlama3}) {
    for (const Case& c : Cases()) {
      SCOPED_TRACE(std::to_string(static_cast<int>(f)) + "/" + c.name);
      try {
        EXPECT_FALSE(RenderChat(f, c.messages, true, true, {}, Tools(c)).empty());
      } catch (...) {
        ADD_FAILURE() << "an exception escaped the render";
      }
    }
  }
}

// The native formats against llama.cpp's Jinja rendering of the official templates they follow
// (Qwen2.5-7B-Instruct's for chatml, Qwen3-0.6B's for qwen3; records native-chatml/CASE and
// native-qwen3/CASE of the golden file, from the same variables).
TEST(ChatTemplates, NativeFormatsMatchLlamaCppOnTheOfficialTemplates) {
  const std::map<std::string, Golden> goldens =
      ReadGoldens(std::string(LAMINA_SOURCE_DIR) + "/tests/fixtures/golden/chat_templates.txt");
  int compared = 0;
  for (const auto& [prefix, format] : {std::pair{"native-chatml", ChatFormat::kChatML},
                                       std::pair{"native-qwen3", ChatFormat::kQwen3}}) {
    for (const Case& c : Cases()) {
      const std::string label = std::string(prefix) + "/" + c.name;
      SCOPED_TRACE(label);
      const auto it = goldens.find(label);
      if (it == goldens.end()) {
        ADD_FAILURE() << "no golden: write them again (tests/fixtures/README.md)";
        continue;
      }
      if (!it->second.ok) continue;
      EXPECT_EQ(RenderChat(format, c.messages, true, true, {}, Tools(c)), it->second.body);
      ++compared;
    }
  }
  EXPECT_GT(compared, 0);
}

// gpt-oss's tools without a description (or parameters) render as harmony's own renderer
// writes them: no "// " comment line, "() => any" for no parameters.
TEST(ChatTemplates, GptOssToolWithoutDescription) {
  const ChatSetup setup = BuiltinSetup("gpt-oss");
  const Value tools = FromJson(Json::array(
      {Tool(R"({"name": "get_time"})"),
       Tool(R"({"name": "ping", "description": "", "parameters": {"type": "object"}})")}));
  Result<std::string> r = RenderChatJinja(setup, Ask(), true, std::nullopt, tools);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_NE(r->find("namespace functions {\n\ntype get_time = () => any;\n\n"
                    "type ping = () => any;\n\n} // namespace functions"),
            std::string::npos)
      << *r;
}

// The texts llama.cpp's Jinja engine renders from the same template and variables.
TEST(ChatTemplates, MatchLlamaCppJinja) {
  const std::map<std::string, Golden> goldens =
      ReadGoldens(std::string(LAMINA_SOURCE_DIR) + "/tests/fixtures/golden/chat_templates.txt");
  ASSERT_FALSE(goldens.empty());
  int compared = 0;
  for (std::string_view name : BuiltinJinjaTemplateNames()) {
    const ChatSetup setup = BuiltinSetup(name);
    for (const Case& c : Cases()) {
      const std::string label = std::string(name) + "/" + c.name;
      SCOPED_TRACE(label);
      const auto it = goldens.find(label);
      if (it == goldens.end()) {
        ADD_FAILURE() << "no golden: write them again (tests/fixtures/README.md)";
        continue;
      }
      Result<std::string> r = RenderChatJinja(setup, c.messages, true, std::nullopt, Tools(c));
      // Where llama.cpp refuses (a raise_exception, an operation on none, or its engine's own
      // limits: `spec['items']` reads the dict method there), lamina may render or refuse;
      // EveryBuiltinRendersOrFailsCleanly holds it to a clean Error.
      if (!it->second.ok) continue;
      if (!r.ok()) {
        ADD_FAILURE() << "llama.cpp renders it; lamina: " << r.error().message;
        continue;
      }
      EXPECT_EQ(NormalizeDate(*r), NormalizeDate(it->second.body));
      ++compared;
    }
  }
  EXPECT_GT(compared, 0);
}

// With LAMINA_DUMP_TEMPLATE_CASES=DIR: writes each built-in's source (NAME.jinja) and each
// case's variables (NAME__CASE.json) for render_template (tests/fixtures/README.md).
TEST(ChatTemplates, DumpForPeer) {
  const char* dir = std::getenv("LAMINA_DUMP_TEMPLATE_CASES");
  if (dir == nullptr) GTEST_SKIP() << "LAMINA_DUMP_TEMPLATE_CASES not set";
  std::filesystem::create_directories(dir);
  for (std::string_view name : BuiltinJinjaTemplateNames()) {
    const ChatSetup setup = BuiltinSetup(name);
    std::ofstream(std::string(dir) + "/" + std::string(name) + ".jinja", std::ios::binary)
        << BuiltinJinjaTemplate(name);
    for (const Case& c : Cases()) {
      const Value context = ChatJinjaContext(setup, c.messages, true, std::nullopt, Tools(c));
      std::ofstream(std::string(dir) + "/" + std::string(name) + "__" + c.name + ".json",
                    std::ios::binary)
          << jinja::ToJson(context);
    }
  }
}

}  // namespace
}  // namespace lamina::chat
