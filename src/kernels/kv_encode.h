// The KV encoders' kernels: the scale search's squared error of one group's codes at several
// candidate scales at once, and the Walsh-Hadamard butterflies of the rotation (kv_format.h
// defines the formats, the search and the rotation).
#pragma once

#include <algorithm>
#include <cmath>

#include "kernels/kv_format.h"

namespace lamina {

// q4_nl's decision thresholds: the midpoints between neighbouring levels, rounded to float. A
// value's nearest level is the number of midpoints below it.
struct KvQ4NlMidpoints {
  float mid[15];
  constexpr KvQ4NlMidpoints() : mid() {
    for (int k = 0; k < 15; ++k) {
      mid[k] = 0.5f * (static_cast<float>(kQ4NlLevels[k]) + static_cast<float>(kQ4NlLevels[k + 1]));
    }
  }
};
inline constexpr KvQ4NlMidpoints kKvQ4NlMidpoints;

// Round half to even, as the int8 codes ask: adding and subtracting 1.5 * 2^23 rounds in the
// FPU's default (nearest-even) mode exactly like nearbyint for |v| < 2^22, without a libm call,
// so loops over it vectorise. Larger |v| come out within a few units of v (callers clamp them).
inline float KvRoundHalfEven(float v) {
  constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23
  return (v + kMagic) - kMagic;
}

// The largest |x[i]| of x[n] (NaNs skipped; 0 when none is above 0). Eight running maxima
// instead of one (a max does not depend on the order it is taken in), so the loop vectorises.
inline float KvAbsMax(const float* x, int n) {
  float lane_max[8] = {};
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int l = 0; l < 8; ++l) lane_max[l] = std::max(lane_max[l], std::fabs(x[i + l]));
  }
  for (; i < n; ++i) lane_max[0] = std::max(lane_max[0], std::fabs(x[i]));
  float amax = 0.0f;
  for (const float m : lane_max) amax = std::max(amax, m);
  return amax;
}

// The nearest q4_nl level's index of t (0 for NaN).
inline int KvQ4NlNearest(float t) {
  int c = 0;
  for (int k = 0; k < 15; ++k) c += t > kKvQ4NlMidpoints.mid[k];
  return c;
}

// Squared errors of encoding the group x[g] at candidate scales d[n] (n <= kKvScaleCandidates):
// err[j] = sum over i = 0 .. g - 1, in that order from 0, of e * e with, per format,
//   int8 : s = fp16(d[j]) (the stored scale), y = x[i] * (s != 0 ? 1 / s : 0),
//          e = s * clamp(round-half-even(y), -127, 127) - x[i]
//   q4_0 : s = fp16(d[j]), t = x[i] * (d[j] != 0 ? 1 / d[j] : 0) + 8.5,
//          e = s * (c - 8) - x[i] with c = t >= 0 ? min(trunc(t), 15) : 0 (NaN: 0)
//   q4_nl: s = fp16(d[j]), e = s * level[nearest(x[i] * (s != 0 ? 1 / s : 0))] - x[i]
// each step rounded as written (no multiply-add contraction; NaN stays NaN through the int8
// clamp), where fp16() rounds to the nearest half and back. round-half-even(v) is
// (v + 1.5 * 2^23) - 1.5 * 2^23. The SIMD kernels hold one candidate per lane and run the same
// steps on each, so every variant gives the scalar twin's bits and the search picks the same
// scale on every ISA.
inline constexpr int kKvScaleCandidates = 16;
using KvScaleErrorsFn = void (*)(const float* x, int g, const float* d, int n, float* err);

KvScaleErrorsFn ScalarKvScaleErrors(KvRowFormat format);  // int8, q4_0, q4_nl; else nullptr
KvScaleErrorsFn Avx2KvScaleErrors(KvRowFormat format);    // nullptr when none
KvScaleErrorsFn Avx512KvScaleErrors(KvRowFormat format);  // nullptr when none
// The widest the CPU (and LAMINA_ISA) allow, else the scalar twin. Chosen once per format.
KvScaleErrorsFn BestKvScaleErrors(KvRowFormat format);

// The unnormalised Walsh-Hadamard transform of x[b] in place, b a power of two: for len = 1, 2,
// 4, .. < b, for each pair (j, j + len) with j % (2 len) < len: x[j], x[j + len] = a + b, a - b
// from a = x[j], b = x[j + len]. Every element's result is the same sequence of adds and
// subtracts on every variant (the SIMD twins run each pass on whole vectors, the small strides
// by in-register swaps), so all give the scalar twin's bits (NaN payloads aside).
using KvHadamardFn = void (*)(float* x, int b);

KvHadamardFn ScalarKvHadamard();
KvHadamardFn Avx2KvHadamard();  // nullptr when none; needs b >= 8 (smaller b: the scalar twin)
KvHadamardFn BestKvHadamard();  // chosen once; falls back to the scalar twin for b < 8

}  // namespace lamina
