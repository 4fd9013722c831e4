// Tiled two-pass causal GQA attention over encoded KV rows.
#include "runtime/attention.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/attention_kernels.h"
#include "kernels/kv_decode.h"
#include "kernels/kv_format.h"
#include "kernels/ops.h"
#include "util/check.h"

namespace lamina {

namespace {
constexpr int kTokenBlock = 8;  // tokens sharing one pass over the cells
constexpr int kCellTile = 64;   // cells decoded at once
constexpr int kCellChunk = kAttentionCellChunk;
static_assert(kCellChunk % kCellTile == 0);
// A sliding-window layer's ring (kv_cache.h) holds whole tiles: a tile never wraps around it.
static_assert(kKvRingAlign % kCellTile == 0);
// Merged chunk results held at once: work items are run in waves of at most this many stored
// chunks (a block's chunks always share a wave).
constexpr int64_t kMaxStoredChunks = 512;
// Anchored keys (kv_cache.h): a flagged cell at position p stores k - R(p) a, so its score
// misses scale * q . R(p) a. For a rotated pair (x, y) that the anchor keeps, that is
// m [cos(p t) (qx ax + qy ay) + sin(p t) (qy ax - qx ay)]: two coefficients per kept pair and
// query, times the cos and sin of the cell's angle (from the cache's angle tables); the
// dimensions RoPE leaves alone add a constant q . a. q: the queries as RoPE left them (not
// rotated for the cache). Scratch: coef [2 * kept pairs][nq] (the accumulators, free until
// pass 2; kept pairs <= head_dim / 2, so it fits), rest [nq] (the query rows, done with after
// pass 1), tables [2 * kept pairs][kCellTile] (the tile).
// Cells a query reads from the window's exact copy (wb[qi] and later) are not corrected.
void AddAnchorScores(const KvCache& cache, int layer, int seq, int g, int pos0, int c_lo,
                     int n_cells, const float* q, int64_t q_stride, int t0, int nq, int group,
                     const AttentionShape& shape, int n_ctx, const int* wb, float* coef,
                     float* rest, float* tables, float* scores) {
  const int hd = shape.head_dim;
  const int n_rot = cache.config().rope.n_rot;
  const float m = cache.anchor_mscale();
  const float* a = cache.KAnchor(layer, seq, g);
  int pairs[kAnchorMaxPairs];
  int n_pairs = 0;
  for (int j = 0; j < n_rot / 2 && n_pairs < kAnchorMaxPairs; ++j) {
    if (a[cache.PairX(j)] != 0.0f || a[cache.PairY(j)] != 0.0f) pairs[n_pairs++] = j;
  }
  const int n_terms = 2 * n_pairs;  // per query: a cos and a sin coefficient per kept pair
  for (int qi = 0; qi < nq; ++qi) {
    const int t = t0 + qi / group, h = g * group + qi % group;
    const float* qr = q + t * q_stride + static_cast<int64_t>(h) * hd;
    for (int i = 0; i < n_pairs; ++i) {
      const int x = cache.PairX(pairs[i]), y = cache.PairY(pairs[i]);
      coef[static_cast<size_t>(2 * i) * nq + qi] = m * (qr[x] * a[x] + qr[y] * a[y]);
      coef[static_cast<size_t>(2 * i + 1) * nq + qi] = m * (qr[y] * a[x] - qr[x] * a[y]);
    }
    float r = 0.0f;
    for (int e = n_rot; e < hd; ++e) r += qr[e] * a[e];
    rest[qi] = r;
  }
  static_assert(kCellTile == kAnchorAngleRun, "a tile is one anchor-angle run");
  // The kept pairs' offset tables side by side: [2 * n_pairs][kCellTile] (cos row, sin row).
  for (int i = 0; i < n_pairs; ++i) {
    std::copy_n(cache.AnchorOffsetCosSin(pairs[i]), 2 * kCellTile, tables + 2 * i * kCellTile);
  }
  static_assert(kCellTile == kAnchorTileCells, "the anchor kernel's tiles are attention's");
  const KvAnchorScoreFn anchor = BestKvAnchorScorer();
  // Runs of up to kRunTiles tiles per kernel call (within one turn of a ring layer's cells), so
  // that the kernel runs the sparse tiles' cells together; blocks of queries within a run.
  constexpr int kQueryBlock = 32;
  constexpr int kRunTiles = 16;
  const int64_t tile_stride = 2 * n_pairs * kQueryBlock;  // floats of one tile's weights at most
  // [kRunTiles][2 * n_pairs][n] each tile's offset-table weights (term-major), tiles
  // tile_stride apart
  float xy[kRunTiles * 2 * kAnchorMaxPairs * kQueryBlock];
  int lims[kQueryBlock];    // the query's causal or window limit, relative to the run
  bool flagged[kRunTiles];  // [tile of the run] some cell of it is flagged
  const int ring = cache.layer_cells(layer);
  for (int r0 = c_lo; r0 < n_cells;) {
    const int r1 = std::min({n_cells, r0 + kRunTiles * kCellTile, (r0 / ring + 1) * ring});
    const uint8_t* flags = cache.KAnchorFlags(layer, seq, g, r0);  // [r1 - r0] the run's cells
    bool any_tile = false;
    for (int c0 = r0, i = 0; c0 < r1; c0 += kCellTile, ++i) {
      const int nc = std::min(kCellTile, r1 - c0);
      const uint8_t* f = flags + (c0 - r0);
      uint64_t any = 0;  // (no early exit: the loops vectorise)
      if (nc == kCellTile) {
        for (int j = 0; j < kCellTile; j += 8) {
          uint64_t word;
          std::memcpy(&word, f + j, 8);
          any |= word;
        }
      } else {
        for (int j = 0; j < nc; ++j) any |= f[j];
      }
      flagged[i] = any != 0;
      any_tile |= flagged[i];
    }
    if (!any_tile) {
      r0 = r1;
      continue;
    }
    for (int q0 = 0; q0 < nq; q0 += kQueryBlock) {
      const int n = std::min(kQueryBlock, nq - q0);
      for (int b = 0; b < n; ++b) lims[b] = wb[q0 + b] - r0;
      for (int c0 = r0, t = 0; c0 < r1; c0 += kCellTile, ++t) {
        if (!flagged[t]) continue;  // the kernel reads no weights of a tile without flags
        // cos(p t) = C0 cos(k t) - S0 sin(k t), sin(p t) = S0 cos(k t) + C0 sin(k t) for
        // p = c0 + k, so a query's correction is a weighted sum of the kept pairs' offset tables.
        const float* start = cache.AnchorRunStart(c0 / kCellTile);
        for (int i = 0; i < n_pairs; ++i) {
          const float c0s = start[2 * pairs[i]], s0s = start[2 * pairs[i] + 1];
          const float* ce = coef + static_cast<size_t>(2 * i) * nq + q0;      // [n] cos coefs
          const float* co = coef + static_cast<size_t>(2 * i + 1) * nq + q0;  // [n] sin coefs
          float* we = xy + t * tile_stride + 2 * i * n;                       // [n]
          float* wo = xy + t * tile_stride + (2 * i + 1) * n;                 // [n]
          for (int b = 0; b < n; ++b) {  // (vectorises: the queries are consecutive)
            we[b] = ce[b] * c0s + co[b] * s0s;
            wo[b] = co[b] * c0s - ce[b] * s0s;
          }
        }
      }
      anchor(xy, tile_stride, n_terms, tables, rest + q0, flags, r1 - r0, n, lims, shape.scale,
             scores + static_cast<size_t>(q0) * n_ctx + r0, n_ctx);
    }
    r0 = r1;
  }
}

// A unit is one token block of one segment; its work items are (KV head, cell chunk).
struct Unit {
  int seg, t0, nt, n_chunks;
  int64_t first_slot;  // its chunks' stored results (-1: one chunk, written out directly)
};

// The units of every segment, in segment and token order.
std::vector<Unit> MakeUnits(const AttentionSegment* segments, int n_segments) {
  std::vector<Unit> units;
  for (int s = 0; s < n_segments; ++s) {
    for (int t0 = 0; t0 < segments[s].n; t0 += kTokenBlock) {
      const int nt = std::min(kTokenBlock, segments[s].n - t0);
      const int n_cells = segments[s].pos0 + t0 + nt;
      units.push_back({s, t0, nt, (n_cells + kCellChunk - 1) / kCellChunk, -1});
    }
  }
  return units;
}

// Lays out the wave of units from u0 whose stored chunks fit kMaxStoredChunks (a unit alone
// may exceed it): sets their first slot, counts their items, and returns the wave's end.
size_t PlanWave(std::vector<Unit>& units, size_t u0, int n_head_kv, int64_t* n_items,
                int64_t* n_slots) {
  size_t u1 = u0;
  while (u1 < units.size()) {
    Unit& unit = units[u1];
    const int64_t unit_items = static_cast<int64_t>(n_head_kv) * unit.n_chunks;
    const int64_t unit_slots = unit.n_chunks > 1 ? unit_items : 0;
    if (u1 > u0 && *n_slots + unit_slots > kMaxStoredChunks) break;
    unit.first_slot = unit.n_chunks > 1 ? *n_slots : -1;
    *n_items += unit_items;
    *n_slots += unit_slots;
    ++u1;
  }
  return u1;
}

// One work item: cells [c_lo, n_cells) of a unit's KV head g on one thread's scratch. Query
// qi = (token t0 + qi / group, head g * group + qi % group).
struct Chunk {
  int g, c_lo;
  int n_cells;  // cells of the chunk end here
  int seq, pos0, t0, nq, group;
  const float* q;  // the segment's first query row
  float* out;      // the segment's first output row
  float* scores;   // [max_queries][n_ctx]
  float* qrows;    // [max_queries][hd]
  float* acc;      // [max_queries][hd]
  float* tile;     // [kCellTile][hd]
  // Integer path: qq [max_queries][hd] codes; their scales qd [max_queries][hd / 32] reuse the
  // accumulators, which are not needed until pass 2.
  int16_t* qq;
  float* qd;
  // wb[qi]: the first cell the query reads from the window's exact copy (its causal end:
  // none); lims[qi]: a tile's rows the query reads. [max_queries] scratch of the thread.
  int* wb;
  int* lims;
  int window_lo;  // the first cell any query of the chunk reads exactly
  int sliding;    // AttentionShape::sliding_window (0: none)
  // The first cell of the first tile any query of the chunk sees (>= c_lo, a multiple of
  // kCellTile): tiles below every query's sliding window are skipped.
  int c_first;

  int n_kv_of(int qi) const { return pos0 + t0 + qi / group + 1; }  // the query's causal end
  // The first cell the query sees: the start of its sliding window, or 0.
  int lo_of(int qi) const { return sliding > 0 ? std::max(0, n_kv_of(qi) - sliding) : 0; }
};

// What one CausalAttentionSegments call shares across its work items: its arguments, the
// kernels for the cache's row formats and the scratch layout.
class AttentionCall {
 public:
  AttentionCall(const KvCache& cache, int layer, const AttentionSegment* segments,
                const float* q_all, float* out_all, const AttentionShape& shape,
                AttentionScratch& scratch, ThreadPool& pool);

  // Runs the wave of units [u0, u1) (PlanWave), then merges their stored chunks.
  void RunWave(const std::vector<Unit>& units, size_t u0, size_t u1, int64_t n_items,
               int64_t n_slots, ThreadPool& pool) const;

 private:
  // Runs cells [c_lo, c_hi) of the unit's KV head g; with `slot` set, leaves the chunk's
  // normalised V sums and its per-query (max, mass) there instead of writing the output.
  // wb, lims: [max_queries] scratch of the calling thread.
  void RunChunk(const Unit& unit, int g, int c_lo, int c_hi, float* slot, int thread, int* wb,
                int* lims) const;
  Chunk StartChunk(const Unit& unit, int g, int c_lo, int c_hi, int thread, int* wb,
                   int* lims) const;
  // The chunk's query rows as the K rows are stored (rotated, rounded, quantized).
  void LoadQueries(const Chunk& ch) const;
  // Pass 1: scores, window cells' exact keys and anchor corrections included.
  void ScoreChunk(const Chunk& ch) const;
  // Softmax within the chunk (the (max, mass) to `slot` when set); clears the accumulators.
  void NormaliseScores(const Chunk& ch, float* slot) const;
  // Pass 2: weighted V sum.
  void SumValues(const Chunk& ch) const;
  void WriteChunk(const Chunk& ch, float* slot) const;
  // Runs of exact cells [c0, c1) within one tile and one turn of the ring (boundaries at
  // multiples of both, whatever the batch), each query's part of each run in order.
  template <typename PerQuery>
  void ForExactRuns(const Chunk& ch, const uint8_t* (KvCache::*row)(int, int, int, int) const,
                    PerQuery&& per_query) const;
  void MergeChunks(const Unit& unit, int g, float* merged, std::vector<double>& weight) const;
  // Item g * n_chunks + chunk of a unit with stored chunks.
  float* SlotOf(const Unit& unit, int64_t item) const {
    return scratch_.chunks.data() + static_cast<size_t>(unit.first_slot + item) * slot_floats_;
  }

  const KvCache& cache_;
  const int layer_;
  const AttentionSegment* const segments_;
  const float* const q_all_;
  float* const out_all_;
  const AttentionShape& shape_;
  AttentionScratch& scratch_;
  const int hd_;
  const int group_;
  const int n_ctx_;
  const int max_queries_;
  // Per thread: scores [max_queries][n_ctx], queries [max_queries][hd], accumulators
  // [max_queries][hd], a decoded tile [kCellTile][hd].
  const size_t per_thread_;
  const AttentionRowKernels& kern_;
  const KvSideSpec ks_, vs_;
  const KvRowDecodeFn decode_k_;
  const KvRowDecodeFn decode_v_;
  // V rows decoded in registers and accumulated at once, where that is the faster path.
  const KvAccumulateFn accumulate_v_;
  // accumulate_v_ takes a chunk's tiles in one call where every query reads from the chunk's
  // first tile on (the integer V sums: its passes are the tiles, and it prepares the next one's
  // weights during this one's sums).
  const bool v_runs_;
  // The recent window's exact copies (f16 rows in each side's frame), when the cache has one.
  const KvRowDecodeFn decode_exact_;
  const int window_ring_;
  // Cells the layer stores per KV head (a sliding-window ring's, or n_ctx).
  const int layer_cells_;
  // Integer scores read K codes directly (rows, or the cache's int8 / q4_0 tiles:
  // KvCache::KTile);
  // otherwise (both nullptr) K tiles are decoded to f32.
  const KvScoreFn score_k_;
  const KvTileScoreFn score_k_tiles_;
  // f16 K scored from the cache's f16 tiles (every ISA: the same bits), else nullptr.
  const KvF16TileScoreFn score_f16_;
  const int n_qgroups_;
  const bool k_f16_;
  const bool v_f16_;
  const int64_t q_stride_;
  // Stored chunk results: acc [slot][max_queries][hd], then max and mass [slot][max_queries].
  const size_t slot_floats_;
  const size_t slot_max_;  // offsets within a slot
  const size_t slot_mass_;
};

AttentionCall::AttentionCall(const KvCache& cache, int layer, const AttentionSegment* segments,
                             const float* q_all, float* out_all, const AttentionShape& shape,
                             AttentionScratch& scratch, ThreadPool& pool)
    : cache_(cache),
      layer_(layer),
      segments_(segments),
      q_all_(q_all),
      out_all_(out_all),
      shape_(shape),
      scratch_(scratch),
      hd_(shape.head_dim),
      group_(shape.n_head / shape.n_head_kv),
      n_ctx_(cache.config().n_ctx),
      max_queries_(kTokenBlock * group_),
      per_thread_(static_cast<size_t>(max_queries_) * n_ctx_ +
                  2 * static_cast<size_t>(max_queries_) * hd_ +
                  static_cast<size_t>(kCellTile) * hd_),
      kern_(BestAttentionRowKernels()),
      ks_(cache.k_spec()),
      vs_(cache.v_spec()),
      decode_k_(BestKvRowDecoder(ks_.format)),
      decode_v_(BestKvRowDecoder(vs_.format)),
      accumulate_v_(BestKvAccumulator(vs_.format)),
      v_runs_(accumulate_v_ != nullptr && accumulate_v_ == Avx512KvInt16Accumulator(vs_.format)),
      decode_exact_(BestKvRowDecoder(KvRowFormat::kF16)),
      window_ring_(cache.window_ring()),
      layer_cells_(cache.layer_cells(layer)),
      score_k_(KvIntScoreSupported(ks_.format, hd_) && !cache.k_tiled() ? BestKvScorer(ks_.format)
                                                                        : nullptr),
      score_k_tiles_(KvIntScoreSupported(ks_.format, hd_) && cache.k_tiled()
                         ? BestKvTileScorer(ks_.format)
                         : nullptr),
      score_f16_(ks_.format == KvRowFormat::kF16 && cache.k_tiled() ? BestKvF16TileScorer()
                                                                    : nullptr),
      n_qgroups_(hd_ / 32),
      k_f16_(ks_.format == KvRowFormat::kF16),
      v_f16_(vs_.format == KvRowFormat::kF16),
      q_stride_(static_cast<int64_t>(shape.n_head) * hd_),
      slot_floats_(static_cast<size_t>(max_queries_) * (hd_ + 2)),
      slot_max_(static_cast<size_t>(max_queries_) * hd_),
      slot_mass_(slot_max_ + max_queries_) {
  // A ring holds the cells of its layer's window only: attention must not look further back.
  LAMINA_CHECK(!cache.ring_layer(layer) ||
               (shape.sliding_window > 0 && shape.sliding_window <= cache.sliding_window(layer)));
  if (scratch_.per_thread.size() < per_thread_ * pool.size()) {
    scratch_.per_thread.resize(per_thread_ * pool.size());
  }
  if (score_k_ != nullptr || score_k_tiles_ != nullptr) {
    const size_t q_per_thread = static_cast<size_t>(max_queries_) * hd_;
    if (scratch_.per_thread_q.size() < q_per_thread * pool.size()) {
      scratch_.per_thread_q.resize(q_per_thread * pool.size());
    }
  }
}

void AttentionCall::RunChunk(const Unit& unit, int g, int c_lo, int c_hi, float* slot, int thread,
                             int* wb, int* lims) const {
  // A chunk below every query's sliding window (the unit's first query's starts lowest) holds
  // no cell they see: an empty result for the merge (a unit of one chunk always has cells).
  const int first_pos = segments_[unit.seg].pos0 + unit.t0;
  if (shape_.sliding_window > 0 && c_hi <= first_pos + 1 - shape_.sliding_window) {
    LAMINA_CHECK(slot != nullptr);
    for (int qi = 0; qi < unit.nt * group_; ++qi) {
      slot[slot_max_ + qi] = -INFINITY;
      slot[slot_mass_ + qi] = 0.0f;
    }
    return;
  }
  const Chunk ch = StartChunk(unit, g, c_lo, c_hi, thread, wb, lims);
  LoadQueries(ch);
  ScoreChunk(ch);
  NormaliseScores(ch, slot);
  SumValues(ch);
  WriteChunk(ch, slot);
}

Chunk AttentionCall::StartChunk(const Unit& unit, int g, int c_lo, int c_hi, int thread, int* wb,
                                int* lims) const {
  const AttentionSegment& segment = segments_[unit.seg];
  Chunk ch;
  ch.g = g;
  ch.c_lo = c_lo;
  ch.n_cells = c_hi;
  ch.seq = segment.seq;
  ch.pos0 = segment.pos0;
  ch.t0 = unit.t0;
  ch.nq = unit.nt * group_;
  ch.group = group_;
  ch.q = q_all_ + segment.begin * q_stride_;
  ch.out = out_all_ + segment.begin * q_stride_;
  ch.scores = scratch_.per_thread.data() + per_thread_ * thread;
  ch.qrows = ch.scores + static_cast<size_t>(max_queries_) * n_ctx_;
  ch.acc = ch.qrows + static_cast<size_t>(max_queries_) * hd_;
  ch.tile = ch.acc + static_cast<size_t>(max_queries_) * hd_;
  ch.qq = score_k_ || score_k_tiles_
              ? scratch_.per_thread_q.data() + static_cast<size_t>(max_queries_) * hd_ * thread
              : nullptr;
  ch.qd = ch.acc;
  ch.wb = wb;
  ch.lims = lims;
  ch.sliding = shape_.sliding_window;
  // Queries are in position order: the first one's window starts lowest.
  ch.c_first = std::max(c_lo, ch.lo_of(0) / kCellTile * kCellTile);
  int window_lo = c_hi;
  for (int qi = 0; qi < ch.nq; ++qi) {
    wb[qi] = cache_.WindowBegin(layer_, ch.seq, ch.n_kv_of(qi) - 1);
    window_lo = std::min(window_lo, std::max({wb[qi], c_lo, ch.lo_of(qi)}));
  }
  ch.window_lo = window_lo;
  return ch;
}

template <typename PerQuery>
void AttentionCall::ForExactRuns(const Chunk& ch,
                                 const uint8_t* (KvCache::*row)(int, int, int, int) const,
                                 PerQuery&& per_query) const {
  if (window_ring_ == 0) return;
  for (int c0 = ch.window_lo; c0 < ch.n_cells;) {
    const int c1 = std::min(
        {ch.n_cells, (c0 / kCellTile + 1) * kCellTile, (c0 / window_ring_ + 1) * window_ring_});
    decode_exact_((cache_.*row)(layer_, ch.seq, ch.g, c0), c1 - c0, hd_, ch.tile);
    for (int qi = 0; qi < ch.nq; ++qi) {
      const int b = std::max({c0, ch.wb[qi], ch.lo_of(qi)}), e = std::min(c1, ch.n_kv_of(qi));
      if (e > b) per_query(qi, b, e - b, ch.tile + static_cast<size_t>(b - c0) * hd_);
    }
    c0 = c1;
  }
}

void AttentionCall::LoadQueries(const Chunk& ch) const {
  for (int qi = 0; qi < ch.nq; ++qi) {
    const int t = ch.t0 + qi / group_, h = ch.g * group_ + qi % group_;
    float* qr = ch.qrows + static_cast<size_t>(qi) * hd_;
    std::copy_n(ch.q + t * q_stride_ + static_cast<int64_t>(h) * hd_, hd_, qr);
    if (ks_.rotated) Rotate(qr, hd_);
    if (k_f16_) kern_.round_f16(qr, hd_);
    if (score_k_ || score_k_tiles_) {
      QuantizeQueryInt16(ks_.format, qr, hd_, ch.qq + static_cast<size_t>(qi) * hd_,
                         ch.qd + static_cast<size_t>(qi) * n_qgroups_);
    }
  }
}

void AttentionCall::ScoreChunk(const Chunk& ch) const {
  const int c_lo = ch.c_first, n_cells = ch.n_cells;
  if (cache_.k_anchored()) {
    // The chunk's anchor flags, which AddAnchorScores reads after the K scores: fetched now, they
    // arrive while the keys are scored (the KV stream evicts them between steps).
    for (int c0 = c_lo; c0 < n_cells;) {
      const int c1 = std::min(n_cells, (c0 / layer_cells_ + 1) * layer_cells_);
      const uint8_t* f = cache_.KAnchorFlags(layer_, ch.seq, ch.g, c0);  // [c1 - c0]
      for (int c = 0; c < c1 - c0; c += 64) __builtin_prefetch(f + c);
      c0 = c1;
    }
  }
  // A query's scores past its own causal limit (or before its sliding window) are computed from
  // cells another query of the block sees and are never read.
  // K read without decoded tiles
  const bool direct = score_k_ != nullptr || score_k_tiles_ != nullptr || score_f16_ != nullptr;
  if (direct) {
    // In runs within one turn of a ring layer's cells (one run for a layer that keeps all).
    for (int c0 = c_lo; c0 < n_cells;) {
      const int c1 = std::min(n_cells, (c0 / layer_cells_ + 1) * layer_cells_);
      if (score_k_) {
        score_k_(cache_.KHead(layer_, ch.seq, ch.g, c0), c1 - c0, hd_, ch.nq, ch.qq, ch.qd,
                 shape_.scale, ch.scores + c0, n_ctx_);
        c0 = c1;
        continue;
      }
      // From the tile holding c0 (scoring may start mid-tile: a sliding window, a chunk).
      const KvCache::KTileRef t = cache_.KTile(layer_, ch.seq, ch.g, c0);
      if (score_k_tiles_) {
        score_k_tiles_(t.tile, t.cell, c1 - c0, hd_, ch.nq, ch.qq, ch.qd, shape_.scale,
                       ch.scores + c0, n_ctx_);
      } else {
        score_f16_(t.tile, t.cell, c1 - c0, hd_, ch.nq, ch.qrows, shape_.scale, ch.scores + c0,
                   n_ctx_);
      }
      c0 = c1;
    }
  }
  for (int c0 = c_lo; c0 < (direct ? c_lo : n_cells); c0 += kCellTile) {
    const int nc = std::min(kCellTile, n_cells - c0);
    // Head rows (or tiles) of consecutive cells are contiguous and hold whole groups: one call.
    if (cache_.k_tiled()) {
      const KvCache::KTileRef t = cache_.KTile(layer_, ch.seq, ch.g, c0);
      DecodeKvTileCells(t.tile, t.cell, nc, hd_, ch.tile, ks_.format);
    } else {
      decode_k_(cache_.KHead(layer_, ch.seq, ch.g, c0), nc, hd_, ch.tile);
    }
    // The tile's cells query qi scores (0: none).
    auto lim_of = [&](int qi) {
      const int lim = std::min(nc, ch.n_kv_of(qi) - c0);
      return lim <= 0 || ch.lo_of(qi) >= c0 + nc ? 0 : lim;
    };
    // Queries in pairs: the eight-cell blocks both score read each K row once for the two
    // (score_rows2), the rest of each query's cells follow alone from that multiple of eight, so
    // every query's scores keep the bits of one score_rows call over its cells.
    for (int qi = 0; qi < ch.nq; qi += 2) {
      const int lim0 = lim_of(qi), lim1 = qi + 1 < ch.nq ? lim_of(qi + 1) : 0;
      const float* q0 = ch.qrows + static_cast<size_t>(qi) * hd_;  // [hd]
      float* out0 = ch.scores + static_cast<size_t>(qi) * n_ctx_ + c0;
      const int both = std::min(lim0, lim1) / 8 * 8;
      if (both > 0) {
        kern_.score_rows2(q0, q0 + hd_, ch.tile, both, hd_, shape_.scale, out0, out0 + n_ctx_);
      }
      const float* rest = ch.tile + static_cast<size_t>(both) * hd_;  // [nc - both, hd]
      if (lim0 > both) kern_.score_rows(q0, rest, lim0 - both, hd_, shape_.scale, out0 + both);
      if (lim1 > both) {
        kern_.score_rows(q0 + hd_, rest, lim1 - both, hd_, shape_.scale, out0 + n_ctx_ + both);
      }
    }
  }
  // Window cells: the scores of their exact keys replace the encoded ones.
  ForExactRuns(ch, &KvCache::WindowK, [&](int qi, int c, int n, const float* rows) {
    kern_.score_rows(ch.qrows + static_cast<size_t>(qi) * hd_, rows, n, hd_, shape_.scale,
                     ch.scores + static_cast<size_t>(qi) * n_ctx_ + c);
  });
  if (cache_.k_anchored()) {
    AddAnchorScores(cache_, layer_, ch.seq, ch.g, ch.pos0, ch.c_first, n_cells, ch.q, q_stride_,
                    ch.t0, ch.nq, group_, shape_, n_ctx_, ch.wb, ch.acc, ch.qrows, ch.tile,
                    ch.scores);
  }
}

void AttentionCall::NormaliseScores(const Chunk& ch, float* slot) const {
  for (int qi = 0; qi < ch.nq; ++qi) {
    const int lo = std::max(ch.c_lo, ch.lo_of(qi));  // the query's first cell in the chunk
    float* row = ch.scores + static_cast<size_t>(qi) * n_ctx_;  // [n_ctx] by cell
    float* srow = row + lo;
    const int n = std::min(ch.n_cells, ch.n_kv_of(qi)) - lo;  // the query's cells
    // Pass 2 reads whole tiles: the cells of the window's first tile before it weigh nothing.
    const int z0 = std::max(ch.c_first, lo / kCellTile * kCellTile);
    if (lo > z0) std::fill(row + z0, row + std::min(lo, ch.n_cells), 0.0f);
    float max = -INFINITY;
    double mass = 0.0;
    if (n > 0) {
      max = kern_.max(srow, n);
      // A chunk written out directly is the query's whole softmax: its sink joins here, as
      // ggml's soft_max does (the max includes the sink). Stored chunks get it in the merge.
      const bool sink = shape_.sinks != nullptr && slot == nullptr;
      const float sink_logit = sink ? shape_.sinks[ch.g * group_ + qi % group_] : 0.0f;
      if (sink) max = std::max(max, sink_logit);
      mass = kern_.exp_sum(srow, n, max);
      if (sink) mass += static_cast<double>(std::exp(sink_logit - max));
      kern_.scale(srow, n, static_cast<float>(1.0 / mass));
      if (v_f16_) kern_.round_f16(srow, n);
    }
    if (slot != nullptr) {
      slot[slot_max_ + qi] = max;
      slot[slot_mass_ + qi] = static_cast<float>(mass);
    }
    std::fill(ch.acc + static_cast<size_t>(qi) * hd_, ch.acc + static_cast<size_t>(qi + 1) * hd_,
              0.0f);
  }
}

void AttentionCall::SumValues(const Chunk& ch) const {
  const int n_cells = ch.n_cells;
  // One call per run of tiles within a turn of the layer's cells, when no query's sliding window
  // starts past the first tile: each query's rows are then those below its window, the same
  // per tile as the loop below gives (a kIntAccRows pass is a kCellTile tile; static_assert
  // below), tiles past every query's window left out.
  static_assert(kIntAccRows == kCellTile);
  bool runs = v_runs_;
  int end = ch.c_first;  // past the last tile any query reads encoded
  for (int qi = 0; qi < ch.nq && runs; ++qi) {
    runs = ch.lo_of(qi) < ch.c_first + kCellTile;
    end = std::max(end, std::min(n_cells, ch.wb[qi]));
  }
  for (int c0 = ch.c_first; runs && c0 < end;) {
    const int c1 = std::min(end, (c0 / layer_cells_ + 1) * layer_cells_);
    for (int qi = 0; qi < ch.nq; ++qi) ch.lims[qi] = std::clamp(ch.wb[qi] - c0, 0, c1 - c0);
    accumulate_v_(cache_.VHead(layer_, ch.seq, ch.g, c0), c1 - c0, hd_, ch.nq, ch.scores + c0,
                  n_ctx_, ch.lims, ch.acc);
    c0 = c1;
  }
  for (int c0 = ch.c_first; !runs && c0 < n_cells; c0 += kCellTile) {
    const int nc = std::min(kCellTile, n_cells - c0);
    bool any_encoded = false;  // a tile every query reads exactly (or none sees) is not decoded
    for (int qi = 0; qi < ch.nq; ++qi) {
      // The tile's rows before the query's exact window; none below its sliding window (rows of
      // its window's first tile before it have zero weights).
      ch.lims[qi] = ch.lo_of(qi) >= c0 + nc ? 0 : std::min(nc, ch.wb[qi] - c0);
      any_encoded |= ch.lims[qi] > 0;
    }
    if (!any_encoded) continue;
    if (accumulate_v_ != nullptr) {
      accumulate_v_(cache_.VHead(layer_, ch.seq, ch.g, c0), nc, hd_, ch.nq, ch.scores + c0, n_ctx_,
                    ch.lims, ch.acc);
      continue;
    }
    decode_v_(cache_.VHead(layer_, ch.seq, ch.g, c0), nc, hd_, ch.tile);
    for (int qi = 0; qi < ch.nq; ++qi) {
      if (ch.lims[qi] <= 0) continue;
      kern_.accumulate_rows(ch.scores + static_cast<size_t>(qi) * n_ctx_ + c0, ch.tile, ch.lims[qi],
                            hd_, ch.acc + static_cast<size_t>(qi) * hd_);
    }
  }
  ForExactRuns(ch, &KvCache::WindowV, [&](int qi, int c, int n, const float* rows) {
    kern_.accumulate_rows(ch.scores + static_cast<size_t>(qi) * n_ctx_ + c, rows, n, hd_,
                          ch.acc + static_cast<size_t>(qi) * hd_);
  });
}

// The chunk's sums to its slot, or (rotated back) to the output rows.
void AttentionCall::WriteChunk(const Chunk& ch, float* slot) const {
  if (slot != nullptr) {
    std::copy_n(ch.acc, static_cast<size_t>(ch.nq) * hd_, slot);
    return;
  }
  for (int qi = 0; qi < ch.nq; ++qi) {
    const int t = ch.t0 + qi / group_, h = ch.g * group_ + qi % group_;
    float* a = ch.acc + static_cast<size_t>(qi) * hd_;
    if (vs_.rotated) InverseRotate(a, hd_);
    std::copy_n(a, hd_, ch.out + t * q_stride_ + static_cast<int64_t>(h) * hd_);
  }
}

// The chunks of a unit's KV head g, merged in chunk order: out = sum_c (w_c / W) o_c with
// w_c = mass_c * exp(max_c - max), W = sum_c w_c (+ exp(sink - max) with a sink; o_c: the
// chunk's normalised sums).
// merged: [hd] and weight: [n_chunks] scratch of the calling thread.
void AttentionCall::MergeChunks(const Unit& unit, int g, float* merged,
                                std::vector<double>& weight) const {
  weight.resize(unit.n_chunks);
  const AttentionSegment& segment = segments_[unit.seg];
  float* out = out_all_ + segment.begin * q_stride_;
  const int nq = unit.nt * group_;
  for (int qi = 0; qi < nq; ++qi) {
    auto slot = [&](int ch) { return SlotOf(unit, static_cast<int64_t>(g) * unit.n_chunks + ch); };
    const int h = g * group_ + qi % group_;
    // The sink (AttentionShape::sinks) weighs in as one more chunk of mass 1 at its logit, with
    // nothing to add to the sums.
    const bool sink = shape_.sinks != nullptr;
    float max = sink ? shape_.sinks[h] : -INFINITY;
    for (int ch = 0; ch < unit.n_chunks; ++ch) {
      if (slot(ch)[slot_mass_ + qi] > 0.0f) max = std::max(max, slot(ch)[slot_max_ + qi]);
    }
    double total = sink ? std::exp(static_cast<double>(shape_.sinks[h] - max)) : 0.0;
    for (int ch = 0; ch < unit.n_chunks; ++ch) {
      const float mass = slot(ch)[slot_mass_ + qi];
      weight[ch] =
          mass > 0.0f ? mass * std::exp(static_cast<double>(slot(ch)[slot_max_ + qi] - max)) : 0.0;
      total += weight[ch];
    }
    std::fill_n(merged, hd_, 0.0f);
    for (int ch = 0; ch < unit.n_chunks; ++ch) {
      if (weight[ch] == 0.0) continue;
      const float w = static_cast<float>(weight[ch] / total);
      const float* o = slot(ch) + static_cast<size_t>(qi) * hd_;
      for (int i = 0; i < hd_; ++i) merged[i] += w * o[i];
    }
    const int t = unit.t0 + qi / group_;
    if (vs_.rotated) InverseRotate(merged, hd_);
    std::copy_n(merged, hd_, out + t * q_stride_ + static_cast<int64_t>(h) * hd_);
  }
}

void AttentionCall::RunWave(const std::vector<Unit>& units, size_t u0, size_t u1, int64_t n_items,
                            int64_t n_slots, ThreadPool& pool) const {
  if (scratch_.chunks.size() < static_cast<size_t>(n_slots) * slot_floats_) {
    scratch_.chunks.resize(static_cast<size_t>(n_slots) * slot_floats_);
  }
  // The items in the order threads take them, one at a time: the costliest first (cells times
  // queries; ties in item order), so that what is left at the end of the wave is small and a
  // thread waits at the join for at most a short item, not a whole chunk of cells (a step at
  // depth ends each KV head with a short chunk: in item order the long ones came last). Which
  // thread runs an item never changes a result (each has its slot or its output rows).
  struct Item {
    int64_t cost;
    int32_t unit;        // index into units
    int32_t item;        // g * n_chunks + chunk within the unit
    int32_t c_lo, c_hi;  // the chunk's cells
  };
  std::vector<Item> order;  // [n_items]
  order.reserve(static_cast<size_t>(n_items));
  for (size_t u = u0; u < u1; ++u) {
    const Unit& unit = units[u];
    const int n_cells = segments_[unit.seg].pos0 + unit.t0 + unit.nt;
    for (int64_t item = 0; item < static_cast<int64_t>(shape_.n_head_kv) * unit.n_chunks; ++item) {
      const int c_lo = static_cast<int>(item % unit.n_chunks) * kCellChunk;
      const int c_hi = std::min(n_cells, c_lo + kCellChunk);
      order.push_back({static_cast<int64_t>(c_hi - c_lo) * unit.nt, static_cast<int32_t>(u),
                       static_cast<int32_t>(item), c_lo, c_hi});
    }
  }
  LAMINA_CHECK(static_cast<int64_t>(order.size()) == n_items);
  std::stable_sort(order.begin(), order.end(),
                   [](const Item& a, const Item& b) { return a.cost > b.cost; });
  std::atomic<int64_t> next{0};
  pool.ParallelFor(pool.size(), 1, [&](int64_t, int64_t, int thread) {
    std::vector<int> wb(max_queries_), lims(max_queries_);  // [max_queries]
    for (int64_t i = next.fetch_add(1, std::memory_order_relaxed); i < n_items;
         i = next.fetch_add(1, std::memory_order_relaxed)) {
      const Item& it = order[i];
      const Unit& unit = units[it.unit];
      float* slot = unit.first_slot < 0 ? nullptr : SlotOf(unit, it.item);
      RunChunk(unit, it.item / unit.n_chunks, it.c_lo, it.c_hi, slot, thread, wb.data(),
               lims.data());
    }
  });
  // The merges are a few multiply-adds per stored value: on this thread, without waking the
  // pool again.
  std::vector<double> weight;  // [n_chunks]
  float* merged = scratch_.per_thread.data();
  for (size_t u = u0; u < u1; ++u) {
    if (units[u].first_slot < 0) continue;
    for (int g = 0; g < shape_.n_head_kv; ++g) MergeChunks(units[u], g, merged, weight);
  }
}

}  // namespace

void CausalAttention(const KvCache& cache, int layer, int seq, int pos0, int n_tokens,
                     const float* q, float* out, const AttentionShape& shape,
                     AttentionScratch& scratch, ThreadPool& pool) {
  const AttentionSegment segment{seq, pos0, 0, n_tokens};
  CausalAttentionSegments(cache, layer, &segment, 1, q, out, shape, scratch, pool);
}

void CausalAttentionSegments(const KvCache& cache, int layer, const AttentionSegment* segments,
                             int n_segments, const float* q_all, float* out_all,
                             const AttentionShape& shape, AttentionScratch& scratch,
                             ThreadPool& pool) {
  const AttentionCall call(cache, layer, segments, q_all, out_all, shape, scratch, pool);
  std::vector<Unit> units = MakeUnits(segments, n_segments);
  // Waves of units whose stored chunks fit kMaxStoredChunks (a unit alone may exceed it).
  for (size_t u0 = 0; u0 < units.size();) {
    int64_t n_items = 0, n_slots = 0;
    const size_t u1 = PlanWave(units, u0, shape.n_head_kv, &n_items, &n_slots);
    call.RunWave(units, u0, u1, n_items, n_slots, pool);
    u0 = u1;
  }
}

}  // namespace lamina
