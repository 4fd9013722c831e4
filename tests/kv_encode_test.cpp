// The KV encoders' kernels (kernels/kv_encode.h): every SIMD twin of the scale search gives the
// scalar twin's bits for every candidate count, group size and input class (ties, outliers,
// scales that round to zero or overflow in fp16, NaN and infinities), and so does the Hadamard
// transform for every block size.
#include "kernels/kv_encode.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "util/cpu_features.h"

namespace lamina {
namespace {

const KvRowFormat kFormats[] = {KvRowFormat::kInt8, KvRowFormat::kQ4_0, KvRowFormat::kQ4Nl};

// Same bits, or both NaN (a NaN's payload follows its operands' order, which the definition
// leaves open).
bool SameFloat(float a, float b) {
  return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b) ||
         (std::isnan(a) && std::isnan(b));
}

struct Twin {
  std::string name;
  KvScaleErrorsFn fn;
};

std::vector<Twin> SimdTwins(KvRowFormat format) {
  const CpuFeatures& cpu = GetCpuFeatures();
  std::vector<Twin> twins;
  if (cpu.HasAvx2Set() && Avx2KvScaleErrors(format) != nullptr) {
    twins.push_back({"avx2", Avx2KvScaleErrors(format)});
  }
  if (cpu.HasAvx512Set() && Avx512KvScaleErrors(format) != nullptr) {
    twins.push_back({"avx512", Avx512KvScaleErrors(format)});
  }
  return twins;
}

// One group of g values of input class `kind`, scaled by `scale`.
void FillGroup(std::mt19937& rng, int kind, float scale, int g, float* x) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int i = 0; i < g; ++i) x[i] = normal(rng) * scale;
  switch (kind) {
    case 1:  // one outlier
      x[rng() % g] *= 40.0f;
      break;
    case 2:  // values on a coarse grid: exact halves of the plain scale's steps (ties)
      for (int i = 0; i < g; ++i) x[i] = std::round(x[i] / scale * 8.0f) / 16.0f * scale;
      break;
    case 3:  // a NaN
      x[rng() % g] = NAN;
      break;
    case 4:  // an infinity
      x[rng() % g] = (rng() & 1) ? INFINITY : -INFINITY;
      break;
    case 5:  // zeros with one value
      for (int i = 0; i < g; ++i) x[i] = 0.0f;
      x[rng() % g] = scale;
      break;
    default:
      break;
  }
}

TEST(KvScaleErrors, SimdTwinsMatchTheScalarTwinBitForBit) {
  std::mt19937 rng(23);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  int checked = 0;
  for (KvRowFormat format : kFormats) {
    const KvScaleErrorsFn scalar = ScalarKvScaleErrors(format);
    ASSERT_NE(scalar, nullptr);
    const std::vector<Twin> twins = SimdTwins(format);
    if (twins.empty()) GTEST_SKIP() << "no AVX2 on this CPU: only the scalar twin runs";
    for (int trial = 0; trial < 3000; ++trial) {
      const int g = 2 << (trial % 5);  // 2 .. 32
      const int n = 1 + trial % kKvScaleCandidates;
      // Magnitudes from fp16-subnormal scales to values whose scale overflows fp16.
      const float scale =
          std::ldexp(1.0f, static_cast<int>(rng() % 48) - 30) * (trial % 17 == 0 ? 1e5f : 1.0f);
      float x[32];
      FillGroup(rng, trial % 6, scale, g, x);
      float amax = 0.0f;
      for (int i = 0; i < g; ++i) {
        if (std::isfinite(x[i])) amax = std::max(amax, std::fabs(x[i]));
      }
      float d[kKvScaleCandidates];  // [n] the encoders' candidates, and edge values
      for (int k = 0; k < n; ++k) {
        switch ((trial + k) % 8) {
          case 0:
            d[k] = 0.0f;
            break;
          case 1:
            d[k] = -amax / (8.0f + 0.1f * k);
            break;
          case 2:
            d[k] = 65520.0f * (1.0f + unit(rng));  // rounds to an fp16 infinity
            break;
          case 3:
            d[k] = 1e-9f * unit(rng);  // below fp16's smallest subnormal
            break;
          default:
            d[k] = amax / (127.0f - 0.25f * (k + trial % 25)) *
                   (format == KvRowFormat::kInt8 ? 1.0f : 16.0f);
            break;
        }
      }
      float want[kKvScaleCandidates], got[kKvScaleCandidates];
      scalar(x, g, d, n, want);
      for (const Twin& twin : twins) {
        for (float& e : got) e = -1.0f;
        twin.fn(x, g, d, n, got);
        for (int k = 0; k < n; ++k) {
          ASSERT_TRUE(SameFloat(want[k], got[k]))
              << twin.name << " format " << static_cast<int>(format) << " trial " << trial << " g "
              << g << " candidate " << k << " of " << n << " d " << d[k] << ": " << want[k]
              << " vs " << got[k];
        }
        for (int k = n; k < kKvScaleCandidates; ++k) {
          ASSERT_EQ(got[k], -1.0f) << twin.name << ": wrote past n";
        }
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 0);
}

TEST(KvHadamard, SimdTwinMatchesTheScalarTwinBitForBit) {
  const KvHadamardFn simd = Avx2KvHadamard();
  if (simd == nullptr || !GetCpuFeatures().HasAvx2Set()) {
    GTEST_SKIP() << "no AVX2 on this CPU: only the scalar twin runs";
  }
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int b = 8; b <= 1024; b *= 2) {
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<float> x(b);  // [b]
      // Magnitudes 2^-20 .. 2^20 apart, so that rounding differs with the order of the adds.
      for (float& v : x) v = normal(rng) * std::ldexp(1.0f, static_cast<int>(rng() % 41) - 20);
      if (trial == 1) x[rng() % b] = INFINITY;
      if (trial == 2) x[rng() % b] = NAN;
      if (trial == 3) x[rng() % b] = 3e38f;  // overflows to inf, then inf - inf = NaN
      std::vector<float> want = x, got = x;
      ScalarKvHadamard()(want.data(), b);
      simd(got.data(), b);
      for (int i = 0; i < b; ++i) {
        ASSERT_TRUE(SameFloat(want[i], got[i])) << "b " << b << " trial " << trial << " element "
                                                << i << ": " << want[i] << " vs " << got[i];
      }
      // The selected kernel (any b, including the scalar fallback below 8) agrees too.
      std::vector<float> best = x;
      BestKvHadamard()(best.data(), b);
      for (int i = 0; i < b; ++i) ASSERT_TRUE(SameFloat(want[i], best[i])) << "b " << b;
    }
  }
  for (int b = 1; b < 8; b *= 2) {
    std::vector<float> x(b, 1.5f), want = x;
    x[0] = -2.0f;
    want[0] = -2.0f;
    ScalarKvHadamard()(want.data(), b);
    BestKvHadamard()(x.data(), b);
    EXPECT_EQ(x, want) << "b " << b;
  }
}

}  // namespace
}  // namespace lamina
