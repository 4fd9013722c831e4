// Qwen family unit tests: YaRN RoPE against a double-precision reference written from the YaRN
// paper, rope-scaling metadata and overrides, chat templates rendered byte for byte, MoE
// routing and the grouped expert FFN against a dense reference, and a qwen3 model whose
// head_dim differs from n_embd / n_head against a naive forward pass.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <numeric>
#include <random>

#include "chat/chat_template.h"
#include "gguf/gguf.h"
#include "kernels/ops.h"
#include "model/hparams.h"
#include "model/moe.h"
#include "runtime/session.h"

namespace lamina {
namespace {

namespace fs = std::filesystem;
const std::string kShared = LAMINA_SHARED_DIR;

// ---------------------------------------------------------------------------------------------
// YaRN (Peng et al. 2023, "YaRN: Efficient Context Window Extension of Large Language Models").
// Pair i of a d-dimensional rotary embedding turns at theta_i = b^(-2i/d) radians per position;
// its wavelength is lambda_i = 2*pi / theta_i and r_i = L / lambda_i counts its rotations over
// the original context L. With scale s, YaRN's "NTK-by-parts" keeps pairs with r_i > beta
// (high frequency) unscaled, divides those with r_i < alpha by s, and ramps between them:
//   h(theta_i) = (1 - gamma_i) * theta_i / s + gamma_i * theta_i.
// The paper's reference code (and GGUF/llama.cpp) places the ramp on the pair index: r(i) = beta
// is solved for i (i = d * ln(L / (2*pi*beta)) / (2 ln b)), floored for beta_fast and ceiled for
// beta_slow, and gamma falls linearly from 1 to 0 between those indices. Attention logits are
// scaled by 1/t with sqrt(1/t) = 0.1 ln(s) + 1, applied to q and k alike.
struct YarnReference {
  int d;        // rotated dimensions
  double base;  // b
  double s;     // scale factor
  double L;     // original context length
  double beta_fast = 32.0, beta_slow = 1.0;

  double Theta(int i) const { return std::pow(base, -2.0 * i / d); }
  double Rotations(int i) const { return L / (2.0 * M_PI / Theta(i)); }
  double IndexWithRotations(double r) const {
    return d * std::log(L / (2.0 * M_PI * r)) / (2.0 * std::log(base));
  }
  double Gamma(int i) const {
    const double lo = std::max(0.0, std::floor(IndexWithRotations(beta_fast)));
    const double hi = std::min(d - 1.0, std::ceil(IndexWithRotations(beta_slow)));
    const double y = (i - lo) / std::max(0.001, hi - lo);
    return 1.0 - std::clamp(y, 0.0, 1.0);
  }
  double Angle(int64_t pos, int i) const {
    const double g = Gamma(i);
    return pos * ((1.0 - g) * Theta(i) / s + g * Theta(i));
  }
  double Magnitude() const { return 0.1 * std::log(s) + 1.0; }
};

void ExpectRopeMatchesReference(const YarnReference& ref) {
  RopeParams p;
  p.n_rot = ref.d;
  p.freq_base = static_cast<float>(ref.base);
  p.freq_scale = static_cast<float>(1.0 / ref.s);
  p.ext_factor = 1.0f;
  p.attn_factor = 1.0f;
  p.n_ctx_orig = static_cast<int>(ref.L);
  std::vector<float> cs(ref.d);  // [n_rot/2][cos, sin]
  int n_ramp = 0;
  for (int64_t pos : {0, 1, 2, 3, 10, 100, 1000, 4000}) {
    RopeCache(p, pos, cs.data());
    for (int i = 0; i < ref.d / 2; ++i) {
      // Angles are built by repeated float multiplication (as GGML does): pair i's frequency
      // carries ~i float roundings, so the bound grows with i and with the angle.
      const double tol = 2.4e-7 * (i + 2) * pos * ref.Theta(i) + 2e-6;
      const double a = ref.Angle(pos, i), m = ref.Magnitude();
      EXPECT_NEAR(cs[2 * i], std::cos(a) * m, tol * m) << "pos " << pos << " pair " << i;
      EXPECT_NEAR(cs[2 * i + 1], std::sin(a) * m, tol * m) << "pos " << pos << " pair " << i;
      if (pos == 1) {
        const double g = ref.Gamma(i);
        // The paper's regions: r > beta is extrapolated, r < alpha interpolated.
        if (ref.Rotations(i) > ref.beta_fast) {
          EXPECT_EQ(g, 1.0) << i;
        }
        if (ref.Rotations(i) < ref.beta_slow) {
          EXPECT_EQ(g, 0.0) << i;
        }
        if (g > 0.0 && g < 1.0) ++n_ramp;
      }
    }
  }
  EXPECT_GT(n_ramp, 2) << "the configuration should exercise the ramp";
}

TEST(Yarn, FrequenciesAndMagnitudeMatchPaperReference) {
  ExpectRopeMatchesReference({/*d=*/128, /*base=*/1e6, /*s=*/4.0, /*L=*/32768});  // Qwen3
  ExpectRopeMatchesReference({/*d=*/64, /*base=*/1e4, /*s=*/8.0, /*L=*/4096});
  ExpectRopeMatchesReference({/*d=*/64, /*base=*/1e4, /*s=*/2.0, /*L=*/2048});
}

TEST(Yarn, AttnFactorMultipliesMagnitude) {
  RopeParams p;
  p.n_rot = 64;
  p.freq_base = 1e4f;
  p.freq_scale = 0.25f;
  p.ext_factor = 1.0f;
  p.attn_factor = 0.5f;
  p.n_ctx_orig = 4096;
  std::vector<float> cs(64);
  RopeCache(p, 17, cs.data());
  for (int i = 0; i < 32; ++i) {
    EXPECT_NEAR(std::hypot(cs[2 * i], cs[2 * i + 1]), 0.5 * (0.1 * std::log(4.0) + 1.0), 1e-6);
  }
}

TEST(Yarn, LinearScalingDividesEveryFrequency) {
  RopeParams p;
  p.n_rot = 32;
  p.freq_base = 1e4f;
  p.freq_scale = 0.25f;
  std::vector<float> cs(32);
  RopeCache(p, 40, cs.data());
  for (int i = 0; i < 16; ++i) {
    const double a = 40 * std::pow(1e4, -2.0 * i / 32) / 4.0;
    EXPECT_NEAR(cs[2 * i], std::cos(a), 1e-5);
    EXPECT_NEAR(cs[2 * i + 1], std::sin(a), 1e-5);
  }
}

TEST(Yarn, ResolveRopeAppliesOverridesLikeLlamaCpp) {
  RopeParams base;
  base.n_rot = 64;
  RopeScalingConfig yarn;
  yarn.type = RopeScalingType::kYarn;
  yarn.factor = 4.0f;
  yarn.n_ctx_orig = 32768;
  RopeParams p = ResolveRope(base, yarn, {});
  EXPECT_FLOAT_EQ(p.freq_scale, 0.25f);
  EXPECT_EQ(p.ext_factor, 1.0f);
  EXPECT_EQ(p.n_ctx_orig, 32768);

  RopeOverrides none;
  none.type = RopeScalingType::kNone;
  p = ResolveRope(base, yarn, none);
  EXPECT_EQ(p.freq_scale, 1.0f);
  EXPECT_EQ(p.ext_factor, 0.0f);

  RopeOverrides more;
  more.scale = 8.0f;
  more.yarn_orig_ctx = 16384;
  p = ResolveRope(base, yarn, more);
  EXPECT_FLOAT_EQ(p.freq_scale, 0.125f);
  EXPECT_EQ(p.ext_factor, 1.0f);
  EXPECT_EQ(p.n_ctx_orig, 16384);

  // A model without scaling metadata is "linear, factor 1": --rope-scale alone scales linearly.
  RopeScalingConfig plain;
  plain.n_ctx_orig = 4096;
  RopeOverrides linear;
  linear.scale = 2.0f;
  p = ResolveRope(base, plain, linear);
  EXPECT_FLOAT_EQ(p.freq_scale, 0.5f);
  EXPECT_EQ(p.ext_factor, 0.0f);
  RopeOverrides to_yarn;
  to_yarn.type = RopeScalingType::kYarn;
  to_yarn.scale = 4.0f;
  p = ResolveRope(base, plain, to_yarn);
  EXPECT_EQ(p.ext_factor, 1.0f);
  EXPECT_EQ(p.n_ctx_orig, 4096);
}

// ---------------------------------------------------------------------------------------------
// A tiny qwen3 GGUF written here: head_dim 8 while n_embd / n_head = 4, so q_dim (32) differs
// from n_embd (16). The tokenizer is the stories260K vocabulary (512 tokens).
struct TinyQwen3 {
  static constexpr int kEmbd = 16, kHead = 4, kHeadKv = 2, kHeadDim = 8, kFf = 24, kLayer = 2;
  static constexpr float kEps = 1e-6f, kBase = 1e6f;
  int n_vocab = 0;
  std::map<std::string, std::vector<float>> w;  // name -> f32 data, ggml row-major
};

std::string WriteTinyQwen3(TinyQwen3* m, const std::string& path, bool yarn) {
  Result<std::unique_ptr<gguf::File>> vocab =
      gguf::File::Open(kShared + "/models/stories260K.gguf");
  if (!vocab.ok()) return vocab.error().message;
  m->n_vocab = static_cast<int>((*vocab)->Find("tokenizer.ggml.tokens")->array.size());
  gguf::Writer wr;
  const std::string a = "qwen3";
  wr.SetString("general.architecture", a);
  wr.SetU32(a + ".embedding_length", TinyQwen3::kEmbd);
  wr.SetU32(a + ".block_count", TinyQwen3::kLayer);
  wr.SetU32(a + ".attention.head_count", TinyQwen3::kHead);
  wr.SetU32(a + ".attention.head_count_kv", TinyQwen3::kHeadKv);
  wr.SetU32(a + ".attention.key_length", TinyQwen3::kHeadDim);
  wr.SetU32(a + ".attention.value_length", TinyQwen3::kHeadDim);
  wr.SetU32(a + ".feed_forward_length", TinyQwen3::kFf);
  wr.SetU32(a + ".context_length", 256);
  wr.SetF32(a + ".rope.freq_base", TinyQwen3::kBase);
  wr.SetF32(a + ".attention.layer_norm_rms_epsilon", TinyQwen3::kEps);
  if (yarn) {
    wr.SetString(a + ".rope.scaling.type", "yarn");
    wr.SetF32(a + ".rope.scaling.factor", 4.0f);
    wr.SetU32(a + ".rope.scaling.original_context_length", 64);
    wr.SetF32(a + ".rope.scaling.yarn_beta_fast", 16.0f);
  }
  for (const auto& [key, value] : (*vocab)->metadata()) {
    if (key.rfind("tokenizer.", 0) == 0) wr.SetValue(key, value);
  }
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto add = [&](const std::string& name, std::vector<int64_t> ne, float sigma, float mean) {
    int64_t n = 1;
    for (int64_t x : ne) n *= x;
    std::vector<float>& v = m->w[name];
    v.resize(n);
    for (float& x : v) x = mean + sigma * normal(rng);
    wr.AddTensor(name, GgmlType::kF32, ne, v.data(), v.size() * sizeof(float));
  };
  const int q_dim = TinyQwen3::kHead * TinyQwen3::kHeadDim;
  const int kv_dim = TinyQwen3::kHeadKv * TinyQwen3::kHeadDim;
  add("token_embd.weight", {TinyQwen3::kEmbd, m->n_vocab}, 0.5f, 0.0f);
  add("output_norm.weight", {TinyQwen3::kEmbd}, 0.1f, 1.0f);
  for (int l = 0; l < TinyQwen3::kLayer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    add(p + "attn_norm.weight", {TinyQwen3::kEmbd}, 0.1f, 1.0f);
    add(p + "attn_q.weight", {TinyQwen3::kEmbd, q_dim}, 0.4f, 0.0f);
    add(p + "attn_k.weight", {TinyQwen3::kEmbd, kv_dim}, 0.4f, 0.0f);
    add(p + "attn_v.weight", {TinyQwen3::kEmbd, kv_dim}, 0.3f, 0.0f);
    add(p + "attn_output.weight", {q_dim, TinyQwen3::kEmbd}, 0.3f, 0.0f);
    add(p + "attn_q_norm.weight", {TinyQwen3::kHeadDim}, 0.1f, 1.0f);
    add(p + "attn_k_norm.weight", {TinyQwen3::kHeadDim}, 0.1f, 1.0f);
    add(p + "ffn_norm.weight", {TinyQwen3::kEmbd}, 0.1f, 1.0f);
    add(p + "ffn_gate.weight", {TinyQwen3::kEmbd, TinyQwen3::kFf}, 0.3f, 0.0f);
    add(p + "ffn_up.weight", {TinyQwen3::kEmbd, TinyQwen3::kFf}, 0.3f, 0.0f);
    add(p + "ffn_down.weight", {TinyQwen3::kFf, TinyQwen3::kEmbd}, 0.3f, 0.0f);
  }
  Status st = wr.WriteFile(path);
  return st.ok() ? "" : st.error().message;
}

using Vec = std::vector<double>;

// y = W x for a ggml [cols, rows] f32 matrix.
Vec MatVec(const std::vector<float>& w, int cols, int rows, const Vec& x) {
  Vec y(rows, 0.0);
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < cols; ++c) y[r] += static_cast<double>(w[r * cols + c]) * x[c];
  }
  return y;
}

Vec RmsNormRef(const Vec& x, const float* w, int n, double eps) {
  double ss = 0;
  for (int i = 0; i < n; ++i) ss += x[i] * x[i];
  const double scale = 1.0 / std::sqrt(ss / n + eps);
  Vec y(n);
  for (int i = 0; i < n; ++i) y[i] = x[i] * scale * w[i];
  return y;
}

// Naive qwen3 forward in double: all logits for `tokens` at positions 0..n-1.
std::vector<Vec> NaiveQwen3(const TinyQwen3& m, const std::vector<int32_t>& tokens) {
  const int d = TinyQwen3::kEmbd, hd = TinyQwen3::kHeadDim, nh = TinyQwen3::kHead;
  const int nkv = TinyQwen3::kHeadKv, q_dim = nh * hd, kv_dim = nkv * hd;
  const int n = static_cast<int>(tokens.size());
  auto W = [&](const std::string& name) -> const std::vector<float>& { return m.w.at(name); };
  std::vector<Vec> x(n, Vec(d));
  for (int t = 0; t < n; ++t) {
    for (int i = 0; i < d; ++i) x[t][i] = W("token_embd.weight")[tokens[t] * d + i];
  }
  auto rope = [&](double* v, int pos) {  // NeoX: pairs (i, i + hd/2)
    for (int i = 0; i < hd / 2; ++i) {
      const double a = pos * std::pow(static_cast<double>(TinyQwen3::kBase), -2.0 * i / hd);
      const double x0 = v[i], x1 = v[i + hd / 2];
      v[i] = x0 * std::cos(a) - x1 * std::sin(a);
      v[i + hd / 2] = x0 * std::sin(a) + x1 * std::cos(a);
    }
  };
  for (int l = 0; l < TinyQwen3::kLayer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    std::vector<Vec> q(n), k(n), v(n);
    for (int t = 0; t < n; ++t) {
      const Vec xn = RmsNormRef(x[t], W(p + "attn_norm.weight").data(), d, TinyQwen3::kEps);
      q[t] = MatVec(W(p + "attn_q.weight"), d, q_dim, xn);
      k[t] = MatVec(W(p + "attn_k.weight"), d, kv_dim, xn);
      v[t] = MatVec(W(p + "attn_v.weight"), d, kv_dim, xn);
      for (int h = 0; h < nh; ++h) {
        Vec head(q[t].begin() + h * hd, q[t].begin() + (h + 1) * hd);
        head = RmsNormRef(head, W(p + "attn_q_norm.weight").data(), hd, TinyQwen3::kEps);
        std::copy(head.begin(), head.end(), q[t].begin() + h * hd);
        rope(q[t].data() + h * hd, t);
      }
      for (int h = 0; h < nkv; ++h) {
        Vec head(k[t].begin() + h * hd, k[t].begin() + (h + 1) * hd);
        head = RmsNormRef(head, W(p + "attn_k_norm.weight").data(), hd, TinyQwen3::kEps);
        std::copy(head.begin(), head.end(), k[t].begin() + h * hd);
        rope(k[t].data() + h * hd, t);
      }
    }
    for (int t = 0; t < n; ++t) {
      Vec attn(q_dim, 0.0);
      for (int h = 0; h < nh; ++h) {
        const int kvh = h / (nh / nkv);
        Vec score(t + 1);
        double mx = -1e300;
        for (int j = 0; j <= t; ++j) {
          double s = 0;
          for (int i = 0; i < hd; ++i) s += q[t][h * hd + i] * k[j][kvh * hd + i];
          score[j] = s / std::sqrt(static_cast<double>(hd));
          mx = std::max(mx, score[j]);
        }
        double sum = 0;
        for (double& s : score) sum += (s = std::exp(s - mx));
        for (int j = 0; j <= t; ++j) {
          for (int i = 0; i < hd; ++i) attn[h * hd + i] += score[j] / sum * v[j][kvh * hd + i];
        }
      }
      const Vec o = MatVec(W(p + "attn_output.weight"), q_dim, d, attn);
      for (int i = 0; i < d; ++i) x[t][i] += o[i];
      const Vec xn = RmsNormRef(x[t], W(p + "ffn_norm.weight").data(), d, TinyQwen3::kEps);
      Vec g = MatVec(W(p + "ffn_gate.weight"), d, TinyQwen3::kFf, xn);
      const Vec u = MatVec(W(p + "ffn_up.weight"), d, TinyQwen3::kFf, xn);
      for (int i = 0; i < TinyQwen3::kFf; ++i) g[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
      const Vec dn = MatVec(W(p + "ffn_down.weight"), TinyQwen3::kFf, d, g);
      for (int i = 0; i < d; ++i) x[t][i] += dn[i];
    }
  }
  std::vector<Vec> logits(n);
  for (int t = 0; t < n; ++t) {
    const Vec xn = RmsNormRef(x[t], W("output_norm.weight").data(), d, TinyQwen3::kEps);
    logits[t] = MatVec(W("token_embd.weight"), d, m.n_vocab, xn);  // tied output
  }
  return logits;
}

class TinyQwen3Test : public testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(kShared + "/models/stories260K.gguf")) GTEST_SKIP() << "no stories260K.gguf";
    dir_ = fs::temp_directory_path() / ("lamina_qwen_test_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }
  fs::path dir_;
};

TEST_F(TinyQwen3Test, HeadDimFromKeyLengthMatchesNaiveForward) {
  TinyQwen3 m;
  const std::string path = (dir_ / "tiny-qwen3.gguf").string();
  ASSERT_EQ(WriteTinyQwen3(&m, path, /*yarn=*/false), "");
  Result<std::unique_ptr<Model>> model = LoadModel(path);
  ASSERT_TRUE(model.ok()) << model.error().message;
  const Hparams& hp = (*model)->hparams();
  EXPECT_EQ(hp.head_dim, 8);
  EXPECT_NE(hp.head_dim, hp.n_embd / hp.n_head);
  EXPECT_EQ(hp.q_dim(), 32);
  EXPECT_EQ(hp.kv_dim(), 16);
  EXPECT_EQ(hp.rope.style, RopeStyle::kNeox);

  const std::vector<int32_t> tokens = {1, 57, 300, 9, 402, 33};
  ThreadPool pool(2);
  SessionConfig sc;
  sc.n_ctx = 64;
  sc.kv_type = KvType::kF32;
  Session session(**model, sc, pool);
  Result<const float*> got = session.Eval(tokens, true);
  ASSERT_TRUE(got.ok()) << got.error().message;
  const std::vector<Vec> want = NaiveQwen3(m, tokens);
  double max_err = 0;
  for (size_t t = 0; t < tokens.size(); ++t) {
    for (int i = 0; i < m.n_vocab; ++i) {
      max_err = std::max(max_err, std::fabs((*got)[t * m.n_vocab + i] - want[t][i]));
    }
  }
  EXPECT_LT(max_err, 1e-4);
}

TEST_F(TinyQwen3Test, YarnMetadataAndOverrides) {
  TinyQwen3 m;
  const std::string path = (dir_ / "tiny-qwen3-yarn.gguf").string();
  ASSERT_EQ(WriteTinyQwen3(&m, path, /*yarn=*/true), "");
  Result<std::unique_ptr<Model>> model = LoadModel(path);
  ASSERT_TRUE(model.ok()) << model.error().message;
  const RopeParams& r = (*model)->hparams().rope;
  EXPECT_FLOAT_EQ(r.freq_scale, 0.25f);
  EXPECT_EQ(r.ext_factor, 1.0f);
  EXPECT_EQ(r.n_ctx_orig, 64);
  EXPECT_EQ(r.beta_fast, 16.0f);
  EXPECT_EQ(r.beta_slow, 1.0f);

  RopeOverrides o;
  o.type = RopeScalingType::kLinear;
  o.scale = 2.0f;
  Result<std::unique_ptr<Model>> linear = LoadModel(path, o);
  ASSERT_TRUE(linear.ok()) << linear.error().message;
  EXPECT_FLOAT_EQ((*linear)->hparams().rope.freq_scale, 0.5f);
  EXPECT_EQ((*linear)->hparams().rope.ext_factor, 0.0f);

  RopeOverrides off;
  off.type = RopeScalingType::kNone;
  Result<std::unique_ptr<Model>> none = LoadModel(path, off);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ((*none)->hparams().rope.freq_scale, 1.0f);
  EXPECT_EQ((*none)->hparams().rope.ext_factor, 0.0f);
}

TEST(Qwen3, SyntheticModelHeadDim) {
  const std::string path = kShared + "/models/synth-qwen3-d256.F32.gguf";
  if (!fs::exists(path)) GTEST_SKIP() << path;
  Result<std::unique_ptr<Model>> model = LoadModel(path);
  ASSERT_TRUE(model.ok()) << model.error().message;
  EXPECT_EQ((*model)->hparams().head_dim, 64);
  EXPECT_EQ((*model)->hparams().n_embd / (*model)->hparams().n_head, 32);
  EXPECT_EQ((*model)->hparams().q_dim(), 512);
}

// ---------------------------------------------------------------------------------------------
// MoE.

TEST(Moe, RouteTopKSoftmaxOrderAndNormalisation) {
  // Token 0: distinct logits; token 1: a three-way tie for the top (ties go to the lower id).
  std::vector<float> logits = {1.0f, 3.0f, 2.0f, 0.5f,  //
                               2.0f, 2.0f, 1.0f, 2.0f};
  std::vector<float> probs = logits;
  std::vector<int32_t> ids(4);
  std::vector<float> w(4);
  RouteTopK(probs.data(), 2, 4, 2, /*norm_topk=*/false, ids.data(), w.data());
  const double z0 = std::exp(1.0) + std::exp(3.0) + std::exp(2.0) + std::exp(0.5);
  EXPECT_EQ(ids[0], 1);
  EXPECT_EQ(ids[1], 2);
  EXPECT_NEAR(w[0], std::exp(3.0) / z0, 1e-6);
  EXPECT_NEAR(w[1], std::exp(2.0) / z0, 1e-6);
  EXPECT_EQ(ids[2], 0);
  EXPECT_EQ(ids[3], 1);
  const double z1 = 3 * std::exp(2.0) + std::exp(1.0);
  EXPECT_NEAR(w[2], std::exp(2.0) / z1, 1e-6);

  probs = logits;
  RouteTopK(probs.data(), 2, 4, 2, /*norm_topk=*/true, ids.data(), w.data());
  EXPECT_NEAR(w[0], 1.0 / (1.0 + std::exp(-1.0)), 1e-6);
  EXPECT_NEAR(w[0] + w[1], 1.0, 1e-6);
  EXPECT_NEAR(w[2], 0.5, 1e-6);
}

struct TinyMoe {
  static constexpr int kEmbd = 8, kExpert = 4, kUsed = 2, kFfExp = 6, kFfSh = 5;
  std::vector<float> router, gate, up, down, sh_inp, sh_gate, sh_up, sh_down, norm;
  MoeWeights w;
  MoeHparams hp;

  static WeightMatrix F32(const float* data, int cols, int rows) {
    WeightMatrix m;
    m.type = GgmlType::kF32;
    m.rows = rows;
    m.cols = cols;
    m.row_bytes = cols * sizeof(float);
    m.data = reinterpret_cast<const uint8_t*>(data);
    return m;
  }

  TinyMoe(bool shared, bool norm_topk, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 0.5f);
    auto fill = [&](std::vector<float>& v, size_t n) {
      v.resize(n);
      for (float& x : v) x = nd(rng);
    };
    fill(router, kExpert * kEmbd);
    fill(gate, kExpert * kFfExp * kEmbd);
    fill(up, kExpert * kFfExp * kEmbd);
    fill(down, kExpert * kEmbd * kFfExp);
    fill(sh_inp, kEmbd);
    fill(sh_gate, kFfSh * kEmbd);
    fill(sh_up, kFfSh * kEmbd);
    fill(sh_down, kEmbd * kFfSh);
    fill(norm, kEmbd);
    for (float& x : norm) x += 1.0f;
    hp.n_expert = kExpert;
    hp.n_expert_used = kUsed;
    hp.n_ff_exp = kFfExp;
    hp.n_ff_shexp = shared ? kFfSh : 0;
    hp.norm_topk = norm_topk;
    w.norm = norm;
    w.router = F32(router.data(), kEmbd, kExpert);
    for (int e = 0; e < kExpert; ++e) {
      w.gate.push_back(F32(gate.data() + e * kFfExp * kEmbd, kEmbd, kFfExp));
      w.up.push_back(F32(up.data() + e * kFfExp * kEmbd, kEmbd, kFfExp));
      w.down.push_back(F32(down.data() + e * kEmbd * kFfExp, kFfExp, kEmbd));
    }
    if (shared) {
      w.shared_gate_inp = F32(sh_inp.data(), kEmbd, 1);
      w.shared_gate = F32(sh_gate.data(), kEmbd, kFfSh);
      w.shared_up = F32(sh_up.data(), kEmbd, kFfSh);
      w.shared_down = F32(sh_down.data(), kFfSh, kEmbd);
    }
  }

  // Dense reference: every token evaluates the router in double and runs its top-k experts.
  Vec Reference(const Vec& x) const {
    const int d = kEmbd;
    const Vec xn = RmsNormRef(x, norm.data(), d, 1e-6);
    Vec logit = MatVec(router, d, kExpert, xn);
    const double mx = *std::max_element(logit.begin(), logit.end());
    double z = 0;
    for (double& l : logit) z += (l = std::exp(l - mx));
    for (double& l : logit) l /= z;
    std::vector<int> order(kExpert);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return logit[a] > logit[b]; });
    double wsum = 0;
    for (int j = 0; j < kUsed; ++j) wsum += logit[order[j]];
    Vec out = x;
    auto ffn = [&](const float* g, const float* u, const float* dn, int ff, double scale) {
      std::vector<float> gv(g, g + ff * d), uv(u, u + ff * d), dv(dn, dn + d * ff);
      Vec a = MatVec(gv, d, ff, xn);
      const Vec b = MatVec(uv, d, ff, xn);
      for (int i = 0; i < ff; ++i) a[i] = a[i] / (1.0 + std::exp(-a[i])) * b[i];
      const Vec o = MatVec(dv, ff, d, a);
      for (int i = 0; i < d; ++i) out[i] += scale * o[i];
    };
    for (int j = 0; j < kUsed; ++j) {
      const int e = order[j];
      const double wt = hp.norm_topk ? logit[e] / wsum : logit[e];
      ffn(gate.data() + e * kFfExp * d, up.data() + e * kFfExp * d, down.data() + e * d * kFfExp,
          kFfExp, wt);
    }
    if (hp.n_ff_shexp > 0) {
      double g = 0;
      for (int i = 0; i < d; ++i) g += sh_inp[i] * xn[i];
      ffn(sh_gate.data(), sh_up.data(), sh_down.data(), kFfSh, 1.0 / (1.0 + std::exp(-g)));
    }
    return out;
  }
};

void ExpectMoeBlockMatchesReference(bool shared, bool norm_topk) {
  TinyMoe m(shared, norm_topk, shared ? 11 : 12);
  Hparams hp;
  hp.n_embd = TinyMoe::kEmbd;
  hp.rms_eps = 1e-6f;
  const int n = 13;  // enough tokens that several share each expert
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  ForwardScratch s;
  s.x.resize(n * hp.n_embd);
  s.xn.resize(n * hp.n_embd);
  for (float& v : s.x) v = nd(rng);
  std::vector<Vec> want(n);
  for (int t = 0; t < n; ++t) {
    want[t] = m.Reference(Vec(s.x.begin() + t * hp.n_embd, s.x.begin() + (t + 1) * hp.n_embd));
  }
  ForwardBatch b;
  b.n_tokens = n;
  ThreadPool pool(2);
  MoeBlock(hp, m.hp, m.w, b, s, pool);
  std::vector<int> uses(TinyMoe::kExpert, 0);
  for (int i = 0; i < n * TinyMoe::kUsed; ++i) ++uses[s.moe.ids[i]];
  EXPECT_GE(*std::max_element(uses.begin(), uses.end()), 3) << "grouping is not exercised";
  for (int t = 0; t < n; ++t) {
    for (int i = 0; i < hp.n_embd; ++i) {
      EXPECT_NEAR(s.x[t * hp.n_embd + i], want[t][i], 2e-5) << "token " << t << " dim " << i;
    }
  }
}

TEST(Moe, GroupedExpertsMatchDenseReferenceQwen2MoeStyle) {
  ExpectMoeBlockMatchesReference(/*shared=*/true, /*norm_topk=*/false);
}

TEST(Moe, GroupedExpertsMatchDenseReferenceQwen3MoeStyle) {
  ExpectMoeBlockMatchesReference(/*shared=*/false, /*norm_topk=*/true);
}

TEST(Moe, UnselectedExpertsAreNotRead) {
  TinyMoe m(/*shared=*/false, /*norm_topk=*/true, 3);
  // Expert 3's router row is strongly negative, so no token selects it; its weights are
  // replaced by invalid matrices, which MatMul would refuse if the block touched them.
  for (int c = 0; c < TinyMoe::kEmbd; ++c) m.router[3 * TinyMoe::kEmbd + c] = 0.0f;
  m.router[3 * TinyMoe::kEmbd + 0] = -1e4f;
  m.w.gate[3] = m.w.up[3] = m.w.down[3] = WeightMatrix{};
  Hparams hp;
  hp.n_embd = TinyMoe::kEmbd;
  hp.rms_eps = 1e-6f;
  const int n = 6;
  ForwardScratch s;
  s.x.assign(n * hp.n_embd, 0.0f);
  s.xn.resize(n * hp.n_embd);
  for (int t = 0; t < n; ++t) s.x[t * hp.n_embd] = 1.0f + t;  // positive first dim
  ForwardBatch b;
  b.n_tokens = n;
  ThreadPool pool(1);
  MoeBlock(hp, m.hp, m.w, b, s, pool);
  for (int i = 0; i < n * TinyMoe::kUsed; ++i) EXPECT_NE(s.moe.ids[i], 3);
}

// ---------------------------------------------------------------------------------------------
// Chat templates. Expected strings are written by hand from the official templates' output.

// The parts of Qwen3's official template that identify it (abridged).
constexpr std::string_view kQwen3Template =
    "{%- for message in messages %}{%- if (message.role == \"user\") %}{{- '<|im_start|>' + "
    "message.role + '\\n' + content + '<|im_end|>' + '\\n' }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- if enable_thinking is "
    "defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}";

constexpr std::string_view kQwen25Template =
    "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + "
    "messages[0]['content'] + '<|im_end|>\\n' }}{%- else %}{{- '<|im_start|>system\\nYou are "
    "Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content "
    "+ '<|im_end|>' + '\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- "
    "'<|im_start|>assistant\\n' }}{%- endif %}";

constexpr std::string_view kLlama3Template =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | "
    "trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}"
    "{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}";

TEST(ChatTemplate, Detection) {
  EXPECT_EQ(chat::DetectChatFormat(kQwen3Template), chat::ChatFormat::kQwen3);
  EXPECT_EQ(chat::DetectChatFormat(kQwen25Template), chat::ChatFormat::kChatML);
  EXPECT_EQ(chat::DetectChatFormat(kLlama3Template), chat::ChatFormat::kLlama3);
  EXPECT_EQ(chat::DetectChatFormat("{{ messages }}"), chat::ChatFormat::kUnknown);
  EXPECT_EQ(chat::DefaultSystemPrompt(kQwen25Template),
            "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.");
  EXPECT_EQ(chat::DefaultSystemPrompt(kQwen3Template), "");
}

TEST(ChatTemplate, Qwen3GenerationPromptWithAndWithoutThinking) {
  const std::vector<chat::ChatMessage> msgs = {
      {"system", "You are a helpful assistant."},
      {"user", "Give me a short introduction to large language models."}};
  EXPECT_EQ(chat::RenderChat(chat::ChatFormat::kQwen3, msgs, true, /*enable_thinking=*/true),
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\nGive me a short introduction to large language models.<|im_end|>\n"
            "<|im_start|>assistant\n");
  EXPECT_EQ(chat::RenderChat(chat::ChatFormat::kQwen3, msgs, true, /*enable_thinking=*/false),
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\nGive me a short introduction to large language models.<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\n");
}

TEST(ChatTemplate, Qwen3MultiTurnDropsHistoricalReasoning) {
  const std::vector<chat::ChatMessage> msgs = {
      {"user", "Hi"},
      {"assistant", "<think>\nThe user greets me.\n</think>\n\nHello! How can I help?"},
      {"user", "What is 2+2?"}};
  EXPECT_EQ(chat::RenderChat(chat::ChatFormat::kQwen3, msgs, true, /*enable_thinking=*/false),
            "<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\nHello! How can I help?<|im_end|>\n"
            "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\n");
}

TEST(ChatTemplate, Qwen3FinalAssistantTurnKeepsThinkBlock) {
  EXPECT_EQ(chat::RenderChat(
                chat::ChatFormat::kQwen3,
                {{"user", "Hi"}, {"assistant", "<think>\nGreeting.\n</think>\n\nHello!"}}, false),
            "<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\n<think>\nGreeting.\n</think>\n\nHello!<|im_end|>\n");
  // The last assistant turn after the last query gets an (empty) think block.
  EXPECT_EQ(
      chat::RenderChat(chat::ChatFormat::kQwen3, {{"user", "Hi"}, {"assistant", "Hello!"}}, false),
      "<|im_start|>user\nHi<|im_end|>\n"
      "<|im_start|>assistant\n<think>\n\n</think>\n\nHello!<|im_end|>\n");
}

TEST(ChatTemplate, ChatMLWithDefaultSystem) {
  const std::string sys = chat::DefaultSystemPrompt(kQwen25Template);
  EXPECT_EQ(chat::RenderChat(chat::ChatFormat::kChatML, {{"user", "Hello"}}, true, true, sys),
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
            "assistant.<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(chat::RenderChat(chat::ChatFormat::kChatML,
                             {{"system", "Be brief."}, {"user", "Hello"}}, true, true, sys),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n"
            "<|im_start|>assistant\n");
}

TEST(ChatTemplate, Llama3) {
  EXPECT_EQ(chat::RenderChat(chat::ChatFormat::kLlama3,
                             {{"system", "You are a bot."}, {"user", "  Hello \n"}}, true),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are a "
            "bot.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

}  // namespace
}  // namespace lamina
