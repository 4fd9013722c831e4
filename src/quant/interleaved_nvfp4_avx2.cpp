// AVX2 kernel for interleaved NVFP4 weights (BlockNVFP4x16): the 16-row group as two halves of 8
// rows, one 256-bit lane per row. A 32-byte load of a half's chunk c holds two of the one-row
// dot's eight accumulator lanes (low and high nibbles); each becomes signed E2M1 levels w by one
// vpshufb, and each token's 4 activation codes, broadcast, are multiplied by maddubs(|w|,
// sign(q, w)) and madd: the exact int32 lane dots of the scalar twin (|w| <= 12, so no pair
// saturates). The float steps are the twin's (separate multiply and add, no FMA), so every output
// is the scalar vec_dot's bits. Tokens go in tiles of up to 4; tiles of more than one token run
// the block loop in 2 or 4 passes over disjoint chunks (lanes), so the accumulators fit the 16
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

// Chunk c's low-nibble lane (its high nibbles are that lane + 2).
constexpr int LoLane(int c) { return 4 * ((c / 2) % 2) + c % 2; }

// Pass q of P over rows [8h, 8h + 8): chunks c = q + P m (m < 8 / P), lanes LoLane(c) and
// LoLane(c) + 2 in accumulator slots 2 m', 2 m' + 1 (m' = (c % 4 - q) / P), for N tokens.
template <int N, int P>
void Pass(int64_t nb, const BlockNVFP4x16* w, int h, const BlockQ8_0Act* const* a, int q,
          float (*lanes)[8][kRows]) {
  constexpr int kSlots = 8 / P;
  __m256 acc[N][kSlots];
  for (int t = 0; t < N; ++t) {
    for (int s = 0; s < kSlots; ++s) acc[t][s] = _mm256_setzero_ps();
  }
  const __m256i levels =
      _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kMxfp4Levels)));
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t i = 0; i < nb; ++i) {
#pragma GCC unroll 8
    for (int m = 0; m < 8 / P; ++m) {
      const int c = q + P * m;
      const int g = c / 4, slot = 2 * ((c % 4 - q) / P), lo = LoLane(c);
      const __m256i v =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[i].qs + 64 * c + 32 * h));
      const __m256i slo = _mm256_shuffle_epi8(levels, _mm256_and_si256(v, m4));
      const __m256i shi =
          _mm256_shuffle_epi8(levels, _mm256_and_si256(_mm256_srli_epi16(v, 4), m4));
      const __m256i xlo = _mm256_sign_epi8(slo, slo), xhi = _mm256_sign_epi8(shi, shi);
      const __m256 sw = Ue4m3Half(w[i].d + kRows * (c / 2) + 8 * h);
#pragma GCC unroll 4
      for (int t = 0; t < N; ++t) {
        const BlockQ8_0Act& y = a[t][2 * i + g];
        const __m256 scale = _mm256_mul_ps(sw, _mm256_set1_ps(y.d));
        const __m256i ilo = _mm256_madd_epi16(
            _mm256_maddubs_epi16(xlo, _mm256_sign_epi8(Broadcast4(y.qs + 4 * lo), slo)), ones);
        const __m256i ihi = _mm256_madd_epi16(
            _mm256_maddubs_epi16(xhi, _mm256_sign_epi8(Broadcast4(y.qs + 4 * (lo + 2)), shi)),
            ones);
        acc[t][slot] = _mm256_add_ps(acc[t][slot], _mm256_mul_ps(scale, _mm256_cvtepi32_ps(ilo)));
        acc[t][slot + 1] =
            _mm256_add_ps(acc[t][slot + 1], _mm256_mul_ps(scale, _mm256_cvtepi32_ps(ihi)));
      }
    }
  }
  for (int m = 0; m < 4 / P; ++m) {
    const int c = q + P * m;
    for (int t = 0; t < N; ++t) {
      _mm256_storeu_ps(lanes[t][LoLane(c)] + 8 * h, acc[t][2 * m]);
      _mm256_storeu_ps(lanes[t][LoLane(c) + 2] + 8 * h, acc[t][2 * m + 1]);
    }
  }
}

template <int N, int P>
void GemmN(int64_t nb, const BlockNVFP4x16* w, const char* act, size_t act_row_bytes, float* out,
           size_t out_stride) {
  const BlockQ8_0Act* a[N];
  for (int t = 0; t < N; ++t) a[t] = reinterpret_cast<const BlockQ8_0Act*>(act + t * act_row_bytes);
  alignas(32) float lanes[N][8][kRows];  // [tokens][8 accumulator lanes][rows]
  for (int h = 0; h < kRows / 8; ++h) {
    for (int q = 0; q < P; ++q) Pass<N, P>(nb, w, h, a, q, lanes);
  }
  for (int t = 0; t < N; ++t) {
    for (int h = 0; h < kRows / 8; ++h) {
      __m256 l[8];
      for (int j = 0; j < 8; ++j) l[j] = _mm256_load_ps(lanes[t][j] + 8 * h);
      // LowBitLaneSum: ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)).
      const __m256 even = _mm256_add_ps(_mm256_add_ps(l[0], l[4]), _mm256_add_ps(l[2], l[6]));
      const __m256 odd = _mm256_add_ps(_mm256_add_ps(l[1], l[5]), _mm256_add_ps(l[3], l[7]));
      _mm256_storeu_ps(out + t * out_stride + 8 * h, _mm256_add_ps(even, odd));
    }
  }
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
        GemmN<1, 1>(nb, w, at, act_row_bytes, ot, out_stride);
        break;
      case 2:
        GemmN<2, 2>(nb, w, at, act_row_bytes, ot, out_stride);
        break;
      case 3:
        GemmN<3, 4>(nb, w, at, act_row_bytes, ot, out_stride);
        break;
      default:
        GemmN<4, 4>(nb, w, at, act_row_bytes, ot, out_stride);
        break;
    }
  }
}

}  // namespace

void RegisterAvx2InterleavedNvfp4(KernelTable& table) {
  table[static_cast<int>(GgmlType::kNVFP4)].gemm_interleaved = Gemm;
}

}  // namespace lamina::quant_internal
