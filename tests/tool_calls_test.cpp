// Tool calling below the HTTP edge: the parser of generated text (chat/tool_calls: Hermes /
// Qwen tags, Llama-3 bare JSON, Mistral [TOOL_CALLS], malformed calls left as content, the
// streaming hold-back) and the rendering of tools, assistant tool calls and tool turns through
// the built-in ChatML and Qwen3 formats and a Jinja template (the same text both ways).
#include "chat/tool_calls.h"

#include <gtest/gtest.h>

#include "chat/chat_template.h"
#include "chat/jinja.h"

namespace lamina::chat {
namespace {

TEST(ToolCallParse, HermesOneCall) {
  auto p = ParseToolCalls(
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
      "</tool_call>");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].name, "get_weather");
  EXPECT_EQ(p.calls[0].arguments, "{\"city\": \"Paris\"}");
  EXPECT_EQ(p.content, "");
}

TEST(ToolCallParse, HermesSeveralCallsWithContentAround) {
  auto p = ParseToolCalls(
      "Let me look.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n"
      "<tool_call>{\"arguments\": {\"x\": [1, 2, {\"y\": null}]}, \"name\": \"b\"}</tool_call>"
      " done");
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[0].name, "a");
  EXPECT_EQ(p.calls[0].arguments, "{}");
  EXPECT_EQ(p.calls[1].name, "b");
  EXPECT_EQ(p.calls[1].arguments, "{\"x\": [1, 2, {\"y\": null}]}");
  EXPECT_EQ(p.content, "Let me look.\n\n done");
}

TEST(ToolCallParse, ArgumentsAsStringParametersKeyAndEscapes) {
  auto p = ParseToolCalls(
      "<tool_call>{\"name\": \"f\\u00e9\", \"arguments\": \"{\\\"q\\\": \\\"a\\\\nb\\\"}\"}"
      "</tool_call>");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].name, "f\xC3\xA9");
  EXPECT_EQ(p.calls[0].arguments, "{\"q\": \"a\\nb\"}");
  p = ParseToolCalls("<tool_call>{\"name\": \"g\", \"parameters\": {\"n\": -1.5e3}}</tool_call>");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].arguments, "{\"n\": -1.5e3}");
  // No arguments at all: an empty object.
  p = ParseToolCalls("<tool_call>{\"name\": \"h\"}</tool_call>");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].arguments, "{}");
  // The closing tag cut off by the end of the output still counts.
  p = ParseToolCalls("<tool_call>\n{\"name\": \"h\", \"arguments\": {}}\n");
  ASSERT_EQ(p.calls.size(), 1u);
}

TEST(ToolCallParse, MalformedCallsStayContent) {
  for (const char* text : {
           "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": }}</tool_call>",  // bad JSON
           "<tool_call>{\"name\": \"f\", \"arguments\": {}</tool_call>",          // unclosed
           "<tool_call>{\"arguments\": {}}</tool_call>",                          // no name
           "<tool_call>{\"name\": 3, \"arguments\": {}}</tool_call>",             // name type
           "<tool_call>{\"name\": \"f\", \"arguments\": 7}</tool_call>",          // args type
           "<tool_call>{\"name\": \"f\", \"arguments\": \"not json\"}</tool_call>",
           "<tool_call>{\"name\": \"f\"} trailing</tool_call>", "<tool_call>",
           "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {}},]",
           "{\"name\": \"f\", \"arguments\": {}} and more",
           "{\"name\": \"f\", \"arguments\": {\"s\": \"\x01\"}}",  // raw control character
       }) {
    auto p = ParseToolCalls(text, {"f"});
    EXPECT_TRUE(p.calls.empty()) << text;
    EXPECT_EQ(p.content, text);
  }
  // One good call beside a malformed one: the good one is taken, the bad one stays content.
  auto p = ParseToolCalls(
      "<tool_call>{bad}</tool_call><tool_call>{\"name\": \"ok\", \"arguments\": {}}</tool_call>");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].name, "ok");
  EXPECT_EQ(p.content, "<tool_call>{bad}</tool_call>");
  // Nesting past the cap is malformed, not a crash.
  std::string deep = "<tool_call>{\"name\": \"f\", \"arguments\": ";
  for (int i = 0; i < 10000; ++i) deep += "[";
  EXPECT_TRUE(ParseToolCalls(deep).calls.empty());
}

TEST(ToolCallParse, Llama3BareJsonNeedsAnOfferedName) {
  const std::string text = "  {\"name\": \"get_time\", \"parameters\": {\"zone\": \"UTC\"}}\n";
  auto p = ParseToolCalls(text, {"get_time", "other"});
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].name, "get_time");
  EXPECT_EQ(p.calls[0].arguments, "{\"zone\": \"UTC\"}");
  EXPECT_EQ(p.content, "");
  // A JSON answer naming no offered tool is content.
  p = ParseToolCalls(text, {"other"});
  EXPECT_TRUE(p.calls.empty());
  EXPECT_EQ(p.content, text);
  // <|python_tag|> before the object.
  p = ParseToolCalls("<|python_tag|>{\"name\": \"get_time\", \"parameters\": {}}", {"get_time"});
  ASSERT_EQ(p.calls.size(), 1u);
}

TEST(ToolCallParse, MistralToolCallsArray) {
  auto p = ParseToolCalls(
      "[TOOL_CALLS] [{\"name\": \"a\", \"arguments\": {\"x\": 1}}, {\"name\": \"b\", "
      "\"arguments\": {}, \"id\": \"abc123def\"}]");
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[0].name, "a");
  EXPECT_EQ(p.calls[0].arguments, "{\"x\": 1}");
  EXPECT_EQ(p.calls[1].name, "b");
  EXPECT_EQ(p.content, "");
}

TEST(ToolCallParse, StreamingHoldBack) {
  EXPECT_EQ(ToolCallSafePrefix("Hello"), 5u);
  EXPECT_EQ(ToolCallSafePrefix("Hello <"), 6u);
  EXPECT_EQ(ToolCallSafePrefix("Hello <tool_ca"), 6u);
  EXPECT_EQ(ToolCallSafePrefix("Hello <tool_call>{\"na"), 6u);
  EXPECT_EQ(ToolCallSafePrefix("Hello <b>"), 9u);  // not an opener
  EXPECT_EQ(ToolCallSafePrefix("x [TOOL_CALLS]"), 2u);
  EXPECT_EQ(ToolCallSafePrefix("x [TOOL"), 2u);
  // Blank, or starting like a bare JSON call: nothing yet.
  EXPECT_EQ(ToolCallSafePrefix(""), 0u);
  EXPECT_EQ(ToolCallSafePrefix(" \n"), 0u);
  EXPECT_EQ(ToolCallSafePrefix("\n{\"name\""), 0u);
  EXPECT_EQ(ToolCallSafePrefix("<|python"), 0u);
  EXPECT_EQ(ToolCallSafePrefix("<tool_call>"), 0u);
  // What was safe stays safe as text grows.
  const std::string text = "Sure, one moment. <tool_call>\n{\"name\": \"f\"}\n</tool_call>";
  size_t last = 0;
  for (size_t n = 0; n <= text.size(); ++n) {
    const size_t safe = ToolCallSafePrefix(std::string_view(text).substr(0, n));
    EXPECT_GE(safe, last) << n;
    EXPECT_LE(safe, 18u) << n;
    last = safe;
  }
}

TEST(ToolCallParse, IsJson) {
  EXPECT_TRUE(IsJson(" {\"a\": [1, true, null, \"x\"]} "));
  EXPECT_TRUE(IsJson("0"));
  EXPECT_FALSE(IsJson("01"));
  EXPECT_FALSE(IsJson("{\"a\": 1,}"));
  EXPECT_FALSE(IsJson("{} {}"));
  EXPECT_FALSE(IsJson("\"\\x\""));
}

// Rendering. A Qwen2.5-style template: the published layout of tools, tool calls (arguments
// through tojson) and tool responses.
constexpr std::string_view kQwen25Style = R"({%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
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
{%- endif %}
)";

ChatTools WeatherTools() {
  using jinja::Value;
  const Value params = Value::MakeObject(
      {{"type", "object"},
       {"properties", Value::MakeObject({{"city", Value::MakeObject({{"type", "string"}})}})},
       {"required", Value::MakeArray({"city"})}});
  return Value::MakeArray(
      {Value::MakeObject({{"type", "function"},
                          {"function", Value::MakeObject({{"name", "get_weather"},
                                                          {"description", "Weather of a city"},
                                                          {"parameters", params}})}})});
}

std::vector<ChatMessage> ToolConversation(bool system) {
  std::vector<ChatMessage> m;
  if (system) m.emplace_back("system", "Be brief.");
  m.emplace_back("user", "Weather in Paris and Oslo?");
  ChatMessage call("assistant", "");
  call.content_null = true;
  call.tool_calls.push_back(
      {"call_1", "get_weather", jinja::Value::MakeObject({{"city", jinja::Value("Paris")}})});
  call.tool_calls.push_back(
      {"call_2", "get_weather", jinja::Value::MakeObject({{"city", jinja::Value("Oslo")}})});
  m.push_back(call);
  ChatMessage r1("tool", "{\"temp\": 21}");
  r1.tool_call_id = "call_1";
  ChatMessage r2("tool", "{\"temp\": 8}");
  r2.tool_call_id = "call_2";
  m.push_back(r1);
  m.push_back(r2);
  return m;
}

const std::string kToolsSystem =
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": "
    "\"Weather of a city\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": "
    "{\"type\": \"string\"}}, \"required\": [\"city\"]}}}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, "
    "\"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n";

const std::string kToolTurns =
    "<|im_start|>user\nWeather in Paris and Oslo?<|im_end|>\n"
    "<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
    "\"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
    "{\"city\": \"Oslo\"}}\n</tool_call><|im_end|>\n"
    "<|im_start|>user\n<tool_response>\n{\"temp\": 21}\n</tool_response>\n<tool_response>\n"
    "{\"temp\": 8}\n</tool_response><|im_end|>\n<|im_start|>assistant\n";

TEST(ToolRendering, ChatMLBuiltinWritesQwen25Layout) {
  const std::string sys = "You are a helpful assistant.";
  EXPECT_EQ(
      RenderChat(ChatFormat::kChatML, ToolConversation(true), true, true, sys, WeatherTools()),
      "<|im_start|>system\nBe brief.\n\n" + kToolsSystem + kToolTurns);
  EXPECT_EQ(
      RenderChat(ChatFormat::kChatML, ToolConversation(false), true, true, sys, WeatherTools()),
      "<|im_start|>system\n" + sys + "\n\n" + kToolsSystem + kToolTurns);
  // No default system prompt: the tools section opens the system turn.
  EXPECT_EQ(
      RenderChat(ChatFormat::kChatML, ToolConversation(false), true, true, {}, WeatherTools()),
      "<|im_start|>system\n" + kToolsSystem + kToolTurns);
  // Without tools the earlier turns still render their calls and responses.
  EXPECT_EQ(RenderChat(ChatFormat::kChatML, ToolConversation(false), true, true, sys),
            "<|im_start|>system\n" + sys + "<|im_end|>\n" + kToolTurns);
}

TEST(ToolRendering, JinjaTemplateGetsToolsAndToolCalls) {
  Result<jinja::Template> t = jinja::Template::Parse(kQwen25Style);
  ASSERT_TRUE(t.ok()) << t.error().message;
  ChatSetup s;
  s.format = ChatFormat::kJinja;
  s.jinja = std::make_shared<const jinja::Template>(std::move(*t));
  const std::string sys = "You are a helpful assistant.";
  for (bool system : {false, true}) {
    for (bool tools : {false, true}) {
      const ChatTools given = tools ? WeatherTools() : ChatTools();
      Result<std::string> r = RenderChatJinja(s, ToolConversation(system), true, false, given);
      ASSERT_TRUE(r.ok()) << r.error().message;
      EXPECT_EQ(*r,
                RenderChat(ChatFormat::kChatML, ToolConversation(system), true, true, sys, given))
          << system << tools;
    }
  }
  // An assistant turn with text and a call whose arguments could not be read as an object.
  std::vector<ChatMessage> m = {{"user", "hi"}};
  ChatMessage a("assistant", "Checking.");
  a.tool_calls.push_back({"", "f", jinja::Value("not json")});
  m.push_back(a);
  Result<std::string> r = RenderChatJinja(s, m, false, false, WeatherTools());
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(*r, RenderChat(ChatFormat::kChatML, m, false, true, sys, WeatherTools()));
  EXPECT_NE(r->find("<|im_start|>assistant\nChecking.\n<tool_call>\n{\"name\": \"f\", "
                    "\"arguments\": \"not json\"}\n</tool_call><|im_end|>"),
            std::string::npos)
      << *r;
}

TEST(ToolRendering, Qwen3BuiltinWritesItsLayout) {
  const std::string out = RenderChat(ChatFormat::kQwen3, ToolConversation(true), true,
                                     /*enable_thinking=*/false, {}, WeatherTools());
  EXPECT_EQ(out, "<|im_start|>system\nBe brief.\n\n" + kToolsSystem +
                     "<|im_start|>user\nWeather in Paris and Oslo?<|im_end|>\n"
                     "<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", "
                     "\"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n"
                     "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n"
                     "</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n"
                     "{\"temp\": 21}\n</tool_response>\n<tool_response>\n{\"temp\": 8}\n"
                     "</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  // Qwen3 writes string arguments as they are (the last turn after the query keeps its think
  // block, as the template does).
  std::vector<ChatMessage> m = {{"user", "hi"}};
  ChatMessage a("assistant", "Sure.");
  a.tool_calls.push_back({"", "f", jinja::Value("{\"x\": 1}")});
  m.push_back(a);
  EXPECT_EQ(RenderChat(ChatFormat::kQwen3, m, false, true),
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
            "Sure.\n<tool_call>\n"
            "{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_call><|im_end|>\n");
}

}  // namespace
}  // namespace lamina::chat
