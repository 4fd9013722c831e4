// The batching contract of every weight kernel on every ISA: vec_dot_multi's out[j] is
// bit-identical to vec_dot on row j alone, whatever n_act is. Matmul relies on it so that a
// token's logits do not depend on the batch it arrives in (prompt, decode, verify window).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "quant/quant.h"

namespace lamina {
namespace {

std::vector<Isa> SupportedIsas() {
  std::vector<Isa> isas = {Isa::kScalar};
  if (DetectIsa() >= Isa::kAvx2) isas.push_back(Isa::kAvx2);
  if (DetectIsa() >= Isa::kAvx512) isas.push_back(Isa::kAvx512);
  return isas;
}

TEST(QuantContract, MultiDotEqualsSingleDotBitForBit) {
  const GgmlType types[] = {
      GgmlType::kF32,   GgmlType::kF16,     GgmlType::kBF16,  GgmlType::kQ4_0,    GgmlType::kQ4_1,
      GgmlType::kQ5_0,  GgmlType::kQ5_1,    GgmlType::kQ8_0,  GgmlType::kQ2_K,    GgmlType::kQ3_K,
      GgmlType::kQ4_K,  GgmlType::kQ5_K,    GgmlType::kQ6_K,  GgmlType::kIQ4_NL,  GgmlType::kIQ4_XS,
      GgmlType::kMXFP4, GgmlType::kTQ1_0,   GgmlType::kTQ2_0, GgmlType::kIQ2_XXS, GgmlType::kIQ2_XS,
      GgmlType::kIQ2_S, GgmlType::kIQ3_XXS, GgmlType::kIQ3_S, GgmlType::kIQ1_S,   GgmlType::kIQ1_M,
      GgmlType::kNVFP4, GgmlType::kQ1_0,    GgmlType::kQ2_0};
  std::mt19937 rng(17);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t k = 512;
  for (Isa isa : SupportedIsas()) {
    for (GgmlType t : types) {
      const TypeKernels& kern = GetKernels(t, isa);
      if (kern.vec_dot == nullptr || kern.vec_dot_multi == nullptr) continue;
      const TypeKernels& act = GetKernels(kern.vec_dot_type, isa);
      ASSERT_NE(act.quantize, nullptr);
      // A weight row made by dequantizing random bytes would need per-type care; quantizing
      // a float row works where a quantizer exists, else random bytes with sane scales.
      std::vector<float> wf(k);
      for (float& v : wf) v = normal(rng);
      std::vector<uint8_t> w(RowSize(t, k));
      if (kern.quantize != nullptr) {
        kern.quantize(wf.data(), w.data(), k);
      } else {
        for (auto& b : w) b = static_cast<uint8_t>(rng());
        // Blocks keep their fp16 scales (MXFP4: its exponent) at known offsets; make them small.
        const size_t bs = GetTypeTraits(t).type_size;
        for (size_t off = 0; off < w.size(); off += bs) {
          const fp16_t d = F32ToFp16(0.01f);
          if (t == GgmlType::kMXFP4) {
            w[off] = 120;
          } else if (t == GgmlType::kNVFP4) {  // four UE4M3 sub-block scales, 2^-4 each
            std::memset(&w[off], 0x18, 4);
          } else if (t == GgmlType::kQ1_0 || t == GgmlType::kQ2_0 || t == GgmlType::kIQ4_NL ||
                     t == GgmlType::kIQ4_XS || t == GgmlType::kIQ2_XXS || t == GgmlType::kIQ2_XS ||
                     t == GgmlType::kIQ2_S || t == GgmlType::kIQ3_XXS || t == GgmlType::kIQ3_S ||
                     t == GgmlType::kIQ1_S) {
            std::memcpy(&w[off], &d, 2);
          } else if (t == GgmlType::kIQ1_M) {  // d in the top nibbles of the last 4 words
            for (int i = 0; i < 4; ++i) {
              uint8_t& hi = w[off + bs - 8 + 2 * i + 1];
              hi = static_cast<uint8_t>((hi & 0x0F) | (((d >> (4 * i)) & 0xF) << 4));
            }
          } else if (t == GgmlType::kQ4_K || t == GgmlType::kQ5_K) {
            std::memcpy(&w[off], &d, 2);
            std::memcpy(&w[off + 2], &d, 2);
          } else if (t == GgmlType::kQ2_K) {
            std::memcpy(&w[off + bs - 4], &d, 2);
            std::memcpy(&w[off + bs - 2], &d, 2);
          } else {
            std::memcpy(&w[off + bs - 2], &d, 2);
          }
        }
      }
      const size_t act_bytes = RowSize(kern.vec_dot_type, k);
      std::vector<uint8_t> acts(act_bytes * kMaxMultiDot);
      std::vector<float> xf(k);
      for (int j = 0; j < kMaxMultiDot; ++j) {
        for (float& v : xf) v = normal(rng);
        act.quantize(xf.data(), acts.data() + j * act_bytes, k);
      }
      for (int n = 1; n <= kMaxMultiDot; ++n) {
        float out[kMaxMultiDot];
        kern.vec_dot_multi(k, w.data(), acts.data(), act_bytes, n, out);
        for (int j = 0; j < n; ++j) {
          float single = 0.0f;
          kern.vec_dot(k, &single, w.data(), acts.data() + j * act_bytes);
          EXPECT_EQ(F32ToBits(out[j]), F32ToBits(single))
              << GgmlTypeName(t) << " on " << IsaName(isa) << ", n_act " << n << ", row " << j;
        }
      }
    }
  }
}

// The tile kernel, where an ISA has one: every (row, token) output is vec_dot's bits, whatever
// the tile shape and the pair's place in it. Odd block counts take the lone-block tail; float
// types also a 16-element step and a masked tail.
TEST(QuantContract, TileDotEqualsSingleDotBitForBit) {
  const GgmlType types[] = {GgmlType::kQ4_0, GgmlType::kQ5_0, GgmlType::kQ8_0,
                            GgmlType::kF32,  GgmlType::kF16,  GgmlType::kBF16};
  std::mt19937 rng(19);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  // Float types take any k: 405 = 12 steps of 32, the lone 16-step and a masked tail of 5.
  for (const int64_t k : {int64_t{32}, int64_t{512}, int64_t{544}, int64_t{405}, int64_t{7}}) {
    for (Isa isa : SupportedIsas()) {
      for (GgmlType t : types) {
        if (k % 32 != 0 && GetTypeTraits(t).block_size != 1) continue;
        const TypeKernels& kern = GetKernels(t, isa);
        if (kern.vec_dot_tile == nullptr) continue;
        const TypeKernels& act = GetKernels(kern.vec_dot_type, isa);
        const size_t w_bytes = RowSize(t, k);
        std::vector<uint8_t> w(w_bytes * kMaxTileRows);
        std::vector<float> xf(k);
        for (int i = 0; i < kMaxTileRows; ++i) {
          for (float& v : xf) v = normal(rng);
          kern.quantize(xf.data(), w.data() + i * w_bytes, k);
        }
        const size_t act_bytes = RowSize(kern.vec_dot_type, k);
        ASSERT_GE(kern.tile_max_tokens, kMaxMultiDot);
        ASSERT_LE(kern.tile_max_tokens, kMaxTileTokens);
        std::vector<uint8_t> acts(act_bytes * kMaxTileTokens);
        for (int j = 0; j < kMaxTileTokens; ++j) {
          for (float& v : xf) v = normal(rng);
          act.quantize(xf.data(), acts.data() + j * act_bytes, k);
        }
        for (int nr = 1; nr <= kMaxTileRows; ++nr) {
          for (int n = 1; n <= kern.tile_max_tokens; ++n) {
            float out[kMaxTileTokens * kMaxTileRows];
            kern.vec_dot_tile(k, w.data(), w_bytes, nr, acts.data(), act_bytes, n, out,
                              kMaxTileRows);
            for (int j = 0; j < n; ++j) {
              for (int i = 0; i < nr; ++i) {
                float single = 0.0f;
                kern.vec_dot(k, &single, w.data() + i * w_bytes, acts.data() + j * act_bytes);
                EXPECT_EQ(F32ToBits(out[j * kMaxTileRows + i]), F32ToBits(single))
                    << GgmlTypeName(t) << " on " << IsaName(isa) << ", k " << k << ", tile " << nr
                    << "x" << n << ", row " << i << ", token " << j;
              }
            }
          }
        }
      }
    }
  }
}

// The canonical order of the AVX-512 float dots (F32, F16, BF16), written out element by element:
// 16 lanes, lane l the fused sum of w[i] a[i] for i = l (mod 16) in increasing i (the k % 16
// tail, zero-padded, last), then (x[i] + x[i + 8]), + the lane 4 up, (0 + 2) + (1 + 3). Every
// AVX-512 float kernel (vec_dot, vec_dot_multi, tiles of any shape) must give these bits; the
// other ISAs keep their own orders (AVX2: 8 lanes and a scalar tail; scalar: double).
float Avx512FloatOrder(const std::vector<float>& w, const std::vector<float>& a) {
  float lane[16] = {};
  for (size_t i = 0; i < w.size(); ++i) lane[i % 16] = std::fma(w[i], a[i], lane[i % 16]);
  float t8[8], t4[4];
  for (int i = 0; i < 8; ++i) t8[i] = lane[i] + lane[i + 8];
  for (int i = 0; i < 4; ++i) t4[i] = t8[i] + t8[i + 4];
  return (t4[0] + t4[2]) + (t4[1] + t4[3]);
}

TEST(QuantContract, Avx512FloatDotsKeepTheCanonicalOrder) {
  if (DetectIsa() < Isa::kAvx512) GTEST_SKIP() << "no AVX-512 on this machine";
  std::mt19937 rng(23);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const int64_t k : {int64_t{7}, int64_t{16}, int64_t{32}, int64_t{48}, int64_t{405},
                          int64_t{512}, int64_t{1000}}) {
    for (GgmlType t : {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16}) {
      const TypeKernels& kern = GetKernels(t, Isa::kAvx512);
      const TypeKernels& act = GetKernels(kern.vec_dot_type, Isa::kAvx512);
      std::vector<float> xf(k), wf(k), af(k);
      std::vector<uint8_t> w(RowSize(t, k)), a(RowSize(kern.vec_dot_type, k));
      for (int rep = 0; rep < 8; ++rep) {
        for (float& v : xf) v = normal(rng);
        kern.quantize(xf.data(), w.data(), k);
        for (float& v : xf) v = normal(rng);
        act.quantize(xf.data(), a.data(), k);
        kern.dequantize(w.data(), wf.data(), k);
        act.dequantize(a.data(), af.data(), k);
        float got = NAN;
        kern.vec_dot(k, &got, w.data(), a.data());
        EXPECT_EQ(F32ToBits(got), F32ToBits(Avx512FloatOrder(wf, af)))
            << GgmlTypeName(t) << ", k " << k << ", case " << rep;
      }
    }
  }
}

}  // namespace
}  // namespace lamina
