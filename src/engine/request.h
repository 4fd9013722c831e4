// Typed requests and the events that answer them: what a caller of the engine submits and what
// it receives. No JSON and no protocol here: the HTTP layer (tools/server/) maps its JSON onto
// these, the CLI fills them from its flags.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/generate.h"
#include "spec/speculative.h"

namespace lamina::engine {

// One completion: a tokenized prompt and how to continue it.
struct Request {
  std::vector<int32_t> prompt;  // [n_prompt] token ids, BOS included when wanted
  GenerateParams params;
  int id_slot = -1;          // the slot to run in (-1: the engine picks)
  bool cache_prompt = true;  // reuse the cells a slot already shares with the prompt
  int n_keep = 0;            // context shift: prompt tokens always kept (-1: the whole prompt)
  int n_probs = 0;           // > 0: each sampled token's log-probability and the top n_probs
  // With n_probs: probabilities after the sampler chain instead of log-probabilities of the raw
  // logits (the top list holds at most the candidates the chain kept).
  bool post_sampling_probs = false;
  // Speculative decoding, when the engine drafts (llama-server's speculative.n_max / n_min /
  // p_min): -1 / < 0 = the engine's setting; draft_max 0 turns drafting off for this request.
  int draft_max = -1;
  int draft_min = -1;
  float draft_p_min = -1.0f;
  // kProgress events after each batch of prompt tokens (llama-server's return_progress).
  bool return_progress = false;
  // Requests of one group share one prompt (the choices of an `n` request): while a member is
  // still evaluating it, the others wait in the queue, then copy its cells (0: no group).
  uint64_t prefix_group = 0;
  // The prefix cache's tenant (opaque; the server derives it from the API key and the request's
  // cache_salt; empty: the default scope). A request reuses only cells written under its own
  // scope: a slot holding another scope's cells counts as empty (cache_n 0), and which slot it
  // is given never depends on what another scope's slots hold.
  std::string cache_scope;
};

// A token's log-probability under the model (softmax of its raw logits).
struct TokenLogprob {
  int32_t id = 0;
  float logprob = 0.0f;
};

struct Timings {
  int prompt_n = 0;     // prompt tokens evaluated (not reused)
  int cache_n = 0;      // prompt tokens reused from the slot's cells
  int predicted_n = 0;  // tokens generated
  double prompt_ms = 0.0;
  double predicted_ms = 0.0;
  int64_t draft_n = 0;           // speculative decoding: tokens drafted for this request
  int64_t draft_n_accepted = 0;  // of which accepted
};

// Prompt processing progress: the prompt's tokens, those reused from the slot's cells, those in
// the cells so far (reused included) and the milliseconds since the request started.
struct Progress {
  int total = 0;
  int cache = 0;
  int processed = 0;
  double time_ms = 0.0;
};

// Why the engine ended a request with an error. The engine knows no protocol: tools/server maps
// each kind to an HTTP status and llama-server's error type (api::EventError).
enum class ErrorKind {
  kNone,
  kShuttingDown,     // the server is stopping (or stopped) before the answer ended
  kBadRequest,       // the request cannot run: an empty prompt, a slot that does not exist
  kContextExceeded,  // the prompt is longer than a slot's context (n_prompt_tokens, n_ctx)
  kEngineFailure,    // a forward pass failed
};

struct Event {
  enum class Kind { kText, kProgress, kDone, kError };
  Kind kind = Kind::kText;
  // kText: final text released with these sampled tokens (either may be empty, not both).
  std::string text;
  std::vector<int32_t> tokens;
  // With Request::n_probs > 0, per sampled token: its own log-probability and the top n_probs
  // ([tokens.size()] each); with post_sampling_probs, probabilities (in the logprob field).
  std::vector<TokenLogprob> logprobs;
  std::vector<std::vector<TokenLogprob>> top_logprobs;
  // kProgress (with Request::return_progress)
  Progress progress;
  // kDone
  StopReason reason = StopReason::kNone;
  std::string stop_word;
  bool truncated = false;  // the context filled up (or was shifted)
  int slot = -1;
  int n_ctx = 0;         // the slot's context
  Timings timings;       // kDone: the request's; kText: so far
  spec::SpecStats spec;  // kDone: the request's drafting figures (speculative decoding)
  // kError: what went wrong, in the engine's terms (the HTTP edge maps it to a status and an
  // error type), and a message.
  ErrorKind error = ErrorKind::kNone;
  std::string message;
  int n_prompt_tokens = 0;  // exceed_context_size_error: both numbers
};

// Where the engine delivers a request's events, in order: kText pieces (and kProgress), then one
// kDone or kError. A cancelled request (cancelled() turned true) gets the text still held back
// and a kDone whose reason is kCancelled. Push is called on the thread that steps the engine.
class EventSink {
 public:
  virtual ~EventSink() = default;
  virtual void Push(Event event) = 0;
  virtual bool cancelled() const = 0;
};

}  // namespace lamina::engine
