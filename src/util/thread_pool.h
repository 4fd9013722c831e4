// A small persistent thread pool for data-parallel loops. The calling thread takes part, so
// ThreadPool(1) runs everything inline (and keeps no state while it does: threads of another
// pool may share one as their inline pool). Each thread gets a contiguous share of a loop's items,
// split into chunks that shrink towards its share's end; it claims its own chunks front first
// from a lane (a cache line) that only it touches while it has work, then takes the last chunks
// of other threads' lanes from their back: a descheduled worker (a busy machine) delays nothing,
// because whoever runs takes the chunks left, and a fork and join moves a few cache lines
// between cores instead of one shared counter per chunk. Workers spin (~0.4 ms) before
// sleeping, because decode issues dozens of short loops per token and a futex wake per loop
// would dominate; the caller spins ~25 us on the join, then yields (on a busy machine the thread
// it waits for may need its core). While a thread waits, at a join or for the next loop, it
// prefetches the memory the caller says the next loop will read (PrefetchWhileIdle), so the
// memory bus stays busy through the joins and the caller's serial work between loops.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
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
  // One thread's share of the current loop and its count of finished chunks, on a line of its
  // own: state = tag << 32 | head << 16 | tail, the share's chunks [head, tail) not yet claimed
  // for loop `tag` (the caller writes it to start a loop: a worker's signal); the owner claims
  // head, other threads tail - 1, each by a CAS. finished: chunks this thread has run over all
  // loops (only it writes; the caller's join sums them).
  struct alignas(64) Lane {
    std::atomic<uint64_t> state{0};
    std::atomic<uint64_t> finished{0};
  };

  void WorkerLoop(int slot);
  // Runs chunks of loop job_tag until none is left: its own lane's, then other lanes'.
  void RunChunks(uint64_t job_tag, int slot);
  // Claims a chunk of loop job_tag from lane `lane` (its first unclaimed one when front, else
  // its last); -1 when the lane has none left (or has moved on to another loop).
  int64_t Claim(int lane, uint64_t job_tag, bool front);
  // Prefetches the next piece of the hint; false when none is left.
  bool PrefetchPiece();
  // Fills bounds_ with the chunks of [0, n) for `grain`, each thread's in turn, and lane_first_
  // with where each thread's chunks start; returns how many chunks.
  int64_t SplitChunks(int64_t n, int64_t grain);

  int n_threads_;
  std::vector<std::thread> workers_;
  std::unique_ptr<Lane[]> lanes_;  // [n_threads_] lane t: thread slot t's (0: the caller)
  const std::function<void(int64_t, int64_t, int)>* fn_ = nullptr;
  // [chunks per thread * n_threads_ + 1] chunk c of the current loop: [bounds_[c], bounds_[c + 1])
  std::vector<int64_t> bounds_;
  // [n_threads_ + 1] thread t's chunks: [lane_first_[t], lane_first_[t + 1])
  std::vector<int64_t> lane_first_;
  uint64_t tag_ = 0;
  // Chunks finished by all threads when the last loop joined (the sum of the lanes' finished).
  uint64_t finished_total_ = 0;
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
