// The engine (src/engine/) that the server steps and that Generate runs through: requests packed
// together in one engine — prompt chunks interleaved with decode tokens and speculative verify
// windows of other slots, in every KV mode, on a transformer and on the hybrid qwen3next and
// qwen35 fixtures — leave each sequence with exactly the tokens, KV bytes and recurrent state of
// the same request run alone by engine::Generate. Also: cancellation, rejection and slot choice.
#include "engine/engine.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "engine/generate.h"
#include "kv_storage.h"
#include "model/model.h"
#include "util/thread_pool.h"

namespace lamina {
namespace {

namespace fs = std::filesystem;
const std::string kShipped = std::string(LAMINA_SOURCE_DIR) + "/models/lamina-counter.gguf";
const std::string kQwen3Next =
    std::string(LAMINA_SHARED_DIR) + "/models/synth-qwen3next-d256.F32.gguf";
// The repository's qwen35 fixture (tests/fixtures/README.md): the same hybrid, dense FFN.
const std::string kQwen35 =
    std::string(LAMINA_SOURCE_DIR) + "/tests/fixtures/models/synth-qwen35-d128.Q8_0.gguf";
// Sliding-window layers (window 16) kept as a ring of 128 cells of the 160: the long
// generations below wrap it.
const std::string kGemma3 =
    std::string(LAMINA_SOURCE_DIR) + "/tests/fixtures/models/synth-gemma3-d256.Q8_0.gguf";
// phi3 (fused weights, RoPE frequency factors) and mistral3 (query temperature by position).
const std::string kPhi3 =
    std::string(LAMINA_SOURCE_DIR) + "/tests/fixtures/models/synth-phi3-d256.Q8_0.gguf";
const std::string kMistral3 =
    std::string(LAMINA_SOURCE_DIR) + "/tests/fixtures/models/synth-mistral3-d256.Q8_0.gguf";

// Gathers one request's events.
class Collector : public engine::EventSink {
 public:
  void Push(engine::Event e) override {
    if (e.kind == engine::Event::Kind::kText) {
      tokens.insert(tokens.end(), e.tokens.begin(), e.tokens.end());
      text += e.text;
      if (cancel_after > 0 && static_cast<int>(tokens.size()) >= cancel_after) cancel = true;
    } else if (e.kind != engine::Event::Kind::kProgress) {
      last = e;
      done = true;
    }
  }
  bool cancelled() const override { return cancel; }
  std::vector<int32_t> tokens;
  std::string text;
  engine::Event last;
  bool done = false;
  bool cancel = false;
  int cancel_after = 0;  // > 0: cancel once this many tokens arrived
};

engine::Request Greedy(const std::vector<int32_t>& prompt, int n_predict) {
  engine::Request r;
  r.prompt = prompt;
  r.params.sampler.temperature = 0.0f;
  r.params.n_predict = n_predict;
  r.params.ignore_eos = true;
  return r;
}

std::unique_ptr<Model> Load(const std::string& path) {
  Result<std::unique_ptr<Model>> m = LoadModel(path);
  LAMINA_CHECK(m.ok());
  return std::move(*m);
}

struct EngineCase {
  std::string path;
  KvType type;
  bool drafting;
};

std::string CaseName(const testing::TestParamInfo<EngineCase>& info) {
  const std::string stem = fs::path(info.param.path).stem().string();
  const char* model = stem.find("qwen3next") != std::string::npos  ? "qwen3next"
                      : stem.find("qwen35") != std::string::npos   ? "qwen35"
                      : stem.find("gemma3") != std::string::npos   ? "gemma3"
                      : stem.find("phi3") != std::string::npos     ? "phi3"
                      : stem.find("mistral3") != std::string::npos ? "mistral3"
                                                                   : "shipped";
  return std::string(model) + "_" + KvTypeName(info.param.type) +
         (info.param.drafting ? "_lookup" : "_plain");
}

std::vector<EngineCase> Cases() {
  std::vector<EngineCase> out;
  for (const std::string& path : {kShipped, kQwen3Next, kQwen35, kGemma3, kPhi3, kMistral3}) {
    for (KvType t : {KvType::kF32, KvType::kF16, KvType::kInt8, KvType::kQ4_0, KvType::kK8V4}) {
      for (bool drafting : {false, true}) out.push_back({path, t, drafting});
    }
  }
  return out;
}

class EngineBatching : public testing::TestWithParam<EngineCase> {};

TEST_P(EngineBatching, SlotsSteppedTogetherMatchEachRequestAlone) {
  const EngineCase& c = GetParam();
  if (!fs::exists(c.path)) GTEST_SKIP() << c.path << " is absent";
  std::unique_ptr<Model> model = Load(c.path);
  ThreadPool pool(2);
  const Tokenizer& tok = model->tokenizer();
  // Different lengths, a shared prefix, and repetition for the lookup drafter to find.
  const std::vector<std::vector<int32_t>> prompts = {
      tok.Encode("Count from 1 to 300, one number per line.\n1\n2\n3\n", true, true),
      tok.Encode("Count from 1 to 300, one number per line.\n", true, true),
      tok.Encode("The dog ran to the park. The dog ran to the park. The dog ran to the", true,
                 true),
  };
  const int n_slots = static_cast<int>(prompts.size());
  const bool ring = c.path == kGemma3;
  const int n_predict = ring ? 110 : 28;
  SessionConfig sc;
  sc.n_ctx = 160;
  sc.n_seq = n_slots;
  sc.kv_type = c.type;
  sc.kv_seed = 11;
  sc.recurrent_ring = 8;

  // Together: a small batch budget, so prompts are chunked beside the other slots' decode
  // tokens and verify windows.
  Session together(*model, sc, pool);
  engine::EngineConfig ec;
  ec.n_slots = n_slots;
  ec.n_batch = 12;
  if (c.drafting) {
    ec.spec.mode = engine::SpecConfig::Mode::kLookup;
    ec.spec.lookup_ngram = 1;
    ec.spec.options.adaptive = false;
    ec.spec.options.draft_max = 6;
  }
  engine::Engine eng(together, ec, &pool);
  std::vector<std::shared_ptr<Collector>> sinks;
  for (int i = 0; i < n_slots; ++i) {
    sinks.push_back(std::make_shared<Collector>());
    engine::Request r = Greedy(prompts[i], n_predict);
    r.id_slot = i;
    ASSERT_EQ(eng.TryStart(i + 1, r, sinks.back()), engine::Engine::Admission::kStarted);
  }
  int steps = 0;
  while (eng.busy()) {
    ASSERT_TRUE(eng.Step());
    ASSERT_LT(++steps, 1000);
  }
  EXPECT_EQ(together.cache().has_rings(), ring);
  const engine::Stats st = eng.stats();
  EXPECT_EQ(st.requests, static_cast<uint64_t>(n_slots));
  if (c.drafting) {
    EXPECT_GT(st.verify_steps, 0u);
  }

  // Alone: each request by itself through engine::Generate, on the same sequence index of a
  // fresh session (stochastic rounding is keyed by the sequence's coordinates).
  for (int i = 0; i < n_slots; ++i) {
    SCOPED_TRACE("slot " + std::to_string(i));
    ASSERT_TRUE(sinks[i]->done);
    ASSERT_EQ(sinks[i]->last.kind, engine::Event::Kind::kDone) << sinks[i]->last.message;
    Session alone(*model, sc, pool);
    GenerateOptions go;
    go.params = Greedy(prompts[i], n_predict).params;
    Result<GenerateResult> r = engine::Generate(alone, i, prompts[i], go);
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(sinks[i]->tokens, r->tokens);
    EXPECT_EQ(sinks[i]->text, r->text);
    ASSERT_EQ(together.n_past(i), alone.n_past(i));
    EXPECT_TRUE(KvStorageBytes(together.cache(), i, together.n_past(i)) ==
                KvStorageBytes(alone.cache(), i, alone.n_past(i)))
        << "KV bytes differ";
    EXPECT_TRUE(RecurrentStateFloats(together, i) == RecurrentStateFloats(alone, i))
        << "recurrent state differs";
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, EngineBatching, testing::ValuesIn(Cases()), CaseName);

class EngineRequests : public testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(kShipped)) GTEST_SKIP() << kShipped << " is absent";
    model_ = Load(kShipped);
  }
  std::unique_ptr<Model> model_;
  ThreadPool pool_{2};
};

// A cancelled request ends with kDone (reason kCancelled) and frees its slot; the answer so far
// is a prefix of the uncancelled one.
TEST_F(EngineRequests, CancelEndsTheRequestAndFreesTheSlot) {
  SessionConfig sc;
  sc.n_ctx = 128;
  Session s(*model_, sc, pool_);
  engine::Engine eng(s, engine::EngineConfig{}, &pool_);
  const std::vector<int32_t> prompt =
      model_->tokenizer().Encode("Count from 1 to 300, one number per line.\n", true, true);
  auto full = std::make_shared<Collector>();
  engine::Request r = Greedy(prompt, 20);
  ASSERT_EQ(eng.TryStart(1, r, full), engine::Engine::Admission::kStarted);
  while (eng.busy()) eng.Step();
  auto cut = std::make_shared<Collector>();
  cut->cancel_after = 5;
  r = Greedy(prompt, 20);
  ASSERT_EQ(eng.TryStart(2, r, cut), engine::Engine::Admission::kStarted);
  while (eng.busy()) eng.Step();
  ASSERT_TRUE(cut->done);
  EXPECT_EQ(cut->last.kind, engine::Event::Kind::kDone);
  EXPECT_EQ(cut->last.reason, StopReason::kCancelled);
  ASSERT_EQ(cut->tokens.size(), 5u);
  EXPECT_TRUE(std::equal(cut->tokens.begin(), cut->tokens.end(), full->tokens.begin()));
  const engine::Stats st = eng.stats();
  EXPECT_EQ(st.requests, 2u);
  EXPECT_EQ(st.requests_cancelled, 1u);
  EXPECT_FALSE(eng.busy());
}

// Requests that cannot run are rejected with an error event; one naming a busy slot waits.
TEST_F(EngineRequests, RejectsWhatCannotRunAndWaitsForABusySlot) {
  SessionConfig sc;
  sc.n_ctx = 16;
  sc.n_seq = 2;
  Session s(*model_, sc, pool_);
  engine::EngineConfig ec;
  ec.n_slots = 2;
  engine::Engine eng(s, ec, &pool_);
  auto sink = std::make_shared<Collector>();
  engine::Request empty = Greedy({}, 4);
  EXPECT_EQ(eng.TryStart(1, empty, sink), engine::Engine::Admission::kRejected);
  EXPECT_EQ(sink->last.error, engine::ErrorKind::kBadRequest);
  sink = std::make_shared<Collector>();
  engine::Request long_one = Greedy(std::vector<int32_t>(17, 1), 4);
  EXPECT_EQ(eng.TryStart(2, long_one, sink), engine::Engine::Admission::kRejected);
  EXPECT_EQ(sink->last.error, engine::ErrorKind::kContextExceeded);
  sink = std::make_shared<Collector>();
  engine::Request no_slot = Greedy({1, 2}, 4);
  no_slot.id_slot = 2;
  EXPECT_EQ(eng.TryStart(3, no_slot, sink), engine::Engine::Admission::kRejected);
  EXPECT_EQ(sink->last.error, engine::ErrorKind::kBadRequest);

  auto first = std::make_shared<Collector>();
  engine::Request a = Greedy({1, 2, 3}, 4);
  a.id_slot = 1;
  ASSERT_EQ(eng.TryStart(4, a, first), engine::Engine::Admission::kStarted);
  auto second = std::make_shared<Collector>();
  engine::Request b = Greedy({1, 2, 3}, 4);
  b.id_slot = 1;
  EXPECT_EQ(eng.TryStart(5, b, second), engine::Engine::Admission::kWait);
  EXPECT_EQ(b.prompt.size(), 3u) << "a waiting request is not moved from";
  while (eng.busy()) eng.Step();
  EXPECT_EQ(eng.TryStart(5, b, second), engine::Engine::Admission::kStarted);
  while (eng.busy()) eng.Step();
  EXPECT_EQ(second->tokens, first->tokens);
  EXPECT_EQ(second->last.timings.cache_n, 2) << "the slot's own cells were reused";
  EXPECT_EQ(eng.Slots()[1].request, 5u);
}

// The bytes the slots hold count every store a sequence keeps: its cells, a hybrid model's ring
// of recurrent states (which dominates here: 8 states per layer against a few dozen cells) and
// the hidden states kept for an MTP head; the whole storage counts the rings too.
TEST(EngineStats, BytesUsedCountRecurrentStates) {
  ThreadPool pool(2);
  std::unique_ptr<Model> model = Load(kQwen35);
  SessionConfig sc;
  sc.n_ctx = 64;
  sc.n_seq = 2;
  sc.recurrent_ring = 8;
  Session session(*model, sc, pool);
  engine::EngineConfig ec;
  ec.n_slots = 2;
  engine::Engine eng(session, ec, &pool);
  const uint64_t ring = session.recurrent().bytes();
  ASSERT_GT(ring, 0u);
  EXPECT_EQ(eng.stats().kv_bytes, session.cache().BytesTotal() + ring);
  EXPECT_EQ(eng.stats().kv_bytes_used, 0u);
  auto sink = std::make_shared<Collector>();
  engine::Request r = Greedy({1, 2, 3, 4, 5}, 6);
  r.id_slot = 0;
  ASSERT_EQ(eng.TryStart(1, r, sink), engine::Engine::Admission::kStarted);
  while (eng.busy()) ASSERT_TRUE(eng.Step());
  const int n_past = session.n_past(0);
  ASSERT_GT(n_past, 0);
  const uint64_t cells = static_cast<uint64_t>(n_past) * session.cache().BytesPerToken();
  EXPECT_EQ(eng.stats().kv_bytes_used, cells + ring / 2);  // one sequence's ring of the two
  EXPECT_GT(ring / 2, cells);
  EXPECT_EQ(eng.stats().draft_kv_bytes, 0u) << "no drafter, no drafter cache";
}

TEST(EngineStats, BytesUsedCountMtpHiddenStates) {
  ThreadPool pool(2);
  std::unique_ptr<Model> model = Load(kShipped);
  const std::string head = std::string(LAMINA_SOURCE_DIR) + "/models/lamina-counter-mtp.gguf";
  ASSERT_TRUE(LoadMtpHead(*model, head).ok());
  SessionConfig sc;
  sc.n_ctx = 128;
  Session session(*model, sc, pool);
  engine::EngineConfig ec;
  ec.spec.mode = engine::SpecConfig::Mode::kMtp;
  ec.spec.options.adaptive = false;
  engine::Engine eng(session, ec, &pool);
  auto sink = std::make_shared<Collector>();
  engine::Request r = Greedy({1, 2, 3, 4, 5, 6}, 12);
  ASSERT_EQ(eng.TryStart(1, r, sink), engine::Engine::Admission::kStarted);
  while (eng.busy()) ASSERT_TRUE(eng.Step());
  ASSERT_GT(session.n_hidden(0), 0);
  const uint64_t cells = static_cast<uint64_t>(session.n_past(0)) * session.cache().BytesPerToken();
  const uint64_t hidden =
      static_cast<uint64_t>(session.n_hidden(0)) * model->hparams().n_embd * sizeof(float);
  EXPECT_EQ(eng.stats().kv_bytes_used, cells + hidden);
  // The MTP block's own one-layer cache is counted apart, storage and the cells it holds.
  const engine::Stats st = eng.stats();
  EXPECT_GT(st.draft_kv_bytes, 0u);
  EXPECT_GT(st.draft_kv_bytes_used, 0u);
  EXPECT_LE(st.draft_kv_bytes_used, st.draft_kv_bytes);
  EXPECT_LT(st.draft_kv_bytes, st.kv_bytes) << "one layer against the target's layers";
}

}  // namespace
}  // namespace lamina
