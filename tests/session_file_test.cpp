// Session files: save, restore and continue equals an uninterrupted run byte for byte in every
// KV mode at several cut points (mid-prompt, mid-generation), through the library and through
// `lamina run|chat --session` as real processes; files from another model or KV mode,
// truncated or with a flipped bit are refused (exit code 3), or read again with
// --session-fresh-on-error.
#include "runtime/session_file.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "engine/generate.h"
#include "model/model.h"
#include "process_util.h"
#include "runtime/generate.h"
#include "temp_path.h"
#include "util/hash.h"

namespace lamina {
namespace {

const std::string kModel = std::string(LAMINA_SOURCE_DIR) + "/models/lamina-counter.gguf";
const std::string kOtherModel =
    std::string(LAMINA_SOURCE_DIR) + "/fuzz/corpus/gguf/tiny_llama_q4_0.gguf";
const std::string kBinary = LAMINA_BINARY;
const char* const kModes[] = {"f32", "f16", "int8", "q4_0", "k8v4"};

std::vector<uint8_t> ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)),
                              std::istreambuf_iterator<char>());
}

void WriteBytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

TEST(Xxh64, MatchesTheReferenceVectors) {
  EXPECT_EQ(Xxh64::Of("", 0), 0xEF46DB3751D8E999ull);
  EXPECT_EQ(Xxh64::Of("abc", 3), 0x44BC2CF5AD770999ull);
  // Incremental updates give the one-shot digest.
  std::string text(1000, 'x');
  for (size_t i = 0; i < text.size(); ++i) text[i] = static_cast<char>(i * 7);
  Xxh64 h;
  for (size_t i = 0; i < text.size(); i += 13)
    h.Update(text.data() + i, std::min<size_t>(13, text.size() - i));
  EXPECT_EQ(h.Digest(), Xxh64::Of(text.data(), text.size()));
}

class SessionFileTest : public testing::Test {
 protected:
  void SetUp() override {
    Result<std::unique_ptr<Model>> m = LoadModel(kModel);
    ASSERT_TRUE(m.ok()) << m.error().message;
    model_ = std::move(*m);
    hash_ = ModelIdentityHash(*model_);
  }
  SessionConfig Config(const char* kv) {
    SessionConfig sc;
    sc.n_ctx = 256;
    sc.kv_type = *ParseKvType(kv);
    return sc;
  }
  GenerateOptions Greedy(int n) {
    GenerateOptions o;
    o.params.sampler.temperature = 0.0f;
    o.params.n_predict = n;
    o.params.ignore_eos = true;
    return o;
  }
  std::unique_ptr<Model> model_;
  uint64_t hash_ = 0;
  ThreadPool pool_{2};
};

// Cut after `cut` generated tokens: save, restore into a fresh session, continue; the tokens and
// the final cells equal the uninterrupted run's.
TEST_F(SessionFileTest, SaveRestoreContinueEqualsAnUninterruptedRunInEveryMode) {
  const std::vector<int32_t> prompt =
      model_->tokenizer().Encode("Count from 1 to 40, one number per line.", true, true);
  for (const char* kv : kModes) {
    Session whole(*model_, Config(kv), pool_);
    Result<GenerateResult> ref = engine::Generate(whole, 0, prompt, Greedy(48));
    ASSERT_TRUE(ref.ok());
    std::vector<int32_t> all = prompt;
    all.insert(all.end(), ref->tokens.begin(), ref->tokens.end());
    ASSERT_TRUE(CatchUp(whole, 0, all).ok());
    for (int cut : {-5, 0, 1, 17, 40}) {  // < 0: mid-prompt
      Session first(*model_, Config(kv), pool_);
      std::vector<int32_t> history;
      if (cut < 0) {
        history.assign(prompt.begin(), prompt.end() + cut);
        ASSERT_TRUE(first.Eval(history, false).ok());
      } else {
        Result<GenerateResult> part = engine::Generate(first, 0, prompt, Greedy(cut));
        ASSERT_TRUE(part.ok());
        history = prompt;
        history.insert(history.end(), part->tokens.begin(), part->tokens.end());
        ASSERT_TRUE(CatchUp(first, 0, history).ok());
      }
      const std::vector<uint8_t> bytes = SerializeSessionFile(first, 0, hash_);
      Session second(*model_, Config(kv), pool_);
      Result<SessionFileView> view = ParseSessionFile(bytes.data(), bytes.size(), second, hash_);
      ASSERT_TRUE(view.ok()) << view.error().message;
      EXPECT_EQ(view->tokens, history);
      second.RestoreSequence(0, view->tokens, view->kv);
      // Continue from the cut: mid-prompt, with the whole prompt; mid-generation, with the
      // history as the prompt of the rest.
      const std::vector<int32_t>& next_prompt = cut < 0 ? prompt : history;
      Result<GenerateResult> rest =
          engine::Generate(second, 0, next_prompt, Greedy(48 - std::max(cut, 0)));
      ASSERT_TRUE(rest.ok());
      EXPECT_EQ(rest->n_cached, static_cast<int>(cut < 0 ? history.size() : history.size() - 1))
          << kv << " cut " << cut;
      std::vector<int32_t> joined(history.begin() + std::min(history.size(), prompt.size()),
                                  history.end());
      joined.insert(joined.end(), rest->tokens.begin(), rest->tokens.end());
      EXPECT_EQ(joined, ref->tokens) << kv << " cut " << cut;
      ASSERT_TRUE(CatchUp(second, 0, all).ok());
      EXPECT_EQ(SerializeSessionFile(second, 0, hash_), SerializeSessionFile(whole, 0, hash_))
          << kv << " cut " << cut;
    }
  }
}

TEST_F(SessionFileTest, CorruptTruncatedAndForeignFilesAreRefused) {
  Session s(*model_, Config("q4_0"), pool_);
  ASSERT_TRUE(s.Eval(model_->tokenizer().Encode("Once upon a time", true, true), false).ok());
  const std::vector<uint8_t> good = SerializeSessionFile(s, 0, hash_, "payload");
  Session target(*model_, Config("q4_0"), pool_);
  ASSERT_TRUE(ParseSessionFile(good.data(), good.size(), target, hash_).ok());
  // Every truncation and every single flipped bit is refused.
  for (size_t n = 0; n < good.size(); ++n) {
    EXPECT_FALSE(ParseSessionFile(good.data(), n, target, hash_).ok()) << "truncated to " << n;
  }
  for (size_t byte = 0; byte < good.size(); ++byte) {
    for (int bit = 0; bit < 8; ++bit) {
      std::vector<uint8_t> bad = good;
      bad[byte] ^= static_cast<uint8_t>(1u << bit);
      ASSERT_FALSE(ParseSessionFile(bad.data(), bad.size(), target, hash_).ok())
          << "bit " << bit << " of byte " << byte;
    }
  }
  Result<SessionFileView> other = ParseSessionFile(good.data(), good.size(), target, hash_ ^ 1);
  ASSERT_FALSE(other.ok());
  EXPECT_NE(other.error().message.find("another model"), std::string::npos);
  Session f16(*model_, Config("f16"), pool_);
  Result<SessionFileView> mode = ParseSessionFile(good.data(), good.size(), f16, hash_);
  ASSERT_FALSE(mode.ok());
  EXPECT_EQ(mode.error().message, "made with KV mode q4_0, this run uses f16 (--kv)");
  SessionConfig no_window = Config("q4_0");
  no_window.kv_window = 0;
  Session plain(*model_, no_window, pool_);
  Result<SessionFileView> window = ParseSessionFile(good.data(), good.size(), plain, hash_);
  ASSERT_FALSE(window.ok());
  EXPECT_EQ(window.error().message,
            "made with a KV window of 32 exact cells, this run uses 0 (--kv-window)");
}

// The CLI as real processes.
using Output = testing_util::ProcessOutput;

Output LaminaRun(const std::string& args, bool with_stderr = false) {
  return testing_util::RunShell(kBinary + " run -m " + kModel + " -t 2 " + args +
                                (with_stderr ? " 2>&1" : " 2>/dev/null"));
}

TEST(SessionCli, RestoredRunsPrintExactlyWhatPlainRunsPrint) {
  const std::string file = testing_util::UniqueTempPath("lamina_session_cli.bin");
  const testing_util::RemoveAtExit remove_file(file);
  const std::string p = "Count from 1 to 30, one number per line.";
  const std::string pq = p + " Then count from 5 to 9.";
  for (const char* kv : kModes) {
    const std::string mode = std::string(" --kv ") + kv;
    for (const auto& [first, second] :
         std::vector<std::pair<std::string, std::string>>{{p, p}, {p, pq}}) {
      std::filesystem::remove(file);
      Output plain = LaminaRun("-p \"" + second + "\" -n 64 --temp 0" + mode);
      ASSERT_EQ(plain.code, 0);
      Output save = LaminaRun("--session " + file + " -p \"" + first + "\" -n 0" + mode);
      ASSERT_EQ(save.code, 0);
      Output restored =
          LaminaRun("--session " + file + " -p \"" + second + "\" -n 64 --temp 0" + mode, true);
      ASSERT_EQ(restored.code, 0) << restored.out;
      const std::string tag = "restored ";
      EXPECT_NE(restored.out.find("lamina: session " + file + ": restored "), std::string::npos)
          << restored.out;
      Output quiet =
          LaminaRun("--session " + file + " -p \"" + second + "\" -n 64 --temp 0" + mode);
      EXPECT_EQ(quiet.out, plain.out) << kv << " " << second;
    }
    // Mid-generation: the file holds the prompt and 10 generated tokens.
    std::filesystem::remove(file);
    ASSERT_EQ(LaminaRun("--session " + file + " -p \"" + p + "\" -n 10 --temp 0" + mode).code, 0);
    Output plain = LaminaRun("-p \"" + p + "\" -n 64 --temp 0" + mode);
    EXPECT_EQ(LaminaRun("--session " + file + " -p \"" + p + "\" -n 64 --temp 0" + mode).out,
              plain.out)
        << kv;
  }
}

TEST(SessionCli, RefusedFilesEndWithCodeThreeOrAreReadAgainOnRequest) {
  const std::string file = testing_util::UniqueTempPath("lamina_session_refused.bin");
  const testing_util::RemoveAtExit remove_file(file);
  std::filesystem::remove(file);
  const std::string p = "-p \"Count from 1 to 9.\" -n 16 --temp 0";
  ASSERT_EQ(LaminaRun("--session " + file + " " + p).code, 0);
  const std::vector<uint8_t> good = ReadBytes(file);
  ASSERT_GT(good.size(), 200u);
  const Output plain = LaminaRun(p);
  struct Case {
    std::string name;
    std::vector<uint8_t> bytes;
    std::string args;
    std::string message;
  };
  std::vector<Case> cases;
  cases.push_back({"truncated", std::vector<uint8_t>(good.begin(), good.begin() + good.size() / 2),
                   "", "truncated: section KVST needs"});
  cases.push_back({"empty", {}, "", "truncated: the file is empty"});
  std::vector<uint8_t> flipped = good;
  flipped[good.size() - 100] ^= 0x10;
  cases.push_back(
      {"bit flip", flipped, "", "checksum mismatch in section KVST (the file is corrupt)"});
  std::vector<uint8_t> header = good;
  header[30] ^= 0x01;
  cases.push_back({"header bit flip", header, "", "header checksum mismatch"});
  cases.push_back(
      {"other KV mode", good, " --kv int8", "made with KV mode f16, this run uses int8 (--kv)"});
  cases.push_back(
      {"not a session", std::vector<uint8_t>(300, 'x'), "", "not a lamina session file"});
  for (const Case& c : cases) {
    WriteBytes(file, c.bytes);
    Output o = LaminaRun("--session " + file + " " + p + c.args, true);
    EXPECT_EQ(o.code, 3) << c.name << "\n" << o.out;
    EXPECT_NE(o.out.find("lamina: session " + file + ": "), std::string::npos) << c.name << o.out;
    EXPECT_NE(o.out.find(c.message), std::string::npos) << c.name << "\n" << o.out;
    WriteBytes(file, c.bytes);
    Output fresh = LaminaRun("--session " + file + " --session-fresh-on-error " + p + c.args);
    EXPECT_EQ(fresh.code, 0) << c.name;
    if (c.args.empty()) EXPECT_EQ(fresh.out, plain.out) << c.name;
  }
  // Another model's file.
  std::filesystem::remove(file);
  ASSERT_EQ(testing_util::RunShell(kBinary + " run -m " + kOtherModel + " --session " + file +
                                   " -p hi -n 2 >/dev/null 2>&1")
                .code,
            0);
  Output other = LaminaRun("--session " + file + " " + p, true);
  EXPECT_EQ(other.code, 3) << other.out;
  EXPECT_NE(other.out.find("made with another model"), std::string::npos) << other.out;
}

TEST(SessionCli, ChatResumesTheConversation) {
  const std::string file = testing_util::UniqueTempPath("lamina_session_chat.bin");
  const testing_util::RemoveAtExit remove_file(file);
  const std::string log = testing_util::UniqueTempPath("lamina_session_chat.log");
  const testing_util::RemoveAtExit remove_log(log);
  std::filesystem::remove(file);
  const std::string chat = kBinary + " chat -m " + kModel + " -t 2 -n 24 --temp 0";
  const std::string turn1 = "printf 'Count from 1 to 5.\\n' | ";
  const std::string turn2 = "printf 'Count from 3 to 6.\\n' | ";
  Output both = testing_util::RunShell("printf 'Count from 1 to 5.\\nCount from 3 to 6.\\n' | " +
                                       chat + " 2>/dev/null");
  ASSERT_EQ(both.code, 0);
  Output one = testing_util::RunShell(turn1 + chat + " --session " + file + " 2>/dev/null");
  Output two = testing_util::RunShell(turn2 + chat + " --session " + file + " 2>" + log);
  ASSERT_EQ(two.code, 0);
  // The second process, resumed, answers as the second turn of one process does.
  EXPECT_EQ(one.out + two.out, both.out);
  std::ifstream in(log);
  const std::string err((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(err.find("lamina: session " + file + ": restored "), std::string::npos) << err;
}

}  // namespace
}  // namespace lamina
