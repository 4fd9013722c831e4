// Scalar twins of the KV encoders' kernels (kv_encode.h) and their selection.
#include "kernels/kv_encode.h"

#include <algorithm>

#include "util/cpu_features.h"

namespace lamina {

namespace {
float Int8Error(const float* x, int g, float d) {
  const float ds = Fp16ToF32(F32ToFp16(d));
  const float id = ds != 0.0f ? 1.0f / ds : 0.0f;
  float err = 0.0f;
  for (int i = 0; i < g; ++i) {
    const float c = std::clamp(KvRoundHalfEven(x[i] * id), -127.0f, 127.0f);
    const float e = ds * c - x[i];
    err += e * e;
  }
  return err;
}

float Q4Error(const float* x, int g, float d) {
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  const float dq = Fp16ToF32(F32ToFp16(d));
  float err = 0.0f;
  for (int i = 0; i < g; ++i) {
    // Truncation toward zero then the clamp equals trunc-then-clamp of GGML's formula.
    // The same in float first, so that NaN and +-inf never reach the integer cast.
    const float t = x[i] * id + 8.5f;
    const int c = t >= 0.0f ? (t < 15.0f ? static_cast<int>(t) : 15) : 0;
    const float e = dq * static_cast<float>(c - 8) - x[i];
    err += e * e;
  }
  return err;
}

float Q4NlError(const float* x, int g, float d) {
  const float dq = Fp16ToF32(F32ToFp16(d));
  const float id = dq != 0.0f ? 1.0f / dq : 0.0f;
  float err = 0.0f;
  for (int i = 0; i < g; ++i) {
    const float e = dq * static_cast<float>(kQ4NlLevels[KvQ4NlNearest(x[i] * id)]) - x[i];
    err += e * e;
  }
  return err;
}

template <float (*kError)(const float*, int, float)>
void ErrorsScalar(const float* x, int g, const float* d, int n, float* err) {
  for (int j = 0; j < n; ++j) err[j] = kError(x, g, d[j]);
}

void HadamardScalar(float* x, int b) {
  for (int len = 1; len < b; len <<= 1) {
    for (int i = 0; i < b; i += 2 * len) {
      for (int j = i; j < i + len; ++j) {
        const float lo = x[j], hi = x[j + len];
        x[j] = lo + hi;
        x[j + len] = lo - hi;
      }
    }
  }
}

// The AVX2 twin for blocks of 8 and more, the scalar one below.
void HadamardBest(float* x, int b) {
  static const KvHadamardFn simd = Avx2KvHadamard();
  if (b >= 8) {
    simd(x, b);
  } else {
    HadamardScalar(x, b);
  }
}

KvScaleErrorsFn PickBest(KvRowFormat format) {
  KvScaleErrorsFn f = nullptr;
  if (HasAvx512()) f = Avx512KvScaleErrors(format);
  if (f == nullptr && HasAvx2()) f = Avx2KvScaleErrors(format);
  return f != nullptr ? f : ScalarKvScaleErrors(format);
}
}  // namespace

KvScaleErrorsFn ScalarKvScaleErrors(KvRowFormat format) {
  switch (format) {
    case KvRowFormat::kInt8:
      return ErrorsScalar<Int8Error>;
    case KvRowFormat::kQ4_0:
      return ErrorsScalar<Q4Error>;
    case KvRowFormat::kQ4Nl:
      return ErrorsScalar<Q4NlError>;
    default:
      return nullptr;
  }
}

KvHadamardFn ScalarKvHadamard() { return HadamardScalar; }

KvHadamardFn BestKvHadamard() {
  static const KvHadamardFn best =
      HasAvx2() && Avx2KvHadamard() != nullptr ? HadamardBest : HadamardScalar;
  return best;
}

KvScaleErrorsFn BestKvScaleErrors(KvRowFormat format) {
  static const KvScaleErrorsFn int8 = PickBest(KvRowFormat::kInt8);
  static const KvScaleErrorsFn q4_0 = PickBest(KvRowFormat::kQ4_0);
  static const KvScaleErrorsFn q4_nl = PickBest(KvRowFormat::kQ4Nl);
  switch (format) {
    case KvRowFormat::kInt8:
      return int8;
    case KvRowFormat::kQ4_0:
      return q4_0;
    case KvRowFormat::kQ4Nl:
      return q4_nl;
    default:
      return nullptr;
  }
}

}  // namespace lamina
