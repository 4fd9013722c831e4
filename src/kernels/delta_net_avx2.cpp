// AVX2 twin of GatedDeltaStep (delta_net.h): eight value dims per register, key dims in the
// scalar twin's order, separate multiplies and adds (no FMA), so the bits equal the scalar
// twin's. A d_v that is not a multiple of 8 runs the scalar twin.
#include <immintrin.h>

#include "kernels/delta_net.h"

// The compiler must not fuse a multiply and an add into an FMA (the scalar twin has none).
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

namespace lamina {

namespace {
void Step(const float* src, float* state, const float* q, const float* k, const float* v,
          float decay, float beta, float scale, int d_k, int d_v, float* out) {
  if (d_v % 8 != 0) {
    GatedDeltaStep(src, state, q, k, v, decay, beta, scale, d_k, d_v, out);
    return;
  }
  const __m256 vdecay = _mm256_set1_ps(decay);
  for (int i = 0; i < d_v; i += 8) _mm256_storeu_ps(out + i, _mm256_setzero_ps());
  for (int j = 0; j < d_k; ++j) {
    const float* from = src + static_cast<int64_t>(j) * d_v;
    float* row = state + static_cast<int64_t>(j) * d_v;
    const __m256 kj = _mm256_set1_ps(k[j]);
    for (int i = 0; i < d_v; i += 8) {
      const __m256 m = _mm256_mul_ps(_mm256_loadu_ps(from + i), vdecay);
      _mm256_storeu_ps(row + i, m);
      _mm256_storeu_ps(out + i, _mm256_add_ps(_mm256_loadu_ps(out + i), _mm256_mul_ps(m, kj)));
    }
  }
  const __m256 vbeta = _mm256_set1_ps(beta);
  for (int i = 0; i < d_v; i += 8) {
    const __m256 diff = _mm256_sub_ps(_mm256_loadu_ps(v + i), _mm256_loadu_ps(out + i));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(vbeta, diff));
  }
  for (int j = 0; j < d_k; ++j) {
    float* row = state + static_cast<int64_t>(j) * d_v;
    const __m256 kj = _mm256_set1_ps(k[j]);
    for (int i = 0; i < d_v; i += 8) {
      const __m256 upd = _mm256_mul_ps(kj, _mm256_loadu_ps(out + i));
      _mm256_storeu_ps(row + i, _mm256_add_ps(_mm256_loadu_ps(row + i), upd));
    }
  }
  // The update is complete: out (d) becomes the M^T q accumulator; kept in registers for up to
  // 64 value dims per pass.
  for (int i0 = 0; i0 < d_v; i0 += 64) {
    const int n8 = (d_v - i0 < 64 ? d_v - i0 : 64) / 8;
    __m256 acc[8];
    for (int b = 0; b < n8; ++b) acc[b] = _mm256_setzero_ps();
    for (int j = 0; j < d_k; ++j) {
      const float* row = state + static_cast<int64_t>(j) * d_v + i0;
      const __m256 qj = _mm256_set1_ps(q[j]);
      for (int b = 0; b < n8; ++b) {
        acc[b] = _mm256_add_ps(acc[b], _mm256_mul_ps(_mm256_loadu_ps(row + 8 * b), qj));
      }
    }
    const __m256 vscale = _mm256_set1_ps(scale);
    for (int b = 0; b < n8; ++b) _mm256_storeu_ps(out + i0 + 8 * b, _mm256_mul_ps(acc[b], vscale));
  }
}
}  // namespace

GatedDeltaStepFn Avx2GatedDeltaStep() { return &Step; }

}  // namespace lamina
