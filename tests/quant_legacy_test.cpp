// Tests for the F32/F16/BF16 and legacy-quant kernels: exact dequantization of hand-built
// blocks, quantize round trips, SIMD-vs-scalar twins for every ISA this CPU has, and
// byte-identical activation quantizers.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "quant/quant.h"
#include "quant/types.h"
#include "util/fp16.h"

namespace lamina {
namespace {

std::vector<Isa> SupportedIsas() {
  std::vector<Isa> isas = {Isa::kScalar};
  if (static_cast<int>(DetectIsa()) >= static_cast<int>(Isa::kAvx2)) isas.push_back(Isa::kAvx2);
  if (DetectIsa() == Isa::kAvx512) isas.push_back(Isa::kAvx512);
  return isas;
}

const GgmlType kWeightTypes[] = {GgmlType::kF32,  GgmlType::kF16,  GgmlType::kBF16,
                                 GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0,
                                 GgmlType::kQ5_1, GgmlType::kQ8_0};

std::vector<float> Dequantize(GgmlType type, const std::vector<uint8_t>& row, int64_t k) {
  std::vector<float> out(static_cast<size_t>(k));
  GetKernels(type, Isa::kScalar).dequantize(row.data(), out.data(), k);
  return out;
}

std::vector<uint8_t> Quantize(GgmlType type, const std::vector<float>& x, Isa isa) {
  std::vector<uint8_t> out(RowSize(type, static_cast<int64_t>(x.size())));
  GetKernels(type, isa).quantize(x.data(), out.data(), static_cast<int64_t>(x.size()));
  return out;
}

std::vector<float> RandomFloats(std::mt19937& rng, int64_t n, float scale = 1.0f) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& f : v) f = dist(rng);
  return v;
}

TEST(QuantDispatch, IsaNamesAndTables) {
  EXPECT_STREQ(IsaName(Isa::kScalar), "scalar");
  EXPECT_STREQ(IsaName(Isa::kAvx2), "avx2");
  EXPECT_STREQ(IsaName(Isa::kAvx512), "avx512");
  EXPECT_EQ(DetectIsa(), DetectIsa());
  struct Expect {
    GgmlType type, vec_dot_type;
  };
  const Expect expects[] = {
      {GgmlType::kF32, GgmlType::kF32},   {GgmlType::kF16, GgmlType::kF32},
      {GgmlType::kBF16, GgmlType::kBF16}, {GgmlType::kQ4_0, GgmlType::kQ8_0},
      {GgmlType::kQ4_1, GgmlType::kQ8_1}, {GgmlType::kQ5_0, GgmlType::kQ8_0},
      {GgmlType::kQ5_1, GgmlType::kQ8_1}, {GgmlType::kQ8_0, GgmlType::kQ8_0},
  };
  for (Isa isa : SupportedIsas()) {
    for (const Expect& e : expects) {
      const TypeKernels& k = GetKernels(e.type, isa);
      EXPECT_EQ(k.type, e.type);
      EXPECT_EQ(k.vec_dot_type, e.vec_dot_type) << GgmlTypeName(e.type);
      EXPECT_NE(k.dequantize, nullptr);
      EXPECT_NE(k.quantize, nullptr);
      EXPECT_NE(k.vec_dot, nullptr);
      EXPECT_NE(k.vec_dot_multi, nullptr);
      EXPECT_TRUE(IsSupportedWeightType(e.type));
    }
    const TypeKernels& q81 = GetKernels(GgmlType::kQ8_1, isa);
    EXPECT_EQ(q81.vec_dot, nullptr);
    EXPECT_NE(q81.quantize, nullptr);
  }
  EXPECT_FALSE(IsSupportedWeightType(GgmlType::kQ8_1));
  EXPECT_FALSE(IsSupportedWeightType(static_cast<GgmlType>(4)));
  EXPECT_EQ(&GetKernels(GgmlType::kQ8_0), &GetKernels(GgmlType::kQ8_0, DetectIsa()));
}

TEST(QuantDispatchDeathTest, UnknownTypeIsBrokenInvariant) {
  EXPECT_DEATH(GetKernels(static_cast<GgmlType>(4)), "invariant");
  EXPECT_DEATH(GetKernels(static_cast<GgmlType>(200), Isa::kScalar), "invariant");
}

// ---------------------------------------------------------------------------------------------
// Exact dequantization of hand-built blocks. Every expected value is a small dyadic rational,
// so the comparison is exact.

TEST(QuantDequantize, Q4_0) {
  BlockQ4_0 b;
  b.d = F32ToFp16(0.5f);
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  float y[32];
  for (Isa isa : SupportedIsas()) {
    GetKernels(GgmlType::kQ4_0, isa).dequantize(&b, y, 32);
    for (int j = 0; j < 16; ++j) {
      EXPECT_EQ(y[j], (j - 8) * 0.5f);
      EXPECT_EQ(y[j + 16], (7 - j) * 0.5f);
    }
  }
}

TEST(QuantDequantize, Q4_1) {
  BlockQ4_1 b;
  b.d = F32ToFp16(0.25f);
  b.m = F32ToFp16(-1.0f);
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  float y[32];
  GetKernels(GgmlType::kQ4_1).dequantize(&b, y, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], j * 0.25f - 1.0f);
    EXPECT_EQ(y[j + 16], (15 - j) * 0.25f - 1.0f);
  }
}

TEST(QuantDequantize, Q5_0) {
  BlockQ5_0 b;
  b.d = F32ToFp16(2.0f);
  // Fifth bit set on elements 0, 2, 17 and 31.
  const uint32_t qh = (1u << 0) | (1u << 2) | (1u << 17) | (1u << 31);
  std::memcpy(b.qh, &qh, 4);
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  float y[32];
  GetKernels(GgmlType::kQ5_0).dequantize(&b, y, 32);
  EXPECT_EQ(y[0], (0 + 16 - 16) * 2.0f);
  EXPECT_EQ(y[1], (1 - 16) * 2.0f);
  EXPECT_EQ(y[2], (2 + 16 - 16) * 2.0f);
  EXPECT_EQ(y[15], (15 - 16) * 2.0f);
  EXPECT_EQ(y[16], (15 - 16) * 2.0f);
  EXPECT_EQ(y[17], (14 + 16 - 16) * 2.0f);
  EXPECT_EQ(y[30], (1 - 16) * 2.0f);
  EXPECT_EQ(y[31], (0 + 16 - 16) * 2.0f);
}

TEST(QuantDequantize, Q5_1) {
  BlockQ5_1 b;
  b.d = F32ToFp16(0.5f);
  b.m = F32ToFp16(3.0f);
  const uint32_t qh = 0xFFFF0000u;  // fifth bit on the upper half only
  std::memcpy(b.qh, &qh, 4);
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | (j << 4));
  float y[32];
  GetKernels(GgmlType::kQ5_1).dequantize(&b, y, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], j * 0.5f + 3.0f);
    EXPECT_EQ(y[j + 16], (j + 16) * 0.5f + 3.0f);
  }
}

TEST(QuantDequantize, Q8_0AndQ8_1) {
  BlockQ8_0 b;
  b.d = F32ToFp16(0.125f);
  for (int j = 0; j < 32; ++j) b.qs[j] = static_cast<int8_t>(j * 8 - 128);
  float y[32];
  GetKernels(GgmlType::kQ8_0).dequantize(&b, y, 32);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(y[j], (j * 8 - 128) * 0.125f);

  BlockQ8_1 c;
  c.d = F32ToFp16(-0.5f);
  c.s = 0;
  for (int j = 0; j < 32; ++j) c.qs[j] = static_cast<int8_t>(127 - j);
  GetKernels(GgmlType::kQ8_1).dequantize(&c, y, 32);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(y[j], (127 - j) * -0.5f);
}

TEST(QuantDequantize, F16AndBF16) {
  const fp16_t h[] = {0x3C00, 0xC000, 0x3555, 0x0001, 0x7BFF, 0x8000, 0x7C00};
  const float he[] = {1.0f,     -2.0f, 0.333251953125f, 5.9604644775390625e-08f,
                      65504.0f, -0.0f, INFINITY};
  float y[7];
  GetKernels(GgmlType::kF16).dequantize(h, y, 7);
  for (int i = 0; i < 7; ++i) EXPECT_EQ(F32ToBits(y[i]), F32ToBits(he[i])) << i;

  const bf16_t b[] = {0x3F80, 0xC040, 0x3EAB, 0x0000};
  const float be[] = {1.0f, -3.0f, 0.333984375f, 0.0f};
  GetKernels(GgmlType::kBF16).dequantize(b, y, 4);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(y[i], be[i]) << i;

  const float f[] = {1.5f, -7.25f, 0.0f};
  GetKernels(GgmlType::kF32).dequantize(f, y, 3);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(y[i], f[i]);
}

// ---------------------------------------------------------------------------------------------
// Reference quantizers.

TEST(QuantQuantize, Q4_0ExactOnGrid) {
  // Values on the grid d * (q - 8) with the most negative value -8 d come back exactly.
  std::vector<float> x(32);
  for (int j = 0; j < 32; ++j) x[j] = static_cast<float>(j % 16 - 8) * 0.5f;
  const std::vector<uint8_t> q = Quantize(GgmlType::kQ4_0, x, Isa::kScalar);
  BlockQ4_0 b;
  std::memcpy(&b, q.data(), sizeof(b));
  EXPECT_EQ(Fp16ToF32(b.d), 0.5f);
  for (int j = 0; j < 16; ++j) EXPECT_EQ(b.qs[j], j | (j << 4));
  EXPECT_EQ(Dequantize(GgmlType::kQ4_0, q, 32), x);
}

TEST(QuantQuantize, RoundTripErrorBounds) {
  std::mt19937 rng(1234);
  const int64_t k = 4096;
  for (GgmlType type : kWeightTypes) {
    const std::vector<float> x = RandomFloats(rng, k, 2.0f);
    const std::vector<float> y = Dequantize(type, Quantize(type, x, Isa::kScalar), k);
    for (int64_t b = 0; b < k / kQK; ++b) {
      float amax = 0.0f, mn = INFINITY, mx = -INFINITY;
      for (int j = 0; j < kQK; ++j) {
        const float v = x[b * kQK + j];
        amax = std::max(amax, std::fabs(v));
        mn = std::min(mn, v);
        mx = std::max(mx, v);
      }
      // Half a step, plus fp16 rounding of the scale (2^-11 relative, times up to 31 steps)
      // and of the minimum, plus the one clamped step of the symmetric 4/5-bit types.
      float bound = 0.0f;
      switch (type) {
        case GgmlType::kF32:
          bound = 0.0f;
          break;
        case GgmlType::kF16:
          bound = amax * 0x1p-11f;
          break;
        case GgmlType::kBF16:
          bound = amax * 0x1p-8f;
          break;
        case GgmlType::kQ4_0:
          bound = amax / 8 * 1.01f;
          break;
        case GgmlType::kQ5_0:
          bound = amax / 16 * 1.02f;
          break;
        case GgmlType::kQ8_0:
          bound = amax / 127 * 0.57f;
          break;
        case GgmlType::kQ4_1:
          bound = (mx - mn) / 15 * 0.51f + amax * 0x1p-9f;
          break;
        case GgmlType::kQ5_1:
          bound = (mx - mn) / 31 * 0.52f + amax * 0x1p-9f;
          break;
        default:
          FAIL();
      }
      for (int j = 0; j < kQK; ++j) {
        const int64_t i = b * kQK + j;
        ASSERT_LE(std::fabs(y[i] - x[i]), bound + 1e-7f)
            << GgmlTypeName(type) << " element " << i << " x=" << x[i] << " y=" << y[i];
      }
    }
  }
}

TEST(QuantQuantize, ActivationQ8RoundTrip) {
  std::mt19937 rng(99);
  const int64_t k = 1024;
  const std::vector<float> x = RandomFloats(rng, k, 3.0f);
  for (Isa isa : SupportedIsas()) {
    const std::vector<uint8_t> q0 = Quantize(GgmlType::kQ8_0, x, isa);
    const std::vector<uint8_t> q1 = Quantize(GgmlType::kQ8_1, x, isa);
    const std::vector<float> y0 = Dequantize(GgmlType::kQ8_0, q0, k);
    const std::vector<float> y1 = Dequantize(GgmlType::kQ8_1, q1, k);
    for (int64_t b = 0; b < k / kQK; ++b) {
      float amax = 0.0f;
      for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(x[b * kQK + j]));
      for (int j = 0; j < kQK; ++j) {
        const int64_t i = b * kQK + j;
        ASSERT_LE(std::fabs(y0[i] - x[i]), amax / 127 * 0.57f);
        ASSERT_EQ(y0[i], y1[i]);
      }
      // Q8_1's s is fp16(d * sum(codes)).
      BlockQ8_1 blk;
      std::memcpy(&blk, q1.data() + b * sizeof(BlockQ8_1), sizeof(blk));
      int sum = 0;
      for (int j = 0; j < kQK; ++j) sum += blk.qs[j];
      EXPECT_EQ(blk.s, F32ToFp16(amax / 127.f * static_cast<float>(sum)));
    }
  }
}

// The activation quantizer against a straightforward reference, on inputs whose scaled values
// sit exactly on .5: GGML's x86 path (cvtps2dq) rounds those to even, not away from zero.
TEST(QuantQuantize, Q8_0TiesRoundToEven) {
  for (const float amax : {127.0f, 254.0f}) {
    std::vector<float> x(64);
    const float scale = amax / 127.0f;  // 1 or 2: x / scale is exact
    const float halves[] = {0.5f, 1.5f, 2.5f, -0.5f, -1.5f, -2.5f, 126.5f, -126.5f, 3.25f, 0.0f};
    for (int j = 0; j < 64; ++j) x[j] = halves[j % 10] * scale;
    x[7] = amax;
    x[40] = -amax;
    for (Isa isa : SupportedIsas()) {
      for (GgmlType t : {GgmlType::kQ8_0, GgmlType::kQ8_1}) {
        const std::vector<uint8_t> q = Quantize(t, x, isa);
        const size_t bs = GetTypeTraits(t).type_size;
        for (int b = 0; b < 2; ++b) {
          const uint8_t* blk = q.data() + b * bs;
          fp16_t d;
          std::memcpy(&d, blk, 2);
          EXPECT_EQ(d, F32ToFp16(amax / 127.0f));
          const int8_t* qs = reinterpret_cast<const int8_t*>(blk + (t == GgmlType::kQ8_0 ? 2 : 4));
          for (int j = 0; j < 32; ++j) {
            const float v = x[b * 32 + j] * (127.0f / amax);
            EXPECT_EQ(qs[j], static_cast<int8_t>(std::nearbyint(v)))
                << IsaName(isa) << " " << GgmlTypeName(t) << " x=" << x[b * 32 + j];
          }
        }
      }
    }
    EXPECT_EQ(std::nearbyint(2.5f), 2.0f);  // the rounding mode the reference assumes
  }
}

TEST(QuantQuantize, ActivationQuantizersByteIdenticalAcrossIsas) {
  std::mt19937 rng(7);
  for (const int64_t k : {32, 64, 4096, 4096 + 32}) {
    std::vector<float> x = RandomFloats(rng, k, 0.7f);
    // An all-zero block (amax = 0) and a block with huge and tiny values.
    for (int j = 0; j < 32; ++j) x[j] = 0.0f;
    if (k >= 64) {
      for (int j = 32; j < 64; ++j) x[j] = (j % 2 ? 1e-30f : -3e4f) * static_cast<float>(j);
    }
    for (GgmlType t : {GgmlType::kQ8_0, GgmlType::kQ8_1, GgmlType::kF16, GgmlType::kBF16}) {
      const std::vector<uint8_t> ref = Quantize(t, x, Isa::kScalar);
      for (Isa isa : SupportedIsas()) {
        EXPECT_EQ(Quantize(t, x, isa), ref) << GgmlTypeName(t) << " " << IsaName(isa) << " k=" << k;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// SIMD vs scalar twins. Budget: |simd - scalar| <= 1e-5 * sum|terms| + 1e-6, where the terms
// are the per-element products (and the per-block m * s terms of Q4_1 / Q5_1). Both sides do
// the same exact integer block sums and the same per-block scale products; they differ only in
// the order f32 partial sums are added (the scalar float types sum in double), and the
// worst-case recursive-summation error for ~130 block sums or 16-lane float chains is below
// 130 * 2^-24 ~ 8e-6 of sum|terms|.

// Random weight row built at the byte level so every code value appears, with sane scales.
std::vector<uint8_t> RandomWeightRow(std::mt19937& rng, GgmlType type, int64_t k) {
  if (!GetTypeTraits(type).is_quantized) {
    const std::vector<float> x = RandomFloats(rng, k);
    return Quantize(type, x, Isa::kScalar);
  }
  std::vector<uint8_t> row(RowSize(type, k));
  std::uniform_int_distribution<int> byte(0, 255);
  for (uint8_t& b : row) b = static_cast<uint8_t>(byte(rng));
  std::uniform_real_distribution<float> scale(0.001f, 0.1f);
  std::uniform_real_distribution<float> minv(-1.0f, 1.0f);
  const size_t bs = GetTypeTraits(type).type_size;
  const bool has_m = type == GgmlType::kQ4_1 || type == GgmlType::kQ5_1;
  for (size_t off = 0; off < row.size(); off += bs) {
    const fp16_t d = F32ToFp16(scale(rng));
    std::memcpy(row.data() + off, &d, 2);
    if (has_m) {
      const fp16_t m = F32ToFp16(minv(rng));
      std::memcpy(row.data() + off + 2, &m, 2);
    }
  }
  return row;
}

double SumAbsTerms(GgmlType type, const std::vector<uint8_t>& w, const std::vector<uint8_t>& a,
                   int64_t k) {
  const GgmlType at = GetKernels(type, Isa::kScalar).vec_dot_type;
  const std::vector<float> wf = Dequantize(type, w, k);
  const std::vector<float> af = Dequantize(at, a, k);
  const bool has_m = type == GgmlType::kQ4_1 || type == GgmlType::kQ5_1;
  double sum = 0.0;
  for (int64_t b = 0; b * kQK < k; ++b) {
    float m = 0.0f, s = 0.0f;
    if (has_m) {
      fp16_t mh, sh;
      std::memcpy(&mh, w.data() + b * GetTypeTraits(type).type_size + 2, 2);
      std::memcpy(&sh, a.data() + b * sizeof(BlockQ8_1) + 2, 2);
      m = Fp16ToF32(mh);
      s = Fp16ToF32(sh);
      sum += std::fabs(static_cast<double>(m) * s);
    }
    for (int64_t i = b * kQK; i < std::min(k, (b + 1) * kQK); ++i) {
      sum += std::fabs((static_cast<double>(wf[i]) - m) * af[i]);
    }
  }
  return sum;
}

std::vector<int64_t> TwinSizes(GgmlType type) {
  std::vector<int64_t> ks = {32, 64, 256, 4096, 4096 + 32};
  if (!GetTypeTraits(type).is_quantized) {
    for (int64_t k : {1, 7, 15, 17, 33, 100, 4099}) ks.push_back(k);
  }
  return ks;
}

TEST(QuantTwins, VecDotMatchesScalar) {
  std::mt19937 rng(42);
  for (GgmlType type : kWeightTypes) {
    const GgmlType at = GetKernels(type, Isa::kScalar).vec_dot_type;
    for (int64_t k : TwinSizes(type)) {
      for (int rep = 0; rep < 4; ++rep) {
        const std::vector<uint8_t> w = RandomWeightRow(rng, type, k);
        const std::vector<uint8_t> a = Quantize(at, RandomFloats(rng, k), Isa::kScalar);
        const double budget = 1e-5 * SumAbsTerms(type, w, a, k) + 1e-6;
        float ref = 0.0f;
        GetKernels(type, Isa::kScalar).vec_dot(k, &ref, w.data(), a.data());
        for (Isa isa : SupportedIsas()) {
          float got = 0.0f;
          GetKernels(type, isa).vec_dot(k, &got, w.data(), a.data());
          ASSERT_LE(std::fabs(static_cast<double>(got) - ref), budget)
              << GgmlTypeName(type) << " " << IsaName(isa) << " k=" << k << " ref=" << ref
              << " got=" << got;
        }
      }
    }
  }
}

TEST(QuantTwins, VecDotMultiMatchesScalar) {
  std::mt19937 rng(43);
  for (GgmlType type : kWeightTypes) {
    const GgmlType at = GetKernels(type, Isa::kScalar).vec_dot_type;
    for (int64_t k : TwinSizes(type)) {
      const std::vector<uint8_t> w = RandomWeightRow(rng, type, k);
      const size_t row_bytes = RowSize(at, k);
      // Rows padded past row_bytes so the stride is not the packed row size.
      const size_t stride = row_bytes + 64;
      std::vector<uint8_t> act(stride * kMaxMultiDot, 0xCD);
      std::vector<double> budget(kMaxMultiDot);
      std::vector<float> ref(kMaxMultiDot);
      for (int j = 0; j < kMaxMultiDot; ++j) {
        const std::vector<uint8_t> a = Quantize(at, RandomFloats(rng, k), Isa::kScalar);
        std::memcpy(act.data() + j * stride, a.data(), row_bytes);
        budget[j] = 1e-5 * SumAbsTerms(type, w, a, k) + 1e-6;
        GetKernels(type, Isa::kScalar).vec_dot(k, &ref[j], w.data(), a.data());
      }
      for (Isa isa : SupportedIsas()) {
        for (int n = 1; n <= kMaxMultiDot; ++n) {
          std::vector<float> out(kMaxMultiDot + 1, -12345.0f);
          GetKernels(type, isa).vec_dot_multi(k, w.data(), act.data(), stride, n, out.data());
          for (int j = 0; j < n; ++j) {
            ASSERT_LE(std::fabs(static_cast<double>(out[j]) - ref[j]), budget[j])
                << GgmlTypeName(type) << " " << IsaName(isa) << " k=" << k << " n=" << n
                << " j=" << j;
          }
          EXPECT_EQ(out[n], -12345.0f) << "wrote past n_act";
        }
      }
    }
  }
}

// The register-blocked tile against the scalar twin's vec_dot, with padded strides on both
// sides and an output stride wider than the tile, checking nothing outside it is written.
TEST(QuantTwins, VecDotTileMatchesScalar) {
  std::mt19937 rng(45);
  for (GgmlType type : kWeightTypes) {
    const GgmlType at = GetKernels(type, Isa::kScalar).vec_dot_type;
    for (int64_t k : TwinSizes(type)) {
      const size_t w_bytes = RowSize(type, k);
      const size_t w_stride = w_bytes + 48;
      std::vector<uint8_t> w(w_stride * kMaxTileRows, 0xAB);
      for (int i = 0; i < kMaxTileRows; ++i) {
        const std::vector<uint8_t> row = RandomWeightRow(rng, type, k);
        std::memcpy(w.data() + i * w_stride, row.data(), w_bytes);
      }
      const size_t row_bytes = RowSize(at, k);
      const size_t stride = row_bytes + 64;
      std::vector<uint8_t> act(stride * kMaxMultiDot, 0xCD);
      for (int j = 0; j < kMaxMultiDot; ++j) {
        const std::vector<uint8_t> a = Quantize(at, RandomFloats(rng, k), Isa::kScalar);
        std::memcpy(act.data() + j * stride, a.data(), row_bytes);
      }
      for (Isa isa : SupportedIsas()) {
        const TypeKernels& kern = GetKernels(type, isa);
        if (kern.vec_dot_tile == nullptr) continue;
        for (int nr = 1; nr <= kMaxTileRows; ++nr) {
          for (int n = 1; n <= kMaxMultiDot; ++n) {
            const size_t out_stride = kMaxTileRows + 1;
            std::vector<float> out(out_stride * kMaxMultiDot, -12345.0f);
            kern.vec_dot_tile(k, w.data(), w_stride, nr, act.data(), stride, n, out.data(),
                              out_stride);
            for (int j = 0; j < kMaxMultiDot; ++j) {
              for (size_t i = 0; i < out_stride; ++i) {
                const float got = out[j * out_stride + i];
                if (j >= n || static_cast<int>(i) >= nr) {
                  EXPECT_EQ(got, -12345.0f) << "wrote outside the tile";
                  continue;
                }
                const uint8_t* wi = w.data() + i * w_stride;
                const uint8_t* aj = act.data() + j * stride;
                std::vector<uint8_t> wrow(wi, wi + w_bytes), arow(aj, aj + row_bytes);
                float ref = 0.0f;
                GetKernels(type, Isa::kScalar).vec_dot(k, &ref, wi, aj);
                const double budget = 1e-5 * SumAbsTerms(type, wrow, arow, k) + 1e-6;
                ASSERT_LE(std::fabs(static_cast<double>(got) - ref), budget)
                    << GgmlTypeName(type) << " " << IsaName(isa) << " k=" << k << " rows=" << nr
                    << " n=" << n << " i=" << i << " j=" << j;
              }
            }
          }
        }
      }
    }
  }
}

// The quantized dot equals the dot of the dequantized rows (up to f32 rounding), which ties
// the kernels to the block formats rather than only to each other.
TEST(QuantTwins, VecDotMatchesDequantizedDot) {
  std::mt19937 rng(44);
  const int64_t k = 512;
  for (GgmlType type : kWeightTypes) {
    const GgmlType at = GetKernels(type, Isa::kScalar).vec_dot_type;
    const std::vector<uint8_t> w = RandomWeightRow(rng, type, k);
    const std::vector<uint8_t> a = Quantize(at, RandomFloats(rng, k), Isa::kScalar);
    const std::vector<float> wf = Dequantize(type, w, k);
    const std::vector<float> af = Dequantize(at, a, k);
    double exact = 0.0;
    for (int64_t i = 0; i < k; ++i) exact += static_cast<double>(wf[i]) * af[i];
    // Q8_1's s is d * sum(codes) rounded to fp16, so the m * s term carries 2^-11 relative error.
    const double terms = SumAbsTerms(type, w, a, k);
    const double budget =
        (type == GgmlType::kQ4_1 || type == GgmlType::kQ5_1 ? 1e-3 : 1e-5) * terms + 1e-6;
    for (Isa isa : SupportedIsas()) {
      float got = 0.0f;
      GetKernels(type, isa).vec_dot(k, &got, w.data(), a.data());
      EXPECT_LE(std::fabs(got - exact), budget) << GgmlTypeName(type) << " " << IsaName(isa);
    }
  }
}

}  // namespace
}  // namespace lamina
