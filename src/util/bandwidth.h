// A streaming-read probe of memory bandwidth: integer sums over a buffer several times the
// last-level cache, split over a ThreadPool as a decode step's matmuls split their rows. It is
// the peer figure of `lamina bench --roofline` and of matmul_bench's MemoryReadBandwidth.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "util/huge_pages.h"
#include "util/thread_pool.h"

namespace lamina {

class ReadBandwidthProbe {
 public:
  // A buffer of `bytes` (rounded down to whole 64-byte lines, at least one), written once so
  // every page is mapped before the first measurement.
  explicit ReadBandwidthProbe(size_t bytes);

  // max(256 MiB, 8 × the last-level cache as sysconf reports it): streamed, never resident.
  static size_t DefaultBytes();

  // Reads the whole buffer `passes` times over `pool` (every thread of it, chunks claimed as
  // the matmuls claim theirs); the fastest pass's bytes read per second, in GB/s (1e9): what the
  // memory gave at its best in those moments, so a share against it is never flattered by one
  // slow pass.
  double Measure(ThreadPool& pool, int passes);

  size_t bytes() const { return words_.size() * sizeof(uint64_t); }

 private:
  // [bytes / 8] the streamed buffer, in transparent huge pages as the KV cells and the repacked
  // weights are (huge_pages.h): the probe is a ceiling only if it streams the way they do.
  std::vector<uint64_t, HugePageAllocator<uint64_t>> words_;
  std::vector<uint64_t> partial_;  // [threads * 8] one sum per thread, a cache line apart
};

}  // namespace lamina
