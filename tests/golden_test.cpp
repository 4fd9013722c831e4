// End-to-end goldens against llama.cpp (../shared/golden): logits at every prompt position and
// every teacher-forced generation step, and greedy ids wherever the reference's top-1/top-2
// margin exceeds the tolerance. Tolerances per weight type are documented in docs/GOLDENS.md.
// The same comparison runs on the repository's own fixtures (tests/fixtures: IQ4_NL, IQ4_XS,
// MXFP4, TQ1_0, TQ2_0, the lattice i-quants IQ1_S..IQ3_S, NVFP4 (with and without ModelOpt's
// per-tensor scales), Q1_0 and Q2_0 quantized by llama.cpp, and their F32 base, which lamina-synth
// regenerates).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <system_error>

#include "model/model.h"
#include "runtime/sampler.h"
#include "runtime/session.h"
#include "util/cpu_features.h"

namespace lamina {
namespace {

namespace fs = std::filesystem;
const std::string kShared = LAMINA_SHARED_DIR;
// A row whose every logit is within this of the reference matches to the goldens' 6-digit
// printing: the kernels agree exactly up to summation order.
constexpr double kExactRow = 1e-3;

struct GoldenCase {
  std::string json_path;
  std::string model_path;
  std::string kv;    // f32 / f16
  double tolerance;  // max |logit diff| allowed
};

// gtest prints a failing case's parameter with this (the golden file, not the struct's bytes).
void PrintTo(const GoldenCase& c, std::ostream* os) { *os << c.json_path; }

std::string CaseName(const testing::TestParamInfo<GoldenCase>& info) {
  std::string n = fs::path(info.param.json_path).stem().string();
  for (char& c : n) {
    if (!isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return n;
}

// Tolerance by (weight file type, kv). F32 weights with F32 KV land at the 6-digit rounding of
// the goldens. Quantized weights agree exactly on most rows (see the "rows within 1e-3" count
// printed per file) but a rounding-boundary flip of one activation code, which summation order
// alone can cause, moves these small random-weight models' logits discretely; the bounds below
// are the measured maxima with ~20% headroom (docs/GOLDENS.md).
double ToleranceFor(const std::string& model_stem, const std::string& kv) {
  static const std::map<std::string, double> by_type = {
      {"F32", 3e-4},
      {"F16", 2e-2},
      {"Q8_0", 0.3},
      {"Q4_0", 0.2},
      // Q4_K and Q6_K interleaved (one canonical order on every ISA, 2026-12-04): the maxima over
      // the scalar, AVX2 and AVX-512 paths, 0.461 (synth-llama-kq p100) and 0.164, with ~50%
      // headroom.
      {"Q4_K_M", 0.7},
      {"Q5_K_M", 0.2},
      {"Q6_K", 0.25},
      // tests/fixtures (IQ4_NL and MXFP4 dot with Q8_0 activations like Q4_0, IQ4_XS with Q8_K
      // like Q4_K): the measured maxima on the scalar, AVX2 and AVX-512 paths (0.053, 0.031,
      // 0.122, 2026-12-04) with ~50% headroom.
      {"IQ4_NL", 0.08},
      {"MXFP4", 0.08},
      {"IQ4_XS", 0.18},
      // TQ1_0 / TQ2_0 (Q8_K activations; the two files hold the same ternary weights, so their
      // logits agree): 6e-6 on AVX-512, 0.053 on AVX2 and 0.072 on the scalar path (p100, one
      // activation-rounding flip; 2026-12-04), with ~50% headroom.
      {"TQ1_0", 0.11},
      {"TQ2_0", 0.11},
      // The lattice i-quants (Q8_K activations; tests/fixtures, imatrix-quantized where
      // llama.cpp requires one): maxima over the scalar, AVX2 and AVX-512 paths 0.0567 (IQ2_XXS),
      // 0.0777 (IQ2_XS), 0.0356 (IQ2_S), 0.0588 (IQ3_XXS), 0.0562 (IQ3_S), 0.0586 (IQ1_S) and
      // 0.0986 (IQ1_M) (p100, 2026-12-05): TQ1_0's bound, and IQ4_XS's for IQ1_M.
      {"IQ2_XXS", 0.11},
      {"IQ2_XS", 0.11},
      {"IQ2_S", 0.11},
      {"IQ3_XXS", 0.11},
      {"IQ3_S", 0.11},
      {"IQ1_S", 0.11},
      {"IQ1_M", 0.18},
      // NVFP4, Q1_0, Q2_0 (Q8_0 activations; tests/fixtures): maxima over the scalar, AVX2 and
      // AVX-512 paths 0.0478, 0.0317 and 0.0528 (p100, 2026-12-05): IQ4_NL's and MXFP4's bound.
      {"NVFP4", 0.08},
      // NVFP4 with ModelOpt's per-tensor scales (every projection and the head divided by its
      // scale before quantizing, the scale multiplied into the matmul's output): NVFP4's bound.
      {"NVFP4-scaled", 0.08},
      {"Q1_0", 0.08},
      {"Q2_0", 0.08}};
  // Per-file bounds where one activation-rounding flip lands above the per-type bound (measured
  // maximum with ~20% headroom): rows before the flip agree to 5e-5. The qwen2moe one is not a
  // routing flip: forcing any layer's runner-up expert at that position does not restore
  // agreement.
  static const std::map<std::string, double> by_file = {
      {"synth-qwen2-d128.Q4_0", 0.3},  // 0.247: once, from prompt position 2 on
      // Q4_0 interleaved (GGML's reference per-block order on every ISA, 2026-12-04): p100
      // 0.213 on AVX-512 and 0.266 on AVX2 (generation step 27), flips from the other kernels'
      // per-ISA sums on top; the scalar path gives 5e-5 (as before), the old AVX-512 one 0.159.
      {"synth-llama-d128.Q4_0", 0.32},
      // 0.574 (AVX-512): p100, from generation step 14 on; ~50% headroom.
      {"synth-qwen2moe-kq.Q4_K_M", 0.86},
      // 1.51 at p100 prompt position 83 (rows before it agree to 5e-5): one discrete jump, the
      // size an expert-routing flip makes, which appeared when attention's f32 sums changed
      // order (AVX-512 kernels); the F32-weight file matches to 5e-5 throughout.
      {"synth-qwen2moe-d128.Q8_0", 1.8},
      // 0.66 at p100 prompt position 47: rows 0-6 agree to 5e-5, then single rows jump and
      // return (7, 15) until a jump at 18 persists, as a flip inside a recurrent layer's state
      // would (the hybrid's Gated DeltaNet state carries it forward, unlike a softmax over
      // many cells). The F32-weight file matches to 8e-5 at every row. Since its Q8_0 attn_qkv
      // runs interleaved (GGML's reference per-block order on every ISA, 2026-12-04) the flips
      // are the scalar twins' ones: 1.87 once (step 10), 3.57 p100 (position 23); the old
      // scalar path gave 1.93 / 3.55. With Q4_K / Q6_K interleaved too (2026-12-04): 5e-5 /
      // 0.774 on AVX-512, 5e-5 / 0.723 on AVX2, 2.25 / 0.716 on the scalar path; ~50% headroom.
      {"synth-qwen3next-d256.Q4_K_M", 3.4},
      // tests/fixtures gemma3 (sliding-window layers): the F32 file's rows differ from llama.cpp
      // by up to 3.5e-4 (AVX-512; 3.2e-4 AVX2, 2.9e-4 scalar), more than the llama files' 6-digit
      // agreement: its GELU rounds the gate to f16 as ggml's table does, so a gate that lands on
      // an f16 rounding boundary in one summation order and not the other moves by one f16 step
      // (its embeddings, scaled by sqrt(256), make such gates common). Q8_0: 0.047 (AVX-512),
      // 0.046 (AVX2), 0.033 (scalar). Both with ~50% headroom (2026-12-04).
      {"synth-gemma3-d256.F32", 5.5e-4},
      {"synth-gemma3-d256.Q8_0", 0.07},
      // tests/fixtures qwen35 / qwen35moe (2026-12-04, Intel Xeon): F32 2.4e-5 / 4.7e-5 (max
      // over scalar, AVX2 and AVX-512). Q8_0: single Q8_0 activation-rounding flips carried on
      // by the recurrent state, from p100 prompt position 5 (dense; llama.cpp's own batch and
      // token-by-token prompts agree exactly there) and 17 (MoE, where llama.cpp's batch and
      // token-by-token prompts differ by the same 0.108 from the same row): 0.097 / 0.108
      // (scalar: 0.050 / 0.108). Bounds ~50% above. The MoE F32 bound: 7e-5 until the AVX-512
      // float dots' one-pass order (2026-12-05), which moved its `once` file from 4.0e-5 to
      // 7.2e-5 (generation step 25; AVX2 2.6e-5, scalar 4.1e-5; p100 4.7e-5 -> 2.1e-5): 1.1e-4.
      {"synth-qwen35-d128.F32", 3.6e-5},
      {"synth-qwen35-d128.Q8_0", 0.15},
      {"synth-qwen35moe-d128.F32", 1.1e-4},
      {"synth-qwen35moe-d128.Q8_0", 0.16},
      // tests/fixtures gpt-oss (attention sinks, sliding-window layers, swiglu_oai experts):
      // measured below, see docs/GOLDENS.md.
      {"synth-gpt-oss-d256.F32", 1e-4},
      {"synth-gpt-oss-d256.MXFP4_MOE", 0.1}};
  // Without AVX-512 (an AVX2-only CPU, or LAMINA_ISA=avx2) the attention and quant sums run in
  // another order, and an expert-routing flip appears early in the qwen2moe K-quant file's p100
  // prompt (2.55 at prompt position 9, 2.84 at 89; 5 of 132 rows within 1e-3) on an AVX2-only
  // AMD EPYC, 2026-12-03; its `once` prompt stays at 0.016. The bound only keeps the check
  // running there; the file's real check is the AVX-512 one above.
  const bool avx512 = IsaAllowed(Isa::kAvx512) && GetCpuFeatures().HasAvx512Set();
  // With Q4_K / Q6_K interleaved (2026-12-04) the Xeon's AVX2 and scalar paths give 2.55.
  if (!avx512 && model_stem == "synth-qwen2moe-kq.Q4_K_M" && kv == "f32") return 3.8;
  // With the Highway attention kernels (summation in another order than the AVX-512 kernels
  // they replaced) one Q8_K activation code of layer 0 rounds the other way on AVX-512, and the
  // qwen3moe K-quant file's p100 prompt meets three expert-routing near-ties (layer 2 at
  // position 93: second and third router scores 0.00025 apart): 0.99 at 56, 1.62 at 76, 3.77 at
  // 93, each a spike that falls back; every AVX-512 kernel matches its scalar twin to 5e-7 of
  // the output on the same inputs (Intel Xeon, AVX-512, 2026-12-04). With Q4_K, Q5_K and Q6_K
  // interleaved (one order on every ISA) the three paths agree closely: p100 2.16 (AVX-512, was
  // 3.73), 2.19 (AVX2, was 0.45), 2.19 (scalar); ~50% headroom on every path.
  if (model_stem == "synth-qwen3moe-d256.Q4_K_M" && kv == "f32") return 3.3;
  if (auto it = by_file.find(model_stem); it != by_file.end() && kv == "f32") return it->second;
  double tol = 3e-4;
  const auto dot = model_stem.rfind('.');
  if (dot != std::string::npos) {
    auto it = by_type.find(model_stem.substr(dot + 1));
    if (it != by_type.end()) tol = it->second;
  }
  if (kv == "f16") tol = std::max(tol, 3e-2);
  return tol;
}

std::vector<GoldenCase> Collect() {
  std::vector<GoldenCase> cases;
  if (!fs::exists(kShared + "/golden")) return cases;
  for (const char* dir : {"stories260K", "synth"}) {
    const fs::path d = fs::path(kShared) / "golden" / dir;
    if (!fs::exists(d)) continue;
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(d)) files.push_back(e.path());
    std::sort(files.begin(), files.end());
    for (const fs::path& p : files) {
      const std::string stem = p.stem().string();  // model.prompt.kv
      const auto kv_dot = stem.rfind('.');
      const std::string kv = stem.substr(kv_dot + 1);
      if (kv != "f32" && kv != "f16") continue;
      const std::string rest = stem.substr(0, kv_dot);
      const std::string model_stem = rest.substr(0, rest.rfind('.'));
      const std::string model = kShared + "/models/" + model_stem + ".gguf";
      if (!fs::exists(model)) continue;
      cases.push_back({p.string(), model, kv, ToleranceFor(model_stem, kv)});
    }
  }
  return cases;
}

// Loads the case's model, feeds the golden prompt as one batch and the golden's generated tokens
// one by one, and compares every row of logits (and the greedy id where the margin allows).
void CheckGolden(const GoldenCase& c, const nlohmann::json& g) {
  Result<std::unique_ptr<Model>> model = LoadModel(c.model_path);
  if (!model.ok() && model.error().message.find("unsupported architecture") != std::string::npos) {
    GTEST_SKIP() << model.error().message;
  }
  ASSERT_TRUE(model.ok()) << model.error().message;
  const int n_vocab = (*model)->hparams().n_vocab;

  const std::vector<int32_t> want_prompt = g["prompt_tokens"].get<std::vector<int32_t>>();
  const std::vector<int32_t> got_prompt =
      (*model)->tokenizer().Encode(g["prompt"].get<std::string>(), true, false);
  ASSERT_EQ(got_prompt, want_prompt);

  ThreadPool pool(2);
  SessionConfig sc;
  // A golden made with a context past 4,096 tokens runs with that context (phi3 rotates with its
  // long RoPE factors past its original context); the others fit in 1,024.
  int golden_ctx = 0;
  if (g.contains("settings") && g["settings"].contains("n_ctx")) {
    golden_ctx = g["settings"]["n_ctx"].get<int>();
  }
  sc.n_ctx = golden_ctx > 4096 ? golden_ctx : 1024;
  sc.kv_type = c.kv == "f32" ? KvType::kF32 : KvType::kF16;
  Session session(**model, sc, pool);

  double max_err = 0.0;
  std::string worst;
  int n_rows = 0, n_exact_rows = 0;
  int greedy_checked = 0, greedy_skipped = 0;
  int top1_equal = 0;  // rows whose argmax is the reference's, checked or not
  auto compare_row = [&](const float* got, const nlohmann::json& want_row, const std::string& where,
                         int want_argmax) {
    std::vector<float> want = want_row.get<std::vector<float>>();
    ASSERT_EQ(static_cast<int>(want.size()), n_vocab);
    double row_err = 0.0;
    for (int i = 0; i < n_vocab; ++i)
      row_err = std::max(row_err, std::fabs(double(got[i]) - want[i]));
    if (row_err > max_err) worst = where;
    ++n_rows;
    if (row_err <= kExactRow) ++n_exact_rows;
    max_err = std::max(max_err, row_err);
    EXPECT_LE(row_err, c.tolerance) << where;
    if (ArgMax(got, n_vocab) == want_argmax) ++top1_equal;
    std::vector<float> sorted = want;
    std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
    if (sorted[0] - sorted[1] > 2 * c.tolerance) {
      ++greedy_checked;
      EXPECT_EQ(ArgMax(got, n_vocab), want_argmax) << where;
    } else {
      ++greedy_skipped;
    }
  };

  Result<const float*> r = session.Eval(want_prompt, true);
  ASSERT_TRUE(r.ok()) << r.error().message;
  const auto& prompt_logits = g["prompt_logits"];
  const auto& prompt_argmax = g["prompt_argmax"];
  for (size_t p = 0; p < prompt_logits.size(); ++p) {
    compare_row(*r + p * n_vocab, prompt_logits[p], "prompt position " + std::to_string(p),
                prompt_argmax[p].get<int>());
  }
  const std::vector<int32_t> gen = g["generated_tokens"].get<std::vector<int32_t>>();
  const auto& gen_logits = g["gen_logits"];
  for (size_t i = 0; i < gen.size(); ++i) {
    Result<const float*> s = session.Eval(&gen[i], 1, false);
    ASSERT_TRUE(s.ok()) << s.error().message;
    const int want_next = i + 1 < gen.size() ? gen[i + 1] : g["next_token_after_last"].get<int>();
    compare_row(*s, gen_logits[i], "generation step " + std::to_string(i), want_next);
  }
  std::printf(
      "[golden] %s: max |logit diff| %.3g at %s (tolerance %.3g), rows within %.0e: %d/%d, "
      "greedy checked %d, skipped %d, top-1 equal %d/%d\n",
      fs::path(c.json_path).filename().c_str(), max_err, worst.c_str(), c.tolerance, kExactRow,
      n_exact_rows, n_rows, greedy_checked, greedy_skipped, top1_equal, n_rows);
}

class GoldenTest : public testing::TestWithParam<GoldenCase> {};

TEST_P(GoldenTest, LogitsAndGreedyMatchLlamaCpp) {
  const GoldenCase& c = GetParam();
  std::ifstream in(c.json_path);
  ASSERT_TRUE(in) << c.json_path;
  CheckGolden(c, nlohmann::json::parse(in));
}

INSTANTIATE_TEST_SUITE_P(LlamaCpp, GoldenTest, testing::ValuesIn(Collect()), CaseName);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(GoldenTest);

TEST(GoldenFixtures, PresentOrSkipped) {
  if (!fs::exists(kShared + "/golden"))
    GTEST_SKIP() << "../shared/golden is absent; golden tests skipped";
  EXPECT_FALSE(Collect().empty());
}

// ---- tests/fixtures: the repository's own llama.cpp goldens (tests/fixtures/README.md) ----

const std::string kFixtures = std::string(LAMINA_SOURCE_DIR) + "/tests/fixtures";

// The F32 base of the fixture files is not in the repository: lamina-synth writes it again,
// byte for byte, with these options (the command tests/fixtures/README.md records).
const std::map<std::string, std::string> kRegenerated = {
    {"synth-llama-d256.F32",
     "--type F32 --dim 256 --layers 2 --heads 4 --kv-heads 2 --ff 256 --seed 3001"},
    {"synth-gemma3-d256.F32",
     "--arch gemma3 --type F32 --dim 256 --layers 2 --heads 4 --kv-heads 2 --ff 256 --swa 16 "
     "--swa-pattern 2 --seed 3002"},
    {"synth-qwen35-d128.F32",
     "--arch qwen35 --type F32 --dim 128 --layers 4 --heads 4 --kv-heads 2 --head-dim 64 --ff 256 "
     "--ssm-k-heads 2 --ssm-v-heads 4 --ssm-head-dim 32 --attn-interval 4 --rope-sections 3 3 2 0 "
     "--seed 3003"},
    {"synth-qwen35moe-d128.F32",
     "--arch qwen35moe --type F32 --dim 128 --layers 4 --heads 4 --kv-heads 2 --head-dim 64 --ff "
     "128 --experts 4 --experts-used 2 --ff-exp 64 --ssm-k-heads 2 --ssm-v-heads 4 --ssm-head-dim "
     "32 --attn-interval 4 --rope-sections 2 2 1 1 --seed 3004"},
    {"synth-gpt-oss-d256.F32",
     "--arch gpt-oss --type F32 --dim 256 --layers 2 --heads 4 --kv-heads 2 --ff 64 --experts 8 "
     "--experts-used 4 --ff-exp 64 --swa 16 --seed 3003"},
    {"synth-phi3-d256.F32",
     "--arch phi3 --type F32 --dim 256 --layers 2 --heads 4 --kv-heads 2 --ff 256 --ctx 131072 "
     "--yarn-orig-ctx 4096 --rope-dims 48 --swa 16 --embd-sd 1 --seed 3005"},
    {"synth-llama-rf-d256.F32",
     "--type F32 --dim 256 --layers 2 --heads 4 --kv-heads 2 --ff 256 --rope-freqs --seed 3007"},
    {"synth-mistral3-d256.F32",
     "--arch mistral3 --type F32 --dim 256 --layers 2 --heads 4 --kv-heads 2 --ff 256 "
     "--yarn-factor 4 --yarn-orig-ctx 32 --embd-sd 1 --seed 3006"},
    {"synth-mistral3-bias-d256.F32",
     "--arch mistral3 --biases --type F32 --dim 256 --layers 2 --heads 4 --kv-heads 2 --ff 256 "
     "--yarn-factor 4 --yarn-orig-ctx 32 --embd-sd 1 --seed 3008"},
    {"synth-mistral3-moe-d256.F32",
     "--arch mistral3 --moe --biases --type F32 --dim 256 --layers 2 --heads 4 --kv-heads 2 --ff "
     "96 --experts 4 --experts-used 2 --yarn-factor 4 --yarn-orig-ctx 32 --embd-sd 1 --seed 3009"},
    {"synth-phimoe-d256.F32",
     "--arch phimoe --type F32 --dim 256 --layers 2 --heads 4 --kv-heads 2 --ff 96 --experts 4 "
     "--experts-used 2 --ctx 131072 --yarn-orig-ctx 4096 --swa 16 --embd-sd 1 --seed 3010"},
    {"synth-mistral3-moe-nogate-d256.F32",
     "--arch mistral3 --moe --no-expert-gate --biases --type F32 --dim 256 --layers 2 --heads 4 "
     "--kv-heads 2 --ff 96 --experts 4 --experts-used 2 --yarn-factor 4 --yarn-orig-ctx 32 "
     "--embd-sd 1 --seed 3011"},
    {"synth-phimoe-rot48-d256.F32",
     "--arch phimoe --type F32 --dim 256 --layers 2 --heads 4 --kv-heads 2 --ff 96 --experts 4 "
     "--experts-used 2 --ctx 131072 --yarn-orig-ctx 4096 --rope-dims 48 --swa 16 --embd-sd 1 "
     "--seed 3012"}};

// The hex sha256 of a file (coreutils' sha256sum), or "" when it cannot be computed.
std::string Sha256(const std::string& path) {
  FILE* p = popen(("sha256sum '" + path + "' 2>/dev/null").c_str(), "r");
  if (p == nullptr) return "";
  char buf[65] = {};
  const size_t n = fread(buf, 1, 64, p);
  pclose(p);
  return n == 64 ? std::string(buf, 64) : "";
}

// Files this process regenerated; removed when it exits.
struct RegeneratedFiles {
  std::map<std::string, std::pair<std::string, std::string>> made;  // stem -> (path, why)
  ~RegeneratedFiles() {
    std::error_code ec;
    for (const auto& [stem, made_path] : made)
      if (!made_path.first.empty()) fs::remove(made_path.first, ec);
  }
};

// The path of a regenerated F32 base in the test's temp dir (one per process: ctest runs cases
// in parallel processes); "" plus *why when it could not be made (no lamina-synth, no ../shared
// vocabulary). Made once per process.
std::string RegeneratedModel(const std::string& model_stem, std::string* why) {
  static RegeneratedFiles files;
  auto& made = files.made;
  if (auto it = made.find(model_stem); it != made.end()) {
    *why = it->second.second;
    return it->second.first;
  }
  std::string path, reason;
  const std::string vocab = kShared + "/models/stories260K.gguf";
#ifdef LAMINA_SYNTH_BINARY
  if (!fs::exists(vocab)) {
    reason = vocab + " is absent (lamina-synth copies its vocabulary)";
  } else {
    const std::string out =
        testing::TempDir() + "/" + model_stem + "." + std::to_string(getpid()) + ".gguf";
    const std::string cmd = std::string(LAMINA_SYNTH_BINARY) + " --vocab-from '" + vocab + "' " +
                            kRegenerated.at(model_stem) + " -o '" + out + "' 2>&1";
    FILE* p = popen(cmd.c_str(), "r");
    std::string log;
    if (p != nullptr) {
      char buf[512];
      size_t n;
      while ((n = fread(buf, 1, sizeof(buf), p)) > 0) log.append(buf, n);
    }
    if (p != nullptr && pclose(p) == 0 && fs::exists(out)) {
      path = out;
    } else {
      reason = "lamina-synth failed: " + cmd + ": " + log;
    }
  }
#else
  reason = "lamina-synth is not built";
#endif
  made[model_stem] = {path, reason};
  *why = reason;
  return path;
}

std::vector<GoldenCase> CollectRepoFixtures() {
  std::vector<GoldenCase> cases;
  const fs::path d = fs::path(kFixtures) / "golden";
  if (!fs::exists(d)) return cases;
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(d))
    if (e.path().extension() == ".json") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  for (const fs::path& p : files) {
    const std::string stem = p.stem().string();  // model.prompt.kv
    const auto kv_dot = stem.rfind('.');
    const std::string kv = stem.substr(kv_dot + 1);
    const std::string rest = stem.substr(0, kv_dot);
    const std::string model_stem = rest.substr(0, rest.rfind('.'));
    // A missing model file is reported by the case itself (its load fails with the path).
    cases.push_back({p.string(), kFixtures + "/models/" + model_stem + ".gguf", kv,
                     ToleranceFor(model_stem, kv)});
  }
  return cases;
}

class FixtureGoldenTest : public testing::TestWithParam<GoldenCase> {};

// The quantized files are loaded from tests/fixtures/models; a load error (e.g. a weight type
// lamina does not implement) fails the case with the loader's message. The goldens' recorded
// sha256 must be the file's, so a model regenerated without its goldens is caught.
TEST_P(FixtureGoldenTest, LogitsAndGreedyMatchLlamaCpp) {
  GoldenCase c = GetParam();
  std::ifstream in(c.json_path);
  ASSERT_TRUE(in) << c.json_path;
  const nlohmann::json g = nlohmann::json::parse(in);
  const std::string model_stem = fs::path(c.model_path).stem().string();
  if (kRegenerated.count(model_stem) != 0) {
    std::string why;
    c.model_path = RegeneratedModel(model_stem, &why);
    if (c.model_path.empty()) GTEST_SKIP() << model_stem << " not regenerated: " << why;
  }
  ASSERT_TRUE(fs::exists(c.model_path)) << c.model_path << " is missing (" << c.json_path << ")";
  const std::string sha = Sha256(c.model_path);
  const std::string want_sha = g["model"]["sha256"].get<std::string>();
  if (kRegenerated.count(model_stem) != 0 && !sha.empty() && sha != want_sha) {
    // std::normal_distribution is the standard library's own: another library draws other
    // weights from the same seed, and these goldens do not apply to them.
    GTEST_SKIP() << "lamina-synth wrote " << model_stem << " with sha256 " << sha << ", not the "
                 << want_sha << " the goldens were made from (another standard library?)";
  }
  if (!sha.empty()) {
    EXPECT_EQ(sha, want_sha) << c.model_path << " is not the goldens' file";
  }
  CheckGolden(c, g);
}

INSTANTIATE_TEST_SUITE_P(RepoFixtures, FixtureGoldenTest, testing::ValuesIn(CollectRepoFixtures()),
                         CaseName);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(FixtureGoldenTest);

TEST(GoldenRepoFixtures, Present) {
  EXPECT_FALSE(CollectRepoFixtures().empty()) << kFixtures << "/golden has no goldens";
}

// The CLI prints llama.cpp's greedy token ids for every stories260K prompt, f32 and f16 KV.
TEST(GoldenCli, RunPrintsReferenceGreedyTokens) {
  const fs::path dir = fs::path(kShared) / "golden" / "stories260K";
  if (!fs::exists(dir)) GTEST_SKIP() << "../shared/golden is absent";
  int checked = 0;
  for (const char* prompt : {"bos", "once", "lily", "story300"}) {
    for (const char* kv : {"f32", "f16"}) {
      const fs::path json = dir / (std::string("stories260K.") + prompt + "." + kv + ".json");
      std::ifstream in(json);
      ASSERT_TRUE(in) << json;
      const nlohmann::json g = nlohmann::json::parse(in);
      const fs::path prompt_file =
          fs::path(kShared) / "golden" / "prompts" / (std::string("prompt_") + prompt + ".txt");
      const std::string cmd = std::string(LAMINA_BINARY) + " run -m " + kShared +
                              "/models/stories260K.gguf -f " + prompt_file.string() +
                              " -n 64 --temp 0 --ignore-eos --json -t 2 --kv " + kv;
      FILE* p = popen(cmd.c_str(), "r");
      ASSERT_NE(p, nullptr);
      std::string out;
      char buf[4096];
      size_t n;
      while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
      ASSERT_EQ(pclose(p), 0) << cmd;
      const nlohmann::json got = nlohmann::json::parse(out);
      EXPECT_EQ(got["prompt_tokens"], g["prompt_tokens"]) << cmd;
      EXPECT_EQ(got["generated_tokens"], g["generated_tokens"]) << cmd;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 8);
}

}  // namespace
}  // namespace lamina
