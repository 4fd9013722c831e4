// The 4-bit table types IQ4_NL, IQ4_XS and MXFP4: block layouts against GGML's type table,
// dequantization of hand-built blocks (MXFP4's exponent edge cases included), the scalar dots
// against a double-precision dot of the format definition, and every SIMD variant this CPU runs
// against its scalar twin, with vec_dot_multi and the tiles bit-identical to vec_dot.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/matmul.h"
#include "quant/quant.h"
#include "quant/types.h"
#include "quant_random.h"
#include "quant_twin.h"
#include "util/cpu_features.h"
#include "util/fp16.h"
#include "util/thread_pool.h"

namespace lamina {
namespace {

constexpr GgmlType kTypes[] = {GgmlType::kIQ4_NL, GgmlType::kIQ4_XS, GgmlType::kMXFP4};

// The ISAs GetKernels may be asked for here (LAMINA_ISA caps DetectIsa()).
// Levels written out from the format definitions (GGML's kvalues_iq4nl; E2M1 doubled).
constexpr int kIq4Nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                            1,    13,   25,  38,  53,  69,  89,  113};
constexpr double kE2M1[16] = {0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6};

// ---------------------------------------------------------------------------------------------
// Layouts and table entries.

TEST(QuantIqLayout, BlocksMatchGgmlTypeTable) {
  static_assert(offsetof(BlockIQ4_NL, qs) == 2);
  static_assert(offsetof(BlockIQ4_XS, scales_h) == 2);
  static_assert(offsetof(BlockIQ4_XS, scales_l) == 4);
  static_assert(offsetof(BlockIQ4_XS, qs) == 8);
  static_assert(offsetof(BlockMXFP4, qs) == 1);
  ExpectLayoutMatchesGgml({GgmlType::kIQ4_NL, 20, "IQ4_NL", 32, 18});
  ExpectLayoutMatchesGgml({GgmlType::kIQ4_XS, 23, "IQ4_XS", 256, 136});
  ExpectLayoutMatchesGgml({GgmlType::kMXFP4, 39, "MXFP4", 32, 17});
}

TEST(QuantIqLayout, LevelTables) {
  for (int i = 0; i < 16; ++i) {
    EXPECT_EQ(kIq4NlLevels[i], kIq4Nl[i]) << i;
    EXPECT_EQ(kMxfp4Levels[i], 2 * kE2M1[i]) << i;
  }
}

TEST(QuantIqKernels, TableEntriesOnEveryIsa) {
  ExpectReadOnlyTypeKernels(GgmlType::kIQ4_NL, GgmlType::kQ8_0);
  ExpectReadOnlyTypeKernels(GgmlType::kIQ4_XS, GgmlType::kQ8_K);
  ExpectReadOnlyTypeKernels(GgmlType::kMXFP4, GgmlType::kQ8_0);
}

// ---------------------------------------------------------------------------------------------
// Dequantization of hand-built blocks (dequantize is scalar on every ISA; checked on each).

TEST(QuantIqDequantize, Iq4NlHandBuilt) {
  BlockIQ4_NL b;
  b.d = F32ToFp16(0.5f);
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  for (Isa isa : SupportedIsas()) {
    const std::vector<float> y = Dequantize(GgmlType::kIQ4_NL, &b, 32, isa);
    EXPECT_EQ(y[0], -63.5f);  // low nibble 0 of byte 0: element 0
    EXPECT_EQ(y[7], -5.0f);
    EXPECT_EQ(y[8], 0.5f);
    EXPECT_EQ(y[15], 56.5f);
    EXPECT_EQ(y[16], 56.5f);  // high nibble 15 of byte 0: element 16
    EXPECT_EQ(y[31], -63.5f);
    for (int j = 0; j < 16; ++j) {
      EXPECT_EQ(y[j], 0.5f * kIq4Nl[j]);
      EXPECT_EQ(y[j + 16], 0.5f * kIq4Nl[15 - j]);
    }
  }
}

TEST(QuantIqDequantize, Iq4XsHandBuilt) {
  BlockIQ4_XS b{};
  b.d = F32ToFp16(0.25f);
  // Group 0: scale 33 (low nibble 1, top bits 2) -> +1. Group 1: scale 0 -> -32.
  // Group 5: scale 63 (high nibble of scales_l[2] = 15, bits 10-11 of scales_h = 3) -> +31.
  // Groups 2, 3, 4, 6: scale 0 -> -32 (zero bytes). Group 7: scale 32 (bits 14-15 = 2) -> 0.
  b.scales_l[0] = 0x01;
  b.scales_l[2] = 0xF0;
  b.scales_h = static_cast<uint16_t>((2u << 0) | (3u << 10) | (2u << 14));
  b.qs[0] = 0x0F;        // element 0: level 113; element 16: level -127
  b.qs[16 + 0] = 0x87;   // element 32: level -10; element 48: level 1
  b.qs[80 + 3] = 0x21;   // element 163: level -104; element 179: level -83
  b.qs[112 + 5] = 0xFF;  // elements 229, 245 of group 7 (scale 0)
  for (Isa isa : SupportedIsas()) {
    const std::vector<float> y = Dequantize(GgmlType::kIQ4_XS, &b, kQK_K, isa);
    EXPECT_EQ(y[0], 28.25f);      // 0.25 * 1 * 113
    EXPECT_EQ(y[16], -31.75f);    // 0.25 * 1 * -127
    EXPECT_EQ(y[1], -31.75f);     // code 0
    EXPECT_EQ(y[32], 80.0f);      // 0.25 * -32 * -10
    EXPECT_EQ(y[48], -8.0f);      // 0.25 * -32 * 1
    EXPECT_EQ(y[64], 1016.0f);    // group 2, code 0: 0.25 * -32 * -127
    EXPECT_EQ(y[163], -806.0f);   // 0.25 * 31 * -104
    EXPECT_EQ(y[179], -643.25f);  // 0.25 * 31 * -83
    EXPECT_EQ(y[229], 0.0f);      // 0.25 * 0 * 113
    EXPECT_EQ(y[245], 0.0f);
  }
}

TEST(QuantIqDequantize, Mxfp4HandBuilt) {
  BlockMXFP4 b;
  b.e = 127;  // 2^0: x = the E2M1 value
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  for (Isa isa : SupportedIsas()) {
    const std::vector<float> y = Dequantize(GgmlType::kMXFP4, &b, 32, isa);
    for (int j = 0; j < 16; ++j) {
      EXPECT_EQ(y[j], kE2M1[j]) << j;
      EXPECT_EQ(y[j + 16], kE2M1[15 - j]) << j;
    }
    EXPECT_EQ(y[7], 6.0f);
    EXPECT_EQ(y[16], -6.0f);
    // Code 8 (negative zero in E2M1) decodes to +0, as in GGML (its level is the integer 0).
    EXPECT_EQ(F32ToBits(y[8]), 0u);
  }
}

TEST(QuantIqDequantize, Mxfp4ExponentEdgeCases) {
  // E8M0ToF32Half(e) = 2^(e - 128); e = 0 and 1 are f32 subnormals, e = 255 is finite.
  EXPECT_EQ(F32ToBits(E8M0ToF32Half(0)), 0x00200000u);
  EXPECT_EQ(F32ToBits(E8M0ToF32Half(1)), 0x00400000u);
  EXPECT_EQ(F32ToBits(E8M0ToF32Half(2)), 0x00800000u);  // smallest normal, 2^-126
  EXPECT_EQ(E8M0ToF32Half(127), 0.5f);
  EXPECT_EQ(E8M0ToF32Half(128), 1.0f);
  EXPECT_EQ(E8M0ToF32Half(254), std::ldexp(1.0f, 126));
  EXPECT_EQ(E8M0ToF32Half(255), std::ldexp(1.0f, 127));
  for (int e = 0; e < 256; ++e) {
    EXPECT_EQ(E8M0ToF32Half(static_cast<uint8_t>(e)), std::ldexp(1.0f, e - 128)) << e;
  }

  // Codes 1 (level 1), 2 (level 2), 7 (level 12) and 9 (level -1) in elements 0..3, code 0
  // elsewhere; the same bytes under four exponents.
  BlockMXFP4 b{};
  b.qs[0] = 1;
  b.qs[1] = 2;
  b.qs[2] = 7;
  b.qs[3] = 9;
  const struct {
    uint8_t e;
    float v1, v2, v12, vm1;
  } cases[] = {
      // e = 0: 2^-128 per level step, subnormal results (exact: the levels are small integers).
      {0, std::ldexp(1.0f, -128), std::ldexp(1.0f, -127), std::ldexp(12.0f, -128),
       -std::ldexp(1.0f, -128)},
      {1, std::ldexp(1.0f, -127), std::ldexp(1.0f, -126), std::ldexp(12.0f, -127),
       -std::ldexp(1.0f, -127)},
      {128, 1.0f, 2.0f, 12.0f, -1.0f},
      // e = 255: 2^127 per level step; level 2 and above overflow to infinity, as in GGML.
      {255, std::ldexp(1.0f, 127), std::numeric_limits<float>::infinity(),
       std::numeric_limits<float>::infinity(), -std::ldexp(1.0f, 127)},
  };
  for (const auto& c : cases) {
    b.e = c.e;
    const std::vector<float> y = Dequantize(GgmlType::kMXFP4, &b, 32);
    EXPECT_EQ(y[0], c.v1) << "e=" << int(c.e);
    EXPECT_EQ(y[1], c.v2) << "e=" << int(c.e);
    EXPECT_EQ(y[2], c.v12) << "e=" << int(c.e);
    EXPECT_EQ(y[3], c.vm1) << "e=" << int(c.e);
    EXPECT_EQ(y[4], 0.0f) << "e=" << int(c.e);
    EXPECT_EQ(y[16], 0.0f) << "e=" << int(c.e);
  }
}

// ---------------------------------------------------------------------------------------------
// Random blocks and the format definition, element by element in double.

// Element e of a row, from the layout definitions in types.h (not the kernels' loops).
double ElementOf(GgmlType t, const uint8_t* row, int64_t e) {
  const int64_t bs = GetTypeTraits(t).block_size;
  const uint8_t* b = row + (e / bs) * GetTypeTraits(t).type_size;
  const int i = static_cast<int>(e % bs);
  switch (t) {
    case GgmlType::kIQ4_NL: {
      const auto& blk = *reinterpret_cast<const BlockIQ4_NL*>(b);
      const int q = i < 16 ? (blk.qs[i] & 0xF) : (blk.qs[i - 16] >> 4);
      return double(Fp16ToF32(blk.d)) * kIq4Nl[q];
    }
    case GgmlType::kMXFP4: {
      const auto& blk = *reinterpret_cast<const BlockMXFP4*>(b);
      const int q = i < 16 ? (blk.qs[i] & 0xF) : (blk.qs[i - 16] >> 4);
      return kE2M1[q] * std::ldexp(1.0, blk.e - 127);
    }
    case GgmlType::kIQ4_XS: {
      const auto& blk = *reinterpret_cast<const BlockIQ4_XS*>(b);
      const int g = i / 32, l = i % 32;
      const int low4 = (blk.scales_l[g / 2] >> (4 * (g % 2))) & 0xF;
      const int high2 = (blk.scales_h >> (2 * g)) & 3;
      const uint8_t byte = blk.qs[16 * g + l % 16];
      const int q = l < 16 ? (byte & 0xF) : (byte >> 4);
      return double(Fp16ToF32(blk.d)) * ((low4 | (high2 << 4)) - 32) * kIq4Nl[q];
    }
    default:
      ADD_FAILURE() << "not a table type";
      return 0;
  }
}

// Exact: an fp16 scale (11 significant bits) times a group scale (6) and a level (7) fits in an
// f32 significand, and MXFP4's scale is a power of two.
TEST(QuantIqDequantize, RandomBlocksMatchFormatDefinition) {
  std::mt19937 rng(1234);
  for (GgmlType t : kTypes) ExpectDequantizeMatchesDefinition(t, ElementOf, 8 * kQK_K, rng);
}

// ---------------------------------------------------------------------------------------------
// Dot products.

// Budgets, as the legacy and K-quant twin tests state them: integer block sums are exact in
// every variant, so the variants differ only in how the per-block (IQ4_XS: per-group) f32 terms
// are added. Q8_0 types (IQ4_NL, MXFP4): 1e-5 * sum|terms| + 1e-6, as quant_legacy_test;
// IQ4_XS: 2e-6 * sum|terms|, as quant_kquants_test.
double Budget(GgmlType t, double mag) {
  return t == GgmlType::kIQ4_XS ? 2e-6 * mag + 1e-30 : 1e-5 * mag + 1e-6;
}

std::vector<int64_t> Sizes(GgmlType t) {
  if (t == GgmlType::kIQ4_XS) return {kQK_K, 3 * kQK_K, 16 * kQK_K, 17 * kQK_K};
  // Odd block counts take the AVX-512 tiles' lone-block tail.
  return {32, 64, 96, 256, 4096, 4096 + 32};
}

TEST(QuantIqDot, ScalarMatchesFormatDefinition) {
  std::mt19937 rng(7);
  for (GgmlType t : kTypes) ExpectScalarDotMatchesDefinition(t, ElementOf, Sizes(t), Budget, rng);
}

// Every ISA against the scalar twin, and vec_dot_multi against vec_dot bit for bit for every
// batch size: a token's result must not depend on the batch it arrives in.
TEST(QuantIqDot, SimdMatchesScalarTwinAndMultiIsBatchInvariant) {
  std::mt19937 rng(42);
  for (GgmlType t : kTypes) {
    ExpectSimdMatchesScalarTwin(t, ElementOf, Sizes(t), Budget, rng);
    if (HasFatalFailure()) return;
  }
}

// IQ4_XS keeps the same eight int32 lanes per super-block on AVX2 and AVX-512 (exact sums over
// the same bytes), then the same FMA and reduction: the two ISAs agree bit for bit.
TEST(QuantIqDot, Iq4XsAvx2AndAvx512Agree) {
  if (DetectIsa() < Isa::kAvx512) GTEST_SKIP() << "needs AVX-512";
  std::mt19937 rng(46);
  for (int64_t k : Sizes(GgmlType::kIQ4_XS)) {
    const DotCase c = MakeDotCase(GgmlType::kIQ4_XS, k, kMaxMultiDot, rng);
    float a2[kMaxMultiDot], a512[kMaxMultiDot];
    GetKernels(GgmlType::kIQ4_XS, Isa::kAvx2)
        .vec_dot_multi(k, c.w.data(), c.act.data(), c.act_stride, kMaxMultiDot, a2);
    GetKernels(GgmlType::kIQ4_XS, Isa::kAvx512)
        .vec_dot_multi(k, c.w.data(), c.act.data(), c.act_stride, kMaxMultiDot, a512);
    for (int r = 0; r < kMaxMultiDot; ++r) {
      EXPECT_EQ(F32ToBits(a2[r]), F32ToBits(a512[r])) << "k=" << k << " row " << r;
    }
  }
}

// The register-blocked tiles (IQ4_NL and MXFP4 on AVX2 and AVX-512): every (row, token) output
// is vec_dot's bits whatever the tile shape, with padded strides and nothing written outside.
TEST(QuantIqDot, TileEqualsVecDotBitForBit) {
  std::mt19937 rng(45);
  for (GgmlType t : {GgmlType::kIQ4_NL, GgmlType::kMXFP4}) {
    for (int64_t k : {int64_t{32}, int64_t{96}, int64_t{512}, int64_t{544}}) {
      const size_t w_bytes = RowSize(t, k);
      const size_t w_stride = w_bytes + 48;
      std::vector<uint8_t> w(w_stride * kMaxTileRows, 0xAB);
      for (int i = 0; i < kMaxTileRows; ++i) {
        const std::vector<uint8_t> row = RandomWeightRow(t, k, rng);
        std::memcpy(w.data() + i * w_stride, row.data(), w_bytes);
      }
      const DotCase c = MakeDotCase(t, k, kMaxMultiDot, rng);
      for (Isa isa : SupportedIsas()) {
        const TypeKernels& kern = GetKernels(t, isa);
        if (isa != Isa::kScalar) {
          ASSERT_NE(kern.vec_dot_tile, nullptr) << IsaName(isa);
        }
        if (kern.vec_dot_tile == nullptr) continue;
        for (int nr = 1; nr <= kMaxTileRows; ++nr) {
          for (int n = 1; n <= kMaxMultiDot; ++n) {
            const size_t out_stride = kMaxTileRows + 1;
            std::vector<float> out(out_stride * kMaxMultiDot, -12345.0f);
            kern.vec_dot_tile(k, w.data(), w_stride, nr, c.act.data(), c.act_stride, n, out.data(),
                              out_stride);
            for (int j = 0; j < kMaxMultiDot; ++j) {
              for (size_t i = 0; i < out_stride; ++i) {
                const float got = out[j * out_stride + i];
                if (j >= n || static_cast<int>(i) >= nr) {
                  ASSERT_EQ(got, -12345.0f) << "wrote outside the tile";
                  continue;
                }
                float single = 0.0f;
                kern.vec_dot(k, &single, w.data() + i * w_stride, c.act.data() + j * c.act_stride);
                ASSERT_EQ(F32ToBits(got), F32ToBits(single))
                    << GgmlTypeName(t) << " " << IsaName(isa) << " k=" << k << " tile " << nr << "x"
                    << n << " row " << i << " token " << j;
              }
            }
          }
        }
      }
    }
  }
}

// Largest magnitudes everywhere: every weight at level -127 (IQ4_NL / IQ4_XS, with IQ4_XS group
// scale -32) or -12 (MXFP4) against activation codes of +-127, to catch int16 saturation in the
// maddubs paths. Inputs of +-127 give activation scales of +-1, so every term and partial sum is
// exact in f32 and every ISA must give the scalar result exactly.
TEST(QuantIqDot, ExtremeCodes) {
  for (GgmlType t : kTypes) {
    const int64_t k = t == GgmlType::kIQ4_XS ? 2 * kQK_K : 64;
    std::vector<uint8_t> w(RowSize(t, k), 0);
    const size_t bs = GetTypeTraits(t).type_size;
    for (size_t off = 0; off < w.size(); off += bs) {
      if (t == GgmlType::kMXFP4) {
        w[off] = 128;
        std::memset(&w[off + 1], 0xFF, 16);  // code 15: level -12
      } else {
        const fp16_t d = F32ToFp16(0.5f);
        std::memcpy(&w[off], &d, 2);  // codes 0 (level -127); IQ4_XS scales 0 (-32)
      }
    }
    for (int sign : {-1, 1}) {
      const GgmlType at = GetKernels(t, Isa::kScalar).vec_dot_type;
      std::vector<float> x(static_cast<size_t>(k));
      for (int64_t i = 0; i < k; ++i) x[i] = (i % 3 == 0 ? -127.0f : 127.0f) * sign;
      std::vector<uint8_t> a(RowSize(at, k));
      GetKernels(at, Isa::kScalar).quantize(x.data(), a.data(), k);
      float want = 0.0f;
      GetKernels(t, Isa::kScalar).vec_dot(k, &want, w.data(), a.data());
      EXPECT_NE(want, 0.0f);
      for (Isa isa : SupportedIsas()) {
        float got = 0.0f;
        GetKernels(t, isa).vec_dot(k, &got, w.data(), a.data());
        EXPECT_EQ(got, want) << GgmlTypeName(t) << " " << IsaName(isa) << " sign " << sign;
      }
    }
  }
}

// MXFP4's largest exponent (e = 255, scale 2^127), which the dequantizer overflows for levels
// of 2 and above: in the dot, 2^127 times a small activation scale stays finite, and every ISA
// gets it (the AVX-512 tiles widen the exponents their own way).
TEST(QuantIqDot, Mxfp4LargestExponent) {
  std::mt19937 rng(3);
  const int64_t k = 256;
  std::vector<uint8_t> w = RandomWeightRow(GgmlType::kMXFP4, k, rng);
  for (size_t off = 0; off < w.size(); off += sizeof(BlockMXFP4)) w[off] = 255;
  std::vector<float> x = RandomFloats(k, rng, 1e-5f);
  std::vector<uint8_t> a(RowSize(GgmlType::kQ8_0, k));
  GetKernels(GgmlType::kQ8_0, Isa::kScalar).quantize(x.data(), a.data(), k);
  float want = 0.0f;
  GetKernels(GgmlType::kMXFP4, Isa::kScalar).vec_dot(k, &want, w.data(), a.data());
  ASSERT_TRUE(std::isfinite(want));
  DotCase c;
  c.k = k;
  c.w = w;
  c.act = a;
  double ref, mag;
  ReferenceDot(GgmlType::kMXFP4, ElementOf, c, 0, &ref, &mag);
  for (Isa isa : SupportedIsas()) {
    float got = 0.0f;
    GetKernels(GgmlType::kMXFP4, isa).vec_dot(k, &got, w.data(), a.data());
    EXPECT_NEAR(got, want, Budget(GgmlType::kMXFP4, mag)) << IsaName(isa);
  }
}

// The model's matmul path equals vec_dot bit for bit for every batch size (quant_random.h).
TEST(QuantIqMatMul, EqualsVecDotForEveryBatchSize) {
  ExpectMatMulEqualsVecDot({std::begin(kTypes), std::end(kTypes)});
}

}  // namespace
}  // namespace lamina
