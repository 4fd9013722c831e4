// AVX-512 twins of the KV encoders' scale-search kernels (kv_encode.h): one candidate scale per
// lane, each lane running the scalar twin's steps on the broadcast group values (compiled with
// -ffp-contract=off, so no step fuses into a multiply-add).
// GCC 12's AVX-512 headers build some intrinsics from _mm512_undefined_*(), which its
// uninitialized-value analysis reports at every use.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "kernels/kv_encode.h"

namespace lamina {

namespace {
// fp16(d): to the nearest half (even on ties; vcvtps2ph gives F32ToFp16's bits) and back.
inline __m512 RoundToHalf(__m512 d) {
  return _mm512_cvtph_ps(_mm512_cvtps_ph(d, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

// v != 0 ? 1 / v : 0 (correctly rounded, as the scalar division).
inline __m512 InverseOrZero(__m512 v) {
  const __mmask16 nonzero = _mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_NEQ_UQ);
  return _mm512_maskz_div_ps(nonzero, _mm512_set1_ps(1.0f), v);
}

enum class Kind { kInt8, kQ4_0, kQ4Nl };

template <Kind kKind>
void Errors(const float* x, int g, const float* d, int n, float* err) {
  const __m512 magic = _mm512_set1_ps(12582912.0f);  // 1.5 * 2^23
  const __m512 lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
  const __m512 half8 = _mm512_set1_ps(8.5f), eight = _mm512_set1_ps(8.0f);
  const __m512 fifteen = _mm512_set1_ps(15.0f), zero = _mm512_setzero_ps();
  // q4_nl: levels[16] for vpermps; midpoints[15] (+ a pad) looked up by a 4-step search.
  alignas(64) float level_table[16], mid_table[16];
  for (int k = 0; k < 16; ++k) level_table[k] = static_cast<float>(kQ4NlLevels[k]);
  for (int k = 0; k < 15; ++k) mid_table[k] = kKvQ4NlMidpoints.mid[k];
  mid_table[15] = mid_table[14];
  const __m512 levels = _mm512_load_ps(level_table), mids = _mm512_load_ps(mid_table);
  for (int j0 = 0; j0 < n; j0 += 16) {
    const __mmask16 lanes = static_cast<__mmask16>(n - j0 >= 16 ? 0xFFFF : (1u << (n - j0)) - 1);
    const __m512 dv = _mm512_maskz_loadu_ps(lanes, d + j0);
    const __m512 s = RoundToHalf(dv);  // the stored scale
    const __m512 inv = kKind == Kind::kQ4_0 ? InverseOrZero(dv) : InverseOrZero(s);
    __m512 acc = zero;
    for (int i = 0; i < g; ++i) {
      const __m512 xi = _mm512_set1_ps(x[i]);
      __m512 level;
      if constexpr (kKind == Kind::kInt8) {
        const __m512 y = _mm512_mul_ps(xi, inv);
        const __m512 r = _mm512_sub_ps(_mm512_add_ps(y, magic), magic);
        // clamp(r, -127, 127) keeping NaN: max(lo, r) and min(hi, .) return r when it is NaN.
        level = _mm512_min_ps(hi, _mm512_max_ps(lo, r));
      } else if constexpr (kKind == Kind::kQ4_0) {
        const __m512 t = _mm512_add_ps(_mm512_mul_ps(xi, inv), half8);
        const __mmask16 nonneg = _mm512_cmp_ps_mask(t, zero, _CMP_GE_OQ);  // false for NaN
        const __m512 c =
            _mm512_min_ps(_mm512_roundscale_ps(t, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC), fifteen);
        level = _mm512_sub_ps(_mm512_maskz_mov_ps(nonneg, c), eight);
      } else {
        // The number of midpoints below y, by binary search over the ascending midpoints
        // (c + bit - 1 <= 14); NaN compares false throughout and gets 0.
        const __m512 y = _mm512_mul_ps(xi, inv);
        __m512i c = _mm512_setzero_si512();
        for (int bit = 8; bit >= 1; bit >>= 1) {
          const __m512i cand = _mm512_add_epi32(c, _mm512_set1_epi32(bit));
          const __m512 m =
              _mm512_permutexvar_ps(_mm512_sub_epi32(cand, _mm512_set1_epi32(1)), mids);
          c = _mm512_mask_mov_epi32(c, _mm512_cmp_ps_mask(y, m, _CMP_GT_OQ), cand);
        }
        level = _mm512_permutexvar_ps(c, levels);
      }
      const __m512 e = _mm512_sub_ps(_mm512_mul_ps(s, level), xi);
      acc = _mm512_add_ps(acc, _mm512_mul_ps(e, e));
    }
    _mm512_mask_storeu_ps(err + j0, lanes, acc);
  }
}
}  // namespace

KvScaleErrorsFn Avx512KvScaleErrors(KvRowFormat format) {
  switch (format) {
    case KvRowFormat::kInt8:
      return Errors<Kind::kInt8>;
    case KvRowFormat::kQ4_0:
      return Errors<Kind::kQ4_0>;
    case KvRowFormat::kQ4Nl:
      return Errors<Kind::kQ4Nl>;
    default:
      return nullptr;
  }
}

}  // namespace lamina
