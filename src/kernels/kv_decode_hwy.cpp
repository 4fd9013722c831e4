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
// w_stride].
template <int kQ>
HWY_INLINE void AnchorBlock(const float* w, int64_t w_stride, int n_terms, const float* tables,
                            const float* rest, const float* flag_scale, const uint8_t* fl,
                            int n_cells, const int* lim, float* scores, int64_t score_stride) {
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
      const int n = std::min(lim[q], n_cells) - v * kLanes;
      if (n <= 0) continue;
      const auto m = hn::And(hn::FirstN(d, static_cast<size_t>(std::min(kLanes, n))), flagged);
      float* srow = scores + q * score_stride + v * kLanes;
      const VF old = hn::MaskedLoad(m, d, srow);
      hn::BlendedStore(hn::MulAdd(fs, a[q][v], old), m, d, srow);
    }
  }
}

// Anchored-key corrections, sparse tiles: the queries in the lanes (a vector's at a time), the
// flagged cells kCells at a time (that many independent fma chains, so their latency overlaps;
// each term's weights are loaded once for them): lane q runs query q's chain on a cell's table
// column (broadcast), then the queries whose limit the cell is below take fma(scale * flag, sum,
// score), as the dense tiles do.
// idx [kAnchorSparseCells]: the flagged cells (bits) ascending, padded with cell 0 (computed,
// never stored); fs: their scale * float(flag).
constexpr int kSparseGroup = 8;
static_assert(kAnchorSparseCells % kSparseGroup == 0, "idx holds whole groups");
HWY_INLINE void AnchorSparse(const float* w, int n_terms, const float* tables, const float* rest,
                             uint64_t bits, const int* idx, const float* fs, int nq, const int* lim,
                             float* scores, int64_t score_stride) {
  const DF d;
  using VF = hn::Vec<DF>;
  constexpr int kCells = kSparseGroup;
  const int lanes = static_cast<int>(hn::Lanes(d));
  alignas(64) float sums[kCells][kLanes];  // [cell of the group][lane] the sums
  for (int q0 = 0; q0 < nq; q0 += lanes) {
    const int nl = std::min(lanes, nq - q0);
    const auto m = hn::FirstN(d, static_cast<size_t>(nl));
    const VF r = hn::MaskedLoad(m, d, rest + q0);
    int lim_max = 0;  // the cells below some lane's limit
    for (int l = 0; l < nl; ++l) lim_max = std::max(lim_max, lim[q0 + l]);
    lim_max = std::min(lim_max, kAnchorTileCells);
    // The flagged cells below it (the first n of idx).
    const int n = lim_max <= 0 ? 0 : std::popcount(bits & (~0ull >> (kAnchorTileCells - lim_max)));
    for (int j = 0; j < n; j += kCells) {
      VF a[kCells];
      for (int c = 0; c < kCells; ++c) a[c] = r;
      for (int t = 0; t < n_terms; ++t) {
        const VF wt = hn::MaskedLoad(m, d, w + static_cast<int64_t>(t) * nq + q0);
        const float* row = tables + t * kAnchorTileCells;
        for (int c = 0; c < kCells; ++c) a[c] = hn::MulAdd(wt, hn::Set(d, row[idx[j + c]]), a[c]);
      }
      for (int c = 0; c < kCells; ++c) hn::Store(a[c], d, sums[c]);
      const int jn = std::min(j + kCells, n);
      for (int l = 0; l < nl; ++l) {
        float* srow = scores + (q0 + l) * score_stride;
        for (int i = j; i < jn && idx[i] < lim[q0 + l]; ++i) {
          srow[idx[i]] = std::fma(fs[i], sums[i - j][l], srow[idx[i]]);
        }
      }
    }
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
    hn::StoreMaskBits(d8, hn::Ne(hn::Load(d8, fl + i), hn::Zero(d8)), mask_bytes);
    uint64_t part;
    std::memcpy(&part, mask_bytes, 8);
    bits |= part << i;
  }
  return bits;
}

void AnchorScores(const float* w, int n_terms, const float* tables, const float* rest,
                  const uint8_t* flags, int n_cells, int nq, const int* lim, float scale,
                  float* scores, int64_t score_stride) {
  const DF d;
  const DI di;
  const hn::Rebind<uint8_t, DI> d8;
  alignas(64) uint8_t fl[kAnchorTileCells] = {};  // [cell] the flags, past n_cells 0
  if (n_cells >= kAnchorTileCells) {
    std::memcpy(fl, flags, kAnchorTileCells);
  } else {
    std::memcpy(fl, flags, std::max(n_cells, 0));
  }
  const uint64_t bits = FlagBits(fl);
  if (bits == 0) return;
  // Sparse where it costs less than the dense form: one group of cells, or two when the dense
  // form would take more than one pass of four queries (measured: bench/matmul_bench.cpp,
  // BM_KvAnchorScores).
  const int n_flagged = std::popcount(bits);
  if (n_flagged <= kSparseGroup || (n_flagged <= kAnchorSparseCells && nq > 4)) {
    // The flagged cells and their scale * float(flag), padded with cell 0.
    // (A fixed count without branches: past the last, countr_zero(0) & 63 = 0.)
    alignas(64) int idx[kAnchorSparseCells];
    alignas(64) float fs[kAnchorSparseCells];
    uint64_t b = bits;
    for (int j = 0; j < kAnchorSparseCells; ++j, b &= b - 1) {
      idx[j] = std::countr_zero(b) & (kAnchorTileCells - 1);
      fs[j] = scale * static_cast<float>(fl[idx[j]]);
    }
    return AnchorSparse(w, n_terms, tables, rest, bits, idx, fs, nq, lim, scores, score_stride);
  }
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
    AnchorBlock<kQ>(w + qi, nq, n_terms, tables, rest + qi, fs, fl, n_cells, lim + qi,
                    scores + qi * score_stride, score_stride);
  }
  for (; qi < nq; ++qi) {
    AnchorBlock<1>(w + qi, nq, n_terms, tables, rest + qi, fs, fl, n_cells, lim + qi,
                   scores + qi * score_stride, score_stride);
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
