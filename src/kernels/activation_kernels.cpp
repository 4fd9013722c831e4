// Scalar activation kernels (the twins of activation_kernels_hwy.cpp) and runtime selection.
#include "kernels/activation_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "util/cpu_features.h"
#include "util/fp16.h"

namespace lamina {

namespace {
// 2^e for -126 <= e <= 127: e + 127 in the exponent field.
float Pow2(int32_t e) {
  const uint32_t bits = static_cast<uint32_t>(e + 127) << 23;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}
}  // namespace

// Step for step the vector Exp of activation_kernels_hwy.cpp (this file is compiled without
// multiply-add contraction; std::fma is its fused multiply-adds).
float PolyExp(float x) {
  x = std::min(std::max(x, -104.0f), 89.0f);
  // n = round-to-nearest-even(x * log2(e)): 1.5 * 2^23 added has float spacing 1, and its bits
  // minus the constant's are n.
  constexpr float kShift = 12582912.0f;
  const float biased = x * 1.44269504088896341f + kShift;
  const float n = biased - kShift;
  uint32_t bits;
  std::memcpy(&bits, &biased, sizeof(bits));
  const int32_t ni = static_cast<int32_t>(bits - 0x4B400000u);
  float r = std::fma(-n, 0.693359375f, x);
  r = std::fma(-n, -2.12194440e-4f, r);
  float p = 1.9875691500e-4f;
  p = std::fma(p, r, 1.3981999507e-3f);
  p = std::fma(p, r, 8.3334519073e-3f);
  p = std::fma(p, r, 4.1665795894e-2f);
  p = std::fma(p, r, 1.6666665459e-1f);
  p = std::fma(p, r, 5.0000001201e-1f);
  p = std::fma(p, r * r, r + 1.0f);
  // 2^n as 2^(n >> 1) * 2^(n - (n >> 1)): both factors normal for n in [-150, 128].
  const int32_t e1 = ni >> 1;
  return (p * Pow2(e1)) * Pow2(ni - e1);
}

const float* GeluTanhF16Table() {
  static const std::vector<float> table = [] {
    constexpr float kSqrt2OverPi = 0.79788456080286535587989211986876f;
    constexpr float kCoef = 0.044715f;
    std::vector<float> t(65536);  // [65536] by f16 bits
    for (uint32_t h = 0; h < 65536; ++h) {
      const float x = Fp16ToF32(static_cast<fp16_t>(h));
      t[h] = Fp16ToF32(
          F32ToFp16(0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * x * (1.0f + kCoef * x * x)))));
    }
    return t;
  }();
  return table.data();
}

namespace {
void Silu(const float* x, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] / (1.0f + PolyExp(-x[i]));
}

void SiluMul(const float* gate, const float* up, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = (g / (1.0f + PolyExp(-g))) * up[i];
  }
}

void SwigluOaiMul(const float* gate, const float* up, int64_t n, float alpha, float limit,
                  float* out) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = std::min(gate[i], limit);
    const float u = std::min(std::max(up[i], -limit), limit);
    out[i] = g / (1.0f + PolyExp(alpha * -g)) * (u + 1.0f);
  }
}

void GeluTanhMul(const float* gate, const float* up, int64_t n, float* out) {
  const float* table = GeluTanhF16Table();
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    const float act = g <= -10.0f ? 0.0f : g >= 10.0f ? g : table[F32ToFp16(g)];
    out[i] = act * up[i];
  }
}
}  // namespace

const ActivationKernels& ScalarActivationKernels() {
  static const ActivationKernels k{Silu, SiluMul, SwigluOaiMul, GeluTanhMul};
  return k;
}

const ActivationKernels& BestActivationKernels() {
  static const ActivationKernels* best = [] {
    const CpuFeatures& cpu = GetCpuFeatures();
    if (cpu.HasAvx2Set() && cpu.avx512f && cpu.avx512bw && cpu.avx512vl && cpu.avx512dq &&
        IsaAllowed(Isa::kAvx512)) {
      if (const ActivationKernels* k = Avx512ActivationKernels()) return k;
    }
    if (cpu.HasAvx2Set() && IsaAllowed(Isa::kAvx2)) {
      if (const ActivationKernels* k = Avx2ActivationKernels()) return k;
    }
    return &ScalarActivationKernels();
  }();
  return *best;
}

}  // namespace lamina
