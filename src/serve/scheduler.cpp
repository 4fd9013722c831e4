// The serving engine's slots, continuous batching and slot files (see scheduler.h).
#include "serve/scheduler.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <future>

#include "runtime/session_file.h"
#include "util/mapped_file.h"
#include "util/timer.h"

namespace lamina::serve {

struct Scheduler::Slot {
  int id = 0;
  bool busy = false;
  uint64_t request = 0;
  std::shared_ptr<Channel> channel;
  Request req;
  std::unique_ptr<Generator> gen;
  std::vector<int32_t> pending;  // tokens to evaluate next, in order
  size_t pending_done = 0;       // of which already evaluated
  int n_prompt = 0;
  int n_cached = 0;
  int n_prompt_evaluated = 0;
  bool prompt_done = false;
  bool truncated = false;
  double t_start = 0.0;
  double t_prompt_done = 0.0;
  uint64_t last_used = 0;
  int reserved = 0;   // kv_unified: cells set aside for the request it runs
  std::string scope;  // the Request::cache_scope its cells were written under
  // Speculative decoding (config.spec): the slot's drafter and controller, and the drafts of
  // the verify window in flight (pending is then [last token, drafts...]).
  std::unique_ptr<spec::Drafter> drafter;
  std::unique_ptr<spec::DraftController> controller;
  std::vector<int32_t> draft;
  double draft_seconds = 0.0;  // drafting time of the window in flight
  bool asked = false;          // the drafter was asked this step
  int64_t draft_n = 0;
  int64_t draft_accepted = 0;
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

SessionConfig SlotSessionConfig(const SchedulerConfig& c) {
  SessionConfig s = c.session;
  s.n_seq = std::max(1, c.n_slots);
  return s;
}
}  // namespace

Scheduler::Scheduler(const Model& model, const SchedulerConfig& config, ThreadPool& pool)
    : model_(model),
      pool_(pool),
      config_(config),
      session_(model, SlotSessionConfig(config), pool),
      model_hash_(ModelIdentityHash(model)) {
  config_.n_slots = session_.n_seq();
  config_.n_batch = std::max(1, config_.n_batch);
  for (int i = 0; i < config_.n_slots; ++i) {
    slots_.push_back(std::make_unique<Slot>());
    Slot& slot = *slots_.back();
    slot.id = i;
    slot.drafter = MakeDrafter();
  }
  stats_.kv_bytes = session_.cache().BytesTotal();
  PublishInfo();
}

Scheduler::~Scheduler() { Stop(); }

std::unique_ptr<spec::Drafter> Scheduler::MakeDrafter() const {
  const SpecConfig& sp = config_.spec;
  if (sp.mode == SpecConfig::Mode::kLookup) {
    return std::make_unique<spec::LookupDrafter>(sp.lookup_ngram);
  }
  if (sp.mode == SpecConfig::Mode::kDraft) {
    LAMINA_CHECK(sp.draft_model != nullptr);
    SessionConfig dc = sp.draft_session;
    dc.n_seq = 1;
    return std::make_unique<spec::ModelDrafter>(*sp.draft_model, dc, pool_, sp.draft_p_min);
  }
  return nullptr;
}

bool Scheduler::SlotReadableBy(const Slot& slot, const std::string& scope) const {
  return slot.scope == scope || session_.n_past(slot.id) == 0;
}

void Scheduler::ClaimSlot(Slot& slot, const std::string& scope) {
  if (slot.scope == scope) return;
  session_.Truncate(slot.id, 0);
  SetScope(slot, scope);
}

void Scheduler::SetScope(Slot& slot, const std::string& scope) {
  if (slot.scope == scope) return;
  // A draft model's session keeps the last history it drafted for, and reuses its prefix:
  // that would make drafting time depend on another scope's tokens.
  if (dynamic_cast<spec::ModelDrafter*>(slot.drafter.get()) != nullptr) {
    slot.drafter.reset();
    slot.drafter = MakeDrafter();
  }
  slot.scope = scope;
}

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
      Event e;
      e.kind = Event::Kind::kError;
      e.error = ErrorKind::kShuttingDown;
      e.message = "the server is shutting down";
      channel->Push(std::move(e));
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
      auto busy = [&] {
        return std::any_of(slots_.begin(), slots_.end(), [](const auto& s) { return s->busy; });
      };
      cv_.wait(lock, [&] { return stop_ || !queue_.empty() || !tasks_.empty() || busy(); });
      if (stop_) break;
      tasks.swap(tasks_);
    }
    for (auto& task : tasks) task();
    Admit();
    Step();
    PublishInfo();
  }
  // Ending: every open request gets an error so no HTTP thread waits forever.
  for (auto& s : slots_) {
    if (s->busy) Fail(*s, ErrorKind::kShuttingDown, "the server is shutting down");
  }
  std::lock_guard<std::mutex> lock(mutex_);
  for (Queued& q : queue_) {
    Event e;
    e.kind = Event::Kind::kError;
    e.error = ErrorKind::kShuttingDown;
    e.message = "the server is shutting down";
    q.channel->Push(std::move(e));
  }
  queue_.clear();
  for (auto& task : tasks_) task();
  tasks_.clear();
}

void Scheduler::Admit() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (auto it = queue_.begin(); it != queue_.end();) {
    Queued& q = *it;
    if (q.channel->cancelled()) {
      ++stats_.requests;
      ++stats_.requests_cancelled;
      it = queue_.erase(it);
      continue;
    }
    const int n_prompt = static_cast<int>(q.request.prompt.size());
    if (n_prompt == 0 || n_prompt > n_ctx_slot() || (q.request.id_slot >= config_.n_slots)) {
      Event e;
      e.kind = Event::Kind::kError;
      if (n_prompt == 0) {
        e.error = ErrorKind::kBadRequest;
        e.message = "the prompt is empty (and the model adds no BOS token)";
      } else if (n_prompt > n_ctx_slot()) {
        e.error = ErrorKind::kContextExceeded;
        e.message =
            "the request exceeds the available context size, try increasing it: the "
            "prompt has " +
            std::to_string(n_prompt) + " tokens and a slot's context is " +
            std::to_string(n_ctx_slot());
        e.n_prompt_tokens = n_prompt;
        e.n_ctx = n_ctx_slot();
      } else {
        e.error = ErrorKind::kBadRequest;
        e.message = "id_slot " + std::to_string(q.request.id_slot) + " does not exist (" +
                    std::to_string(config_.n_slots) + " slots)";
      }
      q.channel->Push(std::move(e));
      ++stats_.requests;
      it = queue_.erase(it);
      continue;
    }
    // A member of a prompt group waits while another member still evaluates the prompt.
    const std::string& scope = q.request.cache_scope;
    if (q.request.prefix_group != 0 &&
        std::any_of(slots_.begin(), slots_.end(), [&](const auto& s) {
          return s->busy && !s->prompt_done && s->req.prefix_group == q.request.prefix_group &&
                 s->req.cache_scope == scope;
        })) {
      ++it;
      continue;
    }
    // The idle slot asked for, else the idle slot sharing the longest prefix, else the least
    // recently used. Another scope's cells count as none: the choice never depends on them.
    Slot* best = nullptr;
    int best_common = -1;
    for (auto& s : slots_) {
      if (s->busy) continue;
      if (q.request.id_slot >= 0 && s->id != q.request.id_slot) continue;
      const int common =
          s->scope == scope ? CommonPrefix(session_.tokens(s->id), q.request.prompt) : 0;
      if (best == nullptr || common > best_common ||
          (common == best_common && s->last_used < best->last_used)) {
        best = s.get();
        best_common = common;
      }
    }
    if (best == nullptr) {
      ++it;  // waits for its slot (or any slot) to free up; later requests may still start
      continue;
    }
    // A request waiting for room in a unified cache keeps its place: later ones wait behind it.
    if (config_.kv_unified && !MakeUnifiedRoom(UnifiedReserve(q.request), *best)) break;
    Queued taken = std::move(q);
    it = queue_.erase(it);
    stats_.queued = static_cast<int>(queue_.size());
    lock.unlock();
    StartInSlot(*best, std::move(taken));
    lock.lock();
    it = queue_.begin();  // the queue may have grown meanwhile; rescan from the front
  }
  stats_.queued = static_cast<int>(queue_.size());
}

int Scheduler::UnifiedReserve(const Request& request) const {
  const int64_t n_predict = request.params.n_predict;
  if (n_predict < 0) return n_ctx_slot();
  const int64_t most =
      static_cast<int64_t>(request.prompt.size()) + std::max<int64_t>(1, n_predict);
  return static_cast<int>(std::min<int64_t>(n_ctx_slot(), most));
}

bool Scheduler::MakeUnifiedRoom(int need, const Slot& taker) {
  const int pool = n_ctx_slot();
  int used = need;
  for (const auto& s : slots_) {
    if (s->busy) used += s->reserved;
  }
  if (used > pool) return false;
  std::vector<Slot*> idle;
  for (const auto& s : slots_) {
    if (!s->busy && s.get() != &taker && session_.n_past(s->id) > 0) {
      idle.push_back(s.get());
      used += session_.n_past(s->id);
    }
  }
  std::sort(idle.begin(), idle.end(),
            [](const Slot* a, const Slot* b) { return a->last_used < b->last_used; });
  for (Slot* s : idle) {
    if (used <= pool) break;
    used -= session_.n_past(s->id);
    session_.Truncate(s->id, 0);
  }
  return true;
}

void Scheduler::StartInSlot(Slot& slot, Queued q) {
  slot.busy = true;
  slot.request = q.id;
  slot.channel = std::move(q.channel);
  slot.req = std::move(q.request);
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
    int own = CommonPrefix(session_.tokens(slot.id), prompt);
    int donor = -1, donor_common = own;
    for (auto& s : slots_) {
      if (slot.req.id_slot >= 0) break;
      if (s->id == slot.id || s->scope != slot.scope) continue;
      const int common = CommonPrefix(session_.tokens(s->id), prompt);
      if (common > donor_common) {
        donor = s->id;
        donor_common = common;
      }
    }
    if (donor >= 0) {
      session_.CopyPrefix(donor, slot.id, std::min(donor_common, slot.n_prompt - 1));
    }
    slot.n_cached = ReusePrefix(session_, slot.id, prompt);
  } else {
    session_.Truncate(slot.id, 0);
    slot.n_cached = 0;
  }
  slot.pending.assign(prompt.begin() + slot.n_cached, prompt.end());
  slot.pending_done = 0;
  slot.n_prompt_evaluated = 0;
  if (slot.req.return_progress) {  // the start: only the reused cells processed so far
    Event e;
    e.kind = Event::Kind::kProgress;
    e.progress.total = slot.n_prompt;
    e.progress.cache = slot.n_cached;
    e.progress.processed = slot.n_cached;
    slot.channel->Push(std::move(e));
  }
  slot.gen = std::make_unique<Generator>(model_.tokenizer(), slot.req.params, prompt);
  slot.controller = std::make_unique<spec::DraftController>(config_.spec.options.adaptive);
  slot.draft.clear();
  slot.draft_n = slot.draft_accepted = 0;
  if (auto* md = dynamic_cast<spec::ModelDrafter*>(slot.drafter.get())) {
    md->set_p_min(slot.req.draft_p_min >= 0.0f ? slot.req.draft_p_min : config_.spec.draft_p_min);
  }
}

void Scheduler::Release(Slot& slot, bool cancelled) {
  slot.busy = false;
  slot.reserved = 0;
  slot.channel.reset();
  slot.gen.reset();
  slot.pending.clear();
  slot.pending_done = 0;
  slot.draft.clear();
  std::lock_guard<std::mutex> lock(mutex_);
  ++stats_.requests;
  if (cancelled) ++stats_.requests_cancelled;
}

void Scheduler::Finish(Slot& slot, StopReason reason) {
  if (reason != StopReason::kNone) {
    const std::string tail = slot.gen->Finish(reason);
    if (!tail.empty()) {
      Event e;
      e.text = tail;
      slot.channel->Push(std::move(e));
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
  e.timings.draft_n = slot.draft_n;
  e.timings.draft_n_accepted = slot.draft_accepted;
  slot.channel->Push(std::move(e));
  Release(slot, /*cancelled=*/false);
}

void Scheduler::Fail(Slot& slot, ErrorKind error, const std::string& message) {
  Event e;
  e.kind = Event::Kind::kError;
  e.error = error;
  e.message = message;
  slot.channel->Push(std::move(e));
  Release(slot, /*cancelled=*/false);
}

void Scheduler::ShiftContext(Slot& slot, int32_t next_token) {
  // Keep the first n_keep cells, drop half of the rest, and evaluate the kept tail again at
  // its new positions (through the single writer), then the new token.
  const std::vector<int32_t> held = session_.tokens(slot.id);
  const int n_past = static_cast<int>(held.size());
  int n_keep = slot.req.n_keep < 0 ? slot.n_prompt : slot.req.n_keep;
  n_keep = std::clamp(n_keep, 0, std::max(0, n_past - 2));
  const int n_discard = std::max(1, (n_past - n_keep) / 2);
  session_.Truncate(slot.id, n_keep);
  // The cells a KV window could not keep (Session::Truncate) are evaluated again first.
  slot.pending.assign(held.begin() + session_.n_past(slot.id), held.begin() + n_keep);
  slot.pending.insert(slot.pending.end(), held.begin() + n_keep + n_discard, held.end());
  slot.pending.push_back(next_token);
  slot.pending_done = 0;
  slot.truncated = true;
}

bool Scheduler::Step() {
  // Cancelled requests free their slot first.
  for (auto& s : slots_) {
    if (s->busy && s->channel->cancelled()) {
      s->gen->Finish(StopReason::kCancelled);
      Release(*s, /*cancelled=*/true);
    }
  }
  // Generating slots with a drafter propose their verify windows.
  int budget = config_.n_batch;
  for (auto& s : slots_) {
    if (!s->busy || !s->drafter || !s->prompt_done) continue;
    if (s->pending.size() - s->pending_done != 1) continue;
    const int draft_max = s->req.draft_max >= 0 ? s->req.draft_max : config_.spec.options.draft_max;
    const int draft_min = s->req.draft_min >= 0 ? s->req.draft_min : config_.spec.options.draft_min;
    // Drafts beyond the slot's room, the token budget, the recurrent ring (a hybrid model) or
    // the batch could never be kept.
    // The window must leave the slot's last cell free (the full-slot rule in the loop below),
    // so that drafting never yields a token more than plain decoding would.
    const int k_max = std::min({spec::DraftBudget(session_, s->id, draft_max, s->gen->remaining()),
                                config_.n_batch - 1, n_ctx_slot() - session_.n_past(s->id) - 2});
    if (k_max <= 0 || !s->controller->ShouldDraft()) continue;
    s->asked = true;
    const double t0 = NowSeconds();
    Status st = s->drafter->Draft(s->gen->history(), s->controller->DraftLength(k_max), &s->draft);
    s->draft_seconds = NowSeconds() - t0;
    if (!st.ok() || static_cast<int>(s->draft.size()) < std::max(1, draft_min)) {
      s->draft.clear();
      continue;
    }
    if (static_cast<int>(s->draft.size()) > k_max) s->draft.resize(k_max);
    s->pending.resize(s->pending_done + 1);
    s->pending.insert(s->pending.end(), s->draft.begin(), s->draft.end());
  }

  SequenceBatch batch;
  struct Row {
    Slot* slot;
    size_t n;   // pending tokens this batch evaluates
    int n_out;  // logits rows it asks for: 0 or 1, or n for a verify window
  };
  std::vector<Row> rows;
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
      const size_t take = std::min<size_t>(s->pending.size() - s->pending_done, budget);
      const int pos0 = session_.n_past(s->id);
      for (size_t i = 0; i < take; ++i) {
        const bool last = s->pending_done + i + 1 == s->pending.size();
        batch.Add(s->pending[s->pending_done + i], s->id, pos0 + static_cast<int>(i),
                  last || !s->draft.empty());
      }
      const bool ends = s->pending_done + take == s->pending.size();
      rows.push_back({s.get(), take, !s->draft.empty() ? static_cast<int>(take) : (ends ? 1 : 0)});
      budget -= static_cast<int>(take);
    }
  }
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
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++stats_.steps;
    stats_.prompt_tokens += n_prompt_tokens;
    if (n_prompt_tokens > 0) {
      stats_.prompt_seconds += dt;
    } else {
      stats_.decode_seconds += dt;
    }
  }
  if (!r.ok()) {
    for (const Row& row : rows) Fail(*row.slot, ErrorKind::kEngineFailure, r.error().message);
    return true;
  }
  const int n_vocab = model_.hparams().n_vocab;
  int out_row = 0;
  int n_decoded = 0;
  for (const Row& row : rows) {
    Slot& s = *row.slot;
    s.pending_done += row.n;
    if (!s.prompt_done && s.req.return_progress) {
      Event e;
      e.kind = Event::Kind::kProgress;
      e.progress.total = s.n_prompt;
      e.progress.cache = s.n_cached;
      e.progress.processed = s.n_cached + static_cast<int>(s.pending_done);
      e.progress.time_ms = (NowSeconds() - s.t_start) * 1e3;
      s.channel->Push(std::move(e));
    }
    if (row.n_out == 0) continue;
    const float* base = *r + static_cast<size_t>(out_row) * n_vocab;
    out_row += row.n_out;
    if (!s.prompt_done) {
      s.prompt_done = true;
      s.t_prompt_done = NowSeconds();
    }
    // Row i of a verify window predicts the token after window[i]: drafts are accepted while
    // the sampler agrees; the first rejection (or the row after the last draft) gives the
    // target's own token.
    const int k = static_cast<int>(s.draft.size());
    const int n_window_start = session_.n_past(s.id) - static_cast<int>(row.n);
    auto on_step = [&](int, Generator::Step& step, const float* logits) {
      if (!step.text.empty() || step.token >= 0) {
        Event e;
        e.text = std::move(step.text);
        if (step.token >= 0) {
          e.tokens.push_back(step.token);
          if (s.req.n_probs > 0) {
            e.logprobs.emplace_back();
            e.top_logprobs.emplace_back();
            if (s.req.post_sampling_probs) {
              PostSamplingProbs(s.gen->last_distribution(), step.token, s.req.n_probs,
                                &e.logprobs.back(), &e.top_logprobs.back());
            } else {
              Logprobs(logits, n_vocab, step.token, s.req.n_probs, &e.logprobs.back(),
                       &e.top_logprobs.back());
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
        e.timings.draft_n = s.draft_n;
        e.timings.draft_n_accepted = s.draft_accepted;
        s.channel->Push(std::move(e));
      }
      return !s.channel->cancelled();
    };
    const spec::WindowOutcome w = spec::AcceptWindow(*s.gen, base, n_vocab, s.draft, on_step);
    const Generator::Step& step = w.last;
    const int used = w.used, n_accepted = w.accepted, n_emitted = w.emitted;
    n_decoded += n_emitted;
    if (k > 0) {
      // Keep the cells of window[0..used]; the rest are rejected drafts.
      session_.Truncate(s.id, n_window_start + 1 + used);
      s.drafter->Accepted(k, n_accepted);
      s.draft_n += k;
      s.draft_accepted += n_accepted;
      std::lock_guard<std::mutex> lock(mutex_);
      stats_.draft_tokens += k;
      stats_.draft_accepted += n_accepted;
      ++stats_.verify_steps;
    }
    if (s.controller && s.prompt_done && row.n_out == static_cast<int>(row.n)) {
      s.controller->Record(s.asked, k, n_accepted, n_emitted,
                           dt + (s.asked ? s.draft_seconds : 0.0));
    }
    s.draft.clear();
    s.asked = false;
    if (step.done) {
      Finish(s, StopReason::kNone);
      continue;
    }
    if (s.channel->cancelled()) {
      s.gen->Finish(StopReason::kCancelled);
      Release(s, /*cancelled=*/true);
      continue;
    }
    // As llama-server: the slot is full when the token just sampled would take its last cell
    // (n_ctx - n_prompt tokens at most without a shift).
    if (session_.n_past(s.id) + 1 >= n_ctx_slot()) {
      if (config_.context_shift && n_ctx_slot() >= 4) {
        ShiftContext(s, step.token);
      } else {
        s.truncated = true;
        Finish(s, StopReason::kContextFull);
      }
      continue;
    }
    s.pending.assign(1, step.token);
    s.pending_done = 0;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.predicted_tokens += n_decoded;
  }
  return true;
}

void Scheduler::PublishInfo() {
  std::vector<SlotInfo> info;
  size_t used = 0;
  int busy = 0;
  for (auto& s : slots_) {
    SlotInfo i;
    i.id = s->id;
    i.busy = s->busy;
    i.request = s->request;
    i.n_past = session_.n_past(s->id);
    i.n_prompt = s->n_prompt;
    i.n_decoded = s->gen ? static_cast<int>(s->gen->generated().size()) : 0;
    i.n_ctx = n_ctx_slot();
    i.scope = s->scope;
    used += static_cast<size_t>(i.n_past) * session_.cache().BytesPerToken();
    busy += s->busy;
    info.push_back(i);
  }
  std::lock_guard<std::mutex> lock(mutex_);
  info_ = std::move(info);
  stats_.busy_slots = busy;
  stats_.kv_bytes_used = used;
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
    std::lock_guard<std::mutex> lock(mutex_);
    if (!thread_.joinable() || stop_) {
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

Result<SlotFileResult> Scheduler::OnIdleSlot(int id,
                                             const std::function<Result<SlotFileResult>()>& fn) {
  Result<SlotFileResult> out = Error{"slot " + std::to_string(id) + " does not exist"};
  if (id < 0 || id >= config_.n_slots) return out;
  RunOnEngine([&] {
    const double t0 = NowSeconds();
    out = slots_[id]->busy
              ? Result<SlotFileResult>(Error{"slot " + std::to_string(id) + " is busy"})
              : fn();
    if (out.ok()) out->ms = (NowSeconds() - t0) * 1e3;
  });
  return out;
}

namespace {
size_t FileBytes(const std::string& path) {
  std::error_code ec;
  const uintmax_t n = std::filesystem::file_size(path, ec);
  return ec ? 0 : static_cast<size_t>(n);
}
}  // namespace

namespace {
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

Result<SlotFileResult> Scheduler::SaveSlot(int id, const std::string& path,
                                           const std::string& scope) {
  return OnIdleSlot(id, [&]() -> Result<SlotFileResult> {
    if (!SlotReadableBy(*slots_[id], scope)) return OtherScope(id);
    Status st = SaveSessionFile(path, session_, id, model_hash_, ScopeApp(slots_[id]->scope));
    if (!st.ok()) return st.error();
    return SlotFileResult{session_.n_past(id), FileBytes(path), 0.0};
  });
}

Result<SlotFileResult> Scheduler::RestoreSlot(int id, const std::string& path,
                                              const std::string& scope) {
  Result<SlotFileResult> out = OnIdleSlot(id, [&]() -> Result<SlotFileResult> {
    // Only the scope that saved a file may restore it: checked before the slot changes.
    if (session_.recurrent().empty()) {
      Result<std::unique_ptr<MappedFile>> file = MappedFile::Open(path);
      if (file.ok()) {
        Result<SessionFileView> view =
            ParseSessionFile((*file)->data(), (*file)->size(), session_, model_hash_);
        if (view.ok()) {
          if (ScopeOfApp(view->app) != scope) return OtherScopeFile(path);
          session_.RestoreSequence(id, view->tokens, view->kv);
          SetScope(*slots_[id], scope);
          return SlotFileResult{static_cast<int>(view->tokens.size()), (*file)->size(), 0.0};
        }
      }
    }
    // Refused files get LoadSessionFile's reasons.
    Result<SessionRestore> r = LoadSessionFile(path, session_, id, model_hash_);
    if (!r.ok()) return r.error();
    if (!r->found) return Error{path + ": no such file"};
    if (ScopeOfApp(r->app) != scope) {  // the file changed since: drop what it restored
      session_.Truncate(id, 0);
      return OtherScopeFile(path);
    }
    // The file's cells replaced all the slot's: they are the restoring client's now.
    SetScope(*slots_[id], scope);
    return SlotFileResult{r->n_file, FileBytes(path), 0.0};
  });
  if (out.ok()) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (id < static_cast<int>(info_.size())) info_[id].scope = scope;
  }
  return out;
}

Result<int> Scheduler::EraseSlot(int id, const std::string& scope) {
  Result<SlotFileResult> r = OnIdleSlot(id, [&]() -> Result<SlotFileResult> {
    if (!SlotReadableBy(*slots_[id], scope)) return OtherScope(id);
    const int n = session_.n_past(id);
    session_.Truncate(id, 0);
    return SlotFileResult{n, 0, 0.0};
  });
  if (!r.ok()) return r.error();
  return r->n_tokens;
}

}  // namespace lamina::serve
