// Sliding-window attention (gemma3's local layers): a query at position p sees the cells
// [p - window + 1, p] and nothing else, in every KV mode, with and without the recent exact copy,
// on short contexts and on contexts split into cell chunks; its result is the same bits whether
// the queries come as one batch or one by one, and on 1 or 3 threads. Also the metadata rules:
// the layer pattern as llama.cpp reads it and the errors for values it cannot hold.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <random>

#include "gguf/gguf.h"
#include "model/hparams.h"
#include "runtime/attention.h"
#include "runtime/kv_cache.h"
#include "util/fp16.h"

namespace lamina {
namespace {

struct Span {
  int n_ctx, pos0, n_tok, window;
};

// A cache of one layer holding n_cells random K/V rows; cells in [far_lo, far_hi) are drawn
// from another seed (the rest equal whatever far_seed is).
KvCache MakeCache(KvType type, int kv_window, int n_ctx, int n_cells, int n_kv, int hd, int far_lo,
                  int far_hi, int far_seed) {
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
  std::mt19937 rng(5 + static_cast<int>(type)), far(far_seed);
  std::normal_distribution<float> unit(0.0f, 1.0f);
  std::vector<float> k(static_cast<size_t>(n_cells) * n_kv * hd);  // [n_cells, n_kv, hd]
  std::vector<float> v(k.size());                                  // [n_cells, n_kv, hd]
  for (size_t i = 0; i < k.size(); ++i) {
    const bool is_far =
        static_cast<int>(i / (n_kv * hd)) >= far_lo && static_cast<int>(i / (n_kv * hd)) < far_hi;
    const float a = 2.0f * unit(rng), b = unit(rng);
    k[i] = is_far ? 2.0f * unit(far) : a;
    v[i] = is_far ? unit(far) : b;
  }
  cache.Write(0, 0, 0, n_cells, k.data(), v.data());
  return cache;
}

// Softmax attention in double over rows [lo, hi) of one head ([n, hd] rows).
std::vector<double> Reference(const float* q, const float* k, const float* v, int lo, int hi,
                              int hd, float scale) {
  std::vector<double> w(hi - lo);  // [hi - lo]
  double mx = -1e300, sum = 0;
  for (int p = lo; p < hi; ++p) {
    double d = 0;
    for (int e = 0; e < hd; ++e) d += double(q[e]) * k[static_cast<size_t>(p) * hd + e];
    w[p - lo] = d * scale;
    mx = std::max(mx, w[p - lo]);
  }
  for (double& x : w) sum += (x = std::exp(x - mx));
  std::vector<double> out(hd, 0.0);  // [hd]
  for (int p = lo; p < hi; ++p) {
    for (int e = 0; e < hd; ++e) out[e] += w[p - lo] / sum * v[static_cast<size_t>(p) * hd + e];
  }
  return out;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class SlidingWindowModes : public testing::TestWithParam<KvType> {};

// Cells before the first query's window are drawn from another seed in a second cache (cell 0
// stays: it fixes the q4_0 anchor): with the window nothing changes, without it the output
// does. The batch's queries agree bit for bit with the same queries one by one and on 3
// threads; f32 K/V matches the double-precision softmax over the window alone.
TEST_P(SlidingWindowModes, AQuerySeesOnlyItsWindowAndIsBatchInvariant) {
  const KvType type = GetParam();
  const int hd = 64, n_kv = 2, n_head = 4;
  const int chunk = kAttentionCellChunk;
  // Short: 12 queries over a 37-cell window. Long: a 300-cell window whose queries straddle a
  // chunk boundary (their windows span two chunks; the first chunk is below every window).
  for (const Span& s : {Span{200, 150, 12, 37}, Span{2 * chunk + 64, 2 * chunk - 5, 11, 300}}) {
    for (int kv_window : {0, 12}) {
      if (!KvModeOf(type).quantized && kv_window != 0) continue;
      const int n_cells = s.pos0 + s.n_tok;
      const int first_lo = s.pos0 - s.window + 1;  // the first query's window starts here
      const KvCache a = MakeCache(type, kv_window, s.n_ctx, n_cells, n_kv, hd, 1, first_lo, 77);
      const KvCache b = MakeCache(type, kv_window, s.n_ctx, n_cells, n_kv, hd, 1, first_lo, 78);
      std::mt19937 rng(3);
      std::normal_distribution<float> unit(0.0f, 1.0f);
      const size_t row = static_cast<size_t>(n_head) * hd;
      std::vector<float> q(s.n_tok * row);  // [n_tok, n_head, hd]
      for (float& x : q) x = unit(rng);
      AttentionShape shape{n_head, n_kv, hd, 1.0f / std::sqrt(static_cast<float>(hd)), s.window};
      AttentionScratch scratch;
      ThreadPool pool1(1), pool3(3);
      std::vector<float> out_a(q.size()), out_a3(q.size()), out_b(q.size()), single(q.size());
      CausalAttention(a, 0, 0, s.pos0, s.n_tok, q.data(), out_a.data(), shape, scratch, pool1);
      CausalAttention(a, 0, 0, s.pos0, s.n_tok, q.data(), out_a3.data(), shape, scratch, pool3);
      CausalAttention(b, 0, 0, s.pos0, s.n_tok, q.data(), out_b.data(), shape, scratch, pool3);
      for (int t = 0; t < s.n_tok; ++t) {
        CausalAttention(a, 0, 0, s.pos0 + t, 1, q.data() + t * row, single.data() + t * row, shape,
                        scratch, pool3);
      }
      const std::string where = std::string(KvTypeName(type)) + " n_ctx " +
                                std::to_string(s.n_ctx) + " kv window " + std::to_string(kv_window);
      EXPECT_TRUE(SameBits(out_a, out_b)) << where << ": cells before the window changed it";
      EXPECT_TRUE(SameBits(out_a, single)) << where << ": batch vs one by one";
      EXPECT_TRUE(SameBits(out_a, out_a3)) << where << ": 1 vs 3 threads";
      // Teeth: without the sliding window the far cells count.
      AttentionShape full = shape;
      full.sliding_window = 0;
      CausalAttention(a, 0, 0, s.pos0, s.n_tok, q.data(), out_a.data(), full, scratch, pool1);
      CausalAttention(b, 0, 0, s.pos0, s.n_tok, q.data(), out_b.data(), full, scratch, pool1);
      EXPECT_FALSE(SameBits(out_a, out_b)) << where << ": full attention ignores far cells";
      if (type != KvType::kF32) continue;
      CausalAttention(a, 0, 0, s.pos0, s.n_tok, q.data(), out_a.data(), shape, scratch, pool1);
      std::vector<float> kr(static_cast<size_t>(n_cells) * hd), vr(kr.size());  // [n_cells, hd]
      for (int h = 0; h < n_head; ++h) {
        a.ReadHeadRows(0, 0, 0, h / (n_head / n_kv), n_cells, kr.data());
        a.ReadHeadRows(1, 0, 0, h / (n_head / n_kv), n_cells, vr.data());
        for (int t = 0; t < s.n_tok; ++t) {
          const int p = s.pos0 + t;
          const std::vector<double> o = Reference(q.data() + t * row + h * hd, kr.data(), vr.data(),
                                                  p - s.window + 1, p + 1, hd, shape.scale);
          for (int e = 0; e < hd; ++e) {
            ASSERT_NEAR(out_a[t * row + h * hd + e], o[e], 1e-5) << where << " head " << h;
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, SlidingWindowModes,
                         testing::Values(KvType::kF32, KvType::kF16, KvType::kInt8, KvType::kQ4_0,
                                         KvType::kK8V4, KvType::kK8V4Nl),
                         [](const testing::TestParamInfo<KvType>& info) {
                           return std::string(KvTypeName(info.param));
                         });

// The boundary, llama.cpp's standard rule (masked when p - k >= window): with equal scores the
// output is the mean of the V rows the query sees, here cell i's V row is i everywhere.
TEST(SlidingWindowBoundary, APositionSeesExactlyTheWindowMostRecentCells) {
  const int hd = 8, n_ctx = 40, window = 5;
  KvCacheConfig c;
  c.n_layer = 1;
  c.n_ctx = n_ctx;
  c.n_kv_heads = 1;
  c.head_dim = hd;
  c.type = KvType::kF32;
  KvCache cache(c);
  std::vector<float> k(static_cast<size_t>(n_ctx) * hd, 0.0f), v(k.size());  // [n_ctx, hd]
  for (int p = 0; p < n_ctx; ++p) std::fill_n(v.data() + p * hd, hd, static_cast<float>(p));
  cache.Write(0, 0, 0, n_ctx, k.data(), v.data());
  const AttentionShape shape{1, 1, hd, 1.0f, window};
  AttentionScratch scratch;
  ThreadPool pool(1);
  std::vector<float> q(hd, 1.0f), out(hd);  // [hd]
  for (int p = 0; p < n_ctx; ++p) {
    CausalAttention(cache, 0, 0, p, 1, q.data(), out.data(), shape, scratch, pool);
    const int lo = std::max(0, p - window + 1);
    const float want = 0.5f * static_cast<float>(lo + p);  // mean of lo..p
    EXPECT_NEAR(out[0], want, 1e-5) << "position " << p;
  }
}

// A metadata-only GGUF with the given sliding-window keys, opened; hp for `layers` layers.
std::unique_ptr<gguf::File> MetadataFile(const std::function<void(gguf::Writer&)>& keys) {
  gguf::Writer w;
  w.SetString("general.architecture", "gemma3");
  keys(w);
  const std::string path = testing::TempDir() + "/swa_meta_" + std::to_string(getpid()) + ".gguf";
  EXPECT_TRUE(w.WriteFile(path).ok());
  Result<std::unique_ptr<gguf::File>> f = gguf::File::Open(path);
  EXPECT_TRUE(f.ok()) << f.error().message;
  std::filesystem::remove(path);
  return f.ok() ? std::move(*f) : nullptr;
}

Result<Hparams> ReadSwa(const gguf::File& f, int layers) {
  Hparams hp;
  hp.arch = "gemma3";
  hp.n_layer = layers;
  hp.rope.freq_base = 1e6f;
  hp.rope.freq_scale = 0.125f;
  Status st = ReadSlidingWindow(f, &hp);
  if (!st.ok()) return st.error();
  return hp;
}

TEST(SlidingWindowMetadata, PatternAndRopeAsLlamaCppReadsThem) {
  // Default period 6: layers 5 and 11 are global.
  auto f = MetadataFile([](gguf::Writer& w) { w.SetU32("gemma3.attention.sliding_window", 512); });
  Result<Hparams> hp = ReadSwa(*f, 12);
  ASSERT_TRUE(hp.ok()) << hp.error().message;
  EXPECT_EQ(hp->n_swa, 512);
  for (int il = 0; il < 12; ++il) EXPECT_EQ(hp->is_swa(il), il % 6 != 5) << il;
  EXPECT_EQ(hp->sliding_window(5), 0);
  EXPECT_EQ(hp->sliding_window(4), 512);
  EXPECT_EQ(hp->rope_swa.freq_base, 10000.0f);  // the default local base, no scaling
  EXPECT_EQ(hp->rope_swa.freq_scale, 1.0f);
  EXPECT_EQ(hp->layer_rope(5).freq_scale, 0.125f);
  // Period 2 and a local base of its own.
  f = MetadataFile([](gguf::Writer& w) {
    w.SetU32("gemma3.attention.sliding_window", 16);
    w.SetU32("gemma3.attention.sliding_window_pattern", 2);
    w.SetF32("gemma3.rope.freq_base_swa", 5000.0f);
  });
  hp = ReadSwa(*f, 4);
  ASSERT_TRUE(hp.ok()) << hp.error().message;
  EXPECT_EQ(hp->swa_layers, (std::vector<uint8_t>{1, 0, 1, 0}));
  EXPECT_EQ(hp->rope_swa.freq_base, 5000.0f);
  // No key, or a window of 0: no sliding window (llama.cpp's reading).
  f = MetadataFile([](gguf::Writer&) {});
  hp = ReadSwa(*f, 4);
  ASSERT_TRUE(hp.ok());
  EXPECT_TRUE(hp->swa_layers.empty());
  f = MetadataFile([](gguf::Writer& w) { w.SetU32("gemma3.attention.sliding_window", 0); });
  hp = ReadSwa(*f, 4);
  ASSERT_TRUE(hp.ok());
  EXPECT_EQ(hp->sliding_window(0), 0);
}

TEST(SlidingWindowMetadata, ValuesItCannotHoldAreRefusedByName) {
  struct Bad {
    std::function<void(gguf::Writer&)> keys;
    const char* key;
  };
  const Bad bad[] = {
      {[](gguf::Writer& w) { w.SetI32("gemma3.attention.sliding_window", -4); },
       "attention.sliding_window"},
      {[](gguf::Writer& w) { w.SetU64("gemma3.attention.sliding_window", uint64_t{1} << 40); },
       "attention.sliding_window"},
      {[](gguf::Writer& w) {
         w.SetU32("gemma3.attention.sliding_window", 16);
         w.SetI32Array("gemma3.attention.sliding_window_pattern", {1, 1, 0});
       },
       "sliding_window_pattern"},
      {[](gguf::Writer& w) {
         w.SetU32("gemma3.attention.sliding_window", 16);
         w.SetI32("gemma3.attention.sliding_window_pattern", -1);
       },
       "sliding_window_pattern"},
      {[](gguf::Writer& w) {
         w.SetU32("gemma3.attention.sliding_window", 16);
         w.SetF32("gemma3.rope.freq_base_swa", 0.0f);
       },
       "rope.freq_base_swa"},
  };
  for (const Bad& b : bad) {
    auto f = MetadataFile(b.keys);
    ASSERT_NE(f, nullptr);
    Result<Hparams> hp = ReadSwa(*f, 3);
    ASSERT_FALSE(hp.ok()) << b.key;
    EXPECT_NE(hp.error().message.find(b.key), std::string::npos) << hp.error().message;
  }
}

}  // namespace
}  // namespace lamina
