// Scalar K-quant kernels (Q2_K..Q6_K, IQ4_XS, TQ1_0, TQ2_0, Q8_K): the reference twins the SIMD
// files are tested against. Formulas, integer sums and float accumulation order follow GGML's
// reference and generic CPU code (llama.cpp c392e50), so results here are what llama.cpp's scalar
// path computes.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "quant/kernel_registry.h"
#include "quant/quant.h"
#include "quant/types.h"
#include "util/check.h"
#include "util/fp16.h"

namespace lamina::quant_internal {
namespace {

// Round to nearest (ties to even) the way GGML does: the float add of 1.5 * 2^23 puts the rounded
// integer in the mantissa. Quantizers must use this, not lrintf, to reproduce GGML's codes.
inline int NearestInt(float fval) {
  const float val = fval + 12582912.f;
  int32_t i;
  std::memcpy(&i, &val, sizeof(i));
  return (i & 0x007fffff) - 0x00400000;
}

// Q4_K / Q5_K: 8 six-bit scales and 8 six-bit mins packed into 12 bytes.
inline void ScaleMinK4(int j, const uint8_t* q, uint8_t* d, uint8_t* m) {
  if (j < 4) {
    *d = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// Q3_K: 16 six-bit scales in 12 bytes (low nibbles in bytes 0..7, top two bits in bytes 8..11),
// returned with the +32 bias removed.
inline void UnpackQ3Scales(const uint8_t* packed, int8_t* out) {
  constexpr uint32_t kMask1 = 0x03030303;
  constexpr uint32_t kMask2 = 0x0f0f0f0f;
  uint32_t aux[4];
  std::memcpy(aux, packed, 12);
  const uint32_t tmp = aux[2];
  aux[2] = ((aux[0] >> 4) & kMask2) | (((tmp >> 4) & kMask1) << 4);
  aux[3] = ((aux[1] >> 4) & kMask2) | (((tmp >> 6) & kMask1) << 4);
  aux[0] = (aux[0] & kMask2) | (((tmp >> 0) & kMask1) << 4);
  aux[1] = (aux[1] & kMask2) | (((tmp >> 2) & kMask1) << 4);
  int8_t raw[16];
  std::memcpy(raw, aux, 16);
  for (int j = 0; j < 16; ++j) out[j] = static_cast<int8_t>(raw[j] - 32);
}

// ---------------------------------------------------------------------------------------------
// Dequantize.

void DequantizeQ2K(const void* vx, float* y, int64_t k) {
  LAMINA_DCHECK(k % kQK_K == 0);
  const auto* x = static_cast<const BlockQ2_K*>(vx);
  for (int64_t i = 0; i < k / kQK_K; ++i) {
    const float d = Fp16ToF32(x[i].d);
    const float dmin = Fp16ToF32(x[i].dmin);
    const uint8_t* q = x[i].qs;
    int is = 0;
    for (int n = 0; n < kQK_K; n += 128) {
      for (int shift = 0; shift < 8; shift += 2) {
        for (int half = 0; half < 2; ++half) {
          const uint8_t sc = x[i].scales[is++];
          const float dl = d * (sc & 0xF);
          const float ml = dmin * (sc >> 4);
          for (int l = 0; l < 16; ++l) *y++ = dl * ((q[l + 16 * half] >> shift) & 3) - ml;
        }
      }
      q += 32;
    }
  }
}

void DequantizeQ3K(const void* vx, float* y, int64_t k) {
  LAMINA_DCHECK(k % kQK_K == 0);
  const auto* x = static_cast<const BlockQ3_K*>(vx);
  for (int64_t i = 0; i < k / kQK_K; ++i) {
    const float d_all = Fp16ToF32(x[i].d);
    int8_t scales[16];
    UnpackQ3Scales(x[i].scales, scales);
    const uint8_t* q = x[i].qs;
    const uint8_t* hm = x[i].hmask;
    uint8_t m = 1;
    int is = 0;
    for (int n = 0; n < kQK_K; n += 128) {
      for (int shift = 0; shift < 8; shift += 2) {
        for (int half = 0; half < 2; ++half) {
          const float dl = d_all * scales[is++];
          for (int l = 16 * half; l < 16 * half + 16; ++l) {
            *y++ = dl * (((q[l] >> shift) & 3) - ((hm[l] & m) ? 0 : 4));
          }
        }
        m <<= 1;
      }
      q += 32;
    }
  }
}

void DequantizeQ4K(const void* vx, float* y, int64_t k) {
  LAMINA_DCHECK(k % kQK_K == 0);
  const auto* x = static_cast<const BlockQ4_K*>(vx);
  for (int64_t i = 0; i < k / kQK_K; ++i) {
    const float d = Fp16ToF32(x[i].d);
    const float dmin = Fp16ToF32(x[i].dmin);
    const uint8_t* q = x[i].qs;
    for (int is = 0; is < 8; is += 2) {
      uint8_t sc, m;
      ScaleMinK4(is, x[i].scales, &sc, &m);
      const float d1 = d * sc, m1 = dmin * m;
      ScaleMinK4(is + 1, x[i].scales, &sc, &m);
      const float d2 = d * sc, m2 = dmin * m;
      for (int l = 0; l < 32; ++l) *y++ = d1 * (q[l] & 0xF) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * (q[l] >> 4) - m2;
      q += 32;
    }
  }
}

void DequantizeQ5K(const void* vx, float* y, int64_t k) {
  LAMINA_DCHECK(k % kQK_K == 0);
  const auto* x = static_cast<const BlockQ5_K*>(vx);
  for (int64_t i = 0; i < k / kQK_K; ++i) {
    const float d = Fp16ToF32(x[i].d);
    const float dmin = Fp16ToF32(x[i].dmin);
    const uint8_t* ql = x[i].qs;
    const uint8_t* qh = x[i].qh;
    uint8_t u1 = 1, u2 = 2;
    for (int is = 0; is < 8; is += 2) {
      uint8_t sc, m;
      ScaleMinK4(is, x[i].scales, &sc, &m);
      const float d1 = d * sc, m1 = dmin * m;
      ScaleMinK4(is + 1, x[i].scales, &sc, &m);
      const float d2 = d * sc, m2 = dmin * m;
      for (int l = 0; l < 32; ++l) *y++ = d1 * ((ql[l] & 0xF) + ((qh[l] & u1) ? 16 : 0)) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * ((ql[l] >> 4) + ((qh[l] & u2) ? 16 : 0)) - m2;
      ql += 32;
      u1 <<= 2;
      u2 <<= 2;
    }
  }
}

void DequantizeQ6K(const void* vx, float* y, int64_t k) {
  LAMINA_DCHECK(k % kQK_K == 0);
  const auto* x = static_cast<const BlockQ6_K*>(vx);
  for (int64_t i = 0; i < k / kQK_K; ++i) {
    const float d = Fp16ToF32(x[i].d);
    const uint8_t* ql = x[i].ql;
    const uint8_t* qh = x[i].qh;
    const int8_t* sc = x[i].scales;
    for (int n = 0; n < kQK_K; n += 128) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        // (d * scale) * q, left to right, as GGML evaluates it.
        y[l + 0] = d * sc[is + 0] * q1;
        y[l + 32] = d * sc[is + 2] * q2;
        y[l + 64] = d * sc[is + 4] * q3;
        y[l + 96] = d * sc[is + 6] * q4;
      }
      y += 128;
      ql += 64;
      qh += 32;
      sc += 8;
    }
  }
}

// IQ4_XS: group g's 6-bit scale, low 4 bits from scales_l, top 2 bits from scales_h.
inline int Iq4XsScale(const BlockIQ4_XS& b, int g) {
  return ((b.scales_l[g / 2] >> (4 * (g % 2))) & 0xF) | (((b.scales_h >> (2 * g)) & 3) << 4);
}

void DequantizeIQ4XS(const void* vx, float* y, int64_t k) {
  LAMINA_DCHECK(k % kQK_K == 0);
  const auto* x = static_cast<const BlockIQ4_XS*>(vx);
  for (int64_t i = 0; i < k / kQK_K; ++i) {
    const float d = Fp16ToF32(x[i].d);
    const uint8_t* q = x[i].qs;
    for (int g = 0; g < kQK_K / 32; ++g) {
      const float dl = d * (Iq4XsScale(x[i], g) - 32);
      for (int l = 0; l < 16; ++l) {
        y[l] = dl * kIq4NlLevels[q[l] & 0xF];
        y[l + 16] = dl * kIq4NlLevels[q[l] >> 4];
      }
      y += 32;
      q += 16;
    }
  }
}

// TQ1_0: digit n of a pow3-packed byte b (types.h), as 0..2: the top two bits of (b * 3^n) * 3
// in 10 bits, the byte product taken mod 256.
inline int Tq1Digit(uint8_t b, int n) {
  constexpr uint8_t kPow3[5] = {1, 3, 9, 27, 81};
  const uint8_t q = static_cast<uint8_t>(b * kPow3[n]);
  return (q * 3) >> 8;
}

// Calls f(element, code 0..2) for the 256 elements of a TQ1_0 block, in element order.
template <typename F>
inline void ForEachTq1(const BlockTQ1_0& b, F&& f) {
  int e = 0;
  for (int n = 0; n < 5; ++n) {
    for (int m = 0; m < 32; ++m) f(e++, Tq1Digit(b.qs[m], n));
  }
  for (int n = 0; n < 5; ++n) {
    for (int m = 0; m < 16; ++m) f(e++, Tq1Digit(b.qs[32 + m], n));
  }
  for (int n = 0; n < 4; ++n) {
    for (int j = 0; j < 4; ++j) f(e++, Tq1Digit(b.qh[j], n));
  }
}

void DequantizeTQ1_0(const void* vx, float* y, int64_t k) {
  LAMINA_DCHECK(k % kQK_K == 0);
  const auto* x = static_cast<const BlockTQ1_0*>(vx);
  for (int64_t i = 0; i < k / kQK_K; ++i) {
    const float d = Fp16ToF32(x[i].d);
    ForEachTq1(x[i], [&](int e, int t) { y[e] = static_cast<float>(t - 1) * d; });
    y += kQK_K;
  }
}

void DequantizeTQ2_0(const void* vx, float* y, int64_t k) {
  LAMINA_DCHECK(k % kQK_K == 0);
  const auto* x = static_cast<const BlockTQ2_0*>(vx);
  for (int64_t i = 0; i < k / kQK_K; ++i) {
    const float d = Fp16ToF32(x[i].d);
    for (int h = 0; h < 2; ++h) {
      for (int l = 0; l < 4; ++l) {
        for (int m = 0; m < 32; ++m) {
          y[128 * h + 32 * l + m] =
              static_cast<float>(((x[i].qs[32 * h + m] >> (2 * l)) & 3) - 1) * d;
        }
      }
    }
    y += kQK_K;
  }
}

void DequantizeQ8K(const void* vx, float* y, int64_t k) {
  LAMINA_DCHECK(k % kQK_K == 0);
  const auto* x = static_cast<const BlockQ8_K*>(vx);
  for (int64_t i = 0; i < k / kQK_K; ++i) {
    for (int j = 0; j < kQK_K; ++j) *y++ = x[i].d * x[i].qs[j];
  }
}

// ---------------------------------------------------------------------------------------------
// Activation quantizer. The -127 (not -128) keeps codes symmetric so SIMD kernels may use sign
// tricks; only the positive side is clamped, exactly as GGML does.

void QuantizeQ8K(const float* x, void* vy, int64_t k) {
  LAMINA_CHECK(k % kQK_K == 0);
  auto* y = static_cast<BlockQ8_K*>(vy);
  for (int64_t i = 0; i < k / kQK_K; ++i, x += kQK_K) {
    float max = 0;
    float amax = 0;
    for (int j = 0; j < kQK_K; ++j) {
      const float ax = std::fabs(x[j]);
      if (ax > amax) {
        amax = ax;
        max = x[j];
      }
    }
    if (amax == 0.f) {
      // GGML leaves bsums stale here; zero them so the block is fully defined.
      std::memset(&y[i], 0, sizeof(BlockQ8_K));
      continue;
    }
    const float iscale = -127.f / max;
    for (int j = 0; j < kQK_K; ++j) {
      y[i].qs[j] = static_cast<int8_t>(std::min(127, NearestInt(iscale * x[j])));
    }
    for (int j = 0; j < kQK_K / 16; ++j) {
      int sum = 0;
      for (int l = 0; l < 16; ++l) sum += y[i].qs[j * 16 + l];
      y[i].bsums[j] = static_cast<int16_t>(sum);
    }
    y[i].d = 1 / iscale;
  }
}

// ---------------------------------------------------------------------------------------------
// Weight quantizers (GGML's reference, no importance matrix): enough to build synthetic models
// whose files llama.cpp would produce identically.

// Fits x ~ scale * L - min with L in [0, nmax], searching scale around the min/max fit.
float MakeQkx2Quants(int n, int nmax, const float* x, const float* weights, uint8_t* L,
                     float* the_min, uint8_t* laux, float rmin, float rdelta, int nstep,
                     bool use_mad) {
  float min = x[0];
  float max = x[0];
  float sum_w = weights[0];
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] < min) min = x[i];
    if (x[i] > max) max = x[i];
    const float w = weights[i];
    sum_w += w;
    sum_x += w * x[i];
  }
  if (min > 0) min = 0;
  if (max == min) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    *the_min = -min;
    return 0.f;
  }
  float iscale = nmax / (max - min);
  float scale = 1 / iscale;
  float best_error = 0;
  for (int i = 0; i < n; ++i) {
    const int l = NearestInt(iscale * (x[i] - min));
    L[i] = static_cast<uint8_t>(std::max(0, std::min(nmax, l)));
    float diff = scale * L[i] + min - x[i];
    diff = use_mad ? std::fabs(diff) : diff * diff;
    best_error += weights[i] * diff;
  }
  if (nstep < 1) {
    *the_min = -min;
    return scale;
  }
  for (int is = 0; is <= nstep; ++is) {
    iscale = (rmin + rdelta * is + nmax) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      int l = NearestInt(iscale * (x[i] - min));
      l = std::max(0, std::min(nmax, l));
      laux[i] = static_cast<uint8_t>(l);
      const float w = weights[i];
      sum_l += w * l;
      sum_l2 += w * l * l;
      sum_xl += w * l * x[i];
    }
    const float D = sum_w * sum_l2 - sum_l * sum_l;
    if (D > 0) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
      float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
      if (this_min > 0) {
        this_min = 0;
        this_scale = sum_xl / sum_l2;
      }
      float cur_error = 0;
      for (int i = 0; i < n; ++i) {
        float diff = this_scale * laux[i] + this_min - x[i];
        diff = use_mad ? std::fabs(diff) : diff * diff;
        cur_error += weights[i] * diff;
      }
      if (cur_error < best_error) {
        for (int i = 0; i < n; ++i) L[i] = laux[i];
        best_error = cur_error;
        scale = this_scale;
        min = this_min;
      }
    }
  }
  *the_min = -min;
  return scale;
}

// Symmetric fit x ~ scale * (L - nmax), L in [0, 2*nmax), weighted by x^2 (rmse_type 1).
float MakeQxQuants(int n, int nmax, const float* x, int8_t* L) {
  float max = 0;
  float amax = 0;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax < 1e-15f) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    return 0.f;
  }
  float iscale = -nmax / max;
  float sumlx = 0;
  float suml2 = 0;
  for (int i = 0; i < n; ++i) {
    int l = NearestInt(iscale * x[i]);
    l = std::max(-nmax, std::min(nmax - 1, l));
    L[i] = static_cast<int8_t>(l + nmax);
    const float w = x[i] * x[i];
    sumlx += w * x[i] * l;
    suml2 += w * l * l;
  }
  float scale = suml2 ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    iscale = -(nmax + 0.1f * is) / max;
    sumlx = suml2 = 0;
    for (int i = 0; i < n; ++i) {
      int l = NearestInt(iscale * x[i]);
      l = std::max(-nmax, std::min(nmax - 1, l));
      const float w = x[i] * x[i];
      sumlx += w * x[i] * l;
      suml2 += w * l * l;
    }
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      for (int i = 0; i < n; ++i) {
        const int l = NearestInt(iscale * x[i]);
        L[i] = static_cast<int8_t>(nmax + std::max(-nmax, std::min(nmax - 1, l)));
      }
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

// Shared by Q4_K and Q5_K, which differ only in the code range and search parameters.
template <int kNmax>
void QuantizeScaleMinK(const float* x, float* scales, float* mins, uint8_t* L, uint8_t* packed,
                       fp16_t* d_out, fp16_t* dmin_out) {
  uint8_t laux[32];
  float weights[32];
  float max_scale = 0;
  float max_min = 0;
  for (int j = 0; j < kQK_K / 32; ++j) {
    float sum_x2 = 0;
    for (int l = 0; l < 32; ++l) sum_x2 += x[32 * j + l] * x[32 * j + l];
    const float av_x = std::sqrt(sum_x2 / 32);
    for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(x[32 * j + l]);
    if constexpr (kNmax == 15) {
      scales[j] = MakeQkx2Quants(32, kNmax, x + 32 * j, weights, L + 32 * j, &mins[j], laux, -1.f,
                                 0.1f, 20, false);
    } else {
      scales[j] = MakeQkx2Quants(32, kNmax, x + 32 * j, weights, L + 32 * j, &mins[j], laux, -0.5f,
                                 0.1f, 15, false);
    }
    max_scale = std::max(max_scale, scales[j]);
    max_min = std::max(max_min, mins[j]);
  }
  const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
  const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
  for (int j = 0; j < kQK_K / 32; ++j) {
    uint8_t ls = static_cast<uint8_t>(NearestInt(inv_scale * scales[j]));
    uint8_t lm = static_cast<uint8_t>(NearestInt(inv_min * mins[j]));
    ls = std::min<uint8_t>(63, ls);
    lm = std::min<uint8_t>(63, lm);
    if (j < 4) {
      packed[j] = ls;
      packed[j + 4] = lm;
    } else {
      packed[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4);
      packed[j - 4] |= ((ls >> 4) << 6);
      packed[j - 0] |= ((lm >> 4) << 6);
    }
  }
  *d_out = F32ToFp16(max_scale / 63.f);
  *dmin_out = F32ToFp16(max_min / 63.f);
  for (int j = 0; j < kQK_K / 32; ++j) {
    uint8_t sc, m;
    ScaleMinK4(j, packed, &sc, &m);
    const float d = Fp16ToF32(*d_out) * sc;
    if (!d) continue;
    const float dm = Fp16ToF32(*dmin_out) * m;
    for (int ii = 0; ii < 32; ++ii) {
      const int l = NearestInt((x[32 * j + ii] + dm) / d);
      L[32 * j + ii] = static_cast<uint8_t>(std::max(0, std::min(kNmax, l)));
    }
  }
}

void QuantizeQ4K(const float* x, void* vy, int64_t k) {
  LAMINA_CHECK(k % kQK_K == 0);
  auto* y = static_cast<BlockQ4_K*>(vy);
  uint8_t L[kQK_K];
  float scales[kQK_K / 32], mins[kQK_K / 32];
  for (int64_t i = 0; i < k / kQK_K; ++i, x += kQK_K) {
    std::memset(y[i].scales, 0, sizeof(y[i].scales));
    QuantizeScaleMinK<15>(x, scales, mins, L, y[i].scales, &y[i].d, &y[i].dmin);
    uint8_t* q = y[i].qs;
    for (int j = 0; j < kQK_K; j += 64) {
      for (int l = 0; l < 32; ++l) q[l] = L[j + l] | (L[j + l + 32] << 4);
      q += 32;
    }
  }
}

void QuantizeQ5K(const float* x, void* vy, int64_t k) {
  LAMINA_CHECK(k % kQK_K == 0);
  auto* y = static_cast<BlockQ5_K*>(vy);
  uint8_t L[kQK_K];
  float scales[kQK_K / 32], mins[kQK_K / 32];
  for (int64_t i = 0; i < k / kQK_K; ++i, x += kQK_K) {
    std::memset(y[i].scales, 0, sizeof(y[i].scales));
    QuantizeScaleMinK<31>(x, scales, mins, L, y[i].scales, &y[i].d, &y[i].dmin);
    uint8_t* qh = y[i].qh;
    uint8_t* ql = y[i].qs;
    std::memset(qh, 0, kQK_K / 8);
    uint8_t m1 = 1, m2 = 2;
    for (int n = 0; n < kQK_K; n += 64) {
      for (int j = 0; j < 32; ++j) {
        int l1 = L[n + j];
        if (l1 > 15) {
          l1 -= 16;
          qh[j] |= m1;
        }
        int l2 = L[n + j + 32];
        if (l2 > 15) {
          l2 -= 16;
          qh[j] |= m2;
        }
        ql[j] = static_cast<uint8_t>(l1 | (l2 << 4));
      }
      m1 <<= 2;
      m2 <<= 2;
      ql += 32;
    }
  }
}

void QuantizeQ6K(const float* x, void* vy, int64_t k) {
  LAMINA_CHECK(k % kQK_K == 0);
  auto* y = static_cast<BlockQ6_K*>(vy);
  int8_t L[kQK_K];
  float scales[kQK_K / 16];
  for (int64_t i = 0; i < k / kQK_K; ++i, x += kQK_K) {
    float max_scale = 0;
    float max_abs_scale = 0;
    for (int ib = 0; ib < kQK_K / 16; ++ib) {
      const float scale = MakeQxQuants(16, 32, x + 16 * ib, L + 16 * ib);
      scales[ib] = scale;
      if (std::fabs(scale) > max_abs_scale) {
        max_abs_scale = std::fabs(scale);
        max_scale = scale;
      }
    }
    if (max_abs_scale < 1e-15f) {
      std::memset(&y[i], 0, sizeof(BlockQ6_K));
      continue;
    }
    const float iscale = -128.f / max_scale;
    y[i].d = F32ToFp16(1 / iscale);
    for (int ib = 0; ib < kQK_K / 16; ++ib) {
      y[i].scales[ib] = static_cast<int8_t>(std::min(127, NearestInt(iscale * scales[ib])));
    }
    for (int j = 0; j < kQK_K / 16; ++j) {
      const float d = Fp16ToF32(y[i].d) * y[i].scales[j];
      if (!d) continue;
      for (int ii = 0; ii < 16; ++ii) {
        int l = NearestInt(x[16 * j + ii] / d);
        l = std::max(-32, std::min(31, l));
        L[16 * j + ii] = static_cast<int8_t>(l + 32);
      }
    }
    uint8_t* ql = y[i].ql;
    uint8_t* qh = y[i].qh;
    for (int j = 0; j < kQK_K; j += 128) {
      for (int l = 0; l < 32; ++l) {
        const uint8_t q1 = L[j + l + 0] & 0xF;
        const uint8_t q2 = L[j + l + 32] & 0xF;
        const uint8_t q3 = L[j + l + 64] & 0xF;
        const uint8_t q4 = L[j + l + 96] & 0xF;
        ql[l + 0] = q1 | (q3 << 4);
        ql[l + 32] = q2 | (q4 << 4);
        qh[l] = (L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) | ((L[j + l + 64] >> 4) << 4) |
                ((L[j + l + 96] >> 4) << 6);
      }
      ql += 64;
      qh += 32;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Dot products against Q8_K. Integer sums are exact; the float accumulation (eight partial sums
// for Q3_K..Q6_K, one running sum for Q2_K) mirrors GGML's generic code.

void VecDotQ2K(int64_t k, float* s, const void* vx, const void* vy) {
  const auto* x = static_cast<const BlockQ2_K*>(vx);
  const auto* y = static_cast<const BlockQ8_K*>(vy);
  float sumf = 0;
  for (int64_t i = 0; i < k / kQK_K; ++i) {
    const uint8_t* q2 = x[i].qs;
    const int8_t* q8 = y[i].qs;
    const uint8_t* sc = x[i].scales;
    int summs = 0;
    for (int j = 0; j < 16; ++j) summs += y[i].bsums[j] * (sc[j] >> 4);
    const float dall = y[i].d * Fp16ToF32(x[i].d);
    const float dmin = y[i].d * Fp16ToF32(x[i].dmin);
    int isum = 0;
    int is = 0;
    for (int n = 0; n < kQK_K / 128; ++n) {
      for (int shift = 0; shift < 8; shift += 2) {
        for (int half = 0; half < 2; ++half) {
          const int d = sc[is++] & 0xF;
          int isuml = 0;
          for (int l = 16 * half; l < 16 * half + 16; ++l) isuml += q8[l] * ((q2[l] >> shift) & 3);
          isum += d * isuml;
        }
        q8 += 32;
      }
      q2 += 32;
    }
    sumf += dall * isum - dmin * summs;
  }
  *s = sumf;
}

// Shared tail of Q3_K..Q6_K: aux8 holds the 256 signed codes, scale16[j] the scale of the 16-value
// group j; adds d * (eight lane sums) into sums as GGML's generic code does.
inline void AccumulateGroups16(const int8_t* aux8, const int8_t* q8, const int* scale16, float d,
                               float* sums) {
  int32_t aux32[8] = {};
  for (int j = 0; j < kQK_K / 16; ++j) {
    for (int half = 0; half < 2; ++half) {
      for (int l = 0; l < 8; ++l) {
        const int16_t prod = static_cast<int16_t>(q8[l] * aux8[l]);
        aux32[l] += scale16[j] * prod;
      }
      q8 += 8;
      aux8 += 8;
    }
  }
  for (int l = 0; l < 8; ++l) sums[l] += d * aux32[l];
}

void VecDotQ3K(int64_t k, float* s, const void* vx, const void* vy) {
  const auto* x = static_cast<const BlockQ3_K*>(vx);
  const auto* y = static_cast<const BlockQ8_K*>(vy);
  float sums[8] = {};
  int8_t aux8[kQK_K];
  for (int64_t i = 0; i < k / kQK_K; ++i) {
    const uint8_t* q3 = x[i].qs;
    const uint8_t* hm = x[i].hmask;
    int8_t* a = aux8;
    uint8_t m = 1;
    for (int n = 0; n < kQK_K; n += 128) {
      for (int shift = 0; shift < 8; shift += 2) {
        for (int l = 0; l < 32; ++l) {
          a[l] = static_cast<int8_t>(((q3[l] >> shift) & 3) - ((hm[l] & m) ? 0 : 4));
        }
        a += 32;
        m <<= 1;
      }
      q3 += 32;
    }
    int8_t sc8[16];
    UnpackQ3Scales(x[i].scales, sc8);
    int scale16[16];
    for (int j = 0; j < 16; ++j) scale16[j] = sc8[j];
    AccumulateGroups16(aux8, y[i].qs, scale16, Fp16ToF32(x[i].d) * y[i].d, sums);
  }
  float sumf = 0;
  for (int l = 0; l < 8; ++l) sumf += sums[l];
  *s = sumf;
}

// Q4_K and Q5_K share everything but the fifth bit.
template <bool kHasHighBit, typename Block>
void VecDotQ45K(int64_t k, float* s, const void* vx, const void* vy) {
  const auto* x = static_cast<const Block*>(vx);
  const auto* y = static_cast<const BlockQ8_K*>(vy);
  float sums[8] = {};
  float sumf = 0;
  int8_t aux8[kQK_K];
  for (int64_t i = 0; i < k / kQK_K; ++i) {
    const uint8_t* q4 = x[i].qs;
    int8_t* a = aux8;
    uint8_t m = 1;
    for (int j = 0; j < kQK_K / 64; ++j) {
      for (int nib = 0; nib < 2; ++nib) {
        for (int l = 0; l < 32; ++l) {
          int v = nib ? (q4[l] >> 4) : (q4[l] & 0xF);
          if constexpr (kHasHighBit) v += (x[i].qh[l] & m) ? 16 : 0;
          a[l] = static_cast<int8_t>(v);
        }
        a += 32;
        m <<= 1;
      }
      q4 += 32;
    }
    uint8_t scales[8], mins[8];
    for (int j = 0; j < 8; ++j) ScaleMinK4(j, x[i].scales, &scales[j], &mins[j]);
    int sumi = 0;
    for (int j = 0; j < kQK_K / 16; ++j) sumi += y[i].bsums[j] * mins[j / 2];
    int scale16[16];
    for (int j = 0; j < 16; ++j) scale16[j] = scales[j / 2];
    AccumulateGroups16(aux8, y[i].qs, scale16, Fp16ToF32(x[i].d) * y[i].d, sums);
    const float dmin = Fp16ToF32(x[i].dmin) * y[i].d;
    sumf -= dmin * sumi;
  }
  for (int l = 0; l < 8; ++l) sumf += sums[l];
  *s = sumf;
}

void VecDotQ4K(int64_t k, float* s, const void* vx, const void* vy) {
  VecDotQ45K<false, BlockQ4_K>(k, s, vx, vy);
}

void VecDotQ5K(int64_t k, float* s, const void* vx, const void* vy) {
  VecDotQ45K<true, BlockQ5_K>(k, s, vx, vy);
}

void VecDotQ6K(int64_t k, float* s, const void* vx, const void* vy) {
  const auto* x = static_cast<const BlockQ6_K*>(vx);
  const auto* y = static_cast<const BlockQ8_K*>(vy);
  float sums[8] = {};
  int8_t aux8[kQK_K];
  for (int64_t i = 0; i < k / kQK_K; ++i) {
    const uint8_t* ql = x[i].ql;
    const uint8_t* qh = x[i].qh;
    int8_t* a = aux8;
    for (int n = 0; n < kQK_K; n += 128) {
      for (int l = 0; l < 32; ++l) {
        a[l + 0] = static_cast<int8_t>(((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32);
        a[l + 32] = static_cast<int8_t>(((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
        a[l + 64] = static_cast<int8_t>(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
        a[l + 96] = static_cast<int8_t>(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
      }
      a += 128;
      ql += 64;
      qh += 32;
    }
    int scale16[16];
    for (int j = 0; j < 16; ++j) scale16[j] = x[i].scales[j];
    AccumulateGroups16(aux8, y[i].qs, scale16, Fp16ToF32(x[i].d) * y[i].d, sums);
  }
  float sumf = 0;
  for (int l = 0; l < 8; ++l) sumf += sums[l];
  *s = sumf;
}

// IQ4_XS: one float term per 32-value group, (d * d_a) * (scale - 32) times the group's integer
// sum, added in group order (GGML's generic code).
void VecDotIQ4XS(int64_t k, float* s, const void* vx, const void* vy) {
  const auto* x = static_cast<const BlockIQ4_XS*>(vx);
  const auto* y = static_cast<const BlockQ8_K*>(vy);
  float sumf = 0;
  for (int64_t i = 0; i < k / kQK_K; ++i) {
    const float d4d8 = Fp16ToF32(x[i].d) * y[i].d;
    const uint8_t* q4 = x[i].qs;
    const int8_t* q8 = y[i].qs;
    for (int g = 0; g < kQK_K / 32; ++g) {
      const float dl = d4d8 * (Iq4XsScale(x[i], g) - 32);
      int sumi = 0;
      for (int l = 0; l < 16; ++l) {
        sumi += q8[l] * kIq4NlLevels[q4[l] & 0xF] + q8[l + 16] * kIq4NlLevels[q4[l] >> 4];
      }
      sumf += dl * sumi;
      q4 += 16;
      q8 += 32;
    }
  }
  *s = sumf;
}

// TQ1_0 / TQ2_0: one float term per super-block, the exact integer sum times (d * d_a), added
// in block order (GGML's generic code).
void VecDotTQ1_0(int64_t k, float* s, const void* vx, const void* vy) {
  const auto* x = static_cast<const BlockTQ1_0*>(vx);
  const auto* y = static_cast<const BlockQ8_K*>(vy);
  float sumf = 0;
  for (int64_t i = 0; i < k / kQK_K; ++i) {
    int sumi = 0;
    ForEachTq1(x[i], [&](int e, int t) { sumi += (t - 1) * y[i].qs[e]; });
    sumf += static_cast<float>(sumi) * (Fp16ToF32(x[i].d) * y[i].d);
  }
  *s = sumf;
}

void VecDotTQ2_0(int64_t k, float* s, const void* vx, const void* vy) {
  const auto* x = static_cast<const BlockTQ2_0*>(vx);
  const auto* y = static_cast<const BlockQ8_K*>(vy);
  float sumf = 0;
  for (int64_t i = 0; i < k / kQK_K; ++i) {
    int sumi = 0;
    for (int h = 0; h < 2; ++h) {
      for (int l = 0; l < 4; ++l) {
        for (int m = 0; m < 32; ++m) {
          sumi += (((x[i].qs[32 * h + m] >> (2 * l)) & 3) - 1) * y[i].qs[128 * h + 32 * l + m];
        }
      }
    }
    sumf += static_cast<float>(sumi) * (Fp16ToF32(x[i].d) * y[i].d);
  }
  *s = sumf;
}

}  // namespace

void RegisterScalarKQuants(KernelTable& table) {
  auto set = [&table](GgmlType type, DequantizeRowFn deq, QuantizeRowFn quant, VecDotFn dot,
                      VecDotMultiFn multi) {
    TypeKernels& e = table[static_cast<int>(type)];
    e.type = type;
    e.vec_dot_type = GgmlType::kQ8_K;
    e.dequantize = deq;
    e.quantize = quant;
    e.vec_dot = dot;
    e.vec_dot_multi = multi;
  };
  set(GgmlType::kQ2_K, DequantizeQ2K, nullptr, VecDotQ2K, VecDotEachRow<VecDotQ2K>);
  set(GgmlType::kQ3_K, DequantizeQ3K, nullptr, VecDotQ3K, VecDotEachRow<VecDotQ3K>);
  set(GgmlType::kQ4_K, DequantizeQ4K, QuantizeQ4K, VecDotQ4K, VecDotEachRow<VecDotQ4K>);
  set(GgmlType::kQ5_K, DequantizeQ5K, QuantizeQ5K, VecDotQ5K, VecDotEachRow<VecDotQ5K>);
  set(GgmlType::kQ6_K, DequantizeQ6K, QuantizeQ6K, VecDotQ6K, VecDotEachRow<VecDotQ6K>);
  // No quantizer: llama-quantize makes IQ4_XS files (its level search is not reproduced here).
  set(GgmlType::kIQ4_XS, DequantizeIQ4XS, nullptr, VecDotIQ4XS, VecDotEachRow<VecDotIQ4XS>);
  // No quantizer: llama-quantize makes TQ1_0 / TQ2_0 files.
  set(GgmlType::kTQ1_0, DequantizeTQ1_0, nullptr, VecDotTQ1_0, VecDotEachRow<VecDotTQ1_0>);
  set(GgmlType::kTQ2_0, DequantizeTQ2_0, nullptr, VecDotTQ2_0, VecDotEachRow<VecDotTQ2_0>);
  set(GgmlType::kQ8_K, DequantizeQ8K, QuantizeQ8K, nullptr, nullptr);
}

}  // namespace lamina::quant_internal
