// AVX-512 (BW + VNNI) K-quant dot products (Q2_K..Q6_K, IQ4_XS, TQ1_0 and TQ2_0 against Q8_K). As
// the AVX2 variant: each weight super-block is decoded once into 256 codes and per-group scale
// vectors and reused for up to kMaxMultiDot activation rows; here 64 codes per register, and VNNI's
// dpwssd fuses the group-scale multiply with the accumulate (TQ1_0 / TQ2_0: dpbusd over the codes).
// Integer sums are exact.

// GCC 12's AVX-512 headers build their "undefined" vectors by self-initialisation, which trips
// -Wuninitialized at every inlined broadcast/insert/extract (GCC PR 105593); nothing reads them.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <array>
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

// dot = d * (sum scl*w*q8 - [int offset] bsums*bs_mul) - dmin * bsums*bs_mul; see the AVX2 file.
struct Decoded {
  __m512i w[4];    // codes of elements 64k..64k+63, unsigned
  __m512i scl[4];  // int16 multiplier for each maddubs output word of w[k]
  __m256i bs_mul;  // int16 multiplier for each of the 16 bsums
  float d;
  float dmin;
};

constexpr __mmask32 kUpperWords = 0xFFFF0000u;  // words 16..31: the upper 32 bytes
constexpr __mmask32 kLowerWords = 0x0000FFFFu;

inline __m512i Load512(const void* p) { return _mm512_loadu_si512(p); }
inline __m512i Broadcast256(const void* p) { return _mm512_broadcast_i64x4(Load256(p)); }

// vpermw indices: register k, output word i takes scale (group_words == 8 ? 4k + i/8 : 2k + i/16),
// i.e. the scale of the group that maddubs output word i belongs to.
template <int kGroupWords>
constexpr std::array<int16_t, 128> MakeScaleIndex() {
  std::array<int16_t, 128> idx{};
#pragma GCC unroll 8
  for (int k = 0; k < 4; ++k) {
    for (int i = 0; i < 32; ++i) {
      idx[32 * k + i] = static_cast<int16_t>((32 / kGroupWords) * k + i / kGroupWords);
    }
  }
  return idx;
}
alignas(64) constexpr std::array<int16_t, 128> kIndex16 = MakeScaleIndex<8>();   // 16-value groups
alignas(64) constexpr std::array<int16_t, 128> kIndex32 = MakeScaleIndex<16>();  // 32-value groups

template <const std::array<int16_t, 128>& kIndex>
[[gnu::always_inline]] inline void GroupScales(__m256i scales16, __m512i* scl) {
  const __m512i s = _mm512_inserti64x4(_mm512_setzero_si512(), scales16, 0);
#pragma GCC unroll 8
  for (int k = 0; k < 4; ++k) {
    scl[k] = _mm512_permutexvar_epi16(Load512(kIndex.data() + 32 * k), s);
  }
}

[[gnu::always_inline]] inline void ScalesMinsK4(const uint8_t* packed, Decoded* out) {
  const __m128i sm = UnpackScaleMinK4(packed);
  GroupScales<kIndex32>(_mm256_cvtepu8_epi16(sm), out->scl);  // only words 0..7 are read
  const __m128i mins = _mm_cvtepu8_epi16(_mm_srli_si128(sm, 8));
  out->bs_mul = _mm256_setr_m128i(_mm_unpacklo_epi16(mins, mins), _mm_unpackhi_epi16(mins, mins));
}

struct Q2K {
  using Block = BlockQ2_K;
  static constexpr bool kIntOffset = false;
  [[gnu::always_inline]] static void Decode(const Block& b, Decoded* out) {
    const __m512i m3 = _mm512_set1_epi8(3);
#pragma GCC unroll 8
    for (int h = 0; h < 2; ++h) {
      const __m512i q = Broadcast256(b.qs + 32 * h);
#pragma GCC unroll 8
      for (int jj = 0; jj < 2; ++jj) {
        // Lower half: shift 4*jj (elements 128h + 64jj + l); upper half: two bits further.
        __m512i s = _mm512_srl_epi16(q, _mm_cvtsi32_si128(4 * jj));
        s = _mm512_mask_srli_epi16(s, kUpperWords, s, 2);
        out->w[2 * h + jj] = _mm512_and_si512(s, m3);
      }
    }
    const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.scales));
    const __m128i m4 = _mm_set1_epi8(0xF);
    GroupScales<kIndex16>(_mm256_cvtepu8_epi16(_mm_and_si128(sc, m4)), out->scl);
    out->bs_mul = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc, 4), m4));
    out->d = HalfToFloat(b.d);
    out->dmin = HalfToFloat(b.dmin);
  }
};

struct Q3K {
  using Block = BlockQ3_K;
  static constexpr bool kIntOffset = true;
  [[gnu::always_inline]] static void Decode(const Block& b, Decoded* out) {
    const __m512i m3 = _mm512_set1_epi8(3);
    const __m512i m4 = _mm512_set1_epi8(4);
    const __m512i hm = Broadcast256(b.hmask);
#pragma GCC unroll 8
    for (int h = 0; h < 2; ++h) {
      const __m512i q = Broadcast256(b.qs + 32 * h);
#pragma GCC unroll 8
      for (int jj = 0; jj < 2; ++jj) {
        __m512i s = _mm512_srl_epi16(q, _mm_cvtsi32_si128(4 * jj));
        s = _mm512_mask_srli_epi16(s, kUpperWords, s, 2);
        // High bit of element 128h + 32j + l is bit 4h + j of hmask[l].
        __m512i hb = _mm512_srl_epi16(hm, _mm_cvtsi32_si128(4 * h + 2 * jj));
        hb = _mm512_mask_srli_epi16(hb, kUpperWords, hb, 1);
        out->w[2 * h + jj] = _mm512_or_si512(_mm512_and_si512(s, m3),
                                             _mm512_and_si512(_mm512_slli_epi16(hb, 2), m4));
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
    GroupScales<kIndex16>(scales16, out->scl);
    out->bs_mul = _mm256_slli_epi16(scales16, 2);
    out->d = HalfToFloat(b.d);
    out->dmin = 0;
  }
};

struct Q4K {
  using Block = BlockQ4_K;
  static constexpr bool kIntOffset = false;
  [[gnu::always_inline]] static void Decode(const Block& b, Decoded* out) {
    const __m512i m4 = _mm512_set1_epi8(0xF);
#pragma GCC unroll 8
    for (int c = 0; c < 4; ++c) {
      // Low nibbles are elements 64c..64c+31, high nibbles the next 32.
      const __m512i q = Broadcast256(b.qs + 32 * c);
      out->w[c] = _mm512_and_si512(_mm512_mask_srli_epi16(q, kUpperWords, q, 4), m4);
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
    const __m512i m4 = _mm512_set1_epi8(0xF);
    const __m512i m16 = _mm512_set1_epi8(0x10);
    const __m512i qh = Broadcast256(b.qh);
#pragma GCC unroll 8
    for (int c = 0; c < 4; ++c) {
      const __m512i q = Broadcast256(b.qs + 32 * c);
      const __m512i nib = _mm512_and_si512(_mm512_mask_srli_epi16(q, kUpperWords, q, 4), m4);
      // Bit 2c of qh for the low nibbles, bit 2c+1 for the high ones.
      __m512i h = _mm512_srl_epi16(qh, _mm_cvtsi32_si128(2 * c));
      h = _mm512_mask_srli_epi16(h, kUpperWords, h, 1);
      out->w[c] = _mm512_or_si512(nib, _mm512_and_si512(_mm512_slli_epi16(h, 4), m16));
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
    const __m512i m4 = _mm512_set1_epi8(0xF);
    const __m512i m48 = _mm512_set1_epi8(0x30);
#pragma GCC unroll 8
    for (int h = 0; h < 2; ++h) {
      const __m512i ql = Load512(b.ql + 64 * h);  // ql[0..31] | ql[32..63]
      const __m512i qh = Broadcast256(b.qh + 32 * h);
      // Elements 128h + 0..63: low nibbles with qh bits 0-1 (lower half) and 2-3 (upper half).
      const __m512i hlo = _mm512_mask_slli_epi16(_mm512_slli_epi16(qh, 2), kLowerWords, qh, 4);
      out->w[2 * h] = _mm512_or_si512(_mm512_and_si512(ql, m4), _mm512_and_si512(hlo, m48));
      // Elements 128h + 64..127: high nibbles with qh bits 4-5 and 6-7.
      const __m512i hhi = _mm512_mask_mov_epi16(_mm512_srli_epi16(qh, 2), kLowerWords, qh);
      out->w[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4),
                                          _mm512_and_si512(hhi, m48));
    }
    const __m256i scales16 =
        _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.scales)));
    GroupScales<kIndex16>(scales16, out->scl);
    out->bs_mul = _mm256_slli_epi16(scales16, 5);
    out->d = HalfToFloat(b.d);
    out->dmin = 0;
  }
};

// sum over the super-block of scale * code * activation, in eight int32 lanes (the two
// 256-bit halves of the 512-bit sums added).
[[gnu::always_inline]] inline __m256i CodeSums(const Decoded& dec, const BlockQ8_K& y) {
  __m512i isum0 = _mm512_setzero_si512();
  __m512i isum1 = _mm512_setzero_si512();
#pragma GCC unroll 8
  for (int kk = 0; kk < 4; kk += 2) {
    const __m512i p0 = _mm512_maddubs_epi16(dec.w[kk], Load512(y.qs + 64 * kk));
    const __m512i p1 = _mm512_maddubs_epi16(dec.w[kk + 1], Load512(y.qs + 64 * kk + 64));
    isum0 = _mm512_dpwssd_epi32(isum0, p0, dec.scl[kk]);
    isum1 = _mm512_dpwssd_epi32(isum1, p1, dec.scl[kk + 1]);
  }
  const __m512i isum512 = _mm512_add_epi32(isum0, isum1);
  return _mm256_add_epi32(_mm512_castsi512_si256(isum512), _mm512_extracti64x4_epi64(isum512, 1));
}

#include "quant/kquants_multidot.inc"

// ---------------------------------------------------------------------------------------------
// IQ4_XS: two 32-value groups per register. Its levels are signed (-127..113): maddubs takes
// |w| and the activation negated where w < 0 (a masked subtract: AVX-512 has no sign_epi8),
// then dpwssd adds the words times the group's scale - 32 into int32 lanes. The super-block's
// lanes take one FMA by d * d_a, as the AVX2 variant.

struct Iq4XsDecoded {
  __m512i abs_w[4];  // |level| of elements 64c..64c+63 (groups 2c, 2c + 1)
  __mmask64 neg[4];  // the bytes whose level is negative
  __m512i scale[4];  // scale - 32 of group 2c in words 0-15, of group 2c + 1 in words 16-31
  float d;
};

// The levels of groups 2c and 2c + 1 in element order: each group's 16 bytes broadcast into two
// 128-bit lanes ([g0, g0, g1, g1], by loads rather than lane shuffles), the second of each pair
// shifted to its high nibbles (a group's low nibbles are its elements 0..15, high ones 16..31).
[[gnu::always_inline]] inline __m512i Iq4XsLevels(const BlockIQ4_XS& b, int c, __m512i table) {
  const __m128i* q = reinterpret_cast<const __m128i*>(b.qs + 32 * c);
  const __m512i z = _mm512_mask_broadcast_i32x4(_mm512_broadcast_i32x4(_mm_loadu_si128(q)), 0xFF00,
                                                _mm_loadu_si128(q + 1));
  const __m512i nib =
      _mm512_and_si512(_mm512_mask_srli_epi16(z, 0xFF00FF00u, z, 4), _mm512_set1_epi8(0xF));
  return _mm512_shuffle_epi8(table, nib);
}

[[gnu::always_inline]] inline void DecodeIq4Xs(const BlockIQ4_XS& b, Iq4XsDecoded* out) {
  const __m512i table =
      _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4NlLevels)));
#pragma GCC unroll 4
  for (int c = 0; c < 4; ++c) {
    const __m512i w = Iq4XsLevels(b, c, table);
    out->abs_w[c] = _mm512_abs_epi8(w);
    out->neg[c] = _mm512_movepi8_mask(w);
    out->scale[c] = _mm512_mask_blend_epi16(
        kUpperWords, _mm512_set1_epi16(static_cast<int16_t>(Iq4XsScale(b, 2 * c) - 32)),
        _mm512_set1_epi16(static_cast<int16_t>(Iq4XsScale(b, 2 * c + 1) - 32)));
  }
  out->d = HalfToFloat(b.d);
}

template <int N>
void Iq4XsMultiDot(int64_t k, const void* w_row, const uint8_t* act, size_t act_row_bytes,
                   float* out) {
  LAMINA_DCHECK(k % kQK_K == 0);
  const auto* x = static_cast<const BlockIQ4_XS*>(w_row);
  const __m512i zero = _mm512_setzero_si512();
  __m256 acc[N];
#pragma GCC unroll 8
  for (int r = 0; r < N; ++r) acc[r] = _mm256_setzero_ps();
  const int64_t nb = k / kQK_K;
  for (int64_t i = 0; i < nb; ++i) {
    Iq4XsDecoded dec;
    DecodeIq4Xs(x[i], &dec);
#pragma GCC unroll 8
    for (int r = 0; r < N; ++r) {
      const BlockQ8_K& y = reinterpret_cast<const BlockQ8_K*>(act + r * act_row_bytes)[i];
      __m512i isum0 = zero;
      __m512i isum1 = zero;
#pragma GCC unroll 4
      for (int c = 0; c < 4; c += 2) {
        const __m512i y0 = Load512(y.qs + 64 * c);
        const __m512i y1 = Load512(y.qs + 64 * c + 64);
        const __m512i p0 =
            _mm512_maddubs_epi16(dec.abs_w[c], _mm512_mask_sub_epi8(y0, dec.neg[c], zero, y0));
        const __m512i p1 = _mm512_maddubs_epi16(dec.abs_w[c + 1],
                                                _mm512_mask_sub_epi8(y1, dec.neg[c + 1], zero, y1));
        isum0 = _mm512_dpwssd_epi32(isum0, p0, dec.scale[c]);
        isum1 = _mm512_dpwssd_epi32(isum1, p1, dec.scale[c + 1]);
      }
      const __m512i s512 = _mm512_add_epi32(isum0, isum1);
      const __m256i isum =
          _mm256_add_epi32(_mm512_castsi512_si256(s512), _mm512_extracti64x4_epi64(s512, 1));
      acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(dec.d * y.d), _mm256_cvtepi32_ps(isum), acc[r]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < N; ++r) out[r] = HorizontalSum(acc[r]);
}

#include "quant/kquants_iq4xs.inc"

// TQ1_0 / TQ2_0 (kquants_tq.inc): the codes stay in eight 256-bit registers, one VNNI dpbusd
// (AVX-512 VL form) per 32-value chunk and activation row. Packing two chunks per 512-bit
// register measured slower (the inserts cost more than the four dpbusd saved).
struct TqCodes {
  __m256i v[8];
};

[[gnu::always_inline]] inline void TqPack(const __m256i* t, TqCodes* out) {
  for (int c = 0; c < 8; ++c) out->v[c] = t[c];
}

[[gnu::always_inline]] inline __m256i TqRowSum(const TqCodes& codes, const int8_t* q8) {
  __m256i acc = _mm256_setzero_si256();
#pragma GCC unroll 8
  for (int c = 0; c < 8; ++c) acc = _mm256_dpbusd_epi32(acc, codes.v[c], Load256(q8 + 32 * c));
  return acc;
}

#include "quant/kquants_tq.inc"

}  // namespace

void RegisterAvx512KQuants(KernelTable& table) {
  Set<Q2K>(table, GgmlType::kQ2_K);
  Set<Q3K>(table, GgmlType::kQ3_K);
  Set<Q4K>(table, GgmlType::kQ4_K);
  Set<Q5K>(table, GgmlType::kQ5_K);
  Set<Q6K>(table, GgmlType::kQ6_K);
  SetIq4Xs(table);
  SetTq(table);
}

}  // namespace lamina::quant_internal
