// ThreadPool::ParallelFor: every item runs exactly once in contiguous chunks, whatever the
// thread count, the item count and the grain (even and decreasing chunk splits).
#include "util/thread_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

namespace lamina {
namespace {

TEST(ThreadPool, EveryItemOnceInChunksOfAtLeastGrain) {
  for (int threads : {1, 2, 3, 4}) {
    ThreadPool pool(threads);
    for (int64_t n : {1, 2, 3, 7, 16, 31, 64, 96, 176, 1000, 4097}) {
      for (int64_t grain : {1, 2, 4, 16, 100}) {
        std::vector<std::atomic<int>> hits(static_cast<size_t>(n));  // [n] runs per item
        std::mutex mu;
        std::vector<std::pair<int64_t, int64_t>> chunks;
        pool.ParallelFor(n, grain, [&](int64_t b, int64_t e, int slot) {
          EXPECT_GE(slot, 0);
          EXPECT_LT(slot, threads);
          for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
          std::lock_guard<std::mutex> lock(mu);
          chunks.emplace_back(b, e);
        });
        for (int64_t i = 0; i < n; ++i)
          ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1)
              << "threads " << threads << " n " << n << " grain " << grain << " item " << i;
        std::sort(chunks.begin(), chunks.end());
        ASSERT_LE(chunks.size(), static_cast<size_t>(4 * threads));
        for (const auto& [b, e] : chunks) {
          ASSERT_LT(b, e);
          // Decreasing splits (n >= 2 chunks' worth of grains per chunk) keep every chunk
          // at least `grain` items.
          if (n >= 8 * threads * grain) EXPECT_GE(e - b, grain);
        }
        // Larger chunks first: a thread that claims the last chunks waits for little.
        if (threads > 1 && n >= 8 * threads * grain && chunks.size() > 2) {
          EXPECT_GE(chunks.front().second - chunks.front().first,
                    chunks.back().second - chunks.back().first);
        }
      }
    }
  }
}

TEST(ThreadPool, ManyShortRegionsInARow) {
  ThreadPool pool(2);
  std::atomic<int64_t> sum{0};
  for (int r = 0; r < 20000; ++r) {
    pool.ParallelFor(64, 1, [&](int64_t b, int64_t e) { sum.fetch_add(e - b); });
  }
  EXPECT_EQ(sum.load(), int64_t{64} * 20000);
}

// Threads that take other threads' chunks (a chunk that sleeps holds its thread up), more threads
// than cores, and workers that fell asleep between loops: every item still runs exactly once,
// and no two chunks running at the same time share a thread slot.
TEST(ThreadPool, EveryItemOnceWhenThreadsTakeEachOthersChunks) {
  std::mt19937 rng(7);
  for (int threads : {2, 3, 5, 8}) {
    ThreadPool pool(threads);
    std::vector<std::atomic<int>> busy(static_cast<size_t>(threads));  // [threads] chunks running
    for (int r = 0; r < 300; ++r) {
      const int64_t n = 1 + static_cast<int64_t>(rng() % 200);
      const int64_t grain = std::array<int64_t, 4>{1, 2, 3, 7}[rng() % 4];
      const uint32_t slow = rng();  // bit i: chunks starting at items = i (mod 32) sleep
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));  // [n] runs per item
      std::atomic<bool> slot_shared{false};
      pool.ParallelFor(n, grain, [&](int64_t b, int64_t e, int slot) {
        ASSERT_GE(slot, 0);
        ASSERT_LT(slot, threads);
        if (busy[static_cast<size_t>(slot)].fetch_add(1) != 0) slot_shared = true;
        if ((slow >> (b % 32)) & 1 && r % 3 == 0) {
          std::this_thread::sleep_for(std::chrono::microseconds(30));
        }
        for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
        busy[static_cast<size_t>(slot)].fetch_sub(1);
      });
      ASSERT_FALSE(slot_shared) << threads << " threads, loop " << r;
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1)
            << threads << " threads, loop " << r << ", n " << n << ", item " << i;
      }
      // Now and then a pause past the workers' spin: they sleep, and the next loop wakes them.
      if (r % 50 == 49) std::this_thread::sleep_for(std::chrono::milliseconds(3));
    }
  }
}

// A prefetch hint (a real buffer, a null one, one replaced while loops run) changes nothing:
// every item still runs once, and the idle threads' prefetches never fault.
// A one-thread pool runs its loops on the calling thread and keeps no state while it does, so
// the threads of another pool may share one as their inline pool (the session does, spreading
// a decode step's sequences over its threads).
TEST(ThreadPool, OneThreadPoolSharedByAnotherPoolsThreads) {
  ThreadPool pool(3);
  ThreadPool inline_pool(1);
  constexpr int kItems = 64, kInner = 200;
  std::vector<int64_t> sums(kItems, -1);  // [item] what its inner loops added up
  pool.ParallelFor(kItems, 1, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      int64_t sum = 0;
      for (int r = 0; r < 10; ++r) {
        inline_pool.ParallelFor(kInner, 7, [&](int64_t b, int64_t e, int slot) {
          EXPECT_EQ(slot, 0);
          for (int64_t j = b; j < e; ++j) sum += j + i;
        });
      }
      sums[i] = sum;
    }
  });
  for (int i = 0; i < kItems; ++i) {
    EXPECT_EQ(sums[i], 10 * (int64_t{kInner} * (kInner - 1) / 2 + int64_t{kInner} * i)) << i;
  }
  EXPECT_EQ(inline_pool.regions(), 0u);
}

TEST(ThreadPool, PrefetchHintChangesNoResult) {
  std::vector<char> buffer(1 << 20, 1);  // [1 MiB] what the "next loop" reads
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    std::atomic<int64_t> sum{0};
    for (int r = 0; r < 2000; ++r) {
      const PrefetchRange ranges[] = {
          {buffer.data(), buffer.size()}, {buffer.data() + 4096, 100}, {nullptr, 0}};
      pool.PrefetchWhileIdle(ranges, r % 4 == 3 ? 0 : 1 + r % 3);
      pool.ParallelFor(64, 1, [&](int64_t b, int64_t e) { sum.fetch_add(e - b); });
    }
    EXPECT_EQ(sum.load(), int64_t{64} * 2000) << threads << " threads";
  }
}

}  // namespace
}  // namespace lamina
