// gpt-oss's pieces: attention sinks (f32 attention with sinks equals a double-precision softmax
// whose denominator holds exp(sink); every KV mode keeps batch and thread invariance with them;
// a sink of -inf changes no bit), the swiglu_oai activation and the softmax over the chosen
// experts against direct formulas, and the metadata the loader refuses, naming the key.
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
#include "model/moe.h"
#include "runtime/attention.h"
#include "runtime/kv_cache.h"

namespace lamina {
namespace {

namespace fs = std::filesystem;

const std::string kFixture =
    std::string(LAMINA_SOURCE_DIR) + "/tests/fixtures/models/synth-gpt-oss-d256.MXFP4_MOE.gguf";

// A one-layer cache holding n_cells random K/V rows ([n_cells, n_kv, hd]).
KvCache MakeCache(KvType type, int kv_window, int n_ctx, int n_cells, int n_kv, int hd) {
  KvCacheConfig c;
  c.n_layer = 1;
  c.n_ctx = n_ctx;
  c.n_kv_heads = n_kv;
  c.head_dim = hd;
  c.type = type;
  c.window = kv_window;
  c.rope.n_rot = hd;
  c.rope.style = RopeStyle::kNeox;
  KvCache cache(c);
  std::mt19937 rng(11 + static_cast<int>(type));
  std::normal_distribution<float> unit(0.0f, 1.0f);
  std::vector<float> k(static_cast<size_t>(n_cells) * n_kv * hd);  // [n_cells, n_kv, hd]
  std::vector<float> v(k.size());                                  // [n_cells, n_kv, hd]
  for (size_t i = 0; i < k.size(); ++i) {
    k[i] = 2.0f * unit(rng);
    v[i] = unit(rng);
  }
  cache.Write(0, 0, 0, n_cells, k.data(), v.data());
  return cache;
}

// Softmax attention in double over rows [lo, hi) of one head ([n, hd] rows), the sink's
// exp(sink - max) in the denominator.
std::vector<double> Reference(const float* q, const float* k, const float* v, int lo, int hi,
                              int hd, float scale, double sink) {
  std::vector<double> w(hi - lo);  // [hi - lo]
  double mx = sink, sum = 0;
  for (int p = lo; p < hi; ++p) {
    double d = 0;
    for (int e = 0; e < hd; ++e) d += double(q[e]) * k[static_cast<size_t>(p) * hd + e];
    w[p - lo] = d * scale;
    mx = std::max(mx, w[p - lo]);
  }
  for (double& x : w) sum += (x = std::exp(x - mx));
  sum += std::exp(sink - mx);
  std::vector<double> out(hd, 0.0);  // [hd]
  for (int p = lo; p < hi; ++p) {
    for (int e = 0; e < hd; ++e) out[e] += w[p - lo] / sum * v[static_cast<size_t>(p) * hd + e];
  }
  return out;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

struct Span {
  int n_ctx, pos0, n_tok, window;
};

// Short contexts (one cell chunk) and one split into chunks (merged with the sink), with and
// without a sliding window.
const Span kSpans[] = {{200, 150, 12, 0},
                       {200, 150, 12, 37},
                       {2 * kAttentionCellChunk + 64, 2 * kAttentionCellChunk - 5, 11, 0},
                       {2 * kAttentionCellChunk + 64, 2 * kAttentionCellChunk - 5, 11, 300}};

TEST(AttentionSinks, F32MatchesDoubleSoftmaxWithTheSink) {
  const int hd = 64, n_kv = 2, n_head = 4;
  // Sinks below, among and above the scores (a sink of 9 takes most of a short context's mass
  // and about half of a long one's).
  const std::vector<float> sinks = {-3.0f, 0.0f, 1.5f, 9.0f};  // [n_head]
  for (const Span& s : kSpans) {
    const int n_cells = s.pos0 + s.n_tok;
    const KvCache cache = MakeCache(KvType::kF32, 0, s.n_ctx, n_cells, n_kv, hd);
    std::mt19937 rng(3);
    std::normal_distribution<float> unit(0.0f, 1.0f);
    const size_t row = static_cast<size_t>(n_head) * hd;
    std::vector<float> q(s.n_tok * row), out(q.size());  // [n_tok, n_head, hd]
    for (float& x : q) x = unit(rng);
    AttentionShape shape{n_head,   n_kv,        hd, 1.0f / std::sqrt(static_cast<float>(hd)),
                         s.window, sinks.data()};
    AttentionScratch scratch;
    ThreadPool pool(2);
    CausalAttention(cache, 0, 0, s.pos0, s.n_tok, q.data(), out.data(), shape, scratch, pool);
    std::vector<float> kr(static_cast<size_t>(n_cells) * hd), vr(kr.size());  // [n_cells, hd]
    double worst_moved = 0;  // the largest change the sink made against no sink
    for (int h = 0; h < n_head; ++h) {
      cache.ReadHeadRows(0, 0, 0, h / (n_head / n_kv), n_cells, kr.data());
      cache.ReadHeadRows(1, 0, 0, h / (n_head / n_kv), n_cells, vr.data());
      for (int t = 0; t < s.n_tok; ++t) {
        const int p = s.pos0 + t;
        const int lo = s.window > 0 ? std::max(0, p - s.window + 1) : 0;
        const float* qr = q.data() + t * row + h * hd;
        const std::vector<double> want =
            Reference(qr, kr.data(), vr.data(), lo, p + 1, hd, shape.scale, sinks[h]);
        const std::vector<double> plain =
            Reference(qr, kr.data(), vr.data(), lo, p + 1, hd, shape.scale, -1e300);
        for (int e = 0; e < hd; ++e) {
          ASSERT_NEAR(out[t * row + h * hd + e], want[e], 1e-5)
              << "n_ctx " << s.n_ctx << " window " << s.window << " head " << h << " token " << t;
          worst_moved = std::max(worst_moved, std::abs(want[e] - plain[e]));
        }
      }
    }
    EXPECT_GT(worst_moved, 1e-2) << "the sinks should move the output";
  }
}

class AttentionSinkModes : public testing::TestWithParam<KvType> {};

// In every KV mode: the batch equals its queries one by one and on 3 threads with sinks; sinks
// change the output; sinks of -inf give the bits of no sinks.
TEST_P(AttentionSinkModes, BatchInvariantAndMinusInfinityIsNoSink) {
  const KvType type = GetParam();
  const int hd = 64, n_kv = 2, n_head = 4;
  const std::vector<float> sinks = {0.5f, -1.0f, 2.0f, 0.0f};  // [n_head]
  const std::vector<float> none(n_head, -INFINITY);            // [n_head]
  for (const Span& s : kSpans) {
    for (int kv_window : {0, 12}) {
      if (!KvModeOf(type).quantized && kv_window != 0) continue;
      const KvCache cache = MakeCache(type, kv_window, s.n_ctx, s.pos0 + s.n_tok, n_kv, hd);
      std::mt19937 rng(5);
      std::normal_distribution<float> unit(0.0f, 1.0f);
      const size_t row = static_cast<size_t>(n_head) * hd;
      std::vector<float> q(s.n_tok * row);  // [n_tok, n_head, hd]
      for (float& x : q) x = unit(rng);
      AttentionShape shape{n_head, n_kv, hd, 0.125f, s.window, sinks.data()};
      AttentionScratch scratch;
      ThreadPool pool1(1), pool3(3);
      std::vector<float> out(q.size()), out3(q.size()), single(q.size()), plain(q.size()),
          minf(q.size());
      CausalAttention(cache, 0, 0, s.pos0, s.n_tok, q.data(), out.data(), shape, scratch, pool1);
      CausalAttention(cache, 0, 0, s.pos0, s.n_tok, q.data(), out3.data(), shape, scratch, pool3);
      for (int t = 0; t < s.n_tok; ++t) {
        CausalAttention(cache, 0, 0, s.pos0 + t, 1, q.data() + t * row, single.data() + t * row,
                        shape, scratch, pool3);
      }
      AttentionShape no_sink = shape;
      no_sink.sinks = nullptr;
      CausalAttention(cache, 0, 0, s.pos0, s.n_tok, q.data(), plain.data(), no_sink, scratch,
                      pool1);
      AttentionShape inf_sink = shape;
      inf_sink.sinks = none.data();
      CausalAttention(cache, 0, 0, s.pos0, s.n_tok, q.data(), minf.data(), inf_sink, scratch,
                      pool3);
      const std::string where = std::string(KvTypeName(type)) + " n_ctx " +
                                std::to_string(s.n_ctx) + " window " + std::to_string(s.window) +
                                " kv window " + std::to_string(kv_window);
      EXPECT_TRUE(SameBits(out, single)) << where << ": batch vs one by one";
      EXPECT_TRUE(SameBits(out, out3)) << where << ": 1 vs 3 threads";
      EXPECT_FALSE(SameBits(out, plain)) << where << ": the sinks changed nothing";
      EXPECT_TRUE(SameBits(plain, minf)) << where << ": sinks of -inf are no sinks";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, AttentionSinkModes,
                         testing::Values(KvType::kF32, KvType::kF16, KvType::kInt8, KvType::kQ4_0,
                                         KvType::kK8V4, KvType::kK8V4Nl),
                         [](const testing::TestParamInfo<KvType>& info) {
                           return std::string(KvTypeName(info.param));
                         });

TEST(SwigluOai, MatchesTheFormula) {
  const std::vector<float> gate = {-20.0f, -1.0f, 0.0f, 0.5f, 6.9f, 7.0f, 30.0f};  // [7]
  const std::vector<float> up = {1.0f, -9.0f, 2.0f, 0.25f, 8.0f, -7.5f, 3.0f};     // [7]
  std::vector<float> out(gate.size());
  SwigluOaiMul(gate.data(), up.data(), static_cast<int64_t>(gate.size()), 1.702f, 7.0f, out.data());
  for (size_t i = 0; i < gate.size(); ++i) {
    const double g = std::min<double>(gate[i], 7.0);
    const double u = std::clamp<double>(up[i], -7.0, 7.0);
    const double want = g / (1.0 + std::exp(-1.702 * g)) * (u + 1.0);
    EXPECT_NEAR(out[i], want, 1e-5 * std::max(1.0, std::abs(want))) << i;
  }
}

// softmax_selected: the k largest logits (ties to the lower id), weighted by their own softmax.
TEST(RouteTopK, SoftmaxOverTheChosenLogits) {
  std::vector<float> logits = {0.5f, 3.0f, -1.0f, 3.0f, 2.0f, -4.0f};  // [1, 6]
  std::vector<int32_t> ids(3);
  std::vector<float> w(3);
  RouteTopK(logits.data(), 1, 6, 3, false, ids.data(), w.data(), /*softmax_selected=*/true);
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 3, 4}));
  const double z = 2 * std::exp(3.0) + std::exp(2.0);
  EXPECT_NEAR(w[0], std::exp(3.0) / z, 1e-6);
  EXPECT_NEAR(w[1], std::exp(3.0) / z, 1e-6);
  EXPECT_NEAR(w[2], std::exp(2.0) / z, 1e-6);
}

// The fixture rewritten with one metadata key changed (or removed: `set` empty), then loaded.
Result<std::unique_ptr<Model>> LoadWith(const std::string& key,
                                        const std::function<void(gguf::Writer&)>& set) {
  Result<std::unique_ptr<gguf::File>> f = gguf::File::Open(kFixture);
  if (!f.ok()) return f.error();
  gguf::Writer w;
  for (const auto& [k, v] : (*f)->metadata()) {
    if (k != key) w.SetValue(k, v);
  }
  if (set) set(w);
  for (const gguf::TensorInfo& t : (*f)->tensors()) {
    std::vector<int64_t> ne(t.ne, t.ne + t.n_dims);
    w.AddTensor(t.name, t.type, ne, t.data, t.n_bytes);
  }
  const std::string path =
      testing::TempDir() + "/gptoss_meta_" + std::to_string(getpid()) + ".gguf";
  Status st = w.WriteFile(path);
  if (!st.ok()) return st.error();
  Result<std::unique_ptr<Model>> m = LoadModel(path);
  fs::remove(path);
  return m;
}

TEST(GptOssMetadata, TheFixtureLoadsAsLlamaCppReadsIt) {
  if (!fs::exists(kFixture)) GTEST_SKIP() << kFixture << " is absent";
  Result<std::unique_ptr<Model>> m = LoadModel(kFixture);
  ASSERT_TRUE(m.ok()) << m.error().message;
  const Hparams& hp = (*m)->hparams();
  EXPECT_EQ(hp.swa_layers, (std::vector<uint8_t>{1, 0}));  // the default period 2
  EXPECT_EQ(hp.sliding_window(0), 16);
  EXPECT_EQ(hp.sliding_window(1), 0);
  // YaRN on both layers: the local ones rotate as the global ones.
  EXPECT_EQ(hp.rope.freq_scale, 0.25f);
  EXPECT_EQ(hp.rope_swa.freq_scale, 0.25f);
  EXPECT_EQ(hp.rope_swa.ext_factor, 1.0f);
  EXPECT_EQ(hp.rope_swa.freq_base, hp.rope.freq_base);
  EXPECT_NE((*m)->AttentionSinks(0), nullptr);
  EXPECT_NE((*m)->AttentionSinks(1), nullptr);
}

TEST(GptOssMetadata, ValuesItCannotHoldAreRefusedByName) {
  if (!fs::exists(kFixture)) GTEST_SKIP() << kFixture << " is absent";
  struct Bad {
    const char* key;
    std::function<void(gguf::Writer&)> set;  // empty: the key removed
  };
  const Bad bad[] = {
      {"gpt-oss.attention.sliding_window", nullptr},
      {"gpt-oss.attention.sliding_window",
       [](gguf::Writer& w) { w.SetI32("gpt-oss.attention.sliding_window", -4); }},
      {"gpt-oss.attention.sliding_window_pattern",
       [](gguf::Writer& w) { w.SetI32("gpt-oss.attention.sliding_window_pattern", -1); }},
      {"gpt-oss.rope.freq_base_swa",
       [](gguf::Writer& w) { w.SetF32("gpt-oss.rope.freq_base_swa", -1.0f); }},
      {"gpt-oss.expert_feed_forward_length", nullptr},
      {"gpt-oss.expert_feed_forward_length",
       [](gguf::Writer& w) { w.SetU32("gpt-oss.expert_feed_forward_length", 96); }},
      {"gpt-oss.expert_used_count",
       [](gguf::Writer& w) { w.SetU32("gpt-oss.expert_used_count", 9); }},
      {"gpt-oss.expert_count", [](gguf::Writer& w) { w.SetU32("gpt-oss.expert_count", 4); }},
      {"gpt-oss.rope.scaling.type",
       [](gguf::Writer& w) { w.SetString("gpt-oss.rope.scaling.type", "longrope"); }},
  };
  for (const Bad& b : bad) {
    Result<std::unique_ptr<Model>> m = LoadWith(b.key, b.set);
    ASSERT_FALSE(m.ok()) << b.key;
    // The key without the architecture prefix (messages name it either way).
    const std::string tail = std::string(b.key).substr(std::strlen("gpt-oss."));
    EXPECT_NE(m.error().message.find(tail), std::string::npos) << m.error().message;
  }
  // A missing sink tensor is named too.
  Result<std::unique_ptr<gguf::File>> f = gguf::File::Open(kFixture);
  ASSERT_TRUE(f.ok());
  gguf::Writer w;
  for (const auto& [k, v] : (*f)->metadata()) w.SetValue(k, v);
  for (const gguf::TensorInfo& t : (*f)->tensors()) {
    if (t.name == "blk.1.attn_sinks.weight") continue;
    w.AddTensor(t.name, t.type, std::vector<int64_t>(t.ne, t.ne + t.n_dims), t.data, t.n_bytes);
  }
  const std::string path =
      testing::TempDir() + "/gptoss_sinks_" + std::to_string(getpid()) + ".gguf";
  ASSERT_TRUE(w.WriteFile(path).ok());
  Result<std::unique_ptr<Model>> m = LoadModel(path);
  fs::remove(path);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.error().message.find("blk.1.attn_sinks.weight"), std::string::npos)
      << m.error().message;
}

}  // namespace
}  // namespace lamina
