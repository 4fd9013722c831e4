// AVX-512 twins of RMSNorm's row loops (ops.cpp): the sums of squares of 8 rows in the 8 double
// lanes of one register, each row's squares added in index order, and the scaling 16 floats at a
// time: every row keeps the scalar loops' bits.
#include <immintrin.h>

#include "kernels/ops.h"

namespace lamina {

// GCC 12's _mm512_cvtps_pd builds on _mm512_undefined_pd(), which its uninitialized-value
// analysis reports at every use.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace {
// Columns j of the 8 x 8 floats r[0..7] (row k in r[k]): c[j] = {r[0][j], ..., r[7][j]}.
inline void Transpose8x8(const __m256* r, __m256* c) {
  __m256 t[8], u[8];
  for (int k = 0; k < 4; ++k) {
    t[2 * k] = _mm256_unpacklo_ps(r[2 * k], r[2 * k + 1]);
    t[2 * k + 1] = _mm256_unpackhi_ps(r[2 * k], r[2 * k + 1]);
  }
  for (int h = 0; h < 2; ++h) {  // rows 4h..4h+3
    const __m256* a = t + 4 * h;
    u[4 * h + 0] = _mm256_shuffle_ps(a[0], a[2], 0x44);
    u[4 * h + 1] = _mm256_shuffle_ps(a[0], a[2], 0xEE);
    u[4 * h + 2] = _mm256_shuffle_ps(a[1], a[3], 0x44);
    u[4 * h + 3] = _mm256_shuffle_ps(a[1], a[3], 0xEE);
  }
  for (int j = 0; j < 4; ++j) {
    c[j] = _mm256_permute2f128_ps(u[j], u[4 + j], 0x20);
    c[4 + j] = _mm256_permute2f128_ps(u[j], u[4 + j], 0x31);
  }
}
}  // namespace

void Avx512SumSquares8(const float* x, int64_t stride, int64_t n, double* sums) {
  // Lane r: row r's running sum. A float's square is exact in double, so a fused multiply-add
  // would round as the scalar add of the exact square does; but the chain of adds is the bound,
  // and an add's latency is shorter than an fma's: the empty asm keeps GCC from fusing them.
  const auto add_square = [](__m512d acc, __m512d v) {
    __m512d sq = _mm512_mul_pd(v, v);
    asm("" : "+v"(sq));
    return _mm512_add_pd(acc, sq);
  };
  __m512d s = _mm512_setzero_pd();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 r[8], c[8];  // r[k]: row k's values i..i+7; c[j]: value i + j of the 8 rows
    for (int k = 0; k < 8; ++k) r[k] = _mm256_loadu_ps(x + k * stride + i);
    Transpose8x8(r, c);
    for (int j = 0; j < 8; ++j) {
      s = add_square(s, _mm512_cvtps_pd(c[j]));
    }
  }
  for (; i < n; ++i) {
    s = add_square(
        s, _mm512_cvtps_pd(_mm256_setr_ps(x[i], x[stride + i], x[2 * stride + i], x[3 * stride + i],
                                          x[4 * stride + i], x[5 * stride + i], x[6 * stride + i],
                                          x[7 * stride + i])));
  }
  _mm512_storeu_pd(sums, s);
}

void Avx512ScaleRow(const float* x, const float* w, int64_t n, float scale, float* out) {
  const __m512 vs = _mm512_set1_ps(scale);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 v = _mm512_mul_ps(_mm512_loadu_ps(x + i), vs);
    if (w != nullptr) v = _mm512_mul_ps(v, _mm512_loadu_ps(w + i));
    _mm512_storeu_ps(out + i, v);
  }
  for (; i < n; ++i) out[i] = w != nullptr ? (x[i] * scale) * w[i] : x[i] * scale;
}

#pragma GCC diagnostic pop

}  // namespace lamina
