// qwen35 / qwen35moe (the hybrid in the Qwen3.5 file layout) unit tests: interleaved
// multi-section RoPE against its rule, the layer pattern and shapes read from the repository
// fixtures, a file carrying a multi-token-prediction block loading with the trunk's logits
// unchanged, and one clear error per malformed file.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <map>

#include "gguf/gguf.h"
#include "kernels/ops.h"
#include "runtime/session.h"

namespace lamina {
namespace {

namespace fs = std::filesystem;
const std::string kModels = std::string(LAMINA_SOURCE_DIR) + "/tests/fixtures/models/";
const std::string kDense = kModels + "synth-qwen35-d128.Q8_0.gguf";
const std::string kMoe = kModels + "synth-qwen35moe-d128.Q8_0.gguf";

// ---------------------------------------------------------------------------------------------
// RoPE sections.

TEST(Qwen35Rope, SectionsCoveringEveryPairAreNeox) {
  RopeParams neox;
  neox.n_rot = 64;
  neox.freq_base = 1e7f;
  neox.style = RopeStyle::kNeox;
  RopeParams mrope = neox;
  const int published[4] = {11, 11, 10, 0};  // Qwen3.5's, over 32 pairs
  std::copy(published, published + 4, mrope.sections);
  for (int i = 0; i < 32; ++i) EXPECT_TRUE(RopeTextPair(mrope, i)) << i;
  std::vector<float> a(64), b(64);  // [n_rot/2][2]
  for (int64_t pos : {0, 1, 7, 1000, 262143}) {
    RopeCache(neox, pos, a.data());
    RopeCache(mrope, pos, b.data());
    EXPECT_EQ(a, b) << pos;
  }
}

TEST(Qwen35Rope, PairsOutsideTheTextSectionsTurnByZero) {
  RopeParams p;
  p.n_rot = 16;
  p.freq_base = 1e6f;
  p.style = RopeStyle::kNeox;
  const int sec[4] = {2, 2, 1, 1};  // 6 sectors: 0 t, 1 h, 2 w, 3 t, 4 h, 5 e
  std::copy(sec, sec + 4, p.sections);
  const bool want[8] = {true, true, true, true, true, false, true, true};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(RopeTextPair(p, i), want[i]) << i;
  RopeParams plain = p;
  std::fill(plain.sections, plain.sections + 4, 0);
  std::vector<float> cs(16), ref(16);
  RopeCache(p, 37, cs.data());
  RopeCache(plain, 37, ref.data());
  for (int i = 0; i < 8; ++i) {
    if (want[i]) {
      EXPECT_EQ(cs[2 * i], ref[2 * i]) << i;
      EXPECT_EQ(cs[2 * i + 1], ref[2 * i + 1]) << i;
    } else {
      EXPECT_EQ(cs[2 * i], 1.0f) << i;
      EXPECT_EQ(cs[2 * i + 1], 0.0f) << i;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The fixtures' shapes.

TEST(Qwen35Fixtures, LayerPatternAndShapes) {
  for (const std::string& path : {kDense, kMoe}) {
    if (!fs::exists(path)) GTEST_SKIP() << path << " is absent";
    Result<std::unique_ptr<Model>> m = LoadModel(path);
    ASSERT_TRUE(m.ok()) << m.error().message;
    const Hparams& hp = (*m)->hparams();
    EXPECT_EQ(hp.n_layer, 4) << path;
    EXPECT_EQ(hp.n_layer_kv, 1) << path;  // layer 3 alone is attention
    EXPECT_EQ(hp.recurrent.n_layer, 3) << path;
    EXPECT_EQ(hp.recurrent.n_k_heads, 2) << path;
    EXPECT_EQ(hp.recurrent.n_v_heads, 4) << path;
    EXPECT_TRUE(hp.recurrent.v_tiled) << path;
    EXPECT_EQ(hp.head_dim, 64) << path;
    EXPECT_EQ(hp.rope.n_rot, 16) << path;
    EXPECT_EQ(hp.rope.style, RopeStyle::kNeox) << path;
  }
}

// ---------------------------------------------------------------------------------------------
// Rewritten files.

// A copy of `src` with metadata overwritten (u32 values, or a removed key when the value is
// absent), tensors dropped, and `extra` tensors appended (name -> a tensor of src to copy).
struct Rewrite {
  std::map<std::string, uint32_t> set_u32;
  std::map<std::string, std::vector<int32_t>> set_i32_array;
  std::string drop_key;
  std::string drop_tensor;
  std::vector<std::pair<std::string, std::string>> extra;  // (new name, source name)
};

std::string Write(const std::string& src, const std::string& dst, const Rewrite& r) {
  Result<std::unique_ptr<gguf::File>> f = gguf::File::Open(src);
  if (!f.ok()) return f.error().message;
  gguf::Writer w;
  for (const auto& [key, value] : (*f)->metadata()) {
    if (key == r.drop_key || r.set_u32.count(key) || r.set_i32_array.count(key)) continue;
    w.SetValue(key, value);
  }
  for (const auto& [key, v] : r.set_u32) w.SetU32(key, v);
  for (const auto& [key, v] : r.set_i32_array) w.SetI32Array(key, v);
  auto add = [&w](const std::string& name, const gguf::TensorInfo& t) {
    w.AddTensor(name, t.type, std::vector<int64_t>(t.ne, t.ne + t.n_dims), t.data, t.n_bytes);
  };
  for (const gguf::TensorInfo& t : (*f)->tensors()) {
    if (t.name != r.drop_tensor) add(t.name, t);
  }
  for (const auto& [name, from] : r.extra) {
    const gguf::TensorInfo* t = (*f)->FindTensor(from);
    if (t == nullptr) return "no tensor " + from;
    add(name, *t);
  }
  Status st = w.WriteFile(dst);
  return st.ok() ? "" : st.error().message;
}

class Qwen35Files : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("lamina_q35_" + std::to_string(getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string Path(const std::string& name) const { return (dir_ / (name + ".gguf")).string(); }
  fs::path dir_;
};

// Logits of every position of a fixed prompt.
std::vector<float> PromptLogits(const Model& model) {
  ThreadPool pool(2);
  SessionConfig sc;
  sc.n_ctx = 64;
  Session s(model, sc, pool);
  std::vector<int32_t> tokens;
  for (int i = 0; i < 24; ++i) tokens.push_back(1 + (i * 37) % (model.hparams().n_vocab - 1));
  Result<const float*> logits = s.Eval(tokens, /*all_logits=*/true);
  if (!logits.ok()) return {};
  return std::vector<float>(*logits, *logits + tokens.size() * model.hparams().n_vocab);
}

// llama.cpp's layout of a Qwen3.5 file with multi-token prediction: block_count counts the
// appended block (blk.4: a full-attention layer with the nextn tensors) and
// nextn_predict_layers says how many there are. The trunk alone runs, with the same logits.
TEST_F(Qwen35Files, MultiTokenPredictionBlockIsSkippedAndLeavesTheTrunkAlone) {
  for (const std::string& src : {kDense, kMoe}) {
    if (!fs::exists(src)) GTEST_SKIP() << src << " is absent";
    Result<std::unique_ptr<gguf::File>> f = gguf::File::Open(src);
    ASSERT_TRUE(f.ok());
    const std::string arch = *(*f)->GetString("general.architecture");
    Rewrite r;
    r.set_u32 = {{arch + ".block_count", 5}, {arch + ".nextn_predict_layers", 1}};
    for (const gguf::TensorInfo& t : (*f)->tensors()) {
      if (t.name.rfind("blk.3.", 0) == 0) r.extra.push_back({"blk.4." + t.name.substr(6), t.name});
    }
    r.extra.push_back({"blk.4.nextn.eh_proj.weight", "blk.3.attn_q.weight"});
    r.extra.push_back({"blk.4.nextn.enorm.weight", "blk.3.attn_norm.weight"});
    r.extra.push_back({"blk.4.nextn.hnorm.weight", "blk.3.attn_norm.weight"});
    const std::string path = Path(arch + "_mtp");
    ASSERT_EQ(Write(src, path, r), "");
    Result<std::unique_ptr<Model>> plain = LoadModel(src);
    Result<std::unique_ptr<Model>> mtp = LoadModel(path);
    ASSERT_TRUE(plain.ok()) << plain.error().message;
    ASSERT_TRUE(mtp.ok()) << mtp.error().message;
    EXPECT_EQ((*mtp)->hparams().n_layer, 4);
    EXPECT_EQ((*mtp)->hparams().n_layer_kv, 1);
    const std::vector<float> with_mtp = PromptLogits(**mtp);
    ASSERT_FALSE(with_mtp.empty()) << arch;
    EXPECT_EQ(with_mtp, PromptLogits(**plain)) << arch;
  }
}

struct Defect {
  std::string name;
  Rewrite rewrite;
  std::string want;  // expected in the error
};

TEST_F(Qwen35Files, EachDefectGivesOneClearError) {
  if (!fs::exists(kDense)) GTEST_SKIP() << kDense << " is absent";
  const std::vector<Defect> defects = {
      {"no_sections",
       {.drop_key = "qwen35.rope.dimension_sections"},
       "missing required key qwen35.rope.dimension_sections"},
      {"three_sections",
       {.set_i32_array = {{"qwen35.rope.dimension_sections", {3, 3, 2}}}},
       "\"qwen35.rope.dimension_sections\" is not an integer or an array of 4 integers"},
      {"negative_section",
       {.set_i32_array = {{"qwen35.rope.dimension_sections", {3, -1, 2, 0}}}},
       "\"qwen35.rope.dimension_sections\" = -1, but a section must be in"},
      {"sections_past_head",
       {.set_i32_array = {{"qwen35.rope.dimension_sections", {32, 32, 1, 0}}}},
       "\"qwen35.rope.dimension_sections\" = 65, but the sections' sum must be in [1, head "
       "dimension 64]"},
      {"only_e_section",
       {.set_i32_array = {{"qwen35.rope.dimension_sections", {0, 0, 0, 8}}}},
       "t, h, w not all 0"},
      {"all_nextn",
       {.set_u32 = {{"qwen35.nextn_predict_layers", 4}}},
       "\"qwen35.nextn_predict_layers\" = 4, but block_count is 4"},
      {"nextn_takes_attention",
       {.set_u32 = {{"qwen35.nextn_predict_layers", 1}}},
       "leaves no full-attention layer among 3"},
      {"missing_beta", {.drop_tensor = "blk.1.ssm_beta.weight"}, "blk.1.ssm_beta.weight"},
      {"missing_alpha", {.drop_tensor = "blk.2.ssm_alpha.weight"}, "blk.2.ssm_alpha.weight"},
      {"missing_ffn", {.drop_tensor = "blk.0.ffn_up.weight"}, "blk.0.ffn_up.weight"},
      {"v_heads_not_multiple",
       {.set_u32 = {{"qwen35.ssm.group_count", 3}}},
       "inconsistent head counts"},
  };
  for (const Defect& d : defects) {
    const std::string path = Path(d.name);
    ASSERT_EQ(Write(kDense, path, d.rewrite), "") << d.name;
    Result<std::unique_ptr<Model>> m = LoadModel(path);
    ASSERT_FALSE(m.ok()) << d.name << " loaded";
    const std::string& msg = m.error().message;
    EXPECT_NE(msg.find(d.want), std::string::npos) << d.name << ": " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << d.name << ": " << msg;
  }
}

}  // namespace
}  // namespace lamina
