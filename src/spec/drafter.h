// Drafters for speculative decoding: each proposes up to k next tokens from a sequence's history
// and is told how many the target accepted. LookupDrafter matches the recent suffix against the
// history (prompt lookup, no model); ModelDrafter runs a small model whose vocabulary matches the
// target's in its own session, kept aligned with the target's history by prefix reuse and
// rolled back with Truncate like the target. MtpDrafter runs the target's own
// multi-token-prediction block (Model::mtp()) over the target's kept hidden states.
#pragma once

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "model/model.h"
#include "runtime/session.h"
#include "util/status.h"

namespace lamina::spec {

class Drafter {
 public:
  virtual ~Drafter() = default;
  virtual const char* name() const = 0;
  // history: the sequence's tokens, the last one sampled but not yet evaluated by the target.
  // Replaces *draft with at most max_tokens proposed continuations (possibly none).
  virtual Status Draft(const std::vector<int32_t>& history, int max_tokens,
                       std::vector<int32_t>* draft) = 0;
  // Called once the target has evaluated the prompt (and counted as prompt time): a draft model
  // evaluates the prompt as well, so that its first draft costs decode steps, not a prompt.
  virtual Status Prepare(const std::vector<int32_t>& prompt) {
    (void)prompt;
    return Status::Ok();
  }
  // A one-token draft that tells the controller whether drafting pays again (a probe while
  // drafting is paused). By default a Draft of one token; a drafter that would first catch up
  // with the positions it missed (an MTP head) may skip that and propose from what it holds
  // (last_catch_up().skipped): a cheaper, rougher proposal, checked by the target like any draft.
  virtual Status Probe(const std::vector<int32_t>& history, std::vector<int32_t>* draft) {
    return Draft(history, 1, draft);
  }
  // Whether Probe skips the catch-up (its cost is then the drafter's pass alone).
  virtual bool probes_without_catch_up() const { return false; }
  // The target accepted n_accepted of the last draft's n_drafted tokens.
  virtual void Accepted(int n_drafted, int n_accepted) {
    (void)n_drafted;
    (void)n_accepted;
  }
  // The part of the last Draft call that caught the drafter up with positions the target
  // evaluated since (cells evaluated besides the one whose logits start the draft; after plain
  // steps, every position they emitted), in one batched pass: the cost model's catch-up.
  struct CatchUpWork {
    int cells = 0;
    double seconds = 0.0;
    int skipped = 0;  // positions a Probe left to catch up (the drafter is that far behind)
  };
  CatchUpWork last_catch_up() const { return catch_up_; }
  // The drafter's own cache (a draft model's or an MTP block's session; none for lookup):
  // its whole storage, and the bytes of the cells it holds now.
  struct CacheBytes {
    size_t total = 0;
    size_t used = 0;
  };
  virtual CacheBytes cache_bytes() const { return {}; }

 protected:
  // A one-sequence session's cache: its storage and the cells sequence 0 holds.
  static CacheBytes SessionCacheBytes(const Session& session) {
    CacheBytes b;
    b.total = session.cache().BytesTotal() + session.recurrent().bytes();
    b.used = static_cast<size_t>(session.n_past(0)) * session.cache().BytesPerToken();
    return b;
  }
  // An evaluation of `evaluated` cells in one pass that took `seconds`: all but the last are
  // catch-up (their share of the time, in proportion).
  void SetCatchUp(int evaluated, double seconds) {
    catch_up_.cells = std::max(0, evaluated - 1);
    catch_up_.seconds = evaluated > 0 ? seconds * catch_up_.cells / evaluated : 0.0;
  }
  CatchUpWork catch_up_;
};

// Prompt lookup: the earlier place in the history that agrees longest with the history's end
// (at least ngram_min tokens, compared up to max_context); the tokens that followed it there are
// the draft.
class LookupDrafter : public Drafter {
 public:
  explicit LookupDrafter(int ngram_min, int max_context = 64);
  const char* name() const override { return "lookup"; }
  Status Draft(const std::vector<int32_t>& history, int max_tokens,
               std::vector<int32_t>* draft) override;

 private:
  int ngram_min_;
  int max_context_;
};

// A draft model: greedy continuations of the history, stopping early when the draft's own
// probability of its choice falls below p_min.
class ModelDrafter : public Drafter {
 public:
  // config.n_seq must be 1; the session's context should be at least the target's.
  ModelDrafter(const Model& draft_model, const SessionConfig& config, ThreadPool& pool,
               float p_min);
  const char* name() const override { return "draft"; }
  Status Prepare(const std::vector<int32_t>& prompt) override;
  Status Draft(const std::vector<int32_t>& history, int max_tokens,
               std::vector<int32_t>* draft) override;
  const Session& session() const { return session_; }
  void set_p_min(float p_min) { p_min_ = p_min; }
  CacheBytes cache_bytes() const override { return SessionCacheBytes(session_); }

 private:
  // Keeps the cells of the longest common prefix of `tokens` and the session's (at most
  // `limit` tokens), returns how many it kept.
  int KeepCommonPrefix(const std::vector<int32_t>& tokens, int limit);

  Session session_;
  float p_min_;
};

// Multi-token prediction: the target model's MTP block, in a one-layer session of its own,
// pairs token x_p with the target's normed final hidden state h_{p-1} (Session::KeepHidden;
// zeros for x_0) in cell p, as llama.cpp does, to propose x_{p+1} past the history's end;
// further drafts chain the block's own normed hidden state with the token it proposed, stopping
// early when the block's probability of its choice falls below p_min (no draft when the first
// one's does). Prepare catches the block's cells up with the prompt (prompt time); each Draft
// first catches them up with every position the target evaluated since, keeping the cells whose
// tokens still agree and dropping the chained ones. A Probe more than kProbeLag positions behind
// skips that catch-up: it evaluates (history's last token, the target's last state) in the
// block's next free cell, a position short by the cells it missed, and drops that cell again, so
// a paused head costs one block pass per probe instead of a pass over every missed position.
class MtpDrafter : public Drafter {
 public:
  // target: the session the drafts are verified in, holding the history in sequence `seq`;
  // it must have a model with an MTP block (CheckMtp) and outlive the drafter. config: the
  // block's session (n_seq 1; n_ctx at least the target's).
  MtpDrafter(Session& target, int seq, const SessionConfig& config, ThreadPool& pool,
             float p_min = 0.0f);
  const char* name() const override { return "mtp"; }
  Status Prepare(const std::vector<int32_t>& prompt) override;
  Status Draft(const std::vector<int32_t>& history, int max_tokens,
               std::vector<int32_t>* draft) override;
  Status Probe(const std::vector<int32_t>& history, std::vector<int32_t>* draft) override;
  bool probes_without_catch_up() const override { return true; }
  const Session& session() const { return session_; }
  CacheBytes cache_bytes() const override { return SessionCacheBytes(session_); }
  static constexpr int kProbeLag = 4;  // a probe this few positions behind catches up first

 private:
  // The cells [0, keep) still in line with history (their tokens agree), the others dropped.
  int KeepAgreeing(const std::vector<int32_t>& history, int n_cells);
  // The proposal from logits `r` (none when the block's probability of it is below p_min).
  bool Propose(const float* logits, int32_t* token) const;
  // Evaluates cells [keep, n_cells) of the block: (h_{c-1}, history[c]); returns the last
  // row's logits.
  Result<const float*> CatchUp(const std::vector<int32_t>& history, int keep, int n_cells);
  // Cells [0, n_cells) in line with history: the agreeing ones kept, the rest (and always the
  // last) evaluated; returns the last cell's logits.
  Result<const float*> Sync(const std::vector<int32_t>& history, int n_cells);

  Session& target_;
  int seq_;
  Session session_;
  float p_min_;
  int n_real_ = 0;           // the block's cells paired with the target's hidden states
  std::vector<float> embd_;  // [n_tokens, n_embd] the hidden rows of one block batch
};

// Whether `model` can draft for itself with --spec mtp; the error says why not.
Status CheckMtp(const Model& model);

// Whether `draft` can draft for `target`: the same tokenizer kind, vocabulary size, token texts
// and special tokens. The error names the first difference.
Status CheckDraftCompatible(const Model& target, const Model& draft);

}  // namespace lamina::spec
