// Refused inputs of the lamina CLI as a real process: the memory guard (oversize context,
// oversize batch, the limit's option and variable), an allocation failing despite it, and
// numeric options out of range; each checks the one-line message and the exit code.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <thread>

#include "process_util.h"

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
  const std::string text = testing::TempDir() + "/robust_score.txt";
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

}  // namespace
