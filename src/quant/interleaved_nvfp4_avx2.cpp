// AVX2 kernel for interleaved NVFP4 weights (BlockNVFP4x16): the 16-row group as two halves of 8
// rows, one 256-bit lane per row, one f32 accumulator register per token and half (the one-row
// dot's order, lowbit_common.inc). A 16-value sub-block of a half is two 32-byte chunk loads;
// their low and high nibbles become signed E2M1 levels w by one vpshufb each, and each token's
// four runs of 4 activation codes, broadcast, are multiplied by maddubs(|w|, sign(q, w)), the four
// int16 results added (at most 8 * 12 * 127 per word, so none saturates) and widened by one madd:
// the exact int32 sub-block sums of the scalar twin. Then one convert, the scale's multiply, a
// multiply and an add per sub-block (no FMA), so every output is the scalar vec_dot's bits.
// Tokens go in tiles of up to 4, so the accumulators and the sub-block's levels fit the 16
// registers.
#include <immintrin.h>

#include <cstring>

#include "quant/kernel_registry.h"

namespace lamina::quant_internal {
namespace {

constexpr int kRows = kQ8_0x16Rows;
constexpr int kTokens = 4;  // tokens per register tile

// Rows [8h, 8h + 8)'s halved UE4M3 scales (Ue4m3ToF32Half) from their codes x, by the f32 bits:
// for an exponent field > 0, ((x & 0x7F) << 20) + (119 << 23) is (8 + man) * 2^(exp - 11); for
// exponent 0, man * 2^-10 (exact); code 0x7F reads as 0.
inline __m256 Ue4m3Half(const uint8_t* d) {
  int64_t bytes;
  std::memcpy(&bytes, d, sizeof(bytes));
  const __m256i x = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(bytes));
  const __m256i v = _mm256_and_si256(x, _mm256_set1_epi32(0x7F));
  const __m256 normal =
      _mm256_castsi256_ps(_mm256_add_epi32(_mm256_slli_epi32(v, 20), _mm256_set1_epi32(119 << 23)));
  const __m256 sub = _mm256_mul_ps(_mm256_cvtepi32_ps(v), _mm256_set1_ps(1.0f / 1024.0f));
  const __m256 is_sub = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(8), v));
  const __m256 zero = _mm256_castsi256_ps(_mm256_cmpeq_epi32(x, _mm256_set1_epi32(0x7F)));
  return _mm256_andnot_ps(zero, _mm256_blendv_ps(normal, sub, is_sub));
}

inline __m256i Broadcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof(v));
  return _mm256_set1_epi32(v);
}

// Rows [8h, 8h + 8) against N tokens.
template <int N>
void Half(int64_t nb, const BlockNVFP4x16* w, int h, const BlockQ8_0Act* const* a, float* out,
          size_t out_stride) {
  __m256 acc[N];  // [tokens] 8 rows
  for (int t = 0; t < N; ++t) acc[t] = _mm256_setzero_ps();
  const __m256i levels =
      _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kMxfp4Levels)));
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t i = 0; i < nb; ++i) {
#pragma GCC unroll 4
    for (int sb = 0; sb < 4; ++sb) {
      // s[2j + n]: chunk 2 sb + j's low (n = 0) or high (n = 1) nibbles' levels, the sub-block's
      // elements 4j + 8n .. 4j + 8n + 3 of every row; x: their magnitudes.
      __m256i s[4], x[4];
#pragma GCC unroll 2
      for (int j = 0; j < 2; ++j) {
        const __m256i v = _mm256_loadu_si256(
            reinterpret_cast<const __m256i*>(w[i].qs + 64 * (2 * sb + j) + 32 * h));
        s[2 * j] = _mm256_shuffle_epi8(levels, _mm256_and_si256(v, m4));
        s[2 * j + 1] = _mm256_shuffle_epi8(levels, _mm256_and_si256(_mm256_srli_epi16(v, 4), m4));
      }
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) x[j] = _mm256_sign_epi8(s[j], s[j]);
      const __m256 sw = Ue4m3Half(w[i].d + kRows * sb + 8 * h);
#pragma GCC unroll 4
      for (int t = 0; t < N; ++t) {
        const BlockQ8_0Act& y = a[t][2 * i + sb / 2];
        const int8_t* q = y.qs + 16 * (sb % 2);
        const __m256 scale = _mm256_mul_ps(sw, _mm256_set1_ps(y.d));
        const __m256i p0 = _mm256_maddubs_epi16(x[0], _mm256_sign_epi8(Broadcast4(q), s[0]));
        const __m256i p1 = _mm256_maddubs_epi16(x[1], _mm256_sign_epi8(Broadcast4(q + 8), s[1]));
        const __m256i p2 = _mm256_maddubs_epi16(x[2], _mm256_sign_epi8(Broadcast4(q + 4), s[2]));
        const __m256i p3 = _mm256_maddubs_epi16(x[3], _mm256_sign_epi8(Broadcast4(q + 12), s[3]));
        const __m256i isum = _mm256_madd_epi16(
            _mm256_add_epi16(_mm256_add_epi16(p0, p1), _mm256_add_epi16(p2, p3)), ones);
        acc[t] = _mm256_add_ps(acc[t], _mm256_mul_ps(scale, _mm256_cvtepi32_ps(isum)));
      }
    }
  }
  for (int t = 0; t < N; ++t) _mm256_storeu_ps(out + t * out_stride + 8 * h, acc[t]);
}

template <int N>
void GemmN(int64_t nb, const BlockNVFP4x16* w, const char* act, size_t act_row_bytes, float* out,
           size_t out_stride) {
  const BlockQ8_0Act* a[N];
  for (int t = 0; t < N; ++t) a[t] = reinterpret_cast<const BlockQ8_0Act*>(act + t * act_row_bytes);
  for (int h = 0; h < kRows / 8; ++h) Half<N>(nb, w, h, a, out, out_stride);
}

void Gemm(int64_t k, const void* group, const void* act, size_t act_row_bytes, int n_act,
          float* out, size_t out_stride) {
  const auto* w = static_cast<const BlockNVFP4x16*>(group);
  const char* a = static_cast<const char*>(act);
  const int64_t nb = k / kQKNvfp4;
  for (int t = 0; t < n_act; t += kTokens) {
    const int n = n_act - t < kTokens ? n_act - t : kTokens;
    const char* at = a + t * act_row_bytes;
    float* ot = out + t * out_stride;
    switch (n) {
      case 1:
        GemmN<1>(nb, w, at, act_row_bytes, ot, out_stride);
        break;
      case 2:
        GemmN<2>(nb, w, at, act_row_bytes, ot, out_stride);
        break;
      case 3:
        GemmN<3>(nb, w, at, act_row_bytes, ot, out_stride);
        break;
      default:
        GemmN<4>(nb, w, at, act_row_bytes, ot, out_stride);
        break;
    }
  }
}

}  // namespace

void RegisterAvx2InterleavedNvfp4(KernelTable& table) {
  table[static_cast<int>(GgmlType::kNVFP4)].gemm_interleaved = Gemm;
}

}  // namespace lamina::quant_internal
