// The interleaved lattice i-quants (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S and IQ1_M as
// BlockIQ2_XXSx16 ... BlockIQ1_Mx16, repacked at load, Q8_K activations; AVX2 all but
// IQ3_XXS): every ISA with the layout gives the scalar vec_dot of the row before repacking bit for
// bit, for every batch size (1..64 tokens a call) and place in the batch, and writes nothing past
// its tile; the matmul on an interleaved matrix (whole groups and a row range cutting groups) and
// the loader's repacked weights give the plain rows' bits.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "kernels/matmul.h"
#include "model/weight_loader.h"
#include "quant/quant.h"
#include "quant_random.h"
#include "util/thread_pool.h"

namespace lamina {
namespace {

constexpr GgmlType kIqTypes[] = {GgmlType::kIQ2_XXS, GgmlType::kIQ2_XS, GgmlType::kIQ2_S,
                                 GgmlType::kIQ3_XXS, GgmlType::kIQ3_S,  GgmlType::kIQ1_S,
                                 GgmlType::kIQ1_M};

// AVX2 interleaves every type but IQ3_XXS (its row kernel stayed faster at decode).
bool AvxTwoInterleaves(GgmlType t) { return t != GgmlType::kIQ3_XXS; }
bool Interleaves(GgmlType t) { return DetectIsa() != Isa::kAvx2 || AvxTwoInterleaves(t); }

// Random rows: every byte random (any grid index, sign and scale is valid), d a sane f16 (the
// first field of each of these blocks but IQ1_M, whose d is its scale words' top nibbles).
std::vector<uint8_t> RandomIqRows(GgmlType t, int64_t n, std::mt19937& rng) {
  std::vector<uint8_t> rows(RowSize(t, n));
  std::uniform_int_distribution<int> byte(0, 255);
  for (uint8_t& v : rows) v = static_cast<uint8_t>(byte(rng));
  std::uniform_real_distribution<float> scale(-0.05f, 0.05f);
  const size_t bs = GetTypeTraits(t).type_size;
  for (size_t off = 0; off < rows.size(); off += bs) {
    const fp16_t d = F32ToFp16(scale(rng));
    if (t == GgmlType::kIQ1_M) {  // d is the top nibbles of the four scale words
      uint16_t sc[4];             // at the block's end
      std::memcpy(sc, rows.data() + off + bs - 8, 8);
      for (int w = 0; w < 4; ++w) {
        sc[w] = static_cast<uint16_t>((sc[w] & 0x0FFF) | (((d >> (4 * w)) & 0xF) << 12));
      }
      std::memcpy(rows.data() + off + bs - 8, sc, 8);
    } else {
      std::memcpy(rows.data() + off, &d, sizeof(d));
    }
  }
  return rows;
}

struct Acts {
  std::vector<uint8_t> q8k;  // [n][row]
  size_t row = 0;
  const uint8_t* Row(int t) const { return q8k.data() + t * row; }
};
Acts MakeActs(int64_t k, int n, std::mt19937& rng) {
  Acts a;
  a.row = RowSize(GgmlType::kQ8_K, k) + 292;  // a gap between rows
  a.q8k.assign(a.row * n, 0xCD);
  for (int j = 0; j < n; ++j) {
    // Some tokens large, so codes reach +-127.
    const std::vector<float> x = RandomFloats(k, rng, j % 3 == 0 ? 30.0f : 1.0f);
    GetKernels(GgmlType::kQ8_K, Isa::kScalar).quantize(x.data(), a.q8k.data() + j * a.row, k);
  }
  return a;
}

void ExpectKernelsEqualScalarVecDot(GgmlType type, std::mt19937& rng) {
  SCOPED_TRACE(GgmlTypeName(type));
  const TypeKernels& scalar = GetKernels(type, Isa::kScalar);
  const int g = scalar.interleave_rows;
  ASSERT_EQ(g, kQ8_0x16Rows);
  for (const int64_t k : {kQK_K, 3 * kQK_K, 8 * kQK_K}) {
    const size_t row_bytes = RowSize(type, k);
    const std::vector<uint8_t> rows = RandomIqRows(type, k * g, rng);  // [g][row_bytes]
    std::vector<uint8_t> group(rows.size());
    scalar.repack(rows.data(), row_bytes, k, group.data());
    constexpr int kTokens = kLatticeGemmTokens + 3;
    const Acts a = MakeActs(k, kTokens, rng);
    float want[kTokens][kQ8_0x16Rows];  // [token][row]: the scalar vec_dot
    for (int t = 0; t < kTokens; ++t) {
      for (int r = 0; r < g; ++r)
        scalar.vec_dot(k, &want[t][r], rows.data() + r * row_bytes, a.Row(t));
    }
    for (Isa isa : SupportedIsas()) {
      const TypeKernels& kern = GetKernels(type, isa);
      if (isa == Isa::kAvx2 && !AvxTwoInterleaves(type)) {
        EXPECT_EQ(kern.interleave_rows, 0);
        EXPECT_EQ(kern.gemm_interleaved, nullptr);
        continue;
      }
      ASSERT_EQ(kern.interleave_rows, g);
      ASSERT_EQ(kern.gemm_max_tokens, kLatticeGemmTokens);
      ASSERT_EQ(kern.repack, scalar.repack);
      ASSERT_NE(kern.gemm_interleaved, nullptr);
      if (isa != Isa::kScalar) {
        EXPECT_NE(kern.gemm_interleaved, scalar.gemm_interleaved);
      }
      for (int n : {1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 23, kLatticeGemmTokens}) {
        for (int t0 : {0, 1, 3}) {
          const size_t stride = g + 3;
          std::vector<float> out(stride * (n + 1), -12345.0f);  // [n + 1][stride]
          kern.gemm_interleaved(k, group.data(), a.Row(t0), a.row, n, out.data(), stride);
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

TEST(InterleavedIq, KernelsEqualScalarVecDotBitForBit) {
  std::mt19937 rng(53);
  for (GgmlType t : kIqTypes) ExpectKernelsEqualScalarVecDot(t, rng);
}

void ExpectMatMulEqualsPlainRows(GgmlType type, std::mt19937& rng, ThreadPool& pool) {
  SCOPED_TRACE(GgmlTypeName(type));
  const int64_t rows = 48, cols = 3 * kQK_K;
  const std::vector<uint8_t> data = RandomIqRows(type, rows * cols, rng);
  const WeightMatrix plain{type, rows, cols, RowSize(type, cols), data.data()};
  if (!Interleaves(type)) {
    EXPECT_FALSE(CanInterleave(plain));
    return;
  }
  ASSERT_TRUE(CanInterleave(plain));
  std::vector<uint8_t> buf(data.size());  // the interleaved copy: [rows / 16 groups]
  const WeightMatrix w = InterleaveInto(plain, buf.data());
  EXPECT_EQ(w.interleave, kQ8_0x16Rows);
  for (int64_t n_tokens : {1, 3, 20, 75}) {
    const std::vector<float> x = RandomFloats(n_tokens * cols, rng);
    for (auto [lo, hi] : {std::pair<int64_t, int64_t>{0, rows}, {5, 27}, {16, 32}}) {
      std::vector<float> y(static_cast<size_t>(n_tokens * rows), NAN);  // [n_tokens, rows]
      std::vector<float> y_plain(y.size(), NAN);                        // [n_tokens, rows]
      MatMulScratch scratch;
      MatMulRows(w, lo, hi, x.data(), cols, n_tokens, y.data(), rows, scratch, pool);
      MatMulRows(plain, lo, hi, x.data(), cols, n_tokens, y_plain.data(), rows, scratch, pool);
      for (size_t i = 0; i < y.size(); ++i) {
        const int64_t r = static_cast<int64_t>(i) % rows;
        if (r < lo || r >= hi) {
          ASSERT_TRUE(std::isnan(y[i])) << "wrote row " << r << " outside the range";
          continue;
        }
        ASSERT_EQ(F32ToBits(y[i]), F32ToBits(y_plain[i])) << "tokens " << n_tokens << " at " << i;
      }
    }
  }
}

TEST(InterleavedIq, MatMulEqualsPlainRowsBitForBit) {
  std::mt19937 rng(59);
  ThreadPool pool(2);
  for (GgmlType t : kIqTypes) ExpectMatMulEqualsPlainRows(t, rng, pool);
}

// The loader repacks the i-quant matmul weights of the synthetic fixtures (on AVX2 all but
// IQ3_XXS) and keeps
// the embedding as rows; the repacked weights give the mapped rows' bits.
TEST(InterleavedIq, LoaderRepacksMatMulWeights) {
  std::mt19937 rng(61);
  ThreadPool pool(2);
  const std::vector<float> x = RandomFloats(5 * 256, rng);
  for (GgmlType type : kIqTypes) {
    const std::string name = GgmlTypeName(type);
    SCOPED_TRACE(name);
    auto file = gguf::File::Open(std::string(LAMINA_SOURCE_DIR) +
                                 "/tests/fixtures/models/synth-llama-d256." + name + ".gguf");
    ASSERT_TRUE(file.ok()) << file.error().message;
    std::vector<WeightBuffer> store;
    WeightLoader L(**file, &store);
    WeightLoader plain_loader(**file);
    int found = 0;
    for (const char* t : {"blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.attn_output.weight",
                          "blk.0.ffn_gate.weight", "blk.0.ffn_up.weight"}) {
      const gguf::TensorInfo* info = (*file)->FindTensor(t);
      if (info == nullptr || info->type != type || info->ne[0] != 256) continue;
      ++found;
      const WeightMatrix w = L.Matrix(t, info->ne[0], info->ne[1]);
      const WeightMatrix p = plain_loader.Matrix(t, info->ne[0], info->ne[1]);
      ASSERT_TRUE(L.status().ok() && plain_loader.status().ok());
      EXPECT_EQ(w.interleave, Interleaves(type) ? kQ8_0x16Rows : 0) << t;
      EXPECT_EQ(p.interleave, 0);
      const int64_t rows = info->ne[1];
      std::vector<float> y0(5 * rows), y1(5 * rows);  // [5 tokens, rows]
      MatMulScratch scratch;
      MatMul(w, x.data(), 256, 5, y0.data(), rows, scratch, pool);
      MatMul(p, x.data(), 256, 5, y1.data(), rows, scratch, pool);
      for (size_t i = 0; i < y0.size(); ++i) ASSERT_EQ(F32ToBits(y0[i]), F32ToBits(y1[i])) << t;
    }
    EXPECT_GT(found, 0);
    const WeightMatrix embd = L.Matrix("token_embd.weight", 256, 512, true, WeightUse::kRows);
    EXPECT_EQ(embd.interleave, 0);
  }
}

}  // namespace
}  // namespace lamina
