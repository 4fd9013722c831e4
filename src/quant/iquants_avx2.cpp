// AVX2 dot products of the lattice i-quants (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M
// against Q8_K). A super-block is decoded chunk by chunk (32 values) and each chunk is used at
// once by every activation row: the grid entries by broadcast loads and blends (8-byte entries) or
// inserts (4-byte entries) from the indices as bytes in memory (AVX2 gathers were slower on the
// measured core), the +-1 sign bytes by one in-lane vpshufb of the super-block's 32 sign bytes
// (7-bit indices completed by a parity lookup) and a bit test, the scales by one vpshufb; then
// per row one vpsignb, vpmaddubsw and vpmaddwd per chunk, and rows in fours share one horizontal
// reduction, their float steps lane by lane. The integer sums and float steps are the scalar
// twins' (iquants.cpp), so every output is their bits and does not depend on the batch.
#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

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

// N activation rows against one weight row: per super-block and row the exact integer sum (the
// scalar twin's integer) and its float steps, in the twin's order; rows in fours share one
// reduction and run the float steps lane by lane (the same operations per row, so a row's result
// does not depend on N).
template <typename B, int N>
void IqMultiDot(int64_t k, const void* w_row, const uint8_t* act, size_t act_row_bytes,
                float* out) {
  LAMINA_DCHECK(k % kQK_K == 0);
  const auto* x = static_cast<const B*>(w_row);
  constexpr int kQuads = N / 4;
  __m128 sum4[kQuads > 0 ? kQuads : 1];  // [row quad]: rows 4j..4j+3
  float sumf[N];
#pragma GCC unroll 8
  for (int r = 0; r < N; ++r) sumf[r] = 0;
#pragma GCC unroll 2
  for (int j = 0; j < kQuads; ++j) sum4[j] = _mm_setzero_ps();
  for (int64_t i = 0; i < k / kQK_K; ++i) {
    const BlockQ8_K* y[N];
#pragma GCC unroll 8
    for (int r = 0; r < N; ++r) {
      y[r] = reinterpret_cast<const BlockQ8_K*>(act + r * act_row_bytes) + i;
    }
    const IqDec<B> dec(x[i]);
    // [N rows][8 int32 lanes]: the exact integer sums, chunk by chunk: the codes signed by w,
    // maddubs with the magnitudes, madd with the scales.
    __m256i acc[N];
#pragma GCC unroll 8
    for (int r = 0; r < N; ++r) acc[r] = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int c = 0; c < 8; ++c) {
      const IqChunk ch = dec.Chunk(c);
#pragma GCC unroll 8
      for (int r = 0; r < N; ++r) {
        const __m256i q8 = _mm256_sign_epi8(Load256(y[r]->qs + 32 * c), ch.sgn);
        acc[r] =
            _mm256_add_epi32(acc[r], _mm256_madd_epi16(_mm256_maddubs_epi16(ch.u, q8), ch.scl));
      }
    }
    // F16C widens d exactly (Iq<B>::D's value; a signalling NaN comes out quiet, which the
    // multiply by the activation's d below does anyway).
    const float dx = _cvtsh_ss(IqHalf(x[i]));
#pragma GCC unroll 2
    for (int j = 0; j < kQuads; ++j) {
      __m128 isum =
          _mm_cvtepi32_ps(ReduceAdd4(acc[4 * j], acc[4 * j + 1], acc[4 * j + 2], acc[4 * j + 3]));
      const __m128 d = _mm_mul_ps(_mm_set1_ps(dx), _mm_setr_ps(y[4 * j]->d, y[4 * j + 1]->d,
                                                               y[4 * j + 2]->d, y[4 * j + 3]->d));
      if constexpr (kIsIq1<B>) isum = _mm_mul_ps(isum, _mm_set1_ps(0.125f));
      sum4[j] = _mm_add_ps(sum4[j], _mm_mul_ps(d, isum));
    }
#pragma GCC unroll 4
    for (int r = 4 * kQuads; r < N; ++r) {
      const float isum = static_cast<float>(HorizontalSumI32(acc[r]));
      const float d = dx * y[r]->d;
      if constexpr (kIsIq1<B>) {
        sumf[r] += d * (isum * 0.125f);
      } else {
        sumf[r] += d * isum;
      }
    }
  }
#pragma GCC unroll 2
  for (int j = 0; j < kQuads; ++j) _mm_storeu_ps(sumf + 4 * j, sum4[j]);
#pragma GCC unroll 8
  for (int r = 0; r < N; ++r) out[r] = Iq<B>::kFinal * sumf[r];
}

template <typename B>
void IqVecDot(int64_t k, float* s, const void* w_row, const void* act_row) {
  IqMultiDot<B, 1>(k, w_row, static_cast<const uint8_t*>(act_row), 0, s);
}

template <typename B>
void IqVecDotMulti(int64_t k, const void* w_row, const void* act, size_t act_row_bytes, int n_act,
                   float* out) {
  LAMINA_DCHECK(n_act >= 1 && n_act <= kMaxMultiDot);
  const auto* a = static_cast<const uint8_t*>(act);
  switch (n_act) {
    case 1:
      return IqMultiDot<B, 1>(k, w_row, a, act_row_bytes, out);
    case 2:
      return IqMultiDot<B, 2>(k, w_row, a, act_row_bytes, out);
    case 3:
      return IqMultiDot<B, 3>(k, w_row, a, act_row_bytes, out);
    case 4:
      return IqMultiDot<B, 4>(k, w_row, a, act_row_bytes, out);
    case 5:
      return IqMultiDot<B, 5>(k, w_row, a, act_row_bytes, out);
    case 6:
      return IqMultiDot<B, 6>(k, w_row, a, act_row_bytes, out);
    case 7:
      return IqMultiDot<B, 7>(k, w_row, a, act_row_bytes, out);
    default:
      return IqMultiDot<B, 8>(k, w_row, a, act_row_bytes, out);
  }
}

template <typename B>
void SetIq(KernelTable& table, GgmlType type) {
  TypeKernels& e = table[static_cast<int>(type)];
  e.vec_dot = IqVecDot<B>;
  e.vec_dot_multi = IqVecDotMulti<B>;
}

}  // namespace

void RegisterAvx2IQuants(KernelTable& table) {
  SetIq<BlockIQ2_XXS>(table, GgmlType::kIQ2_XXS);
  SetIq<BlockIQ2_XS>(table, GgmlType::kIQ2_XS);
  SetIq<BlockIQ2_S>(table, GgmlType::kIQ2_S);
  SetIq<BlockIQ3_XXS>(table, GgmlType::kIQ3_XXS);
  SetIq<BlockIQ3_S>(table, GgmlType::kIQ3_S);
  SetIq<BlockIQ1_S>(table, GgmlType::kIQ1_S);
  SetIq<BlockIQ1_M>(table, GgmlType::kIQ1_M);
}

}  // namespace lamina::quant_internal
