// Persistent thread pool with chunk claiming (see thread_pool.h).
#include "util/thread_pool.h"

#include <algorithm>
#include <chrono>

#include "util/check.h"

#if defined(__x86_64__)
#include <immintrin.h>
#include <x86intrin.h>
#endif

namespace lamina {

namespace {
inline void CpuRelax() {
#if defined(__x86_64__)
  _mm_pause();
#endif
}
// A cheap monotonic tick count for bounding spins (the TSC; a few GHz), no system call.
inline uint64_t Ticks() {
#if defined(__x86_64__)
  return __rdtsc();
#else
  return static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
#endif
}
// A worker spins this long for the next region before it sleeps on the condition variable
// (~0.4 ms at 2.7 GHz): a decode step's regions come microseconds apart, so a worker that
// slept between them would cost a futex wake per region.
constexpr uint64_t kWorkerSpinTicks = uint64_t{1} << 20;
// The caller spins this long (~25 us at 2.7 GHz) on the other threads' last chunks, then yields
// the core at every check. Not longer: on an oversubscribed machine both threads of a 2-thread
// pool often share one core, and a caller spinning longer keeps the worker that holds the last
// chunk off it (spinning ~100 us here ran a 2-thread decode 2-3x slower at load 15).
constexpr uint64_t kJoinSpinTicks = uint64_t{1} << 16;
// Prefetched per claim of the hint: 64 lines, short enough that a waiting thread notices its
// next loop (or the end of a join) within ~0.2 us.
constexpr int64_t kPrefetchPiece = 4096;
constexpr uint64_t kChunkBits = 20;
constexpr uint64_t kChunkMask = (1ull << kChunkBits) - 1;
inline uint64_t Tag(uint64_t w) { return w >> (2 * kChunkBits); }
inline uint64_t NChunks(uint64_t w) { return (w >> kChunkBits) & kChunkMask; }
inline uint64_t Next(uint64_t w) { return w & kChunkMask; }
}  // namespace

ThreadPool::ThreadPool(int n_threads) {
  if (n_threads <= 0)
    n_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  n_threads_ = n_threads;
  bounds_.resize(static_cast<size_t>(kChunksPerThread * n_threads_) + 1);
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

void ThreadPool::PrefetchWhileIdle(const PrefetchRange* ranges, int n) {
  if (n_threads_ == 1) return;
  LAMINA_CHECK(n >= 0 && n <= kMaxPrefetchRanges);
  pf_n_.store(0, std::memory_order_relaxed);  // no claims while the ranges change
  for (int i = 0; i < n; ++i) {
    pf_data_[i].store(reinterpret_cast<uintptr_t>(ranges[i].data), std::memory_order_relaxed);
    pf_bytes_[i].store(static_cast<int64_t>(ranges[i].bytes), std::memory_order_relaxed);
  }
  pf_next_.store(0, std::memory_order_relaxed);
  pf_n_.store(n, std::memory_order_release);
}

bool ThreadPool::PrefetchPiece() {
  const int n = pf_n_.load(std::memory_order_acquire);
  if (n == 0 || pf_next_.load(std::memory_order_relaxed) * kPrefetchPiece >= kPrefetchBudget) {
    return false;
  }
  const int64_t piece = pf_next_.fetch_add(1, std::memory_order_relaxed);
  if (piece * kPrefetchPiece >= kPrefetchBudget) return false;
  // Piece i: range i % n at offset (i / n) pieces. A hint replaced meanwhile may mix old and new
  // ranges: a prefetch of any address is harmless.
  const int r = static_cast<int>(piece % n);
  const int64_t begin = piece / n * kPrefetchPiece;
  const int64_t end =
      std::min(begin + kPrefetchPiece, pf_bytes_[r].load(std::memory_order_relaxed));
  const char* base = reinterpret_cast<const char*>(pf_data_[r].load(std::memory_order_relaxed));
#if defined(__x86_64__)
  for (int64_t o = begin; o < end; o += 64) _mm_prefetch(base + o, _MM_HINT_T1);
#else
  for (int64_t o = begin; o < end; o += 64) __builtin_prefetch(base + o, 0, 2);
#endif
  return true;
}

void ThreadPool::RunChunks(uint64_t job_tag, int slot) {
  uint64_t w = work_.load(std::memory_order_acquire);
  for (;;) {
    if (Tag(w) != job_tag || Next(w) >= NChunks(w)) return;
    if (!work_.compare_exchange_weak(w, w + 1, std::memory_order_acq_rel)) continue;
    // Claimed chunk Next(w) of job_tag: the job cannot finish (and fn_, bounds_ cannot change)
    // until this chunk is counted in done_.
    const size_t c = static_cast<size_t>(Next(w));
    (*fn_)(bounds_[c], bounds_[c + 1], slot);
    done_.fetch_add(1, std::memory_order_acq_rel);
    w = work_.load(std::memory_order_acquire);
  }
}

void ThreadPool::WorkerLoop(int slot) {
  uint64_t last_tag = 0;
  for (;;) {
    uint64_t w = work_.load(std::memory_order_acquire);
    uint64_t spin_start = Ticks();
    int spins = 0;
    while (Tag(w) == last_tag && !stop_.load(std::memory_order_relaxed)) {
      // The clock is read every 64 pauses only.
      if ((++spins & 63) != 0 || Ticks() - spin_start < kWorkerSpinTicks) {
        if (!PrefetchPiece()) CpuRelax();
      } else {
        std::unique_lock<std::mutex> lock(mu_);
        sleepers_.fetch_add(1);
        cv_.wait(lock, [&] { return Tag(work_.load()) != last_tag || stop_.load(); });
        sleepers_.fetch_sub(1);
        spin_start = Ticks();
      }
      w = work_.load(std::memory_order_acquire);
    }
    if (stop_.load()) return;
    last_tag = Tag(w);
    RunChunks(last_tag, slot);
  }
}

int64_t ThreadPool::SplitChunks(int64_t n, int64_t grain) {
  const int64_t max_chunks = (n + grain - 1) / grain;
  const int64_t k = std::min<int64_t>(max_chunks, kChunksPerThread * n_threads_);
  if (max_chunks < 2 * k) {
    // Few items: even chunks (ceil(n / k) items each).
    const int64_t size = (n + k - 1) / k;
    int64_t c = 0;
    for (int64_t b = 0; b < n; b += size) bounds_[static_cast<size_t>(c++)] = b;
    bounds_[static_cast<size_t>(c)] = n;
    return c;
  }
  // Chunks of decreasing size, weights k, k - 1, ..., 1 (each at least `grain` items): the big
  // ones first keep the claims few, the small ones last leave a thread at most a small chunk to
  // wait for at the join (k even chunks left one thread idle for up to 1 / k of the loop).
  // Which thread runs which chunk never changes a result.
  const int64_t total_weight = k * (k + 1) / 2;
  int64_t begin = 0, weight_done = 0, c = 0;
  for (int64_t i = 0; i < k && begin < n; ++i) {
    weight_done += k - i;
    int64_t end = (n * weight_done + total_weight - 1) / total_weight;  // ceil
    end = std::min(n, std::max(end, begin + grain));
    if (n - end < grain) end = n;  // no runt chunk at the end
    bounds_[static_cast<size_t>(c++)] = begin;
    begin = end;
  }
  bounds_[static_cast<size_t>(c)] = n;
  return c;
}

void ThreadPool::ParallelFor(int64_t n, int64_t grain,
                             const std::function<void(int64_t, int64_t, int)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  if (n_threads_ == 1) {
    fn(0, n, 0);
    return;
  }
  const int64_t real_chunks = SplitChunks(n, grain);
  if (real_chunks <= 1) {
    fn(0, n, 0);
    return;
  }
  LAMINA_CHECK(static_cast<uint64_t>(real_chunks) <= kChunkMask);
  ++regions_;
  fn_ = &fn;
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
  const uint64_t spin_start = Ticks();
  bool spin = true;
  int spins = 0;
  while (done_.load(std::memory_order_acquire) != real_chunks) {
    // The clock is read every 64 pauses only.
    if (spin && (++spins & 63) == 0) spin = Ticks() - spin_start < kJoinSpinTicks;
    if (spin) {
      if (!PrefetchPiece()) CpuRelax();
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
