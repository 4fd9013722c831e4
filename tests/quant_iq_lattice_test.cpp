// The lattice i-quants IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S and IQ1_M: block layouts
// against GGML's type table, the codebooks' invariants, dequantization against an element-wise
// reading of the format definitions (types.h) and hand-built blocks, the scalar dots against a
// double-precision dot, and every SIMD variant this CPU runs bit-identical to its scalar twin,
// with vec_dot_multi and the model's matmul bit-identical to vec_dot.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "quant/iq_grids.h"
#include "quant/quant.h"
#include "quant/types.h"
#include "quant_random.h"
#include "quant_twin.h"
#include "util/cpu_features.h"
#include "util/fp16.h"

namespace lamina {
namespace {

namespace qi = quant_internal;

constexpr GgmlType kTypes[] = {GgmlType::kIQ2_XXS, GgmlType::kIQ2_XS, GgmlType::kIQ2_S,
                               GgmlType::kIQ3_XXS, GgmlType::kIQ3_S,  GgmlType::kIQ1_S,
                               GgmlType::kIQ1_M};

// ---------------------------------------------------------------------------------------------
// Layouts, table entries, codebooks.

TEST(QuantIqLatticeLayout, BlocksMatchGgmlTypeTable) {
  static_assert(offsetof(BlockIQ2_XS, scales) == 66);
  static_assert(offsetof(BlockIQ2_S, qh) == 66);
  static_assert(offsetof(BlockIQ2_S, scales) == 74);
  static_assert(offsetof(BlockIQ3_S, qh) == 66);
  static_assert(offsetof(BlockIQ3_S, signs) == 74);
  static_assert(offsetof(BlockIQ3_S, scales) == 106);
  static_assert(offsetof(BlockIQ1_S, qh) == 34);
  static_assert(offsetof(BlockIQ1_M, qh) == 32);
  static_assert(offsetof(BlockIQ1_M, scales) == 48);
  const ExpectedLayout expects[] = {{GgmlType::kIQ2_XXS, 16, "IQ2_XXS", kQK_K, 66},
                                    {GgmlType::kIQ2_XS, 17, "IQ2_XS", kQK_K, 74},
                                    {GgmlType::kIQ2_S, 22, "IQ2_S", kQK_K, 82},
                                    {GgmlType::kIQ3_XXS, 18, "IQ3_XXS", kQK_K, 98},
                                    {GgmlType::kIQ3_S, 21, "IQ3_S", kQK_K, 110},
                                    {GgmlType::kIQ1_S, 19, "IQ1_S", kQK_K, 50},
                                    {GgmlType::kIQ1_M, 29, "IQ1_M", kQK_K, 56}};
  for (const ExpectedLayout& e : expects) ExpectLayoutMatchesGgml(e);
}

TEST(QuantIqLatticeKernels, TableEntriesOnEveryIsa) {
  for (GgmlType t : kTypes) ExpectReadOnlyTypeKernels(t, GgmlType::kQ8_K);
}

// The values of entry e of a grid of W-value entries, as signed integers.
template <typename Word>
std::vector<int> EntryValues(const Word* grid, size_t e, int width) {
  std::vector<int> v(static_cast<size_t>(width));
  for (int j = 0; j < width; ++j) v[j] = static_cast<int8_t>((grid[e] >> (8 * j)) & 0xFF);
  return v;
}

// Entry count (the arrays' sizes), the value set, and no entry twice.
template <typename Word, size_t N>
void ExpectGrid(const char* name, const std::array<Word, N>& grid, size_t entries, int width,
                const std::set<int>& values) {
  SCOPED_TRACE(name);
  EXPECT_EQ(N, entries);
  std::set<std::vector<int>> seen;
  std::set<int> used;
  for (size_t e = 0; e < N; ++e) {
    const std::vector<int> v = EntryValues(grid.data(), e, width);
    for (int x : v) {
      EXPECT_TRUE(values.count(x)) << "entry " << e << " value " << x;
      used.insert(x);
    }
    EXPECT_TRUE(seen.insert(v).second) << "entry " << e << " repeats";
  }
  EXPECT_EQ(used, values) << "every level is used";
}

TEST(QuantIqLatticeCodebooks, Invariants) {
  const std::set<int> iq2 = {8, 25, 43};
  ExpectGrid("IQ2_XXS", qi::kIq2xxsGrid, 256, 8, iq2);
  ExpectGrid("IQ2_XS", qi::kIq2xsGrid, 512, 8, iq2);
  ExpectGrid("IQ2_S", qi::kIq2sGrid, 1024, 8, iq2);
  ExpectGrid("IQ3_XXS", qi::kIq3xxsGrid, 256, 4, {4, 12, 20, 28, 36, 44, 52, 62});
  ExpectGrid("IQ3_S", qi::kIq3sGrid, 512, 4, {1, 3, 5, 7, 9, 11, 13, 15});
  ExpectGrid("IQ1", qi::kIq1Grid, 2048, 8, {-1, 0, 1});
  for (size_t e = 0; e < qi::kIq1Grid.size(); ++e) {
    const std::vector<int> a = EntryValues(qi::kIq1Grid.data(), e, 8);
    const std::vector<int> b = EntryValues(qi::kIq1Grid8.data(), e, 8);
    for (int j = 0; j < 8; ++j) ASSERT_EQ(b[j], 8 * a[j]) << "entry " << e;
  }
  // The sign rule: 128 distinct bytes, each negating an even number of values, whose low seven
  // bits are the index.
  std::set<int> signs;
  for (uint32_t s = 0; s < 128; ++s) {
    const int b = qi::IqSignBits(s);
    EXPECT_EQ(b & 127, static_cast<int>(s));
    EXPECT_EQ(__builtin_popcount(b) % 2, 0) << s;
    signs.insert(b);
  }
  EXPECT_EQ(signs.size(), 128u);
}

// ---------------------------------------------------------------------------------------------
// Dequantization.

uint32_t Word32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
uint16_t Word16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// Value j (0..7) of an 8-value grid entry, or of two 4-value entries.
int Grid8(const uint64_t* grid, int idx, int j) {
  return static_cast<int8_t>((grid[idx] >> (8 * j)) & 0xFF);
}
int Grid4x2(const uint32_t* grid, int i1, int i2, int j) {
  return static_cast<int>((grid[j < 4 ? i1 : i2] >> (8 * (j % 4))) & 0xFF);
}
int SignOf(int sign_bits, int j) { return (sign_bits >> j) & 1 ? -1 : 1; }

// Element e of a row, read from types.h's layout comments with GGML's float formulas.
double ElementOf(GgmlType t, const uint8_t* row, int64_t e) {
  const size_t bs = GetTypeTraits(t).type_size;
  const uint8_t* b = row + (e / kQK_K) * bs;
  const int i = static_cast<int>(e % kQK_K), g = i / 32, l = (i % 32) / 8, j = i % 8;
  const float d = t == GgmlType::kIQ1_M ? 0.0f : Fp16ToF32(Word16(b));
  switch (t) {
    case GgmlType::kIQ2_XXS: {
      const uint32_t a = Word32(b + 2 + 8 * g), sw = Word32(b + 2 + 8 * g + 4);
      const float db = d * (0.5f + (sw >> 28)) * 0.25f;
      return db * Grid8(qi::kIq2xxsGrid.data(), (a >> (8 * l)) & 255, j) *
             SignOf(qi::IqSignBits(sw >> (7 * l)), j);
    }
    case GgmlType::kIQ2_XS: {
      const int q = Word16(b + 2 + 2 * (4 * g + l));
      const float db = d * (0.5f + ((b[66 + g] >> (4 * (l / 2))) & 0xF)) * 0.25f;
      return db * Grid8(qi::kIq2xsGrid.data(), q & 511, j) * SignOf(qi::IqSignBits(q >> 9), j);
    }
    case GgmlType::kIQ2_S: {
      const int idx = b[2 + 4 * g + l] | (((b[66 + g] >> (2 * l)) & 3) << 8);
      const float db = d * (0.5f + ((b[74 + g] >> (4 * (l / 2))) & 0xF)) * 0.25f;
      return db * Grid8(qi::kIq2sGrid.data(), idx, j) * SignOf(b[2 + 32 + 4 * g + l], j);
    }
    case GgmlType::kIQ3_XXS: {
      const uint32_t sw = Word32(b + 2 + 64 + 4 * g);
      const float db = d * (0.5f + (sw >> 28)) * 0.5f;
      const uint8_t* q = b + 2 + 8 * g + 2 * l;
      return db * Grid4x2(qi::kIq3xxsGrid.data(), q[0], q[1], j) *
             SignOf(qi::IqSignBits(sw >> (7 * l)), j);
    }
    case GgmlType::kIQ3_S: {
      const uint8_t* q = b + 2 + 8 * g + 2 * l;
      const int h = b[66 + g];
      const float db = d * static_cast<float>(1 + 2 * ((b[106 + g / 2] >> (4 * (g % 2))) & 0xF));
      return db *
             Grid4x2(qi::kIq3sGrid.data(), q[0] | ((h >> (2 * l)) & 1) << 8,
                     q[1] | ((h >> (2 * l + 1)) & 1) << 8, j) *
             SignOf(b[74 + 4 * g + l], j);
    }
    case GgmlType::kIQ1_S: {
      const int qh = Word16(b + 34 + 2 * g);
      const float dl = d * static_cast<float>(2 * ((qh >> 12) & 7) + 1);
      const float delta = qh & 0x8000 ? -0.125f : 0.125f;
      return dl *
             (Grid8(qi::kIq1Grid.data(), b[2 + 4 * g + l] | ((qh >> (3 * l)) & 7) << 8, j) + delta);
    }
    case GgmlType::kIQ1_M: {
      uint16_t sc[4];
      std::memcpy(sc, b + 48, 8);
      const fp16_t h16 = static_cast<fp16_t>((sc[0] >> 12) | ((sc[1] >> 8) & 0xF0) |
                                             ((sc[2] >> 4) & 0xF00) | (sc[3] & 0xF000));
      const int s = (sc[g / 2] >> (6 * (g % 2) + 3 * (l / 2))) & 7;
      const float dl = Fp16ToF32(h16) * static_cast<float>(2 * s + 1);
      const int nib = (b[32 + 2 * g + l / 2] >> (4 * (l % 2))) & 0xF;
      const float delta = nib & 8 ? -0.125f : 0.125f;
      return dl * (Grid8(qi::kIq1Grid.data(), b[4 * g + l] | (nib & 7) << 8, j) + delta);
    }
    default:
      ADD_FAILURE() << "type";
      return 0;
  }
}

TEST(QuantIqLatticeDequantize, RandomBlocksMatchFormatDefinition) {
  std::mt19937 rng(1234);
  for (GgmlType t : kTypes) ExpectDequantizeMatchesDefinition(t, ElementOf, 8 * kQK_K, rng);
}

// Hand-built blocks: d = 1, every index 0, smallest scale, no signs (entry 0 of each grid is
// its smallest level everywhere: IQ2 8, IQ3_XXS 4, IQ3_S 1; IQ1_S's entry 0 is all -1).
TEST(QuantIqLatticeDequantize, HandBuilt) {
  const fp16_t one = F32ToFp16(1.0f);
  {
    BlockIQ2_XXS b{};
    b.d = one;
    const std::vector<float> y = Dequantize(GgmlType::kIQ2_XXS, &b, kQK_K);
    for (float v : y) ASSERT_EQ(v, 1.0f);  // 8 * (0.5 + 0) / 4
    b.qs[3] = 0xF000;                      // group 0's scale 15: 8 * 15.5 / 4
    b.qs[2] = 1;                           // run 0's sign index 1: bits 0 and 7
    const std::vector<float> z = Dequantize(GgmlType::kIQ2_XXS, &b, kQK_K);
    EXPECT_EQ(z[0], -31.0f);
    EXPECT_EQ(z[1], 31.0f);
    EXPECT_EQ(z[7], -31.0f);
    EXPECT_EQ(z[8], 31.0f);
    EXPECT_EQ(z[32], 1.0f);
  }
  {
    BlockIQ3_S b{};
    b.d = one;
    b.signs[0] = 0x81;
    b.scales[0] = 0x21;  // group 0: 3, group 1: 5
    const std::vector<float> y = Dequantize(GgmlType::kIQ3_S, &b, kQK_K);
    EXPECT_EQ(y[0], -3.0f);
    EXPECT_EQ(y[1], 3.0f);
    EXPECT_EQ(y[7], -3.0f);
    EXPECT_EQ(y[32], 5.0f);
    EXPECT_EQ(y[64], 1.0f);
  }
  {
    BlockIQ1_S b{};
    b.d = one;
    b.qh[1] = 0x8000 | (2 << 12);  // group 1: delta -1/8, scale 5
    const std::vector<float> y = Dequantize(GgmlType::kIQ1_S, &b, kQK_K);
    const float g0 = static_cast<float>(Grid8(qi::kIq1Grid.data(), 0, 0));
    EXPECT_EQ(y[0], g0 + 0.125f);
    EXPECT_EQ(y[32], 5.0f * (g0 - 0.125f));
  }
}

// ---------------------------------------------------------------------------------------------
// Dot products.

const std::vector<int64_t> kSizes = {kQK_K, 3 * kQK_K, 16 * kQK_K, 17 * kQK_K};

// Integer super-block sums are exact; the f32 terms (one per super-block) round.
double Budget(GgmlType, double mag) { return 2e-6 * mag + 1e-30; }

TEST(QuantIqLatticeDot, ScalarMatchesFormatDefinition) {
  std::mt19937 rng(7);
  for (GgmlType t : kTypes) ExpectScalarDotMatchesDefinition(t, ElementOf, kSizes, Budget, rng);
}

// Every ISA equals the scalar twin bit for bit (the same integers, the same float steps), and
// vec_dot_multi equals vec_dot for every batch size.
TEST(QuantIqLatticeDot, SimdEqualsScalarTwinAndMultiIsBatchInvariant) {
  std::mt19937 rng(42);
  for (GgmlType t : kTypes) {
    ExpectSimdMatchesScalarTwin(t, ElementOf, kSizes, nullptr, rng);
    if (HasFatalFailure()) return;
  }
}

// Extreme blocks (every byte 0x00, 0xFF, 0xAA or 0x55, so the largest grid values and scales)
// against activations all +127 or all -127: the SIMD integer paths do not saturate. (Q8_K codes
// are within +-127: the quantizer never writes -128.)
TEST(QuantIqLatticeDot, ExtremeCodes) {
  for (GgmlType t : kTypes) {
    for (int fill : {0x00, 0xFF, 0xAA, 0x55}) {
      std::vector<uint8_t> w(RowSize(t, kQK_K), static_cast<uint8_t>(fill));
      const fp16_t d = F32ToFp16(1.0f);
      if (t == GgmlType::kIQ1_M) {  // d's nibbles in the scale words' top nibbles
        for (int i = 0; i < 4; ++i) {
          uint8_t& hi = w[48 + 2 * i + 1];
          hi = static_cast<uint8_t>((hi & 0x0F) | (((d >> (4 * i)) & 0xF) << 4));
        }
      } else {
        std::memcpy(w.data(), &d, 2);
      }
      for (int q : {127, -127}) {
        BlockQ8_K a;
        a.d = 1.0f;
        std::memset(a.qs, q & 0xFF, sizeof(a.qs));
        for (int g = 0; g < kQK_K / 16; ++g) a.bsums[g] = static_cast<int16_t>(16 * q);
        double want = 0;
        for (int e = 0; e < kQK_K; ++e) want += double(ElementOf(t, w.data(), e)) * q;
        float scalar = NAN;
        GetKernels(t, Isa::kScalar).vec_dot(kQK_K, &scalar, w.data(), &a);
        EXPECT_NEAR(scalar, want, 1e-6 * std::fabs(want) + 1e-30) << GgmlTypeName(t);
        for (Isa isa : SupportedIsas()) {
          float got = NAN;
          GetKernels(t, isa).vec_dot(kQK_K, &got, w.data(), &a);
          EXPECT_EQ(F32ToBits(got), F32ToBits(scalar))
              << GgmlTypeName(t) << " " << IsaName(isa) << " fill " << fill << " q " << q;
        }
      }
    }
  }
}

// The model's matmul path equals vec_dot bit for bit for every batch size (quant_random.h).
TEST(QuantIqLatticeMatMul, EqualsVecDotForEveryBatchSize) {
  ExpectMatMulEqualsVecDot({std::begin(kTypes), std::end(kTypes)});
}

}  // namespace
}  // namespace lamina
