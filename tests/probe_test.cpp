// `lamina probe` as a real process: healthy legs pass, the two planted faults (decode-path writes
// that never reach storage, a biased V quantizer) fail the divergence probe, probes a model cannot
// do are n/a rather than failures (the thinking probe on a model that does not think), the
// shipped model's thinking probe passes its healthy legs, usage errors exit 2, and the HTML report
// renders in headless Chromium.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "process_util.h"

namespace {

namespace fs = std::filesystem;

const std::string kShared = LAMINA_SHARED_DIR;
const std::string kBinary = LAMINA_BINARY;

using Output = lamina::testing_util::ProcessOutput;

Output Shell(const std::string& cmd) { return lamina::testing_util::RunShell(cmd); }

Output Lamina(const std::string& args) { return Shell(kBinary + " " + args + " 2>/dev/null"); }

std::string Model(const char* name) { return kShared + "/models/" + name; }

std::string TempDir(const std::string& name) {
  const fs::path dir =
      fs::temp_directory_path() / ("lamina_probe_test_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

nlohmann::json ReadJson(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

#define REQUIRE_MODEL(name) \
  if (!fs::exists(Model(name))) GTEST_SKIP() << Model(name) << " is absent"

const nlohmann::json& Probe(const nlohmann::json& report, int leg, const char* probe) {
  return report["legs"][leg]["probes"][probe];
}

// Runs the counting and divergence probes over the legs `kv` with skipped decode writes planted
// in leg `skip_leg` and a biased V quantizer in leg `biased_leg`; a planted fault must make the
// run exit 1. Returns DIR/probe.json.
nlohmann::json ProbeWithFaults(const std::string& model_path, const std::string& kv, int count_to,
                               int ctx, int skip_leg, int biased_leg, const std::string& dir) {
  Output o = Lamina("probe -m " + model_path + " --kv " + kv +
                    " --probes counting,divergence --count-to " + std::to_string(count_to) +
                    " --ctx " + std::to_string(ctx) +
                    " --divergence-tokens 256 --free-run-tokens 32 -t 2 --inject-fault " +
                    std::to_string(skip_leg) + ":skip-decode-writes --inject-fault " +
                    std::to_string(biased_leg) + ":biased-v --out " + dir);
  EXPECT_EQ(o.code, 1) << o.out;
  return ReadJson(dir + "/probe.json");
}

// Runs legs f32 + three of `mode`, faults planted in legs 3 and 4, and checks the verdicts.
void ExpectFaultsCaught(const char* model, const std::string& kv, const std::string& tag) {
  const std::string dir = TempDir(tag);
  const nlohmann::json r = ProbeWithFaults(Model(model), kv, 20, 320, 3, 4, dir);
  ASSERT_EQ(r["legs"].size(), 5u);
  for (int leg : {0, 1, 2}) {
    EXPECT_EQ(r["legs"][leg]["verdict"], "pass") << r["legs"][leg]["verdict_line"];
    EXPECT_EQ(Probe(r, leg, "divergence")["status"], "pass") << r["legs"][leg]["verdict_line"];
  }
  // Healthy quantized legs stay far below the limits, the faulty ones far above.
  const double healthy_kl = Probe(r, 2, "divergence")["kl_mean"];
  EXPECT_LT(healthy_kl, 0.02);
  EXPECT_EQ(Probe(r, 2, "divergence")["path_max_abs_diff"].get<double>(), 0.0);

  // Skipped decode writes: the decode path no longer matches the prompt path, KL explodes, and
  // the decode-written cells read back as nothing (relative error 1) while prompt cells are fine.
  const nlohmann::json& skip = Probe(r, 3, "divergence");
  EXPECT_EQ(skip["status"], "fail");
  EXPECT_FALSE(skip["path_first_mismatch"].is_null());
  EXPECT_GT(skip["kl_mean"].get<double>(), 20 * healthy_kl);
  EXPECT_NE(skip["reason"].get<std::string>().find("decode path differs"), std::string::npos);
  EXPECT_NEAR(skip["layers"][0]["v"]["rel_rms_decode_cells"].get<double>(), 1.0, 1e-6);
  EXPECT_LT(skip["layers"][0]["v"]["rel_rms_prompt_cells"].get<double>(), 0.2);
  EXPECT_EQ(r["legs"][3]["verdict"], "fail");

  // Biased V: both write paths agree (one writer), but V carries a systematic offset.
  const nlohmann::json& biased = Probe(r, 4, "divergence");
  EXPECT_EQ(biased["status"], "fail");
  EXPECT_EQ(biased["path_max_abs_diff"].get<double>(), 0.0);
  EXPECT_GT(biased["kl_mean"].get<double>(), 10 * healthy_kl);
  EXPECT_GT(biased["layers"][0]["v"]["bias_rel"].get<double>(), 0.1);
  EXPECT_LT(std::abs(Probe(r, 2, "divergence")["layers"][0]["v"]["bias_rel"].get<double>()), 0.01);
  EXPECT_NE(biased["reason"].get<std::string>().find("V bias"), std::string::npos);
  EXPECT_EQ(r["legs"][4]["verdict"], "fail");

  // These models cannot count: the reference fails, so counting is n/a for every leg.
  for (int leg = 0; leg < 5; ++leg) {
    const nlohmann::json& c = Probe(r, leg, "counting");
    EXPECT_EQ(c["status"], "n/a");
    EXPECT_EQ(c["reason"], "model cannot count: reference leg fails too");
    EXPECT_TRUE(c["first_40"].is_array());
  }
  fs::remove_all(dir);
}

TEST(Probe, FaultsFailDivergenceWhileHealthyLegsPassOnStories260K) {
  REQUIRE_MODEL("stories260K.gguf");
  ExpectFaultsCaught("stories260K.gguf", "f32,int8,k8v4,k8v4,k8v4", "stories");
}

TEST(Probe, FaultsFailDivergenceWhileHealthyLegsPassOnSynthLlamaKq) {
  REQUIRE_MODEL("synth-llama-kq.F32.gguf");
  ExpectFaultsCaught("synth-llama-kq.F32.gguf", "f32,f16,int8,int8,int8", "kq");
}

// The shipped model can count, so the planted faults must show where users saw the real bug: in
// the numbers it prints (skipped decode writes), or at least in the divergence (biased V), while
// the healthy quantized leg counts like the reference.
TEST(Probe, FaultsFailCountingOnTheShippedModel) {
  const std::string model = std::string(LAMINA_SOURCE_DIR) + "/models/lamina-counter.gguf";
  if (!fs::exists(model)) GTEST_SKIP() << "no shipped model yet (" << model << ")";
  const std::string dir = TempDir("shipped");
  const nlohmann::json r = ProbeWithFaults(model, "f16,int8,int8,int8", 45, 512, 2, 3, dir);
  ASSERT_EQ(r["legs"].size(), 4u);
  for (int leg : {0, 1}) {
    EXPECT_EQ(Probe(r, leg, "counting")["status"], "pass") << r["legs"][leg]["verdict_line"];
    EXPECT_EQ(r["legs"][leg]["verdict"], "pass") << r["legs"][leg]["verdict_line"];
  }
  const nlohmann::json& skip = Probe(r, 2, "counting");
  EXPECT_EQ(skip["status"], "fail") << skip.dump();
  EXPECT_FALSE(skip["sequence_ok"].get<bool>());
  EXPECT_EQ(r["legs"][2]["verdict"], "fail");
  EXPECT_EQ(r["legs"][3]["verdict"], "fail") << r["legs"][3]["verdict_line"];
  fs::remove_all(dir);
}

// Speculative legs (--spec) A/B like KV modes: healthy prompt-lookup and draft-model legs count,
// copy and write JSON like the plain reference; a draft leg whose verify windows never reach
// storage (the seed engine's bug) fails counting.
TEST(Probe, SpeculativeLegsPassAndASkippedVerifyWriteFails) {
  const std::string model = std::string(LAMINA_SOURCE_DIR) + "/models/lamina-counter.gguf";
  if (!fs::exists(model)) GTEST_SKIP() << "no shipped model (" << model << ")";
  Output o = Lamina("probe -m " + model + " --kv f16,k8v4 --spec off,lookup,draft -md " + model +
                    " --kv-draft q4_0 --probes counting,copy --count-to 60 -t 2 --inject-fault "
                    "5:skip-verify-writes");
  EXPECT_EQ(o.code, 1) << o.out;
  for (const char* line :
       {"leg 0 f16 (reference): PASS", "leg 1 f16+lookup: PASS", "leg 2 f16+draft: PASS",
        "leg 3 k8v4/rtn: PASS", "leg 4 k8v4/rtn+lookup: PASS",
        "leg 5 k8v4/rtn+draft+skip-verify-writes: FAIL"}) {
    EXPECT_NE(o.out.find(line), std::string::npos) << line << "\n" << o.out;
  }
}

// The session's other planted faults: a lossy leg whose decoded cells keep only their exact copy
// in the recent window (they read as nothing once they leave it) fails divergence, and a
// speculative leg whose Truncate keeps the rejected drafts fails counting.
TEST(Probe, AWindowNeverEncodedAndASkippedTruncateFail) {
  const std::string model = std::string(LAMINA_SOURCE_DIR) + "/models/lamina-counter.gguf";
  if (!fs::exists(model)) GTEST_SKIP() << "no shipped model (" << model << ")";
  const std::string dir = TempDir("session_faults");
  Output o = Lamina("probe -m " + model +
                    " --kv f16,int8 --spec off,lookup --probes counting,divergence --count-to 45"
                    " --ctx 512 --divergence-tokens 256 --free-run-tokens 32 -t 2"
                    " --inject-fault 2:skip-window-encode --inject-fault 3:skip-truncate --out " +
                    dir);
  EXPECT_EQ(o.code, 1) << o.out;
  const nlohmann::json r = ReadJson(dir + "/probe.json");
  ASSERT_EQ(r["legs"].size(), 4u);
  for (int leg : {0, 1}) {
    EXPECT_EQ(r["legs"][leg]["verdict"], "pass") << r["legs"][leg]["verdict_line"];
  }
  const nlohmann::json& window = Probe(r, 2, "divergence");
  EXPECT_EQ(window["status"], "fail") << window.dump();
  EXPECT_FALSE(window["path_first_mismatch"].is_null());
  EXPECT_NE(window["reason"].get<std::string>().find("decode path differs"), std::string::npos);
  EXPECT_EQ(Probe(r, 3, "counting")["status"], "fail") << r["legs"][3]["verdict_line"];
  EXPECT_EQ(r["legs"][3]["verdict"], "fail");
  fs::remove_all(dir);
}

// The constrained-JSON probe: every leg's output is schema-valid (the grammar guarantees it),
// the healthy legs hold the values asked for as the reference does, and a leg whose decode
// writes never reach storage gets wrong values although its output is still schema-valid.
TEST(Probe, SchemaProbeIsValidEverywhereAndCatchesAFault) {
  const std::string model = std::string(LAMINA_SOURCE_DIR) + "/models/lamina-counter.gguf";
  if (!fs::exists(model)) GTEST_SKIP() << "no shipped model (" << model << ")";
  const std::string dir = TempDir("schema");
  Output o = Lamina("probe -m " + model +
                    " --kv f16,int8,k8v4,q4_0,int8 --probes json,schema -t 2 --inject-fault "
                    "4:skip-decode-writes --out " +
                    dir);
  EXPECT_EQ(o.code, 1) << o.out;
  const nlohmann::json r = ReadJson(dir + "/probe.json");
  ASSERT_EQ(r["legs"].size(), 5u);
  for (int leg = 0; leg < 5; ++leg) {
    const nlohmann::json& p = Probe(r, leg, "schema");
    EXPECT_EQ(p["valid_rate"].get<double>(), 1.0) << p.dump();
    for (const auto& item : p["items"]) {
      const auto doc = nlohmann::ordered_json::parse(item["output"].get<std::string>());
      ASSERT_EQ(doc.size(), 3u) << item.dump();
      EXPECT_TRUE(doc["name"].is_string() && doc["age"].is_number_integer() &&
                  doc["city"].is_string())
          << item.dump();
    }
  }
  EXPECT_EQ(Probe(r, 0, "schema")["exact_rate"].get<double>(), 1.0);
  for (int leg : {1, 2, 3}) {
    EXPECT_EQ(Probe(r, leg, "schema")["status"], "pass") << r["legs"][leg]["verdict_line"];
  }
  EXPECT_EQ(Probe(r, 4, "schema")["status"], "fail") << r["legs"][4]["verdict_line"];
  const std::string html = Shell("cat " + dir + "/report.html").out;
  EXPECT_NE(html.find("Constrained JSON outputs"), std::string::npos);
  fs::remove_all(dir);
}

// The thinking probe: the shipped thinking model (lamina-counter-think.gguf), asked with thinking
// on, writes its plan ("I count from
// 1 to N ..."), closes the block and answers exactly in every healthy leg, byte for byte like the
// reference; a leg whose decoded cells are never encoded (they read as nothing once they leave
// the recent window) and one whose decode writes never reach storage lose answers and fail it.
TEST(Probe, ThinkingProbePassesOnTheShippedModelAndFaultsFailIt) {
  const std::string model = std::string(LAMINA_SOURCE_DIR) + "/models/lamina-counter-think.gguf";
  if (!fs::exists(model)) GTEST_SKIP() << "no thinking model (" << model << ")";
  const std::string dir = TempDir("thinking");
  Output o = Lamina("probe -m " + model +
                    " --kv f16,int8,k8v4,int8,int8 --probes thinking --count-to 30 --ctx 512 -t 2"
                    " --inject-fault 3:skip-window-encode --inject-fault 4:skip-decode-writes"
                    " --out " +
                    dir);
  EXPECT_EQ(o.code, 1) << o.out;
  const nlohmann::json r = ReadJson(dir + "/probe.json");
  ASSERT_EQ(r["legs"].size(), 5u);
  for (int leg : {0, 1, 2}) {
    const nlohmann::json& p = Probe(r, leg, "thinking");
    EXPECT_EQ(p["status"], "pass") << r["legs"][leg]["verdict_line"];
    EXPECT_EQ(p["right"], 3) << p.dump();
    EXPECT_TRUE(p["identical"].get<bool>()) << p.dump();
    ASSERT_EQ(p["items"].size(), 3u);
    EXPECT_EQ(p["items"][0]["thought"], "I count from 1 to 30 and stop at 30.") << p.dump();
    EXPECT_EQ(p["items"][1]["thought"], "I count down from 15 to 1 and stop at 1.") << p.dump();
    for (const auto& item : p["items"]) {
      EXPECT_TRUE(item["closed"].get<bool>()) << item.dump();
      EXPECT_TRUE(item["right"].get<bool>()) << item.dump();
      EXPECT_NE(item["output"].get<std::string>().find("</think>"), std::string::npos);
    }
  }
  for (int leg : {3, 4}) {
    const nlohmann::json& faulty = Probe(r, leg, "thinking");
    EXPECT_EQ(faulty["status"], "fail") << faulty.dump();
    EXPECT_LT(faulty["right"].get<int>(), 3);
    EXPECT_FALSE(faulty["identical"].get<bool>());
    EXPECT_NE(faulty["reason"].get<std::string>().find("first miss: "), std::string::npos);
    EXPECT_EQ(r["legs"][leg]["verdict"], "fail");
  }
  EXPECT_EQ(Probe(r, 4, "thinking")["closed"], 0);
  const std::string html = Shell("cat " + dir + "/report.html").out;
  EXPECT_NE(html.find("I count from 1 to 30 and stop at 30."), std::string::npos);
  fs::remove_all(dir);
}

// A model that does not think never closes a thought: the thinking probe is n/a, not a failure.
TEST(Probe, ThinkingProbeIsNotApplicableWithoutThinking) {
  REQUIRE_MODEL("stories260K.gguf");
  const std::string dir = TempDir("no_thinking");
  Output o = Lamina("probe -m " + Model("stories260K.gguf") +
                    " --kv f32,int8 --probes thinking --count-to 8 --ctx 256 -t 2 --out " + dir);
  EXPECT_EQ(o.code, 0) << o.out;
  const nlohmann::json r = ReadJson(dir + "/probe.json");
  ASSERT_EQ(r["legs"].size(), 2u);
  for (int leg : {0, 1}) {
    const nlohmann::json& p = Probe(r, leg, "thinking");
    EXPECT_EQ(p["status"], "n/a") << p.dump();
    EXPECT_EQ(p["reason"], "the model does not think: no </think> in the reference's answers");
    EXPECT_EQ(p["closed"], 0);
  }
  fs::remove_all(dir);
}

TEST(Probe, HealthyLegsExitZeroAndPrintOneRowPerLeg) {
  REQUIRE_MODEL("stories260K.gguf");
  Output o =
      Lamina("probe -m " + Model("stories260K.gguf") +
             " --kv int8,k8v4 --kv-v-round rtn,stochastic --probes prefill,divergence --ctx 256"
             " --divergence-tokens 128 --free-run-tokens 16 -t 2");
  EXPECT_EQ(o.code, 0) << o.out;
  // f32 reference prepended, each quantized mode crossed with both roundings.
  for (const char* leg :
       {"f32 (ref)", "int8/rtn", "int8/stochastic", "k8v4/rtn", "k8v4/stochastic"}) {
    EXPECT_NE(o.out.find(leg), std::string::npos) << leg << "\n" << o.out;
  }
  EXPECT_NE(o.out.find("leg 4 k8v4/stochastic: PASS"), std::string::npos) << o.out;
}

// The KL split by position (quarters of the text) and by distance (the same mode with several
// recent exact windows side by side): printed, and each leg's window in probe.json.
TEST(Probe, KlByPositionAndDistanceTables) {
  REQUIRE_MODEL("stories260K.gguf");
  const std::string dir = TempDir("distance");
  Output o = Lamina("probe -m " + Model("stories260K.gguf") +
                    " --kv k8v4 --kv-window 0,16 --probes divergence --ctx 256"
                    " --divergence-tokens 200 --free-run-tokens 8 -t 2 --out " +
                    dir);
  EXPECT_EQ(o.code, 0) << o.out;
  EXPECT_NE(o.out.find("mean KL by position"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("pos 0-49"), std::string::npos) << o.out;
  const size_t d = o.out.find("mean KL by distance");
  ASSERT_NE(d, std::string::npos) << o.out;
  EXPECT_NE(o.out.find("R = 0", d), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("k8v4/rtn ", d), std::string::npos) << o.out;
  const nlohmann::json r = ReadJson(dir + "/probe.json");
  ASSERT_EQ(r["legs"].size(), 3u);
  EXPECT_EQ(r["legs"][1]["kv_window"], 0);
  EXPECT_EQ(r["legs"][2]["kv_window"], 16);
  // The recent cells are the sensitive ones: 16 exact cells lower the KL.
  EXPECT_LT(Probe(r, 2, "divergence")["kl_mean"].get<double>(),
            Probe(r, 1, "divergence")["kl_mean"].get<double>());
  fs::remove_all(dir);
}

TEST(Probe, BadUsageExitsTwo) {
  REQUIRE_MODEL("stories260K.gguf");
  const std::string m = " -m " + Model("stories260K.gguf");
  EXPECT_EQ(Lamina("probe" + m + " --kv int9").code, 2);
  EXPECT_EQ(Lamina("probe" + m + " --probes counting,telepathy").code, 2);
  EXPECT_EQ(Lamina("probe" + m + " --kv-v-round sideways").code, 2);
  EXPECT_EQ(Lamina("probe" + m + " --needle-depths 10,x").code, 2);
  EXPECT_EQ(Lamina("probe" + m + " --kv int8 --inject-fault 7:biased-v").code, 2);
  EXPECT_EQ(Lamina("probe" + m + " --kv int8 --inject-fault 1:gremlins").code, 2);
  // No -m and no shipped model next to the build or in the working directory.
  if (!fs::exists(fs::path(kBinary).parent_path() / ".." / ".." / "models") &&
      !fs::exists(fs::path(kBinary).parent_path() / ".." / "models")) {
    EXPECT_EQ(Shell("cd " + fs::temp_directory_path().string() + " && " + kBinary +
                    " probe --kv int8 2>/dev/null")
                  .code,
              2);
  }
}

std::string FindChromium() {
  for (const char* name : {"chromium", "chromium-browser", "google-chrome"}) {
    if (Shell(std::string("command -v ") + name + " >/dev/null 2>&1").code == 0) return name;
  }
  return "";
}

TEST(Probe, HtmlReportRendersInHeadlessChromium) {
  REQUIRE_MODEL("stories260K.gguf");
  const std::string chromium = FindChromium();
  if (chromium.empty()) GTEST_SKIP() << "chromium is not installed (apt-get install chromium)";
  const std::string dir = TempDir("html");
  Output o = Lamina("probe -m " + Model("stories260K.gguf") +
                    " --kv f32,int8,k8v4 --ctx 320 --needle-lengths 96,160 --needle-depths 10,50,90"
                    " --count-to 12 --divergence-tokens 128 --free-run-tokens 16 -t 2 --out " +
                    dir);
  ASSERT_TRUE(o.code == 0 || o.code == 1) << o.out;
  ASSERT_TRUE(fs::exists(dir + "/report.html"));
  const nlohmann::json r = ReadJson(dir + "/probe.json");
  EXPECT_EQ(Probe(r, 1, "needle")["grid"].size(), 6u);

  const std::string profile = dir + "/profile";
  Output dom = Shell("timeout 120 " + chromium +
                     " --headless --no-sandbox --disable-gpu --disable-background-networking"
                     " --disable-component-update --disable-sync --no-first-run --user-data-dir=" +
                     profile + " --dump-dom file://" + dir + "/report.html 2>/dev/null");
  ASSERT_EQ(dom.code, 0);
  auto count = [&](const std::string& what) {
    size_t n = 0;
    for (size_t at = dom.out.find(what); at != std::string::npos; at = dom.out.find(what, at + 1))
      ++n;
    return n;
  };
  EXPECT_EQ(count("id=\"kl-chart\""), 1u);
  EXPECT_EQ(count("class=\"kl-line\""), 2u);      // one line per non-reference leg
  EXPECT_EQ(count("class=\"needle-grid\""), 3u);  // one heatmap per leg
  EXPECT_EQ(count("class=\"layer-bars\""), 2u);   // one bar chart per non-reference leg
  EXPECT_GE(count("<svg"), 6u);
  EXPECT_NE(dom.out.find("<table class=\"counting\""), std::string::npos);
  // Self-contained: nothing is fetched from anywhere.
  std::ifstream in(dir + "/report.html");
  std::stringstream html;
  html << in.rdbuf();
  EXPECT_EQ(html.str().find("<script"), std::string::npos);
  EXPECT_EQ(html.str().find("src=\""), std::string::npos);
  EXPECT_EQ(html.str().find("href=\""), std::string::npos);
  fs::remove_all(dir);
}

}  // namespace
