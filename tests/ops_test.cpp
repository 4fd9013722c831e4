// The activation kernels: PolyExp's accuracy against exp, GELU-tanh against its formula, and
// every SIMD path's bits against the scalar twin's (whole rows, partial vectors, aliasing, rows
// split into pieces); RmsNormRows against RmsNorm row by row.
#include "kernels/ops.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/activation_kernels.h"
#include "util/fp16.h"

namespace lamina {
namespace {

// Distance in representable floats between a and b (both finite, same sign or zero).
int64_t UlpDistance(float a, float b) {
  int32_t ia, ib;
  std::memcpy(&ia, &a, sizeof(ia));
  std::memcpy(&ib, &b, sizeof(ib));
  return std::llabs(static_cast<int64_t>(ia) - ib);
}

TEST(OpsPolyExp, WithinTwoUlpOverTheNormalRange) {
  // exp's result is a normal float for x in [ln(FLT_MIN), ln(FLT_MAX)] ~ [-87.336, 88.722].
  int64_t worst = 0;
  float worst_x = 0;
  auto check = [&](float x) {
    const float want = static_cast<float>(std::exp(static_cast<double>(x)));
    const float got = PolyExp(x);
    const int64_t d = UlpDistance(want, got);
    if (d > worst) worst = d, worst_x = x;
  };
  for (int i = 0; i <= 4000000; ++i) check(-87.33f + (88.72f + 87.33f) * (i / 4000000.0f));
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> small(-1.0f, 1.0f);
  for (int i = 0; i < 1000000; ++i) check(small(rng));
  EXPECT_LE(worst, 2) << "at x = " << worst_x;
  EXPECT_EQ(PolyExp(0.0f), 1.0f);
}

TEST(OpsPolyExp, SaturatesAndReachesTheSubnormals) {
  EXPECT_EQ(PolyExp(89.0f), std::numeric_limits<float>::infinity());
  EXPECT_EQ(PolyExp(1000.0f), std::numeric_limits<float>::infinity());
  EXPECT_EQ(PolyExp(std::numeric_limits<float>::infinity()),
            std::numeric_limits<float>::infinity());
  EXPECT_EQ(PolyExp(-200.0f), 0.0f);
  EXPECT_EQ(PolyExp(-std::numeric_limits<float>::infinity()), 0.0f);
  EXPECT_TRUE(std::isfinite(PolyExp(88.72f)));
  // Subnormal results: within two of the smallest subnormal steps of exp.
  constexpr float kDenormMin = std::numeric_limits<float>::denorm_min();
  for (float x = -103.9f; x < -87.4f; x += 0.01f) {
    const float want = static_cast<float>(std::exp(static_cast<double>(x)));
    EXPECT_LE(std::fabs(PolyExp(x) - want), 2 * kDenormMin) << x;
  }
}

TEST(OpsActivations, SiluMatchesTheDefinition) {
  std::mt19937 rng(9);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  const ActivationKernels& k = BestActivationKernels();
  std::vector<float> x(4096), out(4096);
  for (float& v : x) v = normal(rng);
  x[0] = -200.0f, x[1] = 200.0f, x[2] = 0.0f;
  k.silu(x.data(), static_cast<int64_t>(x.size()), out.data());
  for (size_t i = 0; i < x.size(); ++i) {
    const double want = x[i] / (1.0 + std::exp(-static_cast<double>(x[i])));
    EXPECT_NEAR(out[i], want, 4e-7 * std::fabs(want) + 1e-37) << x[i];
  }
}

// Inputs spanning every branch: ordinary gates, both saturations, the clamp limits.
std::vector<float> Inputs(std::mt19937& rng, size_t n) {
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::uniform_real_distribution<float> wide(-130.0f, 130.0f);
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = i % 5 == 4 ? wide(rng) : normal(rng);
  return v;
}

void ExpectKernelsMatch(const ActivationKernels& simd) {
  const ActivationKernels& ref = ScalarActivationKernels();
  std::mt19937 rng(17);
  for (int64_t n : {1, 3, 7, 8, 9, 15, 16, 17, 31, 33, 100, 1027}) {
    const std::vector<float> g = Inputs(rng, n), u = Inputs(rng, n);
    std::vector<float> a(n), b(n);
    ref.silu(g.data(), n, a.data());
    simd.silu(g.data(), n, b.data());
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), n * sizeof(float))) << "silu n " << n;
    ref.silu_mul(g.data(), u.data(), n, a.data());
    simd.silu_mul(g.data(), u.data(), n, b.data());
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), n * sizeof(float))) << "silu_mul n " << n;
    std::vector<float> in_place = g;  // out aliasing gate, as the FFN calls it
    simd.silu_mul(in_place.data(), u.data(), n, in_place.data());
    EXPECT_EQ(0, std::memcmp(a.data(), in_place.data(), n * sizeof(float))) << n;
    ref.swiglu_oai_mul(g.data(), u.data(), n, 1.702f, 7.0f, a.data());
    simd.swiglu_oai_mul(g.data(), u.data(), n, 1.702f, 7.0f, b.data());
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), n * sizeof(float))) << "swiglu_oai n " << n;
    ref.gelu_tanh_mul(g.data(), u.data(), n, a.data());
    simd.gelu_tanh_mul(g.data(), u.data(), n, b.data());
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), n * sizeof(float))) << "gelu_tanh_mul n " << n;
    in_place = g;
    simd.gelu_tanh_mul(in_place.data(), u.data(), n, in_place.data());
    EXPECT_EQ(0, std::memcmp(a.data(), in_place.data(), n * sizeof(float))) << n;
    // A row in pieces (each thread's rows of a parallel FFN) gives the same bits.
    std::vector<float> pieces(n);
    for (int64_t i0 = 0; i0 < n; i0 += 5) {
      const int64_t len = std::min<int64_t>(5, n - i0);
      simd.silu_mul(g.data() + i0, u.data() + i0, len, pieces.data() + i0);
    }
    ref.silu_mul(g.data(), u.data(), n, a.data());
    EXPECT_EQ(0, std::memcmp(a.data(), pieces.data(), n * sizeof(float))) << "pieces n " << n;
  }
}

// GELU-tanh * up as ggml's GEGLU computes it (the formula the table replaced, step for step).
float GeluTanhMulReference(float g, float u) {
  constexpr float kSqrt2OverPi = 0.79788456080286535587989211986876f;
  constexpr float kCoef = 0.044715f;
  float act;
  if (g <= -10.0f) {
    act = 0.0f;
  } else if (g >= 10.0f) {
    act = g;
  } else {
    const float x = Fp16ToF32(F32ToFp16(g));
    act = Fp16ToF32(
        F32ToFp16(0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * x * (1.0f + kCoef * x * x)))));
  }
  return act * u;
}

// Every kernel (scalar twin and each SIMD path) against the formula: every f16 gate value, the
// +-10 edges, infinities and random gates, bit for bit.
TEST(OpsActivations, GeluTanhMulMatchesTheFormulaOnEveryPath) {
  std::vector<float> g;
  for (uint32_t h = 0; h < 65536; ++h) {
    const float x = Fp16ToF32(static_cast<fp16_t>(h));
    if (!std::isnan(x)) g.push_back(x);
  }
  for (float x :
       {-10.0f, 10.0f, std::nextafter(-10.0f, 0.0f), std::nextafter(10.0f, 0.0f),
        std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()}) {
    g.push_back(x);
  }
  std::mt19937 rng(29);
  const std::vector<float> extra = Inputs(rng, 4099);
  g.insert(g.end(), extra.begin(), extra.end());
  const int64_t n = static_cast<int64_t>(g.size());
  std::vector<float> u(n);
  std::normal_distribution<float> normal;
  for (float& v : u) v = normal(rng);
  std::vector<float> want(n);
  for (int64_t i = 0; i < n; ++i) want[i] = GeluTanhMulReference(g[i], u[i]);
  std::vector<const ActivationKernels*> all = {&ScalarActivationKernels()};
  if (const ActivationKernels* k = Avx2ActivationKernels()) all.push_back(k);
  if (const ActivationKernels* k = Avx512ActivationKernels()) all.push_back(k);
  for (const ActivationKernels* k : all) {
    std::vector<float> got(n);
    k->gelu_tanh_mul(g.data(), u.data(), n, got.data());
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(std::bit_cast<uint32_t>(want[i]), std::bit_cast<uint32_t>(got[i]))
          << "gate " << g[i] << " up " << u[i];
    }
  }
}

TEST(OpsActivations, Avx2MatchesScalarTwinBitForBit) {
  const ActivationKernels* k = Avx2ActivationKernels();
  if (k == nullptr) GTEST_SKIP() << "no AVX2 kernels on this CPU";
  ExpectKernelsMatch(*k);
}

TEST(OpsActivations, Avx512MatchesScalarTwinBitForBit) {
  const ActivationKernels* k = Avx512ActivationKernels();
  if (k == nullptr) GTEST_SKIP() << "no AVX-512 kernels on this CPU";
  ExpectKernelsMatch(*k);
}

TEST(OpsActivations, PublicEntryPointsUseTheSelectedKernels) {
  std::mt19937 rng(3);
  const std::vector<float> g = Inputs(rng, 77), u = Inputs(rng, 77);
  std::vector<float> a(77), b(77);
  SiluMul(g.data(), u.data(), 77, a.data());
  ScalarActivationKernels().silu_mul(g.data(), u.data(), 77, b.data());
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), sizeof(float) * 77));
}

// RMSNorm as GGML computes it: the squares summed in double in index order, one row.
void RmsNormOneRow(const float* x, const float* w, int64_t n, float eps, float* out) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(x[i]) * x[i];
  const float scale = 1.0f / std::sqrt(static_cast<float>(sum / n) + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = w != nullptr ? (x[i] * scale) * w[i] : x[i] * scale;
}

// RmsNorm, and a batch of rows normalised side by side, give every row GGML's order's bits: any row
// count (the groups of kRmsNormRowsAtOnce and a remainder; on AVX-512 the 8-row twin,
// Avx512SumSquares8 and Avx512ScaleRow, for 8, 9 and 16 rows), strides past the row, rows of 1 to
// 1,025 values with magnitudes far apart (where a different order of the double sum would show), no
// weight, and in place.
TEST(OpsRmsNormRows, EveryRowIsRmsNormsBits) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f), mag(-30.0f, 30.0f);
  for (int64_t n : {1, 3, 64, 128, 1000, 1025}) {
    for (int64_t rows : {1, 2, 3, 4, 5, 7, 8, 9, 16}) {
      const int64_t stride = n + (rows % 3);
      std::vector<float> x(static_cast<size_t>(rows * stride)), w(static_cast<size_t>(n));
      for (float& v : x) v = u(rng) * std::exp2(std::round(mag(rng)));
      for (float& v : w) v = u(rng);
      for (const float* wp :
           {static_cast<const float*>(w.data()), static_cast<const float*>(nullptr)}) {
        std::vector<float> want(x.size(), 0.0f), got(x.size(), 0.0f);  // [rows][stride]
        for (int64_t r = 0; r < rows; ++r) {
          RmsNormOneRow(x.data() + r * stride, wp, n, 1e-6f, want.data() + r * stride);
          std::vector<float> one(static_cast<size_t>(n));
          RmsNorm(x.data() + r * stride, wp, n, 1e-6f, one.data());
          ASSERT_EQ(0, std::memcmp(one.data(), want.data() + r * stride, sizeof(float) * n));
        }
        RmsNormRows(x.data(), stride, wp, n, 1e-6f, rows, got.data(), stride);
        ASSERT_EQ(0, std::memcmp(want.data(), got.data(), sizeof(float) * x.size()))
            << "n " << n << " rows " << rows;
        std::vector<float> in_place = x;
        RmsNormRows(in_place.data(), stride, wp, n, 1e-6f, rows, in_place.data(), stride);
        for (int64_t r = 0; r < rows; ++r) {
          ASSERT_EQ(0, std::memcmp(want.data() + r * stride, in_place.data() + r * stride,
                                   sizeof(float) * n))
              << "in place, n " << n << " rows " << rows << " row " << r;
        }
      }
    }
  }
}

}  // namespace
}  // namespace lamina
