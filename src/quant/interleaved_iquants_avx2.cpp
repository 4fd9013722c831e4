// AVX2 kernels of the interleaved lattice i-quants (interleaved_iquants.h, against Q8_K). Calls
// of up to kFewTokens tokens (decode) decode each row's super-block as the row kernels do
// (iquants_avx2_dec.inc), reading the grid indices in place and the sign/scale fields from a copy
// transposed to row order once per super-block; larger calls use the lanes below. int32 lane r of
// a register is row 8R + r of the group's half R (two registers per field). Per 16-value half of
// a super-block the 16 rows' signed weights are decoded once into eight registers (4 values per
// lane; grid entries by AVX2 gathers, signs by a compare and vpsignb) with the rows' scales
// 2s + 1 as 16-bit words; every token of the call (up to kLatticeGemmTokens) then costs, per 8
// rows, four vpmaddubsw of its broadcast codes + 128 against the weights (|w| < 64, so no
// saturation), four vpmaddwd by the scales and a subtraction of the same sums for codes 0 (128
// times the weights' sum, computed once per half). Both are the row kernels' exact integer per
// super-block and row, and the float steps are theirs lane by lane: every output is the scalar
// vec_dot's bits (iquants.cpp), whatever the batch.
#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "quant/interleaved_iquants.h"
#include "quant/iq_grids.h"
#include "quant/kernel_registry.h"
#include "quant/quant.h"
#include "quant/types.h"
#include "util/check.h"
#include "util/fp16.h"

namespace lamina::quant_internal {
namespace {

#include "quant/iquants_avx2_dec.inc"
#include "quant/iquants_common.inc"

constexpr int kRows = kQ8_0x16Rows;

// One half (16 values) of a super-block for the 16 rows.
struct Half {
  __m256i w[2][4];   // [row half R][4 positions][8 rows]: int32 lane r = row 8R + r's 4 values
  __m256i scale[2];  // [R][8 rows]: 2s + 1 in both 16-bit words
  __m256i zero[2];   // [R][8 rows]: the sums of a token of codes 0 (128 (2s + 1) sum(w))
};

inline __m256i Load8x(const uint8_t* p) {  // 8 bytes widened to 8 int32 lanes
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}
inline __m256i Load16x8(const uint16_t* p) {  // 8 words widened to 8 int32 lanes
  return _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// 2s + 1 of 4-bit scales in int32 lanes (bits above the nibble masked off), in both words.
[[gnu::always_inline]] inline __m256i OddScale(__m256i s) {
  const __m256i o = _mm256_or_si256(
      _mm256_slli_epi32(_mm256_and_si256(s, _mm256_set1_epi32(0xF)), 1), _mm256_set1_epi32(1));
  return _mm256_or_si256(o, _mm256_slli_epi32(o, 16));
}

// Bytes holding 7-bit sign indices s (bit 7 clear) completed to their 8 sign bits.
[[gnu::always_inline]] inline __m256i SignBytes(__m256i s) {
  const __m256i nib = _mm256_set1_epi8(0x0F);
  const __m256i par = _mm256_broadcastsi128_si256(_mm_setr_epi8(
      0, -128, -128, 0, -128, 0, 0, -128, -128, 0, 0, -128, 0, -128, -128, 0));  // parity(i) << 7
  const __m256i p =
      _mm256_xor_si256(_mm256_shuffle_epi8(par, _mm256_and_si256(s, nib)),
                       _mm256_shuffle_epi8(par, _mm256_and_si256(_mm256_srli_epi16(s, 4), nib)));
  return _mm256_or_si256(s, p);
}

// Magnitudes u of an entry's two positions with the signs of byte l of each lane of sb (bit j
// negates value j): *lo values 0..3, *hi values 4..7.
[[gnu::always_inline]] inline void ApplySigns(__m256i sb, int l, __m256i* lo, __m256i* hi) {
  const char c = static_cast<char>(l);
  const __m256i ctrl = _mm256_add_epi8(_mm256_broadcastsi128_si256(_mm_setr_epi8(
                                           0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12)),
                                       _mm256_set1_epi8(c));
  const __m256i rep = _mm256_shuffle_epi8(sb, ctrl);  // byte l of each lane, in all 4 bytes
  const __m256i one = _mm256_set1_epi8(1);
  const __m256i b_lo = _mm256_set1_epi32(0x08040201);
  const __m256i b_hi = _mm256_set1_epi32(static_cast<int>(0x80402010u));
  const __m256i m_lo = _mm256_cmpeq_epi8(_mm256_and_si256(rep, b_lo), b_lo);  // -1: negative
  const __m256i m_hi = _mm256_cmpeq_epi8(_mm256_and_si256(rep, b_hi), b_hi);
  *lo = _mm256_sign_epi8(*lo, _mm256_or_si256(m_lo, one));
  *hi = _mm256_sign_epi8(*hi, _mm256_or_si256(m_hi, one));
}

// The 8-byte grid entries idx[r] of 8 rows as two positions: *lo lane r = entry r's bytes 0..3,
// *hi its bytes 4..7.
[[gnu::always_inline]] inline void Gather8(__m256i idx, const uint64_t* grid, __m256i* lo,
                                           __m256i* hi) {
  const auto* base = reinterpret_cast<const long long*>(grid);
  const __m256i a = _mm256_i32gather_epi64(base, _mm256_castsi256_si128(idx), 8);  // rows 0..3
  const __m256i b = _mm256_i32gather_epi64(base, _mm256_extracti128_si256(idx, 1), 8);
  const __m256 fa = _mm256_castsi256_ps(a), fb = _mm256_castsi256_ps(b);
  *lo = _mm256_permute4x64_epi64(_mm256_castps_si256(_mm256_shuffle_ps(fa, fb, 0x88)), 0xD8);
  *hi = _mm256_permute4x64_epi64(_mm256_castps_si256(_mm256_shuffle_ps(fa, fb, 0xDD)), 0xD8);
}

[[gnu::always_inline]] inline __m256i Gather4(__m256i idx, const uint32_t* grid) {
  return _mm256_i32gather_epi32(reinterpret_cast<const int*>(grid), idx, 4);
}

// IQ2_XXS / IQ3_XXS: the sign bytes of 8 rows' sign/scale words (byte l of lane r: row r's
// entry l) and their scales.
[[gnu::always_inline]] inline __m256i XxsSigns(const uint32_t* sw, __m256i* scale) {
  const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sw));
  __m256i s = _mm256_and_si256(w, _mm256_set1_epi32(0x7F));
  for (int l = 1; l < 4; ++l) {
    s = _mm256_or_si256(
        s, _mm256_and_si256(_mm256_slli_epi32(w, l), _mm256_set1_epi32(0x7F << (8 * l))));
  }
  *scale = OddScale(_mm256_srli_epi32(w, 28));
  return SignBytes(s);
}

[[gnu::always_inline]] inline void DecodeRows(const BlockIQ2_XXSx16& b, int h, int R, Half* out) {
  const int g = h / 2;
  const __m256i sb = XxsSigns(b.sw + kRows * g + 8 * R, &out->scale[R]);
  for (int e = 0; e < 2; ++e) {
    const int l = 2 * (h % 2) + e;
    __m256i* w = &out->w[R][2 * e];
    Gather8(Load8x(b.grid + kRows * (4 * g + l) + 8 * R), kIq2xxsGrid.data(), &w[0], &w[1]);
    ApplySigns(sb, l, &w[0], &w[1]);
  }
}

[[gnu::always_inline]] inline void DecodeRows(const BlockIQ2_XSx16& b, int h, int R, Half* out) {
  const int g = h / 2;
  out->scale[R] = OddScale(_mm256_srli_epi32(Load8x(b.scales + kRows * g + 8 * R), 4 * (h % 2)));
  for (int e = 0; e < 2; ++e) {
    const __m256i q = Load16x8(b.qs + kRows * (2 * h + e) + 8 * R);
    __m256i* w = &out->w[R][2 * e];
    Gather8(_mm256_and_si256(q, _mm256_set1_epi32(511)), kIq2xsGrid.data(), &w[0], &w[1]);
    ApplySigns(SignBytes(_mm256_srli_epi32(q, 9)), 0, &w[0], &w[1]);
  }
}

[[gnu::always_inline]] inline void DecodeRows(const BlockIQ2_Sx16& b, int h, int R, Half* out) {
  const int g = h / 2;
  const __m256i qh = Load8x(b.qh + kRows * g + 8 * R);
  out->scale[R] = OddScale(_mm256_srli_epi32(Load8x(b.scales + kRows * g + 8 * R), 4 * (h % 2)));
  for (int e = 0; e < 2; ++e) {
    const int l = 2 * (h % 2) + e;  // entry 2h + e
    const __m256i high =
        _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(qh, 2 * l), _mm256_set1_epi32(3)), 8);
    __m256i* w = &out->w[R][2 * e];
    Gather8(_mm256_or_si256(Load8x(b.grid + kRows * (2 * h + e) + 8 * R), high), kIq2sGrid.data(),
            &w[0], &w[1]);
    ApplySigns(Load8x(b.signs + kRows * (2 * h + e) + 8 * R), 0, &w[0], &w[1]);
  }
}

[[gnu::always_inline]] inline void DecodeRows(const BlockIQ3_XXSx16& b, int h, int R, Half* out) {
  const int g = h / 2;
  const __m256i sb = XxsSigns(b.sw + kRows * g + 8 * R, &out->scale[R]);
  for (int e = 0; e < 2; ++e) {
    const int l = 2 * (h % 2) + e;  // positions 8g + 2l, +1
    __m256i* w = &out->w[R][2 * e];
    for (int j = 0; j < 2; ++j)
      w[j] = Gather4(Load8x(b.grid + kRows * (8 * g + 2 * l + j) + 8 * R), kIq3xxsGrid.data());
    ApplySigns(sb, l, &w[0], &w[1]);
  }
}

[[gnu::always_inline]] inline void DecodeRows(const BlockIQ3_Sx16& b, int h, int R, Half* out) {
  const int g = h / 2;
  const __m256i qh = Load8x(b.qh + kRows * g + 8 * R);
  out->scale[R] = OddScale(_mm256_srli_epi32(
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.scales + 8 * R)), 4 * g));
  for (int e = 0; e < 2; ++e) {
    const int l = 2 * (h % 2) + e;
    __m256i* w = &out->w[R][2 * e];
    for (int j = 0; j < 2; ++j) {
      const int p = 8 * g + 2 * l + j;
      const __m256i high = _mm256_slli_epi32(
          _mm256_and_si256(_mm256_srli_epi32(qh, 2 * l + j), _mm256_set1_epi32(1)), 8);
      w[j] = Gather4(_mm256_or_si256(Load8x(b.grid + kRows * p + 8 * R), high), kIq3sGrid.data());
    }
    ApplySigns(Load8x(b.signs + kRows * (4 * g + l) + 8 * R), 0, &w[0], &w[1]);
  }
}

// IQ1: kIq1Grid8Delta's entries are the signed weights 8 * grid + delta already.
[[gnu::always_inline]] inline void DecodeRows(const BlockIQ1_Sx16& b, int h, int R, Half* out) {
  const int g = h / 2;
  const __m256i qh = Load16x8(b.qh + kRows * g + 8 * R);
  out->scale[R] = OddScale(_mm256_and_si256(_mm256_srli_epi32(qh, 12), _mm256_set1_epi32(7)));
  const __m256i neg = _mm256_srli_epi32(_mm256_and_si256(qh, _mm256_set1_epi32(0x8000)), 4);
  for (int e = 0; e < 2; ++e) {
    const int l = 2 * (h % 2) + e;
    const __m256i high =
        _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(qh, 3 * l), _mm256_set1_epi32(7)), 8);
    const __m256i idx =
        _mm256_or_si256(_mm256_or_si256(Load8x(b.grid + kRows * (2 * h + e) + 8 * R), high), neg);
    Gather8(idx, kIq1Grid8Delta.data(), &out->w[R][2 * e], &out->w[R][2 * e + 1]);
  }
}

[[gnu::always_inline]] inline void DecodeRows(const BlockIQ1_Mx16& b, int h, int R, Half* out) {
  const __m256i sc = Load16x8(b.scales + kRows * (h / 4) + 8 * R);
  out->scale[R] =
      OddScale(_mm256_and_si256(_mm256_srli_epi32(sc, 3 * (h % 4)), _mm256_set1_epi32(7)));
  const __m256i qh = Load8x(b.qh + kRows * h + 8 * R);  // entries 2h, 2h + 1: low, high nibble
  for (int e = 0; e < 2; ++e) {
    // nibble bits 0..2 are index bits 8..10 and bit 3 the negative delta (index bit 11)
    const __m256i nib = _mm256_and_si256(_mm256_srli_epi32(qh, 4 * e), _mm256_set1_epi32(0xF));
    const __m256i idx =
        _mm256_or_si256(Load8x(b.grid + kRows * (2 * h + e) + 8 * R), _mm256_slli_epi32(nib, 8));
    Gather8(idx, kIq1Grid8Delta.data(), &out->w[R][2 * e], &out->w[R][2 * e + 1]);
  }
}

// Per 8 rows: sum over the 4 positions of (2s + 1) * (codes + 128) . w, codes as the four
// broadcast words c[j] (already + 128). Each vpmaddubsw pair is at most 2 * 255 * 63 < 2^15.
[[gnu::always_inline]] inline __m256i Dot(const Half& hf, int R, const __m256i* c) {
  __m256i s = _mm256_madd_epi16(_mm256_maddubs_epi16(c[0], hf.w[R][0]), hf.scale[R]);
  for (int j = 1; j < 4; ++j) {
    s = _mm256_add_epi32(s, _mm256_madd_epi16(_mm256_maddubs_epi16(c[j], hf.w[R][j]), hf.scale[R]));
  }
  return s;
}

template <typename X>
[[gnu::always_inline]] inline void DecodeHalf(const X& b, int h, Half* out) {
  const __m256i c128[4] = {
      _mm256_set1_epi8(static_cast<char>(0x80)), _mm256_set1_epi8(static_cast<char>(0x80)),
      _mm256_set1_epi8(static_cast<char>(0x80)), _mm256_set1_epi8(static_cast<char>(0x80))};
  for (int R = 0; R < 2; ++R) {
    DecodeRows(b, h, R, out);
    out->zero[R] = Dot(*out, R, c128);
  }
}

// 8 rows' d as floats.
template <typename X>
[[gnu::always_inline]] inline __m256 LoadD(const X& b, int R) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.d + 8 * R)));
}
// IQ1_M: the top nibbles of the four scale words, word 0's lowest.
template <>
[[gnu::always_inline]] inline __m256 LoadD(const BlockIQ1_Mx16& b, int R) {
  __m128i s[4];  // [word][8 rows]
  for (int w = 0; w < 4; ++w) {
    s[w] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.scales + kRows * w + 8 * R));
  }
  const __m128i top = _mm_set1_epi16(static_cast<int16_t>(0xF000));
  const __m128i lo =
      _mm_or_si128(_mm_srli_epi16(s[0], 12), _mm_srli_epi16(_mm_and_si128(s[1], top), 8));
  const __m128i hi =
      _mm_or_si128(_mm_srli_epi16(_mm_and_si128(s[2], top), 4), _mm_and_si128(s[3], top));
  return _mm256_cvtph_ps(_mm_or_si128(lo, hi));
}

template <typename X>
constexpr bool kIq1 = std::is_same_v<X, BlockIQ1_Sx16> || std::is_same_v<X, BlockIQ1_Mx16>;

// d * (the super-block's integer), IQ1's integer first divided by 8 (exact), as the scalar
// vec_dot.
template <typename X>
[[gnu::always_inline]] inline __m256 Scaled(__m256 d, __m256i isum) {
  const __m256 f = _mm256_cvtepi32_ps(isum);
  if constexpr (kIq1<X>) {
    return _mm256_mul_ps(d, _mm256_mul_ps(f, _mm256_set1_ps(0.125f)));
  } else {
    return _mm256_mul_ps(d, f);
  }
}

template <typename X>
constexpr float kFinal = std::is_same_v<X, BlockIQ3_Sx16> || kIq1<X> ? 1.0f
                         : std::is_same_v<X, BlockIQ3_XXSx16>        ? 0.25f
                                                                     : 0.125f;

// ---- Few tokens (decode): each row's super-block decoded as the row kernels do ----
//
// With one or two tokens the gathers above cost more than they share. This path decodes row by
// row with the row kernels' chunk decoder (iquants_avx2_dec.inc: grid entries by broadcast loads
// and blends, signs by one vpshufb and a bit test), reading the grid indices in place (row r's
// entry e is byte / word 16 e + r) and the fields it loads as vectors (sign words, sign bytes,
// scales) from a copy transposed to row order once per super-block for the 16 rows; the 16 rows'
// integers then share four reductions and the float steps run 8 rows per register. Same
// integers and float operations as the scalar vec_dot.

constexpr int kFewTokens = 4;  // calls of up to this many tokens take this path

constexpr int BitRev(int j, int bits) {
  int r = 0;
  for (int b = 0; b < bits; ++b) r |= ((j >> b) & 1) << (bits - 1 - b);
  return r;
}

template <int W>
[[gnu::always_inline]] inline __m256i UnpackLo(__m256i a, __m256i b) {
  if constexpr (W == 1) return _mm256_unpacklo_epi8(a, b);
  if constexpr (W == 2) return _mm256_unpacklo_epi16(a, b);
  if constexpr (W == 4) return _mm256_unpacklo_epi32(a, b);
  if constexpr (W == 8) return _mm256_unpacklo_epi64(a, b);
}
template <int W>
[[gnu::always_inline]] inline __m256i UnpackHi(__m256i a, __m256i b) {
  if constexpr (W == 1) return _mm256_unpackhi_epi8(a, b);
  if constexpr (W == 2) return _mm256_unpackhi_epi16(a, b);
  if constexpr (W == 4) return _mm256_unpackhi_epi32(a, b);
  if constexpr (W == 8) return _mm256_unpackhi_epi64(a, b);
}

// Two L x L transposes of W-byte elements (L = 16 / W), one per 128-bit lane: on entry x[j] holds
// unit BitRev(j)'s elements of rows 0..L-1, on return x[i] row i's elements of units 0..L-1.
template <int W, int E = W>
[[gnu::always_inline]] inline void TransposeLanes(__m256i* x) {
  constexpr int L = 16 / W;
  __m256i y[L];
#pragma GCC unroll 16
  for (int i = 0; i < L / 2; ++i) {
    y[2 * i] = UnpackLo<E>(x[i], x[i + L / 2]);
    y[2 * i + 1] = UnpackHi<E>(x[i], x[i + L / 2]);
  }
#pragma GCC unroll 16
  for (int i = 0; i < L; ++i) x[i] = y[i];
  if constexpr (E < 8) TransposeLanes<W, 2 * E>(x);
}

// A byte field interleaved as f[16 * unit + row]: row r's bytes of units lo(0..15), then
// hi(0..15) (each a pointer to the unit's 16 rows), stored at dst + stride * r.
template <typename Lo, typename Hi>
[[gnu::always_inline]] inline void BytesToRows(Lo lo, Hi hi, uint8_t* dst, size_t stride) {
  __m256i x[16];
#pragma GCC unroll 16
  for (int j = 0; j < 16; ++j) {
    const int u = BitRev(j, 4);
    x[j] = _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(lo(u)))),
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(hi(u))), 1);
  }
  TransposeLanes<1>(x);
#pragma GCC unroll 16
  for (int r = 0; r < 16; ++r)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + stride * r), x[r]);
}

// Eight 32-bit words per row interleaved as f[16 * unit + row] (the XXS sign/scale words): row
// r's 8 words at dst[8 r].
[[gnu::always_inline]] inline void WordsToRows(const uint32_t* f, uint32_t* dst) {
#pragma GCC unroll 4
  for (int q = 0; q < 4; ++q) {  // rows 4q..4q+3
    __m256i x[4];
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      const int u = BitRev(j, 2);
      x[j] = _mm256_inserti128_si256(
          _mm256_castsi128_si256(
              _mm_loadu_si128(reinterpret_cast<const __m128i*>(f + 16 * u + 4 * q))),
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(f + 16 * (u + 4) + 4 * q)), 1);
    }
    TransposeLanes<4>(x);
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i)
      _mm256_store_si256(reinterpret_cast<__m256i*>(dst + 8 * (4 * q + i)), x[i]);
  }
}

// Row r's 8 scale bytes f[16 g + r] (g < 8) at dst + 8 r: three rounds of unpacks, 128-bit.
[[gnu::always_inline]] inline void ScalesToRows(const uint8_t* f, uint8_t* dst) {
  auto ld = [f](int g) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(f + 16 * g)); };
  __m128i a[4][2];  // [pair of groups][row half]: words (g 2p, 2p + 1) of rows
#pragma GCC unroll 4
  for (int q = 0; q < 4; ++q) {
    a[q][0] = _mm_unpacklo_epi8(ld(2 * q), ld(2 * q + 1));
    a[q][1] = _mm_unpackhi_epi8(ld(2 * q), ld(2 * q + 1));
  }
#pragma GCC unroll 4
  for (int k = 0; k < 4; ++k) {  // rows 4k..4k+3
    const int h = k / 2;
    const auto u = [k](__m128i x, __m128i y) {
      return k % 2 == 0 ? _mm_unpacklo_epi16(x, y) : _mm_unpackhi_epi16(x, y);
    };
    const __m128i lo = u(a[0][h], a[1][h]), hi = u(a[2][h], a[3][h]);  // groups 0..3 | 4..7
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 8 * (4 * k)), _mm_unpacklo_epi32(lo, hi));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 8 * (4 * k + 2)), _mm_unpackhi_epi32(lo, hi));
  }
}

// Per super-block of the 16 rows: what the row decoders read as vectors, in row order.
template <typename X>
struct Few;

// IQ2_XXS: grid index bytes in place; the sign/scale words transposed.
template <>
struct Few<BlockIQ2_XXSx16> {
  alignas(32) uint32_t sw[kRows * 8];  // [16 rows][8 groups]
  [[gnu::always_inline]] void Prepare(const BlockIQ2_XXSx16& b) { WordsToRows(b.sw, sw); }
  class Dec {
   public:
    [[gnu::always_inline]] Dec(const Few& f, const BlockIQ2_XXSx16& b, int r) : g_(b.grid + r) {
      XxsSignsScales(Load256(f.sw + 8 * r), &t_, &e_);
    }
    [[gnu::always_inline]] IqChunk Chunk(int c) const {
      const uint8_t* p = g_ + kRows * 4 * c;
      return {Grid4(kIq2xxsGrid.data(), p[0], p[kRows], p[2 * kRows], p[3 * kRows]),
              SignUnit(t_, c), e_.Get(c)};
    }

   private:
    const uint8_t* g_;
    __m256i t_;
    ChunkWords e_;
  };
};

// IQ3_XXS: the same with one index byte per 4 values.
template <>
struct Few<BlockIQ3_XXSx16> {
  alignas(32) uint32_t sw[kRows * 8];  // [16 rows][8 groups]
  [[gnu::always_inline]] void Prepare(const BlockIQ3_XXSx16& b) { WordsToRows(b.sw, sw); }
  class Dec {
   public:
    [[gnu::always_inline]] Dec(const Few& f, const BlockIQ3_XXSx16& b, int r) : g_(b.grid + r) {
      XxsSignsScales(Load256(f.sw + 8 * r), &t_, &e_);
    }
    [[gnu::always_inline]] IqChunk Chunk(int c) const {
      return {Grid8<kRows>(kIq3xxsGrid.data(), g_ + kRows * 8 * c), SignUnit(t_, c), e_.Get(c)};
    }

   private:
    const uint8_t* g_;
    __m256i t_;
    ChunkWords e_;
  };
};

// IQ2_XS: grid indices from the words in place; the 7-bit sign indices (the words' bits 9..15)
// and the scales transposed.
template <>
struct Few<BlockIQ2_XSx16> {
  alignas(32) uint8_t signs[kRows * 32];  // [16 rows][32 entries] sign indices
  alignas(32) uint8_t scales[kRows * 8];  // [16 rows][8 groups]
  alignas(32) uint8_t tmp[32 * kRows];    // [32 entries][16 rows] sign indices
  [[gnu::always_inline]] void Prepare(const BlockIQ2_XSx16& b) {
#pragma GCC unroll 16
    for (int e = 0; e < 32; e += 2) {  // [entry e | entry e + 1], 16 rows each
      const __m256i s = _mm256_packus_epi16(_mm256_srli_epi16(Load256(b.qs + kRows * e), 9),
                                            _mm256_srli_epi16(Load256(b.qs + kRows * (e + 1)), 9));
      _mm256_store_si256(reinterpret_cast<__m256i*>(tmp + kRows * e),
                         _mm256_permute4x64_epi64(s, 0xD8));
    }
    const uint8_t* t = tmp;
    BytesToRows([t](int u) { return t + kRows * u; }, [t](int u) { return t + kRows * (16 + u); },
                signs, 32);
    ScalesToRows(b.scales, scales);
  }
  class Dec {
   public:
    [[gnu::always_inline]] Dec(const Few& f, const BlockIQ2_XSx16& b, int r) : q_(b.qs + r) {
      t_ = SignGroups(SignRule(Load256(f.signs + 32 * r)));
      e_ = NibbleScales(f.scales + 8 * r);
    }
    [[gnu::always_inline]] IqChunk Chunk(int c) const {
      const uint16_t* p = q_ + kRows * 4 * c;
      return {Grid4(kIq2xsGrid.data(), p[0] & 511u, p[kRows] & 511u, p[2 * kRows] & 511u,
                    p[3 * kRows] & 511u),
              SignUnit(t_, c), e_.Get(c)};
    }

   private:
    const uint16_t* q_;
    __m256i t_;
    ChunkWords e_;
  };
};

// IQ2_S: the 10-bit grid indices of 8 rows per register into idx (entry-major, as the fields);
// sign bytes and scales transposed.
template <>
struct Few<BlockIQ2_Sx16> {
  alignas(32) uint32_t idx_[32 * kRows];  // [32 entries][16 rows] grid indices
  alignas(32) uint8_t signs[kRows * 32];  // [16 rows][32 entries]
  alignas(32) uint8_t scales[kRows * 8];  // [16 rows][8 groups]
  const uint32_t* idx;                    // idx_, opaque
  [[gnu::always_inline]] void Prepare(const BlockIQ2_Sx16& b) {
#pragma GCC unroll 8
    for (int g = 0; g < 8; ++g) {
#pragma GCC unroll 2
      for (int R = 0; R < 2; ++R) {
        const __m256i qh = Load8x(b.qh + kRows * g + 8 * R);
#pragma GCC unroll 4
        for (int l = 0; l < 4; ++l) {
          const int e = 4 * g + l;
          const __m256i high = _mm256_slli_epi32(
              _mm256_and_si256(_mm256_srli_epi32(qh, 2 * l), _mm256_set1_epi32(3)), 8);
          _mm256_store_si256(reinterpret_cast<__m256i*>(idx_ + kRows * e + 8 * R),
                             _mm256_or_si256(Load8x(b.grid + kRows * e + 8 * R), high));
        }
      }
    }
    idx = Opaque(idx_);
    const uint8_t* s = b.signs;
    BytesToRows([s](int u) { return s + kRows * u; }, [s](int u) { return s + kRows * (16 + u); },
                signs, 32);
    ScalesToRows(b.scales, scales);
  }
  class Dec {
   public:
    [[gnu::always_inline]] Dec(const Few& f, const BlockIQ2_Sx16&, int r) : i_(f.idx + r) {
      t_ = SignGroups(Load256(f.signs + 32 * r));
      e_ = NibbleScales(f.scales + 8 * r);
    }
    [[gnu::always_inline]] IqChunk Chunk(int c) const {
      const uint32_t* i = i_ + kRows * 4 * c;
      return {Grid4(kIq2sGrid.data(), i[0], i[kRows], i[2 * kRows], i[3 * kRows]), SignUnit(t_, c),
              e_.Get(c)};
    }

   private:
    const uint32_t* i_;
    __m256i t_;
    ChunkWords e_;
  };
};

// IQ3_S: the 9-bit grid indices of 8 rows per register into idx; sign bytes transposed; the
// scale word read per row.
template <>
struct Few<BlockIQ3_Sx16> {
  alignas(32) uint32_t idx_[64 * kRows];  // [64 value quads][16 rows] grid indices
  alignas(32) uint8_t signs[kRows * 32];  // [16 rows][32 entries]
  const uint32_t* idx;                    // idx_, opaque
  [[gnu::always_inline]] void Prepare(const BlockIQ3_Sx16& b) {
#pragma GCC unroll 8
    for (int g = 0; g < 8; ++g) {
#pragma GCC unroll 2
      for (int R = 0; R < 2; ++R) {
        const __m256i qh = Load8x(b.qh + kRows * g + 8 * R);
#pragma GCC unroll 8
        for (int j = 0; j < 8; ++j) {
          const int p = 8 * g + j;
          const __m256i high = _mm256_and_si256(_mm256_slli_epi32(qh, 8 - j),
                                                _mm256_set1_epi32(0x100));  // bit j to bit 8
          _mm256_store_si256(reinterpret_cast<__m256i*>(idx_ + kRows * p + 8 * R),
                             _mm256_or_si256(Load8x(b.grid + kRows * p + 8 * R), high));
        }
      }
    }
    idx = Opaque(idx_);
    const uint8_t* s = b.signs;
    BytesToRows([s](int u) { return s + kRows * u; }, [s](int u) { return s + kRows * (16 + u); },
                signs, 32);
  }
  class Dec {
   public:
    [[gnu::always_inline]] Dec(const Few& f, const BlockIQ3_Sx16& b, int r) : i_(f.idx + r) {
      t_ = SignGroups(Load256(f.signs + 32 * r));
      const __m256i sc4 = _mm256_set1_epi32(static_cast<int>(b.scales[r]));
      e_ = ChunkWords::PerChunk(OddScales(
          _mm256_and_si256(_mm256_srlv_epi32(sc4, _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
                           _mm256_set1_epi32(0xF))));
    }
    [[gnu::always_inline]] IqChunk Chunk(int c) const {
      return {Grid8<kRows>(kIq3sGrid.data(), i_ + kRows * 8 * c), SignUnit(t_, c), e_.Get(c)};
    }

   private:
    const uint32_t* i_;
    __m256i t_;
    ChunkWords e_;
  };
};

// The 16 rows against N tokens (N <= kFewTokens): per super-block and row the row kernels'
// exact integer, then per 8 rows the scalar vec_dot's float steps lane by lane.
template <typename X, int N>
void GemmFew(int64_t k, const X* w, const uint8_t* a, size_t act_row_bytes, float* out,
             size_t out_stride) {
  __m256 sumf[N][2];  // [token][row half]
#pragma GCC unroll 4
  for (int t = 0; t < N; ++t) sumf[t][0] = sumf[t][1] = _mm256_setzero_ps();
  Few<X> few;
  for (int64_t i = 0; i < k / kQK_K; ++i) {
    const BlockQ8_K* y[N];
#pragma GCC unroll 4
    for (int t = 0; t < N; ++t)
      y[t] = reinterpret_cast<const BlockQ8_K*>(a + t * act_row_bytes) + i;
    few.Prepare(w[i]);
    alignas(32) int32_t acc[N][kRows][8];  // [token][row][8 lanes] integer sums
    for (int r = 0; r < kRows; ++r) {
      const typename Few<X>::Dec dec(few, w[i], r);
      __m256i s[N];
#pragma GCC unroll 4
      for (int t = 0; t < N; ++t) s[t] = _mm256_setzero_si256();
#pragma GCC unroll 8
      for (int c = 0; c < 8; ++c) {
        const IqChunk ch = dec.Chunk(c);
#pragma GCC unroll 4
        for (int t = 0; t < N; ++t) {
          const __m256i q8 = _mm256_sign_epi8(Load256(y[t]->qs + 32 * c), ch.sgn);
          s[t] = _mm256_add_epi32(s[t], _mm256_madd_epi16(_mm256_maddubs_epi16(ch.u, q8), ch.scl));
        }
      }
#pragma GCC unroll 4
      for (int t = 0; t < N; ++t) _mm256_store_si256(reinterpret_cast<__m256i*>(acc[t][r]), s[t]);
    }
#pragma GCC unroll 2
    for (int R = 0; R < 2; ++R) {
      const __m256 dx =
          _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w[i].d + 8 * R)));
#pragma GCC unroll 4
      for (int t = 0; t < N; ++t) {
        auto v = [&](int r) {
          return _mm256_load_si256(reinterpret_cast<const __m256i*>(acc[t][8 * R + r]));
        };
        const __m256i isum =
            _mm256_inserti128_si256(_mm256_castsi128_si256(ReduceAdd4(v(0), v(1), v(2), v(3))),
                                    ReduceAdd4(v(4), v(5), v(6), v(7)), 1);
        const __m256 d = _mm256_mul_ps(dx, _mm256_set1_ps(y[t]->d));
        sumf[t][R] = _mm256_add_ps(sumf[t][R], _mm256_mul_ps(d, _mm256_cvtepi32_ps(isum)));
      }
    }
  }
#pragma GCC unroll 4
  for (int t = 0; t < N; ++t) {
    for (int R = 0; R < 2; ++R) {
      _mm256_storeu_ps(out + t * out_stride + 8 * R,
                       _mm256_mul_ps(_mm256_set1_ps(kFinal<X>), sumf[t][R]));
    }
  }
}

template <typename X>
void GemmFewN(int64_t k, const void* group, const void* act, size_t act_row_bytes, int n,
              float* out, size_t out_stride) {
  const auto* w = static_cast<const X*>(group);
  const auto* a = static_cast<const uint8_t*>(act);
  switch (n) {
    case 1:
      return GemmFew<X, 1>(k, w, a, act_row_bytes, out, out_stride);
    case 2:
      return GemmFew<X, 2>(k, w, a, act_row_bytes, out, out_stride);
    case 3:
      return GemmFew<X, 3>(k, w, a, act_row_bytes, out, out_stride);
    default:
      return GemmFew<X, 4>(k, w, a, act_row_bytes, out, out_stride);
  }
}

// The 16 rows of the group against n tokens (1..kLatticeGemmTokens): per super-block and token
// the exact integer of every row, then the float steps of the scalar vec_dot.
template <typename X>
void Gemm(int64_t k, const void* group, const void* act, size_t act_row_bytes, int n, float* out,
          size_t out_stride) {
  LAMINA_DCHECK(k % kQK_K == 0 && n >= 1 && n <= kLatticeGemmTokens);
  if constexpr (!kIq1<X>) {
    if (n <= kFewTokens) return GemmFewN<X>(k, group, act, act_row_bytes, n, out, out_stride);
  }
  const auto* w = static_cast<const X*>(group);
  const auto* a = static_cast<const uint8_t*>(act);
  auto row = [&](int t) { return reinterpret_cast<const BlockQ8_K*>(a + t * act_row_bytes); };
  alignas(32) float sumf[kLatticeGemmTokens][kRows];    // [token][16 rows]
  alignas(32) int32_t isum[kLatticeGemmTokens][kRows];  // [token][16 rows]
  for (int t = 0; t < n; ++t) {
    for (int R = 0; R < 2; ++R) _mm256_store_ps(sumf[t] + 8 * R, _mm256_setzero_ps());
  }
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  for (int64_t i = 0; i < k / kQK_K; ++i) {
    for (int t = 0; t < n; ++t) {
      for (int R = 0; R < 2; ++R)
        _mm256_store_si256(reinterpret_cast<__m256i*>(isum[t] + 8 * R), _mm256_setzero_si256());
    }
    for (int h = 0; h < kQK_K / 16; ++h) {
      Half half;
      DecodeHalf(w[i], h, &half);
      for (int t = 0; t < n; ++t) {
        const int8_t* q = row(t)[i].qs + 16 * h;
        __m256i c[4];  // the token's 4 code words + 128, broadcast
        for (int j = 0; j < 4; ++j)
          c[j] = _mm256_xor_si256(_mm256_set1_epi32(static_cast<int>(Load32(q + 4 * j))), flip);
        for (int R = 0; R < 2; ++R) {
          auto* p = reinterpret_cast<__m256i*>(isum[t] + 8 * R);
          const __m256i d = _mm256_sub_epi32(Dot(half, R, c), half.zero[R]);
          _mm256_store_si256(p, _mm256_add_epi32(_mm256_load_si256(p), d));
        }
      }
    }
    for (int R = 0; R < 2; ++R) {
      const __m256 dx = LoadD(w[i], R);
      for (int t = 0; t < n; ++t) {
        const __m256 d = _mm256_mul_ps(dx, _mm256_set1_ps(row(t)[i].d));
        const __m256i s = _mm256_load_si256(reinterpret_cast<const __m256i*>(isum[t] + 8 * R));
        _mm256_store_ps(sumf[t] + 8 * R,
                        _mm256_add_ps(_mm256_load_ps(sumf[t] + 8 * R), Scaled<X>(d, s)));
      }
    }
  }
  for (int t = 0; t < n; ++t) {
    for (int R = 0; R < 2; ++R) {
      _mm256_storeu_ps(out + t * out_stride + 8 * R,
                       _mm256_mul_ps(_mm256_set1_ps(kFinal<X>), _mm256_load_ps(sumf[t] + 8 * R)));
    }
  }
}

}  // namespace

// Every type but IQ3_XXS: its few-token path measured 0.88-0.90x its row kernel at 1 token in
// two of three runs and 0.89x at tg64 end to end (docs/PERFORMANCE.md), so it keeps plain rows
// here (its kernels stay for the next try).
void RegisterAvx2InterleavedIq(KernelTable& table) {
  RegisterScalarInterleavedIq(table);
  table[static_cast<int>(GgmlType::kIQ2_XXS)].gemm_interleaved = Gemm<BlockIQ2_XXSx16>;
  table[static_cast<int>(GgmlType::kIQ2_XS)].gemm_interleaved = Gemm<BlockIQ2_XSx16>;
  table[static_cast<int>(GgmlType::kIQ2_S)].gemm_interleaved = Gemm<BlockIQ2_Sx16>;
  UnsetInterleaved(table, GgmlType::kIQ3_XXS);
  (void)Gemm<BlockIQ3_XXSx16>;
  table[static_cast<int>(GgmlType::kIQ3_S)].gemm_interleaved = Gemm<BlockIQ3_Sx16>;
  table[static_cast<int>(GgmlType::kIQ1_S)].gemm_interleaved = Gemm<BlockIQ1_Sx16>;
  table[static_cast<int>(GgmlType::kIQ1_M)].gemm_interleaved = Gemm<BlockIQ1_Mx16>;
}

}  // namespace lamina::quant_internal
