// Speculative decoding's rules: a drafter proposes tokens, the target verifies `[last, d1..dk]` as
// one batch with all logits through the same Session::Decode a prompt chunk takes (so every
// window cell goes through KvCache::Write), accepts the longest prefix its sampler agrees with
// plus its own next token (AcceptWindow), and truncates the rest; the engine (src/engine/) runs
// the windows. At temperature 0 the emitted ids are those of plain
// greedy decoding; above it the accept rule (Sampler::SampleWithDraft) keeps the target's
// distribution. A controller stops drafting while it does not pay (measured tokens per second).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "runtime/generate.h"
#include "spec/drafter.h"

namespace lamina::spec {

struct SpecOptions {
  int draft_max = 8;     // tokens drafted per verify step (>= 1)
  int draft_min = 0;     // drafts shorter than this are not verified (a plain step instead)
  bool adaptive = true;  // stop drafting while speculative steps are slower than plain ones
};

struct SpecStats {
  int64_t drafted = 0;       // tokens proposed and verified
  int64_t accepted = 0;      // of which the target accepted
  int64_t verify_steps = 0;  // forward passes over a window with at least one draft
  int64_t plain_steps = 0;   // forward passes over one token
  int64_t emitted = 0;       // tokens emitted by decode steps (verify and plain)
  double draft_seconds = 0.0;
  double acceptance() const { return drafted > 0 ? double(accepted) / double(drafted) : 0.0; }
  // Tokens emitted per verify step (accepted drafts + the target's own token).
  double tokens_per_verify() const {
    return verify_steps > 0 ? double(accepted + verify_steps) / double(verify_steps) : 0.0;
  }
  void Add(const SpecStats& o);
};

// Decides per step whether to draft and how much. Throughput: an exponential average of tokens
// per second over speculative steps and over plain ones; speculation pauses when it is below 0.95
// of plain (8 steps, doubling to 256 while it keeps losing) and is tried again after. Length:
// after a window whose drafts were all accepted the next may be 2 longer (up to the maximum);
// after a rejection it is one more than what was accepted.
class DraftController {
 public:
  explicit DraftController(bool adaptive) : adaptive_(adaptive) {}
  bool ShouldDraft() const;
  // The most tokens to draft this step (at most max_tokens).
  int DraftLength(int max_tokens) const;
  // A finished step: whether the drafter was asked (a step that asked and got no draft pays
  // for asking, so it counts as speculative), drafted and accepted tokens, tokens emitted,
  // seconds (draft + verify).
  void Record(bool asked, int drafted, int accepted, int emitted, double seconds);

 private:
  bool adaptive_;
  double plain_rate_ = 0.0;  // tokens/s, exponential average
  double spec_rate_ = 0.0;
  int n_plain_ = 0;
  int n_spec_ = 0;      // speculative steps since the last pause
  int pause_left_ = 0;  // plain steps left in the current pause
  int backoff_ = 8;
  int length_ = 1 << 30;  // the current draft length cap
};

// The most draft tokens worth verifying on sequence `seq` of `session` this step: draft_max,
// capped by what could ever be kept: the room left in the sequence's context after the token
// the window starts with, the generation's remaining tokens after it (remaining < 0: no limit)
// and, for a hybrid model, the ring of recurrent states a rejected draft is rolled back within
// (further back Truncate could not restore the state exactly). <= 0: do not draft. The
// engine caps every window with it.
int DraftBudget(const Session& session, int seq, int draft_max, int remaining);

// One verify window's outcome: window[0..used] keep their cells (the tokens whose logits were
// used; the rest are rejected drafts), `accepted` drafts were kept, `emitted` tokens sampled,
// and `last` is the final step (done when generation ended).
struct WindowOutcome {
  int used = 0;
  int accepted = 0;
  int emitted = 0;
  Generator::Step last;
};

// The one accept rule of every verify window (the engine's, for the CLI and the server alike): row
// i of `rows` ([draft.size() + 1, n_vocab]) predicts the token after window[i]; drafts are accepted
// while the generator's sampler agrees (Generator::NextWithDraft), and the first rejection — or the
// row after the last draft — gives the target's own token and ends the window. on_step(i, step,
// logits) sees every step (its text and token) and returns false to stop after it (a cancelled
// request).
WindowOutcome AcceptWindow(Generator& gen, const float* rows, int n_vocab,
                           const std::vector<int32_t>& draft,
                           const std::function<bool(int, Generator::Step&, const float*)>& on_step);

}  // namespace lamina::spec
