// AVX2 twins of the KV encoders' kernels (kv_encode.h). Scale search: one candidate scale per
// lane, each lane running the scalar twin's steps on the broadcast group values (compiled with
// -ffp-contract=off, so no step fuses into a multiply-add). Hadamard: 8 values per vector.
#include <immintrin.h>

#include <algorithm>

#include "kernels/kv_encode.h"

namespace lamina {

namespace {
// fp16(d): to the nearest half (even on ties; vcvtps2ph gives F32ToFp16's bits) and back.
inline __m256 RoundToHalf(__m256 d) {
  return _mm256_cvtph_ps(_mm256_cvtps_ph(d, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

// v != 0 ? 1 / v : 0 (correctly rounded, as the scalar division).
inline __m256 InverseOrZero(__m256 v) {
  const __m256 nonzero = _mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_NEQ_UQ);
  return _mm256_and_ps(nonzero, _mm256_div_ps(_mm256_set1_ps(1.0f), v));
}

enum class Kind { kInt8, kQ4_0, kQ4Nl };

template <Kind kKind>
void Errors(const float* x, int g, const float* d, int n, float* err) {
  const __m256 magic = _mm256_set1_ps(12582912.0f);  // 1.5 * 2^23
  const __m256 lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
  const __m256 half8 = _mm256_set1_ps(8.5f), eight = _mm256_set1_ps(8.0f);
  const __m256 fifteen = _mm256_set1_ps(15.0f), zero = _mm256_setzero_ps();
  for (int j0 = 0; j0 < n; j0 += 8) {
    const int m = std::min(8, n - j0);
    alignas(32) float dpad[8] = {}, out[8];  // [8] this pass's candidates, zero-padded
    std::copy_n(d + j0, m, dpad);
    const __m256 dv = _mm256_load_ps(dpad);
    const __m256 s = RoundToHalf(dv);  // the stored scale
    const __m256 inv = kKind == Kind::kQ4_0 ? InverseOrZero(dv) : InverseOrZero(s);
    __m256 acc = zero;
    for (int i = 0; i < g; ++i) {
      const __m256 xi = _mm256_set1_ps(x[i]);
      __m256 level;
      if constexpr (kKind == Kind::kInt8) {
        const __m256 y = _mm256_mul_ps(xi, inv);
        const __m256 r = _mm256_sub_ps(_mm256_add_ps(y, magic), magic);
        // clamp(r, -127, 127) keeping NaN: max(lo, r) and min(hi, .) return r when it is NaN.
        level = _mm256_min_ps(hi, _mm256_max_ps(lo, r));
      } else if constexpr (kKind == Kind::kQ4_0) {
        const __m256 t = _mm256_add_ps(_mm256_mul_ps(xi, inv), half8);
        const __m256 nonneg = _mm256_cmp_ps(t, zero, _CMP_GE_OQ);  // false for NaN
        const __m256 c =
            _mm256_min_ps(_mm256_round_ps(t, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC), fifteen);
        level = _mm256_sub_ps(_mm256_and_ps(nonneg, c), eight);
      } else {
        // The level above each midpoint below y (the midpoints ascend, so the last one
        // selected is level[number of midpoints below y]); NaN selects none: level[0].
        const __m256 y = _mm256_mul_ps(xi, inv);
        level = _mm256_set1_ps(static_cast<float>(kQ4NlLevels[0]));
        for (int k = 0; k < 15; ++k) {
          const __m256 above =
              _mm256_cmp_ps(y, _mm256_set1_ps(kKvQ4NlMidpoints.mid[k]), _CMP_GT_OQ);
          level = _mm256_blendv_ps(level, _mm256_set1_ps(static_cast<float>(kQ4NlLevels[k + 1])),
                                   above);
        }
      }
      const __m256 e = _mm256_sub_ps(_mm256_mul_ps(s, level), xi);
      acc = _mm256_add_ps(acc, _mm256_mul_ps(e, e));
    }
    _mm256_store_ps(out, acc);
    std::copy_n(out, m, err + j0);
  }
}
// One butterfly pass of stride len < 8 within each vector of 8: `swapped` holds each lane's
// partner (lane ^ len); the lower lane of a pair keeps lo + hi, the upper one lo - hi, with the
// operands in the scalar twin's order.
template <int kLen>
inline __m256 InVectorPass(__m256 v) {
  constexpr int kUpper = kLen == 4 ? 0xF0 : kLen == 2 ? 0xCC : 0xAA;  // lanes with bit kLen set
  __m256 swapped;
  if constexpr (kLen == 4) {
    swapped = _mm256_permute2f128_ps(v, v, 0x01);
  } else if constexpr (kLen == 2) {
    swapped = _mm256_permute_ps(v, 0x4E);  // [2, 3, 0, 1] per 128-bit half
  } else {
    swapped = _mm256_permute_ps(v, 0xB1);  // [1, 0, 3, 2]
  }
  const __m256 sum = _mm256_add_ps(v, swapped);   // lower lanes: lo + hi
  const __m256 diff = _mm256_sub_ps(swapped, v);  // upper lanes: lo - hi
  return _mm256_blend_ps(sum, diff, kUpper);
}

void Hadamard(float* x, int b) {
  for (int i = 0; i < b; i += 8) {
    __m256 v = _mm256_loadu_ps(x + i);
    v = InVectorPass<1>(v);
    v = InVectorPass<2>(v);
    v = InVectorPass<4>(v);
    _mm256_storeu_ps(x + i, v);
  }
  for (int len = 8; len < b; len <<= 1) {
    for (int i = 0; i < b; i += 2 * len) {
      for (int j = i; j < i + len; j += 8) {
        const __m256 lo = _mm256_loadu_ps(x + j), hi = _mm256_loadu_ps(x + j + len);
        _mm256_storeu_ps(x + j, _mm256_add_ps(lo, hi));
        _mm256_storeu_ps(x + j + len, _mm256_sub_ps(lo, hi));
      }
    }
  }
}
}  // namespace

KvHadamardFn Avx2KvHadamard() { return Hadamard; }

KvScaleErrorsFn Avx2KvScaleErrors(KvRowFormat format) {
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
