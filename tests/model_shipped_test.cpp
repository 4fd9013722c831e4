// The shipped model (models/lamina-counter.gguf, or the file named by LAMINA_TEST_MODEL): its
// tokenizer keeps every digit a separate token and parses the ChatML control tokens, and the
// model answers a short counting prompt and a short needle prompt exactly, through
// `lamina run --chat` (greedy, f16 KV); the thinking model thinks (a plan in a <think> block)
// only when asked.
// Skips when no model is shipped yet.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "gguf/gguf.h"
#include "process_util.h"
#include "tokenizer/tokenizer.h"

namespace {

const std::string kBinary = LAMINA_BINARY;

std::string ModelPath() {
  if (const char* env = std::getenv("LAMINA_TEST_MODEL"); env != nullptr && *env) return env;
  return std::string(LAMINA_SOURCE_DIR) + "/models/lamina-counter.gguf";
}

#define REQUIRE_MODEL()                      \
  if (!std::filesystem::exists(ModelPath())) \
  GTEST_SKIP() << "no shipped model yet (" << ModelPath() << ")"

using Output = lamina::testing_util::ProcessOutput;

Output Shell(const std::string& cmd) {
  return lamina::testing_util::RunShell(cmd + " 2>/dev/null");
}

std::string Quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) {
    if (c == '\'') {
      q += "'\\''";
    } else {
      q += c;
    }
  }
  return q + "'";
}

// Greedy answer to one user turn.
std::string Chat(const std::string& prompt, int n_predict) {
  Output o = Shell(kBinary + " run --chat -m " + Quote(ModelPath()) + " -p " + Quote(prompt) +
                   " -n " + std::to_string(n_predict) + " --temp 0 --kv f16 --json -t 2");
  EXPECT_EQ(o.code, 0);
  if (o.code != 0) return "";
  return nlohmann::json::parse(o.out)["text"].get<std::string>();
}

TEST(ShippedModel, TokenizerDigitsAndChatTokens) {
  REQUIRE_MODEL();
  auto file = lamina::gguf::File::Open(ModelPath());
  ASSERT_TRUE(file.ok()) << file.error().message;
  auto tok = lamina::Tokenizer::FromGguf(**file);
  ASSERT_TRUE(tok.ok()) << tok.error().message;
  const lamina::Tokenizer& t = **tok;
  const lamina::TokenId im_start = t.FindToken("<|im_start|>");
  const lamina::TokenId im_end = t.FindToken("<|im_end|>");
  ASSERT_GE(im_start, 0);
  ASSERT_GE(im_end, 0);
  EXPECT_EQ(t.Attr(im_start), lamina::TokenAttr::kControl);
  EXPECT_TRUE(t.IsEog(im_end));
  // No token but the ten digits themselves contains a digit.
  for (lamina::TokenId id = 0; id < t.vocab_size(); ++id) {
    if (t.Attr(id) != lamina::TokenAttr::kNormal) continue;
    const std::string& text = t.TokenText(id);
    if (text.find_first_of("0123456789") != std::string::npos) EXPECT_EQ(text.size(), 1u) << text;
  }
  const std::string text = "<|im_start|>user\nCount from 98 to 1002.<|im_end|>\n";
  const std::vector<lamina::TokenId> ids = t.Encode(text, true, true);
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids[0], t.bos());
  EXPECT_EQ(ids[1], im_start);
  int digits = 0;
  for (lamina::TokenId id : ids) {
    if (t.Attr(id) == lamina::TokenAttr::kNormal &&
        t.TokenText(id).find_first_of("0123456789") != std::string::npos) {
      ++digits;
    }
  }
  EXPECT_EQ(digits, 6);  // 9 8 1 0 0 2
  std::string round_trip;
  for (size_t i = 1; i < ids.size(); ++i) round_trip += t.TokenToPiece(ids[i], true);
  EXPECT_EQ(round_trip, text);
}

TEST(ShippedModel, CountsExactly) {
  REQUIRE_MODEL();
  std::string expected;
  for (int i = 1; i <= 45; ++i) expected += (i > 1 ? "\n" : "") + std::to_string(i);
  EXPECT_EQ(Chat("Count from 1 to 45, one number per line.", 200), expected);
  expected.clear();
  for (int i = 587; i <= 612; ++i) expected += (i > 587 ? "\n" : "") + std::to_string(i);
  EXPECT_EQ(Chat("Count from 587 to 612, one number per line.", 200), expected);
}

// The thinking model (lamina-counter-think.gguf, the shipped model fine-tuned with a thinking
// mode): with --reasoning on its template opens the block and the model writes its plan, closes
// the block and answers as it does without thinking; off (the CLI's default) and auto (the
// template's default, off for this model) do not think. The default model does not think.
TEST(ShippedModel, ThinksOnlyWhenAsked) {
  REQUIRE_MODEL();
  const std::string think_model =
      std::string(LAMINA_SOURCE_DIR) + "/models/lamina-counter-think.gguf";
  if (!std::filesystem::exists(think_model)) GTEST_SKIP() << "no " << think_model;
  const std::string count =
      " -p 'Count from 3 to 9, one number per line.' -n 60 --temp 0 --json -t 2";
  const std::string ask = " run --chat -m " + Quote(think_model) + count;
  Output on = Shell(kBinary + ask + " --reasoning on");
  ASSERT_EQ(on.code, 0);
  EXPECT_EQ(nlohmann::json::parse(on.out)["text"].get<std::string>(),
            "I count from 3 to 9 and stop at 9.\n</think>\n\n3\n4\n5\n6\n7\n8\n9");
  for (const char* mode : {"off", "auto"}) {
    Output o = Shell(kBinary + ask + " --reasoning " + mode);
    ASSERT_EQ(o.code, 0);
    EXPECT_EQ(nlohmann::json::parse(o.out)["text"].get<std::string>(), "3\n4\n5\n6\n7\n8\n9")
        << mode;
  }
  Output plain =
      Shell(kBinary + " run --chat -m " + Quote(ModelPath()) + count + " --reasoning on");
  ASSERT_EQ(plain.code, 0);
  EXPECT_EQ(nlohmann::json::parse(plain.out)["text"].get<std::string>(), "3\n4\n5\n6\n7\n8\n9");
}

TEST(ShippedModel, FindsTheNeedle) {
  REQUIRE_MODEL();
  const std::string before =
      "The small fox lived near the river. Anna felt calm and went to the market. It was "
      "raining. Tom painted a green lamp in the garden. The old owl watched the red box. ";
  const std::string after =
      "In the evening, Sam found the quiet chair. The brave bear lived near the hill. Clouds "
      "moved over the hills. Lily and Max talked about the gentle deer.";
  const std::string prompt =
      before + "The secret code is 48213. " + after + "\n\nWhat is the secret code?";
  const std::string answer = Chat(prompt, 40);
  EXPECT_NE(answer.find("48213"), std::string::npos) << answer;
}

TEST(ShippedModel, RunWithoutModelFlagUsesTheShippedModel) {
  REQUIRE_MODEL();
  if (std::getenv("LAMINA_TEST_MODEL") != nullptr) GTEST_SKIP() << "LAMINA_TEST_MODEL is set";
  Output o = Shell(kBinary +
                   " run --chat -p 'Count from 1 to 3, one number per line.' -n 20 "
                   "--temp 0 --json -t 2");
  ASSERT_EQ(o.code, 0);
  EXPECT_EQ(nlohmann::json::parse(o.out)["text"].get<std::string>(), "1\n2\n3");
}

// Three turns in one conversation: each line is answered in turn, with the earlier turns in the
// context (the second count must stop at its own B). The model was trained on single turns,
// so two counts with different starts are not asked: it may take the first turn's start.
TEST(ShippedModel, ChatLoopAnswersEachLineUntilEof) {
  REQUIRE_MODEL();
  Output o = Shell(
      "printf 'Count from 1 to 3, one number per line.\\nCount from 1 to 6, one "
      "number per line.\\nWrite a JSON object with the fields \"name\" = "
      "\"Alice\", \"age\" = 34.\\n' | " +
      kBinary + " chat -m " + Quote(ModelPath()) + " --temp 0 -n 40 -t 2");
  ASSERT_EQ(o.code, 0);
  EXPECT_EQ(o.out, "1\n2\n3\n1\n2\n3\n4\n5\n6\n{\"name\": \"Alice\", \"age\": 34}\n");
}

}  // namespace
