// AVX-512 (BW + VL + VNNI) dot products of the lattice i-quants (IQ2_XXS, IQ2_XS, IQ2_S,
// IQ3_XXS, IQ3_S, IQ1_S, IQ1_M against Q8_K): a super-block is decoded once into four 512-bit
// registers of weight magnitudes, four 64-bit sign masks and four registers of scales, then each
// activation row costs per 64 values one masked negate, one maddubs and one dpwssd, and rows in
// fours share one horizontal reduction. The grid entries come by gathers (8 per vpgatherdq, 16
// per vpgatherdd); 7-bit sign indices become sign bytes in registers (parity by two nibble
// lookups), explicit sign bits are the masks as they are, IQ1's deltas are added to 8 * grid. The
// integer sums and float steps are the scalar twins' (iquants.cpp), so every output is their
// bits.

// GCC 12's AVX-512 headers build their "undefined" vectors by self-initialisation, which trips
// -Wuninitialized at every inlined broadcast/insert/extract (GCC PR 105593); nothing reads them.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "quant/iq_grids.h"
#include "quant/kernel_registry.h"
#include "quant/quant.h"
#include "quant/types.h"
#include "util/check.h"
#include "util/fp16.h"

namespace lamina::quant_internal {
namespace {

#include "quant/iquants_common.inc"

struct IqDecoded512 {
  __m512i u[4];      // [4 chunks of 64 values] weight magnitudes |w|
  __mmask64 neg[4];  // [4 chunks]: bit j set where value j's weight is negative
  __m512i scl[4];    // [4 chunks][32 words]: 2s + 1 of each 16-value half, as IqDecoded's
};

inline __m512i Lanes4(int a, int b, int c, int d) {
  return _mm512_setr_epi32(a, a, a, a, b, b, b, b, c, c, c, c, d, d, d, d);
}

// The four chunks' sign masks from the 32 entries' 7-bit sign indices (one byte each, entry
// order, bit 7 clear): s | parity(s) << 7 by two nibble lookups.
[[gnu::always_inline]] inline void SignMasks32(__m256i s, IqDecoded512* out) {
  const __m256i nib = _mm256_set1_epi8(0x0F);
  const __m256i par = _mm256_broadcastsi128_si256(_mm_setr_epi8(
      0, -128, -128, 0, -128, 0, 0, -128, -128, 0, 0, -128, 0, -128, -128, 0));  // parity(i) << 7
  const __m256i p =
      _mm256_xor_si256(_mm256_shuffle_epi8(par, _mm256_and_si256(s, nib)),
                       _mm256_shuffle_epi8(par, _mm256_and_si256(_mm256_srli_epi16(s, 4), nib)));
  const __m256i bytes = _mm256_or_si256(s, p);
  const __m128i lo = _mm256_castsi256_si128(bytes), hi = _mm256_extracti128_si256(bytes, 1);
  out->neg[0] = _cvtu64_mask64(static_cast<uint64_t>(_mm_cvtsi128_si64(lo)));
  out->neg[1] = _cvtu64_mask64(static_cast<uint64_t>(_mm_extract_epi64(lo, 1)));
  out->neg[2] = _cvtu64_mask64(static_cast<uint64_t>(_mm_cvtsi128_si64(hi)));
  out->neg[3] = _cvtu64_mask64(static_cast<uint64_t>(_mm_extract_epi64(hi, 1)));
}

// IQ2_XXS / IQ3_XXS: signs and scales from the eight sign words (int32 lane g of sw: group g's
// four 7-bit sign indices, its scale in the top 4 bits).
[[gnu::always_inline]] inline void XxsSignsScales(__m512i sw, IqDecoded512* out) {
  // Byte l of int32 lane g: sign index l of group g (bits 7l..7l+6), so the 32 bytes are the 32
  // entries' indices in order.
  const __m256i w = _mm512_castsi512_si256(sw);
  __m256i s = _mm256_and_si256(w, _mm256_set1_epi32(0x7F));
#pragma GCC unroll 3
  for (int l = 1; l < 4; ++l) {  // (w << l) & field l's byte, ORed in: one vpternlogd
    s = _mm256_ternarylogic_epi32(_mm256_slli_epi32(w, l), _mm256_set1_epi32(0x7F << (8 * l)), s,
                                  0xEA);
  }
  SignMasks32(s, out);
  const __m512i sc =
      _mm512_or_si512(_mm512_slli_epi32(_mm512_srli_epi32(sw, 28), 1), _mm512_set1_epi32(1));
  const __m512i sc2 = _mm512_or_si512(sc, _mm512_slli_epi32(sc, 16));  // both words
#pragma GCC unroll 4
  for (int c = 0; c < 4; ++c) {
    out->scl[c] = _mm512_permutexvar_epi32(Lanes4(2 * c, 2 * c, 2 * c + 1, 2 * c + 1), sc2);
  }
}

[[gnu::always_inline]] inline void IqDecode512(const BlockIQ2_XXS& b, IqDecoded512* out) {
  // 16 bytes k hold groups 2k, 2k + 1: 4 grid indices and a sign word each.
  const __m128i pick = _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, -1, -1, -1, -1, -1, -1, -1, -1);
#pragma GCC unroll 4
  for (int k = 0; k < 4; ++k) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs + 8 * k));
    const __m256i idx = _mm256_cvtepu8_epi32(_mm_shuffle_epi8(v, pick));
    out->u[k] = _mm512_i32gather_epi64(idx, kIq2xxsGrid.data(), 8);
  }
  const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 1, 3, 5, 7, 9, 11, 13, 15);
  XxsSignsScales(_mm512_permutexvar_epi32(odd, _mm512_loadu_si512(b.qs)), out);
}

[[gnu::always_inline]] inline void IqDecode512(const BlockIQ3_XXS& b, IqDecoded512* out) {
#pragma GCC unroll 4
  for (int c = 0; c < 4; ++c) {  // one byte index per 4 values
    const __m512i idx =
        _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs + 16 * c)));
    out->u[c] = _mm512_i32gather_epi32(idx, kIq3xxsGrid.data(), 4);
  }
  XxsSignsScales(
      _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs + 64))), out);
}

// IQ3_S: entry e (4 values) of group g indexes the grid by qs[8g + e] and bit e of qh[g] as bit 8;
// explicit sign bits (bit j of signs[4g..4g+3] negates value 32g + j); one scale per group.
[[gnu::always_inline]] inline void IqDecode512(const BlockIQ3_S& b, IqDecoded512* out) {
  const __m512i bit = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
#pragma GCC unroll 4
  for (int c = 0; c < 4; ++c) {  // entries 16c..16c+15: groups 2c, 2c + 1
    uint16_t qh16;
    std::memcpy(&qh16, b.qh + 2 * c, sizeof(qh16));
    const __m512i high = _mm512_slli_epi32(
        _mm512_and_si512(_mm512_srlv_epi32(_mm512_set1_epi32(qh16), bit), _mm512_set1_epi32(1)), 8);
    const __m512i idx = _mm512_or_si512(
        _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs + 16 * c))),
        high);
    out->u[c] = _mm512_i32gather_epi32(idx, kIq3sGrid.data(), 4);
    uint64_t signs;
    std::memcpy(&signs, b.signs + 8 * c, sizeof(signs));
    out->neg[c] = _cvtu64_mask64(signs);
  }
  uint32_t sc4;
  std::memcpy(&sc4, b.scales, sizeof(sc4));
  // int32 lane g: 2s + 1 of group g in both words.
  const __m512i nib = _mm512_and_si512(
      _mm512_srlv_epi32(_mm512_set1_epi32(static_cast<int>(sc4)),
                        _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 0, 0, 0, 0, 0, 0, 0)),
      _mm512_set1_epi32(0xF));
  const __m512i sc = _mm512_or_si512(_mm512_slli_epi32(nib, 1), _mm512_set1_epi32(1));
  const __m512i sc2 = _mm512_or_si512(sc, _mm512_slli_epi32(sc, 16));
#pragma GCC unroll 4
  for (int c = 0; c < 4; ++c) {
    out->scl[c] = _mm512_permutexvar_epi32(Lanes4(2 * c, 2 * c, 2 * c + 1, 2 * c + 1), sc2);
  }
}

// IQ2_XS / IQ2_S: scales[g] low nibble the scale of values 32g..32g+15, high nibble of
// 32g+16..32g+31.
[[gnu::always_inline]] inline void NibbleScales(const uint8_t* scales, IqDecoded512* out) {
  uint64_t sc8;
  std::memcpy(&sc8, scales, sizeof(sc8));
  // int32 lane 2g: group g's low nibble, 2g + 1 its high nibble; then 2s + 1 in both words.
  const __m512i raw = _mm512_cvtepu8_epi32(_mm_set1_epi64x(static_cast<long long>(sc8)));
  const __m512i nib = _mm512_and_si512(
      _mm512_srlv_epi32(_mm512_permutexvar_epi32(
                            _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7), raw),
                        _mm512_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4)),
      _mm512_set1_epi32(0xF));
  const __m512i sc = _mm512_or_si512(_mm512_slli_epi32(nib, 1), _mm512_set1_epi32(1));
  const __m512i sc2 = _mm512_or_si512(sc, _mm512_slli_epi32(sc, 16));
#pragma GCC unroll 4
  for (int c = 0; c < 4; ++c) {
    out->scl[c] = _mm512_permutexvar_epi32(Lanes4(4 * c, 4 * c + 1, 4 * c + 2, 4 * c + 3), sc2);
  }
}

// IQ2_XS: qs[i] bits 0..8 index the grid for values 8i..8i+7, bits 9..15 their sign index;
// scales[g] low nibble the scale of values 32g..32g+15, high nibble of 32g+16..32g+31.
[[gnu::always_inline]] inline void IqDecode512(const BlockIQ2_XS& b, IqDecoded512* out) {
#pragma GCC unroll 2
  for (int h = 0; h < 2; ++h) {  // entries 16h..16h+15
    const __m512i q =
        _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs + 16 * h)));
    const __m512i idx = _mm512_and_si512(q, _mm512_set1_epi32(511));
    out->u[2 * h] = _mm512_i32gather_epi64(_mm512_castsi512_si256(idx), kIq2xsGrid.data(), 8);
    out->u[2 * h + 1] =
        _mm512_i32gather_epi64(_mm512_extracti64x4_epi64(idx, 1), kIq2xsGrid.data(), 8);
  }
  SignMasks32(_mm512_cvtepi16_epi8(_mm512_srli_epi16(_mm512_loadu_si512(b.qs), 9)), out);
  NibbleScales(b.scales, out);
}

// IQ1: w = 8 * grid + delta, delta -1 in the entries (8 values) whose bit is set in `neg_entries`
// (one bit per entry), else +1; magnitudes and sign masks of the 64 values.
[[gnu::always_inline]] inline void Iq1Chunk(__m256i idx, __mmask8 neg_entries, IqDecoded512* out,
                                            int c) {
  const __m512i grid = _mm512_i32gather_epi64(idx, kIq1Grid8.data(), 8);
  const __m512i delta = _mm512_or_si512(_mm512_movm_epi64(neg_entries), _mm512_set1_epi8(1));
  const __m512i w = _mm512_add_epi8(grid, delta);
  out->u[c] = _mm512_abs_epi8(w);
  out->neg[c] = _mm512_movepi8_mask(w);
}

// 2s + 1 of 16 raw 3-bit scales (int32 lanes, already shifted to bits 0..2) in both words.
inline __m512i Iq1Scales(__m512i raw) {
  const __m512i sc = _mm512_or_si512(
      _mm512_slli_epi32(_mm512_and_si512(raw, _mm512_set1_epi32(7)), 1), _mm512_set1_epi32(1));
  return _mm512_or_si512(sc, _mm512_slli_epi32(sc, 16));
}

// IQ1_S: entry l of group g indexes the grid by qs[4g + l] and bits 3l..3l+2 of qh[g] as bits
// 8..10; qh[g] bits 12..14 are the group's scale, bit 15 its delta's sign.
[[gnu::always_inline]] inline void IqDecode512(const BlockIQ1_S& b, IqDecoded512* out) {
  const __m512i qh = _mm512_cvtepu16_epi32(
      _mm256_zextsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qh))));
  const __m512i thirds = _mm512_setr_epi32(0, 3, 6, 9, 0, 3, 6, 9, 0, 3, 6, 9, 0, 3, 6, 9);
#pragma GCC unroll 2
  for (int h = 0; h < 2; ++h) {  // entries 16h..16h+15: groups 4h..4h+3
    const __m512i rep =
        _mm512_permutexvar_epi32(Lanes4(4 * h, 4 * h + 1, 4 * h + 2, 4 * h + 3), qh);
    const __m512i high = _mm512_slli_epi32(
        _mm512_and_si512(_mm512_srlv_epi32(rep, thirds), _mm512_set1_epi32(7)), 8);
    const __m512i idx = _mm512_or_si512(
        _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs + 16 * h))),
        high);
    const __mmask16 neg = _mm512_test_epi32_mask(rep, _mm512_set1_epi32(0x8000));
    Iq1Chunk(_mm512_castsi512_si256(idx), static_cast<__mmask8>(neg), out, 2 * h);
    Iq1Chunk(_mm512_extracti64x4_epi64(idx, 1), static_cast<__mmask8>(neg >> 8), out, 2 * h + 1);
  }
  const __m512i sc2 = Iq1Scales(_mm512_srli_epi32(qh, 12));  // lane g: group g
#pragma GCC unroll 4
  for (int c = 0; c < 4; ++c) {
    out->scl[c] = _mm512_permutexvar_epi32(Lanes4(2 * c, 2 * c, 2 * c + 1, 2 * c + 1), sc2);
  }
}

// IQ1_M: entry e of chunk c (values 64c + 8e..+7) has nibble e of qh[4c..4c+3]: bits 0..2 the grid
// index's bits 8..10, bit 3 the delta's sign; scale word c holds the four 16-value scales.
[[gnu::always_inline]] inline void IqDecode512(const BlockIQ1_M& b, IqDecoded512* out) {
  const __m256i nibs = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
#pragma GCC unroll 4
  for (int c = 0; c < 4; ++c) {
    uint32_t qh4;
    std::memcpy(&qh4, b.qh + 4 * c, sizeof(qh4));
    const __m256i nib = _mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(qh4)), nibs);
    const __m256i high = _mm256_slli_epi32(_mm256_and_si256(nib, _mm256_set1_epi32(7)), 8);
    const __m256i idx = _mm256_or_si256(
        _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b.qs + 8 * c))),
        high);
    Iq1Chunk(idx, _mm256_test_epi32_mask(nib, _mm256_set1_epi32(8)), out, c);
  }
  // int32 lane 4c + h: scale h (bits 3h..3h+2) of word c, i.e. of values 64c + 16h..+15.
  uint64_t words;
  std::memcpy(&words, b.scales, sizeof(words));
  const __m512i w = _mm512_permutexvar_epi32(
      Lanes4(0, 1, 2, 3), _mm512_cvtepu16_epi32(_mm256_zextsi128_si256(
                              _mm_cvtsi64_si128(static_cast<long long>(words)))));
  const __m512i sc2 = Iq1Scales(
      _mm512_srlv_epi32(w, _mm512_setr_epi32(0, 3, 6, 9, 0, 3, 6, 9, 0, 3, 6, 9, 0, 3, 6, 9)));
#pragma GCC unroll 4
  for (int c = 0; c < 4; ++c) {
    out->scl[c] = _mm512_permutexvar_epi32(Lanes4(4 * c, 4 * c + 1, 4 * c + 2, 4 * c + 3), sc2);
  }
}

// The exact integer sum of one super-block and activation row: per 64 values one masked negate
// of the codes, maddubs with the magnitudes and dpwssd with the scales (int32 lanes).
[[gnu::always_inline]] inline __m512i IqRowSum(const IqDecoded512& dec, const BlockQ8_K& y) {
  const __m512i zero = _mm512_setzero_si512();
  __m512i acc = zero;
#pragma GCC unroll 4
  for (int c = 0; c < 4; ++c) {
    const __m512i q8 = _mm512_loadu_si512(y.qs + 64 * c);
    const __m512i qs = _mm512_mask_sub_epi8(q8, dec.neg[c], zero, q8);
    acc = _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(dec.u[c], qs), dec.scl[c]);
  }
  return acc;
}

// The lane sums of four int32 vectors, in one: {sum(a), sum(b), sum(c), sum(d)}.
[[gnu::always_inline]] inline __m128i ReduceAdd4(__m512i a, __m512i b, __m512i c, __m512i d) {
  const __m512i ab = _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
  const __m512i cd = _mm512_add_epi32(_mm512_unpacklo_epi32(c, d), _mm512_unpackhi_epi32(c, d));
  const __m512i x = _mm512_add_epi32(_mm512_unpacklo_epi64(ab, cd), _mm512_unpackhi_epi64(ab, cd));
  const __m256i y = _mm256_add_epi32(_mm512_castsi512_si256(x), _mm512_extracti64x4_epi64(x, 1));
  return _mm_add_epi32(_mm256_castsi256_si128(y), _mm256_extracti128_si256(y, 1));
}

// IQ2_S: entry e (8 values) of group g indexes the grid by qs[4g + e] and bits 2e, 2e + 1 of
// qh[g] as bits 8, 9; explicit sign bits in qs[32..63] (bit j negates value j).
[[gnu::always_inline]] inline void IqDecode512(const BlockIQ2_S& b, IqDecoded512* out) {
  const __m256i pair = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
#pragma GCC unroll 4
  for (int c = 0; c < 4; ++c) {  // entries 8c..8c+7: groups 2c, 2c + 1
    uint16_t qh16;
    std::memcpy(&qh16, b.qh + 2 * c, sizeof(qh16));
    const __m256i high = _mm256_slli_epi32(
        _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(qh16), pair), _mm256_set1_epi32(3)),
        8);
    const __m256i idx = _mm256_or_si256(
        _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b.qs + 8 * c))),
        high);
    out->u[c] = _mm512_i32gather_epi64(idx, kIq2sGrid.data(), 8);
    uint64_t signs;
    std::memcpy(&signs, b.qs + kQK_K / 8 + 8 * c, sizeof(signs));
    out->neg[c] = _cvtu64_mask64(signs);
  }
  NibbleScales(b.scales, out);
}

// N activation rows against one weight row: per super-block and row the exact integer sum (the
// scalar twin's integer) and its float steps, in the twin's order; rows in fours share one
// reduction and run the float steps lane by lane (the same operations per row, so a row's result
// does not depend on N).
template <typename B, int N>
void IqMultiDot512(int64_t k, const void* w_row, const uint8_t* act, size_t act_row_bytes,
                   float* out) {
  LAMINA_DCHECK(k % kQK_K == 0);
  const auto* x = static_cast<const B*>(w_row);
  constexpr int kQuads = N / 4;
  __m128 sum4[kQuads > 0 ? kQuads : 1];  // [row quad]: rows 4j..4j+3
  float sumf[N];
#pragma GCC unroll 8
  for (int r = 0; r < N; ++r) sumf[r] = 0;
#pragma GCC unroll 2
  for (int j = 0; j < kQuads; ++j) sum4[j] = _mm_setzero_ps();
  auto row = [&](int r, int64_t i) -> const BlockQ8_K& {
    return reinterpret_cast<const BlockQ8_K*>(act + r * act_row_bytes)[i];
  };
  for (int64_t i = 0; i < k / kQK_K; ++i) {
    IqDecoded512 dec;
    IqDecode512(x[i], &dec);
    const float dx = Iq<B>::D(x[i]);
#pragma GCC unroll 2
    for (int j = 0; j < kQuads; ++j) {
      const BlockQ8_K &y0 = row(4 * j, i), &y1 = row(4 * j + 1, i), &y2 = row(4 * j + 2, i),
                      &y3 = row(4 * j + 3, i);
      __m128 isum = _mm_cvtepi32_ps(
          ReduceAdd4(IqRowSum(dec, y0), IqRowSum(dec, y1), IqRowSum(dec, y2), IqRowSum(dec, y3)));
      const __m128 d = _mm_mul_ps(_mm_set1_ps(dx), _mm_setr_ps(y0.d, y1.d, y2.d, y3.d));
      if constexpr (kIsIq1<B>) isum = _mm_mul_ps(isum, _mm_set1_ps(0.125f));
      sum4[j] = _mm_add_ps(sum4[j], _mm_mul_ps(d, isum));
    }
#pragma GCC unroll 4
    for (int r = 4 * kQuads; r < N; ++r) {
      const BlockQ8_K& y = row(r, i);
      const float isum = static_cast<float>(_mm512_reduce_add_epi32(IqRowSum(dec, y)));
      const float d = dx * y.d;
      if constexpr (kIsIq1<B>) {
        sumf[r] += d * (isum * 0.125f);
      } else {
        sumf[r] += d * isum;
      }
    }
  }
#pragma GCC unroll 2
  for (int j = 0; j < kQuads; ++j) _mm_storeu_ps(sumf + 4 * j, sum4[j]);
#pragma GCC unroll 8
  for (int r = 0; r < N; ++r) out[r] = Iq<B>::kFinal * sumf[r];
}

template <typename B>
void IqVecDot512(int64_t k, float* s, const void* w_row, const void* act_row) {
  IqMultiDot512<B, 1>(k, w_row, static_cast<const uint8_t*>(act_row), 0, s);
}

template <typename B>
void IqVecDotMulti512(int64_t k, const void* w_row, const void* act, size_t act_row_bytes,
                      int n_act, float* out) {
  LAMINA_DCHECK(n_act >= 1 && n_act <= kMaxMultiDot);
  const auto* a = static_cast<const uint8_t*>(act);
  switch (n_act) {
    case 1:
      return IqMultiDot512<B, 1>(k, w_row, a, act_row_bytes, out);
    case 2:
      return IqMultiDot512<B, 2>(k, w_row, a, act_row_bytes, out);
    case 3:
      return IqMultiDot512<B, 3>(k, w_row, a, act_row_bytes, out);
    case 4:
      return IqMultiDot512<B, 4>(k, w_row, a, act_row_bytes, out);
    case 5:
      return IqMultiDot512<B, 5>(k, w_row, a, act_row_bytes, out);
    case 6:
      return IqMultiDot512<B, 6>(k, w_row, a, act_row_bytes, out);
    case 7:
      return IqMultiDot512<B, 7>(k, w_row, a, act_row_bytes, out);
    default:
      return IqMultiDot512<B, 8>(k, w_row, a, act_row_bytes, out);
  }
}

template <typename B>
void SetIq512(KernelTable& table, GgmlType type) {
  TypeKernels& e = table[static_cast<int>(type)];
  e.vec_dot = IqVecDot512<B>;
  e.vec_dot_multi = IqVecDotMulti512<B>;
}

}  // namespace

void RegisterAvx512IQuants(KernelTable& table) {
  SetIq512<BlockIQ2_XXS>(table, GgmlType::kIQ2_XXS);
  SetIq512<BlockIQ2_XS>(table, GgmlType::kIQ2_XS);
  SetIq512<BlockIQ2_S>(table, GgmlType::kIQ2_S);
  SetIq512<BlockIQ3_XXS>(table, GgmlType::kIQ3_XXS);
  SetIq512<BlockIQ3_S>(table, GgmlType::kIQ3_S);
  SetIq512<BlockIQ1_S>(table, GgmlType::kIQ1_S);
  SetIq512<BlockIQ1_M>(table, GgmlType::kIQ1_M);
}

}  // namespace lamina::quant_internal
