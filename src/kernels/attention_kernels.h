// Row kernels for attention over decoded (f32) K and V tiles: scores of one query against
// many cell rows, the exp/sum step of softmax, and the weighted sum of V rows. A scalar twin
// and one Highway source compiled for AVX2 + FMA and for AVX-512 (attention_kernels_hwy.cpp)
// share each signature; the best is chosen once. Results of a call
// do not depend on how cells are grouped into calls beyond the (fixed) cell index, so a query
// gives the same output whatever batch it is in.
#pragma once

#include <cstdint>

#include "util/fp16.h"

namespace lamina {

struct AttentionRowKernels {
  // out[j] = scale * sum_i q[i] * rows[j * hd + i], j < n_rows.
  void (*score_rows)(const float* q, const float* rows, int n_rows, int hd, float scale,
                     float* out);
  // score_rows for two queries against the same rows (each row read once for both), n_rows a
  // multiple of 8: out0 and out1 get exactly score_rows(q0, ...) and score_rows(q1, ...)'s bits.
  void (*score_rows2)(const float* q0, const float* q1, const float* rows, int n_rows, int hd,
                      float scale, float* out0, float* out1);
  // x[j] = exp(x[j] - max) for j < n; returns the sum of the new x (x[j] = -inf gives 0).
  double (*exp_sum)(float* x, int n, float max);
  // acc[i] += sum_j p[j] * rows[j * hd + i], j < n_rows.
  void (*accumulate_rows)(const float* p, const float* rows, int n_rows, int hd, float* acc);
  // max_j x[j] (n >= 1).
  float (*max)(const float* x, int n);
  // x[j] *= s.
  void (*scale)(float* x, int n, float s);
  // x[j] = f32(f16(x[j])) with round-to-nearest-even (the f16 V cache's softmax weights).
  void (*round_f16)(float* x, int n);
};

const AttentionRowKernels& ScalarAttentionRowKernels();
// nullptr if not built or the CPU lacks the instructions they were compiled for.
const AttentionRowKernels* Avx2AttentionRowKernels();
const AttentionRowKernels* Avx512AttentionRowKernels();
const AttentionRowKernels& BestAttentionRowKernels();

}  // namespace lamina
