// Prompt-lookup, draft-model and MTP drafters (see drafter.h).
#include "spec/drafter.h"

#include <algorithm>
#include <cmath>

#include "runtime/sampler.h"
#include "util/timer.h"

namespace lamina::spec {

LookupDrafter::LookupDrafter(int ngram_min, int max_context)
    : ngram_min_(std::max(1, ngram_min)), max_context_(std::max(ngram_min_, max_context)) {}

Status LookupDrafter::Draft(const std::vector<int32_t>& history, int max_tokens,
                            std::vector<int32_t>* draft) {
  draft->clear();
  const int n = static_cast<int>(history.size());
  if (max_tokens <= 0 || n < 2) return Status::Ok();
  // Every earlier position whose token equals the last one is a candidate; its match length is
  // how far back the history agrees with the suffix there. The longest match wins (the most
  // recent on ties): in a copy, that is the place being copied rather than any earlier
  // occurrence of the same few tokens.
  const int32_t last = history[n - 1];
  int best_len = 0, best_end = -1;
  for (int end = n - 2; end >= 0; --end) {
    if (history[end] != last) continue;
    int len = 1;
    while (len < max_context_ && end - len >= 0 && history[end - len] == history[n - 1 - len]) {
      ++len;
    }
    if (len > best_len) {
      best_len = len;
      best_end = end;
      if (len == max_context_) break;
    }
  }
  if (best_len < ngram_min_) return Status::Ok();
  const int from = best_end + 1;
  const int to = std::min(n, from + max_tokens);
  draft->assign(history.begin() + from, history.begin() + to);
  return Status::Ok();
}

ModelDrafter::ModelDrafter(const Model& draft_model, const SessionConfig& config, ThreadPool& pool,
                           float p_min)
    : session_(draft_model, config, pool), p_min_(p_min) {
  LAMINA_CHECK(config.n_seq == 1);
}

int ModelDrafter::KeepCommonPrefix(const std::vector<int32_t>& tokens, int limit) {
  const std::vector<int32_t>& cached = session_.tokens();
  int keep = 0;
  while (keep < limit && keep < static_cast<int>(cached.size()) && cached[keep] == tokens[keep]) {
    ++keep;
  }
  session_.Truncate(keep);
  return session_.n_past();  // less where a KV window could not be kept
}

Status ModelDrafter::Prepare(const std::vector<int32_t>& prompt) {
  // Everything but the last token: Draft evaluates that one for its first logits.
  const int n = std::min(static_cast<int>(prompt.size()) - 1, session_.n_ctx());
  if (n <= 0) return Status::Ok();
  const int keep = KeepCommonPrefix(prompt, n);
  if (keep >= n) return Status::Ok();
  Result<const float*> r = session_.Eval(prompt.data() + keep, n - keep, /*all_logits=*/false);
  return r.ok() ? Status::Ok() : Status(r.error());
}

Status ModelDrafter::Draft(const std::vector<int32_t>& history, int max_tokens,
                           std::vector<int32_t>* draft) {
  draft->clear();
  catch_up_ = CatchUpWork{};
  const int n = static_cast<int>(history.size());
  if (n == 0) return Status::Ok();
  max_tokens = std::min(max_tokens, session_.n_ctx() - n);
  if (max_tokens <= 0) return Status::Ok();
  // Align the draft's cells with the history: keep the common prefix, evaluate the rest (at
  // least the last token, whose logits give the first draft).
  const int keep = KeepCommonPrefix(history, n - 1);
  const double t0 = NowSeconds();
  Result<const float*> r = session_.Eval(history.data() + keep, n - keep, /*all_logits=*/false);
  if (!r.ok()) return r.error();
  SetCatchUp(n - keep, NowSeconds() - t0);
  const int n_vocab = session_.model().hparams().n_vocab;
  for (;;) {
    const float* logits = *r;
    const int32_t best = ArgMax(logits, n_vocab);
    if (p_min_ > 0.0f) {  // the draft's own probability of its choice
      double sum = 0.0;
      for (int i = 0; i < n_vocab; ++i)
        sum += std::exp(static_cast<double>(logits[i] - logits[best]));
      if (1.0 / sum < p_min_) break;
    }
    draft->push_back(best);
    if (static_cast<int>(draft->size()) >= max_tokens) break;
    r = session_.Eval(&best, 1, /*all_logits=*/false);
    if (!r.ok()) return r.error();
  }
  return Status::Ok();
}

Status CheckMtp(const Model& model) {
  if (model.mtp() != nullptr) return Status::Ok();
  return Error{"--spec mtp: the model (" + model.hparams().arch +
               ") has no multi-token-prediction block (a qwen35 or qwen35moe file's " +
               model.hparams().arch +
               ".nextn_predict_layers block, or a dense model's <model>-mtp.gguf head beside it)"};
}

MtpDrafter::MtpDrafter(Session& target, int seq, const SessionConfig& config, ThreadPool& pool,
                       float p_min)
    : target_(target), seq_(seq), session_(*target.model().mtp(), config, pool), p_min_(p_min) {
  LAMINA_CHECK(config.n_seq == 1);
  target_.KeepHidden();
  session_.KeepHidden(/*whole_context=*/false);  // the block reads back its last cell's row only
}

Result<const float*> MtpDrafter::CatchUp(const std::vector<int32_t>& history, int keep,
                                         int n_cells) {
  const int d = session_.model().hparams().n_embd;
  constexpr int kChunk = 256;  // cells per batch
  Result<const float*> r = Error{"nothing to evaluate"};
  SequenceBatch batch;
  for (int c0 = keep; c0 < n_cells; c0 += kChunk) {
    const int m = std::min(kChunk, n_cells - c0);
    batch.Clear();
    embd_.resize(static_cast<size_t>(m) * d);
    for (int i = 0; i < m; ++i) {
      const int c = c0 + i;
      batch.Add(history[c], 0, c, c == n_cells - 1);
      float* h = embd_.data() + static_cast<size_t>(i) * d;
      if (c == 0) {
        std::fill_n(h, d, 0.0f);
      } else {
        std::copy_n(target_.Hidden(seq_, c - 1), d, h);
      }
    }
    r = session_.Decode(batch, embd_.data());
    if (!r.ok()) return r;
  }
  return r;
}

Status MtpDrafter::Draft(const std::vector<int32_t>& history, int max_tokens,
                         std::vector<int32_t>* draft) {
  draft->clear();
  catch_up_ = CatchUpWork{};
  const int n = static_cast<int>(history.size());
  // The target holds history[0..n-2]; cell c pairs history[c] with h_{c-1}, c = 0..n-1.
  const int n_cells = n;
  if (n_cells <= 0 || target_.n_past(seq_) != n - 1 || target_.n_hidden(seq_) < n - 1) {
    return Status::Ok();
  }
  max_tokens = std::min(max_tokens, session_.n_ctx() - n_cells + 1);
  if (max_tokens <= 0) return Status::Ok();
  Result<const float*> r = Sync(history, n_cells);
  if (!r.ok()) return r.error();
  const int d = session_.model().hparams().n_embd;
  SequenceBatch batch;
  for (;;) {
    int32_t best = 0;
    if (!Propose(*r, &best)) break;
    draft->push_back(best);
    const int cell = session_.n_past();
    if (static_cast<int>(draft->size()) >= max_tokens || cell >= session_.n_ctx()) break;
    // Chain: the block's own normed state of the last cell with the token it proposed.
    embd_.assign(session_.Hidden(0, cell - 1), session_.Hidden(0, cell - 1) + d);
    batch.Clear();
    batch.Add(best, 0, cell, true);
    r = session_.Decode(batch, embd_.data());
    if (!r.ok()) return r.error();
  }
  return Status::Ok();
}

Status MtpDrafter::Prepare(const std::vector<int32_t>& prompt) {
  // The target holds the prompt: cells 0..n-1 pair prompt[c] with h_{c-1}.
  const int n = static_cast<int>(prompt.size());
  if (n <= 0 || n > session_.n_ctx() || target_.n_past(seq_) != n ||
      target_.n_hidden(seq_) < n - 1) {
    return Status::Ok();
  }
  Result<const float*> r = Sync(prompt, n);
  return r.ok() ? Status::Ok() : Status(r.error());
}

bool MtpDrafter::Propose(const float* logits, int32_t* token) const {
  const int n_vocab = session_.model().hparams().n_vocab;
  *token = ArgMax(logits, n_vocab);
  if (p_min_ <= 0.0f) return true;
  double sum = 0.0;  // the block's own probability of its choice
  for (int i = 0; i < n_vocab; ++i)
    sum += std::exp(static_cast<double>(logits[i] - logits[*token]));
  return 1.0 / sum >= p_min_;
}

int MtpDrafter::KeepAgreeing(const std::vector<int32_t>& history, int n_cells) {
  // Keep the cells paired with the target's states whose tokens still agree (h_{c-1} depends
  // on history[0..c-1] alone).
  int keep = std::min(n_real_, n_cells);
  const std::vector<int32_t>& cached = session_.tokens();
  for (int c = 0; c < keep; ++c) {
    if (c >= static_cast<int>(cached.size()) || cached[c] != history[c]) keep = c;
  }
  session_.Truncate(keep);
  n_real_ = session_.n_past();
  return n_real_;
}

Status MtpDrafter::Probe(const std::vector<int32_t>& history, std::vector<int32_t>* draft) {
  draft->clear();
  catch_up_ = CatchUpWork{};
  const int n = static_cast<int>(history.size());
  if (n <= 0 || target_.n_past(seq_) != n - 1 || target_.n_hidden(seq_) < n - 1 ||
      n > session_.n_ctx()) {
    return Status::Ok();
  }
  // Cells [0, keep) agree; [keep, n - 1) are the positions missed, cell n - 1 gives the logits.
  const int keep = KeepAgreeing(history, n);
  const int missed = n - 1 - keep;
  if (keep == 0 || missed <= kProbeLag) return Draft(history, 1, draft);
  // (history[n-1], h_{n-2}) in the next free cell, `missed` positions early.
  const int d = session_.model().hparams().n_embd;
  embd_.assign(target_.Hidden(seq_, n - 2), target_.Hidden(seq_, n - 2) + d);
  SequenceBatch batch;
  batch.Add(history[n - 1], 0, keep, true);
  Result<const float*> r = session_.Decode(batch, embd_.data());
  if (!r.ok()) return r.error();
  int32_t best = 0;
  if (Propose(*r, &best)) draft->push_back(best);
  session_.Truncate(keep);  // the probe's cell is not the position it stands for
  catch_up_.skipped = missed;
  return Status::Ok();
}

Result<const float*> MtpDrafter::Sync(const std::vector<int32_t>& history, int n_cells) {
  int keep = KeepAgreeing(history, n_cells);
  if (keep >= n_cells) {  // the last cell is re-evaluated for its logits
    session_.Truncate(n_cells - 1);
    keep = session_.n_past();
  }
  const double t0 = NowSeconds();
  Result<const float*> r = CatchUp(history, keep, n_cells);
  SetCatchUp(n_cells - keep, NowSeconds() - t0);
  n_real_ = session_.n_past();
  return r;
}

Status CheckDraftCompatible(const Model& target, const Model& draft) {
  const Tokenizer& t = target.tokenizer();
  const Tokenizer& d = draft.tokenizer();
  const std::string what = "the draft model (" + draft.hparams().arch + ", vocabulary " +
                           std::to_string(d.vocab_size()) + ") cannot draft for the target (" +
                           target.hparams().arch + ", vocabulary " +
                           std::to_string(t.vocab_size()) + "): ";
  if (t.vocab_size() != d.vocab_size() || draft.hparams().n_vocab != target.hparams().n_vocab) {
    return Error{what + "the vocabulary sizes differ"};
  }
  for (int32_t id = 0; id < t.vocab_size(); ++id) {
    if (t.TokenText(id) != d.TokenText(id) || t.Attr(id) != d.Attr(id)) {
      return Error{what + "token " + std::to_string(id) + " is '" + t.TokenText(id) +
                   "' in the target and '" + d.TokenText(id) + "' in the draft"};
    }
  }
  if (t.bos() != d.bos() || t.eos() != d.eos() || t.eot() != d.eot() ||
      t.add_bos() != d.add_bos()) {
    return Error{what + "the special tokens (BOS, EOS, EOT) differ"};
  }
  return Status::Ok();
}

}  // namespace lamina::spec
