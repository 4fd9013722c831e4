// The server's scheduler: a queue of typed requests and one engine thread that alone touches the
// model, stepping an engine::Engine (slots, admission, continuous batching: engine/engine.h)
// over one multi-sequence Session. HTTP threads Submit requests and read events from the
// returned Channel; slot files run on the engine thread too.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "runtime/session.h"
#include "serve/request.h"

namespace lamina::serve {

using engine::SlotFileResult;
using engine::SlotInfo;
using engine::SpecConfig;
using engine::Stats;

struct SchedulerConfig {
  int n_slots = 1;
  int n_batch = 512;           // most tokens per forward pass
  bool context_shift = false;  // when a slot fills: drop old cells and go on (else stop)
  // llama-server's --kv-unified (engine::EngineConfig::kv_unified).
  bool kv_unified = false;
  SessionConfig session;  // n_ctx: cells per slot; n_seq is set to n_slots
  SpecConfig spec;
};

class Scheduler {
 public:
  // The config's session must pass MakeKvCacheConfig (checked by the caller).
  Scheduler(const Model& model, const SchedulerConfig& config, ThreadPool& pool);
  ~Scheduler();  // stops the engine thread

  void Start();
  void Stop();

  // Thread-safe. Events for the request arrive on the returned channel: kText pieces, then
  // kDone or kError.
  std::shared_ptr<Channel> Submit(Request request);

  // Slot files (run on the engine thread; block until done) in the session-file format
  // (runtime/session_file.h): the slot's tokens and encoded KV cells, written atomically.
  // Restoring replaces the slot's cells by the file's bytes and marks them as `scope`'s (a
  // Request::cache_scope); a file of another model, KV mode or shape, a truncated one or one
  // with a flipped bit is refused with the reason (the slot unchanged). Scopes: a file records
  // the scope of the cells it holds (its APPD payload; none for the default scope) and only
  // that scope may restore it; saving and erasing are refused when the slot holds cells of a
  // scope other than `scope` (checked on the engine thread, so no request can slip in between
  // the check and the file).
  Result<SlotFileResult> SaveSlot(int slot, const std::string& path, const std::string& scope = {});
  Result<SlotFileResult> RestoreSlot(int slot, const std::string& path,
                                     const std::string& scope = {});
  Result<int> EraseSlot(int slot, const std::string& scope = {});  // the number of cells dropped

  std::vector<SlotInfo> Slots() const;
  // The cache scope of slot i's cells (SlotInfo::scope; empty for a slot out of range).
  std::string slot_scope(int i) const;
  Stats stats() const;
  int n_slots() const { return config_.n_slots; }
  int n_ctx_slot() const { return session_.n_ctx(); }
  const KvCache& cache() const { return session_.cache(); }
  const Model& model() const { return model_; }

 private:
  struct Queued {
    uint64_t id;
    Request request;
    std::shared_ptr<Channel> channel;
  };
  void Loop();
  // Offers queued requests to the engine in order (engine thread).
  void Admit();
  // Copies the engine's slots and figures for other threads (engine thread).
  void PublishInfo();
  // Runs fn on the engine thread and waits for it (on the caller's thread when none runs).
  void RunOnEngine(const std::function<void()>& fn);

  const Model& model_;
  SchedulerConfig config_;
  Session session_;
  engine::Engine engine_;

  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Queued> queue_;
  std::deque<std::function<void()>> tasks_;
  uint64_t next_id_ = 1;
  uint64_t queue_cancelled_ = 0;  // requests cancelled before they started
  bool stop_ = false;
  std::vector<SlotInfo> info_;
  Stats stats_;
  std::thread thread_;
};

}  // namespace lamina::serve
