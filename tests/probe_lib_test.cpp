// The probe as a library (src/probe/), without a model: the strict JSON reader agrees with
// nlohmann's parser on what is valid and what equals the expected object; counting analysis; and
// RunProbe over scripted backends (typed results, stop rules, verdicts, n/a for a backend without
// logits, generation errors failing the leg).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <regex>

#include "probe/json_check.h"
#include "probe/probe.h"

namespace lamina::probe {
namespace {

TEST(JsonCheck, AcceptsExactlyWhatNlohmannAccepts) {
  const char* const cases[] = {
      R"({})",
      R"({"name": "Tom", "age": 42, "city": "Paris"})",
      " \t\n{\"a\":1}\r\n",
      R"({"a": [1, 2.5, -3e2, true, false, null, {"b": []}], "c": "\u00e9\ud83d\ude00"})",
      R"({"a": "tab\tin"})",
      "{\"a\": \"raw\ttab\"}",
      "{\"a\": \"\xc3\xa9\"}",
      "{\"a\": \"\xc3\"}",
      "{\"a\": \"\xe0\x80\xaf\"}",
      "{\"a\": \"\xed\xa0\x80\"}",
      R"({"a": "\ud800"})",
      R"({"a": "\udc00"})",
      R"({"a": "\x"})",
      R"({"a": 01})",
      R"({"a": 1.})",
      R"({"a": .5})",
      R"({"a": -})",
      R"({"a": 1e})",
      R"({"a": +1})",
      R"({"a": 1,})",
      R"({"a" 1})",
      R"({a: 1})",
      R"({'a': 1})",
      R"({"a": 1} x)",
      R"([1, 2])",
      R"("text")",
      R"({"a": tru})",
      R"({"a": nul})",
      R"({"a": 1)",
      R"({"a": "unterminated})",
      "",
  };
  for (const char* text : cases) {
    EXPECT_EQ(ParseJsonObject(text).has_value(),
              nlohmann::json::accept(text) && nlohmann::json::parse(text).is_object())
        << text;
  }
}

TEST(JsonCheck, FieldsCompareAsJsonValues) {
  const nlohmann::json expected = {{"name", "Tom"}, {"age", 42}, {"city", "Paris"}};
  const char* const answers[] = {
      R"({"name": "Tom", "age": 42, "city": "Paris"})",
      R"({"city": "Paris", "name": "Tom", "age": 42.0})",
      R"({"name": "Tom", "age": 4.2e1, "city": "Paris"})",
      R"({"name": "Tom", "age": "42", "city": "Paris"})",
      R"({"name": "Tom", "age": 42, "city": "Paris", "x": 1})",
      R"({"name": "Tom", "age": 43, "age": 42, "city": "Paris"})",
      R"({"name": "T\u006fm", "age": 42, "city": "Paris"})",
      R"({"name": "Tom", "age": 42})",
      R"({"name": ["Tom"], "age": 42, "city": "Paris"})",
  };
  for (const char* text : answers) {
    const auto fields = ParseJsonObject(text);
    ASSERT_TRUE(fields.has_value()) << text;
    const bool same = fields->size() == 3 && fields->count("name") &&
                      JsonEquals(fields->at("name"), std::string("Tom")) && fields->count("age") &&
                      JsonEquals(fields->at("age"), int64_t{42}) && fields->count("city") &&
                      JsonEquals(fields->at("city"), std::string("Paris"));
    EXPECT_EQ(same, nlohmann::json::parse(text) == expected) << text;
  }
  EXPECT_EQ(JsonQuote("a\"b\\c\n\x01"), nlohmann::json("a\"b\\c\n\x01").dump());
}

TEST(AnalyzeCounting, ReadsTheCountAndItsStop) {
  CountingAnalysis a = AnalyzeCounting("1\n2\n3\n", 3, true);
  EXPECT_TRUE(a.pass);
  EXPECT_EQ(a.first_wrong_line, -1);
  a = AnalyzeCounting("1\n2\n3\n4\n", 3, false);  // runs on past n
  EXPECT_FALSE(a.pass);
  EXPECT_TRUE(a.sequence_ok);
  EXPECT_EQ(a.first_wrong_line, 4);
  EXPECT_EQ(a.first_wrong_text, "4");
  a = AnalyzeCounting("1\n1\n1\n5.\n", 6, true);
  EXPECT_FALSE(a.sequence_ok);
  EXPECT_EQ(a.first_wrong_line, 2);
  EXPECT_EQ(a.longest_repeat_value, 1);
  EXPECT_EQ(a.longest_repeat_length, 3);
  EXPECT_EQ(a.skipped, (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(a.first_40, (std::vector<std::string>{"1", "1", "1", "5."}));
}

// Answers the probe's generation tasks from the prompt text, like a perfect model; `wrong_count`
// counts with a repeated number, `fail` answers every request with an error. No logits.
class ScriptedBackend : public ProbeBackend {
 public:
  ScriptedBackend(bool wrong_count, bool fail) : wrong_count_(wrong_count), fail_(fail) {}
  BackendInfo Info() const override {
    BackendInfo info;
    info.logits = false;
    info.no_logits_reason = "scripted: no logits";
    return info;
  }
  int CountTokens(const std::string& text) override { return static_cast<int>(text.size() / 4); }
  Generation Generate(const GenerationRequest& request) override {
    ++requests;
    Generation g;
    if (fail_) {
      g.error = true;
      g.error_message = "the scripted backend is down";
      return g;
    }
    std::smatch m;
    std::string out;
    if (std::regex_search(request.user, m, std::regex(R"(^Count from 1 to (\d+))"))) {
      for (int i = 1; i <= std::stoi(m[1]); ++i) {
        out += std::to_string(wrong_count_ && i > 2 ? 2 : i) + "\n";
      }
    } else if (std::regex_search(request.user, m, std::regex(R"(The secret code is (\d+)\.)"))) {
      out = "The secret code is " + m[1].str() + ".\nMore text.";
    } else if (std::regex_search(
                   request.user, m,
                   std::regex(R"re("name" = "(\w+)", "age" = (\d+), "city" = "(\w+)")re"))) {
      out = "{\"name\": \"" + m[1].str() + "\", \"age\": " + m[2].str() + ", \"city\": \"" +
            m[3].str() + "\"}";
    } else {
      out = request.user.substr(request.user.find('\n') + 1);
    }
    // Token by token (four bytes each, as CountTokens says), checking the stop rule as a real
    // backend does.
    for (size_t at = 0; at < out.size(); at += 4) {
      g.text += out.substr(at, 4);
      ++g.n_tokens;
      if (request.stop && request.stop(g.text)) return g;
      if (g.n_tokens >= request.max_tokens) return g;
    }
    g.ended_turn = true;
    return g;
  }
  int requests = 0;

 private:
  bool wrong_count_;
  bool fail_;
};

ProbeReport RunScripted(std::vector<std::pair<bool, bool>> legs_wrong_fail,
                        std::vector<ProbeKind> probes) {
  ProbeConfig config;
  config.probes = std::move(probes);
  config.n_ctx = 512;
  config.count_to = 10;
  config.needle_lengths = {64};
  config.needle_depths = {50};
  std::vector<Leg> legs;
  for (size_t i = 0; i < legs_wrong_fail.size(); ++i) {
    legs.push_back(
        {"leg" + std::to_string(i),
         std::make_unique<ScriptedBackend>(legs_wrong_fail[i].first, legs_wrong_fail[i].second)});
  }
  return RunProbe(config, legs);
}

TEST(RunProbe, TypedResultsAndVerdictsFromScriptedBackends) {
  const ProbeReport r = RunScripted({{false, false}, {true, false}},
                                    {ProbeKind::kPrefill, ProbeKind::kCounting, ProbeKind::kNeedle,
                                     ProbeKind::kJson, ProbeKind::kCopy, ProbeKind::kDivergence});
  ASSERT_EQ(r.legs.size(), 2u);
  EXPECT_FALSE(r.pass);
  const LegReport& ref = r.legs[0];
  EXPECT_TRUE(ref.reference);
  EXPECT_TRUE(ref.pass) << ref.verdict_line;
  ASSERT_TRUE(ref.counting && ref.needle && ref.json && ref.copy && ref.prefill && ref.divergence);
  EXPECT_EQ(ref.counting->outcome.status, Status::kPass);
  EXPECT_EQ(ref.counting->outcome.cell, "10/10");
  EXPECT_EQ(ref.needle->outcome.cell, "1/1");
  // The stop rule ended the answer where the code appeared.
  EXPECT_EQ(ref.needle->grid[0].answer, "The secret code is " + ref.needle->grid[0].expected);
  EXPECT_EQ(ref.json->outcome.cell, "valid 4/4, exact 4/4");
  EXPECT_EQ(ref.copy->outcome.cell, "exact 3/3");
  EXPECT_FALSE(ref.json->first_difference.has_value());
  for (const Outcome* o : {&ref.prefill->outcome, &ref.divergence->outcome}) {
    EXPECT_EQ(o->status, Status::kNotApplicable);
    EXPECT_EQ(o->reason, "scripted: no logits");
  }
  EXPECT_EQ(ref.verdict_line,
            "leg 0 leg0 (reference): PASS — prefill, divergence n/a (scripted: no logits)");

  const LegReport& bad = r.legs[1];
  EXPECT_FALSE(bad.pass);
  EXPECT_EQ(bad.counting->outcome.status, Status::kFail);
  EXPECT_EQ(bad.counting->analysis.first_wrong_line, 3);
  EXPECT_EQ(bad.counting->outcome.cell, "line 3, run 9x2");
  EXPECT_EQ(bad.verdict_line,
            "leg 1 leg1: FAIL — counting: first wrong line 3 (\"2\"), longest repeat 9x");
  EXPECT_EQ(bad.json->outcome.status, Status::kPass);
}

// The scripted backend answers without a thought: the thinking probe is n/a.
TEST(RunProbe, ThinkingIsNotApplicableWithoutAThought) {
  const ProbeReport r = RunScripted({{false, false}, {false, false}}, {ProbeKind::kThinking});
  ASSERT_EQ(r.legs.size(), 2u);
  EXPECT_TRUE(r.pass);
  for (const LegReport& leg : r.legs) {
    ASSERT_TRUE(leg.thinking.has_value());
    EXPECT_EQ(leg.thinking->outcome.status, Status::kNotApplicable);
    EXPECT_EQ(leg.thinking->outcome.reason,
              "the model does not think: no </think> in the reference's answers");
    EXPECT_EQ(leg.thinking->items.size(), 3u);
    EXPECT_EQ(leg.thinking->closed, 0);
  }
  EXPECT_EQ(r.legs[1].thinking->outcome.cell, "right 0/3, closed 0/3, same text");
}

TEST(RunProbe, GenerationErrorsFailInsteadOfLookingNotApplicable) {
  const ProbeReport r = RunScripted({{false, true}}, {ProbeKind::kCounting, ProbeKind::kCopy});
  ASSERT_EQ(r.legs.size(), 1u);
  EXPECT_FALSE(r.pass);
  EXPECT_EQ(r.legs[0].counting->outcome.status, Status::kFail);
  EXPECT_EQ(r.legs[0].counting->outcome.reason, "the scripted backend is down");
  EXPECT_EQ(r.legs[0].copy->outcome.status, Status::kFail);
  EXPECT_EQ(r.legs[0].copy->items[0].error, "the scripted backend is down");
}

}  // namespace
}  // namespace lamina::probe
