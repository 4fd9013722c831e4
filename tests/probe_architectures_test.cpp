// `lamina probe` on each architecture's test fixture (gemma3, gpt-oss, qwen35, qwen35moe, phi3,
// phimoe, mistral3 dense and MoE), every KV mode as a leg at its default recent window: every leg
// passes the divergence probe against the f32 reference, and the decode path's KV rows equal the
// prompt path's (path_max_abs_diff 0: the one writer) in every mode.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cctype>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>

#include "process_util.h"

namespace {

namespace fs = std::filesystem;

const std::string kFixtures = std::string(LAMINA_SOURCE_DIR) + "/tests/fixtures/models/";

struct ArchFixture {
  const char* arch;  // general.architecture of the file
  const char* file;  // under tests/fixtures/models
};

const ArchFixture kArchFixtures[] = {
    {"gemma3", "synth-gemma3-d256.Q8_0.gguf"},
    {"gpt-oss", "synth-gpt-oss-d256.MXFP4_MOE.gguf"},
    {"qwen35", "synth-qwen35-d128.Q8_0.gguf"},
    {"qwen35moe", "synth-qwen35moe-d128.Q8_0.gguf"},
    {"phi3", "synth-phi3-d256.Q8_0.gguf"},
    {"phimoe", "synth-phimoe-d256.Q8_0.gguf"},
    {"mistral3", "synth-mistral3-d256.Q8_0.gguf"},
    {"mistral3", "synth-mistral3-moe-d256.Q8_0.gguf"},
};

// gtest names each case by its file rather than the struct's bytes.
void PrintTo(const ArchFixture& fixture, std::ostream* os) { *os << fixture.file; }

class ProbeArchitectures : public ::testing::TestWithParam<ArchFixture> {};

TEST_P(ProbeArchitectures, EveryKvModePassesAndTheWritePathsAgree) {
  const ArchFixture& fixture = GetParam();
  const std::string model = kFixtures + fixture.file;
  if (!fs::exists(model)) GTEST_SKIP() << model << " is absent";
  const fs::path dir =
      fs::temp_directory_path() /
      ("lamina_probe_arch_" + std::string(fixture.file) + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const std::string kv_modes = "f32,f16,int8,q4_0,k8v4,k8v4nl";
  const lamina::testing_util::ProcessOutput o = lamina::testing_util::RunShell(
      std::string(LAMINA_BINARY) + " probe -m " + model + " -t 1 --kv " + kv_modes +
      " --probes prefill,divergence --divergence-tokens 256 --free-run-tokens 32 --out " +
      dir.string() + " 2>&1");
  ASSERT_EQ(o.code, 0) << o.out;
  std::ifstream in(dir / "probe.json");
  ASSERT_TRUE(in.good()) << "no probe.json in " << dir;
  const nlohmann::json report = nlohmann::json::parse(in);
  EXPECT_EQ(report["arch"], fixture.arch);
  EXPECT_TRUE(report["pass"].get<bool>());
  const nlohmann::json& legs = report["legs"];
  ASSERT_EQ(legs.size(), 6u) << o.out;  // one leg per mode, f32 the reference
  for (const nlohmann::json& leg : legs) {
    SCOPED_TRACE(leg["name"].get<std::string>());
    EXPECT_EQ(leg["verdict"], "pass") << leg["verdict_line"];
    const nlohmann::json& divergence = leg["probes"]["divergence"];
    if (leg["reference"].get<bool>()) continue;
    EXPECT_EQ(divergence["status"], "pass");
    EXPECT_EQ(divergence["path_max_abs_diff"].get<double>(), 0.0);
    EXPECT_GE(divergence["top1_agreement"].get<double>(), 0.9);
  }
  fs::remove_all(dir);
}

std::string FixtureName(const ::testing::TestParamInfo<ArchFixture>& info) {
  std::string name = info.param.file;
  name = name.substr(0, name.find(".gguf"));
  for (char& c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return name;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ProbeArchitectures, ::testing::ValuesIn(kArchFixtures),
                         FixtureName);

}  // namespace
