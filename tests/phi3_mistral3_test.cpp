// phi3, mistral3 and phimoe: RoPE frequency factors against ggml's formula, the fixtures'
// hyper-parameters as llama.cpp reads them (phi3's ignored window, LongRoPE's short factors and
// attention factor; mistral3's YaRN log multiplier and temperature tuning, its biases and
// experts, gated or not; phimoe's biases and its factors over the whole head under partial RoPE),
// the context phi3's short factors serve and the long ones past them, and the metadata and tensors
// the loaders refuse, naming the key or the tensor.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <random>

#include "gguf/gguf.h"
#include "kernels/ops.h"
#include "model/model.h"
#include "runtime/session.h"
#include "runtime/session_file.h"
#include "util/thread_pool.h"

namespace lamina {
namespace {

namespace fs = std::filesystem;

const std::string kModels = std::string(LAMINA_SOURCE_DIR) + "/tests/fixtures/models/";
const std::string kPhi3 = kModels + "synth-phi3-d256.Q8_0.gguf";
const std::string kMistral3 = kModels + "synth-mistral3-d256.Q8_0.gguf";
const std::string kMistral3Bias = kModels + "synth-mistral3-bias-d256.Q8_0.gguf";
const std::string kMistral3Moe = kModels + "synth-mistral3-moe-d256.Q8_0.gguf";
const std::string kMistral3MoeNoGate = kModels + "synth-mistral3-moe-nogate-d256.Q8_0.gguf";
const std::string kPhiMoe = kModels + "synth-phimoe-d256.Q8_0.gguf";
const std::string kPhiMoeRot48 = kModels + "synth-phimoe-rot48-d256.Q8_0.gguf";

// What a rewrite of a fixture changes: metadata keys set (after `drop` is removed) and tensors
// left out or added.
struct Edit {
  std::string drop = {};                        // a metadata key removed ("" none)
  std::function<void(gguf::Writer&)> set = {};  // keys (or tensors) added
  std::string skip_tensor = {};                 // a tensor left out ("" none)
  std::function<bool(const gguf::TensorInfo&, gguf::Writer&)> replace = {};  // true: written here
};

// The fixture rewritten with `edit`, then loaded.
Result<std::unique_ptr<Model>> LoadEdited(const std::string& fixture, const Edit& edit) {
  Result<std::unique_ptr<gguf::File>> f = gguf::File::Open(fixture);
  if (!f.ok()) return f.error();
  gguf::Writer w;
  for (const auto& [k, v] : (*f)->metadata()) {
    if (k != edit.drop) w.SetValue(k, v);
  }
  if (edit.set) edit.set(w);
  for (const gguf::TensorInfo& t : (*f)->tensors()) {
    if (t.name == edit.skip_tensor) continue;
    if (edit.replace && edit.replace(t, w)) continue;
    w.AddTensor(t.name, t.type, std::vector<int64_t>(t.ne, t.ne + t.n_dims), t.data, t.n_bytes);
  }
  const std::string path = testing::TempDir() + "/archs_" + std::to_string(getpid()) + ".gguf";
  Status st = w.WriteFile(path);
  if (!st.ok()) return st.error();
  Result<std::unique_ptr<Model>> m = LoadModel(path);
  fs::remove(path);
  return m;
}

// A float vector tensor of n values v.
void AddVector(gguf::Writer& w, const std::string& name, int n, float v) {
  std::vector<float> data(n, v);  // [n]
  w.AddTensor(name, GgmlType::kF32, {n}, data.data(), data.size() * sizeof(float));
}

TEST(RopeFreqFactors, PairIDividesItsAngleByItsFactor) {
  RopeParams p;
  p.n_rot = 16;
  p.freq_base = 10000.0f;
  p.style = RopeStyle::kNeox;
  std::vector<float> ff(8);  // [n_rot / 2]
  for (int i = 0; i < 8; ++i) ff[i] = 1.0f + 0.5f * i;
  std::vector<float> plain(16), ones_cs(16), with(16);  // [n_rot] cos, sin pairs
  RopeCache(p, 37, plain.data());
  const std::vector<float> ones(8, 1.0f);  // [n_rot / 2]
  p.freq_factors = ones.data();
  RopeCache(p, 37, ones_cs.data());
  EXPECT_EQ(std::memcmp(plain.data(), ones_cs.data(), sizeof(float) * 16), 0);
  p.freq_factors = ff.data();
  RopeCache(p, 37, with.data());
  for (int i = 0; i < 8; ++i) {
    const double theta = 37.0 * std::pow(10000.0, -2.0 * i / 16) / ff[i];
    EXPECT_NEAR(with[2 * i], std::cos(theta), 2e-5) << i;
    EXPECT_NEAR(with[2 * i + 1], std::sin(theta), 2e-5) << i;
  }
}

TEST(Phi3, TheFixtureLoadsAsLlamaCppReadsIt) {
  if (!fs::exists(kPhi3)) GTEST_SKIP() << kPhi3 << " is absent";
  Result<std::unique_ptr<Model>> m = LoadModel(kPhi3);
  ASSERT_TRUE(m.ok()) << m.error().message;
  const Hparams& hp = (*m)->hparams();
  EXPECT_TRUE(hp.swa_layers.empty());  // attention.sliding_window 16 is ignored
  EXPECT_EQ(hp.rope.style, RopeStyle::kNeox);
  EXPECT_EQ(hp.rope.n_rot, 48);
  EXPECT_EQ(hp.head_dim, 64);
  ASSERT_NE(hp.rope.freq_factors, nullptr);
  const gguf::TensorInfo* s = (*m)->file().FindTensor("rope_factors_short.weight");
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(std::memcmp(hp.rope.freq_factors, s->data, 24 * sizeof(float)), 0);
  EXPECT_EQ(hp.rope_short_ctx, 4096);
  EXPECT_FLOAT_EQ(hp.rope.attn_factor, std::sqrt(1.0f + std::log(32.0f) / std::log(4096.0f)));
  EXPECT_EQ(hp.rope.freq_scale, 1.0f);
}

TEST(Phi3, AContextBeyondTheOriginalRotatesWithTheLongFactors) {
  if (!fs::exists(kPhi3)) GTEST_SKIP() << kPhi3 << " is absent";
  Result<std::unique_ptr<Model>> m = LoadModel(kPhi3);
  ASSERT_TRUE(m.ok()) << m.error().message;
  const Hparams& hp = (*m)->hparams();
  const gguf::TensorInfo* l = (*m)->file().FindTensor("rope_factors_long.weight");
  ASSERT_NE(l, nullptr);
  ASSERT_NE(hp.rope_long.freq_factors, nullptr);
  EXPECT_EQ(std::memcmp(hp.rope_long.freq_factors, l->data, 24 * sizeof(float)), 0);
  EXPECT_EQ(hp.rope_long.attn_factor, hp.rope.attn_factor);
  EXPECT_FALSE(hp.uses_long_rope(4096));
  EXPECT_TRUE(hp.uses_long_rope(4097));
  ThreadPool pool(1);
  SessionConfig c;
  c.n_ctx = 4096;
  Session short_ctx(**m, c, pool);
  EXPECT_FALSE(short_ctx.long_rope());
  EXPECT_EQ(short_ctx.cache().config().rope.freq_factors, hp.rope.freq_factors);
  c.n_ctx = 4097;
  Session long_ctx(**m, c, pool);
  EXPECT_TRUE(long_ctx.long_rope());
  EXPECT_EQ(long_ctx.cache().config().rope.freq_factors, hp.rope_long.freq_factors);
  // The same prompt gives other logits (the goldens hold llama.cpp's for both contexts).
  const std::vector<int32_t> prompt = {1, 100, 200, 300, 400, 5, 6, 7};
  Result<const float*> a = short_ctx.Eval(prompt, false);
  ASSERT_TRUE(a.ok()) << a.error().message;
  const std::vector<float> la(*a, *a + hp.n_vocab);  // [n_vocab]
  Result<const float*> b = long_ctx.Eval(prompt, false);
  ASSERT_TRUE(b.ok()) << b.error().message;
  EXPECT_NE(std::memcmp(la.data(), *b, la.size() * sizeof(float)), 0);
  // A session file of one context is refused by the other (their keys turned differently).
  const uint64_t hash = ModelIdentityHash(**m);
  const std::vector<uint8_t> file = SerializeSessionFile(long_ctx, 0, hash);
  EXPECT_TRUE(ParseSessionFile(file.data(), file.size(), long_ctx, hash).ok());
  c.n_ctx = 8192;
  Session longer(**m, c, pool);
  EXPECT_TRUE(ParseSessionFile(file.data(), file.size(), longer, hash).ok());
  EXPECT_FALSE(ParseSessionFile(file.data(), file.size(), short_ctx, hash).ok());
  // Without long factors every context rotates with the short ones.
  Result<std::unique_ptr<Model>> no_long =
      LoadEdited(kPhi3, {.skip_tensor = "rope_factors_long.weight"});
  ASSERT_TRUE(no_long.ok()) << no_long.error().message;
  EXPECT_EQ((*no_long)->hparams().rope_short_ctx, 0);
  EXPECT_FALSE((*no_long)->hparams().uses_long_rope(1 << 20));
}

// A fused attn_qkv or ffn_up of the wrong height, factors of the wrong length: named.
TEST(Phi3, MalformedTensorsAreRefusedByName) {
  if (!fs::exists(kPhi3)) GTEST_SKIP() << kPhi3 << " is absent";
  struct Bad {
    Edit edit;
    const char* named;
  };
  auto ff_len = [](gguf::Writer& w) { w.SetU32("phi3.feed_forward_length", 128); };
  auto short_len = [](const gguf::TensorInfo& t, gguf::Writer& w) {
    if (t.name != "rope_factors_short.weight") return false;
    AddVector(w, t.name, 16, 1.0f);
    return true;
  };
  auto heads = [](gguf::Writer& w) { w.SetU32("phi3.attention.head_count_kv", 4); };
  const Bad bad[] = {
      {{.drop = "phi3.feed_forward_length", .set = ff_len}, "feed_forward_length"},
      {{.replace = short_len}, "rope_factors_short.weight"},
      {{.drop = "phi3.attention.head_count_kv", .set = heads}, "blk.0.attn_qkv.weight"},
      {{.skip_tensor = "blk.1.attn_qkv.weight"}, "blk.1.attn_q.weight"},
  };
  for (const Bad& b : bad) {
    Result<std::unique_ptr<Model>> m = LoadEdited(kPhi3, b.edit);
    ASSERT_FALSE(m.ok()) << b.named;
    EXPECT_NE(m.error().message.find(b.named), std::string::npos) << m.error().message;
  }
}

TEST(Mistral3, TheFixtureLoadsAsLlamaCppReadsIt) {
  if (!fs::exists(kMistral3)) GTEST_SKIP() << kMistral3 << " is absent";
  Result<std::unique_ptr<Model>> m = LoadModel(kMistral3);
  ASSERT_TRUE(m.ok()) << m.error().message;
  const Hparams& hp = (*m)->hparams();
  EXPECT_EQ(hp.rope.style, RopeStyle::kNormal);
  EXPECT_EQ(hp.rope.freq_scale, 0.25f);
  EXPECT_EQ(hp.rope.ext_factor, 1.0f);
  EXPECT_EQ(hp.rope.freq_factors, nullptr);
  // log multiplier 1: mscale(4, 1) / mscale(4, 1), YaRN's own 1 + 0.1 ln 4 cancelled.
  EXPECT_FLOAT_EQ(hp.rope.attn_factor, 1.0f / (1.0f + 0.1f * std::log(4.0f)));
  EXPECT_FLOAT_EQ(hp.attn_temp_scale, 0.1f);
  EXPECT_EQ(hp.attn_temp_floor, 32);
  EXPECT_EQ(hp.attention_temperature(0), 1.0f);
  EXPECT_EQ(hp.attention_temperature(31), 1.0f);
  EXPECT_FLOAT_EQ(hp.attention_temperature(32), 1.0f + 0.1f * std::log(2.0f));
  EXPECT_FLOAT_EQ(hp.attention_temperature(99), 1.0f + 0.1f * std::log(4.0f));
}

TEST(Mistral3, ValuesItCannotHoldAreRefusedByName) {
  if (!fs::exists(kMistral3)) GTEST_SKIP() << kMistral3 << " is absent";
  struct Bad {
    Edit edit;
    const char* named;
  };
  auto key = [](const char* k, float v) {
    return Edit{.drop = k, .set = [k, v](gguf::Writer& w) { w.SetF32(k, v); }};
  };
  auto bias = [](gguf::Writer& w) { AddVector(w, "blk.1.attn_output.bias", 128, 0.0f); };
  auto shared = [](gguf::Writer& w) {
    std::vector<float> r(256 * 64, 0.0f);  // [64, 256]
    w.AddTensor("blk.0.ffn_gate_shexp.weight", GgmlType::kF32, {256, 64}, r.data(), r.size() * 4);
  };
  auto rot = [](gguf::Writer& w) { w.SetU32("mistral3.rope.dimension_count", 32); };
  const Bad bad[] = {
      {key("mistral3.attention.temperature_scale", -0.1f), "attention.temperature_scale"},
      {key("mistral3.attention.temperature_scale", NAN), "attention.temperature_scale"},
      {key("mistral3.rope.scaling.yarn_log_multiplier", -1.0f), "yarn_log_multiplier"},
      // Partial RoPE: llama.cpp's mistral3 graph asserts n_rot = head_dim.
      {{.drop = "mistral3.rope.dimension_count", .set = rot}, "rope.dimension_count"},
      {{.set = bias}, "blk.1.attn_output.bias has 128 elements, expected 256"},
      // A shared expert, which llama.cpp's mistral3 never reads.
      {{.set = shared}, "blk.0.ffn_gate_shexp.weight"},
  };
  for (const Bad& b : bad) {
    Result<std::unique_ptr<Model>> m = LoadEdited(kMistral3, b.edit);
    ASSERT_FALSE(m.ok()) << b.named;
    EXPECT_NE(m.error().message.find(b.named), std::string::npos) << m.error().message;
  }
  // rope_freqs.weight, when present, is the RoPE's frequency factors.
  Result<std::unique_ptr<Model>> m = LoadEdited(
      kMistral3, {.set = [](gguf::Writer& w) { AddVector(w, "rope_freqs.weight", 32, 2.0f); }});
  ASSERT_TRUE(m.ok()) << m.error().message;
  ASSERT_NE((*m)->hparams().rope.freq_factors, nullptr);
  EXPECT_EQ((*m)->hparams().rope.freq_factors[31], 2.0f);
}

// The last-position logits of `prompt` in a fresh session of `m`.
std::vector<float> LastLogits(const Model& m, const std::vector<int32_t>& prompt) {
  ThreadPool pool(1);
  SessionConfig c;
  c.n_ctx = 256;
  Session s(m, c, pool);
  Result<const float*> r = s.Eval(prompt, false);
  LAMINA_CHECK(r.ok());
  return std::vector<float>(*r, *r + m.hparams().n_vocab);
}

// attn_output.bias and a dense FFN's biases are read when present (llama.cpp's optional
// tensors) and move the logits; the bias fixture has every one of them.
TEST(Mistral3, OptionalBiasesAreRead) {
  if (!fs::exists(kMistral3)) GTEST_SKIP() << kMistral3 << " is absent";
  const std::vector<int32_t> prompt = {1, 100, 200, 300};
  Result<std::unique_ptr<Model>> plain = LoadModel(kMistral3);
  ASSERT_TRUE(plain.ok()) << plain.error().message;
  const std::vector<float> base = LastLogits(**plain, prompt);
  for (const auto& [name, n] :
       {std::pair{"blk.1.attn_output.bias", 256}, std::pair{"blk.1.ffn_gate.bias", 256},
        std::pair{"blk.1.ffn_up.bias", 256}, std::pair{"blk.1.ffn_down.bias", 256}}) {
    const std::string tensor = name;
    const int len = n;
    Result<std::unique_ptr<Model>> m =
        LoadEdited(kMistral3, {.set = [&](gguf::Writer& w) { AddVector(w, tensor, len, 0.5f); }});
    ASSERT_TRUE(m.ok()) << m.error().message;
    EXPECT_NE(LastLogits(**m, prompt), base) << tensor;
  }
  if (!fs::exists(kMistral3Bias)) GTEST_SKIP() << kMistral3Bias << " is absent";
  Result<std::unique_ptr<Model>> biased = LoadModel(kMistral3Bias);
  ASSERT_TRUE(biased.ok()) << biased.error().message;
  for (const char* t : {"attn_q.bias", "attn_output.bias", "ffn_gate.bias", "ffn_down.bias"})
    EXPECT_NE((*biased)->file().FindTensor(std::string("blk.1.") + t), nullptr) << t;
}

// expert_count > 0 makes the FFN a MoE (llama.cpp: router, ffn_{gate,up,down}_exps of
// feed_forward_length rows each); a missing expert tensor is named.
TEST(Mistral3, ExpertsAreReadWhenExpertCountSaysSo) {
  if (!fs::exists(kMistral3Moe)) GTEST_SKIP() << kMistral3Moe << " is absent";
  Result<std::unique_ptr<Model>> m = LoadModel(kMistral3Moe);
  ASSERT_TRUE(m.ok()) << m.error().message;
  const Hparams& hp = (*m)->hparams();
  EXPECT_EQ(hp.n_ff, 96);
  EXPECT_EQ(hp.rope.n_rot, hp.head_dim);
  // A token reads 2 of the 4 experts: fewer bytes than the weights after the embedding.
  uint64_t weights = 0;
  for (const gguf::TensorInfo& t : (*m)->file().tensors())
    if (t.name != "token_embd.weight") weights += t.n_bytes;
  EXPECT_LT((*m)->WeightBytesPerToken(), weights);
  struct Bad {
    Edit edit;
    const char* named;
  };
  auto ff = [](gguf::Writer& w) { w.SetU32("mistral3.feed_forward_length", 128); };
  auto count = [](gguf::Writer& w) { w.SetU32("mistral3.expert_count", 8); };
  const Bad bad[] = {
      {{.skip_tensor = "blk.1.ffn_up_exps.weight"}, "missing tensor blk.1.ffn_up_exps.weight"},
      {{.drop = "mistral3.feed_forward_length", .set = ff}, "feed_forward_length"},
      {{.drop = "mistral3.expert_count", .set = count}, "expert_count"},
  };
  for (const Bad& b : bad) {
    Result<std::unique_ptr<Model>> e = LoadEdited(kMistral3Moe, b.edit);
    ASSERT_FALSE(e.ok()) << b.named;
    EXPECT_NE(e.error().message.find(b.named), std::string::npos) << e.error().message;
  }
}

// llama.cpp loads mistral3's ffn_gate_exps as optional; a layer without it runs its experts as
// down(SiLU(up(x))) (build_moe_ffn with a null gate). The nogate fixture has none (its goldens
// check the numbers); one layer's gate left out of the gated fixture loads too and changes the
// logits; phimoe, whose loader requires the gates, refuses a missing one by name.
TEST(Mistral3, ExpertsWithoutAGateRunSiluOfUp) {
  if (!fs::exists(kMistral3MoeNoGate)) GTEST_SKIP() << kMistral3MoeNoGate << " is absent";
  Result<std::unique_ptr<Model>> m = LoadModel(kMistral3MoeNoGate);
  ASSERT_TRUE(m.ok()) << m.error().message;
  EXPECT_EQ((*m)->hparams().n_ff, 96);
  for (const char* t : {"blk.0.ffn_gate_exps.weight", "blk.1.ffn_gate_exps.weight"})
    EXPECT_EQ((*m)->file().FindTensor(t), nullptr) << t;
  // 2 of 4 experts per token: the up and down stacks, not a gate's, are the unread part.
  uint64_t weights = 0;
  for (const gguf::TensorInfo& t : (*m)->file().tensors())
    if (t.name != "token_embd.weight") weights += t.n_bytes;
  EXPECT_LT((*m)->WeightBytesPerToken(), weights);
  // The count check reads ffn_up_exps when no gate exists.
  Result<std::unique_ptr<Model>> count = LoadEdited(
      kMistral3MoeNoGate, {.drop = "mistral3.expert_count",
                           .set = [](gguf::Writer& w) { w.SetU32("mistral3.expert_count", 8); }});
  ASSERT_FALSE(count.ok());
  EXPECT_NE(count.error().message.find("blk.0.ffn_up_exps.weight holds 4 experts"),
            std::string::npos)
      << count.error().message;

  if (!fs::exists(kMistral3Moe)) GTEST_SKIP() << kMistral3Moe << " is absent";
  const std::vector<int32_t> prompt = {1, 100, 200, 300};
  Result<std::unique_ptr<Model>> gated = LoadModel(kMistral3Moe);
  ASSERT_TRUE(gated.ok()) << gated.error().message;
  Result<std::unique_ptr<Model>> one =
      LoadEdited(kMistral3Moe, {.skip_tensor = "blk.1.ffn_gate_exps.weight"});
  ASSERT_TRUE(one.ok()) << one.error().message;
  EXPECT_NE(LastLogits(**one, prompt), LastLogits(**gated, prompt));
  if (!fs::exists(kPhiMoe)) GTEST_SKIP() << kPhiMoe << " is absent";
  Result<std::unique_ptr<Model>> phimoe =
      LoadEdited(kPhiMoe, {.skip_tensor = "blk.1.ffn_gate_exps.weight"});
  ASSERT_FALSE(phimoe.ok());
  EXPECT_NE(phimoe.error().message.find("missing tensor blk.1.ffn_gate_exps.weight"),
            std::string::npos)
      << phimoe.error().message;
}

TEST(PhiMoe, TheFixtureLoadsAsLlamaCppReadsIt) {
  if (!fs::exists(kPhiMoe)) GTEST_SKIP() << kPhiMoe << " is absent";
  Result<std::unique_ptr<Model>> m = LoadModel(kPhiMoe);
  ASSERT_TRUE(m.ok()) << m.error().message;
  const Hparams& hp = (*m)->hparams();
  EXPECT_TRUE(hp.swa_layers.empty());  // attention.sliding_window 16 is ignored, as for phi3
  EXPECT_EQ(hp.rope.style, RopeStyle::kNeox);
  EXPECT_EQ(hp.rope.n_rot, 64);
  ASSERT_NE(hp.rope.freq_factors, nullptr);
  EXPECT_EQ(hp.rope_short_ctx, 4096);
  EXPECT_FLOAT_EQ(hp.rope.attn_factor, std::sqrt(1.0f + std::log(32.0f) / std::log(4096.0f)));
  EXPECT_EQ(hp.n_ff, 96);
  // Each bias is required (llama.cpp's loader), and the head is never tied.
  for (const char* t : {"output.bias", "output_norm.bias", "blk.1.attn_norm.bias",
                        "blk.0.ffn_norm.bias", "blk.1.attn_output.bias", "output.weight"}) {
    Result<std::unique_ptr<Model>> e = LoadEdited(kPhiMoe, {.skip_tensor = t});
    ASSERT_FALSE(e.ok()) << t;
    EXPECT_NE(e.error().message.find(std::string("missing tensor ") + t), std::string::npos)
        << e.error().message;
  }
  // Q/K/V biases are optional, as in llama.cpp, and read when present.
  Result<std::unique_ptr<Model>> no_qb = LoadEdited(kPhiMoe, {.skip_tensor = "blk.0.attn_q.bias"});
  ASSERT_TRUE(no_qb.ok()) << no_qb.error().message;
  const std::vector<int32_t> prompt = {1, 100, 200, 300};
  EXPECT_NE(LastLogits(**no_qb, prompt), LastLogits(**m, prompt));
}

// Partial RoPE in a phimoe: llama.cpp rotates rope.dimension_count dimensions but sizes the
// LongRoPE factors for the whole head (n_embd / n_head / 2, its phimoe loader; phi3's are
// n_rot / 2) and ggml's RoPE reads the first n_rot / 2 of them. Factors one per rotated pair,
// which llama.cpp refuses to load, are refused by name.
TEST(PhiMoe, PartialRopeTakesFactorsForTheWholeHead) {
  if (!fs::exists(kPhiMoeRot48)) GTEST_SKIP() << kPhiMoeRot48 << " is absent";
  Result<std::unique_ptr<Model>> m = LoadModel(kPhiMoeRot48);
  ASSERT_TRUE(m.ok()) << m.error().message;
  const Hparams& hp = (*m)->hparams();
  EXPECT_EQ(hp.rope.n_rot, 48);
  EXPECT_EQ(hp.head_dim, 64);
  for (const char* name : {"rope_factors_short.weight", "rope_factors_long.weight"}) {
    const gguf::TensorInfo* t = (*m)->file().FindTensor(name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_EQ(t->ne[0], 32) << name;
  }
  ASSERT_NE(hp.rope.freq_factors, nullptr);
  ASSERT_NE(hp.rope_long.freq_factors, nullptr);
  EXPECT_EQ(
      std::memcmp(hp.rope.freq_factors, (*m)->file().FindTensor("rope_factors_short.weight")->data,
                  32 * sizeof(float)),
      0);
  auto per_rotated_pair = [](const gguf::TensorInfo& t, gguf::Writer& w) {
    if (t.name != "rope_factors_short.weight") return false;
    AddVector(w, t.name, 24, 1.0f);
    return true;
  };
  Result<std::unique_ptr<Model>> bad = LoadEdited(kPhiMoeRot48, {.replace = per_rotated_pair});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("rope_factors_short.weight has 24 elements, expected 32"),
            std::string::npos)
      << bad.error().message;
}

}  // namespace
}  // namespace lamina
