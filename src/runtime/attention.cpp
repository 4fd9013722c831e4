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
// misses scale * q . R(p) a. Per pair (x, y) of rotated dimensions that is
// m [cos(p t) (qx ax + qy ay) + sin(p t) (qy ax - qx ay)], so each query gets one coefficient
// per cos and sin entry of the cache's AnchorAngles table, plus a constant for the dimensions
// RoPE leaves alone. q: the queries as RoPE left them (not rotated for the cache).
// Scratch: coef [nq][n_rot] (the accumulators, free until pass 2), rest [nq] (the query rows,
// done with after pass 1), angles [kCellTile][n_rot] (the tile).
void AddAnchorScores(const KvCache& cache, int layer, int seq, int g, int pos0, int n_cells,
                     const float* q, int64_t q_stride, int t0, int nq, int group,
                     const AttentionShape& shape,
                     int n_ctx, float* coef, float* rest, float* angles, float* scores) {
  const int hd = shape.head_dim;
  const RopeParams& rope = cache.config().rope;
  const int nr = rope.n_rot, half = nr / 2;
  const float m = cache.anchor_mscale();
  const float* a = cache.KAnchor(layer, seq, g);
  const uint8_t* flags = cache.KAnchorFlags(layer, seq, g);
  for (int qi = 0; qi < nq; ++qi) {
    const int t = t0 + qi / group, h = g * group + qi % group;
    const float* qr = q + t * q_stride + static_cast<int64_t>(h) * hd;
    float* c = coef + static_cast<size_t>(qi) * nr;
    for (int j = 0; j < nr; j += 2) {
      const int x = rope.style == RopeStyle::kNormal ? j : j / 2;
      const int y = rope.style == RopeStyle::kNormal ? j + 1 : j / 2 + half;
      c[j] = m * (qr[x] * a[x] + qr[y] * a[y]);
      c[j + 1] = m * (qr[y] * a[x] - qr[x] * a[y]);
    }
    float r = 0.0f;
    for (int e = nr; e < hd; ++e) r += qr[e] * a[e];
    rest[qi] = r;
  }
  for (int c0 = 0; c0 < n_cells; c0 += kCellTile) {
    const int nc = std::min(kCellTile, n_cells - c0);
    if (std::find(flags + c0, flags + c0 + nc, 1) == flags + c0 + nc) continue;
    cache.AnchorAngles(c0, nc, angles);
    for (int qi = 0; qi < nq; ++qi) {
      const int lim = std::min(nc, pos0 + t0 + qi / group + 1 - c0);  // the query's causal limit
      const float* c = coef + static_cast<size_t>(qi) * nr;
      float* srow = scores + static_cast<size_t>(qi) * n_ctx + c0;
      for (int i = 0; i < lim; ++i) {
        if (!flags[c0 + i]) continue;
        const float* an = angles + static_cast<size_t>(i) * nr;
        float dot = rest[qi];
        for (int j = 0; j < nr; ++j) dot += c[j] * an[j];
        srow[i] += shape.scale * dot;
      }
    }
  }
}

}  // namespace

void CausalAttention(const KvCache& cache, int layer, int seq, int pos0, int n_tokens,
                     const float* q, float* out, const AttentionShape& shape,
                     AttentionScratch& scratch, ThreadPool& pool) {
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
  // Integer scores read K codes directly; otherwise K tiles are decoded to f32.
  const KvScoreFn score_k =
      KvIntScoreSupported(ks.format, hd) ? BestKvScorer(ks.format) : nullptr;
  const int n_qgroups = hd / 32;
  if (score_k != nullptr) {
    const size_t q_per_thread = static_cast<size_t>(max_queries) * hd;
    if (scratch.per_thread_q.size() < q_per_thread * pool.size()) {
      scratch.per_thread_q.resize(q_per_thread * pool.size());
    }
  }
  const bool k_f16 = ks.format == KvRowFormat::kF16;
  const bool v_f16 = vs.format == KvRowFormat::kF16;
  const int n_blocks = (n_tokens + kTokenBlock - 1) / kTokenBlock;
  const int64_t n_items = static_cast<int64_t>(shape.n_head_kv) * n_blocks;
  const int64_t q_stride = static_cast<int64_t>(shape.n_head) * hd;

  pool.ParallelFor(n_items, 1, [&](int64_t begin, int64_t end, int thread) {
    float* scores = scratch.per_thread.data() + per_thread * thread;
    float* qrows = scores + static_cast<size_t>(max_queries) * n_ctx;
    float* acc = qrows + static_cast<size_t>(max_queries) * hd;
    float* tile = acc + static_cast<size_t>(max_queries) * hd;
    // Integer path: qq [max_queries][hd] codes; their scales [max_queries][hd / 32] reuse the
    // accumulators, which are not needed until pass 2.
    int16_t* qq = score_k ? scratch.per_thread_q.data() + static_cast<size_t>(max_queries) * hd * thread
                          : nullptr;
    float* qd = acc;
    for (int64_t item = begin; item < end; ++item) {
      const int g = static_cast<int>(item % shape.n_head_kv);
      const int blk = static_cast<int>(item / shape.n_head_kv);
      const int t0 = blk * kTokenBlock;
      const int nt = std::min(kTokenBlock, n_tokens - t0);
      const int nq = nt * group;  // query qi = (token t0 + qi / group, head g*group + qi % group)
      const int n_cells = pos0 + t0 + nt;  // cells the last token of the block sees
      auto n_kv_of = [&](int qi) { return pos0 + t0 + qi / group + 1; };
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
        score_k(cache.KHead(layer, seq, g, 0), n_cells, hd, nq, qq, qd, shape.scale, scores,
                n_ctx);
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
      if (cache.k_anchored()) {
        AddAnchorScores(cache, layer, seq, g, pos0, n_cells, q, q_stride, t0, nq, group, shape, n_ctx,
                        acc, qrows, tile, scores);
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
        decode_v(cache.VHead(layer, seq, g, c0), nc, hd, tile);
        for (int qi = 0; qi < nq; ++qi) {
          const int lim = std::min(nc, n_kv_of(qi) - c0);
          if (lim <= 0) continue;
          kern.accumulate_rows(scores + static_cast<size_t>(qi) * n_ctx + c0, tile, lim, hd,
                               acc + static_cast<size_t>(qi) * hd);
        }
      }
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
