// Tenant isolation of the server's prefix cache (serve::Request::cache_scope): a request reuses
// only cells written under its own scope, so its cache_n, its slot and its output never depend
// on what another scope's prompts hold (the digit-by-digit prompt recovery through cache hits).
// Also: the scheduler caps speculative drafts by a hybrid model's ring of recurrent states.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "engine/generate.h"
#include "model/model.h"
#include "runtime/generate.h"
#include "serve/scheduler.h"
#include "util/thread_pool.h"

namespace lamina {
namespace {

namespace fs = std::filesystem;
const std::string kShipped = std::string(LAMINA_SOURCE_DIR) + "/models/lamina-counter.gguf";
const std::string kQwen3Next =
    std::string(LAMINA_SHARED_DIR) + "/models/synth-qwen3next-d256.F32.gguf";

struct Outcome {
  std::vector<int32_t> tokens;
  int slot = -1;
  int cache_n = -1;
  int64_t draft_n = 0;
  int64_t draft_accepted = 0;
  std::string error;
};

// Waits for the request's kDone (or kError) and gathers its tokens.
Outcome Collect(serve::Channel& channel) {
  Outcome o;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(5);
  while (std::chrono::steady_clock::now() < deadline) {
    serve::Event e;
    if (!channel.Pop(&e, std::chrono::milliseconds(100))) continue;
    if (e.kind == serve::Event::Kind::kText) {
      o.tokens.insert(o.tokens.end(), e.tokens.begin(), e.tokens.end());
    } else if (e.kind == serve::Event::Kind::kDone) {
      o.slot = e.slot;
      o.cache_n = e.timings.cache_n;
      o.draft_n = e.timings.draft_n;
      o.draft_accepted = e.timings.draft_n_accepted;
      return o;
    } else if (e.kind == serve::Event::Kind::kError) {
      o.error = e.message.empty() ? "error" : e.message;
      return o;
    }
  }
  o.error = "timed out";
  return o;
}

serve::Request MakeRequest(const std::vector<int32_t>& prompt, const std::string& scope,
                           int n_predict = 6, int id_slot = -1) {
  serve::Request r;
  r.prompt = prompt;
  r.params.sampler.temperature = 0.0f;
  r.params.n_predict = n_predict;
  r.params.ignore_eos = true;
  r.cache_scope = scope;
  r.id_slot = id_slot;
  return r;
}

class ServeScope : public testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(kShipped)) GTEST_SKIP() << kShipped << " is absent";
    Result<std::unique_ptr<Model>> m = LoadModel(kShipped);
    ASSERT_TRUE(m.ok()) << m.error().message;
    model_ = std::move(*m);
  }
  std::unique_ptr<serve::Scheduler> Make(int n_slots) {
    serve::SchedulerConfig c;
    c.n_slots = n_slots;
    c.n_batch = 64;
    c.session.n_ctx = 256;
    auto s = std::make_unique<serve::Scheduler>(*model_, c, pool_);
    s->Start();
    return s;
  }
  Outcome Run(serve::Scheduler& s, serve::Request r) {
    std::shared_ptr<serve::Channel> ch = s.Submit(std::move(r));
    return Collect(*ch);
  }
  std::vector<int32_t> Encode(const std::string& text) const {
    return model_->tokenizer().Encode(text, true, true);
  }
  std::vector<int32_t> Chat(const std::string& user) const {
    return Encode("<|im_start|>user\n" + user + "<|im_end|>\n<|im_start|>assistant\n");
  }
  // The answer to the request alone, in a fresh scheduler.
  Outcome Solo(const serve::Request& r) {
    auto s = Make(1);
    return Run(*s, r);
  }
  std::unique_ptr<Model> model_;
  ThreadPool pool_{2};
};

// (a) B's run of A's prompt reuses nothing and answers as alone; A's own prompt still hits.
TEST_F(ServeScope, AnotherScopesPromptIsNotReused) {
  const std::vector<int32_t> p = Chat("Count from 17 to 29, one number per line.");
  const Outcome solo = Solo(MakeRequest(p, "B"));
  ASSERT_TRUE(solo.error.empty()) << solo.error;
  ASSERT_EQ(solo.cache_n, 0);
  for (int n_slots : {1, 2, 3}) {
    SCOPED_TRACE("n_slots " + std::to_string(n_slots));
    auto s = Make(n_slots);
    const Outcome a = Run(*s, MakeRequest(p, "A"));
    ASSERT_TRUE(a.error.empty()) << a.error;
    EXPECT_EQ(a.cache_n, 0);
    EXPECT_EQ(a.tokens, solo.tokens);
    const Outcome b = Run(*s, MakeRequest(p, "B"));
    ASSERT_TRUE(b.error.empty()) << b.error;
    EXPECT_EQ(b.cache_n, 0);
    EXPECT_EQ(b.tokens, solo.tokens);
    const Outcome a2 = Run(*s, MakeRequest(p, "A"));
    ASSERT_TRUE(a2.error.empty()) << a2.error;
    EXPECT_EQ(a2.tokens, solo.tokens);
    if (n_slots > 1) {
      EXPECT_EQ(a2.cache_n, static_cast<int>(p.size()) - 1);
      EXPECT_EQ(a2.slot, a.slot);
    } else {
      EXPECT_EQ(a2.cache_n, 0);  // B's request took the only slot over
    }
    // The default scope is a scope like any other.
    const Outcome d = Run(*s, MakeRequest(p, ""));
    EXPECT_EQ(d.cache_n, 0);
    EXPECT_EQ(d.tokens, solo.tokens);
  }
}

// (b) The digit-by-digit attack: probes sharing k tokens of A's secret prompt, for every k, get
// cache_n 0; and everything a probing scope observes (cache_n, slot, tokens) is the same
// whatever A's secret is.
TEST_F(ServeScope, SharedPrefixOfAnyLengthIsNotReused) {
  const std::vector<int32_t> secret1 = Chat("The secret code is 48213. What is the secret code?");
  const std::vector<int32_t> secret2 = Chat("The secret code is 90576. What is the secret code?");
  ASSERT_EQ(secret1.size(), secret2.size());
  const std::vector<int32_t> tail = Encode("9");
  auto probe = [&](size_t k) {
    std::vector<int32_t> p(secret1.begin(), secret1.begin() + k);
    p.insert(p.end(), tail.begin() + 1, tail.end());  // without its BOS
    return p;
  };
  auto s = Make(3);
  ASSERT_TRUE(Run(*s, MakeRequest(secret1, "A", 2)).error.empty());
  for (size_t k = 1; k <= secret1.size(); ++k) {
    const Outcome o = Run(*s, MakeRequest(probe(k), "B" + std::to_string(k), 2));
    ASSERT_TRUE(o.error.empty()) << o.error;
    EXPECT_EQ(o.cache_n, 0) << "k " << k;
  }
  // One probing scope, with A running its secret in between: the trace is A's content-free.
  std::vector<std::vector<Outcome>> traces;
  for (const std::vector<int32_t>* secret : {&secret1, &secret2}) {
    auto t = Make(3);
    std::vector<Outcome> trace;
    for (size_t k = 1; k <= secret1.size(); k += 3) {
      ASSERT_TRUE(Run(*t, MakeRequest(*secret, "A", 1)).error.empty());
      trace.push_back(Run(*t, MakeRequest(probe(k), "B", 2)));
    }
    traces.push_back(trace);
  }
  ASSERT_EQ(traces[0].size(), traces[1].size());
  for (size_t i = 0; i < traces[0].size(); ++i) {
    EXPECT_EQ(traces[0][i].cache_n, traces[1][i].cache_n) << i;
    EXPECT_EQ(traces[0][i].slot, traces[1][i].slot) << i;
    EXPECT_EQ(traces[0][i].tokens, traces[1][i].tokens) << i;
  }
}

// (c) An explicit id_slot onto another scope's slot runs there and reuses nothing.
TEST_F(ServeScope, ExplicitSlotOfAnotherScopeReusesNothing) {
  const std::vector<int32_t> p = Chat("Repeat this list exactly, one item per line:\napple\nriver");
  const Outcome solo = Solo(MakeRequest(p, "B"));
  auto s = Make(2);
  const Outcome a = Run(*s, MakeRequest(p, "A"));
  ASSERT_TRUE(a.error.empty()) << a.error;
  EXPECT_EQ(s->slot_scope(a.slot), "A");
  const Outcome b = Run(*s, MakeRequest(p, "B", 6, a.slot));
  ASSERT_TRUE(b.error.empty()) << b.error;
  EXPECT_EQ(b.slot, a.slot);
  EXPECT_EQ(b.cache_n, 0);
  EXPECT_EQ(b.tokens, solo.tokens);
  EXPECT_EQ(s->slot_scope(a.slot), "B");
  const std::vector<serve::SlotInfo> info = s->Slots();
  ASSERT_EQ(info.size(), 2u);
  EXPECT_EQ(info[a.slot].scope, "B");
  // Now A's cells are gone: A's prompt is evaluated again.
  const Outcome a2 = Run(*s, MakeRequest(p, "A", 6, a.slot));
  EXPECT_EQ(a2.cache_n, 0);
  EXPECT_EQ(a2.tokens, solo.tokens);
}

// (d) Within a scope, prefixes are reused as before: the own slot's cells and another slot's
// (copied over while that slot is busy) alike; a request that pins its slot (id_slot) uses that
// slot's cells only, as llama-server.
TEST_F(ServeScope, SameScopeStillReuses) {
  const std::vector<int32_t> p = Chat("Count from 3 to 12, one number per line.");
  std::vector<int32_t> longer = p;
  const std::vector<int32_t> more = Encode("3\n4\n5");
  longer.insert(longer.end(), more.begin() + 1, more.end());
  for (const std::string scope : {"", "A"}) {
    SCOPED_TRACE("scope '" + scope + "'");
    auto s = Make(3);
    const Outcome a = Run(*s, MakeRequest(p, scope));
    ASSERT_TRUE(a.error.empty()) << a.error;
    const Outcome own = Run(*s, MakeRequest(longer, scope));
    EXPECT_EQ(own.slot, a.slot);
    EXPECT_GE(own.cache_n, static_cast<int>(p.size()));  // and what it generated
    EXPECT_EQ(own.tokens, Solo(MakeRequest(longer, scope)).tokens);
    // a.slot busy with a long answer: p goes to another slot, its prefix copied from a.slot.
    std::shared_ptr<serve::Channel> busy = s->Submit(MakeRequest(longer, scope, 96, a.slot));
    const Outcome copied = Run(*s, MakeRequest(p, scope));
    EXPECT_TRUE(Collect(*busy).error.empty());
    EXPECT_NE(copied.slot, a.slot);
    EXPECT_EQ(copied.cache_n, static_cast<int>(p.size()) - 1);
    EXPECT_EQ(copied.tokens, a.tokens);
    // Pinned to the slot that holds nothing: nothing is copied, the answer is the same.
    const int empty_slot = 3 - a.slot - copied.slot;
    const Outcome pinned = Run(*s, MakeRequest(p, scope, 6, empty_slot));
    EXPECT_EQ(pinned.slot, empty_slot);
    EXPECT_EQ(pinned.cache_n, 0);
    EXPECT_EQ(pinned.tokens, a.tokens);
  }
}

// (e) The choices of an `n` request (one prefix group) still share their prompt, and the cells
// of another scope running the same prompt at the same time are not copied.
TEST_F(ServeScope, PrefixGroupSharesWithinARequest) {
  const std::vector<int32_t> p = Chat("Count from 40 to 52, one number per line.");
  const Outcome solo = Solo(MakeRequest(p, "A"));
  auto s = Make(4);
  std::vector<std::shared_ptr<serve::Channel>> channels;
  for (int i = 0; i < 3; ++i) {
    serve::Request r = MakeRequest(p, "A");
    r.prefix_group = 7;
    channels.push_back(s->Submit(r));
  }
  channels.push_back(s->Submit(MakeRequest(p, "B")));
  int evaluated = 0, copied = 0;
  for (int i = 0; i < 3; ++i) {
    const Outcome o = Collect(*channels[i]);
    ASSERT_TRUE(o.error.empty()) << o.error;
    EXPECT_EQ(o.tokens, solo.tokens) << i;
    evaluated += o.cache_n == 0;
    copied += o.cache_n == static_cast<int>(p.size()) - 1;
  }
  EXPECT_EQ(evaluated, 1);
  EXPECT_EQ(copied, 2);
  const Outcome b = Collect(*channels[3]);
  ASSERT_TRUE(b.error.empty()) << b.error;
  EXPECT_EQ(b.cache_n, 0);
  EXPECT_EQ(b.tokens, solo.tokens);
}

// Slot files: a file records its cells' scope and only that scope may restore it; a restore
// marks the slot as the restoring scope's; saving or erasing another scope's cells is refused.
TEST_F(ServeScope, SlotFilesCarryTheScope) {
  const std::vector<int32_t> p = Chat("Count from 5 to 9, one number per line.");
  const fs::path dir = fs::temp_directory_path() / ("lamina_scope_" + std::to_string(getpid()));
  fs::create_directories(dir);
  const std::string path_a = (dir / "a.bin").string(), path_b = (dir / "b.bin").string();
  auto s = Make(2);
  const Outcome a = Run(*s, MakeRequest(p, "A"));
  ASSERT_TRUE(a.error.empty()) << a.error;
  const int other = 1 - a.slot;
  EXPECT_FALSE(s->SaveSlot(a.slot, path_a, "B").ok());
  EXPECT_FALSE(s->SaveSlot(a.slot, path_a).ok());
  EXPECT_FALSE(s->EraseSlot(a.slot, "B").ok());
  EXPECT_FALSE(fs::exists(path_a));
  ASSERT_TRUE(s->SaveSlot(a.slot, path_a, "A").ok());
  // An empty slot holds nothing to hide.
  EXPECT_TRUE(s->EraseSlot(other, "B").ok());

  // A's file is A's: B cannot load it (the slot unchanged), A can.
  Result<serve::SlotFileResult> r = s->RestoreSlot(other, path_a, "B");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("another client"), std::string::npos) << r.error().message;
  EXPECT_EQ(s->Slots()[other].n_past, 0);
  EXPECT_FALSE(s->RestoreSlot(other, path_a).ok());
  r = s->RestoreSlot(other, path_a, "A");
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->n_tokens, s->Slots()[a.slot].n_past);
  EXPECT_EQ(s->slot_scope(other), "A");
  const Outcome a2 = Run(*s, MakeRequest(p, "A", 6, other));
  EXPECT_EQ(a2.cache_n, static_cast<int>(p.size()) - 1);
  EXPECT_EQ(a2.tokens, a.tokens);

  // B's own file restored into A's slot: the cells are B's now, A reuses nothing there.
  const Outcome b = Run(*s, MakeRequest(p, "B", 6, other));
  EXPECT_EQ(b.cache_n, 0);
  ASSERT_TRUE(s->SaveSlot(other, path_b, "B").ok());
  ASSERT_TRUE(s->RestoreSlot(a.slot, path_b, "B").ok());
  EXPECT_EQ(s->slot_scope(a.slot), "B");
  const Outcome a3 = Run(*s, MakeRequest(p, "A", 6, a.slot));
  EXPECT_EQ(a3.cache_n, 0);
  EXPECT_EQ(a3.tokens, a.tokens);
  ASSERT_TRUE(s->RestoreSlot(a.slot, path_b, "B").ok());
  const Outcome b2 = Run(*s, MakeRequest(p, "B", 6, a.slot));
  EXPECT_EQ(b2.cache_n, static_cast<int>(p.size()) - 1);
  EXPECT_EQ(b2.tokens, a.tokens);

  // A refused restore leaves the slot and its scope as they were.
  EXPECT_FALSE(s->RestoreSlot(a.slot, (dir / "absent.bin").string(), "C").ok());
  EXPECT_EQ(s->slot_scope(a.slot), "B");
  Result<int> erased = s->EraseSlot(a.slot, "B");
  ASSERT_TRUE(erased.ok()) << erased.error().message;
  EXPECT_GT(*erased, 0);

  // Default-scope files are as before: no scope recorded, restorable by the default scope.
  auto d = Make(1);
  ASSERT_TRUE(Run(*d, MakeRequest(p, "")).error.empty());
  const std::string path_d = (dir / "d.bin").string();
  ASSERT_TRUE(d->SaveSlot(0, path_d).ok());
  ASSERT_TRUE(d->EraseSlot(0).ok());
  ASSERT_TRUE(d->RestoreSlot(0, path_d).ok());
  EXPECT_EQ(Run(*d, MakeRequest(p, "")).cache_n, static_cast<int>(p.size()) - 1);
  EXPECT_FALSE(d->RestoreSlot(0, path_d, "A").ok());
  fs::remove_all(dir);
}

// The scheduler caps drafts by the ring of recurrent states like the CLI does: a hybrid model
// served with prompt lookup, a ring of 4 and drafts of up to 40 answers as plain greedy decoding.
TEST(ServeHybridSpec, DraftsStayWithinTheRecurrentRing) {
  if (!fs::exists(kQwen3Next)) GTEST_SKIP() << kQwen3Next << " is absent (../shared)";
  Result<std::unique_ptr<Model>> m = LoadModel(kQwen3Next);
  ASSERT_TRUE(m.ok()) << m.error().message;
  const Model& model = **m;
  ThreadPool pool(2);
  const std::vector<std::vector<int32_t>> prompts = {
      model.tokenizer().Encode("The dog ran to the park. The dog ran to the park. The dog ran",
                               true, true),
      model.tokenizer().Encode("Tom had a small red boat. One day the wind was strong and Tom "
                               "had a small",
                               true, true)};
  const int n_predict = 40;
  serve::SchedulerConfig c;
  c.n_slots = 2;
  c.session.n_ctx = 160;
  c.session.recurrent_ring = 4;
  std::vector<std::vector<int32_t>> plain;
  for (const std::vector<int32_t>& p : prompts) {
    Session session(model, c.session, pool);
    GenerateOptions go;
    go.params.sampler.temperature = 0.0f;
    go.params.n_predict = n_predict;
    go.params.ignore_eos = true;
    Result<GenerateResult> r = engine::Generate(session, 0, p, go);
    ASSERT_TRUE(r.ok()) << r.error().message;
    plain.push_back(r->tokens);
    ASSERT_EQ(plain.back().size(), static_cast<size_t>(n_predict));
  }
  for (bool per_request : {false, true}) {
    SCOPED_TRACE(per_request ? "request draft_max 40" : "server draft_max 40");
    serve::SchedulerConfig sc = c;
    sc.spec.mode = serve::SpecConfig::Mode::kLookup;
    sc.spec.lookup_ngram = 1;
    sc.spec.options.adaptive = false;
    sc.spec.options.draft_max = per_request ? 8 : 40;
    serve::Scheduler s(model, sc, pool);
    s.Start();
    std::vector<std::shared_ptr<serve::Channel>> channels;
    for (const std::vector<int32_t>& p : prompts) {
      serve::Request r = MakeRequest(p, "", n_predict);
      if (per_request) r.draft_max = 40;
      channels.push_back(s.Submit(r));
    }
    int64_t drafted = 0, accepted = 0;
    for (size_t i = 0; i < prompts.size(); ++i) {
      const Outcome o = Collect(*channels[i]);
      ASSERT_TRUE(o.error.empty()) << o.error;
      EXPECT_EQ(o.tokens, plain[i]) << "prompt " << i;
      drafted += o.draft_n;
      accepted += o.draft_accepted;
    }
    EXPECT_GT(drafted, 0);
    EXPECT_LT(accepted, drafted) << "no draft was rejected: the rollback went untested";
  }
}

}  // namespace
}  // namespace lamina
