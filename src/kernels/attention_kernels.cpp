// Scalar attention row kernels and runtime selection.
#include "kernels/attention_kernels.h"

#include <cmath>

#include "util/cpu_features.h"

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

void ScoreRows2(const float* q0, const float* q1, const float* rows, int n_rows, int hd,
                float scale, float* out0, float* out1) {
  ScoreRows(q0, rows, n_rows, hd, scale, out0);
  ScoreRows(q1, rows, n_rows, hd, scale, out1);
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
float Max(const float* x, int n) {
  float m = x[0];
  for (int j = 1; j < n; ++j) m = x[j] > m ? x[j] : m;
  return m;
}

void Scale(float* x, int n, float s) {
  for (int j = 0; j < n; ++j) x[j] *= s;
}

void RoundF16(float* x, int n) {
  for (int j = 0; j < n; ++j) x[j] = Fp16ToF32(F32ToFp16(x[j]));
}
}  // namespace

const AttentionRowKernels& ScalarAttentionRowKernels() {
  static const AttentionRowKernels k{ScoreRows, ScoreRows2, ExpSum,  AccumulateRows,
                                     Max,       Scale,      RoundF16};
  return k;
}

const AttentionRowKernels& BestAttentionRowKernels() {
  static const AttentionRowKernels* best = [] {
    const CpuFeatures& cpu = GetCpuFeatures();
    // The CPU has the kernels' instructions and LAMINA_ISA allows them.
    if (cpu.HasAvx2Set() && cpu.avx512f && cpu.avx512bw && cpu.avx512vl && cpu.avx512dq &&
        IsaAllowed(Isa::kAvx512)) {
      if (const AttentionRowKernels* k = Avx512AttentionRowKernels()) return k;
    }
    if (cpu.HasAvx2Set() && IsaAllowed(Isa::kAvx2)) {
      if (const AttentionRowKernels* k = Avx2AttentionRowKernels()) return k;
    }
    return &ScalarAttentionRowKernels();
  }();
  return *best;
}

}  // namespace lamina
