// Row kernels for attention over f32 / f16 K and V rows: dot products and scaled accumulation.
// A scalar twin and an AVX2+F16C variant share each signature; the best is chosen once.
#pragma once

#include <cstdint>

#include "util/fp16.h"

namespace lamina {

struct AttentionRowKernels {
  // sum_i a[i] * b[i]
  float (*dot_f32)(const float* a, const float* b, int n);
  // sum_i f32(a[i]) * b[i]
  float (*dot_f16)(const fp16_t* a, const float* b, int n);
  // out[i] += p * v[i]
  void (*axpy_f32)(float p, const float* v, float* out, int n);
  // out[i] += p * f32(v[i])
  void (*axpy_f16)(float p, const fp16_t* v, float* out, int n);
};

const AttentionRowKernels& ScalarAttentionRowKernels();
const AttentionRowKernels* Avx2AttentionRowKernels();  // nullptr if not built/supported
const AttentionRowKernels& BestAttentionRowKernels();

}  // namespace lamina
