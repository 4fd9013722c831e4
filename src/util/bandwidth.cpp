// The streaming-read bandwidth probe (see bandwidth.h).
#include "util/bandwidth.h"

#include <unistd.h>

#include <algorithm>

#include "util/timer.h"

namespace lamina {

ReadBandwidthProbe::ReadBandwidthProbe(size_t bytes)
    : words_(std::max<size_t>(8, bytes / 64 * 8), 1) {}

size_t ReadBandwidthProbe::DefaultBytes() {
  constexpr size_t kMin = size_t{256} << 20;
  const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
  return std::max(kMin, l3 > 0 ? 8 * static_cast<size_t>(l3) : size_t{0});
}

double ReadBandwidthProbe::Measure(ThreadPool& pool, int passes) {
  passes = std::max(1, passes);
  partial_.assign(static_cast<size_t>(pool.size()) * 8, 0);
  const int64_t n = static_cast<int64_t>(words_.size());
  const uint64_t* w = words_.data();
  double best = 0.0;  // the shortest pass, in seconds (0: none yet)
  for (int p = 0; p < passes; ++p) {
    const double t0 = NowSeconds();
    // Chunks of at least 2 MiB; eight independent sums per 64-byte line (no dependency chain
    // limits the loads).
    pool.ParallelFor(n, int64_t{1} << 18, [&](int64_t b, int64_t e, int slot) {
      uint64_t acc[8] = {};
      for (int64_t i = b; i + 8 <= e; i += 8) {
        for (int j = 0; j < 8; ++j) acc[j] += w[i + j];
      }
      uint64_t s = 0;
      for (uint64_t a : acc) s += a;
      partial_[static_cast<size_t>(slot) * 8] += s;
    });
    const double dt = NowSeconds() - t0;
    if (best == 0.0 || dt < best) best = dt;
  }
  // Keeps the sums observable, so the loads are not optimised away.
  uint64_t total = 0;
  for (uint64_t s : partial_) total += s;
  asm volatile("" : : "r"(total) : "memory");
  return best > 0 ? static_cast<double>(bytes()) / best / 1e9 : 0.0;
}

}  // namespace lamina
