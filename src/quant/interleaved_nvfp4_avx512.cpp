// AVX-512 VNNI kernel for interleaved NVFP4 weights (BlockNVFP4x16): one 512-bit lane per row of
// the 16-row group. A 64-byte load of chunk c holds two of the one-row dot's eight accumulator
// lanes for all 16 rows (low nibbles and high nibbles); each becomes signed E2M1 levels by one
// vpshufb, and each token's 4 activation codes, offset to unsigned (q + 128) and broadcast, are
// dotted with them by one vpdpbusd started at -128 * sum(levels) (shared by all tokens), so each
// int32 lane is the exact integer dot of the scalar twin. The float steps are the twin's
// (separate multiply and add, no FMA), so every output is the scalar vec_dot's bits. The eight
// accumulators of 16 rows take 8 registers per token: batches of more than two tokens run the
// block loop in 2 or 4 passes, each over a disjoint set of chunks (lanes). GCC 12's AVX-512
// headers self-initialise their "undefined" vectors, which -Wall reports at every inlined
// intrinsic (GCC PR105593); the warnings say nothing about this file.
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

inline __m512i BroadcastUnsigned4(const int8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof(v));
  return _mm512_set1_epi32(static_cast<int>(v ^ 0x80808080u));
}

// Pass q of P: the chunks c = q + P m (m < 8 / P), lanes LoLane(c) and LoLane(c) + 2 in
// accumulator slots 2 m', 2 m' + 1 (m' = (c % 4 - q) / P) for N tokens.
constexpr int LoLane(int c) { return 4 * ((c / 2) % 2) + c % 2; }

template <int N, int P>
void Pass(int64_t nb, const BlockNVFP4x16* w, const BlockQ8_0Act* const* a, int q,
          float (*lanes)[8][kRows]) {
  constexpr int kSlots = 8 / P;
  __m512 acc[N][kSlots];
#pragma GCC unroll 8
  for (int t = 0; t < N; ++t) {
#pragma GCC unroll 8
    for (int s = 0; s < kSlots; ++s) acc[t][s] = _mm512_setzero_ps();
  }
  const __m512i levels =
      _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kMxfp4Levels)));
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  const __m512i u128 = _mm512_set1_epi8(static_cast<char>(0x80));
  for (int64_t i = 0; i < nb; ++i) {
#pragma GCC unroll 8
    for (int m = 0; m < 8 / P; ++m) {
      const int c = q + P * m;
      const int g = c / 4, slot = 2 * ((c % 4 - q) / P), lo = LoLane(c);
      const __m512i v = _mm512_loadu_si512(w[i].qs + 64 * c);
      const __m512i wlo = _mm512_shuffle_epi8(levels, _mm512_and_si512(v, m4));
      const __m512i whi =
          _mm512_shuffle_epi8(levels, _mm512_and_si512(_mm512_srli_epi16(v, 4), m4));
      const __m512i nlo = _mm512_sub_epi32(_mm512_setzero_si512(),
                                           _mm512_dpbusd_epi32(_mm512_setzero_si512(), u128, wlo));
      const __m512i nhi = _mm512_sub_epi32(_mm512_setzero_si512(),
                                           _mm512_dpbusd_epi32(_mm512_setzero_si512(), u128, whi));
      const __m512 sw = Ue4m3Half(w[i].d + kRows * (c / 2));
#pragma GCC unroll 8
      for (int t = 0; t < N; ++t) {
        const BlockQ8_0Act& y = a[t][2 * i + g];
        const __m512 scale = _mm512_mul_ps(sw, _mm512_set1_ps(y.d));
        const __m512i ilo = _mm512_dpbusd_epi32(nlo, BroadcastUnsigned4(y.qs + 4 * lo), wlo);
        const __m512i ihi = _mm512_dpbusd_epi32(nhi, BroadcastUnsigned4(y.qs + 4 * (lo + 2)), whi);
        acc[t][slot] = _mm512_add_ps(acc[t][slot], _mm512_mul_ps(scale, _mm512_cvtepi32_ps(ilo)));
        acc[t][slot + 1] =
            _mm512_add_ps(acc[t][slot + 1], _mm512_mul_ps(scale, _mm512_cvtepi32_ps(ihi)));
      }
    }
  }
#pragma GCC unroll 8
  for (int m = 0; m < 4 / P; ++m) {
    const int c = q + P * m;
#pragma GCC unroll 8
    for (int t = 0; t < N; ++t) {
      _mm512_storeu_ps(lanes[t][LoLane(c)], acc[t][2 * m]);
      _mm512_storeu_ps(lanes[t][LoLane(c) + 2], acc[t][2 * m + 1]);
    }
  }
}

template <int N, int P>
void GemmN(int64_t nb, const BlockNVFP4x16* w, const char* act, size_t act_row_bytes, float* out,
           size_t out_stride) {
  const BlockQ8_0Act* a[N];
  for (int t = 0; t < N; ++t) a[t] = reinterpret_cast<const BlockQ8_0Act*>(act + t * act_row_bytes);
  alignas(64) float lanes[N][8][kRows];  // [tokens][8 accumulator lanes][rows]
  for (int q = 0; q < P; ++q) Pass<N, P>(nb, w, a, q, lanes);
  for (int t = 0; t < N; ++t) {
    __m512 l[8];
    for (int j = 0; j < 8; ++j) l[j] = _mm512_load_ps(lanes[t][j]);
    // LowBitLaneSum: ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)).
    const __m512 even = _mm512_add_ps(_mm512_add_ps(l[0], l[4]), _mm512_add_ps(l[2], l[6]));
    const __m512 odd = _mm512_add_ps(_mm512_add_ps(l[1], l[5]), _mm512_add_ps(l[3], l[7]));
    _mm512_storeu_ps(out + t * out_stride, _mm512_add_ps(even, odd));
  }
}

void Gemm(int64_t k, const void* group, const void* act, size_t act_row_bytes, int n_act,
          float* out, size_t out_stride) {
  const auto* w = static_cast<const BlockNVFP4x16*>(group);
  const char* a = static_cast<const char*>(act);
  const int64_t nb = k / kQKNvfp4;
  switch (n_act) {
    case 1:
      return GemmN<1, 1>(nb, w, a, act_row_bytes, out, out_stride);
    case 2:
      return GemmN<2, 1>(nb, w, a, act_row_bytes, out, out_stride);
    case 3:
      return GemmN<3, 2>(nb, w, a, act_row_bytes, out, out_stride);
    case 4:
      return GemmN<4, 2>(nb, w, a, act_row_bytes, out, out_stride);
    case 5:
      return GemmN<5, 4>(nb, w, a, act_row_bytes, out, out_stride);
    case 6:
      return GemmN<6, 4>(nb, w, a, act_row_bytes, out, out_stride);
    case 7:
      return GemmN<7, 4>(nb, w, a, act_row_bytes, out, out_stride);
    default:
      return GemmN<8, 4>(nb, w, a, act_row_bytes, out, out_stride);
  }
}

}  // namespace

void RegisterAvx512InterleavedNvfp4(KernelTable& table) {
  table[static_cast<int>(GgmlType::kNVFP4)].gemm_interleaved = Gemm;
}

}  // namespace lamina::quant_internal
