// AVX-512 (BW + VL + VNNI) kernels of the interleaved lattice i-quants (BlockIQ2_XXSx16,
// BlockIQ2_XSx16, BlockIQ2_Sx16, BlockIQ3_XXSx16, BlockIQ3_Sx16, BlockIQ1_Sx16, BlockIQ1_Mx16
// against Q8_K): int32 lane r of every register is
// weight row r. Per 16-value half of a super-block the 16 rows' weights are decoded once into four
// registers (4 values per lane, as bytes w + 128: grid entries by one gather per register, or two
// for 8-value entries, signs by a masked subtract) and a register of the rows' scales 2s + 1;
// each token then costs four vpdpbusd against its four broadcast activation words, started from
// -128 * bsum (which removes the +128) and one multiply by the scales. The per-row integer is thus
// the row kernels' exact sum, and the float steps (d * d_a, times the integer, added per
// super-block, times the final factor) are theirs, lane by lane: every output is the scalar
// vec_dot's bits (iquants.cpp), whatever the batch.

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

#include "quant/interleaved_iquants.h"
#include "quant/iq_grids.h"
#include "quant/kernel_registry.h"
#include "quant/quant.h"
#include "quant/types.h"
#include "util/check.h"

namespace lamina::quant_internal {
namespace {

constexpr int kRows = kQ8_0x16Rows;

// One half (16 values) of a super-block for the 16 rows.
struct Half {
  __m512i w[4];   // [4 positions][16 rows]: int32 lane r = row r's 4 values, bytes w + 128
  __m512i scale;  // [16 rows]: 2s + 1
};

inline __m512i Load128x(const uint8_t* p) {  // 16 bytes widened to 16 int32 lanes
  return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// Bytes holding 7-bit sign indices s (bit 7 clear) completed to their 8 sign bits s | parity(s)
// << 7 by two nibble lookups.
[[gnu::always_inline]] inline __m512i SignBytes(__m512i s) {
  const __m512i nib = _mm512_set1_epi8(0x0F);
  const __m512i par = _mm512_broadcast_i32x4(_mm_setr_epi8(
      0, -128, -128, 0, -128, 0, 0, -128, -128, 0, 0, -128, 0, -128, -128, 0));  // parity(i) << 7
  const __m512i p =
      _mm512_xor_si512(_mm512_shuffle_epi8(par, _mm512_and_si512(s, nib)),
                       _mm512_shuffle_epi8(par, _mm512_and_si512(_mm512_srli_epi16(s, 4), nib)));
  return _mm512_or_si512(s, p);
}

// The negative-weight masks of the two positions of entry l (8 values) whose sign byte is byte l
// of each int32 lane of sb: bit 4r + j of *lo (*hi) set when value j (4 + j) of row r is negative.
[[gnu::always_inline]] inline void EntryMasks(__m512i sb, int l, __mmask64* lo, __mmask64* hi) {
  const __m512i ctrl = _mm512_add_epi8(
      _mm512_broadcast_i32x4(_mm_setr_epi8(0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12)),
      _mm512_set1_epi8(static_cast<char>(l)));
  const __m512i rep = _mm512_shuffle_epi8(sb, ctrl);  // byte l of each lane, in all 4 bytes
  *lo = _mm512_test_epi8_mask(rep, _mm512_set1_epi32(0x08040201));
  *hi = _mm512_test_epi8_mask(rep, _mm512_set1_epi32(static_cast<int>(0x80402010u)));
}

// Magnitudes u (< 128) with the signs of neg, as bytes w + 128.
[[gnu::always_inline]] inline __m512i Offset(__m512i u, __mmask64 neg) {
  const __m512i c128 = _mm512_set1_epi8(static_cast<char>(0x80));
  return _mm512_mask_sub_epi8(_mm512_xor_si512(u, c128), neg, c128, u);
}

// 2s + 1 of 4-bit scales in int32 lanes (bits above the nibble masked off).
[[gnu::always_inline]] inline __m512i OddScale(__m512i s) {
  return _mm512_or_si512(_mm512_slli_epi32(_mm512_and_si512(s, _mm512_set1_epi32(0xF)), 1),
                         _mm512_set1_epi32(1));
}

// IQ2_XXS / IQ3_XXS: group g's sign bytes (byte l of lane r: row r's entry l) and scales from
// its 16 sign/scale words.
[[gnu::always_inline]] inline __m512i XxsSigns(const uint32_t* sw, __m512i* scale) {
  const __m512i w = _mm512_loadu_si512(sw);
  __m512i s = _mm512_and_si512(w, _mm512_set1_epi32(0x7F));
#pragma GCC unroll 3
  for (int l = 1; l < 4; ++l) {  // (w << l) & field l's byte, ORed in: one vpternlogd
    s = _mm512_ternarylogic_epi32(_mm512_slli_epi32(w, l), _mm512_set1_epi32(0x7F << (8 * l)), s,
                                  0xEA);
  }
  *scale = OddScale(_mm512_srli_epi32(w, 28));
  return SignBytes(s);
}

// An 8-value entry's grid entries of the 16 rows (indices idx[r], uint64 entries) as its two
// positions: *lo int32 lane r = row r's values 0..3, *hi its values 4..7.
[[gnu::always_inline]] inline void Gather8(__m512i idx, const uint64_t* grid, __m512i* lo,
                                           __m512i* hi) {
  const __m512i a = _mm512_i32gather_epi64(_mm512_castsi512_si256(idx), grid, 8);  // rows 0..7
  const __m512i b = _mm512_i32gather_epi64(_mm512_extracti64x4_epi64(idx, 1), grid, 8);
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  *lo = _mm512_permutex2var_epi32(a, even, b);
  *hi = _mm512_permutex2var_epi32(a, _mm512_add_epi32(even, _mm512_set1_epi32(1)), b);
}

[[gnu::always_inline]] inline void DecodeHalf(const BlockIQ3_XXSx16& b, int h, Half* out) {
  const int g = h / 2;
  const __m512i sb = XxsSigns(b.sw + kRows * g, &out->scale);
#pragma GCC unroll 2
  for (int e = 0; e < 2; ++e) {
    const int l = 2 * (h % 2) + e;  // entry l of the group: positions 8g + 2l, +1
    __mmask64 neg[2];
    EntryMasks(sb, l, &neg[0], &neg[1]);
#pragma GCC unroll 2
    for (int j = 0; j < 2; ++j) {
      const __m512i u = _mm512_i32gather_epi32(Load128x(b.grid + kRows * (8 * g + 2 * l + j)),
                                               kIq3xxsGrid.data(), 4);
      out->w[2 * e + j] = Offset(u, neg[j]);
    }
  }
}

[[gnu::always_inline]] inline void DecodeHalf(const BlockIQ3_Sx16& b, int h, Half* out) {
  const int g = h / 2;
  const __m512i qh = Load128x(b.qh + kRows * g);
  out->scale = OddScale(_mm512_srli_epi32(_mm512_loadu_si512(b.scales), 4 * g));
#pragma GCC unroll 2
  for (int e = 0; e < 2; ++e) {
    const int l = 2 * (h % 2) + e;  // entry 4g + l: positions 8g + 2l, +1
    __mmask64 neg[2];
    EntryMasks(Load128x(b.signs + kRows * (4 * g + l)), 0, &neg[0], &neg[1]);
#pragma GCC unroll 2
    for (int j = 0; j < 2; ++j) {
      const int p = 8 * g + 2 * l + j;
      const __m512i high = _mm512_slli_epi32(
          _mm512_and_si512(_mm512_srli_epi32(qh, 2 * l + j), _mm512_set1_epi32(1)), 8);
      const __m512i idx = _mm512_or_si512(Load128x(b.grid + kRows * p), high);
      out->w[2 * e + j] = Offset(_mm512_i32gather_epi32(idx, kIq3sGrid.data(), 4), neg[j]);
    }
  }
}

[[gnu::always_inline]] inline void DecodeHalf(const BlockIQ2_XXSx16& b, int h, Half* out) {
  const int g = h / 2;
  const __m512i sb = XxsSigns(b.sw + kRows * g, &out->scale);
#pragma GCC unroll 2
  for (int e = 0; e < 2; ++e) {
    const int l = 2 * (h % 2) + e;  // entry 4g + l
    __mmask64 neg[2];
    EntryMasks(sb, l, &neg[0], &neg[1]);
    __m512i u[2];
    Gather8(Load128x(b.grid + kRows * (4 * g + l)), kIq2xxsGrid.data(), &u[0], &u[1]);
    out->w[2 * e] = Offset(u[0], neg[0]);
    out->w[2 * e + 1] = Offset(u[1], neg[1]);
  }
}

[[gnu::always_inline]] inline void DecodeHalf(const BlockIQ2_XSx16& b, int h, Half* out) {
  const int g = h / 2;
  const __m512i sc = Load128x(b.scales + kRows * g);  // low nibble: half 2g, high: 2g + 1
  out->scale = OddScale(_mm512_srli_epi32(sc, 4 * (h % 2)));
#pragma GCC unroll 2
  for (int e = 0; e < 2; ++e) {
    const int entry = 2 * h + e;
    const __m512i q = _mm512_cvtepu16_epi32(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs + kRows * entry)));
    __mmask64 neg[2];
    EntryMasks(SignBytes(_mm512_srli_epi32(q, 9)), 0, &neg[0], &neg[1]);
    __m512i u[2];
    Gather8(_mm512_and_si512(q, _mm512_set1_epi32(511)), kIq2xsGrid.data(), &u[0], &u[1]);
    out->w[2 * e] = Offset(u[0], neg[0]);
    out->w[2 * e + 1] = Offset(u[1], neg[1]);
  }
}

[[gnu::always_inline]] inline void DecodeHalf(const BlockIQ2_Sx16& b, int h, Half* out) {
  const int g = h / 2;
  const __m512i qh = Load128x(b.qh + kRows * g);
  out->scale = OddScale(_mm512_srli_epi32(Load128x(b.scales + kRows * g), 4 * (h % 2)));
#pragma GCC unroll 2
  for (int e = 0; e < 2; ++e) {
    const int l = 2 * (h % 2) + e;  // entry 4g + l = 2h + e
    __mmask64 neg[2];
    EntryMasks(Load128x(b.signs + kRows * (2 * h + e)), 0, &neg[0], &neg[1]);
    const __m512i high =
        _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(qh, 2 * l), _mm512_set1_epi32(3)), 8);
    __m512i u[2];
    Gather8(_mm512_or_si512(Load128x(b.grid + kRows * (2 * h + e)), high), kIq2sGrid.data(), &u[0],
            &u[1]);
    out->w[2 * e] = Offset(u[0], neg[0]);
    out->w[2 * e + 1] = Offset(u[1], neg[1]);
  }
}

// IQ1: entries of kIq1Grid8Delta (8 * grid + delta, index | negative delta << 11) as bytes w + 128.
[[gnu::always_inline]] inline void Iq1Entry(__m512i idx, Half* out, int e) {
  const __m512i c128 = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512i u[2];
  Gather8(idx, kIq1Grid8Delta.data(), &u[0], &u[1]);
  out->w[2 * e] = _mm512_xor_si512(u[0], c128);
  out->w[2 * e + 1] = _mm512_xor_si512(u[1], c128);
}

[[gnu::always_inline]] inline void DecodeHalf(const BlockIQ1_Sx16& b, int h, Half* out) {
  const int g = h / 2;
  const __m512i qh =
      _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qh + kRows * g)));
  out->scale = OddScale(_mm512_and_si512(_mm512_srli_epi32(qh, 12), _mm512_set1_epi32(7)));
  const __m512i neg = _mm512_srli_epi32(_mm512_and_si512(qh, _mm512_set1_epi32(0x8000)), 4);
#pragma GCC unroll 2
  for (int e = 0; e < 2; ++e) {
    const int l = 2 * (h % 2) + e;  // entry 4g + l = 2h + e
    const __m512i high =
        _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(qh, 3 * l), _mm512_set1_epi32(7)), 8);
    Iq1Entry(_mm512_ternarylogic_epi32(Load128x(b.grid + kRows * (2 * h + e)), high, neg, 0xFE),
             out, e);
  }
}

[[gnu::always_inline]] inline void DecodeHalf(const BlockIQ1_Mx16& b, int h, Half* out) {
  const __m512i sc = _mm512_cvtepu16_epi32(
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.scales + kRows * (h / 4))));
  out->scale = OddScale(_mm512_and_si512(_mm512_srli_epi32(sc, 3 * (h % 4)), _mm512_set1_epi32(7)));
  const __m512i qh = Load128x(b.qh + kRows * h);  // entries 2h, 2h + 1: low, high nibble
#pragma GCC unroll 2
  for (int e = 0; e < 2; ++e) {
    // nibble bits 0..2 are index bits 8..10 and bit 3 the negative delta (index bit 11)
    const __m512i nib = _mm512_and_si512(_mm512_srli_epi32(qh, 4 * e), _mm512_set1_epi32(0xF));
    Iq1Entry(_mm512_or_si512(Load128x(b.grid + kRows * (2 * h + e)), _mm512_slli_epi32(nib, 8)),
             out, e);
  }
}

// The 16 rows' d as floats.
template <typename X>
[[gnu::always_inline]] inline __m512 LoadD(const X& b) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.d)));
}
// IQ1_M: the top nibbles of the four scale words, word 0's lowest.
template <>
[[gnu::always_inline]] inline __m512 LoadD(const BlockIQ1_Mx16& b) {
  __m256i s[4];  // [word][16 rows]
  for (int w = 0; w < 4; ++w) {
    s[w] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.scales + kRows * w));
  }
  const __m256i top = _mm256_set1_epi16(static_cast<int16_t>(0xF000));
  const __m256i lo = _mm256_or_si256(_mm256_srli_epi16(s[0], 12),
                                     _mm256_srli_epi16(_mm256_and_si256(s[1], top), 8));
  const __m256i hi = _mm256_or_si256(_mm256_srli_epi16(_mm256_and_si256(s[2], top), 4),
                                     _mm256_and_si256(s[3], top));
  return _mm512_cvtph_ps(_mm256_or_si256(lo, hi));
}

template <typename X>
constexpr bool kIq1 = std::is_same_v<X, BlockIQ1_Sx16> || std::is_same_v<X, BlockIQ1_Mx16>;

// d * (the super-block's integer), IQ1's integer first divided by 8 (exact), as the scalar
// vec_dot.
template <typename X>
[[gnu::always_inline]] inline __m512 Scaled(__m512 d, __m512i isum) {
  const __m512 f = _mm512_cvtepi32_ps(isum);
  if constexpr (kIq1<X>) {
    return _mm512_mul_ps(d, _mm512_mul_ps(f, _mm512_set1_ps(0.125f)));
  } else {
    return _mm512_mul_ps(d, f);
  }
}

template <typename X>
constexpr float kFinal = std::is_same_v<X, BlockIQ3_Sx16> || kIq1<X> ? 1.0f
                         : std::is_same_v<X, BlockIQ3_XXSx16>        ? 0.25f
                                                                     : 0.125f;

inline int32_t Load32(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// The 16 rows of the group against N tokens: per super-block and token the exact integer of
// every row (sum over halves of (2s + 1) * dot), then the float steps of the scalar vec_dot.
template <typename X, int N>
void GemmN(int64_t k, const X* w, const uint8_t* act, size_t act_row_bytes, float* out,
           size_t out_stride) {
  const BlockQ8_K* y[N];  // [token]: its row of super-blocks
#pragma GCC unroll 8
  for (int t = 0; t < N; ++t) y[t] = reinterpret_cast<const BlockQ8_K*>(act + t * act_row_bytes);
  __m512 sumf[N];  // [token][16 rows]
#pragma GCC unroll 8
  for (int t = 0; t < N; ++t) sumf[t] = _mm512_setzero_ps();
  for (int64_t i = 0; i < k / kQK_K; ++i) {
    alignas(64) int32_t nbs[N][kQK_K / 16];  // [token][half]: -128 * bsums, the +128's share
    __m512i isum[N];                         // [token][16 rows]
#pragma GCC unroll 8
    for (int t = 0; t < N; ++t) {
      const __m512i bs = _mm512_cvtepi16_epi32(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[t][i].bsums)));
      _mm512_store_si512(nbs[t],
                         _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(bs, 7)));
      isum[t] = _mm512_setzero_si512();
    }
    for (int h = 0; h < kQK_K / 16; ++h) {
      Half half;
      DecodeHalf(w[i], h, &half);
#pragma GCC unroll 8
      for (int t = 0; t < N; ++t) {
        const int8_t* q = y[t][i].qs + 16 * h;
        __m512i acc = _mm512_set1_epi32(nbs[t][h]);
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j) {
          acc = _mm512_dpbusd_epi32(acc, half.w[j], _mm512_set1_epi32(Load32(q + 4 * j)));
        }
        isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(acc, half.scale));
      }
    }
    const __m512 dx = LoadD(w[i]);
#pragma GCC unroll 8
    for (int t = 0; t < N; ++t) {
      const __m512 d = _mm512_mul_ps(dx, _mm512_set1_ps(y[t][i].d));
      sumf[t] = _mm512_add_ps(sumf[t], Scaled<X>(d, isum[t]));
    }
  }
#pragma GCC unroll 8
  for (int t = 0; t < N; ++t) {
    _mm512_storeu_ps(out + t * out_stride, _mm512_mul_ps(_mm512_set1_ps(kFinal<X>), sumf[t]));
  }
}

// More than 8 tokens (up to kLatticeGemmTokens): GemmN's steps with the tokens' sums in
// memory, so each half's decode serves every token of the call.
template <typename X>
void GemmMany(int64_t k, const X* w, const uint8_t* act, size_t act_row_bytes, int n, float* out,
              size_t out_stride) {
  alignas(64) float sumf[kLatticeGemmTokens][kRows];        // [token][16 rows]
  alignas(64) int32_t isum[kLatticeGemmTokens][kRows];      // [token][16 rows]
  alignas(64) int32_t nbs[kLatticeGemmTokens][kQK_K / 16];  // [token][half]: -128 * bsums
  auto row = [&](int t) { return reinterpret_cast<const BlockQ8_K*>(act + t * act_row_bytes); };
  for (int t = 0; t < n; ++t) _mm512_store_ps(sumf[t], _mm512_setzero_ps());
  for (int64_t i = 0; i < k / kQK_K; ++i) {
    for (int t = 0; t < n; ++t) {
      const __m512i bs = _mm512_cvtepi16_epi32(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row(t)[i].bsums)));
      _mm512_store_si512(nbs[t],
                         _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(bs, 7)));
      _mm512_store_si512(isum[t], _mm512_setzero_si512());
    }
    for (int h = 0; h < kQK_K / 16; ++h) {
      Half half;
      DecodeHalf(w[i], h, &half);
      for (int t = 0; t < n; ++t) {
        const int8_t* q = row(t)[i].qs + 16 * h;
        __m512i acc = _mm512_set1_epi32(nbs[t][h]);
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j) {
          acc = _mm512_dpbusd_epi32(acc, half.w[j], _mm512_set1_epi32(Load32(q + 4 * j)));
        }
        _mm512_store_si512(isum[t], _mm512_add_epi32(_mm512_load_si512(isum[t]),
                                                     _mm512_mullo_epi32(acc, half.scale)));
      }
    }
    const __m512 dx = LoadD(w[i]);
    for (int t = 0; t < n; ++t) {
      const __m512 d = _mm512_mul_ps(dx, _mm512_set1_ps(row(t)[i].d));
      _mm512_store_ps(sumf[t], _mm512_add_ps(_mm512_load_ps(sumf[t]),
                                             Scaled<X>(d, _mm512_load_si512(isum[t]))));
    }
  }
  for (int t = 0; t < n; ++t) {
    _mm512_storeu_ps(out + t * out_stride,
                     _mm512_mul_ps(_mm512_set1_ps(kFinal<X>), _mm512_load_ps(sumf[t])));
  }
}

template <typename X>
void Gemm(int64_t k, const void* group, const void* act, size_t act_row_bytes, int n_act,
          float* out, size_t out_stride) {
  LAMINA_DCHECK(k % kQK_K == 0 && n_act >= 1 && n_act <= kLatticeGemmTokens);
  const auto* w = static_cast<const X*>(group);
  const auto* a = static_cast<const uint8_t*>(act);
  switch (n_act) {
    case 1:
      return GemmN<X, 1>(k, w, a, act_row_bytes, out, out_stride);
    case 2:
      return GemmN<X, 2>(k, w, a, act_row_bytes, out, out_stride);
    case 3:
      return GemmN<X, 3>(k, w, a, act_row_bytes, out, out_stride);
    case 4:
      return GemmN<X, 4>(k, w, a, act_row_bytes, out, out_stride);
    case 5:
      return GemmN<X, 5>(k, w, a, act_row_bytes, out, out_stride);
    case 6:
      return GemmN<X, 6>(k, w, a, act_row_bytes, out, out_stride);
    case 7:
      return GemmN<X, 7>(k, w, a, act_row_bytes, out, out_stride);
    case 8:
      return GemmN<X, 8>(k, w, a, act_row_bytes, out, out_stride);
    default:
      return GemmMany<X>(k, w, a, act_row_bytes, n_act, out, out_stride);
  }
}

}  // namespace

void RegisterAvx512InterleavedIq(KernelTable& table) {
  RegisterScalarInterleavedIq(table);  // the AVX2 file turned the layouts off
  table[static_cast<int>(GgmlType::kIQ2_XXS)].gemm_interleaved = Gemm<BlockIQ2_XXSx16>;
  table[static_cast<int>(GgmlType::kIQ2_XS)].gemm_interleaved = Gemm<BlockIQ2_XSx16>;
  table[static_cast<int>(GgmlType::kIQ3_XXS)].gemm_interleaved = Gemm<BlockIQ3_XXSx16>;
  table[static_cast<int>(GgmlType::kIQ3_S)].gemm_interleaved = Gemm<BlockIQ3_Sx16>;
  table[static_cast<int>(GgmlType::kIQ2_S)].gemm_interleaved = Gemm<BlockIQ2_Sx16>;
  table[static_cast<int>(GgmlType::kIQ1_S)].gemm_interleaved = Gemm<BlockIQ1_Sx16>;
  table[static_cast<int>(GgmlType::kIQ1_M)].gemm_interleaved = Gemm<BlockIQ1_Mx16>;
}

}  // namespace lamina::quant_internal
