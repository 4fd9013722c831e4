// K-quant kernels: dequantize against hand-built blocks and the format definitions, the Q8_K
// activation quantizer's contract, the scalar dots against a float reference, and every SIMD
// variant this CPU runs against its scalar twin.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "quant/kernel_registry.h"
#include "quant/quant.h"
#include "quant/types.h"
#include "util/cpu_features.h"
#include "util/fp16.h"

namespace lamina {
namespace {

using quant_internal::KernelTable;

// Tables built straight from the Register functions (scalar first, then an ISA's overrides), the
// same layering the dispatcher uses, so these tests do not depend on runtime ISA selection.
struct Tables {
  KernelTable scalar{};
  KernelTable avx2{};
  KernelTable avx512{};
  Tables() {
    quant_internal::RegisterScalarKQuants(scalar);
    quant_internal::RegisterScalarKQuants(avx2);
    quant_internal::RegisterAvx2KQuants(avx2);
    quant_internal::RegisterScalarKQuants(avx512);
    quant_internal::RegisterAvx512KQuants(avx512);
  }
};
const Tables& GetTables() {
  static const Tables tables;
  return tables;
}

bool CpuHasAvx2() { return GetCpuFeatures().HasAvx2Set(); }
bool CpuHasAvx512() { return GetCpuFeatures().HasAvx512Set(); }

const TypeKernels& Scalar(GgmlType t) { return GetTables().scalar[static_cast<int>(t)]; }

// ---------------------------------------------------------------------------------------------
// Independent per-element decoders written from the format definitions (element index -> value),
// deliberately not sharing the loop structure of the kernels.

// Splits weight e of a block into its scale part and its min/offset part (value = s + m), so the
// error budget can be stated in terms of the magnitudes the kernels actually add.
struct Parts {
  double s;
  double m;
};

void ScaleMin6(const uint8_t* q, int j, int* sc, int* mn) {
  if (j < 4) {
    *sc = q[j] & 63;
    *mn = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *mn = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

Parts ElementQ2K(const BlockQ2_K& b, int e) {
  const int byte = 32 * (e / 128) + e % 32;
  const int shift = 2 * ((e % 128) / 32);
  const int q = (b.qs[byte] >> shift) & 3;
  const int g = e / 16;
  return {double(Fp16ToF32(b.d)) * (b.scales[g] & 0xF) * q,
          -double(Fp16ToF32(b.dmin)) * (b.scales[g] >> 4)};
}

Parts ElementQ3K(const BlockQ3_K& b, int e) {
  const int byte = 32 * (e / 128) + e % 32;
  const int shift = 2 * ((e % 128) / 32);
  const int q = (b.qs[byte] >> shift) & 3;
  const int hbit = (b.hmask[e % 32] >> (e / 32)) & 1;
  const int g = e / 16;
  const int low4 = g < 8 ? (b.scales[g] & 0xF) : (b.scales[g - 8] >> 4);
  const int high2 = (b.scales[8 + g % 4] >> (2 * (g / 4))) & 3;
  const int scale = (low4 | (high2 << 4)) - 32;
  const double ds = double(Fp16ToF32(b.d)) * scale;
  return {ds * (q + 4 * hbit), -ds * 4};
}

Parts ElementQ4K(const BlockQ4_K& b, int e) {
  const int g = e / 32;
  const uint8_t byte = b.qs[32 * (e / 64) + e % 32];
  const int q = (g % 2 == 0) ? (byte & 0xF) : (byte >> 4);
  int sc, mn;
  ScaleMin6(b.scales, g, &sc, &mn);
  return {double(Fp16ToF32(b.d)) * sc * q, -double(Fp16ToF32(b.dmin)) * mn};
}

Parts ElementQ5K(const BlockQ5_K& b, int e) {
  const int g = e / 32;
  const uint8_t byte = b.qs[32 * (e / 64) + e % 32];
  const int hbit = (b.qh[e % 32] >> g) & 1;
  const int q = ((g % 2 == 0) ? (byte & 0xF) : (byte >> 4)) + 16 * hbit;
  int sc, mn;
  ScaleMin6(b.scales, g, &sc, &mn);
  return {double(Fp16ToF32(b.d)) * sc * q, -double(Fp16ToF32(b.dmin)) * mn};
}

Parts ElementQ6K(const BlockQ6_K& b, int e) {
  const int half = e / 128, r = e % 128;
  const int quarter = r / 32, l = r % 32;
  // Quarters 0/1 are the low nibbles of ql[l] / ql[l+32], quarters 2/3 the high nibbles.
  const uint8_t lbyte = b.ql[64 * half + l + 32 * (quarter % 2)];
  const int low = quarter < 2 ? (lbyte & 0xF) : (lbyte >> 4);
  const int high = (b.qh[32 * half + l] >> (2 * quarter)) & 3;
  const int q = low | (high << 4);
  const double ds = double(Fp16ToF32(b.d)) * b.scales[e / 16];
  return {ds * q, -ds * 32};
}

template <typename Block, Parts (*kElement)(const Block&, int)>
Parts ElementAt(const void* row, int64_t e) {
  return kElement(static_cast<const Block*>(row)[e / kQK_K], static_cast<int>(e % kQK_K));
}

Parts ElementOf(GgmlType t, const void* row, int64_t e) {
  switch (t) {
    case GgmlType::kQ2_K:
      return ElementAt<BlockQ2_K, ElementQ2K>(row, e);
    case GgmlType::kQ3_K:
      return ElementAt<BlockQ3_K, ElementQ3K>(row, e);
    case GgmlType::kQ4_K:
      return ElementAt<BlockQ4_K, ElementQ4K>(row, e);
    case GgmlType::kQ5_K:
      return ElementAt<BlockQ5_K, ElementQ5K>(row, e);
    case GgmlType::kQ6_K:
      return ElementAt<BlockQ6_K, ElementQ6K>(row, e);
    default:
      ADD_FAILURE() << "not a K weight type";
      return {0, 0};
  }
}

// ---------------------------------------------------------------------------------------------
// Hand-built blocks with values worked out by hand from the format definitions.

std::vector<float> Dequant(GgmlType t, const void* blocks, int64_t k) {
  std::vector<float> out(k);
  Scalar(t).dequantize(blocks, out.data(), k);
  return out;
}

TEST(KQuantDequantize, Q2KHandBuilt) {
  BlockQ2_K b{};
  b.d = F32ToFp16(0.5f);
  b.dmin = F32ToFp16(0.25f);
  b.scales[0] = 0x35;  // scale 5, min 3 for elements 0..15
  b.scales[6] = 0x12;  // scale 2, min 1 for elements 96..111
  b.qs[0] = 0xE4;      // 2-bit codes 0,1,2,3 for elements 0, 32, 64, 96
  const auto y = Dequant(GgmlType::kQ2_K, &b, kQK_K);
  EXPECT_EQ(y[0], 0.5f * 5 * 0 - 0.25f * 3);   // -0.75
  EXPECT_EQ(y[96], 0.5f * 2 * 3 - 0.25f * 1);  // 2.75
  EXPECT_EQ(y[32], 0.0f);                      // scale 0, min 0 (scales[2] == 0)
  EXPECT_EQ(y[1], -0.75f);                     // code 0 in group 0: just the min
}

TEST(KQuantDequantize, Q3KHandBuilt) {
  BlockQ3_K b{};
  b.d = F32ToFp16(0.25f);
  // Group 0: 6-bit scale 40 (low nibble 8 in scales[0], top bits 2 in scales[8] bits 0-1) -> +8.
  b.scales[0] = 0x08;
  b.scales[8] = 0x02;
  // Group 9: 6-bit scale 10 (high nibble of scales[1], top bits from scales[9] bits 4-5 = 0) ->
  // -22.
  b.scales[1] = 0xA0;
  b.qs[0] = 0x01;      // element 0: q2 = 1, hmask bit clear -> 1 - 4 = -3
  b.qs[48] = 0x03;     // element 144 (half 1, l = 16, shift 0): q2 = 3
  b.hmask[16] = 0x10;  // element 144's high bit is bit 4 (= 32-chunk 4) -> value 3
  const auto y = Dequant(GgmlType::kQ3_K, &b, kQK_K);
  EXPECT_EQ(y[0], -6.0f);     // 0.25 * 8 * -3
  EXPECT_EQ(y[144], -16.5f);  // 0.25 * -22 * 3
  EXPECT_EQ(y[1], -8.0f);     // 0.25 * 8 * (0 - 4)
  EXPECT_EQ(y[16], 32.0f);    // group 1 scale 0 - 32 = -32: 0.25 * -32 * -4
}

TEST(KQuantDequantize, Q4KHandBuilt) {
  BlockQ4_K b{};
  b.d = F32ToFp16(1.0f);
  b.dmin = F32ToFp16(0.5f);
  b.scales[0] = 3;         // scale 0
  b.scales[4] = 2;         // min 0
  b.scales[1] = 0x40 | 5;  // scale 1 = 5, top bits 01 feed scale 5
  b.scales[5] = 0x80 | 1;  // min 1 = 1, top bits 10 feed min 5
  b.scales[9] = 0x71;      // scale 5 low nibble 1, min 5 low nibble 7
  b.qs[0] = 0xA7;          // element 0 = 7, element 32 = 10
  b.qs[67] = 0xC0;         // element 163 (sub-block 5, high nibble) = 12
  const auto y = Dequant(GgmlType::kQ4_K, &b, kQK_K);
  EXPECT_EQ(y[0], 20.0f);     // 3*7 - 0.5*2
  EXPECT_EQ(y[32], 49.5f);    // 5*10 - 0.5*1
  EXPECT_EQ(y[163], 184.5f);  // (1 | 1<<4 = 17)*12 - 0.5*(7 | 2<<4 = 39)
  EXPECT_EQ(y[160], -19.5f);  // code 0 in sub-block 5
}

TEST(KQuantDequantize, Q5KHandBuilt) {
  BlockQ5_K b{};
  b.d = F32ToFp16(1.0f);
  b.dmin = F32ToFp16(0.5f);
  b.scales[0] = 3;
  b.scales[4] = 2;
  b.scales[1] = 0x40 | 5;
  b.scales[5] = 0x80 | 1;
  b.scales[9] = 0x71;
  b.qs[0] = 0xA7;
  b.qs[67] = 0xC0;
  b.qh[0] = 0x01;  // fifth bit for element 0 (sub-block 0 uses bit 0)
  b.qh[3] = 0x20;  // fifth bit for element 163 (sub-block 5 uses bit 5)
  const auto y = Dequant(GgmlType::kQ5_K, &b, kQK_K);
  EXPECT_EQ(y[0], 68.0f);     // 3*(7+16) - 1
  EXPECT_EQ(y[32], 49.5f);    // bit 1 of qh[0] clear
  EXPECT_EQ(y[163], 456.5f);  // 17*(12+16) - 19.5
}

TEST(KQuantDequantize, Q6KHandBuilt) {
  BlockQ6_K b{};
  b.d = F32ToFp16(0.5f);
  b.scales[0] = -3;
  b.scales[2] = 2;
  b.scales[4] = 7;
  b.scales[6] = -1;
  b.ql[0] = 0x5A;   // element 0 low 4 bits = 10, element 64 low 4 bits = 5
  b.ql[32] = 0x03;  // element 32 low 4 bits = 3, element 96 low 4 bits = 0
  b.qh[0] = 2 | (3 << 2) | (1 << 4) | (0 << 6);  // high 2 bits of elements 0, 32, 64, 96
  const auto y = Dequant(GgmlType::kQ6_K, &b, kQK_K);
  EXPECT_EQ(y[0], -15.0f);   // 0.5 * -3 * (42 - 32)
  EXPECT_EQ(y[32], 19.0f);   // 0.5 * 2 * (51 - 32)
  EXPECT_EQ(y[64], -38.5f);  // 0.5 * 7 * (21 - 32)
  EXPECT_EQ(y[96], 16.0f);   // 0.5 * -1 * (0 - 32)
}

TEST(KQuantDequantize, Q8KHandBuilt) {
  BlockQ8_K b{};
  b.d = 0.5f;
  b.qs[7] = -100;
  b.qs[255] = 127;
  const auto y = Dequant(GgmlType::kQ8_K, &b, kQK_K);
  EXPECT_EQ(y[7], -50.0f);
  EXPECT_EQ(y[255], 63.5f);
  EXPECT_EQ(y[0], 0.0f);
}

// ---------------------------------------------------------------------------------------------
// Random blocks: any bytes are valid codes and scales; d/dmin are kept small and finite.

std::vector<uint8_t> RandomBlocks(GgmlType t, int64_t nb, std::mt19937& rng) {
  const size_t bs = GetTypeTraits(t).type_size;
  std::vector<uint8_t> buf(nb * bs);
  std::uniform_int_distribution<int> byte(0, 255);
  for (auto& v : buf) v = static_cast<uint8_t>(byte(rng));
  std::uniform_real_distribution<float> scale(-0.05f, 0.05f);
  size_t half_off = 0;  // d, with dmin right after it when the type has one
  int n_halves = 2;
  switch (t) {
    case GgmlType::kQ2_K:
      half_off = offsetof(BlockQ2_K, d);
      break;
    case GgmlType::kQ3_K:
      half_off = offsetof(BlockQ3_K, d);
      n_halves = 1;
      break;
    case GgmlType::kQ4_K:
      half_off = offsetof(BlockQ4_K, d);
      break;
    case GgmlType::kQ5_K:
      half_off = offsetof(BlockQ5_K, d);
      break;
    case GgmlType::kQ6_K:
      half_off = offsetof(BlockQ6_K, d);
      n_halves = 1;
      break;
    default:
      ADD_FAILURE() << "not a K weight type";
  }
  for (int64_t i = 0; i < nb; ++i) {
    for (int h = 0; h < n_halves; ++h) {
      const fp16_t v = F32ToFp16(scale(rng));
      std::memcpy(buf.data() + i * bs + half_off + 2 * h, &v, 2);
    }
  }
  return buf;
}

std::vector<float> RandomFloats(int64_t n, std::mt19937& rng, float sigma = 1.0f) {
  std::normal_distribution<float> dist(0.f, sigma);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

constexpr GgmlType kWeightTypes[] = {GgmlType::kQ2_K, GgmlType::kQ3_K, GgmlType::kQ4_K,
                                     GgmlType::kQ5_K, GgmlType::kQ6_K};

TEST(KQuantDequantize, RandomBlocksMatchFormatDefinition) {
  std::mt19937 rng(1234);
  constexpr int64_t kNb = 8;
  for (GgmlType t : kWeightTypes) {
    SCOPED_TRACE(GgmlTypeName(t));
    const auto blocks = RandomBlocks(t, kNb, rng);
    const auto y = Dequant(t, blocks.data(), kNb * kQK_K);
    for (int64_t e = 0; e < kNb * kQK_K; ++e) {
      const Parts p = ElementOf(t, blocks.data(), e);
      // The kernels round each product to float; allow those roundings (a few ulps of the parts).
      const double tol = 4e-7 * (std::fabs(p.s) + std::fabs(p.m));
      ASSERT_NEAR(y[e], p.s + p.m, tol) << "element " << e;
    }
  }
}

TEST(KQuantKernels, TableEntries) {
  for (GgmlType t : kWeightTypes) {
    const TypeKernels& k = Scalar(t);
    EXPECT_EQ(k.type, t);
    EXPECT_EQ(k.vec_dot_type, GgmlType::kQ8_K);
    EXPECT_NE(k.dequantize, nullptr);
    EXPECT_NE(k.vec_dot, nullptr);
    EXPECT_NE(k.vec_dot_multi, nullptr);
  }
  const TypeKernels& q8 = Scalar(GgmlType::kQ8_K);
  EXPECT_EQ(q8.type, GgmlType::kQ8_K);
  EXPECT_NE(q8.quantize, nullptr);
  EXPECT_NE(q8.dequantize, nullptr);
  EXPECT_EQ(q8.vec_dot, nullptr);
}

// ---------------------------------------------------------------------------------------------
// Q8_K activation quantizer (GGML's quantize_row_q8_K_ref: iscale = -127/max, codes clamped at 127
// from above only, d = 1/iscale, bsums of 16 codes).

std::vector<BlockQ8_K> QuantizeQ8K(const std::vector<float>& x) {
  std::vector<BlockQ8_K> q(x.size() / kQK_K);
  Scalar(GgmlType::kQ8_K).quantize(x.data(), q.data(), static_cast<int64_t>(x.size()));
  return q;
}

TEST(KQuantQ8K, CodesBsumsAndRoundTrip) {
  std::mt19937 rng(99);
  const auto x = RandomFloats(16 * kQK_K, rng, 3.0f);
  const auto q = QuantizeQ8K(x);
  for (size_t i = 0; i < q.size(); ++i) {
    float amax = 0, max = 0;
    for (int j = 0; j < kQK_K; ++j) {
      const float v = x[i * kQK_K + j];
      if (std::fabs(v) > amax) {
        amax = std::fabs(v);
        max = v;
      }
    }
    EXPECT_FLOAT_EQ(q[i].d, -max / 127.f);
    for (int j = 0; j < kQK_K; ++j) {
      const int c = q[i].qs[j];
      EXPECT_GE(c, -127);
      EXPECT_LE(c, 127);
      const float v = x[i * kQK_K + j];
      if (v == max) {
        EXPECT_EQ(c, -127);  // the largest magnitude maps to -127 by construction
      }
      // Nearest rounding: the reconstruction is within half a step (plus float slack).
      EXPECT_LE(std::fabs(q[i].d * c - v), 0.5f * std::fabs(q[i].d) * 1.0001f + 1e-7f);
    }
    for (int g = 0; g < 16; ++g) {
      int sum = 0;
      for (int l = 0; l < 16; ++l) sum += q[i].qs[16 * g + l];
      EXPECT_EQ(q[i].bsums[g], sum);
    }
  }
}

TEST(KQuantQ8K, KnownValuesAndZeroBlock) {
  std::vector<float> x(2 * kQK_K, 0.f);
  x[3] = 127.f;   // max: iscale = -127/127 = -1 exactly, d = -1
  x[4] = -63.5f;  // 63.5 rounds half to even -> 64
  x[5] = 0.5f;    // -0.5 rounds half to even -> 0
  x[20] = 50.f;   // -50, in group 1
  const auto q = QuantizeQ8K(x);
  EXPECT_EQ(q[0].d, -1.0f);
  EXPECT_EQ(q[0].qs[3], -127);
  EXPECT_EQ(q[0].qs[4], 64);
  EXPECT_EQ(q[0].qs[5], 0);
  EXPECT_EQ(q[0].qs[20], -50);
  EXPECT_EQ(q[0].bsums[0], -127 + 64);
  EXPECT_EQ(q[0].bsums[1], -50);
  // An all-zero block is all zeros, bsums included.
  EXPECT_EQ(q[1].d, 0.f);
  for (int j = 0; j < kQK_K; ++j) EXPECT_EQ(q[1].qs[j], 0);
  for (int g = 0; g < 16; ++g) EXPECT_EQ(q[1].bsums[g], 0);
}

// ---------------------------------------------------------------------------------------------
// Dot products.

// Error budget: the integer sums inside a super-block are exact in every variant, so variants
// differ only in how the per-block float terms d*isum and dmin*summs are added (about nb + 8
// additions, each off by <= 2^-24 relative). Budget: 2e-6 * M, where
// M = sum_i (|s_i| + |m_i|) * |a_i| with s_i / m_i the scale and min (or offset) parts of weight i
// and a_i the dequantized activation; observed worst case over 200 random k=4096 rows per type is
// about 2e-8 * sum_i |w_i * a_i|. The scalar twin against a double-precision dot of the format
// definition has the same budget (its float products round each part once more).
constexpr double kRelBudget = 2e-6;

struct DotCase {
  std::vector<uint8_t> w;
  std::vector<uint8_t> act;  // n_rows rows of Q8_K, stride act_stride bytes
  size_t act_stride;
  int64_t k;
};

DotCase MakeCase(GgmlType t, int64_t k, int n_rows, std::mt19937& rng) {
  DotCase c;
  c.k = k;
  c.w = RandomBlocks(t, k / kQK_K, rng);
  // A gap between rows checks that act_row_bytes is honoured.
  c.act_stride = RowSize(GgmlType::kQ8_K, k) + sizeof(BlockQ8_K);
  c.act.assign(c.act_stride * n_rows, 0xCD);
  for (int r = 0; r < n_rows; ++r) {
    const auto x = RandomFloats(k, rng);
    Scalar(GgmlType::kQ8_K).quantize(x.data(), c.act.data() + r * c.act_stride, k);
  }
  return c;
}

// Exact (double) dot from the format definition, and the magnitude M of the budget.
void ReferenceDot(GgmlType t, const DotCase& c, int row, double* dot, double* mag) {
  const auto* y = reinterpret_cast<const BlockQ8_K*>(c.act.data() + row * c.act_stride);
  *dot = 0;
  *mag = 0;
  for (int64_t e = 0; e < c.k; ++e) {
    const Parts p = ElementOf(t, c.w.data(), e);
    const double a = double(y[e / kQK_K].d) * y[e / kQK_K].qs[e % kQK_K];
    *dot += (p.s + p.m) * a;
    *mag += (std::fabs(p.s) + std::fabs(p.m)) * std::fabs(a);
  }
}

TEST(KQuantDot, ScalarMatchesFormatDefinition) {
  std::mt19937 rng(7);
  for (GgmlType t : kWeightTypes) {
    for (int64_t k : {kQK_K, 16 * kQK_K}) {
      SCOPED_TRACE(std::string(GgmlTypeName(t)) + " k=" + std::to_string(k));
      const DotCase c = MakeCase(t, k, 1, rng);
      double ref, mag;
      ReferenceDot(t, c, 0, &ref, &mag);
      float got = NAN;
      Scalar(t).vec_dot(k, &got, c.w.data(), c.act.data());
      EXPECT_NEAR(got, ref, kRelBudget * mag + 1e-30);
    }
  }
}

TEST(KQuantDot, ScalarMultiIsLoopOfVecDot) {
  std::mt19937 rng(8);
  for (GgmlType t : kWeightTypes) {
    SCOPED_TRACE(GgmlTypeName(t));
    const DotCase c = MakeCase(t, 4 * kQK_K, kMaxMultiDot, rng);
    float multi[kMaxMultiDot];
    Scalar(t).vec_dot_multi(c.k, c.w.data(), c.act.data(), c.act_stride, kMaxMultiDot, multi);
    for (int r = 0; r < kMaxMultiDot; ++r) {
      float single;
      Scalar(t).vec_dot(c.k, &single, c.w.data(), c.act.data() + r * c.act_stride);
      EXPECT_EQ(multi[r], single);
    }
  }
}

void CheckSimdTwin(const KernelTable& table, const char* isa) {
  std::mt19937 rng(42);
  for (GgmlType t : kWeightTypes) {
    const TypeKernels& simd = table[static_cast<int>(t)];
    ASSERT_NE(simd.vec_dot, Scalar(t).vec_dot)
        << isa << " " << GgmlTypeName(t) << " not vectorized";
    for (int64_t k : {kQK_K, 16 * kQK_K}) {
      SCOPED_TRACE(std::string(isa) + " " + GgmlTypeName(t) + " k=" + std::to_string(k));
      const DotCase c = MakeCase(t, k, kMaxMultiDot, rng);
      float scalar[kMaxMultiDot];
      double mag[kMaxMultiDot];
      for (int r = 0; r < kMaxMultiDot; ++r) {
        Scalar(t).vec_dot(k, &scalar[r], c.w.data(), c.act.data() + r * c.act_stride);
        double ref;
        ReferenceDot(t, c, r, &ref, &mag[r]);
        float single;
        simd.vec_dot(k, &single, c.w.data(), c.act.data() + r * c.act_stride);
        EXPECT_NEAR(single, scalar[r], kRelBudget * mag[r] + 1e-30) << "row " << r;
      }
      for (int n_act = 1; n_act <= kMaxMultiDot; ++n_act) {
        float out[kMaxMultiDot + 1];
        out[n_act] = 12345.f;  // must not be written
        simd.vec_dot_multi(k, c.w.data(), c.act.data(), c.act_stride, n_act, out);
        for (int r = 0; r < n_act; ++r) {
          EXPECT_NEAR(out[r], scalar[r], kRelBudget * mag[r] + 1e-30)
              << "n_act " << n_act << " row " << r;
          // The multi kernel runs each row through the same operations as vec_dot.
          float single;
          simd.vec_dot(k, &single, c.w.data(), c.act.data() + r * c.act_stride);
          EXPECT_EQ(out[r], single) << "n_act " << n_act << " row " << r;
        }
        EXPECT_EQ(out[n_act], 12345.f);
      }
    }
  }
}

TEST(KQuantDot, Avx2MatchesScalarTwin) {
  if (!CpuHasAvx2()) GTEST_SKIP() << "CPU lacks AVX2/FMA/F16C";
  CheckSimdTwin(GetTables().avx2, "avx2");
}

TEST(KQuantDot, Avx512MatchesScalarTwin) {
  if (!CpuHasAvx512()) GTEST_SKIP() << "CPU lacks AVX-512 F/BW/VL/DQ/VNNI";
  CheckSimdTwin(GetTables().avx512, "avx512");
}

// Extreme codes: every weight and activation code at its largest magnitude, to catch int16
// saturation in the maddubs path (Q8_K codes are in [-127, 127]).
TEST(KQuantDot, SimdExtremeCodes) {
  for (const KernelTable* table : {&GetTables().avx2, &GetTables().avx512}) {
    if (table == &GetTables().avx2 && !CpuHasAvx2()) continue;
    if (table == &GetTables().avx512 && !CpuHasAvx512()) continue;
    for (GgmlType t : kWeightTypes) {
      for (int sign : {-1, 1}) {
        SCOPED_TRACE(std::string(GgmlTypeName(t)) + (sign > 0 ? " +" : " -"));
        const size_t bs = GetTypeTraits(t).type_size;
        std::vector<uint8_t> w(bs, 0xFF);
        // Every byte 0xFF (largest codes and scales) except d/dmin, taken from a random block
        // so they stay finite.
        std::mt19937 rng(5);
        const auto d_blocks = RandomBlocks(t, 1, rng);
        for (size_t off = 0; off < bs; ++off) {
          bool is_half = false;
          switch (t) {
            case GgmlType::kQ2_K:
              is_half = off >= offsetof(BlockQ2_K, d);
              break;
            case GgmlType::kQ3_K:
              is_half = off >= offsetof(BlockQ3_K, d);
              break;
            case GgmlType::kQ4_K:
              is_half = off < offsetof(BlockQ4_K, scales);
              break;
            case GgmlType::kQ5_K:
              is_half = off < offsetof(BlockQ5_K, scales);
              break;
            case GgmlType::kQ6_K:
              is_half = off >= offsetof(BlockQ6_K, d);
              break;
            default:
              break;
          }
          if (is_half) w[off] = d_blocks[off];
        }
        if (t == GgmlType::kQ6_K) {
          // Scale -128 is the int8 extreme.
          for (int j = 0; j < 16; ++j) reinterpret_cast<BlockQ6_K*>(w.data())->scales[j] = -128;
        }
        std::vector<float> x(kQK_K, sign * 1.0f);
        BlockQ8_K act;
        Scalar(GgmlType::kQ8_K).quantize(x.data(), &act, kQK_K);
        float want, got;
        Scalar(t).vec_dot(kQK_K, &want, w.data(), &act);
        (*table)[static_cast<int>(t)].vec_dot(kQK_K, &got, w.data(), &act);
        EXPECT_NEAR(got, want, 1e-5 * std::fabs(want) + 1e-30);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Weight quantizers (Q4_K, Q5_K, Q6_K): codes decode back close to the input.

TEST(KQuantQuantize, RoundTrip) {
  std::mt19937 rng(3);
  const auto x = RandomFloats(8 * kQK_K, rng, 0.02f);
  // Typical relative RMS error of the reference quantizers on Gaussian data, with margin.
  const struct {
    GgmlType t;
    double max_rel_rms;
  } cases[] = {{GgmlType::kQ4_K, 0.12}, {GgmlType::kQ5_K, 0.06}, {GgmlType::kQ6_K, 0.03}};
  for (const auto& c : cases) {
    SCOPED_TRACE(GgmlTypeName(c.t));
    const TypeKernels& k = Scalar(c.t);
    ASSERT_NE(k.quantize, nullptr);
    std::vector<uint8_t> q(RowSize(c.t, x.size()));
    k.quantize(x.data(), q.data(), static_cast<int64_t>(x.size()));
    std::vector<float> y(x.size());
    k.dequantize(q.data(), y.data(), static_cast<int64_t>(x.size()));
    double err = 0, ref = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      err += (x[i] - y[i]) * (x[i] - y[i]);
      ref += x[i] * x[i];
    }
    EXPECT_LT(std::sqrt(err / ref), c.max_rel_rms);
  }
}

TEST(KQuantQuantize, ZeroInputIsZero) {
  const std::vector<float> x(kQK_K, 0.f);
  for (GgmlType t : {GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K}) {
    std::vector<uint8_t> q(RowSize(t, kQK_K), 0xAB);
    Scalar(t).quantize(x.data(), q.data(), kQK_K);
    std::vector<float> y(kQK_K, 1.f);
    Scalar(t).dequantize(q.data(), y.data(), kQK_K);
    for (float v : y) EXPECT_EQ(v, 0.f) << GgmlTypeName(t);
  }
}

}  // namespace
}  // namespace lamina
