// Split GGUF models (llama.cpp's gguf-split layout, written here with gguf::Writer): a real model
// re-written into 2 and 3 files loads from its first file with the full tensor table and logits
// bit-identical to the unsplit file; each malformed split set (a missing file, a wrong
// split.count, a duplicated tensor, a wrong split.no, a wrong split.tensors.count, a later file
// opened first, a first file not named by the pattern) is refused with a message naming the file
// and the fault; `lamina inspect` on the first file lists every tensor.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "model/model.h"
#include "process_util.h"
#include "runtime/session.h"
#include "util/thread_pool.h"

namespace lamina {
namespace {

namespace fs = std::filesystem;
using gguf::File;
using gguf::TensorInfo;
using gguf::Value;
using gguf::ValueType;
using gguf::Writer;

const std::string kStories = std::string(LAMINA_SHARED_DIR) + "/models/stories260K.gguf";
const std::string kCounter = std::string(LAMINA_SOURCE_DIR) + "/models/lamina-counter.gguf";

Value U16(uint64_t v) {
  Value x;
  x.type = ValueType::kU16;
  x.u = v;
  return x;
}

// Called with (file index, that file's writer) before each file is written.
using EditFn = std::function<void(int, Writer&)>;

class GgufSplitTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    // Unique per test and process: ctest may run test cases in parallel.
    dir_ =
        ::testing::TempDir() + "gguf_split_test_" + std::to_string(getpid()) + "_" + info->name();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Writes `src` as gguf-split does: files DIR/NAME-0000k-of-0000n.gguf, the tensors dealt out
  // in order in n nearly equal runs, all metadata in the first file, split.no / split.count
  // (u16) and split.tensors.count (i32) in every file. Returns the n paths.
  std::vector<std::string> WriteSplit(const File& src, const std::string& name, int n,
                                      const EditFn& edit = {}) {
    const std::vector<TensorInfo>& tensors = src.tensors();
    const size_t n_tensors = tensors.size();
    std::vector<std::string> paths;
    for (int k = 0; k < n; ++k) {
      Writer w(src.version());
      if (k == 0) {
        for (const auto& [key, value] : src.metadata()) w.SetValue(key, value);
      }
      w.SetValue("split.no", U16(k));
      w.SetValue("split.count", U16(n));
      w.SetI32("split.tensors.count", static_cast<int32_t>(n_tensors));
      for (size_t t = n_tensors * k / n; t < n_tensors * (k + 1) / n; ++t) {
        AddTensorFrom(tensors[t], &w);
      }
      if (edit) edit(k, w);
      char suffix[64];
      std::snprintf(suffix, sizeof(suffix), "-%05d-of-%05d.gguf", k + 1, n);
      paths.push_back(dir_ + "/" + name + suffix);
      Status st = w.WriteFile(paths.back());
      EXPECT_TRUE(st.ok()) << st.error().message;
    }
    return paths;
  }

  static void AddTensorFrom(const TensorInfo& t, Writer* w) {
    w->AddTensor(t.name, t.type, std::vector<int64_t>(t.ne, t.ne + t.n_dims), t.data, t.n_bytes);
  }

  std::string dir_;
};

// Last-token logits [n_vocab] of a short prompt, session defaults.
std::vector<float> PromptLogits(const Model& model) {
  ThreadPool pool(2);
  Session s(model, SessionConfig{}, pool);
  const std::vector<int32_t> tokens =
      model.tokenizer().Encode("Once upon a time, 1 2 3", /*add_special=*/true,
                               /*parse_special=*/false);
  Result<const float*> logits = s.Eval(tokens, false);
  EXPECT_TRUE(logits.ok()) << logits.error().message;
  if (!logits.ok()) return {};
  return std::vector<float>(*logits, *logits + model.hparams().n_vocab);
}

class GgufSplitLoadTest : public GgufSplitTest {
 protected:
  // Splits `path` into n files and checks the first one loads to the same model, bit for bit.
  void ExpectSplitMatches(const std::string& path, int n) {
    SCOPED_TRACE(path + " in " + std::to_string(n) + " files");
    Result<std::unique_ptr<Model>> whole = LoadModel(path);
    ASSERT_TRUE(whole.ok()) << whole.error().message;
    const File& src = (*whole)->file();
    EXPECT_EQ(src.split_count(), 1u);
    const std::vector<std::string> paths = WriteSplit(src, "model-n" + std::to_string(n), n);

    Result<std::unique_ptr<Model>> split = LoadModel(paths[0]);
    ASSERT_TRUE(split.ok()) << split.error().message;
    const File& f = (*split)->file();
    EXPECT_EQ(f.path(), paths[0]);
    EXPECT_EQ(f.split_count(), static_cast<size_t>(n));
    uint64_t total = 0;
    for (const std::string& p : paths) total += fs::file_size(p);
    EXPECT_EQ(f.total_size(), total);
    EXPECT_EQ(*f.GetString("general.architecture"), *src.GetString("general.architecture"));
    ASSERT_EQ(f.tensors().size(), src.tensors().size());
    for (size_t t = 0; t < src.tensors().size(); ++t) {
      const TensorInfo& a = src.tensors()[t];
      const TensorInfo& b = f.tensors()[t];
      EXPECT_EQ(b.name, a.name);
      uint32_t want_split = 0;  // the file WriteSplit put tensor t in
      while (t >= src.tensors().size() * (want_split + 1) / n) ++want_split;
      EXPECT_EQ(b.split, want_split) << b.name;
      EXPECT_EQ(f.FindTensor(a.name), &b);
      ASSERT_EQ(b.n_bytes, a.n_bytes) << b.name;
      EXPECT_EQ(std::memcmp(b.data, a.data, a.n_bytes), 0) << b.name;
    }

    const std::vector<float> want = PromptLogits(**whole);
    const std::vector<float> got = PromptLogits(**split);
    ASSERT_FALSE(want.empty());
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0)
        << "logits differ from the unsplit file";
  }
};

TEST_F(GgufSplitLoadTest, Stories260KInTwoAndThreeFiles) {
  if (!fs::exists(kStories)) GTEST_SKIP() << "shared fixture not found: " << kStories;
  ExpectSplitMatches(kStories, 2);
  ExpectSplitMatches(kStories, 3);
}

TEST_F(GgufSplitLoadTest, ShippedModelInTwoAndThreeFiles) {
  if (!fs::exists(kCounter)) GTEST_SKIP() << "shipped model not found: " << kCounter;
  ExpectSplitMatches(kCounter, 2);
  ExpectSplitMatches(kCounter, 3);
}

// The shipped model (always in the repository, so these never skip) in three files; for the
// malformed cases one of them is edited or removed and LoadModel on the first file must fail with
// a message containing every fragment.
class GgufSplitShippedTest : public GgufSplitTest {
 protected:
  void SetUp() override {
    GgufSplitTest::SetUp();
    if (!fs::exists(kCounter)) GTEST_SKIP() << "shipped model not found: " << kCounter;
    Result<std::unique_ptr<File>> src = File::Open(kCounter);
    ASSERT_TRUE(src.ok()) << src.error().message;
    src_ = std::move(*src);
  }

  std::vector<std::string> Split(const EditFn& edit = {}) {
    return WriteSplit(*src_, "model", 3, edit);
  }

  static void ExpectLoadFails(const std::string& path, const std::vector<std::string>& fragments) {
    Result<std::unique_ptr<Model>> model = LoadModel(path);
    ASSERT_FALSE(model.ok()) << "expected " << path << " to be refused";
    const std::string& msg = model.error().message;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    for (const std::string& f : fragments)
      EXPECT_NE(msg.find(f), std::string::npos) << "'" << f << "' not in: " << msg;
  }

  std::unique_ptr<File> src_;
};

TEST_F(GgufSplitShippedTest, MissingFile) {
  const std::vector<std::string> paths = Split();
  fs::remove(paths[2]);
  ExpectLoadFails(paths[0], {paths[0] + ": split file 3 of 3: ", paths[2] + ": cannot open"});
}

TEST_F(GgufSplitShippedTest, WrongSplitCountInALaterFile) {
  const std::vector<std::string> paths = Split([](int k, Writer& w) {
    if (k == 1) w.SetValue("split.count", U16(4));
  });
  ExpectLoadFails(paths[0], {paths[1] + ": metadata key \"split.count\": 4, but the first file " +
                             paths[0] + " has 3"});
}

TEST_F(GgufSplitShippedTest, MissingSplitCountInALaterFile) {
  // A later file without split.* keys at all (a plain GGUF of the right name) is refused.
  const std::vector<std::string> paths = Split();
  Writer plain(src_->version());
  const std::vector<TensorInfo>& tensors = src_->tensors();
  for (size_t t = tensors.size() * 2 / 3; t < tensors.size(); ++t)
    AddTensorFrom(tensors[t], &plain);
  Status st = plain.WriteFile(paths[2]);
  ASSERT_TRUE(st.ok()) << st.error().message;
  ExpectLoadFails(paths[0], {paths[2] + ": metadata key \"split.count\": missing"});
}

TEST_F(GgufSplitShippedTest, FirstFileNameDisagreesWithSplitCount) {
  // The first file says two files but is named as the first of three.
  const std::vector<std::string> paths = Split([](int k, Writer& w) {
    if (k == 0) w.SetValue("split.count", U16(2));
  });
  ExpectLoadFails(paths[0],
                  {paths[0] + ": split.count is 2", "does not end in -00001-of-00002.gguf"});
  // Renamed away from the pattern, the other files cannot be found.
  const std::string renamed = dir_ + "/renamed.gguf";
  fs::copy_file(Split()[0], renamed);
  ExpectLoadFails(renamed, {renamed + ": split.count is 3", "-00001-of-00003.gguf"});
}

TEST_F(GgufSplitShippedTest, DuplicatedTensor) {
  const TensorInfo& first = src_->tensors()[0];
  const std::vector<std::string> paths = Split([&](int k, Writer& w) {
    if (k == 2) AddTensorFrom(first, &w);
  });
  ExpectLoadFails(paths[0], {paths[2] + ": tensor \"" + first.name + "\" is also in " + paths[0]});
}

TEST_F(GgufSplitShippedTest, WrongSplitNo) {
  const std::vector<std::string> paths = Split([](int k, Writer& w) {
    if (k == 1) w.SetValue("split.no", U16(2));
  });
  ExpectLoadFails(paths[0],
                  {paths[1] + ": metadata key \"split.no\": 2, expected 1 (file 2 of 3)"});
}

TEST_F(GgufSplitShippedTest, WrongTensorTotal) {
  const std::vector<std::string> paths = Split([](int k, Writer& w) {
    if (k == 0) w.SetI32("split.tensors.count", 5);
  });
  ExpectLoadFails(paths[0], {paths[0] +
                             ": metadata key \"split.tensors.count\": 5, but the 3 "
                             "split files hold " +
                             std::to_string(src_->tensors().size()) + " tensors"});
}

TEST_F(GgufSplitShippedTest, LaterFileOpenedFirst) {
  const std::vector<std::string> paths = Split();
  ExpectLoadFails(paths[1], {paths[1] +
                             ": file 2 of 3 of a split model (split.no 1); open its "
                             "first file " +
                             paths[0]});
  // One file on its own still opens, with only its own tensors.
  Result<std::unique_ptr<File>> one = File::OpenSingle(paths[1]);
  ASSERT_TRUE(one.ok()) << one.error().message;
  EXPECT_EQ((*one)->split_count(), 1u);
  EXPECT_LT((*one)->tensors().size(), src_->tensors().size());
}

TEST_F(GgufSplitShippedTest, InspectListsEveryTensor) {
  const std::vector<std::string> paths = Split();
  const std::string bin = LAMINA_BINARY;
  testing_util::ProcessOutput o =
      testing_util::RunShell("'" + bin + "' inspect --json '" + paths[0] + "' 2>/dev/null");
  ASSERT_EQ(o.code, 0) << o.out;
  const nlohmann::json j = nlohmann::json::parse(o.out);
  EXPECT_EQ(j["n_tensors"], src_->tensors().size());
  EXPECT_EQ(j["metadata"]["split.count"], 3);
  ASSERT_EQ(j["tensors"].size(), src_->tensors().size());
  EXPECT_EQ(j["tensors"].back()["name"], src_->tensors().back().name);
}

}  // namespace
}  // namespace lamina
