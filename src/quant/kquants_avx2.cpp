// AVX2 K-quant dot products (Q2_K..Q6_K, IQ4_XS, TQ1_0 and TQ2_0 against Q8_K). Each weight
// super-block is decoded once into 256 codes plus per-group scales, then reused for up to
// kMaxMultiDot activation rows; that reuse is what makes prompt processing fast. Integer sums are
// exact, so results differ from the scalar twins only in float summation order.
#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "quant/kernel_registry.h"
#include "quant/quant.h"
#include "quant/types.h"
#include "util/check.h"

namespace lamina::quant_internal {
namespace {

#include "quant/kquants_shared.inc"

// One decoded weight super-block. Value of element e is w[e] (0..63) combined with its group scale
// through scl; the group offset (a min, or the constant bias of a signed format) goes through the
// activation's bsums: dot = d * (sum scl*w*q8 - [int offset] bsums*bs_mul) - dmin * bsums*bs_mul.
struct Decoded {
  __m256i w[8];    // codes of elements 32k..32k+31, unsigned
  __m256i scl[8];  // int16 multiplier for each maddubs output word of w[k]
  __m256i bs_mul;  // int16 multiplier for each of the 16 bsums
  float d;
  float dmin;  // only for formats with a float min term
};

// For 16-value groups: register k covers groups 2k (low 128-bit lane) and 2k+1 (high lane), so its
// multiplier is scales16[2k] broadcast in the low lane and scales16[2k+1] in the high lane.
[[gnu::always_inline]] inline void GroupScales16(__m256i scales16, __m256i* scl) {
  const __m256i lo = _mm256_permute2x128_si256(scales16, scales16, 0x00);
  const __m256i hi = _mm256_permute2x128_si256(scales16, scales16, 0x11);
#pragma GCC unroll 8
  for (int k = 0; k < 4; ++k) {
    const char a = static_cast<char>(4 * k), b = static_cast<char>(4 * k + 2);
    const __m256i ctrl = _mm256_setr_epi8(a, a + 1, a, a + 1, a, a + 1, a, a + 1, a, a + 1, a,
                                          a + 1, a, a + 1, a, a + 1, b, b + 1, b, b + 1, b, b + 1,
                                          b, b + 1, b, b + 1, b, b + 1, b, b + 1, b, b + 1);
    scl[k] = _mm256_shuffle_epi8(lo, ctrl);
    scl[k + 4] = _mm256_shuffle_epi8(hi, ctrl);
  }
}

// Q4_K/Q5_K: one scale per 32-value group (one register each); mins repeat over two bsums.
[[gnu::always_inline]] inline void ScalesMinsK4(const uint8_t* packed, Decoded* out) {
  const __m128i sm = UnpackScaleMinK4(packed);
  const __m256i scales = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sm));
#pragma GCC unroll 8
  for (int k = 0; k < 8; ++k) {
    const char a = static_cast<char>(2 * k), b = static_cast<char>(2 * k + 1);
    const __m256i ctrl = _mm256_setr_epi8(a, b, a, b, a, b, a, b, a, b, a, b, a, b, a, b, a, b, a,
                                          b, a, b, a, b, a, b, a, b, a, b, a, b);
    out->scl[k] = _mm256_shuffle_epi8(scales, ctrl);
  }
  const __m128i mins = _mm_cvtepu8_epi16(_mm_srli_si128(sm, 8));
  out->bs_mul = _mm256_setr_m128i(_mm_unpacklo_epi16(mins, mins), _mm_unpackhi_epi16(mins, mins));
}

struct Q2K {
  using Block = BlockQ2_K;
  static constexpr bool kIntOffset = false;
  [[gnu::always_inline]] static void Decode(const Block& b, Decoded* out) {
    const __m256i m3 = _mm256_set1_epi8(3);
#pragma GCC unroll 8
    for (int h = 0; h < 2; ++h) {
      const __m256i q = Load256(b.qs + 32 * h);
      out->w[4 * h + 0] = _mm256_and_si256(q, m3);
      out->w[4 * h + 1] = _mm256_and_si256(_mm256_srli_epi16(q, 2), m3);
      out->w[4 * h + 2] = _mm256_and_si256(_mm256_srli_epi16(q, 4), m3);
      out->w[4 * h + 3] = _mm256_and_si256(_mm256_srli_epi16(q, 6), m3);
    }
    const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.scales));
    const __m128i m4 = _mm_set1_epi8(0xF);
    GroupScales16(_mm256_cvtepu8_epi16(_mm_and_si128(sc, m4)), out->scl);
    out->bs_mul = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc, 4), m4));
    out->d = HalfToFloat(b.d);
    out->dmin = HalfToFloat(b.dmin);
  }
};

struct Q3K {
  using Block = BlockQ3_K;
  static constexpr bool kIntOffset = true;
  [[gnu::always_inline]] static void Decode(const Block& b, Decoded* out) {
    const __m256i m3 = _mm256_set1_epi8(3);
    const __m256i m4 = _mm256_set1_epi8(4);
    const __m256i hm = Load256(b.hmask);
#pragma GCC unroll 8
    for (int h = 0; h < 2; ++h) {
      const __m256i q = Load256(b.qs + 32 * h);
#pragma GCC unroll 8
      for (int j = 0; j < 4; ++j) {
        // Code u = q2 + 4*hbit in 0..7; the -4 bias goes through bsums.
        const __m256i q2 = _mm256_and_si256(_mm256_srl_epi16(q, _mm_cvtsi32_si128(2 * j)), m3);
        const __m256i hb = _mm256_srl_epi16(hm, _mm_cvtsi32_si128(4 * h + j));
        out->w[4 * h + j] = _mm256_or_si256(q2, _mm256_and_si256(_mm256_slli_epi16(hb, 2), m4));
      }
    }
    constexpr uint32_t kMask1 = 0x03030303, kMask2 = 0x0f0f0f0f;
    uint32_t aux[3];
    std::memcpy(aux, b.scales, 12);
    // Assembled in registers (a vector reload of freshly stored words would stall).
    const __m128i raw = _mm_setr_epi32(
        static_cast<int>((aux[0] & kMask2) | (((aux[2] >> 0) & kMask1) << 4)),
        static_cast<int>((aux[1] & kMask2) | (((aux[2] >> 2) & kMask1) << 4)),
        static_cast<int>(((aux[0] >> 4) & kMask2) | (((aux[2] >> 4) & kMask1) << 4)),
        static_cast<int>(((aux[1] >> 4) & kMask2) | (((aux[2] >> 6) & kMask1) << 4)));
    const __m256i scales16 = _mm256_sub_epi16(_mm256_cvtepu8_epi16(raw), _mm256_set1_epi16(32));
    GroupScales16(scales16, out->scl);
    out->bs_mul = _mm256_slli_epi16(scales16, 2);
    out->d = HalfToFloat(b.d);
    out->dmin = 0;
  }
};

struct Q4K {
  using Block = BlockQ4_K;
  static constexpr bool kIntOffset = false;
  [[gnu::always_inline]] static void Decode(const Block& b, Decoded* out) {
    const __m256i m4 = _mm256_set1_epi8(0xF);
#pragma GCC unroll 8
    for (int c = 0; c < 4; ++c) {
      const __m256i q = Load256(b.qs + 32 * c);
      out->w[2 * c] = _mm256_and_si256(q, m4);
      out->w[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
    }
    ScalesMinsK4(b.scales, out);
    out->d = HalfToFloat(b.d);
    out->dmin = HalfToFloat(b.dmin);
  }
};

struct Q5K {
  using Block = BlockQ5_K;
  static constexpr bool kIntOffset = false;
  [[gnu::always_inline]] static void Decode(const Block& b, Decoded* out) {
    const __m256i m4 = _mm256_set1_epi8(0xF);
    const __m256i m16 = _mm256_set1_epi8(0x10);
    const __m256i qh = Load256(b.qh);
#pragma GCC unroll 8
    for (int c = 0; c < 4; ++c) {
      const __m256i q = Load256(b.qs + 32 * c);
      // Bit 2c of qh is the fifth bit of the low nibbles, bit 2c+1 of the high nibbles.
      const __m256i h = _mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * c));
      out->w[2 * c] =
          _mm256_or_si256(_mm256_and_si256(q, m4), _mm256_and_si256(_mm256_slli_epi16(h, 4), m16));
      out->w[2 * c + 1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4),
                                          _mm256_and_si256(_mm256_slli_epi16(h, 3), m16));
    }
    ScalesMinsK4(b.scales, out);
    out->d = HalfToFloat(b.d);
    out->dmin = HalfToFloat(b.dmin);
  }
};

struct Q6K {
  using Block = BlockQ6_K;
  static constexpr bool kIntOffset = true;
  [[gnu::always_inline]] static void Decode(const Block& b, Decoded* out) {
    const __m256i m4 = _mm256_set1_epi8(0xF);
    const __m256i m48 = _mm256_set1_epi8(0x30);
#pragma GCC unroll 8
    for (int h = 0; h < 2; ++h) {
      const __m256i ql0 = Load256(b.ql + 64 * h);
      const __m256i ql1 = Load256(b.ql + 64 * h + 32);
      const __m256i qh = Load256(b.qh + 32 * h);
      // Code u = q6 in 0..63; the -32 bias goes through bsums.
      out->w[4 * h + 0] = _mm256_or_si256(_mm256_and_si256(ql0, m4),
                                          _mm256_and_si256(_mm256_slli_epi16(qh, 4), m48));
      out->w[4 * h + 1] = _mm256_or_si256(_mm256_and_si256(ql1, m4),
                                          _mm256_and_si256(_mm256_slli_epi16(qh, 2), m48));
      out->w[4 * h + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                                          _mm256_and_si256(qh, m48));
      out->w[4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                                          _mm256_and_si256(_mm256_srli_epi16(qh, 2), m48));
    }
    const __m256i scales16 =
        _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.scales)));
    GroupScales16(scales16, out->scl);
    out->bs_mul = _mm256_slli_epi16(scales16, 5);
    out->d = HalfToFloat(b.d);
    out->dmin = 0;
  }
};

// sum over the super-block of scale * code * activation, in eight int32 lanes.
[[gnu::always_inline]] inline __m256i CodeSums(const Decoded& dec, const BlockQ8_K& y) {
  __m256i isum0 = _mm256_setzero_si256();
  __m256i isum1 = _mm256_setzero_si256();
#pragma GCC unroll 8
  for (int kk = 0; kk < 8; kk += 2) {
    const __m256i p0 = _mm256_maddubs_epi16(dec.w[kk], Load256(y.qs + 32 * kk));
    const __m256i p1 = _mm256_maddubs_epi16(dec.w[kk + 1], Load256(y.qs + 32 * kk + 32));
    isum0 = _mm256_add_epi32(isum0, _mm256_madd_epi16(p0, dec.scl[kk]));
    isum1 = _mm256_add_epi32(isum1, _mm256_madd_epi16(p1, dec.scl[kk + 1]));
  }
  return _mm256_add_epi32(isum0, isum1);
}

#include "quant/kquants_multidot.inc"

// ---------------------------------------------------------------------------------------------
// IQ4_XS: its levels are signed (-127..113), so a group's dot is maddubs(|w|, sign(y, w)) (as
// the signed legacy quants) rather than the unsigned-code path above, then madd by the group's
// scale - 32 into int32 lanes; the super-block's lanes take one FMA by d * d_a, as GGML's AVX2.

struct Iq4XsDecoded {
  __m256i abs_w[8];  // |level| of elements 32g..32g+31
  __m256i w[8];      // the levels, whose signs go onto the activation
  __m256i scale[8];  // scale - 32 of group g in every int16 word
  float d;
};

// The levels of groups g and g + 1 in element order: the low nibbles' levels (elements 0..15 of
// each group) and the high nibbles' (16..31), each group's two halves then joined.
[[gnu::always_inline]] inline void Iq4XsLevels(const BlockIQ4_XS& b, int g, __m256i* w0,
                                               __m256i* w1) {
  const __m256i table =
      _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4NlLevels)));
  const __m256i m4 = _mm256_set1_epi8(0xF);
  const __m256i q = Load256(b.qs + 16 * g);
  const __m256i lo = _mm256_shuffle_epi8(table, _mm256_and_si256(q, m4));
  const __m256i hi = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(q, 4), m4));
  *w0 = _mm256_permute2x128_si256(lo, hi, 0x20);
  *w1 = _mm256_permute2x128_si256(lo, hi, 0x31);
}

inline __m256i Iq4XsScale16(const BlockIQ4_XS& b, int g) {
  return _mm256_set1_epi16(static_cast<int16_t>(Iq4XsScale(b, g) - 32));
}

[[gnu::always_inline]] inline void DecodeIq4Xs(const BlockIQ4_XS& b, Iq4XsDecoded* out) {
#pragma GCC unroll 8
  for (int g = 0; g < 8; g += 2) Iq4XsLevels(b, g, &out->w[g], &out->w[g + 1]);
#pragma GCC unroll 8
  for (int g = 0; g < 8; ++g) {
    out->abs_w[g] = _mm256_sign_epi8(out->w[g], out->w[g]);
    out->scale[g] = Iq4XsScale16(b, g);
  }
  out->d = HalfToFloat(b.d);
}

template <int N>
void Iq4XsMultiDot(int64_t k, const void* w_row, const uint8_t* act, size_t act_row_bytes,
                   float* out) {
  LAMINA_DCHECK(k % kQK_K == 0);
  const auto* x = static_cast<const BlockIQ4_XS*>(w_row);
  __m256 acc[N];
#pragma GCC unroll 8
  for (int r = 0; r < N; ++r) acc[r] = _mm256_setzero_ps();
  const int64_t nb = k / kQK_K;
  if constexpr (N == 1) {
    // One row: each group decoded and used at once, nothing kept. The int32 lanes are exact
    // sums, so they equal the multi path's in any order, and the float steps are the same.
    const auto* yb = reinterpret_cast<const BlockQ8_K*>(act);
    for (int64_t i = 0; i < nb; ++i) {
      const BlockIQ4_XS& b = x[i];
      __m256i isum0 = _mm256_setzero_si256();
      __m256i isum1 = _mm256_setzero_si256();
#pragma GCC unroll 8
      for (int g = 0; g < 8; g += 2) {
        __m256i w0, w1;
        Iq4XsLevels(b, g, &w0, &w1);
        const __m256i y0 = _mm256_sign_epi8(Load256(yb[i].qs + 32 * g), w0);
        const __m256i y1 = _mm256_sign_epi8(Load256(yb[i].qs + 32 * g + 32), w1);
        const __m256i p0 = _mm256_maddubs_epi16(_mm256_sign_epi8(w0, w0), y0);
        const __m256i p1 = _mm256_maddubs_epi16(_mm256_sign_epi8(w1, w1), y1);
        isum0 = _mm256_add_epi32(isum0, _mm256_madd_epi16(p0, Iq4XsScale16(b, g)));
        isum1 = _mm256_add_epi32(isum1, _mm256_madd_epi16(p1, Iq4XsScale16(b, g + 1)));
      }
      const __m256i isum = _mm256_add_epi32(isum0, isum1);
      acc[0] = _mm256_fmadd_ps(_mm256_set1_ps(HalfToFloat(b.d) * yb[i].d), _mm256_cvtepi32_ps(isum),
                               acc[0]);
    }
    out[0] = HorizontalSum(acc[0]);
    return;
  }
  for (int64_t i = 0; i < nb; ++i) {
    Iq4XsDecoded dec;
    DecodeIq4Xs(x[i], &dec);
#pragma GCC unroll 8
    for (int r = 0; r < N; ++r) {
      const BlockQ8_K& y = reinterpret_cast<const BlockQ8_K*>(act + r * act_row_bytes)[i];
      __m256i isum0 = _mm256_setzero_si256();
      __m256i isum1 = _mm256_setzero_si256();
#pragma GCC unroll 8
      for (int g = 0; g < 8; g += 2) {
        const __m256i y0 = _mm256_sign_epi8(Load256(y.qs + 32 * g), dec.w[g]);
        const __m256i y1 = _mm256_sign_epi8(Load256(y.qs + 32 * g + 32), dec.w[g + 1]);
        const __m256i p0 = _mm256_maddubs_epi16(dec.abs_w[g], y0);
        const __m256i p1 = _mm256_maddubs_epi16(dec.abs_w[g + 1], y1);
        isum0 = _mm256_add_epi32(isum0, _mm256_madd_epi16(p0, dec.scale[g]));
        isum1 = _mm256_add_epi32(isum1, _mm256_madd_epi16(p1, dec.scale[g + 1]));
      }
      const __m256i isum = _mm256_add_epi32(isum0, isum1);
      acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(dec.d * y.d), _mm256_cvtepi32_ps(isum), acc[r]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < N; ++r) out[r] = HorizontalSum(acc[r]);
}

#include "quant/kquants_iq4xs.inc"

// TQ1_0 / TQ2_0 (kquants_tq.inc): the codes stay in eight registers; each 32-value chunk's
// maddubs words stay within 2 * 3 * 128 in magnitude, so nothing saturates.
struct TqCodes {
  __m256i v[8];
};

[[gnu::always_inline]] inline void TqPack(const __m256i* t, TqCodes* out) {
  for (int c = 0; c < 8; ++c) out->v[c] = t[c];
}

[[gnu::always_inline]] inline __m256i TqRowSum(const TqCodes& codes, const int8_t* q8) {
  const __m256i ones16 = _mm256_set1_epi16(1);
  __m256i acc = _mm256_setzero_si256();
#pragma GCC unroll 8
  for (int c = 0; c < 8; ++c) {
    const __m256i p = _mm256_maddubs_epi16(codes.v[c], Load256(q8 + 32 * c));
    acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, ones16));
  }
  return acc;
}

#include "quant/kquants_tq.inc"

}  // namespace

void RegisterAvx2KQuants(KernelTable& table) {
  Set<Q2K>(table, GgmlType::kQ2_K);
  Set<Q3K>(table, GgmlType::kQ3_K);
  Set<Q4K>(table, GgmlType::kQ4_K);
  Set<Q5K>(table, GgmlType::kQ5_K);
  Set<Q6K>(table, GgmlType::kQ6_K);
  SetIq4Xs(table);
  SetTq(table);
}

}  // namespace lamina::quant_internal
