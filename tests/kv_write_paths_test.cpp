// Write-path equivalence: the same token stream fed as one prompt batch, token by token, in
// random chunks, and as speculative verify windows (a random suffix rejected, truncated and
// rewritten) must leave byte-identical cache storage and bit-identical logits, in every KV mode
// and V rounding. A planted fault (one path's writes never reach storage) must be caught.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <random>

#include "model/model.h"
#include "runtime/session.h"

namespace lamina {
namespace {

const std::string kShared = LAMINA_SHARED_DIR;

struct PathRun {
  std::vector<float> logits;                   // [n_tokens, n_vocab], position p predicts p+1
  std::vector<std::vector<uint8_t>> storage;   // per layer: K bytes then V bytes
};

enum class Path { kBatch, kTokenByToken, kRandomChunks, kVerifyWindows };

const char* PathName(Path p) {
  switch (p) {
    case Path::kBatch: return "batch";
    case Path::kTokenByToken: return "token-by-token";
    case Path::kRandomChunks: return "random-chunks";
    case Path::kVerifyWindows: return "verify-windows";
  }
  return "?";
}

PathRun RunPath(const Model& model, const SessionConfig& sc, const std::vector<int32_t>& tokens,
                Path path, KvCache::Fault fault, ThreadPool& pool) {
  const int n_vocab = model.hparams().n_vocab;
  Session s(model, sc, pool);
  s.mutable_cache().InjectFaultForTesting(fault);
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
      case Path::kBatch: take = n; break;
      case Path::kTokenByToken: take = 1; break;
      case Path::kRandomChunks: take = std::uniform_int_distribution<int>(1, 37)(rng); break;
      case Path::kVerifyWindows: {
        // A window of w tokens of which the first `accept` are right; the rest is a wrong
        // draft that is written, rejected (truncated) and later rewritten with the right ones.
        const int w = std::min(n - pos, std::uniform_int_distribution<int>(2, 8)(rng));
        const int accept = std::uniform_int_distribution<int>(1, w)(rng);
        std::vector<int32_t> window(tokens.begin() + pos, tokens.begin() + pos + w);
        for (int i = accept; i < w; ++i) window[i] = (window[i] + 1 + i) % n_vocab;
        eval_keep(pos, window, accept);
        s.Truncate(pos + accept);
        pos += accept;
        continue;
      }
    }
    take = std::min(take, n - pos);
    eval_keep(pos, std::vector<int32_t>(tokens.begin() + pos, tokens.begin() + pos + take), take);
    pos += take;
  }
  const KvCache& c = s.cache();
  for (int l = 0; l < c.config().n_layer; ++l) {
    std::vector<uint8_t> bytes(c.KStorage(l, 0), c.KStorage(l, 0) + c.k_row_bytes() * c.config().n_ctx);
    bytes.insert(bytes.end(), c.VStorage(l, 0), c.VStorage(l, 0) + c.v_row_bytes() * c.config().n_ctx);
    if (c.k_anchored()) {  // anchored keys: the per-cell flags and each head's anchor too
      for (int h = 0; h < c.config().n_kv_heads; ++h) {
        const uint8_t* flags = c.KAnchorFlags(l, 0, h);
        bytes.insert(bytes.end(), flags, flags + c.config().n_ctx);
        const auto* anchor = reinterpret_cast<const uint8_t*>(c.KAnchor(l, 0, h));
        bytes.insert(bytes.end(), anchor, anchor + sizeof(float) * c.config().head_dim);
      }
    }
    run.storage.push_back(std::move(bytes));
  }
  return run;
}

// "" when equal, else where the first difference is.
std::string Compare(const PathRun& a, const PathRun& b, int n_vocab) {
  for (size_t l = 0; l < a.storage.size(); ++l) {
    if (a.storage[l] != b.storage[l]) {
      size_t i = 0;
      while (a.storage[l][i] == b.storage[l][i]) ++i;
      return "cache storage differs in layer " + std::to_string(l) + " at byte " + std::to_string(i);
    }
  }
  if (std::memcmp(a.logits.data(), b.logits.data(), a.logits.size() * sizeof(float)) != 0) {
    size_t i = 0;
    while (a.logits[i] == b.logits[i]) ++i;
    return "logits differ at position " + std::to_string(i / n_vocab);
  }
  return "";
}

struct ModeCase {
  std::string model;
  KvType type;
  KvRounding rounding;
};

std::string ModeCaseName(const testing::TestParamInfo<ModeCase>& info) {
  std::string m = std::filesystem::path(info.param.model).stem().string();
  for (char& ch : m) {
    if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
  }
  return m + "_" + KvTypeName(info.param.type) + "_" + KvRoundingName(info.param.rounding);
}

std::vector<ModeCase> Cases() {
  std::vector<ModeCase> cases;
  for (const char* m : {"stories260K.gguf", "synth-llama-kq.F32.gguf"}) {
    for (KvType t : {KvType::kF32, KvType::kF16, KvType::kInt8, KvType::kQ4_0, KvType::kK8V4}) {
      cases.push_back({m, t, KvRounding::kNearest});
      if (t != KvType::kF32 && t != KvType::kF16) cases.push_back({m, t, KvRounding::kStochastic});
    }
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

class KvWritePaths : public testing::TestWithParam<ModeCase> {};

TEST_P(KvWritePaths, AllPathsGiveIdenticalBytesAndLogits) {
  const std::string path = kShared + "/models/" + GetParam().model;
  if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " is absent";
  Result<std::unique_ptr<Model>> model = LoadModel(path);
  ASSERT_TRUE(model.ok()) << model.error().message;
  ThreadPool pool(2);
  SessionConfig sc;
  sc.n_ctx = 160;
  sc.kv_type = GetParam().type;
  sc.v_rounding = GetParam().rounding;
  sc.kv_seed = 99;
  const std::vector<int32_t> tokens = TestTokens(**model, 150);
  const int n_vocab = (*model)->hparams().n_vocab;
  const PathRun batch = RunPath(**model, sc, tokens, Path::kBatch, KvCache::Fault::kNone, pool);
  for (Path p : {Path::kTokenByToken, Path::kRandomChunks, Path::kVerifyWindows}) {
    const PathRun other = RunPath(**model, sc, tokens, p, KvCache::Fault::kNone, pool);
    EXPECT_EQ(Compare(batch, other, n_vocab), "") << "path " << PathName(p) << " vs batch";
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, KvWritePaths, testing::ValuesIn(Cases()), ModeCaseName);

// The planted faults: single-token writes skipped (the real-world bug) or corrupted. The
// comparison must catch both, in a quantized mode.
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
  const PathRun batch = RunPath(**model, sc, tokens, Path::kBatch, KvCache::Fault::kNone, pool);
  for (KvCache::Fault f : {KvCache::Fault::kSkipSingleToken, KvCache::Fault::kCorruptSingleToken}) {
    const PathRun faulty = RunPath(**model, sc, tokens, Path::kTokenByToken, f, pool);
    EXPECT_NE(Compare(batch, faulty, n_vocab), "") << "a planted fault went unnoticed";
  }
}

}  // namespace
}  // namespace lamina
