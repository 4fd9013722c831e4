// Scalar attention row kernels and runtime selection.
#include "kernels/attention_kernels.h"

namespace lamina {

namespace {
float DotF32(const float* a, const float* b, int n) {
  float s = 0.0f;
  for (int i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}
float DotF16(const fp16_t* a, const float* b, int n) {
  float s = 0.0f;
  for (int i = 0; i < n; ++i) s += Fp16ToF32(a[i]) * b[i];
  return s;
}
void AxpyF32(float p, const float* v, float* out, int n) {
  for (int i = 0; i < n; ++i) out[i] += p * v[i];
}
void AxpyF16(float p, const fp16_t* v, float* out, int n) {
  for (int i = 0; i < n; ++i) out[i] += p * Fp16ToF32(v[i]);
}
}  // namespace

const AttentionRowKernels& ScalarAttentionRowKernels() {
  static const AttentionRowKernels k{DotF32, DotF16, AxpyF32, AxpyF16};
  return k;
}

const AttentionRowKernels& BestAttentionRowKernels() {
  static const AttentionRowKernels* best = [] {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
        __builtin_cpu_supports("f16c")) {
      if (const AttentionRowKernels* k = Avx2AttentionRowKernels()) return k;
    }
    return &ScalarAttentionRowKernels();
  }();
  return *best;
}

}  // namespace lamina
