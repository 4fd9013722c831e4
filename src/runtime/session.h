// A session: one model, one KV cache holding one or more sequences (and, for hybrid models,
// their recurrent state beside it), scratch buffers and a thread pool reference. Eval appends
// tokens to sequence 0 (a prompt in one batch or in chunks, a decoded token, a verify window);
// Decode runs a mixed batch of several sequences in one forward pass (weight matmuls shared,
// attention per sequence). Every path reaches the cache only through KvCache::Write, via the
// model's AttentionContext, and the recurrent state only through RecurrentState::Scan, via its
// RecurrentContext.
#pragma once

#include <memory>
#include <vector>

#include "model/model.h"
#include "runtime/attention.h"
#include "runtime/kv_cache.h"
#include "runtime/recurrent_state.h"
#include "runtime/write_observer.h"

namespace lamina {

inline constexpr int kKvWindowModeDefault = -1;

struct SessionConfig {
  int n_ctx = 0;  // cells per sequence; 0: the model's training context, capped at 4096
  int n_seq = 1;  // sequences the cache holds (a server's slots)
  KvType kv_type = KvType::kF16;
  KvRounding v_rounding = KvRounding::kNearest;
  uint64_t kv_seed = 0;
  // Recent cells read from an exact copy (KvCacheConfig::window); kKvWindowModeDefault: the
  // mode's (its row in kKvModes); 0: none.
  int kv_window = kKvWindowModeDefault;
  // Keep every cell of sliding-window layers (--swa-full) instead of a ring of their recent
  // cells (KvCacheConfig::swa_full). A ring cannot serve a prefix cut more than
  // kKvWindowSlack cells back (Truncate then keeps nothing); every cell can.
  bool swa_full = false;
  // Optional hook of planted faults (write_observer.h), handed to the cache and the recurrent
  // state and asked by Truncate; not owned, must outlive the session. nullptr: none.
  const WriteObserver* write_observer = nullptr;
  // Bytes the session may hold (cache + the scratch of a batch); a batch whose scratch would
  // pass it is refused with an error before anything is allocated. UINT64_MAX: unchecked.
  uint64_t memory_limit = UINT64_MAX;
  // Hybrid models: per-token recurrent states kept per sequence (RecurrentState's ring), the
  // furthest back a Truncate restores exactly (at least the longest verify window).
  int recurrent_ring = kRecurrentRingDefault;
};

// Upper estimate of the scratch one forward pass allocates for n_tokens tokens with n_out
// logits rows (activations, matmul scratch, logits), saturating; for the memory guard.
uint64_t ForwardBytes(const Hparams& hp, int n_tokens, int n_out);

// The cache configuration a session would use; an error when the mode cannot hold the model's
// head_dim (call before constructing a Session with user-chosen options).
Result<KvCacheConfig> MakeKvCacheConfig(const Hparams& hp, const SessionConfig& config);

// A mixed batch for Session::Decode: token i belongs to sequence seq[i] at position pos[i].
// A sequence's tokens must continue it (the first at Length(seq), then consecutive); several
// sequences may interleave. output[i]: whether token i's logits are wanted.
struct SequenceBatch {
  std::vector<int32_t> tokens;  // [n]
  std::vector<int32_t> pos;     // [n]
  std::vector<int32_t> seq;     // [n]
  std::vector<uint8_t> output;  // [n]
  void Clear();
  void Add(int32_t token, int seq_id, int position, bool want_logits);
  int size() const { return static_cast<int>(tokens.size()); }
  int n_outputs() const;
};

class Session {
 public:
  Session(const Model& model, const SessionConfig& config, ThreadPool& pool);

  const Model& model() const { return model_; }
  const KvCache& cache() const { return cache_; }
  KvCache& mutable_cache() { return cache_; }
  const RecurrentState& recurrent() const { return recurrent_; }
  RecurrentState& mutable_recurrent() { return recurrent_; }
  int n_ctx() const { return cache_.config().n_ctx; }  // cells per sequence
  // Whether this context rotates with the model's long RoPE (Hparams::rope_long: phi3 past its
  // original context).
  bool long_rope() const { return model_.hparams().uses_long_rope(n_ctx()); }
  int n_seq() const { return cache_.config().n_seq; }
  // Tokens held by sequence `seq` (its next position).
  int n_past(int seq = 0) const { return n_past_[seq]; }
  // The token ids whose cells sequence `seq` holds, in order ([n_past(seq)]; -1 for cells
  // filled by FillWithRandomCells).
  const std::vector<int32_t>& tokens(int seq = 0) const { return tokens_[seq]; }

  // Appends tokens to sequence 0 at positions n_past()..; returns logits [n, n_vocab] if
  // all_logits, else the last token's [n_vocab]. Fails if the context would overflow, or if a
  // K/V value was non-finite (the cache refuses to store it).
  Result<const float*> Eval(const std::vector<int32_t>& tokens, bool all_logits);
  Result<const float*> Eval(const int32_t* tokens, int n, bool all_logits);
  // The same for sequence `seq`.
  Result<const float*> EvalSeq(int seq, const int32_t* tokens, int n, bool all_logits);

  // One forward pass over tokens of several sequences; returns logits
  // [batch.n_outputs(), n_vocab], one row per flagged token in batch order. Checked first: ids
  // in the vocabulary, sequences in range, each sequence continuing at its length and within
  // n_ctx(); nothing is written on such an error.
  Result<const float*> Decode(const SequenceBatch& batch);
  // The same for a model's multi-token-prediction block (Model::mtp()): embd holds the hidden
  // state paired with each token ([batch.size(), n_embd], ForwardBatch::embd).
  Result<const float*> Decode(const SequenceBatch& batch, const float* embd);

  // From now on, keeps every evaluated token's normed final hidden state (ForwardBatch::hidden)
  // by sequence and position, what an MTP drafter pairs with the next token. whole_context:
  // every sequence's store ([n_ctx, n_embd], what MtpPlanBytes plans) is allocated and zeroed
  // now, so that decode steps write their rows in place into memory already touched (no page
  // fault, no reallocation mid-decode); false: grown on demand (a session that reads back only
  // its last rows, such as the MTP block's own).
  void KeepHidden(bool whole_context = true);
  // Positions [0, n_hidden(seq)) of sequence `seq` have their hidden state kept (cells copied by
  // CopyPrefix keep theirs; restored or random cells have none).
  int n_hidden(int seq) const { return hidden_.empty() ? 0 : n_hidden_[seq]; }
  // The kept hidden state of position pos < n_hidden(seq) ([n_embd]).
  const float* Hidden(int seq, int pos) const;

  // Drops positions >= n_keep of sequence `seq` (0 when omitted). With a KV window or a
  // sliding-window ring a cut more than kKvWindowSlack cells back keeps nothing
  // (KvCache::ExactKeep), and so does, for a
  // hybrid model, a cut further back than the ring of recurrent states (RecurrentState): read
  // n_past() after and re-evaluate what was dropped.
  void Truncate(int n_keep) { Truncate(0, n_keep); }
  void Truncate(int seq, int n_keep);
  // The same, but refused with an error (nothing changed) when the cut cannot be exact.
  Status TruncateExact(int seq, int n_keep);
  // The length <= n_keep Truncate(seq, n_keep) would keep.
  int ExactKeep(int seq, int n_keep) const;
  // Makes dst's first n cells a copy of src's and dst's length n (a shared prompt prefix);
  // with a KV window or a sliding-window ring, 0 cells when src no longer holds the window
  // before n exactly (the same
  // for recurrent state past its ring).
  void CopyPrefix(int src_seq, int dst_seq, int n);

  // Replaces sequence `seq` by a saved state: `tokens` ([n], each in the vocabulary, n <=
  // n_ctx()) and their encoded cells as KvCache::ExportSequence wrote them (checked).
  void RestoreSequence(int seq, const std::vector<int32_t>& tokens, const uint8_t* state);

  // Appends n cells of random K/V (unit-variance Gaussian rows, through the cache's writer) to
  // every layer without running the model: lets benchmarks measure decode at a long depth
  // without first processing a long prompt.
  void FillWithRandomCells(int n, uint64_t seed);

 private:
  class CacheAttention;
  class StateRecurrent;
  // Runs a batch already checked; n_out logits rows land in logits_.
  Result<const float*> Run(const ForwardBatch& batch, int n_out);
  // Where the forward pass writes the batch's hidden rows ([n_tokens, n_embd]): a batch of one
  // sequence straight into hidden_ at its positions, several into batch_hidden_.
  float* HiddenRows(const std::vector<AttentionSegment>& segments, int n_tokens);
  // Records the rows the pass wrote at `rows` (copied to hidden_ by sequence and position when
  // they went to batch_hidden_).
  void StoreHidden(const std::vector<AttentionSegment>& segments, const float* rows);
  const Model& model_;
  ThreadPool& pool_;
  // Runs attention that is too small for a fork and join (a short context) on the caller.
  ThreadPool inline_pool_{1};
  KvCache cache_;
  RecurrentState recurrent_;
  const WriteObserver* observer_ = nullptr;  // planted faults; not owned
  ForwardScratch scratch_;
  AttentionScratch attention_scratch_;
  // [pool threads - 1] the other threads' scratch when a decode step's sequences are spread
  // over the pool (CacheAttention::AttendBySequence; the caller uses attention_scratch_)
  std::vector<AttentionScratch> sequence_scratch_;
  std::vector<float> logits_;                 // [n_outputs, n_vocab]
  std::vector<int32_t> positions_;            // [n_tokens] Eval's positions
  std::vector<int> n_past_;                   // [n_seq]
  std::vector<std::vector<int32_t>> tokens_;  // [n_seq][n_past]
  uint64_t memory_limit_ = UINT64_MAX;
  // KeepHidden: per sequence [n_ctx, n_embd] (allocated whole, or grown on demand) and the
  // valid length; a batch of several sequences' rows [n_tokens, n_embd]. Empty unless kept.
  std::vector<std::vector<float>> hidden_;
  std::vector<int> n_hidden_;  // [n_seq]
  std::vector<float> batch_hidden_;
  const float* embd_in_ = nullptr;  // Decode(batch, embd)'s rows while it runs
};

}  // namespace lamina
