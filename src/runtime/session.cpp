// Session: batched prefill and decode over the KV cache.
#include "runtime/session.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "util/memory.h"

namespace lamina {

Result<KvCacheConfig> MakeKvCacheConfig(const Hparams& hp, const SessionConfig& c) {
  KvCacheConfig kc;
  kc.n_layer = hp.kv_layers();
  kc.n_ctx = c.n_ctx > 0 ? c.n_ctx : std::min(hp.n_ctx_train, 4096);
  kc.n_seq = std::max(1, c.n_seq);
  kc.n_kv_heads = hp.n_head_kv;
  kc.head_dim = hp.head_dim;
  kc.type = c.kv_type;
  kc.v_rounding = c.v_rounding;
  kc.seed = c.kv_seed;
  kc.rope = hp.uses_long_rope(kc.n_ctx) ? hp.rope_long : hp.rope;
  // Anchored keys follow one RoPE for every layer: where sliding-window layers rotate with
  // another, the anchors are plain offsets (still exact, only less fitted to rotating keys).
  if (!hp.swa_layers.empty() && (hp.rope_swa.freq_base != hp.rope.freq_base ||
                                 hp.rope_swa.freq_scale != hp.rope.freq_scale)) {
    kc.rope.n_rot = 0;
  }
  kc.write_observer = c.write_observer;
  kc.window = c.kv_window == kKvWindowModeDefault ? KvModeOf(c.kv_type).window : c.kv_window;
  if (!hp.swa_layers.empty()) {
    kc.sliding_window.resize(kc.n_layer);
    for (int l = 0; l < kc.n_layer; ++l) kc.sliding_window[l] = hp.sliding_window(l);
  }
  kc.swa_full = c.swa_full;
  Status st = ValidateKvConfig(kc);
  if (!st.ok()) return st.error();
  return kc;
}

uint64_t ForwardBytes(const Hparams& hp, int n_tokens, int n_out) {
  // Residual, normed and output-of-attention rows, Q/K/V, gate/up, RoPE tables, the matmul's
  // quantized activations (at most one f32 row's bytes per row) and slack for MoE buffers.
  // The last 3 n_embd: the batch's hidden rows (KeepHidden) and an MTP block's [enorm | hnorm].
  uint64_t per_token_floats = 7ull * hp.n_embd + 3ull * hp.q_dim() + 2ull * hp.kv_dim() +
                              4ull * hp.n_ff + static_cast<uint64_t>(hp.rope.n_rot);
  if (hp.recurrent.n_layer > 0) {
    // Hybrid layers: qkv and its convolution, z and the heads' output, gates, and the larger
    // of the gated attention's [q | gate] rows and a fused ssm_in's.
    const RecurrentShape& r = hp.recurrent;
    const uint64_t c = static_cast<uint64_t>(r.conv_channels());
    const uint64_t vd = static_cast<uint64_t>(r.n_v_heads) * r.head_v;
    per_token_floats +=
        2 * c + 2 * vd + 4ull * r.n_v_heads + std::max<uint64_t>(2ull * hp.q_dim(), c + vd);
  }
  const uint64_t act = SatMul(SatMul(per_token_floats, std::max(0, n_tokens)), sizeof(float));
  const uint64_t logits =
      SatMul(SatMul(static_cast<uint64_t>(std::max(0, n_out)), hp.n_vocab), sizeof(float));
  return SatAdd(act, logits);
}

namespace {
KvCacheConfig CheckedCacheConfig(const Hparams& hp, const SessionConfig& c) {
  Result<KvCacheConfig> kc = MakeKvCacheConfig(hp, c);
  LAMINA_CHECK(kc.ok());
  return *kc;
}
}  // namespace

void SequenceBatch::Clear() {
  tokens.clear();
  pos.clear();
  seq.clear();
  output.clear();
}

void SequenceBatch::Add(int32_t token, int seq_id, int position, bool want_logits) {
  tokens.push_back(token);
  pos.push_back(position);
  seq.push_back(seq_id);
  output.push_back(want_logits ? 1 : 0);
}

int SequenceBatch::n_outputs() const {
  int n = 0;
  for (uint8_t o : output) n += o != 0;
  return n;
}

namespace {
using Segment = AttentionSegment;

// Attention of at most this many query-cell pairs times q_dim runs on the calling thread
// (128 cells of a 1,024-wide query; ~10 us on one core).
constexpr int64_t kInlineAttentionWork = int64_t{1} << 17;

// A step's sequences are spread over the threads (CacheAttention::AttendBySequence) when each
// brings at most this many tokens: a decode token or a verify window, not a prompt chunk.
constexpr int kMaxTokensBySequence = 16;
static_assert(kMaxTokensBySequence <= kKvWindowSlack, "a window's pieces hold whole segments");

// Whether every value of x [n] is finite: no exponent field of all ones (inf or NaN).
bool AllFinite(const float* x, int64_t n) {
  uint32_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, x + i, sizeof(bits));
    bad |= static_cast<uint32_t>((bits & 0x7F800000u) == 0x7F800000u);
  }
  return bad == 0;
}

std::vector<Segment> Segments(const ForwardBatch& b) {
  std::vector<Segment> out;
  for (int t = 0; t < b.n_tokens; ++t) {
    const int seq = b.seq != nullptr ? b.seq[t] : 0;
    if (!out.empty() && out.back().seq == seq && out.back().pos0 + out.back().n == b.pos[t]) {
      ++out.back().n;
    } else {
      out.push_back({seq, b.pos[t], t, 1});
    }
  }
  return out;
}
}  // namespace

// Bridges the model's attention calls to the cache: per segment of one sequence, write through
// the single writer, then read.
class Session::CacheAttention final : public AttentionContext {
 public:
  CacheAttention(Session& s, std::vector<Segment> segments)
      : s_(s), segments_(std::move(segments)), whole_begin_{0, static_cast<int>(segments_.size())} {
    Split();
  }
  void Attend(int layer, const float* q, const float* k, const float* v, float* out) override {
    const Hparams& hp = s_.model_.hparams();
    const size_t kvd = hp.kv_dim();
    const AttentionShape shape{hp.n_head,
                               hp.n_head_kv,
                               hp.head_dim,
                               hp.attention_scale(),
                               hp.sliding_window(layer),
                               s_.model_.AttentionSinks(layer)};
    if (AttendBySequence(layer, q, k, v, out, shape)) return;
    // Per piece (all segments without a window, and in a layer that keeps every cell when only
    // sliding-window rings need pieces): every segment's cells first (one-token segments
    // encode on this thread: a pool dispatch would cost more than the row), then attention
    // over all its segments in one pass.
    const bool whole = s_.cache_.window() == 0 && !s_.cache_.ring_layer(layer);
    const std::vector<Segment>& pieces = whole ? segments_ : pieces_;
    const std::vector<int>& piece_begin = whole ? whole_begin_ : piece_begin_;
    for (size_t p = 0; p + 1 < piece_begin.size(); ++p) {
      const Segment* first = pieces.data() + piece_begin[p];
      const int n = piece_begin[p + 1] - piece_begin[p];
      for (const Segment* g = first; g != first + n; ++g) {
        s_.cache_.Write(layer, g->seq, g->pos0, g->n, k + g->begin * kvd, v + g->begin * kvd,
                        g->n > 1 ? &s_.pool_ : nullptr);
      }
      // Attention over few cells runs on this thread: the pool's fork and join would cost
      // about what its other threads save, and meanwhile they prefetch the output projection
      // (ThreadPool::PrefetchWhileIdle). The split never changes a result.
      int64_t work = 0;  // query-cell pairs times q_dim
      for (const Segment* g = first; g != first + n; ++g) {
        work += static_cast<int64_t>(g->n) * (g->pos0 + g->n) * hp.q_dim();
      }
      ThreadPool& pool = work <= kInlineAttentionWork ? s_.inline_pool_ : s_.pool_;
      CausalAttentionSegments(s_.cache_, layer, first, n, q, out, shape, s_.attention_scratch_,
                              pool);
    }
  }

 private:
  // A decode step of several sequences (a token each, or a short verify window: at most
  // kMaxTokensBySequence; no sequence twice), spread over the pool a sequence at a time: each
  // thread writes its sequences' cells through the single writer and runs their attention
  // itself, so the writes no longer queue on the caller and no thread reads the cells another
  // one just wrote. Each segment's attention is CausalAttention's for it alone (its chunks are
  // fixed by cell index), so the split changes no result; a window's or a ring's pieces
  // (Split) are these segments then (each under kKvWindowSlack tokens). Taken where every
  // thread gets a sequence and the sequences balance over the threads (or their attention is
  // too short for the pool's items to pay); not with a write observer or a non-finite row (the
  // serial path reports it). Returns false, having done nothing, where the step does not
  // qualify.
  bool AttendBySequence(int layer, const float* q, const float* k, const float* v, float* out,
                        const AttentionShape& shape) {
    const Hparams& hp = s_.model_.hparams();
    const int n_threads = s_.pool_.size();
    const int n = static_cast<int>(segments_.size());
    if (n_threads < 2 || n < n_threads || s_.cache_.config().write_observer != nullptr) {
      return false;
    }
    int64_t total = 0, largest = 0;  // query-cell pairs times q_dim
    int64_t n_rows = 0;              // the batch's rows, every segment's
    seen_.assign(s_.n_seq(), 0);
    for (const Segment& g : segments_) {
      if (g.n > kMaxTokensBySequence || seen_[g.seq] != 0) return false;
      seen_[g.seq] = 1;
      n_rows += g.n;
      int64_t pairs = 0;  // the segment's query-cell pairs
      for (int t = 0; t < g.n; ++t) {
        const int cells = g.pos0 + t + 1;
        pairs += shape.sliding_window > 0 ? std::min(cells, shape.sliding_window) : cells;
      }
      const int64_t work = pairs * hp.q_dim();
      total += work;
      largest = std::max(largest, work);
    }
    if (total > n_threads * kInlineAttentionWork && 2 * n_threads * largest > total) return false;
    const size_t kvd = hp.kv_dim();
    if (!AllFinite(k, n_rows * static_cast<int64_t>(kvd)) ||
        !AllFinite(v, n_rows * static_cast<int64_t>(kvd))) {
      return false;
    }
    // Slot 0 (the caller) shares the pool path's scratch; the others have their own.
    if (s_.sequence_scratch_.size() + 1 < static_cast<size_t>(n_threads)) {
      s_.sequence_scratch_.resize(n_threads - 1);
    }
    s_.pool_.ParallelFor(n, 1, [&](int64_t i0, int64_t i1, int slot) {
      AttentionScratch& scratch =
          slot == 0 ? s_.attention_scratch_ : s_.sequence_scratch_[slot - 1];
      for (int64_t i = i0; i < i1; ++i) {
        const Segment& g = segments_[i];
        s_.cache_.Write(layer, g.seq, g.pos0, g.n, k + g.begin * kvd, v + g.begin * kvd, nullptr);
        CausalAttentionSegments(s_.cache_, layer, &g, 1, q, out, shape, scratch, s_.inline_pool_);
      }
    });
    return true;
  }

  // With a window or a sliding-window ring, a sequence may write at most kKvWindowSlack cells
  // before attention reads them (its window's exact copies, or the cells of its sliding window,
  // must still be in the ring): the segments are cut into pieces holding at most that many
  // tokens of each sequence, run in order. Every token's result depends only on its own cells,
  // so the pieces change nothing else.
  void Split() {
    if (s_.cache_.window() == 0 && !s_.cache_.has_rings()) {
      pieces_ = segments_;
      piece_begin_ = {0, static_cast<int>(pieces_.size())};
      return;
    }
    piece_begin_ = {0};
    std::vector<int> in_piece(s_.n_seq(), 0);  // [n_seq] tokens of each sequence in this piece
    for (Segment g : segments_) {
      while (g.n > 0) {
        if (in_piece[g.seq] == kKvWindowSlack) {
          piece_begin_.push_back(static_cast<int>(pieces_.size()));
          std::fill(in_piece.begin(), in_piece.end(), 0);
        }
        const int take = std::min(g.n, kKvWindowSlack - in_piece[g.seq]);
        pieces_.push_back({g.seq, g.pos0, g.begin, take});
        in_piece[g.seq] += take;
        g.pos0 += take;
        g.begin += take;
        g.n -= take;
      }
    }
    piece_begin_.push_back(static_cast<int>(pieces_.size()));
  }

  Session& s_;
  std::vector<Segment> segments_;
  std::vector<int> whole_begin_;  // {0, segments_.size()}: the segments as one piece
  std::vector<Segment> pieces_;   // segments_, cut where a piece would pass the slack
  std::vector<int> piece_begin_;  // [n_pieces + 1] each piece's first entry of pieces_
  std::vector<char> seen_;        // [n_seq] AttendBySequence: sequences met in the batch
};

// Bridges the model's Gated DeltaNet layers to the recurrent state: per segment of one
// sequence, the store's single writer.
class Session::StateRecurrent final : public RecurrentContext {
 public:
  StateRecurrent(Session& s, const std::vector<Segment>& segments) : s_(s), segments_(segments) {}
  void Scan(int layer, const float* conv_w, const float* qkv, const float* decay, const float* beta,
            float* out) override {
    const RecurrentShape& r = s_.recurrent_.shape();
    const int64_t c = r.conv_channels(), nv = r.n_v_heads, vd = nv * r.head_v;
    for (const Segment& g : segments_) {
      s_.recurrent_.Scan(layer, g.seq, g.pos0, g.n, conv_w, qkv + g.begin * c, decay + g.begin * nv,
                         beta + g.begin * nv, out + g.begin * vd, s_.pool_);
    }
  }

 private:
  Session& s_;
  const std::vector<Segment>& segments_;
};

Session::Session(const Model& model, const SessionConfig& config, ThreadPool& pool)
    : model_(model),
      pool_(pool),
      cache_(CheckedCacheConfig(model.hparams(), config)),
      recurrent_(model.hparams().recurrent, cache_.config().n_seq, config.recurrent_ring,
                 config.write_observer),
      observer_(config.write_observer),
      n_past_(cache_.config().n_seq, 0),
      tokens_(cache_.config().n_seq),
      memory_limit_(config.memory_limit) {}

Result<const float*> Session::Eval(const std::vector<int32_t>& tokens, bool all_logits) {
  return EvalSeq(0, tokens.data(), static_cast<int>(tokens.size()), all_logits);
}

Result<const float*> Session::Eval(const int32_t* tokens, int n, bool all_logits) {
  return EvalSeq(0, tokens, n, all_logits);
}

namespace {
Status CheckToken(int32_t id, int n_vocab) {
  if (id < 0 || id >= n_vocab) return Error{"token id " + std::to_string(id) + " out of range"};
  return Status::Ok();
}
}  // namespace

Result<const float*> Session::EvalSeq(int seq, const int32_t* tokens, int n, bool all_logits) {
  const Hparams& hp = model_.hparams();
  LAMINA_CHECK(seq >= 0 && seq < n_seq());
  if (n <= 0) return Error{"empty batch"};
  if (n_past_[seq] + n > n_ctx()) {
    return Error{"context overflow: " + std::to_string(n_past_[seq]) + " + " + std::to_string(n) +
                 " tokens exceed the context of " + std::to_string(n_ctx())};
  }
  for (int i = 0; i < n; ++i) {
    Status st = CheckToken(tokens[i], hp.n_vocab);
    if (!st.ok()) return st.error();
  }
  positions_.resize(n);
  for (int i = 0; i < n; ++i) positions_[i] = n_past_[seq] + i;
  std::vector<int32_t> seqs(seq == 0 ? 0 : n, seq);     // [n] (empty: all 0)
  std::vector<uint8_t> outputs(all_logits ? n : 0, 1);  // [n] (empty: the last only)
  ForwardBatch batch;
  batch.tokens = tokens;
  batch.pos = positions_.data();
  batch.seq = seqs.empty() ? nullptr : seqs.data();
  batch.output = outputs.empty() ? nullptr : outputs.data();
  batch.n_tokens = n;
  return Run(batch, all_logits ? n : 1);
}

Result<const float*> Session::Decode(const SequenceBatch& b) {
  const Hparams& hp = model_.hparams();
  const int n = b.size();
  if (n <= 0) return Error{"empty batch"};
  LAMINA_CHECK(b.pos.size() == b.tokens.size() && b.seq.size() == b.tokens.size() &&
               b.output.size() == b.tokens.size());
  std::vector<int> next(n_past_);  // [n_seq] each sequence's next position
  for (int i = 0; i < n; ++i) {
    Status st = CheckToken(b.tokens[i], hp.n_vocab);
    if (!st.ok()) return st.error();
    const int seq = b.seq[i];
    if (seq < 0 || seq >= n_seq()) {
      return Error{"batch token " + std::to_string(i) + ": sequence " + std::to_string(seq) +
                   " out of range (the cache holds " + std::to_string(n_seq()) + ")"};
    }
    if (b.pos[i] != next[seq]) {
      return Error{"batch token " + std::to_string(i) + ": position " + std::to_string(b.pos[i]) +
                   " does not continue sequence " + std::to_string(seq) + " (next is " +
                   std::to_string(next[seq]) + ")"};
    }
    if (++next[seq] > n_ctx()) {
      return Error{"context overflow: sequence " + std::to_string(seq) + " would exceed " +
                   std::to_string(n_ctx()) + " cells"};
    }
  }
  ForwardBatch batch;
  batch.tokens = b.tokens.data();
  batch.pos = b.pos.data();
  batch.seq = b.seq.data();
  batch.output = b.output.data();
  batch.n_tokens = n;
  batch.embd = embd_in_;
  return Run(batch, b.n_outputs());
}

Result<const float*> Session::Decode(const SequenceBatch& b, const float* embd) {
  embd_in_ = embd;
  Result<const float*> r = Decode(b);
  embd_in_ = nullptr;
  return r;
}

void Session::KeepHidden(bool whole_context) {
  if (!hidden_.empty()) return;
  hidden_.resize(n_seq());
  n_hidden_.assign(n_seq(), 0);
  if (!whole_context) return;
  // Every sequence's rows now, zeroed (so written once): a decode step then stores its row in
  // memory already touched, as the KV cache's cells are, instead of a fresh page every few
  // steps and a reallocation (a copy into fresh pages) each time the store doubled; a first
  // touch costs a page fault, 25-35 us on the EPYC VM, ~4 % of the shipped model's step.
  const size_t rows = static_cast<size_t>(n_ctx()) * model_.hparams().n_embd;
  for (std::vector<float>& h : hidden_) h.assign(rows, 0.0f);
}

const float* Session::Hidden(int seq, int pos) const {
  LAMINA_CHECK(seq >= 0 && seq < n_seq() && pos >= 0 && pos < n_hidden(seq));
  return hidden_[seq].data() + static_cast<size_t>(pos) * model_.hparams().n_embd;
}

float* Session::HiddenRows(const std::vector<AttentionSegment>& segments, int n_tokens) {
  const size_t d = model_.hparams().n_embd;
  if (segments.size() == 1) {  // one sequence (a decode step, a window, a prompt chunk): in place
    const Segment& g = segments[0];
    std::vector<float>& h = hidden_[g.seq];
    if (h.size() < (g.pos0 + g.n) * d) h.resize((g.pos0 + g.n) * d);
    return h.data() + g.pos0 * d;
  }
  batch_hidden_.resize(static_cast<size_t>(n_tokens) * d);
  return batch_hidden_.data();
}

void Session::StoreHidden(const std::vector<AttentionSegment>& segments, const float* rows) {
  const size_t d = model_.hparams().n_embd;
  for (const Segment& g : segments) {
    std::vector<float>& h = hidden_[g.seq];
    if (rows == batch_hidden_.data()) {
      if (h.size() < (g.pos0 + g.n) * d) h.resize((g.pos0 + g.n) * d);
      std::copy_n(rows + g.begin * d, g.n * d, h.data() + g.pos0 * d);
    }
    // Rows after the batch belong to an older history; a gap before it leaves them unknown.
    if (g.pos0 <= n_hidden_[g.seq]) n_hidden_[g.seq] = g.pos0 + g.n;
  }
}

Result<const float*> Session::Run(const ForwardBatch& batch, int n_out) {
  if (memory_limit_ != UINT64_MAX) {
    const uint64_t cache = SatAdd(KvCacheBytes(cache_.config()), recurrent_.bytes());
    const uint64_t need = ForwardBytes(model_.hparams(), batch.n_tokens, n_out);
    if (SatAdd(cache, need) > memory_limit_) {
      return Error{"a batch of " + std::to_string(batch.n_tokens) + " tokens needs " +
                   FormatBytes(need) + " of scratch besides the " + FormatBytes(cache) +
                   " KV cache, over the memory limit of " + FormatBytes(memory_limit_) +
                   "; use smaller batches (--prompt-chunk, -b)"};
    }
  }
  logits_.resize(static_cast<size_t>(n_out) * model_.hparams().n_vocab);
  std::vector<Segment> segments = Segments(batch);
  for (const Segment& g : segments) {
    n_past_[g.seq] = g.pos0 + g.n;
    tokens_[g.seq].resize(g.pos0);
    tokens_[g.seq].insert(tokens_[g.seq].end(), batch.tokens + g.begin,
                          batch.tokens + g.begin + g.n);
  }
  StateRecurrent recurrent(*this, segments);
  CacheAttention attention(*this, segments);
  ForwardBatch b = batch;
  b.long_rope = long_rope();
  if (!hidden_.empty()) b.hidden = HiddenRows(segments, b.n_tokens);
  model_.Forward(b, attention, recurrent, scratch_, pool_, logits_.data());
  if (!hidden_.empty()) StoreHidden(segments, b.hidden);
  if (!cache_.nonfinite_error().empty()) {
    const std::string msg = cache_.nonfinite_error();
    cache_.ClearNonfinite();
    return Error{msg};
  }
  return static_cast<const float*>(logits_.data());
}

void Session::FillWithRandomCells(int n, uint64_t seed) {
  LAMINA_CHECK(n >= 0 && n_past_[0] + n <= n_ctx());
  const int row = cache_.row_elems();
  const int chunk = 256;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> k(static_cast<size_t>(chunk) * row), v(k.size());  // [chunk, row]
  for (int p0 = 0; p0 < n; p0 += chunk) {
    const int m = std::min(chunk, n - p0);
    for (int layer = 0; layer < cache_.config().n_layer; ++layer) {
      for (size_t i = 0; i < static_cast<size_t>(m) * row; ++i) {
        k[i] = normal(rng);
        v[i] = normal(rng);
      }
      cache_.Write(layer, 0, n_past_[0] + p0, m, k.data(), v.data(), &pool_);
    }
  }
  n_past_[0] += n;
  tokens_[0].resize(n_past_[0], -1);
  recurrent_.Skip(0, n_past_[0]);
}

void Session::RestoreSequence(int seq, const std::vector<int32_t>& tokens, const uint8_t* state) {
  LAMINA_CHECK(seq >= 0 && seq < n_seq());
  const int n = static_cast<int>(tokens.size());
  LAMINA_CHECK(n <= n_ctx());
  for (int32_t t : tokens) LAMINA_CHECK(t >= 0 && t < model_.hparams().n_vocab);
  // Session files hold K/V only; they are refused for hybrid models before this point.
  LAMINA_CHECK(recurrent_.empty());
  cache_.ImportSequence(seq, n, state);
  if (!hidden_.empty()) n_hidden_[seq] = 0;
  n_past_[seq] = n;
  tokens_[seq] = tokens;
}

int Session::ExactKeep(int seq, int n_keep) const {
  LAMINA_CHECK(seq >= 0 && seq < n_seq());
  n_keep = cache_.ExactKeep(seq, std::max(0, std::min(n_keep, n_past_[seq])));
  return std::min(n_keep, recurrent_.ExactKeep(seq, n_keep));
}

void Session::Truncate(int seq, int n_keep) {
  n_keep = ExactKeep(seq, n_keep);
  if (observer_ != nullptr && n_keep < n_past_[seq] &&
      observer_->KeepOnTruncate(seq, n_past_[seq], n_keep)) {
    return;  // a planted fault: the cells after n_keep stay
  }
  cache_.Truncate(seq, n_keep);
  recurrent_.Truncate(seq, n_keep);
  if (!hidden_.empty()) n_hidden_[seq] = std::min(n_hidden_[seq], n_keep);
  n_past_[seq] = n_keep;
  tokens_[seq].resize(n_keep);
}

Status Session::TruncateExact(int seq, int n_keep) {
  LAMINA_CHECK(seq >= 0 && seq < n_seq());
  const int want = std::max(0, std::min(n_keep, n_past_[seq]));
  const int keep = ExactKeep(seq, want);
  if (keep != want) {
    return Error{"cannot roll sequence " + std::to_string(seq) + " back from " +
                 std::to_string(n_past_[seq]) + " to " + std::to_string(want) +
                 " tokens exactly: " +
                 (recurrent_.ExactKeep(seq, want) != want
                      ? "recurrent state is kept for the last " +
                            std::to_string(recurrent_.ring()) + " tokens only"
                      : std::string("the KV window or a sliding-window ring no longer holds it"))};
  }
  Truncate(seq, keep);
  return Status::Ok();
}

void Session::CopyPrefix(int src_seq, int dst_seq, int n) {
  LAMINA_CHECK(src_seq >= 0 && src_seq < n_seq() && dst_seq >= 0 && dst_seq < n_seq());
  LAMINA_CHECK(n >= 0 && n <= n_past_[src_seq]);
  n = ExactKeep(src_seq, n);
  if (src_seq == dst_seq) {
    Truncate(dst_seq, n);
    return;
  }
  cache_.CopyPrefix(src_seq, dst_seq, n);
  recurrent_.CopyPrefix(src_seq, dst_seq, n);
  if (!hidden_.empty()) {
    const size_t d = model_.hparams().n_embd;
    n_hidden_[dst_seq] = std::min(n, n_hidden_[src_seq]);
    std::vector<float>& dst = hidden_[dst_seq];  // keeps its size (a whole context's store)
    const size_t count = static_cast<size_t>(n_hidden_[dst_seq]) * d;
    if (dst.size() < count) dst.resize(count);
    std::copy_n(hidden_[src_seq].begin(), count, dst.begin());
  }
  n_past_[dst_seq] = n;
  tokens_[dst_seq].assign(tokens_[src_seq].begin(), tokens_[src_seq].begin() + n);
}

}  // namespace lamina
