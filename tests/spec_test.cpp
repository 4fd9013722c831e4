// Speculative decoding: at temperature 0 the emitted ids are plain greedy decoding's and the KV
// bytes after the run are the plain run's, for every drafter, KV mode, V rounding, --draft-max
// and prompt chunking; a verify window whose writes are skipped or a skipped Truncate is caught.
// Above temperature 0 the accept rule keeps the target distribution (chi-square tests, which a
// deliberately wrong rule fails). Vocabulary checks for draft models.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>

#include "engine/generate.h"
#include "kv_storage.h"
#include "model/model.h"
#include "probe/faults.h"
#include "runtime/sampler.h"
#include "spec/speculative.h"

namespace lamina {
namespace {

const std::string kShipped = std::string(LAMINA_SOURCE_DIR) + "/models/lamina-counter.gguf";
const std::string kShippedDraft =
    std::string(LAMINA_SOURCE_DIR) + "/models/lamina-counter-draft.gguf";
const std::string kStories = std::string(LAMINA_SHARED_DIR) + "/models/stories260K.gguf";

std::unique_ptr<Model> Load(const std::string& path) {
  Result<std::unique_ptr<Model>> m = LoadModel(path);
  LAMINA_CHECK(m.ok());
  return std::move(*m);
}

std::vector<std::vector<int32_t>> Prompts(const Model& m, bool chat) {
  std::vector<std::string> texts;
  if (chat) {
    for (const char* q : {"Count from 1 to 300, one number per line.",
                          "Repeat this list exactly, one item per line:\napple\nriver\nstone\n"
                          "cloud\napple\nriver\nlamp\nstone",
                          "Write a JSON object with the fields \"name\" = \"Alice\", \"age\" = 34.",
                          "Tell me a short story about a cat."}) {
      texts.push_back(std::string("<|im_start|>user\n") + q +
                      "<|im_end|>\n<|im_start|>assistant\n");
    }
  } else {
    texts = {"Once upon a time, there was a little girl named Lily.",
             "Tom had a small red boat. One day the wind was strong and Tom had a small",
             "The dog ran to the park. The dog ran to the",
             "Ben and Mia went to the shop. They saw a big cake."};
  }
  std::vector<std::vector<int32_t>> out;
  for (const std::string& t : texts) out.push_back(m.tokenizer().Encode(t, true, true));
  return out;
}

struct RunOutput {
  std::vector<int32_t> ids;
  int n_past = 0;
  std::vector<std::vector<uint8_t>> storage;  // [n_layer][bytes] of cells [0, n_past)
  std::vector<float> state;  // hybrid models: every recurrent layer's conv tail and delta state
  spec::SpecStats stats;
};

GenerateOptions Greedy(int n, int chunk) {
  GenerateOptions o;
  o.params.sampler.temperature = 0.0f;
  o.params.n_predict = n;
  o.params.ignore_eos = true;
  o.prompt_chunk = chunk;
  return o;
}

// drafter null: plain Generate.
RunOutput RunOne(const Model& m, const SessionConfig& sc, ThreadPool& pool,
                 const std::vector<int32_t>& prompt, const GenerateOptions& go,
                 spec::Drafter* drafter, const spec::SpecOptions& so = {}) {
  Session s(m, sc, pool);
  RunOutput out;
  Result<GenerateResult> r =
      drafter ? engine::GenerateSpeculative(s, 0, prompt, go, *drafter, so, &out.stats)
              : engine::Generate(s, 0, prompt, go);
  LAMINA_CHECK(r.ok());
  out.ids = r->tokens;
  out.n_past = s.n_past(0);
  out.storage = KvStorageBytes(s.cache(), 0, out.n_past);
  out.state = RecurrentStateFloats(s, 0);
  return out;
}

struct ModeCase {
  bool shipped;  // the shipped model (else stories260K)
  KvType type;
  KvRounding rounding;
};

std::string CaseName(const testing::TestParamInfo<ModeCase>& info) {
  return std::string(info.param.shipped ? "shipped" : "stories260K") + "_" +
         KvTypeName(info.param.type) + "_" + KvRoundingName(info.param.rounding);
}

std::vector<ModeCase> Cases() {
  std::vector<ModeCase> cases;
  for (bool shipped : {true, false}) {
    for (KvType t : {KvType::kF32, KvType::kF16, KvType::kInt8, KvType::kQ4_0, KvType::kK8V4}) {
      cases.push_back({shipped, t, KvRounding::kNearest});
      if (t != KvType::kF32 && t != KvType::kF16) {
        cases.push_back({shipped, t, KvRounding::kStochastic});
      }
    }
  }
  return cases;
}

class SpecGreedy : public testing::TestWithParam<ModeCase> {};

// Every drafter (prompt lookup; the model drafting for itself from a q4_0 cache, which mostly
// agrees and sometimes not; the shipped draft model for the shipped model) × --draft-max 1, 2,
// 4, 8 × four prompts (odd ones chunked by 7) × 64 tokens: the ids and the KV bytes of the
// plain greedy run.
TEST_P(SpecGreedy, IdsAndKvBytesEqualPlainGreedy) {
  const ModeCase& c = GetParam();
  const std::string path = c.shipped ? kShipped : kStories;
  if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " is absent";
  std::unique_ptr<Model> model = Load(path);
  std::unique_ptr<Model> shipped_draft;
  if (c.shipped && std::filesystem::exists(kShippedDraft)) shipped_draft = Load(kShippedDraft);
  ThreadPool pool(2);
  SessionConfig sc;
  sc.n_ctx = 256;
  sc.kv_type = c.type;
  sc.v_rounding = c.rounding;
  sc.kv_seed = 5;
  SessionConfig self_draft_sc;
  self_draft_sc.n_ctx = 256;
  self_draft_sc.kv_type = KvType::kQ4_0;
  spec::SpecOptions so;
  so.adaptive = false;  // every step drafts
  spec::SpecStats total;
  const std::vector<std::vector<int32_t>> prompts = Prompts(*model, c.shipped);
  for (size_t pi = 0; pi < prompts.size(); ++pi) {
    const GenerateOptions go = Greedy(64, pi % 2 ? 7 : 0);
    const RunOutput plain = RunOne(*model, sc, pool, prompts[pi], go, nullptr);
    ASSERT_EQ(plain.ids.size(), 64u);
    for (int draft_max : {1, 2, 4, 8}) {
      so.draft_max = draft_max;
      std::vector<std::unique_ptr<spec::Drafter>> drafters;
      drafters.push_back(std::make_unique<spec::LookupDrafter>(3));
      drafters.push_back(std::make_unique<spec::ModelDrafter>(*model, self_draft_sc, pool, 0.0f));
      if (shipped_draft) {
        drafters.push_back(
            std::make_unique<spec::ModelDrafter>(*shipped_draft, self_draft_sc, pool, 0.0f));
      }
      for (auto& d : drafters) {
        const RunOutput r = RunOne(*model, sc, pool, prompts[pi], go, d.get(), so);
        const std::string where = std::string(d->name()) + " draft_max " +
                                  std::to_string(draft_max) + " prompt " + std::to_string(pi);
        EXPECT_EQ(r.ids, plain.ids) << where;
        EXPECT_EQ(r.n_past, plain.n_past) << where;
        EXPECT_TRUE(r.storage == plain.storage) << where << ": KV bytes differ";
        total.Add(r.stats);
      }
    }
  }
  // The runs verified windows, accepted drafts and rejected some.
  EXPECT_GT(total.verify_steps, 100);
  EXPECT_GT(total.accepted, 100);
  EXPECT_LT(total.accepted, total.drafted);
}

INSTANTIATE_TEST_SUITE_P(AllModes, SpecGreedy, testing::ValuesIn(Cases()), CaseName);

// Speculative greedy on a hybrid target: rejected drafts roll the recurrent state back through
// its ring of states. Prompt lookup, the model drafting for itself (q4_0 cache, which nearly
// always agrees) and another file drafting for it (which often does not) × --draft-max 1, 4, 8
// × four prompts × 32 tokens, in the given KV modes with a ring of 32, and q4_0 with a ring of
// 4 (drafts capped at 3 so every rollback stays exact): ids, KV bytes and recurrent state of
// plain greedy.
void CheckHybridSpec(const std::string& path, const std::string& drafter_path,
                     const std::vector<KvType>& types) {
  if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " is absent";
  if (!std::filesystem::exists(drafter_path)) GTEST_SKIP() << drafter_path << " is absent";
  std::unique_ptr<Model> other = Load(drafter_path);
  std::unique_ptr<Model> model = Load(path);
  ThreadPool pool(2);
  SessionConfig self_draft_sc;
  self_draft_sc.n_ctx = 160;
  self_draft_sc.kv_type = KvType::kQ4_0;
  spec::SpecOptions so;
  so.adaptive = false;
  spec::SpecStats total;
  const std::vector<std::vector<int32_t>> prompts = Prompts(*model, /*chat=*/false);
  struct Mode {
    KvType type;
    int ring;
  };
  std::vector<Mode> modes;
  for (KvType t : types) modes.push_back({t, kRecurrentRingDefault});
  modes.push_back({KvType::kQ4_0, 4});
  for (const Mode& mode : modes) {
    SessionConfig sc;
    sc.n_ctx = 160;
    sc.kv_type = mode.type;
    sc.kv_seed = 5;
    sc.recurrent_ring = mode.ring;
    for (size_t pi = 0; pi < prompts.size(); ++pi) {
      const GenerateOptions go = Greedy(32, pi % 2 ? 7 : 0);
      const RunOutput plain = RunOne(*model, sc, pool, prompts[pi], go, nullptr);
      ASSERT_EQ(plain.ids.size(), 32u);
      ASSERT_FALSE(plain.state.empty());
      for (int draft_max : {1, 4, 8}) {
        so.draft_max = draft_max;
        spec::LookupDrafter lookup(3);
        spec::ModelDrafter self(*model, self_draft_sc, pool, 0.0f);
        spec::ModelDrafter foreign(*other, self_draft_sc, pool, 0.0f);
        for (spec::Drafter* d :
             {static_cast<spec::Drafter*>(&lookup), static_cast<spec::Drafter*>(&self),
              static_cast<spec::Drafter*>(&foreign)}) {
          const RunOutput r = RunOne(*model, sc, pool, prompts[pi], go, d, so);
          const std::string where = std::string(d->name()) + " " + KvTypeName(mode.type) +
                                    " ring " + std::to_string(mode.ring) + " draft_max " +
                                    std::to_string(draft_max) + " prompt " + std::to_string(pi);
          EXPECT_EQ(r.ids, plain.ids) << where;
          EXPECT_EQ(r.n_past, plain.n_past) << where;
          EXPECT_TRUE(r.storage == plain.storage) << where << ": KV bytes differ";
          EXPECT_TRUE(r.state == plain.state) << where << ": recurrent state differs";
          total.Add(r.stats);
        }
      }
    }
  }
  EXPECT_GT(total.verify_steps, 100);
  EXPECT_GT(total.accepted, 50);
  EXPECT_LT(total.accepted, total.drafted);
}

// qwen3next's F32 file, its Q4_K_M file drafting for it.
TEST(SpecGreedyHybrid, IdsKvBytesAndStateEqualPlainGreedy) {
  const std::string models = std::string(LAMINA_SHARED_DIR) + "/models/";
  CheckHybridSpec(models + "synth-qwen3next-d256.F32.gguf",
                  models + "synth-qwen3next-d256.Q4_K_M.gguf", {KvType::kF32, KvType::kK8V4});
}

// The repository's qwen35 fixture (tiled V heads, multi-section RoPE), the qwen35moe one (same
// vocabulary) drafting for it.
TEST(SpecGreedyHybrid, Qwen35IdsKvBytesAndStateEqualPlainGreedy) {
  const std::string models = std::string(LAMINA_SOURCE_DIR) + "/tests/fixtures/models/";
  CheckHybridSpec(models + "synth-qwen35-d128.Q8_0.gguf", models + "synth-qwen35moe-d128.Q8_0.gguf",
                  {KvType::kK8V4});
}

// The planted faults must be caught: a verify window's writes that never reach storage (the
// seed engine's bug) and rejected cells left in place (no Truncate).
class SpecFaults : public testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(kShipped)) GTEST_SKIP() << kShipped << " is absent";
    model_ = Load(kShipped);
    sc_.n_ctx = 256;
    draft_sc_.n_ctx = 256;
    draft_sc_.kv_type = KvType::kQ4_0;
    prompt_ = Prompts(*model_, true)[0];  // counting
  }
  std::unique_ptr<Model> model_;
  ThreadPool pool_{2};
  SessionConfig sc_, draft_sc_;
  std::vector<int32_t> prompt_;
};

TEST_F(SpecFaults, SkippedVerifyWritesAreCaught) {
  const GenerateOptions go = Greedy(64, 0);
  const RunOutput plain = RunOne(*model_, sc_, pool_, prompt_, go, nullptr);
  std::unique_ptr<WriteObserver> fault = probe::MakeFaultObserver(probe::Fault::kSkipVerifyWrites);
  SessionConfig faulty = sc_;
  faulty.write_observer = fault.get();
  // The fault alone does not touch plain decoding (one batch from position 0, then single tokens).
  EXPECT_EQ(RunOne(*model_, faulty, pool_, prompt_, go, nullptr).ids, plain.ids);
  spec::SpecOptions so;
  so.adaptive = false;
  so.draft_max = 4;
  spec::ModelDrafter drafter(*model_, draft_sc_, pool_, 0.0f);
  const RunOutput r = RunOne(*model_, faulty, pool_, prompt_, go, &drafter, so);
  EXPECT_TRUE(r.ids != plain.ids || r.storage != plain.storage);
  EXPECT_TRUE(r.storage != plain.storage);
}

// The planted fault: every Truncate to a prefix keeps the cells it would drop (the rejected
// drafts); a reset to 0 still clears the sequence.
class KeepRejectedCells : public WriteObserver {
 public:
  bool KeepOnTruncate(int, int, int n_keep) const override { return n_keep > 0; }
};

TEST_F(SpecFaults, SkippedTruncateIsCaught) {
  const GenerateOptions go = Greedy(64, 0);
  const RunOutput plain = RunOne(*model_, sc_, pool_, prompt_, go, nullptr);
  spec::SpecOptions so;
  so.adaptive = false;
  so.draft_max = 4;
  const KeepRejectedCells fault;
  SessionConfig faulty = sc_;
  faulty.write_observer = &fault;
  spec::LookupDrafter drafter(3);
  const RunOutput r = RunOne(*model_, faulty, pool_, prompt_, go, &drafter, so);
  EXPECT_GT(r.stats.drafted, r.stats.accepted);  // something was rejected
  EXPECT_TRUE(r.ids != plain.ids || r.n_past != plain.n_past);
}

// Pearson's chi-square of counts against expected counts, over bins expecting >= 5 (the rest
// pooled into one bin); returns (statistic, degrees of freedom).
std::pair<double, int> ChiSquare(const std::map<int32_t, double>& expected,
                                 const std::map<int32_t, int>& observed) {
  double stat = 0.0, pooled_e = 0.0, pooled_o = 0.0;
  int bins = 0;
  for (const auto& [id, e] : expected) {
    const auto it = observed.find(id);
    const double o = it == observed.end() ? 0.0 : it->second;
    if (e >= 5.0) {
      stat += (o - e) * (o - e) / e;
      ++bins;
    } else {
      pooled_e += e;
      pooled_o += o;
    }
  }
  for (const auto& [id, o] : observed) {
    if (!expected.count(id)) pooled_o += o;  // a token p does not allow: counts against
  }
  if (pooled_e > 0.0) {
    stat += (pooled_o - pooled_e) * (pooled_o - pooled_e) / std::max(pooled_e, 1.0);
    ++bins;
  } else if (pooled_o > 0.0) {
    stat += 1e9;
  }
  return {stat, bins - 1};
}

// A bound the statistic of a correct sampler exceeds with probability ~1e-6.
double ChiSquareBound(int df) { return df + 7.0 * std::sqrt(2.0 * df) + 10.0; }

// A deliberately wrong accept rule: the residual keeps the draft's mass (p, not p − q).
int32_t WrongAcceptRule(const std::vector<TokenProb>& p, int32_t draft, double u_accept,
                        double u_draw) {
  for (const TokenProb& t : p) {
    if (t.id == draft && u_accept < t.p) return draft;
  }
  double cum = 0.0;
  for (const TokenProb& t : p) {
    cum += t.p;
    if (u_draw < cum) return t.id;
  }
  return p.back().id;
}

class SpecSampling : public testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(kStories)) GTEST_SKIP() << kStories << " is absent";
    model_ = Load(kStories);
  }
  std::unique_ptr<Model> model_;
  ThreadPool pool_{2};
};

// The accept rule on the real next-token distribution of stories260K (temperature 0.9,
// top-k 24): fixed drafts of the likeliest, the third and an impossible token (q one-hot), and
// drafts drawn from a dense q. 40,000 draws each must follow p; the wrong rule must not.
TEST_F(SpecSampling, AcceptRuleKeepsTheTargetDistribution) {
  SessionConfig sc;
  sc.n_ctx = 64;
  Session s(*model_, sc, pool_);
  const std::vector<int32_t> prompt = Prompts(*model_, false)[0];
  Result<const float*> r = s.Eval(prompt, false);
  ASSERT_TRUE(r.ok());
  const int n_vocab = model_->hparams().n_vocab;
  SamplerConfig cfg;
  cfg.temperature = 0.9f;
  cfg.top_k = 24;
  cfg.top_p = 1.0f;
  cfg.min_p = 0.0f;
  cfg.seed = 11;
  Sampler sampler(cfg);
  const std::vector<TokenProb> p = sampler.Distribution(*r, n_vocab, prompt);
  ASSERT_EQ(p.size(), 24u);
  constexpr int kDraws = 40000;
  std::map<int32_t, double> expected;
  for (const TokenProb& t : p) expected[t.id] = t.p * kDraws;
  // q: uniform over the candidates ranked 2..13.
  std::vector<TokenProb> q;
  for (int i = 1; i <= 12; ++i) q.push_back({p[i].id, 1.0f / 12.0f});
  struct DraftCase {
    int32_t draft;
    const std::vector<TokenProb>* q;
  };
  int32_t impossible = 0;
  while (expected.count(impossible)) ++impossible;
  for (const DraftCase& dc : {DraftCase{p[0].id, nullptr}, DraftCase{p[2].id, nullptr},
                              DraftCase{impossible, nullptr}, DraftCase{-1, &q}}) {
    std::map<int32_t, int> observed;
    int accepted_count = 0;
    std::mt19937_64 draft_rng(17);
    std::uniform_int_distribution<int> pick(0, static_cast<int>(q.size()) - 1);
    for (int i = 0; i < kDraws; ++i) {
      bool accepted = false;
      // With q the draft is a draw from q (uniform here), as the rule assumes.
      const int32_t draft = dc.q ? q[pick(draft_rng)].id : dc.draft;
      ++observed[sampler.SampleWithDraft(*r, n_vocab, prompt, draft, dc.q, &accepted)];
      accepted_count += accepted;
    }
    const auto [stat, df] = ChiSquare(expected, observed);
    EXPECT_LT(stat, ChiSquareBound(df)) << "draft " << dc.draft << (dc.q ? " with q" : "");
    if (dc.draft == impossible) EXPECT_EQ(accepted_count, 0);
  }
  // The harness has the power to see a wrong rule.
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::map<int32_t, int> wrong;
  for (int i = 0; i < kDraws; ++i) {
    const double ua = u(rng), ud = u(rng);
    ++wrong[WrongAcceptRule(p, p[2].id, ua, ud)];
  }
  const auto [wrong_stat, wrong_df] = ChiSquare(expected, wrong);
  EXPECT_GT(wrong_stat, ChiSquareBound(wrong_df));
}

// End to end: the third generated token of stories260K at temperature 1 over 3,000 seeds,
// plain vs speculative (the model drafting for itself from a q4_0 cache, so windows are
// verified with the accept rule): a two-sample chi-square must not tell them apart.
TEST_F(SpecSampling, SpeculativeSamplingMatchesPlainSampling) {
  SessionConfig sc;
  sc.n_ctx = 64;
  SessionConfig dsc = sc;
  dsc.kv_type = KvType::kQ4_0;
  const std::vector<int32_t> prompt = Prompts(*model_, false)[2];
  GenerateOptions go;
  go.params.sampler.temperature = 1.0f;
  go.params.sampler.top_k = 0;
  go.params.sampler.top_p = 1.0f;
  go.params.sampler.min_p = 0.0f;
  go.params.n_predict = 3;
  go.params.ignore_eos = true;
  spec::SpecOptions so;
  so.adaptive = false;
  so.draft_max = 4;
  Session plain_s(*model_, sc, pool_), spec_s(*model_, sc, pool_);
  spec::ModelDrafter drafter(*model_, dsc, pool_, 0.0f);
  std::map<int32_t, int> plain, specd;
  constexpr int kSeeds = 3000;
  spec::SpecStats stats;
  for (int seed = 0; seed < kSeeds; ++seed) {
    go.params.sampler.seed = seed;
    Result<GenerateResult> a = engine::Generate(plain_s, 0, prompt, go);
    go.params.sampler.seed = seed + 1000003;  // independent draws
    Result<GenerateResult> b =
        engine::GenerateSpeculative(spec_s, 0, prompt, go, drafter, so, &stats);
    ASSERT_TRUE(a.ok() && b.ok());
    ++plain[a->tokens[2]];
    ++specd[b->tokens[2]];
  }
  EXPECT_GT(stats.accepted, kSeeds / 2);
  // Two-sample chi-square over tokens seen >= 10 times in total (the rest pooled).
  double stat = 0.0;
  int bins = 0;
  double pool_a = 0.0, pool_b = 0.0;
  std::map<int32_t, std::pair<int, int>> both;
  for (auto& [id, n] : plain) both[id].first = n;
  for (auto& [id, n] : specd) both[id].second = n;
  for (auto& [id, ab] : both) {
    if (ab.first + ab.second < 10) {
      pool_a += ab.first;
      pool_b += ab.second;
      continue;
    }
    const double e = (ab.first + ab.second) / 2.0;
    stat += (ab.first - e) * (ab.first - e) / e + (ab.second - e) * (ab.second - e) / e;
    ++bins;
  }
  if (pool_a + pool_b > 0) {
    const double e = (pool_a + pool_b) / 2.0;
    stat += (pool_a - e) * (pool_a - e) / e + (pool_b - e) * (pool_b - e) / e;
    ++bins;
  }
  EXPECT_LT(stat, ChiSquareBound(bins - 1)) << bins << " bins";
}

TEST(DraftCompatibility, MismatchedVocabulariesAreRefused) {
  if (!std::filesystem::exists(kShipped) || !std::filesystem::exists(kStories)) {
    GTEST_SKIP() << "needs the shipped model and stories260K";
  }
  std::unique_ptr<Model> a = Load(kShipped), b = Load(kStories);
  EXPECT_TRUE(spec::CheckDraftCompatible(*a, *a).ok());
  Status s = spec::CheckDraftCompatible(*a, *b);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("cannot draft for the target"), std::string::npos);
}

TEST(LookupDrafter, DraftsWhatFollowedTheLongestMatch) {
  spec::LookupDrafter d(2);
  std::vector<int32_t> draft;
  // "2 3" occurs twice; "1 2 3" matches longer at the first place.
  ASSERT_TRUE(d.Draft({1, 2, 3, 4, 5, 9, 2, 3, 7, 1, 2, 3}, 3, &draft).ok());
  EXPECT_EQ(draft, (std::vector<int32_t>{4, 5, 9}));
  // Equal matches: the most recent.
  ASSERT_TRUE(d.Draft({2, 3, 4, 2, 3, 7, 2, 3}, 2, &draft).ok());
  EXPECT_EQ(draft, (std::vector<int32_t>{7, 2}));
  ASSERT_TRUE(d.Draft({1, 2, 3, 1, 2}, 8, &draft).ok());
  EXPECT_EQ(draft, (std::vector<int32_t>{3, 1, 2}));
  ASSERT_TRUE(d.Draft({5, 6, 7}, 4, &draft).ok());
  EXPECT_TRUE(draft.empty());
  ASSERT_TRUE(d.Draft({5, 6, 7, 6}, 4, &draft).ok());  // a 1-token match is below ngram_min
  EXPECT_TRUE(draft.empty());
}

}  // namespace
}  // namespace lamina
