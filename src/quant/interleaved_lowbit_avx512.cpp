// AVX-512 VNNI kernels for interleaved Q1_0 and Q2_0 weights (BlockQ1_0x16, BlockQ2_0x16): one
// 512-bit register per row pair and 32-value group, its 64 bytes the two rows' signed values
// (Q1_0: +-1 blended from the pair's 64-bit sign mask; Q2_0: the pair's 16 code bytes shifted by
// 0, 2, 4, 6 and masked, less 1). Each token's 32 activation codes, offset to unsigned (q + 128)
// and broadcast to both halves, are dotted with them by one vpdpbusd started at -128 * the
// 4-value sums of the weights, so int32 lane l of each half is the scalar twin's lane l of that
// row (lowbit_common.inc); then the twin's float steps (scale = d * d_a, lane += scale *
// float(lane sum), no FMA) and LowBitLaneSum at the end, so every output is the scalar vec_dot's
// bits. GCC 12's AVX-512 headers self-initialise their "undefined" vectors, which -Wall reports
// at every inlined intrinsic (GCC PR105593); the warnings say nothing about this file.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "quant/kernel_registry.h"
#include "quant/types.h"

namespace lamina::quant_internal {
namespace {

constexpr int kRows = kQ8_0x16Rows;

// A row pair's signed values of one group and the dot's starting value.
struct Pair {
  __m512i w;     // [2 rows][32] signed values
  __m512i init;  // [2 rows][8 lanes] -128 * sum of the lane's 4 values
};

inline __m512i InitOf(__m512i w) {
  return _mm512_sub_epi32(
      _mm512_setzero_si512(),
      _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(static_cast<char>(0x80)), w));
}

struct Q1 {
  using Block = BlockQ1_0x16;
  static constexpr int kGroups = 4;  // 128 values
  static Pair Prepare(const Block& b, int g, int p) {
    uint64_t bits;
    std::memcpy(&bits, b.qs + 64 * g + 8 * p, sizeof(bits));
    const __m512i w =
        _mm512_mask_blend_epi8(_cvtu64_mask64(bits), _mm512_set1_epi8(-1), _mm512_set1_epi8(1));
    return {w, InitOf(w)};
  }
};

struct Q2 {
  using Block = BlockQ2_0x16;
  static constexpr int kGroups = 2;  // 64 values
  static Pair Prepare(const Block& b, int g, int p) {
    const __m512i x = _mm512_broadcast_i32x4(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs + 128 * g + 16 * p)));
    const __m512i codes = _mm512_and_si512(
        _mm512_srlv_epi64(x, _mm512_set_epi64(6, 6, 4, 4, 2, 2, 0, 0)), _mm512_set1_epi8(3));
    const __m512i w = _mm512_sub_epi8(codes, _mm512_set1_epi8(1));
    return {w, InitOf(w)};
  }
};

// LowBitLaneSum over the 8 lanes at l.
inline float LaneSum(const float* l) {
  return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}

// Pairs [p0, p0 + P) against N tokens.
template <typename T, int P, int N>
void PairsN(int64_t nb, const typename T::Block* w, const BlockQ8_0Act* const* a, int p0,
            float* out, size_t out_stride) {
  constexpr int kG = T::kGroups;
  __m512 acc[P][N];  // [pairs][tokens] 2 rows x 8 lanes
  for (int p = 0; p < P; ++p) {
    for (int t = 0; t < N; ++t) acc[p][t] = _mm512_setzero_ps();
  }
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  for (int64_t i = 0; i < nb; ++i) {
    const __m512 d_all =
        _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[i].d)));
    __m512 dw[P];  // row 2p's d in lanes 0-7, row 2p + 1's in 8-15
#pragma GCC unroll 8
    for (int p = 0; p < P; ++p) {
      const __m512i idx =
          _mm512_add_epi32(_mm512_set1_epi32(2 * (p0 + p)),
                           _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0));
      dw[p] = _mm512_permutexvar_ps(idx, d_all);
    }
#pragma GCC unroll 4
    for (int g = 0; g < kG; ++g) {
#pragma GCC unroll 8
      for (int p = 0; p < P; ++p) {
        const Pair wp = T::Prepare(w[i], g, p0 + p);
#pragma GCC unroll 8
        for (int t = 0; t < N; ++t) {
          const BlockQ8_0Act& y = a[t][kG * i + g];
          const __m512i au = _mm512_xor_si512(
              _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(y.qs))),
              flip);
          const __m512i dot = _mm512_dpbusd_epi32(wp.init, au, wp.w);
          const __m512 scale = _mm512_mul_ps(dw[p], _mm512_set1_ps(y.d));
          acc[p][t] = _mm512_add_ps(acc[p][t], _mm512_mul_ps(scale, _mm512_cvtepi32_ps(dot)));
        }
      }
    }
  }
  for (int p = 0; p < P; ++p) {
    for (int t = 0; t < N; ++t) {
      alignas(64) float l[16];  // [2 rows][8 lanes]
      _mm512_store_ps(l, acc[p][t]);
      out[t * out_stride + 2 * (p0 + p)] = LaneSum(l);
      out[t * out_stride + 2 * (p0 + p) + 1] = LaneSum(l + 8);
    }
  }
}

template <typename T, int N>
void GemmN(int64_t nb, const typename T::Block* w, const char* act, size_t act_row_bytes,
           float* out, size_t out_stride) {
  const BlockQ8_0Act* a[N];
  for (int t = 0; t < N; ++t) a[t] = reinterpret_cast<const BlockQ8_0Act*>(act + t * act_row_bytes);
  // P pairs x N tokens of accumulators stay within the 32 registers with the pairs' values.
  constexpr int P = N <= 2 ? 4 : 2;
  for (int p0 = 0; p0 < kRows / 2; p0 += P) PairsN<T, P, N>(nb, w, a, p0, out, out_stride);
}

template <typename T>
void Gemm(int64_t k, const void* group, const void* act, size_t act_row_bytes, int n_act,
          float* out, size_t out_stride) {
  const auto* w = static_cast<const typename T::Block*>(group);
  const char* a = static_cast<const char*>(act);
  const int64_t nb = k / (kQK * T::kGroups);
  switch (n_act) {
    case 1:
      return GemmN<T, 1>(nb, w, a, act_row_bytes, out, out_stride);
    case 2:
      return GemmN<T, 2>(nb, w, a, act_row_bytes, out, out_stride);
    case 3:
      return GemmN<T, 3>(nb, w, a, act_row_bytes, out, out_stride);
    case 4:
      return GemmN<T, 4>(nb, w, a, act_row_bytes, out, out_stride);
    case 5:
      return GemmN<T, 5>(nb, w, a, act_row_bytes, out, out_stride);
    case 6:
      return GemmN<T, 6>(nb, w, a, act_row_bytes, out, out_stride);
    case 7:
      return GemmN<T, 7>(nb, w, a, act_row_bytes, out, out_stride);
    default:
      return GemmN<T, 8>(nb, w, a, act_row_bytes, out, out_stride);
  }
}

}  // namespace

void RegisterAvx512InterleavedLowBit(KernelTable& table) {
  RegisterScalarInterleavedLowBit(table);  // the AVX2 registration turned the layouts off
  table[static_cast<int>(GgmlType::kQ1_0)].gemm_interleaved = Gemm<Q1>;
  table[static_cast<int>(GgmlType::kQ2_0)].gemm_interleaved = Gemm<Q2>;
}

}  // namespace lamina::quant_internal
