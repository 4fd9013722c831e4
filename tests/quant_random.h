// Test helpers for the weight types' kernel tests: random rows of a type (every byte value, then
// a sane scale in each block) and the check that the model's matmul equals vec_dot bit for bit.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/matmul.h"
#include "quant/quant.h"
#include "quant/types.h"
#include "util/cpu_features.h"
#include "util/fp16.h"
#include "util/thread_pool.h"

namespace lamina {

// The ISAs this CPU runs (LAMINA_ISA caps them), scalar first.
inline std::vector<Isa> SupportedIsas() {
  std::vector<Isa> isas = {Isa::kScalar};
  if (DetectIsa() >= Isa::kAvx2) isas.push_back(Isa::kAvx2);
  if (DetectIsa() >= Isa::kAvx512) isas.push_back(Isa::kAvx512);
  return isas;
}

// k values of type t dequantized by the kernels of `isa`.
inline std::vector<float> Dequantize(GgmlType t, const void* blocks, int64_t k,
                                     Isa isa = Isa::kScalar) {
  std::vector<float> y(static_cast<size_t>(k));
  GetKernels(t, isa).dequantize(blocks, y.data(), k);
  return y;
}

// A type lamina reads but never writes (its files come from llama-quantize): on every ISA its
// table entry computes with activations of type `act`, dequantizes, has no quantizer, and the
// SIMD ISAs have their own vec_dot and vec_dot_multi.
inline void ExpectReadOnlyTypeKernels(GgmlType t, GgmlType act) {
  EXPECT_TRUE(IsSupportedWeightType(t)) << GgmlTypeName(t);
  const TypeKernels& scalar = GetKernels(t, Isa::kScalar);
  for (Isa isa : SupportedIsas()) {
    SCOPED_TRACE(std::string(GgmlTypeName(t)) + " " + IsaName(isa));
    const TypeKernels& k = GetKernels(t, isa);
    EXPECT_EQ(k.type, t);
    EXPECT_EQ(k.vec_dot_type, act);
    EXPECT_NE(k.dequantize, nullptr);
    EXPECT_EQ(k.quantize, nullptr);
    ASSERT_NE(k.vec_dot, nullptr);
    ASSERT_NE(k.vec_dot_multi, nullptr);
    if (isa != Isa::kScalar) {
      EXPECT_NE(k.vec_dot, scalar.vec_dot) << "not vectorized";
      EXPECT_NE(k.vec_dot_multi, scalar.vec_dot_multi) << "not vectorized";
    }
  }
}

// k values of type t: random bytes (every code, so unused codes are exercised too), then per
// block a small fp16 scale where the layout keeps it (MXFP4: an exponent near 2^0; NVFP4: small
// UE4M3 sub-block scales).
inline std::vector<uint8_t> RandomWeightRow(GgmlType t, int64_t k, std::mt19937& rng) {
  std::vector<uint8_t> row(RowSize(t, k));
  std::uniform_int_distribution<int> byte(0, 255);
  for (uint8_t& v : row) v = static_cast<uint8_t>(byte(rng));
  std::uniform_real_distribution<float> scale(-0.05f, 0.05f);
  std::uniform_int_distribution<int> exponent(110, 135);
  const size_t bs = GetTypeTraits(t).type_size;
  // The ternary types keep d last in the block, the others first.
  const bool d_last = t == GgmlType::kTQ1_0 || t == GgmlType::kTQ2_0;
  for (size_t off = 0; off < row.size(); off += bs) {
    if (t == GgmlType::kMXFP4) {
      row[off] = static_cast<uint8_t>(exponent(rng));
    } else if (t == GgmlType::kNVFP4) {
      // Four UE4M3 sub-block scales from 2^-8 to about 1 (exponent fields 0..7; 0 subnormal).
      std::uniform_int_distribution<int> ue4m3(0, 0x3F);
      for (int s = 0; s < 4; ++s) row[off + s] = static_cast<uint8_t>(ue4m3(rng));
    } else if (t == GgmlType::kIQ1_M) {
      // IQ1_M has no d field: d's four nibbles are the top nibbles of the last 4 uint16 words.
      const fp16_t d = F32ToFp16(scale(rng));
      for (int w = 0; w < 4; ++w) {
        uint8_t& hi = row[off + bs - 8 + 2 * w + 1];
        hi = static_cast<uint8_t>((hi & 0x0F) | (((d >> (4 * w)) & 0xF) << 4));
      }
    } else {
      const fp16_t d = F32ToFp16(scale(rng));
      std::memcpy(row.data() + off + (d_last ? bs - 2 : 0), &d, 2);
    }
  }
  return row;
}

inline std::vector<float> RandomFloats(int64_t n, std::mt19937& rng, float sigma = 1.0f) {
  std::normal_distribution<float> dist(0.0f, sigma);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

// One ISA's kernels of a type on kMaxMultiDot activation rows (act + r * act_stride): vec_dot
// of each row within budget[r] of the scalar twin's scalar[r], and vec_dot_multi equal to
// vec_dot bit for bit for every batch size 1..kMaxMultiDot, writing nothing past the batch.
inline void ExpectDotsMatchTwinAndBatchInvariant(const TypeKernels& kern, int64_t k,
                                                 const uint8_t* w, const uint8_t* act,
                                                 size_t act_stride, const float* scalar,
                                                 const double* budget) {
  float single[kMaxMultiDot];
  for (int r = 0; r < kMaxMultiDot; ++r) {
    kern.vec_dot(k, &single[r], w, act + r * act_stride);
    ASSERT_NEAR(single[r], scalar[r], budget[r]) << "row " << r;
  }
  for (int n = 1; n <= kMaxMultiDot; ++n) {
    float out[kMaxMultiDot + 1];
    out[n] = -12345.0f;
    kern.vec_dot_multi(k, w, act, act_stride, n, out);
    for (int r = 0; r < n; ++r) {
      ASSERT_EQ(F32ToBits(out[r]), F32ToBits(single[r])) << "n_act " << n << " row " << r;
    }
    EXPECT_EQ(out[n], -12345.0f) << "wrote past n_act";
  }
}

// The model's matmul with weights of each type (the path a loaded GGUF takes): activations
// quantized to the type's vec_dot_type, then the multi or tile kernels, on two threads. Every
// output equals vec_dot of its row and token at the best ISA, whatever the batch size: 1
// (decode), 3, and 20 (past the AVX2 tiles' 16-token threshold).
inline void ExpectMatMulEqualsVecDot(const std::vector<GgmlType>& types) {
  std::mt19937 rng(11);
  ThreadPool pool(2);
  for (GgmlType t : types) {
    const int64_t rows = 37, cols = 2 * kQK_K;
    const std::vector<uint8_t> data = RandomWeightRow(t, rows * cols, rng);
    const WeightMatrix w{t, rows, cols, RowSize(t, cols), data.data()};
    const TypeKernels& kern = GetKernels(t);
    const TypeKernels& act_kern = GetKernels(kern.vec_dot_type);
    for (int64_t n_tokens : {1, 3, 20}) {
      const std::vector<float> x = RandomFloats(n_tokens * cols, rng);
      std::vector<float> y(static_cast<size_t>(n_tokens * rows), NAN);
      MatMulScratch scratch;
      MatMul(w, x.data(), cols, n_tokens, y.data(), rows, scratch, pool);
      std::vector<uint8_t> a(RowSize(kern.vec_dot_type, cols));
      for (int64_t j = 0; j < n_tokens; ++j) {
        act_kern.quantize(x.data() + j * cols, a.data(), cols);
        for (int64_t r = 0; r < rows; ++r) {
          float want = 0.0f;
          kern.vec_dot(cols, &want, w.Row(r), a.data());
          ASSERT_EQ(F32ToBits(y[j * rows + r]), F32ToBits(want))
              << GgmlTypeName(t) << " tokens " << n_tokens << " token " << j << " row " << r;
        }
      }
    }
  }
}

}  // namespace lamina
