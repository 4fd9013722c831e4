// AVX2 dot products of NVFP4, Q1_0 and Q2_0 against Q8_0: the shared kernel in lowbit_simd.inc
// with maddubs + madd. Bit-identical to the scalar twins in lowbit.cpp.
#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "quant/kernel_registry.h"
#include "quant/quant.h"
#include "quant/types.h"
#include "util/check.h"
#include "util/fp16.h"

namespace lamina::quant_internal {
namespace {

#include "quant/lowbit_common.inc"

// Byte j (0..31) = +1 where bit j of `bits` is set, else -1: byte j / 8 of the word spread
// over eight bytes, one bit tested per byte, then the 0 / 0xFF mask turned into -1 / +1.
inline __m256i LbSigns(uint32_t bits) {
  const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2,
                                          2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
  const __m256i bit = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ull));
  const __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(bits)), spread);
  const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
  return _mm256_sub_epi8(_mm256_and_si256(set, _mm256_set1_epi8(2)), _mm256_set1_epi8(1));
}

[[gnu::always_inline]] inline __m256i LbDot(__m256i u, __m256i s) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

#include "quant/lowbit_simd.inc"

}  // namespace

void RegisterAvx2LowBit(KernelTable& table) { SetAllLowBit(table); }

}  // namespace lamina::quant_internal
