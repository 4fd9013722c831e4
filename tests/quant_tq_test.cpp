// The ternary types TQ1_0 and TQ2_0: block layouts against GGML's type table, dequantization of
// hand-built blocks (TQ1_0's base-3 bytes encoded here from the format definition), the scalar
// dots against a double-precision dot of the format definition, and every SIMD variant this CPU
// runs against its scalar twin, with vec_dot_multi and the model's matmul bit-identical to
// vec_dot.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
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

constexpr GgmlType kTypes[] = {GgmlType::kTQ1_0, GgmlType::kTQ2_0};

// Digit n (0 = most significant) of a TQ1_0 byte: ((b * 3^n mod 256) * 3) >> 8.
int Tq1Digit(uint8_t b, int n) {
  int q = b;
  for (int i = 0; i < n; ++i) q = (q * 3) & 0xFF;
  return (q * 3) >> 8;
}

// Encodes base-3 digits (most significant first) as TQ1_0 does: the number v they spell, padded
// to five digits (qh bytes hold four, v * 3), stored as ceil(v * 256 / 243).
uint8_t EncodeTq1(const std::vector<int>& digits) {
  int v = 0;
  for (int t : digits) v = 3 * v + t;
  for (size_t i = digits.size(); i < 5; ++i) v *= 3;
  return static_cast<uint8_t>((v * 256 + 242) / 243);
}

// ---------------------------------------------------------------------------------------------
// Layouts and table entries.

TEST(QuantTqLayout, BlocksMatchGgmlTypeTable) {
  static_assert(offsetof(BlockTQ1_0, qs) == 0);
  static_assert(offsetof(BlockTQ1_0, qh) == 48);
  static_assert(offsetof(BlockTQ1_0, d) == 52);
  static_assert(offsetof(BlockTQ2_0, qs) == 0);
  static_assert(offsetof(BlockTQ2_0, d) == 64);
  ExpectLayoutMatchesGgml({GgmlType::kTQ1_0, 34, "TQ1_0", kQK_K, 54});
  ExpectLayoutMatchesGgml({GgmlType::kTQ2_0, 35, "TQ2_0", kQK_K, 66});
}

TEST(QuantTqKernels, TableEntriesOnEveryIsa) {
  for (GgmlType t : kTypes) ExpectReadOnlyTypeKernels(t, GgmlType::kQ8_K);
}

// ---------------------------------------------------------------------------------------------
// Dequantization of hand-built blocks.

TEST(QuantTqDequantize, Tq1Encoding) {
  // 2,0,1,2,1 spells 178; ceil(178 * 256 / 243) = 188, and the digits come back.
  EXPECT_EQ(EncodeTq1({2, 0, 1, 2, 1}), 188);
  const int want[5] = {2, 0, 1, 2, 1};
  for (int n = 0; n < 5; ++n) EXPECT_EQ(Tq1Digit(188, n), want[n]) << n;
  EXPECT_EQ(EncodeTq1({1, 1, 1, 1, 1}), 128);  // all zeros
  EXPECT_EQ(EncodeTq1({0, 0, 0, 0, 0}), 0);    // all -1
  // Every 5-digit and 4-digit number survives the round trip.
  for (int v = 0; v < 243; ++v) {
    std::vector<int> d5(5), d4(4);
    for (int n = 4, r = v; n >= 0; --n, r /= 3) d5[n] = r % 3;
    for (int n = 3, r = v % 81; n >= 0; --n, r /= 3) d4[n] = r % 3;
    for (int n = 0; n < 5; ++n) ASSERT_EQ(Tq1Digit(EncodeTq1(d5), n), d5[n]) << v;
    for (int n = 0; n < 4; ++n) ASSERT_EQ(Tq1Digit(EncodeTq1(d4), n), d4[n]) << v;
  }
}

TEST(QuantTqDequantize, Tq1HandBuilt) {
  BlockTQ1_0 b[2];
  for (BlockTQ1_0& blk : b) {
    std::memset(blk.qs, 128, sizeof(blk.qs));  // every digit 1: value 0
    std::memset(blk.qh, EncodeTq1({1, 1, 1, 1}), sizeof(blk.qh));
  }
  b[0].d = F32ToFp16(0.5f);
  b[1].d = F32ToFp16(-2.0f);
  b[0].qs[0] = EncodeTq1({2, 0, 1, 2, 1});   // elements 0, 32, 64, 96, 128
  b[0].qs[31] = EncodeTq1({0, 0, 0, 0, 0});  // elements 31, 63, 95, 127, 159
  b[0].qs[40] = EncodeTq1({0, 2, 1, 1, 2});  // elements 168, 184, 200, 216, 232
  b[0].qh[2] = EncodeTq1({2, 1, 0, 2});      // elements 242, 246, 250, 254
  b[1].qh[3] = EncodeTq1({0, 0, 0, 0});      // elements 256 + 243, 247, 251, 255
  std::vector<float> want(2 * kQK_K, 0.0f);
  const auto set = [&](int e, int t, float d) { want[e] = static_cast<float>(t - 1) * d; };
  const int d0[5] = {2, 0, 1, 2, 1}, d40[5] = {0, 2, 1, 1, 2}, dh[4] = {2, 1, 0, 2};
  for (int n = 0; n < 5; ++n) {
    set(32 * n, d0[n], 0.5f);
    set(32 * n + 31, 0, 0.5f);
    set(160 + 16 * n + 8, d40[n], 0.5f);
  }
  for (int n = 0; n < 4; ++n) {
    set(240 + 4 * n + 2, dh[n], 0.5f);
    set(kQK_K + 240 + 4 * n + 3, 0, -2.0f);
  }
  for (Isa isa : SupportedIsas()) {
    const std::vector<float> y = Dequantize(GgmlType::kTQ1_0, b, 2 * kQK_K, isa);
    for (int e = 0; e < 2 * kQK_K; ++e) ASSERT_EQ(y[e], want[e]) << "element " << e;
  }
}

TEST(QuantTqDequantize, Tq2HandBuilt) {
  BlockTQ2_0 b[2];
  for (BlockTQ2_0& blk : b) std::memset(blk.qs, 0x55, sizeof(blk.qs));  // every code 1: value 0
  b[0].d = F32ToFp16(0.5f);
  b[1].d = F32ToFp16(-2.0f);
  b[0].qs[0] = 0b11100100;   // codes 0, 1, 2, 3 for elements 0, 32, 64, 96
  b[0].qs[33] = 0b01011000;  // codes 0, 2, 1, 1 for elements 129, 161, 193, 225
  b[1].qs[63] = 0b00010110;  // codes 2, 1, 1, 0 for elements 256 + 159, 191, 223, 255
  std::vector<float> want(2 * kQK_K, 0.0f);
  want[0] = -0.5f;
  want[64] = 0.5f;
  want[96] = 1.0f;  // code 3 (not written by quantizers) reads as 2, as GGML's code gives
  want[129] = -0.5f;
  want[161] = 0.5f;
  want[kQK_K + 159] = -2.0f;
  want[kQK_K + 255] = 2.0f;
  for (Isa isa : SupportedIsas()) {
    const std::vector<float> y = Dequantize(GgmlType::kTQ2_0, b, 2 * kQK_K, isa);
    for (int e = 0; e < 2 * kQK_K; ++e) ASSERT_EQ(y[e], want[e]) << "element " << e;
  }
}

// ---------------------------------------------------------------------------------------------
// Random blocks and the format definition, element by element in double.

// Element e of a row, from the layout comments in types.h (not the kernels' loops).
double ElementOf(GgmlType t, const uint8_t* row, int64_t e) {
  const int i = static_cast<int>(e % kQK_K);
  if (t == GgmlType::kTQ1_0) {
    const auto& b = reinterpret_cast<const BlockTQ1_0*>(row)[e / kQK_K];
    int digit;
    if (i < 160) {
      digit = Tq1Digit(b.qs[i % 32], i / 32);
    } else if (i < 240) {
      digit = Tq1Digit(b.qs[32 + (i - 160) % 16], (i - 160) / 16);
    } else {
      digit = Tq1Digit(b.qh[(i - 240) % 4], (i - 240) / 4);
    }
    return double(Fp16ToF32(b.d)) * (digit - 1);
  }
  const auto& b = reinterpret_cast<const BlockTQ2_0*>(row)[e / kQK_K];
  const int h = i / 128, l = (i % 128) / 32, m = i % 32;
  return double(Fp16ToF32(b.d)) * (((b.qs[32 * h + m] >> (2 * l)) & 3) - 1);
}

TEST(QuantTqDequantize, RandomBlocksMatchFormatDefinition) {
  std::mt19937 rng(1234);
  for (GgmlType t : kTypes) ExpectDequantizeMatchesDefinition(t, ElementOf, 8 * kQK_K, rng);
}

// ---------------------------------------------------------------------------------------------
// Dot products.

// Integer block sums are exact in every variant; they differ only in how the per-super-block f32
// terms are added (as IQ4_XS, quant_iq_test).
double Budget(GgmlType, double mag) { return 2e-6 * mag + 1e-30; }

const std::vector<int64_t> kSizes = {kQK_K, 3 * kQK_K, 16 * kQK_K, 17 * kQK_K};

TEST(QuantTqDot, ScalarMatchesFormatDefinition) {
  std::mt19937 rng(7);
  for (GgmlType t : kTypes) ExpectScalarDotMatchesDefinition(t, ElementOf, kSizes, Budget, rng);
}

// Every ISA against the scalar twin, and vec_dot_multi against vec_dot bit for bit for every
// batch size: a token's result must not depend on the batch it arrives in.
TEST(QuantTqDot, SimdMatchesScalarTwinAndMultiIsBatchInvariant) {
  std::mt19937 rng(42);
  for (GgmlType t : kTypes) {
    ExpectSimdMatchesScalarTwin(t, ElementOf, kSizes, Budget, rng);
    if (HasFatalFailure()) return;
  }
}

// AVX2 (maddubs + madd) and AVX-512 (VNNI dpbusd) build the same eight int32 lanes per
// super-block, then the same FMA and reduction: the two ISAs agree bit for bit.
TEST(QuantTqDot, Avx2AndAvx512Agree) {
  if (DetectIsa() < Isa::kAvx512) GTEST_SKIP() << "needs AVX-512";
  std::mt19937 rng(5);
  for (GgmlType t : kTypes) {
    for (int64_t k : kSizes) {
      const DotCase c = MakeDotCase(t, k, 1, rng);
      float a = NAN, b = NAN;
      GetKernels(t, Isa::kAvx2).vec_dot(k, &a, c.w.data(), c.act.data());
      GetKernels(t, Isa::kAvx512).vec_dot(k, &b, c.w.data(), c.act.data());
      EXPECT_EQ(F32ToBits(a), F32ToBits(b)) << GgmlTypeName(t) << " k=" << k;
    }
  }
}

// Extreme activations (every Q8_K code +-127 or -128 against every weight code, TQ2_0's 3
// included): the SIMD integer paths do not saturate.
TEST(QuantTqDot, ExtremeCodes) {
  for (GgmlType t : kTypes) {
    for (int fill : {0x00, 0xFF, 0xAA, 0x80}) {
      std::vector<uint8_t> w(RowSize(t, kQK_K), static_cast<uint8_t>(fill));
      const fp16_t d = F32ToFp16(1.0f);
      std::memcpy(w.data() + w.size() - 2, &d, 2);
      for (int q : {127, -127, -128}) {
        BlockQ8_K a;
        a.d = 1.0f;
        std::memset(a.qs, q & 0xFF, sizeof(a.qs));
        for (int g = 0; g < kQK_K / 16; ++g) a.bsums[g] = static_cast<int16_t>(16 * q);
        double want = 0;
        for (int e = 0; e < kQK_K; ++e) want += ElementOf(t, w.data(), e) * q;
        for (Isa isa : SupportedIsas()) {
          float got = NAN;
          GetKernels(t, isa).vec_dot(kQK_K, &got, w.data(), &a);
          EXPECT_EQ(got, want) << GgmlTypeName(t) << " " << IsaName(isa) << " fill " << fill
                               << " q " << q;
        }
      }
    }
  }
}

// The model's matmul path equals vec_dot bit for bit for every batch size (quant_random.h).
TEST(QuantTqMatMul, EqualsVecDotForEveryBatchSize) {
  ExpectMatMulEqualsVecDot({std::begin(kTypes), std::end(kTypes)});
}

}  // namespace
}  // namespace lamina
