// Chat prompt formats recognised from a GGUF's tokenizer.chat_template text: ChatML (Qwen2 /
// Qwen2.5), Qwen3's ChatML with its thinking switch, and Llama-3's header format. The Jinja
// templates are not interpreted; each known format is rendered the way its official template
// renders plain-text conversations (no tools).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace lamina {

enum class ChatFormat { kChatML, kQwen3, kLlama3, kUnknown };

struct ChatMessage {
  std::string role;  // "system", "user", "assistant" (ChatML formats also take "tool")
  std::string content;
};

// The format a template text belongs to, from markers only that format uses.
ChatFormat DetectChatFormat(std::string_view template_text);

// A template's built-in system prompt, used when the conversation has none (Qwen2.5's
// "You are Qwen, created by Alibaba Cloud. ..."); empty when it has none.
std::string DefaultSystemPrompt(std::string_view template_text);

// The prompt text for `messages`. add_generation_prompt appends the assistant header. For
// kQwen3, enable_thinking=false appends the empty think block "<think>\n\n</think>\n\n" after
// it (as the official template does) and earlier assistant turns lose their reasoning. kLlama3
// output starts with "<|begin_of_text|>", so it must be tokenized without adding another BOS.
// Special-token text in the result is meant to be tokenized with parse_special=true.
std::string RenderChat(ChatFormat format, const std::vector<ChatMessage>& messages,
                       bool add_generation_prompt, bool enable_thinking = true,
                       std::string_view default_system = {});

// A model's chat setup: the format its template belongs to and its built-in system prompt.
struct ChatSetup {
  ChatFormat format = ChatFormat::kUnknown;
  std::string default_system;
};
ChatSetup ChatSetupFromTemplate(std::string_view template_text);

// The prompt text of a conversation ending with the assistant header, ready for
// Encode(text, add_special=true, parse_special=true): a leading BOS text (Llama-3's
// "<|begin_of_text|>") is dropped when the tokenizer adds BOS itself, so it is not doubled.
// Thinking is off for Qwen3 (the empty think block).
std::string RenderChatPrompt(const ChatSetup& setup, const std::vector<ChatMessage>& messages,
                             const Tokenizer& tokenizer);

}  // namespace lamina
