// Refused inputs of the lamina CLI as a real process: the memory guard (oversize context,
// oversize batch, the limit's option and variable), an allocation failing despite it, and
// numeric options out of range; each checks the one-line message and the exit code.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

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
  // Without the guard, under an address-space cap, the cache's allocation fails.
  Output o = lamina::testing_util::RunShell("ulimit -v 3000000; " + kBinary + " run -m " +
                                            kShipped + " --mem-limit none -c 50000000 -p hi 2>&1");
  EXPECT_EQ(o.code, 4) << o.out;
  EXPECT_TRUE(Contains(o.out, "lamina: out of memory")) << o.out;
}

}  // namespace
