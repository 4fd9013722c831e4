// What the probe needs from a model under test, supplied by its caller: greedy answers to a user
// turn (every generation probe) and, where the backend can, teacher-forced logits and the KV
// cache behind them (prefill, divergence). A local Session (local_backend.h) offers both; a
// server reached over HTTP (tools/) offers answers only. Every call starts a fresh sequence.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/kv_cache.h"
#include "util/status.h"

namespace lamina::probe {

struct GenerationRequest {
  std::string user;    // one user turn; the backend applies the model's chat template
  int max_tokens = 0;  // budget of generated tokens
  // Checked on the text after every generated token; true ends the generation there. A backend
  // that cannot check while generating applies it to the finished text (cutting it where it
  // first returns true).
  std::function<bool(const std::string&)> stop;
  // A GBNF grammar the answer must follow (constrained decoding); "" for none.
  std::string grammar;
  // Thinking on: the user turn rendered with the template's enable_thinking = true (the model
  // writes its thought, </think>, then the answer; the text comes back with the block as
  // generated). Off: the answer alone, as every probe but the thinking probe asks.
  bool thinking = false;
};

struct Generation {
  int n_tokens = 0;  // generated
  std::string text;
  bool error = false;
  std::string error_message;
  bool ended_turn = false;  // the model chose end-of-generation (not the budget or `stop`)
};

// One sequence fed by the probe: each Eval appends tokens and returns their logits.
class LogitStream {
 public:
  virtual ~LogitStream() = default;
  // Logits [n, n_vocab] when all_logits, else the last token's [n_vocab]; valid until the next
  // call.
  virtual Result<const float*> Eval(const int32_t* tokens, int n, bool all_logits) = 0;
  // The KV cache holding the sequence (sequence 0), for per-layer diagnostics; nullptr when
  // the backend cannot show it.
  virtual const KvCache* cache() const = 0;
};

// What a backend is and can do; the leg's row of the report takes its description from here.
struct BackendInfo {
  std::string kv;       // KV mode ("k8v4"); "" when unknown (a server)
  std::string v_round;  // "rtn" / "stochastic"; "" when unknown
  std::string fault = "none";
  std::optional<double> bits_per_element;
  std::optional<size_t> bytes_per_token;
  std::optional<int> kv_window;    // recent cells kept exact (0: none); unknown for a server
  bool logits = false;             // Tokenize, NewStream and the rest of the logit calls work
  std::string no_logits_reason;    // why not (the n/a reason of prefill and divergence)
  bool exact_token_counts = true;  // CountTokens is the model's tokenizer, not an estimate
};

class ProbeBackend {
 public:
  virtual ~ProbeBackend() = default;
  virtual BackendInfo Info() const = 0;
  // Tokens of plain text (no BOS; special-token text taken literally); an estimate when
  // Info().exact_token_counts is false.
  virtual int CountTokens(const std::string& text) = 0;
  // The greedy answer to one user turn, in a fresh sequence.
  virtual Generation Generate(const GenerationRequest& request) = 0;

  // Teacher-forced access, where Info().logits.
  virtual int n_vocab() const { return 0; }
  // Text to ids as a scored document: BOS per the vocabulary, special-token text literal.
  virtual std::vector<int32_t> Tokenize(const std::string& text) { return {}; }
  virtual std::string Detokenize(const std::vector<int32_t>& ids) { return ""; }
  // A fresh, empty sequence; nullptr when the backend has no logits.
  virtual std::unique_ptr<LogitStream> NewStream() { return nullptr; }
};

}  // namespace lamina::probe
