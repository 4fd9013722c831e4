// The interleaved weight layouts (Q8_0, Q4_0, IQ4_NL, MXFP4 and NVFP4 as BlockQ8_0x16 /
// BlockQ4_0x16 / BlockIQ4_NLx16 / BlockMXFP4x16 / BlockNVFP4x16, repacked at load): every ISA's
// kernel gives the scalar vec_dot of the row before repacking bit for bit, for every batch size
// and place in the batch, and writes nothing past its tile; the matmul on an interleaved matrix
// (whole groups, and a row range cutting groups) equals that too; Q4_K, Q5_K, Q6_K and IQ4_XS
// (BlockQ4_Kx16 / BlockQ5_Kx16 / BlockQ6_Kx16 / BlockIQ4_XSx16) give their scalar twin's bits the
// same way, within the K-quant bound of vec_dot; Q5_0 (BlockQ5_0x16) gives the vec_dot of its own
// ISA; the loader repacks a model's matmul weights (gpt-oss's MXFP4 expert stacks too) and keeps
// the embedding as rows. Q1_0 and Q2_0 (BlockQ1_0x16 / BlockQ2_0x16, repacked where their ISA has
// a kernel: scalar and AVX-512) give the scalar vec_dot's bits for 1..64 tokens and row ranges
// cutting groups, and their fixture files load repacked with the plain rows' bits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <random>
#include <vector>

#include "gguf/gguf.h"
#include "kernels/matmul.h"
#include "model/weight_loader.h"
#include "quant/kernel_registry.h"
#include "quant/quant.h"
#include "quant_random.h"
#include "util/thread_pool.h"

namespace lamina {
namespace {

constexpr GgmlType kQ8 = GgmlType::kQ8_0;  // the activations' type
constexpr GgmlType kTypes[] = {GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kIQ4_NL,
                               GgmlType::kMXFP4, GgmlType::kNVFP4};

// Row lengths to test: one block, an odd block count, and a longer row (NVFP4 blocks are 64).
std::vector<int64_t> TestKs(GgmlType type) {
  if (GetTypeTraits(type).block_size == kQKNvfp4) return {64, 320, 1024};
  return {32, 352, 1024};
}

// n_act rows of activations as the matmul makes them: Q8_0 (scalar quantizer) then widened.
struct Acts {
  std::vector<uint8_t> q8;    // [n][RowSize(Q8_0, k)]
  std::vector<uint8_t> wide;  // [n][k / 32] BlockQ8_0Act
  size_t q8_row = 0, wide_row = 0;
};
Acts MakeActs(int64_t k, int n, std::mt19937& rng) {
  Acts a;
  a.q8_row = RowSize(kQ8, k);
  a.wide_row = static_cast<size_t>(k / kQK) * sizeof(BlockQ8_0Act);
  a.q8.resize(a.q8_row * n);
  a.wide.resize(a.wide_row * n);
  for (int j = 0; j < n; ++j) {
    const std::vector<float> x = RandomFloats(k, rng);
    GetKernels(kQ8, Isa::kScalar).quantize(x.data(), a.q8.data() + j * a.q8_row, k);
    Q8_0ToAct(a.q8.data() + j * a.q8_row, a.wide.data() + j * a.wide_row, k);
  }
  return a;
}

// kern.gemm_interleaved over one group of kQ8_0x16Rows rows, for every call of 1..max_tokens
// tokens starting at every offset of a's kMaxMultiDot rows, gives want's bits and writes nothing
// past the group's rows or the call's tokens.
void ExpectGemmCallsEqual(const TypeKernels& kern, Isa isa, int64_t k, const uint8_t* group,
                          const Acts& a, const float (&want)[kMaxMultiDot][kQ8_0x16Rows],
                          int max_tokens) {
  const int g = kQ8_0x16Rows;
  for (int n = 1; n <= max_tokens; ++n) {
    // Tokens start at every offset 0..kMaxMultiDot - n, so a token's place varies too.
    for (int t0 = 0; t0 + n <= kMaxMultiDot; ++t0) {
      const size_t stride = g + 3;
      std::vector<float> out(stride * (n + 1), -12345.0f);  // [n + 1][stride]
      kern.gemm_interleaved(k, group, a.wide.data() + t0 * a.wide_row, a.wide_row, n, out.data(),
                            stride);
      for (int t = 0; t < n; ++t) {
        for (int r = 0; r < g; ++r) {
          ASSERT_EQ(F32ToBits(out[t * stride + r]), F32ToBits(want[t0 + t][r]))
              << IsaName(isa) << " k " << k << " n " << n << " token " << t0 + t << " row " << r;
        }
        for (size_t r = g; r < stride; ++r) ASSERT_EQ(out[t * stride + r], -12345.0f);
      }
      for (size_t r = 0; r < stride; ++r) ASSERT_EQ(out[n * stride + r], -12345.0f);
    }
  }
}

void ExpectKernelEqualsScalarVecDot(GgmlType type, std::mt19937& rng) {
  SCOPED_TRACE(GgmlTypeName(type));
  const TypeKernels& scalar = GetKernels(type, Isa::kScalar);
  const int g = scalar.interleave_rows;
  ASSERT_EQ(g, kQ8_0x16Rows);
  for (const int64_t k : TestKs(type)) {
    const size_t row_bytes = RowSize(type, k);
    // Every byte value as a code (Q8_0: -128 included), sane scales.
    std::vector<uint8_t> rows = RandomWeightRow(type, k * g, rng);  // [g][row_bytes]
    if (k == 1024 && (type == GgmlType::kMXFP4 || type == GgmlType::kNVFP4)) {
      // Every scale code the kernels decode themselves: MXFP4's E8M0 exponents 0..200 (0 and 1
      // the f32 subnormals; larger ones overflow the products), NVFP4's 256 UE4M3 codes.
      const size_t bs = GetTypeTraits(type).type_size;
      for (size_t b = 0; b < rows.size() / bs; ++b) {
        if (type == GgmlType::kMXFP4) rows[b * bs] = static_cast<uint8_t>(b % 201);
        for (size_t s = 0; type == GgmlType::kNVFP4 && s < 4; ++s)
          rows[b * bs + s] = static_cast<uint8_t>((4 * b + s) % 256);
      }
    }
    std::vector<uint8_t> group(rows.size());  // one interleaved group of the g rows
    scalar.repack(rows.data(), row_bytes, k, group.data());
    const Acts a = MakeActs(k, kMaxMultiDot, rng);
    float want[kMaxMultiDot][kQ8_0x16Rows];  // [token][row]
    for (int t = 0; t < kMaxMultiDot; ++t) {
      for (int r = 0; r < g; ++r) {
        scalar.vec_dot(k, &want[t][r], rows.data() + r * row_bytes, a.q8.data() + t * a.q8_row);
      }
    }
    for (Isa isa : SupportedIsas()) {
      const TypeKernels& kern = GetKernels(type, isa);
      ASSERT_NE(kern.gemm_interleaved, nullptr);
      if (isa != Isa::kScalar) {
        EXPECT_NE(kern.gemm_interleaved, scalar.gemm_interleaved);
      }
      ExpectGemmCallsEqual(kern, isa, k, group.data(), a, want, kMaxMultiDot);
    }
  }
}

TEST(Interleaved, KernelEqualsScalarVecDotBitForBit) {
  std::mt19937 rng(23);
  for (GgmlType t : kTypes) ExpectKernelEqualsScalarVecDot(t, rng);
}

// Prompt-sized calls (up to the kernel's gemm_max_tokens: the AVX2 kernels split each block's
// codes once per call from kAvx2WideMinTokens tokens and run tiles of 4 or 6 tokens from them,
// Q5_0's tiles of 8): every token gets the bits of its vec_dot (Q5_0: the ISA's own, the others
// the scalar one), whatever the call's size and the token's place.
void ExpectPromptBatchesEqualVecDot(GgmlType type, std::mt19937& rng) {
  SCOPED_TRACE(GgmlTypeName(type));
  const TypeKernels& scalar = GetKernels(type, Isa::kScalar);
  const int g = scalar.interleave_rows;
  ASSERT_EQ(g, kQ8_0x16Rows);
  for (const int64_t k : TestKs(type)) {
    const size_t row_bytes = RowSize(type, k);
    const std::vector<uint8_t> rows = RandomWeightRow(type, k * g, rng);  // [g][row_bytes]
    std::vector<uint8_t> group(rows.size());  // one interleaved group of the g rows
    scalar.repack(rows.data(), row_bytes, k, group.data());
    const int n_max = kMaxGemmTokens + 3;
    const Acts a = MakeActs(k, n_max, rng);
    for (Isa isa : SupportedIsas()) {
      const TypeKernels& kern = GetKernels(type, isa);
      const TypeKernels& ref = type == GgmlType::kQ5_0 ? kern : scalar;
      std::vector<float> want(static_cast<size_t>(n_max) * g);  // [token][row]
      for (int t = 0; t < n_max; ++t) {
        for (int r = 0; r < g; ++r) {
          ref.vec_dot(k, &want[t * g + r], rows.data() + r * row_bytes, a.q8.data() + t * a.q8_row);
        }
      }
      ASSERT_GE(kern.gemm_max_tokens, kMaxMultiDot);
      ASSERT_LE(kern.gemm_max_tokens, kMaxGemmTokens);
      for (const int n : {9, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 37, 100, kMaxGemmTokens}) {
        if (n > kern.gemm_max_tokens) continue;
        for (const int t0 : {0, 3}) {
          const size_t stride = g + 3;
          std::vector<float> out(stride * (n + 1), -12345.0f);  // [n + 1][stride]
          kern.gemm_interleaved(k, group.data(), a.wide.data() + t0 * a.wide_row, a.wide_row, n,
                                out.data(), stride);
          for (int t = 0; t < n; ++t) {
            for (int r = 0; r < g; ++r) {
              ASSERT_EQ(F32ToBits(out[t * stride + r]), F32ToBits(want[(t0 + t) * g + r]))
                  << IsaName(isa) << " k " << k << " n " << n << " token " << t0 + t << " row "
                  << r;
            }
            for (size_t r = g; r < stride; ++r) ASSERT_EQ(out[t * stride + r], -12345.0f);
          }
          for (size_t r = 0; r < stride; ++r) ASSERT_EQ(out[n * stride + r], -12345.0f);
        }
      }
    }
  }
}

TEST(Interleaved, PromptBatchesEqualVecDotBitForBit) {
  std::mt19937 rng(31);
  for (GgmlType t : kTypes) ExpectPromptBatchesEqualVecDot(t, rng);
  ExpectPromptBatchesEqualVecDot(GgmlType::kQ5_0, rng);
}

// The matmul over the interleaved copy `w` of `plain`, for each token count and each row range
// [lo, hi), writes exactly the rows of the range, each the scalar vec_dot of the plain row
// against Q8_0 activations.
void ExpectRangesEqualScalarVecDot(const WeightMatrix& w, const WeightMatrix& plain,
                                   std::initializer_list<int64_t> token_counts,
                                   std::initializer_list<std::pair<int64_t, int64_t>> ranges,
                                   std::mt19937& rng, ThreadPool& pool) {
  const GgmlType type = plain.type;
  const int64_t rows = plain.rows, cols = plain.cols;
  for (int64_t n_tokens : token_counts) {
    const std::vector<float> x = RandomFloats(n_tokens * cols, rng);
    for (auto [lo, hi] : ranges) {
      std::vector<float> y(static_cast<size_t>(n_tokens * rows), NAN);  // [n_tokens, rows]
      MatMulScratch scratch;
      MatMulRows(w, lo, hi, x.data(), cols, n_tokens, y.data(), rows, scratch, pool);
      std::vector<uint8_t> a(RowSize(kQ8, cols));
      for (int64_t j = 0; j < n_tokens; ++j) {
        GetKernels(kQ8).quantize(x.data() + j * cols, a.data(), cols);
        for (int64_t r = 0; r < rows; ++r) {
          const float got = y[j * rows + r];
          if (r < lo || r >= hi) {
            ASSERT_TRUE(std::isnan(got)) << "wrote row " << r << " outside the range";
            continue;
          }
          float want = 0.0f;
          GetKernels(type, Isa::kScalar).vec_dot(cols, &want, plain.Row(r), a.data());
          ASSERT_EQ(F32ToBits(got), F32ToBits(want))
              << "tokens " << n_tokens << " token " << j << " row " << r;
        }
      }
    }
  }
}

// The matmul over an interleaved copy equals the scalar vec_dot of the plain rows (so decode,
// prompt batches of any size, and a row range all give the same bits).
void ExpectMatMulEqualsScalarVecDot(GgmlType type, std::mt19937& rng, ThreadPool& pool) {
  SCOPED_TRACE(GgmlTypeName(type));
  const int64_t rows = 48, cols = TestKs(type)[1];
  const std::vector<uint8_t> data = RandomWeightRow(type, rows * cols, rng);
  const WeightMatrix plain{type, rows, cols, RowSize(type, cols), data.data()};
  ASSERT_TRUE(CanInterleave(plain));
  std::vector<uint8_t> buf(data.size());  // the interleaved copy: [rows / 16 groups]
  const WeightMatrix w = InterleaveInto(plain, buf.data());
  EXPECT_EQ(w.interleave, kQ8_0x16Rows);
  EXPECT_FALSE(CanInterleave(w));
  const WeightMatrix odd{type, rows - 8, cols, RowSize(type, cols), data.data()};
  EXPECT_FALSE(CanInterleave(odd));
  ExpectRangesEqualScalarVecDot(w, plain, {1, 3, 20, 37, 130}, {{0, rows}, {5, 27}, {16, 32}}, rng,
                                pool);
}

TEST(Interleaved, MatMulEqualsScalarVecDot) {
  std::mt19937 rng(29);
  ThreadPool pool(2);
  for (GgmlType t : kTypes) ExpectMatMulEqualsScalarVecDot(t, rng, pool);
}

// ---------------------------------------------------------------------------------------------
// Q4_K, Q5_K, Q6_K and IQ4_XS (BlockQ4_Kx16 / BlockQ5_Kx16 / BlockQ6_Kx16 / BlockIQ4_XSx16, Q8_K
// activations): the scalar twin's canonical order differs from vec_dot's (eight float lanes;
// IQ4_XS: a float term per 32-value group), so every ISA's kernel must give the scalar twin's bits
// for every batch size and place, and the twin must stay within the K-quant dot bound of vec_dot.

constexpr GgmlType kKTypes[] = {GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K,
                                GgmlType::kIQ4_XS};

// Random K-quant rows: every code and scale byte random, d and dmin sane f16 values.
std::vector<uint8_t> RandomKRows(GgmlType t, int64_t n, std::mt19937& rng) {
  std::vector<uint8_t> rows(RowSize(t, n));
  std::uniform_int_distribution<int> byte(0, 255);
  for (uint8_t& v : rows) v = static_cast<uint8_t>(byte(rng));
  std::uniform_real_distribution<float> scale(-0.05f, 0.05f);
  const size_t bs = GetTypeTraits(t).type_size;
  for (size_t off = 0; off < rows.size(); off += bs) {
    const fp16_t d = F32ToFp16(scale(rng)), dmin = F32ToFp16(scale(rng));
    if (t == GgmlType::kIQ4_XS) {
      std::memcpy(rows.data() + off + offsetof(BlockIQ4_XS, d), &d, 2);
    } else if (t != GgmlType::kQ6_K) {  // Q5_K: d and dmin where Q4_K has them
      std::memcpy(rows.data() + off + offsetof(BlockQ4_K, d), &d, 2);
      std::memcpy(rows.data() + off + offsetof(BlockQ4_K, dmin), &dmin, 2);
    } else {
      std::memcpy(rows.data() + off + offsetof(BlockQ6_K, d), &d, 2);
    }
  }
  return rows;
}

// The budget's magnitude M = sum_i (|s_i| + |m_i|) |a_i| of one row (quant_kquants_test.cpp):
// s the scale part of weight i, m its min (Q4_K) or offset (Q6_K) part, a the activation
// (IQ4_XS: m = 0, s the value).
double DotMagnitude(GgmlType t, const uint8_t* row, int64_t k, const BlockQ8_K* a) {
  if (t == GgmlType::kIQ4_XS) {
    const std::vector<float> v = Dequantize(t, row, k);
    double mag = 0;
    for (int64_t e = 0; e < k; ++e) {
      mag += std::fabs(double(v[e]) * a[e / kQK_K].d * a[e / kQK_K].qs[e % kQK_K]);
    }
    return mag;
  }
  std::vector<uint8_t> only_m(row, row + RowSize(t, k)), only_s = only_m;
  const size_t bs = GetTypeTraits(t).type_size;
  for (int64_t i = 0; i < k / kQK_K; ++i) {
    uint8_t* bm = only_m.data() + i * bs;
    uint8_t* bsc = only_s.data() + i * bs;
    if (t != GgmlType::kQ6_K) {  // d = 0 keeps -dmin * mn, dmin = 0 keeps d * sc * q
      std::memset(bm + offsetof(BlockQ4_K, d), 0, 2);
      std::memset(bsc + offsetof(BlockQ4_K, dmin), 0, 2);
    } else {  // codes 0 keep -32 * d * sc
      std::memset(bm + offsetof(BlockQ6_K, ql), 0, kQK_K / 2 + kQK_K / 4);
    }
  }
  const std::vector<float> v = Dequantize(t, row, k), m = Dequantize(t, only_m.data(), k);
  const std::vector<float> s =
      t != GgmlType::kQ6_K ? Dequantize(t, only_s.data(), k) : std::vector<float>();
  double mag = 0;
  for (int64_t e = 0; e < k; ++e) {
    const double sp = t != GgmlType::kQ6_K ? s[e] : double(v[e]) - m[e];
    mag +=
        (std::fabs(sp) + std::fabs(m[e])) * std::fabs(a[e / kQK_K].d * a[e / kQK_K].qs[e % kQK_K]);
  }
  return mag;
}

constexpr double kKRelBudget = 2e-6;  // quant_kquants_test.cpp's kRelBudget

struct KActs {
  std::vector<uint8_t> q8k;  // [n][q8k_row]
  size_t q8k_row = 0;
  const BlockQ8_K* Row(int t) const {
    return reinterpret_cast<const BlockQ8_K*>(q8k.data() + t * q8k_row);
  }
};
KActs MakeKActs(int64_t k, int n, std::mt19937& rng) {
  KActs a;
  a.q8k_row = RowSize(GgmlType::kQ8_K, k) + sizeof(BlockQ8_K);  // a gap between rows
  a.q8k.assign(a.q8k_row * n, 0xCD);
  for (int j = 0; j < n; ++j) {
    const std::vector<float> x = RandomFloats(k, rng);
    GetKernels(GgmlType::kQ8_K, Isa::kScalar).quantize(x.data(), a.q8k.data() + j * a.q8k_row, k);
  }
  return a;
}

void ExpectKKernelsEqualScalarTwin(GgmlType type, std::mt19937& rng) {
  SCOPED_TRACE(GgmlTypeName(type));
  const TypeKernels& scalar = GetKernels(type, Isa::kScalar);
  const int g = scalar.interleave_rows;
  ASSERT_EQ(g, kQ8_0x16Rows);
  for (const int64_t k : {kQK_K, 3 * kQK_K, 8 * kQK_K}) {
    const size_t row_bytes = RowSize(type, k);
    const std::vector<uint8_t> rows = RandomKRows(type, k * g, rng);  // [g][row_bytes]
    std::vector<uint8_t> group(rows.size());
    scalar.repack(rows.data(), row_bytes, k, group.data());
    const KActs a = MakeKActs(k, kMaxMultiDot, rng);
    float want[kMaxMultiDot][kQ8_0x16Rows];  // [token][row]: the scalar twin, one token at a time
    for (int t = 0; t < kMaxMultiDot; ++t) {
      scalar.gemm_interleaved(k, group.data(), a.Row(t), a.q8k_row, 1, want[t], g);
      for (int r = 0; r < g; ++r) {
        float ref = 0.0f;
        scalar.vec_dot(k, &ref, rows.data() + r * row_bytes, a.Row(t));
        const double mag = DotMagnitude(type, rows.data() + r * row_bytes, k, a.Row(t));
        ASSERT_NEAR(want[t][r], ref, 2 * kKRelBudget * mag + 1e-30)
            << "k " << k << " token " << t << " row " << r;
      }
    }
    for (Isa isa : SupportedIsas()) {
      const TypeKernels& kern = GetKernels(type, isa);
      ASSERT_NE(kern.gemm_interleaved, nullptr);
      if (isa != Isa::kScalar) {
        EXPECT_NE(kern.gemm_interleaved, scalar.gemm_interleaved);
      }
      for (int n = 1; n <= kMaxMultiDot; ++n) {
        for (int t0 = 0; t0 + n <= kMaxMultiDot; ++t0) {
          const size_t stride = g + 3;
          std::vector<float> out(stride * (n + 1), -12345.0f);  // [n + 1][stride]
          kern.gemm_interleaved(k, group.data(), a.Row(t0), a.q8k_row, n, out.data(), stride);
          for (int t = 0; t < n; ++t) {
            for (int r = 0; r < g; ++r) {
              ASSERT_EQ(F32ToBits(out[t * stride + r]), F32ToBits(want[t0 + t][r]))
                  << IsaName(isa) << " k " << k << " n " << n << " token " << t0 + t << " row "
                  << r;
            }
            for (size_t r = g; r < stride; ++r) ASSERT_EQ(out[t * stride + r], -12345.0f);
          }
          for (size_t r = 0; r < stride; ++r) ASSERT_EQ(out[n * stride + r], -12345.0f);
        }
      }
    }
  }
}

TEST(InterleavedK, KernelsEqualScalarTwinBitForBit) {
  std::mt19937 rng(37);
  for (GgmlType t : kKTypes) ExpectKKernelsEqualScalarTwin(t, rng);
}

// Prompt-sized calls (up to the kernel's gemm_max_tokens, where the AVX-512 kernels unpack the
// group once and tile the tokens 8..12 at a time, the AVX2 ones 6..8 for Q4_K / Q5_K and 7..10
// for Q6_K): every token gets its scalar twin's bits one
// token at a time, whatever the call's size and the token's place, with more super-blocks than
// the kernels unpack at once.
TEST(InterleavedK, PromptBatchesEqualScalarTwinBitForBit) {
  std::mt19937 rng(43);
  for (GgmlType type : kKTypes) {
    SCOPED_TRACE(GgmlTypeName(type));
    const TypeKernels& scalar = GetKernels(type, Isa::kScalar);
    const int g = scalar.interleave_rows;
    for (const int64_t k : {kQK_K, 5 * kQK_K, 9 * kQK_K}) {
      const size_t row_bytes = RowSize(type, k);
      const std::vector<uint8_t> rows = RandomKRows(type, k * g, rng);  // [g][row_bytes]
      std::vector<uint8_t> group(rows.size());
      scalar.repack(rows.data(), row_bytes, k, group.data());
      const int n_max = kMaxGemmTokens + 3;
      const KActs a = MakeKActs(k, n_max, rng);
      std::vector<float> want(static_cast<size_t>(n_max) * g);  // [token][row]
      for (int t = 0; t < n_max; ++t) {
        scalar.gemm_interleaved(k, group.data(), a.Row(t), a.q8k_row, 1, &want[t * g], g);
      }
      for (Isa isa : SupportedIsas()) {
        const TypeKernels& kern = GetKernels(type, isa);
        ASSERT_GE(kern.gemm_max_tokens, kMaxMultiDot);
        ASSERT_LE(kern.gemm_max_tokens, kMaxGemmTokens);
        for (const int n : {9, 15, 16, 17, 19, 21, 23, 24, 25, 37, 100, kMaxGemmTokens}) {
          if (n > kern.gemm_max_tokens) continue;
          for (const int t0 : {0, 3}) {
            const size_t stride = g + 3;
            std::vector<float> out(stride * (n + 1), -12345.0f);  // [n + 1][stride]
            kern.gemm_interleaved(k, group.data(), a.Row(t0), a.q8k_row, n, out.data(), stride);
            for (int t = 0; t < n; ++t) {
              for (int r = 0; r < g; ++r) {
                ASSERT_EQ(F32ToBits(out[t * stride + r]), F32ToBits(want[(t0 + t) * g + r]))
                    << IsaName(isa) << " k " << k << " n " << n << " token " << t0 + t << " row "
                    << r;
              }
              for (size_t r = g; r < stride; ++r) ASSERT_EQ(out[t * stride + r], -12345.0f);
            }
            for (size_t r = 0; r < stride; ++r) ASSERT_EQ(out[n * stride + r], -12345.0f);
          }
        }
      }
    }
  }
}

// Extreme codes: every Q6_K code 0 or 63 and scales -128 / 127, every Q4_K / Q5_K code 15 / 31
// with scales and mins 63, every IQ4_XS level -127 with scales -32 (even groups) and 31 (odd),
// against activations of +-127 (sign runs of 7; for Q4_K / Q5_K / Q6_K the second super-block
// all -127, where the AVX2 kernels' int16 sums of several chunks come closest to -32768): the
// integer sums at their largest.
TEST(InterleavedK, ExtremeCodesEqualScalarTwin) {
  std::mt19937 rng(41);
  const int64_t k = 2 * kQK_K;
  for (GgmlType type : kKTypes) {
    SCOPED_TRACE(GgmlTypeName(type));
    std::vector<uint8_t> rows = RandomKRows(type, k * kQ8_0x16Rows, rng);
    const size_t bs = GetTypeTraits(type).type_size;
    for (size_t off = 0; off < rows.size(); off += bs) {
      if (type == GgmlType::kQ4_K) {
        std::memset(rows.data() + off + offsetof(BlockQ4_K, scales), 0xFF, kKScaleSize);
        std::memset(rows.data() + off + offsetof(BlockQ4_K, qs), 0xFF, kQK_K / 2);
      } else if (type == GgmlType::kIQ4_XS) {
        // ls = 0 (even groups) and 63 (odd): low bits 0 / 15, top bits 0 / 3; codes 0: -127.
        auto* b = reinterpret_cast<BlockIQ4_XS*>(rows.data() + off);
        b->scales_h = 0xCCCC;
        std::memset(b->scales_l, 0xF0, sizeof(b->scales_l));
        std::memset(b->qs, 0, kQK_K / 2);
      } else if (type == GgmlType::kQ5_K) {
        std::memset(rows.data() + off + offsetof(BlockQ5_K, scales), 0xFF, kKScaleSize);
        std::memset(rows.data() + off + offsetof(BlockQ5_K, qh), 0xFF, kQK_K / 8);
        std::memset(rows.data() + off + offsetof(BlockQ5_K, qs), 0xFF, kQK_K / 2);
      } else {
        const bool top = (off / bs) % 2 == 0;
        std::memset(rows.data() + off + offsetof(BlockQ6_K, ql), top ? 0xFF : 0, kQK_K / 2);
        std::memset(rows.data() + off + offsetof(BlockQ6_K, qh), top ? 0xFF : 0, kQK_K / 4);
        for (int g = 0; g < 16; ++g) {
          rows[off + offsetof(BlockQ6_K, scales) + g] = g % 2 ? 0x80 : 0x7F;
        }
      }
    }
    std::vector<float> x(static_cast<size_t>(k));
    for (int64_t e = 0; e < k; ++e) {
      x[e] = (e < kQK_K || type == GgmlType::kIQ4_XS) && (e / 7) % 2 ? 1.0f : -1.0f;
    }
    std::vector<uint8_t> act(RowSize(GgmlType::kQ8_K, k));
    GetKernels(GgmlType::kQ8_K, Isa::kScalar).quantize(x.data(), act.data(), k);
    std::vector<uint8_t> group(rows.size());
    const TypeKernels& scalar = GetKernels(type, Isa::kScalar);
    scalar.repack(rows.data(), RowSize(type, k), k, group.data());
    float want[kQ8_0x16Rows], got[kQ8_0x16Rows];  // [row]
    scalar.gemm_interleaved(k, group.data(), act.data(), act.size(), 1, want, kQ8_0x16Rows);
    for (int r = 0; r < kQ8_0x16Rows; ++r) {
      float ref = 0.0f;
      scalar.vec_dot(k, &ref, rows.data() + r * RowSize(type, k), act.data());
      EXPECT_NEAR(want[r], ref, 1e-5 * std::fabs(ref)) << "row " << r;
    }
    // The same row for 20 tokens (a prompt-sized call where a kernel allows it).
    constexpr int kN = 20;
    std::vector<uint8_t> acts(act.size() * kN);  // [kN][act.size()]
    for (int t = 0; t < kN; ++t) std::copy(act.begin(), act.end(), acts.begin() + t * act.size());
    for (Isa isa : SupportedIsas()) {
      const TypeKernels& kern = GetKernels(type, isa);
      kern.gemm_interleaved(k, group.data(), act.data(), act.size(), 1, got, kQ8_0x16Rows);
      for (int r = 0; r < kQ8_0x16Rows; ++r) {
        ASSERT_EQ(F32ToBits(got[r]), F32ToBits(want[r])) << IsaName(isa) << " row " << r;
      }
      // 2, 3 and 8 tokens (the decode-batch kernels' paths) and a prompt-sized call.
      for (const int n : {2, 3, kMaxMultiDot, std::min(kN, kern.gemm_max_tokens)}) {
        std::vector<float> many(static_cast<size_t>(n) * kQ8_0x16Rows);  // [n][row]
        kern.gemm_interleaved(k, group.data(), acts.data(), act.size(), n, many.data(),
                              kQ8_0x16Rows);
        for (int t = 0; t < n; ++t) {
          for (int r = 0; r < kQ8_0x16Rows; ++r) {
            ASSERT_EQ(F32ToBits(many[t * kQ8_0x16Rows + r]), F32ToBits(want[r]))
                << IsaName(isa) << " n " << n << " token " << t << " row " << r;
          }
        }
      }
    }
  }
}

// The Q8_K activation quantizer: every ISA's gives the scalar twin's bytes (codes, bsums, d),
// including a block whose largest magnitude appears twice with both signs, an all-zero block,
// blocks with NaNs (payloads too: their codes are whatever the rounding trick makes of them, and
// bsums sums those bytes), and large and tiny blocks.
TEST(InterleavedK, ActivationQuantizerEqualsScalarTwin) {
  std::mt19937 rng(47);
  const int64_t k = 8 * kQK_K;
  for (int rep = 0; rep < 20; ++rep) {
    std::vector<float> x = RandomFloats(k, rng, rep % 2 ? 1e-3f : 30.0f);
    x[kQK_K + 7] = 100.0f;  // block 1: +-100 tie, the first one decides the sign of d
    x[kQK_K + 3] = -100.0f;
    std::fill(x.begin() + 2 * kQK_K, x.begin() + 3 * kQK_K, 0.0f);  // block 2: zeros
    x[3 * kQK_K + 5] = NAN;                                         // block 3: one NaN
    x[5 * kQK_K + 9] = BitsToF32(0x7fc00000u | (static_cast<uint32_t>(rep) * 0x2F3Bu));  // payload
    x[5 * kQK_K + 30] = -BitsToF32(0x7f812345u + static_cast<uint32_t>(rep));  // signalling
    x[4 * kQK_K + rep] = (rep % 3 - 1) * 1e4f;  // block 4: one outlier
    const size_t row = RowSize(GgmlType::kQ8_K, k);
    std::vector<uint8_t> want(row, 0xAB), got(row, 0xCD);
    GetKernels(GgmlType::kQ8_K, Isa::kScalar).quantize(x.data(), want.data(), k);
    for (Isa isa : SupportedIsas()) {
      if (isa != Isa::kScalar) {  // its own twin, not the scalar one inherited
        EXPECT_NE(GetKernels(GgmlType::kQ8_K, isa).quantize,
                  GetKernels(GgmlType::kQ8_K, Isa::kScalar).quantize);
      }
      std::fill(got.begin(), got.end(), 0xCD);
      GetKernels(GgmlType::kQ8_K, isa).quantize(x.data(), got.data(), k);
      ASSERT_EQ(0, std::memcmp(got.data(), want.data(), row)) << IsaName(isa) << " rep " << rep;
    }
  }
}

// The matmul over an interleaved K-quant copy equals the scalar twin on each token alone, for
// decode, prompt batches and a row range cutting groups.
void ExpectKMatMulEqualsScalarTwin(GgmlType type, std::mt19937& rng, ThreadPool& pool) {
  SCOPED_TRACE(GgmlTypeName(type));
  const int64_t rows = 48, cols = 3 * kQK_K;
  const std::vector<uint8_t> data = RandomKRows(type, rows * cols, rng);
  const WeightMatrix plain{type, rows, cols, RowSize(type, cols), data.data()};
  ASSERT_TRUE(CanInterleave(plain));
  std::vector<uint8_t> buf(data.size());  // the interleaved copy: [rows / 16 groups]
  const WeightMatrix w = InterleaveInto(plain, buf.data());
  EXPECT_EQ(w.interleave, kQ8_0x16Rows);
  const TypeKernels& scalar = GetKernels(type, Isa::kScalar);
  for (int64_t n_tokens : {1, 3, 20}) {
    const std::vector<float> x = RandomFloats(n_tokens * cols, rng);
    for (auto [lo, hi] : {std::pair<int64_t, int64_t>{0, rows}, {5, 27}, {16, 32}}) {
      std::vector<float> y(static_cast<size_t>(n_tokens * rows), NAN);  // [n_tokens, rows]
      MatMulScratch scratch;
      MatMulRows(w, lo, hi, x.data(), cols, n_tokens, y.data(), rows, scratch, pool);
      std::vector<uint8_t> a(RowSize(GgmlType::kQ8_K, cols));
      for (int64_t j = 0; j < n_tokens; ++j) {
        GetKernels(GgmlType::kQ8_K).quantize(x.data() + j * cols, a.data(), cols);
        float want[3][kQ8_0x16Rows];  // [group][row]
        for (int grp = 0; grp < 3; ++grp) {
          scalar.gemm_interleaved(cols, buf.data() + grp * 16 * plain.row_bytes, a.data(), a.size(),
                                  1, want[grp], kQ8_0x16Rows);
        }
        for (int64_t r = 0; r < rows; ++r) {
          const float got = y[j * rows + r];
          if (r < lo || r >= hi) {
            ASSERT_TRUE(std::isnan(got)) << "wrote row " << r << " outside the range";
            continue;
          }
          ASSERT_EQ(F32ToBits(got), F32ToBits(want[r / 16][r % 16]))
              << "tokens " << n_tokens << " token " << j << " row " << r;
        }
      }
    }
  }
}

TEST(InterleavedK, MatMulEqualsScalarTwin) {
  std::mt19937 rng(43);
  ThreadPool pool(2);
  for (GgmlType t : kKTypes) ExpectKMatMulEqualsScalarTwin(t, rng, pool);
}

// The loader repacks a file's Q8_0 (Q4_K / Q6_K, IQ4_XS, Q5_0) matmul weights (the same results as
// the mapped rows) and keeps the embedding, read by rows, as it is; without a store it repacks
// nothing.
TEST(Interleaved, LoaderRepacksMatMulWeightsOnly) {
  for (const char* name : {"synth-llama-d128.Q8_0.gguf", "synth-llama-kq.Q4_K_M.gguf",
                           "synth-llama-d128.Q4_K_M.gguf"}) {
    const std::string path = std::string(LAMINA_SHARED_DIR) + "/models/" + name;
    if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " is absent (../shared fixtures)";
  }
  auto file =
      gguf::File::Open(std::string(LAMINA_SHARED_DIR) + "/models/synth-llama-d128.Q8_0.gguf");
  ASSERT_TRUE(file.ok()) << file.error().message;
  std::vector<WeightBuffer> store;
  WeightLoader L(**file, &store);
  const WeightMatrix embd = L.Matrix("token_embd.weight", 128, 512, true, WeightUse::kRows);
  const WeightMatrix wq = L.Matrix("blk.0.attn_q.weight", 128, 128);
  const WeightMatrix wk = L.Matrix("blk.0.attn_k.weight", 128, 32);
  ASSERT_TRUE(L.status().ok());
  EXPECT_EQ(embd.interleave, 0);
  EXPECT_EQ(wq.interleave, kQ8_0x16Rows);
  EXPECT_EQ(wk.interleave, kQ8_0x16Rows);
  EXPECT_EQ(store.size(), 2u);
  // A Q4_K_M file: its Q4_K and Q6_K matmul weights are repacked too, its embedding is not.
  auto kq = gguf::File::Open(std::string(LAMINA_SHARED_DIR) + "/models/synth-llama-kq.Q4_K_M.gguf");
  ASSERT_TRUE(kq.ok()) << kq.error().message;
  std::vector<WeightBuffer> kq_store;
  WeightLoader kq_loader(**kq, &kq_store);
  const WeightMatrix kq_embd =
      kq_loader.Matrix("token_embd.weight", 256, 512, true, WeightUse::kRows);
  const WeightMatrix kq_q = kq_loader.Matrix("blk.0.attn_q.weight", 256, 256);
  const WeightMatrix kq_down = kq_loader.Matrix("blk.3.ffn_down.weight", 512, 256);
  ASSERT_TRUE(kq_loader.status().ok());
  EXPECT_EQ(kq_q.type, GgmlType::kQ4_K);
  EXPECT_EQ(kq_down.type, GgmlType::kQ6_K);
  EXPECT_EQ(kq_embd.interleave, 0);
  EXPECT_EQ(kq_q.interleave, kQ8_0x16Rows);
  EXPECT_EQ(kq_down.interleave, kQ8_0x16Rows);
  // An IQ4_XS file (tests/fixtures): its matmul weights are repacked, its embedding is not.
  auto xs = gguf::File::Open(std::string(LAMINA_SOURCE_DIR) +
                             "/tests/fixtures/models/synth-llama-d256.IQ4_XS.gguf");
  ASSERT_TRUE(xs.ok()) << xs.error().message;
  std::vector<WeightBuffer> xs_store;
  WeightLoader xs_loader(**xs, &xs_store);
  const WeightMatrix xs_embd =
      xs_loader.Matrix("token_embd.weight", 256, 512, true, WeightUse::kRows);
  const WeightMatrix xs_k = xs_loader.Matrix("blk.0.attn_k.weight", 256, 128);
  ASSERT_TRUE(xs_loader.status().ok());
  EXPECT_EQ(xs_k.type, GgmlType::kIQ4_XS);
  EXPECT_EQ(xs_embd.interleave, 0);
  EXPECT_EQ(xs_k.interleave, kQ8_0x16Rows);
  // gpt-oss's MXFP4 expert stacks (3-D, one matrix per expert) are repacked per expert, and an
  // NVFP4 file's matmul weights too.
  auto oss = gguf::File::Open(std::string(LAMINA_SOURCE_DIR) +
                              "/tests/fixtures/models/synth-gpt-oss-d256.MXFP4_MOE.gguf");
  ASSERT_TRUE(oss.ok()) << oss.error().message;
  const gguf::TensorInfo* gate = (*oss)->FindTensor("blk.0.ffn_gate_exps.weight");
  ASSERT_NE(gate, nullptr);
  ASSERT_EQ(gate->type, GgmlType::kMXFP4);
  std::vector<WeightBuffer> oss_store;
  WeightLoader oss_loader(**oss, &oss_store);
  const std::vector<WeightMatrix> experts =
      oss_loader.Stacked("blk.0.ffn_gate_exps.weight", gate->ne[0], gate->ne[1], gate->ne[2]);
  ASSERT_TRUE(oss_loader.status().ok());
  ASSERT_EQ(experts.size(), static_cast<size_t>(gate->ne[2]));
  for (const WeightMatrix& e : experts) EXPECT_EQ(e.interleave, kQ8_0x16Rows);
  EXPECT_EQ(oss_store.size(), 1u);
  auto nv = gguf::File::Open(std::string(LAMINA_SOURCE_DIR) +
                             "/tests/fixtures/models/synth-llama-d256.NVFP4.gguf");
  ASSERT_TRUE(nv.ok()) << nv.error().message;
  const gguf::TensorInfo* nv_q = (*nv)->FindTensor("blk.0.attn_q.weight");
  ASSERT_NE(nv_q, nullptr);
  std::vector<WeightBuffer> nv_store;
  WeightLoader nv_loader(**nv, &nv_store);
  const WeightMatrix nv_w = nv_loader.Matrix("blk.0.attn_q.weight", nv_q->ne[0], nv_q->ne[1]);
  ASSERT_TRUE(nv_loader.status().ok());
  EXPECT_EQ(nv_w.type, GgmlType::kNVFP4);
  EXPECT_EQ(nv_w.interleave, kQ8_0x16Rows);
  WeightLoader plain_loader(**file);
  const WeightMatrix plain = plain_loader.Matrix("blk.0.attn_q.weight", 128, 128);
  EXPECT_EQ(plain.interleave, 0);
  std::mt19937 rng(31);
  ThreadPool pool(2);
  const std::vector<float> x = RandomFloats(5 * 128, rng);
  std::vector<float> y0(5 * 128), y1(5 * 128);  // [5 tokens, 128 rows]
  MatMulScratch scratch;
  MatMul(wq, x.data(), 128, 5, y0.data(), 128, scratch, pool);
  MatMul(plain, x.data(), 128, 5, y1.data(), 128, scratch, pool);
  for (size_t i = 0; i < y0.size(); ++i) ASSERT_NEAR(y0[i], y1[i], 1e-4f * (1 + std::fabs(y1[i])));
  // A Q4_K_M file whose 128-wide rows fell back to Q5_0: repacked on every ISA, with the mapped
  // rows' bits.
  auto q5 =
      gguf::File::Open(std::string(LAMINA_SHARED_DIR) + "/models/synth-llama-d128.Q4_K_M.gguf");
  ASSERT_TRUE(q5.ok()) << q5.error().message;
  std::vector<WeightBuffer> q5_store;
  WeightLoader q5_loader(**q5, &q5_store);
  const WeightMatrix q5_q = q5_loader.Matrix("blk.0.attn_q.weight", 128, 128);
  ASSERT_TRUE(q5_loader.status().ok());
  EXPECT_EQ(q5_q.type, GgmlType::kQ5_0);
  EXPECT_EQ(q5_q.interleave, kQ8_0x16Rows);
  WeightLoader q5_plain_loader(**q5);
  const WeightMatrix q5_plain = q5_plain_loader.Matrix("blk.0.attn_q.weight", 128, 128);
  EXPECT_EQ(q5_plain.interleave, 0);
  MatMul(q5_q, x.data(), 128, 5, y0.data(), 128, scratch, pool);
  MatMul(q5_plain, x.data(), 128, 5, y1.data(), 128, scratch, pool);
  for (size_t i = 0; i < y0.size(); ++i) ASSERT_EQ(F32ToBits(y0[i]), F32ToBits(y1[i])) << i;
}

// ---------------------------------------------------------------------------------------------
// Q5_0 (BlockQ5_0x16): each ISA keeps its row kernel's order, so an interleaved kernel gives the
// vec_dot of its own ISA bit for bit (scalar: GGML's per-block order; AVX2 and AVX-512: eight
// float lanes per row, whose scalar twin is GemmQ5_0x16Lanes), for every batch size and place.

TEST(InterleavedQ5_0, KernelEqualsItsIsaVecDotBitForBit) {
  constexpr GgmlType kType = GgmlType::kQ5_0;
  std::mt19937 rng(47);
  const TypeKernels& scalar = GetKernels(kType, Isa::kScalar);
  ASSERT_EQ(scalar.interleave_rows, kQ8_0x16Rows);
  const int g = kQ8_0x16Rows;
  for (const int64_t k : {int64_t{32}, int64_t{352}, int64_t{1024}}) {
    SCOPED_TRACE(k);
    const size_t row_bytes = RowSize(kType, k);
    const std::vector<uint8_t> rows = RandomWeightRow(kType, k * g, rng);  // [g][row_bytes]
    std::vector<uint8_t> group(rows.size());  // one interleaved group of the g rows
    scalar.repack(rows.data(), row_bytes, k, group.data());
    const Acts a = MakeActs(k, kMaxMultiDot, rng);
    // The SIMD row kernels' order, as the scalar lane twin computes it.
    float lanes[kMaxMultiDot][kQ8_0x16Rows];  // [token][row]
    quant_internal::GemmQ5_0x16Lanes(k, group.data(), a.wide.data(), a.wide_row, kMaxMultiDot,
                                     &lanes[0][0], g);
    for (Isa isa : SupportedIsas()) {
      const TypeKernels& kern = GetKernels(kType, isa);
      float want[kMaxMultiDot][kQ8_0x16Rows];  // [token][row]: this ISA's vec_dot
      for (int t = 0; t < kMaxMultiDot; ++t) {
        for (int r = 0; r < g; ++r) {
          kern.vec_dot(k, &want[t][r], rows.data() + r * row_bytes, a.q8.data() + t * a.q8_row);
          if (isa != Isa::kScalar) {
            ASSERT_EQ(F32ToBits(lanes[t][r]), F32ToBits(want[t][r]))
                << IsaName(isa) << " lane twin, token " << t << " row " << r;
          }
        }
      }
      ASSERT_EQ(kern.interleave_rows, g);
      ASSERT_EQ(kern.repack, scalar.repack);
      ASSERT_NE(kern.gemm_interleaved, nullptr);
      if (isa != Isa::kScalar) {
        EXPECT_NE(kern.gemm_interleaved, scalar.gemm_interleaved);
      }
      for (int n = 1; n <= kMaxMultiDot; ++n) {
        for (int t0 = 0; t0 + n <= kMaxMultiDot; ++t0) {
          const size_t stride = g + 3;
          std::vector<float> out(stride * (n + 1), -12345.0f);  // [n + 1][stride]
          kern.gemm_interleaved(k, group.data(), a.wide.data() + t0 * a.wide_row, a.wide_row, n,
                                out.data(), stride);
          for (int t = 0; t < n; ++t) {
            for (int r = 0; r < g; ++r) {
              ASSERT_EQ(F32ToBits(out[t * stride + r]), F32ToBits(want[t0 + t][r]))
                  << IsaName(isa) << " n " << n << " token " << t0 + t << " row " << r;
            }
            for (size_t r = g; r < stride; ++r) ASSERT_EQ(out[t * stride + r], -12345.0f);
          }
          for (size_t r = 0; r < stride; ++r) ASSERT_EQ(out[n * stride + r], -12345.0f);
        }
      }
    }
  }
}

// The matmul over an interleaved Q5_0 copy equals the plain rows' matmul bit for bit (the
// default ISA's vec_dot), for decode, small and large batches and row ranges cutting groups.
TEST(InterleavedQ5_0, MatMulEqualsPlainRowsBitForBit) {
  constexpr GgmlType kType = GgmlType::kQ5_0;
  std::mt19937 rng(53);
  ThreadPool pool(2);
  const int64_t rows = 48, cols = 352;
  const std::vector<uint8_t> data = RandomWeightRow(kType, rows * cols, rng);
  const WeightMatrix plain{kType, rows, cols, RowSize(kType, cols), data.data()};
  ASSERT_TRUE(CanInterleave(plain));
  std::vector<uint8_t> buf(data.size());  // the interleaved copy: [rows / 16 groups]
  const WeightMatrix w = InterleaveInto(plain, buf.data());
  EXPECT_EQ(w.interleave, kQ8_0x16Rows);
  for (int64_t n_tokens : {1, 3, 9, 20, 37, 130}) {
    const std::vector<float> x = RandomFloats(n_tokens * cols, rng);
    for (auto [lo, hi] : {std::pair<int64_t, int64_t>{0, rows}, {5, 27}, {16, 32}}) {
      std::vector<float> y(static_cast<size_t>(n_tokens * rows), NAN);  // [n_tokens, rows]
      std::vector<float> want(y.size(), NAN);                           // [n_tokens, rows]
      MatMulScratch scratch;
      MatMulRows(w, lo, hi, x.data(), cols, n_tokens, y.data(), rows, scratch, pool);
      MatMulRows(plain, lo, hi, x.data(), cols, n_tokens, want.data(), rows, scratch, pool);
      for (size_t i = 0; i < y.size(); ++i) {
        if (std::isnan(want[i])) {
          ASSERT_TRUE(std::isnan(y[i])) << "wrote outside the range at " << i;
          continue;
        }
        ASSERT_EQ(F32ToBits(y[i]), F32ToBits(want[i])) << "tokens " << n_tokens << " at " << i;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Q1_0 and Q2_0 (BlockQ1_0x16 / BlockQ2_0x16): interleaved on the ISAs with a kernel for them
// (scalar: the twin; AVX-512), plain rows on AVX2.

constexpr GgmlType kLowBitTypes[] = {GgmlType::kQ1_0, GgmlType::kQ2_0};

std::vector<int64_t> LowBitKs(GgmlType type) {
  if (type == GgmlType::kQ1_0) return {128, 384, 1024};
  return {64, 320, 1024};
}

TEST(InterleavedLowBit, KernelEqualsScalarVecDotBitForBit) {
  std::mt19937 rng(41);
  for (GgmlType type : kLowBitTypes) {
    SCOPED_TRACE(GgmlTypeName(type));
    const TypeKernels& scalar = GetKernels(type, Isa::kScalar);
    ASSERT_EQ(scalar.interleave_rows, kQ8_0x16Rows);
    const int g = kQ8_0x16Rows;
    for (const int64_t k : LowBitKs(type)) {
      const size_t row_bytes = RowSize(type, k);
      std::vector<uint8_t> rows = RandomWeightRow(type, k * g, rng);  // [g][row_bytes]
      std::vector<uint8_t> group(rows.size());  // one interleaved group of the g rows
      scalar.repack(rows.data(), row_bytes, k, group.data());
      // The repack keeps every byte (a permutation of the codes, d as it is).
      EXPECT_EQ(group.size(), rows.size());
      const Acts a = MakeActs(k, kMaxMultiDot, rng);
      float want[kMaxMultiDot][kQ8_0x16Rows];  // [token][row]
      for (int t = 0; t < kMaxMultiDot; ++t) {
        for (int r = 0; r < g; ++r) {
          scalar.vec_dot(k, &want[t][r], rows.data() + r * row_bytes, a.q8.data() + t * a.q8_row);
        }
      }
      for (Isa isa : SupportedIsas()) {
        const TypeKernels& kern = GetKernels(type, isa);
        if (isa == Isa::kAvx512) {
          ASSERT_EQ(kern.interleave_rows, kQ8_0x16Rows);
        }
        if (kern.interleave_rows == 0) {
          EXPECT_EQ(kern.gemm_interleaved, nullptr) << IsaName(isa);
          continue;
        }
        ASSERT_NE(kern.gemm_interleaved, nullptr);
        if (isa != Isa::kScalar) {
          EXPECT_NE(kern.gemm_interleaved, scalar.gemm_interleaved);
        }
        ExpectGemmCallsEqual(kern, isa, k, group.data(), a, want,
                             std::min(kern.gemm_max_tokens, kMaxMultiDot));
      }
    }
  }
}

// The matmul over an interleaved copy, 1..64 tokens and row ranges cutting groups, equals the
// scalar vec_dot of the plain rows.
TEST(InterleavedLowBit, MatMulEqualsScalarVecDot) {
  std::mt19937 rng(43);
  ThreadPool pool(2);
  for (GgmlType type : kLowBitTypes) {
    SCOPED_TRACE(GgmlTypeName(type));
    const int64_t rows = 48, cols = LowBitKs(type)[1];
    const std::vector<uint8_t> data = RandomWeightRow(type, rows * cols, rng);
    const WeightMatrix plain{type, rows, cols, RowSize(type, cols), data.data()};
    if (!CanInterleave(plain)) {
      EXPECT_EQ(GetKernels(type).interleave_rows, 0);
      continue;
    }
    std::vector<uint8_t> buf(data.size());  // the interleaved copy: [rows / 16 groups]
    const WeightMatrix w = InterleaveInto(plain, buf.data());
    EXPECT_EQ(w.interleave, kQ8_0x16Rows);
    const WeightMatrix odd{type, rows - 8, cols, RowSize(type, cols), data.data()};
    EXPECT_FALSE(CanInterleave(odd));
    ExpectRangesEqualScalarVecDot(w, plain, {1, 2, 5, 8, 9, 20, 64},
                                  {{0, rows}, {5, 27}, {16, 32}, {3, 45}}, rng, pool);
  }
}

// The fixture files' matmul weights load repacked where the ISA has the layout, and give the
// plain rows' bits.
TEST(InterleavedLowBit, LoaderRepacksFixtures) {
  std::mt19937 rng(47);
  ThreadPool pool(2);
  for (const char* name : {"Q1_0", "Q2_0"}) {
    SCOPED_TRACE(name);
    auto file = gguf::File::Open(std::string(LAMINA_SOURCE_DIR) +
                                 "/tests/fixtures/models/synth-llama-d256." + name + ".gguf");
    ASSERT_TRUE(file.ok()) << file.error().message;
    const gguf::TensorInfo* info = (*file)->FindTensor("blk.0.ffn_gate.weight");
    ASSERT_NE(info, nullptr);
    const int64_t cols = info->ne[0], rows = info->ne[1];
    std::vector<WeightBuffer> store;
    WeightLoader L(**file, &store);
    const WeightMatrix w = L.Matrix("blk.0.ffn_gate.weight", cols, rows);
    ASSERT_TRUE(L.status().ok());
    const bool layout = GetKernels(info->type).interleave_rows > 0;
    EXPECT_EQ(w.interleave, layout ? kQ8_0x16Rows : 0);
    WeightLoader plain_loader(**file);
    const WeightMatrix plain = plain_loader.Matrix("blk.0.ffn_gate.weight", cols, rows);
    EXPECT_EQ(plain.interleave, 0);
    for (int64_t n : {1, 7, 33}) {
      const std::vector<float> x = RandomFloats(n * cols, rng);
      std::vector<float> y0(n * rows), y1(n * rows);  // [n tokens, rows]
      MatMulScratch scratch;
      MatMul(w, x.data(), cols, n, y0.data(), rows, scratch, pool);
      MatMul(plain, x.data(), cols, n, y1.data(), rows, scratch, pool);
      for (size_t i = 0; i < y0.size(); ++i) ASSERT_EQ(F32ToBits(y0[i]), F32ToBits(y1[i])) << i;
    }
  }
}

}  // namespace
}  // namespace lamina
