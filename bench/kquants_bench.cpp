// K-quant (and IQ4_XS, TQ1_0, TQ2_0, the lattice i-quants; NVFP4, Q1_0 and Q2_0 with Q4_0 and
// MXFP4 beside them, on Q8_0 activations) dot-product throughput per type and ISA: one k=4096 dot,
// a 2048x2048 matvec (decode), and the same matrix against 8 activation rows through vec_dot_multi
// (prompt processing). Bytes/s counts weight bytes read, the figure that bounds decode speed.
#include <benchmark/benchmark.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "quant/quant.h"
#include "quant/types.h"
#include "util/fp16.h"

namespace lamina {
namespace {

constexpr GgmlType kTypes[] = {
    GgmlType::kQ2_K, GgmlType::kQ3_K, GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K,
    GgmlType::kIQ4_XS, GgmlType::kTQ1_0, GgmlType::kTQ2_0, GgmlType::kIQ2_XXS, GgmlType::kIQ2_XS,
    GgmlType::kIQ2_S, GgmlType::kIQ3_XXS, GgmlType::kIQ3_S, GgmlType::kIQ1_S, GgmlType::kIQ1_M,
    // NVFP4, Q1_0, Q2_0 (Q8_0 activations) and the 4-bit Q8_0 types to compare NVFP4 with.
    GgmlType::kQ4_0, GgmlType::kMXFP4, GgmlType::kNVFP4, GgmlType::kQ1_0, GgmlType::kQ2_0};

// Random weight rows: any bytes are valid codes and scales; d/dmin are then overwritten with a
// small fp16 so no Inf/NaN slows the float path.
std::vector<uint8_t> RandomWeights(GgmlType t, int64_t rows, int64_t k) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> byte(0, 255);
  const size_t row_bytes = RowSize(t, k);
  std::vector<uint8_t> w(rows * row_bytes);
  for (auto& v : w) v = static_cast<uint8_t>(byte(rng));
  const size_t bs = GetTypeTraits(t).type_size;
  size_t half_off = 0;
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
    case GgmlType::kIQ4_XS:
      half_off = offsetof(BlockIQ4_XS, d);
      n_halves = 1;
      break;
    case GgmlType::kTQ1_0:
      half_off = offsetof(BlockTQ1_0, d);
      n_halves = 1;
      break;
    case GgmlType::kTQ2_0:
      half_off = offsetof(BlockTQ2_0, d);
      n_halves = 1;
      break;
    case GgmlType::kIQ2_XXS:
    case GgmlType::kIQ2_XS:
    case GgmlType::kIQ2_S:
    case GgmlType::kIQ3_XXS:
    case GgmlType::kIQ3_S:
    case GgmlType::kIQ1_S:
      half_off = 0;  // d first
      n_halves = 1;
      break;
    case GgmlType::kIQ1_M:
      n_halves = 0;  // d lives in the scale words' top nibbles: set below
      break;
    case GgmlType::kQ4_0:
    case GgmlType::kQ1_0:
    case GgmlType::kQ2_0:
      half_off = 0;  // d first
      n_halves = 1;
      break;
    case GgmlType::kMXFP4:
    case GgmlType::kNVFP4:
      n_halves = 0;  // one E8M0 / four UE4M3 scale bytes first: set below
      break;
    default:
      half_off = offsetof(BlockQ6_K, d);
      n_halves = 1;
      break;
  }
  const fp16_t small = F32ToFp16(0.01f);
  for (size_t b = 0; b < w.size() / bs; ++b) {
    for (int h = 0; h < n_halves; ++h) std::memcpy(&w[b * bs + half_off + 2 * h], &small, 2);
    if (t == GgmlType::kMXFP4) w[b * bs] = 120;                   // 2^-7
    if (t == GgmlType::kNVFP4) std::memset(&w[b * bs], 0x18, 4);  // 2^-4 each
    if (t == GgmlType::kIQ1_M) {
      for (int i = 0; i < 4; ++i) {
        uint8_t& hi = w[b * bs + offsetof(BlockIQ1_M, scales) + 2 * i + 1];
        hi = static_cast<uint8_t>((hi & 0x0F) | (((small >> (4 * i)) & 0xF) << 4));
      }
    }
  }
  return w;
}

// Activation rows in the weight type's vec_dot_type (Q8_K or Q8_0).
std::vector<uint8_t> RandomActivations(GgmlType t, int64_t rows, int64_t k) {
  std::mt19937 rng(12);
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<float> x(k);
  const GgmlType at = GetKernels(t, Isa::kScalar).vec_dot_type;
  const size_t row_bytes = RowSize(at, k);
  std::vector<uint8_t> a(rows * row_bytes);
  const TypeKernels& q8 = GetKernels(at, Isa::kScalar);
  for (int64_t r = 0; r < rows; ++r) {
    for (auto& v : x) v = dist(rng);
    q8.quantize(x.data(), a.data() + r * row_bytes, k);
  }
  return a;
}

void BmVecDot(benchmark::State& state, GgmlType t, Isa isa) {
  constexpr int64_t kK = 4096;
  const auto w = RandomWeights(t, 1, kK);
  const auto a = RandomActivations(t, 1, kK);
  const TypeKernels& kern = GetKernels(t, isa);
  float s = 0;
  for (auto _ : state) {
    kern.vec_dot(kK, &s, w.data(), a.data());
    benchmark::DoNotOptimize(s);
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(w.size()));
}

// out[r] = W[r] . x for a rows x k matrix, n_act activation rows at a time (1 = plain vec_dot).
void BmMatmul(benchmark::State& state, GgmlType t, Isa isa, int n_act) {
  constexpr int64_t kRows = 2048, kK = 2048;
  const auto w = RandomWeights(t, kRows, kK);
  const auto a = RandomActivations(t, n_act, kK);
  const size_t w_row = RowSize(t, kK);
  const size_t a_row = RowSize(GetKernels(t, Isa::kScalar).vec_dot_type, kK);
  const TypeKernels& kern = GetKernels(t, isa);
  std::vector<float> out(kRows * n_act);
  for (auto _ : state) {
    for (int64_t r = 0; r < kRows; ++r) {
      if (n_act == 1) {
        kern.vec_dot(kK, &out[r], w.data() + r * w_row, a.data());
      } else {
        kern.vec_dot_multi(kK, w.data() + r * w_row, a.data(), a_row, n_act, &out[r * n_act]);
      }
    }
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(w.size()));
  // Weight rows per second (each against n_act activation rows).
  state.counters["rows/s"] = benchmark::Counter(static_cast<double>(kRows) * state.iterations(),
                                                benchmark::Counter::kIsRate);
  // Multiply-adds per second, comparable across n_act.
  state.counters["MAC/s"] = benchmark::Counter(
      static_cast<double>(kRows * kK * n_act) * state.iterations(), benchmark::Counter::kIsRate);
}

bool RegisterAll() {
  const Isa best = DetectIsa();
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (static_cast<int>(isa) > static_cast<int>(best)) continue;
    for (GgmlType t : kTypes) {
      std::string suffix = GgmlTypeName(t);
      suffix.append("/").append(IsaName(isa));
      std::string name = "VecDot4096/";
      benchmark::RegisterBenchmark(name.append(suffix).c_str(), BmVecDot, t, isa);
      name = "Matvec2048/";
      benchmark::RegisterBenchmark(name.append(suffix).c_str(), BmMatmul, t, isa, 1);
      name = "Matmul2048x8/";
      benchmark::RegisterBenchmark(name.append(suffix).c_str(), BmMatmul, t, isa, 8)
          ->Unit(benchmark::kMillisecond);
    }
  }
  return true;
}

const bool kRegistered = RegisterAll();

}  // namespace
}  // namespace lamina
