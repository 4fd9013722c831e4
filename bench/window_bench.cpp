// What a verify window costs against a decode step on the shipped model, in a warm session:
// per iteration N tokens are evaluated after a 32-token history (all logits when N > 1, as a
// speculative verify window wants them) and truncated away again, so every iteration sees the
// same cache. BM_ShippedWindow/N/threads; the ratio of N = 9 to N = 1 is "a 9-token window in
// decode steps". BM_PoolRegion: what one parallel region costs. Prints figures; nothing is
// asserted.
//   build/release/bench/window_bench [--benchmark_filter=...]
#include <benchmark/benchmark.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "model/model.h"
#include "runtime/session.h"
#include "util/thread_pool.h"

namespace lamina {
namespace {

constexpr int kHistory = 32;

const Model* ShippedModel() {
  static std::unique_ptr<Model> model = [] {
    Result<std::unique_ptr<Model>> m =
        LoadModel(std::string(LAMINA_SOURCE_DIR) + "/models/lamina-counter.gguf");
    return m.ok() ? std::move(*m) : nullptr;
  }();
  return model.get();
}

void BM_ShippedWindow(benchmark::State& state) {
  const Model* model = ShippedModel();
  if (model == nullptr) {
    state.SkipWithError("the shipped model did not load");
    return;
  }
  const int n = static_cast<int>(state.range(0));
  ThreadPool pool(static_cast<int>(state.range(1)));
  SessionConfig sc;
  sc.n_ctx = 256;
  Session s(*model, sc, pool);
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> dist(0, model->hparams().n_vocab - 1);
  std::vector<int32_t> history(kHistory), window(n);  // token ids
  for (int32_t& t : history) t = dist(rng);
  for (int32_t& t : window) t = dist(rng);
  if (!s.Eval(history, false).ok() || !s.Eval(window, n > 1).ok()) {
    state.SkipWithError("evaluation failed");
    return;
  }
  s.Truncate(kHistory);
  for (auto _ : state) {
    Result<const float*> r = s.Eval(window, n > 1);
    benchmark::DoNotOptimize(r.ok());
    s.Truncate(kHistory);
  }
}
BENCHMARK(BM_ShippedWindow)->ArgsProduct({{1, 9}, {1, 2}})->UseRealTime();

// One fork and join of the pool with (almost) nothing to do: 8 chunks, as a matmul splits its
// rows, each a few dozen nanoseconds of arithmetic. A decode step of the shipped model runs
// 26 such regions (5 per layer and the output head), a 9-token window 31.
void BM_PoolRegion(benchmark::State& state) {
  ThreadPool pool(static_cast<int>(state.range(0)));
  std::vector<float> sink(pool.size() * 16);  // [threads][16], one slot per thread's line
  for (auto _ : state) {
    pool.ParallelFor(8, 1, [&](int64_t b, int64_t e, int slot) {
      float acc = 0.0f;
      for (int64_t i = b * 16; i < e * 16; ++i) acc += static_cast<float>(i) * 0.5f;
      sink[slot * 16] += acc;
    });
    benchmark::DoNotOptimize(sink.data());
  }
}
BENCHMARK(BM_PoolRegion)->Arg(1)->Arg(2)->UseRealTime();

}  // namespace
}  // namespace lamina
