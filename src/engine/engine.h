// The engine: slots over the sequences of one Session, admission, batch packing and the step —
// synchronous, with no thread and no queue of its own. Every caller is a client: the server's
// scheduler (serve/) owns a queue and the one thread that steps it; Generate and
// GenerateSpeculative (engine/generate.h), and through them the CLI and the probe, run one
// request in a one-slot engine over the caller's sequence. So every generation, speculative or
// not, hybrid model or not, takes the same admission, prompt evaluation, verify window
// (spec::AcceptWindow), rollback and stop rules. Every step packs the decode tokens and verify
// windows of generating slots and chunks of pending prompts into one SequenceBatch (weight
// matmuls shared, attention per sequence); because every row's result is independent of the
// batch, a request's answer is identical to the same request run alone.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/request.h"
#include "runtime/generate.h"
#include "runtime/session.h"
#include "spec/drafter.h"
#include "spec/speculative.h"

namespace lamina::engine {

// Speculative decoding in every slot: each slot has its own drafter (prompt lookup, or a draft
// model in a session of its own, or the target's MTP block in a session of its own over the
// slot's kept hidden states, or one the caller lends: Engine::LendDrafter), verify windows
// join the step's batch like decode tokens.
struct SpecConfig {
  enum class Mode { kOff, kLookup, kDraft, kMtp };
  Mode mode = Mode::kOff;
  const Model* draft_model = nullptr;  // kDraft; must outlive the engine
  SessionConfig draft_session;         // kDraft, kMtp: the draft sessions' config (n_seq 1)
  float draft_p_min = 0.5f;
  int lookup_ngram = 2;
  spec::SpecOptions options;
};

// When a sequence is full. kLastCellFree is llama-server's rule: the slot is full when the token
// just sampled would take its last cell (n_ctx - n_prompt tokens at most without a shift).
// kAllCells, the command line's: every cell is filled, and the token sampled from the last
// cell's logits is still emitted (n_ctx - n_prompt + 1 tokens).
enum class ContextEdge { kLastCellFree, kAllCells };

struct EngineConfig {
  int n_slots = 1;
  int first_seq = 0;           // slot i uses the session's sequence first_seq + i
  int n_batch = 512;           // most tokens per forward pass
  int prompt_chunk = 0;        // most prompt tokens of one slot per forward pass; 0: n_batch
  bool context_shift = false;  // when a slot fills: drop old cells and go on (else stop)
  ContextEdge context_edge = ContextEdge::kLastCellFree;
  // llama-server's --kv-unified: every slot may use the whole session.n_ctx, and the slots'
  // cells together stay within it. A request starts only when the cells it may come to hold
  // (its prompt and n_predict tokens, at most n_ctx) fit beside those set aside for the busy
  // slots (idle slots' cached cells are dropped to make room), so no request ever fails or
  // changes for lack of room once started.
  bool kv_unified = false;
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
  int queued = 0;  // requests waiting in the caller's queue (the caller counts them)
  // The cache's whole storage, with the recurrent states of a hybrid model (every sequence's ring).
  size_t kv_bytes = 0;
  // What the slots hold: their cells, a hybrid model's ring of recurrent states per sequence that
  // holds cells, and the hidden states kept for an MTP head (--spec mtp).
  size_t kv_bytes_used = 0;
  // The slots' drafters' own caches (--spec draft: the draft model's sessions; --spec mtp: the
  // MTP block's), storage and the cells they hold; 0 without such drafters.
  size_t draft_kv_bytes = 0;
  size_t draft_kv_bytes_used = 0;
  uint64_t draft_tokens = 0;  // speculative decoding: drafted and verified
  uint64_t draft_accepted = 0;
  uint64_t verify_steps = 0;
};

struct SlotFileResult {
  int n_tokens = 0;
  size_t n_bytes = 0;
  double ms = 0.0;
};

class Engine {
 public:
  // The session (its sequences first_seq .. first_seq + n_slots - 1) and pool must outlive the
  // engine; pool may be null unless config.spec.mode is kDraft (it runs the draft sessions).
  Engine(Session& session, const EngineConfig& config, ThreadPool* pool);
  ~Engine();

  enum class Admission {
    kStarted,   // the request runs in a slot; its events go to the sink
    kRejected,  // it cannot run (empty prompt, too long, no such slot): a kError went to the sink
    kWait,      // no slot for it yet; later requests may still start
    kBlocked,   // kv_unified: no room yet; it keeps its place, later requests wait behind it
  };
  // Starts `request` (moved from only when started) in an idle slot: the one it names, else the
  // one sharing the longest prefix of its scope, else the least recently used.
  Admission TryStart(uint64_t id, Request& request, std::shared_ptr<EventSink> sink);

  // One forward pass over every busy slot's next tokens (cancelled requests end first); false
  // when there was nothing to evaluate.
  bool Step();
  bool busy() const;
  // Ends every running request with an error (the engine's owner is going away).
  void FailAll(ErrorKind error, const std::string& message);

  // Drafting for a slot with a drafter the caller owns (it must outlive the engine's use of it),
  // in place of the one config.spec would make; the config's spec.options apply.
  void LendDrafter(int slot, spec::Drafter* drafter);

  // Slot files in the session-file format (runtime/session_file.h): the slot's tokens and
  // encoded KV cells, written atomically. Restoring replaces the slot's cells by the file's bytes
  // and marks them as `scope`'s (a Request::cache_scope); a file of another model, KV mode or
  // shape, a truncated one or one with a flipped bit is refused with the reason (the slot
  // unchanged). Scopes: a file records the scope of the cells it holds (its APPD payload; none
  // for the default scope) and only that scope may restore it; saving and erasing are refused
  // when the slot holds cells of a scope other than `scope`. A slot out of range or busy is
  // refused.
  Result<SlotFileResult> SaveSlot(int slot, const std::string& path, const std::string& scope);
  Result<SlotFileResult> RestoreSlot(int slot, const std::string& path, const std::string& scope);
  Result<SlotFileResult> EraseSlot(int slot, const std::string& scope);  // n_tokens: cells dropped

  std::vector<SlotInfo> Slots() const;
  Stats stats() const;  // kv_bytes_used and busy_slots as of now; queued is the caller's
  int n_slots() const { return config_.n_slots; }
  int n_ctx_slot() const { return session_.n_ctx(); }
  const Session& session() const { return session_; }

 private:
  struct Slot;
  Admission Reject(Request& request, EventSink& sink);
  Slot* PickSlot(const Request& request);
  void StartInSlot(Slot& slot, uint64_t id, Request request, std::shared_ptr<EventSink> sink);
  // kv_unified: the cells a request may come to hold, set aside while it runs.
  int UnifiedReserve(const Request& request) const;
  // kv_unified: whether `need` cells fit beside the busy slots' reservations; idle slots' cells
  // (never `taker`'s, which the request reuses) are dropped, least recently used first, until
  // they fit too.
  bool MakeUnifiedRoom(int need, const Slot& taker);
  // The step's parts: drafting, packing, and what each slot does with its logits rows.
  void ProposeWindows();
  struct Row;
  void PackBatch(SequenceBatch* batch, std::vector<Row>* rows);
  void AfterRow(const Row& row, const float* logits, double step_seconds, int* n_decoded);
  void PushToken(Slot& slot, Generator::Step& step, const float* logits);
  // The most cells a slot may hold before it counts as full (context_edge).
  int SlotLimit() const;
  void Finish(Slot& slot, StopReason reason);
  void Cancel(Slot& slot);
  void Fail(Slot& slot, ErrorKind error, const std::string& message);
  void Release(Slot& slot, bool cancelled);
  void ShiftContext(Slot& slot, int32_t next_token);
  Result<SlotFileResult> OnIdleSlot(int id, const std::function<Result<SlotFileResult>()>& fn);
  // Makes the slot's cells (and its drafter's) belong to `scope`, dropping them first when they
  // belong to another one.
  void ClaimSlot(Slot& slot, const std::string& scope);
  // Marks the slot's cells as `scope`'s (resetting its drafter's when the scope changes).
  void SetScope(Slot& slot, const std::string& scope);
  // Whether the slot's cells may be read by `scope`: its own, or none held.
  bool SlotReadableBy(const Slot& slot, const std::string& scope) const;
  std::unique_ptr<spec::Drafter> MakeDrafter(int seq) const;
  uint64_t model_hash();  // ModelIdentityHash, the slot files' model identity (computed once)

  Session& session_;
  ThreadPool* pool_;
  EngineConfig config_;
  uint64_t model_hash_ = 0;
  std::vector<std::unique_ptr<Slot>> slots_;
  uint64_t clock_ = 0;  // slot use order
  Stats stats_;
};

}  // namespace lamina::engine
