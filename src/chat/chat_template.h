// Chat prompt formats: ChatML (Qwen2 / Qwen2.5), Qwen3's ChatML with its thinking switch and
// Llama-3's header format, recognised from a GGUF's tokenizer.chat_template text and rendered
// natively the way their official templates render plain-text conversations; any other
// template (or any template, when asked) is rendered by the Jinja engine (jinja.h), as are the
// built-in Jinja sources of the other named formats (gemma, phi3, mistral-v7, deepseek3,
// gpt-oss's harmony, ...).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "chat/jinja.h"
#include "tokenizer/tokenizer.h"
#include "util/status.h"

namespace lamina::chat {

enum class ChatFormat { kChatML, kQwen3, kLlama3, kJinja, kUnknown };

// A tool call an assistant turn made (OpenAI's tool_calls[i]).
struct ChatToolCall {
  std::string id;
  std::string name;
  // The arguments as templates expect them: an object when the client's arguments are a JSON
  // object (or a string holding one), else the string as given.
  jinja::Value arguments;
};

struct ChatMessage {
  ChatMessage() = default;
  ChatMessage(std::string r, std::string c) : role(std::move(r)), content(std::move(c)) {}

  std::string role;  // "system", "user", "assistant", "tool"
  std::string content;
  std::vector<ChatToolCall> tool_calls;  // assistant turns
  std::string tool_call_id;              // tool turns: the call answered
  std::string name;                      // tool turns: the function's name, when given
  bool content_null = false;             // the client sent "content": null
  // Assistant turns: the thinking that came before the content, given apart (OpenAI-style
  // `reasoning_content`, a verified Anthropic thinking block); empty: none, or still inside
  // content as "<think>...</think>". Templates render it where they render thinking (Qwen3:
  // the turns after the last user query).
  std::string reasoning_content;
};

// Tools offered to the model: OpenAI's `tools` array as template values (each
// {"type": "function", "function": {"name", "description", "parameters"}}); none: no tools.
using ChatTools = jinja::Value;

// The format a template text belongs to, from markers only that format uses.
ChatFormat DetectChatFormat(std::string_view template_text);
// Whether a ChatML template opens a thinking block ("<think>\n") after the assistant header when
// enable_thinking is defined and true, and only then (the shipped model's template): such a
// template stays native ChatML (tools included), with ChatSetup::opens_thinking.
bool OpensThinkingOnRequest(std::string_view template_text);

// A template's built-in system prompt, used when the conversation has none (Qwen2.5's
// "You are Qwen, created by Alibaba Cloud. ..."); empty when it has none.
std::string DefaultSystemPrompt(std::string_view template_text);

// The prompt text for `messages`. add_generation_prompt appends the assistant header. For
// kQwen3, enable_thinking=false appends the empty think block "<think>\n\n</think>\n\n" after
// it (as the official template does) and earlier assistant turns lose their reasoning. kLlama3
// output starts with "<|begin_of_text|>", so it must be tokenized without adding another BOS.
// Special-token text in the result is meant to be tokenized with parse_special=true.
//
// Tools (kChatML, kQwen3), as Qwen2.5 / Qwen3 (Hermes style) templates render them: a system
// turn (the conversation's own system text, else for kChatML the default one, then "# Tools")
// listing each tool as JSON inside <tools></tools> and asking for
// <tool_call>{"name": ..., "arguments": ...}</tool_call>; assistant tool calls as such blocks
// after the turn's text; "tool" turns folded into one user turn of <tool_response> blocks.
// kLlama3 renders no tools (RenderChatPrompt refuses them).
std::string RenderChat(ChatFormat format, const std::vector<ChatMessage>& messages,
                       bool add_generation_prompt, bool enable_thinking = true,
                       std::string_view default_system = {}, const ChatTools& tools = {});

// A model's chat setup: the format its template belongs to and its built-in system prompt;
// for kJinja the parsed template and the texts its bos_token / eos_token variables hold.
struct ChatSetup {
  ChatFormat format = ChatFormat::kUnknown;
  std::string default_system;
  // kChatML that opens the thinking block when enable_thinking is true (OpensThinkingOnRequest)
  bool opens_thinking = false;
  std::shared_ptr<const jinja::Template> jinja;
  // The Jinja template renders gpt-oss's harmony format (IsHarmonyTemplate): messages carry
  // their reasoning as `thinking` too, and answers are read by chat/harmony.h.
  bool harmony = false;
  std::string bos_token, eos_token;
  jinja::RenderOptions render;  // strftime_now's clock (tests fix it)
};
// The native format of a template text (kUnknown when it is none of the three).
ChatSetup ChatSetupFromTemplate(std::string_view template_text);

// The names --chat-template accepts, comma-separated: the native formats (chatml, qwen3,
// llama3) and the built-in Jinja sources.
std::string ChatTemplateNames();
// The Jinja source of a built-in name (gemma, phi3, mistral-v7, deepseek3); empty otherwise.
std::string_view BuiltinJinjaTemplate(std::string_view name);
// Every built-in Jinja source's name, in registry order.
std::vector<std::string_view> BuiltinJinjaTemplateNames();
// A Jinja setup for `source` with the tokenizer's BOS / EOS texts; an Error names the
// template position when it does not parse.
Result<ChatSetup> ChatSetupFromJinja(std::string_view source, const Tokenizer& tokenizer);
// The setup for a --chat-template NAME (native or built-in Jinja); an Error lists the names.
Result<ChatSetup> ChatSetupFromName(std::string_view name, const Tokenizer& tokenizer);
// The setup for a model's tokenizer.chat_template: its native format when it is one of the
// three (unless force_jinja), else the template rendered by the Jinja engine.
Result<ChatSetup> ChatSetupForModel(std::string_view template_text, const Tokenizer& tokenizer,
                                    bool force_jinja);

// Renders a kJinja setup: messages (role, content: none for a null one beside tool calls;
// tool_calls as [{"id", "type": "function", "function": {"name", "arguments"}}], tool_call_id
// and name when given), bos_token, eos_token, add_generation_prompt, enable_thinking (undefined
// when none) and tools (none when there are none) are the template's variables.
// ChatJinjaContext: those variables (an object), as RenderChatJinja passes them.
jinja::Value ChatJinjaContext(const ChatSetup& setup, const std::vector<ChatMessage>& messages,
                              bool add_generation_prompt, std::optional<bool> enable_thinking,
                              const ChatTools& tools = {},
                              const jinja::Value& extra = jinja::Value());
Result<std::string> RenderChatJinja(const ChatSetup& setup,
                                    const std::vector<ChatMessage>& messages,
                                    bool add_generation_prompt, std::optional<bool> enable_thinking,
                                    const ChatTools& tools = {},
                                    const jinja::Value& extra = jinja::Value());

// How RenderChatPrompt renders: with the assistant header (add_generation_prompt), thinking on
// or off (enable_thinking: Qwen3's switch, and the variable of that name for a Jinja template;
// none: the template's own default, as Hugging Face's apply_chat_template leaves it: undefined
// for a Jinja template, on for Qwen3's native format),
// and more variables for a Jinja template (`extra`: an object, e.g. a request's
// chat_template_kwargs; None: none; its keys never replace messages, tools, bos_token,
// eos_token or add_generation_prompt).
struct ChatRenderOptions {
  bool add_generation_prompt = true;
  std::optional<bool> enable_thinking = false;
  jinja::Value extra;
};

// The prompt text of a conversation ending with the assistant header (unless
// add_generation_prompt is off), ready for Encode(text, add_special=true, parse_special=true): a
// leading BOS text (Llama-3's "<|begin_of_text|>") is dropped when the tokenizer adds BOS
// itself, so it is not doubled. By default thinking is off (Qwen3's empty think block). A Jinja
// template can fail (raise_exception, a limit), and kLlama3 refuses tools, tool calls and tool
// turns.
Result<std::string> RenderChatPrompt(const ChatSetup& setup,
                                     const std::vector<ChatMessage>& messages,
                                     const Tokenizer& tokenizer, const ChatTools& tools = {},
                                     const ChatRenderOptions& options = {});

}  // namespace lamina::chat
