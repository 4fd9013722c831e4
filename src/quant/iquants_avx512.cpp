// AVX-512 (BW + VL + VNNI) dot products of the lattice i-quants (IQ2_XXS, IQ2_XS, IQ2_S,
// IQ3_XXS, IQ3_S, IQ1_S, IQ1_M against Q8_K): the shared kernel in iquants_simd.inc with the sign
// bits turned into byte masks by vpmovm2b and the scale multiply fused into VNNI's dpwssd.
// Bit-identical to the scalar twins in iquants.cpp.

// GCC 12's AVX-512 headers build their "undefined" vectors by self-initialisation, which trips
// -Wuninitialized at every inlined broadcast/insert/extract (GCC PR 105593); nothing reads them.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

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

inline __m256i IqSignMask(uint32_t bits) { return _mm256_movm_epi8(bits); }

[[gnu::always_inline]] inline __m256i IqAccumulate(__m256i acc, __m256i u, __m256i s, __m256i scl) {
  return _mm256_dpwssd_epi32(acc, _mm256_maddubs_epi16(u, s), scl);
}

#include "quant/iquants_simd.inc"

}  // namespace

void RegisterAvx512IQuants(KernelTable& table) { SetAllIq(table); }

}  // namespace lamina::quant_internal
