// Tiled, threaded matmul over the quant kernel table.
#include "kernels/matmul.h"

#include <algorithm>

#include "util/check.h"

namespace lamina {

namespace {
// Rows per work item: small enough to balance 2..16 threads, large enough to amortise dispatch.
constexpr int64_t kRowTile = 16;
}  // namespace

void DequantizeRow(const WeightMatrix& w, int64_t row, float* out) {
  const TypeKernels& kern = GetKernels(w.type);
  LAMINA_CHECK(kern.dequantize != nullptr && w.interleave == 0);
  kern.dequantize(w.Row(row), out, w.cols);
  if (w.scale != 1.0f) {
    for (int64_t c = 0; c < w.cols; ++c) out[c] *= w.scale;
  }
}

bool CanInterleave(const WeightMatrix& w) {
  if (!w.valid() || w.interleave != 0 || !IsSupportedWeightType(w.type)) return false;
  const TypeKernels& kern = GetKernels(w.type);
  return kern.gemm_interleaved != nullptr && kern.interleave_rows <= kMaxInterleaveRows &&
         w.rows % kern.interleave_rows == 0;
}

WeightMatrix InterleaveInto(const WeightMatrix& w, uint8_t* dst) {
  LAMINA_CHECK(CanInterleave(w));
  const TypeKernels& kern = GetKernels(w.type);
  const int g = kern.interleave_rows;
  const size_t group_bytes = static_cast<size_t>(g) * w.row_bytes;
  for (int64_t r = 0; r < w.rows; r += g) {
    kern.repack(w.Row(r), w.row_bytes, w.cols, dst + static_cast<size_t>(r / g) * group_bytes);
  }
  WeightMatrix out = w;
  out.data = dst;
  out.interleave = g;
  return out;
}

namespace {

// y[t][r] *= w.scale for t < n_tokens, r in [r0, r1): the weight's per-tensor scale on outputs
// already computed (a product per output, so each row's result stays its own).
void ScaleOutputs(const WeightMatrix& w, int64_t r0, int64_t r1, int64_t n_tokens, float* y,
                  int64_t y_stride) {
  if (w.scale == 1.0f) return;
  for (int64_t t = 0; t < n_tokens; ++t) {
    float* yt = y + t * y_stride;
    for (int64_t r = r0; r < r1; ++r) yt[r] *= w.scale;
  }
}

// Activations as a matmul's kernels read them: [n_tokens][row_bytes]. For a few tokens (at most
// kLocalActTokens: decode steps, verify windows), F16 weights' f16-rounded activations are made
// by each thread for itself from x on its first chunk of the loop (Local): one shared copy
// rounded on the caller kept the other threads waiting, a verify window's matmuls 10-20% of
// their time (docs/PERFORMANCE.md). The same values either way: rounding is per element.
constexpr int64_t kLocalActTokens = 16;
struct PreparedAct {
  const uint8_t* data = nullptr;
  size_t row_bytes = 0;
  // Per-thread rounding (data == nullptr): x [n_tokens, x_stride], the rounding, each slot's
  // buffer at per_thread + slot * per_thread_stride, ready[slot] once made.
  const float* x = nullptr;
  int64_t x_stride = 0;
  int64_t n_tokens = 0;
  int64_t cols = 0;
  void (*round)(const float* x, void* y, int64_t k) = nullptr;
  uint8_t* per_thread = nullptr;
  size_t per_thread_stride = 0;
  uint8_t* ready = nullptr;

  // Whether y [n_tokens, y_stride] (rows columns) shares bytes with x: a thread's outputs must
  // not change what a later thread rounds.
  bool Overlaps(const float* y, int64_t y_stride, int64_t rows) const {
    if (data != nullptr) return false;
    // Addresses as integers: x and y may be unrelated arrays.
    const auto at = [](const float* p) { return reinterpret_cast<uintptr_t>(p); };
    return at(x) < at(y + (n_tokens - 1) * y_stride + rows) &&
           at(y) < at(x + (n_tokens - 1) * x_stride + cols);
  }
  // The activations as thread `slot` reads them (rounded on its first call in a loop).
  PreparedAct Local(int slot) const {
    if (data != nullptr) return *this;
    uint8_t* dst = per_thread + static_cast<size_t>(slot) * per_thread_stride;
    if (ready[slot] == 0) {
      for (int64_t t = 0; t < n_tokens; ++t) round(x + t * x_stride, dst + t * row_bytes, cols);
      ready[slot] = 1;
    }
    PreparedAct local;
    local.data = dst;
    local.row_bytes = row_bytes;
    return local;
  }
};

// bytes of v at a 64-byte boundary (v grown to hold them): the kernels' 512-bit loads of an
// activation row then do not straddle cache lines (a 9-token F16 window's matmuls ran 16% longer
// on rows 16 bytes off, docs/PERFORMANCE.md).
uint8_t* Aligned64(std::vector<uint8_t>& v, size_t bytes) {
  v.resize(bytes + 64);
  const uintptr_t base = reinterpret_cast<uintptr_t>(v.data());
  return v.data() + (64 - base % 64) % 64;
}

// The interleaved kernels' activations: quantized to vec_dot_type as for vec_dot (Q8_0 rows then
// widened to BlockQ8_0Act; Q8_K rows as they are). The same bytes for every weight type with this
// vec_dot_type and these cols.
PreparedAct PrepareInterleavedAct(const WeightMatrix& w, const TypeKernels& kern, const float* x,
                                  int64_t x_stride, int64_t n_tokens, MatMulScratch& scratch,
                                  ThreadPool& pool) {
  const bool wide = kern.vec_dot_type == GgmlType::kQ8_0;
  LAMINA_CHECK(kern.gemm_interleaved != nullptr && (wide || kern.vec_dot_type == GgmlType::kQ8_K) &&
               w.interleave == kern.interleave_rows && w.interleave <= kMaxInterleaveRows);
  const TypeKernels& act_kern = GetKernels(kern.vec_dot_type);
  const size_t q_row = RowSize(kern.vec_dot_type, w.cols);
  const size_t act_row = wide ? static_cast<size_t>(w.cols / kQK) * sizeof(BlockQ8_0Act) : q_row;
  uint8_t* q_rows =
      Aligned64(scratch.act, q_row * static_cast<size_t>(n_tokens));  // [n_tokens][q_row]
  uint8_t* wide_rows =                                                // [n_tokens][act_row]
      wide ? Aligned64(scratch.act_wide, act_row * static_cast<size_t>(n_tokens)) : nullptr;
  pool.ParallelFor(n_tokens, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      uint8_t* q = q_rows + t * q_row;
      act_kern.quantize(x + t * x_stride, q, w.cols);
      if (wide) Q8_0ToAct(q, wide_rows + t * act_row, w.cols);
    }
  });
  return {wide ? wide_rows : q_rows, act_row};
}

// Groups [g_begin, g_end) of interleaved w (w.interleave rows each), only their rows in
// [row_begin, row_end), against every token of act, into y: even tiles of up to the kernel's
// gemm_max_tokens tokens (kMaxMultiDot = 8: 9 tokens as 5 + 4; a lone token would leave most of a
// kernel's accumulators idle). A group straddling the range is computed whole into a local tile
// and only its rows in the range are copied (each row's result is its own).
void RunGroups(const WeightMatrix& w, const TypeKernels& kern, const PreparedAct& act,
               int64_t n_tokens, int64_t g_begin, int64_t g_end, int64_t row_begin, int64_t row_end,
               float* y, int64_t y_stride) {
  const int g = w.interleave;
  const size_t group_bytes = static_cast<size_t>(g) * w.row_bytes;
  const size_t y_step = static_cast<size_t>(y_stride);
  const int64_t max_tokens = kern.gemm_max_tokens;
  LAMINA_CHECK(max_tokens >= 1 && max_tokens <= kMaxGemmTokens);
  const int64_t n_token_tiles = (n_tokens + max_tokens - 1) / max_tokens;
  float tile[kMaxGemmTokens * kMaxInterleaveRows];  // [tokens][rows of one group]
  for (int64_t grp = g_begin; grp < g_end; ++grp) {
    const uint8_t* wg = w.data + static_cast<size_t>(grp) * group_bytes;
    const int64_t r0 = grp * g;
    const int64_t lo = std::max(r0, row_begin), hi = std::min(r0 + g, row_end);
    for (int64_t tt = 0; tt < n_token_tiles; ++tt) {
      const int64_t t0 = tt * n_tokens / n_token_tiles;
      const int nt = static_cast<int>((tt + 1) * n_tokens / n_token_tiles - t0);
      const uint8_t* a = act.data + static_cast<size_t>(t0) * act.row_bytes;
      if (lo == r0 && hi == r0 + g) {
        kern.gemm_interleaved(w.cols, wg, a, act.row_bytes, nt, y + t0 * y_stride + r0, y_step);
        continue;
      }
      kern.gemm_interleaved(w.cols, wg, a, act.row_bytes, nt, tile, g);
      for (int j = 0; j < nt; ++j) {
        for (int64_t r = lo; r < hi; ++r) y[(t0 + j) * y_stride + r] = tile[j * g + (r - r0)];
      }
    }
    ScaleOutputs(w, lo, hi, n_tokens, y, y_stride);
  }
}

// Interleaved weights: activations prepared once, then the groups covering [row_begin, row_end)
// in one parallel region.
void MatMulInterleaved(const WeightMatrix& w, const TypeKernels& kern, int64_t row_begin,
                       int64_t row_end, const float* x, int64_t x_stride, int64_t n_tokens,
                       float* y, int64_t y_stride, MatMulScratch& scratch, ThreadPool& pool) {
  const PreparedAct act = PrepareInterleavedAct(w, kern, x, x_stride, n_tokens, scratch, pool);
  const int g = w.interleave;
  const int64_t g_begin = row_begin / g, g_end = (row_end + g - 1) / g;
  pool.ParallelFor(g_end - g_begin, 1, [&](int64_t i0, int64_t i1) {
    RunGroups(w, kern, act, n_tokens, g_begin + i0, g_begin + i1, row_begin, row_end, y, y_stride);
  });
}

}  // namespace

namespace {

// Activations in the layout w's plain-row kernels read: x itself when it already is (f32
// activations at stride cols), else prepared into scratch.act.

PreparedAct PrepareActivations(const WeightMatrix& w, const TypeKernels& kern, const float* x,
                               int64_t x_stride, int64_t n_tokens, MatMulScratch& scratch,
                               ThreadPool& pool) {
  const size_t act_row_bytes = RowSize(kern.vec_dot_type, w.cols);
  if (kern.vec_dot_type == GgmlType::kF32 && kern.quantize_act == nullptr && x_stride == w.cols) {
    return {reinterpret_cast<const uint8_t*>(x), act_row_bytes};
  }
  if (kern.quantize_act != nullptr && n_tokens <= kLocalActTokens) {
    // F16 weights, few tokens: each thread rounds its own copy (PreparedAct::Local), 64-byte
    // aligned slots of [n_tokens][cols] f32.
    const size_t stride = (act_row_bytes * static_cast<size_t>(n_tokens) + 63) / 64 * 64;
    uint8_t* slots = Aligned64(scratch.act_per_thread, stride * static_cast<size_t>(pool.size()));
    scratch.act_ready.assign(static_cast<size_t>(pool.size()), 0);
    PreparedAct act;
    act.row_bytes = act_row_bytes;
    act.x = x;
    act.x_stride = x_stride;
    act.n_tokens = n_tokens;
    act.cols = w.cols;
    act.round = kern.quantize_act;
    act.per_thread = slots;
    act.per_thread_stride = stride;
    act.ready = scratch.act_ready.data();
    return act;
  }
  uint8_t* dst = Aligned64(scratch.act, act_row_bytes * static_cast<size_t>(n_tokens));
  if (kern.quantize_act != nullptr) {  // F16 weights: f16-rounded activations kept as f32
    for (int64_t t = 0; t < n_tokens; ++t) {
      kern.quantize_act(x + t * x_stride, dst + t * act_row_bytes, w.cols);
    }
  } else if (kern.vec_dot_type == GgmlType::kF32) {
    for (int64_t t = 0; t < n_tokens; ++t) {
      std::copy_n(x + t * x_stride, w.cols, reinterpret_cast<float*>(dst + t * act_row_bytes));
    }
  } else {
    const TypeKernels& act_kern = GetKernels(kern.vec_dot_type);
    LAMINA_CHECK(act_kern.quantize != nullptr);
    pool.ParallelFor(n_tokens, 1, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        act_kern.quantize(x + t * x_stride, dst + t * act_row_bytes, w.cols);
      }
    });
  }
  return {dst, act_row_bytes};
}

// Rows [r_start, r_stop) of plain w against every token of act, into y: per row tile of
// kRowTile rows, token tiles of at most the tile kernel's tile_max_tokens (kMaxMultiDot for the
// row kernel), as even as possible (9 tokens at 8: 5 + 4, not 8 + 1, whose one-token tile
// would run each row's few dependent FMA chains alone; at 12, one tile). The outer
// loop over row tiles keeps the rows hot in cache across the token tiles.
void RunRows(const WeightMatrix& w, const TypeKernels& kern, const PreparedAct& act,
             int64_t n_tokens, int64_t r_start, int64_t r_stop, float* y, int64_t y_stride) {
  const bool use_tile = kern.vec_dot_tile != nullptr && n_tokens >= kern.tile_min_tokens;
  const int64_t max_tokens = use_tile ? kern.tile_max_tokens : kMaxMultiDot;
  LAMINA_CHECK(max_tokens >= 1 && max_tokens <= kMaxTileTokens);
  const int64_t n_token_tiles = (n_tokens + max_tokens - 1) / max_tokens;
  const size_t y_step = static_cast<size_t>(y_stride);
  float out[kMaxMultiDot];
  for (int64_t r0 = r_start; r0 < r_stop; r0 += kRowTile) {
    const int64_t r1 = std::min(r_stop, r0 + kRowTile);
    for (int64_t tt = 0; tt < n_token_tiles; ++tt) {
      const int64_t t0 = tt * n_tokens / n_token_tiles;
      const int nt = static_cast<int>((tt + 1) * n_tokens / n_token_tiles - t0);
      const uint8_t* act_tile = act.data + static_cast<size_t>(t0) * act.row_bytes;
      if (use_tile) {
        for (int64_t r = r0; r < r1; r += kMaxTileRows) {
          const int nr = static_cast<int>(std::min<int64_t>(kMaxTileRows, r1 - r));
          kern.vec_dot_tile(w.cols, w.Row(r), w.row_bytes, nr, act_tile, act.row_bytes, nt,
                            y + t0 * y_stride + r, y_step);
        }
        continue;
      }
      for (int64_t r = r0; r < r1; ++r) {
        // Always the multi kernel: its out[j] must not depend on n_act, so a token's
        // result is the same whatever batch it arrives in (the write-path tests rely on it).
        kern.vec_dot_multi(w.cols, w.Row(r), act_tile, act.row_bytes, nt, out);
        for (int j = 0; j < nt; ++j) y[(t0 + j) * y_stride + r] = out[j];
      }
    }
    ScaleOutputs(w, r0, r1, n_tokens, y, y_stride);
  }
}

}  // namespace

void MatMulRows(const WeightMatrix& w, int64_t row_begin, int64_t row_end, const float* x,
                int64_t x_stride, int64_t n_tokens, float* y, int64_t y_stride,
                MatMulScratch& scratch, ThreadPool& pool) {
  LAMINA_CHECK(w.valid());
  LAMINA_CHECK(row_begin >= 0 && row_end <= w.rows && row_begin <= row_end);
  if (n_tokens <= 0 || row_begin == row_end) return;
  const TypeKernels& kern = GetKernels(w.type);
  LAMINA_CHECK(kern.vec_dot != nullptr);
  if (w.interleave != 0) {
    return MatMulInterleaved(w, kern, row_begin, row_end, x, x_stride, n_tokens, y, y_stride,
                             scratch, pool);
  }
  const PreparedAct act = PrepareActivations(w, kern, x, x_stride, n_tokens, scratch, pool);
  LAMINA_CHECK(!act.Overlaps(y, y_stride, row_end));
  const int64_t n_row_tiles = (row_end - row_begin + kRowTile - 1) / kRowTile;
  pool.ParallelFor(n_row_tiles, 1, [&](int64_t tile0, int64_t tile1, int slot) {
    RunRows(w, kern, act.Local(slot), n_tokens, row_begin + tile0 * kRowTile,
            std::min(row_end, row_begin + tile1 * kRowTile), y, y_stride);
  });
}

void MatMulMany(const MatMulPart* parts, int n_parts, const float* x, int64_t x_stride,
                int64_t n_tokens, MatMulScratch& scratch, ThreadPool& pool,
                const std::function<void(int64_t row_begin, int64_t row_end)>* after_rows) {
  LAMINA_CHECK(n_parts >= 1 && n_parts <= kMaxMatMulParts);
  if (n_tokens <= 0) return;
  const WeightMatrix& w0 = *parts[0].w;
  const bool interleaved = w0.interleave != 0;
  const TypeKernels* kerns[kMaxMatMulParts];  // [n_parts]
  // Shared: plain rows of one type, or interleaved rows whose types read the same activations
  // (one vec_dot_type: Q4_K and Q6_K both take Q8_K), with one group size under after_rows.
  bool shared = true;
  for (int p = 0; p < n_parts; ++p) {
    const WeightMatrix& w = *parts[p].w;
    LAMINA_CHECK(w.valid() && w.cols == w0.cols);
    LAMINA_CHECK(after_rows == nullptr || w.rows == w0.rows);
    kerns[p] = &GetKernels(w.type);
    LAMINA_CHECK(kerns[p]->vec_dot != nullptr);
    if (!interleaved) {
      shared = shared && w.type == w0.type && w.interleave == 0;
    } else {
      shared = shared && w.interleave != 0 && kerns[p]->vec_dot_type == kerns[0]->vec_dot_type &&
               (after_rows == nullptr || w.interleave == w0.interleave);
    }
  }
  if (!shared) {  // each its own region (mixed layouts or activation formats)
    for (int p = 0; p < n_parts; ++p) {
      MatMul(*parts[p].w, x, x_stride, n_tokens, parts[p].y, parts[p].y_stride, scratch, pool);
    }
    if (after_rows != nullptr) (*after_rows)(0, w0.rows);
    return;
  }
  // A unit is kRowTile rows of a plain part or one group of an interleaved one.
  PreparedAct act;
  PreparedAct iact;
  if (interleaved) {
    iact = PrepareInterleavedAct(w0, *kerns[0], x, x_stride, n_tokens, scratch, pool);
  } else {
    act = PrepareActivations(w0, *kerns[0], x, x_stride, n_tokens, scratch, pool);
    for (int p = 0; p < n_parts; ++p) {
      LAMINA_CHECK(!act.Overlaps(parts[p].y, parts[p].y_stride, parts[p].w->rows));
    }
  }
  auto unit_rows = [&](int p) -> int64_t {
    return interleaved ? parts[p].w->interleave : kRowTile;
  };
  // Units [u0, u1) of part p (relative to the part).
  auto run = [&](int p, int64_t u0, int64_t u1, int slot) {
    const WeightMatrix& w = *parts[p].w;
    if (interleaved) {
      RunGroups(w, *kerns[p], iact, n_tokens, u0, u1, 0, w.rows, parts[p].y, parts[p].y_stride);
    } else {
      RunRows(w, *kerns[p], act.Local(slot), n_tokens, u0 * kRowTile,
              std::min(w.rows, u1 * kRowTile), parts[p].y, parts[p].y_stride);
    }
  };
  // Units: with after_rows, unit u is unit u of every part (then after_rows on its rows);
  // without, the parts' units one after another.
  int64_t first_unit[kMaxMatMulParts + 1] = {0};  // [n_parts + 1] prefix sums of units
  for (int p = 0; p < n_parts; ++p) {
    first_unit[p + 1] = first_unit[p] + (parts[p].w->rows + unit_rows(p) - 1) / unit_rows(p);
  }
  const int64_t n_units = after_rows != nullptr ? first_unit[1] : first_unit[n_parts];
  pool.ParallelFor(n_units, 1, [&](int64_t u0, int64_t u1, int slot) {
    if (after_rows != nullptr) {
      for (int p = 0; p < n_parts; ++p) run(p, u0, u1, slot);
      (*after_rows)(u0 * unit_rows(0), std::min(w0.rows, u1 * unit_rows(0)));
      return;
    }
    for (int p = 0; p < n_parts; ++p) {
      const int64_t lo = std::max(u0, first_unit[p]), hi = std::min(u1, first_unit[p + 1]);
      if (lo < hi) run(p, lo - first_unit[p], hi - first_unit[p], slot);
    }
  });
}

void MatMul(const WeightMatrix& w, const float* x, int64_t x_stride, int64_t n_tokens, float* y,
            int64_t y_stride, MatMulScratch& scratch, ThreadPool& pool) {
  MatMulRows(w, 0, w.rows, x, x_stride, n_tokens, y, y_stride, scratch, pool);
}

}  // namespace lamina
