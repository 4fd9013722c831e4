// Refused inputs of the lamina CLI as a real process: the memory guard (oversize context,
// oversize batch, the limit's option and variable), an allocation failing despite it, numeric
// options out of range, and model files whose metadata counts contradict their tensors; each
// checks the one-line message and the exit code.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "gguf/gguf.h"
#include "model/model.h"
#include "process_util.h"
#include "temp_path.h"

namespace {

const std::string kBinary = LAMINA_BINARY;
const std::string kShipped = std::string(LAMINA_SOURCE_DIR) + "/models/lamina-counter.gguf";

using Output = lamina::testing_util::ProcessOutput;

// stdout and stderr together.
Output Lamina(const std::string& args) {
  return lamina::testing_util::RunShell(kBinary + " " + args + " 2>&1");
}

bool Contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

std::string Numbers(int n) {
  std::string p;
  for (int i = 0; i < n; ++i) p += std::to_string(i) + " ";
  return p;
}

TEST(MemoryGuard, OversizeContextIsRefusedWithTheBytesTheLimitAndTheOptions) {
  Output o = Lamina("run -m " + kShipped + " -c 100000000 -p hi");
  EXPECT_EQ(o.code, 2) << o.out;
  EXPECT_TRUE(Contains(o.out, "the KV cache (f16, 100000000 tokens x 1 sequence) needs 238.42 GiB"))
      << o.out;
  EXPECT_TRUE(Contains(o.out, "over the memory limit of")) << o.out;
  EXPECT_TRUE(Contains(o.out, "--ctx-size/-c")) << o.out;
  EXPECT_TRUE(Contains(o.out, "--kv")) << o.out;
  EXPECT_TRUE(Contains(o.out, "--parallel")) << o.out;
  EXPECT_FALSE(Contains(o.out, "bad_alloc")) << o.out;
}

// Hybrid models: the ring of recurrent states is planned with the cache, and --recurrent-ring
// is range-checked; a small ring still runs (drafts stay below it).
TEST(MemoryGuard, RecurrentRingIsPlannedAndRangeChecked) {
  const std::string hybrid =
      std::string(LAMINA_SHARED_DIR) + "/models/synth-qwen3next-d256.Q4_K_M.gguf";
  if (!std::filesystem::exists(hybrid)) GTEST_SKIP() << hybrid << " is absent";
  Output big =
      Lamina("run -m " + hybrid + " -c 256 -p hi -n 1 --recurrent-ring 4096 --mem-limit 64M");
  EXPECT_EQ(big.code, 2) << big.out;
  EXPECT_TRUE(Contains(big.out, "the recurrent states (4096 per sequence x 1 sequence) need"))
      << big.out;
  EXPECT_TRUE(Contains(big.out, "--recurrent-ring")) << big.out;
  Output zero = Lamina("run -m " + hybrid + " -p hi --recurrent-ring 0");
  EXPECT_EQ(zero.code, 2) << zero.out;
  EXPECT_TRUE(Contains(zero.out, "--recurrent-ring")) << zero.out;
  Output small = Lamina("run -m " + hybrid +
                        " -c 256 -p \"1 2 3 1 2 3 1 2 3\" -n 16 --temp 0 "
                        "--recurrent-ring 3 --spec lookup");
  EXPECT_EQ(small.code, 0) << small.out;
  Output plain = Lamina("run -m " + hybrid + " -c 256 -p \"1 2 3 1 2 3 1 2 3\" -n 16 --temp 0");
  EXPECT_EQ(plain.code, 0) << plain.out;
  // The same greedy text (stdout's first line) with a 3-state ring and lookup drafts.
  EXPECT_EQ(small.out.substr(0, small.out.find('\n')), plain.out.substr(0, plain.out.find('\n')));
}

// The repository's hybrid fixture: its rings of recurrent states dominate a small cache, and the
// plan counts them (no ../shared needed).
TEST(MemoryGuard, RecurrentStatesOfTheRepositoryHybridArePlanned) {
  const std::string hybrid =
      std::string(LAMINA_SOURCE_DIR) + "/tests/fixtures/models/synth-qwen35-d128.Q8_0.gguf";
  Output big =
      Lamina("run -m " + hybrid + " -c 256 -p hi -n 1 --recurrent-ring 4096 --mem-limit 16M");
  EXPECT_EQ(big.code, 2) << big.out;
  EXPECT_TRUE(Contains(big.out,
                       "the recurrent states (4096 per sequence x 1 sequence) need 228.0 MiB "
                       "besides the 128.0 KiB KV cache"))
      << big.out;
  Output fits = Lamina("run -m " + hybrid + " -c 256 -p hi -n 1 --mem-limit 16M");
  EXPECT_EQ(fits.code, 0) << fits.out;
}

// --spec mtp keeps a KV cache for the MTP head and the trunk's hidden states (8 MiB at 4096
// tokens for the shipped model and its head): a limit the plain plan fits is refused with them,
// naming them, and a smaller context fits again. The server plans them for each slot.
TEST(MemoryGuard, MtpHeadCachesAndHiddenStatesArePlanned) {
  Output plain = Lamina("run -m " + kShipped + " -p hi -n 1 --mem-limit 15M");
  EXPECT_EQ(plain.code, 0) << plain.out;
  Output mtp = Lamina("run -m " + kShipped + " -p hi -n 1 --mem-limit 15M --spec mtp");
  EXPECT_EQ(mtp.code, 2) << mtp.out;
  EXPECT_TRUE(Contains(mtp.out,
                       "--spec mtp needs 8.0 MiB for the MTP head's KV cache and the kept hidden "
                       "states (4096 tokens x 1 sequence) besides the 10.0 MiB KV cache"))
      << mtp.out;
  EXPECT_TRUE(Contains(mtp.out, "--kv-draft")) << mtp.out;
  Output smaller = Lamina("run -m " + kShipped + " -p hi -n 1 --mem-limit 15M --spec mtp -c 2048");
  EXPECT_EQ(smaller.code, 0) << smaller.out;
  Output chat = lamina::testing_util::RunShell("echo hi | " + kBinary + " chat -m " + kShipped +
                                               " -n 1 --mem-limit 15M --spec mtp 2>&1");
  EXPECT_EQ(chat.code, 2) << chat.out;
  EXPECT_TRUE(Contains(chat.out, "--spec mtp needs 8.0 MiB")) << chat.out;
  Output serve = Lamina("serve -m " + kShipped + " --port 0 --mem-limit 30M --spec mtp");
  EXPECT_EQ(serve.code, 2) << serve.out;
  EXPECT_TRUE(Contains(serve.out, "(and 8.0 MiB for --spec mtp)")) << serve.out;
}

TEST(MemoryGuard, TheLimitComesFromTheOptionOrTheEnvironment) {
  Output env = lamina::testing_util::RunShell("LAMINA_MEM_LIMIT=1M " + kBinary + " run -m " +
                                              kShipped + " -p hi -n 1 2>&1");
  EXPECT_EQ(env.code, 2) << env.out;
  EXPECT_TRUE(Contains(env.out,
                       "needs 10.0 MiB, over the memory limit of 1.0 MiB (set by "
                       "LAMINA_MEM_LIMIT"))
      << env.out;
  // The option wins over the variable.
  Output opt = lamina::testing_util::RunShell("LAMINA_MEM_LIMIT=1M " + kBinary + " run -m " +
                                              kShipped + " -p hi -n 1 --mem-limit 1G 2>&1");
  EXPECT_EQ(opt.code, 0) << opt.out;
  Output bad = Lamina("run -m " + kShipped + " -p hi --mem-limit 3x");
  EXPECT_EQ(bad.code, 2) << bad.out;
  EXPECT_TRUE(Contains(bad.out, "--mem-limit: bad size \"3x\"")) << bad.out;
}

TEST(MemoryGuard, OversizeBatchIsRefusedAndPromptChunkFitsIt) {
  const std::string prompt = "-p \"" + Numbers(150) + "\"";
  Output o = Lamina("run -m " + kShipped + " --mem-limit 12M -n 1 " + prompt);
  EXPECT_EQ(o.code, 2) << o.out;
  EXPECT_TRUE(Contains(o.out, "a batch of 49")) << o.out;
  EXPECT_TRUE(Contains(o.out, "--prompt-chunk")) << o.out;
  Output chunked =
      Lamina("run -m " + kShipped + " --mem-limit 12M -n 1 --prompt-chunk 16 " + prompt);
  EXPECT_EQ(chunked.code, 0) << chunked.out;
}

TEST(MemoryGuard, ScoreAndServeAreGuardedToo) {
  const std::string text = lamina::testing_util::UniqueTempPath("robust_score.txt");
  const lamina::testing_util::RemoveAtExit remove_text(text);
  ASSERT_EQ(std::system(("echo '" + Numbers(100) + "' > " + text).c_str()), 0);
  Output score = Lamina("score -m " + kShipped + " -f " + text + " -c 50000000");
  EXPECT_EQ(score.code, 2) << score.out;
  EXPECT_TRUE(Contains(score.out, "needs 119.21 GiB")) << score.out;
  Output serve = Lamina("serve -m " + kShipped + " --port 0 -c 16000000 -np 4");
  EXPECT_EQ(serve.code, 2) << serve.out;
  EXPECT_TRUE(Contains(serve.out, "(f16, 4000000 tokens x 4 sequences) needs 38.15 GiB"))
      << serve.out;
}

TEST(MemoryGuard, AFailedAllocationEndsWithAMessageNotAnAbort) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer reserves terabytes of shadow address space at start, which "
                  "the ulimit -v cap this test needs forbids";
#endif
  // Without the guard, under an address-space cap, the cache's allocation fails.
  Output o = lamina::testing_util::RunShell("ulimit -v 3000000; " + kBinary + " run -m " +
                                            kShipped + " --mem-limit none -c 50000000 -p hi 2>&1");
  EXPECT_EQ(o.code, 4) << o.out;
  EXPECT_TRUE(Contains(o.out, "lamina: out of memory")) << o.out;
}

// Every refused value: exit code 2 and exactly one line naming the option and the value.
void ExpectRefused(const std::string& args, const std::string& message) {
  Output o = Lamina(args);
  EXPECT_EQ(o.code, 2) << args << "\n" << o.out;
  EXPECT_EQ(o.out, "lamina: " + message + "\n") << args;
}

TEST(OptionRanges, EveryKindOfNumberIsRangeChecked) {
  const std::string m = "-m " + kShipped;
  const std::string threads_max = std::to_string(4 * std::thread::hardware_concurrency());
  for (const char* cmd : {"run -p hi", "chat", "score -f x", "bench", "probe", "serve"}) {
    const std::string c = std::string(cmd) + " " + m;
    ExpectRefused(c + " -t 100000",
                  "--threads: must be 0 (all cores) .. " + threads_max + " (4 x the " +
                      std::to_string(std::thread::hardware_concurrency()) + " cores), got 100000");
    ExpectRefused(c + " -t -1",
                  "--threads: must be 0 (all cores) .. " + threads_max + " (4 x the " +
                      std::to_string(std::thread::hardware_concurrency()) + " cores), got -1");
  }
  for (const char* cmd : {"run -p hi", "chat", "serve"}) {
    const std::string c = std::string(cmd) + " " + m;
    ExpectRefused(c + " --top-p 7", "--top-p: must be a probability in [0, 1], got 7");
    ExpectRefused(c + " --top-p nan", "--top-p: must be a probability in [0, 1], got nan");
    ExpectRefused(c + " --min-p -0.1", "--min-p: must be a probability in [0, 1], got -0.1");
    ExpectRefused(c + " --repeat-penalty 0",
                  "--repeat-penalty: must be a finite number > 0, got 0");
    ExpectRefused(c + " --repeat-penalty inf",
                  "--repeat-penalty: must be a finite number > 0, got inf");
    ExpectRefused(c + " --temp -1", "--temp: must be a temperature in [0, 100], got -1");
    ExpectRefused(c + " --top-k -3", std::string("--top-k: must be an integer in [0, ") +
                                         (std::string(cmd) == "serve" ? "1048576" : "1073741824") +
                                         "], got -3");
    ExpectRefused(c + " -n -5",
                  std::string("--n-predict: must be an integer in [") +
                      (std::string(cmd) == "serve" ? "-1, 16777216" : "0, 1073741824") +
                      "], got -5");
  }
  for (const char* cmd : {"run -p hi", "chat", "score -f x", "bench"}) {
    const std::string c = std::string(cmd) + " " + m;
    ExpectRefused(c + " -c -4", "--ctx-size: must be an integer in [0, 1073741824], got -4");
    ExpectRefused(c + " --rope-scale -2", "--rope-scale: must be a finite number >= 0, got -2");
    ExpectRefused(c + " --yarn-orig-ctx -1",
                  "--yarn-orig-ctx: must be an integer in [0, 1073741824], got -1");
    ExpectRefused(c + " --kv-seed -1", "--kv-seed: must be an integer in [0, 2^64), got -1");
  }
  ExpectRefused("run " + m + " -p hi --seed -5", "--seed: must be an integer in [0, 2^64), got -5");
  ExpectRefused("run " + m + " -p hi --prompt-chunk -1",
                "--prompt-chunk: must be an integer in [0, 1073741824], got -1");
  ExpectRefused("bench " + m + " -r 0", "--reps: must be an integer in [1, 1000], got 0");
  ExpectRefused("bench " + m + " -p -1",
                "--n-prompt: must be an integer in [0, 1073741824], got -1");
  ExpectRefused("bench " + m + " -d -1", "--depth: must be an integer in [0, 1073741824], got -1");
  ExpectRefused("probe " + m + " -c 10", "--ctx: must be an integer in [64, 1073741824], got 10");
  ExpectRefused("probe " + m + " --count-to 0",
                "--count-to: must be an integer in [1, 1048576], got 0");
  ExpectRefused("probe " + m + " --divergence-tokens 4",
                "--divergence-tokens: must be an integer in [8, 1073741824], got 4");
  ExpectRefused("probe " + m + " --free-run-tokens -1",
                "--free-run-tokens: must be an integer in [0, 1073741824], got -1");
  ExpectRefused("serve " + m + " --parallel 0",
                "--parallel: must be an integer in [1, 256], got 0");
  ExpectRefused("serve " + m + " --port 70000",
                "--port: must be an integer in [0, 65535], got 70000");
  ExpectRefused("serve " + m + " -b 0", "--batch-size: must be an integer in [1, 65536], got 0");
}

TEST(OptionRanges, ThreadsAboveTheCoreCountWarn) {
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  Output o = Lamina("run -m " + kShipped + " -p hi -n 1 -t " + std::to_string(cores + 1));
  EXPECT_EQ(o.code, 0) << o.out;
  EXPECT_TRUE(Contains(o.out, "lamina: warning: " + std::to_string(cores + 1) + " threads on " +
                                  std::to_string(cores) + " cores"))
      << o.out;
}

// ---------------------------------------------------------------------------------------------
// Metadata counts against the tensors present (docs/ROBUSTNESS.md, "Hyper-parameters against
// tensors"): a real model file rewritten with one count inflated (or contradicted) is refused
// by LoadModel with the key, the value and what contradicts it, and by `lamina run` with exit
// code 3 in well under a second, before anything is sized from the count.

using lamina::LoadModel;
using lamina::Model;
using lamina::Result;
namespace gguf = lamina::gguf;

// The longest a refusal may take, the process's start included (measured: 0.01 to 0.06 s).
constexpr double kMaxRefusalSeconds = 1.0;

gguf::Value U32(uint32_t v) {
  gguf::Value x;
  x.type = gguf::ValueType::kU32;
  x.u = v;
  return x;
}

gguf::Value U64(uint64_t v) {
  gguf::Value x;
  x.type = gguf::ValueType::kU64;
  x.u = v;
  return x;
}

gguf::Value I32Array(const std::vector<int32_t>& items) {
  gguf::Value x;
  x.type = gguf::ValueType::kArray;
  x.elem_type = gguf::ValueType::kI32;
  for (int32_t i : items) {
    gguf::Value e;
    e.type = gguf::ValueType::kI32;
    e.i = i;
    x.array.push_back(e);
  }
  return x;
}

struct CountCase {
  std::string name;
  std::string fixture;                                     // the real model file rewritten
  std::vector<std::pair<std::string, gguf::Value>> edits;  // metadata set or replaced
  std::vector<std::string> fragments;                      // all in the error message
  std::string drop_prefix = {};                            // tensors left out ("": none)
  // Applied to the serialized file (for what the writer cannot express); nullptr: none.
  std::function<void(std::vector<uint8_t>*)> poke = {};
};

// Writes `c.fixture` with the case's edits as a new file; "" when the fixture is absent.
std::string WriteCase(const CountCase& c) {
  auto file = gguf::File::Open(c.fixture);
  if (!file.ok()) return "";
  gguf::Writer w;
  for (const auto& [key, value] : (*file)->metadata()) w.SetValue(key, value);
  for (const auto& [key, value] : c.edits) w.SetValue(key, value);
  for (const gguf::TensorInfo& t : (*file)->tensors()) {
    if (!c.drop_prefix.empty() && t.name.starts_with(c.drop_prefix)) continue;
    w.AddTensor(t.name, t.type, std::vector<int64_t>(t.ne, t.ne + t.n_dims), t.data, t.n_bytes);
  }
  std::vector<uint8_t> bytes = w.Serialize();
  if (c.poke) c.poke(&bytes);
  const std::string path =
      testing::TempDir() + "/counts_" + std::to_string(getpid()) + "_" + c.name + ".gguf";
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return "";
  const bool ok = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  std::fclose(f);
  return ok ? path : "";
}

// Position of a metadata key's value in a serialized file (the key text is unique there).
size_t ValueAt(const std::vector<uint8_t>& bytes, const std::string& key) {
  const auto it = std::search(bytes.begin(), bytes.end(), key.begin(), key.end());
  EXPECT_NE(it, bytes.end()) << key;
  return static_cast<size_t>(it - bytes.begin()) + key.size() + 4;  // after the u32 type
}

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

void ExpectRefusedQuickly(const CountCase& c, bool parser_level) {
  SCOPED_TRACE(c.name);
  const std::string path = WriteCase(c);
  ASSERT_FALSE(path.empty()) << "could not rewrite " << c.fixture;
  if (!parser_level) {
    // The file itself is well-formed GGUF: the parser keeps it, the model loader refuses it.
    ASSERT_TRUE(gguf::File::Open(path).ok());
  }
  auto start = std::chrono::steady_clock::now();
  Result<std::unique_ptr<Model>> model = LoadModel(path);
  const double load_s = Seconds(start);
  ASSERT_FALSE(model.ok()) << path << " was loaded";
  const std::string& msg = model.error().message;
  EXPECT_EQ(msg.rfind(path + ": ", 0), 0u) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  for (const std::string& f : c.fragments) EXPECT_TRUE(Contains(msg, f)) << f << " not in: " << msg;
  EXPECT_LT(load_s, kMaxRefusalSeconds) << msg;

  start = std::chrono::steady_clock::now();
  Output run = Lamina("run -m " + path + " -p hi -n 1");
  const double run_s = Seconds(start);
  EXPECT_EQ(run.code, 3) << run.out;
  EXPECT_EQ(run.out, "lamina: " + msg + "\n");
  EXPECT_LT(run_s, kMaxRefusalSeconds) << run.out;

  // inspect shows a well-formed file whatever its counts claim (exit 0), and refuses one the
  // parser refuses (exit 3), in well under a second either way.
  start = std::chrono::steady_clock::now();
  Output inspect = Lamina("inspect " + path + " >/dev/null");
  const double inspect_s = Seconds(start);
  EXPECT_EQ(inspect.code, parser_level ? 3 : 0) << inspect.out;
  EXPECT_LT(inspect_s, kMaxRefusalSeconds);
  std::printf("  %-28s load %.3f s, run %.3f s, inspect %.3f s: %s\n", c.name.c_str(), load_s,
              run_s, inspect_s, msg.c_str() + path.size() + 2);
  std::filesystem::remove(path);
}

TEST(HparamCounts, EveryLlamaCountIsCheckedAgainstTheTensors) {
  // lamina-counter: llama, 5 layers, n_embd 384, 6 heads of 64 (2 KV heads), FFN 1024,
  // 1,024 tokens.
  const std::string m = kShipped;
  const std::vector<CountCase> cases = {
      {"layers_5M",
       m,
       {{"llama.block_count", U32(5000000)}},
       {"metadata key \"llama.block_count\" = 5000000",
        "but the tensors hold 5 layers (blk.0 .. blk.4)"}},
      {"layers_int_max",
       m,
       {{"llama.block_count", U32(2147483647)}},
       {"\"llama.block_count\" = 2147483647", "the tensors hold 5 layers"}},
      {"layers_2_40", m, {{"llama.block_count", U64(1ull << 40)}}, {"out of range [1, "}},
      {"layers_fewer",
       m,
       {{"llama.block_count", U32(3)}},
       {"\"llama.block_count\" = 3", "tensors of blk.3 are present (layers are blk.0 .. blk.2)"}},
      {"layer_missing",
       m,
       {},
       {"\"llama.block_count\" = 5", "the tensors hold 4 layers and none of blk.2"},
       "blk.2."},
      {"heads_2_20",
       m,
       {{"llama.attention.head_count", U32(1u << 20)}},
       {"\"llama.attention.head_count\" = 1048576 is out of range [1, 65536]"}},
      {"heads_4096",
       m,
       {{"llama.attention.head_count", U32(4096)}},
       {"\"llama.attention.head_count\" = 4096",
        "blk.0.attn_q.weight has 384 rows, not a multiple of it"}},
      {"kv_heads_2_20",
       m,
       {{"llama.attention.head_count_kv", U32(1u << 20)}},
       {"\"llama.attention.head_count_kv\" = 1048576", "does not divide"}},
      // 2^32 + 2 used to be cast to int and read as 2.
      {"kv_heads_2_32_plus_2",
       m,
       {{"llama.attention.head_count_kv", U64((1ull << 32) + 2)}},
       {"\"llama.attention.head_count_kv\" = 4294967298", "does not divide"}},
      {"kv_heads_3",
       m,
       {{"llama.attention.head_count_kv", U32(3)}},
       {"\"llama.attention.head_count_kv\" = 3",
        "blk.0.attn_k.weight has 128 rows, not a multiple of it"}},
      {"key_length_2_32_plus_64",
       m,
       {{"llama.attention.key_length", U64((1ull << 32) + 64)}},
       {"\"llama.attention.key_length\" = 4294967360", "even and in [2, 1024]"}},
      {"key_length_32",
       m,
       {{"llama.attention.key_length", U32(32)}},
       {"\"llama.attention.key_length\" = 32", "blk.0.attn_q.weight has 384 rows for 6 heads"}},
      {"embd_2_30",
       m,
       {{"llama.embedding_length", U32(1u << 30)}},
       {"\"llama.embedding_length\" = 1073741824", "token_embd.weight has rows of 384 elements"}},
      {"ff_2_30",
       m,
       {{"llama.feed_forward_length", U32(1u << 30)}},
       {"\"llama.feed_forward_length\" = 1073741824", "blk.0.ffn_up.weight has 1024 rows"}},
      {"ff_per_layer_array",
       m,
       {{"llama.feed_forward_length", I32Array({1024, 1024, 1024, 1024, 1 << 30})}},
       {"llama.feed_forward_length", "has type array, expected an integer"}},
      {"ctx_2_31",
       m,
       {{"llama.context_length", U32(1u << 31)}},
       {"\"llama.context_length\" = 2147483648 is out of range [1, 1073741824]"}},
      {"yarn_orig_ctx_2_31",
       m,
       {{"llama.rope.scaling.original_context_length", U32(1u << 31)}},
       {"\"llama.rope.scaling.original_context_length\" = 2147483648", "[1, 1073741824]"}},
      {"rope_dims_2_20",
       m,
       {{"llama.rope.dimension_count", U32(1u << 20)}},
       {"\"llama.rope.dimension_count\" = 1048576", "in [2, head dimension 64]"}},
      {"vocab_size_2_30",
       m,
       {{"llama.vocab_size", U32(1u << 30)}},
       {"\"llama.vocab_size\" = 1073741824", "tokenizer.ggml.tokens has 1024 tokens"}},
  };
  for (const CountCase& c : cases) ExpectRefusedQuickly(c, /*parser_level=*/false);
}

// Counts the GGUF parser itself bounds (src/gguf/gguf.h): array lengths, the tensor count.
TEST(HparamCounts, ArrayLengthsAndTensorCountsAreCappedByTheParser) {
  CountCase tokens{"tokens_2_60", kShipped, {}, {"tokenizer.ggml.tokens", "exceeds the cap"}};
  tokens.poke = [](std::vector<uint8_t>* b) {
    const uint64_t huge = 1ull << 60;  // after the element type
    std::memcpy(b->data() + ValueAt(*b, "tokenizer.ggml.tokens") + 4, &huge, sizeof(huge));
  };
  ExpectRefusedQuickly(tokens, /*parser_level=*/true);
  CountCase tensors{"tensors_2_40", kShipped, {}, {"header.n_tensors", "exceeds the cap"}};
  tensors.poke = [](std::vector<uint8_t>* b) {
    const uint64_t huge = 1ull << 40;  // magic, version, then n_tensors
    std::memcpy(b->data() + 8, &huge, sizeof(huge));
  };
  ExpectRefusedQuickly(tensors, /*parser_level=*/true);
  CountCase chat{"string_2_40", kShipped, {}, {"tokenizer.chat_template", "exceeds the cap"}};
  chat.poke = [](std::vector<uint8_t>* b) {
    const uint64_t huge = 1ull << 40;  // the string's length
    std::memcpy(b->data() + ValueAt(*b, "tokenizer.chat_template"), &huge, sizeof(huge));
  };
  ExpectRefusedQuickly(chat, /*parser_level=*/true);
}

std::string SharedModel(const std::string& name) {
  return std::string(LAMINA_SHARED_DIR) + "/models/" + name;
}

TEST(HparamCounts, ExpertCountsAreCheckedAgainstTheExpertTensors) {
  // 8 experts (2 used) of width 256, feed_forward_length 512, 4 layers.
  const std::string moe = SharedModel("synth-qwen3moe-d256.Q4_K_M.gguf");
  // 8 experts of 96 and a shared expert of 384.
  const std::string moe2 = SharedModel("synth-qwen2moe-d128.Q8_0.gguf");
  if (!std::filesystem::exists(moe) || !std::filesystem::exists(moe2)) {
    GTEST_SKIP() << "the MoE fixtures of ../shared are absent (" << moe << ", " << moe2 << ")";
  }
  const std::vector<CountCase> cases = {
      {"moe_layers_5M",
       moe,
       {{"qwen3moe.block_count", U32(5000000)}},
       {"\"qwen3moe.block_count\" = 5000000", "the tensors hold 4 layers"}},
      {"experts_1M",
       moe,
       {{"qwen3moe.expert_count", U32(1000000)}},
       {"\"qwen3moe.expert_count\" = 1000000", "must be in [1, 1024]"}},
      {"experts_16",
       moe,
       {{"qwen3moe.expert_count", U32(16)}},
       {"\"qwen3moe.expert_count\" = 16", "blk.0.ffn_gate_exps.weight holds 8 experts"}},
      {"experts_used_100",
       moe,
       {{"qwen3moe.expert_used_count", U32(100)}},
       {"\"qwen3moe.expert_used_count\" = 100", "[1, qwen3moe.expert_count 8]"}},
      {"expert_ff_2_20",
       moe,
       {{"qwen3moe.expert_feed_forward_length", U32(1u << 20)}},
       {"\"qwen3moe.expert_feed_forward_length\" = 1048576",
        "blk.0.ffn_gate_exps.weight has 256 rows per expert"}},
      {"moe_ff_2_30",
       moe,
       {{"qwen3moe.feed_forward_length", U32(1u << 30)}},
       {"\"qwen3moe.feed_forward_length\" = 1073741824", "the experts together are 2048 wide"}},
      {"shared_ff_2_20",
       moe2,
       {{"qwen2moe.expert_shared_feed_forward_length", U32(1u << 20)}},
       {"\"qwen2moe.expert_shared_feed_forward_length\" = 1048576",
        "blk.0.ffn_gate_shexp.weight has 384 rows"}},
  };
  for (const CountCase& c : cases) ExpectRefusedQuickly(c, /*parser_level=*/false);
}

TEST(HparamCounts, HybridCountsAreCheckedAgainstTheDeltaNetTensors) {
  // 4 layers (every 4th full attention), conv kernel 4, 2 K heads of 64, 4 V heads, inner 256.
  const std::string next = SharedModel("synth-qwen3next-d256.Q4_K_M.gguf");
  if (!std::filesystem::exists(next)) GTEST_SKIP() << next << " is absent";
  const std::vector<CountCase> cases = {
      {"next_layers_5M",
       next,
       {{"qwen3next.block_count", U32(5000000)}},
       {"\"qwen3next.block_count\" = 5000000", "the tensors hold 4 layers"}},
      {"next_heads_4096",
       next,
       {{"qwen3next.attention.head_count", U32(4096)}},
       {"\"qwen3next.attention.head_count\" = 4096", "blk.3.attn_q.weight has",
        "not a multiple of 2 x it"}},
      {"interval_2",
       next,
       {{"qwen3next.full_attention_interval", U32(2)}},
       {"\"qwen3next.full_attention_interval\" = 2",
        "makes blk.1 a full-attention layer, and blk.1.attn_q.weight is missing"}},
      {"conv_kernel_64",
       next,
       {{"qwen3next.ssm.conv_kernel", U32(64)}},
       {"\"qwen3next.ssm.conv_kernel\" = 64", "blk.0.ssm_conv1d.weight has 4 taps"}},
      {"state_size_4096",
       next,
       {{"qwen3next.ssm.state_size", U32(4096)}},
       {"\"qwen3next.ssm.state_size\" = 4096", "= 16640 channels",
        "blk.0.ssm_conv1d.weight has 512"}},
      {"v_heads_8",
       next,
       {{"qwen3next.ssm.time_step_rank", U32(8)}},
       {"\"qwen3next.ssm.time_step_rank\" = 8", "blk.0.ssm_a has 4 heads"}},
      {"inner_2_20",
       next,
       {{"qwen3next.ssm.inner_size", U32(1u << 20)}},
       {"\"qwen3next.ssm.inner_size\" = 1048576", "blk.0.ssm_norm.weight has 64"}},
      {"next_experts_16",
       next,
       {{"qwen3next.expert_count", U32(16)}},
       {"\"qwen3next.expert_count\" = 16", "holds 8 experts"}},
  };
  for (const CountCase& c : cases) ExpectRefusedQuickly(c, /*parser_level=*/false);
}

TEST(HparamCounts, Qwen35CountsAreCheckedAgainstTheTensors) {
  // The repository's qwen35moe fixture: 4 layers (every 4th full attention), conv kernel 4, 2 K
  // heads of 32, 4 V heads (inner 128), 4 experts, head dimension 64.
  const std::string q35 =
      std::string(LAMINA_SOURCE_DIR) + "/tests/fixtures/models/synth-qwen35moe-d128.Q8_0.gguf";
  if (!std::filesystem::exists(q35)) GTEST_SKIP() << q35 << " is absent";
  const std::vector<CountCase> cases = {
      {"q35_layers_5M",
       q35,
       {{"qwen35moe.block_count", U32(5000000)}},
       {"\"qwen35moe.block_count\" = 5000000", "the tensors hold 4 layers"}},
      {"q35_nextn_5M",
       q35,
       {{"qwen35moe.nextn_predict_layers", U32(5000000)}},
       {"\"qwen35moe.nextn_predict_layers\" = 5000000", "block_count is 4"}},
      {"q35_sections_5M",
       q35,
       {{"qwen35moe.rope.dimension_sections", U32(5000000)}},
       {"\"qwen35moe.rope.dimension_sections\" = 5000000", "a section must be in [0, 1024]"}},
      {"q35_v_heads_8",
       q35,
       {{"qwen35moe.ssm.time_step_rank", U32(8)}},
       {"\"qwen35moe.ssm.time_step_rank\" = 8", "blk.0.ssm_a has 4 heads"}},
      {"q35_state_size_4096",
       q35,
       {{"qwen35moe.ssm.state_size", U32(4096)}},
       {"\"qwen35moe.ssm.state_size\" = 4096", "blk.0.ssm_conv1d.weight has 256"}},
      {"q35_experts_16",
       q35,
       {{"qwen35moe.expert_count", U32(16)}},
       {"\"qwen35moe.expert_count\" = 16", "holds 4 experts"}},
  };
  for (const CountCase& c : cases) ExpectRefusedQuickly(c, /*parser_level=*/false);
}

// The rewriting itself keeps a model loadable: the unedited copies load and run.
TEST(HparamCounts, UneditedCopiesStillLoad) {
  std::vector<std::string> fixtures = {kShipped};
  for (const char* name : {"synth-qwen3moe-d256.Q4_K_M.gguf", "synth-qwen2moe-d128.Q8_0.gguf",
                           "synth-qwen3next-d256.Q4_K_M.gguf"}) {
    if (std::filesystem::exists(SharedModel(name))) fixtures.push_back(SharedModel(name));
  }
  for (size_t k = 0; k < fixtures.size(); ++k) {
    const std::string path = WriteCase({"copy_" + std::to_string(k), fixtures[k], {}, {}});
    ASSERT_FALSE(path.empty()) << fixtures[k];
    Result<std::unique_ptr<Model>> model = LoadModel(path);
    EXPECT_TRUE(model.ok()) << model.error().message;
    std::filesystem::remove(path);
  }
}

}  // namespace
