// Scalar kernels for F32, F16, BF16, the legacy 32-element quants (Q4_0 .. Q8_1) and the two
// 32-element table types (IQ4_NL, MXFP4): the reference twins every SIMD variant is tested
// against. Rounding follows GGML bit for bit.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "quant/kernel_registry.h"

namespace lamina::quant_internal {
namespace {

// Round to nearest, ties to even, for |x| < 2^22: the same result as cvtps2dq under the default
// MXCSR, which is what GGML's x86 activation quantizers use. Avoids a libm call per element.
inline int RoundNearestEven(float x) {
  const float magic = 12582912.0f;  // 1.5 * 2^23
  float r = (x + magic) - magic;
  return static_cast<int>(r);
}

// The f32 scale of a 32-element block: its fp16 d, or MXFP4's E8M0 exponent (halved, since the
// MXFP4 levels are doubled).
template <class Block>
inline float BlockScale(const Block& b) {
  return Fp16ToF32(b.d);
}
inline float BlockScale(const BlockMXFP4& b) { return E8M0ToF32Half(b.e); }

// ---------------------------------------------------------------------------------------------
// Dequantize.

void DequantizeF32(const void* x, float* y, int64_t k) {
  std::memcpy(y, x, static_cast<size_t>(k) * sizeof(float));
}

void DequantizeF16(const void* x, float* y, int64_t k) {
  const fp16_t* h = static_cast<const fp16_t*>(x);
  for (int64_t i = 0; i < k; ++i) y[i] = Fp16ToF32(h[i]);
}

void DequantizeBF16(const void* x, float* y, int64_t k) {
  const bf16_t* h = static_cast<const bf16_t*>(x);
  for (int64_t i = 0; i < k; ++i) y[i] = Bf16ToF32(h[i]);
}

void DequantizeQ4_0(const void* vx, float* y, int64_t k) {
  const BlockQ4_0* x = static_cast<const BlockQ4_0*>(vx);
  const int64_t nb = k / kQK;
  for (int64_t i = 0; i < nb; ++i) {
    const float d = Fp16ToF32(x[i].d);
    for (int j = 0; j < kQK / 2; ++j) {
      const int x0 = (x[i].qs[j] & 0x0F) - 8;
      const int x1 = (x[i].qs[j] >> 4) - 8;
      y[i * kQK + j] = static_cast<float>(x0) * d;
      y[i * kQK + j + kQK / 2] = static_cast<float>(x1) * d;
    }
  }
}

void DequantizeQ4_1(const void* vx, float* y, int64_t k) {
  const BlockQ4_1* x = static_cast<const BlockQ4_1*>(vx);
  const int64_t nb = k / kQK;
  for (int64_t i = 0; i < nb; ++i) {
    const float d = Fp16ToF32(x[i].d);
    const float m = Fp16ToF32(x[i].m);
    for (int j = 0; j < kQK / 2; ++j) {
      const int x0 = x[i].qs[j] & 0x0F;
      const int x1 = x[i].qs[j] >> 4;
      y[i * kQK + j] = static_cast<float>(x0) * d + m;
      y[i * kQK + j + kQK / 2] = static_cast<float>(x1) * d + m;
    }
  }
}

void DequantizeQ5_0(const void* vx, float* y, int64_t k) {
  const BlockQ5_0* x = static_cast<const BlockQ5_0*>(vx);
  const int64_t nb = k / kQK;
  for (int64_t i = 0; i < nb; ++i) {
    const float d = Fp16ToF32(x[i].d);
    uint32_t qh;
    std::memcpy(&qh, x[i].qh, sizeof(qh));
    for (int j = 0; j < kQK / 2; ++j) {
      const uint8_t xh0 = static_cast<uint8_t>(((qh >> (j + 0)) << 4) & 0x10);
      const uint8_t xh1 = static_cast<uint8_t>((qh >> (j + 12)) & 0x10);
      const int x0 = ((x[i].qs[j] & 0x0F) | xh0) - 16;
      const int x1 = ((x[i].qs[j] >> 4) | xh1) - 16;
      y[i * kQK + j] = static_cast<float>(x0) * d;
      y[i * kQK + j + kQK / 2] = static_cast<float>(x1) * d;
    }
  }
}

void DequantizeQ5_1(const void* vx, float* y, int64_t k) {
  const BlockQ5_1* x = static_cast<const BlockQ5_1*>(vx);
  const int64_t nb = k / kQK;
  for (int64_t i = 0; i < nb; ++i) {
    const float d = Fp16ToF32(x[i].d);
    const float m = Fp16ToF32(x[i].m);
    uint32_t qh;
    std::memcpy(&qh, x[i].qh, sizeof(qh));
    for (int j = 0; j < kQK / 2; ++j) {
      const uint8_t xh0 = static_cast<uint8_t>(((qh >> (j + 0)) << 4) & 0x10);
      const uint8_t xh1 = static_cast<uint8_t>((qh >> (j + 12)) & 0x10);
      const int x0 = (x[i].qs[j] & 0x0F) | xh0;
      const int x1 = (x[i].qs[j] >> 4) | xh1;
      y[i * kQK + j] = static_cast<float>(x0) * d + m;
      y[i * kQK + j + kQK / 2] = static_cast<float>(x1) * d + m;
    }
  }
}

void DequantizeQ8_0(const void* vx, float* y, int64_t k) {
  const BlockQ8_0* x = static_cast<const BlockQ8_0*>(vx);
  const int64_t nb = k / kQK;
  for (int64_t i = 0; i < nb; ++i) {
    const float d = Fp16ToF32(x[i].d);
    for (int j = 0; j < kQK; ++j) y[i * kQK + j] = static_cast<float>(x[i].qs[j]) * d;
  }
}

// GGML has no Q8_1 dequantizer; this one (x = d * q) lets tests inspect activation blocks.
void DequantizeQ8_1(const void* vx, float* y, int64_t k) {
  const BlockQ8_1* x = static_cast<const BlockQ8_1*>(vx);
  const int64_t nb = k / kQK;
  for (int64_t i = 0; i < nb; ++i) {
    const float d = Fp16ToF32(x[i].d);
    for (int j = 0; j < kQK; ++j) y[i * kQK + j] = static_cast<float>(x[i].qs[j]) * d;
  }
}

// Table types: each nibble indexes 16 levels (IQ4_NL: fp16 scale, MXFP4: E8M0 scale).
template <class Block>
void DequantizeTable4(const void* vx, float* y, int64_t k, const int8_t* levels) {
  const Block* x = static_cast<const Block*>(vx);
  const int64_t nb = k / kQK;
  for (int64_t i = 0; i < nb; ++i) {
    const float d = BlockScale(x[i]);
    for (int j = 0; j < kQK / 2; ++j) {
      y[i * kQK + j] = d * levels[x[i].qs[j] & 0x0F];
      y[i * kQK + j + kQK / 2] = d * levels[x[i].qs[j] >> 4];
    }
  }
}

void DequantizeIQ4_NL(const void* vx, float* y, int64_t k) {
  DequantizeTable4<BlockIQ4_NL>(vx, y, k, kIq4NlLevels);
}

void DequantizeMXFP4(const void* vx, float* y, int64_t k) {
  DequantizeTable4<BlockMXFP4>(vx, y, k, kMxfp4Levels);
}

// ---------------------------------------------------------------------------------------------
// Quantize. F16 / BF16 round to nearest even; Q4_0 .. Q5_1 follow quantize_row_*_ref; Q8_0 / Q8_1
// follow ggml-cpu's x86 activation quantizers (id = 127 / amax, ties to even), because the
// matmul quantizes activations with GetKernels(vec_dot_type).quantize.

void QuantizeF32(const float* x, void* y, int64_t k) {
  std::memcpy(y, x, static_cast<size_t>(k) * sizeof(float));
}

void QuantizeF16(const float* x, void* vy, int64_t k) {
  fp16_t* y = static_cast<fp16_t*>(vy);
  for (int64_t i = 0; i < k; ++i) y[i] = F32ToFp16(x[i]);
}

// F16 weights' activations: each value rounded to f16 (as QuantizeF16), stored as f32.
void RoundF16AsF32(const float* x, void* vy, int64_t k) {
  float* y = static_cast<float*>(vy);
  for (int64_t i = 0; i < k; ++i) y[i] = Fp16ToF32(F32ToFp16(x[i]));
}

void QuantizeBF16(const float* x, void* vy, int64_t k) {
  bf16_t* y = static_cast<bf16_t*>(vy);
  for (int64_t i = 0; i < k; ++i) y[i] = F32ToBf16(x[i]);
}

void QuantizeQ4_0(const float* x, void* vy, int64_t k) {
  BlockQ4_0* y = static_cast<BlockQ4_0*>(vy);
  const int64_t nb = k / kQK;
  for (int64_t i = 0; i < nb; ++i) {
    // The signed value of largest magnitude maps to -8 so the full [-8, 7] range is used.
    float amax = 0.0f;
    float max = 0.0f;
    for (int j = 0; j < kQK; ++j) {
      const float v = x[i * kQK + j];
      if (amax < std::fabs(v)) {
        amax = std::fabs(v);
        max = v;
      }
    }
    const float d = max / -8;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = F32ToFp16(d);
    for (int j = 0; j < kQK / 2; ++j) {
      const float x0 = x[i * kQK + j] * id;
      const float x1 = x[i * kQK + kQK / 2 + j] * id;
      const int xi0 = std::min(15, static_cast<int>(static_cast<int8_t>(x0 + 8.5f)));
      const int xi1 = std::min(15, static_cast<int>(static_cast<int8_t>(x1 + 8.5f)));
      y[i].qs[j] = static_cast<uint8_t>(xi0 | (xi1 << 4));
    }
  }
}

void QuantizeQ4_1(const float* x, void* vy, int64_t k) {
  BlockQ4_1* y = static_cast<BlockQ4_1*>(vy);
  const int64_t nb = k / kQK;
  for (int64_t i = 0; i < nb; ++i) {
    float min = 3.402823466e+38f;
    float max = -3.402823466e+38f;
    for (int j = 0; j < kQK; ++j) {
      const float v = x[i * kQK + j];
      if (v < min) min = v;
      if (v > max) max = v;
    }
    const float d = (max - min) / ((1 << 4) - 1);
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = F32ToFp16(d);
    y[i].m = F32ToFp16(min);
    for (int j = 0; j < kQK / 2; ++j) {
      const float x0 = (x[i * kQK + j] - min) * id;
      const float x1 = (x[i * kQK + kQK / 2 + j] - min) * id;
      const int xi0 = std::min(15, static_cast<int>(static_cast<int8_t>(x0 + 0.5f)));
      const int xi1 = std::min(15, static_cast<int>(static_cast<int8_t>(x1 + 0.5f)));
      y[i].qs[j] = static_cast<uint8_t>(xi0 | (xi1 << 4));
    }
  }
}

void QuantizeQ5_0(const float* x, void* vy, int64_t k) {
  BlockQ5_0* y = static_cast<BlockQ5_0*>(vy);
  const int64_t nb = k / kQK;
  for (int64_t i = 0; i < nb; ++i) {
    float amax = 0.0f;
    float max = 0.0f;
    for (int j = 0; j < kQK; ++j) {
      const float v = x[i * kQK + j];
      if (amax < std::fabs(v)) {
        amax = std::fabs(v);
        max = v;
      }
    }
    const float d = max / -16;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = F32ToFp16(d);
    uint32_t qh = 0;
    for (int j = 0; j < kQK / 2; ++j) {
      const float x0 = x[i * kQK + j] * id;
      const float x1 = x[i * kQK + kQK / 2 + j] * id;
      const uint32_t xi0 =
          static_cast<uint32_t>(std::min(31, static_cast<int>(static_cast<int8_t>(x0 + 16.5f))));
      const uint32_t xi1 =
          static_cast<uint32_t>(std::min(31, static_cast<int>(static_cast<int8_t>(x1 + 16.5f))));
      y[i].qs[j] = static_cast<uint8_t>((xi0 & 0x0F) | ((xi1 & 0x0F) << 4));
      qh |= ((xi0 & 0x10u) >> 4) << (j + 0);
      qh |= ((xi1 & 0x10u) >> 4) << (j + kQK / 2);
    }
    std::memcpy(y[i].qh, &qh, sizeof(qh));
  }
}

void QuantizeQ5_1(const float* x, void* vy, int64_t k) {
  BlockQ5_1* y = static_cast<BlockQ5_1*>(vy);
  const int64_t nb = k / kQK;
  for (int64_t i = 0; i < nb; ++i) {
    float min = 3.402823466e+38f;
    float max = -3.402823466e+38f;
    for (int j = 0; j < kQK; ++j) {
      const float v = x[i * kQK + j];
      if (v < min) min = v;
      if (v > max) max = v;
    }
    const float d = (max - min) / ((1 << 5) - 1);
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = F32ToFp16(d);
    y[i].m = F32ToFp16(min);
    uint32_t qh = 0;
    for (int j = 0; j < kQK / 2; ++j) {
      const float x0 = (x[i * kQK + j] - min) * id;
      const float x1 = (x[i * kQK + kQK / 2 + j] - min) * id;
      // GGML does not clamp here: (max - min) * id rounds to at most 31.
      const uint32_t xi0 = static_cast<uint8_t>(x0 + 0.5f);
      const uint32_t xi1 = static_cast<uint8_t>(x1 + 0.5f);
      y[i].qs[j] = static_cast<uint8_t>((xi0 & 0x0F) | ((xi1 & 0x0F) << 4));
      qh |= ((xi0 & 0x10u) >> 4) << (j + 0);
      qh |= ((xi1 & 0x10u) >> 4) << (j + kQK / 2);
    }
    std::memcpy(y[i].qh, &qh, sizeof(qh));
  }
}

// Shared by Q8_0 and Q8_1: returns d (f32, before fp16 rounding) and writes the 32 codes.
inline float QuantizeBlock8(const float* x, int8_t* qs) {
  float amax = 0.0f;
  for (int j = 0; j < kQK; ++j) amax = std::fmax(amax, std::fabs(x[j]));
  const float d = amax / 127.f;
  // GGML's SIMD path scales by 127 / amax, not 1 / d; the two differ in the last bit.
  const float id = amax != 0.0f ? 127.f / amax : 0.0f;
  for (int j = 0; j < kQK; ++j) qs[j] = static_cast<int8_t>(RoundNearestEven(x[j] * id));
  return d;
}

void QuantizeQ8_0(const float* x, void* vy, int64_t k) {
  BlockQ8_0* y = static_cast<BlockQ8_0*>(vy);
  const int64_t nb = k / kQK;
  for (int64_t i = 0; i < nb; ++i) {
    const float d = QuantizeBlock8(x + i * kQK, y[i].qs);
    y[i].d = F32ToFp16(d);
  }
}

void QuantizeQ8_1(const float* x, void* vy, int64_t k) {
  BlockQ8_1* y = static_cast<BlockQ8_1*>(vy);
  const int64_t nb = k / kQK;
  for (int64_t i = 0; i < nb; ++i) {
    const float d = QuantizeBlock8(x + i * kQK, y[i].qs);
    int sum = 0;
    for (int j = 0; j < kQK; ++j) sum += y[i].qs[j];
    y[i].d = F32ToFp16(d);
    y[i].s = F32ToFp16(d * static_cast<float>(sum));
  }
}

// ---------------------------------------------------------------------------------------------
// Dot products. Float types accumulate in double (as GGML's scalar ggml_float path) so the twin
// is close to exact; quantized types keep GGML's per-block f32 arithmetic.

void VecDotF32(int64_t k, float* s, const void* vw, const void* va) {
  const float* w = static_cast<const float*>(vw);
  const float* a = static_cast<const float*>(va);
  double sum = 0.0;
  for (int64_t i = 0; i < k; ++i) sum += static_cast<double>(w[i] * a[i]);
  *s = static_cast<float>(sum);
}

// Activations are f32 (f16-rounded by the matmul: RoundF16AsF32).
void VecDotF16(int64_t k, float* s, const void* vw, const void* va) {
  const fp16_t* w = static_cast<const fp16_t*>(vw);
  const float* a = static_cast<const float*>(va);
  double sum = 0.0;
  // With f16-rounded activations the product of two halves is exact in f32.
  for (int64_t i = 0; i < k; ++i) sum += static_cast<double>(Fp16ToF32(w[i]) * a[i]);
  *s = static_cast<float>(sum);
}

void VecDotBF16(int64_t k, float* s, const void* vw, const void* va) {
  const bf16_t* w = static_cast<const bf16_t*>(vw);
  const bf16_t* a = static_cast<const bf16_t*>(va);
  double sum = 0.0;
  for (int64_t i = 0; i < k; ++i) sum += static_cast<double>(Bf16ToF32(w[i]) * Bf16ToF32(a[i]));
  *s = static_cast<float>(sum);
}

void VecDotQ4_0(int64_t k, float* s, const void* vw, const void* va) {
  const BlockQ4_0* w = static_cast<const BlockQ4_0*>(vw);
  const BlockQ8_0* a = static_cast<const BlockQ8_0*>(va);
  const int64_t nb = k / kQK;
  float sumf = 0.0f;
  for (int64_t i = 0; i < nb; ++i) {
    int sumi = 0;
    for (int j = 0; j < kQK / 2; ++j) {
      const int v0 = (w[i].qs[j] & 0x0F) - 8;
      const int v1 = (w[i].qs[j] >> 4) - 8;
      sumi += v0 * a[i].qs[j] + v1 * a[i].qs[j + kQK / 2];
    }
    sumf += static_cast<float>(sumi) * (Fp16ToF32(w[i].d) * Fp16ToF32(a[i].d));
  }
  *s = sumf;
}

void VecDotQ4_1(int64_t k, float* s, const void* vw, const void* va) {
  const BlockQ4_1* w = static_cast<const BlockQ4_1*>(vw);
  const BlockQ8_1* a = static_cast<const BlockQ8_1*>(va);
  const int64_t nb = k / kQK;
  float sumf = 0.0f;
  for (int64_t i = 0; i < nb; ++i) {
    int sumi = 0;
    for (int j = 0; j < kQK / 2; ++j) {
      const int v0 = w[i].qs[j] & 0x0F;
      const int v1 = w[i].qs[j] >> 4;
      sumi += v0 * a[i].qs[j] + v1 * a[i].qs[j + kQK / 2];
    }
    // sum((d q + m) * da qa) = d da sum(q qa) + m s, with s = da sum(qa) stored in the activation.
    sumf += (Fp16ToF32(w[i].d) * Fp16ToF32(a[i].d)) * static_cast<float>(sumi) +
            Fp16ToF32(w[i].m) * Fp16ToF32(a[i].s);
  }
  *s = sumf;
}

void VecDotQ5_0(int64_t k, float* s, const void* vw, const void* va) {
  const BlockQ5_0* w = static_cast<const BlockQ5_0*>(vw);
  const BlockQ8_0* a = static_cast<const BlockQ8_0*>(va);
  const int64_t nb = k / kQK;
  float sumf = 0.0f;
  for (int64_t i = 0; i < nb; ++i) {
    uint32_t qh;
    std::memcpy(&qh, w[i].qh, sizeof(qh));
    int sumi = 0;
    for (int j = 0; j < kQK / 2; ++j) {
      const int xh0 = static_cast<int>(((qh >> (j + 0)) << 4) & 0x10);
      const int xh1 = static_cast<int>((qh >> (j + 12)) & 0x10);
      const int v0 = ((w[i].qs[j] & 0x0F) | xh0) - 16;
      const int v1 = ((w[i].qs[j] >> 4) | xh1) - 16;
      sumi += v0 * a[i].qs[j] + v1 * a[i].qs[j + kQK / 2];
    }
    sumf += static_cast<float>(sumi) * (Fp16ToF32(w[i].d) * Fp16ToF32(a[i].d));
  }
  *s = sumf;
}

void VecDotQ5_1(int64_t k, float* s, const void* vw, const void* va) {
  const BlockQ5_1* w = static_cast<const BlockQ5_1*>(vw);
  const BlockQ8_1* a = static_cast<const BlockQ8_1*>(va);
  const int64_t nb = k / kQK;
  float sumf = 0.0f;
  for (int64_t i = 0; i < nb; ++i) {
    uint32_t qh;
    std::memcpy(&qh, w[i].qh, sizeof(qh));
    int sumi = 0;
    for (int j = 0; j < kQK / 2; ++j) {
      const int xh0 = static_cast<int>(((qh >> (j + 0)) << 4) & 0x10);
      const int xh1 = static_cast<int>((qh >> (j + 12)) & 0x10);
      const int v0 = (w[i].qs[j] & 0x0F) | xh0;
      const int v1 = (w[i].qs[j] >> 4) | xh1;
      sumi += v0 * a[i].qs[j] + v1 * a[i].qs[j + kQK / 2];
    }
    sumf += (Fp16ToF32(w[i].d) * Fp16ToF32(a[i].d)) * static_cast<float>(sumi) +
            Fp16ToF32(w[i].m) * Fp16ToF32(a[i].s);
  }
  *s = sumf;
}

void VecDotQ8_0(int64_t k, float* s, const void* vw, const void* va) {
  const BlockQ8_0* w = static_cast<const BlockQ8_0*>(vw);
  const BlockQ8_0* a = static_cast<const BlockQ8_0*>(va);
  const int64_t nb = k / kQK;
  float sumf = 0.0f;
  for (int64_t i = 0; i < nb; ++i) {
    int sumi = 0;
    for (int j = 0; j < kQK; ++j) sumi += w[i].qs[j] * a[i].qs[j];
    sumf += static_cast<float>(sumi) * (Fp16ToF32(w[i].d) * Fp16ToF32(a[i].d));
  }
  *s = sumf;
}

// IQ4_NL and MXFP4 against Q8_0: the integer dot of the levels with the codes per block, then
// sumf += (d_a * d_w) * sumi, as GGML's generic code.
template <class Block>
void VecDotTable4(int64_t k, float* s, const void* vw, const void* va, const int8_t* levels) {
  const Block* w = static_cast<const Block*>(vw);
  const BlockQ8_0* a = static_cast<const BlockQ8_0*>(va);
  const int64_t nb = k / kQK;
  float sumf = 0.0f;
  for (int64_t i = 0; i < nb; ++i) {
    int sumi = 0;
    for (int j = 0; j < kQK / 2; ++j) {
      sumi +=
          levels[w[i].qs[j] & 0x0F] * a[i].qs[j] + levels[w[i].qs[j] >> 4] * a[i].qs[j + kQK / 2];
    }
    sumf += (Fp16ToF32(a[i].d) * BlockScale(w[i])) * static_cast<float>(sumi);
  }
  *s = sumf;
}

void VecDotIQ4_NL(int64_t k, float* s, const void* vw, const void* va) {
  VecDotTable4<BlockIQ4_NL>(k, s, vw, va, kIq4NlLevels);
}

void VecDotMXFP4(int64_t k, float* s, const void* vw, const void* va) {
  VecDotTable4<BlockMXFP4>(k, s, vw, va, kMxfp4Levels);
}

void Set(KernelTable& table, GgmlType type, GgmlType vec_dot_type, DequantizeRowFn dequantize,
         QuantizeRowFn quantize, VecDotFn vec_dot, VecDotMultiFn vec_dot_multi) {
  table[static_cast<int>(type)] =
      TypeKernels{type, vec_dot_type, dequantize, quantize, vec_dot, vec_dot_multi};
}

}  // namespace

void RegisterScalarLegacy(KernelTable& table) {
  using T = GgmlType;
  Set(table, T::kF32, T::kF32, DequantizeF32, QuantizeF32, VecDotF32, VecDotEachRow<VecDotF32>);
  Set(table, T::kF16, T::kF32, DequantizeF16, QuantizeF16, VecDotF16, VecDotEachRow<VecDotF16>);
  table[static_cast<int>(T::kF16)].quantize_act = RoundF16AsF32;
  Set(table, T::kBF16, T::kBF16, DequantizeBF16, QuantizeBF16, VecDotBF16,
      VecDotEachRow<VecDotBF16>);
  Set(table, T::kQ4_0, T::kQ8_0, DequantizeQ4_0, QuantizeQ4_0, VecDotQ4_0,
      VecDotEachRow<VecDotQ4_0>);
  Set(table, T::kQ4_1, T::kQ8_1, DequantizeQ4_1, QuantizeQ4_1, VecDotQ4_1,
      VecDotEachRow<VecDotQ4_1>);
  Set(table, T::kQ5_0, T::kQ8_0, DequantizeQ5_0, QuantizeQ5_0, VecDotQ5_0,
      VecDotEachRow<VecDotQ5_0>);
  Set(table, T::kQ5_1, T::kQ8_1, DequantizeQ5_1, QuantizeQ5_1, VecDotQ5_1,
      VecDotEachRow<VecDotQ5_1>);
  Set(table, T::kQ8_0, T::kQ8_0, DequantizeQ8_0, QuantizeQ8_0, VecDotQ8_0,
      VecDotEachRow<VecDotQ8_0>);
  // No quantizers: llama-quantize makes these files (its searches are not reproduced here).
  Set(table, T::kIQ4_NL, T::kQ8_0, DequantizeIQ4_NL, nullptr, VecDotIQ4_NL,
      VecDotEachRow<VecDotIQ4_NL>);
  Set(table, T::kMXFP4, T::kQ8_0, DequantizeMXFP4, nullptr, VecDotMXFP4,
      VecDotEachRow<VecDotMXFP4>);
  // Activation-only: no dot product with Q8_1 weights.
  Set(table, T::kQ8_1, T::kQ8_1, DequantizeQ8_1, QuantizeQ8_1, nullptr, nullptr);
}

}  // namespace lamina::quant_internal
