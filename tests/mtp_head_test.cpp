// The shipped model's multi-token-prediction head (models/lamina-counter-mtp.gguf, read beside
// models/lamina-counter.gguf by LoadMtpHead): greedy `--spec mtp` decoding gives plain greedy
// decoding's ids and final KV bytes in every KV mode, over a quarter of its drafts are accepted,
// and a malformed head file (wrong width, missing key or tensor, wrong shape) is refused with an
// error naming the key or tensor, by the loader and by `lamina run --spec mtp`.
// Skips when the model or its head is absent.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <map>

#include "engine/generate.h"
#include "gguf/gguf.h"
#include "kv_storage.h"
#include "mtp_harness.h"
#include "process_util.h"
#include "runtime/sampler.h"
#include "runtime/session.h"
#include "spec/drafter.h"

namespace lamina {
namespace {

namespace fs = std::filesystem;
const std::string kModel = std::string(LAMINA_SOURCE_DIR) + "/models/lamina-counter.gguf";
const std::string kHead = std::string(LAMINA_SOURCE_DIR) + "/models/lamina-counter-mtp.gguf";

#define REQUIRE_HEAD()                           \
  if (!fs::exists(kModel) || !fs::exists(kHead)) \
  GTEST_SKIP() << "no shipped model or MTP head (" << kHead << ")"

std::unique_ptr<Model> LoadWithHead() {
  Result<std::unique_ptr<Model>> m = LoadModel(kModel);
  EXPECT_TRUE(m.ok()) << m.error().message;
  if (!m.ok()) return nullptr;
  Status st = LoadMtpHead(**m, kHead);
  EXPECT_TRUE(st.ok()) << st.error().message;
  return st.ok() ? std::move(*m) : nullptr;
}

std::vector<int32_t> ChatPrompt(const Model& m, const std::string& user) {
  return m.tokenizer().Encode("<|im_start|>user\n" + user + "<|im_end|>\n<|im_start|>assistant\n",
                              true, true);
}

GenerateOptions Greedy(int n) {
  GenerateOptions o;
  o.params.sampler.temperature = 0.0f;
  o.params.n_predict = n;
  return o;
}

TEST(MtpHead, LoadsAsAOneLayerBlockAndLeavesTheTrunkAlone) {
  REQUIRE_HEAD();
  Result<std::unique_ptr<Model>> plain = LoadModel(kModel);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ((*plain)->mtp(), nullptr);
  std::unique_ptr<Model> m = LoadWithHead();
  ASSERT_NE(m, nullptr);
  ASSERT_NE(m->mtp(), nullptr);
  EXPECT_EQ(m->mtp()->hparams().n_layer, 1);
  EXPECT_EQ(m->mtp()->hparams().n_embd, m->hparams().n_embd);
  EXPECT_EQ(m->WeightBytesPerToken(), (*plain)->WeightBytesPerToken());
  Status again = LoadMtpHead(*m, kHead);
  ASSERT_FALSE(again.ok());
  EXPECT_NE(again.error().message.find("already has an MTP head"), std::string::npos);
}

// Greedy --spec mtp with the shipped head: plain greedy's ids and the target's KV bytes, in
// every KV mode (the head's cache in the same mode), at draft lengths 1 and 4.
TEST(MtpHead, GreedyAndKvBytesEqualPlainGreedyInEveryKvMode) {
  REQUIRE_HEAD();
  std::unique_ptr<Model> m = LoadWithHead();
  ASSERT_NE(m, nullptr);
  const Model& model = *m;
  const std::vector<MtpCase> cases = {
      {ChatPrompt(model, "Count from 37 to 61, one number per line."), Greedy(48)},
      {ChatPrompt(model, "Write a JSON object with the fields \"name\" = \"Alice\", \"age\" = 34."),
       Greedy(48)}};
  const spec::SpecStats total = CheckMtpGreedyEqualsPlain(model, cases, 256);
  EXPECT_GT(total.drafted, total.verify_steps);
  // A trained head: more than a quarter of its drafts, every one proposed (p_min 0), chained up
  // to four, are the model's next tokens (the shipped head: 330 of 912).
  EXPECT_GT(total.accepted, total.drafted / 4);
  std::printf("mtp head: drafted %lld, accepted %lld over %lld verify steps\n",
              static_cast<long long>(total.drafted), static_cast<long long>(total.accepted),
              static_cast<long long>(total.verify_steps));
}

// After plain steps the head catches up with every position it missed in one batched pass at
// the next draft, reported as catch-up (cells, seconds) for the cost model, and drafts what a
// head caught up from scratch drafts; a probe before it skips the catch-up and leaves no cell.
TEST(MtpHead, ResumingCatchesUpInOneBatchedPass) {
  REQUIRE_HEAD();
  std::unique_ptr<Model> m = LoadWithHead();
  ASSERT_NE(m, nullptr);
  const int n_vocab = m->hparams().n_vocab;
  ThreadPool pool(2);
  SessionConfig sc;
  sc.n_ctx = 256;
  std::vector<int32_t> history = ChatPrompt(*m, "Count from 1 to 20, one number per line.");
  const int n_prompt = static_cast<int>(history.size());
  Session target(*m, sc, pool);
  spec::MtpDrafter resumed(target, 0, sc, pool);
  Result<const float*> r = target.Eval(history, false);
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(resumed.Prepare(history).ok());
  constexpr int kPlain = 12;  // greedy steps the head does not see
  history.push_back(ArgMax(*r, n_vocab));
  for (int i = 0; i < kPlain; ++i) {
    r = target.Eval(&history.back(), 1, false);
    ASSERT_TRUE(r.ok());
    history.push_back(ArgMax(*r, n_vocab));
  }
  std::vector<int32_t> draft;
  // A probe skips the catch-up: one pass in the next free cell, dropped again.
  const int held = resumed.session().n_past();
  ASSERT_TRUE(resumed.Probe(history, &draft).ok());
  EXPECT_LE(draft.size(), 1u);
  EXPECT_EQ(resumed.last_catch_up().cells, 0);
  EXPECT_EQ(resumed.last_catch_up().skipped, kPlain);
  EXPECT_EQ(resumed.session().n_past(), held);
  ASSERT_TRUE(resumed.Draft(history, 3, &draft).ok());
  EXPECT_EQ(resumed.last_catch_up().cells, kPlain);
  EXPECT_GT(resumed.last_catch_up().seconds, 0.0);
  EXPECT_FALSE(draft.empty());
  // The same history evaluated in one go, the head caught up from scratch.
  Session fresh_target(*m, sc, pool);
  spec::MtpDrafter fresh(fresh_target, 0, sc, pool);
  ASSERT_TRUE(fresh_target.Eval(history.data(), static_cast<int>(history.size()) - 1, false).ok());
  std::vector<int32_t> want;
  ASSERT_TRUE(fresh.Draft(history, 3, &want).ok());
  EXPECT_EQ(fresh.last_catch_up().cells, n_prompt + kPlain);
  EXPECT_EQ(draft, want);
  // Drafting again right away: nothing to catch up but the accepted tokens.
  ASSERT_TRUE(resumed.Draft(history, 3, &draft).ok());
  EXPECT_EQ(resumed.last_catch_up().cells, 0);
  // A probe with nothing missed is a one-token draft.
  std::vector<int32_t> probe;
  ASSERT_TRUE(resumed.Probe(history, &probe).ok());
  EXPECT_EQ(resumed.last_catch_up().skipped, 0);
  EXPECT_EQ(probe,
            std::vector<int32_t>(want.begin(), want.begin() + std::min<size_t>(1, want.size())));
}

// The target's kept hidden states: with the whole context's store allocated up front, a decode
// step writes its row in place (the store never moves, so no step touches a fresh page or
// copies the store), and the rows equal those of a store grown on demand, of a batch of two
// sequences (copied from the batch's rows) and of a prefix copied to another sequence.
TEST(MtpHead, KeptHiddenRowsAreWrittenInPlaceAndEqualEveryOtherPath) {
  REQUIRE_HEAD();
  std::unique_ptr<Model> m = LoadWithHead();
  ASSERT_NE(m, nullptr);
  const int n_vocab = m->hparams().n_vocab;
  const size_t d = m->hparams().n_embd;
  ThreadPool pool(2);
  SessionConfig sc;
  sc.n_ctx = 128;
  sc.n_seq = 2;
  Session whole(*m, sc, pool), grown(*m, sc, pool), both(*m, sc, pool);
  whole.KeepHidden();
  grown.KeepHidden(/*whole_context=*/false);
  both.KeepHidden();
  std::vector<int32_t> history = ChatPrompt(*m, "Count from 1 to 20, one number per line.");
  const int n_prompt = static_cast<int>(history.size());
  Result<const float*> r = whole.Eval(history, false);
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(grown.Eval(history, false).ok());
  const float* store = whole.Hidden(0, 0);
  history.push_back(ArgMax(*r, n_vocab));
  for (int i = 0; i < 40; ++i) {
    r = whole.Eval(&history.back(), 1, false);
    ASSERT_TRUE(r.ok());
    ASSERT_TRUE(grown.Eval(&history.back(), 1, false).ok());
    history.push_back(ArgMax(*r, n_vocab));
  }
  const int n = static_cast<int>(history.size()) - 1;  // positions evaluated
  ASSERT_EQ(whole.n_hidden(0), n);
  ASSERT_EQ(grown.n_hidden(0), n);
  EXPECT_EQ(whole.Hidden(0, 0), store);  // never reallocated
  for (int p = 0; p < n; ++p) {
    ASSERT_EQ(std::memcmp(whole.Hidden(0, p), grown.Hidden(0, p), d * sizeof(float)), 0) << p;
  }
  // The prompt for sequence 1 and the first token for sequence 0 in one batch: the batch's rows
  // are copied to each sequence's store.
  SequenceBatch b;
  for (int p = 0; p < n_prompt; ++p) b.Add(history[p], 1, p, p == n_prompt - 1);
  ASSERT_TRUE(both.Eval(history.data(), 1, false).ok());  // sequence 0, position 0
  b.Add(history[1], 0, 1, true);
  ASSERT_TRUE(both.Decode(b).ok());
  ASSERT_EQ(both.n_hidden(1), n_prompt);
  ASSERT_EQ(both.n_hidden(0), 2);
  for (int p = 0; p < n_prompt; ++p) {
    ASSERT_EQ(std::memcmp(both.Hidden(1, p), whole.Hidden(0, p), d * sizeof(float)), 0) << p;
  }
  EXPECT_EQ(std::memcmp(both.Hidden(0, 1), whole.Hidden(0, 1), d * sizeof(float)), 0);
  // A prefix copied over a longer one keeps the rows it copies.
  both.CopyPrefix(0, 1, 2);
  ASSERT_EQ(both.n_hidden(1), 2);
  EXPECT_EQ(std::memcmp(both.Hidden(1, 1), whole.Hidden(0, 1), d * sizeof(float)), 0);
}

// A copy of the head file with keys overwritten or removed and a tensor dropped or replaced by
// another tensor's data (name -> source name).
struct HeadEdit {
  std::map<std::string, uint32_t> set_u32;
  std::string drop_key;
  std::string drop_tensor;
  std::map<std::string, std::string> replace;
};

std::string WriteHead(const std::string& dst, const HeadEdit& e) {
  Result<std::unique_ptr<gguf::File>> f = gguf::File::Open(kHead);
  if (!f.ok()) return f.error().message;
  gguf::Writer w;
  for (const auto& [key, value] : (*f)->metadata()) {
    if (key == e.drop_key || e.set_u32.count(key)) continue;
    w.SetValue(key, value);
  }
  for (const auto& [key, v] : e.set_u32) w.SetU32(key, v);
  for (const gguf::TensorInfo& t : (*f)->tensors()) {
    if (t.name == e.drop_tensor) continue;
    const gguf::TensorInfo* src = &t;
    if (auto it = e.replace.find(t.name); it != e.replace.end()) src = (*f)->FindTensor(it->second);
    if (src == nullptr) return "no tensor to copy for " + t.name;
    w.AddTensor(t.name, src->type, std::vector<int64_t>(src->ne, src->ne + src->n_dims), src->data,
                src->n_bytes);
  }
  Status st = w.WriteFile(dst);
  return st.ok() ? "" : st.error().message;
}

class MtpHeadFiles : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("lamina_mtphead_" + std::to_string(getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(MtpHeadFiles, MalformedHeadsAreRefusedNamingTheKeyOrTensor) {
  REQUIRE_HEAD();
  const struct {
    const char* name;
    HeadEdit edit;
    const char* want;
  } cases[] = {
      {"width", {{{"llama.embedding_length", 256}}, "", "", {}}, "llama.embedding_length"},
      {"ffn", {{{"llama.feed_forward_length", 512}}, "", "", {}}, "llama.feed_forward_length"},
      {"blocks", {{{"llama.block_count", 5}}, "", "", {}}, "llama.block_count"},
      {"nextn", {{}, "llama.nextn_predict_layers", "", {}}, "llama.nextn_predict_layers"},
      {"eh_proj", {{}, "", "blk.5.nextn.eh_proj.weight", {}}, "blk.5.nextn.eh_proj.weight"},
      {"hnorm", {{}, "", "blk.5.nextn.hnorm.weight", {}}, "blk.5.nextn.hnorm.weight"},
      {"ffn_up", {{}, "", "blk.5.ffn_up.weight", {}}, "blk.5.ffn_up.weight"},
      {"shape",
       {{}, "", "", {{"blk.5.attn_q.weight", "blk.5.attn_k.weight"}}},
       "blk.5.attn_q.weight"},
  };
  for (const auto& c : cases) {
    const std::string path = (dir_ / (std::string(c.name) + ".gguf")).string();
    ASSERT_EQ(WriteHead(path, c.edit), "") << c.name;
    Result<std::unique_ptr<Model>> m = LoadModel(kModel);
    ASSERT_TRUE(m.ok());
    Status st = LoadMtpHead(**m, path);
    ASSERT_FALSE(st.ok()) << c.name;
    EXPECT_NE(st.error().message.find(c.want), std::string::npos)
        << c.name << ": " << st.error().message;
    EXPECT_EQ((*m)->mtp(), nullptr) << c.name;
  }
}

// `lamina run --spec mtp` finds <model>-mtp.gguf beside the model, and refuses a malformed one
// (exit 3) naming the tensor; without one it refuses the model.
TEST_F(MtpHeadFiles, RunFindsTheHeadBesideTheModelAndRefusesAMalformedOne) {
  REQUIRE_HEAD();
  const fs::path model = dir_ / "m.gguf";
  fs::create_symlink(kModel, model);
  const std::string run = std::string(LAMINA_BINARY) + " run -m " + model.string() +
                          " -p 'Count from 1 to 5, one number per line.' --chat -n 12 --temp 0 "
                          "-t 2 --spec mtp";
  testing_util::ProcessOutput none = testing_util::RunShell(run + " 2>&1");
  EXPECT_NE(none.code, 0);
  EXPECT_NE(none.out.find("no multi-token-prediction block"), std::string::npos) << none.out;
  fs::create_symlink(kHead, dir_ / "m-mtp.gguf");
  testing_util::ProcessOutput ok = testing_util::RunShell(run + " 2>&1");
  EXPECT_EQ(ok.code, 0) << ok.out;
  EXPECT_NE(ok.out.find("spec mtp"), std::string::npos) << ok.out;
  fs::remove(dir_ / "m-mtp.gguf");
  ASSERT_EQ(WriteHead((dir_ / "m-mtp.gguf").string(), {{}, "", "blk.5.nextn.eh_proj.weight", {}}),
            "");
  testing_util::ProcessOutput bad = testing_util::RunShell(run + " 2>&1");
  EXPECT_EQ(bad.code, 3) << bad.out;
  EXPECT_NE(bad.out.find("blk.5.nextn.eh_proj.weight"), std::string::npos) << bad.out;
}

}  // namespace
}  // namespace lamina
