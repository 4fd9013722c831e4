// AVX2 + FMA attention row kernels (twins of the scalar ones in attention_kernels.cpp).
// score_rows reduces eight cells' dot products together (one transpose-add tree per eight
// cells instead of one horizontal sum per cell); exp uses a degree-5 polynomial after range
// reduction (relative error ~2e-7); accumulate_rows keeps the accumulator in registers.
#include <immintrin.h>

#include <cmath>

#include "kernels/attention_kernels.h"

namespace lamina {

namespace {
inline float HorizontalSum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v);
  __m128 hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
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
  if (hd % 8 == 0) {
    for (; j + 8 <= n_rows; j += 8) {
      __m256 acc[8];
      for (int r = 0; r < 8; ++r) acc[r] = _mm256_setzero_ps();
      for (int i = 0; i < hd; i += 8) {
        const __m256 qv = _mm256_loadu_ps(q + i);
        for (int r = 0; r < 8; ++r) {
          acc[r] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(rows + static_cast<int64_t>(j + r) * hd + i), acc[r]);
        }
      }
      _mm256_storeu_ps(out + j, _mm256_mul_ps(Transpose8Sum(acc), vscale));
    }
  }
  for (; j < n_rows; ++j) {
    const float* r = rows + static_cast<int64_t>(j) * hd;
    __m256 acc = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= hd; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), _mm256_loadu_ps(r + i), acc);
    float s = HorizontalSum(acc);
    for (; i < hd; ++i) s += q[i] * r[i];
    out[j] = s * scale;
  }
}

// exp(x) for x <= 0 (inputs are x - max); underflows to 0 below about -87.
inline __m256 Exp(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.3365f);
  x = _mm256_max_ps(x, lo);
  const __m256 log2e = _mm256_set1_ps(1.44269504088896341f);
  const __m256 ln2_hi = _mm256_set1_ps(0.693359375f);
  const __m256 ln2_lo = _mm256_set1_ps(-2.12194440e-4f);
  __m256 n = _mm256_round_ps(_mm256_mul_ps(x, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, ln2_hi, x);
  r = _mm256_fnmadd_ps(n, ln2_lo, r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  const __m256 r2 = _mm256_mul_ps(r, r);
  p = _mm256_fmadd_ps(p, r2, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

double ExpSum(float* x, int n, float max) {
  const __m256 vmax = _mm256_set1_ps(max);
  const __m256 ninf = _mm256_set1_ps(-INFINITY);
  __m256 sum = _mm256_setzero_ps();
  int j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 v = _mm256_loadu_ps(x + j);
    __m256 e = Exp(_mm256_sub_ps(v, vmax));
    e = _mm256_blendv_ps(e, _mm256_setzero_ps(), _mm256_cmp_ps(v, ninf, _CMP_EQ_OQ));
    _mm256_storeu_ps(x + j, e);
    sum = _mm256_add_ps(sum, e);
  }
  double total = HorizontalSum(sum);
  for (; j < n; ++j) {
    const float e = x[j] == -INFINITY ? 0.0f : std::exp(x[j] - max);
    x[j] = e;
    total += e;
  }
  return total;
}

template <int kVecs>
void AccumulateFixed(const float* p, const float* rows, int n_rows, int hd, float* acc) {
  __m256 a[kVecs];
  for (int v = 0; v < kVecs; ++v) a[v] = _mm256_loadu_ps(acc + 8 * v);
  for (int j = 0; j < n_rows; ++j) {
    const __m256 pj = _mm256_set1_ps(p[j]);
    const float* r = rows + static_cast<int64_t>(j) * hd;
    for (int v = 0; v < kVecs; ++v) a[v] = _mm256_fmadd_ps(pj, _mm256_loadu_ps(r + 8 * v), a[v]);
  }
  for (int v = 0; v < kVecs; ++v) _mm256_storeu_ps(acc + 8 * v, a[v]);
}

void AccumulateRows(const float* p, const float* rows, int n_rows, int hd, float* acc) {
  // Column chunks of up to 64 values keep 8 accumulators in registers.
  int i0 = 0;
  for (; i0 + 64 <= hd; i0 += 64) AccumulateFixed<8>(p, rows + i0, n_rows, hd, acc + i0);
  for (; i0 + 32 <= hd; i0 += 32) AccumulateFixed<4>(p, rows + i0, n_rows, hd, acc + i0);
  for (; i0 + 8 <= hd; i0 += 8) AccumulateFixed<1>(p, rows + i0, n_rows, hd, acc + i0);
  for (; i0 < hd; ++i0) {
    for (int j = 0; j < n_rows; ++j) acc[i0] += p[j] * rows[static_cast<int64_t>(j) * hd + i0];
  }
}
float Max(const float* x, int n) {
  int j = 0;
  float m = x[0];
  if (n >= 8) {
    __m256 vm = _mm256_loadu_ps(x);
    for (j = 8; j + 8 <= n; j += 8) vm = _mm256_max_ps(vm, _mm256_loadu_ps(x + j));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(vm), _mm256_extractf128_ps(vm, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    m = _mm_cvtss_f32(h);
  }
  for (; j < n; ++j) m = x[j] > m ? x[j] : m;
  return m;
}

void Scale(float* x, int n, float s) {
  const __m256 vs = _mm256_set1_ps(s);
  int j = 0;
  for (; j + 8 <= n; j += 8) _mm256_storeu_ps(x + j, _mm256_mul_ps(_mm256_loadu_ps(x + j), vs));
  for (; j < n; ++j) x[j] *= s;
}

void RoundF16(float* x, int n) {
  int j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(x + j), _MM_FROUND_TO_NEAREST_INT);
    _mm256_storeu_ps(x + j, _mm256_cvtph_ps(h));
  }
  for (; j < n; ++j) x[j] = _cvtsh_ss(_cvtss_sh(x[j], _MM_FROUND_TO_NEAREST_INT));
}
}  // namespace

const AttentionRowKernels* Avx2AttentionRowKernels() {
  static const AttentionRowKernels k{ScoreRows, ExpSum, AccumulateRows, Max, Scale, RoundF16};
  return &k;
}

}  // namespace lamina
