// The serving engine: slots over one multi-sequence Session, continuous batching and prefix
// reuse, driven by one engine thread that alone touches the model. HTTP threads Submit typed
// requests and read events from the returned Channel. Every step packs the decode tokens of
// generating slots and chunks of pending prompts into one SequenceBatch (weight matmuls shared,
// attention per sequence); because every row's result is independent of the batch, a response
// is identical to the same request run alone.
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

#include "runtime/generate.h"
#include "runtime/session.h"
#include "serve/request.h"
#include "spec/speculative.h"

namespace lamina::serve {

// Speculative decoding in every slot: each slot has its own drafter (prompt lookup, or a draft
// model in a session of its own), verify windows join the step's batch like decode tokens.
struct SpecConfig {
  enum class Mode { kOff, kLookup, kDraft };
  Mode mode = Mode::kOff;
  const Model* draft_model = nullptr;  // kDraft; must outlive the scheduler
  SessionConfig draft_session;         // kDraft: the draft sessions' config (n_seq 1)
  float draft_p_min = 0.5f;
  int lookup_ngram = 2;
  spec::SpecOptions options;
};

struct SchedulerConfig {
  int n_slots = 1;
  int n_batch = 512;           // most tokens per forward pass
  bool context_shift = false;  // when a slot fills: drop old cells and go on (else stop)
  // llama-server's --kv-unified: every slot may use the whole session.n_ctx, and the slots'
  // cells together stay within it. A request starts only when the cells it may come to hold
  // (its prompt and n_predict tokens, at most n_ctx) fit beside those set aside for the busy
  // slots (idle slots' cached cells are dropped to make room), so no request ever fails or
  // changes for lack of room once started.
  bool kv_unified = false;
  SessionConfig session;  // n_ctx: cells per slot; n_seq is set to n_slots
  SpecConfig spec;
};

struct SlotInfo {
  int id = 0;
  bool busy = false;
  uint64_t request = 0;  // the request it runs (or ran last); 0: none yet
  int n_past = 0;        // cells it holds
  int n_prompt = 0;
  int n_decoded = 0;
  int n_ctx = 0;
  // The Request::cache_scope its cells were written under (or a restore's); the server shows a
  // client only its own scope's slot details.
  std::string scope;
};

struct Stats {
  uint64_t requests = 0;  // finished (done, cancelled or failed)
  uint64_t requests_cancelled = 0;
  uint64_t prompt_tokens = 0;  // evaluated
  uint64_t predicted_tokens = 0;
  double prompt_seconds = 0.0;  // wall time of steps that evaluated prompt tokens
  double decode_seconds = 0.0;  // wall time of steps that only decoded
  uint64_t steps = 0;
  int busy_slots = 0;
  int queued = 0;
  size_t kv_bytes = 0;        // the cache's whole storage
  size_t kv_bytes_used = 0;   // cells held by all slots
  uint64_t draft_tokens = 0;  // speculative decoding: drafted and verified
  uint64_t draft_accepted = 0;
  uint64_t verify_steps = 0;
};

struct SlotFileResult {
  int n_tokens = 0;
  size_t n_bytes = 0;
  double ms = 0.0;
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
  struct Slot;
  struct Queued {
    uint64_t id;
    Request request;
    std::shared_ptr<Channel> channel;
  };
  void Loop();
  // Places queued requests into idle slots (engine thread; takes the lock).
  void Admit();
  void StartInSlot(Slot& slot, Queued q);
  // kv_unified: the cells a request may come to hold, set aside while it runs.
  int UnifiedReserve(const Request& request) const;
  // kv_unified: whether `need` cells fit beside the busy slots' reservations; idle slots' cells
  // (never `taker`'s, which the request reuses) are dropped, least recently used first, until
  // they fit too.
  bool MakeUnifiedRoom(int need, const Slot& taker);
  // One forward pass over every busy slot's next tokens; false when there was nothing to do.
  bool Step();
  void Finish(Slot& slot, StopReason reason);
  void Fail(Slot& slot, ErrorKind error, const std::string& message);
  void Release(Slot& slot, bool cancelled);
  void ShiftContext(Slot& slot, int32_t next_token);
  void PublishInfo();
  // Runs fn on the engine thread when the slot exists and is idle (else an error), timing it.
  Result<SlotFileResult> OnIdleSlot(int id, const std::function<Result<SlotFileResult>()>& fn);
  // Runs fn on the engine thread and waits for it.
  void RunOnEngine(const std::function<void()>& fn);
  // Makes the slot's cells (and its drafter's) belong to `scope`, dropping them first when they
  // belong to another one.
  void ClaimSlot(Slot& slot, const std::string& scope);
  // Marks the slot's cells as `scope`'s (resetting its drafter's when the scope changes).
  void SetScope(Slot& slot, const std::string& scope);
  // Whether the slot's cells may be read by `scope`: its own, or none held.
  bool SlotReadableBy(const Slot& slot, const std::string& scope) const;
  std::unique_ptr<spec::Drafter> MakeDrafter() const;

  const Model& model_;
  ThreadPool& pool_;
  SchedulerConfig config_;
  Session session_;
  uint64_t model_hash_ = 0;  // ModelIdentityHash(model_), the slot files' model identity
  std::vector<std::unique_ptr<Slot>> slots_;
  uint64_t clock_ = 0;  // slot use order

  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Queued> queue_;
  std::deque<std::function<void()>> tasks_;
  uint64_t next_id_ = 1;
  bool stop_ = false;
  std::vector<SlotInfo> info_;
  Stats stats_;
  std::thread thread_;
};

}  // namespace lamina::serve
