// The engine's slots, admission, batch packing, step and slot files (see engine.h).
#include "engine/engine.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "runtime/session_file.h"
#include "util/mapped_file.h"
#include "util/timer.h"

namespace lamina::engine {

struct Engine::Slot {
  int id = 0;
  int seq = 0;  // the session's sequence
  bool busy = false;
  uint64_t request = 0;
  std::shared_ptr<EventSink> sink;
  Request req;
  std::unique_ptr<Generator> gen;
  std::vector<int32_t> pending;  // tokens to evaluate next, in order
  size_t pending_done = 0;       // of which already evaluated
  int n_prompt = 0;
  int n_cached = 0;
  bool prompt_done = false;
  bool truncated = false;
  double t_start = 0.0;
  double t_prompt_done = 0.0;
  uint64_t last_used = 0;
  int reserved = 0;   // kv_unified: cells set aside for the request it runs
  std::string scope;  // the Request::cache_scope its cells were written under
  // Speculative decoding: the slot's drafter (its own, or lent by the caller) and controller,
  // and the drafts of the verify window in flight (pending is then [last token, drafts...]).
  std::unique_ptr<spec::Drafter> own_drafter;
  spec::Drafter* drafter = nullptr;
  bool lent = false;
  bool drafting = true;  // false once the drafter failed to prepare (this request drafts no more)
  std::unique_ptr<spec::DraftController> controller;
  std::vector<int32_t> draft;
  double draft_seconds = 0.0;  // drafting time of the window in flight
  bool asked = false;          // the drafter was asked this step
  bool probing = false;        // and that was a probe
  spec::SpecStats spec;        // the request's drafting figures
};

struct Engine::Row {
  Slot* slot;
  size_t n;   // pending tokens this batch evaluates
  int n_out;  // logits rows it asks for: 0 or 1, or n for a verify window
};

namespace {
// The log-probability of `id` and the top n entries of log-softmax(logits) (ties: lower id).
void Logprobs(const float* logits, int n_vocab, int32_t id, int n, TokenLogprob* own,
              std::vector<TokenLogprob>* top) {
  float max = logits[0];
  for (int i = 1; i < n_vocab; ++i) max = std::max(max, logits[i]);
  double sum = 0.0;
  for (int i = 0; i < n_vocab; ++i) sum += std::exp(static_cast<double>(logits[i] - max));
  const float log_z = max + static_cast<float>(std::log(sum));
  *own = {id, logits[id] - log_z};
  std::vector<int32_t> order(n_vocab);
  for (int i = 0; i < n_vocab; ++i) order[i] = i;
  n = std::min(n, n_vocab);
  std::partial_sort(order.begin(), order.begin() + n, order.end(), [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  top->clear();
  for (int i = 0; i < n; ++i) top->push_back({order[i], logits[order[i]] - log_z});
}

// The probability of `id` and the first n candidates of the sampler chain's distribution (most
// likely first), in TokenLogprob's value field.
void PostSamplingProbs(const std::vector<TokenProb>& dist, int32_t id, int n, TokenLogprob* own,
                       std::vector<TokenLogprob>* top) {
  *own = {id, 0.0f};
  top->clear();
  for (const TokenProb& t : dist) {
    if (t.id == id) own->logprob = t.p;
    if (static_cast<int>(top->size()) < n) top->push_back({t.id, t.p});
  }
}

int CommonPrefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  return static_cast<int>(n);
}

Event ErrorEvent(ErrorKind error, const std::string& message) {
  Event e;
  e.kind = Event::Kind::kError;
  e.error = error;
  e.message = message;
  return e;
}
}  // namespace

Engine::Engine(Session& session, const EngineConfig& config, ThreadPool* pool)
    : session_(session), pool_(pool), config_(config) {
  config_.n_batch = std::max(1, config_.n_batch);
  // The step costs the slots' controllers share: the caller's (kept across engines) or our own.
  if (!config_.spec.options.costs) config_.spec.options.costs = std::make_shared<spec::CostModel>();
  LAMINA_CHECK(config_.n_slots >= 1 && config_.first_seq >= 0 &&
               config_.first_seq + config_.n_slots <= session_.n_seq());
  for (int i = 0; i < config_.n_slots; ++i) {
    slots_.push_back(std::make_unique<Slot>());
    Slot& slot = *slots_.back();
    slot.id = i;
    slot.seq = config_.first_seq + i;
    slot.own_drafter = MakeDrafter(slot.seq);
    slot.drafter = slot.own_drafter.get();
  }
  stats_.kv_bytes = session_.cache().BytesTotal() + session_.recurrent().bytes();
}

Engine::~Engine() = default;

std::unique_ptr<spec::Drafter> Engine::MakeDrafter(int seq) const {
  const SpecConfig& sp = config_.spec;
  if (sp.mode == SpecConfig::Mode::kLookup) {
    return std::make_unique<spec::LookupDrafter>(sp.lookup_ngram);
  }
  if (sp.mode == SpecConfig::Mode::kDraft) {
    LAMINA_CHECK(sp.draft_model != nullptr && pool_ != nullptr);
    SessionConfig dc = sp.draft_session;
    dc.n_seq = 1;
    return std::make_unique<spec::ModelDrafter>(*sp.draft_model, dc, *pool_, sp.draft_p_min);
  }
  if (sp.mode == SpecConfig::Mode::kMtp) {
    LAMINA_CHECK(session_.model().mtp() != nullptr && pool_ != nullptr);
    SessionConfig dc = sp.draft_session;
    dc.n_seq = 1;
    dc.n_ctx = session_.n_ctx();
    return std::make_unique<spec::MtpDrafter>(session_, seq, dc, *pool_, sp.draft_p_min);
  }
  return nullptr;
}

void Engine::LendDrafter(int slot, spec::Drafter* drafter) {
  LAMINA_CHECK(slot >= 0 && slot < config_.n_slots && !slots_[slot]->busy);
  Slot& s = *slots_[slot];
  s.own_drafter.reset();
  s.drafter = drafter;
  s.lent = true;
}

uint64_t Engine::model_hash() {
  if (model_hash_ == 0) model_hash_ = ModelIdentityHash(session_.model());
  return model_hash_;
}

bool Engine::SlotReadableBy(const Slot& slot, const std::string& scope) const {
  return slot.scope == scope || session_.n_past(slot.seq) == 0;
}

void Engine::ClaimSlot(Slot& slot, const std::string& scope) {
  if (slot.scope == scope) return;
  session_.Truncate(slot.seq, 0);
  SetScope(slot, scope);
}

void Engine::SetScope(Slot& slot, const std::string& scope) {
  if (slot.scope == scope) return;
  // A draft model's session keeps the last history it drafted for, and reuses its prefix:
  // that would make drafting time depend on another scope's tokens.
  if (!slot.lent && (dynamic_cast<spec::ModelDrafter*>(slot.drafter) != nullptr ||
                     dynamic_cast<spec::MtpDrafter*>(slot.drafter) != nullptr)) {
    slot.own_drafter = MakeDrafter(slot.seq);
    slot.drafter = slot.own_drafter.get();
  }
  slot.scope = scope;
}

bool Engine::busy() const {
  return std::any_of(slots_.begin(), slots_.end(), [](const auto& s) { return s->busy; });
}

void Engine::FailAll(ErrorKind error, const std::string& message) {
  for (auto& s : slots_) {
    if (s->busy) Fail(*s, error, message);
  }
}

Engine::Admission Engine::Reject(Request& request, EventSink& sink) {
  const int n_prompt = static_cast<int>(request.prompt.size());
  Event e;
  if (n_prompt == 0) {
    e = ErrorEvent(ErrorKind::kBadRequest, "the prompt is empty (and the model adds no BOS token)");
  } else if (n_prompt > n_ctx_slot()) {
    e = ErrorEvent(ErrorKind::kContextExceeded,
                   "the request exceeds the available context size, try increasing it: the "
                   "prompt has " +
                       std::to_string(n_prompt) + " tokens and a slot's context is " +
                       std::to_string(n_ctx_slot()));
    e.n_prompt_tokens = n_prompt;
    e.n_ctx = n_ctx_slot();
  } else {
    e = ErrorEvent(ErrorKind::kBadRequest, "id_slot " + std::to_string(request.id_slot) +
                                               " does not exist (" +
                                               std::to_string(config_.n_slots) + " slots)");
  }
  sink.Push(std::move(e));
  ++stats_.requests;
  return Admission::kRejected;
}

Engine::Slot* Engine::PickSlot(const Request& request) {
  // The idle slot asked for, else the idle slot sharing the longest prefix, else the least
  // recently used. Another scope's cells count as none: the choice never depends on them.
  Slot* best = nullptr;
  int best_common = -1;
  for (auto& s : slots_) {
    if (s->busy) continue;
    if (request.id_slot >= 0 && s->id != request.id_slot) continue;
    const int common =
        s->scope == request.cache_scope ? CommonPrefix(session_.tokens(s->seq), request.prompt) : 0;
    if (best == nullptr || common > best_common ||
        (common == best_common && s->last_used < best->last_used)) {
      best = s.get();
      best_common = common;
    }
  }
  return best;
}

Engine::Admission Engine::TryStart(uint64_t id, Request& request, std::shared_ptr<EventSink> sink) {
  const int n_prompt = static_cast<int>(request.prompt.size());
  if (n_prompt == 0 || n_prompt > n_ctx_slot() || request.id_slot >= config_.n_slots) {
    return Reject(request, *sink);
  }
  // A member of a prompt group waits while another member still evaluates the prompt.
  if (request.prefix_group != 0 && std::any_of(slots_.begin(), slots_.end(), [&](const auto& s) {
        return s->busy && !s->prompt_done && s->req.prefix_group == request.prefix_group &&
               s->req.cache_scope == request.cache_scope;
      })) {
    return Admission::kWait;
  }
  Slot* best = PickSlot(request);
  if (best == nullptr) return Admission::kWait;  // its slot (or every slot) is busy
  if (config_.kv_unified && !MakeUnifiedRoom(UnifiedReserve(request), *best)) {
    return Admission::kBlocked;
  }
  StartInSlot(*best, id, std::move(request), std::move(sink));
  return Admission::kStarted;
}

int Engine::UnifiedReserve(const Request& request) const {
  const int64_t n_predict = request.params.n_predict;
  if (n_predict < 0) return n_ctx_slot();
  const int64_t most =
      static_cast<int64_t>(request.prompt.size()) + std::max<int64_t>(1, n_predict);
  return static_cast<int>(std::min<int64_t>(n_ctx_slot(), most));
}

bool Engine::MakeUnifiedRoom(int need, const Slot& taker) {
  const int pool = n_ctx_slot();
  int used = need;
  for (const auto& s : slots_) {
    if (s->busy) used += s->reserved;
  }
  if (used > pool) return false;
  std::vector<Slot*> idle;
  for (const auto& s : slots_) {
    if (!s->busy && s.get() != &taker && session_.n_past(s->seq) > 0) {
      idle.push_back(s.get());
      used += session_.n_past(s->seq);
    }
  }
  std::sort(idle.begin(), idle.end(),
            [](const Slot* a, const Slot* b) { return a->last_used < b->last_used; });
  for (Slot* s : idle) {
    if (used <= pool) break;
    used -= session_.n_past(s->seq);
    session_.Truncate(s->seq, 0);
  }
  return true;
}

void Engine::StartInSlot(Slot& slot, uint64_t id, Request request,
                         std::shared_ptr<EventSink> sink) {
  slot.busy = true;
  slot.request = id;
  slot.sink = std::move(sink);
  slot.req = std::move(request);
  slot.last_used = ++clock_;
  slot.truncated = false;
  slot.prompt_done = false;
  slot.t_start = NowSeconds();
  slot.reserved = config_.kv_unified ? UnifiedReserve(slot.req) : 0;
  const std::vector<int32_t>& prompt = slot.req.prompt;
  slot.n_prompt = static_cast<int>(prompt.size());
  // Cells of another scope are dropped: this request reuses only its own scope's.
  ClaimSlot(slot, slot.req.cache_scope);
  if (slot.req.cache_prompt) {
    // A longer shared prefix held by another slot of the scope is copied over (a common system
    // prompt) — unless the request pinned its slot (id_slot): then it reuses that slot's cells
    // only, as llama-server does (a slot restored from a file is not topped up from others).
    int own = CommonPrefix(session_.tokens(slot.seq), prompt);
    const Slot* donor = nullptr;
    int donor_common = own;
    for (auto& s : slots_) {
      if (slot.req.id_slot >= 0) break;
      if (s->id == slot.id || s->scope != slot.scope) continue;
      const int common = CommonPrefix(session_.tokens(s->seq), prompt);
      if (common > donor_common) {
        donor = s.get();
        donor_common = common;
      }
    }
    if (donor != nullptr) {
      session_.CopyPrefix(donor->seq, slot.seq, std::min(donor_common, slot.n_prompt - 1));
    }
    slot.n_cached = ReusePrefix(session_, slot.seq, prompt);
  } else {
    session_.Truncate(slot.seq, 0);
    slot.n_cached = 0;
  }
  slot.pending.assign(prompt.begin() + slot.n_cached, prompt.end());
  slot.pending_done = 0;
  if (slot.req.return_progress) {  // the start: only the reused cells processed so far
    Event e;
    e.kind = Event::Kind::kProgress;
    e.progress.total = slot.n_prompt;
    e.progress.cache = slot.n_cached;
    e.progress.processed = slot.n_cached;
    slot.sink->Push(std::move(e));
  }
  slot.gen = std::make_unique<Generator>(session_.model().tokenizer(), slot.req.params, prompt);
  slot.controller = std::make_unique<spec::DraftController>(config_.spec.options.costs.get(),
                                                            config_.spec.options.adaptive);
  if (slot.drafter != nullptr) {
    slot.controller->set_probes_without_catch_up(slot.drafter->probes_without_catch_up());
  }
  slot.draft.clear();
  slot.drafting = true;
  slot.spec = spec::SpecStats{};
  if (!slot.lent) {
    if (auto* md = dynamic_cast<spec::ModelDrafter*>(slot.drafter)) {
      md->set_p_min(slot.req.draft_p_min >= 0.0f ? slot.req.draft_p_min : config_.spec.draft_p_min);
    }
  }
}

void Engine::Release(Slot& slot, bool cancelled) {
  slot.busy = false;
  slot.reserved = 0;
  slot.sink.reset();
  slot.gen.reset();
  slot.pending.clear();
  slot.pending_done = 0;
  slot.draft.clear();
  ++stats_.requests;
  if (cancelled) ++stats_.requests_cancelled;
}

void Engine::Finish(Slot& slot, StopReason reason) {
  if (reason != StopReason::kNone) {
    const std::string tail = slot.gen->Finish(reason);
    if (!tail.empty()) {
      Event e;
      e.text = tail;
      slot.sink->Push(std::move(e));
    }
  }
  const double now = NowSeconds();
  Event e;
  e.kind = Event::Kind::kDone;
  e.reason = slot.gen->reason();
  e.stop_word = slot.gen->stop_word();
  e.truncated = slot.truncated;
  e.slot = slot.id;
  e.n_ctx = n_ctx_slot();
  e.timings.prompt_n = slot.n_prompt - slot.n_cached;
  e.timings.cache_n = slot.n_cached;
  e.timings.predicted_n = static_cast<int>(slot.gen->generated().size());
  const double t_prompt_done = slot.prompt_done ? slot.t_prompt_done : now;
  e.timings.prompt_ms = (t_prompt_done - slot.t_start) * 1e3;
  e.timings.predicted_ms = (now - t_prompt_done) * 1e3;
  e.timings.draft_n = slot.spec.drafted;
  e.timings.draft_n_accepted = slot.spec.accepted;
  e.spec = slot.spec;
  slot.sink->Push(std::move(e));
  Release(slot, /*cancelled=*/reason == StopReason::kCancelled);
}

void Engine::Cancel(Slot& slot) { Finish(slot, StopReason::kCancelled); }

void Engine::Fail(Slot& slot, ErrorKind error, const std::string& message) {
  slot.sink->Push(ErrorEvent(error, message));
  Release(slot, /*cancelled=*/false);
}

void Engine::ShiftContext(Slot& slot, int32_t next_token) {
  // Keep the first n_keep cells, drop half of the rest, and evaluate the kept tail again at
  // its new positions (through the single writer), then the new token.
  const std::vector<int32_t> held = session_.tokens(slot.seq);
  const int n_past = static_cast<int>(held.size());
  int n_keep = slot.req.n_keep < 0 ? slot.n_prompt : slot.req.n_keep;
  n_keep = std::clamp(n_keep, 0, std::max(0, n_past - 2));
  const int n_discard = std::max(1, (n_past - n_keep) / 2);
  session_.Truncate(slot.seq, n_keep);
  // The cells a KV window could not keep (Session::Truncate) are evaluated again first.
  slot.pending.assign(held.begin() + session_.n_past(slot.seq), held.begin() + n_keep);
  slot.pending.insert(slot.pending.end(), held.begin() + n_keep + n_discard, held.end());
  slot.pending.push_back(next_token);
  slot.pending_done = 0;
  slot.truncated = true;
}

int Engine::SlotLimit() const {
  return config_.context_edge == ContextEdge::kAllCells ? n_ctx_slot() : n_ctx_slot() - 1;
}

void Engine::ProposeWindows() {
  for (auto& s : slots_) {
    if (!s->busy || s->drafter == nullptr || !s->drafting || !s->prompt_done) continue;
    if (s->pending.size() - s->pending_done != 1) continue;
    const spec::SpecOptions& o = config_.spec.options;
    const int draft_max = s->req.draft_max >= 0 ? s->req.draft_max : o.draft_max;
    const int draft_min = s->req.draft_min >= 0 ? s->req.draft_min : o.draft_min;
    // Drafts beyond the slot's room, the token budget, the recurrent ring (a hybrid model) or
    // the batch could never be kept. The window ends at the slot's limit (context_edge), so
    // drafting never yields a token more than plain decoding would.
    const int k_max = std::min({spec::DraftBudget(session_, s->seq, draft_max, s->gen->remaining()),
                                config_.n_batch - 1, SlotLimit() - session_.n_past(s->seq) - 1});
    const int k = s->controller->Plan(k_max);
    if (k <= 0) continue;
    s->asked = true;
    const double t0 = NowSeconds();
    // A probe may skip the drafter's catch-up (Drafter::Probe).
    s->probing = s->controller->probing();
    Status st = s->probing ? s->drafter->Probe(s->gen->history(), &s->draft)
                           : s->drafter->Draft(s->gen->history(), k, &s->draft);
    s->draft_seconds = NowSeconds() - t0;
    if (!st.ok() || static_cast<int>(s->draft.size()) < std::max(1, draft_min)) {
      s->draft.clear();
      continue;
    }
    if (static_cast<int>(s->draft.size()) > k_max) s->draft.resize(k_max);
    s->pending.resize(s->pending_done + 1);
    s->pending.insert(s->pending.end(), s->draft.begin(), s->draft.end());
  }
}

void Engine::PackBatch(SequenceBatch* batch, std::vector<Row>* rows) {
  int budget = config_.n_batch;
  // Decode tokens and verify windows first, then prompt chunks in slot order.
  for (int pass = 0; pass < 2 && budget > 0; ++pass) {
    for (auto& s : slots_) {
      if (!s->busy || budget <= 0) continue;
      const bool window = !s->draft.empty();
      const size_t left = s->pending.size() - s->pending_done;
      const bool decode = left == 1 || window;
      if (left == 0 || decode != (pass == 0)) continue;
      if (window && left > static_cast<size_t>(budget)) {  // fewer drafts fit this batch
        s->draft.resize(budget - 1);
        s->pending.resize(s->pending_done + budget);
      }
      size_t take = std::min<size_t>(s->pending.size() - s->pending_done, budget);
      if (!decode && config_.prompt_chunk > 0) {
        take = std::min<size_t>(take, config_.prompt_chunk);
      }
      const int pos0 = session_.n_past(s->seq);
      for (size_t i = 0; i < take; ++i) {
        const bool last = s->pending_done + i + 1 == s->pending.size();
        batch->Add(s->pending[s->pending_done + i], s->seq, pos0 + static_cast<int>(i),
                   last || !s->draft.empty());
      }
      const bool ends = s->pending_done + take == s->pending.size();
      rows->push_back({s.get(), take, !s->draft.empty() ? static_cast<int>(take) : (ends ? 1 : 0)});
      budget -= static_cast<int>(take);
    }
  }
}

bool Engine::Step() {
  // Cancelled requests free their slot first.
  for (auto& s : slots_) {
    if (s->busy && s->sink->cancelled()) Cancel(*s);
  }
  ProposeWindows();
  SequenceBatch batch;
  std::vector<Row> rows;
  PackBatch(&batch, &rows);
  if (batch.size() == 0) return false;
  const double t0 = NowSeconds();
  Result<const float*> r = session_.Decode(batch);
  const double dt = NowSeconds() - t0;
  int n_prompt_tokens = 0;
  for (const Row& row : rows) {
    if (!row.slot->prompt_done || (row.n > 1 && row.slot->draft.empty())) {
      n_prompt_tokens += static_cast<int>(row.n);
    }
  }
  ++stats_.steps;
  stats_.prompt_tokens += n_prompt_tokens;
  (n_prompt_tokens > 0 ? stats_.prompt_seconds : stats_.decode_seconds) += dt;
  if (!r.ok()) {
    for (const Row& row : rows) Fail(*row.slot, ErrorKind::kEngineFailure, r.error().message);
    return true;
  }
  const int n_vocab = session_.model().hparams().n_vocab;
  int out_row = 0;
  int n_decoded = 0;
  // A step's time is one sequence's cost only when it ran alone (the cost model's samples).
  const double own_seconds = rows.size() == 1 ? dt : 0.0;
  for (const Row& row : rows) {
    AfterRow(row, *r + static_cast<size_t>(out_row) * n_vocab, own_seconds, &n_decoded);
    out_row += row.n_out;
  }
  stats_.predicted_tokens += n_decoded;
  return true;
}

void Engine::PushToken(Slot& s, Generator::Step& step, const float* logits) {
  if (step.text.empty() && step.token < 0) return;
  Event e;
  e.text = std::move(step.text);
  if (step.token >= 0) {
    e.tokens.push_back(step.token);
    if (s.req.n_probs > 0) {
      e.logprobs.emplace_back();
      e.top_logprobs.emplace_back();
      if (s.req.post_sampling_probs) {
        PostSamplingProbs(s.gen->last_distribution(), step.token, s.req.n_probs, &e.logprobs.back(),
                          &e.top_logprobs.back());
      } else {
        Logprobs(logits, session_.model().hparams().n_vocab, step.token, s.req.n_probs,
                 &e.logprobs.back(), &e.top_logprobs.back());
      }
    }
  }
  // The timings so far (llama-server's timings_per_token).
  const double now = NowSeconds();
  e.timings.prompt_n = s.n_prompt - s.n_cached;
  e.timings.cache_n = s.n_cached;
  e.timings.predicted_n = static_cast<int>(s.gen->generated().size());
  e.timings.prompt_ms = (s.t_prompt_done - s.t_start) * 1e3;
  e.timings.predicted_ms = (now - s.t_prompt_done) * 1e3;
  e.timings.draft_n = s.spec.drafted;
  e.timings.draft_n_accepted = s.spec.accepted;
  s.sink->Push(std::move(e));
}

void Engine::AfterRow(const Row& row, const float* logits, double step_seconds, int* n_decoded) {
  Slot& s = *row.slot;
  s.pending_done += row.n;
  if (!s.prompt_done && s.req.return_progress) {
    Event e;
    e.kind = Event::Kind::kProgress;
    e.progress.total = s.n_prompt;
    e.progress.cache = s.n_cached;
    e.progress.processed = s.n_cached + static_cast<int>(s.pending_done);
    e.progress.time_ms = (NowSeconds() - s.t_start) * 1e3;
    s.sink->Push(std::move(e));
  }
  if (row.n_out == 0) return;
  // A decode step: one token or a verify window after the prompt (not the prompt's last chunk,
  // nor the re-evaluation after a context shift).
  const bool decode_step = s.prompt_done && row.n_out == static_cast<int>(row.n);
  if (!s.prompt_done) {
    s.prompt_done = true;
    // A draft model evaluates the prompt too (counted as prompt time), so that its first draft
    // costs decode steps; a drafter that cannot drafts no more for this request.
    const int draft_max = s.req.draft_max >= 0 ? s.req.draft_max : config_.spec.options.draft_max;
    if (s.drafter != nullptr && draft_max > 0) s.drafting = s.drafter->Prepare(s.req.prompt).ok();
    s.t_prompt_done = NowSeconds();
  }
  // Row i of a verify window predicts the token after window[i]: drafts are accepted while the
  // sampler agrees; the first rejection (or the row after the last draft) gives the target's
  // own token.
  const int k = static_cast<int>(s.draft.size());
  const int n_window_start = session_.n_past(s.seq) - static_cast<int>(row.n);
  const spec::WindowOutcome w =
      spec::AcceptWindow(*s.gen, logits, session_.model().hparams().n_vocab, s.draft,
                         [&](int, Generator::Step& step, const float* row_logits) {
                           PushToken(s, step, row_logits);
                           return !s.sink->cancelled();
                         });
  *n_decoded += w.emitted;
  if (k > 0) {
    // Keep the cells of window[0..used]: the tokens whose logits were used. The rest are
    // rejected drafts (or an accepted one plain decoding would not have evaluated yet).
    session_.Truncate(s.seq, n_window_start + 1 + w.used);
    s.drafter->Accepted(k, w.accepted);
    stats_.draft_tokens += k;
    stats_.draft_accepted += w.accepted;
    ++stats_.verify_steps;
  }
  if (decode_step) {
    s.spec.drafted += k;
    s.spec.accepted += w.accepted;
    s.spec.emitted += w.emitted;
    (k > 0 ? s.spec.verify_steps : s.spec.plain_steps) += 1;
    (k > 0 ? s.spec.window_seconds : s.spec.plain_seconds) += step_seconds;
    if (s.asked) s.spec.draft_seconds += s.draft_seconds;
    spec::StepRecord rec;
    rec.asked = s.asked;
    rec.drafted = k;
    rec.accepted = w.accepted;
    rec.emitted = w.emitted;
    rec.window_seconds = step_seconds;
    if (s.asked) {
      const spec::Drafter::CatchUpWork cu = s.drafter->last_catch_up();
      rec.draft_seconds = s.draft_seconds;
      rec.catch_up_cells = cu.cells;
      rec.catch_up_seconds = std::min(cu.seconds, s.draft_seconds);
      rec.catch_up_skipped = cu.skipped;
      ++s.spec.asks;
      s.spec.probes += s.probing;
      s.spec.catch_up_cells += cu.cells;
      s.spec.catch_up_seconds += rec.catch_up_seconds;
    }
    s.controller->Record(rec);
  }
  s.draft.clear();
  s.asked = false;
  s.probing = false;
  if (w.last.done) {
    Finish(s, StopReason::kNone);
    return;
  }
  if (s.sink->cancelled()) {
    Cancel(s);
    return;
  }
  if (session_.n_past(s.seq) >= SlotLimit()) {
    if (config_.context_shift && n_ctx_slot() >= 4) {
      ShiftContext(s, w.last.token);
    } else {
      s.truncated = true;
      Finish(s, StopReason::kContextFull);
    }
    return;
  }
  s.pending.assign(1, w.last.token);
  s.pending_done = 0;
}

std::vector<SlotInfo> Engine::Slots() const {
  std::vector<SlotInfo> info;
  for (auto& s : slots_) {
    SlotInfo i;
    i.id = s->id;
    i.busy = s->busy;
    i.request = s->request;
    i.n_past = session_.n_past(s->seq);
    i.n_prompt = s->n_prompt;
    i.n_decoded = s->gen ? static_cast<int>(s->gen->generated().size()) : 0;
    i.n_ctx = n_ctx_slot();
    i.scope = s->scope;
    info.push_back(i);
  }
  return info;
}

Stats Engine::stats() const {
  Stats out = stats_;
  out.busy_slots = 0;
  out.kv_bytes_used = 0;
  // A sequence holding cells also holds its share of the recurrent states (hybrid models: every
  // sequence's ring is allocated with the session) and the hidden states kept for an MTP head.
  const RecurrentState& recurrent = session_.recurrent();
  const size_t ring_per_seq = static_cast<size_t>(recurrent.bytes() / session_.n_seq());
  const size_t hidden_per_token = static_cast<size_t>(session_.model().hparams().n_embd) * 4;
  for (auto& s : slots_) {
    out.busy_slots += s->busy;
    const int n_past = session_.n_past(s->seq);
    out.kv_bytes_used += static_cast<size_t>(n_past) * session_.cache().BytesPerToken();
    if (n_past > 0) out.kv_bytes_used += ring_per_seq;
    out.kv_bytes_used += static_cast<size_t>(session_.n_hidden(s->seq)) * hidden_per_token;
  }
  // A lent drafter may serve several slots: each counted once.
  std::vector<const spec::Drafter*> seen;
  for (auto& s : slots_) {
    if (s->drafter == nullptr || std::find(seen.begin(), seen.end(), s->drafter) != seen.end()) {
      continue;
    }
    seen.push_back(s->drafter);
    const spec::Drafter::CacheBytes b = s->drafter->cache_bytes();
    out.draft_kv_bytes += b.total;
    out.draft_kv_bytes_used += b.used;
  }
  return out;
}

Result<SlotFileResult> Engine::OnIdleSlot(int id,
                                          const std::function<Result<SlotFileResult>()>& fn) {
  if (id < 0 || id >= config_.n_slots) {
    return Error{"slot " + std::to_string(id) + " does not exist"};
  }
  if (slots_[id]->busy) return Error{"slot " + std::to_string(id) + " is busy"};
  const double t0 = NowSeconds();
  Result<SlotFileResult> out = fn();
  if (out.ok()) out->ms = (NowSeconds() - t0) * 1e3;
  return out;
}

namespace {
size_t FileBytes(const std::string& path) {
  std::error_code ec;
  const uintmax_t n = std::filesystem::file_size(path, ec);
  return ec ? 0 : static_cast<size_t>(n);
}

Error OtherScope(int id) {
  return Error{"slot " + std::to_string(id) + " holds another client's cache"};
}

// A slot file records the scope of its cells in its APPD payload (nothing for the default
// scope, so such files are the same bytes as before scopes existed); any other payload (a
// chat's turns) counts as the default scope.
constexpr char kScopeTag[] = "lamina.cache_scope=";

std::string ScopeApp(const std::string& scope) {
  return scope.empty() ? std::string() : kScopeTag + scope;
}

std::string ScopeOfApp(const std::string& app) {
  const size_t n = sizeof(kScopeTag) - 1;
  return app.compare(0, n, kScopeTag) == 0 ? app.substr(n) : std::string();
}

Error OtherScopeFile(const std::string& path) {
  return Error{path + ": the slot file holds another client's cache"};
}
}  // namespace

Result<SlotFileResult> Engine::SaveSlot(int id, const std::string& path, const std::string& scope) {
  return OnIdleSlot(id, [&]() -> Result<SlotFileResult> {
    const Slot& slot = *slots_[id];
    if (!SlotReadableBy(slot, scope)) return OtherScope(id);
    Status st = SaveSessionFile(path, session_, slot.seq, model_hash(), ScopeApp(slot.scope));
    if (!st.ok()) return st.error();
    return SlotFileResult{session_.n_past(slot.seq), FileBytes(path), 0.0};
  });
}

Result<SlotFileResult> Engine::RestoreSlot(int id, const std::string& path,
                                           const std::string& scope) {
  return OnIdleSlot(id, [&]() -> Result<SlotFileResult> {
    Slot& slot = *slots_[id];
    // Only the scope that saved a file may restore it: checked before the slot changes.
    if (session_.recurrent().empty()) {
      Result<std::unique_ptr<MappedFile>> file = MappedFile::Open(path);
      if (file.ok()) {
        Result<SessionFileView> view =
            ParseSessionFile((*file)->data(), (*file)->size(), session_, model_hash());
        if (view.ok()) {
          if (ScopeOfApp(view->app) != scope) return OtherScopeFile(path);
          session_.RestoreSequence(slot.seq, view->tokens, view->kv);
          SetScope(slot, scope);
          return SlotFileResult{static_cast<int>(view->tokens.size()), (*file)->size(), 0.0};
        }
      }
    }
    // Refused files get LoadSessionFile's reasons.
    Result<SessionRestore> r = LoadSessionFile(path, session_, slot.seq, model_hash());
    if (!r.ok()) return r.error();
    if (!r->found) return Error{path + ": no such file"};
    if (ScopeOfApp(r->app) != scope) {  // the file changed since: drop what it restored
      session_.Truncate(slot.seq, 0);
      return OtherScopeFile(path);
    }
    // The file's cells replaced all the slot's: they are the restoring client's now.
    SetScope(slot, scope);
    return SlotFileResult{r->n_file, FileBytes(path), 0.0};
  });
}

Result<SlotFileResult> Engine::EraseSlot(int id, const std::string& scope) {
  return OnIdleSlot(id, [&]() -> Result<SlotFileResult> {
    const Slot& slot = *slots_[id];
    if (!SlotReadableBy(slot, scope)) return OtherScope(id);
    const int n = session_.n_past(slot.seq);
    session_.Truncate(slot.seq, 0);
    return SlotFileResult{n, 0, 0.0};
  });
}

}  // namespace lamina::engine
