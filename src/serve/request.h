// The per-request channel between the server's HTTP threads and its engine thread, and the
// engine's typed requests and events under serve:: names (engine/request.h).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>

#include "engine/request.h"

namespace lamina::serve {

using engine::ErrorKind;
using engine::Event;
using engine::Progress;
using engine::Request;
using engine::Timings;
using engine::TokenLogprob;

// The per-request channel: the engine pushes events, the HTTP thread pops them; the HTTP side
// cancels when its client goes away.
class Channel : public engine::EventSink {
 public:
  void Push(Event event) override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      events_.push_back(std::move(event));
    }
    cv_.notify_one();
  }
  // Waits up to `timeout` for an event; false when none came.
  bool Pop(Event* out, std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!cv_.wait_for(lock, timeout, [&] { return !events_.empty(); })) return false;
    *out = std::move(events_.front());
    events_.pop_front();
    return true;
  }
  void Cancel() { cancelled_ = true; }
  bool cancelled() const override { return cancelled_; }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Event> events_;
  std::atomic<bool> cancelled_{false};
};

}  // namespace lamina::serve
