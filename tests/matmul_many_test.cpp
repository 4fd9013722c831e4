// MatMulMany (several matmuls over the same activations in one parallel region) against one
// MatMul per part: the same bits for every part, token count and thread count, with and without
// the per-row epilogue, and through the fallback for parts of different types; F16 weights
// against vec_dot on the rounded activations (made per thread for few tokens); plain and
// interleaved (repacked) weights, including interleaved parts of different types that read the
// same activations (Q4_K and Q6_K: Q8_K).
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kernels/matmul.h"
#include "kernels/ops.h"
#include "quant/quant.h"
#include "quant_random.h"
#include "util/thread_pool.h"

namespace lamina {
namespace {

// A plain weight matrix of random values in `type`, owning its bytes.
struct OwnedWeights {
  std::vector<uint8_t> data;  // [rows][row_bytes]
  WeightMatrix w;
};

OwnedWeights MakeWeights(GgmlType type, int64_t rows, int64_t cols, std::mt19937& rng) {
  OwnedWeights o;
  const size_t row_bytes = RowSize(type, cols);
  o.data.resize(row_bytes * rows);
  const std::vector<float> values = RandomFloats(rows * cols, rng);
  for (int64_t r = 0; r < rows; ++r) {
    GetKernels(type).quantize(values.data() + r * cols, o.data.data() + r * row_bytes, cols);
  }
  o.w = {type, rows, cols, row_bytes, o.data.data()};
  return o;
}

// o's weights repacked into their interleaved layout (o.w unchanged if this ISA has none).
OwnedWeights Interleaved(const OwnedWeights& o) {
  OwnedWeights r;
  r.data = o.data;  // [rows / 16 groups][16 * row_bytes] once repacked
  r.w = o.w;
  r.w.data = r.data.data();
  if (CanInterleave(o.w)) r.w = InterleaveInto(o.w, r.data.data());
  return r;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Runs the parts ws over x ([n, cols]) by MatMulMany and expects each output to be one MatMul's
// bits; label(p) names part p in a failure.
void ExpectManyEqualsSeparate(const std::vector<OwnedWeights>& ws, const std::vector<float>& x,
                              int64_t cols, int64_t n, MatMulScratch& scratch, ThreadPool& pool,
                              const std::function<std::string(int)>& label) {
  const int n_parts = static_cast<int>(ws.size());
  std::vector<std::vector<float>> want(n_parts), got(n_parts);  // [n, rows] each
  std::vector<MatMulPart> parts(n_parts);
  for (int p = 0; p < n_parts; ++p) {
    const WeightMatrix& w = ws[p].w;
    want[p].assign(n * w.rows, 0.0f);
    got[p].assign(n * w.rows, -1.0f);
    MatMul(w, x.data(), cols, n, want[p].data(), w.rows, scratch, pool);
    parts[p] = {&w, got[p].data(), w.rows};
  }
  MatMulMany(parts.data(), n_parts, x.data(), cols, n, scratch, pool);
  for (int p = 0; p < n_parts; ++p) EXPECT_TRUE(SameBits(want[p], got[p])) << label(p);
}

TEST(MatMulMany, EqualsOneMatMulPerPartBitForBit) {
  std::mt19937 rng(5);
  const int64_t cols = 96;
  for (GgmlType type : {GgmlType::kF16, GgmlType::kF32, GgmlType::kQ8_0}) {
    // Q, K and V shaped parts: 48, 16 and 24 rows (the last not a whole row tile).
    std::vector<OwnedWeights> ws;
    for (int64_t rows : {48, 16, 24}) ws.push_back(MakeWeights(type, rows, cols, rng));
    for (int threads : {1, 2}) {
      ThreadPool pool(threads);
      for (int64_t n : {1, 2, 9, 13}) {
        const std::vector<float> x = RandomFloats(n * cols, rng);  // [n, cols]
        MatMulScratch scratch;
        ExpectManyEqualsSeparate(ws, x, cols, n, scratch, pool, [&](int p) {
          return std::string(GgmlTypeName(type)) + ", part " + std::to_string(p) + ", " +
                 std::to_string(n) + " tokens, " + std::to_string(threads) + " threads";
        });
      }
    }
  }
}

// F16 weights round their activations to f16 per thread for a few tokens (each thread its own
// copy, made on its first chunk of a loop) and once on the caller for more: every output must be
// vec_dot's bits on the caller-rounded row, on either side of the switch, for any thread count,
// with strided activations and one scratch reused across calls of every size.
TEST(MatMulMany, F16EqualsVecDotOnRoundedRowsForEveryThreadCount) {
  std::mt19937 rng(9);
  const int64_t cols = 80, rows = 40, x_stride = 96;  // 40: two whole row tiles and a part
  const OwnedWeights w = MakeWeights(GgmlType::kF16, rows, cols, rng);
  const TypeKernels& kern = GetKernels(GgmlType::kF16);
  ASSERT_NE(kern.quantize_act, nullptr);
  for (int threads : {1, 2, 3, 4}) {
    ThreadPool pool(threads);
    MatMulScratch scratch;  // reused by every call below
    for (int64_t n : {1, 2, 9, 16, 17, 24, 5, 1}) {
      // [n, x_stride] with values past cols that must not be read; magnitudes around f16's
      // subnormals, normals and its largest.
      std::vector<float> x = RandomFloats(n * x_stride, rng);
      for (int64_t i = 0; i < n * x_stride; ++i) {
        x[i] *= i % 7 == 0 ? 1e-6f : (i % 11 == 0 ? 2e4f : 1.0f);
      }
      std::vector<float> want(n * rows);  // [n, rows]
      std::vector<float> rounded(cols);   // [cols]
      for (int64_t t = 0; t < n; ++t) {
        kern.quantize_act(x.data() + t * x_stride, rounded.data(), cols);
        for (int64_t r = 0; r < rows; ++r) {
          kern.vec_dot(cols, &want[t * rows + r], w.data.data() + r * w.w.row_bytes,
                       rounded.data());
        }
      }
      std::vector<float> one(n * rows, -1.0f), many(n * rows, -1.0f);  // [n, rows]
      MatMul(w.w, x.data(), x_stride, n, one.data(), rows, scratch, pool);
      const MatMulPart parts[] = {{&w.w, many.data(), rows}};
      MatMulMany(parts, 1, x.data(), x_stride, n, scratch, pool);
      EXPECT_TRUE(SameBits(want, one)) << n << " tokens, " << threads << " threads (MatMul)";
      EXPECT_TRUE(SameBits(want, many)) << n << " tokens, " << threads << " threads (Many)";
    }
  }
}

TEST(MatMulMany, EpilogueSeesEveryRowOnceAfterBothParts) {
  std::mt19937 rng(6);
  const int64_t cols = 64, rows = 40;  // 40: two whole row tiles and a part of one
  for (GgmlType up_type : {GgmlType::kF16, GgmlType::kQ8_0}) {  // Q8_0: the mixed-type fallback
    const OwnedWeights gate = MakeWeights(GgmlType::kF16, rows, cols, rng);
    const OwnedWeights up = MakeWeights(up_type, rows, cols, rng);
    ThreadPool pool(2);
    for (int64_t n : {1, 9}) {
      const std::vector<float> x = RandomFloats(n * cols, rng);  // [n, cols]
      MatMulScratch scratch;
      std::vector<float> g0(n * rows), u0(n * rows);  // [n, rows]
      MatMul(gate.w, x.data(), cols, n, g0.data(), rows, scratch, pool);
      MatMul(up.w, x.data(), cols, n, u0.data(), rows, scratch, pool);
      SiluMul(g0.data(), u0.data(), n * rows, g0.data());
      std::vector<float> g1(n * rows), u1(n * rows);  // [n, rows]
      std::vector<int> seen(rows, 0);                 // [rows] epilogue calls per row
      const MatMulPart parts[] = {{&gate.w, g1.data(), rows}, {&up.w, u1.data(), rows}};
      const std::function<void(int64_t, int64_t)> activate = [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) ++seen[r];
        for (int64_t t = 0; t < n; ++t) {
          SiluMul(g1.data() + t * rows + r0, u1.data() + t * rows + r0, r1 - r0,
                  g1.data() + t * rows + r0);
        }
      };
      MatMulMany(parts, 2, x.data(), cols, n, scratch, pool, &activate);
      EXPECT_TRUE(SameBits(g0, g1)) << GgmlTypeName(up_type) << ", " << n << " tokens";
      for (int64_t r = 0; r < rows; ++r) EXPECT_EQ(seen[r], 1) << "row " << r;
    }
  }
}

// Interleaved parts: Q, K and V (and gate and up with the epilogue) of one type, and of Q4_K,
// Q4_K and Q6_K as a Q4_K_M layer has them, each bit for bit one MatMul per part.
TEST(MatMulMany, InterleavedPartsEqualOneMatMulPerPartBitForBit) {
  std::mt19937 rng(7);
  const int64_t cols = 512;
  using Types = std::vector<GgmlType>;
  for (const Types& types : {Types{GgmlType::kQ8_0, GgmlType::kQ8_0, GgmlType::kQ8_0},
                             Types{GgmlType::kQ4_K, GgmlType::kQ4_K, GgmlType::kQ6_K},
                             Types{GgmlType::kQ6_K, GgmlType::kQ4_K, GgmlType::kQ4_0}}) {
    std::vector<OwnedWeights> ws;
    const int64_t part_rows[] = {64, 32, 48};
    for (int p = 0; p < 3; ++p) {
      ws.push_back(Interleaved(MakeWeights(types[p], part_rows[p], cols, rng)));
    }
    if (ws[0].w.interleave == 0) GTEST_SKIP() << "no interleaved layout at this ISA";
    for (int threads : {1, 2}) {
      ThreadPool pool(threads);
      for (int64_t n : {1, 3, 8, 9}) {
        const std::vector<float> x = RandomFloats(n * cols, rng);  // [n, cols]
        MatMulScratch scratch;
        ExpectManyEqualsSeparate(ws, x, cols, n, scratch, pool, [&](int p) {
          return std::string(GgmlTypeName(types[p])) + ", part " + std::to_string(p) + ", " +
                 std::to_string(n) + " tokens, " + std::to_string(threads) + " threads";
        });
        // Gate and up: the first two parts at equal rows, with the SiLU epilogue.
        const OwnedWeights& gate = ws[1];
        const OwnedWeights up = Interleaved(MakeWeights(types[0], gate.w.rows, cols, rng));
        const int64_t rows = gate.w.rows;
        std::vector<float> g0(n * rows), u0(n * rows);  // [n, rows]
        MatMul(gate.w, x.data(), cols, n, g0.data(), rows, scratch, pool);
        MatMul(up.w, x.data(), cols, n, u0.data(), rows, scratch, pool);
        SiluMul(g0.data(), u0.data(), n * rows, g0.data());
        std::vector<float> g1(n * rows), u1(n * rows);  // [n, rows]
        std::vector<int> seen(rows, 0);                 // [rows] epilogue calls per row
        const MatMulPart gate_up[] = {{&gate.w, g1.data(), rows}, {&up.w, u1.data(), rows}};
        const std::function<void(int64_t, int64_t)> activate = [&](int64_t r0, int64_t r1) {
          for (int64_t r = r0; r < r1; ++r) ++seen[r];
          for (int64_t t = 0; t < n; ++t) {
            SiluMul(g1.data() + t * rows + r0, u1.data() + t * rows + r0, r1 - r0,
                    g1.data() + t * rows + r0);
          }
        };
        MatMulMany(gate_up, 2, x.data(), cols, n, scratch, pool, &activate);
        EXPECT_TRUE(SameBits(g0, g1)) << GgmlTypeName(types[1]) << " gate, " << n << " tokens";
        for (int64_t r = 0; r < rows; ++r) EXPECT_EQ(seen[r], 1) << "row " << r;
      }
    }
  }
}

}  // namespace
}  // namespace lamina
