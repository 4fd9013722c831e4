// The speculative generation loop and its draft controller (see speculative.h).
#include "spec/speculative.h"

#include <algorithm>

#include "util/timer.h"

namespace lamina::spec {

void SpecStats::Add(const SpecStats& o) {
  drafted += o.drafted;
  accepted += o.accepted;
  verify_steps += o.verify_steps;
  plain_steps += o.plain_steps;
  emitted += o.emitted;
  draft_seconds += o.draft_seconds;
}

bool DraftController::ShouldDraft() const {
  if (!adaptive_) return true;
  if (n_plain_ < 2) return false;  // a plain baseline first
  return pause_left_ == 0;
}

int DraftController::DraftLength(int max_tokens) const {
  return adaptive_ ? std::max(1, std::min(max_tokens, length_)) : max_tokens;
}

void DraftController::Record(bool asked, int drafted, int accepted, int emitted, double seconds) {
  if (!adaptive_ || seconds <= 0.0) return;
  constexpr double kAlpha = 0.25;
  const double rate = std::max(1, emitted) / seconds;
  if (!asked) {
    plain_rate_ = n_plain_ == 0 ? rate : plain_rate_ + kAlpha * (rate - plain_rate_);
    ++n_plain_;
    if (pause_left_ > 0) --pause_left_;
    return;
  }
  if (drafted > 0) length_ = accepted == drafted ? std::min(length_, drafted) + 2 : accepted + 1;
  spec_rate_ = n_spec_ == 0 ? rate : spec_rate_ + kAlpha * (rate - spec_rate_);
  ++n_spec_;
  if (n_spec_ < 3) return;
  if (spec_rate_ < plain_rate_) {
    pause_left_ = backoff_;
    backoff_ = std::min(256, backoff_ * 2);
    n_spec_ = 0;
  } else if (n_spec_ >= 16) {
    backoff_ = 8;  // it pays: a later loss pauses briefly again
  }
}

int DraftBudget(const Session& session, int seq, int draft_max, int remaining) {
  // Drafts beyond the room left or the token budget could never be kept.
  int k_max = std::min(draft_max, session.n_ctx() - session.n_past(seq) - 1);
  if (remaining >= 0) k_max = std::min(k_max, remaining - 1);
  // A hybrid model rolls its recurrent state back exactly only within its ring of states.
  if (!session.recurrent().empty()) k_max = std::min(k_max, session.recurrent().ring() - 1);
  return k_max;
}

WindowOutcome AcceptWindow(
    Generator& gen, const float* rows, int n_vocab, const std::vector<int32_t>& draft,
    const std::function<bool(int, Generator::Step&, const float*)>& on_step) {
  WindowOutcome out;
  const int k = static_cast<int>(draft.size());
  for (int i = 0;; ++i) {
    const float* logits = rows + static_cast<size_t>(i) * n_vocab;
    bool accepted = false;
    out.last = i < k ? gen.NextWithDraft(logits, n_vocab, draft[i], nullptr, &accepted)
                     : gen.Next(logits, n_vocab);
    out.used = i;
    if (out.last.token >= 0) ++out.emitted;
    if (accepted) ++out.accepted;
    const bool go_on = on_step(i, out.last, logits);
    if (out.last.done || !go_on || !accepted) break;
  }
  return out;
}

}  // namespace lamina::spec
