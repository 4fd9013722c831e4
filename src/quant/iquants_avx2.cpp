// AVX2 dot products of the lattice i-quants (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M
// against Q8_K): the shared kernel in iquants_simd.inc with maddubs + madd. Bit-identical to the
// scalar twins in iquants.cpp.
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

#include "quant/iquants_common.inc"

// Byte j (0..31) = 0xFF where bit j of `bits` is set: byte j / 8 of the word spread over eight
// bytes (each 128-bit lane holds the whole word), then one bit tested per byte.
inline __m256i IqSignMask(uint32_t bits) {
  const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2,
                                          2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
  const __m256i bit = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ull));
  const __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(bits)), spread);
  return _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
}

[[gnu::always_inline]] inline __m256i IqAccumulate(__m256i acc, __m256i u, __m256i s, __m256i scl) {
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), scl));
}

#include "quant/iquants_simd.inc"

}  // namespace

void RegisterAvx2IQuants(KernelTable& table) { SetAllIq(table); }

}  // namespace lamina::quant_internal
