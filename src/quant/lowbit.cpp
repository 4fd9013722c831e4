// Scalar kernels of NVFP4, Q1_0 and Q2_0 (GGML types 40, 41, 42) against Q8_0 activations: the
// dequantizers (GGML's formulas) and the reference dot products the AVX2 and AVX-512 twins in
// lowbit_avx2.cpp / lowbit_avx512.cpp equal bit for bit (the lane order in lowbit_common.inc).
// No quantizers: llama.cpp writes these files.
#include <cstdint>

#include "quant/kernel_registry.h"
#include "quant/quant.h"
#include "quant/types.h"
#include "util/fp16.h"

namespace lamina::quant_internal {
namespace {

#include "quant/lowbit_common.inc"

// Value e (0..block size) of a block as an integer: NVFP4's doubled E2M1 level, Q1_0's +-1,
// Q2_0's q - 1.
int ValueOf(const BlockNVFP4& b, int e) {
  const int s = e / kQKNvfp4Sub, j = e % kQKNvfp4Sub;
  const uint8_t byte = b.qs[8 * s + j % 8];
  return kMxfp4Levels[j < 8 ? (byte & 0xF) : (byte >> 4)];
}
int ValueOf(const BlockQ1_0& b, int e) { return ((b.qs[e / 8] >> (e % 8)) & 1) ? 1 : -1; }
int ValueOf(const BlockQ2_0& b, int e) { return ((b.qs[e / 4] >> (2 * (e % 4))) & 3) - 1; }

// NVFP4: level * the sub-block's halved UE4M3 scale; Q1_0 / Q2_0: value * d (as GGML's
// dequantize_row_*: the int value converted, then one f32 multiply).
void DequantizeNVFP4(const void* vx, float* y, int64_t k) {
  const auto* x = static_cast<const BlockNVFP4*>(vx);
  for (int64_t i = 0; i < k / kQKNvfp4; ++i) {
    for (int e = 0; e < kQKNvfp4; ++e) {
      const float d = kUe4m3Half.v[x[i].d[e / kQKNvfp4Sub]];
      y[i * kQKNvfp4 + e] = static_cast<float>(ValueOf(x[i], e)) * d;
    }
  }
}

template <typename B, int64_t kBlock>
void DequantizeScaled(const void* vx, float* y, int64_t k) {
  const auto* x = static_cast<const B*>(vx);
  for (int64_t i = 0; i < k / kBlock; ++i) {
    const float d = Fp16ToF32(x[i].d);
    for (int e = 0; e < kBlock; ++e) {
      y[i * kBlock + e] = static_cast<float>(ValueOf(x[i], e)) * d;
    }
  }
}

// Q1_0's and Q2_0's reference dot (lowbit_common.inc states the order).
template <typename B>
void VecDotLowBit(int64_t k, float* s, const void* vw, const void* va) {
  constexpr int kG = LowBit<B>::kGroups;
  const auto* w = static_cast<const B*>(vw);
  const auto* a = static_cast<const BlockQ8_0*>(va);
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};  // [8 lanes]
  for (int64_t i = 0; i < k / (kG * kQK); ++i) {
    for (int g = 0; g < kG; ++g) {
      const BlockQ8_0& y = a[i * kG + g];
      const float dy = Fp16ToF32(y.d);
      for (int l = 0; l < 8; ++l) {
        int isum = 0;
        for (int e = 4 * l; e < 4 * l + 4; ++e) isum += ValueOf(w[i], 32 * g + e) * y.qs[e];
        const float scale = LowBit<B>::Scale(w[i], g, l / 4) * dy;
        acc[l] += scale * static_cast<float>(isum);
      }
    }
  }
  *s = LowBitLaneSum(acc);
}

// NVFP4's reference dot: one accumulator, the sub-blocks in order (lowbit_common.inc).
void VecDotNVFP4(int64_t k, float* s, const void* vw, const void* va) {
  const auto* w = static_cast<const BlockNVFP4*>(vw);
  const auto* a = static_cast<const BlockQ8_0*>(va);
  constexpr int kSub = static_cast<int>(kQKNvfp4Sub);
  float acc = 0.0f;
  for (int64_t i = 0; i < k / kQKNvfp4; ++i) {
    for (int sb = 0; sb < 4; ++sb) {
      const BlockQ8_0& y = a[2 * i + sb / 2];
      int isum = 0;
      for (int e = 0; e < kSub; ++e)
        isum += ValueOf(w[i], kSub * sb + e) * y.qs[kSub * (sb % 2) + e];
      acc += (kUe4m3Half.v[w[i].d[sb]] * Fp16ToF32(y.d)) * static_cast<float>(isum);
    }
  }
  *s = acc;
}

void Set(KernelTable& table, GgmlType type, DequantizeRowFn dequantize, VecDotFn vec_dot,
         VecDotMultiFn vec_dot_multi) {
  table[static_cast<int>(type)] =
      TypeKernels{type, GgmlType::kQ8_0, dequantize, nullptr, vec_dot, vec_dot_multi};
}

}  // namespace

void RegisterScalarLowBit(KernelTable& table) {
  Set(table, GgmlType::kNVFP4, DequantizeNVFP4, VecDotNVFP4, VecDotEachRow<VecDotNVFP4>);
  Set(table, GgmlType::kQ1_0, DequantizeScaled<BlockQ1_0, kQK1_0>, VecDotLowBit<BlockQ1_0>,
      VecDotEachRow<VecDotLowBit<BlockQ1_0>>);
  Set(table, GgmlType::kQ2_0, DequantizeScaled<BlockQ2_0, kQK2_0>, VecDotLowBit<BlockQ2_0>,
      VecDotEachRow<VecDotLowBit<BlockQ2_0>>);
}

}  // namespace lamina::quant_internal
