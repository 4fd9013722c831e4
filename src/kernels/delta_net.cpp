// Scalar Gated DeltaNet kernels (see delta_net.h).
#include "kernels/delta_net.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "util/cpu_features.h"

namespace lamina {

void CausalConvSilu(const float* tail, const float* x, int n, int channels, int k, const float* w,
                    float* out) {
  for (int t = 0; t < n; ++t) {
    float* o = out + static_cast<int64_t>(t) * channels;
    for (int c = 0; c < channels; ++c) {
      const float* wc = w + static_cast<int64_t>(c) * k;
      float sum = 0.0f;
      for (int j = 0; j < k; ++j) {
        const int r = t + j - (k - 1);  // row of x; negative: row k - 1 + r of the tail
        const float in = r >= 0 ? x[static_cast<int64_t>(r) * channels + c]
                                : tail[static_cast<int64_t>(k - 1 + r) * channels + c];
        sum += wc[j] * in;
      }
      o[c] = sum / (1.0f + std::exp(-sum));
    }
  }
}

void ConvTailAdvance(const float* tail, const float* x, int n, int channels, int k,
                     float* new_tail) {
  const int keep = k - 1;
  // Rows in order, oldest first; row r of [tail; x] (r < keep: the tail) lands at r - n.
  for (int i = 0; i < keep; ++i) {
    const int r = n + i;  // row index in [tail; x]
    const float* src = r < keep ? tail + static_cast<int64_t>(r) * channels
                                : x + static_cast<int64_t>(r - keep) * channels;
    float* dst = new_tail + static_cast<int64_t>(i) * channels;
    if (src != dst) std::memmove(dst, src, sizeof(float) * channels);
  }
}

void L2Normalize(float* x, int n, float eps) {
  double sum = 0.0;  // as ggml_l2_norm
  for (int i = 0; i < n; ++i) sum += static_cast<double>(x[i]) * x[i];
  const float scale = 1.0f / std::max(std::sqrt(static_cast<float>(sum)), eps);
  for (int i = 0; i < n; ++i) x[i] *= scale;
}

void GatedDeltaStep(const float* src, float* state, const float* q, const float* k, const float* v,
                    float decay, float beta, float scale, int d_k, int d_v, float* out) {
  // state = decay * src; out = M^T k.
  std::fill(out, out + d_v, 0.0f);
  for (int j = 0; j < d_k; ++j) {
    const float* from = src + static_cast<int64_t>(j) * d_v;
    float* row = state + static_cast<int64_t>(j) * d_v;
    for (int i = 0; i < d_v; ++i) {
      row[i] = from[i] * decay;
      out[i] += row[i] * k[j];
    }
  }
  for (int i = 0; i < d_v; ++i) out[i] = beta * (v[i] - out[i]);  // d
  for (int j = 0; j < d_k; ++j) {
    float* row = state + static_cast<int64_t>(j) * d_v;
    for (int i = 0; i < d_v; ++i) row[i] += k[j] * out[i];
  }
  std::fill(out, out + d_v, 0.0f);
  for (int j = 0; j < d_k; ++j) {
    const float* row = state + static_cast<int64_t>(j) * d_v;
    for (int i = 0; i < d_v; ++i) out[i] += row[i] * q[j];
  }
  for (int i = 0; i < d_v; ++i) out[i] *= scale;
}

GatedDeltaStepFn BestGatedDeltaStep() {
  static const GatedDeltaStepFn best = [] {
    if (IsaAllowed(Isa::kAvx512)) {
      if (GatedDeltaStepFn f = Avx512GatedDeltaStep()) return f;
    }
    if (IsaAllowed(Isa::kAvx2)) {
      if (GatedDeltaStepFn f = Avx2GatedDeltaStep()) return f;
    }
    return &GatedDeltaStep;
  }();
  return best;
}

}  // namespace lamina
