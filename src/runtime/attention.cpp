// Tiled two-pass causal GQA attention over encoded KV rows.
#include "runtime/attention.h"

#include <algorithm>
#include <cmath>

#include "kernels/attention_kernels.h"
#include "kernels/kv_decode.h"
#include "kernels/kv_format.h"
#include "kernels/ops.h"

namespace lamina {

namespace {
constexpr int kTokenBlock = 8;  // tokens sharing one pass over the cells
constexpr int kCellTile = 64;   // cells decoded at once
// Anchored keys (kv_cache.h): a flagged cell at position p stores k - R(p) a, so its score
// misses scale * q . R(p) a. For a rotated pair (x, y) that the anchor keeps, that is
// m [cos(p t) (qx ax + qy ay) + sin(p t) (qy ax - qx ay)]: two coefficients per kept pair and
// query, times the cos and sin of the cell's angle (from the cache's angle tables); the
// dimensions RoPE leaves alone add a constant q . a. q: the queries as RoPE left them (not
// rotated for the cache). Scratch: coef [nq][2 * kept pairs] (the accumulators, free until
// pass 2; kept pairs <= head_dim / 2, so it fits), rest [nq] (the query rows, done with after
// pass 1), tables [2 * kept pairs][kCellTile] (the tile).
// Cells a query reads from the window's exact copy (wb[qi] and later) are not corrected.
void AddAnchorScores(const KvCache& cache, int layer, int seq, int g, int pos0, int n_cells,
                     const float* q, int64_t q_stride, int t0, int nq, int group,
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
  for (int c0 = 0; c0 < n_cells; c0 += kCellTile) {
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
  // Work items: (KV head, token block) of each segment; first_item[s] is segment s's first.
  std::vector<int64_t> first_item(n_segments + 1, 0);  // [n_segments + 1]
  for (int s = 0; s < n_segments; ++s) {
    const int n_blocks = (segments[s].n + kTokenBlock - 1) / kTokenBlock;
    first_item[s + 1] = first_item[s] + static_cast<int64_t>(shape.n_head_kv) * n_blocks;
  }
  const int64_t n_items = first_item[n_segments];

  pool.ParallelFor(n_items, 1, [&](int64_t begin, int64_t end, int thread) {
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
    // Per query: the first cell read from the window's exact copy (its causal end: none).
    std::vector<int> wb(max_queries);    // [max_queries]
    std::vector<int> lims(max_queries);  // [max_queries] a tile's rows each query reads
    int s = 0;
    for (int64_t flat = begin; flat < end; ++flat) {
      while (flat >= first_item[s + 1]) ++s;
      const AttentionSegment& segment = segments[s];
      const int seq = segment.seq, pos0 = segment.pos0, n_tokens = segment.n;
      const float* q = q_all + segment.begin * q_stride;
      float* out = out_all + segment.begin * q_stride;
      const int64_t item = flat - first_item[s];
      const int g = static_cast<int>(item % shape.n_head_kv);
      const int blk = static_cast<int>(item / shape.n_head_kv);
      const int t0 = blk * kTokenBlock;
      const int nt = std::min(kTokenBlock, n_tokens - t0);
      const int nq = nt * group;  // query qi = (token t0 + qi / group, head g*group + qi % group)
      const int n_cells = pos0 + t0 + nt;  // cells the last token of the block sees
      auto n_kv_of = [&](int qi) { return pos0 + t0 + qi / group + 1; };
      int window_lo = n_cells;  // the first cell any query of the item reads exactly
      for (int qi = 0; qi < nq; ++qi) {
        wb[qi] = cache.WindowBegin(layer, seq, n_kv_of(qi) - 1);
        window_lo = std::min(window_lo, wb[qi]);
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
        score_k(cache.KHead(layer, seq, g, 0), n_cells, hd, nq, qq, qd, shape.scale, scores, n_ctx);
      }
      for (int c0 = 0; c0 < (score_k ? 0 : n_cells); c0 += kCellTile) {
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
        AddAnchorScores(cache, layer, seq, g, pos0, n_cells, q, q_stride, t0, nq, group, shape,
                        n_ctx, wb.data(), acc, qrows, tile, scores);
      }
      for (int qi = 0; qi < nq; ++qi) {
        float* srow = scores + static_cast<size_t>(qi) * n_ctx;
        const int n_kv = n_kv_of(qi);
        const float max = kern.max(srow, n_kv);
        kern.scale(srow, n_kv, static_cast<float>(1.0 / kern.exp_sum(srow, n_kv, max)));
        if (v_f16) kern.round_f16(srow, n_kv);
        std::fill(acc + static_cast<size_t>(qi) * hd, acc + static_cast<size_t>(qi + 1) * hd, 0.0f);
      }
      // Pass 2: weighted V sum.
      for (int c0 = 0; c0 < n_cells; c0 += kCellTile) {
        const int nc = std::min(kCellTile, n_cells - c0);
        bool any_encoded = false;  // a tile every query reads exactly is not decoded
        for (int qi = 0; qi < nq; ++qi) {
          lims[qi] = std::min(nc, wb[qi] - c0);  // the tile's rows before the query's window
          any_encoded |= lims[qi] > 0;
        }
        if (!any_encoded) continue;
        if (accumulate_v != nullptr) {
          accumulate_v(cache.VHead(layer, seq, g, c0), nc, hd, nq, scores + c0, n_ctx, lims.data(),
                       acc);
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
      for (int qi = 0; qi < nq; ++qi) {
        const int t = t0 + qi / group, h = g * group + qi % group;
        float* a = acc + static_cast<size_t>(qi) * hd;
        if (vs.rotated) InverseRotate(a, hd);
        std::copy_n(a, hd, out + t * q_stride + static_cast<int64_t>(h) * hd);
      }
    }
  });
}

}  // namespace lamina
