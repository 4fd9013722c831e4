// Per-tensor weight scales ("<name>.scale" beside "<name>.weight", the second-level scale of NVIDIA
// ModelOpt NVFP4 checkpoints converted by llama.cpp): the scaled fixture loads with every scale,
// scales by powers of two give exactly the logits of weights multiplied by them (per expert, on
// a hybrid MoE, gpt-oss's biased experts and the NVFP4 file), and malformed scales or scales on
// weights llama.cpp never scales are refused naming the tensor, by the load and by
// CheckModelFile (`lamina inspect`'s verdict) alike.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "model/model.h"
#include "prompt_logits.h"
#include "quant/types.h"
#include "runtime/session.h"
#include "util/fp16.h"

namespace lamina {
namespace {

namespace fs = std::filesystem;

const std::string kModels = std::string(LAMINA_SOURCE_DIR) + "/tests/fixtures/models/";

// A tensor as a file copy writes it; data empty: dropped.
struct TensorCopy {
  std::string name;
  GgmlType type;
  std::vector<int64_t> ne;
  std::vector<uint8_t> data;
};

// Writes src's metadata and tensors to a temp file after `edit` (which may change, drop or
// append tensors); returns its path.
std::string CopyWith(const std::string& src, const std::string& tag,
                     const std::function<void(std::vector<TensorCopy>&)>& edit) {
  Result<std::unique_ptr<gguf::File>> f = gguf::File::Open(src);
  EXPECT_TRUE(f.ok()) << f.error().message;
  if (!f.ok()) return "";
  std::vector<TensorCopy> tensors;
  for (const gguf::TensorInfo& t : (*f)->tensors()) {
    tensors.push_back({t.name, t.type, std::vector<int64_t>(t.ne, t.ne + t.n_dims),
                       std::vector<uint8_t>(t.data, t.data + t.n_bytes)});
  }
  edit(tensors);
  gguf::Writer w;
  for (const auto& [k, v] : (*f)->metadata()) w.SetValue(k, v);
  for (const TensorCopy& t : tensors) {
    if (!t.data.empty()) w.AddTensor(t.name, t.type, t.ne, t.data.data(), t.data.size());
  }
  const std::string path =
      testing::TempDir() + "/scale_" + tag + "_" + std::to_string(getpid()) + ".gguf";
  EXPECT_TRUE(w.WriteFile(path).ok());
  return path;
}

TensorCopy F32Tensor(const std::string& name, const std::vector<float>& v) {
  std::vector<uint8_t> bytes(v.size() * sizeof(float));
  std::memcpy(bytes.data(), v.data(), bytes.size());
  return {name, GgmlType::kF32, {static_cast<int64_t>(v.size())}, bytes};
}

using testing_util::PromptLogits;
constexpr int kPromptTokens = 21;  // PromptLogits' prompt length here

// Multiplies every value of one matrix's blocks by 2^k exactly, by moving each block scale's
// exponent; false (data unchanged or partly changed) where a scale would leave its normal range.
bool ScaleByPowerOfTwo(GgmlType type, uint8_t* data, size_t n_bytes, int k) {
  switch (type) {
    case GgmlType::kF32:
      for (size_t i = 0; i < n_bytes; i += 4) {
        float v;
        std::memcpy(&v, data + i, 4);
        if (v != 0.0f && !std::isnormal(std::ldexp(v, k))) return false;
        if (v != 0.0f && !std::isnormal(v)) return false;
        v = std::ldexp(v, k);
        std::memcpy(data + i, &v, 4);
      }
      return true;
    case GgmlType::kQ8_0:  // fp16 d, then 32 int8
      for (size_t i = 0; i < n_bytes; i += sizeof(BlockQ8_0)) {
        fp16_t d;
        std::memcpy(&d, data + i, 2);
        const int e = (d >> 10) & 0x1F;
        if ((d & 0x7FFF) == 0) continue;
        if (e == 0 || e + k < 1 || e + k > 30) return false;
        d = static_cast<fp16_t>((d & ~(0x1F << 10)) | ((e + k) << 10));
        std::memcpy(data + i, &d, 2);
      }
      return true;
    case GgmlType::kMXFP4:  // E8M0 exponent, then 16 bytes of codes
      for (size_t i = 0; i < n_bytes; i += sizeof(BlockMXFP4)) {
        const int e = data[i];
        if (e < 2 || e + k < 2 || e + k > 254) return false;
        data[i] = static_cast<uint8_t>(e + k);
      }
      return true;
    case GgmlType::kNVFP4: {  // four UE4M3 sub-block scales, then 32 bytes of codes
      // UE4M3 as ggml reads it: exponent bias 7, exponent 0 subnormal (man * 2^-9).
      auto value = [](int x) {
        const int e = (x >> 3) & 0xF, m = x & 7;
        return e == 0 ? std::ldexp(static_cast<float>(m), -9)
                      : std::ldexp(1.0f + static_cast<float>(m) / 8.0f, e - 7);
      };
      for (size_t i = 0; i < n_bytes; i += sizeof(BlockNVFP4)) {
        for (int s = 0; s < 4; ++s) {
          const int x = data[i + s];
          if (x == 0) continue;
          if (x >= 0x7F) return false;
          const float want = std::ldexp(value(x), k);
          int y = 1;
          while (y < 0x7F && value(y) != want) ++y;
          if (y == 0x7F) return false;
          data[i + s] = static_cast<uint8_t>(y);
        }
      }
      return true;
    }
    default:
      return false;
  }
}

// The projections llama.cpp's loader reads a per-tensor scale for (weight_loader.cpp).
bool Scalable(const std::string& name, GgmlType type) {
  if (name == "output.weight") return type == GgmlType::kNVFP4;
  static const char* kRoles[] = {
      ".attn_q.weight",         ".attn_k.weight",         ".attn_v.weight",
      ".attn_output.weight",    ".attn_qkv.weight",       ".attn_gate.weight",
      ".ffn_gate.weight",       ".ffn_down.weight",       ".ffn_up.weight",
      ".ffn_gate_shexp.weight", ".ffn_down_shexp.weight", ".ffn_up_shexp.weight",
      ".ffn_gate_exps.weight",  ".ffn_down_exps.weight",  ".ffn_up_exps.weight",
      ".ssm_out.weight",        ".ssm_alpha.weight",      ".ssm_beta.weight"};
  if (name.rfind("blk.", 0) != 0) return false;
  for (const char* r : kRoles) {
    const std::string role = r;
    if (name.size() > role.size() &&
        name.compare(name.size() - role.size(), role.size(), role) == 0)
      return true;
  }
  return false;
}

// For each scalable matrix (each expert of a stack on its own) a power of two 2^k, k in -2..2:
// `weights` multiplies the matrices by them, `scales` instead adds "<name>.scale" tensors
// holding them (and an ".input_scale", which changes nothing).
struct PairCounts {
  int scaled = 0;       // matrices whose scale is not 1
  uint64_t values = 0;  // scale values written (one per matrix of each scalable tensor)
};
PairCounts PowerOfTwoPair(const std::string& src, const std::string& tag, std::string* weights,
                          std::string* scales) {
  PairCounts counts;
  std::vector<std::vector<float>> chosen;  // per tensor in file order: one scale per matrix
  *weights = CopyWith(src, tag + "_w", [&](std::vector<TensorCopy>& ts) {
    int seed = 0;
    for (TensorCopy& t : ts) {
      chosen.emplace_back();
      if (!Scalable(t.name, t.type)) continue;
      const int64_t n_mat = t.ne.size() == 3 ? t.ne[2] : 1;
      const size_t mat_bytes = t.data.size() / static_cast<size_t>(n_mat);
      for (int64_t m = 0; m < n_mat; ++m) {
        // The chosen power, else 2 or 1/2 where its block scales would leave their range.
        int k = 0;
        std::vector<uint8_t> trial;
        for (const int try_k : {(seed++ * 7 + 3) % 5 - 2, 1, -1}) {
          trial.assign(t.data.begin() + m * mat_bytes, t.data.begin() + (m + 1) * mat_bytes);
          if (try_k != 0 && ScaleByPowerOfTwo(t.type, trial.data(), trial.size(), try_k)) {
            k = try_k;
            break;
          }
        }
        if (k != 0) {
          std::copy(trial.begin(), trial.end(), t.data.begin() + m * mat_bytes);
          ++counts.scaled;
        }
        chosen.back().push_back(std::ldexp(1.0f, k));
        ++counts.values;
      }
    }
  });
  *scales = CopyWith(src, tag + "_s", [&](std::vector<TensorCopy>& ts) {
    std::vector<TensorCopy> out;
    for (size_t i = 0; i < ts.size(); ++i) {
      out.push_back(ts[i]);
      if (chosen[i].empty()) continue;
      const std::string base = ts[i].name.substr(0, ts[i].name.size() - 7);
      out.push_back(F32Tensor(base + ".scale", chosen[i]));
      out.push_back(F32Tensor(base + ".input_scale", std::vector<float>(chosen[i].size(), 0.01f)));
    }
    ts = std::move(out);
  });
  return counts;
}

TEST(Nvfp4Scale, ScaledFixtureLoadsWithAScaleOnEveryProjectionAndTheHead) {
  const std::string path = kModels + "synth-llama-d256.NVFP4-scaled.gguf";
  if (!fs::exists(path)) GTEST_SKIP() << path << " is absent";
  Result<std::unique_ptr<gguf::File>> f = gguf::File::Open(path);
  ASSERT_TRUE(f.ok()) << f.error().message;
  int scales = 0, input_scales = 0, nvfp4 = 0;
  for (const gguf::TensorInfo& t : (*f)->tensors()) {
    const std::string n = t.name;
    if (n.size() > 12 && n.compare(n.size() - 12, 12, ".input_scale") == 0) {
      ++input_scales;
    } else if (n.size() > 6 && n.compare(n.size() - 6, 6, ".scale") == 0) {
      ++scales;
      EXPECT_EQ(t.type, GgmlType::kF32) << n;
      EXPECT_EQ(t.n_dims, 1u) << n;
      EXPECT_NE((*f)->FindTensor(n.substr(0, n.size() - 6) + ".weight"), nullptr) << n;
    }
    nvfp4 += t.type == GgmlType::kNVFP4;
  }
  EXPECT_EQ(nvfp4, 16);   // token_embd (unscaled), 2 x 7 projections, output
  EXPECT_EQ(scales, 15);  // every matrix but token_embd
  EXPECT_EQ(input_scales, 15);
  EXPECT_TRUE(CheckModelFile(path).ok()) << CheckModelFile(path).error().message;
  Result<std::unique_ptr<Model>> m = LoadModel(path);
  ASSERT_TRUE(m.ok()) << m.error().message;
}

// Scales by powers of two against the same powers multiplied into the weights: the logits agree
// bit for bit when the scale multiplies each matmul output (per expert, before a bias).
TEST(Nvfp4Scale, PowerOfTwoScalesMatchWeightsMultipliedByThem) {
  for (const char* name : {"synth-qwen35moe-d128.Q8_0", "synth-gpt-oss-d256.MXFP4_MOE",
                           "synth-llama-d256.NVFP4", "synth-qwen35-d128.Q8_0"}) {
    const std::string src = kModels + name + ".gguf";
    if (!fs::exists(src)) GTEST_SKIP() << src << " is absent";
    std::string weights, scales;
    const PairCounts n = PowerOfTwoPair(src, "p2", &weights, &scales);
    EXPECT_GT(n.scaled, 10) << name;
    Result<std::unique_ptr<Model>> a = LoadModel(weights);
    Result<std::unique_ptr<Model>> b = LoadModel(scales);
    Result<std::unique_ptr<Model>> base = LoadModel(src);
    fs::remove(weights);
    fs::remove(scales);
    ASSERT_TRUE(a.ok()) << a.error().message;
    ASSERT_TRUE(b.ok()) << b.error().message;
    ASSERT_TRUE(base.ok()) << base.error().message;
    const std::vector<float> la = PromptLogits(**a, kPromptTokens),
                             lb = PromptLogits(**b, kPromptTokens);
    ASSERT_FALSE(la.empty());
    EXPECT_EQ(la, lb) << name;
    EXPECT_NE(la, PromptLogits(**base, kPromptTokens)) << name << ": the scales changed nothing";
    // Each scale and input scale counts as a parameter, as llama.cpp counts every tensor it reads.
    EXPECT_EQ((*b)->ParameterCount(), (*a)->ParameterCount() + 2 * n.values) << name;
  }
}

struct BadScale {
  const char* what;
  const char* model;  // fixture stem
  std::function<void(std::vector<TensorCopy>&)> edit;
  std::vector<std::string> expect;  // substrings of the error
};

TEST(Nvfp4Scale, MalformedOrMisplacedScalesAreRefusedNamingTheTensor) {
  auto add = [](TensorCopy t) { return [t](std::vector<TensorCopy>& ts) { ts.push_back(t); }; };
  const float nan = std::numeric_limits<float>::quiet_NaN();
  TensorCopy f16_scale = F32Tensor("blk.0.ffn_up.scale", {1.0f});
  f16_scale.type = GgmlType::kF16;
  f16_scale.data.resize(2);
  const std::vector<BadScale> cases = {
      {"type F16",
       "synth-llama-d256.NVFP4",
       add(f16_scale),
       {"blk.0.ffn_up.scale", "blk.0.ffn_up.weight", "type F16", "expected F32 [1]"}},
      {"two values",
       "synth-llama-d256.NVFP4",
       add(F32Tensor("blk.1.attn_q.scale", {1, 2})),
       {"blk.1.attn_q.scale", "shape [2]", "expected F32 [1]"}},
      {"NaN",
       "synth-llama-d256.NVFP4",
       add(F32Tensor("blk.0.attn_output.scale", {nan})),
       {"blk.0.attn_output.scale", "finite"}},
      {"input scale of two values",
       "synth-llama-d256.NVFP4",
       add(F32Tensor("blk.0.ffn_down.input_scale", {1, 2})),
       {"blk.0.ffn_down.input_scale", "expected F32 [1]"}},
      {"on the embedding",
       "synth-llama-d256.NVFP4",
       add(F32Tensor("token_embd.scale", {2})),
       {"token_embd.scale", "token_embd.weight", "not applied"}},
      {"on a tied head",
       "synth-llama-d256.NVFP4",
       [](std::vector<TensorCopy>& ts) {
         for (TensorCopy& t : ts) {
           if (t.name == "output.weight") t.data.clear();
         }
         ts.push_back(F32Tensor("output.scale", {2}));
       },
       {"output.scale", "tied"}},
      {"on a Q8_0 head",
       "synth-mistral3-d256.Q8_0",
       add(F32Tensor("output.scale", {2})),
       {"output.scale", "only for an NVFP4 output.weight", "Q8_0"}},
      {"on a router",
       "synth-qwen35moe-d128.Q8_0",
       add(F32Tensor("blk.0.ffn_gate_inp.scale", {2})),
       {"blk.0.ffn_gate_inp.scale", "not applied"}},
      {"one value for a stack of experts",
       "synth-qwen35moe-d128.Q8_0",
       add(F32Tensor("blk.1.ffn_up_exps.scale", {2})),
       {"blk.1.ffn_up_exps.scale", "shape [1]", "(one per expert)"}},
  };
  for (const BadScale& c : cases) {
    const std::string src = kModels + c.model + ".gguf";
    if (!fs::exists(src)) GTEST_SKIP() << src << " is absent";
    const std::string path = CopyWith(src, "bad", c.edit);
    Result<std::unique_ptr<Model>> m = LoadModel(path);
    const Status check = CheckModelFile(path);
    fs::remove(path);
    ASSERT_FALSE(m.ok()) << c.what;
    ASSERT_FALSE(check.ok()) << c.what;
    EXPECT_EQ(check.error().message, m.error().message) << c.what;
    for (const std::string& s : c.expect) {
      EXPECT_NE(m.error().message.find(s), std::string::npos)
          << c.what << ": " << m.error().message << " (wanted " << s << ")";
    }
  }
}

}  // namespace
}  // namespace lamina
