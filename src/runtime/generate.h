// A sequence's generation state: sampling, stop rules (end-of-generation tokens, stop strings, the
// token budget), the streaming detokenizer, and prompt-prefix reuse. Generator turns logits into
// tokens and text and never evaluates anything, so the engine (src/engine/) can step many of them
// over one batched forward pass; `run`, `chat`, the probe and the server all reach it there.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "runtime/grammar.h"
#include "runtime/sampler.h"
#include "runtime/session.h"
#include "tokenizer/tokenizer.h"

namespace lamina {

struct GenerateParams {
  SamplerConfig sampler;
  int n_predict = -1;             // tokens to generate at most; < 0: until a stop rule
  std::vector<std::string> stop;  // stop strings (the text ends before the first one)
  bool ignore_eos = false;        // keep going past end-of-generation tokens
  // When set, only tokens that keep the output a prefix of a sentence of this grammar are
  // sampled (GBNF; JSON schemas are converted to it), and generation ends when it is complete.
  std::shared_ptr<const Grammar> grammar;
  // Added to a token's logit before the sampler chain (-inf: never sampled), as llama.cpp's
  // logit-bias sampler; later entries for the same token add up. When no token is left (all
  // at -inf, or all the grammar allows), generation ends as at an end-of-generation token.
  std::vector<std::pair<int32_t, float>> logit_bias;
  // A thinking budget (llama-server's --reasoning-budget): when >= 0, once this many tokens were
  // generated inside the thinking block (a `<think>` that opens the answer, or one the prompt
  // opened: thinking_at_start), the tokens of think_close are forced, which ends the block (a
  // model in the middle of its own close tag may finish it first). Not applied with a grammar.
  int reasoning_budget = -1;
  bool thinking_at_start = false;
  std::vector<int32_t> think_close;  // the close tag's tokens
};

enum class StopReason {
  kNone,         // still generating
  kEos,          // the model chose an end-of-generation token
  kStopString,   // a stop string appeared
  kLimit,        // n_predict tokens were generated
  kContextFull,  // the sequence's context has no room for the next token
  kCancelled,    // the caller stopped it
};
const char* StopReasonName(StopReason reason);

// One sequence's generation state. Feed it the logits of the last evaluated token; it samples
// the next token and says what text became final. Text that could still be the start of a stop
// string is held back until it is known not to be.
class Generator {
 public:
  // `history`: the tokens the sequence holds so far (the prompt), for the repetition penalty.
  Generator(const Tokenizer& tokenizer, const GenerateParams& params, std::vector<int32_t> history);

  struct Step {
    int32_t token = -1;  // the sampled token (-1 when none was added: end of generation)
    std::string text;    // text that became final with this step
    bool done = false;   // no more steps; when false, `token` must be evaluated next
  };
  // logits: [n_vocab] of the last evaluated token.
  Step Next(const float* logits, int n_vocab);
  // The same for a position whose next token was drafted: the speculative accept rule
  // (Sampler::SampleWithDraft) picks the token; *accepted says whether it is `draft`.
  Step NextWithDraft(const float* logits, int n_vocab, int32_t draft,
                     const std::vector<TokenProb>* q, bool* accepted);
  // Tokens still allowed by n_predict (-1: no limit).
  int remaining() const {
    return params_.n_predict < 0
               ? -1
               : std::max(0, params_.n_predict - static_cast<int>(generated_.size()));
  }
  // Ends generation for a reason of the caller (context full, cancelled); returns the text
  // still held back (an incomplete UTF-8 tail, a possible stop-string prefix).
  std::string Finish(StopReason reason);

  bool done() const { return reason_ != StopReason::kNone; }
  StopReason reason() const { return reason_; }
  const std::string& stop_word() const { return stop_word_; }  // the stop string that matched
  const std::vector<int32_t>& generated() const { return generated_; }  // sampled tokens
  const std::string& text() const { return text_; }                     // the final text so far
  const std::vector<int32_t>& history() const { return history_; }
  // The distribution the last sampled token was drawn from, after the sampler chain (and the
  // logit biases and the grammar's mask): llama-server's post-sampling probabilities.
  const std::vector<TokenProb>& last_distribution() const { return sampler_.last_distribution(); }

 private:
  // Adds a chosen token (or ends at an end-of-generation token) and releases text.
  Step Emit(int32_t id);
  // Moves pending_ text to the output as far as stop strings allow; returns what was released.
  std::string Release(bool final);
  // The logits with the logit biases added (biased_), or logits itself when there are none.
  const float* Bias(const float* logits, int n_vocab);
  // With a grammar: the logits with every token it does not allow at -inf (masked_), or
  // nullptr when it allows none; without one, logits itself.
  const float* Constrain(const float* logits, int n_vocab);
  // The sampler's greedy choice when the grammar allows it (then it is also the constrained
  // arg max), else -1.
  int32_t GreedyIfAllowed(const float* logits, int n_vocab);
  bool GrammarAllows(int32_t id);
  // The thinking budget: the token to force next (-1: none), and the state after a token.
  int32_t ForcedToken();
  void TrackThinking(int32_t id);

  const Tokenizer& tokenizer_;
  GenerateParams params_;
  Sampler sampler_;
  StreamingDetokenizer detok_;
  std::vector<int32_t> history_;
  // The generated text begins the document (no history but BOS): its first token loses its
  // leading space, for the grammar as in the text. Otherwise it continues the prompt.
  bool text_starts_;
  std::vector<int32_t> generated_;
  // The thinking budget's state: inside the block, the tokens generated in it, the close tag
  // being forced (its next token at forced_at_), the start of the answer's raw text while it may
  // still open a block.
  bool thinking_ = false;
  bool thinking_decided_ = false;
  int thinking_tokens_ = 0;
  size_t forced_at_ = 0;
  bool forcing_ = false;
  std::string think_head_;
  std::string think_tail_;  // the last bytes of the raw text inside the block
  std::string text_;        // released text
  std::string pending_;     // decoded, not yet released (may begin a stop string)
  StopReason reason_ = StopReason::kNone;
  std::string stop_word_;
  std::optional<GrammarMatcher> matcher_;
  std::vector<uint8_t> allowed_;  // [n_vocab] Constrain's scratch: the grammar's mask
  std::vector<float> masked_;     // [n_vocab] Constrain's result
  std::vector<float> biased_;     // [n_vocab] Bias's result
};

// Keeps the longest prefix that sequence `seq` of the session shares with `prompt`, always
// leaving at least the last prompt token to evaluate (its logits start generation); truncates
// the rest and returns the number of cells kept.
int ReusePrefix(Session& session, int seq, const std::vector<int32_t>& prompt);

struct GenerateOptions {
  GenerateParams params;
  int prompt_chunk = 0;      // prompt tokens per forward pass; 0: the whole prompt at once
  bool reuse_prefix = true;  // keep the cells the sequence already shares with the prompt
};

struct GenerateResult {
  int n_prompt = 0;             // prompt tokens
  int n_cached = 0;             // of which reused from the sequence's cells
  std::vector<int32_t> tokens;  // generated
  std::string text;
  StopReason reason = StopReason::kNone;
  std::string stop_word;
  double prompt_seconds = 0.0;
  double decode_seconds = 0.0;
};

}  // namespace lamina
