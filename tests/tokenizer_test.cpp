// Tokenizer tests: llama.cpp's tokenizer suites (one ctest per case), stories260K prompts and
// continuations against the llama.cpp goldens, special-token parsing, EOG and streaming.
#include "tokenizer/tokenizer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "temp_path.h"
#include "tokenizer/unicode.h"

namespace lamina {
namespace {

namespace fs = std::filesystem;

std::string SharedDir() { return LAMINA_SHARED_DIR; }

bool ReadFile(const std::string& path, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::ostringstream ss;
  ss << in.rdbuf();
  *out = ss.str();
  return true;
}

// Tokenizers are loaded once per file and shared by all cases (the BPE vocabularies take a
// noticeable fraction of a second each).
const Tokenizer* LoadTokenizer(const std::string& path, std::string* error) {
  static std::mutex mu;
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  static std::map<std::string, std::string> errors;
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = cache.find(path); it != cache.end()) return it->second.get();
  if (auto it = errors.find(path); it != errors.end()) {
    *error = it->second;
    return nullptr;
  }
  auto file = gguf::File::Open(path);
  if (!file.ok()) {
    *error = errors[path] = file.error().message;
    return nullptr;
  }
  auto tok = Tokenizer::FromGguf(**file);
  if (!tok.ok()) {
    *error = errors[path] = tok.error().message;
    return nullptr;
  }
  return (cache[path] = std::move(tok).value()).get();
}

std::string IdsToString(const std::vector<TokenId>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) s += ' ';
    s += std::to_string(ids[i]);
  }
  return s;
}

std::vector<TokenId> ParseIds(const std::string& line) {
  std::vector<TokenId> ids;
  std::istringstream ss(line);
  long long v;
  while (ss >> v) ids.push_back(static_cast<TokenId>(v));
  return ids;
}

// ---------------------------------------------------------------------------------------------
// llama.cpp's test-tokenizer-0 vectors, one parameterized case per input string.

struct SuiteCase {
  std::string vocab;  // e.g. "llama-spm"
  int index = 0;
  std::string input;
  std::vector<TokenId> expected;
  std::string skip_reason;  // non-empty: GTEST_SKIP with this message
};

std::vector<SuiteCase> LoadSuiteCases() {
  static const char* const kVocabs[] = {"llama-spm",      "phi-3", "gpt-2",
                                        "deepseek-coder", "qwen2", "llama-bpe"};
  std::vector<SuiteCase> cases;
  const std::string dir = SharedDir() + "/vocab";
  if (!fs::is_directory(dir)) {
    SuiteCase skip;
    skip.vocab = "missing";
    skip.skip_reason = "shared fixtures not found at " + dir;
    cases.push_back(skip);
    return cases;
  }
  for (const char* vocab : kVocabs) {
    const std::string base = dir + "/ggml-vocab-" + vocab + ".gguf";
    std::string inp, out;
    if (!ReadFile(base + ".inp", &inp) || !ReadFile(base + ".out", &out)) {
      SuiteCase skip;
      skip.vocab = vocab;
      skip.skip_reason = "missing " + base + ".inp/.out";
      cases.push_back(skip);
      continue;
    }
    static const std::string kSep = "\n__ggml_vocab_test__\n";
    std::vector<std::string> inputs;
    size_t pos = 0;
    while (true) {
      const size_t next = inp.find(kSep, pos);
      if (next == std::string::npos) {
        // The file ends with a separator; a trailing empty piece is not a case.
        if (pos < inp.size()) inputs.push_back(inp.substr(pos));
        break;
      }
      inputs.push_back(inp.substr(pos, next - pos));
      pos = next + kSep.size();
    }
    std::vector<std::string> lines;
    std::istringstream ss(out);
    std::string line;
    while (std::getline(ss, line)) lines.push_back(line);
    for (size_t i = 0; i < inputs.size(); ++i) {
      SuiteCase c;
      c.vocab = vocab;
      c.index = static_cast<int>(i);
      c.input = inputs[i];
      if (i < lines.size()) {
        c.expected = ParseIds(lines[i]);
      } else {
        c.skip_reason = "no expected line for input " + std::to_string(i);
      }
      cases.push_back(std::move(c));
    }
  }
  return cases;
}

// Keeps test listings readable (gtest would otherwise dump the struct's bytes).
void PrintTo(const SuiteCase& c, std::ostream* os) { *os << c.vocab << " #" << c.index; }

class TokenizerSuite : public ::testing::TestWithParam<SuiteCase> {};

TEST_P(TokenizerSuite, Case) {
  const SuiteCase& c = GetParam();
  if (!c.skip_reason.empty()) GTEST_SKIP() << c.skip_reason;
  std::string error;
  const Tokenizer* tok =
      LoadTokenizer(SharedDir() + "/vocab/ggml-vocab-" + c.vocab + ".gguf", &error);
  ASSERT_NE(tok, nullptr) << error;
  const std::vector<TokenId> got = tok->Encode(c.input, /*add_special=*/false,
                                               /*parse_special=*/false);
  EXPECT_EQ(IdsToString(got), IdsToString(c.expected)) << "input: '" << c.input << "'";
}

std::string SuiteCaseName(const ::testing::TestParamInfo<SuiteCase>& info) {
  std::string name = info.param.vocab + "_" + std::to_string(info.param.index);
  for (char& ch : name) {
    if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
  }
  return name;
}

INSTANTIATE_TEST_SUITE_P(Vocab, TokenizerSuite, ::testing::ValuesIn(LoadSuiteCases()),
                         SuiteCaseName);

// ---------------------------------------------------------------------------------------------
// Fixture helpers for the remaining tests.

const Tokenizer* RequireVocab(const std::string& relative) {
  const std::string path = SharedDir() + "/" + relative;
  if (!fs::exists(path)) return nullptr;
  std::string error;
  const Tokenizer* tok = LoadTokenizer(path, &error);
  EXPECT_NE(tok, nullptr) << error;
  return tok;
}

#define REQUIRE_VOCAB(var, relative)                                                     \
  const Tokenizer* var = RequireVocab(relative);                                         \
  if (var == nullptr) {                                                                  \
    if (HasFailure()) return;                                                            \
    GTEST_SKIP() << "shared fixture " << relative << " not found under " << SharedDir(); \
  }

std::vector<TokenId> JsonIds(const nlohmann::json& j) {
  std::vector<TokenId> ids;
  for (const auto& v : j) ids.push_back(v.get<TokenId>());
  return ids;
}

// ---------------------------------------------------------------------------------------------
// stories260K (SentencePiece, 512 tokens) against the llama.cpp goldens.

TEST(Stories260K, OnceUponATime) {
  REQUIRE_VOCAB(tok, "models/stories260K.gguf");
  EXPECT_EQ(tok->vocab_size(), 512);
  EXPECT_EQ(tok->bos(), 1);
  EXPECT_EQ(tok->eos(), 2);
  EXPECT_TRUE(tok->add_bos());
  EXPECT_FALSE(tok->add_eos());
  const std::vector<TokenId> want = {1, 403, 407, 261, 378};
  EXPECT_EQ(tok->Encode("Once upon a time", true, false), want);
  const std::vector<TokenId> no_bos(want.begin() + 1, want.end());
  EXPECT_EQ(tok->Encode("Once upon a time", false, false), no_bos);
  EXPECT_EQ(tok->Decode(no_bos), "Once upon a time");
}

TEST(Stories260K, GoldenPromptsAndContinuations) {
  REQUIRE_VOCAB(tok, "models/stories260K.gguf");
  const std::string golden_dir = SharedDir() + "/golden/stories260K";
  int checked = 0;
  for (const char* name : {"bos", "once", "lily", "story300"}) {
    SCOPED_TRACE(name);
    std::string json_text, prompt;
    const std::string json_path = golden_dir + "/stories260K." + name + ".f32.json";
    if (!ReadFile(json_path, &json_text)) continue;
    ASSERT_TRUE(ReadFile(SharedDir() + "/golden/prompts/prompt_" + name + ".txt", &prompt));
    const nlohmann::json j = nlohmann::json::parse(json_text);
    EXPECT_EQ(prompt, j["prompt"].get<std::string>());
    const std::vector<TokenId> prompt_tokens = JsonIds(j["prompt_tokens"]);
    EXPECT_EQ(tok->Encode(prompt, true, false), prompt_tokens);
    for (size_t i = 0; i < prompt_tokens.size(); ++i) {
      EXPECT_EQ(tok->TokenToPiece(prompt_tokens[i], true),
                j["prompt_pieces"][i].get<std::string>());
    }

    const std::vector<TokenId> generated = JsonIds(j["generated_tokens"]);
    std::string pieces;
    for (size_t i = 0; i < generated.size(); ++i) {
      EXPECT_EQ(tok->TokenToPiece(generated[i], true), j["generated_pieces"][i].get<std::string>());
      pieces += tok->TokenToPiece(generated[i], false);
    }
    EXPECT_EQ(pieces, j["continuation_text"].get<std::string>());
    const std::string decoded = tok->Decode(generated);
    EXPECT_EQ(decoded, j["continuation_detokenized"].get<std::string>());

    StreamingDetokenizer stream(*tok);
    std::string streamed;
    for (TokenId id : generated) streamed += stream.Push(id);
    streamed += stream.Flush();
    EXPECT_EQ(streamed, decoded);
    ++checked;
  }
  EXPECT_EQ(checked, 4);
}

TEST(Stories260K, EogAndPieces) {
  REQUIRE_VOCAB(tok, "models/stories260K.gguf");
  EXPECT_TRUE(tok->IsEog(2));
  EXPECT_FALSE(tok->IsEog(1));
  EXPECT_FALSE(tok->IsEog(403));
  EXPECT_FALSE(tok->IsEog(-1));
  EXPECT_EQ(tok->TokenToPiece(1, false), "");
  EXPECT_EQ(tok->TokenToPiece(1, true), "<s>");
  EXPECT_EQ(tok->TokenToPiece(403, false), " Once");
  EXPECT_EQ(tok->FindToken("<0x0A>"), 13);
  EXPECT_EQ(tok->TokenToPiece(13, false), "\n");
  EXPECT_EQ(tok->FindToken("no such token"), -1);
  EXPECT_EQ(tok->TokenText(2), "</s>");
  EXPECT_EQ(tok->Attr(2), TokenAttr::kControl);
  EXPECT_EQ(tok->Attr(13), TokenAttr::kByte);
}

TEST(Stories260K, ByteFallbackAndStreamingSplitsUtf8) {
  REQUIRE_VOCAB(tok, "models/stories260K.gguf");
  // U+1F600 is not in the 512-token vocabulary: it falls back to its four byte tokens.
  const std::string text = "caf\xC3\xA9 \xF0\x9F\x98\x80!";
  const std::vector<TokenId> ids = tok->Encode(text, false, false);
  const TokenId f0 = tok->FindToken("<0xF0>");
  ASSERT_GE(f0, 0);
  EXPECT_NE(std::find(ids.begin(), ids.end(), f0), ids.end()) << IdsToString(ids);
  EXPECT_EQ(tok->Decode(ids), text);

  StreamingDetokenizer stream(*tok);
  std::string streamed;
  for (TokenId id : ids) {
    const std::string out = stream.Push(id);
    // Every chunk handed out is whole UTF-8: a lead byte is never left dangling at the end.
    if (!out.empty()) {
      const unsigned char last = static_cast<unsigned char>(out.back());
      EXPECT_FALSE(last >= 0xC0) << "chunk ends in a lead byte";
    }
    if (id == f0) {
      EXPECT_EQ(out, "") << "the first byte of U+1F600 must be held";
    }
    streamed += out;
  }
  streamed += stream.Flush();
  EXPECT_EQ(streamed, text);

  // The 4-byte emoji, byte by byte.
  StreamingDetokenizer emoji(*tok);
  const char* bytes[] = {"<0xF0>", "<0x9F>", "<0x98>", "<0x80>"};
  std::string got;
  for (int i = 0; i < 4; ++i) {
    const TokenId id = tok->FindToken(bytes[i]);
    ASSERT_GE(id, 0);
    const std::string out = emoji.Push(id);
    if (i < 3) {
      EXPECT_EQ(out, "");
    }
    got += out;
  }
  EXPECT_EQ(got, "\xF0\x9F\x98\x80");
  EXPECT_EQ(emoji.Flush(), "");

  // A truncated character is released by Flush as-is.
  StreamingDetokenizer partial(*tok);
  EXPECT_EQ(partial.Push(tok->FindToken("<0xE2>")), "");
  EXPECT_EQ(partial.Flush(), "\xE2");
}

TEST(Stories260K, EmptyText) {
  REQUIRE_VOCAB(tok, "models/stories260K.gguf");
  EXPECT_EQ(tok->Encode("", true, false), std::vector<TokenId>{1});
  EXPECT_TRUE(tok->Encode("", false, false).empty());
  EXPECT_EQ(tok->Decode({}), "");
}

// ---------------------------------------------------------------------------------------------
// Special tokens, EOG and round trips on the BPE vocabularies.

TEST(Qwen2Vocab, ParseSpecial) {
  REQUIRE_VOCAB(tok, "vocab/ggml-vocab-qwen2.gguf");
  EXPECT_EQ(tok->FindToken("<|im_start|>"), 151644);
  EXPECT_EQ(tok->FindToken("<|im_end|>"), 151645);
  const std::string chat = "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n";
  const std::vector<TokenId> parsed = tok->Encode(chat, false, true);
  ASSERT_FALSE(parsed.empty());
  EXPECT_EQ(parsed.front(), 151644);
  EXPECT_EQ(std::count(parsed.begin(), parsed.end(), 151644), 2);
  EXPECT_EQ(std::count(parsed.begin(), parsed.end(), 151645), 1);
  // The text between specials is tokenized as usual.
  const std::vector<TokenId> user = tok->Encode("user\nHello", false, false);
  EXPECT_TRUE(std::equal(user.begin(), user.end(), parsed.begin() + 1));

  const std::vector<TokenId> plain = tok->Encode(chat, false, false);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 151644), 0);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 151645), 0);
  EXPECT_GT(plain.size(), parsed.size());

  // Control tokens render only with special=true; Decode drops them.
  EXPECT_EQ(tok->TokenToPiece(151645, true), "<|im_end|>");
  EXPECT_EQ(tok->TokenToPiece(151645, false), "");
  EXPECT_EQ(tok->Decode(parsed), "user\nHello\nassistant\n");
  EXPECT_EQ(tok->Decode(plain), chat);
}

// Qwen3.5's pre-tokenizer (tokenizer.ggml.pre "qwen35": Qwen2's with combining marks inside
// letter runs), on the qwen2 vocabulary relabelled: ids from llama.cpp 3f545be's tokenizer on the
// same relabelled file (add_special and parse_special false). The Thai and Arabic strings are
// where the marks change the result from qwen2's.
TEST(Qwen35PreTokenizer, MatchesLlamaCppOnTheRelabelledQwen2Vocabulary) {
  const std::string src = SharedDir() + "/vocab/ggml-vocab-qwen2.gguf";
  if (!std::filesystem::exists(src)) GTEST_SKIP() << src << " is absent";
  Result<std::unique_ptr<gguf::File>> f = gguf::File::Open(src);
  ASSERT_TRUE(f.ok()) << f.error().message;
  gguf::Writer w;
  for (const auto& [key, value] : (*f)->metadata()) {
    if (key != "tokenizer.ggml.pre") w.SetValue(key, value);
  }
  w.SetString("tokenizer.ggml.pre", "qwen35");
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("lamina_qwen35_vocab_" + std::to_string(getpid()) + ".gguf"))
                               .string();
  ASSERT_TRUE(w.WriteFile(path).ok());
  Result<std::unique_ptr<gguf::File>> relabelled = gguf::File::Open(path);
  ASSERT_TRUE(relabelled.ok());
  Result<std::unique_ptr<Tokenizer>> tok = Tokenizer::FromGguf(**relabelled);
  std::filesystem::remove(path);
  ASSERT_TRUE(tok.ok()) << tok.error().message;
  const std::vector<std::pair<std::string, std::vector<TokenId>>> cases = {
      {"Hello world", {9707, 1879}},
      {"e\u0301te\u0301 cafe\u0301", {68, 53839, 665, 53839, 40930, 53839}},
      {"\u0928\u092E\u0938\u094D\u0924\u0947 \u0926\u0941\u0928\u093F\u092F\u093E",
       {60096, 87244, 78368, 30484, 97, 34370, 14925, 99, 72653, 60096, 42311, 107, 23868}},
      {"\u0E20\u0E32\u0E29\u0E32\u0E44\u0E17\u0E22 \u0E01\u0E48\u0E2D\u0E19",
       {127382, 125451, 220, 126261}},
      {"\u0645\u064E\u0631\u0652\u062D\u064E\u0628\u064B\u0627",
       {130531, 11071, 59397, 132078, 21360, 127837}},
      {"don't I'LL we've", {15007, 944, 358, 6, 4086, 582, 3003}},
      {"123 4567 \u0663\u0664\u0665",
       {16, 17, 18, 220, 19, 20, 21, 22, 220, 149, 96, 149, 97, 149, 98}},
      {"  spaces\n\n\tand\r\nnewlines  ", {220, 12621, 271, 52477, 319, 931, 7969, 256}},
      {"a\u0301\u0302b", {64, 53839, 136, 224, 65}},
      {" \u0301x", {220, 53839, 87}},
      {"!!!\u0301?", {12069, 53839, 30}},
      {"\uD55C\uAD6D\uC5B4 \u65E5\u672C\u8A9E \u4E2D\u6587",
       {23573, 124785, 31079, 75402, 21894, 102819, 72858, 16744}},
      {"x = f(y) + 2;\n", {87, 284, 282, 7021, 8, 488, 220, 17, 280}},
  };
  for (const auto& [text, want] : cases) {
    EXPECT_EQ(IdsToString((*tok)->Encode(text, false, false)), IdsToString(want)) << text;
  }
}

TEST(Qwen2Vocab, EogAndSpecialIds) {
  REQUIRE_VOCAB(tok, "vocab/ggml-vocab-qwen2.gguf");
  EXPECT_EQ(tok->vocab_size(), 151936);
  EXPECT_EQ(tok->bos(), 151643);
  EXPECT_EQ(tok->eos(), 151643);
  EXPECT_EQ(tok->eot(), 151645);
  EXPECT_FALSE(tok->add_bos());
  EXPECT_TRUE(tok->IsEog(151643));  // <|endoftext|>
  EXPECT_TRUE(tok->IsEog(151645));  // <|im_end|>
  EXPECT_FALSE(tok->IsEog(151644));
  EXPECT_FALSE(tok->IsEog(0));
  // add_bos is false for this vocabulary: add_special adds nothing.
  EXPECT_EQ(tok->Encode("Hello", true, false), tok->Encode("Hello", false, false));
}

TEST(LlamaBpeVocab, SpecialsEogAndRoundTrip) {
  REQUIRE_VOCAB(tok, "vocab/ggml-vocab-llama-bpe.gguf");
  EXPECT_EQ(tok->bos(), 128000);
  EXPECT_EQ(tok->eos(), 128001);
  EXPECT_EQ(tok->eot(), 128009);
  EXPECT_TRUE(tok->add_bos());
  EXPECT_TRUE(tok->IsEog(128001));
  EXPECT_TRUE(tok->IsEog(128009));
  EXPECT_FALSE(tok->IsEog(128000));
  EXPECT_FALSE(tok->IsEog(128006));
  const std::vector<TokenId> ids = tok->Encode("Hello world", true, false);
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids.front(), 128000);
  const std::string prompt =
      "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>";
  const std::vector<TokenId> parsed = tok->Encode(prompt, false, true);
  ASSERT_GE(parsed.size(), 4u);
  EXPECT_EQ(parsed[0], 128000);
  EXPECT_EQ(parsed[1], 128006);
  EXPECT_EQ(parsed.back(), 128009);

  const std::string text =
      "Byte-level BPE round trip: caf\xC3\xA9, \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E, "
      "emoji \xF0\x9F\xA6\x99, tabs\t\tand  spaces,\r\nnumbers 1234567.";
  EXPECT_EQ(tok->Decode(tok->Encode(text, false, false)), text);
}

TEST(LlamaBpeVocab, LargeTextIsFast) {
  REQUIRE_VOCAB(tok, "vocab/ggml-vocab-llama-bpe.gguf");
  std::string text;
  while (text.size() < 8192) {
    text += "The quick brown fox jumps over the lazy dog; it's 12345 times faster! ";
    text += "\xD0\x9F\xD1\x80\xD0\xB8\xD0\xB2\xD0\xB5\xD1\x82 \xE4\xB8\x96\xE7\x95\x8C\n";
  }
  const auto start = std::chrono::steady_clock::now();
  const std::vector<TokenId> ids = tok->Encode(text, false, false);
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GT(ids.size(), 1000u);
  EXPECT_EQ(tok->Decode(ids), text);
  // Generous bound: a few ms is typical; this only catches accidental quadratic behaviour.
  EXPECT_LT(ms, 500.0) << "8 KB took " << ms << " ms";
}

TEST(Phi3Vocab, UserDefinedTokensSplitWithoutParseSpecial) {
  REQUIRE_VOCAB(tok, "vocab/ggml-vocab-phi-3.gguf");
  // </s> is user-defined in this vocabulary: recognised even without parse_special, and (as
  // llama.cpp does for phi-3) it swallows the whitespace after it.
  const TokenId eos_text = tok->FindToken("</s>");
  ASSERT_GE(eos_text, 0);
  const std::vector<TokenId> ids = tok->Encode("a</s>  b", false, false);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), eos_text), 1) << IdsToString(ids);
  EXPECT_EQ(ids, tok->Encode("a</s>b", false, false));
  EXPECT_TRUE(tok->IsEog(tok->FindToken("<|end|>")));
  EXPECT_TRUE(tok->IsEog(tok->eos()));
}

TEST(AllVocabs, ArbitraryBytesRoundTrip) {
  // Invalid UTF-8, NULs and control bytes must neither crash nor lose text. SentencePiece
  // byte fallback keeps every byte; byte-level BPE first reads invalid UTF-8 as U+FFFD (as
  // llama.cpp does), so there the expectation is the leniently re-encoded input.
  if (!fs::is_directory(SharedDir() + "/vocab")) GTEST_SKIP() << "shared fixtures not found";
  uint32_t state = 12345;
  auto next = [&] {
    state = state * 1664525u + 1013904223u;
    return state >> 8;
  };
  for (const char* vocab : {"llama-spm", "gpt-2", "deepseek-coder", "qwen2", "llama-bpe"}) {
    SCOPED_TRACE(vocab);
    REQUIRE_VOCAB(tok, std::string("vocab/ggml-vocab-") + vocab + ".gguf");
    const bool spm = std::string(vocab) == "llama-spm";
    for (int iter = 0; iter < 50; ++iter) {
      std::string text(next() % 64, '\0');
      for (char& c : text) c = static_cast<char>(next() & 0xFF);
      const std::vector<TokenId> ids = tok->Encode(text, false, false);
      for (TokenId id : ids) ASSERT_TRUE(id >= 0 && id < tok->vocab_size());
      std::string got = tok->Decode(ids);
      if (spm) {
        // A space escaped to U+2581 that ends up in byte-fallback tokens decodes as the
        // bytes of U+2581 (llama.cpp behaves the same way).
        for (size_t p; (p = got.find("\xE2\x96\x81")) != std::string::npos;) {
          got.replace(p, 3, " ");
        }
      }
      const std::string want = spm ? text : unicode::Encode(unicode::Decode(text));
      EXPECT_EQ(got, want) << "iteration " << iter;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Validation of untrusted metadata (in-memory vocabularies).

VocabData TinySpm() {
  VocabData v;
  v.model = "llama";
  v.tokens = {"<unk>",
              "<s>",
              "</s>",
              "\xE2\x96\x81",
              "a",
              "b",
              "\xE2\x96\x81"
              "a",
              "ab"};
  v.scores = {0, 0, 0, -1, -2, -2, -0.5f, -0.1f};
  v.token_types = {2, 3, 3, 1, 1, 1, 1, 1};
  return v;
}

TEST(FromVocab, TinySpmMergesByScore) {
  auto tok = Tokenizer::FromVocab(TinySpm());
  ASSERT_TRUE(tok.ok()) << tok.error().message;
  // "▁ab": "ab" (-0.1) beats "▁a" (-0.5).
  EXPECT_EQ((*tok)->Encode("ab", false, false), (std::vector<TokenId>{3, 7}));
  EXPECT_EQ((*tok)->Encode("ab", true, false), (std::vector<TokenId>{1, 3, 7}));
  // No byte tokens: unknown characters become <unk>.
  EXPECT_EQ((*tok)->Encode("z", false, false), (std::vector<TokenId>{3, 0}));
  EXPECT_EQ((*tok)->Decode({3, 7}), "ab");
}

// The "gpt-4o" pre-tokenizer (o200k: gpt-oss), checked on llama-bpe's vocabulary relabelled
// "gpt-4o" against the ids llama.cpp (3f545be) gives the same relabelled file. On the
// vocabulary's own 47 test strings lamina and llama.cpp agree too; "Cửa Việt" is where the
// gpt-4o split differs from llama-bpe's.
TEST(FromGguf, Gpt4oPreTokenizerAsLlamaCpp) {
  const std::string path = SharedDir() + "/vocab/ggml-vocab-llama-bpe.gguf";
  if (!fs::exists(path)) GTEST_SKIP() << path << " not found";
  auto f = gguf::File::Open(path);
  ASSERT_TRUE(f.ok()) << f.error().message;
  gguf::Writer w;
  for (const auto& [k, v] : (*f)->metadata()) w.SetValue(k, v);
  w.SetString("tokenizer.ggml.pre", "gpt-4o");
  const std::string relabelled = testing_util::UniqueTempPath("vocab-gpt4o.gguf");
  ASSERT_TRUE(w.WriteFile(relabelled).ok());
  auto g = gguf::File::Open(relabelled);
  ASSERT_TRUE(g.ok()) << g.error().message;
  auto tok = Tokenizer::FromGguf(**g);
  ASSERT_TRUE(tok.ok()) << tok.error().message;
  fs::remove(relabelled);
  const std::pair<std::string, std::vector<TokenId>> cases[] = {
      {"HelloWorld and getHTTPResponse", {9906, 10343, 323, 636, 9412, 2647}},
      {"C\xE1\xBB\xAD"
       "a Vi\xE1\xBB\x87t",
       {34, 91163, 11655, 26298, 83}},
      {"\xC3\x89t\xC3\xA9\xC3\x89T\xC3\x89 na\xC3\xAFve CAF\xC3\x89s",
       {27887, 123708, 27887, 51, 27887, 95980, 588, 356, 8440, 27887, 82}},
      {"12345 67/89", {4513, 1774, 220, 3080, 14, 4578}},
      {"they'RE here\npath/to/\nfile\n\n  x",
       {20670, 95253, 1618, 198, 2398, 33529, 6018, 1213, 271, 220, 865}},
  };
  for (const auto& [text, ids] : cases) EXPECT_EQ((*tok)->Encode(text, false, false), ids) << text;
}

// The "tekken" pre-tokenizer (mistral3's Ministral 3, Mistral Small 3.x, Devstral), checked as
// gpt-4o's is: llama-bpe's vocabulary relabelled "tekken", against the ids llama.cpp (3f545be)
// gives the same relabelled file. Digits go one at a time, "/" and newlines join punctuation.
TEST(FromGguf, TekkenPreTokenizerAsLlamaCpp) {
  const std::string path = SharedDir() + "/vocab/ggml-vocab-llama-bpe.gguf";
  if (!fs::exists(path)) GTEST_SKIP() << path << " not found";
  auto f = gguf::File::Open(path);
  ASSERT_TRUE(f.ok()) << f.error().message;
  gguf::Writer w;
  for (const auto& [k, v] : (*f)->metadata()) w.SetValue(k, v);
  w.SetString("tokenizer.ggml.pre", "tekken");
  const std::string relabelled = testing_util::UniqueTempPath("vocab-tekken.gguf");
  ASSERT_TRUE(w.WriteFile(relabelled).ok());
  auto g = gguf::File::Open(relabelled);
  ASSERT_TRUE(g.ok()) << g.error().message;
  auto tok = Tokenizer::FromGguf(**g);
  ASSERT_TRUE(tok.ok()) << tok.error().message;
  fs::remove(relabelled);
  const std::pair<std::string, std::vector<TokenId>> cases[] = {
      {"HelloWorld and getHTTPResponse", {9906, 10343, 323, 636, 9412, 2647}},
      {"C\xE1\xBB\xAD"
       "a Vi\xE1\xBB\x87t",
       {34, 91163, 101798}},
      {"\xC3\x89t\xC3\xA9\xC3\x89T\xC3\x89 na\xC3\xAFve CAF\xC3\x89s",
       {27887, 123708, 27887, 51, 27887, 95980, 588, 356, 8440, 27887, 82}},
      {"12345 67/89", {16, 17, 18, 19, 20, 220, 21, 22, 14, 23, 24}},
      {"they'RE here\npath/to/\nfile\n\n  x",
       {20670, 95253, 1618, 198, 2398, 33529, 6018, 1213, 271, 220, 865}},
      {"x = a+b;  // ok\r\n\tdone!?", {87, 284, 264, 36193, 26, 220, 443, 5509, 319, 41595, 58490}},
  };
  for (const auto& [text, ids] : cases) EXPECT_EQ((*tok)->Encode(text, false, false), ids) << text;
}

// gpt-oss's harmony tokens, as llama.cpp reads o200k_harmony: <|return|> and <|call|> end
// generation and <|end|> does not (it closes every message of an answer); the message markers
// render in generated text and are matched as one token without parse_special.
TEST(FromVocab, HarmonyTokens) {
  VocabData v = TinySpm();
  for (const char* t : {"<|start|>", "<|channel|>", "<|message|>", "<|constrain|>", "<|end|>",
                        "<|return|>", "<|call|>"}) {
    v.tokens.push_back(t);
    v.scores.push_back(0);
    v.token_types.push_back(3);
  }
  v.eos_id = 13;  // <|return|>
  auto tok = Tokenizer::FromVocab(v);
  ASSERT_TRUE(tok.ok()) << tok.error().message;
  const Tokenizer& t = **tok;
  EXPECT_TRUE(t.IsEog(13));
  EXPECT_TRUE(t.IsEog(14));
  EXPECT_FALSE(t.IsEog(12)) << "<|end|> ends a message, not the answer";
  for (TokenId id : {8, 9, 10, 11}) EXPECT_EQ(t.TokenToPiece(id, false), v.tokens[id]) << id;
  EXPECT_EQ(t.TokenToPiece(12, false), "");
  const std::vector<TokenId> ids = t.Encode("<|start|>a<|channel|>b", false, false);
  EXPECT_EQ(ids.front(), 8);
  EXPECT_NE(std::find(ids.begin(), ids.end(), 9), ids.end());
  // Without both <|return|> and <|call|>, <|end|> stays an end of generation (phi-3).
  v.tokens[14] = "<|other|>";
  tok = Tokenizer::FromVocab(v);
  ASSERT_TRUE(tok.ok());
  EXPECT_TRUE((*tok)->IsEog(12));
  EXPECT_EQ((*tok)->TokenToPiece(9, false), "");
}

TEST(FromVocab, RejectsUnknownModelAndPre) {
  VocabData v = TinySpm();
  v.model = "t5";
  auto tok = Tokenizer::FromVocab(v);
  ASSERT_FALSE(tok.ok());
  EXPECT_NE(tok.error().message.find("t5"), std::string::npos) << tok.error().message;

  VocabData b;
  b.model = "gpt2";
  b.pre = "no-such-pre";
  b.tokens = {"a", "b", "ab"};
  b.merges = {"a b"};
  auto bpe = Tokenizer::FromVocab(b);
  ASSERT_FALSE(bpe.ok());
  EXPECT_NE(bpe.error().message.find("no-such-pre"), std::string::npos);
}

TEST(FromVocab, RejectsInconsistentArrays) {
  VocabData v = TinySpm();
  v.scores.pop_back();
  EXPECT_FALSE(Tokenizer::FromVocab(v).ok());
  v = TinySpm();
  v.token_types.resize(3);
  EXPECT_FALSE(Tokenizer::FromVocab(v).ok());
  v = TinySpm();
  v.tokens[5] = "a";  // duplicate
  EXPECT_FALSE(Tokenizer::FromVocab(v).ok());
  v = TinySpm();
  v.tokens.clear();
  v.scores.clear();
  v.token_types.clear();
  EXPECT_FALSE(Tokenizer::FromVocab(v).ok());
  VocabData b;
  b.model = "gpt2";
  b.tokens = {"a", "b", "ab"};
  EXPECT_FALSE(Tokenizer::FromVocab(b).ok()) << "BPE needs merges";
}

TEST(FromVocab, OutOfRangeSpecialIdsAreIgnored) {
  VocabData v = TinySpm();
  v.bos_id = 4294967295;  // how some converters spell "none"
  v.eos_id = -1;
  v.pad_id = 99999;
  auto tok = Tokenizer::FromVocab(v);
  ASSERT_TRUE(tok.ok()) << tok.error().message;
  EXPECT_EQ((*tok)->bos(), 1);  // SentencePiece defaults
  EXPECT_EQ((*tok)->eos(), 2);

  VocabData b;
  b.model = "gpt2";
  b.pre = "gpt-2";
  b.tokens = {"a", "b", "ab"};
  b.merges = {"a b"};
  b.add_bos = true;  // but no BOS id in range (the default 11 is outside a 3-token vocab)
  auto bpe = Tokenizer::FromVocab(b);
  EXPECT_FALSE(bpe.ok());
  b.add_bos = false;
  bpe = Tokenizer::FromVocab(b);
  ASSERT_TRUE(bpe.ok()) << bpe.error().message;
  EXPECT_EQ((*bpe)->Encode("ab", false, false), std::vector<TokenId>{2});
  EXPECT_EQ((*bpe)->Encode("aab", false, false), (std::vector<TokenId>{0, 2}));
}

}  // namespace
}  // namespace lamina
