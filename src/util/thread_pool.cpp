// Persistent thread pool with per-thread lanes of chunks (see thread_pool.h).
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
// Chunks per thread and loop: a few balance uneven progress without much claiming.
constexpr int kChunksPerThread = 4;
// Lane state: tag << 32 | head << 16 | tail.
constexpr uint64_t kIndexBits = 16;
constexpr uint64_t kIndexMask = (1ull << kIndexBits) - 1;
inline uint64_t Tag(uint64_t s) { return s >> (2 * kIndexBits); }
inline int64_t Head(uint64_t s) { return static_cast<int64_t>((s >> kIndexBits) & kIndexMask); }
inline int64_t Tail(uint64_t s) { return static_cast<int64_t>(s & kIndexMask); }
inline uint64_t LaneState(uint64_t tag, int64_t head, int64_t tail) {
  return tag << (2 * kIndexBits) | static_cast<uint64_t>(head) << kIndexBits |
         static_cast<uint64_t>(tail);
}
}  // namespace

ThreadPool::ThreadPool(int n_threads) {
  if (n_threads <= 0)
    n_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  // Chunk indices fit a lane's 16-bit head and tail.
  n_threads_ = std::min(n_threads, static_cast<int>(kIndexMask / kChunksPerThread));
  lanes_ = std::make_unique<Lane[]>(static_cast<size_t>(n_threads_));
  bounds_.resize(static_cast<size_t>(kChunksPerThread * n_threads_) + 1);
  lane_first_.resize(static_cast<size_t>(n_threads_) + 1);
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

int64_t ThreadPool::Claim(int lane, uint64_t job_tag, bool front) {
  std::atomic<uint64_t>& state = lanes_[static_cast<size_t>(lane)].state;
  uint64_t s = state.load(std::memory_order_acquire);
  for (;;) {
    // Another loop's state: this one's chunks there are all claimed (a loop starts only after
    // the last one joined, and its states are written before it starts).
    if (Tag(s) != job_tag) return -1;
    const int64_t head = Head(s), tail = Tail(s);
    if (head >= tail) return -1;
    const uint64_t next =
        front ? LaneState(job_tag, head + 1, tail) : LaneState(job_tag, head, tail - 1);
    if (state.compare_exchange_weak(s, next, std::memory_order_acq_rel)) {
      return front ? head : tail - 1;
    }
  }
}

void ThreadPool::RunChunks(uint64_t job_tag, int slot) {
  std::atomic<uint64_t>& finished = lanes_[static_cast<size_t>(slot)].finished;
  // A claimed chunk of job_tag: the loop cannot finish (and fn_, bounds_ cannot change) until it
  // is counted in this thread's finished.
  auto run = [&](int64_t c) {
    (*fn_)(bounds_[static_cast<size_t>(c)], bounds_[static_cast<size_t>(c) + 1], slot);
    finished.store(finished.load(std::memory_order_relaxed) + 1, std::memory_order_release);
  };
  for (int64_t c; (c = Claim(slot, job_tag, true)) >= 0;) run(c);
  for (int i = 1; i < n_threads_; ++i) {
    const int lane = (slot + i) % n_threads_;
    for (int64_t c; (c = Claim(lane, job_tag, false)) >= 0;) run(c);
  }
}

void ThreadPool::WorkerLoop(int slot) {
  std::atomic<uint64_t>& state = lanes_[static_cast<size_t>(slot)].state;
  uint64_t last_tag = 0;
  for (;;) {
    uint64_t s = state.load(std::memory_order_acquire);
    uint64_t spin_start = Ticks();
    int spins = 0;
    while (Tag(s) == last_tag && !stop_.load(std::memory_order_relaxed)) {
      // The clock is read every 64 pauses only.
      if ((++spins & 63) != 0 || Ticks() - spin_start < kWorkerSpinTicks) {
        if (!PrefetchPiece()) CpuRelax();
      } else {
        std::unique_lock<std::mutex> lock(mu_);
        sleepers_.fetch_add(1);
        cv_.wait(lock, [&] { return Tag(state.load()) != last_tag || stop_.load(); });
        sleepers_.fetch_sub(1);
        spin_start = Ticks();
      }
      s = state.load(std::memory_order_acquire);
    }
    if (stop_.load()) return;
    last_tag = Tag(s);
    RunChunks(last_tag, slot);
  }
}

int64_t ThreadPool::SplitChunks(int64_t n, int64_t grain) {
  // Thread t's items: grains [ceil(G t / T), ceil(G (t + 1) / T)) of the G grains (the last
  // grain may be short), so the caller (t = 0) has work whenever a later thread has.
  const int64_t grains = (n + grain - 1) / grain;
  const auto grain_start = [&](int64_t t) {
    return std::min(n, (grains * t + n_threads_ - 1) / n_threads_ * grain);
  };
  int64_t c = 0;
  for (int t = 0; t < n_threads_; ++t) {
    lane_first_[static_cast<size_t>(t)] = c;
    const int64_t begin = grain_start(t), end = grain_start(t + 1);
    const int64_t m = end - begin;
    if (m <= 0) continue;
    const int64_t max_chunks = (m + grain - 1) / grain;
    const int64_t k = std::min<int64_t>(max_chunks, kChunksPerThread);
    if (max_chunks < 2 * k) {
      // Few items: even chunks (ceil(m / k) items each).
      const int64_t size = (m + k - 1) / k;
      for (int64_t b = 0; b < m; b += size) bounds_[static_cast<size_t>(c++)] = begin + b;
      continue;
    }
    // Chunks of decreasing size, weights k, k - 1, ..., 1 (each at least `grain` items): the big
    // ones first keep the claims few, the small ones last leave a thread at most a small chunk
    // to wait for at the join, or for another thread to take. Which thread runs which chunk
    // never changes a result.
    const int64_t total_weight = k * (k + 1) / 2;
    int64_t b = 0, weight_done = 0;
    for (int64_t i = 0; i < k && b < m; ++i) {
      weight_done += k - i;
      int64_t e = (m * weight_done + total_weight - 1) / total_weight;  // ceil
      e = std::min(m, std::max(e, b + grain));
      if (m - e < grain) e = m;  // no runt chunk at the end
      bounds_[static_cast<size_t>(c++)] = begin + b;
      b = e;
    }
  }
  lane_first_[static_cast<size_t>(n_threads_)] = c;
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
  ++regions_;
  fn_ = &fn;
  tag_ = (tag_ + 1) & 0xFFFFFFFFull;
  if (tag_ == 0) tag_ = 1;
  // The lanes' states start the loop (a worker waits for its own lane's tag to change). The
  // stores, then one seq_cst fence and load: they pair with the sleeper's increment-then-check
  // (no lost wake-up), and the lines' transfers overlap rather than one fenced store each.
  for (int t = 0; t < n_threads_; ++t) {
    lanes_[static_cast<size_t>(t)].state.store(LaneState(tag_, lane_first_[static_cast<size_t>(t)],
                                                         lane_first_[static_cast<size_t>(t) + 1]),
                                               std::memory_order_release);
  }
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (sleepers_.load() > 0) {
    std::lock_guard<std::mutex> lock(mu_);
    cv_.notify_all();
  }
  RunChunks(tag_, 0);
  const uint64_t target = finished_total_ + static_cast<uint64_t>(real_chunks);
  auto finished = [&] {
    uint64_t sum = 0;
    for (int t = 0; t < n_threads_; ++t) {
      sum += lanes_[static_cast<size_t>(t)].finished.load(std::memory_order_acquire);
    }
    return sum;
  };
  const uint64_t spin_start = Ticks();
  bool spin = true;
  int spins = 0;
  while (finished() != target) {
    // The clock is read every 64 pauses only.
    if (spin && (++spins & 63) == 0) spin = Ticks() - spin_start < kJoinSpinTicks;
    if (spin) {
      if (!PrefetchPiece()) CpuRelax();
    } else {
      std::this_thread::yield();
    }
  }
  finished_total_ = target;
  fn_ = nullptr;
}

void ThreadPool::ParallelFor(int64_t n, int64_t grain,
                             const std::function<void(int64_t, int64_t)>& fn) {
  ParallelFor(n, grain, [&fn](int64_t b, int64_t e, int) { fn(b, e); });
}

}  // namespace lamina
