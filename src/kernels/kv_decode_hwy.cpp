// KV row decoders (f16, int8, q4_0, q4_nl head rows to floats; twins of the scalar ones in
// kv_decode.cpp, the selection is there), written once with Highway and compiled for AVX2 and
// for AVX-512. Each value is one conversion and at most one multiply by its group's scale, as
// in the scalar twin, so every decoder gives the scalar twin's bits. Rows whose groups are not
// whole vectors (head_dim < 32) take the scalar twin.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/kv_decode_hwy.cpp"
// Only the targets lamina dispatches to (the static baseline target is always compiled too).
#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS (HWY_SSSE3 | HWY_SSE4 | HWY_AVX3_DL)
#endif
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/kv_decode.h"
#include "util/fp16.h"

HWY_BEFORE_NAMESPACE();
namespace lamina {
namespace HWY_NAMESPACE {
namespace {

namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using DI = hn::RebindToSigned<DF>;
using DU = hn::RebindToUnsigned<DF>;
constexpr int kLanes = static_cast<int>(HWY_MAX_BYTES / sizeof(float));

// The scalar twin, row by row (groups that are not whole vectors).
void DecodeRowsScalar(KvRowFormat format, const uint8_t* rows, int n_rows, int head_dim,
                      float* out) {
  const size_t row_bytes = KvRowBytes(format, head_dim);
  for (int r = 0; r < n_rows; ++r) {
    DecodeKvRow(format, rows + r * row_bytes, head_dim, out + static_cast<int64_t>(r) * head_dim);
  }
}

// A group's f16 scale (its first two bytes) in every lane, converted by the F16C instruction.
HWY_INLINE hn::Vec<DF> GroupScale(DF d, const uint8_t* group) {
  const hn::CappedTag<hwy::float16_t, 1> dh1;
  const hn::Rebind<float, decltype(dh1)> df1;
  const auto half = hn::LoadU(dh1, reinterpret_cast<const hwy::float16_t*>(group));
  return hn::Set(d, hn::GetLane(hn::PromoteTo(df1, half)));
}

// out[i] = d * codes[i] for i < n (n a multiple of the lanes), codes int8.
HWY_INLINE void ScaleInt8(DF d, hn::Vec<DF> scale, const int8_t* codes, int n, float* out) {
  const DI di;
  const hn::Rebind<int8_t, DI> d8;
  for (int i = 0; i < n; i += kLanes) {
    const auto q = hn::PromoteTo(di, hn::LoadU(d8, codes + i));
    hn::StoreU(hn::Mul(scale, hn::ConvertTo(d, q)), d, out + i);
  }
}

void DecodeF16(const uint8_t* row, int n_rows, int head_dim, float* out) {
  const DF d;
  const hn::Rebind<hwy::float16_t, DF> dh;
  const fp16_t* h = reinterpret_cast<const fp16_t*>(row);
  const int64_t n = static_cast<int64_t>(n_rows) * head_dim;
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const auto half = hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(h + i));
    hn::StoreU(hn::PromoteTo(d, half), d, out + i);
  }
  for (; i < n; ++i) out[i] = Fp16ToF32(h[i]);
}

void DecodeInt8(const uint8_t* row, int n_rows, int head_dim, float* out) {
  const int g = KvGroupSize(head_dim);
  if (g % kLanes != 0) return DecodeRowsScalar(KvRowFormat::kInt8, row, n_rows, head_dim, out);
  const DF d;
  // Rows are whole groups, so n_rows rows are n_rows * head_dim / g consecutive groups.
  const int64_t n_groups = static_cast<int64_t>(n_rows) * (head_dim / g);
  for (int64_t b = 0; b < n_groups; ++b) {
    const uint8_t* group = row + b * (2 + g);  // [f16 scale][g int8 codes]
    ScaleInt8(d, GroupScale(d, group), reinterpret_cast<const int8_t*>(group + 2), g, out + b * g);
  }
}

void DecodeQ4(const uint8_t* row, int n_rows, int head_dim, float* out) {
  const int g = KvGroupSize(head_dim);
  const int half = g / 2;  // byte i holds value i (low nibble) and value i + half (high)
  if (half % kLanes != 0) return DecodeRowsScalar(KvRowFormat::kQ4_0, row, n_rows, head_dim, out);
  const DF d;
  const DI di;
  const DU du;
  const hn::Rebind<uint8_t, DU> d8;
  const auto eight = hn::Set(di, 8);
  const auto low_mask = hn::Set(du, 0x0F);
  const int64_t n_groups = static_cast<int64_t>(n_rows) * (head_dim / g);
  for (int64_t b = 0; b < n_groups; ++b) {
    const uint8_t* group = row + b * (2 + half);  // [f16 scale][half bytes of nibble pairs]
    const auto scale = GroupScale(d, group);
    const uint8_t* qs = group + 2;
    for (int i = 0; i < half; i += kLanes) {
      const auto bytes = hn::PromoteTo(du, hn::LoadU(d8, qs + i));
      const auto lo = hn::Sub(hn::BitCast(di, hn::And(bytes, low_mask)), eight);
      const auto hi = hn::Sub(hn::BitCast(di, hn::ShiftRight<4>(bytes)), eight);
      hn::StoreU(hn::Mul(scale, hn::ConvertTo(d, lo)), d, out + b * g + i);
      hn::StoreU(hn::Mul(scale, hn::ConvertTo(d, hi)), d, out + b * g + i + half);
    }
  }
}

void DecodeQ4Nl(const uint8_t* row, int n_rows, int head_dim, float* out) {
#if HWY_TARGET != HWY_SCALAR
  const int g = KvGroupSize(head_dim);
  if (g == 32 && g % kLanes == 0) {
    const DF d;
    // Nibbles to their int8 levels with one byte table lookup per 16 values.
    const hn::FixedTag<uint8_t, 16> d16;
    const auto table = hn::LoadU(d16, reinterpret_cast<const uint8_t*>(kQ4NlLevels));
    const auto nibble = hn::Set(d16, 0x0F);
    const int64_t n_groups = static_cast<int64_t>(n_rows) * (head_dim / g);
    alignas(64) int8_t levels[32];  // [g] the group's levels: value i from nibble i
    for (int64_t b = 0; b < n_groups; ++b) {
      const uint8_t* group = row + b * (2 + g / 2);  // [f16 scale][16 bytes of nibble pairs]
      const auto bytes = hn::LoadU(d16, group + 2);
      hn::StoreU(hn::TableLookupBytes(table, hn::And(bytes, nibble)), d16,
                 reinterpret_cast<uint8_t*>(levels));
      hn::StoreU(hn::TableLookupBytes(table, hn::ShiftRight<4>(bytes)), d16,
                 reinterpret_cast<uint8_t*>(levels + 16));
      ScaleInt8(d, GroupScale(d, group), levels, g, out + b * g);
    }
    return;
  }
#endif
  DecodeRowsScalar(KvRowFormat::kQ4Nl, row, n_rows, head_dim, out);
}

// Anchored-key corrections, dense tiles: kQ queries' sums for the whole tile
// (kAnchorTileCells / kLanes vectors each) stay in registers, one fma chain per vector down the
// terms, then each query's flagged cells below its limit take fma(scale * flag, sum, score)
// (masked loads and stores; flagged: fl[k] != 0). w: the first query's weight of term t at w[t *
// w_stride]; lim relative to the cell lim_base cells before the tile.
template <int kQ>
HWY_INLINE void AnchorBlock(const float* w, int64_t w_stride, int n_terms, const float* tables,
                            const float* rest, const float* flag_scale, const uint8_t* fl,
                            int n_cells, const int* lim, int lim_base, float* scores,
                            int64_t score_stride) {
  const DF d;
  const DI di;
  const hn::Rebind<uint8_t, DI> d8;
  constexpr int kVecs = kAnchorTileCells / kLanes;
  using VF = hn::Vec<DF>;
  VF a[kQ][kVecs];
  for (int q = 0; q < kQ; ++q) {
    const VF r = hn::Set(d, rest[q]);
    for (int v = 0; v < kVecs; ++v) a[q][v] = r;
  }
  for (int t = 0; t < n_terms; ++t) {
    const float* row = tables + t * kAnchorTileCells;
    for (int q = 0; q < kQ; ++q) {
      const VF wt = hn::Set(d, w[t * w_stride + q]);
      for (int v = 0; v < kVecs; ++v)
        a[q][v] = hn::MulAdd(wt, hn::LoadU(d, row + v * kLanes), a[q][v]);
    }
  }
  for (int v = 0; v < kVecs && v * kLanes < n_cells; ++v) {
    const auto flagged =
        hn::RebindMask(d, hn::Ne(hn::PromoteTo(di, hn::LoadU(d8, fl + v * kLanes)), hn::Zero(di)));
    const VF fs = hn::LoadU(d, flag_scale + v * kLanes);
    for (int q = 0; q < kQ; ++q) {
      const int n = std::min(lim[q] - lim_base, n_cells) - v * kLanes;
      if (n <= 0) continue;
      const auto m = hn::And(hn::FirstN(d, static_cast<size_t>(std::min(kLanes, n))), flagged);
      float* srow = scores + q * score_stride + v * kLanes;
      const VF old = hn::MaskedLoad(m, d, srow);
      hn::BlendedStore(hn::MulAdd(fs, a[q][v], old), m, d, srow);
    }
  }
}

// Anchored-key corrections, sparse tiles: the queries in the lanes (a vector's at a time), the
// flagged cells of a segment's sparse tiles kSparseGroup at a time whichever tiles they are in
// (that many independent fma chains, so their latency overlaps; each cell reads its own tile's
// weights): lane q runs query q's chain on a cell's table column (broadcast), then the queries
// whose limit the cell is below take fma(scale * flag, sum, score), as the dense tiles do.
// cells [n]: the flagged cells (relative to the run) ascending; wofs [n]: where their tile's
// weights start in w; fs [n]: scale * float(flag).
constexpr int kSparseGroup = 8;
// One block of nl queries from q0 in the lanes of D (nl <= Lanes(D); all of them: unmasked
// loads).
template <class D>
HWY_INLINE void AnchorSparseQueries(D d, int q0, int nl, const float* w, int n_terms,
                                    const float* tables, const float* rest, const int* cells,
                                    const int64_t* wofs, const float* fs, int n, int nq,
                                    const int* lim, float* scores, int64_t score_stride) {
  using VF = hn::Vec<D>;
  constexpr int kCells = kSparseGroup;
  const bool full = nl == static_cast<int>(hn::Lanes(d));
  const auto m = hn::FirstN(d, static_cast<size_t>(nl));
  const VF r = full ? hn::LoadU(d, rest + q0) : hn::MaskedLoad(m, d, rest + q0);
  int lim_max = 0;  // the cells below some lane's limit
  for (int l = 0; l < nl; ++l) lim_max = std::max(lim_max, lim[q0 + l]);
  // The flagged cells below it (the first nb: cells ascend).
  const int nb = static_cast<int>(std::lower_bound(cells, cells + n, lim_max) - cells);
  alignas(64) float sums[kCells][kLanes];  // [cell of the group][lane] the sums
  for (int j = 0; j < nb; j += kCells) {
    const int jn = std::min(j + kCells, nb);
    VF a[kCells];
    const float* wc[kCells];   // [cell] its tile's weights of term 0, lane 0 = query q0
    const float* col[kCells];  // [cell] its table column, term 0
    for (int c = 0; c < kCells; ++c) {
      a[c] = r;
      const int i = std::min(j + c, jn - 1);  // past the group's last: computed, not stored
      wc[c] = w + wofs[i] + q0;
      col[c] = tables + cells[i] % kAnchorTileCells;
    }
    auto load_w = [&](const float* p) { return full ? hn::LoadU(d, p) : hn::MaskedLoad(m, d, p); };
    if (wofs[j] == wofs[jn - 1]) {  // one tile's cells (they ascend): its weights loaded once
      for (int t = 0; t < n_terms; ++t) {
        const VF wv = load_w(wc[0] + static_cast<int64_t>(t) * nq);
        for (int c = 0; c < kCells; ++c)
          a[c] = hn::MulAdd(wv, hn::Set(d, col[c][t * kAnchorTileCells]), a[c]);
      }
    } else {
      for (int t = 0; t < n_terms; ++t) {
        const int64_t wt = static_cast<int64_t>(t) * nq;
        for (int c = 0; c < kCells; ++c)
          a[c] = hn::MulAdd(load_w(wc[c] + wt), hn::Set(d, col[c][t * kAnchorTileCells]), a[c]);
      }
    }
    for (int c = 0; c < kCells; ++c) hn::StoreU(a[c], d, sums[c]);
    for (int l = 0; l < nl; ++l) {
      float* srow = scores + (q0 + l) * score_stride;
      for (int i = j; i < jn && cells[i] < lim[q0 + l]; ++i) {
        srow[cells[i]] = std::fma(fs[i], sums[i - j][l], srow[cells[i]]);
      }
    }
  }
}

// Every query block of the segment's sparse cells.
HWY_NOINLINE void AnchorSparse(const float* w, int n_terms, const float* tables, const float* rest,
                               const int* cells, const int64_t* wofs, const float* fs, int n,
                               int nq, const int* lim, float* scores, int64_t score_stride) {
  const DF d;
  const int lanes = static_cast<int>(hn::Lanes(d));
  for (int q0 = 0; q0 < nq; q0 += lanes) {
    const int nl = std::min(lanes, nq - q0);
#if HWY_TARGET != HWY_SCALAR
    if (nl == 4 && lanes > 4) {  // a decode step's GQA group: 128-bit vectors, unmasked
      AnchorSparseQueries(hn::Full128<float>(), q0, nl, w, n_terms, tables, rest, cells, wofs, fs,
                          n, nq, lim, scores, score_stride);
      continue;
    }
#endif
    AnchorSparseQueries(d, q0, nl, w, n_terms, tables, rest, cells, wofs, fs, n, nq, lim, scores,
                        score_stride);
  }
}

// Bit k set when cell k of the (zero-padded) tile is flagged: one byte compare per vector of
// flags and its mask's bits.
HWY_INLINE uint64_t FlagBits(const uint8_t* fl) {
  const hn::ScalableTag<uint8_t> d8;
  const int n8 = static_cast<int>(hn::Lanes(d8));
  uint64_t bits = 0;
  for (int i = 0; i < kAnchorTileCells; i += n8) {
    uint8_t mask_bytes[8] = {};  // [bit] flagged, lane i + bit
    hn::StoreMaskBits(d8, hn::Ne(hn::LoadU(d8, fl + i), hn::Zero(d8)), mask_bytes);
    uint64_t part;
    std::memcpy(&part, mask_bytes, 8);
    bits |= part << i;
  }
  return bits;
}

// One dense tile (more flagged cells than the sparse form takes): w its weights, fl its flags
// zero-padded to a whole tile, lim relative to the cell lim_base cells before the tile.
HWY_NOINLINE void AnchorDenseTile(const float* w, int n_terms, const float* tables,
                                  const float* rest, const uint8_t* fl, int n_cells, int nq,
                                  const int* lim, int lim_base, float scale, float* scores,
                                  int64_t score_stride) {
  const DF d;
  const DI di;
  const hn::Rebind<uint8_t, DI> d8;
  // scale * float(flag) per cell, past n_cells 0 (never stored).
  alignas(64) float fs[kAnchorTileCells];
  const auto vscale = hn::Set(d, scale);
  for (int v = 0; v < kAnchorTileCells; v += kLanes) {
    hn::Store(hn::Mul(vscale, hn::ConvertTo(d, hn::PromoteTo(di, hn::LoadU(d8, fl + v)))), d,
              fs + v);
  }
  // Four queries at once where the registers hold their sums (AVX-512), else one.
  constexpr int kQ = kLanes >= 16 ? 4 : 1;
  int qi = 0;
  for (; qi + kQ <= nq; qi += kQ) {
    AnchorBlock<kQ>(w + qi, nq, n_terms, tables, rest + qi, fs, fl, n_cells, lim + qi, lim_base,
                    scores + qi * score_stride, score_stride);
  }
  for (; qi < nq; ++qi) {
    AnchorBlock<1>(w + qi, nq, n_terms, tables, rest + qi, fs, fl, n_cells, lim + qi, lim_base,
                   scores + qi * score_stride, score_stride);
  }
}

// Tiles per segment: the sparse cells of this many tiles are collected, then run as groups.
constexpr int kSegmentTiles = 16;

void AnchorScores(const float* w, int64_t w_tile_stride, int n_terms, const float* tables,
                  const float* rest, const uint8_t* flags, int n_cells, int nq, const int* lim,
                  float scale, float* scores, int64_t score_stride) {
  // The segment's sparse cells (at most kAnchorSparseCells a tile) in cell order.
  alignas(64) int cells[kSegmentTiles * kAnchorSparseCells];
  alignas(64) int64_t wofs[kSegmentTiles * kAnchorSparseCells];
  alignas(64) float fs[kSegmentTiles * kAnchorSparseCells];
  const int n_tiles = (n_cells + kAnchorTileCells - 1) / kAnchorTileCells;
  for (int s0 = 0; s0 < n_tiles; s0 += kSegmentTiles) {
    int n = 0;
    for (int i = s0; i < std::min(n_tiles, s0 + kSegmentTiles); ++i) {
      const int c0 = i * kAnchorTileCells;
      const int nc = std::min(kAnchorTileCells, n_cells - c0);
      alignas(64) uint8_t pad[kAnchorTileCells];  // a last partial tile's flags, zero-padded
      const uint8_t* fl = flags + c0;
      if (nc < kAnchorTileCells) {
        std::memset(pad, 0, sizeof(pad));
        std::memcpy(pad, fl, static_cast<size_t>(nc));
        fl = pad;
      }
      const uint64_t bits = FlagBits(fl);
      if (bits == 0) continue;
      // Sparse where it costs less than the dense form: one group of cells, or two when the
      // dense form would take more than one pass of four queries (measured: bench/matmul_bench.cpp,
      // BM_KvAnchorScores).
      const int n_flagged = std::popcount(bits);
      const int64_t wo = i * w_tile_stride;
      if (n_flagged <= kSparseGroup || (n_flagged <= kAnchorSparseCells && nq > 4)) {
        for (uint64_t b = bits; b != 0; b &= b - 1) {
          const int k = std::countr_zero(b);
          cells[n] = c0 + k;
          wofs[n] = wo;
          fs[n] = scale * static_cast<float>(fl[k]);
          ++n;
        }
        continue;
      }
      AnchorDenseTile(w + wo, n_terms, tables, rest, fl, nc, nq, lim, c0, scale, scores + c0,
                      score_stride);
    }
    if (n > 0)
      AnchorSparse(w, n_terms, tables, rest, cells, wofs, fs, n, nq, lim, scores, score_stride);
  }
}

}  // namespace

KvAnchorScoreFn HighwayKvAnchorScorer() { return AnchorScores; }

KvRowDecodeFn HighwayKvRowDecoder(KvRowFormat format) {
  switch (format) {
    case KvRowFormat::kF32:
      return nullptr;  // the scalar twin is a copy
    case KvRowFormat::kF16:
      return DecodeF16;
    case KvRowFormat::kInt8:
      return DecodeInt8;
    case KvRowFormat::kQ4_0:
      return DecodeQ4;
    case KvRowFormat::kQ4Nl:
      return DecodeQ4Nl;
  }
  return nullptr;
}

}  // namespace HWY_NAMESPACE
}  // namespace lamina
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace lamina {

// Each target's decoders only where Highway finds every instruction it compiled them with.
KvRowDecodeFn Avx2KvRowDecoder(KvRowFormat format) {
#if HWY_TARGETS & HWY_AVX2
  if ((hwy::SupportedTargets() & HWY_AVX2) != 0) return N_AVX2::HighwayKvRowDecoder(format);
#endif
  return nullptr;
}

KvRowDecodeFn Avx512KvRowDecoder(KvRowFormat format) {
#if HWY_TARGETS & HWY_AVX3
  if ((hwy::SupportedTargets() & HWY_AVX3) != 0) return N_AVX3::HighwayKvRowDecoder(format);
#endif
  return nullptr;
}

KvAnchorScoreFn Avx2KvAnchorScorer() {
#if HWY_TARGETS & HWY_AVX2
  if ((hwy::SupportedTargets() & HWY_AVX2) != 0) return N_AVX2::HighwayKvAnchorScorer();
#endif
  return nullptr;
}

KvAnchorScoreFn Avx512KvAnchorScorer() {
#if HWY_TARGETS & HWY_AVX3
  if ((hwy::SupportedTargets() & HWY_AVX3) != 0) return N_AVX3::HighwayKvAnchorScorer();
#endif
  return nullptr;
}

}  // namespace lamina
#endif  // HWY_ONCE
