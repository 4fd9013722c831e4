// Test scaffolding the weight types' kernel tests share (quant_tq_test, quant_iq_test,
// quant_iq_lattice_test, quant_lowbit_test): a type's identity against GGML's table, random
// rows checked element by element against the test's own reading of the format definition, the
// scalar dot against the exact dot of that definition, and every ISA against its scalar twin
// with vec_dot_multi batch-invariant.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gguf/ggml_types.h"
#include "quant/quant.h"
#include "quant/types.h"
#include "quant_random.h"
#include "util/cpu_features.h"
#include "util/fp16.h"

namespace lamina {

// A weight type as GGML defines it: lamina's traits and the GGUF reader's table agree with it.
struct ExpectedLayout {
  GgmlType type;
  uint32_t id;
  const char* name;
  int64_t block_size;
  size_t bytes;
};

inline void ExpectLayoutMatchesGgml(const ExpectedLayout& e) {
  SCOPED_TRACE(e.name);
  EXPECT_EQ(static_cast<uint32_t>(e.type), e.id);
  EXPECT_TRUE(IsKnownGgmlType(e.id));
  const TypeTraits& t = GetTypeTraits(e.type);
  EXPECT_STREQ(t.name, e.name);
  EXPECT_EQ(t.block_size, e.block_size);
  EXPECT_EQ(t.type_size, e.bytes);
  EXPECT_TRUE(t.is_quantized);
  EXPECT_EQ(RowSize(e.type, 4096 * e.block_size), 4096 * e.bytes);
  const gguf::GgmlTypeInfo* g = gguf::FindGgmlType(e.id);
  ASSERT_NE(g, nullptr);
  EXPECT_STREQ(g->name, e.name);
  EXPECT_EQ(g->block_size, e.block_size);
  EXPECT_EQ(g->type_size, e.bytes);
}

// Element e of a row of type t, from the test's reading of the layout comments in types.h (not
// the kernels' loops).
using ElementFn = double (*)(GgmlType t, const uint8_t* row, int64_t e);
// The allowed |vec_dot - exact| given sum |w_i a_i|; nullptr where the SIMD twins must give the
// scalar bits.
using BudgetFn = double (*)(GgmlType t, double mag);

// Random rows of every ISA's dequantizer equal the definition exactly.
inline void ExpectDequantizeMatchesDefinition(GgmlType t, ElementFn element, int64_t k,
                                              std::mt19937& rng) {
  SCOPED_TRACE(GgmlTypeName(t));
  const std::vector<uint8_t> row = RandomWeightRow(t, k, rng);
  for (Isa isa : SupportedIsas()) {
    SCOPED_TRACE(IsaName(isa));
    const std::vector<float> y = Dequantize(t, row.data(), k, isa);
    for (int64_t e = 0; e < k; ++e) ASSERT_EQ(y[e], element(t, row.data(), e)) << "element " << e;
  }
}

// A random weight row and n activation rows of the type's vec_dot_type, act_stride bytes apart
// (a gap past each row: act_row_bytes must be honoured).
struct DotCase {
  std::vector<uint8_t> w;
  std::vector<uint8_t> act;
  size_t act_stride = 0;
  int64_t k = 0;
};

inline DotCase MakeDotCase(GgmlType t, int64_t k, int n, std::mt19937& rng) {
  DotCase c;
  c.k = k;
  c.w = RandomWeightRow(t, k, rng);
  const GgmlType at = GetKernels(t, Isa::kScalar).vec_dot_type;
  c.act_stride = RowSize(at, k) + 64;
  c.act.assign(c.act_stride * n, 0xCD);
  for (int r = 0; r < n; ++r) {
    const std::vector<float> x = RandomFloats(k, rng);
    GetKernels(at, Isa::kScalar).quantize(x.data(), c.act.data() + r * c.act_stride, k);
  }
  return c;
}

// Exact (double) dot of the definitions with activation row `row`, and sum |w_i a_i|.
inline void ReferenceDot(GgmlType t, ElementFn element, const DotCase& c, int row, double* dot,
                         double* mag) {
  const GgmlType at = GetKernels(t, Isa::kScalar).vec_dot_type;
  std::vector<float> a(static_cast<size_t>(c.k));
  GetKernels(at, Isa::kScalar).dequantize(c.act.data() + row * c.act_stride, a.data(), c.k);
  *dot = 0;
  *mag = 0;
  for (int64_t e = 0; e < c.k; ++e) {
    const double p = element(t, c.w.data(), e) * a[e];
    *dot += p;
    *mag += std::fabs(p);
  }
}

// The scalar twin within budget of the exact dot, `reps` random cases per size.
inline void ExpectScalarDotMatchesDefinition(GgmlType t, ElementFn element,
                                             const std::vector<int64_t>& sizes, BudgetFn budget,
                                             std::mt19937& rng, int reps = 4) {
  for (int64_t k : sizes) {
    SCOPED_TRACE(std::string(GgmlTypeName(t)) + " k=" + std::to_string(k));
    for (int rep = 0; rep < reps; ++rep) {
      const DotCase c = MakeDotCase(t, k, 1, rng);
      double ref, mag;
      ReferenceDot(t, element, c, 0, &ref, &mag);
      float got = NAN;
      GetKernels(t, Isa::kScalar).vec_dot(k, &got, c.w.data(), c.act.data());
      EXPECT_NEAR(got, ref, budget(t, mag));
    }
  }
}

// Every ISA against the scalar twin (within budget, or bit for bit when budget is nullptr), and
// vec_dot_multi against vec_dot bit for bit for every batch size: a token's result must not
// depend on the batch it arrives in.
inline void ExpectSimdMatchesScalarTwin(GgmlType t, ElementFn element,
                                        const std::vector<int64_t>& sizes, BudgetFn budget,
                                        std::mt19937& rng, int reps = 3) {
  for (int64_t k : sizes) {
    for (int rep = 0; rep < reps; ++rep) {
      const DotCase c = MakeDotCase(t, k, kMaxMultiDot, rng);
      float scalar[kMaxMultiDot];
      double allowed[kMaxMultiDot];
      for (int r = 0; r < kMaxMultiDot; ++r) {
        GetKernels(t, Isa::kScalar)
            .vec_dot(k, &scalar[r], c.w.data(), c.act.data() + r * c.act_stride);
        allowed[r] = 0;
        if (budget != nullptr) {
          double ref, mag;
          ReferenceDot(t, element, c, r, &ref, &mag);
          allowed[r] = budget(t, mag);
        }
      }
      for (Isa isa : SupportedIsas()) {
        SCOPED_TRACE(std::string(GgmlTypeName(t)) + " " + IsaName(isa) + " k=" + std::to_string(k));
        ExpectDotsMatchTwinAndBatchInvariant(GetKernels(t, isa), k, c.w.data(), c.act.data(),
                                             c.act_stride, scalar, allowed);
        if (::testing::Test::HasFatalFailure()) return;
        if (budget == nullptr) {
          for (int r = 0; r < kMaxMultiDot; ++r) {
            float got = NAN;
            GetKernels(t, isa).vec_dot(k, &got, c.w.data(), c.act.data() + r * c.act_stride);
            ASSERT_EQ(F32ToBits(got), F32ToBits(scalar[r])) << "row " << r;
          }
        }
      }
    }
  }
}

}  // namespace lamina
