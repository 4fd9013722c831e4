// AVX2 kernels of the interleaved IQ1_S and IQ1_M (BlockIQ1_Sx16, BlockIQ1_Mx16 against Q8_K):
// int32 lane r of a register is row 8R + r of the group's half R (two registers per field). Per
// 16-value half of a super-block the 16 rows' signed weights 8 * grid + delta (|w| <= 9) are
// decoded once into eight registers (4 values per lane, grid entries by AVX2 gathers from
// kIq1Grid8Delta) with the rows' scales 2s + 1 as 16-bit words; every token of the call (up to
// kLatticeGemmTokens) then costs, per 8 rows, four vpmaddubsw of its broadcast codes + 128
// against the weights, four vpmaddwd by the scales and a subtraction of the same sums for codes
// 0 (128 times the weights' sum, computed once per half). That is the row kernels' exact integer
// per super-block and row, and the float steps are theirs lane by lane: every output is the
// scalar vec_dot's bits (iquants.cpp), whatever the batch.
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

namespace lamina::quant_internal {
namespace {

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
// broadcast words c[j] (already + 128). Each vpmaddubsw pair is at most 2 * 255 * 9 < 2^15
// (any |w| < 64 would do).
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
  static_assert(kIq1<X>);
  return _mm256_mul_ps(d, _mm256_mul_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(0.125f)));
}

inline int32_t Load32(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// The 16 rows of the group against n tokens (1..kLatticeGemmTokens): per super-block and token
// the exact integer of every row, then the float steps of the scalar vec_dot.
template <typename X>
void Gemm(int64_t k, const void* group, const void* act, size_t act_row_bytes, int n, float* out,
          size_t out_stride) {
  LAMINA_DCHECK(k % kQK_K == 0 && n >= 1 && n <= kLatticeGemmTokens);
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
          c[j] = _mm256_xor_si256(_mm256_set1_epi32(Load32(q + 4 * j)), flip);
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
                       _mm256_mul_ps(_mm256_set1_ps(1.0f), _mm256_load_ps(sumf[t] + 8 * R)));
    }
  }
}

void Unset(KernelTable& table, GgmlType type) {
  TypeKernels& e = table[static_cast<int>(type)];
  e.interleave_rows = 0;
  e.repack = nullptr;
  e.gemm_interleaved = nullptr;
  e.gemm_max_tokens = kMaxMultiDot;
}

}  // namespace

// IQ1_S and IQ1_M only: the other five types' kernel (the same scheme, gathers and sign masks)
// was 0.72-0.94x the row kernels at 1 token and 0.92-1.10x at 8 (docs/PERFORMANCE.md), so they
// keep plain rows here.
void RegisterAvx2InterleavedIq(KernelTable& table) {
  RegisterScalarInterleavedIq(table);
  for (GgmlType t : {GgmlType::kIQ2_XXS, GgmlType::kIQ2_XS, GgmlType::kIQ2_S, GgmlType::kIQ3_XXS,
                     GgmlType::kIQ3_S})
    Unset(table, t);
  table[static_cast<int>(GgmlType::kIQ1_S)].gemm_interleaved = Gemm<BlockIQ1_Sx16>;
  table[static_cast<int>(GgmlType::kIQ1_M)].gemm_interleaved = Gemm<BlockIQ1_Mx16>;
}

}  // namespace lamina::quant_internal
