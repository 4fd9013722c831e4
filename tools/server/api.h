// The JSON side of `lamina serve`: request bodies (OpenAI and llama-server fields) mapped onto
// typed serve::Request values with type checks, and events mapped back onto response JSON.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "../value_ranges.h"
#include "chat/chat_template.h"
#include "chat/reasoning.h"
#include "model/model.h"
#include "serve/request.h"
#include "server.h"

namespace lamina::cli::api {

using json = nlohmann::ordered_json;  // members keep their order (JSON schemas, responses)

// A client error: HTTP status, llama-server error type, message; `extra` members go into the
// error object beside them (exceed_context_size_error: n_prompt_tokens and n_ctx).
struct ApiError {
  int status = 400;
  std::string type = "invalid_request_error";
  std::string message;
  json extra = json::object();
};
json ErrorBody(const ApiError& e);
// An engine error event (serve::ErrorKind) as the HTTP edge answers it: the status and
// llama-server's error type (503 unavailable_error, 400 invalid_request_error, 400
// exceed_context_size_error with n_prompt_tokens and n_ctx, 500 server_error) and its message.
ApiError EventError(const serve::Event& e);

// Request defaults from the command line.
struct Defaults {
  GenerateParams params;
  long long seed = -1;  // -1: random per request
  // A conversation ending with an assistant message continues that message (llama-server's
  // default; --no-prefill-assistant turns it off).
  bool prefill_assistant = true;
  // A slot's context: a prompt over it is refused (400 exceed_context_size_error with
  // n_prompt_tokens and n_ctx) before the request is copied for its choices. 0: not checked
  // here (the caller checks).
  int n_ctx_slot = 0;
  int n_keep = 0;  // --keep: prompt tokens a context shift keeps (-1: all); a request's n_keep wins
  bool verbose = false;  // --verbose: answers carry __verbose unless the request says otherwise
  // Reasoning (--reasoning-format, --reasoning, --reasoning-budget[-message],
  // --chat-template-kwargs): how a chat answer's thinking block is returned, whether templates
  // think (enable_thinking), the thinking budget in tokens (-1: none) and the text forced before
  // the close tag, and template variables of every request.
  chat::ReasoningFormat reasoning_format = chat::ReasoningFormat::kDeepseek;
  std::optional<bool> enable_thinking;  // none: the template's default
  int reasoning_budget = -1;
  std::string reasoning_budget_message;
  json chat_template_kwargs = json::object();
};

// Hard caps on chat_template_kwargs: members, and the object as compact JSON.
inline constexpr size_t kMaxTemplateKwargs = 64;
inline constexpr size_t kMaxTemplateKwargsBytes = 64 << 10;

// Hard caps on one request's work and memory (docs/SERVER.md, "Limits"). Each is refused with a
// 400 invalid_request_error naming the field and the limit.
// Most choices one request may ask for (`n`, `n_cmpl`).
inline constexpr int kMaxChoices = 16;
// Most completions one request may ask for: prompts times choices.
inline constexpr size_t kMaxCompletions = 64;
// Stop strings: a request's count and each one's length in bytes (every step of every slot
// searches the pending text for each, and holds back what could start one).
inline constexpr size_t kMaxStops = 16;
inline constexpr size_t kMaxStopBytes = 256;
// logit_bias: entries (keys or pairs) in the body, and the bytes of a text key (each of its
// tokens is biased). The biases are summed per token (llama.cpp adds them up), so a request
// holds at most one per vocabulary token.
inline constexpr size_t kMaxLogitBiasEntries = 4096;
inline constexpr size_t kMaxLogitBiasTextBytes = 256;
// Biased tokens times completions: every completion holds its own copy.
inline constexpr size_t kMaxLogitBiasCopies = 1 << 20;
// |bias| at most this: a sum of biases stays a finite float.
inline constexpr double kMaxLogitBiasValue = 1e30;
// Log-probabilities per token (n_probs, logprobs, top_logprobs), as llama-server and OpenAI.
inline constexpr int kMaxLogprobs = 20;
// /tokenize: tokens in one answer (with pieces, about 30 bytes of JSON each plus the piece: a
// full answer is a few tens of MB; without, ids only, at most about 8 MB).
inline constexpr size_t kMaxTokenizeTokens = 1 << 20;
// /detokenize: tokens in one request, and the bytes of the text answered.
inline constexpr size_t kMaxDetokenizeTokens = 1 << 20;
inline constexpr size_t kMaxDetokenizeBytes = 16 << 20;

// A numeric request field and its range (value_ranges.h: the command line's rules where the
// field has a flag). Values outside it, NaN and infinities are refused with a 400 naming the
// field, the range and the value.
struct NumericField {
  std::string_view key;
  ValueRange range;
};
// Every numeric field of the completion routes, the one table the parsers check against.
// (`logprobs` is a count on /v1/completions and a boolean on the chat route.)
std::span<const NumericField> NumericFields();

// What a completion body asks beyond the typed request.
struct Completion {
  // n_choices per prompt, prompt-major: requests[p * n_choices + c] is choice c of prompt p.
  // Choice c samples with the request's seed + c, so a fixed seed gives n different,
  // reproducible answers and greedy sampling n equal ones.
  std::vector<serve::Request> requests;
  int n_choices = 1;  // OpenAI `n`, llama-server `n_cmpl`
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool return_tokens = false;  // llama-server: token ids in each answer
  // Log-probabilities asked for: chat `logprobs` + `top_logprobs`, completions `logprobs: N`,
  // native `n_probs: N` (the requests carry n_probs).
  bool logprobs = false;
  int top_logprobs = 0;
  // Native n_probs with post_sampling_probs: "prob" / "top_probs" entries after the sampler chain.
  bool post_sampling_probs = false;
  // llama-server's response_fields: only these keys of each native answer ("a/b" = the nested
  // key b of a, returned under the key "a/b"); empty: all.
  std::vector<std::string> response_fields;
  // llama-server's timings_per_token: each streamed chunk carries the timings so far.
  bool timings_per_token = false;
  // llama-server's return_progress (streaming only): prompt_progress chunks while the prompt is
  // evaluated.
  bool return_progress = false;
  // llama-server's `verbose`: an OpenAI-format answer (or its first streamed chunk) carries the
  // native answer, the rendered prompt included, as "__verbose".
  bool verbose = false;
  // Chat: how a thinking block in the answer is returned (kNone on the other routes), and
  // whether the prompt opened one (the answer starts inside it).
  chat::ReasoningFormat reasoning_format = chat::ReasoningFormat::kNone;
  bool thinking_at_start = false;
  // Tool calling (chat): the output is read for tool calls (`tools` given and `tool_choice` not
  // "none"); the offered tools' names.
  bool parse_tool_calls = false;
  std::vector<std::string> tool_names;
  // Chat with a harmony template (gpt-oss, ChatSetup::harmony): the answer is read by
  // chat/harmony.h, its analysis channel as reasoning_content and its calls as tool_calls.
  bool harmony = false;
};

// Hard caps on a request's tools.
inline constexpr size_t kMaxTools = 128;
inline constexpr size_t kMaxToolsBytes = 256 << 10;  // the `tools` array as compact JSON
inline constexpr size_t kMaxToolCallsPerMessage = 128;

// A chat body's `tools`, `tool_choice` and `parallel_tool_calls`, checked.
struct ToolRequest {
  json tools = json::array();  // the offered tools (validated), empty when none
  std::vector<std::string> names;
  // "none" (tools neither rendered nor parsed), "auto", "required" or "function" (one named
  // tool, `forced`).
  std::string choice = "none";
  std::string forced;
  bool parallel = false;  // llama-server's default
  bool active() const { return !tools.empty() && choice != "none"; }
};
bool ReadTools(const json& body, ToolRequest* out, ApiError* err);

// The grammar that forces a tool call for `tool_choice` "required" or a named function:
// `<tool_call>\n{"name": <a tool's name>, "arguments": <its parameters' schema, or any
// object when the schema converter cannot take it>}\n</tool_call>`, one or (parallel) more.
bool ToolCallGrammar(const ToolRequest& tools, std::string* gbnf, std::string* root, ApiError* err);
// The same for a harmony (gpt-oss) template: one message `<|channel|>commentary
// to=functions.NAME <|constrain|>json<|message|>ARGUMENTS` (the one callable tool's parameters
// schema, or any object when several may be called or the converter cannot take it); one call,
// since the message after it would start past <|call|>, which ends the answer.
bool HarmonyToolCallGrammar(const ToolRequest& tools, std::string* gbnf, std::string* root,
                            ApiError* err);

// Fills the sampling and control fields shared by every completion route from `body`.
bool ReadParams(const json& body, const Defaults& defaults, serve::Request* out, ApiError* err);

// logit_bias as llama-server and OpenAI take it: an object {"id" or "text": bias} or an array
// of [id or text, bias] pairs; false = never; a text biases each of its tokens.
bool ReadLogitBias(const json& body, const Model& model, GenerateParams* params, ApiError* err);

// POST /completion and /v1/completions: "prompt" as text, token ids, a mix of both, or an
// array of prompts.
bool ParseCompletion(const json& body, const Model& model, const Defaults& defaults, bool oai,
                     Completion* out, ApiError* err);

// "messages" rendered with the chat setup (the prompt text, before tokenizing); also
// POST /apply-template and /v1/chat/completions/input_tokens. A last assistant message is
// continued (the conversation before it rendered with the generation prompt, then its text,
// left open) when `continue_final_message` is true, or when it is absent and
// defaults.prefill_assistant is on. Thinking: the body's chat_template_kwargs (merged over the
// server's; enable_thinking a boolean) and reasoning_effort ("none" turns thinking off; also a
// template variable), else defaults.enable_thinking.
bool RenderMessages(const json& body, const Model& model, const chat::ChatSetup& chat,
                    const Defaults& defaults, std::string* prompt, ApiError* err);

// POST /v1/chat/completions: "messages" rendered with the chat setup.
bool ParseChat(const json& body, const Model& model, const chat::ChatSetup& chat,
               const Defaults& defaults, Completion* out, ApiError* err);

// Tokenizes text with BOS as the vocabulary says and special tokens parsed (llama-server's
// prompt handling).
std::vector<int32_t> TokenizePrompt(const Model& model, const std::string& text, bool add_special);

// OpenAI finish_reason for a stop reason ("stop" or "length").
const char* FinishReason(StopReason reason);
// llama-server stop_type ("eos", "word", "limit", "none").
const char* StopType(StopReason reason);

// llama-server's "timings" object.
json TimingsJson(const serve::Timings& t);

// A token's piece for /tokenize with_pieces: the text, or its byte values when it is not
// valid UTF-8 on its own (a byte-fallback piece).
json PieceJson(const std::string& piece);

// POST /tokenize: {"content", "add_special" (false), "with_pieces" (false), "parse_special"
// (true)} → the answer's JSON text, {"tokens": [id, ...]} or {"tokens": [{"id", "piece"}, ...]}.
// Over kMaxTokenizeTokens tokens is a 400 naming the count and the limit. Written as text, not
// as a JSON value, so an answer costs its bytes and no more.
bool TokenizeAnswer(const json& body, const Model& model, std::string* answer, ApiError* err);

// POST /detokenize: {"tokens": [id, ...]} → the answer's JSON text, {"content": text}. Over
// kMaxDetokenizeTokens tokens, or a text over kMaxDetokenizeBytes, is a 400 naming the limit.
bool DetokenizeAnswer(const json& body, const Model& model, std::string* answer, ApiError* err);

}  // namespace lamina::cli::api
