// Rendering of the known chat formats, following the official Jinja templates line by line.
#include "chat/chat_template.h"

#include "chat/harmony.h"

namespace lamina::chat {

namespace {

bool Contains(std::string_view s, std::string_view what) {
  return s.find(what) != std::string_view::npos;
}

std::string_view StripChars(std::string_view s, std::string_view chars, bool left, bool right) {
  while (left && !s.empty() && chars.find(s.front()) != std::string_view::npos) s.remove_prefix(1);
  while (right && !s.empty() && chars.find(s.back()) != std::string_view::npos) s.remove_suffix(1);
  return s;
}

// Jinja's `| trim` (Python str.strip()).
std::string_view Trim(std::string_view s) { return StripChars(s, " \t\n\r\f\v", true, true); }

// Qwen3: splits an assistant message written as "<think>reasoning</think>answer" the way the
// template does (content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n')).
void SplitReasoning(std::string_view content, std::string* reasoning, std::string* answer) {
  const size_t close = content.find("</think>");
  if (close == std::string_view::npos) {
    reasoning->clear();
    *answer = std::string(content);
    return;
  }
  std::string_view before = StripChars(content.substr(0, close), "\n", false, true);
  const size_t open = before.rfind("<think>");
  if (open != std::string_view::npos) before = before.substr(open + 7);
  *reasoning = std::string(StripChars(before, "\n", true, false));
  const size_t last_close = content.rfind("</think>");
  *answer = std::string(StripChars(content.substr(last_close + 8), "\n", true, false));
}

bool IsToolResponse(std::string_view content) {
  return content.starts_with("<tool_response>") && content.ends_with("</tool_response>");
}

bool HasTools(const ChatTools& tools) { return tools.is_array() && !tools.array().empty(); }

// The "# Tools" section of Qwen2.5's and Qwen3's templates (the text after the system prompt
// and its blank line), ending with the system turn's <|im_end|>.
std::string ToolsSection(const ChatTools& tools) {
  std::string out =
      "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
      "You are provided with function signatures within <tools></tools> XML tags:\n<tools>";
  for (const jinja::Value& t : tools.array()) {
    out += '\n';
    out += jinja::ToJson(t);
  }
  out +=
      "\n</tools>\n\nFor each function call, return a json object with function name and "
      "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
      "<function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n";
  return out;
}

// One Hermes-style call block; arguments as `| tojson` writes them (Qwen3: a string as is).
std::string ToolCallBlock(const ChatToolCall& c, bool string_as_is) {
  const std::string args =
      string_as_is && c.arguments.is_string() ? c.arguments.str() : jinja::ToJson(c.arguments);
  return "<tool_call>\n{\"name\": \"" + c.name + "\", \"arguments\": " + args + "}\n</tool_call>";
}

// Tool turns in a row become one user turn of <tool_response> blocks (Qwen2.5 and Qwen3).
void AppendToolTurn(const std::vector<ChatMessage>& m, size_t i, std::string* out) {
  if (i == 0 || m[i - 1].role != "tool") *out += "<|im_start|>user";
  *out += "\n<tool_response>\n" + m[i].content + "\n</tool_response>";
  if (i + 1 == m.size() || m[i + 1].role != "tool") *out += "<|im_end|>\n";
}

std::string RenderQwen3(const std::vector<ChatMessage>& m, bool add_generation_prompt,
                        bool enable_thinking, const ChatTools& tools) {
  std::string out;
  if (HasTools(tools)) {
    out += "<|im_start|>system\n";
    if (!m.empty() && m[0].role == "system") out += m[0].content + "\n\n";
    out += ToolsSection(tools);
  } else if (!m.empty() && m[0].role == "system") {
    out += "<|im_start|>system\n" + m[0].content + "<|im_end|>\n";
  }
  // The last user turn that is not a tool response: assistant turns after it keep reasoning.
  int last_query = static_cast<int>(m.size()) - 1;
  for (int i = static_cast<int>(m.size()) - 1; i >= 0; --i) {
    if (m[i].role == "user" && !IsToolResponse(m[i].content)) {
      last_query = i;
      break;
    }
  }
  for (int i = 0; i < static_cast<int>(m.size()); ++i) {
    const ChatMessage& msg = m[i];
    const bool last = i + 1 == static_cast<int>(m.size());
    if (msg.role == "user" || (msg.role == "system" && i != 0)) {
      out += "<|im_start|>" + msg.role + "\n" + msg.content + "<|im_end|>\n";
    } else if (msg.role == "assistant") {
      std::string reasoning, content;
      SplitReasoning(msg.content, &reasoning, &content);
      if (!msg.reasoning_content.empty()) reasoning = msg.reasoning_content;  // given apart
      if (i > last_query && (last || !reasoning.empty())) {
        out += "<|im_start|>assistant\n<think>\n" +
               std::string(StripChars(reasoning, "\n", true, true)) + "\n</think>\n\n" +
               std::string(StripChars(content, "\n", true, false));
      } else {
        out += "<|im_start|>assistant\n" + content;
      }
      for (size_t k = 0; k < msg.tool_calls.size(); ++k) {
        if (k > 0 || !content.empty()) out += "\n";
        out += ToolCallBlock(msg.tool_calls[k], /*string_as_is=*/true);
      }
      out += "<|im_end|>\n";
    } else if (msg.role == "tool") {
      AppendToolTurn(m, i, &out);
    }
  }
  if (add_generation_prompt) {
    out += "<|im_start|>assistant\n";
    if (!enable_thinking) out += "<think>\n\n</think>\n\n";
  }
  return out;
}

// ChatML as Qwen2.5's template writes it (tools, tool calls and tool turns included).
std::string RenderChatML(const std::vector<ChatMessage>& m, bool add_generation_prompt,
                         std::string_view default_system, const ChatTools& tools) {
  std::string out;
  const bool has_system = !m.empty() && m[0].role == "system";
  size_t first = 0;
  if (HasTools(tools)) {
    const std::string system = has_system ? m[0].content : std::string(default_system);
    out += "<|im_start|>system\n" + system + (system.empty() ? "" : "\n\n") + ToolsSection(tools);
    first = has_system ? 1 : 0;
  } else if (!default_system.empty() && !has_system) {
    out += "<|im_start|>system\n" + std::string(default_system) + "<|im_end|>\n";
  }
  for (size_t i = first; i < m.size(); ++i) {
    const ChatMessage& msg = m[i];
    if (msg.role == "tool") {
      AppendToolTurn(m, i, &out);
    } else if (msg.role == "assistant" && !msg.tool_calls.empty()) {
      out += "<|im_start|>assistant";
      if (!msg.content.empty()) out += "\n" + msg.content;
      for (const ChatToolCall& c : msg.tool_calls) {
        out += '\n';
        out += ToolCallBlock(c, false);
      }
      out += "<|im_end|>\n";
    } else {
      out += "<|im_start|>" + msg.role + "\n" + msg.content + "<|im_end|>\n";
    }
  }
  if (add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

constexpr std::string_view kLlama3Bos = "<|begin_of_text|>";

std::string RenderLlama3(const std::vector<ChatMessage>& m, bool add_generation_prompt) {
  std::string out(kLlama3Bos);
  for (const ChatMessage& msg : m) {
    out += "<|start_header_id|>" + msg.role + "<|end_header_id|>\n\n" +
           std::string(Trim(msg.content)) + "<|eot_id|>";
  }
  if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

// Built-in Jinja sources for --chat-template names, written from each format's documented
// prompt layout (the names are llama-server's). A null content (an assistant turn that only
// calls tools) renders as empty text in those without tools.
struct BuiltinTemplate {
  std::string_view name;
  std::string_view source;
};
constexpr BuiltinTemplate kBuiltins[] = {
    // Gemma: user/model turns; a system turn is prepended to the first user turn.
    {"gemma",
     R"({{ bos_token }}{%- set ns = namespace(system='') -%}
{%- for message in messages -%}
{%- if message['role'] == 'system' -%}
{%- set ns.system = (message['content'] or '') | trim -%}
{%- else -%}
{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}
{{ '<start_of_turn>' + role + '
' }}
{%- if ns.system and role != 'model' -%}
{{ ns.system + '

' }}{%- set ns.system = '' -%}
{%- endif -%}
{{ (message['content'] or '') | trim + '<end_of_turn>
' }}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{ '<start_of_turn>model
' }}{%- endif -%})"},
    // Phi-3: <|role|> headers, <|end|> after each turn.
    {"phi3",
     R"({%- for message in messages -%}
{{ '<|' + message['role'] + '|>
' + (message['content'] or '') + '<|end|>
' }}
{%- endfor -%}
{%- if add_generation_prompt -%}{{ '<|assistant|>
' }}{%- endif -%})"},
    // Mistral v7: [SYSTEM_PROMPT] / [INST] blocks, assistant turns closed by EOS.
    {"mistral-v7",
     R"({{ bos_token }}
{%- for message in messages -%}
{%- if message['role'] == 'system' -%}
{{ '[SYSTEM_PROMPT] ' + (message['content'] or '') + '[/SYSTEM_PROMPT]' }}
{%- elif message['role'] == 'user' -%}
{{ '[INST] ' + (message['content'] or '') + '[/INST]' }}
{%- elif message['role'] == 'assistant' -%}
{{ ' ' + (message['content'] or '') + eos_token }}
{%- else -%}
{{ raise_exception('mistral-v7: unsupported role ' + message['role']) }}
{%- endif -%}
{%- endfor -%})"},
    // DeepSeek V3 / R1: the system turns first (joined by blank lines), then
    // <｜User｜> / <｜Assistant｜> turns; an assistant turn ends with <｜end▁of▁sentence｜>.
    {"deepseek3",
     R"({{ bos_token }}
{%- set ns = namespace(system='') -%}
{%- for message in messages if message['role'] == 'system' -%}
{%- set ns.system = ns.system + ('

' if not loop.first else '') + (message['content'] or '') -%}
{%- endfor -%}
{{ ns.system }}
{%- for message in messages -%}
{%- if message['role'] == 'user' -%}
{{ '<｜User｜>' + (message['content'] or '') }}
{%- elif message['role'] == 'assistant' -%}
{%- set content = (message['content'] or '') -%}
{%- if '</think>' in content -%}{%- set content = content.split('</think>')[-1] -%}{%- endif -%}
{{ '<｜Assistant｜>' + content + '<｜end▁of▁sentence｜>' }}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{ '<｜Assistant｜>' }}{%- endif -%})"},
    // Command R: <|START_OF_TURN_TOKEN|> + a role token, the trimmed text, <|END_OF_TURN_TOKEN|>.
    {"command-r",
     R"({%- for message in messages -%}
{%- if message['role'] not in ['system', 'user', 'assistant'] -%}
{{ raise_exception('command-r: unsupported role ' + message['role']) }}
{%- endif -%}
{%- set role = {'system': '<|SYSTEM_TOKEN|>', 'user': '<|USER_TOKEN|>', 'assistant': '<|CHATBOT_TOKEN|>'}[message['role']] -%}
{{ '<|START_OF_TURN_TOKEN|>' + role + (message['content'] or '') | trim + '<|END_OF_TURN_TOKEN|>' }}
{%- endfor -%}
{%- if add_generation_prompt -%}{{ '<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>' }}{%- endif -%})"},
    // Zephyr: <|role|>, a newline, the text, <|endoftext|> and a newline.
    {"zephyr",
     R"({%- for message in messages -%}
{{ '<|' + message['role'] + '|>
' + (message['content'] or '') + '<|endoftext|>
' }}
{%- endfor -%}
{%- if add_generation_prompt -%}{{ '<|assistant|>
' }}{%- endif -%})"},
    // Vicuna 1.1: the system text and a blank line, "USER: " / "ASSISTANT: " lines, </s> after
    // an answer.
    {"vicuna",
     R"({%- for message in messages -%}
{%- if message['role'] == 'system' -%}{{ (message['content'] or '') + '

' }}
{%- elif message['role'] == 'user' -%}{{ 'USER: ' + (message['content'] or '') + '
' }}
{%- elif message['role'] == 'assistant' -%}{{ 'ASSISTANT: ' + (message['content'] or '') + '</s>
' }}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{ 'ASSISTANT:' }}{%- endif -%})"},
    // OpenChat 3.5: "GPT4 Correct User: " / "GPT4 Correct Assistant: " turns ending
    // <|end_of_turn|>; the system text alone before its <|end_of_turn|>.
    {"openchat",
     R"({%- for message in messages -%}
{%- if message['role'] == 'system' -%}{{ (message['content'] or '') + '<|end_of_turn|>' }}
{%- else -%}{{ 'GPT4 Correct ' + message['role'] | capitalize + ': ' + (message['content'] or '') + '<|end_of_turn|>' }}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{ 'GPT4 Correct Assistant:' }}{%- endif -%})"},
    // Phi-4: ChatML with <|im_sep|> after the role.
    {"phi4",
     R"({%- for message in messages -%}
{{ '<|im_start|>' + message['role'] + '<|im_sep|>' + (message['content'] or '') + '<|im_end|>' }}
{%- endfor -%}
{%- if add_generation_prompt -%}{{ '<|im_start|>assistant<|im_sep|>' }}{%- endif -%})"},
    // gpt-oss ("harmony"): a system message (identity, knowledge cutoff, today's date, the
    // reasoning effort, the channels), a developer message with the first system or developer
    // turn as "# Instructions" and the tools as a TypeScript namespace, then <|start|>ROLE
    // <|message|>TEXT<|end|> turns; an assistant's answer goes to the final channel, its tool
    // call to functions.NAME on the commentary channel (its reasoning, or its text, on the
    // analysis channel before it unless a later answer follows), a tool's result comes from
    // functions.NAME as a JSON string. Variables: model_identity, reasoning_effort (default
    // medium).
    {"gpt-oss",
     R"({%- macro ts_type(spec) -%}
{%- if spec.type == 'string' and spec.enum -%}{{ '"' + spec.enum | join('" | "') + '"' }}
{%- elif spec.type == 'string' -%}{{ 'string' + (' | null' if spec.nullable else '') }}
{%- elif spec.type == 'number' or spec.type == 'integer' -%}number
{%- elif spec.type == 'boolean' -%}boolean
{%- elif spec.type == 'array' and spec['items'] and spec['items'].type in ['string', 'number', 'integer', 'boolean'] -%}
{{ ('number' if spec['items'].type == 'integer' else spec['items'].type) + '[]' + (' | null' if spec.nullable else '') }}
{%- elif spec.type == 'array' -%}{{ 'any[]' + (' | null' if spec.nullable else '') }}
{%- else -%}any
{%- endif -%}
{%- endmacro -%}
{%- set first = messages[0] if messages else none -%}
{%- set instructions = first.content if first and first.role in ['system', 'developer'] else '' -%}
{%- set turns = messages[1:] if first and first.role in ['system', 'developer'] else messages -%}
{{- '<|start|>system<|message|>' + (model_identity if model_identity is defined else 'You are ChatGPT, a large language model trained by OpenAI.') + '\n' -}}
{{- 'Knowledge cutoff: 2024-06\nCurrent date: ' + strftime_now('%Y-%m-%d') + '\n\n' -}}
{{- 'Reasoning: ' + (reasoning_effort if reasoning_effort is defined else 'medium') + '\n\n' -}}
{{- '# Valid channels: analysis, commentary, final. Channel must be included for every message.' -}}
{%- if tools %}{{ "\nCalls to these tools must go to the commentary channel: 'functions'." }}{% endif -%}
{{- '<|end|>' -}}
{%- if instructions or tools -%}
{{- '<|start|>developer<|message|>' -}}
{%- if instructions %}{{ '# Instructions\n\n' + instructions + '\n\n' }}{% endif -%}
{%- if tools -%}
{{- '# Tools\n\n## functions\n\nnamespace functions {\n\n' -}}
{%- for t in tools -%}
{%- set f = t.function -%}
{%- if f.description %}{{ '// ' + f.description + '\n' }}{% endif -%}
{{- 'type ' + f.name + ' = ' -}}
{%- if f.parameters and f.parameters.properties -%}
{{- '(_: {\n' -}}
{%- for name, spec in f.parameters.properties.items() -%}
{%- if spec.description %}{{ '// ' + spec.description + '\n' }}{% endif -%}
{{- name + ('' if name in (f.parameters.required or []) else '?') + ': ' + ts_type(spec) -}}
{%- if spec.default is defined -%}{{ ', // default: ' + (spec.default if spec.enum else spec.default | tojson) }}{%- endif -%}
{{- ',\n' -}}
{%- endfor -%}
{{- '}) => any;\n\n' -}}
{%- else -%}{{ '() => any;\n\n' }}{%- endif -%}
{%- endfor -%}
{{- '} // namespace functions' -}}
{%- endif -%}
{{- '<|end|>' -}}
{%- endif -%}
{%- set ns = namespace(called=none) -%}
{%- for m in turns -%}
{%- if m.role == 'user' -%}
{{- '<|start|>user<|message|>' + m.content + '<|end|>' -}}
{%- elif m.role == 'assistant' and m.tool_calls -%}
{%- set answered = namespace(yes=false) -%}
{%- for later in turns[loop.index:] -%}
{%- if later.role == 'assistant' and not later.tool_calls %}{% set answered.yes = true %}{% endif -%}
{%- endfor -%}
{%- set call = m.tool_calls[0].function if m.tool_calls[0].function else m.tool_calls[0] -%}
{%- set note = m.content if m.content else (m.thinking if m.thinking else '') -%}
{%- if m.content and m.thinking %}{{ raise_exception('gpt-oss: an assistant tool call has both content and thinking') }}{% endif -%}
{%- if note and not answered.yes %}{{ '<|start|>assistant<|channel|>analysis<|message|>' + note + '<|end|>' }}{% endif -%}
{{- '<|start|>assistant to=functions.' + call.name + '<|channel|>commentary json<|message|>' + call.arguments | tojson + '<|call|>' -}}
{%- set ns.called = call.name -%}
{%- elif m.role == 'assistant' and loop.last and not add_generation_prompt -%}
{%- if m.thinking %}{{ '<|start|>assistant<|channel|>analysis<|message|>' + m.thinking + '<|end|>' }}{% endif -%}
{{- '<|start|>assistant<|channel|>final<|message|>' + m.content + '<|return|>' -}}
{%- elif m.role == 'assistant' -%}
{{- '<|start|>assistant<|channel|>final<|message|>' + m.content + '<|end|>' -}}
{%- set ns.called = none -%}
{%- elif m.role == 'tool' -%}
{%- if ns.called is none %}{{ raise_exception('gpt-oss: a tool turn without an earlier tool call') }}{% endif -%}
{{- '<|start|>functions.' + ns.called + ' to=assistant<|channel|>commentary<|message|>' + m.content | tojson + '<|end|>' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt %}{{ '<|start|>assistant' }}{% endif -%})"},
    // Falcon 3: <|role|>, a newline, the text and a newline.
    {"falcon3",
     R"({%- for message in messages -%}
{{ '<|' + message['role'] + '|>
' + (message['content'] or '') + '
' }}
{%- endfor -%}
{%- if add_generation_prompt -%}{{ '<|assistant|>
' }}{%- endif -%})"},
};

}  // namespace

bool OpensThinkingOnRequest(std::string_view t) {
  return Contains(t, "{% if enable_thinking is defined and enable_thinking %}{{ '<think>\\n' }}");
}

ChatFormat DetectChatFormat(std::string_view t) {
  if (Contains(t, "<|start_header_id|>") && Contains(t, "<|eot_id|>")) return ChatFormat::kLlama3;
  if (Contains(t, "<|im_start|>")) {
    // Qwen3's template is ChatML plus think-block handling and the enable_thinking switch, whose
    // off state it tests in these words; other ChatML templates that think (they open the block
    // themselves, or test the switch otherwise) are rendered by the Jinja engine.
    if (Contains(t, "enable_thinking is defined and enable_thinking is false")) {
      return ChatFormat::kQwen3;
    }
    if (OpensThinkingOnRequest(t)) return ChatFormat::kChatML;
    if (Contains(t, "enable_thinking") || Contains(t, "<think>")) return ChatFormat::kUnknown;
    return ChatFormat::kChatML;
  }
  return ChatFormat::kUnknown;
}

std::string DefaultSystemPrompt(std::string_view t) {
  // A default system turn is one string literal '<|im_start|>system\n...<|im_end|>' (the
  // other occurrence concatenates messages[0]['content'] and so contains quotes).
  static constexpr std::string_view kOpen = "<|im_start|>system\\n";
  for (size_t at = t.find(kOpen); at != std::string_view::npos; at = t.find(kOpen, at + 1)) {
    const size_t begin = at + kOpen.size();
    const size_t end = t.find("<|im_end|>", begin);
    if (end == std::string_view::npos) break;
    const std::string_view body = t.substr(begin, end - begin);
    if (body.empty() || body.find_first_of("'\"{}") != std::string_view::npos) continue;
    // Undo the Jinja string escapes that can occur in a plain sentence.
    std::string out;
    for (size_t i = 0; i < body.size(); ++i) {
      if (body[i] == '\\' && i + 1 < body.size()) {
        const char c = body[++i];
        out += c == 'n' ? '\n' : c;
      } else {
        out += body[i];
      }
    }
    return out;
  }
  return {};
}

std::string RenderChat(ChatFormat format, const std::vector<ChatMessage>& messages,
                       bool add_generation_prompt, bool enable_thinking,
                       std::string_view default_system, const ChatTools& tools) {
  switch (format) {
    case ChatFormat::kQwen3:
      return RenderQwen3(messages, add_generation_prompt, enable_thinking, tools);
    case ChatFormat::kLlama3:
      return RenderLlama3(messages, add_generation_prompt);
    case ChatFormat::kChatML:
    case ChatFormat::kJinja:  // rendered by RenderChatJinja; ChatML when called without one
    case ChatFormat::kUnknown:
      // ChatML is the common fallback for an unrecognised template, as in llama.cpp.
      return RenderChatML(messages, add_generation_prompt, default_system, tools);
  }
  return {};
}

ChatSetup ChatSetupFromTemplate(std::string_view template_text) {
  ChatSetup setup;
  setup.format = DetectChatFormat(template_text);
  setup.default_system = DefaultSystemPrompt(template_text);
  setup.opens_thinking =
      setup.format == ChatFormat::kChatML && OpensThinkingOnRequest(template_text);
  return setup;
}

std::string ChatTemplateNames() {
  std::string names = "chatml, qwen3, llama3";
  for (const BuiltinTemplate& b : kBuiltins) names += ", " + std::string(b.name);
  return names;
}

std::string_view BuiltinJinjaTemplate(std::string_view name) {
  for (const BuiltinTemplate& b : kBuiltins) {
    if (b.name == name) return b.source;
  }
  return {};
}

std::vector<std::string_view> BuiltinJinjaTemplateNames() {
  std::vector<std::string_view> names;
  for (const BuiltinTemplate& b : kBuiltins) names.push_back(b.name);
  return names;
}

Result<ChatSetup> ChatSetupFromJinja(std::string_view source, const Tokenizer& tok) {
  Result<jinja::Template> t = jinja::Template::Parse(source);
  if (!t.ok()) return Error{"chat template: " + t.error().message};
  ChatSetup setup;
  setup.format = ChatFormat::kJinja;
  setup.jinja = std::make_shared<const jinja::Template>(std::move(*t));
  setup.harmony = IsHarmonyTemplate(source);
  const int n = tok.vocab_size();
  if (tok.bos() >= 0 && tok.bos() < n) setup.bos_token = tok.TokenText(tok.bos());
  if (tok.eos() >= 0 && tok.eos() < n) setup.eos_token = tok.TokenText(tok.eos());
  return setup;
}

Result<ChatSetup> ChatSetupFromName(std::string_view name, const Tokenizer& tok) {
  static constexpr std::pair<std::string_view, ChatFormat> kNative[] = {
      {"chatml", ChatFormat::kChatML},
      {"qwen3", ChatFormat::kQwen3},
      {"llama3", ChatFormat::kLlama3}};
  for (const auto& [n, f] : kNative) {
    if (n == name) {
      ChatSetup setup;
      setup.format = f;
      return setup;
    }
  }
  const std::string_view source = BuiltinJinjaTemplate(name);
  if (source.empty()) {
    return Error{"unknown chat template '" + std::string(name) +
                 "' (built-in: " + ChatTemplateNames() + ")"};
  }
  return ChatSetupFromJinja(source, tok);
}

Result<ChatSetup> ChatSetupForModel(std::string_view template_text, const Tokenizer& tok,
                                    bool force_jinja) {
  if (!force_jinja) {
    ChatSetup setup = ChatSetupFromTemplate(template_text);
    if (setup.format != ChatFormat::kUnknown) return setup;
  }
  return ChatSetupFromJinja(template_text, tok);
}

jinja::Value ChatJinjaContext(const ChatSetup& setup, const std::vector<ChatMessage>& messages,
                              bool add_generation_prompt, std::optional<bool> enable_thinking,
                              const ChatTools& tools, const jinja::Value& extra) {
  jinja::Array list;
  for (const ChatMessage& m : messages) {
    const bool null_content = m.content_null && !m.tool_calls.empty();
    // Harmony templates read an assistant's reasoning as `thinking`; a tool call then carries it
    // without a content key at all (as llama.cpp passes it).
    const bool harmony_thinking = setup.harmony && !m.reasoning_content.empty();
    jinja::Value msg = jinja::Value::MakeObject({{"role", jinja::Value(m.role)}});
    if (!harmony_thinking || m.tool_calls.empty()) {
      msg.Set("content", null_content ? jinja::Value::None() : jinja::Value(m.content));
    }
    if (!m.tool_calls.empty()) {
      jinja::Array calls;
      for (const ChatToolCall& c : m.tool_calls) {
        jinja::Value call = jinja::Value::MakeObject();
        if (!c.id.empty()) call.Set("id", jinja::Value(c.id));
        call.Set("type", jinja::Value("function"));
        call.Set("function", jinja::Value::MakeObject(
                                 {{"name", jinja::Value(c.name)}, {"arguments", c.arguments}}));
        calls.push_back(std::move(call));
      }
      msg.Set("tool_calls", jinja::Value::MakeArray(std::move(calls)));
    }
    if (!m.reasoning_content.empty()) {
      msg.Set("reasoning_content", jinja::Value(m.reasoning_content));
      if (harmony_thinking) msg.Set("thinking", jinja::Value(m.reasoning_content));
    }
    if (!m.tool_call_id.empty()) msg.Set("tool_call_id", jinja::Value(m.tool_call_id));
    if (!m.name.empty()) msg.Set("name", jinja::Value(m.name));
    list.push_back(std::move(msg));
  }
  jinja::Value context = jinja::Value::MakeObject({
      {"messages", jinja::Value::MakeArray(std::move(list))},
      {"bos_token", jinja::Value(setup.bos_token)},
      {"eos_token", jinja::Value(setup.eos_token)},
      {"add_generation_prompt", jinja::Value(add_generation_prompt)},
      {"tools", HasTools(tools) ? tools : jinja::Value::None()},
  });
  if (enable_thinking.has_value()) context.Set("enable_thinking", jinja::Value(*enable_thinking));
  if (extra.is_object()) {
    for (const auto& [key, value] : extra.object()) {
      if (key == "messages" || key == "bos_token" || key == "eos_token" ||
          key == "add_generation_prompt" || key == "tools" || key == "enable_thinking") {
        continue;
      }
      context.Set(key, value);
    }
  }
  return context;
}

Result<std::string> RenderChatJinja(const ChatSetup& setup,
                                    const std::vector<ChatMessage>& messages,
                                    bool add_generation_prompt, std::optional<bool> enable_thinking,
                                    const ChatTools& tools, const jinja::Value& extra) {
  LAMINA_CHECK(setup.jinja != nullptr);
  const jinja::Value context =
      ChatJinjaContext(setup, messages, add_generation_prompt, enable_thinking, tools, extra);
  Result<std::string> out = setup.jinja->Render(context, setup.render);
  if (!out.ok()) return Error{"chat template: " + out.error().message};
  return out;
}

Result<std::string> RenderChatPrompt(const ChatSetup& setup,
                                     const std::vector<ChatMessage>& messages, const Tokenizer& tok,
                                     const ChatTools& tools, const ChatRenderOptions& options) {
  std::string text;
  if (setup.format == ChatFormat::kJinja) {
    Result<std::string> r = RenderChatJinja(setup, messages, options.add_generation_prompt,
                                            options.enable_thinking, tools, options.extra);
    if (!r.ok()) return r.error();
    text = std::move(*r);
  } else {
    if (setup.format == ChatFormat::kLlama3) {
      bool tool_turns = HasTools(tools);
      for (const ChatMessage& m : messages) {
        tool_turns = tool_turns || m.role == "tool" || !m.tool_calls.empty();
      }
      if (tool_turns) {
        return Error{
            "the built-in llama3 chat format renders no tools, tool calls or tool messages; "
            "start the server with --jinja to use the model's own template"};
      }
    }
    text = RenderChat(setup.format, messages, options.add_generation_prompt,
                      options.enable_thinking.value_or(true), setup.default_system, tools);
    if (setup.opens_thinking && options.add_generation_prompt &&
        options.enable_thinking.value_or(false)) {
      text += "<think>\n";
    }
  }
  if (tok.add_bos() && tok.bos() >= 0) {
    const std::string& bos = tok.TokenText(tok.bos());
    if (!bos.empty() && text.starts_with(bos)) {
      text.erase(0, bos.size());
    } else if (setup.format == ChatFormat::kLlama3 && text.starts_with(kLlama3Bos)) {
      // The built-in llama3 format on a model whose BOS is another token (llama.cpp's
      // built-in leaves the BOS to the tokenizer too).
      text.erase(0, kLlama3Bos.size());
    }
  }
  return text;
}

}  // namespace lamina::chat
