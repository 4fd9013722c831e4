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
  if (spec_rate_ < 0.95 * plain_rate_) {
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

Result<GenerateResult> GenerateSpeculative(
    Session& session, int seq, const std::vector<int32_t>& prompt, const GenerateOptions& options,
    Drafter& drafter, const SpecOptions& spec, SpecStats* stats,
    const std::function<bool(const std::string&)>& on_text,
    const std::function<void(int, int)>& on_prompt_progress) {
  LAMINA_CHECK(spec.draft_max >= 1);
  Result<PromptEval> pe = EvalPrompt(session, seq, prompt, options, on_prompt_progress);
  if (!pe.ok()) return pe.error();
  GenerateResult result = BeginResult(prompt, *pe);
  const double t_prepare = NowSeconds();
  Status prepared = drafter.Prepare(prompt);
  if (!prepared.ok()) return prepared.error();
  result.prompt_seconds += NowSeconds() - t_prepare;
  const double t1 = NowSeconds();

  const int n_vocab = session.model().hparams().n_vocab;
  Generator gen(session.model().tokenizer(), options.params, prompt);
  SpecStats local;
  DraftController controller(spec.adaptive);
  bool cancelled = false;
  auto emit = [&](const std::string& text) {
    if (!text.empty() && on_text && !on_text(text)) cancelled = true;
  };
  Generator::Step step = gen.Next(pe->logits, n_vocab);
  emit(step.text);
  std::vector<int32_t> draft;   // [<= draft_max]
  std::vector<int32_t> window;  // [1 + draft.size()] the last token, then the drafts
  while (!step.done) {
    if (cancelled) {
      gen.Finish(StopReason::kCancelled);
      break;
    }
    const int room = session.n_ctx() - session.n_past(seq);
    if (room <= 0) {
      emit(gen.Finish(StopReason::kContextFull));
      break;
    }
    const double t_step = NowSeconds();
    const int k_max = DraftBudget(session, seq, spec.draft_max, gen.remaining());
    draft.clear();
    const bool asked = k_max > 0 && controller.ShouldDraft();
    if (asked) {
      Status s = drafter.Draft(gen.history(), controller.DraftLength(k_max), &draft);
      if (!s.ok()) return s.error();
      if (static_cast<int>(draft.size()) > k_max) draft.resize(k_max);
      if (static_cast<int>(draft.size()) < spec.draft_min) draft.clear();
    }
    const double t_drafted = NowSeconds();
    local.draft_seconds += t_drafted - t_step;
    window.assign(1, step.token);
    window.insert(window.end(), draft.begin(), draft.end());
    const int n_before = session.n_past(seq);
    const int k = static_cast<int>(draft.size());
    Result<const float*> r = session.EvalSeq(seq, window.data(), k + 1, /*all_logits=*/true);
    if (!r.ok()) return r.error();
    const WindowOutcome w =
        AcceptWindow(gen, *r, n_vocab, draft, [&](int, Generator::Step& s, const float*) {
          emit(s.text);
          return !cancelled;
        });
    step = w.last;
    const int n_accepted = w.accepted;
    const int n_emitted = w.emitted;
    // Keep the cells of window[0..used]: the tokens whose logits were used. The rest are
    // rejected drafts (or an accepted one the plain loop would not have evaluated yet).
    if (!spec.planted_skip_truncate) session.Truncate(seq, n_before + 1 + w.used);
    if (k > 0) drafter.Accepted(k, n_accepted);
    local.drafted += k;
    local.accepted += n_accepted;
    local.emitted += n_emitted;
    (k > 0 ? local.verify_steps : local.plain_steps) += 1;
    controller.Record(asked, k, n_accepted, n_emitted, NowSeconds() - t_step);
  }
  EndResult(gen, t1, &result);
  if (stats) stats->Add(local);
  return result;
}

}  // namespace lamina::spec
