// The other protocols `lamina serve` speaks (Anthropic's Messages API, OpenAI's Responses API,
// Ollama's API), at the edge: each request body is mapped onto the OpenAI chat body (or the
// native completion body) that api::ParseChat / api::ParseCompletion read, and each answer is
// written from the engine's events by the protocol's Formatter. docs/SERVER.md, "Other
// protocols", lists the fields.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "api.h"

namespace lamina::cli::protocols {

using api::ApiError;
using api::json;

// Signs thinking blocks for one tenant: HMAC-SHA256 (OpenSSL) of the tenant's cache scope and
// the thinking text under a key drawn when the server starts, base64. A thinking block a client
// sends back is used (as the turn's reasoning_content) only when its signature is this server's
// for the same tenant and text; any other — another server's, another tenant's, edited, or one
// from before a restart — is left out of the prompt, as unsigned ones always were.
class ThinkingSigner {
 public:
  ThinkingSigner();  // a fresh random key
  std::string Sign(const std::string& scope, const std::string& thinking) const;
  bool Verify(const std::string& scope, const std::string& thinking,
              const std::string& signature) const;

 private:
  unsigned char key_[32];
};

// POST /v1/messages (count_only: /v1/messages/count_tokens, where max_tokens is not needed) →
// an OpenAI chat body. An assistant turn's thinking blocks that `signer` verifies for `scope`
// become its reasoning_content (signer null: none are used).
bool AnthropicToChat(const json& body, bool count_only, json* out, ApiError* err,
                     const ThinkingSigner* signer = nullptr, const std::string& scope = "");
// POST /api/chat → an OpenAI chat body ("stream" defaults to true).
bool OllamaChatToChat(const json& body, json* out, ApiError* err);
// POST /api/generate → an OpenAI chat body, or with "raw": true a native completion body
// (*raw set).
bool OllamaGenerateToBody(const json& body, json* out, bool* raw, ApiError* err);

// Error bodies: Anthropic's {"type":"error","error":{"type","message"}}, Ollama's {"error"}.
json AnthropicError(const ApiError& e);
json OllamaError(const ApiError& e);

// POST /v1/responses (OpenAI's Responses API, stateless: no previous_response_id, nothing
// stored) → an OpenAI chat body. *echo: the request's settings a response object repeats.
bool ResponsesToChat(const json& body, json* out, json* echo, ApiError* err);

// What a formatter knows of the request it answers.
struct AnswerInfo {
  std::string model;
  int prompt_tokens = 0;
  bool parse_tool_calls = false;
  std::vector<std::string> tool_names;
  // The thinking block: how it is returned (kNone: as content), and whether the prompt opened it.
  chat::ReasoningFormat reasoning_format = chat::ReasoningFormat::kNone;
  bool thinking_at_start = false;
  // Anthropic's thinking blocks are signed for this tenant (null: an empty signature).
  const ThinkingSigner* signer = nullptr;
  std::string scope;
  // gpt-oss's harmony answer (api::Completion::harmony): the analysis channel is the reasoning,
  // messages to functions.NAME the tool calls, the final channel the content (chat/answer.h).
  bool harmony = false;
};

// One protocol's answer (one choice) from the engine's events: a whole JSON answer, or a
// stream (Start, then Text per released piece, then Done; StreamError on a failure).
class Formatter {
 public:
  virtual ~Formatter() = default;
  virtual const char* stream_type() const = 0;
  virtual json Whole(const std::string& text, const serve::Event& done) = 0;
  virtual std::string Start() = 0;
  virtual std::string Text(const std::string& piece) = 0;
  virtual std::string Done(const serve::Event& done) = 0;
  virtual json Error(const ApiError& e) const = 0;
  virtual std::string StreamError(const ApiError& e) const = 0;
};

std::unique_ptr<Formatter> MakeAnthropicFormatter(AnswerInfo info);
// echo: what ResponsesToChat set aside.
std::unique_ptr<Formatter> MakeResponsesFormatter(AnswerInfo info, json echo);
// generate: /api/generate's "response" pieces, else /api/chat's "message".
std::unique_ptr<Formatter> MakeOllamaFormatter(AnswerInfo info, bool generate);

// The time as Ollama writes it (RFC 3339, UTC, microseconds).
std::string OllamaTime(double seconds_since_epoch);

}  // namespace lamina::cli::protocols
