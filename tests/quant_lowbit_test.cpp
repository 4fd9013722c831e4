// NVFP4, Q1_0 and Q2_0 (GGML types 40, 41, 42): block layouts against GGML's type table, the
// UE4M3 scale decoding for every byte, dequantization of hand-built blocks, random blocks
// against the format definitions, the scalar dots against a double-precision dot of those
// definitions, every SIMD variant this CPU runs equal to its scalar twin bit for bit, and the
// model's matmul equal to vec_dot for every batch size.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "quant/quant.h"
#include "quant/types.h"
#include "quant_random.h"
#include "quant_twin.h"
#include "util/cpu_features.h"
#include "util/fp16.h"

namespace lamina {
namespace {

constexpr GgmlType kTypes[] = {GgmlType::kNVFP4, GgmlType::kQ1_0, GgmlType::kQ2_0};

// E2M1 magnitudes {0, 0.5, 1, 1.5, 2, 3, 4, 6}, sign bit 3.
constexpr double kE2M1[16] = {0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6};

// An unsigned E4M3 byte as a real number, from the format: bias 7, 3 mantissa bits, exponent 0
// subnormal; GGML reads bit 7 as nothing and codes 0x00 and 0x7F as 0.
double Ue4m3(uint8_t x) {
  if (x == 0 || x == 0x7F) return 0;
  const int e = (x >> 3) & 0xF, m = x & 7;
  return e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1 + m / 8.0, e - 7);
}

// Element e of a row, from the layout comments in types.h.
double ElementOf(GgmlType t, const uint8_t* row, int64_t e) {
  const int64_t bs = GetTypeTraits(t).block_size;
  const uint8_t* b = row + (e / bs) * GetTypeTraits(t).type_size;
  const int i = static_cast<int>(e % bs);
  switch (t) {
    case GgmlType::kNVFP4: {
      const auto& blk = *reinterpret_cast<const BlockNVFP4*>(b);
      const int s = i / 16, j = i % 16;
      const uint8_t byte = blk.qs[8 * s + j % 8];
      return kE2M1[j < 8 ? byte & 0xF : byte >> 4] * Ue4m3(blk.d[s]);
    }
    case GgmlType::kQ1_0: {
      const auto& blk = *reinterpret_cast<const BlockQ1_0*>(b);
      return ((blk.qs[i / 8] >> (i % 8)) & 1 ? 1.0 : -1.0) * Fp16ToF32(blk.d);
    }
    case GgmlType::kQ2_0: {
      const auto& blk = *reinterpret_cast<const BlockQ2_0*>(b);
      return (((blk.qs[i / 4] >> (2 * (i % 4))) & 3) - 1) * double(Fp16ToF32(blk.d));
    }
    default:
      ADD_FAILURE() << "not a low-bit type";
      return 0;
  }
}

// Integer sums are exact; the f32 terms (one per four values and group) round: as the Q8_0
// table types (quant_iq_test).
double Budget(GgmlType, double mag) { return 1e-5 * mag + 1e-6; }

const std::vector<int64_t> kSizes = {128, 256, 384, 4096, 4096 + 128};

// ---------------------------------------------------------------------------------------------
// Layouts, table entries, scales.

TEST(QuantLowBitLayout, BlocksMatchGgmlTypeTable) {
  static_assert(offsetof(BlockNVFP4, qs) == 4);
  static_assert(offsetof(BlockQ1_0, qs) == 2);
  static_assert(offsetof(BlockQ2_0, qs) == 2);
  ExpectLayoutMatchesGgml({GgmlType::kNVFP4, 40, "NVFP4", 64, 36});
  ExpectLayoutMatchesGgml({GgmlType::kQ1_0, 41, "Q1_0", 128, 18});
  ExpectLayoutMatchesGgml({GgmlType::kQ2_0, 42, "Q2_0", 64, 18});
}

TEST(QuantLowBitKernels, TableEntriesOnEveryIsa) {
  for (GgmlType t : kTypes) ExpectReadOnlyTypeKernels(t, GgmlType::kQ8_0);
}

// Every byte: half the UE4M3 value (the levels are doubled E2M1), exact.
TEST(QuantLowBitLayout, Ue4m3EveryByte) {
  for (int x = 0; x < 256; ++x) {
    ASSERT_EQ(double(Ue4m3ToF32Half(static_cast<uint8_t>(x))), Ue4m3(x) / 2) << x;
  }
  EXPECT_EQ(Ue4m3ToF32Half(0x38), 0.5f);         // 2^0
  EXPECT_EQ(Ue4m3ToF32Half(0x01), 1.0f / 1024);  // smallest subnormal 2^-9
  EXPECT_EQ(Ue4m3ToF32Half(0x7E), 224.0f);       // largest, 448
  EXPECT_EQ(Ue4m3ToF32Half(0x7F), 0.0f);         // E4M3's NaN code
  EXPECT_EQ(Ue4m3ToF32Half(0xFF), 240.0f);       // bit 7 ignored, but not the 0x7F check
  EXPECT_EQ(Ue4m3ToF32Half(0x80), 0.0f);
}

// ---------------------------------------------------------------------------------------------
// Dequantization.

TEST(QuantLowBitDequantize, Nvfp4HandBuilt) {
  BlockNVFP4 b{};
  b.d[0] = 0x38;    // 1 (halved: 0.5 times the doubled levels)
  b.d[1] = 0x40;    // 2
  b.d[2] = 0x7F;    // 0
  b.d[3] = 0x01;    // 2^-9
  b.qs[0] = 0x71;   // element 0: code 1 (0.5), element 8: code 7 (6)
  b.qs[7] = 0xF9;   // element 7: code 9 (-0.5), element 15: code 15 (-6)
  b.qs[8] = 0x0D;   // element 16: code 13 (-3) * 2
  b.qs[16] = 0x77;  // sub-block 2: scale 0
  b.qs[31] = 0x70;  // element 63: code 7 (6) * 2^-9
  std::vector<float> want(64, 0.0f);
  want[0] = 0.5f;
  want[8] = 6.0f;
  want[7] = -0.5f;
  want[15] = -6.0f;
  want[16] = -6.0f;
  want[63] = 6.0f / 512;
  for (Isa isa : SupportedIsas()) {
    const std::vector<float> y = Dequantize(GgmlType::kNVFP4, &b, 64, isa);
    for (int e = 0; e < 64; ++e) ASSERT_EQ(y[e], want[e]) << "element " << e;
  }
}

TEST(QuantLowBitDequantize, Q1_0AndQ2_0HandBuilt) {
  BlockQ1_0 q1{};
  q1.d = F32ToFp16(0.25f);
  q1.qs[0] = 0x81;   // elements 0 and 7 positive
  q1.qs[15] = 0x40;  // element 126 positive
  BlockQ2_0 q2{};
  q2.d = F32ToFp16(-0.5f);
  std::memset(q2.qs, 0x55, sizeof(q2.qs));  // every code 1: value 0
  q2.qs[0] = 0b11100100;                    // elements 0..3: codes 0, 1, 2, 3
  q2.qs[15] = 0b00010101;                   // element 63: code 0
  for (Isa isa : SupportedIsas()) {
    const std::vector<float> y1 = Dequantize(GgmlType::kQ1_0, &q1, 128, isa);
    for (int e = 0; e < 128; ++e) {
      ASSERT_EQ(y1[e], (e == 0 || e == 7 || e == 126) ? 0.25f : -0.25f) << "element " << e;
    }
    const std::vector<float> y2 = Dequantize(GgmlType::kQ2_0, &q2, 64, isa);
    const float want[4] = {0.5f, 0.0f, -0.5f, -1.0f};  // (q - 1) * d
    for (int e = 0; e < 64; ++e) {
      ASSERT_EQ(y2[e], e < 4 ? want[e] : (e == 63 ? 0.5f : 0.0f)) << "element " << e;
    }
  }
}

TEST(QuantLowBitDequantize, RandomBlocksMatchFormatDefinition) {
  std::mt19937 rng(1234);
  for (GgmlType t : kTypes) ExpectDequantizeMatchesDefinition(t, ElementOf, 16 * 128, rng);
}

// ---------------------------------------------------------------------------------------------
// Dot products.

TEST(QuantLowBitDot, ScalarMatchesFormatDefinition) {
  std::mt19937 rng(7);
  for (GgmlType t : kTypes) ExpectScalarDotMatchesDefinition(t, ElementOf, kSizes, Budget, rng);
}

// Every ISA equals the scalar twin bit for bit (the same int32 lanes, the same float steps),
// and vec_dot_multi equals vec_dot for every batch size.
TEST(QuantLowBitDot, SimdEqualsScalarTwinAndMultiIsBatchInvariant) {
  std::mt19937 rng(42);
  for (GgmlType t : kTypes) {
    ExpectSimdMatchesScalarTwin(t, ElementOf, kSizes, nullptr, rng);
    if (HasFatalFailure()) return;
  }
}

// Extreme blocks (every byte 0x00, 0xFF, 0xAA or 0x55: NVFP4's +-6 levels, Q2_0's code 3)
// against activations all +127 or all -127: the SIMD integer paths do not saturate.
TEST(QuantLowBitDot, ExtremeCodes) {
  for (GgmlType t : kTypes) {
    for (int fill : {0x00, 0xFF, 0xAA, 0x55}) {
      std::vector<uint8_t> w(RowSize(t, 128), static_cast<uint8_t>(fill));
      const size_t bs = GetTypeTraits(t).type_size;
      for (size_t off = 0; off < w.size(); off += bs) {
        if (t == GgmlType::kNVFP4) {
          std::memset(w.data() + off, 0x38, 4);
        } else {
          const fp16_t d = F32ToFp16(1.0f);
          std::memcpy(w.data() + off, &d, 2);
        }
      }
      for (int q : {127, -127}) {
        BlockQ8_0 a[4];  // [128 values / 32]
        for (BlockQ8_0& blk : a) {
          blk.d = F32ToFp16(1.0f);
          std::memset(blk.qs, q & 0xFF, sizeof(blk.qs));
        }
        double want = 0;
        for (int e = 0; e < 128; ++e) want += ElementOf(t, w.data(), e) * q;
        float scalar = NAN;
        GetKernels(t, Isa::kScalar).vec_dot(128, &scalar, w.data(), a);
        EXPECT_EQ(scalar, want) << GgmlTypeName(t) << " fill " << fill << " q " << q;
        for (Isa isa : SupportedIsas()) {
          float got = NAN;
          GetKernels(t, isa).vec_dot(128, &got, w.data(), a);
          EXPECT_EQ(F32ToBits(got), F32ToBits(scalar))
              << GgmlTypeName(t) << " " << IsaName(isa) << " fill " << fill << " q " << q;
        }
      }
    }
  }
}

// The model's matmul path equals vec_dot bit for bit for every batch size (quant_random.h).
TEST(QuantLowBitMatMul, EqualsVecDotForEveryBatchSize) {
  ExpectMatMulEqualsVecDot({std::begin(kTypes), std::end(kTypes)});
}

}  // namespace
}  // namespace lamina
