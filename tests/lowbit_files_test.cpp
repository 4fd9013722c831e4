// NVFP4, Q1_0 and Q2_0 files (tests/fixtures, made by llama.cpp's quantizers): they load with every
// matrix in the type, a cut file is refused by the GGUF reader naming the tensor, and `lamina
// inspect` names the type and says the file runs (per-tensor NVFP4 scales: nvfp4_scale_test).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "model/model.h"
#include "quant/types.h"

namespace lamina {
namespace {

namespace fs = std::filesystem;

const std::string kModels = std::string(LAMINA_SOURCE_DIR) + "/tests/fixtures/models/";

std::string Fixture(const char* type) { return kModels + "synth-llama-d256." + type + ".gguf"; }

TEST(LowBitFiles, EveryMatrixInTheTypeAndTheModelLoads) {
  for (const auto& [name, type] :
       {std::pair{"NVFP4", GgmlType::kNVFP4}, std::pair{"Q1_0", GgmlType::kQ1_0},
        std::pair{"Q2_0", GgmlType::kQ2_0}}) {
    const std::string path = Fixture(name);
    if (!fs::exists(path)) GTEST_SKIP() << path << " is absent";
    Result<std::unique_ptr<gguf::File>> f = gguf::File::Open(path);
    ASSERT_TRUE(f.ok()) << f.error().message;
    int matrices = 0;
    for (const gguf::TensorInfo& t : (*f)->tensors()) {
      if (t.n_dims < 2) continue;
      EXPECT_EQ(t.type, type) << t.name;
      ++matrices;
    }
    EXPECT_EQ(matrices, 16) << name;
    Result<std::unique_ptr<Model>> m = LoadModel(path);
    ASSERT_TRUE(m.ok()) << name << ": " << m.error().message;
  }
}

// The Q1_0 and Q2_0 files cut short: the reader names a tensor whose bytes run past the end.
TEST(LowBitFiles, CutFileIsRefusedNamingATensor) {
  for (const char* name : {"Q1_0", "Q2_0", "NVFP4"}) {
    const std::string src = Fixture(name);
    if (!fs::exists(src)) GTEST_SKIP() << src << " is absent";
    std::ifstream in(src, std::ios::binary);
    std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    bytes.resize(bytes.size() - 1000);
    const std::string path = testing::TempDir() + "/cut_" + std::to_string(getpid()) + ".gguf";
    std::ofstream(path, std::ios::binary)
        .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    Result<std::unique_ptr<gguf::File>> f = gguf::File::Open(path);
    fs::remove(path);
    ASSERT_FALSE(f.ok()) << name;
    EXPECT_NE(f.error().message.find("tensor["), std::string::npos) << f.error().message;
  }
}

// `lamina inspect FILE`: the tensor listing names the type, and the verdict is that it runs.
TEST(LowBitFiles, InspectNamesTheTypeAndSaysItRuns) {
  for (const auto& [file, name] : {std::pair{"NVFP4", "NVFP4"}, std::pair{"NVFP4-scaled", "NVFP4"},
                                   std::pair{"Q1_0", "Q1_0"}, std::pair{"Q2_0", "Q2_0"}}) {
    const std::string path = Fixture(file);
    if (!fs::exists(path)) GTEST_SKIP() << path << " is absent";
    const std::string cmd = "'" + std::string(LAMINA_BINARY) + "' inspect '" + path + "' 2>&1";
    FILE* p = popen(cmd.c_str(), "r");
    ASSERT_NE(p, nullptr);
    std::string out;
    char buf[4096];
    size_t n = 0;
    while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
    const int status = pclose(p);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << out;
    EXPECT_NE(out.find(std::string(" ") + name), std::string::npos) << out;
    EXPECT_NE(out.find("lamina can run this file (architecture llama)"), std::string::npos) << out;
    EXPECT_EQ(out.find("cannot compute"), std::string::npos) << out;
  }
}

}  // namespace
}  // namespace lamina
