// The server's queue and engine thread over an engine::Engine (see scheduler.h).
#include "serve/scheduler.h"

#include <algorithm>
#include <future>

namespace lamina::serve {

namespace {
SessionConfig SlotSessionConfig(const SchedulerConfig& c) {
  SessionConfig s = c.session;
  s.n_seq = std::max(1, c.n_slots);
  return s;
}

engine::EngineConfig MakeEngineConfig(const SchedulerConfig& c, int n_slots) {
  engine::EngineConfig e;
  e.n_slots = n_slots;
  e.n_batch = c.n_batch;
  e.context_shift = c.context_shift;
  e.context_edge = engine::ContextEdge::kLastCellFree;
  e.kv_unified = c.kv_unified;
  e.spec = c.spec;
  return e;
}

Event ShuttingDown() {
  Event e;
  e.kind = Event::Kind::kError;
  e.error = ErrorKind::kShuttingDown;
  e.message = "the server is shutting down";
  return e;
}
}  // namespace

Scheduler::Scheduler(const Model& model, const SchedulerConfig& config, ThreadPool& pool)
    : model_(model),
      config_(config),
      session_(model, SlotSessionConfig(config), pool),
      engine_(session_, MakeEngineConfig(config, session_.n_seq()), &pool) {
  config_.n_slots = session_.n_seq();
  PublishInfo();
}

Scheduler::~Scheduler() { Stop(); }

void Scheduler::Start() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (thread_.joinable()) return;
  stop_ = false;
  thread_ = std::thread([this] { Loop(); });
}

void Scheduler::Stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::shared_ptr<Channel> Scheduler::Submit(Request request) {
  auto channel = std::make_shared<Channel>();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stop_) {
      channel->Push(ShuttingDown());
      return channel;
    }
    queue_.push_back({next_id_++, std::move(request), channel});
    stats_.queued = static_cast<int>(queue_.size());
  }
  cv_.notify_all();
  return channel;
}

void Scheduler::Loop() {
  while (true) {
    std::deque<std::function<void()>> tasks;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty() || !tasks_.empty() || engine_.busy(); });
      if (stop_) break;
      tasks.swap(tasks_);
    }
    for (auto& task : tasks) task();
    Admit();
    engine_.Step();
    PublishInfo();
  }
  // Ending: every open request gets an error so no HTTP thread waits forever.
  engine_.FailAll(ErrorKind::kShuttingDown, "the server is shutting down");
  std::deque<std::function<void()>> tasks;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (Queued& q : queue_) q.channel->Push(ShuttingDown());
    queue_.clear();
    tasks.swap(tasks_);
  }
  for (auto& task : tasks) task();
  PublishInfo();
}

void Scheduler::Admit() {
  std::deque<Queued> offered;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    offered.swap(queue_);
  }
  std::deque<Queued> waiting;
  bool blocked = false;  // a request waits for room in a unified cache: later ones wait behind it
  uint64_t cancelled = 0;
  for (Queued& q : offered) {
    if (blocked) {
      waiting.push_back(std::move(q));
      continue;
    }
    if (q.channel->cancelled()) {
      ++cancelled;
      continue;
    }
    switch (engine_.TryStart(q.id, q.request, q.channel)) {
      case engine::Engine::Admission::kStarted:
      case engine::Engine::Admission::kRejected:
        break;
      case engine::Engine::Admission::kBlocked:
        blocked = true;
        waiting.push_back(std::move(q));
        break;
      case engine::Engine::Admission::kWait:
        waiting.push_back(std::move(q));
        break;
    }
  }
  std::lock_guard<std::mutex> lock(mutex_);
  // Requests submitted meanwhile queue behind the ones still waiting.
  queue_.insert(queue_.begin(), std::make_move_iterator(waiting.begin()),
                std::make_move_iterator(waiting.end()));
  queue_cancelled_ += cancelled;
  stats_.queued = static_cast<int>(queue_.size());
}

void Scheduler::PublishInfo() {
  std::vector<SlotInfo> info = engine_.Slots();
  Stats stats = engine_.stats();
  std::lock_guard<std::mutex> lock(mutex_);
  info_ = std::move(info);
  stats.requests += queue_cancelled_;
  stats.requests_cancelled += queue_cancelled_;
  stats.queued = static_cast<int>(queue_.size());
  stats_ = stats;
}

std::vector<SlotInfo> Scheduler::Slots() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return info_;
}

std::string Scheduler::slot_scope(int i) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return i >= 0 && i < static_cast<int>(info_.size()) ? info_[i].scope : std::string();
}

Stats Scheduler::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void Scheduler::RunOnEngine(const std::function<void()>& fn) {
  std::promise<void> done;
  std::future<void> f = done.get_future();
  {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!thread_.joinable() || stop_) {
      lock.unlock();
      fn();  // no engine thread: the caller's thread is the only one
      return;
    }
    tasks_.push_back([&] {
      fn();
      done.set_value();
    });
  }
  cv_.notify_all();
  f.wait();
}

Result<SlotFileResult> Scheduler::SaveSlot(int id, const std::string& path,
                                           const std::string& scope) {
  Result<SlotFileResult> out = Error{""};
  RunOnEngine([&] { out = engine_.SaveSlot(id, path, scope); });
  return out;
}

Result<SlotFileResult> Scheduler::RestoreSlot(int id, const std::string& path,
                                              const std::string& scope) {
  Result<SlotFileResult> out = Error{""};
  RunOnEngine([&] {
    out = engine_.RestoreSlot(id, path, scope);
    PublishInfo();  // the slot's scope, for slot_scope() at once
  });
  return out;
}

Result<int> Scheduler::EraseSlot(int id, const std::string& scope) {
  Result<SlotFileResult> out = Error{""};
  RunOnEngine([&] {
    out = engine_.EraseSlot(id, scope);
    PublishInfo();
  });
  if (!out.ok()) return out.error();
  return out->n_tokens;
}

}  // namespace lamina::serve
