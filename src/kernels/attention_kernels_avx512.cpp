// AVX-512 attention row kernels (twins of the scalar ones in attention_kernels.cpp), the same
// algorithms as the AVX2 variants at twice the width. score_rows folds each cell's 512-bit
// accumulator to 256 bits and reduces eight cells together with one transpose-add tree.
// GCC 12's AVX-512 headers build some intrinsics from _mm512_undefined_*(), which its
// uninitialized-value analysis reports at every use.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cmath>

#include "kernels/attention_kernels.h"

namespace lamina {

namespace {
inline __m256 Fold(__m512 v) {
  return _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
}

// Sums of each of eight vectors, as one vector (lane j = sum of v[j]).
inline __m256 Transpose8Sum(const __m256 v[8]) {
  const __m256 a01 = _mm256_hadd_ps(v[0], v[1]);
  const __m256 a23 = _mm256_hadd_ps(v[2], v[3]);
  const __m256 a45 = _mm256_hadd_ps(v[4], v[5]);
  const __m256 a67 = _mm256_hadd_ps(v[6], v[7]);
  const __m256 b0123 = _mm256_hadd_ps(a01, a23);
  const __m256 b4567 = _mm256_hadd_ps(a45, a67);
  const __m256 lo = _mm256_permute2f128_ps(b0123, b4567, 0x20);
  const __m256 hi = _mm256_permute2f128_ps(b0123, b4567, 0x31);
  return _mm256_add_ps(lo, hi);
}

void ScoreRows(const float* q, const float* rows, int n_rows, int hd, float scale, float* out) {
  const __m256 vscale = _mm256_set1_ps(scale);
  int j = 0;
  if (hd % 16 == 0) {
    for (; j + 8 <= n_rows; j += 8) {
      __m512 acc[8];
      for (int r = 0; r < 8; ++r) acc[r] = _mm512_setzero_ps();
      for (int i = 0; i < hd; i += 16) {
        const __m512 qv = _mm512_loadu_ps(q + i);
        for (int r = 0; r < 8; ++r) {
          acc[r] = _mm512_fmadd_ps(qv, _mm512_loadu_ps(rows + static_cast<int64_t>(j + r) * hd + i), acc[r]);
        }
      }
      __m256 folded[8];
      for (int r = 0; r < 8; ++r) folded[r] = Fold(acc[r]);
      _mm256_storeu_ps(out + j, _mm256_mul_ps(Transpose8Sum(folded), vscale));
    }
  }
  for (; j < n_rows; ++j) {
    const float* r = rows + static_cast<int64_t>(j) * hd;
    __m512 acc = _mm512_setzero_ps();
    int i = 0;
    for (; i + 16 <= hd; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(q + i), _mm512_loadu_ps(r + i), acc);
    float s = _mm512_reduce_add_ps(acc);
    for (; i < hd; ++i) s += q[i] * r[i];
    out[j] = s * scale;
  }
}

// exp(x) for x <= 0 (inputs are x - max); underflows to 0 below about -87.
inline __m512 Exp(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.3365f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(p, _mm512_castsi512_ps(e));
}

double ExpSum(float* x, int n, float max) {
  const __m512 vmax = _mm512_set1_ps(max);
  const __m512 ninf = _mm512_set1_ps(-INFINITY);
  __m512 sum = _mm512_setzero_ps();
  int j = 0;
  for (; j + 16 <= n; j += 16) {
    const __m512 v = _mm512_loadu_ps(x + j);
    const __mmask16 live = _mm512_cmp_ps_mask(v, ninf, _CMP_NEQ_OQ);
    const __m512 e = _mm512_maskz_mov_ps(live, Exp(_mm512_sub_ps(v, vmax)));
    _mm512_storeu_ps(x + j, e);
    sum = _mm512_add_ps(sum, e);
  }
  double total = _mm512_reduce_add_ps(sum);
  for (; j < n; ++j) {
    const float e = x[j] == -INFINITY ? 0.0f : std::exp(x[j] - max);
    x[j] = e;
    total += e;
  }
  return total;
}

template <int kVecs>
void AccumulateFixed(const float* p, const float* rows, int n_rows, int hd, float* acc) {
  __m512 a[kVecs];
  for (int v = 0; v < kVecs; ++v) a[v] = _mm512_loadu_ps(acc + 16 * v);
  for (int j = 0; j < n_rows; ++j) {
    const __m512 pj = _mm512_set1_ps(p[j]);
    const float* r = rows + static_cast<int64_t>(j) * hd;
    for (int v = 0; v < kVecs; ++v) a[v] = _mm512_fmadd_ps(pj, _mm512_loadu_ps(r + 16 * v), a[v]);
  }
  for (int v = 0; v < kVecs; ++v) _mm512_storeu_ps(acc + 16 * v, a[v]);
}

void AccumulateRows(const float* p, const float* rows, int n_rows, int hd, float* acc) {
  // Column chunks of up to 128 values keep 8 accumulators in registers.
  int i0 = 0;
  for (; i0 + 128 <= hd; i0 += 128) AccumulateFixed<8>(p, rows + i0, n_rows, hd, acc + i0);
  for (; i0 + 64 <= hd; i0 += 64) AccumulateFixed<4>(p, rows + i0, n_rows, hd, acc + i0);
  for (; i0 + 16 <= hd; i0 += 16) AccumulateFixed<1>(p, rows + i0, n_rows, hd, acc + i0);
  for (; i0 < hd; ++i0) {
    for (int j = 0; j < n_rows; ++j) acc[i0] += p[j] * rows[static_cast<int64_t>(j) * hd + i0];
  }
}

float Max(const float* x, int n) {
  int j = 0;
  float m = x[0];
  if (n >= 16) {
    __m512 vm = _mm512_loadu_ps(x);
    for (j = 16; j + 16 <= n; j += 16) vm = _mm512_max_ps(vm, _mm512_loadu_ps(x + j));
    m = _mm512_reduce_max_ps(vm);
  }
  for (; j < n; ++j) m = x[j] > m ? x[j] : m;
  return m;
}

void Scale(float* x, int n, float s) {
  const __m512 vs = _mm512_set1_ps(s);
  int j = 0;
  for (; j + 16 <= n; j += 16) _mm512_storeu_ps(x + j, _mm512_mul_ps(_mm512_loadu_ps(x + j), vs));
  for (; j < n; ++j) x[j] *= s;
}

void RoundF16(float* x, int n) {
  int j = 0;
  for (; j + 16 <= n; j += 16) {
    const __m256i h = _mm512_cvtps_ph(_mm512_loadu_ps(x + j), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm512_storeu_ps(x + j, _mm512_cvtph_ps(h));
  }
  for (; j < n; ++j) x[j] = _cvtsh_ss(_cvtss_sh(x[j], _MM_FROUND_TO_NEAREST_INT));
}
}  // namespace

const AttentionRowKernels* Avx512AttentionRowKernels() {
  static const AttentionRowKernels k{ScoreRows, ExpSum, AccumulateRows, Max, Scale, RoundF16};
  return &k;
}

}  // namespace lamina
