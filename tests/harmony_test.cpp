// gpt-oss's harmony chat format: the built-in "gpt-oss" template renders every conversation
// shape (system / developer instructions, user and assistant turns, reasoning, tools, tool calls
// and results) byte for byte as the published template does through lamina's Jinja engine, and
// the published one renders the documented layout; answers split into reasoning, content and
// tool calls, whole and streamed in any piece sizes.
#include "chat/harmony.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>

#include "chat/chat_template.h"
#include "chat/jinja.h"

namespace lamina::chat {
namespace {

using jinja::Value;

constexpr int64_t kJuly26th2024 = 1721952000;  // 2024-07-26 00:00:00 UTC

// openai/gpt-oss-120b (ggml-org/llama.cpp, models/templates/openai-gpt-oss-120b.jinja): the
// model's published chat template, test data.
constexpr std::string_view kPublished = R"tpl({#-
  In addition to the normal inputs of `messages` and `tools`, this template also accepts the
  following kwargs:
  - "builtin_tools": A list, can contain "browser" and/or "python".
  - "model_identity": A string that optionally describes the model identity.
  - "reasoning_effort": A string that describes the reasoning effort, defaults to "medium".
 #}

{#- Tool Definition Rendering ============================================== #}
{%- macro render_typescript_type(param_spec, required_params, is_nullable=false) -%}
    {%- if param_spec.type == "array" -%}
        {%- if param_spec['items'] -%}
            {%- if param_spec['items']['type'] == "string" -%}
                {{- "string[]" }}
            {%- elif param_spec['items']['type'] == "number" -%}
                {{- "number[]" }}
            {%- elif param_spec['items']['type'] == "integer" -%}
                {{- "number[]" }}
            {%- elif param_spec['items']['type'] == "boolean" -%}
                {{- "boolean[]" }}
            {%- else -%}
                {%- set inner_type = render_typescript_type(param_spec['items'], required_params) -%}
                {%- if inner_type == "object | object" or inner_type|length > 50 -%}
                    {{- "any[]" }}
                {%- else -%}
                    {{- inner_type + "[]" }}
                {%- endif -%}
            {%- endif -%}
            {%- if param_spec.nullable -%}
                {{- " | null" }}
            {%- endif -%}
        {%- else -%}
            {{- "any[]" }}
            {%- if param_spec.nullable -%}
                {{- " | null" }}
            {%- endif -%}
        {%- endif -%}
    {%- elif param_spec.type is defined and param_spec.type is iterable and param_spec.type is not string and param_spec.type is not mapping and param_spec.type[0] is defined -%}
        {#- Handle array of types like ["object", "object"] from Union[dict, list] #}
        {%- if param_spec.type | length > 1 -%}
            {{- param_spec.type | join(" | ") }}
        {%- else -%}
            {{- param_spec.type[0] }}
        {%- endif -%}
    {%- elif param_spec.oneOf -%}
        {#- Handle oneOf schemas - check for complex unions and fallback to any #}
        {%- set has_object_variants = false -%}
        {%- for variant in param_spec.oneOf -%}
            {%- if variant.type == "object" -%}
                {%- set has_object_variants = true -%}
            {%- endif -%}
        {%- endfor -%}
        {%- if has_object_variants and param_spec.oneOf|length > 1 -%}
            {{- "any" }}
        {%- else -%}
            {%- for variant in param_spec.oneOf -%}
                {{- render_typescript_type(variant, required_params) -}}
                {%- if variant.description %}
                    {{- "// " + variant.description }}
                {%- endif -%}
                {%- if variant.default is defined %}
                    {{ "// default: " + variant.default|tojson }}
                {%- endif -%}
                {%- if not loop.last %}
                    {{- " | " }}
                {% endif -%}
            {%- endfor -%}
        {%- endif -%}
    {%- elif param_spec.type == "string" -%}
        {%- if param_spec.enum -%}
            {{- '"' + param_spec.enum|join('" | "') + '"' -}}
        {%- else -%}
            {{- "string" }}
            {%- if param_spec.nullable %}
                {{- " | null" }}
            {%- endif -%}
        {%- endif -%}
    {%- elif param_spec.type == "number" -%}
        {{- "number" }}
    {%- elif param_spec.type == "integer" -%}
        {{- "number" }}
    {%- elif param_spec.type == "boolean" -%}
        {{- "boolean" }}

    {%- elif param_spec.type == "object" -%}
        {%- if param_spec.properties -%}
            {{- "{\n" }}
            {%- for prop_name, prop_spec in param_spec.properties.items() -%}
                {{- prop_name -}}
                {%- if prop_name not in (param_spec.required or []) -%}
                    {{- "?" }}
                {%- endif -%}
                {{- ": " }}
                {{ render_typescript_type(prop_spec, param_spec.required or []) }}
                {%- if not loop.last -%}
                    {{-", " }}
                {%- endif -%}
            {%- endfor -%}
            {{- "}" }}
        {%- else -%}
            {{- "object" }}
        {%- endif -%}
    {%- else -%}
        {{- "any" }}
    {%- endif -%}
{%- endmacro -%}

{%- macro render_tool_namespace(namespace_name, tools) -%}
    {{- "## " + namespace_name + "\n\n" }}
    {{- "namespace " + namespace_name + " {\n\n" }}
    {%- for tool in tools %}
        {%- set tool = tool.function %}
        {{- "// " + tool.description + "\n" }}
        {{- "type "+ tool.name + " = " }}
        {%- if tool.parameters and tool.parameters.properties %}
            {{- "(_: {\n" }}
            {%- for param_name, param_spec in tool.parameters.properties.items() %}
                {%- if param_spec.description %}
                    {{- "// " + param_spec.description + "\n" }}
                {%- endif %}
                {{- param_name }}
                {%- if param_name not in (tool.parameters.required or []) -%}
                    {{- "?" }}
                {%- endif -%}
                {{- ": " }}
                {{- render_typescript_type(param_spec, tool.parameters.required or []) }}
                {%- if param_spec.default is defined -%}
                    {%- if param_spec.enum %}
                        {{- ", // default: " + param_spec.default }}
                    {%- elif param_spec.oneOf %}
                        {{- "// default: " + param_spec.default }}
                    {%- else %}
                        {{- ", // default: " + param_spec.default|tojson }}
                    {%- endif -%}
                {%- endif -%}
                {%- if not loop.last %}
                    {{- ",\n" }}
                {%- else %}
                    {{- ",\n" }}
                {%- endif -%}
            {%- endfor %}
            {{- "}) => any;\n\n" }}
        {%- else -%}
            {{- "() => any;\n\n" }}
        {%- endif -%}
    {%- endfor %}
    {{- "} // namespace " + namespace_name }}
{%- endmacro -%}

{%- macro render_builtin_tools(browser_tool, python_tool) -%}
    {%- if browser_tool %}
        {{- "## browser\n\n" }}
        {{- "// Tool for browsing.\n" }}
        {{- "// The `cursor` appears in brackets before each browsing display: `[{cursor}]`.\n" }}
        {{- "// Cite information from the tool using the following format:\n" }}
        {{- "// `【{cursor}†L{line_start}(-L{line_end})?】`, for example: `【6†L9-L11】` or `【8†L3】`.\n" }}
        {{- "// Do not quote more than 10 words directly from the tool output.\n" }}
        {{- "// sources=web (default: web)\n" }}
        {{- "namespace browser {\n\n" }}
        {{- "// Searches for information related to `query` and displays `topn` results.\n" }}
        {{- "type search = (_: {\n" }}
        {{- "query: string,\n" }}
        {{- "topn?: number, // default: 10\n" }}
        {{- "source?: string,\n" }}
        {{- "}) => any;\n\n" }}
        {{- "// Opens the link `id` from the page indicated by `cursor` starting at line number `loc`, showing `num_lines` lines.\n" }}
        {{- "// Valid link ids are displayed with the formatting: `【{id}†.*】`.\n" }}
        {{- "// If `cursor` is not provided, the most recent page is implied.\n" }}
        {{- "// If `id` is a string, it is treated as a fully qualified URL associated with `source`.\n" }}
        {{- "// If `loc` is not provided, the viewport will be positioned at the beginning of the document or centered on the most relevant passage, if available.\n" }}
        {{- "// Use this function without `id` to scroll to a new location of an opened page.\n" }}
        {{- "type open = (_: {\n" }}
        {{- "id?: number | string, // default: -1\n" }}
        {{- "cursor?: number, // default: -1\n" }}
        {{- "loc?: number, // default: -1\n" }}
        {{- "num_lines?: number, // default: -1\n" }}
        {{- "view_source?: boolean, // default: false\n" }}
        {{- "source?: string,\n" }}
        {{- "}) => any;\n\n" }}
        {{- "// Finds exact matches of `pattern` in the current page, or the page given by `cursor`.\n" }}
        {{- "type find = (_: {\n" }}
        {{- "pattern: string,\n" }}
        {{- "cursor?: number, // default: -1\n" }}
        {{- "}) => any;\n\n" }}
        {{- "} // namespace browser\n\n" }}
    {%- endif -%}

    {%- if python_tool %}
        {{- "## python\n\n" }}
        {{- "Use this tool to execute Python code in your chain of thought. The code will not be shown to the user. This tool should be used for internal reasoning, but not for code that is intended to be visible to the user (e.g. when creating plots, tables, or files).\n\n" }}
        {{- "When you send a message containing Python code to python, it will be executed in a stateful Jupyter notebook environment. python will respond with the output of the execution or time out after 120.0 seconds. The drive at '/mnt/data' can be used to save and persist user files. Internet access for this session is UNKNOWN. Depends on the cluster.\n\n" }}
    {%- endif -%}
{%- endmacro -%}

{#- System Message Construction ============================================ #}
{%- macro build_system_message() -%}
    {%- if model_identity is not defined %}
        {%- set model_identity = "You are ChatGPT, a large language model trained by OpenAI." %}
    {%- endif %}
    {{- model_identity + "\n" }}
    {{- "Knowledge cutoff: 2024-06\n" }}
    {{- "Current date: " + strftime_now("%Y-%m-%d") + "\n\n" }}
    {%- if reasoning_effort is not defined %}
        {%- set reasoning_effort = "medium" %}
    {%- endif %}
    {{- "Reasoning: " + reasoning_effort + "\n\n" }}
    {%- if builtin_tools %}
        {{- "# Tools\n\n" }}
        {%- set available_builtin_tools = namespace(browser=false, python=false) %}
        {%- for tool in builtin_tools %}
            {%- if tool == "browser" %}
                {%- set available_builtin_tools.browser = true %}
            {%- elif tool == "python" %}
                {%- set available_builtin_tools.python = true %}
            {%- endif %}
        {%- endfor %}
        {{- render_builtin_tools(available_builtin_tools.browser, available_builtin_tools.python) }}
    {%- endif -%}
    {{- "# Valid channels: analysis, commentary, final. Channel must be included for every message." }}
    {%- if tools -%}
        {{- "\nCalls to these tools must go to the commentary channel: 'functions'." }}
    {%- endif -%}
{%- endmacro -%}

{#- Main Template Logic ================================================= #}
{#- Set defaults #}

{#- Render system message #}
{{- "<|start|>system<|message|>" }}
{{- build_system_message() }}
{{- "<|end|>" }}

{#- Extract developer message #}
{%- if messages[0].role == "developer" or messages[0].role == "system" %}
    {%- set developer_message = messages[0].content %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set developer_message = "" %}
    {%- set loop_messages = messages %}
{%- endif %}

{#- Render developer message #}
{%- if developer_message or tools %}
    {{- "<|start|>developer<|message|>" }}
    {%- if developer_message %}
        {{- "# Instructions\n\n" }}
        {{- developer_message }}
        {{- "\n\n" }}
    {%- endif %}
    {%- if tools -%}
        {{- "# Tools\n\n" }}
        {{- render_tool_namespace("functions", tools) }}
    {%- endif -%}
    {{- "<|end|>" }}
{%- endif %}

{#- Render messages #}
{%- set last_tool_call = namespace(name=none) %}
{%- for message in loop_messages -%}
    {#- At this point only assistant/user/tool messages should remain #}
    {%- if message.role == 'assistant' -%}
        {#- Checks to ensure the messages are being passed in the format we expect #}
        {%- if "content" in message %}
            {%- if "<|channel|>analysis<|message|>" in message.content or "<|channel|>final<|message|>" in message.content %}
                {{- raise_exception("You have passed a message containing <|channel|> tags in the content field. Instead of doing this, you should pass analysis messages (the string between '<|message|>' and '<|end|>') in the 'thinking' field, and final messages (the string between '<|message|>' and '<|end|>') in the 'content' field.") }}
            {%- endif %}
        {%- endif %}
        {%- if "thinking" in message %}
            {%- if "<|channel|>analysis<|message|>" in message.thinking or "<|channel|>final<|message|>" in message.thinking %}
                {{- raise_exception("You have passed a message containing <|channel|> tags in the thinking field. Instead of doing this, you should pass analysis messages (the string between '<|message|>' and '<|end|>') in the 'thinking' field, and final messages (the string between '<|message|>' and '<|end|>') in the 'content' field.") }}
            {%- endif %}
        {%- endif %}
        {%- if "tool_calls" in message %}
            {#- We need very careful handling here - we want to drop the tool call analysis message if the model #}
            {#- has output a later <|final|> message, but otherwise we want to retain it. This is the only case #}
            {#- when we render CoT/analysis messages in inference. #}
            {%- set future_final_message = namespace(found=false) %}
            {%- for future_message in loop_messages[loop.index:] %}
                {%- if future_message.role == 'assistant' and "tool_calls" not in future_message %}
                    {%- set future_final_message.found = true %}
                {%- endif %}
            {%- endfor %}
            {#- We assume max 1 tool call per message, and so we infer the tool call name #}
            {#- in "tool" messages from the most recent assistant tool call name #}
            {%- set tool_call = message.tool_calls[0] %}
            {%- if tool_call.function %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {%- if message.content and message.thinking %}
                {{- raise_exception("Cannot pass both content and thinking in an assistant message with tool calls! Put the analysis message in one or the other, but not both.") }}
            {%- elif message.content and not future_final_message.found %}
                {{- "<|start|>assistant<|channel|>analysis<|message|>" + message.content + "<|end|>" }}
            {%- elif message.thinking and not future_final_message.found %}
                {{- "<|start|>assistant<|channel|>analysis<|message|>" + message.thinking + "<|end|>" }}
            {%- endif %}
            {{- "<|start|>assistant to=" }}
            {{- "functions." + tool_call.name + "<|channel|>commentary " }}
            {{- (tool_call.content_type if tool_call.content_type is defined else "json") + "<|message|>" }}
            {{- tool_call.arguments|tojson }}
            {{- "<|call|>" }}
            {%- set last_tool_call.name = tool_call.name %}
        {%- elif loop.last and not add_generation_prompt %}
            {#- Only render the CoT if the final turn is an assistant turn and add_generation_prompt is false #}
            {#- This is a situation that should only occur in training, never in inference. #}
            {%- if "thinking" in message %}
                {{- "<|start|>assistant<|channel|>analysis<|message|>" + message.thinking + "<|end|>" }}
            {%- endif %}
            {#- <|return|> indicates the end of generation, but <|end|> does not #}
            {#- <|return|> should never be an input to the model, but we include it as the final token #}
            {#- when training, so the model learns to emit it. #}
            {{- "<|start|>assistant<|channel|>final<|message|>" + message.content + "<|return|>" }}
        {%- else %}
            {#- CoT is dropped during all previous turns, so we never render it for inference #}
            {{- "<|start|>assistant<|channel|>final<|message|>" + message.content + "<|end|>" }}
            {%- set last_tool_call.name = none %}
        {%- endif %}
    {%- elif message.role == 'tool' -%}
        {%- if last_tool_call.name is none %}
            {{- raise_exception("Message has tool role, but there was no previous assistant message with a tool call!") }}
        {%- endif %}
        {{- "<|start|>functions." + last_tool_call.name }}
        {{- " to=assistant<|channel|>commentary<|message|>" + message.content|tojson + "<|end|>" }}
    {%- elif message.role == 'user' -%}
        {{- "<|start|>user<|message|>" + message.content + "<|end|>" }}
    {%- endif -%}
{%- endfor -%}

{#- Generation prompt #}
{%- if add_generation_prompt -%}
<|start|>assistant
{%- endif -%})tpl";

ChatSetup HarmonySetup(std::string_view source) {
  Result<jinja::Template> t = jinja::Template::Parse(source);
  EXPECT_TRUE(t.ok()) << (t.ok() ? "" : t.error().message);
  ChatSetup s;
  s.format = ChatFormat::kJinja;
  if (t.ok()) s.jinja = std::make_shared<const jinja::Template>(std::move(*t));
  s.harmony = IsHarmonyTemplate(source);
  s.render.now_unix = kJuly26th2024;
  return s;
}

std::string Render(const ChatSetup& s, const std::vector<ChatMessage>& m, bool gen,
                   const ChatTools& tools = {}, const Value& extra = Value()) {
  Result<std::string> r = RenderChatJinja(s, m, gen, std::nullopt, tools, extra);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
  return r.ok() ? *r : "<error>";
}

Value WeatherTool() {
  Value props = Value::MakeObject(
      {{"city", Value::MakeObject({{"type", "string"}, {"description", "The city"}})},
       {"unit", Value::MakeObject({{"type", "string"},
                                   {"enum", Value::MakeArray({"celsius", "fahrenheit"})},
                                   {"default", "celsius"}})},
       {"days", Value::MakeObject({{"type", "integer"}, {"default", 1}})},
       {"hourly", Value::MakeObject({{"type", "boolean"}})},
       {"fields", Value::MakeObject(
                      {{"type", "array"}, {"items", Value::MakeObject({{"type", "string"}})}})}});
  return Value::MakeObject(
      {{"type", "function"},
       {"function",
        Value::MakeObject(
            {{"name", "get_weather"},
             {"description", "Get the weather"},
             {"parameters", Value::MakeObject({{"type", "object"},
                                               {"properties", props},
                                               {"required", Value::MakeArray({"city"})}})}})}});
}

Value NoArgsTool() {
  return Value::MakeObject(
      {{"type", "function"},
       {"function", Value::MakeObject({{"name", "get_time"}, {"description", "The time"}})}});
}

ChatMessage Call(const std::string& name, Value args, std::string content = "") {
  ChatMessage m("assistant", std::move(content));
  m.tool_calls.push_back({"call_1", name, std::move(args)});
  return m;
}

ChatMessage ToolResult(const std::string& content) {
  ChatMessage m("tool", content);
  m.tool_call_id = "call_1";
  return m;
}

const char* const kSystemHead =
    "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
    "Knowledge cutoff: 2024-06\nCurrent date: 2024-07-26\n\nReasoning: medium\n\n"
    "# Valid channels: analysis, commentary, final. Channel must be included for every "
    "message.";

TEST(HarmonyTemplate, PublishedRendersTheDocumentedLayout) {
  const ChatSetup s = HarmonySetup(kPublished);
  ASSERT_TRUE(s.harmony);
  std::vector<ChatMessage> m = {{"system", "Be brief."},
                                {"user", "Hello"},
                                {"assistant", "Hi there!"},
                                {"user", "How are you?"}};
  EXPECT_EQ(Render(s, m, true),
            std::string(kSystemHead) +
                "<|end|><|start|>developer<|message|># Instructions\n\nBe brief.\n\n<|end|>"
                "<|start|>user<|message|>Hello<|end|><|start|>assistant<|channel|>final"
                "<|message|>Hi there!<|end|><|start|>user<|message|>How are you?<|end|>"
                "<|start|>assistant");
  // Tools, a call with its reasoning, the result, and the answer after it (which drops the
  // call's reasoning).
  ChatMessage call = Call("get_weather", Value::MakeObject({{"city", "Paris"}}));
  call.reasoning_content = "Need the weather.";
  m = {{"user", "Weather in Paris?"}, call, ToolResult("{\"temp\": 21}")};
  const Value tools = Value::MakeArray({WeatherTool()});
  EXPECT_EQ(Render(s, m, true, tools),
            std::string(kSystemHead) +
                "\nCalls to these tools must go to the commentary channel: 'functions'.<|end|>"
                "<|start|>developer<|message|># Tools\n\n## functions\n\nnamespace functions {\n\n"
                "// Get the weather\ntype get_weather = (_: {\n// The city\ncity: string,\n"
                "unit?: \"celsius\" | \"fahrenheit\", // default: celsius,\n"
                "days?: number, // default: 1,\nhourly?: boolean,\nfields?: string[],\n"
                "}) => any;\n\n} // namespace functions<|end|>"
                "<|start|>user<|message|>Weather in Paris?<|end|>"
                "<|start|>assistant<|channel|>analysis<|message|>Need the weather.<|end|>"
                "<|start|>assistant to=functions.get_weather<|channel|>commentary json"
                "<|message|>{\"city\": \"Paris\"}<|call|>"
                "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"
                "\"{\\\"temp\\\": 21}\"<|end|><|start|>assistant");
}

// The built-in template gives the published one's bytes for each conversation shape.
TEST(HarmonyTemplate, BuiltinMatchesPublished) {
  const ChatSetup published = HarmonySetup(kPublished);
  const ChatSetup builtin = HarmonySetup(BuiltinJinjaTemplate("gpt-oss"));
  ASSERT_TRUE(builtin.harmony);
  ChatMessage reasoned("assistant", "Paris.");
  reasoned.reasoning_content = "The capital of France.";
  ChatMessage call = Call("get_weather", Value::MakeObject({{"city", "Paris"}, {"days", 2}}));
  call.reasoning_content = "Need the weather.";
  const ChatMessage plain_call = Call("get_time", Value::MakeObject());
  const ChatMessage noted_call = Call("get_time", Value::MakeObject(), "Checking the clock.");
  struct Case {
    const char* what;
    std::vector<ChatMessage> messages;
    Value tools;
  };
  const Value tools = Value::MakeArray({WeatherTool(), NoArgsTool()});
  const std::vector<Case> cases = {
      {"user only", {{"user", "Hi"}}, Value()},
      {"system", {{"system", "Be brief."}, {"user", "Hi"}}, Value()},
      {"developer", {{"developer", "Be brief."}, {"user", "Hi"}}, Value()},
      {"turns",
       {{"user", "Capital of France?"}, reasoned, {"user", "And Spain?"}, {"assistant", "Madrid."}},
       Value()},
      {"tools without calls", {{"system", "Use tools."}, {"user", "Hi"}}, tools},
      {"a call and its result",
       {{"user", "Weather?"}, call, ToolResult("sunny"), {"user", "Thanks"}},
       tools},
      {"a call answered",
       {{"user", "Weather?"}, call, ToolResult("sunny"), {"assistant", "It is sunny."}},
       tools},
      {"calls without reasoning",
       {{"user", "Time?"}, plain_call, ToolResult("noon"), noted_call, ToolResult("12:01")},
       tools},
  };
  for (const Case& c : cases) {
    for (bool gen : {true, false}) {
      EXPECT_EQ(Render(builtin, c.messages, gen, c.tools),
                Render(published, c.messages, gen, c.tools))
          << c.what << (gen ? " (generation prompt)" : "");
    }
  }
  const Value extra =
      Value::MakeObject({{"model_identity", "You are a test."}, {"reasoning_effort", "high"}});
  const std::vector<ChatMessage> m = {{"user", "Hi"}};
  EXPECT_EQ(Render(builtin, m, true, {}, extra), Render(published, m, true, {}, extra));
  EXPECT_NE(Render(builtin, m, true, {}, extra).find("Reasoning: high"), std::string::npos);
}

// ---- parsing answers ----

struct Answer {
  const char* what;
  std::string text;  // what the model generated after the prompt's <|start|>assistant
  std::string reasoning, content;
  std::vector<ToolCall> calls;
};

std::vector<Answer> Answers() {
  return {
      {"reasoning then final",
       "<|channel|>analysis<|message|>User greets.<|end|><|start|>assistant<|channel|>final"
       "<|message|>Hello! How can I help?<|return|>",
       "User greets.",
       "Hello! How can I help?",
       {}},
      {"final only, no terminator", "<|channel|>final<|message|>Hi", "", "Hi", {}},
      {"call, recipient in the channel header",
       "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary"
       " to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}<|call|>",
       "Need weather.",
       "",
       {{"get_weather", "{\"city\":\"Paris\"}"}}},
      {"call, recipient in the role header",
       "<|channel|>analysis<|message|>Hmm<|end|><|start|>assistant to=functions.get_time"
       "<|channel|>commentary json<|message|>{}<|call|>",
       "Hmm",
       "",
       {{"get_time", "{}"}}},
      {"call right after the prompt",
       " to=functions.get_time<|channel|>commentary json<|message|> {\"tz\": \"UTC\"} <|call|>",
       "",
       "",
       {{"get_time", "{\"tz\": \"UTC\"}"}}},
      {"preamble and two calls",
       "<|channel|>commentary<|message|>Let me check. <|end|><|start|>assistant<|channel|>"
       "commentary to=functions.a <|constrain|>json<|message|>{\"x\":1}<|call|><|start|>assistant"
       "<|channel|>commentary to=functions.b json<|message|>{\"y\":[1,2]}<|call|>",
       "",
       "Let me check. ",
       {{"a", "{\"x\":1}"}, {"b", "{\"y\":[1,2]}"}}},
      {"two analysis messages",
       "<|channel|>analysis<|message|>one<|end|><|start|>assistant<|channel|>analysis<|message|>"
       "two<|end|><|start|>assistant<|channel|>final<|message|>done<|return|>",
       "one\ntwo",
       "done",
       {}},
      {"stray commentary before final",
       "<|channel|>commentary to=assistant<|channel|>final<|message|>ok<|return|>",
       "",
       "ok",
       {}},
      {"a built-in tool's call is not the client's",
       "<|channel|>analysis<|message|>search<|end|><|start|>assistant<|channel|>commentary "
       "to=browser.search <|constrain|>json<|message|>{\"query\":\"x\"}<|call|>",
       "search",
       "",
       {}},
      {"plain text",
       "Just text, with a < sign and to=x.",
       "",
       "Just text, with a < sign and to=x.",
       {}},
      {"a call cut off in its arguments stays content",
       "<|channel|>commentary to=functions.f json<|message|>{\"a\": \"b",
       "",
       "{\"a\": \"b",
       {}},
      {"unicode", "<|channel|>final<|message|>héllo 世界<|return|>", "", "héllo 世界", {}},
  };
}

void ExpectParse(const HarmonyParse& got, const Answer& a, const std::string& how) {
  EXPECT_EQ(got.reasoning, a.reasoning) << a.what << how;
  EXPECT_EQ(got.content, a.content) << a.what << how;
  ASSERT_EQ(got.calls.size(), a.calls.size()) << a.what << how;
  for (size_t i = 0; i < a.calls.size(); ++i) {
    EXPECT_EQ(got.calls[i].name, a.calls[i].name) << a.what << how;
    EXPECT_EQ(got.calls[i].arguments, a.calls[i].arguments) << a.what << how;
  }
}

TEST(HarmonyParse, WholeAnswers) {
  for (const Answer& a : Answers()) ExpectParse(ParseHarmony(a.text), a, "");
}

// Streamed in pieces of 1..7 bytes (and byte by byte), the deltas add up to the whole parse, and
// no marker text ever leaks into the reasoning or the content.
TEST(HarmonyParse, StreamedInAnyPiecesAddsUpToTheWhole) {
  std::mt19937 rng(7);
  for (const Answer& a : Answers()) {
    for (int round = 0; round < 6; ++round) {
      HarmonyStream stream;
      HarmonyParse sum;
      auto add = [&](const HarmonyParse& d) {
        sum.reasoning += d.reasoning;
        sum.content += d.content;
        for (const ToolCall& c : d.calls) sum.calls.push_back(c);
        EXPECT_EQ(d.content.find("<|"), std::string::npos) << a.what << ": " << d.content;
      };
      for (size_t i = 0; i < a.text.size();) {
        const size_t n = round == 0 ? 1 : 1 + rng() % 7;
        add(stream.Push(std::string_view(a.text).substr(i, n)));
        i += n;
      }
      add(stream.Flush());
      ExpectParse(sum, a, " (streamed, round " + std::to_string(round) + ")");
    }
  }
}

// A call comes out only once its message has ended: the arguments are whole.
TEST(HarmonyParse, AStreamedCallComesOutWhole) {
  HarmonyStream stream;
  EXPECT_TRUE(
      stream.Push("<|channel|>commentary to=functions.f json<|message|>{\"a\":").calls.empty());
  EXPECT_TRUE(stream.Push("1}").calls.empty());
  const HarmonyParse d = stream.Push("<|call|>");
  ASSERT_EQ(d.calls.size(), 1u);
  EXPECT_EQ(d.calls[0].name, "f");
  EXPECT_EQ(d.calls[0].arguments, "{\"a\":1}");
  EXPECT_TRUE(stream.Flush().calls.empty());
}

// An answer of n pieces of 4 bytes (half reasoning, half the final answer), streamed; the
// microseconds per piece. The stream's work is linear in the answer: a piece costs the same at
// 1,000 pieces as at 64,000 (docs/PERFORMANCE.md, "Harmony stream").
double StreamMicrosPerPiece(int n) {
  std::vector<std::string> pieces;
  pieces.push_back("<|channel|>analysis<|message|>");
  for (int i = 0; i < n / 2; ++i) pieces.push_back(i % 7 == 0 ? "ok, " : "abc ");
  pieces.push_back("<|end|><|start|>assistant<|channel|>final<|message|>");
  for (int i = n / 2; i < n; ++i) pieces.push_back(i % 5 == 0 ? "<b> " : "xyz ");
  pieces.push_back("<|return|>");
  double best = 1e30;
  for (int rep = 0; rep < 3; ++rep) {
    HarmonyStream stream;
    size_t out = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (const std::string& p : pieces) out += stream.Push(p).content.size();
    out += stream.Flush().content.size();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(out, static_cast<size_t>(n - n / 2) * 4);
    best = std::min(best, s * 1e6 / static_cast<double>(pieces.size()));
  }
  return best;
}

TEST(HarmonyParse, StreamCostPerPieceDoesNotGrow) {
  const double us_1k = StreamMicrosPerPiece(1000);
  const double us_16k = StreamMicrosPerPiece(16000);
  const double us_64k = StreamMicrosPerPiece(64000);
  std::printf("harmony stream: %.3f us/piece at 1K pieces, %.3f at 16K, %.3f at 64K\n", us_1k,
              us_16k, us_64k);
  // Quadratic work would make a piece at 64K pieces 64x one at 1K; allow noise, not growth.
  EXPECT_LT(us_64k, 8 * us_1k + 1.0);
}

}  // namespace
}  // namespace lamina::chat
