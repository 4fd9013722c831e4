// Write-path equivalence: the same token stream fed as one prompt batch, token by token, in
// random chunks, and as speculative verify windows (a random suffix rejected, truncated and
// rewritten) must leave byte-identical cache storage and bit-identical logits, in every KV mode
// and V rounding (the gemma3 fixture: with sliding-window layers; the gpt-oss one: with attention
// sinks too; phi3: fused weights and RoPE frequency factors, which the q4_0 keys' anchors follow;
// mistral3: YaRN and per-position query temperature). A planted fault (one path's writes never
// reach storage) must be caught. On gemma3 the sliding-window layer keeps a ring of its recent
// cells: every path through the ring must equal a cache that keeps every cell (--swa-full) cut to
// the window, bit for bit, and a rollback across the window's edge, a session saved and restored
// mid-run, and a prefix the ring no longer holds (which must fall back to evaluating again) too.
// The hybrid qwen3next, qwen35 and qwen35moe fixtures add their recurrent state (conv tails and
// delta states), which every path must leave bit-identical too, and a planted fault (state not
// restored on truncate).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>

#include "kv_storage.h"
#include "model/model.h"
#include "probe/faults.h"
#include "runtime/attention.h"
#include "runtime/generate.h"
#include "runtime/session.h"
#include "runtime/session_file.h"

namespace lamina {
namespace {

const std::string kShared = LAMINA_SHARED_DIR;
// The repository's gemma3 fixture (tests/fixtures/README.md): sliding-window layers (window 16)
// and global ones, so the 150-token streams below run far past every local window.
const std::string kGemma3 =
    std::string(LAMINA_SOURCE_DIR) + "/tests/fixtures/models/synth-gemma3-d256.Q8_0.gguf";
// The repository's qwen35 and qwen35moe fixtures: the hybrid in the Qwen3.5 layout (tiled V
// heads, multi-section RoPE), dense and MoE.
const std::string kQwen35 =
    std::string(LAMINA_SOURCE_DIR) + "/tests/fixtures/models/synth-qwen35-d128.Q8_0.gguf";
const std::string kQwen35Moe =
    std::string(LAMINA_SOURCE_DIR) + "/tests/fixtures/models/synth-qwen35moe-d128.Q8_0.gguf";

// The repository's gpt-oss fixture: attention sinks in every softmax, alternating
// sliding-window layers (window 16) and a MoE of MXFP4 experts.
const std::string kGptOss =
    std::string(LAMINA_SOURCE_DIR) + "/tests/fixtures/models/synth-gpt-oss-d256.MXFP4_MOE.gguf";

// The repository's phi3 and mistral3 fixtures (tests/fixtures/README.md).
const std::string kPhi3 =
    std::string(LAMINA_SOURCE_DIR) + "/tests/fixtures/models/synth-phi3-d256.Q8_0.gguf";
const std::string kMistral3 =
    std::string(LAMINA_SOURCE_DIR) + "/tests/fixtures/models/synth-mistral3-d256.Q8_0.gguf";

// A case's model: a path, or a file name under ../shared/models.
std::string ModelPath(const std::string& model) {
  return model.find('/') != std::string::npos ? model : kShared + "/models/" + model;
}

struct PathRun {
  std::vector<float> logits;                  // [n_tokens, n_vocab], position p predicts p+1
  std::vector<std::vector<uint8_t>> storage;  // per layer: K bytes then V bytes
  // The same with sliding-window layers cut to their window (a ring against every cell).
  std::vector<std::vector<uint8_t>> windows;
  size_t kv_bytes = 0;       // KvCache::BytesTotal
  std::vector<float> state;  // recurrent layers' conv tails and delta states (hybrid models)
};

enum class Path { kBatch, kTokenByToken, kRandomChunks, kVerifyWindows };

const char* PathName(Path p) {
  switch (p) {
    case Path::kBatch:
      return "batch";
    case Path::kTokenByToken:
      return "token-by-token";
    case Path::kRandomChunks:
      return "random-chunks";
    case Path::kVerifyWindows:
      return "verify-windows";
  }
  return "?";
}

// observer: the session's write observer (a planted fault), or none.
PathRun RunPath(const Model& model, SessionConfig sc, const std::vector<int32_t>& tokens, Path path,
                ThreadPool& pool, const WriteObserver* observer = nullptr) {
  const int n_vocab = model.hparams().n_vocab;
  sc.write_observer = observer;
  Session s(model, sc, pool);
  PathRun run;
  run.logits.resize(tokens.size() * n_vocab);
  std::mt19937 rng(7);
  const int n = static_cast<int>(tokens.size());
  auto eval_keep = [&](int pos, const std::vector<int32_t>& batch, int keep) {
    Result<const float*> r = s.Eval(batch, true);
    LAMINA_CHECK(r.ok());
    std::memcpy(run.logits.data() + static_cast<size_t>(pos) * n_vocab, *r,
                sizeof(float) * keep * n_vocab);
  };
  int pos = 0;
  while (pos < n) {
    int take = 1;
    switch (path) {
      case Path::kBatch:
        take = n;
        break;
      case Path::kTokenByToken:
        take = 1;
        break;
      case Path::kRandomChunks:
        take = std::uniform_int_distribution<int>(1, 37)(rng);
        break;
      case Path::kVerifyWindows: {
        // A window of w tokens of which the first `accept` are right; the rest is a wrong
        // draft that is written, rejected (truncated) and later rewritten with the right ones.
        const int w = std::min(n - pos, std::uniform_int_distribution<int>(2, 8)(rng));
        const int accept = std::uniform_int_distribution<int>(1, w)(rng);
        std::vector<int32_t> window(tokens.begin() + pos, tokens.begin() + pos + w);
        for (int i = accept; i < w; ++i) window[i] = (window[i] + 1 + i) % n_vocab;
        eval_keep(pos, window, accept);
        s.Truncate(pos + accept);
        LAMINA_CHECK(s.n_past() == pos + accept);
        pos += accept;
        continue;
      }
    }
    take = std::min(take, n - pos);
    eval_keep(pos, std::vector<int32_t>(tokens.begin() + pos, tokens.begin() + pos + take), take);
    pos += take;
  }
  run.storage = KvStorageBytes(s.cache(), 0);
  run.windows = KvStorageBytes(s.cache(), 0, -1, /*windows_only=*/true);
  run.kv_bytes = s.cache().BytesTotal();
  run.state = RecurrentStateFloats(s, 0);
  return run;
}

// "" when equal, else where the first difference is.
std::string Compare(const PathRun& a, const PathRun& b, int n_vocab) {
  for (size_t l = 0; l < a.storage.size(); ++l) {
    if (a.storage[l] != b.storage[l]) {
      size_t i = 0;
      while (a.storage[l][i] == b.storage[l][i]) ++i;
      return "cache storage differs in layer " + std::to_string(l) + " at byte " +
             std::to_string(i);
    }
  }
  // memcmp only on non-empty buffers: an empty vector's data() may be null.
  if (a.state.size() != b.state.size() ||
      (!a.state.empty() &&
       std::memcmp(a.state.data(), b.state.data(), a.state.size() * sizeof(float)) != 0)) {
    return "recurrent state differs";
  }
  if (!a.logits.empty() &&
      std::memcmp(a.logits.data(), b.logits.data(), a.logits.size() * sizeof(float)) != 0) {
    size_t i = 0;
    while (a.logits[i] == b.logits[i]) ++i;
    return "logits differ at position " + std::to_string(i / n_vocab);
  }
  return "";
}

// A ring run against one that keeps every cell: logits, and the cells of every window.
std::string CompareWithFull(const PathRun& ring, const PathRun& full, int n_vocab) {
  PathRun a = ring, b = full;
  a.storage = a.windows;
  b.storage = b.windows;
  return Compare(a, b, n_vocab);
}

struct ModeCase {
  std::string model;
  KvType type;
  KvRounding rounding;
  int window = 0;  // recent exact cells
};

std::string ModeCaseName(const testing::TestParamInfo<ModeCase>& info) {
  std::string m = std::filesystem::path(info.param.model).stem().string();
  for (char& ch : m) {
    if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
  }
  return m + "_" + KvTypeName(info.param.type) + "_" + KvRoundingName(info.param.rounding) +
         (info.param.window > 0 ? "_w" + std::to_string(info.param.window) : "");
}

std::vector<ModeCase> Cases() {
  std::vector<ModeCase> cases;
  for (const std::string& m :
       {std::string("stories260K.gguf"), std::string("synth-llama-kq.F32.gguf"),
        std::string("synth-qwen3next-d256.F32.gguf"), kGemma3, kQwen35, kQwen35Moe, kGptOss, kPhi3,
        kMistral3}) {
    for (KvType t : {KvType::kF32, KvType::kF16, KvType::kInt8, KvType::kQ4_0, KvType::kK8V4}) {
      cases.push_back({m, t, KvRounding::kNearest});
      if (t != KvType::kF32 && t != KvType::kF16) cases.push_back({m, t, KvRounding::kStochastic});
    }
    // A recent exact window (12 cells, ring 76: 150 tokens wrap it; chunks and verify windows
    // cross its boundary inside one batch).
    for (KvType t : {KvType::kInt8, KvType::kQ4_0, KvType::kK8V4}) {
      cases.push_back({m, t, KvRounding::kNearest, 12});
    }
    cases.push_back({m, KvType::kK8V4, KvRounding::kStochastic, 12});
    // Lloyd-Max V levels: the same writer, nearest and stochastic, without and with a window.
    cases.push_back({m, KvType::kK8V4Nl, KvRounding::kNearest});
    cases.push_back({m, KvType::kK8V4Nl, KvRounding::kStochastic, 12});
  }
  return cases;
}

std::vector<int32_t> TestTokens(const Model& model, int n) {
  std::vector<int32_t> tokens = model.tokenizer().Encode(
      "Tom had a small red boat. One day the wind was strong and the boat went far away. Tom was "
      "sad, but his dog Max jumped into the water and brought the boat back. Tom hugged Max and "
      "said, \"Thank you, Max!\" Lily and Ben went to the park. They played on the swings.",
      true, false);
  while (static_cast<int>(tokens.size()) < n) tokens.push_back(tokens[tokens.size() % 50 + 1]);
  tokens.resize(n);
  return tokens;
}

// The parameter's model and a session config in its KV mode (n_ctx 160).
class KvWritePaths : public testing::TestWithParam<ModeCase> {
 protected:
  void SetUp() override {
    const std::string path = ModelPath(GetParam().model);
    if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " is absent";
    Result<std::unique_ptr<Model>> m = LoadModel(path);
    ASSERT_TRUE(m.ok()) << m.error().message;
    model_ = std::move(*m);
    sc_.n_ctx = 160;
    sc_.kv_type = GetParam().type;
    sc_.v_rounding = GetParam().rounding;
    sc_.kv_window = GetParam().window;
    sc_.kv_seed = 99;
    sc_.recurrent_ring = 40;  // the longest rejected suffix below is 36 tokens
  }
  std::unique_ptr<Model> model_;
  SessionConfig sc_;
};

TEST_P(KvWritePaths, AllPathsGiveIdenticalBytesAndLogits) {
  const Model& m = *model_;
  SessionConfig sc = sc_;
  ThreadPool pool(2);
  const std::vector<int32_t> tokens = TestTokens(m, 150);
  const int n_vocab = m.hparams().n_vocab;
  const PathRun batch = RunPath(m, sc, tokens, Path::kBatch, pool);
  for (Path p : {Path::kTokenByToken, Path::kRandomChunks, Path::kVerifyWindows}) {
    const PathRun other = RunPath(m, sc, tokens, p, pool);
    EXPECT_EQ(Compare(batch, other, n_vocab), "") << "path " << PathName(p) << " vs batch";
  }
  // Sliding-window layers: the ring (the default) against every cell kept (--swa-full), which
  // must cost more memory, as the memory guard computes it too.
  if (m.hparams().swa_layers.empty()) return;
  Result<KvCacheConfig> ring_config = MakeKvCacheConfig(m.hparams(), sc);
  ASSERT_TRUE(ring_config.ok());
  EXPECT_EQ(KvCacheBytes(*ring_config), batch.kv_bytes);
  sc.swa_full = true;
  Result<KvCacheConfig> full_config = MakeKvCacheConfig(m.hparams(), sc);
  ASSERT_TRUE(full_config.ok());
  const PathRun full = RunPath(m, sc, tokens, Path::kBatch, pool);
  EXPECT_EQ(KvCacheBytes(*full_config), full.kv_bytes);
  EXPECT_LT(batch.kv_bytes, full.kv_bytes);
  EXPECT_EQ(CompareWithFull(batch, full, n_vocab), "") << "ring vs every cell";
  const PathRun full_verify = RunPath(m, sc, tokens, Path::kVerifyWindows, pool);
  EXPECT_EQ(CompareWithFull(full_verify, full, n_vocab), "") << "every cell, verify windows";
}

// Sliding-window rings saved and restored mid-run (session files): a run cut at a point where
// the ring has wrapped, saved, restored into a fresh session and continued (one token at a
// time, then in a batch) equals the uninterrupted run bit for bit; the file of a ring is
// refused by a session that keeps every cell, with a reason.
TEST_P(KvWritePaths, SlidingWindowRingSavedAndRestoredMidRun) {
  const Model& m = *model_;
  if (m.hparams().swa_layers.empty()) GTEST_SKIP() << "no sliding-window layers";
  ThreadPool pool(2);
  const std::vector<int32_t> tokens = TestTokens(m, 150);
  const int n_vocab = m.hparams().n_vocab;
  const PathRun batch = RunPath(m, sc_, tokens, Path::kBatch, pool);
  for (int cut : {21, 133}) {
    Session first(m, sc_, pool);
    ASSERT_TRUE(first.cache().has_rings());
    ASSERT_TRUE(first.Eval(std::vector<int32_t>(tokens.begin(), tokens.begin() + cut), true).ok());
    const std::vector<uint8_t> bytes = SerializeSessionFile(first, 0, 1234);
    Session second(m, sc_, pool);
    Result<SessionFileView> view = ParseSessionFile(bytes.data(), bytes.size(), second, 1234);
    ASSERT_TRUE(view.ok()) << view.error().message;
    second.RestoreSequence(0, view->tokens, view->kv);
    EXPECT_EQ(SerializeSessionFile(second, 0, 1234), bytes) << "cut " << cut;
    // Untrusted ring state: the ring layer's (layer 0) first held cell out of range, or data
    // before it, is refused by name.
    std::vector<uint8_t> state(view->kv, view->kv + view->kv_bytes);
    int32_t m0;
    std::memcpy(&m0, state.data(), sizeof(m0));
    EXPECT_EQ(m0, std::max(0, cut - first.cache().ring_cells()));
    for (int32_t bad : {cut + 1, m0 - 1, m0 + 1}) {
      std::memcpy(state.data(), &bad, sizeof(bad));
      const Status st = second.cache().CheckSequenceState(cut, state.data());
      EXPECT_FALSE(st.ok()) << "first held cell " << bad;
      if (!st.ok()) {
        EXPECT_NE(st.error().message.find(bad == m0 + 1 ? "before the ring's start" : "layer 0"),
                  std::string::npos)
            << st.error().message;
      }
    }
    PathRun run;
    run.logits = batch.logits;
    for (int pos = cut; pos < 150;) {
      const int take = pos < cut + 5 ? 1 : 150 - pos;
      Result<const float*> r = second.Eval(
          std::vector<int32_t>(tokens.begin() + pos, tokens.begin() + pos + take), true);
      ASSERT_TRUE(r.ok());
      std::memcpy(run.logits.data() + static_cast<size_t>(pos) * n_vocab, *r,
                  sizeof(float) * take * n_vocab);
      pos += take;
    }
    run.storage = KvStorageBytes(second.cache(), 0);
    EXPECT_EQ(Compare(batch, run, n_vocab), "") << "cut " << cut;
    SessionConfig full = sc_;
    full.swa_full = true;
    Session other(m, full, pool);
    Result<SessionFileView> refused = ParseSessionFile(bytes.data(), bytes.size(), other, 1234);
    ASSERT_FALSE(refused.ok());
    EXPECT_NE(refused.error().message.find("--swa-full"), std::string::npos)
        << refused.error().message;
    // A file that keeps every cell (version 2, as before rings) loads where every cell is kept
    // and is refused by a ring, with a reason.
    ASSERT_TRUE(other.Eval(std::vector<int32_t>(tokens.begin(), tokens.begin() + cut), true).ok());
    const std::vector<uint8_t> full_bytes = SerializeSessionFile(other, 0, 1234);
    uint32_t version;
    std::memcpy(&version, full_bytes.data() + 8, sizeof(version));
    EXPECT_EQ(version, kSessionFileVersionNoRing);
    EXPECT_TRUE(ParseSessionFile(full_bytes.data(), full_bytes.size(), other, 1234).ok());
    refused = ParseSessionFile(full_bytes.data(), full_bytes.size(), second, 1234);
    ASSERT_FALSE(refused.ok());
    EXPECT_NE(refused.error().message.find("keeps a ring of"), std::string::npos)
        << refused.error().message;
  }
}

// Several sequences in one forward pass: four token streams of different lengths advance
// together in mixed batches (random chunk per sequence and step, tokens of the sequences
// interleaved at random, some steps a wrong draft that is written, rejected and rewritten, some
// sequences idle), through Session::Decode. Each sequence's cells and logits must equal those
// of the same stream alone in its own session.
// Sequence i's own token stream of lengths[i] tokens drawn from base: token t is
// base[(t * (a * i + 1) + b * i) % base.size()], the first one BOS (base[0]).
std::vector<std::vector<int32_t>> SequenceStreams(const std::vector<int32_t>& base,
                                                  const std::vector<int>& lengths, int a, int b) {
  std::vector<std::vector<int32_t>> streams(lengths.size());
  for (size_t i = 0; i < lengths.size(); ++i) {
    const int si = static_cast<int>(i);
    for (int t = 0; t < lengths[i]; ++t) {
      streams[i].push_back(base[(t * (a * si + 1) + b * si) % base.size()]);
    }
    streams[i][0] = base[0];
  }
  return streams;
}

// Each stream run alone, in a one-sequence session, by `path`.
std::vector<PathRun> EachAlone(const Model& m, const SessionConfig& sc,
                               const std::vector<std::vector<int32_t>>& streams, Path path,
                               ThreadPool& pool) {
  std::vector<PathRun> alone;
  for (const std::vector<int32_t>& stream : streams)
    alone.push_back(RunPath(m, sc, stream, path, pool));
  return alone;
}

TEST_P(KvWritePaths, SequencesBatchedTogetherMatchEachAlone) {
  const Model& m = *model_;
  SessionConfig sc = sc_;
  ThreadPool pool(2);
  const int n_vocab = m.hparams().n_vocab;
  const std::vector<int32_t> base = TestTokens(m, 150);
  const std::vector<int> lengths = {150, 97, 123, 60};
  const int n_seq = static_cast<int>(lengths.size());
  const std::vector<std::vector<int32_t>> streams = SequenceStreams(base, lengths, 1, 1);
  const std::vector<PathRun> alone = EachAlone(m, sc, streams, Path::kBatch, pool);

  sc.n_seq = n_seq;
  Session s(m, sc, pool);
  std::vector<PathRun> together(n_seq);
  for (int i = 0; i < n_seq; ++i) together[i].logits.resize(streams[i].size() * n_vocab);
  std::mt19937 rng(11);
  std::vector<int> done(n_seq, 0);
  int steps = 0;
  while (done != lengths) {
    // Per sequence: the tokens of this step (a chunk, maybe with a wrong draft tail to reject).
    std::vector<std::vector<int32_t>> chunk(n_seq);
    std::vector<int> accept(n_seq, 0);
    for (int i = 0; i < n_seq; ++i) {
      const int left = lengths[i] - done[i];
      if (left == 0 || rng() % 5 == 0) continue;  // finished, or idle this step
      const int take =
          std::min(left, rng() % 3 == 0 ? 1 : std::uniform_int_distribution<int>(1, 37)(rng));
      chunk[i].assign(streams[i].begin() + done[i], streams[i].begin() + done[i] + take);
      accept[i] = take;
      if (take > 1 && rng() % 3 == 0) {  // a verify window: keep a prefix, reject the rest
        accept[i] = std::uniform_int_distribution<int>(1, take - 1)(rng);
        for (int j = accept[i]; j < take; ++j) chunk[i][j] = (chunk[i][j] + 1 + j) % n_vocab;
      }
    }
    // Interleave the chunks at random, each sequence's tokens in order.
    SequenceBatch batch;
    std::vector<int> next(n_seq, 0);
    std::vector<std::pair<int, int>> rows;  // (sequence, index in its chunk) per batch row
    while (true) {
      std::vector<int> open;
      for (int i = 0; i < n_seq; ++i) {
        if (next[i] < static_cast<int>(chunk[i].size())) open.push_back(i);
      }
      if (open.empty()) break;
      const int i = open[rng() % open.size()];
      batch.Add(chunk[i][next[i]], i, done[i] + next[i], true);
      rows.push_back({i, next[i]++});
    }
    if (batch.size() == 0) continue;
    Result<const float*> r = s.Decode(batch);
    ASSERT_TRUE(r.ok()) << r.error().message;
    for (size_t row = 0; row < rows.size(); ++row) {
      const auto [i, j] = rows[row];
      if (j >= accept[i]) continue;
      std::memcpy(together[i].logits.data() + static_cast<size_t>(done[i] + j) * n_vocab,
                  *r + row * n_vocab, sizeof(float) * n_vocab);
    }
    for (int i = 0; i < n_seq; ++i) {
      if (chunk[i].empty()) continue;
      done[i] += accept[i];
      s.Truncate(i, done[i]);
    }
    ++steps;
  }
  EXPECT_GT(steps, 5);
  for (int i = 0; i < n_seq; ++i) {
    EXPECT_EQ(s.n_past(i), lengths[i]);
    together[i].storage = KvStorageBytes(s.cache(), i);
    together[i].state = RecurrentStateFloats(s, i);
    EXPECT_EQ(Compare(alone[i], together[i], n_vocab), "")
        << "sequence " << i << " batched vs alone";
  }
}

// Decode steps of several sequences, each bringing one token or a short verify window and no
// sequence twice (a server's slots): the session spreads such a step over the pool a sequence
// at a time, each thread writing its sequences' cells and running their attention (Session's
// CacheAttention::AttendBySequence; with two threads, at least two sequences and a short
// context it always does). Every sequence's logits, cells and recurrent state equal the ones it
// gets alone. Prompts of different lengths, each sequence's own continuation, the steps' order
// of sequences shuffled, windows of 2-6 tokens whose wrong tail is rejected (truncated and
// rewritten), and sequences finishing at different steps (the last one alone).
TEST_P(KvWritePaths, DecodeStepsOfSeveralSequencesMatchEachAlone) {
  const Model& m = *model_;
  SessionConfig sc = sc_;
  ThreadPool pool(2);
  const int n_vocab = m.hparams().n_vocab;
  const std::vector<int32_t> base = TestTokens(m, 150);
  const std::vector<int> prompts = {40, 17, 29, 8};
  const std::vector<int> lengths = {90, 75, 60, 70};
  const int n_seq = static_cast<int>(lengths.size());
  const std::vector<std::vector<int32_t>> streams = SequenceStreams(base, lengths, 2, 3);
  const std::vector<PathRun> alone = EachAlone(m, sc, streams, Path::kTokenByToken, pool);

  sc.n_seq = n_seq;
  Session s(m, sc, pool);
  std::vector<PathRun> together(n_seq);
  for (int i = 0; i < n_seq; ++i) {
    together[i].logits.resize(streams[i].size() * n_vocab);
    Result<const float*> r = s.EvalSeq(i, streams[i].data(), prompts[i], true);
    ASSERT_TRUE(r.ok()) << r.error().message;
    std::memcpy(together[i].logits.data(), *r, sizeof(float) * prompts[i] * n_vocab);
  }
  std::mt19937 rng(5);
  std::vector<int> done = prompts;
  int steps = 0, windows = 0;
  while (done != lengths) {
    std::vector<int> order;
    for (int i = 0; i < n_seq; ++i) {
      if (done[i] < lengths[i]) order.push_back(i);
    }
    std::shuffle(order.begin(), order.end(), rng);
    SequenceBatch batch;
    std::vector<int> take(n_seq, 0), accept(n_seq, 0);
    for (int i : order) {
      const int left = lengths[i] - done[i];
      take[i] = rng() % 2 == 0 ? 1 : std::uniform_int_distribution<int>(1, std::min(6, left))(rng);
      accept[i] = take[i];
      std::vector<int32_t> tokens(streams[i].begin() + done[i],
                                  streams[i].begin() + done[i] + take[i]);
      if (take[i] > 1 && rng() % 3 == 0) {  // a verify window: keep a prefix, reject the rest
        accept[i] = std::uniform_int_distribution<int>(1, take[i] - 1)(rng);
        for (int j = accept[i]; j < take[i]; ++j) tokens[j] = (tokens[j] + 1 + j) % n_vocab;
      }
      windows += take[i] > 1;
      for (int j = 0; j < take[i]; ++j) batch.Add(tokens[j], i, done[i] + j, true);
    }
    Result<const float*> r = s.Decode(batch);
    ASSERT_TRUE(r.ok()) << r.error().message;
    size_t row = 0;
    for (int i : order) {
      std::memcpy(together[i].logits.data() + static_cast<size_t>(done[i]) * n_vocab,
                  *r + row * n_vocab, sizeof(float) * accept[i] * n_vocab);
      row += take[i];
      done[i] += accept[i];
      if (accept[i] < take[i]) s.Truncate(i, done[i]);
    }
    ++steps;
  }
  EXPECT_GT(steps, 10);
  EXPECT_GT(windows, 10);
  for (int i = 0; i < n_seq; ++i) {
    together[i].storage = KvStorageBytes(s.cache(), i);
    together[i].state = RecurrentStateFloats(s, i);
    EXPECT_EQ(Compare(alone[i], together[i], n_vocab), "")
        << "sequence " << i << " in steps of several sequences vs alone";
  }
}

// The same past one attention chunk (kAttentionCellChunk cells: each sequence's attention then
// merges two chunks through its thread's scratch) and over many cells a step, where the session
// spreads a step only because its sequences balance over the threads: four sequences sharing a
// random prefix of 4,100 cells (FillWithRandomCells, CopyPrefix), each continued by its own
// tokens in steps of all four, against each continued alone; f16 and k8v4.
TEST(KvWritePathsLong, DecodeStepsOfSeveralSequencesPastOneAttentionChunk) {
  if (!std::filesystem::exists(kMistral3)) GTEST_SKIP() << kMistral3 << " is absent";
  Result<std::unique_ptr<Model>> model = LoadModel(kMistral3);
  ASSERT_TRUE(model.ok()) << model.error().message;
  const Model& m = **model;
  const int n_vocab = m.hparams().n_vocab;
  constexpr int kDepth = kAttentionCellChunk + 4;
  constexpr int kSteps = 6;
  constexpr int kSeqs = 4;
  const std::vector<int32_t> base = TestTokens(m, 40);
  ThreadPool pool(2);
  for (KvType type : {KvType::kF16, KvType::kK8V4}) {
    SessionConfig sc;
    sc.n_ctx = kDepth + kSteps;
    sc.kv_type = type;
    sc.kv_seed = 99;
    std::vector<std::vector<float>> alone(kSeqs);  // [seq][kSteps * n_vocab]
    for (int i = 0; i < kSeqs; ++i) {
      Session a(m, sc, pool);
      a.FillWithRandomCells(kDepth, 17);
      for (int t = 0; t < kSteps; ++t) {
        Result<const float*> r = a.Eval({base[(5 * i + 3 * t) % base.size()]}, false);
        ASSERT_TRUE(r.ok()) << r.error().message;
        alone[i].insert(alone[i].end(), *r, *r + n_vocab);
      }
    }
    sc.n_seq = kSeqs;
    Session s(m, sc, pool);
    s.FillWithRandomCells(kDepth, 17);
    for (int i = 1; i < kSeqs; ++i) s.CopyPrefix(0, i, kDepth);
    for (int t = 0; t < kSteps; ++t) {
      SequenceBatch batch;
      for (int j = 0; j < kSeqs; ++j) {
        const int i = (j + t) % kSeqs;  // a different order each step
        batch.Add(base[(5 * i + 3 * t) % base.size()], i, kDepth + t, true);
      }
      Result<const float*> r = s.Decode(batch);
      ASSERT_TRUE(r.ok()) << r.error().message;
      for (int j = 0; j < kSeqs; ++j) {
        const int i = (j + t) % kSeqs;
        EXPECT_EQ(std::memcmp(*r + static_cast<size_t>(j) * n_vocab,
                              alone[i].data() + static_cast<size_t>(t) * n_vocab,
                              sizeof(float) * n_vocab),
                  0)
            << KvTypeName(type) << ": sequence " << i << ", step " << t;
      }
    }
  }
}

// A batch that does not continue its sequences is refused before anything is written.
TEST(SequenceBatch, RefusesPositionsThatDoNotContinueTheSequence) {
  const std::string path = kShared + "/models/stories260K.gguf";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " is absent";
  Result<std::unique_ptr<Model>> model = LoadModel(path);
  ASSERT_TRUE(model.ok());
  ThreadPool pool(1);
  SessionConfig sc;
  sc.n_ctx = 8;
  sc.n_seq = 2;
  Session s(**model, sc, pool);
  SequenceBatch b;
  b.Add(1, 0, 0, true);
  b.Add(1, 1, 1, true);  // sequence 1 is empty: its next position is 0
  Result<const float*> r = s.Decode(b);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("does not continue sequence 1"), std::string::npos)
      << r.error().message;
  EXPECT_EQ(s.n_past(0), 0);
  b.Clear();
  b.Add(1, 2, 0, true);
  EXPECT_FALSE(s.Decode(b).ok());
  b.Clear();
  for (int p = 0; p < 9; ++p) b.Add(1, 1, p, false);
  r = s.Decode(b);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("context overflow"), std::string::npos);
  EXPECT_EQ(s.n_past(1), 0);
}

INSTANTIATE_TEST_SUITE_P(Modes, KvWritePaths, testing::ValuesIn(Cases()), ModeCaseName);

// The planted faults (write observers): single-token writes skipped (the real-world bug) or
// corrupted. The comparison must catch both, in a quantized mode.
TEST(KvWritePathsTeeth, PlantedFaultsAreCaught) {
  const std::string path = kShared + "/models/stories260K.gguf";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " is absent";
  Result<std::unique_ptr<Model>> model = LoadModel(path);
  ASSERT_TRUE(model.ok());
  ThreadPool pool(2);
  SessionConfig sc;
  sc.n_ctx = 64;
  sc.kv_type = KvType::kK8V4;
  const std::vector<int32_t> tokens = TestTokens(**model, 60);
  const int n_vocab = (*model)->hparams().n_vocab;
  const PathRun batch = RunPath(**model, sc, tokens, Path::kBatch, pool);
  for (probe::Fault f : {probe::Fault::kSkipDecodeWrites, probe::Fault::kCorruptDecodeWrites}) {
    const std::unique_ptr<WriteObserver> fault = probe::MakeFaultObserver(f);
    const PathRun faulty = RunPath(**model, sc, tokens, Path::kTokenByToken, pool, fault.get());
    EXPECT_NE(Compare(batch, faulty, n_vocab), "")
        << probe::FaultName(f) << ": a planted fault went unnoticed";
  }
}

// The hybrid's planted fault: Truncate moves the length but leaves the recurrent state as the
// rejected draft left it. Verify windows against one batch must catch it.
class StateLeftUnrestored : public WriteObserver {
 public:
  bool SkipStateRestore(int, int, int) const override { return true; }
};

TEST(KvWritePathsTeeth, RecurrentStateNotRestoredOnTruncateIsCaught) {
  const std::string path = kShared + "/models/synth-qwen3next-d256.F32.gguf";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " is absent";
  Result<std::unique_ptr<Model>> model = LoadModel(path);
  ASSERT_TRUE(model.ok()) << model.error().message;
  ThreadPool pool(2);
  SessionConfig sc;
  sc.n_ctx = 64;
  sc.kv_type = KvType::kF16;
  const std::vector<int32_t> tokens = TestTokens(**model, 60);
  const int n_vocab = (*model)->hparams().n_vocab;
  const PathRun batch = RunPath(**model, sc, tokens, Path::kBatch, pool);
  EXPECT_EQ(Compare(batch, RunPath(**model, sc, tokens, Path::kVerifyWindows, pool), n_vocab), "");
  const StateLeftUnrestored fault;
  const PathRun faulty = RunPath(**model, sc, tokens, Path::kVerifyWindows, pool, &fault);
  EXPECT_NE(Compare(batch, faulty, n_vocab), "") << "a state left unrestored went unnoticed";
}

// An observer that changes nothing: the observer path itself (copied rows, one call per Write)
// must leave storage and logits bit-identical to no observer, on every path.
class CountingObserver : public WriteObserver {
 public:
  bool OnWrite(const KvWriteSpan& span, float*, float*) const override {
    ++calls;
    rows += span.n;
    return true;
  }
  mutable int calls = 0;
  mutable int rows = 0;
};

TEST(KvWritePathsTeeth, AnObserverThatChangesNothingChangesNothing) {
  const std::string path = kShared + "/models/stories260K.gguf";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " is absent";
  Result<std::unique_ptr<Model>> model = LoadModel(path);
  ASSERT_TRUE(model.ok());
  ThreadPool pool(2);
  SessionConfig sc;
  sc.n_ctx = 64;
  sc.kv_type = KvType::kQ4_0;
  sc.v_rounding = KvRounding::kStochastic;
  const std::vector<int32_t> tokens = TestTokens(**model, 60);
  const int n_vocab = (*model)->hparams().n_vocab;
  const PathRun batch = RunPath(**model, sc, tokens, Path::kBatch, pool);
  for (Path p : {Path::kBatch, Path::kTokenByToken}) {
    CountingObserver observer;
    const PathRun observed = RunPath(**model, sc, tokens, p, pool, &observer);
    EXPECT_EQ(Compare(batch, observed, n_vocab), "") << PathName(p);
    const int n_layer = (*model)->hparams().n_layer;
    EXPECT_EQ(observer.rows, n_layer * 60) << PathName(p);
    EXPECT_EQ(observer.calls, n_layer * (p == Path::kBatch ? 1 : 60)) << PathName(p);
  }
}

// The window: a Truncate that moves its boundary back (by up to the slack) and a rewrite, and a
// prompt batch longer than the slack (cut into pieces by the session), give the same bytes and
// logits as one batch; the window reads exact cells (a window over the whole text equals f16's
// logits to f16 precision, no window differs).
class KvWindowPaths : public testing::Test {
 protected:
  void SetUp() override {
    const std::string path = kShared + "/models/stories260K.gguf";
    if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " is absent";
    Result<std::unique_ptr<Model>> m = LoadModel(path);
    ASSERT_TRUE(m.ok());
    model_ = std::move(*m);
  }
  std::unique_ptr<Model> model_;
};

TEST_F(KvWindowPaths, TruncatesThatMoveTheBoundaryBackRewriteTheSameBytes) {
  ThreadPool pool(2);
  const std::vector<int32_t> tokens = TestTokens(*model_, 150);
  const int n_vocab = model_->hparams().n_vocab;
  for (KvType t : {KvType::kQ4_0, KvType::kK8V4}) {
    SessionConfig sc;
    sc.n_ctx = 160;
    sc.kv_type = t;
    sc.kv_window = 20;
    const PathRun batch = RunPath(*model_, sc, tokens, Path::kBatch, pool);
    // Write 100 cells, write 50 wrong ones, cut back 50 + d (d up to the slack less 50, so the
    // boundary moves back across cells that had left the window), then rewrite the rest.
    for (int back : {1, 7, 14}) {
      Session s(*model_, sc, pool);
      PathRun run;
      run.logits.resize(tokens.size() * n_vocab);
      std::vector<int32_t> wrong(tokens.begin() + 100, tokens.end());
      for (int32_t& id : wrong) id = (id + 3) % n_vocab;
      ASSERT_TRUE(s.Eval(std::vector<int32_t>(tokens.begin(), tokens.begin() + 100), true).ok());
      ASSERT_TRUE(s.Eval(wrong, true).ok());
      s.Truncate(100 - back);
      Result<const float*> r =
          s.Eval(std::vector<int32_t>(tokens.begin() + 100 - back, tokens.end()), true);
      ASSERT_TRUE(r.ok());
      std::memcpy(run.logits.data() + static_cast<size_t>(100 - back) * n_vocab, *r,
                  sizeof(float) * (50 + back) * n_vocab);
      std::memcpy(run.logits.data(), batch.logits.data(), sizeof(float) * (100 - back) * n_vocab);
      run.storage = KvStorageBytes(s.cache(), 0);
      EXPECT_EQ(Compare(batch, run, n_vocab), "") << KvTypeName(t) << " back " << back;
    }
  }
}

// A cut further back than the slack cannot keep the window exact: nothing is kept (the
// caller evaluates again), so no kept prefix ever reads encoded cells where a fresh run reads
// exact ones. CopyPrefix follows the same rule.
TEST_F(KvWindowPaths, CutsBeyondTheSlackKeepNothing) {
  ThreadPool pool(2);
  const std::vector<int32_t> tokens = TestTokens(*model_, 150);
  SessionConfig sc;
  sc.n_ctx = 160;
  sc.n_seq = 2;
  sc.kv_type = KvType::kK8V4;
  sc.kv_window = 20;
  Session s(*model_, sc, pool);
  ASSERT_TRUE(s.Eval(tokens, false).ok());
  s.CopyPrefix(0, 1, 150 - kKvWindowSlack);
  EXPECT_EQ(s.n_past(1), 150 - kKvWindowSlack);
  s.CopyPrefix(0, 1, 149 - kKvWindowSlack);
  EXPECT_EQ(s.n_past(1), 0);
  s.Truncate(0, 150 - kKvWindowSlack);
  EXPECT_EQ(s.n_past(0), 150 - kKvWindowSlack);
  ASSERT_TRUE(
      s.Eval(std::vector<int32_t>(tokens.begin() + 150 - kKvWindowSlack, tokens.end()), false)
          .ok());
  s.Truncate(0, 110);  // 40 back, within the slack
  EXPECT_EQ(s.n_past(0), 110);
  s.Truncate(0, 20);  // 90 back
  EXPECT_EQ(s.n_past(0), 0);
  sc.kv_window = 0;
  Session plain(*model_, sc, pool);
  ASSERT_TRUE(plain.Eval(tokens, false).ok());
  plain.Truncate(0, 20);
  EXPECT_EQ(plain.n_past(0), 20);
}

TEST_F(KvWindowPaths, AWindowOverTheWholeTextReadsExactCells) {
  ThreadPool pool(2);
  const std::vector<int32_t> tokens = TestTokens(*model_, 150);
  const int n_vocab = model_->hparams().n_vocab;
  SessionConfig sc;
  sc.n_ctx = 160;
  sc.kv_type = KvType::kF16;
  const PathRun f16 = RunPath(*model_, sc, tokens, Path::kBatch, pool);
  auto max_diff = [&](const PathRun& a) {
    double d = 0;
    for (size_t i = 0; i < a.logits.size(); ++i)
      d = std::max(d, std::fabs(double(a.logits[i]) - f16.logits[i]));
    return d;
  };
  sc.kv_type = KvType::kQ4_0;
  sc.kv_window = 0;
  const double none = max_diff(RunPath(*model_, sc, tokens, Path::kBatch, pool));
  sc.kv_window = 160;
  const double whole = max_diff(RunPath(*model_, sc, tokens, Path::kTokenByToken, pool));
  EXPECT_LT(whole, 0.05) << "a whole-text window must read f16 cells";
  EXPECT_GT(none, 10 * whole);
  (void)n_vocab;
}

// Planted faults of the window: on single-token writes a cell's encoded form is never stored
// (only its exact copy, so it reads wrong once it leaves the window), or it is encoded twice.
// Token-by-token writes against one batch must tell both apart.
class WindowFault : public WriteObserver {
 public:
  explicit WindowFault(bool skip) : skip_(skip) {}
  bool SkipWindowedEncode(const KvWriteSpan&) const override { return skip_; }
  bool EncodeWindowedTwice(const KvWriteSpan&) const override { return !skip_; }

 private:
  bool skip_;
};

TEST(KvWindowTeeth, CellsEncodedNotAtAllOrTwiceAreCaught) {
  const std::string path = kShared + "/models/stories260K.gguf";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " is absent";
  Result<std::unique_ptr<Model>> model = LoadModel(path);
  ASSERT_TRUE(model.ok());
  ThreadPool pool(2);
  const std::vector<int32_t> tokens = TestTokens(**model, 60);
  const int n_vocab = (*model)->hparams().n_vocab;
  for (KvType t : {KvType::kQ4_0, KvType::kK8V4}) {
    SessionConfig sc;
    sc.n_ctx = 64;
    sc.kv_type = t;
    sc.kv_window = 8;
    const PathRun batch = RunPath(**model, sc, tokens, Path::kBatch, pool);
    EXPECT_EQ(Compare(batch, RunPath(**model, sc, tokens, Path::kTokenByToken, pool), n_vocab), "");
    for (bool skip : {true, false}) {
      const WindowFault fault(skip);
      const PathRun faulty = RunPath(**model, sc, tokens, Path::kTokenByToken, pool, &fault);
      EXPECT_NE(Compare(batch, faulty, n_vocab), "")
          << KvTypeName(t) << (skip ? " skipped" : " twice") << " encode went unnoticed";
    }
  }
}

// The gemma3 fixture's sliding-window ring (window 16, ring 128 of n_ctx 160).
class SlidingWindowRing : public testing::Test {
 protected:
  void SetUp() override {
    Result<std::unique_ptr<Model>> m = LoadModel(kGemma3);
    ASSERT_TRUE(m.ok()) << m.error().message;
    model_ = std::move(*m);
    sc_.n_ctx = 160;
    sc_.n_seq = 2;
  }
  std::unique_ptr<Model> model_;
  SessionConfig sc_;
};

// Several turns of the ring (500 tokens, ring 128 of n_ctx 512): in every mode, token by token
// and in random chunks through the ring equal one batch with every cell kept, bit for bit.
TEST_F(SlidingWindowRing, SeveralTurnsEqualEveryCellKept) {
  ThreadPool pool(2);
  const std::vector<int32_t> tokens = TestTokens(*model_, 500);
  const int n_vocab = model_->hparams().n_vocab;
  for (const KvMode& mode : kKvModes) {
    SessionConfig sc = sc_;
    sc.n_ctx = 512;
    sc.n_seq = 1;
    sc.kv_type = mode.type;
    sc.swa_full = true;
    const PathRun full = RunPath(*model_, sc, tokens, Path::kBatch, pool);
    sc.swa_full = false;
    for (Path p : {Path::kTokenByToken, Path::kRandomChunks}) {
      const PathRun ring = RunPath(*model_, sc, tokens, p, pool);
      EXPECT_EQ(CompareWithFull(ring, full, n_vocab), "") << mode.name << " " << PathName(p);
      EXPECT_LT(ring.kv_bytes, full.kv_bytes);
    }
  }
}

// Speculative rollback across the window's edge: 100 cells, 50 wrong ones, a cut back by 50 +
// d (the cells the next query sees were overwritten by the wrong ones' turn of the ring or had
// left the window), the rest rewritten: the same bytes and logits as one batch, in a lossless,
// an anchored and a windowed lossy mode.
TEST_F(SlidingWindowRing, RollbackAcrossTheWindowEdgeRewritesTheSameBytes) {
  ThreadPool pool(2);
  const std::vector<int32_t> tokens = TestTokens(*model_, 150);
  const int n_vocab = model_->hparams().n_vocab;
  for (auto [t, window] :
       {std::pair{KvType::kF16, 0}, std::pair{KvType::kQ4_0, 0}, std::pair{KvType::kK8V4, 12}}) {
    SessionConfig sc = sc_;
    sc.n_seq = 1;
    sc.kv_type = t;
    sc.kv_window = window;
    const PathRun batch = RunPath(*model_, sc, tokens, Path::kBatch, pool);
    for (int back : {1, 7, 14}) {
      Session s(*model_, sc, pool);
      ASSERT_TRUE(s.cache().has_rings());
      PathRun run;
      run.logits = batch.logits;
      std::vector<int32_t> wrong(tokens.begin() + 100, tokens.end());
      for (int32_t& id : wrong) id = (id + 3) % n_vocab;
      ASSERT_TRUE(s.Eval(std::vector<int32_t>(tokens.begin(), tokens.begin() + 100), true).ok());
      ASSERT_TRUE(s.Eval(wrong, true).ok());
      s.Truncate(100 - back);
      ASSERT_EQ(s.n_past(), 100 - back);
      Result<const float*> r =
          s.Eval(std::vector<int32_t>(tokens.begin() + 100 - back, tokens.end()), true);
      ASSERT_TRUE(r.ok());
      std::memcpy(run.logits.data() + static_cast<size_t>(100 - back) * n_vocab, *r,
                  sizeof(float) * (50 + back) * n_vocab);
      run.storage = KvStorageBytes(s.cache(), 0);
      EXPECT_EQ(Compare(batch, run, n_vocab), "") << KvTypeName(t) << " back " << back;
    }
  }
}

// A prefix whose window the ring no longer holds is not kept (Truncate, CopyPrefix and prompt
// reuse keep nothing and the caller evaluates again), and what is evaluated again equals a
// fresh run; with every cell kept (--swa-full) the same prefixes are kept.
TEST_F(SlidingWindowRing, PrefixesTheRingNoLongerHoldsFallBack) {
  ThreadPool pool(2);
  const std::vector<int32_t> tokens = TestTokens(*model_, 150);
  const int n_vocab = model_->hparams().n_vocab;
  Session s(*model_, sc_, pool);
  ASSERT_TRUE(s.cache().has_rings());
  const int cells = s.cache().ring_cells();
  ASSERT_EQ(cells, 128);
  ASSERT_TRUE(s.Eval(tokens, false).ok());
  // The ring holds [150 - 128, 150): the query at n reads n - 15 .. n - 1.
  const int lowest = 150 - cells + 15;
  s.CopyPrefix(0, 1, lowest);
  EXPECT_EQ(s.n_past(1), lowest);
  s.CopyPrefix(0, 1, lowest - 1);
  EXPECT_EQ(s.n_past(1), 0);
  s.CopyPrefix(0, 1, 10);  // within the first window, whose cells were overwritten
  EXPECT_EQ(s.n_past(1), 0);
  // Prompt reuse (the CLI's and the server's): a prompt sharing 30 tokens keeps nothing, and the
  // re-evaluated prompt's logits equal a fresh session's.
  std::vector<int32_t> prompt(tokens.begin(), tokens.begin() + 30);
  prompt.push_back((tokens[30] + 1) % n_vocab);
  EXPECT_EQ(ReusePrefix(s, 0, prompt), 0);
  Result<const float*> again = s.Eval(prompt, true);
  ASSERT_TRUE(again.ok());
  std::vector<float> reused(*again, *again + prompt.size() * n_vocab);
  Session fresh(*model_, sc_, pool);
  Result<const float*> ref = fresh.Eval(prompt, true);
  ASSERT_TRUE(ref.ok());
  EXPECT_EQ(std::memcmp(reused.data(), *ref, reused.size() * sizeof(float)), 0);
  // Every cell kept: the same cuts keep what they ask.
  SessionConfig full = sc_;
  full.swa_full = true;
  Session f(*model_, full, pool);
  EXPECT_FALSE(f.cache().has_rings());
  ASSERT_TRUE(f.Eval(tokens, false).ok());
  f.CopyPrefix(0, 1, 10);
  EXPECT_EQ(f.n_past(1), 10);
  EXPECT_EQ(ReusePrefix(f, 0, prompt), 30);
}

}  // namespace
}  // namespace lamina
