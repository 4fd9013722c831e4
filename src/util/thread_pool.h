// A small persistent thread pool for data-parallel loops. The calling thread takes part, so
// ThreadPool(1) runs everything inline. Workers spin briefly before sleeping, because decode
// issues hundreds of short parallel loops per token and a futex wake per loop would dominate.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace lamina {

class ThreadPool {
 public:
  // n_threads counts the caller; n_threads <= 0 means "all hardware threads".
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // Runs fn(thread_index) once on each of the size() threads and waits for all.
  void RunOnAll(const std::function<void(int thread_index)>& fn);

  // Splits [0, n) into contiguous ranges of at least `grain` items, one or more per thread,
  // and runs fn(begin, end) on them; waits for all.
  void ParallelFor(int64_t n, int64_t grain,
                   const std::function<void(int64_t begin, int64_t end)>& fn);

 private:
  void WorkerLoop(int index);

  int n_threads_;
  std::vector<std::thread> workers_;
  const std::function<void(int)>* job_ = nullptr;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::condition_variable cv_;
};

}  // namespace lamina
