// `lamina probe`: A/B the KV cache modes the way users meet them. Each leg (KV mode, V rounding)
// runs every probe in fresh sessions; the first leg is the reference. With --url the one leg is
// an OpenAI-compatible server. Prints a table and a verdict per leg, and writes probe.json and a
// self-contained report.html (views of src/probe's typed results).
#include "cli_probe.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "cli_common.h"
#include "cli_spec.h"
#include "probe/faults.h"
#include "probe/local_backend.h"
#include "probe/probe.h"

namespace lamina::cli {

namespace {

using nlohmann::json;

std::vector<std::string> SplitList(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

bool ParseIntList(const std::string& s, const char* flag, int lo, int hi, std::vector<int>* out) {
  out->clear();
  for (const std::string& item : SplitList(s)) {
    char* end = nullptr;
    const long v = std::strtol(item.c_str(), &end, 10);
    if (end == item.c_str() || *end != '\0' || v < lo || v > hi) {
      std::fprintf(stderr, "lamina: %s: \"%s\" is not an integer in [%d, %d]\n", flag, item.c_str(),
                   lo, hi);
      return false;
    }
    out->push_back(static_cast<int>(v));
  }
  if (out->empty()) {
    std::fprintf(stderr, "lamina: %s needs at least one value\n", flag);
    return false;
  }
  return true;
}

bool IsQuantized(KvType t) { return KvModeOf(t).quantized; }

// A local leg before its backend exists.
struct LegSpec {
  KvType kv = KvType::kF32;
  KvRounding v_round = KvRounding::kNearest;
  int window = kKvWindowModeDefault;         // --kv-window
  probe::Fault fault = probe::Fault::kNone;  // test-only (--inject-fault)
  std::string spec = "off";                  // speculative decoding: off, lookup, draft, mtp
  std::string name;                          // "k8v4/rtn", "f16+lookup"
};

// Prints the table, writes DIR/probe.json and DIR/report.html; the exit code.
int Finish(const probe::ProbeReport& report, const std::string& out_dir) {
  std::printf("%s", probe_view::ProbeTable(report).c_str());
  if (!out_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(out_dir, ec);
    const std::string json_path = out_dir + "/probe.json";
    const std::string html_path = out_dir + "/report.html";
    std::ofstream jf(json_path), hf(html_path);
    jf << probe_view::ProbeJson(report).dump(2, ' ', false, json::error_handler_t::replace) << "\n";
    hf << probe_view::RenderHtmlReport(report);
    if (!jf || !hf) {
      std::fprintf(stderr, "lamina: --out: cannot write %s\n", out_dir.c_str());
      return kExitFailure;
    }
    std::fprintf(stderr, "lamina: wrote %s and %s\n", json_path.c_str(), html_path.c_str());
  }
  return report.pass ? kExitOk : kExitFailure;
}

// --url: the one leg is the server.
int RunRemoteProbe(const ProbeOptions& o, const probe::ProbeConfig& config) {
  const ProbeOptions defaults;
  if (!o.inject_faults.empty() || o.kv != defaults.kv || o.kv_v_round != defaults.kv_v_round) {
    std::fprintf(stderr,
                 "lamina: --kv, --kv-v-round and --inject-fault do not apply with --url (the "
                 "server's KV cache is its own)\n");
    return kExitUsage;
  }
  if (o.url.rfind("http://", 0) != 0 && o.url.rfind("https://", 0) != 0) {
    std::fprintf(stderr, "lamina: --url: \"%s\" is not an http:// or https:// URL\n",
                 o.url.c_str());
    return kExitUsage;
  }
  RemoteOptions ro;
  ro.url = o.url;
  ro.api_key = o.api_key;
  ro.model = o.model_path;  // with --url, -m/--model names the server's model
  Result<RemoteServer> server = ConnectRemote(ro);
  if (!server.ok()) {
    std::fprintf(stderr, "lamina: --url: %s\n", server.error().message.c_str());
    return kExitFailure;
  }
  std::vector<probe::Leg> legs(1);
  legs[0].name = server->model.empty() ? o.url : server->model + "@" + o.url;
  legs[0].backend = std::move(server->backend);
  probe::ProbeReport report = probe::RunProbe(config, legs);
  report.model = o.url;
  report.arch = "remote";
  report.chat_template = "server";
  return Finish(report, o.out_dir);
}

}  // namespace

namespace probe_view {

namespace {
std::string Sci(double x) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2g", x);
  return buf;
}

bool MeasuredLeg(const probe::LegReport& leg) {
  return !leg.reference && leg.divergence && leg.divergence->measured;
}

// Rows as aligned text columns.
std::string AlignRows(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width;
  for (const auto& row : rows) {
    if (width.size() < row.size()) width.resize(row.size(), 0);
    for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  }
  std::string out;
  for (const auto& row : rows) {
    for (size_t c = 0; c < row.size(); ++c) {
      out += row[c] + (c + 1 < row.size() ? std::string(width[c] - row[c].size() + 2, ' ') : "");
    }
    out += "\n";
  }
  return out;
}
}  // namespace

std::vector<std::vector<std::string>> KlByPositionRows(const probe::ProbeReport& report) {
  std::vector<std::vector<std::string>> rows;
  for (const probe::LegReport& leg : report.legs) {
    if (!MeasuredLeg(leg) || leg.divergence->buckets.empty()) continue;
    if (rows.empty()) {
      std::vector<std::string> header = {"leg"};
      for (const probe::KlBucket& b : leg.divergence->buckets) {
        header.push_back("pos " + std::to_string(b.from) + "-" + std::to_string(b.to - 1));
      }
      header.push_back("all");
      rows.push_back(header);
    }
    std::vector<std::string> row = {leg.name};
    for (const probe::KlBucket& b : leg.divergence->buckets) row.push_back(Sci(b.mean_kl));
    row.push_back(Sci(leg.divergence->kl_mean));
    rows.push_back(row);
  }
  return rows;
}

std::vector<std::vector<std::string>> KlByDistanceRows(const probe::ProbeReport& report) {
  // Group key: the leg's name without its "/wR" part (mode, rounding, fault, speculation).
  auto key_of = [](const std::string& name) {
    const size_t w = name.find("/w");
    if (w == std::string::npos) return name;
    size_t end = w + 2;
    while (end < name.size() && std::isdigit(static_cast<unsigned char>(name[end]))) ++end;
    return name.substr(0, w) + name.substr(end);
  };
  std::vector<std::string> keys;
  std::map<std::string, std::map<int, double>> kl;  // key -> window -> mean KL
  std::set<int> windows;
  for (const probe::LegReport& leg : report.legs) {
    if (!MeasuredLeg(leg) || !leg.kv_window) continue;
    const std::string key = key_of(leg.name);
    if (!kl.count(key)) keys.push_back(key);
    kl[key][*leg.kv_window] = leg.divergence->kl_mean;
    windows.insert(*leg.kv_window);
  }
  std::vector<std::vector<std::string>> rows;
  for (const std::string& key : keys) {
    const std::map<int, double>& by_window = kl[key];
    if (by_window.size() < 2) continue;
    if (rows.empty()) {
      std::vector<std::string> header = {"mode"};
      for (int w : windows) header.push_back("R = " + std::to_string(w));
      rows.push_back(header);
    }
    std::vector<std::string> row = {key};
    const auto none = by_window.find(0);
    for (int w : windows) {
      const auto it = by_window.find(w);
      if (it == by_window.end()) {
        row.push_back("");
        continue;
      }
      std::string cell = Sci(it->second);
      if (w != 0 && none != by_window.end() && none->second > 0.0) {
        char pct[32];
        std::snprintf(pct, sizeof(pct), " (%.0f%%)", 100.0 * it->second / none->second);
        cell += pct;
      }
      row.push_back(cell);
    }
    rows.push_back(row);
  }
  return rows;
}

std::string ProbeTable(const probe::ProbeReport& report) {
  // The table cell of one probe: status mark, then the probe's own summary.
  auto cell_text = [](const probe::Outcome* o) -> std::string {
    if (o == nullptr) return "";
    switch (o->status) {
      case probe::Status::kPass:
        return "PASS " + o->cell;
      case probe::Status::kFail:
        return "FAIL " + o->cell;
      case probe::Status::kNotApplicable:
        return "n/a (" + o->cell + ")";
      case probe::Status::kInfo:
        return o->cell;
    }
    return o->cell;
  };
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> header = {"leg", "kv / v-round"};
  for (probe::ProbeKind p : report.probes) header.push_back(probe::ProbeName(p));
  header.push_back("verdict");
  rows.push_back(header);
  for (const probe::LegReport& leg : report.legs) {
    std::vector<std::string> row = {std::to_string(leg.index),
                                    leg.name + (leg.reference ? " (ref)" : "")};
    for (probe::ProbeKind p : report.probes) row.push_back(cell_text(leg.outcome(p)));
    row.push_back(leg.pass ? "PASS" : "FAIL");
    rows.push_back(row);
  }
  std::vector<size_t> width(header.size(), 0);
  for (const auto& row : rows) {
    for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  }
  std::string out;
  for (const auto& row : rows) {
    for (size_t c = 0; c < row.size(); ++c) {
      out += row[c] + std::string(width[c] - row[c].size(), ' ') + (c + 1 < row.size() ? "  " : "");
    }
    out += "\n";
  }
  out += "\n";
  for (const probe::LegReport& leg : report.legs) out += leg.verdict_line + "\n";
  const std::vector<std::vector<std::string>> by_position = KlByPositionRows(report);
  if (!by_position.empty()) {
    out += "\nmean KL by position (quarters of the text):\n" + AlignRows(by_position);
  }
  const std::vector<std::vector<std::string>> by_distance = KlByDistanceRows(report);
  if (!by_distance.empty()) {
    out +=
        "\nmean KL by distance: the R most recent cells exact, older cells compressed "
        "(in brackets: share of the R = 0 KL left):\n" +
        AlignRows(by_distance);
  }
  return out;
}

}  // namespace probe_view

namespace {

// The KV modes, V roundings and windows the legs are made of; an exit code.
int ParseKvLists(const ProbeOptions& o, std::vector<KvType>* kvs, std::vector<KvRounding>* rounds,
                 std::vector<int>* windows) {
  for (const std::string& name : SplitList(o.kv)) {
    Result<KvType> t = ParseKvType(name);
    if (!t.ok()) {
      std::fprintf(stderr, "lamina: --kv: %s\n", t.error().message.c_str());
      return kExitUsage;
    }
    kvs->push_back(*t);
  }
  for (const std::string& name : SplitList(o.kv_v_round)) {
    Result<KvRounding> r = ParseKvRounding(name);
    if (!r.ok()) {
      std::fprintf(stderr, "lamina: --kv-v-round: %s\n", r.error().message.c_str());
      return kExitUsage;
    }
    rounds->push_back(*r);
  }
  // Windows crossed with the lossy legs; empty: each mode's default.
  if (!o.kv_window.empty() && !ParseIntList(o.kv_window, "--kv-window", 0, 1 << 20, windows)) {
    return kExitUsage;
  }
  if (windows->empty()) windows->push_back(kKvWindowModeDefault);
  if (kvs->empty() || rounds->empty()) {
    std::fprintf(stderr, "lamina: --kv and --kv-v-round need at least one value\n");
    return kExitUsage;
  }
  return kExitOk;
}

// The probes to run and their sizes from the options; an exit code.
int ParseProbeConfig(const ProbeOptions& o, probe::ProbeConfig* config) {
  const std::vector<std::string> probe_list = SplitList(o.probes);
  const std::set<std::string> requested(probe_list.begin(), probe_list.end());
  for (const std::string& name : requested) {
    probe::ProbeKind kind;
    if (!probe::ParseProbeName(name, &kind)) {
      std::fprintf(stderr,
                   "lamina: --probes: unknown probe \"%s\" (expected prefill, counting, needle, "
                   "json, schema, copy, thinking, divergence)\n",
                   name.c_str());
      return kExitUsage;
    }
  }
  for (probe::ProbeKind kind : probe::kAllProbes) {
    if (requested.count(probe::ProbeName(kind))) config->probes.push_back(kind);
  }
  if (config->probes.empty()) {
    std::fprintf(stderr, "lamina: --probes needs at least one probe\n");
    return kExitUsage;
  }
  if (!ParseIntList(o.needle_depths, "--needle-depths", 0, 100, &config->needle_depths) ||
      !ParseIntList(o.needle_lengths, "--needle-lengths", 16, 1 << 20, &config->needle_lengths)) {
    return kExitUsage;
  }
  if (o.n_ctx < 64 || o.count_to < 1 || o.divergence_tokens < 8 || o.free_run_tokens < 0 ||
      o.n_threads < 0) {
    std::fprintf(stderr,
                 "lamina: --ctx must be >= 64, --count-to >= 1, --divergence-tokens >= 8\n");
    return kExitUsage;
  }
  if (!o.text_file.empty()) {
    std::string text, err;
    if (!ReadTextFile(o.text_file, &text, &err)) {
      std::fprintf(stderr, "lamina: --text: %s\n", err.c_str());
      return kExitBadInput;
    }
    config->text = text;
  }
  config->n_ctx = o.n_ctx;
  config->count_to = o.count_to;
  config->divergence_tokens = o.divergence_tokens;
  config->free_run_tokens = o.free_run_tokens;
  config->seed = o.seed;
  config->progress = [](const std::string& line) {
    std::fprintf(stderr, "lamina: %s\n", line.c_str());
  };
  return kExitOk;
}

// The KV legs: f32 reference unless the list starts with an exact-enough mode; quantized modes
// are crossed with every V rounding.
std::vector<LegSpec> KvLegs(std::vector<KvType> kvs, const std::vector<KvRounding>& rounds,
                            const std::vector<int>& windows) {
  std::vector<LegSpec> specs;
  if (IsQuantized(kvs.front())) {
    kvs.insert(kvs.begin(), KvType::kF32);
  }
  for (KvType kv : kvs) {
    const std::vector<KvRounding> rs =
        IsQuantized(kv) ? rounds : std::vector<KvRounding>{KvRounding::kNearest};
    const std::vector<int> ws = IsQuantized(kv) ? windows : std::vector<int>{0};
    for (KvRounding r : rs) {
      for (int w : ws) {
        LegSpec leg;
        leg.kv = kv;
        leg.v_round = r;
        leg.window = w;
        leg.name = std::string(KvTypeName(kv)) +
                   (IsQuantized(kv) ? std::string("/") + KvRoundingName(r) : "") +
                   (w != kKvWindowModeDefault && IsQuantized(kv) ? "/w" + std::to_string(w) : "");
        specs.push_back(leg);
      }
    }
  }
  return specs;
}

// Speculative legs (--spec): every KV leg crossed with every mode (the reference is the first
// KV leg in the first mode; list "off" first to judge speculation against plain decoding). An
// exit code.
int CrossSpecModes(const std::string& modes, std::vector<LegSpec>* specs) {
  std::vector<std::string> spec_modes = SplitList(modes);
  for (const std::string& m : spec_modes) {
    if (m != "off" && m != "lookup" && m != "draft" && m != "mtp") {
      std::fprintf(stderr, "lamina: --spec: \"%s\" is not off, lookup, draft or mtp\n", m.c_str());
      return kExitUsage;
    }
  }
  if (spec_modes.empty()) spec_modes.push_back("off");
  std::vector<LegSpec> crossed;
  for (size_t i = 0; i < specs->size(); ++i) {
    for (const std::string& m : spec_modes) {
      LegSpec leg = (*specs)[i];
      leg.spec = m;
      if (leg.spec != "off") leg.name += "+" + leg.spec;
      crossed.push_back(leg);
    }
  }
  *specs = std::move(crossed);
  return kExitOk;
}

// --inject-fault LEG_INDEX:FAULT (test-only); an exit code.
int ApplyFaults(const std::vector<std::string>& faults, std::vector<LegSpec>* specs) {
  for (const std::string& spec : faults) {
    const size_t colon = spec.find(':');
    char* end = nullptr;
    const long idx = colon == std::string::npos ? -1 : std::strtol(spec.c_str(), &end, 10);
    Result<probe::Fault> fault = colon == std::string::npos
                                     ? Result<probe::Fault>(Error{"no colon"})
                                     : probe::ParseFault(spec.substr(colon + 1));
    if (colon == std::string::npos || end != spec.c_str() + colon || idx < 0 ||
        idx >= static_cast<long>(specs->size()) || !fault.ok()) {
      std::fprintf(stderr,
                   "lamina: --inject-fault: \"%s\" is not LEG_INDEX:FAULT (legs 0..%zu; faults "
                   "%s)\n",
                   spec.c_str(), specs->size() - 1, probe::FaultNames().c_str());
      return kExitUsage;
    }
    (*specs)[idx].fault = *fault;
    (*specs)[idx].name += "+" + std::string(probe::FaultName(*fault));
  }
  return kExitOk;
}

// A leg's session.
SessionConfig LegSession(const LegSpec& leg, int n_ctx, uint64_t seed) {
  SessionConfig sc;
  sc.n_ctx = n_ctx;
  sc.kv_type = leg.kv;
  sc.v_rounding = leg.v_round;
  sc.kv_window = leg.window;
  sc.kv_seed = seed;
  return sc;
}

// Each leg's KV cache suits the model and fits in memory; an exit code.
int CheckLegMemory(const Model& model, const std::vector<LegSpec>& specs, int n_ctx,
                   uint64_t seed) {
  const Hparams& hp = model.hparams();
  for (const LegSpec& leg : specs) {
    Result<KvCacheConfig> kc = MakeKvCacheConfig(hp, LegSession(leg, n_ctx, seed));
    if (!kc.ok()) {
      std::fprintf(stderr, "lamina: %s\n", kc.error().message.c_str());
      return kExitUsage;
    }
    // Teacher-forced probes evaluate up to a whole context with all its logits.
    SessionConfig planned = LegSession(leg, n_ctx, seed);
    int rc = kExitOk;
    if (!CheckMemoryPlan(CommonOptions{}, model, &planned, n_ctx, n_ctx, 0, "lower --ctx", &rc)) {
      return rc;
    }
  }
  return kExitOk;
}

// One setup per speculative mode (the draft model loads once and is checked against the
// model's vocabulary). The legs' drafters point into it.
struct SpecSetups {
  std::map<std::string, SpecSetup> setups;
  std::map<std::string, SpecCliOptions> options;
};

// The setups of the legs' speculative modes; an exit code.
int MakeSpecSetups(const SpecCliOptions& spec_options, const std::string& model_path,
                   const Model& model, int n_ctx, ThreadPool& pool,
                   const std::vector<LegSpec>& specs, SpecSetups* out) {
  for (const LegSpec& leg : specs) {
    if (leg.spec == "off" || out->setups.count(leg.spec)) continue;
    SpecCliOptions so = spec_options;
    so.mode = leg.spec;
    int rc = kExitOk;
    if (!MakeSpecSetup(so, model_path, model, n_ctx, pool, &out->setups[leg.spec], &rc,
                       /*build_drafter=*/false)) {
      return rc;
    }
    out->options[leg.spec] = so;
  }
  return kExitOk;
}

// The local legs' backends.
std::vector<probe::Leg> MakeLegs(const Model& model, ThreadPool& pool,
                                 const std::vector<LegSpec>& specs, int n_ctx, uint64_t seed,
                                 SpecSetups* setups) {
  std::vector<probe::Leg> legs;
  for (const LegSpec& spec : specs) {
    probe::Leg leg;
    leg.name = spec.name;
    probe::DrafterFactory drafter;
    spec::SpecOptions so;
    if (spec.spec != "off") {
      const SpecSetup* setup = &setups->setups[spec.spec];
      const SpecCliOptions* sco = &setups->options[spec.spec];
      drafter = [setup, sco, &pool](Session& target) {
        return NewDrafter(*sco, *setup, pool, &target);
      };
      so = setup->options;
    }
    leg.backend = std::make_unique<probe::LocalBackend>(model, pool, LegSession(spec, n_ctx, seed),
                                                        spec.fault, drafter, so);
    legs.push_back(std::move(leg));
  }
  return legs;
}

// Touch the weights once so the first leg's cold prefill is not charged for page faults.
void WarmUp(const Model& model, int n_ctx, ThreadPool& pool) {
  SessionConfig sc;
  sc.n_ctx = n_ctx;
  sc.kv_type = KvType::kF32;
  Session warm(model, sc, pool);
  std::vector<int32_t> ids = model.tokenizer().Encode("Once upon a time", true, false);
  (void)warm.Eval(ids, false);
}

}  // namespace

int RunProbe(const ProbeOptions& o) {
  // Usage checks first: nothing runs on bad options.
  std::vector<KvType> kvs;
  std::vector<KvRounding> rounds;
  std::vector<int> windows;
  if (int rc = ParseKvLists(o, &kvs, &rounds, &windows); rc != kExitOk) return rc;
  probe::ProbeConfig config;
  if (int rc = ParseProbeConfig(o, &config); rc != kExitOk) return rc;
  if (!o.url.empty()) return RunRemoteProbe(o, config);

  std::vector<LegSpec> specs = KvLegs(kvs, rounds, windows);
  if (int rc = CrossSpecModes(o.spec, &specs); rc != kExitOk) return rc;
  if (int rc = ApplyFaults(o.inject_faults, &specs); rc != kExitOk) return rc;

  std::string model_path = o.model_path;
  if (!ResolveModelPath(&model_path)) return kExitUsage;
  LoadedModel lm = LoadModelForCli(model_path);
  if (!lm.model) return kExitBadInput;
  if (int rc = kExitOk; !AttachMtpHead(o.spec, model_path, *lm.model, &rc)) return rc;
  const Model& model = *lm.model;
  const Hparams& hp = model.hparams();
  config.n_ctx = hp.n_ctx_train > 0 ? std::min(o.n_ctx, hp.n_ctx_train) : o.n_ctx;
  if (config.n_ctx < o.n_ctx) {
    std::fprintf(stderr, "lamina: --ctx %d capped at the model's training context %d\n", o.n_ctx,
                 config.n_ctx);
  }
  if (int rc = CheckLegMemory(model, specs, config.n_ctx, o.seed); rc != kExitOk) return rc;
  ThreadPool pool(o.n_threads);
  SpecSetups setups;
  if (int rc =
          MakeSpecSetups(o.spec_options, model_path, model, config.n_ctx, pool, specs, &setups);
      rc != kExitOk) {
    return rc;
  }
  std::vector<probe::Leg> legs = MakeLegs(model, pool, specs, config.n_ctx, o.seed, &setups);
  WarmUp(model, config.n_ctx, pool);
  probe::ProbeReport report = probe::RunProbe(config, legs);
  report.model = model_path;
  report.arch = hp.arch;
  Result<std::string> tmpl = model.file().GetString("tokenizer.chat_template");
  report.chat_template = tmpl.ok() && !tmpl->empty() ? "yes" : "none";
  return Finish(report, o.out_dir);
}

}  // namespace lamina::cli
