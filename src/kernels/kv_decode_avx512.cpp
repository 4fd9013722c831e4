// AVX-512 (F/BW/VL/DQ/VNNI) integer K scorers, twins of the scalar ones in kv_decode.cpp (the
// plain row decoders are in kv_decode_hwy.cpp).
//
// Scorer layout: a block of 16 cells is expanded once into int16 codes and reused by every
// query of the call. Each zmm holds one 16-value run of 4 cells (one cell per 128-bit lane);
// splitting each dword's 4 bytes into the even pair and the odd pair of int16s lets vpdpwssd
// multiply them by the query's evens / odds (QuantizeQueryInt16's order), so every lane sums
// a quarter run of one cell in exact int32. Four accumulators (16 cells) reduce to one vector
// of 16 cell sums per group with two unpack-add rounds; its lanes come out as
// lane 4j + m = cell 4m + j, an involution that one vpermd undoes before the store.
// GCC 12's AVX-512 headers build some intrinsics from _mm512_undefined_*(), which its
// uninitialized-value analysis reports at every use.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kernels/kv_decode.h"

namespace lamina {

namespace {

constexpr int kGroup = 32;       // values per scale
constexpr int kBlockCells = 16;  // cells expanded at once
constexpr int kMaxHeadDim = 512;

// Four 16-byte runs (one per cell, `stride` bytes apart) as one zmm, cell c in lane c.
inline __m512i LoadRuns4(const uint8_t* p, size_t stride) {
  __m512i v = _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  v = _mm512_inserti32x4(v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + stride)), 1);
  v = _mm512_inserti32x4(v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2 * stride)), 2);
  return _mm512_inserti32x4(v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 3 * stride)),
                            3);
}

// Signed bytes -> (even bytes, odd bytes) as int16 pairs per dword.
inline void SplitEvenOdd(__m512i b, __m512i* even, __m512i* odd) {
  *even = _mm512_srai_epi16(_mm512_slli_epi16(b, 8), 8);
  *odd = _mm512_srai_epi16(b, 8);
}

// Sums of the four dwords of each 128-bit lane of a[0..3]: lane 4j + m = lane j of a[m].
inline __m512i Reduce4(const __m512i a[4]) {
  const __m512i s01 =
      _mm512_add_epi32(_mm512_unpacklo_epi32(a[0], a[1]), _mm512_unpackhi_epi32(a[0], a[1]));
  const __m512i s23 =
      _mm512_add_epi32(_mm512_unpacklo_epi32(a[2], a[3]), _mm512_unpackhi_epi32(a[2], a[3]));
  return _mm512_add_epi32(_mm512_unpacklo_epi64(s01, s23), _mm512_unpackhi_epi64(s01, s23));
}

template <KvRowFormat F>
void ScoreBlock(const uint8_t* rows, size_t row_bytes, int head_dim, int nq, const int16_t* qq,
                const float* qd, float scale, float* out, int64_t out_stride, int n_valid) {
  const int n_groups = head_dim / kGroup;
  const size_t group_bytes = row_bytes / n_groups;
  // [run][cell quad][even, odd]: the block's codes as int16 pairs.
  alignas(64) __m512i w[kMaxHeadDim / 16][4][2];
  // [group]: K scales, lane 4j + m = cell 4m + j.
  alignas(64) __m512 dk[kMaxHeadDim / kGroup];
  const __m512i lane_cell = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  const __m512i scale_offsets =
      _mm512_mullo_epi32(lane_cell, _mm512_set1_epi32(static_cast<int>(row_bytes)));
  for (int g = 0; g < n_groups; ++g) {
    const uint8_t* grp = rows + g * group_bytes;
    const __m512i d = _mm512_i32gather_epi32(scale_offsets, grp, 1);
    dk[g] = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(d));
    for (int m = 0; m < 4; ++m) {
      const uint8_t* p = grp + 4 * m * row_bytes + 2;
      if constexpr (F == KvRowFormat::kInt8) {
        for (int k = 0; k < 2; ++k) {
          SplitEvenOdd(LoadRuns4(p + 16 * k, row_bytes), &w[2 * g + k][m][0], &w[2 * g + k][m][1]);
        }
      } else {
        const __m512i b = LoadRuns4(p, row_bytes);
        const __m512i nib = _mm512_set1_epi8(0x0F), eight = _mm512_set1_epi8(8);
        const __m512i lo = _mm512_sub_epi8(_mm512_and_si512(b, nib), eight);
        const __m512i hi = _mm512_sub_epi8(_mm512_and_si512(_mm512_srli_epi16(b, 4), nib), eight);
        SplitEvenOdd(lo, &w[2 * g][m][0], &w[2 * g][m][1]);
        SplitEvenOdd(hi, &w[2 * g + 1][m][0], &w[2 * g + 1][m][1]);
      }
    }
  }
  const __mmask16 store_mask = static_cast<__mmask16>((1u << n_valid) - 1);
  const __m512 vscale = _mm512_set1_ps(scale);
  for (int qi = 0; qi < nq; ++qi) {
    const int16_t* qv = qq + static_cast<int64_t>(qi) * head_dim;
    const float* qs = qd + static_cast<int64_t>(qi) * n_groups;
    __m512 s = _mm512_setzero_ps();
    for (int g = 0; g < n_groups; ++g) {
      __m512i acc[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(),
                        _mm512_setzero_si512()};
      for (int k = 2 * g; k < 2 * g + 2; ++k) {
        const __m512i qe =
            _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qv + 16 * k)));
        const __m512i qo = _mm512_broadcast_i32x4(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(qv + 16 * k + 8)));
        for (int m = 0; m < 4; ++m) {
          acc[m] = _mm512_dpwssd_epi32(acc[m], w[k][m][0], qe);
          acc[m] = _mm512_dpwssd_epi32(acc[m], w[k][m][1], qo);
        }
      }
      const __m512 f = _mm512_mul_ps(dk[g], _mm512_set1_ps(qs[g]));
      s = _mm512_fmadd_ps(_mm512_cvtepi32_ps(Reduce4(acc)), f, s);
    }
    s = _mm512_mul_ps(s, vscale);
    _mm512_mask_storeu_ps(out + qi * out_stride, store_mask, _mm512_permutexvar_ps(lane_cell, s));
  }
}

template <KvRowFormat F>
void Score(const uint8_t* rows, int n_rows, int head_dim, int nq, const int16_t* qq,
           const float* qd, float scale, float* out, int64_t out_stride) {
  if (head_dim > kMaxHeadDim) {
    ScalarKvScorer(F)(rows, n_rows, head_dim, nq, qq, qd, scale, out, out_stride);
    return;
  }
  const size_t row_bytes = KvRowBytes(F, head_dim);
  int j = 0;
  for (; j + kBlockCells <= n_rows; j += kBlockCells) {
    ScoreBlock<F>(rows + j * row_bytes, row_bytes, head_dim, nq, qq, qd, scale, out + j, out_stride,
                  kBlockCells);
  }
  if (j < n_rows) {
    // The tail runs through a zero-padded copy so the block code never reads past the rows.
    alignas(64) uint8_t pad[kBlockCells * (kMaxHeadDim + 2 * kMaxHeadDim / kGroup)];
    const size_t bytes = (n_rows - j) * row_bytes;
    std::memcpy(pad, rows + j * row_bytes, bytes);
    std::memset(pad + bytes, 0, kBlockCells * row_bytes - bytes);
    ScoreBlock<F>(pad, row_bytes, head_dim, nq, qq, qd, scale, out + j, out_stride, n_rows - j);
  }
}
}  // namespace

KvScoreFn Avx512KvScorer(KvRowFormat format) {
  switch (format) {
    case KvRowFormat::kInt8:
      return Score<KvRowFormat::kInt8>;
    case KvRowFormat::kQ4_0:
      return Score<KvRowFormat::kQ4_0>;
    default:
      return nullptr;
  }
}

}  // namespace lamina
