// Matmul and attention micro-benchmarks: matrix-vector (decode) and matrix-matrix (prompt)
// products per weight type (plain rows and the interleaved layouts), causal attention per KV mode
// at several depths, the attention row kernels per ISA, GELU-tanh and the prompt's pre-norms, the
// KV-row attention kernels against the FMA / vpdpwssd port limit, and the machine's memory read
// bandwidth (the roofline's denominator).
#include <benchmark/benchmark.h>
#include <immintrin.h>
#include <pthread.h>
#include <sched.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "kernels/activation_kernels.h"
#include "kernels/attention_kernels.h"
#include "kernels/kv_decode.h"
#include "kernels/matmul.h"
#include "model/blocks.h"
#include "runtime/attention.h"
#include "runtime/kv_cache.h"
#include "util/bandwidth.h"
#include "util/cpu_features.h"
#include "util/fp16.h"
#include "util/huge_pages.h"
#include "util/thread_pool.h"

namespace lamina {
namespace {

struct Weights {
  std::vector<uint8_t> data;
  WeightMatrix w;
};

Weights MakeWeights(GgmlType type, int64_t rows, int64_t cols) {
  Weights out;
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  const size_t row_bytes = RowSize(type, cols);
  out.data.resize(row_bytes * rows);
  std::vector<float> row(cols);
  const TypeKernels& k = GetKernels(type);
  for (int64_t r = 0; r < rows; ++r) {
    for (float& v : row) v = normal(rng);
    if (k.quantize != nullptr) {
      k.quantize(row.data(), out.data.data() + r * row_bytes, cols);
    } else {
      for (size_t b = 0; b < row_bytes; ++b)
        out.data[r * row_bytes + b] = static_cast<uint8_t>(rng() & 0x3F);
      if (type == GgmlType::kMXFP4) {  // exponents of 2^-8 steps: tiny ones run on subnormals
        for (size_t b = 0; b < row_bytes; b += sizeof(BlockMXFP4))
          out.data[r * row_bytes + b] = 120;
      }
    }
  }
  out.w = {type, rows, cols, row_bytes, out.data.data()};
  return out;
}

// args: type, n_tokens, threads. 2816 x 1024 is the FFN gate of the 181M benchmark shape.
void BM_MatMul(benchmark::State& state) {
  const GgmlType type = static_cast<GgmlType>(state.range(0));
  const int64_t n_tokens = state.range(1);
  ThreadPool pool(static_cast<int>(state.range(2)));
  Weights w = MakeWeights(type, 2816, 1024);
  std::vector<float> x(n_tokens * 1024, 0.5f), y(n_tokens * 2816);
  MatMulScratch scratch;
  for (auto _ : state) {
    MatMul(w.w, x.data(), 1024, n_tokens, y.data(), 2816, scratch, pool);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetLabel(GgmlTypeName(type));
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * 2816 * 1024 * n_tokens * state.iterations(),
                         benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
  state.counters["weight_GB/s"] =
      benchmark::Counter(static_cast<double>(w.data.size()) * state.iterations(),
                         benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
}
BENCHMARK(BM_MatMul)
    ->ArgsProduct({{int(GgmlType::kQ8_0), int(GgmlType::kQ4_0), int(GgmlType::kQ4_K),
                    int(GgmlType::kQ6_K), int(GgmlType::kF16), int(GgmlType::kIQ4_NL),
                    int(GgmlType::kIQ4_XS), int(GgmlType::kMXFP4), int(GgmlType::kNVFP4),
                    int(GgmlType::kQ5_0), int(GgmlType::kIQ2_XXS), int(GgmlType::kIQ2_XS),
                    int(GgmlType::kIQ3_XXS), int(GgmlType::kIQ3_S), int(GgmlType::kIQ2_S),
                    int(GgmlType::kIQ1_S), int(GgmlType::kIQ1_M), int(GgmlType::kQ1_0),
                    int(GgmlType::kQ2_0)},
                   {1, 8, 64},
                   {1, 2}})
    ->UseRealTime();

// A rows x 1024 matrix of `type` repacked into its interleaved layout (as the loader does for
// matmul weights) and multiplied by n_tokens rows of activations on `threads` threads; labels
// the type. False (the benchmark skipped) when the type has no interleaved layout at this ISA.
bool RunInterleaved(benchmark::State& state, GgmlType type, int64_t rows, int64_t n_tokens,
                    int threads, size_t* weight_bytes) {
  ThreadPool pool(threads);
  Weights w = MakeWeights(type, rows, 1024);
  if (!CanInterleave(w.w)) {
    state.SkipWithError("no interleaved layout for this type at this ISA");
    return false;
  }
  std::vector<uint8_t> packed(w.data.size());  // [rows / 16 groups][16 * row_bytes]
  const WeightMatrix wi = InterleaveInto(w.w, packed.data());
  std::vector<float> x(n_tokens * 1024, 0.5f), y(n_tokens * rows);  // [n, 1024], [n, rows]
  MatMulScratch scratch;
  for (auto _ : state) {
    MatMul(wi, x.data(), 1024, n_tokens, y.data(), rows, scratch, pool);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetLabel(GgmlTypeName(type));
  *weight_bytes = w.data.size();
  return true;
}

// args: type, n_tokens, threads. BM_MatMul's 2816 x 1024 matrix repacked into the type's
// interleaved layout, so the two compare plain rows with the interleaved kernels on the same
// weights.
void BM_MatMulInterleaved(benchmark::State& state) {
  const int64_t n_tokens = state.range(1);
  size_t bytes = 0;
  if (!RunInterleaved(state, static_cast<GgmlType>(state.range(0)), 2816, n_tokens,
                      static_cast<int>(state.range(2)), &bytes)) {
    return;
  }
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * 2816 * 1024 * n_tokens * state.iterations(),
                         benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
}
BENCHMARK(BM_MatMulInterleaved)
    ->ArgsProduct({{int(GgmlType::kQ8_0), int(GgmlType::kQ4_0), int(GgmlType::kQ4_K),
                    int(GgmlType::kQ5_K), int(GgmlType::kQ6_K), int(GgmlType::kIQ4_NL),
                    int(GgmlType::kIQ4_XS), int(GgmlType::kMXFP4), int(GgmlType::kNVFP4),
                    int(GgmlType::kQ5_0), int(GgmlType::kIQ2_XXS), int(GgmlType::kIQ2_XS),
                    int(GgmlType::kIQ3_XXS), int(GgmlType::kIQ3_S), int(GgmlType::kIQ2_S),
                    int(GgmlType::kIQ1_S), int(GgmlType::kIQ1_M), int(GgmlType::kQ1_0),
                    int(GgmlType::kQ2_0)},
                   {1, 4, 8, 9, 64, 512},
                   {1, 2}})
    ->UseRealTime();

// args: type, n_tokens, threads. The same matrix as BM_MatMulInterleaved, 48 copies used in turn
// (72-147 MB, past the 32 MiB L3), so every call reads its weights from memory as a model's
// decode step does: the weights' bytes against the kernels' compute when both must overlap.
void BM_MatMulInterleavedFromMemory(benchmark::State& state) {
  constexpr int kCopies = 48;
  const GgmlType type = static_cast<GgmlType>(state.range(0));
  const int64_t n_tokens = state.range(1);
  ThreadPool pool(static_cast<int>(state.range(2)));
  Weights w = MakeWeights(type, 2816, 1024);
  if (!CanInterleave(w.w)) {
    state.SkipWithError("no interleaved layout for this type at this ISA");
    return;
  }
  const size_t bytes = w.data.size();
  std::vector<uint8_t> packed(bytes * kCopies);  // [kCopies][2816 / 16 groups][16 * row_bytes]
  std::vector<WeightMatrix> copies;
  for (int c = 0; c < kCopies; ++c)
    copies.push_back(InterleaveInto(w.w, packed.data() + c * bytes));
  std::vector<float> x(n_tokens * 1024, 0.5f), y(n_tokens * 2816);  // [n, 1024], [n, 2816]
  MatMulScratch scratch;
  int c = 0;
  for (auto _ : state) {
    MatMul(copies[c], x.data(), 1024, n_tokens, y.data(), 2816, scratch, pool);
    c = (c + 1) % kCopies;
    benchmark::DoNotOptimize(y.data());
  }
  state.SetLabel(GgmlTypeName(type));
  state.counters["GB/s"] =
      benchmark::Counter(static_cast<double>(bytes) * state.iterations(),
                         benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
}
BENCHMARK(BM_MatMulInterleavedFromMemory)
    ->ArgsProduct({{int(GgmlType::kQ8_0), int(GgmlType::kQ4_K), int(GgmlType::kQ6_K)},
                   {1, 8, 9},
                   {1, 2}})
    ->UseRealTime();

// args: type, n_tokens. 1024 x 384, the FFN up projection of the shipped model: cache-resident,
// so it measures the kernels' compute (decode and short verify windows), one thread.
void BM_MatMulCacheResident(benchmark::State& state) {
  const GgmlType type = static_cast<GgmlType>(state.range(0));
  const int64_t n_tokens = state.range(1);
  ThreadPool pool(1);
  Weights w = MakeWeights(type, 1024, 384);
  std::vector<float> x(n_tokens * 384, 0.5f),
      y(n_tokens * 1024);  // [n_tokens, 384], [n_tokens, 1024]
  MatMulScratch scratch;
  for (auto _ : state) {
    MatMul(w.w, x.data(), 384, n_tokens, y.data(), 1024, scratch, pool);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetLabel(GgmlTypeName(type));
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * 1024 * 384 * n_tokens * state.iterations(),
                         benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
}
BENCHMARK(BM_MatMulCacheResident)
    ->ArgsProduct({{int(GgmlType::kQ8_0), int(GgmlType::kQ4_0), int(GgmlType::kF16),
                    int(GgmlType::kF32)},
                   {1, 2, 3, 4, 8, 9, 64}});

// args: type, n_tokens. 256 x 1024 in the type's interleaved layout (136-272 KiB: L2-resident),
// one thread: the interleaved kernels' compute for decode and short windows, K-quants included
// (BM_MatMulCacheResident's plain rows have 384 columns, not a multiple of a K-quant's 256-value
// super-block).
void BM_InterleavedCacheResident(benchmark::State& state) {
  size_t bytes = 0;
  if (!RunInterleaved(state, static_cast<GgmlType>(state.range(0)), 256, state.range(1), 1,
                      &bytes)) {
    return;
  }
  state.counters["GB/s"] =
      benchmark::Counter(static_cast<double>(bytes) * state.iterations(),
                         benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
}
BENCHMARK(BM_InterleavedCacheResident)
    ->ArgsProduct({{int(GgmlType::kQ8_0), int(GgmlType::kQ4_0), int(GgmlType::kIQ4_NL),
                    int(GgmlType::kMXFP4), int(GgmlType::kQ4_K), int(GgmlType::kQ5_K),
                    int(GgmlType::kQ6_K), int(GgmlType::kIQ4_XS)},
                   {1, 2, 3, 4, 8}});

// args: n_tokens, threads. Every weight matmul of one forward step of the shipped model's shape
// (5 layers of Q/K/V/O, gate/up/down, f16, 384 wide, FFN 1,024, 2 KV heads x 64, then the 1,024 x
// 384 output head for every token as a verify window needs): 16.6 MB of weights, more than the L2
// and inside the L3, so it measures what a decode step (1) or a verify window (2..9) costs in the
// matmuls, fork/join of every matmul included.
void BM_ShippedStepMatmuls(benchmark::State& state) {
  const int64_t n = state.range(0);
  ThreadPool pool(static_cast<int>(state.range(1)));
  const int64_t shapes[][2] = {{384, 384},  {128, 384},  {128, 384}, {384, 384},
                               {1024, 384}, {1024, 384}, {384, 1024}};  // {rows, cols}
  std::vector<Weights> layers;
  for (int l = 0; l < 5; ++l) {
    for (const auto& sh : shapes) layers.push_back(MakeWeights(GgmlType::kF16, sh[0], sh[1]));
  }
  Weights head = MakeWeights(GgmlType::kF16, 1024, 384);
  std::vector<float> x(n * 1024, 0.5f), y(n * 1024);  // [n, up to 1024] in and out
  MatMulScratch scratch;
  double bytes = static_cast<double>(head.data.size());
  for (const Weights& w : layers) bytes += static_cast<double>(w.data.size());
  for (auto _ : state) {
    for (const Weights& w : layers) {
      MatMul(w.w, x.data(), w.w.cols, n, y.data(), w.w.rows, scratch, pool);
    }
    MatMul(head.w, x.data(), 384, n, y.data(), 1024, scratch, pool);
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["us/step"] = benchmark::Counter(
      1e6 * state.iterations(), benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.counters["weight_GB/s"] = benchmark::Counter(
      bytes * state.iterations(), benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
}
BENCHMARK(BM_ShippedStepMatmuls)->ArgsProduct({{1, 2, 4, 8, 9}, {1, 2}})->UseRealTime();

// The two limits of BM_ShippedStepMatmuls, on 1 or 2 threads: reading 16.6 MB (the shipped
// model's weights, cache-resident in a large L3) with the same split into 16 chunks per thread
// pool call as a matmul makes; and f32 FMAs from registers alone (16 independent accumulators
// per thread, the best case of any float kernel), in GFLOP/s.
void BM_ShippedWeightRead(benchmark::State& state) {
  std::vector<uint64_t> buf(16600000 / sizeof(uint64_t), 1);
  ThreadPool pool(static_cast<int>(state.range(0)));
  std::vector<uint64_t> partial(pool.size() * 8);
  for (auto _ : state) {
    pool.ParallelFor(static_cast<int64_t>(buf.size()), 1 << 12,
                     [&](int64_t b, int64_t e, int slot) {
                       uint64_t acc[8] = {};
                       for (int64_t i = b; i + 8 <= e; i += 8) {
                         for (int j = 0; j < 8; ++j) acc[j] += buf[i + j];
                       }
                       uint64_t s = 0;
                       for (uint64_t a : acc) s += a;
                       partial[slot * 8] += s;
                     });
    benchmark::DoNotOptimize(partial.data());
  }
  state.counters["us/read"] = benchmark::Counter(
      1e6 * state.iterations(), benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.counters["GB/s"] = benchmark::Counter(
      16.6e6 * state.iterations(), benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
}
BENCHMARK(BM_ShippedWeightRead)->Arg(1)->Arg(2)->UseRealTime();

// GCC 12's AVX-512 reductions (_mm512_reduce_add_*) build on _mm512_undefined_*(), which its
// uninitialized-value analysis reports at every use (as for the port-limit loops below).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// 16 independent 512-bit FMA chains (this file is built for the baseline ISA; the function
// alone targets AVX-512).
__attribute__((target("avx512f,fma"))) float FmaChains(int64_t steps, float seed) {
  __m512 acc[16];
  for (int a = 0; a < 16; ++a) acc[a] = _mm512_set1_ps(seed + static_cast<float>(a));
  const __m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
  for (int64_t i = 0; i < steps; ++i) {
#pragma GCC unroll 16
    for (int a = 0; a < 16; ++a) acc[a] = _mm512_fmadd_ps(acc[a], m, c);
  }
  __m512 s = acc[0];
  for (int a = 1; a < 16; ++a) s = _mm512_add_ps(s, acc[a]);
  return _mm512_reduce_add_ps(s);
}

// The same for the integer dot the interleaved kernels run (VNNI vpdpbusd: 64 u8 x s8 products
// into 16 int32 lanes), in GMAC/s.
__attribute__((target("avx512f,avx512vnni"))) int DpbusdChains(int64_t steps, int seed) {
  __m512i acc[16];
  for (int a = 0; a < 16; ++a) acc[a] = _mm512_set1_epi32(seed + a);
  const __m512i u = _mm512_set1_epi8(3), s = _mm512_set1_epi8(-2);
  for (int64_t i = 0; i < steps; ++i) {
#pragma GCC unroll 16
    for (int a = 0; a < 16; ++a) acc[a] = _mm512_dpbusd_epi32(acc[a], u, s);
  }
  __m512i t = acc[0];
  for (int a = 1; a < 16; ++a) t = _mm512_add_epi32(t, acc[a]);
  return _mm512_reduce_add_epi32(t);
}
#pragma GCC diagnostic pop

void BM_VnniPeak(benchmark::State& state) {
  if (DetectIsa() < Isa::kAvx512) {
    state.SkipWithError("needs AVX-512 VNNI");
    return;
  }
  ThreadPool pool(static_cast<int>(state.range(0)));
  constexpr int64_t kSteps = 1 << 16;
  std::vector<int> sink(pool.size() * 16);  // [threads][16]
  for (auto _ : state) {
    pool.ParallelFor(pool.size(), 1, [&](int64_t, int64_t, int slot) {
      sink[slot * 16] += DpbusdChains(kSteps, slot);
    });
    benchmark::DoNotOptimize(sink.data());
  }
  state.counters["GMAC/s"] = benchmark::Counter(
      64.0 * 16 * kSteps * static_cast<double>(state.range(0)) * state.iterations(),
      benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
}
BENCHMARK(BM_VnniPeak)->Arg(1)->Arg(2)->UseRealTime();

void BM_FmaPeak(benchmark::State& state) {
  if (DetectIsa() < Isa::kAvx512) {
    state.SkipWithError("needs AVX-512");
    return;
  }
  ThreadPool pool(static_cast<int>(state.range(0)));
  constexpr int64_t kSteps = 1 << 16;
  std::vector<float> sink(pool.size() * 16);  // [threads][16], one slot per thread's line
  for (auto _ : state) {
    pool.ParallelFor(pool.size(), 1, [&](int64_t, int64_t, int slot) {
      sink[slot * 16] += FmaChains(kSteps, static_cast<float>(slot));
    });
    benchmark::DoNotOptimize(sink.data());
  }
  state.counters["GFLOP/s"] = benchmark::Counter(
      2.0 * 16 * 16 * kSteps * static_cast<double>(state.range(0)) * state.iterations(),
      benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
}
BENCHMARK(BM_FmaPeak)->Arg(1)->Arg(2)->UseRealTime();

// args: kind (0: the FMA chains, 1: the vpdpbusd chains), cpu. The same chains on one thread
// pinned to one CPU: whether every core of a (virtual) machine runs them at the same rate. A
// 2-thread figure that scales less than 2x may be one slow core rather than the code (on the
// Zen 5 VM of docs/PERFORMANCE.md, CPU 1 once ran vpdpbusd at 78% of CPU 0's rate and FMA at
// 100%, and minutes later both alike).
void BM_CorePeak(benchmark::State& state) {
  if (DetectIsa() < Isa::kAvx512) {
    state.SkipWithError("needs AVX-512 (VNNI)");
    return;
  }
  const int cpu = static_cast<int>(state.range(1));
  if (cpu >= CPU_SETSIZE || cpu >= static_cast<int>(std::thread::hardware_concurrency())) {
    state.SkipWithError("no such CPU");
    return;
  }
  const bool vnni = state.range(0) != 0;
  int sink = 0;
  bool pinned = false;
  std::thread t([&] {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    pinned = pthread_setaffinity_np(pthread_self(), sizeof(set), &set) == 0;
    if (!pinned) return;
    constexpr int64_t kSteps = 1 << 16;
    for (auto _ : state) {
      // The seed depends on the last result, so no call is hoisted out of the loop.
      const int seed = sink & 1;
      sink += vnni ? DpbusdChains(kSteps, seed)
                   : static_cast<int>(FmaChains(kSteps, static_cast<float>(seed)));
    }
    state.counters[vnni ? "GMAC/s" : "GFLOP/s"] = benchmark::Counter(
        (vnni ? 64.0 : 32.0) * 16 * kSteps * static_cast<double>(state.iterations()),
        benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
  });
  t.join();
  if (!pinned) state.SkipWithError("cannot pin to this CPU");
  benchmark::DoNotOptimize(sink);
}
BENCHMARK(BM_CorePeak)->ArgsProduct({{0, 1}, {0, 1, 2, 3}})->UseRealTime();

// args: kv type, depth, threads, keys. One decode step of one layer of the 181M shape (16 heads,
// 4 KV heads, head_dim 64, RoPE over all 64 dimensions). keys 0: Gaussian rows (a random-weight
// model: q4_0's anchored form rarely wins, so few cells carry the score correction); keys 1: a
// shared per-head component turned by RoPE plus noise, as trained models' keys look (nearly
// every q4_0 cell is anchored: the correction's full cost).
void BM_DecodeAttention(benchmark::State& state) {
  KvCacheConfig c;
  c.n_layer = 1;
  c.n_ctx = static_cast<int>(state.range(1)) + 1;
  c.n_kv_heads = 4;
  c.head_dim = 64;
  c.type = static_cast<KvType>(state.range(0));
  c.rope.n_rot = 64;
  KvCache cache(c);
  std::mt19937 rng(2);
  std::normal_distribution<float> normal;
  const bool shared = state.range(3) != 0;
  std::vector<float> k(256), v(256), bias(256), cs(64);  // [n_kv_heads * head_dim]
  for (float& x : bias) x = shared ? 3.0f * normal(rng) : 0.0f;
  for (int p = 0; p < c.n_ctx; ++p) {
    for (int e = 0; e < 256; ++e) k[e] = bias[e] + (shared ? 0.4f : 1.0f) * normal(rng);
    for (float& x : v) x = normal(rng);
    RopeCache(c.rope, p, cs.data());
    ApplyRope(c.rope, cs.data(), k.data(), 4, 64);
    cache.Write(0, 0, p, 1, k.data(), v.data());
  }
  ThreadPool pool(static_cast<int>(state.range(2)));
  std::vector<float> q(16 * 64, 0.1f), out(16 * 64);
  AttentionScratch scratch;
  const AttentionShape shape{16, 4, 64, 0.125f};
  for (auto _ : state) {
    CausalAttention(cache, 0, 0, c.n_ctx - 1, 1, q.data(), out.data(), shape, scratch, pool);
    benchmark::DoNotOptimize(out.data());
  }
  int anchored = 0;
  if (cache.k_anchored()) {
    for (int h = 0; h < 4; ++h) {
      for (int p = 0; p < c.n_ctx; ++p) anchored += cache.KAnchorFlags(0, 0, h)[p];
    }
  }
  state.SetLabel(std::string(KvTypeName(c.type)) + (shared ? " shared-K" : " gaussian-K"));
  state.counters["anchored"] = cache.k_anchored() ? anchored / (4.0 * c.n_ctx) : 0.0;
  state.counters["kv_GB/s"] =
      benchmark::Counter(static_cast<double>(cache.BytesPerToken()) * c.n_ctx * state.iterations(),
                         benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
}
BENCHMARK(BM_DecodeAttention)
    ->ArgsProduct({{int(KvType::kF16), int(KvType::kInt8), int(KvType::kK8V4), int(KvType::kQ4_0)},
                   {1024, 4096, 16384},
                   {1, 2},
                   {0, 1}})
    ->UseRealTime();

// args: kv type, threads, huge pages (0: the KV arena in ordinary 4 KiB pages, 1: advised as
// transparent huge pages, the cache's default). Does decode attention at depth stream at the
// probe's rate? One decode step's attention over all 16 layers of the 181M shape at 16K cells
// (16 heads, 4 KV heads, head_dim 64; f16: 268 MB of K and V, 8x the L3), layer after layer on
// the real thread split, and the same-size ReadBandwidthProbe on the same pool in each
// iteration. Counters: both GB/s, the share, and the step's attention time per layer.
void BM_AttentionStreamVsProbe(benchmark::State& state) {
  constexpr int kLayers = 16, kDepth = 16384;
  KvCacheConfig c;
  c.n_layer = kLayers;
  c.n_ctx = kDepth + 1;
  c.n_kv_heads = 4;
  c.head_dim = 64;
  c.type = static_cast<KvType>(state.range(0));
  c.rope.n_rot = 64;
  c.huge_pages = state.range(2) != 0;
  KvCache cache(c);
  ThreadPool pool(static_cast<int>(state.range(1)));
  std::mt19937 rng(2);
  std::normal_distribution<float> normal;
  constexpr int kRows = 256;                          // positions written per call
  std::vector<float> k(kRows * 256), v(kRows * 256);  // [kRows, n_kv_heads * head_dim]
  for (float& x : k) x = normal(rng);
  for (float& x : v) x = normal(rng);
  for (int l = 0; l < kLayers; ++l) {
    for (int p = 0; p < kDepth; p += kRows) cache.Write(l, 0, p, kRows, k.data(), v.data(), &pool);
  }
  std::vector<float> q(16 * 64, 0.1f), out(16 * 64);  // [1, n_head * head_dim]
  AttentionScratch scratch;
  const AttentionShape shape{16, 4, 64, 0.125f};
  const double kv_bytes = static_cast<double>(cache.BytesPerToken()) * kDepth;
  ReadBandwidthProbe probe(static_cast<size_t>(kv_bytes));
  double probe_s = 0.0, attn_s = 0.0;
  for (auto _ : state) {
    probe_s += static_cast<double>(probe.bytes()) / 1e9 / probe.Measure(pool, 1);
    const auto t0 = std::chrono::steady_clock::now();
    for (int l = 0; l < kLayers; ++l) {
      CausalAttention(cache, l, 0, kDepth - 1, 1, q.data(), out.data(), shape, scratch, pool);
      benchmark::DoNotOptimize(out.data());
    }
    attn_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  const double n = static_cast<double>(state.iterations());
  const double probe_gbs = static_cast<double>(probe.bytes()) * n / probe_s / 1e9;
  const double attn_gbs = kv_bytes * n / attn_s / 1e9;
  state.SetLabel(std::string(KvTypeName(c.type)) + (c.huge_pages ? " huge" : " 4K"));
  state.counters["probe_GB/s"] = probe_gbs;
  state.counters["attn_GB/s"] = attn_gbs;
  state.counters["share"] = attn_gbs / probe_gbs;
  state.counters["us/layer"] = attn_s / n / kLayers * 1e6;
}
BENCHMARK(BM_AttentionStreamVsProbe)
    ->ArgsProduct({{int(KvType::kF16), int(KvType::kInt8), int(KvType::kK8V4), int(KvType::kQ4_0)},
                   {1, 2},
                   {0, 1}})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// args: rounds of arithmetic per 64-byte line (0: the stream alone), threads. Does a thread's
// stream overlap its arithmetic? Each thread reads its half of a 256 MiB buffer (huge pages, as
// the KV cells) line by line; per line, `rounds` dependent multiply-adds on each of the line's 16
// floats (16 independent chains, as attention's accumulators). Measured three ways in each
// iteration: the stream with its arithmetic (ns/line), the same arithmetic over a 256 KiB
// L2-resident slice (compute_ns/line), and the bare stream (stream_ns/line). "overlap" is the
// share of the shorter of the two that the combined run hid: 1 = max(compute, stream), 0 =
// compute + stream, one after the other (decode attention's K and V phases at 16K, 2 threads).
void BM_StreamComputeOverlap(benchmark::State& state) {
  const int rounds = static_cast<int>(state.range(0));
  ThreadPool pool(static_cast<int>(state.range(1)));
  constexpr size_t kFloats = size_t{64} << 20;                      // 256 MiB
  constexpr size_t kL2Floats = size_t{64} << 10;                    // 256 KiB
  std::vector<float, HugePageAllocator<float>> buf(kFloats, 1.0f);  // [kFloats / 16, 16] lines
  const int n_threads = pool.size();
  std::vector<float> sink(static_cast<size_t>(n_threads) * 16);  // [threads, 16] one line each
  // Each thread's share of the lines from `base`, wrapped within `span` floats, with or without
  // the arithmetic; leaves one line of sums per thread in `sink`.
  auto run = [&](const float* base, size_t span, bool arithmetic) {
    pool.ParallelFor(n_threads, 1, [&](int64_t t0, int64_t t1, int slot) {
      for (int64_t t = t0; t < t1; ++t) {
        const size_t lines = kFloats / 16 / n_threads;
        float a[16];  // [16] the line's chains
        for (int k = 0; k < 16; ++k) a[k] = 0.0f;
        for (size_t l = 0; l < lines; ++l) {
          const float* x = base + ((static_cast<size_t>(t) * lines + l) * 16) % span;
          if (!arithmetic) {
            for (int k = 0; k < 16; ++k) a[k] += x[k];
            continue;
          }
          for (int k = 0; k < 16; ++k) a[k] = a[k] * 0.999f + x[k];
          for (int r = 1; r < rounds; ++r) {
            for (int k = 0; k < 16; ++k) a[k] = a[k] * 0.999f + 0.5f;
          }
        }
        std::copy(a, a + 16, sink.begin() + static_cast<size_t>(slot) * 16);
      }
    });
  };
  double both_s = 0.0, compute_s = 0.0, stream_s = 0.0;
  auto timed = [](auto&& f) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  for (auto _ : state) {
    both_s += timed([&] { run(buf.data(), kFloats, rounds > 0); });
    compute_s += timed([&] { run(buf.data(), kL2Floats, rounds > 0); });
    stream_s += timed([&] { run(buf.data(), kFloats, false); });
    benchmark::DoNotOptimize(sink.data());
  }
  const double per_line = 1e9 / (static_cast<double>(state.iterations()) * (kFloats / 16) /
                                 static_cast<double>(n_threads));
  const double both = both_s * per_line, compute = compute_s * per_line,
               stream = stream_s * per_line;
  state.counters["ns/line"] = both;
  state.counters["compute_ns/line"] = compute;
  state.counters["stream_ns/line"] = stream;
  state.counters["overlap"] =
      rounds > 0 ? (compute + stream - both) / std::max(1e-9, std::min(compute, stream)) : 0.0;
  state.counters["stream_GB/s"] = 64.0 * n_threads / stream;
}
BENCHMARK(BM_StreamComputeOverlap)
    ->ArgsProduct({{0, 1, 2, 4, 8}, {1, 2}})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond)
    ->Iterations(3);

// args: ISA (0 scalar twin, 1 AVX2, 2 AVX-512), kernel (0 score_rows, 1 exp_sum, 2
// accumulate_rows, 3 max + scale, 4 score_rows2: the queries' scores in pairs, each row read once
// per pair, as prompt attention's tile runs them; the same bits as 0). One GQA group of 4 queries,
// head_dim 64, over 2,048 decoded rows (512 KiB, cache-resident as a decoded tile is): the row
// kernels' own speed, no memory.
void BM_AttentionRowKernels(benchmark::State& state) {
  const AttentionRowKernels* k = state.range(0) == 0   ? &ScalarAttentionRowKernels()
                                 : state.range(0) == 1 ? Avx2AttentionRowKernels()
                                                       : Avx512AttentionRowKernels();
  if (k == nullptr) {
    state.SkipWithError("this CPU lacks the ISA");
    return;
  }
  constexpr int kHd = 64, kRows = 2048, kQueries = 4;
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  std::vector<float> q(kQueries * kHd),
      rows(static_cast<size_t>(kRows) * kHd);                             // [4, 64], [2048, 64]
  std::vector<float> scores(kRows), weights(kRows), acc(kQueries * kHd);  // [2048], [2048], [4, 64]
  for (float& x : q) x = normal(rng);
  for (float& x : rows) x = normal(rng);
  k->score_rows(q.data(), rows.data(), kRows, kHd, 0.125f, scores.data());
  const float max = k->max(scores.data(), kRows);
  const int kernel = static_cast<int>(state.range(1));
  for (auto _ : state) {
    for (int h = 0; h < kQueries; ++h) {
      switch (kernel) {
        case 0:
          k->score_rows(q.data() + h * kHd, rows.data(), kRows, kHd, 0.125f, scores.data());
          break;
        case 1:
          std::copy(scores.begin(), scores.end(), weights.begin());
          benchmark::DoNotOptimize(k->exp_sum(weights.data(), kRows, max));
          break;
        case 2:
          k->accumulate_rows(weights.data(), rows.data(), kRows, kHd, acc.data() + h * kHd);
          break;
        case 4:
          if (h % 2 == 0) {
            k->score_rows2(q.data() + h * kHd, q.data() + (h + 1) * kHd, rows.data(), kRows, kHd,
                           0.125f, scores.data(), weights.data());
          }
          break;
        default:
          benchmark::DoNotOptimize(k->max(scores.data(), kRows));
          k->scale(weights.data(), kRows, 1.0f);
      }
    }
    benchmark::DoNotOptimize(scores.data());
    benchmark::DoNotOptimize(acc.data());
  }
  static const char* const kIsa[] = {"scalar", "avx2", "avx512"};
  static const char* const kKernel[] = {"score_rows", "exp_sum", "accumulate_rows", "max+scale",
                                        "score_rows2"};
  state.SetLabel(std::string(kIsa[state.range(0)]) + " " + kKernel[kernel]);
  state.counters["rows/s"] = benchmark::Counter(static_cast<double>(kRows) * kQueries,
                                                benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_AttentionRowKernels)->ArgsProduct({{0, 1, 2}, {0, 1, 2, 3, 4}});

// GELU-tanh * up (gemma3's FFN) over 512 rows of 1,024: arg 0 scalar twin, 1 AVX2, 2 AVX-512
// (the table of f16 results), 3 the std::tanh formula per element that the table replaced.
void BM_GeluTanhMul(benchmark::State& state) {
  const int isa = static_cast<int>(state.range(0));
  const ActivationKernels* k = isa == 0   ? &ScalarActivationKernels()
                               : isa == 1 ? Avx2ActivationKernels()
                               : isa == 2 ? Avx512ActivationKernels()
                                          : &ScalarActivationKernels();
  if (k == nullptr) {
    state.SkipWithError("this CPU lacks the ISA");
    return;
  }
  constexpr int64_t kN = 512 * 1024;
  std::mt19937 rng(4);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> gate(kN), up(kN), out(kN);  // [512, 1024] each
  for (float& x : gate) x = normal(rng);
  for (float& x : up) x = normal(rng);
  for (auto _ : state) {
    if (isa == 3) {
      constexpr float kSqrt2OverPi = 0.79788456080286535587989211986876f;
      constexpr float kCoef = 0.044715f;
      for (int64_t i = 0; i < kN; ++i) {
        const float g = gate[i];
        float act = g;
        if (g <= -10.0f) {
          act = 0.0f;
        } else if (g < 10.0f) {
          const float x = Fp16ToF32(F32ToFp16(g));
          act = Fp16ToF32(
              F32ToFp16(0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * x * (1.0f + kCoef * x * x)))));
        }
        out[i] = act * up[i];
      }
    } else {
      k->gelu_tanh_mul(gate.data(), up.data(), kN, out.data());
    }
    benchmark::DoNotOptimize(out.data());
  }
  static const char* const kName[] = {"scalar table", "avx2 table", "avx512 table",
                                      "std::tanh formula"};
  state.SetLabel(kName[isa]);
  state.counters["elems/s"] =
      benchmark::Counter(static_cast<double>(kN), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_GeluTanhMul)->DenseRange(0, 3);

// The pre-norms of a 512-token prompt batch (n_embd 1,024): arg 0 the rows on the calling thread
// (before), 1 NormBatch's rows over a pool of 2; real time.
void BM_NormBatch(benchmark::State& state) {
  Hparams hp;
  hp.n_embd = 1024;
  hp.rms_eps = 1e-6f;
  constexpr int kRows = 512;
  std::mt19937 rng(6);
  std::normal_distribution<float> normal;
  std::vector<float> x(static_cast<size_t>(kRows) * hp.n_embd), out(x.size());  // [512, 1024]
  std::vector<float> w(hp.n_embd);                                              // [1024]
  for (float& v : x) v = normal(rng);
  for (float& v : w) v = normal(rng);
  ThreadPool pool(2);
  for (auto _ : state) {
    NormBatch(hp, w, {}, kRows, x.data(), out.data(), state.range(0) == 1 ? &pool : nullptr);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetLabel(state.range(0) == 1 ? "pool of 2" : "one thread");
  state.counters["rows/s"] =
      benchmark::Counter(kRows, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_NormBatch)->DenseRange(0, 1)->UseRealTime();

// args: row format (KvRowFormat: 1 f16, 2 int8, 3 q4_0, 4 q4_nl), kernel (0 K scores, 1 the V
// sum BestKvAccumulator chooses; 3, f16 only: K scores by decode + score_rows; 4, int8 and 4-bit
// rows: the AVX-512 float fused V sum, which int16 pairs replaced as the default; 5, int8 and
// q4_0 only: K scores over the cache's 16-cell key tiles, kv_format.h, the same cells; 6: the V
// sum of 1 over all the cells in one call, as attention calls it per run of tiles). Decode-step
// attention's inner kernels as the widest ISA the CPU (and LAMINA_ISA) allows runs them: 4 queries
// (one GQA group), head_dim 64, over 1,024 cells in tiles of 64 (L2-resident: compute only, no
// memory). K scores are the integer scorer for int8 / q4_0 and for f16 the f16 tile scorer
// (the cache's 16-cell f16 key tiles, kv_format.h; BestKvF16TileScorer). "s/cell" is per cell
// and KV head, all 4 queries.
void BM_KvAttentionKernels(benchmark::State& state) {
  constexpr int kHd = 64, kCells = 1024, kTile = 64, kQueries = 4;
  const auto f = static_cast<KvRowFormat>(state.range(0));
  // Kernel 3 (f16 only): decode + score_rows, the K path without the one-pass f16 scorer.
  const bool tiles = state.range(1) == 3;
  const bool score = state.range(1) == 0 || tiles;
  const bool float_v = state.range(1) == 4;
  // Kernel 5 (int8, q4_0): the K scorer over the cache's key tiles (kv_format.h).
  const bool k_tiles = state.range(1) == 5;
  // Kernel 6: the V sum over all the cells in one call (attention's call per run of tiles).
  const bool v_run = state.range(1) == 6;
  const size_t rb = KvRowBytes(f, kHd);
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  std::vector<uint8_t> rows(rb * kCells);                           // [kCells] encoded head rows
  std::vector<float> x(kHd), q(kQueries * kHd), tile(kTile * kHd);  // [hd], [4, hd], [64, hd]
  for (int c = 0; c < kCells; ++c) {
    for (float& v : x) v = normal(rng);
    EncodeKvRow(f, x.data(), kHd, nullptr, rows.data() + c * rb);
  }
  // f16 K scores read f16 tiles too.
  const bool f16_tiles = f == KvRowFormat::kF16 && state.range(1) == 0;
  // the same cells as tiles
  std::vector<uint8_t> k_tile_bytes(k_tiles || f16_tiles ? rows.size() : 0);
  for (int c = 0; (k_tiles || f16_tiles) && c < kCells; ++c) {
    TileKvRow(rows.data() + c * rb, kHd,
              k_tile_bytes.data() + (c / kKvTileCells) * kKvTileCells * rb, c % kKvTileCells, f);
  }
  const KvTileScoreFn tile_scorer = BestKvTileScorer(f);
  for (float& v : q) v = normal(rng);
  std::vector<int16_t> qq(kQueries * kHd);     // [4, hd]
  std::vector<float> qd(kQueries * kHd / 32);  // [4, hd / 32]
  std::vector<float> p(kQueries * kCells, 1.0f / kCells),
      acc(kQueries * kHd);  // [4, cells], [4, hd]
  for (int qi = 0; qi < kQueries; ++qi) {
    QuantizeQueryInt16(f, q.data() + qi * kHd, kHd, qq.data() + qi * kHd, qd.data() + qi * 2);
  }
  const KvScoreFn scorer = BestKvScorer(f);
  const KvRowDecodeFn decode = BestKvRowDecoder(f);
  const KvF16TileScoreFn f16_scorer = f16_tiles ? BestKvF16TileScorer() : nullptr;
  const KvAccumulateFn fused =
      float_v ? (GetCpuFeatures().HasAvx512Set() ? Avx512KvAccumulator(f) : nullptr)
              : BestKvAccumulator(f);
  const AttentionRowKernels& rk = BestAttentionRowKernels();
  if ((score && f != KvRowFormat::kF16 && scorer == nullptr) || (!score && fused == nullptr) ||
      (tiles && f != KvRowFormat::kF16) || (k_tiles && tile_scorer == nullptr)) {
    state.SkipWithError("no such kernel on this CPU / ISA");
    return;
  }
  const int lim[kQueries] = {kTile, kTile, kTile, kTile};
  const int run_lim[kQueries] = {kCells, kCells, kCells, kCells};
  for (auto _ : state) {
    if (v_run) fused(rows.data(), kCells, kHd, kQueries, p.data(), kCells, run_lim, acc.data());
    for (int c0 = 0; c0 < (v_run ? 0 : kCells); c0 += kTile) {
      const uint8_t* t = rows.data() + c0 * rb;
      if (k_tiles) {
        tile_scorer(k_tile_bytes.data() + c0 * rb, 0, kTile, kHd, kQueries, qq.data(), qd.data(),
                    0.125f, p.data() + c0, kCells);
      } else if (!score) {
        fused(t, kTile, kHd, kQueries, p.data() + c0, kCells, lim, acc.data());
      } else if (f != KvRowFormat::kF16) {
        scorer(t, kTile, kHd, kQueries, qq.data(), qd.data(), 0.125f, p.data() + c0, kCells);
      } else if (f16_scorer != nullptr) {
        f16_scorer(k_tile_bytes.data() + c0 * rb, 0, kTile, kHd, kQueries, q.data(), 0.125f,
                   p.data() + c0, kCells);
      } else {
        decode(t, kTile, kHd, tile.data());
        for (int qi = 0; qi < kQueries; ++qi) {
          rk.score_rows(q.data() + qi * kHd, tile.data(), kTile, kHd, 0.125f,
                        p.data() + qi * kCells + c0);
        }
      }
    }
    benchmark::DoNotOptimize(p.data());
    benchmark::DoNotOptimize(acc.data());
  }
  static const char* const kFormat[] = {"f32", "f16", "int8", "q4_0", "q4_nl"};
  state.SetLabel(std::string(kFormat[state.range(0)]) + (k_tiles || f16_tiles ? " K scores, tiles"
                                                         : tiles              ? " K scores, decoded"
                                                         : score              ? " K scores"
                                                         : float_v            ? " float fused V sum"
                                                         : v_run              ? " V sum, one call"
                                                                              : " V sum"));
  state.counters["s/cell"] = benchmark::Counter(
      static_cast<double>(kCells) * state.iterations(),
      benchmark::Counter::kIsRate | benchmark::Counter::kInvert, benchmark::Counter::kIs1000);
}
BENCHMARK(BM_KvAttentionKernels)
    ->ArgsProduct({{1, 2, 3, 4}, {0, 1}})
    ->Args({1, 3})
    ->Args({2, 5})
    ->Args({3, 5})
    ->Args({2, 4})
    ->Args({3, 4})
    ->Args({4, 4})
    ->Args({2, 6})
    ->Args({3, 6})
    ->Args({4, 6});

// args: percent of cells flagged (anchored q4_0 keys, runtime/kv_cache.h), queries. The anchor
// score correction BestKvAnchorScorer runs (the widest ISA the CPU and LAMINA_ISA allow): 16
// terms (8 kept pairs), 1,024 cells as one run of 16 tiles (one call, as attention makes one per
// run; L1/L2-resident: compute only), flags at
// random positions. "s/tile" is per 64-cell tile and KV head, all the queries.
void BM_KvAnchorScores(benchmark::State& state) {
  constexpr int kTerms = 16, kCells = 1024, kTile = kAnchorTileCells;
  const int percent = static_cast<int>(state.range(0)), nq = static_cast<int>(state.range(1));
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  std::uniform_int_distribution<int> pct(0, 99);
  std::vector<float> w(static_cast<size_t>(nq) * kTerms), tables(kTerms * kTile), rest(nq);
  // [nq, kTerms], [kTerms, 64], [nq]
  for (float& v : w) v = normal(rng);
  for (float& v : tables) v = normal(rng);
  for (float& v : rest) v = normal(rng);
  std::vector<uint8_t> flags(kCells);  // [kCells]
  int64_t flagged = 0;
  for (uint8_t& f : flags) flagged += f = pct(rng) < percent;
  std::vector<float> scores(static_cast<size_t>(nq) * kCells);  // [nq, kCells]
  const std::vector<int> lim(nq, kCells);
  const KvAnchorScoreFn anchor = BestKvAnchorScorer();
  for (auto _ : state) {
    anchor(w.data(), 0, kTerms, tables.data(), rest.data(), flags.data(), kCells, nq, lim.data(),
           0.125f, scores.data(), kCells);
    benchmark::DoNotOptimize(scores.data());
  }
  state.SetLabel(std::to_string(flagged) + " of " + std::to_string(kCells) + " cells flagged");
  state.counters["s/tile"] = benchmark::Counter(
      static_cast<double>(kCells / kTile) * state.iterations(),
      benchmark::Counter::kIsRate | benchmark::Counter::kInvert, benchmark::Counter::kIs1000);
}
BENCHMARK(BM_KvAnchorScores)->ArgsProduct({{0, 2, 7, 25, 100}, {4, 32}});

// args: 0 vfmadd231ps, 1 vpdpwssd (zmm), 2-5 vpdpbusd alone and with the instructions beside it
// in the K-quant kernels, 6-7 in 8 chains and in one (DpbusdMixChains). 16 independent chains of
// the instruction over registers, no memory: its throughput on this core, the port limit the
// attention kernels are measured against ("s/op" per instruction; a kernel's s/cell divided by it
// is the number of such instruction slots it spends per cell). 8: the 8-token Q4_K kernel's chunk
// as it runs (DpbusdQ4KChunks); 9: the 4-bit V sum's row-pair step as it runs (DpwssdQ4VPairs).
// GCC 12's AVX-512 headers build some intrinsics from _mm512_undefined_*(), which its
// uninitialized-value analysis reports at every use.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// Floating-point chains are not reassociated, so each stays one instruction per iteration;
// the integer chains hold values the compiler cannot fold (its inputs come from n).
__attribute__((target("avx512f,avx512vnni"))) float FmaChains(int64_t n) {
  __m512 f[16];
  for (int i = 0; i < 16; ++i) f[i] = _mm512_set1_ps(1.0f + i);
  const __m512 fa = _mm512_set1_ps(0.999f), fb = _mm512_set1_ps(1e-3f);
  for (int64_t k = 0; k < n; ++k) {
    for (int i = 0; i < 16; ++i) f[i] = _mm512_fmadd_ps(f[i], fa, fb);
  }
  for (int i = 1; i < 16; ++i) f[0] = _mm512_add_ps(f[0], f[i]);
  return _mm512_reduce_add_ps(f[0]);
}

__attribute__((target("avx512f,avx512vnni"))) float DpwssdChains(int64_t n) {
  __m512i d[16];
  for (int i = 0; i < 16; ++i) d[i] = _mm512_set1_epi32(i);
  const __m512i ia = _mm512_set1_epi16(static_cast<int16_t>(n)), ib = _mm512_set1_epi16(5);
  for (int64_t k = 0; k < n; ++k) {
    for (int i = 0; i < 16; ++i) d[i] = _mm512_dpwssd_epi32(d[i], ia, ib);
  }
  for (int i = 1; i < 16; ++i) d[0] = _mm512_add_epi32(d[0], d[i]);
  return static_cast<float>(_mm512_reduce_add_epi32(d[0]));
}

// 16 vpdpbusd chains (the interleaved K-quant kernels' dot, zmm0-15) with what those kernels issue
// beside it: kMix 0 nothing else; 1 a vpshufb per two vpdpbusd (the split-byte scale step, 8
// chains); 2 each vpdpbusd's s8 operand broadcast from memory first (vpbroadcastd zmm, m32, as
// the activations are); 3 a vpdpwssd per two vpdpbusd (8 chains: do the two share ports?); 4 only
// 8 chains, each s8 operand vpdpbusd's {1to16} memory broadcast (the 8-token kernels' dot: one
// chain per token); 5 one chain (the latency). Inline assembly so that the compiler adds no
// copies. s/op counts the vpdpbusd only, so against kMix 0 it shows what the other instruction
// costs in the dot's ports.
template <int kMix>
__attribute__((target("avx512f,avx512bw,avx512vnni"))) float DpbusdMixChains(int64_t n,
                                                                             const int32_t* mem) {
  asm volatile(
      "vpxord %%zmm0, %%zmm0, %%zmm0\n\t"
      "vpternlogd $0xff, %%zmm31, %%zmm31, %%zmm31\n\t"  // u: all ones
      "vpabsb %%zmm31, %%zmm30\n\t"                      // s: ones
      "vmovdqa64 %%zmm0, %%zmm29\n\t" ::
          : "xmm0", "xmm29", "xmm30", "xmm31");
  for (int64_t k = 0; k < n; ++k) {
    if constexpr (kMix == 0) {
      asm volatile(
          "vpdpbusd %%zmm30, %%zmm31, %%zmm0\n\t"
          "vpdpbusd %%zmm30, %%zmm31, %%zmm1\n\t"
          "vpdpbusd %%zmm30, %%zmm31, %%zmm2\n\t"
          "vpdpbusd %%zmm30, %%zmm31, %%zmm3\n\t"
          "vpdpbusd %%zmm30, %%zmm31, %%zmm4\n\t"
          "vpdpbusd %%zmm30, %%zmm31, %%zmm5\n\t"
          "vpdpbusd %%zmm30, %%zmm31, %%zmm6\n\t"
          "vpdpbusd %%zmm30, %%zmm31, %%zmm7\n\t"
          "vpdpbusd %%zmm30, %%zmm31, %%zmm8\n\t"
          "vpdpbusd %%zmm30, %%zmm31, %%zmm9\n\t"
          "vpdpbusd %%zmm30, %%zmm31, %%zmm10\n\t"
          "vpdpbusd %%zmm30, %%zmm31, %%zmm11\n\t"
          "vpdpbusd %%zmm30, %%zmm31, %%zmm12\n\t"
          "vpdpbusd %%zmm30, %%zmm31, %%zmm13\n\t"
          "vpdpbusd %%zmm30, %%zmm31, %%zmm14\n\t"
          "vpdpbusd %%zmm30, %%zmm31, %%zmm15\n\t" ::
              : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9",
                "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15");
    } else if constexpr (kMix == 1) {
      asm volatile(
          "vpdpbusd %%zmm30, %%zmm31, %%zmm0\n\t"
          "vpdpbusd %%zmm30, %%zmm31, %%zmm1\n\t"
          "vpshufb %%zmm29, %%zmm16, %%zmm16\n\t"
          "vpdpbusd %%zmm30, %%zmm31, %%zmm2\n\t"
          "vpdpbusd %%zmm30, %%zmm31, %%zmm3\n\t"
          "vpshufb %%zmm29, %%zmm17, %%zmm17\n\t"
          "vpdpbusd %%zmm30, %%zmm31, %%zmm4\n\t"
          "vpdpbusd %%zmm30, %%zmm31, %%zmm5\n\t"
          "vpshufb %%zmm29, %%zmm18, %%zmm18\n\t"
          "vpdpbusd %%zmm30, %%zmm31, %%zmm6\n\t"
          "vpdpbusd %%zmm30, %%zmm31, %%zmm7\n\t"
          "vpshufb %%zmm29, %%zmm19, %%zmm19\n\t"
          "vpdpbusd %%zmm30, %%zmm31, %%zmm8\n\t"
          "vpdpbusd %%zmm30, %%zmm31, %%zmm9\n\t"
          "vpshufb %%zmm29, %%zmm20, %%zmm20\n\t"
          "vpdpbusd %%zmm30, %%zmm31, %%zmm10\n\t"
          "vpdpbusd %%zmm30, %%zmm31, %%zmm11\n\t"
          "vpshufb %%zmm29, %%zmm21, %%zmm21\n\t"
          "vpdpbusd %%zmm30, %%zmm31, %%zmm12\n\t"
          "vpdpbusd %%zmm30, %%zmm31, %%zmm13\n\t"
          "vpshufb %%zmm29, %%zmm22, %%zmm22\n\t"
          "vpdpbusd %%zmm30, %%zmm31, %%zmm14\n\t"
          "vpdpbusd %%zmm30, %%zmm31, %%zmm15\n\t"
          "vpshufb %%zmm29, %%zmm23, %%zmm23\n\t" ::
              : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9",
                "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "xmm16", "xmm17", "xmm18",
                "xmm19", "xmm20", "xmm21", "xmm22", "xmm23");
    } else if constexpr (kMix == 2) {
      asm volatile(
          "vpbroadcastd 0(%[p]), %%zmm24\n\t"
          "vpdpbusd %%zmm24, %%zmm31, %%zmm0\n\t"
          "vpbroadcastd 4(%[p]), %%zmm25\n\t"
          "vpdpbusd %%zmm25, %%zmm31, %%zmm1\n\t"
          "vpbroadcastd 8(%[p]), %%zmm26\n\t"
          "vpdpbusd %%zmm26, %%zmm31, %%zmm2\n\t"
          "vpbroadcastd 12(%[p]), %%zmm27\n\t"
          "vpdpbusd %%zmm27, %%zmm31, %%zmm3\n\t"
          "vpbroadcastd 16(%[p]), %%zmm24\n\t"
          "vpdpbusd %%zmm24, %%zmm31, %%zmm4\n\t"
          "vpbroadcastd 20(%[p]), %%zmm25\n\t"
          "vpdpbusd %%zmm25, %%zmm31, %%zmm5\n\t"
          "vpbroadcastd 24(%[p]), %%zmm26\n\t"
          "vpdpbusd %%zmm26, %%zmm31, %%zmm6\n\t"
          "vpbroadcastd 28(%[p]), %%zmm27\n\t"
          "vpdpbusd %%zmm27, %%zmm31, %%zmm7\n\t"
          "vpbroadcastd 32(%[p]), %%zmm24\n\t"
          "vpdpbusd %%zmm24, %%zmm31, %%zmm8\n\t"
          "vpbroadcastd 36(%[p]), %%zmm25\n\t"
          "vpdpbusd %%zmm25, %%zmm31, %%zmm9\n\t"
          "vpbroadcastd 40(%[p]), %%zmm26\n\t"
          "vpdpbusd %%zmm26, %%zmm31, %%zmm10\n\t"
          "vpbroadcastd 44(%[p]), %%zmm27\n\t"
          "vpdpbusd %%zmm27, %%zmm31, %%zmm11\n\t"
          "vpbroadcastd 48(%[p]), %%zmm24\n\t"
          "vpdpbusd %%zmm24, %%zmm31, %%zmm12\n\t"
          "vpbroadcastd 52(%[p]), %%zmm25\n\t"
          "vpdpbusd %%zmm25, %%zmm31, %%zmm13\n\t"
          "vpbroadcastd 56(%[p]), %%zmm26\n\t"
          "vpdpbusd %%zmm26, %%zmm31, %%zmm14\n\t"
          "vpbroadcastd 60(%[p]), %%zmm27\n\t"
          "vpdpbusd %%zmm27, %%zmm31, %%zmm15\n\t" ::[p] "r"(mem + (k & 31) * 4)
          : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10",
            "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "xmm24", "xmm25", "xmm26", "xmm27");
    } else if constexpr (kMix == 4) {
      asm volatile(
          "vpdpbusd 0(%[p])%{1to16%}, %%zmm31, %%zmm0\n\t"
          "vpdpbusd 4(%[p])%{1to16%}, %%zmm31, %%zmm1\n\t"
          "vpdpbusd 8(%[p])%{1to16%}, %%zmm31, %%zmm2\n\t"
          "vpdpbusd 12(%[p])%{1to16%}, %%zmm31, %%zmm3\n\t"
          "vpdpbusd 16(%[p])%{1to16%}, %%zmm31, %%zmm4\n\t"
          "vpdpbusd 20(%[p])%{1to16%}, %%zmm31, %%zmm5\n\t"
          "vpdpbusd 24(%[p])%{1to16%}, %%zmm31, %%zmm6\n\t"
          "vpdpbusd 28(%[p])%{1to16%}, %%zmm31, %%zmm7\n\t"
          "vpdpbusd 32(%[p])%{1to16%}, %%zmm31, %%zmm0\n\t"
          "vpdpbusd 36(%[p])%{1to16%}, %%zmm31, %%zmm1\n\t"
          "vpdpbusd 40(%[p])%{1to16%}, %%zmm31, %%zmm2\n\t"
          "vpdpbusd 44(%[p])%{1to16%}, %%zmm31, %%zmm3\n\t"
          "vpdpbusd 48(%[p])%{1to16%}, %%zmm31, %%zmm4\n\t"
          "vpdpbusd 52(%[p])%{1to16%}, %%zmm31, %%zmm5\n\t"
          "vpdpbusd 56(%[p])%{1to16%}, %%zmm31, %%zmm6\n\t"
          "vpdpbusd 60(%[p])%{1to16%}, %%zmm31, %%zmm7\n\t" ::[p] "r"(mem + (k & 31) * 4)
          : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7");
    } else if constexpr (kMix == 5) {
      asm volatile(
          "vpdpbusd %%zmm30, %%zmm31, %%zmm0\n\t"
          "vpdpbusd %%zmm30, %%zmm31, %%zmm0\n\t"
          "vpdpbusd %%zmm30, %%zmm31, %%zmm0\n\t"
          "vpdpbusd %%zmm30, %%zmm31, %%zmm0\n\t"
          "vpdpbusd %%zmm30, %%zmm31, %%zmm0\n\t"
          "vpdpbusd %%zmm30, %%zmm31, %%zmm0\n\t"
          "vpdpbusd %%zmm30, %%zmm31, %%zmm0\n\t"
          "vpdpbusd %%zmm30, %%zmm31, %%zmm0\n\t"
          "vpdpbusd %%zmm30, %%zmm31, %%zmm0\n\t"
          "vpdpbusd %%zmm30, %%zmm31, %%zmm0\n\t"
          "vpdpbusd %%zmm30, %%zmm31, %%zmm0\n\t"
          "vpdpbusd %%zmm30, %%zmm31, %%zmm0\n\t"
          "vpdpbusd %%zmm30, %%zmm31, %%zmm0\n\t"
          "vpdpbusd %%zmm30, %%zmm31, %%zmm0\n\t"
          "vpdpbusd %%zmm30, %%zmm31, %%zmm0\n\t"
          "vpdpbusd %%zmm30, %%zmm31, %%zmm0\n\t" ::
              : "xmm0");
    } else {
      asm volatile(
          "vpdpbusd %%zmm30, %%zmm31, %%zmm0\n\t"
          "vpdpbusd %%zmm30, %%zmm31, %%zmm1\n\t"
          "vpdpwssd %%zmm30, %%zmm31, %%zmm16\n\t"
          "vpdpbusd %%zmm30, %%zmm31, %%zmm2\n\t"
          "vpdpbusd %%zmm30, %%zmm31, %%zmm3\n\t"
          "vpdpwssd %%zmm30, %%zmm31, %%zmm17\n\t"
          "vpdpbusd %%zmm30, %%zmm31, %%zmm4\n\t"
          "vpdpbusd %%zmm30, %%zmm31, %%zmm5\n\t"
          "vpdpwssd %%zmm30, %%zmm31, %%zmm18\n\t"
          "vpdpbusd %%zmm30, %%zmm31, %%zmm6\n\t"
          "vpdpbusd %%zmm30, %%zmm31, %%zmm7\n\t"
          "vpdpwssd %%zmm30, %%zmm31, %%zmm19\n\t"
          "vpdpbusd %%zmm30, %%zmm31, %%zmm8\n\t"
          "vpdpbusd %%zmm30, %%zmm31, %%zmm9\n\t"
          "vpdpwssd %%zmm30, %%zmm31, %%zmm20\n\t"
          "vpdpbusd %%zmm30, %%zmm31, %%zmm10\n\t"
          "vpdpbusd %%zmm30, %%zmm31, %%zmm11\n\t"
          "vpdpwssd %%zmm30, %%zmm31, %%zmm21\n\t"
          "vpdpbusd %%zmm30, %%zmm31, %%zmm12\n\t"
          "vpdpbusd %%zmm30, %%zmm31, %%zmm13\n\t"
          "vpdpwssd %%zmm30, %%zmm31, %%zmm22\n\t"
          "vpdpbusd %%zmm30, %%zmm31, %%zmm14\n\t"
          "vpdpbusd %%zmm30, %%zmm31, %%zmm15\n\t"
          "vpdpwssd %%zmm30, %%zmm31, %%zmm23\n\t" ::
              : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9",
                "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "xmm16", "xmm17", "xmm18",
                "xmm19", "xmm20", "xmm21", "xmm22", "xmm23");
    }
  }
  return static_cast<float>(mem[0]);
}
// The 8-token Q4_K kernel's chunk as it runs (GemmN<BlockQ4_Kx16, 8>): one vpandd of 64 code bytes
// from memory (16 rows x 4 nibbles), then 8 vpdpbusd, one per token, each s8 operand a {1to16}
// broadcast from that token's activation row (8 rows 1,168 bytes apart, pointers in registers);
// chunks alternate between two sets of 8 chains, so no chain waits on its last result. s/op per
// vpdpbusd: what the dot alone costs in the kernel's form, against kMix 0's port limit.
__attribute__((target("avx512f,avx512bw,avx512vnni"))) float DpbusdQ4KChunks(int64_t n,
                                                                             const uint8_t* codes,
                                                                             const int8_t* act) {
  const int8_t* a0 = act;
  const int8_t* a1 = act + 1168;
  const int8_t* a2 = act + 2 * 1168;
  const int8_t* a3 = act + 3 * 1168;
  const int8_t* a4 = act + 4 * 1168;
  const int8_t* a5 = act + 5 * 1168;
  const int8_t* a6 = act + 6 * 1168;
  const int8_t* a7 = act + 7 * 1168;
  asm volatile(
      "vpternlogd $0xff, %%zmm31, %%zmm31, %%zmm31\n\t"
      "vpabsb %%zmm31, %%zmm30\n\t"  // the nibble mask stand-in: ones
      "vpxord %%zmm0, %%zmm0, %%zmm0\n\t" ::
          : "xmm0", "xmm30", "xmm31");
#define LAMINA_Q4K_DOT(off, reg, acc) \
  "vpdpbusd " #off "(%[" #reg "])%{1to16%}, %%zmm29, %%zmm" #acc "\n\t"
#define LAMINA_Q4K_CHUNK(woff, aoff, c0, c1, c2, c3, c4, c5, c6, c7)                             \
  "vpandd " #woff "(%[w]), %%zmm30, %%zmm29\n\t" LAMINA_Q4K_DOT(aoff, a0, c0)                    \
      LAMINA_Q4K_DOT(aoff, a1, c1) LAMINA_Q4K_DOT(aoff, a2, c2) LAMINA_Q4K_DOT(aoff, a3, c3)     \
          LAMINA_Q4K_DOT(aoff, a4, c4) LAMINA_Q4K_DOT(aoff, a5, c5) LAMINA_Q4K_DOT(aoff, a6, c6) \
              LAMINA_Q4K_DOT(aoff, a7, c7)
  for (int64_t k = 0; k < n; k += 2) {
    asm volatile(LAMINA_Q4K_CHUNK(0, 0, 0, 1, 2, 3, 4, 5, 6, 7)
                     LAMINA_Q4K_CHUNK(64, 4, 8, 9, 10, 11, 12, 13, 14, 15)
                         LAMINA_Q4K_CHUNK(128, 8, 0, 1, 2, 3, 4, 5, 6, 7) LAMINA_Q4K_CHUNK(
                             192, 12, 8, 9, 10, 11, 12, 13, 14, 15)::[w] "r"(codes),
                 [a0] "r"(a0), [a1] "r"(a1), [a2] "r"(a2), [a3] "r"(a3), [a4] "r"(a4), [a5] "r"(a5),
                 [a6] "r"(a6), [a7] "r"(a7)
                 : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9",
                   "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "xmm29");
  }
#undef LAMINA_Q4K_CHUNK
#undef LAMINA_Q4K_DOT
  float out;
  asm volatile("vcvtdq2ps %%zmm0, %%zmm0\n\tvmovss %%xmm0, %0" : "=m"(out)::"xmm0");
  return out;
}
// The 4-bit V sum's row-pair step as Int16Dots runs it (kernels/kv_decode_avx512.cpp, q4_0, 4
// queries): two rows' 16 code bytes of one 32-value group zero-extended to dwords (vpmovzxbd from
// memory), the second shifted into the high words and ORed in, split into nibbles (vpandd, vpsrlw),
// both less 8 (vpsubw), then per query one weight pair broadcast (vpbroadcastd m32) into two
// vpdpwssd: 8 chains, 8 vpdpwssd a step. Rows 36 bytes apart (a head of 64 values: two groups of
// an f16 scale and 16 code bytes); codes and weights in L1. s/op per vpdpwssd, against kMix 1's
// port limit: what the unpacking costs the dot's ports. Eight per cell: 4 queries x 64 values / 32
// products per vpdpwssd.
__attribute__((target("avx512f,avx512bw,avx512vnni"))) float DpwssdQ4VPairs(int64_t n,
                                                                            const uint8_t* rows,
                                                                            const int32_t* wq) {
  asm volatile(
      "vpxord %%zmm0, %%zmm0, %%zmm0\n\t"
      "vpternlogd $0xff, %%zmm30, %%zmm30, %%zmm30\n\t"
      "vpsrlw $12, %%zmm30, %%zmm30\n\t"  // 0x000F in every word
      "vpsrlw $15, %%zmm30, %%zmm31\n\t"
      "vpsllw $3, %%zmm31, %%zmm31\n\t" ::  // 8 in every word
      : "xmm0", "xmm30", "xmm31");
// clang-format off
#define LAMINA_Q4V_PAIR(roff, woff)               \
  "vpmovzxbd " #roff "(%[r]), %%zmm20\n\t"        \
  "vpmovzxbd " #roff "+36(%[r]), %%zmm21\n\t"     \
  "vpslld $16, %%zmm21, %%zmm21\n\t"              \
  "vpord %%zmm21, %%zmm20, %%zmm20\n\t"           \
  "vpandd %%zmm30, %%zmm20, %%zmm22\n\t"          \
  "vpsrlw $4, %%zmm20, %%zmm23\n\t"               \
  "vpsubw %%zmm31, %%zmm22, %%zmm22\n\t"          \
  "vpsubw %%zmm31, %%zmm23, %%zmm23\n\t"          \
  "vpbroadcastd " #woff "(%[w]), %%zmm24\n\t"     \
  "vpdpwssd %%zmm24, %%zmm22, %%zmm0\n\t"         \
  "vpdpwssd %%zmm24, %%zmm23, %%zmm1\n\t"         \
  "vpbroadcastd " #woff "+256(%[w]), %%zmm25\n\t" \
  "vpdpwssd %%zmm25, %%zmm22, %%zmm2\n\t"         \
  "vpdpwssd %%zmm25, %%zmm23, %%zmm3\n\t"         \
  "vpbroadcastd " #woff "+512(%[w]), %%zmm26\n\t" \
  "vpdpwssd %%zmm26, %%zmm22, %%zmm4\n\t"         \
  "vpdpwssd %%zmm26, %%zmm23, %%zmm5\n\t"         \
  "vpbroadcastd " #woff "+768(%[w]), %%zmm27\n\t" \
  "vpdpwssd %%zmm27, %%zmm22, %%zmm6\n\t"         \
  "vpdpwssd %%zmm27, %%zmm23, %%zmm7\n\t"
  // clang-format on
  for (int64_t k = 0; k < n; ++k) {
    asm volatile(LAMINA_Q4V_PAIR(2, 0) LAMINA_Q4V_PAIR(74, 4)::[r] "r"(rows), [w] "r"(wq)
                 : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm20", "xmm21",
                   "xmm22", "xmm23", "xmm24", "xmm25", "xmm26", "xmm27");
  }
#undef LAMINA_Q4V_PAIR
  float out;
  asm volatile("vcvtdq2ps %%zmm0, %%zmm0\n\tvmovss %%xmm0, %0" : "=m"(out)::"xmm0");
  return out;
}
#pragma GCC diagnostic pop

void BM_PortLimit(benchmark::State& state) {
  if (!GetCpuFeatures().HasAvx512Set()) {
    state.SkipWithError("no AVX-512 VNNI on this CPU");
    return;
  }
  constexpr int64_t kIters = 1 << 16;
  std::vector<int32_t> mem(256, 0x01020304);           // broadcast sources for arg 4
  std::vector<uint8_t> codes(256, 0x35);               // arg 8: 4 chunks of 64 code bytes
  std::vector<int8_t> act(8 * 1168, 3);                // arg 8: [8 tokens][1168 bytes]
  std::vector<uint8_t> v_rows(4 * 36, 0x5A);           // arg 9: 4 rows of a 64-value q4_0 head
  std::vector<int32_t> v_weights(4 * 64, 0x00030002);  // arg 9: [query][64] weight pairs
  float out = 0.0f;
  const int64_t arg = state.range(0);
  for (auto _ : state) {
    switch (arg) {
      case 0:
        out += FmaChains(kIters);
        break;
      case 1:
        out += DpwssdChains(kIters);
        break;
      case 2:
        out += DpbusdMixChains<0>(kIters, mem.data());
        break;
      case 3:
        out += DpbusdMixChains<1>(kIters, mem.data());
        break;
      case 4:
        out += DpbusdMixChains<2>(kIters, mem.data());
        break;
      case 5:
        out += DpbusdMixChains<3>(kIters, mem.data());
        break;
      case 6:
        out += DpbusdMixChains<4>(kIters, mem.data());
        break;
      case 7:
        out += DpbusdMixChains<5>(kIters, mem.data());
        break;
      case 8:
        out += DpbusdQ4KChunks(kIters, codes.data(), act.data());  // 16 kIters vpdpbusd
        break;
      default:
        out += DpwssdQ4VPairs(kIters, v_rows.data(), v_weights.data());  // 16 kIters vpdpwssd
        break;
    }
    benchmark::DoNotOptimize(out);
  }
  static const char* const kLabels[] = {"vfmadd231ps zmm",
                                        "vpdpwssd zmm",
                                        "vpdpbusd zmm",
                                        "vpdpbusd + vpshufb per 2",
                                        "vpdpbusd, s8 by vpbroadcastd m32",
                                        "vpdpbusd + vpdpwssd per 2",
                                        "vpdpbusd, 8 chains, s8 by {1to16} m32",
                                        "vpdpbusd, 1 chain (latency)",
                                        "Q4_K 8-token chunks: vpandd m512 + 8 {1to16}",
                                        "q4_0 V row pairs: 2 vpmovzxbd m128 + 6 + 4 bcast / 8"};
  state.SetLabel(kLabels[arg]);
  state.counters["s/op"] = benchmark::Counter(
      16.0 * kIters * state.iterations(), benchmark::Counter::kIsRate | benchmark::Counter::kInvert,
      benchmark::Counter::kIs1000);
}
BENCHMARK(BM_PortLimit)->DenseRange(0, 9);

// Streaming read bandwidth over a buffer far larger than the caches, on 1 or 2 threads. Integer
// adds into 8 independent accumulators keep the loop far from compute-bound, so it measures the
// memory system (the roofline's denominator).
void BM_MemoryReadBandwidth(benchmark::State& state) {
  // The probe `lamina bench --roofline` runs, over 1 GiB.
  ReadBandwidthProbe probe(size_t{1} << 30);
  ThreadPool pool(static_cast<int>(state.range(0)));
  double gbs = 0.0;
  for (auto _ : state) gbs = probe.Measure(pool, 1);
  benchmark::DoNotOptimize(gbs);
  state.counters["GB/s"] =
      benchmark::Counter(static_cast<double>(probe.bytes()) * state.iterations(),
                         benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
}
BENCHMARK(BM_MemoryReadBandwidth)->Arg(1)->Arg(2)->UseRealTime()->Unit(benchmark::kMillisecond);

// args: type, threads. Does the one-token matmul stream at the probe's rate? 256 MiB of copies
// of the 2816 x 1024 FFN matrix in the interleaved layout (8x the 32 MiB L3), read in turn by
// one-token matmuls, and the same-size ReadBandwidthProbe buffer read on the same pool; each
// iteration runs the probe once and the matmuls once over the whole set, so both see the same
// minute of the machine. Counters: both GB/s and their ratio (the kernel's share of the probe).
void BM_GemmStreamVsProbe(benchmark::State& state) {
  constexpr size_t kSetBytes = size_t{256} << 20;
  const GgmlType type = static_cast<GgmlType>(state.range(0));
  ThreadPool pool(static_cast<int>(state.range(1)));
  Weights w = MakeWeights(type, 2816, 1024);
  if (!CanInterleave(w.w)) {
    state.SkipWithError("no interleaved layout for this type at this ISA");
    return;
  }
  const size_t bytes = w.data.size();
  const size_t n_copies = kSetBytes / bytes;
  // [n_copies][2816 / 16 groups][16 * row_bytes], in huge pages as the model's repacked weights
  std::vector<uint8_t, HugePageAllocator<uint8_t>> packed(bytes * n_copies);
  std::vector<WeightMatrix> copies;
  for (size_t c = 0; c < n_copies; ++c)
    copies.push_back(InterleaveInto(w.w, packed.data() + c * bytes));
  ReadBandwidthProbe probe(packed.size());
  std::vector<float> x(1024, 0.5f), y(2816);  // [1, 1024], [1, 2816]
  MatMulScratch scratch;
  double probe_s = 0.0, gemm_s = 0.0;
  for (auto _ : state) {
    probe_s += static_cast<double>(probe.bytes()) / 1e9 / probe.Measure(pool, 1);
    const auto t0 = std::chrono::steady_clock::now();
    for (const WeightMatrix& m : copies) {
      MatMul(m, x.data(), 1024, 1, y.data(), 2816, scratch, pool);
      benchmark::DoNotOptimize(y.data());
    }
    gemm_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  const double n = static_cast<double>(state.iterations());
  const double probe_gbs = static_cast<double>(probe.bytes()) * n / probe_s / 1e9;
  const double gemm_gbs = static_cast<double>(packed.size()) * n / gemm_s / 1e9;
  state.SetLabel(GgmlTypeName(type));
  state.counters["probe_GB/s"] = probe_gbs;
  state.counters["gemm_GB/s"] = gemm_gbs;
  state.counters["share"] = gemm_gbs / probe_gbs;
}
BENCHMARK(BM_GemmStreamVsProbe)
    ->ArgsProduct({{int(GgmlType::kQ8_0), int(GgmlType::kQ4_K), int(GgmlType::kQ5_K),
                    int(GgmlType::kQ6_K), int(GgmlType::kIQ4_XS), int(GgmlType::kQ4_0)},
                   {1, 2}})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace lamina
