// A small persistent thread pool for data-parallel loops. The calling thread takes part, so
// ThreadPool(1) runs everything inline. Work is split into chunks that threads claim from an
// atomic counter: a descheduled worker (a busy machine) delays nothing, because whoever runs
// takes the remaining chunks, and the chunks shrink towards the end of a loop so the last ones
// leave little to wait for. Workers spin (~0.4 ms) before sleeping, because decode issues dozens
// of short loops per token and a futex wake per loop would dominate; the caller spins ~25 us on
// the join, then yields (on a busy machine the thread it waits for may need its core). While a
// thread waits, at a join or for the next loop, it prefetches the memory the caller says the
// next loop will read (PrefetchWhileIdle), so the memory bus stays busy through the joins and
// the caller's serial work between loops.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace lamina {

// A byte range a later parallel loop will read (a weight matrix).
struct PrefetchRange {
  const void* data = nullptr;
  size_t bytes = 0;
};

class ThreadPool {
 public:
  static constexpr int kMaxPrefetchRanges = 4;
  // Bytes prefetched per hint at most, all threads together: a fraction of a core's L2, about
  // what a decode step's joins and serial work leave idle per loop on a quiet machine.
  static constexpr int64_t kPrefetchBudget = int64_t{256} << 10;

  // n_threads counts the caller; n_threads <= 0 means "all hardware threads".
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }
  // Parallel regions run so far (loops split over more than one chunk; a loop run inline on
  // the caller is not one): each is a fork and a join.
  uint64_t regions() const { return regions_; }

  // Splits [0, n) into contiguous chunks of about `grain` items or more and runs
  // fn(begin, end, thread_slot) on them from all threads; waits for all. thread_slot in
  // [0, size()) is unique among concurrently running calls (for per-thread scratch).
  void ParallelFor(int64_t n, int64_t grain,
                   const std::function<void(int64_t begin, int64_t end, int thread_slot)>& fn);
  void ParallelFor(int64_t n, int64_t grain,
                   const std::function<void(int64_t begin, int64_t end)>& fn);

  // A hint: the next loop after the following one reads ranges[0..n) (n <= kMaxPrefetchRanges)
  // from their start. Until the next hint, a thread with nothing to do (the caller at a join
  // with the last chunks on other threads, a worker between loops) prefetches their first
  // kPrefetchBudget bytes (interleaved over the ranges, shared by the threads). It changes no
  // result; n = 0 clears it. A 1-thread pool ignores it.
  void PrefetchWhileIdle(const PrefetchRange* ranges, int n);

 private:
  void WorkerLoop(int slot);
  // Claims and runs chunks of the current job until none are left.
  void RunChunks(uint64_t job_tag, int slot);
  // Prefetches the next piece of the hint; false when none is left.
  bool PrefetchPiece();
  // Fills bounds_ with the chunks of [0, n) for `grain`; returns how many.
  int64_t SplitChunks(int64_t n, int64_t grain);

  // Chunks per thread and loop: a few balance uneven progress without much claiming traffic.
  static constexpr int kChunksPerThread = 4;

  int n_threads_;
  std::vector<std::thread> workers_;
  // The current job: work_ packs (tag << 40 | n_chunks << 20 | next_chunk); a worker runs a chunk
  // only after claiming it with a CAS on the right tag, so a late worker never runs a stale job.
  std::atomic<uint64_t> work_{0};
  std::atomic<int64_t> done_{0};
  const std::function<void(int64_t, int64_t, int)>* fn_ = nullptr;
  // [kChunksPerThread * n_threads_ + 1] chunk c of the current loop: [bounds_[c], bounds_[c + 1])
  std::vector<int64_t> bounds_;
  uint64_t tag_ = 0;
  uint64_t regions_ = 0;
  // The prefetch hint: ranges (read racily by the threads, hence atomics) and the next piece.
  std::atomic<uintptr_t> pf_data_[kMaxPrefetchRanges] = {};
  std::atomic<int64_t> pf_bytes_[kMaxPrefetchRanges] = {};
  std::atomic<int> pf_n_{0};
  std::atomic<int64_t> pf_next_{0};
  std::atomic<bool> stop_{false};
  std::atomic<int> sleepers_{0};
  std::mutex mu_;
  std::condition_variable cv_;
};

}  // namespace lamina
