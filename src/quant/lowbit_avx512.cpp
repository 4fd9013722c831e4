// AVX-512 (BW + VL + VNNI) dot products of NVFP4, Q1_0 and Q2_0 against Q8_0: the shared kernel
// in lowbit_simd.inc with Q1_0's sign bits blended straight from a mask register and the byte
// products summed by VNNI's dpbusd. Bit-identical to the scalar twins in lowbit.cpp.

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

#include "quant/kernel_registry.h"
#include "quant/quant.h"
#include "quant/types.h"
#include "util/check.h"
#include "util/fp16.h"

namespace lamina::quant_internal {
namespace {

#include "quant/lowbit_common.inc"

inline __m256i LbSigns(uint32_t bits) {
  return _mm256_mask_blend_epi8(bits, _mm256_set1_epi8(-1), _mm256_set1_epi8(1));
}

[[gnu::always_inline]] inline __m256i LbDot(__m256i u, __m256i s) {
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
}

#include "quant/lowbit_simd.inc"

}  // namespace

void RegisterAvx512LowBit(KernelTable& table) { SetAllLowBit(table); }

}  // namespace lamina::quant_internal
