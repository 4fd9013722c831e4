// The interleaved weight layouts (Q8_0 and Q4_0 as BlockQ8_0x16 / BlockQ4_0x16, repacked at load):
// every ISA's kernel gives the scalar vec_dot of the row before repacking bit for bit, for every
// batch size and place in the batch, and writes nothing past its tile; the matmul on an interleaved
// matrix (whole groups, and a row range cutting groups) equals that too; the loader repacks a
// model's matmul weights and keeps the embedding as rows.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "gguf/gguf.h"
#include "kernels/matmul.h"
#include "model/weight_loader.h"
#include "quant/quant.h"
#include "quant_random.h"
#include "util/thread_pool.h"

namespace lamina {
namespace {

constexpr GgmlType kQ8 = GgmlType::kQ8_0;  // the activations' type
constexpr GgmlType kTypes[] = {GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kIQ4_NL};

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

void ExpectKernelEqualsScalarVecDot(GgmlType type, std::mt19937& rng) {
  SCOPED_TRACE(GgmlTypeName(type));
  const TypeKernels& scalar = GetKernels(type, Isa::kScalar);
  const int g = scalar.interleave_rows;
  ASSERT_EQ(g, kQ8_0x16Rows);
  for (const int64_t k : {int64_t{32}, int64_t{352}, int64_t{1024}}) {
    const size_t row_bytes = RowSize(type, k);
    // Every byte value as a code (Q8_0: -128 included), sane scales.
    const std::vector<uint8_t> rows = RandomWeightRow(type, k * g, rng);  // [g][row_bytes]
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
      if (isa != Isa::kScalar) EXPECT_NE(kern.gemm_interleaved, scalar.gemm_interleaved);
      for (int n = 1; n <= kMaxMultiDot; ++n) {
        // Tokens start at every offset 0..kMaxMultiDot - n, so a token's place varies too.
        for (int t0 = 0; t0 + n <= kMaxMultiDot; ++t0) {
          const size_t stride = g + 3;
          std::vector<float> out(stride * (n + 1), -12345.0f);  // [n + 1][stride]
          kern.gemm_interleaved(k, group.data(), a.wide.data() + t0 * a.wide_row, a.wide_row, n,
                                out.data(), stride);
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

TEST(Interleaved, KernelEqualsScalarVecDotBitForBit) {
  std::mt19937 rng(23);
  for (GgmlType t : kTypes) ExpectKernelEqualsScalarVecDot(t, rng);
}

// The matmul over an interleaved copy equals the scalar vec_dot of the plain rows (so decode,
// prompt batches of any size, and a row range all give the same bits).
void ExpectMatMulEqualsScalarVecDot(GgmlType type, std::mt19937& rng, ThreadPool& pool) {
  SCOPED_TRACE(GgmlTypeName(type));
  const int64_t rows = 48, cols = 352;
  const std::vector<uint8_t> data = RandomWeightRow(type, rows * cols, rng);
  const WeightMatrix plain{type, rows, cols, RowSize(type, cols), data.data()};
  ASSERT_TRUE(CanInterleave(plain));
  std::vector<uint8_t> buf(data.size());  // the interleaved copy: [rows / 16 groups]
  const WeightMatrix w = InterleaveInto(plain, buf.data());
  EXPECT_EQ(w.interleave, kQ8_0x16Rows);
  EXPECT_FALSE(CanInterleave(w));
  const WeightMatrix odd{type, rows - 8, cols, RowSize(type, cols), data.data()};
  EXPECT_FALSE(CanInterleave(odd));
  for (int64_t n_tokens : {1, 3, 20}) {
    const std::vector<float> x = RandomFloats(n_tokens * cols, rng);
    for (auto [lo, hi] : {std::pair<int64_t, int64_t>{0, rows}, {5, 27}, {16, 32}}) {
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

TEST(Interleaved, MatMulEqualsScalarVecDot) {
  std::mt19937 rng(29);
  ThreadPool pool(2);
  for (GgmlType t : kTypes) ExpectMatMulEqualsScalarVecDot(t, rng, pool);
}

// The loader repacks a file's Q8_0 matmul weights (the same results as the mapped rows) and keeps
// the embedding, read by rows, as it is; without a store it repacks nothing.
TEST(Interleaved, LoaderRepacksMatMulWeightsOnly) {
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
}

}  // namespace
}  // namespace lamina
