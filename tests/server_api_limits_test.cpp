// The server's request mapping (tools/server/api.cpp) bounds each request's work and memory:
// every numeric field is checked against its range from the one table (the command line's
// rules), stop strings and logit biases are capped (biases summed per token, so at most one per
// vocabulary token), prompts over the slot's context are refused before the choices copy them,
// /tokenize and /detokenize answers are capped, and tokenizing is bounded by the text's bytes.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <string>

#include "chat/chat_template.h"
#include "model/model.h"
#include "server/api.h"

namespace lamina::cli::api {
namespace {

const std::string kModel = std::string(LAMINA_SOURCE_DIR) + "/models/lamina-counter.gguf";

enum class Route { kNative, kOaiCompletion, kChat };

class ApiLimits : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!std::filesystem::exists(kModel)) return;
    Result<std::unique_ptr<Model>> m = LoadModel(kModel);
    ASSERT_TRUE(m.ok()) << m.error().message;
    model_ = std::move(*m).release();
  }
  void SetUp() override {
    if (!model_) GTEST_SKIP() << kModel << " is absent";
    chat_.format = chat::ChatFormat::kChatML;
    defaults_.params.n_predict = 16;
  }
  // A body on a route: ok, or the error in *err.
  bool Parse(json body, Route route, Completion* out, ApiError* err) {
    if (route == Route::kChat) {
      if (!body.contains("messages")) body["messages"] = {{{"role", "user"}, {"content", "hi"}}};
      return ParseChat(body, *model_, chat_, defaults_, out, err);
    }
    if (!body.contains("prompt")) body["prompt"] = "Count from 1 to 3.";
    return ParseCompletion(body, *model_, defaults_, route == Route::kOaiCompletion, out, err);
  }
  ApiError Refused(const json& body, Route route = Route::kNative) {
    Completion c;
    ApiError err;
    EXPECT_FALSE(Parse(body, route, &c, &err)) << body.dump().substr(0, 200);
    EXPECT_EQ(err.status, 400);
    return err;
  }
  Completion Accepted(const json& body, Route route = Route::kNative) {
    Completion c;
    ApiError err;
    EXPECT_TRUE(Parse(body, route, &c, &err)) << body.dump().substr(0, 200) << ": " << err.message;
    return c;
  }
  int n_vocab() const { return model_->hparams().n_vocab; }

  static Model* model_;  // loaded once for the suite
  chat::ChatSetup chat_;
  Defaults defaults_;
};
Model* ApiLimits::model_ = nullptr;

// The route a table field is read on.
Route RouteOf(std::string_view key) {
  if (key == "logprobs" || key == "n") return Route::kOaiCompletion;
  if (key == "top_logprobs" || key == "reasoning_budget_tokens") return Route::kChat;
  return Route::kNative;
}

// A body carrying `value` for a table field (top_logprobs needs logprobs: true).
json With(std::string_view key, const json& value) {
  json body = {{std::string(key), value}};
  if (key == "top_logprobs") body["logprobs"] = true;
  return body;
}

// Every field of the table: its bounds are accepted; just outside them, far outside, a string,
// a boolean, an infinity (JSON has none, so 1e400 where the parser makes one) and, for integer
// fields, a fraction are refused with invalid_request_error naming the field, the range and the
// value.
TEST_F(ApiLimits, EveryNumericFieldIsRangeChecked) {
  ASSERT_GE(NumericFields().size(), 20u);
  for (const NumericField& f : NumericFields()) {
    SCOPED_TRACE(std::string(f.key));
    const Route route = RouteOf(f.key);
    const ValueRange& r = f.range;
    // The bounds (the seed's upper bound is 2^64 - 1, not a double).
    if (f.key == "seed") {
      Accepted(With(f.key, 18446744073709551615ULL), route);
    } else {
      if (!r.lo_open)
        Accepted(With(f.key, r.integer ? json(static_cast<long long>(r.lo)) : json(r.lo)), route);
      Accepted(With(f.key, r.integer ? json(static_cast<long long>(r.hi)) : json(r.hi)), route);
    }
    std::vector<json> bad = {json(-1e300), json(1e300), json("1"), json(true),
                             json::parse("1e400", nullptr, false)};
    if (r.integer) {
      bad.push_back(static_cast<long long>(r.lo) - 1);
      bad.push_back(r.lo + 0.5);
      if (f.key != "seed") bad.push_back(static_cast<long long>(r.hi) + 1);
    } else {
      bad.push_back(r.lo_open ? r.lo : r.lo - 1e-3);
      bad.push_back(r.hi * 1.001 + 1e-3);
    }
    for (const json& v : bad) {
      if (v.is_discarded()) continue;  // the parser refused 1e400 itself
      SCOPED_TRACE(v.dump());
      const ApiError err = Refused(With(f.key, v), route);
      EXPECT_EQ(err.type, "invalid_request_error");
      EXPECT_NE(err.message.find("\"" + std::string(f.key) + "\""), std::string::npos)
          << err.message;
      EXPECT_NE(err.message.find(r.What()), std::string::npos) << err.message;
      EXPECT_NE(err.message.find("got "), std::string::npos) << err.message;
    }
  }
}

// A refusal quotes the value it refused, cut at 64 bytes: the cut lands on a character boundary
// whatever the value holds (2-, 3- and 4-byte characters at every offset), so the error body is
// valid UTF-8 and serialises without a replacement (a strict dump throws on a broken character).
TEST_F(ApiLimits, RefusalsQuoteValuesOnCharacterBoundaries) {
  for (const char* ch : {"\xC3\xA9", "\xE2\x82\xAC", "\xF0\x9F\x98\x80"}) {
    for (int offset = 0; offset < 4; ++offset) {
      std::string text(56 + offset, 'a');
      for (int i = 0; i < 6; ++i) text += ch;
      for (const json& v : {json(text), json::array({text}), json{{"k", text}}}) {
        for (const char* key : {"temperature", "n_predict", "top_p"}) {
          SCOPED_TRACE(std::string(key) + " " + v.dump());
          const ApiError err = Refused(With(key, v));
          EXPECT_NO_THROW((void)ErrorBody(err).dump()) << err.message;
          EXPECT_NE(err.message.find("..."), std::string::npos) << err.message;
        }
      }
    }
  }
}

// The reported case: a temperature of 1e30 was a 200 with no tokens.
TEST_F(ApiLimits, HugeTemperatureIsRefused) {
  for (Route route : {Route::kNative, Route::kOaiCompletion, Route::kChat}) {
    const ApiError err = Refused({{"temperature", 1e30}}, route);
    EXPECT_EQ(err.message, "\"temperature\" must be a temperature in [0, 100], got 1e+30");
  }
  EXPECT_FLOAT_EQ(Accepted({{"temperature", 100}}).requests[0].params.sampler.temperature, 100);
}

// Seeds as llama-server takes them: -1 (and 0xFFFFFFFF) draw one, any unsigned 64-bit one is
// kept, a whole float too.
TEST_F(ApiLimits, Seeds) {
  EXPECT_EQ(Accepted({{"seed", 18446744073709551615ULL}}).requests[0].params.sampler.seed,
            18446744073709551615ULL);
  EXPECT_EQ(Accepted({{"seed", 5.0}}).requests[0].params.sampler.seed, 5u);
  EXPECT_EQ(Accepted({{"seed", 0}}).requests[0].params.sampler.seed, 0u);
  EXPECT_LT(Accepted({{"seed", -1}}).requests[0].params.sampler.seed, 1ULL << 31);
  EXPECT_LT(Accepted({{"seed", 4294967295LL}}).requests[0].params.sampler.seed, 1ULL << 31);
  for (const json& v : {json(-2), json(0.5), json(1e20), json("7")}) {
    EXPECT_NE(Refused({{"seed", v}}).message.find("\"seed\" must be -1 (random)"),
              std::string::npos);
  }
}

TEST_F(ApiLimits, SpeculativeMinAboveMaxIsRefused) {
  Refused({{"speculative.n_max", 4}, {"speculative.n_min", 5}});
  Accepted({{"speculative.n_max", 4}, {"speculative.n_min", 4}});
  Accepted({{"speculative.n_min", 5}});  // n_max: the server's
}

TEST_F(ApiLimits, StopStrings) {
  const std::string longest(kMaxStopBytes, 'x');
  json stops = json::array();
  for (size_t i = 0; i < kMaxStops; ++i) stops.push_back(longest);
  EXPECT_EQ(Accepted({{"stop", stops}}).requests[0].params.stop.size(), kMaxStops);
  stops.push_back("y");
  EXPECT_EQ(Refused({{"stop", stops}}).message, "\"stop\" has 17 strings; at most 16");
  EXPECT_EQ(Refused({{"stop", longest + "x"}}).message,
            "a \"stop\" string has 257 bytes; at most 256");
  EXPECT_EQ(Refused({{"stop", {"a", longest + "x"}}}, Route::kChat).message,
            "a \"stop\" string has 257 bytes; at most 256");
  Refused({{"stop", {"a", 3}}});
  Refused({{"stop", 3}});
}

// Biases of one token add up (llama.cpp's sampler adds each entry), false wins; a request holds
// one entry per token.
TEST_F(ApiLimits, LogitBiasesAreSummedPerToken) {
  const Completion c =
      Accepted({{"logit_bias", {{5, 1.0}, {"5", 2.0}, {9, false}, {9, 100}, {7, -1}}}});
  const auto& bias = c.requests[0].params.logit_bias;
  ASSERT_EQ(bias.size(), 3u);
  EXPECT_EQ(bias[0], (std::pair<int32_t, float>{5, 3.0f}));
  EXPECT_EQ(bias[1].first, 9);
  EXPECT_TRUE(std::isinf(bias[1].second) && bias[1].second < 0);
  EXPECT_EQ(bias[2], (std::pair<int32_t, float>{7, -1.0f}));
  // A text with repeated tokens biases each token once, with the bias times its count (a key
  // of digits alone is a token id).
  const Completion repeated = Accepted({{"logit_bias", {{"x1x1x1", 1.0}}}});
  const auto& text = repeated.requests[0].params.logit_bias;
  const std::vector<int32_t> ids = model_->tokenizer().Encode("x1x1x1", false, false);
  std::map<int32_t, float> want;
  for (int32_t id : ids) want[id] += 1.0f;
  ASSERT_LT(want.size(), ids.size());  // a token repeats
  ASSERT_EQ(text.size(), want.size());
  for (const auto& [id, b] : text) EXPECT_FLOAT_EQ(b, want[id]);
}

TEST_F(ApiLimits, LogitBiasCaps) {
  const std::string text(kMaxLogitBiasTextBytes, 'a');
  Accepted({{"logit_bias", {{text, -1}}}});
  EXPECT_EQ(Refused({{"logit_bias", {{text + "a", -1}}}}).message,
            "a \"logit_bias\" text has 257 bytes; at most 256");
  json many = json::array();
  for (size_t i = 0; i <= kMaxLogitBiasEntries; ++i) many.push_back({i % 100, 1});
  EXPECT_EQ(Refused({{"logit_bias", many}}).message,
            "\"logit_bias\" has 4097 entries; at most 4096");
  many.erase(many.end() - 1);
  EXPECT_EQ(Accepted({{"logit_bias", many}}).requests[0].params.logit_bias.size(), 100u);
  for (const json& v : {json(1e31), json(-1e31), json("x"), json(nullptr)}) {
    Refused({{"logit_bias", {{"5", v}}}});
  }
  Accepted({{"logit_bias", {{"5", kMaxLogitBiasValue}, {"6", -kMaxLogitBiasValue}}}});
}

// The reported case: a few MB of text keys, times n choices, reached 17 GB. Now every key is
// short, each token is biased once however many keys name it, and the choices' copies are
// within kMaxLogitBiasCopies; the whole parse stays small and quick.
TEST_F(ApiLimits, LargeLogitBiasBodyStaysBounded) {
  std::mt19937 rng(3);
  json bias = json::object();
  while (bias.size() < kMaxLogitBiasEntries) {
    std::string key(kMaxLogitBiasTextBytes, ' ');
    for (char& ch : key) ch = static_cast<char>(' ' + rng() % 95);
    bias[key] = -(static_cast<double>(rng() % 100));
  }
  for (Route route : {Route::kNative, Route::kOaiCompletion, Route::kChat}) {
    json body = {{"logit_bias", bias}};
    body[route == Route::kNative ? "n_cmpl" : "n"] = kMaxChoices;
    if (route != Route::kChat) body["prompt"] = {"a", "b", "c", "d"};  // 64 completions
    const auto t0 = std::chrono::steady_clock::now();
    const Completion c = Accepted(body, route);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(seconds, 20.0);
    size_t total = 0;
    for (const serve::Request& r : c.requests) {
      EXPECT_LE(r.params.logit_bias.size(), static_cast<size_t>(n_vocab()));
      total += r.params.logit_bias.size();
    }
    EXPECT_LE(total, kMaxLogitBiasCopies);
  }
}

// Banning every token is a valid request (generation then ends at once, see sampler_test).
TEST_F(ApiLimits, BanningEveryTokenIsAccepted) {
  json bias = json::object();
  for (int i = 0; i < n_vocab(); ++i) bias[std::to_string(i)] = false;
  EXPECT_EQ(Accepted({{"logit_bias", bias}}).requests[0].params.logit_bias.size(),
            static_cast<size_t>(n_vocab()));
}

// With the slot's context known, a prompt over it is refused before the choices copy it, with
// llama-server's error type and numbers.
TEST_F(ApiLimits, PromptOverTheSlotIsRefusedBeforeCopies) {
  defaults_.n_ctx_slot = 64;
  std::string prompt;
  for (int i = 0; i < 100; ++i) prompt += "1 ";
  for (Route route : {Route::kNative, Route::kOaiCompletion, Route::kChat}) {
    json body = {{route == Route::kNative ? "n_cmpl" : "n", kMaxChoices}};
    if (route == Route::kChat) {
      body["messages"] = {{{"role", "user"}, {"content", prompt}}};
    } else {
      body["prompt"] = {"short", prompt};
    }
    const ApiError err = Refused(body, route);
    EXPECT_EQ(err.type, "exceed_context_size_error");
    const json j = ErrorBody(err);
    EXPECT_GT(j["error"]["n_prompt_tokens"].get<int>(), 64);
    EXPECT_EQ(j["error"]["n_ctx"], 64);
    EXPECT_EQ(j["error"]["code"], 400);
  }
  // At the context exactly: accepted.
  const std::vector<int32_t> ids = TokenizePrompt(*model_, "Count", true);
  defaults_.n_ctx_slot = static_cast<int>(ids.size());
  Accepted({{"prompt", "Count"}, {"n_cmpl", 2}});
  // Not known (0): the caller checks.
  defaults_.n_ctx_slot = 0;
  Accepted({{"prompt", prompt}, {"n_cmpl", 2}});
}

// Tokenizing never gives more than a token per byte, plus the specials added: the prompt, the
// /tokenize answer and a logit_bias text are bounded by the body's size.
TEST_F(ApiLimits, TokensAreBoundedByBytes) {
  std::mt19937 rng(11);
  const std::vector<std::string> alphabet = {
      "a", "1", " ", "\n", "é", "😀", "\xff", "<|im_start|>", "<|im_end|>", "<s>", "\t", "Count "};
  for (int trial = 0; trial < 200; ++trial) {
    std::string text;
    const int parts = 1 + trial * 3;
    for (int i = 0; i < parts; ++i) text += alphabet[rng() % alphabet.size()];
    for (bool special : {false, true}) {
      const size_t n = model_->tokenizer().Encode(text, special, special).size();
      EXPECT_LE(n, text.size() + 3) << text;
    }
  }
}

// The answer /tokenize gave before (a JSON value dumped), byte for byte.
std::string OldTokenizeAnswer(const Model& model, const std::string& text, bool with_pieces) {
  json tokens = json::array();
  for (int32_t id : model.tokenizer().Encode(text, false, true)) {
    if (with_pieces) {
      tokens.push_back(
          {{"id", id}, {"piece", PieceJson(model.tokenizer().TokenToPiece(id, true))}});
    } else {
      tokens.push_back(id);
    }
  }
  return json{{"tokens", tokens}}.dump(-1, ' ', false, json::error_handler_t::replace);
}

TEST_F(ApiLimits, TokenizeAnswerIsTheJsonAnswer) {
  for (const std::string text : {"", "Count from 1 to 3.\n", "<|im_start|>user\né😀\"\\ \x01"}) {
    for (bool pieces : {false, true}) {
      std::string answer;
      ApiError err;
      ASSERT_TRUE(
          TokenizeAnswer({{"content", text}, {"with_pieces", pieces}}, *model_, &answer, &err))
          << err.message;
      EXPECT_EQ(answer, OldTokenizeAnswer(*model_, text, pieces));
      EXPECT_FALSE(json::parse(answer, nullptr, false).is_discarded());
    }
  }
  std::string answer;
  ApiError err;
  EXPECT_FALSE(TokenizeAnswer({{"content", 3}}, *model_, &answer, &err));
  EXPECT_EQ(err.message, "\"content\" must be a string");
  EXPECT_FALSE(TokenizeAnswer({{"content", "a"}, {"with_pieces", 1}}, *model_, &answer, &err));
  EXPECT_EQ(err.status, 400);
}

// Over kMaxTokenizeTokens tokens (here digits, a token each) is a 400 naming the count and the
// limit; at the limit the answer with pieces stays within a few tens of MB.
TEST_F(ApiLimits, TokenizeAnswerIsCapped) {
  const Tokenizer& tok = model_->tokenizer();
  std::string text(kMaxTokenizeTokens + 1, '7');
  const size_t n = tok.Encode(text, false, true).size();
  ASSERT_GT(n, kMaxTokenizeTokens);  // a token a digit
  std::string answer;
  ApiError err;
  ASSERT_FALSE(TokenizeAnswer({{"content", text}, {"with_pieces", true}}, *model_, &answer, &err));
  EXPECT_EQ(err.status, 400);
  EXPECT_EQ(err.message,
            "\"content\" has " + std::to_string(n) + " tokens; /tokenize answers at most 1048576");
  text.resize(text.size() - (n - kMaxTokenizeTokens));
  ASSERT_TRUE(TokenizeAnswer({{"content", text}, {"with_pieces", true}}, *model_, &answer, &err))
      << err.message;
  EXPECT_LT(answer.size(), size_t{48} << 20);
  EXPECT_EQ(json::parse(answer)["tokens"].size(), kMaxTokenizeTokens);
}

TEST_F(ApiLimits, DetokenizeAnswer) {
  const std::vector<int32_t> ids = model_->tokenizer().Encode("Count from 1 to 3.", false, true);
  std::string answer;
  ApiError err;
  ASSERT_TRUE(DetokenizeAnswer({{"tokens", ids}}, *model_, &answer, &err)) << err.message;
  std::string text;
  for (int32_t id : ids) text += model_->tokenizer().TokenToPiece(id, true);
  EXPECT_EQ(answer, json({{"content", text}}).dump());
  ASSERT_TRUE(DetokenizeAnswer(json::object(), *model_, &answer, &err));
  EXPECT_EQ(answer, "{\"content\":\"\"}");
  for (const json& bad : {json{{"tokens", 3}}, json{{"tokens", {1, -1}}},
                          json{{"tokens", {n_vocab()}}}, json{{"tokens", {"a"}}}}) {
    EXPECT_FALSE(DetokenizeAnswer(bad, *model_, &answer, &err)) << bad;
    EXPECT_EQ(err.status, 400);
  }
  json many = json::array();
  for (size_t i = 0; i <= kMaxDetokenizeTokens; ++i) many.push_back(7);
  EXPECT_FALSE(DetokenizeAnswer({{"tokens", many}}, *model_, &answer, &err));
  EXPECT_EQ(err.message, "\"tokens\" has 1048577 tokens; /detokenize takes at most 1048576");
  // The text's bytes: the longest piece, as often as the count allows.
  int32_t longest = 0;
  for (int id = 0; id < n_vocab(); ++id) {
    if (model_->tokenizer().TokenToPiece(id, true).size() >
        model_->tokenizer().TokenToPiece(longest, true).size()) {
      longest = id;
    }
  }
  const size_t piece = model_->tokenizer().TokenToPiece(longest, true).size();
  if (piece * kMaxDetokenizeTokens > kMaxDetokenizeBytes) {
    json longs = json::array();
    for (size_t i = 0; i < kMaxDetokenizeTokens; ++i) longs.push_back(longest);
    EXPECT_FALSE(DetokenizeAnswer({{"tokens", longs}}, *model_, &answer, &err));
    EXPECT_NE(err.message.find("is over 16777216 bytes"), std::string::npos) << err.message;
  }
}

// Choices: at most kMaxChoices per prompt and kMaxCompletions in all.
TEST_F(ApiLimits, Choices) {
  json prompts = json::array();
  for (int i = 0; i < 4; ++i) prompts.push_back("p" + std::to_string(i));
  EXPECT_EQ(Accepted({{"prompt", prompts}, {"n_cmpl", 16}}).requests.size(), 64u);
  prompts.push_back("p4");
  Refused({{"prompt", prompts}, {"n_cmpl", 16}});
  EXPECT_EQ(Refused({{"n", 17}}, Route::kChat).message,
            "\"n\" must be an integer in [1, 16], got 17");
  json many = json::array();
  for (size_t i = 0; i <= kMaxCompletions; ++i) many.push_back("x");
  EXPECT_EQ(Refused({{"prompt", many}}).message, "more than 64 prompts in one request");
}

// llama-server's prompt forms: text, token ids, a mix in one sequence (only a leading text part
// gets BOS), {"prompt_string": ...}, and an array of those (any array without a number in it).
TEST_F(ApiLimits, PromptForms) {
  const std::string text = "Count from 1 to 3.";
  const std::vector<int32_t> tokens = TokenizePrompt(*model_, text, true);
  const json ids = tokens;
  auto prompts_of = [&](const json& prompt) {
    std::vector<std::vector<int32_t>> out;
    for (const serve::Request& r : Accepted({{"prompt", prompt}}).requests) {
      out.push_back(r.prompt);
    }
    return out;
  };
  using Prompts = std::vector<std::vector<int32_t>>;
  EXPECT_EQ(prompts_of(text), Prompts{tokens});
  EXPECT_EQ(prompts_of(ids), Prompts{tokens});
  EXPECT_EQ(prompts_of({{"prompt_string", text}}), Prompts{tokens});
  EXPECT_EQ(prompts_of({{"prompt_string", ids}}), Prompts{tokens});
  EXPECT_EQ(prompts_of({ids, text, {{"prompt_string", text}}}), (Prompts{tokens, tokens, tokens}));
  // One sequence: ids, then text without BOS.
  std::vector<int32_t> mixed = {5, 6};
  const std::vector<int32_t> plain = TokenizePrompt(*model_, text, false);
  mixed.insert(mixed.end(), plain.begin(), plain.end());
  EXPECT_EQ(prompts_of({5, 6, text}), Prompts{mixed});
  EXPECT_NE(Refused({{"prompt", {{"prompt_string", text}, {"multimodal_data", {"AAAA"}}}}})
                .message.find("multimodal_data"),
            std::string::npos);
  EXPECT_NE(Refused({{"prompt", {{"text", text}}}}).message.find("prompt_string"),
            std::string::npos);
  Refused({{"prompt", {{"prompt_string", {{"prompt_string", text}}}}}});
  Refused({{"prompt", {ids, true}}});
}

}  // namespace
}  // namespace lamina::cli::api
