// IEEE half and bfloat16 conversions, bit-exact with GGML (round to nearest even; NaN kept NaN).
#pragma once

#include <cstdint>
#include <cstring>

namespace lamina {

using fp16_t = uint16_t;  // IEEE 754 binary16 bits
using bf16_t = uint16_t;  // bfloat16 bits (upper half of an f32)

inline float BitsToF32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint32_t F32ToBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Exact half -> float (every half is representable).
inline float Fp16ToF32(fp16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t mant = h & 0x3FFu;
  if (exp == 0x1F) return BitsToF32(sign | 0x7F800000u | (mant << 13));
  if (exp == 0) {
    if (mant == 0) return BitsToF32(sign);
    // Subnormal: normalise.
    int e = -1;
    do {
      ++e;
      mant <<= 1;
    } while ((mant & 0x400u) == 0);
    mant &= 0x3FFu;
    return BitsToF32(sign | ((112u - e) << 23) | (mant << 13));
  }
  return BitsToF32(sign | ((exp + 112u) << 23) | (mant << 13));
}

// float -> half with round-to-nearest-even (same result as F16C's _cvtss_sh(x, 0)).
inline fp16_t F32ToFp16(float f) {
  const uint32_t x = F32ToBits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t abs = x & 0x7FFFFFFFu;
  if (abs > 0x7F800000u) return static_cast<fp16_t>(sign | 0x7E00u | ((abs >> 13) & 0x3FFu));  // NaN
  if (abs >= 0x477FF000u) return static_cast<fp16_t>(sign | 0x7C00u);  // overflow -> inf
  if (abs < 0x38800000u) {
    // Result is subnormal or zero: add a magic number so the FPU rounds for us.
    const float magic = BitsToF32(0x3F000000u);  // 0.5
    float r = BitsToF32(abs) + magic;
    return static_cast<fp16_t>(sign | (F32ToBits(r) - F32ToBits(magic)));
  }
  const uint32_t mant_odd = (abs >> 13) & 1u;
  uint32_t r = abs + 0xC8000FFFu + mant_odd;  // rebias exponent (-112<<23) and round
  return static_cast<fp16_t>(sign | (r >> 13));
}

inline float Bf16ToF32(bf16_t h) { return BitsToF32(static_cast<uint32_t>(h) << 16); }

inline bf16_t F32ToBf16(float f) {
  uint32_t u = F32ToBits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<bf16_t>((u >> 16) | 64);  // quiet NaN
  return static_cast<bf16_t>((u + (0x7FFFu + ((u >> 16) & 1u))) >> 16);
}

}  // namespace lamina
