// The lamina CLI as a real process: --prompt-chunk invariance in every KV mode, JSON outputs of
// run / score / bench, documented exit codes, and the conventions llama.cpp and Ollama users
// expect (--version, suggestions for mistyped commands and options, llama.cpp flags refused by
// name, grouped help with defaults, a random sampling seed that --seed fixes).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>

#include "process_util.h"
#include "temp_path.h"

namespace {

const std::string kShared = LAMINA_SHARED_DIR;
const std::string kBinary = LAMINA_BINARY;

using Output = lamina::testing_util::ProcessOutput;

Output Lamina(const std::string& args) {
  return lamina::testing_util::RunShell(kBinary + " " + args + " 2>/dev/null");
}

std::string Stories() { return kShared + "/models/stories260K.gguf"; }

#define REQUIRE_SHARED() \
  if (!std::filesystem::exists(Stories())) GTEST_SKIP() << "../shared is absent"

TEST(Cli, PromptChunkGivesIdenticalGreedyTokensInEveryMode) {
  REQUIRE_SHARED();
  const std::string prompt = kShared + "/golden/prompts/prompt_p100.txt";
  for (const char* kv : {"f32", "f16", "int8", "q4_0", "k8v4"}) {
    std::string reference;
    for (int chunk : {0, 1, 3, 7, 64}) {
      Output o = Lamina("run -m " + Stories() + " -f " + prompt +
                        " -n 40 --temp 0 --ignore-eos --json -t 2 --kv " + kv + " --prompt-chunk " +
                        std::to_string(chunk));
      ASSERT_EQ(o.code, 0) << kv << " chunk " << chunk;
      const auto j = nlohmann::json::parse(o.out);
      const std::string ids = j["generated_tokens"].dump();
      if (reference.empty()) reference = ids;
      EXPECT_EQ(ids, reference) << "kv " << kv << " chunk " << chunk;
    }
  }
}

// run --chat and chat with gpt-oss's template (the gpt-oss fixture, the answer pinned by a
// grammar): the analysis channel printed as a thinking block, the final channel as the answer, a
// call as a line; never harmony's markers.
TEST(Cli, HarmonyAnswersPrintTheirChannels) {
  const std::string model =
      std::string(LAMINA_SOURCE_DIR) + "/tests/fixtures/models/synth-gpt-oss-d256.MXFP4_MOE.gguf";
  const std::string flags = " -m " + model + " --chat-template gpt-oss -n 400 --temp 0 -t 2";
  Output run = Lamina(
      "run --chat -p hi" + flags +
      " --grammar 'root ::= \"<|channel|>analysis<|message|>User greets.<|end|><|start|>assistant"
      "<|channel|>final<|message|>Hello there.\"'");
  ASSERT_EQ(run.code, 0);
  EXPECT_EQ(run.out, "<think>\nUser greets.\n</think>\n\nHello there.\n");
  Output chat = lamina::testing_util::RunShell(
      "echo hi | " + kBinary + " chat" + flags +
      " --grammar 'root ::= \"<|channel|>analysis<|message|>Need time.<|end|><|start|>assistant"
      "<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{\\\"tz\\\": "
      "\\\"UTC\\\"}\"' 2>/dev/null");
  ASSERT_EQ(chat.code, 0);
  EXPECT_EQ(chat.out, "<think>\nNeed time.\n</think>\n\n[call get_time {\"tz\": \"UTC\"}]\n\n");
}

TEST(Cli, RunJsonHasTokensTextAndTimings) {
  REQUIRE_SHARED();
  Output o = Lamina("run -m " + Stories() + " -p \"Once upon a time\" -n 8 --temp 0 --json");
  ASSERT_EQ(o.code, 0);
  const auto j = nlohmann::json::parse(o.out);
  EXPECT_EQ(j["prompt_tokens"].size(), 5u);
  EXPECT_EQ(j["generated_tokens"].size(), 8u);
  EXPECT_TRUE(j["text"].is_string());
  EXPECT_TRUE(j["timings"]["decode_tok_s"].is_number());
  EXPECT_TRUE(j["timings"]["prompt_tok_s"].is_number());
}

TEST(Cli, SamplingIsDeterministicForASeed) {
  REQUIRE_SHARED();
  const std::string args = "run -m " + Stories() +
                           " -p \"Once upon a time\" -n 32 --temp 0.9 --top-k 20 --top-p 0.9 "
                           "--min-p 0.02 --repeat-penalty 1.1 --json --seed ";
  const auto a = nlohmann::json::parse(Lamina(args + "5").out)["generated_tokens"];
  const auto b = nlohmann::json::parse(Lamina(args + "5").out)["generated_tokens"];
  const auto c = nlohmann::json::parse(Lamina(args + "6").out)["generated_tokens"];
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

TEST(Cli, ScoreSavesLogitsAndComparesKl) {
  REQUIRE_SHARED();
  const std::string text = kShared + "/golden/prompts/prompt_story300.txt";
  const std::string dump = lamina::testing_util::UniqueTempPath("lamina_base.logits");
  const lamina::testing_util::RemoveAtExit remove_dump(dump);
  Output base = Lamina("score -m " + Stories() + " -f " + text + " --kv f32 --save-logits " + dump +
                       " --json");
  ASSERT_EQ(base.code, 0);
  const auto jb = nlohmann::json::parse(base.out);
  EXPECT_GT(jb["perplexity"].get<double>(), 1.0);
  EXPECT_EQ(jb["n_tokens"].get<int>(), 310);
  Output same =
      Lamina("score -m " + Stories() + " -f " + text + " --kv f32 --kl-base " + dump + " --json");
  ASSERT_EQ(same.code, 0);
  const auto js = nlohmann::json::parse(same.out);
  EXPECT_EQ(js["kld_max"].get<double>(), 0.0);
  EXPECT_EQ(js["top1_agreement"].get<double>(), 1.0);
  Output q =
      Lamina("score -m " + Stories() + " -f " + text + " --kv k8v4 --kl-base " + dump + " --json");
  ASSERT_EQ(q.code, 0);
  const auto jq = nlohmann::json::parse(q.out);
  for (const char* k : {"kld_mean", "kld_median", "kld_p99", "kld_max", "top1_agreement"}) {
    EXPECT_TRUE(jq[k].is_number()) << k;
  }
  EXPECT_GT(jq["kld_mean"].get<double>(), 0.0);
}

TEST(Cli, BenchJson) {
  REQUIRE_SHARED();
  Output o = Lamina("bench -m " + Stories() + " -p 32 -n 8 -d 16 -r 1 --json");
  ASSERT_EQ(o.code, 0);
  const auto j = nlohmann::json::parse(o.out);
  EXPECT_GT(j["pp_tok_s"].get<double>(), 0.0);
  EXPECT_GT(j["tg_tok_s"].get<double>(), 0.0);
}

// --parallel: every count once per repetition; vs_1 only where a one-stream run exists, 1 for it.
TEST(Cli, BenchParallelRatiosAgainstTheSameRepetition) {
  REQUIRE_SHARED();
  Output o = Lamina("bench -m " + Stories() + " --parallel 2,1 -p 0 -n 4 -r 3 --json");
  ASSERT_EQ(o.code, 0);
  const auto rows = nlohmann::json::parse(o.out)["parallel"];
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0]["streams"], 2);
  EXPECT_GT(rows[0]["vs_1"].get<double>(), 0.0);
  EXPECT_EQ(rows[1]["vs_1"].get<double>(), 1.0);
  Output without_one = Lamina("bench -m " + Stories() + " --parallel 2 -p 0 -n 4 -r 1 --json");
  ASSERT_EQ(without_one.code, 0);
  EXPECT_FALSE(nlohmann::json::parse(without_one.out)["parallel"][0].contains("vs_1"));
}

TEST(Cli, ExitCodes) {
  EXPECT_EQ(Lamina("").code, 2);
  EXPECT_EQ(Lamina("run --no-such-flag").code, 2);
  EXPECT_EQ(Lamina("run -m /nonexistent.gguf -p hi").code, 3);
  const std::string bad = lamina::testing_util::UniqueTempPath("lamina_bad.gguf");
  const lamina::testing_util::RemoveAtExit remove_bad(bad);
  std::ofstream(bad) << "not a gguf file at all";
  EXPECT_EQ(Lamina("run -m " + bad + " -p hi").code, 3);
  EXPECT_EQ(Lamina("inspect " + bad).code, 3);
  REQUIRE_SHARED();
  EXPECT_EQ(Lamina("run -m " + Stories() + " -p hi --kv q3").code, 2);
  EXPECT_EQ(Lamina("run -m " + Stories() + " -p hi --kv-v-round sometimes").code, 2);
  EXPECT_EQ(Lamina("score -m " + Stories() + " -f /nonexistent.txt").code, 3);
  EXPECT_EQ(Lamina("inspect " + Stories()).code, 0);
}

// Speculative decoding's bad inputs: one line on stderr each, with the documented exit code.
TEST(Cli, SpeculativeErrorsAreOneLineWithExitCodes) {
  REQUIRE_SHARED();
  const std::string shipped = std::string(LAMINA_SOURCE_DIR) + "/models/lamina-counter.gguf";
  const std::string bad = lamina::testing_util::UniqueTempPath("lamina_bad_draft.gguf");
  const lamina::testing_util::RemoveAtExit remove_bad(bad);
  std::ofstream(bad) << "GGUF but not really";
  auto err = [](const std::string& args) {
    return lamina::testing_util::RunShell(kBinary + " " + args + " 2>&1 >/dev/null");
  };
  struct Case {
    std::string args;
    int code;
    std::string says;
  };
  const std::string run = "run -m " + shipped + " -p hi -n 4 ";
  for (const Case& c : {
           Case{run + "--spec draft -md " + Stories(), 3, "cannot draft for the target"},
           Case{run + "--spec draft -md " + bad, 3, ""},
           Case{run + "--spec lookup --draft-max 0", 2, "--draft-max"},
           Case{run + "--spec lookup --draft-max -3", 2, "--draft-max"},
           Case{run + "--spec draft --draft-p-min 1.5", 2, "--draft-p-min"},
           Case{"run -m " + Stories() + " -p hi --spec draft", 2, "-md"},
           Case{run + "--spec sideways", 2, ""},
       }) {
    Output o = err(c.args);
    EXPECT_EQ(o.code, c.code) << c.args << ": " << o.out;
    EXPECT_NE(o.out.find(c.says), std::string::npos) << c.args << ": " << o.out;
    if (c.code == 3) {
      EXPECT_EQ(std::count(o.out.begin(), o.out.end(), '\n'), 1) << c.args << ": " << o.out;
    }
  }
  // A working run reports its drafting in --json.
  Output ok = Lamina(run + "--spec lookup --json");
  ASSERT_EQ(ok.code, 0);
  const auto j = nlohmann::json::parse(ok.out);
  EXPECT_EQ(j["spec"]["mode"], "lookup");
  EXPECT_TRUE(j["spec"]["acceptance"].is_number());
}

// stderr only (stdout dropped).
Output LaminaErr(const std::string& args) {
  return lamina::testing_util::RunShell(kBinary + " " + args + " 2>&1 >/dev/null");
}

bool Has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

const std::string kShipped = std::string(LAMINA_SOURCE_DIR) + "/models/lamina-counter.gguf";

TEST(CliConventions, VersionPrintsNameAndVersion) {
  const std::regex want("lamina [0-9]+\\.[0-9]+\\.[0-9]+( \\([0-9a-f]+\\))?\n");
  for (const char* args : {"--version", "version"}) {
    Output o = Lamina(args);
    EXPECT_EQ(o.code, 0) << args;
    const bool matches = std::regex_match(o.out, want);
    EXPECT_TRUE(matches) << args << ": " << o.out;
  }
}

TEST(CliConventions, MistypedCommandSuggestsTheClosest) {
  struct Case {
    const char* typed;
    const char* want;
  };
  for (const Case& c : {Case{"rnu", "run"}, Case{"rn", "run"}, Case{"chta", "chat"},
                        Case{"bnech", "bench"}, Case{"benchmark", "bench"}, Case{"scor", "score"},
                        Case{"prbe", "probe"}, Case{"inspcet", "inspect"}, Case{"serv", "serve"}}) {
    Output o = LaminaErr(std::string(c.typed) + " -p hi");
    EXPECT_EQ(o.code, 2) << c.typed;
    EXPECT_EQ(o.out, "lamina: unknown command '" + std::string(c.typed) + "'; did you mean '" +
                         c.want + "'?\n");
  }
  // Nothing close: the commands are listed.
  Output o = LaminaErr("xyzzy");
  EXPECT_EQ(o.code, 2);
  EXPECT_TRUE(Has(o.out, "unknown command 'xyzzy'; the commands are run, chat")) << o.out;
}

TEST(CliConventions, MistypedOptionSuggestsTheClosest) {
  struct Case {
    std::string args;
    std::string typed;
    std::string want;
  };
  for (const Case& c : {Case{"run -p hi --temperatur 0.5", "--temperatur", "--temp"},
                        Case{"run -p hi --temperature 0.5", "--temperature", "--temp"},
                        Case{"run -p hi --seeed 3", "--seeed", "--seed"},
                        Case{"run -p hi --n-predcit 3", "--n-predcit", "--n-predict"},
                        Case{"run -p hi --top_k 3", "--top_k", "--top-k"},
                        Case{"chat --sytem hi", "--sytem", "--system"},
                        Case{"bench --n-promt 8", "--n-promt", "--n-prompt"},
                        Case{"score -f x --save-logit y", "--save-logit", "--save-logits"},
                        Case{"probe --probs counting", "--probs", "--probes"}}) {
    Output o = LaminaErr(c.args);
    EXPECT_EQ(o.code, 2) << c.args;
    EXPECT_EQ(o.out, "lamina: unknown option '" + c.typed + "'; did you mean '" + c.want + "'?\n");
  }
  Output far = LaminaErr("run -p hi --zzzzzz");
  EXPECT_EQ(far.code, 2);
  EXPECT_EQ(far.out, "lamina: unknown option '--zzzzzz' (--help lists the options)\n");
}

// llama.cpp's multi-letter one-dash flags: CLI11 would read -cnv as -c nv, -ps as -p s (a prompt
// of "s"), -fa as -f a. Each is refused with one line naming it, or works as in llama.cpp.
TEST(CliConventions, LlamaCppFlagsAreRefusedByNameNotMisread) {
  for (const char* flag : {"-cnv",         "-ngl 99", "-fa",       "-ctk q8_0",
                           "-ctv q8_0",    "-np 4",   "-ts 1",     "-mu x",
                           "-hf x",        "-nkvo",   "-dev none", "-sm none",
                           "-mg 0",        "-tb 2",   "-ub 8",     "-cb",
                           "-nocb",        "-dt 0.1", "-lv 1",     "-otd x",
                           "-sp",          "-ps 0.1", "-st",       "-kvu",
                           "-b 8",         "-i",      "-sys hi",   "--n-gpu-layers 99",
                           "--flash-attn", "-tgs 3",  "-pg 8,4",   "-to 5"}) {
    const std::string name = std::string(flag).substr(0, std::string(flag).find(' '));
    for (const char* cmd : {"run -p hi", "score -f x", "bench", "probe"}) {
      if (std::string(cmd) == "bench" && name == "-np") continue;  // bench's --parallel
      const std::string args = std::string(cmd) + " -m " + kShipped + " " + flag;
      Output o = LaminaErr(args);
      EXPECT_EQ(o.code, 2) << args << ": " << o.out;
      EXPECT_EQ(o.out.rfind("lamina: " + name + ": ", 0), 0u) << args << ": " << o.out;
      EXPECT_EQ(std::count(o.out.begin(), o.out.end(), '\n'), 1) << args << ": " << o.out;
    }
  }
  Output cnv = LaminaErr("run -cnv -p hi");
  EXPECT_TRUE(Has(cnv.out, "lamina chat")) << cnv.out;
  EXPECT_FALSE(Has(cnv.out, "ctx")) << cnv.out;
  // Where lamina has the feature, the llama.cpp spelling works: chat is a conversation, -sys its
  // system turn, -s the seed, -md the draft model, -np bench's batched decode.
  EXPECT_EQ(Lamina("chat -m " + kShipped + " -cnv -i -sys hi -s 3 -n 2 </dev/null").code, 0);
  EXPECT_EQ(Lamina("run -m " + kShipped + " -p hi -n 2 -s 3 -md " + kShipped).code, 0);
  EXPECT_EQ(Lamina("bench -m " + kShipped + " -p 8 -n 4 -r 1 -np 1,2 --json").code, 0);
}

TEST(CliConventions, SamplingSeedIsRandomUnlessGiven) {
  auto seed_of = [](const Output& o) {
    std::smatch m;
    const std::regex re("lamina: seed: ([0-9]+)\n");
    return std::regex_search(o.out, m, re) ? m[1].str() : std::string();
  };
  const std::string run = kBinary + " run -m " + kShipped + " -p hi -n 8 --temp 0.9 --json";
  Output a = lamina::testing_util::RunShell(run + " 2>&1");
  Output b = lamina::testing_util::RunShell(run + " 2>&1");
  ASSERT_EQ(a.code, 0) << a.out;
  ASSERT_FALSE(seed_of(a).empty()) << a.out;
  EXPECT_NE(seed_of(a), seed_of(b));
  // The printed seed repeats the run.
  const std::string seed = seed_of(a);
  Output x = Lamina("run -m " + kShipped + " -p hi -n 8 --temp 0.9 --json --seed " + seed);
  Output y = Lamina("run -m " + kShipped + " -p hi -n 8 --temp 0.9 --json -s " + seed);
  ASSERT_EQ(x.code, 0);
  const auto jx = nlohmann::json::parse(x.out);
  EXPECT_EQ(jx["generated_tokens"], nlohmann::json::parse(y.out)["generated_tokens"]);
  EXPECT_EQ(std::to_string(jx["seed"].get<uint64_t>()), seed);
  const std::string a_json = a.out.substr(a.out.find('{'));
  EXPECT_EQ(jx["generated_tokens"], nlohmann::json::parse(a_json)["generated_tokens"]);
  // Greedy decoding prints no seed.
  Output greedy = LaminaErr("run -m " + kShipped + " -p hi -n 4 --temp 0 --json");
  EXPECT_EQ(greedy.code, 0);
  EXPECT_TRUE(seed_of(greedy).empty()) << greedy.out;
}

TEST(CliConventions, BenchDefaultsToTheShippedModel) {
  Output o = Lamina("bench -p 8 -n 4 -r 1 --json");
  ASSERT_EQ(o.code, 0);
  const auto j = nlohmann::json::parse(o.out);
  EXPECT_GT(j["pp_tok_s"].get<double>(), 0.0);
  EXPECT_GT(j["tg_tok_s"].get<double>(), 0.0);
}

TEST(CliConventions, HelpIsGroupedWithDefaults) {
  Output run = Lamina("run --help");
  ASSERT_EQ(run.code, 0);
  for (const char* part :
       {"Model and context:", "KV cache:", "Prompt and output:", "Sampling:", "Chat template:",
        "Session:", "Constrained output:", "Speculative decoding:", "=0.8", "=128", "=f16"}) {
    EXPECT_TRUE(Has(run.out, part)) << part;
  }
  for (const char* cmd : {"chat", "score", "bench", "probe"}) {
    Output o = Lamina(std::string(cmd) + " --help");
    EXPECT_EQ(o.code, 0) << cmd;
    EXPECT_TRUE(Has(o.out, "Model and context:")) << cmd;
  }
  EXPECT_TRUE(Has(Lamina("chat --help").out, "=512")) << "chat's -n default";
}

}  // namespace

// Constrained output on the command line: the text follows the grammar or the schema; a
// malformed grammar or schema is one line naming its position, exit 2 as an option, 3 as a file.
TEST(Cli, GrammarAndJsonSchemaOptions) {
  if (!std::filesystem::exists(Stories())) GTEST_SKIP() << Stories() << " is absent";
  Output g = Lamina("run -m " + Stories() +
                    " -p \"Once upon a time\" -n 40 --temp 0 --json --grammar "
                    "'root ::= (\"yes\" | \"no\") \" \" [a-z]{2,5} \".\"'");
  ASSERT_EQ(g.code, 0) << g.out;
  const std::string text = nlohmann::json::parse(g.out)["text"];
  const std::regex want("(yes|no) [a-z]{2,5}[.]");
  const bool matches = std::regex_match(text, want);
  EXPECT_TRUE(matches) << text;
  const std::string schema_file = lamina::testing_util::UniqueTempPath("lamina_cli_schema.json");
  const lamina::testing_util::RemoveAtExit remove_schema_file(schema_file);
  std::ofstream(schema_file) << R"({"type":"object","properties":{"n":{"type":"integer"}},)"
                             << R"("required":["n"]})";
  Output s = Lamina("run -m " + Stories() + " -p \"Once\" -n 40 --temp 0 --json --json-schema " +
                    schema_file);
  ASSERT_EQ(s.code, 0) << s.out;
  const auto doc = nlohmann::json::parse(nlohmann::json::parse(s.out)["text"].get<std::string>());
  EXPECT_TRUE(doc["n"].is_number_integer()) << doc.dump();
  Output bad = lamina::testing_util::RunShell(kBinary + " run -m " + Stories() +
                                              " -p hi --grammar 'root ::= (\"a\"' 2>&1");
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.out.find("grammar: line 1, column 14: expected ')'"), std::string::npos) << bad.out;
  std::ofstream(schema_file) << R"({"type": "widget"})";
  Output bad_file = lamina::testing_util::RunShell(
      kBinary + " run -m " + Stories() + " -p hi --json-schema-file " + schema_file + " 2>&1");
  EXPECT_EQ(bad_file.code, 3);
  EXPECT_NE(bad_file.out.find("json_schema at /type: unsupported type \"widget\""),
            std::string::npos)
      << bad_file.out;
  EXPECT_EQ(Lamina("run -m " + Stories() + " -p hi --grammar 'root ::= \"a\"' -j '{}'").code, 2);
}

// `run --chat --json` splits the answer as the server's message does: `reasoning`, `content`
// and `tool_calls` beside the raw `text`, for a `<think>` block (written by the model, or opened
// by the prompt) and for harmony's channels and calls. A grammar makes each model write the
// answer under test.
struct ChatJsonCase {
  std::string name;
  std::string args;     // model, template and thinking options
  std::string grammar;  // the whole answer, as a GBNF string literal's contents
  std::string reasoning, content;
  std::vector<std::pair<std::string, std::string>> calls;  // name, arguments
};

TEST(RunChatJson, SplitsReasoningContentAndToolCalls) {
  const std::string dir = std::string(LAMINA_SOURCE_DIR);
  const std::string shipped = "-m " + dir + "/models/lamina-counter.gguf";
  const std::string think = "-m " + dir + "/models/lamina-counter-think.gguf --reasoning on";
  const std::string gptoss =
      "-m " + dir +
      "/tests/fixtures/models/synth-gpt-oss-d256.MXFP4_MOE.gguf --chat-template gpt-oss";
  const std::vector<ChatJsonCase> cases = {
      {"think block",
       shipped,
       R"(<think>\nsome reasoning\n</think>\n\nThe answer.)",
       "some reasoning",
       "The answer.",
       {}},
      {"no thinking", shipped, "Just 1 2 3.", "", "Just 1 2 3.", {}},
      {"prompt opens the block",
       think,
       R"(some reasoning\n</think>\n\nThe answer.)",
       "some reasoning",
       "The answer.",
       {}},
      {"harmony final",
       gptoss,
       "<|channel|>analysis<|message|>abc<|end|><|start|>assistant<|channel|>final<|message|>hi",
       "abc",
       "hi",
       {}},
      {"harmony call",
       gptoss,
       R"(<|channel|>analysis<|message|>abc<|end|><|start|>assistant<|channel|>commentary )"
       R"(to=functions.get json<|message|>{\"a\": 1}<|call|>)",
       "abc",
       "",
       {{"get", R"({"a": 1})"}}},
  };
  for (const ChatJsonCase& c : cases) {
    SCOPED_TRACE(c.name);
    const Output o = Lamina("run " + c.args + " --chat --json -n 400 --temp 0 -p hi --grammar " +
                            "'root ::= \"" + c.grammar + "\"'");
    ASSERT_EQ(o.code, 0) << o.out;
    const nlohmann::json j = nlohmann::json::parse(o.out);
    EXPECT_EQ(j["reasoning"], c.reasoning) << j["text"];
    EXPECT_EQ(j["content"], c.content) << j["text"];
    ASSERT_EQ(j["tool_calls"].size(), c.calls.size()) << j["text"];
    for (size_t k = 0; k < c.calls.size(); ++k) {
      EXPECT_EQ(j["tool_calls"][k]["type"], "function");
      EXPECT_EQ(j["tool_calls"][k]["function"]["name"], c.calls[k].first);
      EXPECT_EQ(j["tool_calls"][k]["function"]["arguments"], c.calls[k].second);
    }
  }
  // Without --chat the answer is a plain continuation: no split fields.
  const Output plain = Lamina("run " + shipped + " --json -n 2 --temp 0 -p hi");
  ASSERT_EQ(plain.code, 0);
  const nlohmann::json j = nlohmann::json::parse(plain.out);
  EXPECT_TRUE(j.contains("text"));
  EXPECT_FALSE(j.contains("content"));
  EXPECT_FALSE(j.contains("reasoning"));
}

// --roofline: the probe's figures per segment of 16 steps (20 steps: 16 + 4 per repetition), the
// exact bytes per token and the share, in JSON and as one table line; refused (usage) where there
// is no tg to measure.
TEST(Cli, BenchRoofline) {
  REQUIRE_SHARED();
  Output o = Lamina("bench -m " + Stories() + " -p 0 -n 20 -r 2 -t 1 --roofline --json");
  ASSERT_EQ(o.code, 0);
  const auto j = nlohmann::json::parse(o.out);
  const auto& r = j["roofline"];
  ASSERT_TRUE(r.is_object());
  EXPECT_EQ(r["segment_tokens"].get<int>(), 16);
  EXPECT_EQ(r["segment_steps"], nlohmann::json({16, 4, 16, 4}));
  EXPECT_EQ(r["segment_rep"], nlohmann::json({0, 0, 1, 1}));
  EXPECT_EQ(r["segment_seconds"].size(), 4u);
  EXPECT_EQ(r["bw_before_gbs"].size(), 4u);
  EXPECT_EQ(r["bw_after_gbs"].size(), 4u);
  // A segment's probe after is the next one's before, within a repetition.
  EXPECT_EQ(r["bw_after_gbs"][0], r["bw_before_gbs"][1]);
  EXPECT_EQ(r["shares"].size(), 4u);
  EXPECT_EQ(r["rep_shares"].size(), 2u);
  EXPECT_GE(r["probe_bytes"].get<double>(), 256.0 * 1024 * 1024);
  EXPECT_GT(r["measured_gbs"].get<double>(), 0.0);
  EXPECT_GT(r["achieved_gbs"].get<double>(), 0.0);
  EXPECT_GT(r["share"].get<double>(), 0.0);
  // The parts add up to bytes_per_token; at depth 0 the 20 steps read 1.5 + 20 / 2 cells on
  // average and write one.
  const double parts = r["weight_bytes"].get<double>() + r["embedding_row_bytes"].get<double>() +
                       r["kv_bytes"].get<double>() + r["state_bytes"].get<double>();
  EXPECT_DOUBLE_EQ(parts, j["bytes_per_token"].get<double>());
  EXPECT_GT(r["kv_bytes"].get<double>(), 0.0);
  Output t = Lamina("bench -m " + Stories() + " -p 0 -n 2 -r 1 -t 1 --roofline");
  ASSERT_EQ(t.code, 0);
  EXPECT_NE(t.out.find("roofline "), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("GB/s"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("share "), std::string::npos) << t.out;
  for (const char* bad : {" -n 0 --roofline", " -np 1,2 --roofline", " --spec off --roofline"}) {
    Output u = LaminaErr("bench -m " + Stories() + " -p 0 -r 1" + bad);
    EXPECT_EQ(u.code, 2) << bad;
    EXPECT_TRUE(Has(u.out, "--roofline")) << u.out;
  }
  // Without the flag there is no roofline object.
  Output plain = Lamina("bench -m " + Stories() + " -p 0 -n 2 -r 1 -t 1 --json");
  ASSERT_EQ(plain.code, 0);
  EXPECT_FALSE(nlohmann::json::parse(plain.out).contains("roofline"));
}
