// Persistent thread pool with chunk claiming (see thread_pool.h).
#include "util/thread_pool.h"

#include <algorithm>

#include "util/check.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace lamina {

namespace {
inline void CpuRelax() {
#if defined(__x86_64__)
  _mm_pause();
#endif
}
constexpr int kSpinIterations = 20000;
constexpr uint64_t kChunkBits = 20;
constexpr uint64_t kChunkMask = (1ull << kChunkBits) - 1;
inline uint64_t Tag(uint64_t w) { return w >> (2 * kChunkBits); }
inline uint64_t NChunks(uint64_t w) { return (w >> kChunkBits) & kChunkMask; }
inline uint64_t Next(uint64_t w) { return w & kChunkMask; }
}  // namespace

ThreadPool::ThreadPool(int n_threads) {
  if (n_threads <= 0) n_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  n_threads_ = n_threads;
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { WorkerLoop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true);
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::RunChunks(uint64_t job_tag, int slot) {
  uint64_t w = work_.load(std::memory_order_acquire);
  for (;;) {
    if (Tag(w) != job_tag || Next(w) >= NChunks(w)) return;
    if (!work_.compare_exchange_weak(w, w + 1, std::memory_order_acq_rel)) continue;
    // Claimed chunk Next(w) of job_tag: the job cannot finish (and fn_ cannot change) until
    // this chunk is counted in done_.
    const int64_t c = static_cast<int64_t>(Next(w));
    const int64_t begin = c * chunk_size_;
    const int64_t end = std::min(n_items_, begin + chunk_size_);
    (*fn_)(begin, end, slot);
    done_.fetch_add(1, std::memory_order_acq_rel);
    w = work_.load(std::memory_order_acquire);
  }
}

void ThreadPool::WorkerLoop(int slot) {
  uint64_t last_tag = 0;
  for (;;) {
    uint64_t w = work_.load(std::memory_order_acquire);
    int spins = 0;
    while (Tag(w) == last_tag && !stop_.load(std::memory_order_relaxed)) {
      if (++spins < kSpinIterations) {
        CpuRelax();
      } else {
        std::unique_lock<std::mutex> lock(mu_);
        sleepers_.fetch_add(1);
        cv_.wait(lock, [&] {
          return Tag(work_.load()) != last_tag || stop_.load();
        });
        sleepers_.fetch_sub(1);
        spins = 0;
      }
      w = work_.load(std::memory_order_acquire);
    }
    if (stop_.load()) return;
    last_tag = Tag(w);
    RunChunks(last_tag, slot);
  }
}

void ThreadPool::ParallelFor(int64_t n, int64_t grain,
                             const std::function<void(int64_t, int64_t, int)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  // A few chunks per thread balance uneven progress without much claiming traffic.
  const int64_t max_chunks = std::max<int64_t>(1, (n + grain - 1) / grain);
  const int64_t n_chunks = std::min<int64_t>(max_chunks, n_threads_ == 1 ? 1 : 4 * n_threads_);
  if (n_chunks <= 1) {
    fn(0, n, 0);
    return;
  }
  LAMINA_CHECK(static_cast<uint64_t>(n_chunks) <= kChunkMask);
  fn_ = &fn;
  n_items_ = n;
  chunk_size_ = (n + n_chunks - 1) / n_chunks;
  const int64_t real_chunks = (n + chunk_size_ - 1) / chunk_size_;
  done_.store(0, std::memory_order_relaxed);
  tag_ = (tag_ + 1) & ((1ull << (64 - 2 * kChunkBits)) - 1);
  if (tag_ == 0) tag_ = 1;
  // seq_cst store and load: pairs with the sleeper's increment-then-check (no lost wake-up).
  work_.store((tag_ << (2 * kChunkBits)) | (static_cast<uint64_t>(real_chunks) << kChunkBits));
  if (sleepers_.load() > 0) {
    std::lock_guard<std::mutex> lock(mu_);
    cv_.notify_all();
  }
  RunChunks(tag_, 0);
  int spins = 0;
  while (done_.load(std::memory_order_acquire) != real_chunks) {
    if (++spins < 1000) {
      CpuRelax();
    } else {
      std::this_thread::yield();
    }
  }
  fn_ = nullptr;
}

void ThreadPool::ParallelFor(int64_t n, int64_t grain,
                             const std::function<void(int64_t, int64_t)>& fn) {
  ParallelFor(n, grain, [&fn](int64_t b, int64_t e, int) { fn(b, e); });
}

}  // namespace lamina
