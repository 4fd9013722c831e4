// AVX-512 VNNI kernel for interleaved NVFP4 weights (BlockNVFP4x16): one 512-bit lane per row of
// the 16-row group, one f32 accumulator register per token (the one-row dot's order,
// lowbit_common.inc). A 16-value sub-block is two 64-byte chunks; their low and high nibbles
// become signed E2M1 levels by one vpshufb each, and each token's four runs of 4 activation
// codes, offset to unsigned (q + 128) and broadcast, are dotted with them by four vpdpbusd
// started at -128 * sum(levels) (shared by all tokens), so each int32 lane is the exact integer
// sum of the scalar twin; then one convert, the scale's multiply, a multiply and an add per
// sub-block (separate multiply and add, no FMA), so every output is the scalar vec_dot's bits.
// GCC 12's AVX-512 headers self-initialise their "undefined" vectors, which -Wall reports at
// every inlined intrinsic (GCC PR105593); the warnings say nothing about this file.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstring>

#include "quant/kernel_registry.h"

namespace lamina::quant_internal {
namespace {

constexpr int kRows = kQ8_0x16Rows;

// The 16 rows' halved UE4M3 scales (Ue4m3ToF32Half) from their codes x, by the f32 bits: for an
// exponent field > 0, ((x & 0x7F) << 20) + (119 << 23) is (8 + man) * 2^(exp - 11); for exponent
// 0, man * 2^-10 (exact); code 0x7F reads as 0.
inline __m512 Ue4m3Half(const uint8_t* d) {
  const __m512i x = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(d)));
  const __m512i v = _mm512_and_si512(x, _mm512_set1_epi32(0x7F));
  const __m512 normal =
      _mm512_castsi512_ps(_mm512_add_epi32(_mm512_slli_epi32(v, 20), _mm512_set1_epi32(119 << 23)));
  const __m512 sub = _mm512_mul_ps(_mm512_cvtepi32_ps(v), _mm512_set1_ps(1.0f / 1024.0f));
  const __mmask16 is_sub = _mm512_cmplt_epi32_mask(v, _mm512_set1_epi32(8));
  const __mmask16 nonzero = _mm512_cmpneq_epi32_mask(x, _mm512_set1_epi32(0x7F));
  return _mm512_maskz_mov_ps(nonzero, _mm512_mask_blend_ps(is_sub, normal, sub));
}

// 4 activation codes at p, offset to unsigned, in every 32-bit lane.
inline __m512i BroadcastUnsigned4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof(v));
  return _mm512_xor_si512(_mm512_set1_epi32(v), _mm512_set1_epi8(static_cast<char>(0x80)));
}

template <int N>
void GemmN(int64_t nb, const BlockNVFP4x16* w, const char* act, size_t act_row_bytes, float* out,
           size_t out_stride) {
  const BlockQ8_0Act* a[N];
  for (int t = 0; t < N; ++t) a[t] = reinterpret_cast<const BlockQ8_0Act*>(act + t * act_row_bytes);
  __m512 acc[N];  // [tokens] 16 rows
#pragma GCC unroll 8
  for (int t = 0; t < N; ++t) acc[t] = _mm512_setzero_ps();
  const __m512i levels =
      _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kMxfp4Levels)));
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  const __m512i u128 = _mm512_set1_epi8(static_cast<char>(0x80));
  for (int64_t i = 0; i < nb; ++i) {
#pragma GCC unroll 4
    for (int sb = 0; sb < 4; ++sb) {
      // w[h][n]: chunk 2 sb + h's low (n = 0) or high (n = 1) nibbles' levels, the sub-block's
      // elements 4h + 8n .. 4h + 8n + 3 of every row.
      const __m512i v0 = _mm512_loadu_si512(w[i].qs + 64 * (2 * sb));
      const __m512i v1 = _mm512_loadu_si512(w[i].qs + 64 * (2 * sb + 1));
      const __m512i w00 = _mm512_shuffle_epi8(levels, _mm512_and_si512(v0, m4));
      const __m512i w01 =
          _mm512_shuffle_epi8(levels, _mm512_and_si512(_mm512_srli_epi16(v0, 4), m4));
      const __m512i w10 = _mm512_shuffle_epi8(levels, _mm512_and_si512(v1, m4));
      const __m512i w11 =
          _mm512_shuffle_epi8(levels, _mm512_and_si512(_mm512_srli_epi16(v1, 4), m4));
      __m512i bias = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u128, w00);
      bias = _mm512_dpbusd_epi32(bias, u128, w01);
      bias = _mm512_dpbusd_epi32(bias, u128, w10);
      bias = _mm512_dpbusd_epi32(bias, u128, w11);
      const __m512i init = _mm512_sub_epi32(_mm512_setzero_si512(), bias);
      const __m512 sw = Ue4m3Half(w[i].d + kRows * sb);
#pragma GCC unroll 8
      for (int t = 0; t < N; ++t) {
        const BlockQ8_0Act& y = a[t][2 * i + sb / 2];
        const int8_t* q = y.qs + 16 * (sb % 2);
        const __m512 scale = _mm512_mul_ps(sw, _mm512_set1_ps(y.d));
        const __m512i d0 = _mm512_dpbusd_epi32(init, BroadcastUnsigned4(q), w00);
        const __m512i d1 =
            _mm512_dpbusd_epi32(_mm512_setzero_si512(), BroadcastUnsigned4(q + 8), w01);
        const __m512i d2 = _mm512_dpbusd_epi32(d0, BroadcastUnsigned4(q + 4), w10);
        const __m512i d3 = _mm512_dpbusd_epi32(d1, BroadcastUnsigned4(q + 12), w11);
        const __m512i isum = _mm512_add_epi32(d2, d3);
        acc[t] = _mm512_add_ps(acc[t], _mm512_mul_ps(scale, _mm512_cvtepi32_ps(isum)));
      }
    }
  }
#pragma GCC unroll 8
  for (int t = 0; t < N; ++t) _mm512_storeu_ps(out + t * out_stride, acc[t]);
}

void Gemm(int64_t k, const void* group, const void* act, size_t act_row_bytes, int n_act,
          float* out, size_t out_stride) {
  const auto* w = static_cast<const BlockNVFP4x16*>(group);
  const char* a = static_cast<const char*>(act);
  const int64_t nb = k / kQKNvfp4;
  switch (n_act) {
    case 1:
      return GemmN<1>(nb, w, a, act_row_bytes, out, out_stride);
    case 2:
      return GemmN<2>(nb, w, a, act_row_bytes, out, out_stride);
    case 3:
      return GemmN<3>(nb, w, a, act_row_bytes, out, out_stride);
    case 4:
      return GemmN<4>(nb, w, a, act_row_bytes, out, out_stride);
    case 5:
      return GemmN<5>(nb, w, a, act_row_bytes, out, out_stride);
    case 6:
      return GemmN<6>(nb, w, a, act_row_bytes, out, out_stride);
    case 7:
      return GemmN<7>(nb, w, a, act_row_bytes, out, out_stride);
    default:
      return GemmN<8>(nb, w, a, act_row_bytes, out, out_stride);
  }
}

}  // namespace

void RegisterAvx512InterleavedNvfp4(KernelTable& table) {
  table[static_cast<int>(GgmlType::kNVFP4)].gemm_interleaved = Gemm;
}

}  // namespace lamina::quant_internal
