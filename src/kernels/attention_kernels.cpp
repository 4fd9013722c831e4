// Scalar attention row kernels and runtime selection.
#include "kernels/attention_kernels.h"

#include <cmath>

namespace lamina {

namespace {
void ScoreRows(const float* q, const float* rows, int n_rows, int hd, float scale, float* out) {
  for (int j = 0; j < n_rows; ++j) {
    const float* r = rows + static_cast<int64_t>(j) * hd;
    float s = 0.0f;
    for (int i = 0; i < hd; ++i) s += q[i] * r[i];
    out[j] = s * scale;
  }
}

double ExpSum(float* x, int n, float max) {
  double sum = 0.0;
  for (int j = 0; j < n; ++j) {
    const float e = x[j] == -INFINITY ? 0.0f : std::exp(x[j] - max);
    x[j] = e;
    sum += e;
  }
  return sum;
}

void AccumulateRows(const float* p, const float* rows, int n_rows, int hd, float* acc) {
  for (int j = 0; j < n_rows; ++j) {
    const float* r = rows + static_cast<int64_t>(j) * hd;
    for (int i = 0; i < hd; ++i) acc[i] += p[j] * r[i];
  }
}
}  // namespace

const AttentionRowKernels& ScalarAttentionRowKernels() {
  static const AttentionRowKernels k{ScoreRows, ExpSum, AccumulateRows};
  return k;
}

const AttentionRowKernels& BestAttentionRowKernels() {
  static const AttentionRowKernels* best = [] {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
      if (const AttentionRowKernels* k = Avx2AttentionRowKernels()) return k;
    }
    return &ScalarAttentionRowKernels();
  }();
  return *best;
}

}  // namespace lamina
