// qwen3next (hybrid Gated DeltaNet + gated attention) unit tests: the delta-net kernels against
// double-precision references, the layer pattern and cache shapes read from the shared fixture,
// exact rollback of recurrent state (within its ring of states, refused or dropped beyond it,
// copied between sequences), and one clear error per malformed file.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>

#include "gguf/gguf.h"
#include "kernels/delta_net.h"
#include "kv_storage.h"
#include "runtime/session.h"

namespace lamina {
namespace {

namespace fs = std::filesystem;
const std::string kShared = LAMINA_SHARED_DIR;
const std::string kF32 = kShared + "/models/synth-qwen3next-d256.F32.gguf";
const std::string kQ4 = kShared + "/models/synth-qwen3next-d256.Q4_K_M.gguf";

std::vector<float> Random(size_t n, std::mt19937& rng, float sigma = 1.0f) {
  std::normal_distribution<float> normal(0.0f, sigma);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

// ---------------------------------------------------------------------------------------------
// Kernels.

TEST(DeltaNetKernels, CausalConvMatchesReferenceAndTailRolls) {
  std::mt19937 rng(1);
  const int C = 40, K = 4, n = 7;
  const std::vector<float> tail = Random((K - 1) * C, rng), x = Random(n * C, rng),
                           w = Random(C * K, rng);
  std::vector<float> out(n * C);
  CausalConvSilu(tail.data(), x.data(), n, C, K, w.data(), out.data());
  for (int t = 0; t < n; ++t) {
    for (int c = 0; c < C; ++c) {
      double s = 0;
      for (int j = 0; j < K; ++j) {
        const int r = t + j;  // row of [tail; x]
        s += double(w[c * K + j]) * (r < K - 1 ? tail[r * C + c] : x[(r - K + 1) * C + c]);
      }
      EXPECT_NEAR(out[t * C + c], s / (1 + std::exp(-s)), 1e-5) << t << " " << c;
    }
  }
  // Running the tokens one at a time with the rolled tail gives the same bits.
  std::vector<float> rolled = tail, one(C);
  for (int t = 0; t < n; ++t) {
    CausalConvSilu(rolled.data(), x.data() + t * C, 1, C, K, w.data(), one.data());
    EXPECT_EQ(std::memcmp(one.data(), out.data() + t * C, C * sizeof(float)), 0) << t;
    ConvTailAdvance(rolled.data(), x.data() + t * C, 1, C, K, rolled.data());
  }
  std::vector<float> direct((K - 1) * C);
  ConvTailAdvance(tail.data(), x.data(), n, C, K, direct.data());
  EXPECT_EQ(direct, rolled);
  EXPECT_EQ(std::memcmp(direct.data(), x.data() + (n - K + 1) * C, direct.size() * 4), 0);
}

TEST(DeltaNetKernels, GatedDeltaStepMatchesReference) {
  std::mt19937 rng(2);
  const int dk = 24, dv = 16, n = 9;
  std::vector<float> m = Random(dk * dv, rng, 0.3f);  // [dk, dv]
  std::vector<double> ref(m.begin(), m.end());
  const float scale = 1.0f / std::sqrt(float(dk));
  for (int t = 0; t < n; ++t) {
    std::vector<float> q = Random(dk, rng), k = Random(dk, rng), v = Random(dv, rng), out(dv);
    L2Normalize(q.data(), dk, 1e-6f);
    L2Normalize(k.data(), dk, 1e-6f);
    double qn = 0, kn = 0;
    for (int j = 0; j < dk; ++j) qn += double(q[j]) * q[j], kn += double(k[j]) * k[j];
    EXPECT_NEAR(qn, 1.0, 1e-5);
    EXPECT_NEAR(kn, 1.0, 1e-5);
    const float decay = std::exp(-0.05f * (t + 1)), beta = 0.1f * (t + 1);
    GatedDeltaStep(m.data(), m.data(), q.data(), k.data(), v.data(), decay, beta, scale, dk, dv,
                   out.data());
    for (double& x : ref) x *= decay;
    for (int i = 0; i < dv; ++i) {
      double mk = 0;
      for (int j = 0; j < dk; ++j) mk += ref[j * dv + i] * k[j];
      const double d = beta * (v[i] - mk);
      for (int j = 0; j < dk; ++j) ref[j * dv + i] += k[j] * d;
      double mq = 0;
      for (int j = 0; j < dk; ++j) mq += ref[j * dv + i] * q[j];
      EXPECT_NEAR(out[i], scale * mq, 1e-5) << "token " << t << " dim " << i;
    }
  }
  for (int i = 0; i < dv * dk; ++i) ASSERT_NEAR(m[i], ref[i], 1e-5);
}

// The SIMD twins (AVX2, AVX-512) against the scalar one on random inputs: the same bits, state
// and outputs, over several tokens (d_v a multiple of the register width, wider than one
// register pass, and not: the scalar fallback).
void CheckDeltaTwinAgainstScalar(GatedDeltaStepFn twin) {
  std::mt19937 rng(3);
  for (auto [dk, dv] : {std::pair{64, 64}, std::pair{24, 128}, std::pair{16, 256},
                        std::pair{13, 12}, std::pair{8, 24}}) {
    // The scalar twin in place; the SIMD one from one buffer into another, then back.
    std::vector<float> a = Random(dv * dk, rng, 0.3f), b = a, b2(a.size());
    for (int t = 0; t < 6; ++t) {
      std::vector<float> q = Random(dk, rng), k = Random(dk, rng), v = Random(dv, rng);
      L2Normalize(q.data(), dk, 1e-6f);
      L2Normalize(k.data(), dk, 1e-6f);
      std::vector<float> oa(dv), ob(dv);
      GatedDeltaStep(a.data(), a.data(), q.data(), k.data(), v.data(), 0.9f, 0.7f, 0.125f, dk, dv,
                     oa.data());
      twin(b.data(), b2.data(), q.data(), k.data(), v.data(), 0.9f, 0.7f, 0.125f, dk, dv,
           ob.data());
      std::swap(b, b2);
      ASSERT_EQ(std::memcmp(oa.data(), ob.data(), dv * sizeof(float)), 0) << dk << " " << t;
    }
    ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << dk;
  }
}

TEST(DeltaNetKernels, Avx2TwinMatchesScalar) {
  GatedDeltaStepFn twin = Avx2GatedDeltaStep();
  if (twin == nullptr) GTEST_SKIP() << "no AVX2 on this CPU";
  CheckDeltaTwinAgainstScalar(twin);
}

TEST(DeltaNetKernels, Avx512TwinMatchesScalar) {
  GatedDeltaStepFn twin = Avx512GatedDeltaStep();
  if (twin == nullptr) GTEST_SKIP() << "no AVX-512 on this CPU";
  CheckDeltaTwinAgainstScalar(twin);
}

// ---------------------------------------------------------------------------------------------
// The fixture: layer pattern and cache shapes.

TEST(Qwen3Next, LayerPatternAndCacheShapes) {
  if (!fs::exists(kF32)) GTEST_SKIP() << kF32 << " is absent";
  Result<std::unique_ptr<Model>> m = LoadModel(kF32);
  ASSERT_TRUE(m.ok()) << m.error().message;
  const Hparams& hp = (*m)->hparams();
  EXPECT_EQ(hp.n_layer, 4);
  EXPECT_EQ(hp.kv_layers(), 1);
  EXPECT_EQ(hp.recurrent.n_layer, 3);
  EXPECT_EQ(hp.recurrent.conv_channels(), 512);
  EXPECT_EQ(hp.recurrent.n_k_heads, 2);
  EXPECT_EQ(hp.recurrent.n_v_heads, 4);
  EXPECT_EQ(hp.recurrent.head_k, 64);
  EXPECT_EQ(hp.recurrent.head_v, 64);
  EXPECT_EQ(hp.rope.n_rot, 16);
  ThreadPool pool(1);
  SessionConfig sc;
  sc.n_ctx = 32;
  Session s(**m, sc, pool);
  EXPECT_EQ(s.cache().config().n_layer, 1);  // only the attention layer has K/V
  EXPECT_FALSE(s.recurrent().empty());
}

// ---------------------------------------------------------------------------------------------
// Rollback.

std::vector<int32_t> Tokens(int n) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = i == 0 ? 1 : 3 + (i * 37) % 500;
  return t;
}

class Qwen3NextSession : public testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(kF32)) GTEST_SKIP() << kF32 << " is absent";
    Result<std::unique_ptr<Model>> m = LoadModel(kF32);
    ASSERT_TRUE(m.ok()) << m.error().message;
    model_ = std::move(*m);
  }
  std::unique_ptr<Model> model_;
};

TEST_F(Qwen3NextSession, TruncateWithinTheRingRestoresTheStateExactly) {
  ThreadPool pool(2);
  SessionConfig sc;
  sc.n_ctx = 96;
  sc.kv_type = KvType::kF32;
  sc.recurrent_ring = 8;
  const std::vector<int32_t> tokens = Tokens(60);
  Session ref(*model_, sc, pool);
  ASSERT_TRUE(ref.Eval(std::vector<int32_t>(tokens.begin(), tokens.begin() + 53), false).ok());
  const std::vector<float> at53 = RecurrentStateFloats(ref, 0);

  // The ring holds the states after the last 8 tokens (53..60): 52 is one too far.
  Session s(*model_, sc, pool);
  ASSERT_TRUE(s.Eval(tokens, false).ok());
  EXPECT_NE(RecurrentStateFloats(s, 0), at53);
  EXPECT_EQ(s.ExactKeep(0, 52), 0);
  ASSERT_TRUE(s.TruncateExact(0, 53).ok());
  EXPECT_EQ(s.n_past(), 53);
  EXPECT_EQ(RecurrentStateFloats(s, 0), at53);
  // Cut again to the same length: no change.
  ASSERT_TRUE(s.TruncateExact(0, 53).ok());
  EXPECT_EQ(RecurrentStateFloats(s, 0), at53);

  // Past the ring: TruncateExact refuses and changes nothing; Truncate keeps nothing.
  const std::vector<float> before = RecurrentStateFloats(s, 0);
  Status st = s.TruncateExact(0, 40);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("recurrent state is kept for the last 8 tokens"),
            std::string::npos)
      << st.error().message;
  EXPECT_EQ(s.n_past(), 53);
  EXPECT_EQ(RecurrentStateFloats(s, 0), before);
  s.Truncate(0, 40);
  EXPECT_EQ(s.n_past(), 0);
  EXPECT_EQ(RecurrentStateFloats(s, 0), std::vector<float>(before.size(), 0.0f));
}

// The planted fault: Truncate moves the length back but leaves the rejected tokens' state.
class StateLeftUnrestored : public WriteObserver {
 public:
  bool SkipStateRestore(int, int, int) const override { return true; }
};

TEST_F(Qwen3NextSession, PlantedFaultStateNotRestoredIsVisible) {
  ThreadPool pool(2);
  SessionConfig sc;
  sc.n_ctx = 64;
  sc.recurrent_ring = 8;
  const std::vector<int32_t> tokens = Tokens(30);
  Session ref(*model_, sc, pool);
  ASSERT_TRUE(ref.Eval(std::vector<int32_t>(tokens.begin(), tokens.begin() + 25), false).ok());
  const StateLeftUnrestored fault;
  sc.write_observer = &fault;
  Session s(*model_, sc, pool);
  ASSERT_TRUE(s.Eval(tokens, false).ok());
  ASSERT_TRUE(s.TruncateExact(0, 25).ok());
  EXPECT_NE(RecurrentStateFloats(s, 0), RecurrentStateFloats(ref, 0))
      << "a state left unrestored went unnoticed";
}

TEST_F(Qwen3NextSession, CopyPrefixCopiesStateLikeKv) {
  ThreadPool pool(2);
  SessionConfig sc;
  sc.n_ctx = 64;
  sc.n_seq = 2;
  sc.recurrent_ring = 8;
  const std::vector<int32_t> tokens = Tokens(50);
  Session s(*model_, sc, pool);
  ASSERT_TRUE(s.Eval(tokens, false).ok());
  s.CopyPrefix(0, 1, 50);
  EXPECT_EQ(s.n_past(1), 50);
  EXPECT_EQ(RecurrentStateFloats(s, 1), RecurrentStateFloats(s, 0));
  s.CopyPrefix(0, 1, 45);  // from the ring, then continue sequence 1 to 50
  EXPECT_EQ(s.n_past(1), 45);
  ASSERT_TRUE(s.EvalSeq(1, tokens.data() + 45, 5, false).ok());
  EXPECT_EQ(RecurrentStateFloats(s, 1), RecurrentStateFloats(s, 0));
  s.CopyPrefix(0, 1, 20);  // past the ring: nothing is kept
  EXPECT_EQ(s.n_past(1), 0);
  EXPECT_EQ(RecurrentStateFloats(s, 1),
            std::vector<float>(RecurrentStateFloats(s, 0).size(), 0.0f));
}

// ---------------------------------------------------------------------------------------------
// Malformed files: the shipped Q4_K_M fixture rewritten with one defect each.

struct Defect {
  std::string name;
  std::map<std::string, uint32_t> set_u32;  // metadata keys overwritten
  std::string drop_key;                     // metadata key removed
  std::string drop_tensor;                  // tensor removed
  std::string want;                         // expected in the error
};

std::string Rewrite(const std::string& src, const std::string& dst, const Defect& d) {
  Result<std::unique_ptr<gguf::File>> f = gguf::File::Open(src);
  if (!f.ok()) return f.error().message;
  gguf::Writer w;
  for (const auto& [key, value] : (*f)->metadata()) {
    if (key == d.drop_key || d.set_u32.count(key)) continue;
    w.SetValue(key, value);
  }
  for (const auto& [key, v] : d.set_u32) w.SetU32(key, v);
  for (const gguf::TensorInfo& t : (*f)->tensors()) {
    if (t.name == d.drop_tensor) continue;
    w.AddTensor(t.name, t.type, std::vector<int64_t>(t.ne, t.ne + t.n_dims), t.data, t.n_bytes);
  }
  Status st = w.WriteFile(dst);
  return st.ok() ? "" : st.error().message;
}

TEST(Qwen3NextMalformed, EachDefectGivesOneClearError) {
  if (!fs::exists(kQ4)) GTEST_SKIP() << kQ4 << " is absent";
  const fs::path dir = fs::temp_directory_path() / ("lamina_q3n_" + std::to_string(getpid()));
  fs::create_directories(dir);
  const std::vector<Defect> defects = {
      {"missing_state_tensor", {}, "", "blk.1.ssm_a", "missing tensor blk.1.ssm_a"},
      {"missing_conv", {}, "", "blk.0.ssm_conv1d.weight", "missing tensor blk.0.ssm_conv1d.weight"},
      {"missing_conv_kernel_key",
       {},
       "qwen3next.ssm.conv_kernel",
       "",
       "missing or invalid required key qwen3next.ssm.conv_kernel"},
      {"v_heads_not_multiple",
       {{"qwen3next.ssm.group_count", 3}},
       "",
       "",
       "inconsistent head counts"},
      {"inner_not_multiple",
       {{"qwen3next.ssm.inner_size", 250}},
       "",
       "",
       "inconsistent head counts"},
      {"inner_disagrees_with_tensors",
       {{"qwen3next.ssm.inner_size", 512}},
       "",
       "",
       "\"qwen3next.ssm.inner_size\" = 512, but it gives 4 value heads of 128, and "
       "blk.0.ssm_norm.weight has 64"},
      {"no_attention_layer",
       {{"qwen3next.full_attention_interval", 5}},
       "",
       "",
       "leaves no full-attention layer"},
      {"layer_pattern_disagrees",
       {{"qwen3next.full_attention_interval", 2}},
       "",
       "",
       "\"qwen3next.full_attention_interval\" = 2, but it makes blk.1 a full-attention layer, "
       "and blk.1.attn_q.weight is missing"},
  };
  for (const Defect& d : defects) {
    const std::string path = (dir / (d.name + ".gguf")).string();
    ASSERT_EQ(Rewrite(kQ4, path, d), "") << d.name;
    Result<std::unique_ptr<Model>> m = LoadModel(path);
    ASSERT_FALSE(m.ok()) << d.name << " loaded";
    const std::string& msg = m.error().message;
    EXPECT_NE(msg.find(d.want), std::string::npos) << d.name << ": " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << d.name << ": " << msg;
  }
  fs::remove_all(dir);
}

// The legacy fused layout: ssm_in holds per K head g the rows [q_g | k_g | v_g | z_g] of
// attn_qkv and attn_gate. The F32 fixture rewritten that way gives the same logits (each output
// row is the same dot product, only its place in the matrix moves).
TEST(Qwen3NextFused, SsmInGivesTheSplitLayoutsLogits) {
  if (!fs::exists(kF32)) GTEST_SKIP() << kF32 << " is absent";
  Result<std::unique_ptr<gguf::File>> f = gguf::File::Open(kF32);
  ASSERT_TRUE(f.ok()) << f.error().message;
  const int kHeads = 2, vHeads = 4, hk = 64, hv = 64, d = 256, r = vHeads / kHeads;
  const size_t row = d * sizeof(float);
  gguf::Writer w;
  for (const auto& [key, value] : (*f)->metadata()) w.SetValue(key, value);
  std::vector<std::vector<uint8_t>> fused;  // keeps each ssm_in's data alive until written
  for (const gguf::TensorInfo& t : (*f)->tensors()) {
    const std::string& n = t.name;
    const size_t dot = n.find(".attn_qkv.");
    if (n.find(".attn_gate.") != std::string::npos) continue;
    if (dot == std::string::npos) {
      w.AddTensor(n, t.type, std::vector<int64_t>(t.ne, t.ne + t.n_dims), t.data, t.n_bytes);
      continue;
    }
    const std::string p = n.substr(0, dot);
    const gguf::TensorInfo* gate = (*f)->FindTensor(p + ".attn_gate.weight");
    ASSERT_NE(gate, nullptr);
    ASSERT_EQ(t.type, GgmlType::kF32);
    std::vector<uint8_t> out;
    auto rows = [&](const uint8_t* src, int first, int count) {
      out.insert(out.end(), src + first * row, src + (first + count) * row);
    };
    for (int g = 0; g < kHeads; ++g) {
      rows(t.data, g * hk, hk);                            // q_g
      rows(t.data, kHeads * hk + g * hk, hk);              // k_g
      rows(t.data, 2 * kHeads * hk + g * r * hv, r * hv);  // v of V heads g*r..
      rows(gate->data, g * r * hv, r * hv);                // z of the same heads
    }
    const int64_t n_rows = static_cast<int64_t>(out.size() / row);
    fused.push_back(std::move(out));
    w.AddTensor(p + ".ssm_in.weight", GgmlType::kF32, {d, n_rows}, fused.back().data(),
                fused.back().size());
  }
  const fs::path dir = fs::temp_directory_path() / ("lamina_q3n_fused_" + std::to_string(getpid()));
  fs::create_directories(dir);
  const std::string path = (dir / "fused.gguf").string();
  ASSERT_TRUE(w.WriteFile(path).ok());
  Result<std::unique_ptr<Model>> split = LoadModel(kF32);
  Result<std::unique_ptr<Model>> joined = LoadModel(path);
  ASSERT_TRUE(split.ok() && joined.ok()) << (joined.ok() ? "" : joined.error().message);
  ThreadPool pool(2);
  SessionConfig sc;
  sc.n_ctx = 64;
  const std::vector<int32_t> tokens = Tokens(40);
  Session a(**split, sc, pool), b(**joined, sc, pool);
  Result<const float*> la = a.Eval(tokens, true);
  Result<const float*> lb = b.Eval(tokens, true);
  ASSERT_TRUE(la.ok() && lb.ok());
  const size_t n = tokens.size() * (*split)->hparams().n_vocab;
  double max_diff = 0;
  for (size_t i = 0; i < n; ++i)
    max_diff = std::max(max_diff, double(std::fabs((*la)[i] - (*lb)[i])));
  EXPECT_LT(max_diff, 1e-5);
  EXPECT_EQ(RecurrentStateFloats(a, 0), RecurrentStateFloats(b, 0));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace lamina
