// The generation loop shared by the CLI, the probe and the server (see generate.h).
#include "runtime/generate.h"

#include <algorithm>
#include <cmath>

#include "util/timer.h"

namespace lamina {

const char* StopReasonName(StopReason reason) {
  switch (reason) {
    case StopReason::kNone:
      return "none";
    case StopReason::kEos:
      return "eos";
    case StopReason::kStopString:
      return "word";
    case StopReason::kLimit:
      return "limit";
    case StopReason::kContextFull:
      return "context";
    case StopReason::kCancelled:
      return "cancelled";
  }
  return "?";
}

namespace {

// Whether generation after `history` begins the text (nothing but BOS before it).
bool StartsText(const Tokenizer& tokenizer, const std::vector<int32_t>& history) {
  return history.empty() || (history.size() == 1 && history[0] == tokenizer.bos());
}

}  // namespace

Generator::Generator(const Tokenizer& tokenizer, const GenerateParams& params,
                     std::vector<int32_t> history)
    : tokenizer_(tokenizer),
      params_(params),
      sampler_(params.sampler, &tokenizer),
      detok_(tokenizer, StartsText(tokenizer, history)),
      history_(std::move(history)),
      text_starts_(StartsText(tokenizer, history_)) {
  params_.stop.erase(std::remove(params_.stop.begin(), params_.stop.end(), std::string()),
                     params_.stop.end());
  if (params_.n_predict == 0) reason_ = StopReason::kLimit;
  if (params_.grammar) matcher_.emplace(params_.grammar);
  if (params_.reasoning_budget < 0 || params_.think_close.empty() || matcher_) {
    params_.reasoning_budget = -1;
  }
  thinking_ = params_.reasoning_budget >= 0 && params_.thinking_at_start;
  thinking_decided_ = thinking_;
}

int32_t Generator::ForcedToken() {
  if (params_.reasoning_budget < 0) return -1;
  if (!forcing_ && thinking_ && thinking_tokens_ >= params_.reasoning_budget) {
    // A model in the middle of its own close tag finishes it (a few tokens past the budget).
    constexpr std::string_view kClose = "</think>";
    bool closing = false;
    for (size_t len = 1; len < kClose.size() && len <= think_tail_.size(); ++len) {
      closing |=
          std::string_view(think_tail_).substr(think_tail_.size() - len) == kClose.substr(0, len);
    }
    const int grace = static_cast<int>(params_.think_close.size());
    if (!closing || thinking_tokens_ >= params_.reasoning_budget + grace) {
      forcing_ = true;
      forced_at_ = 0;
    }
  }
  if (!forcing_) return -1;
  const int32_t id = params_.think_close[forced_at_++];
  if (forced_at_ == params_.think_close.size()) {
    forcing_ = false;
    thinking_ = false;  // the block is closed, however the tag's tokens read back
  }
  return id;
}

void Generator::TrackThinking(int32_t id) {
  if (params_.reasoning_budget < 0) return;
  constexpr std::string_view kOpen = "<think>", kClose = "</think>";
  const std::string piece = tokenizer_.TokenToPiece(id, true);
  if (!thinking_decided_) {
    // The answer opens a block when its text, after white space, starts with the open tag.
    think_head_ += piece;
    const size_t at = think_head_.find_first_not_of(" \t\r\n");
    if (at == std::string::npos) return;
    const std::string_view rest = std::string_view(think_head_).substr(at);
    if (rest.starts_with(kOpen)) {
      thinking_ = true;
      thinking_decided_ = true;
      think_tail_ = std::string(rest.substr(kOpen.size()));
    } else if (!kOpen.starts_with(rest)) {
      thinking_decided_ = true;
    }
    return;
  }
  if (!thinking_) return;
  think_tail_ += piece;
  if (think_tail_.find(kClose) != std::string::npos) {
    thinking_ = false;
    forcing_ = false;
    return;
  }
  if (think_tail_.size() > 64) think_tail_.erase(0, think_tail_.size() - 16);
  if (!forcing_) ++thinking_tokens_;
}

bool Generator::GrammarAllows(int32_t id) {
  if (params_.ignore_eos && tokenizer_.IsEog(id)) return false;
  return matcher_->Allows(tokenizer_, id, text_starts_ && generated_.empty());
}

int32_t Generator::GreedyIfAllowed(const float* logits, int n_vocab) {
  if (params_.sampler.temperature > 0.0f) return -1;
  // Greedy picks the arg max after the repetition penalty; masking only removes candidates,
  // so an allowed arg max of the whole vocabulary is the arg max of the allowed ones.
  const int32_t id = sampler_.Sample(logits, n_vocab, history_);
  return id != kNoToken && GrammarAllows(id) ? id : -1;
}

const float* Generator::Bias(const float* logits, int n_vocab) {
  if (params_.logit_bias.empty()) return logits;
  biased_.assign(logits, logits + n_vocab);
  for (const auto& [id, bias] : params_.logit_bias) {
    if (id >= 0 && id < n_vocab) biased_[id] += bias;
  }
  return biased_.data();
}

const float* Generator::Constrain(const float* logits, int n_vocab) {
  if (!matcher_) return logits;
  matcher_->AllowedTokens(tokenizer_, text_starts_ && generated_.empty(), &allowed_);
  masked_.assign(logits, logits + n_vocab);
  bool any = false;
  for (int i = 0; i < n_vocab; ++i) {
    if (allowed_[i] && !(params_.ignore_eos && tokenizer_.IsEog(i))) {
      any = true;
    } else {
      masked_[i] = -INFINITY;
    }
  }
  return any ? masked_.data() : nullptr;
}

std::string Generator::Release(bool final) {
  // A stop string anywhere in the pending text ends generation before it (earliest first).
  size_t cut = std::string::npos;
  for (const std::string& s : params_.stop) {
    // It may straddle released text only if released text ended inside it, which Release
    // prevents by holding back prefixes; so searching pending_ suffices.
    const size_t at = pending_.find(s);
    if (at != std::string::npos && (cut == std::string::npos || at < cut)) {
      cut = at;
      stop_word_ = s;
    }
  }
  std::string out;
  if (cut != std::string::npos) {
    out = pending_.substr(0, cut);
    pending_.clear();
    reason_ = StopReason::kStopString;
  } else if (final) {
    out.swap(pending_);
  } else {
    // Hold back the longest tail of pending_ that begins some stop string.
    size_t hold = 0;
    for (const std::string& s : params_.stop) {
      for (size_t len = std::min(s.size() - 1, pending_.size()); len > hold; --len) {
        if (pending_.compare(pending_.size() - len, len, s, 0, len) == 0) {
          hold = len;
          break;
        }
      }
    }
    out = pending_.substr(0, pending_.size() - hold);
    pending_.erase(0, pending_.size() - hold);
  }
  text_ += out;
  return out;
}

Generator::Step Generator::Next(const float* logits, int n_vocab) {
  if (done()) return Step{-1, "", true};
  if (const int32_t forced = ForcedToken(); forced >= 0) return Emit(forced);
  logits = Bias(logits, n_vocab);
  if (matcher_) {
    const int32_t greedy = GreedyIfAllowed(logits, n_vocab);
    if (greedy >= 0) return Emit(greedy);
    logits = Constrain(logits, n_vocab);
    // Nothing may follow: the grammar's sentence is complete.
    if (!logits) return Step{-1, Finish(StopReason::kEos), true};
  }
  const int32_t id = sampler_.Sample(logits, n_vocab, history_);
  // Every token is banned (logit biases, with the grammar's mask): nothing more can be said.
  if (id == kNoToken) return Step{-1, Finish(StopReason::kEos), true};
  return Emit(id);
}

Generator::Step Generator::NextWithDraft(const float* logits, int n_vocab, int32_t draft,
                                         const std::vector<TokenProb>* q, bool* accepted) {
  *accepted = false;
  if (done()) return Step{-1, "", true};
  if (const int32_t forced = ForcedToken(); forced >= 0) {
    *accepted = forced == draft;
    return Emit(forced);
  }
  logits = Bias(logits, n_vocab);
  if (matcher_) {
    const int32_t greedy = GreedyIfAllowed(logits, n_vocab);
    if (greedy >= 0) {
      *accepted = greedy == draft;
      return Emit(greedy);
    }
    logits = Constrain(logits, n_vocab);
    if (!logits) return Step{-1, Finish(StopReason::kEos), true};
  }
  const int32_t id = sampler_.SampleWithDraft(logits, n_vocab, history_, draft, q, accepted);
  if (id == kNoToken) return Step{-1, Finish(StopReason::kEos), true};
  return Emit(id);
}

Generator::Step Generator::Emit(int32_t id) {
  Step step;
  if (matcher_) {
    // Constrain allowed only what the matcher accepts.
    LAMINA_CHECK(matcher_->AcceptToken(tokenizer_, id, text_starts_ && generated_.empty()));
  }
  if (!params_.ignore_eos && tokenizer_.IsEog(id)) {
    reason_ = StopReason::kEos;
    pending_ += detok_.Flush();
    step.text = Release(/*final=*/true);
    step.done = true;
    return step;
  }
  step.token = id;
  history_.push_back(id);
  generated_.push_back(id);
  TrackThinking(id);
  pending_ += detok_.Push(id);
  const bool at_limit =
      params_.n_predict >= 0 && static_cast<int>(generated_.size()) >= params_.n_predict;
  // A grammar whose sentence is complete allows nothing but an end token: end here.
  const bool grammar_done = matcher_ && matcher_->Complete();
  if (at_limit || grammar_done) pending_ += detok_.Flush();
  step.text = Release(/*final=*/at_limit || grammar_done);
  if (reason_ == StopReason::kNone && at_limit) reason_ = StopReason::kLimit;
  if (reason_ == StopReason::kNone && grammar_done) reason_ = StopReason::kEos;
  step.done = done();
  return step;
}

std::string Generator::Finish(StopReason reason) {
  if (done()) return "";
  reason_ = reason;
  pending_ += detok_.Flush();
  const StopReason keep = reason_;
  std::string out = Release(/*final=*/true);
  // A stop string completed by the flushed tail still wins.
  if (reason_ != StopReason::kStopString) reason_ = keep;
  return out;
}

int ReusePrefix(Session& session, int seq, const std::vector<int32_t>& prompt) {
  const std::vector<int32_t>& cached = session.tokens(seq);
  size_t keep = 0;
  while (keep < cached.size() && keep < prompt.size() && cached[keep] == prompt[keep]) ++keep;
  if (!prompt.empty() && keep >= prompt.size()) keep = prompt.size() - 1;
  session.Truncate(seq, static_cast<int>(keep));
  return session.n_past(seq);  // less than keep where a KV window could not be kept
}

}  // namespace lamina
