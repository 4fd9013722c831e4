// Micro-benchmarks for the F32/F16/BF16, legacy-quant, IQ4_NL and MXFP4 kernels at every ISA this
// CPU has: one k=4096 dot, a single-thread matvec (weight bytes/s: decode is bandwidth bound), and
// the 8-activation multi-dot used for prompt processing (items/s = multiply-adds * 2, i.e. FLOP/s),
// the Q8_0 / Q8_K activation quantizers, the KV encoders' scale search (kv_encode.h) and whole KV
// rows encoded (int8, q4_0, q4_nl; the rotation of 4-bit rows timed on its own).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

#include "kernels/kv_encode.h"
#include "kernels/kv_format.h"
#include "quant/quant.h"
#include "quant/types.h"
#include "util/fp16.h"

namespace lamina {
namespace {

const GgmlType kTypes[] = {GgmlType::kF32,    GgmlType::kF16,  GgmlType::kBF16, GgmlType::kQ4_0,
                           GgmlType::kQ4_1,   GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kQ8_0,
                           GgmlType::kIQ4_NL, GgmlType::kMXFP4};

std::vector<Isa> SupportedIsas() {
  std::vector<Isa> isas = {Isa::kScalar};
  if (static_cast<int>(DetectIsa()) >= static_cast<int>(Isa::kAvx2)) isas.push_back(Isa::kAvx2);
  if (DetectIsa() == Isa::kAvx512) isas.push_back(Isa::kAvx512);
  return isas;
}

// Rows of `type` quantized from random floats (the reference quantizer, so scales are sane).
// Types without a quantizer (IQ4_NL, MXFP4) get random codes and a fixed small scale.
std::vector<uint8_t> RandomRows(GgmlType type, int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(cols));
  const size_t row_bytes = RowSize(type, cols);
  std::vector<uint8_t> out(row_bytes * static_cast<size_t>(rows));
  const TypeKernels& k = GetKernels(type, Isa::kScalar);
  if (k.quantize == nullptr) {
    for (uint8_t& b : out) b = static_cast<uint8_t>(rng());
    const size_t bs = GetTypeTraits(type).type_size;
    const fp16_t d = F32ToFp16(0.01f);
    for (size_t off = 0; off < out.size(); off += bs) {
      if (type == GgmlType::kMXFP4) {
        out[off] = 120;  // E8M0 exponent: steps of 2^-8
      } else {
        std::memcpy(&out[off], &d, 2);  // IQ4_NL: d leads the block
      }
    }
    return out;
  }
  for (int64_t r = 0; r < rows; ++r) {
    for (float& f : x) f = dist(rng);
    k.quantize(x.data(), out.data() + r * row_bytes, cols);
  }
  return out;
}

void BM_VecDot(benchmark::State& state, GgmlType type, Isa isa) {
  const int64_t k = 4096;
  const TypeKernels& kern = GetKernels(type, isa);
  const std::vector<uint8_t> w = RandomRows(type, 1, k, 1);
  const std::vector<uint8_t> a = RandomRows(kern.vec_dot_type, 1, k, 2);
  float s = 0.0f;
  for (auto _ : state) {
    kern.vec_dot(k, &s, w.data(), a.data());
    benchmark::DoNotOptimize(s);
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(w.size() + a.size()));
}

void BM_Matvec(benchmark::State& state, GgmlType type, Isa isa) {
  const int64_t rows = state.range(0), cols = state.range(1);
  const TypeKernels& kern = GetKernels(type, isa);
  const std::vector<uint8_t> w = RandomRows(type, rows, cols, 3);
  const std::vector<uint8_t> a = RandomRows(kern.vec_dot_type, 1, cols, 4);
  const size_t row_bytes = RowSize(type, cols);
  std::vector<float> out(static_cast<size_t>(rows));
  for (auto _ : state) {
    for (int64_t r = 0; r < rows; ++r)
      kern.vec_dot(cols, &out[r], w.data() + r * row_bytes, a.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(w.size()));
}

void BM_MultiDot8(benchmark::State& state, GgmlType type, Isa isa) {
  const int64_t rows = state.range(0), cols = state.range(1);
  const int n_act = kMaxMultiDot;
  const TypeKernels& kern = GetKernels(type, isa);
  const std::vector<uint8_t> w = RandomRows(type, rows, cols, 5);
  const std::vector<uint8_t> a = RandomRows(kern.vec_dot_type, n_act, cols, 6);
  const size_t row_bytes = RowSize(type, cols);
  const size_t act_bytes = RowSize(kern.vec_dot_type, cols);
  std::vector<float> out(static_cast<size_t>(rows) * n_act);
  for (auto _ : state) {
    for (int64_t r = 0; r < rows; ++r) {
      kern.vec_dot_multi(cols, w.data() + r * row_bytes, a.data(), act_bytes, n_act,
                         &out[r * n_act]);
    }
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * 2 * rows * cols * n_act);
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(w.size()));
}

// The activation quantizers the matmul runs once per token row (Q8_0 for the legacy and 4-bit table
// types, Q8_K for the K-quants): 64 rows of 4096 normal floats (items/s = floats quantized).
void BM_QuantizeAct(benchmark::State& state, GgmlType type, Isa isa) {
  constexpr int64_t kRows = 64, kCols = 4096;
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(kRows * kCols));  // [kRows, kCols]
  for (float& f : x) f = dist(rng);
  const size_t row_bytes = RowSize(type, kCols);
  std::vector<uint8_t> out(row_bytes * kRows);  // [kRows][row_bytes]
  const QuantizeRowFn quantize = GetKernels(type, isa).quantize;
  for (auto _ : state) {
    for (int64_t r = 0; r < kRows; ++r)
      quantize(x.data() + r * kCols, out.data() + r * row_bytes, kCols);
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * kRows * kCols);
}

const KvRowFormat kKvFormats[] = {KvRowFormat::kInt8, KvRowFormat::kQ4_0, KvRowFormat::kQ4Nl};

const char* KvFormatName(KvRowFormat f) {
  return f == KvRowFormat::kInt8 ? "int8" : f == KvRowFormat::kQ4_0 ? "q4_0" : "q4_nl";
}

// The scale search's first round as the encoders run it: 12 candidate scales of one 32-value
// group, over 1,024 groups of normal floats (items/s = candidates evaluated).
void BM_KvScaleErrors(benchmark::State& state, KvRowFormat format, Isa isa) {
  constexpr int kGroups = 1024, kG = 32, kN = 12;
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(kGroups * kG);  // [kGroups, kG]
  for (float& f : x) f = dist(rng);
  std::vector<float> d(kGroups * kN), err(kN);  // d [kGroups, kN]
  for (int b = 0; b < kGroups; ++b) {
    float amax = 0.0f;
    for (int i = 0; i < kG; ++i) amax = std::max(amax, std::fabs(x[b * kG + i]));
    for (int k = 0; k < kN; ++k) d[b * kN + k] = amax / (127.0f - kN * k / 4.0f);
  }
  const KvScaleErrorsFn fn = isa == Isa::kScalar ? ScalarKvScaleErrors(format)
                             : isa == Isa::kAvx2 ? Avx2KvScaleErrors(format)
                                                 : Avx512KvScaleErrors(format);
  for (auto _ : state) {
    for (int b = 0; b < kGroups; ++b) {
      fn(x.data() + b * kG, kG, d.data() + b * kN, kN, err.data());
      benchmark::DoNotOptimize(err.data());
    }
  }
  state.SetItemsProcessed(state.iterations() * kGroups * kN);
}

// Whole head rows encoded as the cache's writer does (the best twin LAMINA_ISA allows): 1,024
// rows of 128 normal floats (items/s = rows).
void BM_EncodeKvRow(benchmark::State& state, KvRowFormat format) {
  constexpr int kRows = 1024, kHd = 128;
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(kRows * kHd);  // [kRows, kHd]
  for (float& f : x) f = dist(rng);
  const size_t rb = KvRowBytes(format, kHd);
  std::vector<uint8_t> out(rb * kRows);  // [kRows][rb]
  for (auto _ : state) {
    for (int r = 0; r < kRows; ++r) {
      EncodeKvRow(format, x.data() + r * kHd, kHd, nullptr, out.data() + r * rb);
    }
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * kRows);
}

// The Walsh-Hadamard rotation of 1,024 rows of 128 floats, forward then back (items/s = rows).
void BM_RotateKvRow(benchmark::State& state) {
  constexpr int kRows = 1024, kHd = 128;
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(kRows * kHd);  // [kRows, kHd]
  for (float& f : x) f = dist(rng);
  for (auto _ : state) {
    for (int r = 0; r < kRows; ++r) {
      Rotate(x.data() + r * kHd, kHd);
      InverseRotate(x.data() + r * kHd, kHd);
    }
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * kRows);
}

bool RegisterAll() {
  for (Isa isa : SupportedIsas()) {
    for (GgmlType t : kTypes) {
      const std::string suffix = std::string(GgmlTypeName(t)) + "/" + IsaName(isa);
      benchmark::RegisterBenchmark(("VecDot4096/" + suffix).c_str(), BM_VecDot, t, isa);
      // 2048x2048 stays in the last-level cache; 8192x4096 does not (DRAM bandwidth).
      benchmark::RegisterBenchmark(("Matvec/" + suffix).c_str(), BM_Matvec, t, isa)
          ->Args({2048, 2048})
          ->Args({8192, 4096})
          ->Unit(benchmark::kMicrosecond);
      benchmark::RegisterBenchmark(("MultiDot8/" + suffix).c_str(), BM_MultiDot8, t, isa)
          ->Args({2048, 2048})
          ->Unit(benchmark::kMicrosecond);
    }
    for (GgmlType t : {GgmlType::kQ8_0, GgmlType::kQ8_K}) {
      const std::string name = std::string("QuantizeAct/") + GgmlTypeName(t) + "/" + IsaName(isa);
      benchmark::RegisterBenchmark(name.c_str(), BM_QuantizeAct, t, isa)
          ->Unit(benchmark::kMicrosecond);
    }
    for (KvRowFormat f : kKvFormats) {
      const std::string name = std::string("KvScaleErrors/") + KvFormatName(f) + "/" + IsaName(isa);
      benchmark::RegisterBenchmark(name.c_str(), BM_KvScaleErrors, f, isa)
          ->Unit(benchmark::kMicrosecond);
    }
  }
  for (KvRowFormat f : kKvFormats) {
    benchmark::RegisterBenchmark((std::string("EncodeKvRow/") + KvFormatName(f)).c_str(),
                                 BM_EncodeKvRow, f)
        ->Unit(benchmark::kMicrosecond);
  }
  benchmark::RegisterBenchmark("RotateKvRow", BM_RotateKvRow)->Unit(benchmark::kMicrosecond);
  return true;
}

const bool kRegistered = RegisterAll();

}  // namespace
}  // namespace lamina
