// Tiled two-pass causal GQA attention over encoded KV rows.
#include "runtime/attention.h"

#include <algorithm>
#include <cmath>

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
// Merged chunk results held at once: work items are run in waves of at most this many stored
// chunks (a block's chunks always share a wave).
constexpr int64_t kMaxStoredChunks = 512;
// Anchored keys (kv_cache.h): a flagged cell at position p stores k - R(p) a, so its score
// misses scale * q . R(p) a. For a rotated pair (x, y) that the anchor keeps, that is
// m [cos(p t) (qx ax + qy ay) + sin(p t) (qy ax - qx ay)]: two coefficients per kept pair and
// query, times the cos and sin of the cell's angle (from the cache's angle tables); the
// dimensions RoPE leaves alone add a constant q . a. q: the queries as RoPE left them (not
// rotated for the cache). Scratch: coef [nq][2 * kept pairs] (the accumulators, free until
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
  const uint8_t* flags = cache.KAnchorFlags(layer, seq, g);
  int pairs[kAnchorMaxPairs];
  int n_pairs = 0;
  for (int j = 0; j < n_rot / 2 && n_pairs < kAnchorMaxPairs; ++j) {
    if (a[cache.PairX(j)] != 0.0f || a[cache.PairY(j)] != 0.0f) pairs[n_pairs++] = j;
  }
  const int stride = 2 * n_pairs;  // per query: a cos and a sin coefficient per kept pair
  for (int qi = 0; qi < nq; ++qi) {
    const int t = t0 + qi / group, h = g * group + qi % group;
    const float* qr = q + t * q_stride + static_cast<int64_t>(h) * hd;
    float* c = coef + static_cast<size_t>(qi) * stride;
    for (int i = 0; i < n_pairs; ++i) {
      const int x = cache.PairX(pairs[i]), y = cache.PairY(pairs[i]);
      c[2 * i] = m * (qr[x] * a[x] + qr[y] * a[y]);
      c[2 * i + 1] = m * (qr[y] * a[x] - qr[x] * a[y]);
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
  const AttentionRowKernels& kern = BestAttentionRowKernels();
  float mask[kCellTile];          // 1 for flagged cells
  float sum[kCellTile];           // one query's correction per cell
  float xy[2 * kAnchorMaxPairs];  // one query's weights of the offset tables in this tile
  for (int c0 = c_lo; c0 < n_cells; c0 += kCellTile) {
    const int nc = std::min(kCellTile, n_cells - c0);
    bool any = false;
    for (int i = 0; i < nc; ++i) any |= (mask[i] = flags[c0 + i]) != 0.0f;
    if (!any) continue;
    // cos(p t) = C0 cos(k t) - S0 sin(k t), sin(p t) = S0 cos(k t) + C0 sin(k t) for p = c0 + k,
    // so a query's correction is a weighted sum of the kept pairs' offset tables.
    const float* start = cache.AnchorRunStart(c0 / kCellTile);
    for (int qi = 0; qi < nq; ++qi) {
      const int lim = std::min(nc, wb[qi] - c0);  // the query's causal or window limit
      if (lim <= 0) continue;
      const float* c = coef + static_cast<size_t>(qi) * stride;
      for (int i = 0; i < n_pairs; ++i) {
        const float c0s = start[2 * pairs[i]], s0s = start[2 * pairs[i] + 1];
        xy[2 * i] = c[2 * i] * c0s + c[2 * i + 1] * s0s;
        xy[2 * i + 1] = c[2 * i + 1] * c0s - c[2 * i] * s0s;
      }
      std::fill_n(sum, kCellTile, rest[qi]);
      kern.accumulate_rows(xy, tables, 2 * n_pairs, kCellTile, sum);
      float* srow = scores + static_cast<size_t>(qi) * n_ctx + c0;
      for (int k = 0; k < lim; ++k) srow[k] += shape.scale * mask[k] * sum[k];
    }
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
  const int hd = shape.head_dim;
  const int group = shape.n_head / shape.n_head_kv;
  const int n_ctx = cache.config().n_ctx;
  const int max_queries = kTokenBlock * group;
  // Per thread: scores [max_queries][n_ctx], queries [max_queries][hd], accumulators
  // [max_queries][hd], a decoded tile [kCellTile][hd].
  const size_t per_thread = static_cast<size_t>(max_queries) * n_ctx +
                            2 * static_cast<size_t>(max_queries) * hd +
                            static_cast<size_t>(kCellTile) * hd;
  if (scratch.per_thread.size() < per_thread * pool.size()) {
    scratch.per_thread.resize(per_thread * pool.size());
  }
  const AttentionRowKernels& kern = BestAttentionRowKernels();
  const KvSideSpec ks = cache.k_spec(), vs = cache.v_spec();
  const KvRowDecodeFn decode_k = BestKvRowDecoder(ks.format);
  const KvRowDecodeFn decode_v = BestKvRowDecoder(vs.format);
  // V rows decoded in registers and accumulated at once, where that is the faster path.
  const KvAccumulateFn accumulate_v = BestKvAccumulator(vs.format);
  // The recent window's exact copies (f16 rows in each side's frame), when the cache has one.
  const KvRowDecodeFn decode_exact = BestKvRowDecoder(KvRowFormat::kF16);
  const int window_ring = cache.window_ring();
  // Integer scores read K codes directly; otherwise K tiles are decoded to f32.
  const KvScoreFn score_k = KvIntScoreSupported(ks.format, hd) ? BestKvScorer(ks.format) : nullptr;
  const int n_qgroups = hd / 32;
  if (score_k != nullptr) {
    const size_t q_per_thread = static_cast<size_t>(max_queries) * hd;
    if (scratch.per_thread_q.size() < q_per_thread * pool.size()) {
      scratch.per_thread_q.resize(q_per_thread * pool.size());
    }
  }
  const bool k_f16 = ks.format == KvRowFormat::kF16;
  const bool v_f16 = vs.format == KvRowFormat::kF16;
  const int64_t q_stride = static_cast<int64_t>(shape.n_head) * hd;

  // A unit is one token block of one segment; its work items are (KV head, cell chunk).
  struct Unit {
    int seg, t0, nt, n_chunks;
    int64_t first_item;  // within its wave
    int64_t first_slot;  // its chunks' stored results (-1: one chunk, written out directly)
  };
  std::vector<Unit> units;
  for (int s = 0; s < n_segments; ++s) {
    for (int t0 = 0; t0 < segments[s].n; t0 += kTokenBlock) {
      const int nt = std::min(kTokenBlock, segments[s].n - t0);
      const int n_cells = segments[s].pos0 + t0 + nt;
      units.push_back({s, t0, nt, (n_cells + kCellChunk - 1) / kCellChunk, 0, -1});
    }
  }
  // Stored chunk results: acc [slot][max_queries][hd], then max and mass [slot][max_queries].
  const size_t slot_floats = static_cast<size_t>(max_queries) * (hd + 2);
  const size_t slot_max = static_cast<size_t>(max_queries) * hd;  // offsets within a slot
  const size_t slot_mass = slot_max + max_queries;
  // Item g * n_chunks + chunk of a unit with stored chunks.
  auto slot_of = [&](const Unit& unit, int64_t item) {
    return scratch.chunks.data() + static_cast<size_t>(unit.first_slot + item) * slot_floats;
  };

  // Runs cells [c_lo, c_hi) of the unit's KV head g; with `slot` set, leaves the chunk's
  // normalised V sums and its per-query (max, mass) there instead of writing the output.
  // wb, lims: [max_queries] scratch of the calling thread.
  auto run_chunk = [&](const Unit& unit, int g, int c_lo, int c_hi, float* slot, int thread,
                       int* wb, int* lims) {
    const AttentionSegment& segment = segments[unit.seg];
    float* scores = scratch.per_thread.data() + per_thread * thread;
    float* qrows = scores + static_cast<size_t>(max_queries) * n_ctx;
    float* acc = qrows + static_cast<size_t>(max_queries) * hd;
    float* tile = acc + static_cast<size_t>(max_queries) * hd;
    // Integer path: qq [max_queries][hd] codes; their scales [max_queries][hd / 32] reuse the
    // accumulators, which are not needed until pass 2.
    int16_t* qq = score_k
                      ? scratch.per_thread_q.data() + static_cast<size_t>(max_queries) * hd * thread
                      : nullptr;
    float* qd = acc;
    const int seq = segment.seq, pos0 = segment.pos0;
    const float* q = q_all + segment.begin * q_stride;
    float* out = out_all + segment.begin * q_stride;
    const int t0 = unit.t0;
    const int nq =
        unit.nt * group;       // query qi = (token t0 + qi / group, head g*group + qi % group)
    const int n_cells = c_hi;  // cells of the chunk end here
    auto n_kv_of = [&](int qi) { return pos0 + t0 + qi / group + 1; };
    // wb[qi]: the first cell the query reads from the window's exact copy (its causal end:
    // none); lims[qi]: a tile's rows the query reads.
    int window_lo = n_cells;  // the first cell any query of the chunk reads exactly
    for (int qi = 0; qi < nq; ++qi) {
      wb[qi] = cache.WindowBegin(layer, seq, n_kv_of(qi) - 1);
      window_lo = std::min(window_lo, std::max(wb[qi], c_lo));
    }
    // Runs of exact cells [c0, c1) within one tile and one turn of the ring (boundaries at
    // multiples of both, whatever the batch), each query's part of each run in order.
    auto for_exact_runs = [&](const uint8_t* (KvCache::*row)(int, int, int, int) const,
                              auto&& per_query) {
      if (window_ring == 0) return;
      for (int c0 = window_lo; c0 < n_cells;) {
        const int c1 = std::min(
            {n_cells, (c0 / kCellTile + 1) * kCellTile, (c0 / window_ring + 1) * window_ring});
        decode_exact((cache.*row)(layer, seq, g, c0), c1 - c0, hd, tile);
        for (int qi = 0; qi < nq; ++qi) {
          const int b = std::max(c0, wb[qi]), e = std::min(c1, n_kv_of(qi));
          if (e > b) per_query(qi, b, e - b, tile + static_cast<size_t>(b - c0) * hd);
        }
        c0 = c1;
      }
    };
    for (int qi = 0; qi < nq; ++qi) {
      const int t = t0 + qi / group, h = g * group + qi % group;
      float* qr = qrows + static_cast<size_t>(qi) * hd;
      std::copy_n(q + t * q_stride + static_cast<int64_t>(h) * hd, hd, qr);
      if (ks.rotated) Rotate(qr, hd);
      if (k_f16) kern.round_f16(qr, hd);
      if (score_k) {
        QuantizeQueryInt16(qr, hd, qq + static_cast<size_t>(qi) * hd,
                           qd + static_cast<size_t>(qi) * n_qgroups);
      }
    }
    // Pass 1: scores. A query's scores past its own causal limit are computed from cells the
    // block's last token sees and are never read.
    if (score_k) {
      score_k(cache.KHead(layer, seq, g, c_lo), n_cells - c_lo, hd, nq, qq, qd, shape.scale,
              scores + c_lo, n_ctx);
    }
    for (int c0 = c_lo; c0 < (score_k ? c_lo : n_cells); c0 += kCellTile) {
      const int nc = std::min(kCellTile, n_cells - c0);
      // Head rows of consecutive cells are contiguous and hold whole groups: one call.
      decode_k(cache.KHead(layer, seq, g, c0), nc, hd, tile);
      for (int qi = 0; qi < nq; ++qi) {
        const int lim = std::min(nc, n_kv_of(qi) - c0);
        if (lim <= 0) continue;
        kern.score_rows(qrows + static_cast<size_t>(qi) * hd, tile, lim, hd, shape.scale,
                        scores + static_cast<size_t>(qi) * n_ctx + c0);
      }
    }
    // Window cells: the scores of their exact keys replace the encoded ones.
    for_exact_runs(&KvCache::WindowK, [&](int qi, int c, int n, const float* rows) {
      kern.score_rows(qrows + static_cast<size_t>(qi) * hd, rows, n, hd, shape.scale,
                      scores + static_cast<size_t>(qi) * n_ctx + c);
    });
    if (cache.k_anchored()) {
      AddAnchorScores(cache, layer, seq, g, pos0, c_lo, n_cells, q, q_stride, t0, nq, group, shape,
                      n_ctx, wb, acc, qrows, tile, scores);
    }
    for (int qi = 0; qi < nq; ++qi) {
      float* srow = scores + static_cast<size_t>(qi) * n_ctx + c_lo;
      const int n = std::min(n_cells, n_kv_of(qi)) - c_lo;  // the query's cells of the chunk
      float max = -INFINITY;
      double mass = 0.0;
      if (n > 0) {
        max = kern.max(srow, n);
        mass = kern.exp_sum(srow, n, max);
        kern.scale(srow, n, static_cast<float>(1.0 / mass));
        if (v_f16) kern.round_f16(srow, n);
      }
      if (slot != nullptr) {
        slot[slot_max + qi] = max;
        slot[slot_mass + qi] = static_cast<float>(mass);
      }
      std::fill(acc + static_cast<size_t>(qi) * hd, acc + static_cast<size_t>(qi + 1) * hd, 0.0f);
    }
    // Pass 2: weighted V sum.
    for (int c0 = c_lo; c0 < n_cells; c0 += kCellTile) {
      const int nc = std::min(kCellTile, n_cells - c0);
      bool any_encoded = false;  // a tile every query reads exactly is not decoded
      for (int qi = 0; qi < nq; ++qi) {
        lims[qi] = std::min(nc, wb[qi] - c0);  // the tile's rows before the query's window
        any_encoded |= lims[qi] > 0;
      }
      if (!any_encoded) continue;
      if (accumulate_v != nullptr) {
        accumulate_v(cache.VHead(layer, seq, g, c0), nc, hd, nq, scores + c0, n_ctx, lims, acc);
        continue;
      }
      decode_v(cache.VHead(layer, seq, g, c0), nc, hd, tile);
      for (int qi = 0; qi < nq; ++qi) {
        if (lims[qi] <= 0) continue;
        kern.accumulate_rows(scores + static_cast<size_t>(qi) * n_ctx + c0, tile, lims[qi], hd,
                             acc + static_cast<size_t>(qi) * hd);
      }
    }
    for_exact_runs(&KvCache::WindowV, [&](int qi, int c, int n, const float* rows) {
      kern.accumulate_rows(scores + static_cast<size_t>(qi) * n_ctx + c, rows, n, hd,
                           acc + static_cast<size_t>(qi) * hd);
    });
    if (slot != nullptr) {
      std::copy_n(acc, static_cast<size_t>(nq) * hd, slot);
      return;
    }
    for (int qi = 0; qi < nq; ++qi) {
      const int t = t0 + qi / group, h = g * group + qi % group;
      float* a = acc + static_cast<size_t>(qi) * hd;
      if (vs.rotated) InverseRotate(a, hd);
      std::copy_n(a, hd, out + t * q_stride + static_cast<int64_t>(h) * hd);
    }
  };

  // The chunks of a unit's KV head g, merged in chunk order: out = sum_c (w_c / W) o_c with
  // w_c = mass_c * exp(max_c - max), W = sum_c w_c (o_c: the chunk's normalised sums).
  // merged: [hd] and weight: [n_chunks] scratch of the calling thread.
  auto merge = [&](const Unit& unit, int g, float* merged, std::vector<double>& weight) {
    weight.resize(unit.n_chunks);
    const AttentionSegment& segment = segments[unit.seg];
    float* out = out_all + segment.begin * q_stride;
    const int nq = unit.nt * group;
    for (int qi = 0; qi < nq; ++qi) {
      auto slot = [&](int ch) {
        return slot_of(unit, static_cast<int64_t>(g) * unit.n_chunks + ch);
      };
      float max = -INFINITY;
      for (int ch = 0; ch < unit.n_chunks; ++ch) {
        if (slot(ch)[slot_mass + qi] > 0.0f) max = std::max(max, slot(ch)[slot_max + qi]);
      }
      double total = 0.0;
      for (int ch = 0; ch < unit.n_chunks; ++ch) {
        const float mass = slot(ch)[slot_mass + qi];
        weight[ch] =
            mass > 0.0f ? mass * std::exp(static_cast<double>(slot(ch)[slot_max + qi] - max)) : 0.0;
        total += weight[ch];
      }
      std::fill_n(merged, hd, 0.0f);
      for (int ch = 0; ch < unit.n_chunks; ++ch) {
        if (weight[ch] == 0.0) continue;
        const float w = static_cast<float>(weight[ch] / total);
        const float* o = slot(ch) + static_cast<size_t>(qi) * hd;
        for (int i = 0; i < hd; ++i) merged[i] += w * o[i];
      }
      const int t = unit.t0 + qi / group, h = g * group + qi % group;
      if (vs.rotated) InverseRotate(merged, hd);
      std::copy_n(merged, hd, out + t * q_stride + static_cast<int64_t>(h) * hd);
    }
  };

  // Waves of units whose stored chunks fit kMaxStoredChunks (a unit alone may exceed it).
  for (size_t u0 = 0; u0 < units.size();) {
    size_t u1 = u0;
    int64_t n_items = 0, n_slots = 0;
    while (u1 < units.size()) {
      Unit& unit = units[u1];
      const int64_t unit_items = static_cast<int64_t>(shape.n_head_kv) * unit.n_chunks;
      const int64_t unit_slots = unit.n_chunks > 1 ? unit_items : 0;
      if (u1 > u0 && n_slots + unit_slots > kMaxStoredChunks) break;
      unit.first_item = n_items;
      unit.first_slot = unit.n_chunks > 1 ? n_slots : -1;
      n_items += unit_items;
      n_slots += unit_slots;
      ++u1;
    }
    if (scratch.chunks.size() < static_cast<size_t>(n_slots) * slot_floats) {
      scratch.chunks.resize(static_cast<size_t>(n_slots) * slot_floats);
    }
    pool.ParallelFor(n_items, 1, [&](int64_t begin, int64_t end, int thread) {
      std::vector<int> wb(max_queries), lims(max_queries);  // [max_queries]
      size_t u = u0;
      for (int64_t flat = begin; flat < end; ++flat) {
        while (u + 1 < u1 && flat >= units[u + 1].first_item) ++u;
        const Unit& unit = units[u];
        const int64_t item = flat - unit.first_item;  // g * n_chunks + chunk
        const int g = static_cast<int>(item / unit.n_chunks);
        const int ch = static_cast<int>(item % unit.n_chunks);
        const int n_cells = segments[unit.seg].pos0 + unit.t0 + unit.nt;
        const int c_lo = ch * kCellChunk, c_hi = std::min(n_cells, c_lo + kCellChunk);
        float* slot = unit.first_slot < 0 ? nullptr : slot_of(unit, item);
        run_chunk(unit, g, c_lo, c_hi, slot, thread, wb.data(), lims.data());
      }
    });
    // The merges are a few multiply-adds per stored value: on this thread, without waking the
    // pool again.
    std::vector<double> weight;  // [n_chunks]
    float* merged = scratch.per_thread.data();
    for (size_t u = u0; u < u1; ++u) {
      if (units[u].first_slot < 0) continue;
      for (int g = 0; g < shape.n_head_kv; ++g) merge(units[u], g, merged, weight);
    }
    u0 = u1;
  }
}

}  // namespace lamina
