// `lamina probe`: A/B the KV cache modes the way users meet them. Each leg (KV mode, V rounding)
// runs every probe in fresh sessions; the first leg is the reference. Prints a table and a
// verdict per leg, and writes probe.json and a self-contained report.html.
#include "cli_probe.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "cli_common.h"
#include "util/timer.h"

namespace lamina::cli {

namespace {

using nlohmann::json;
using probe::Context;
using probe::Leg;

const char* const kProbeNames[] = {"prefill", "counting", "needle", "json", "copy", "divergence"};

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

bool ParseFault(const std::string& name, KvCache::Fault* out) {
  if (name == "skip-decode-writes")
    *out = KvCache::Fault::kSkipSingleToken;
  else if (name == "corrupt-decode-writes")
    *out = KvCache::Fault::kCorruptSingleToken;
  else if (name == "biased-v")
    *out = KvCache::Fault::kBiasedV;
  else
    return false;
  return true;
}

const char* FaultName(KvCache::Fault f) {
  switch (f) {
    case KvCache::Fault::kNone:
      return "none";
    case KvCache::Fault::kSkipSingleToken:
      return "skip-decode-writes";
    case KvCache::Fault::kCorruptSingleToken:
      return "corrupt-decode-writes";
    case KvCache::Fault::kBiasedV:
      return "biased-v";
  }
  return "?";
}

bool IsQuantized(KvType t) { return t != KvType::kF32 && t != KvType::kF16; }

std::string Pad(const std::string& s, size_t w) {
  return s.size() >= w ? s : s + std::string(w - s.size(), ' ');
}

// The table cell of one probe: status mark, then the probe's own summary.
std::string CellText(const json& p) {
  const std::string status = p.value("status", "info");
  const std::string cell = p.value("cell", "");
  if (status == "pass") return "PASS " + cell;
  if (status == "fail") return "FAIL " + cell;
  if (status == "n/a") return "n/a (" + cell + ")";
  return cell;
}

void Verdicts(json& report, const std::vector<std::string>& probes) {
  bool all_pass = true;
  for (json& leg : report["legs"]) {
    std::vector<std::string> fails, notes, na;
    for (const std::string& name : probes) {
      const json& p = leg["probes"][name];
      const std::string status = p.value("status", "info");
      if (status == "fail") fails.push_back(name + ": " + p.value("reason", "failed"));
      if (status == "n/a") na.push_back(name);
    }
    if (leg["probes"].contains("divergence") && leg["probes"]["divergence"].contains("kl_mean") &&
        !leg["reference"].get<bool>()) {
      const json& d = leg["probes"]["divergence"];
      char buf[96];
      std::snprintf(buf, sizeof(buf), "mean KL %.3g, top-1 %.1f%%", d["kl_mean"].get<double>(),
                    100 * d["top1_agreement"].get<double>());
      notes.push_back(buf);
    }
    // One n/a keeps its own reason; several share one note.
    if (na.size() == 1) {
      notes.push_back(na[0] + " n/a (" + leg["probes"][na[0]].value("reason", "") + ")");
    } else if (!na.empty()) {
      std::string list;
      for (size_t k = 0; k < na.size(); ++k) list += (k ? ", " : "") + na[k];
      notes.push_back(list + " n/a (the model cannot do them: the reference leg fails them too)");
    }
    const bool pass = fails.empty();
    all_pass = all_pass && pass;
    std::string line =
        "leg " + std::to_string(leg["index"].get<int>()) + " " + leg["name"].get<std::string>() +
        (leg["reference"].get<bool>() ? " (reference)" : "") + ": " + (pass ? "PASS" : "FAIL");
    const std::vector<std::string>& detail = pass ? notes : fails;
    for (size_t k = 0; k < detail.size(); ++k) line += (k ? "; " : " — ") + detail[k];
    leg["verdict"] = pass ? "pass" : "fail";
    leg["verdict_line"] = line;
  }
  report["pass"] = all_pass;
}

void PrintTable(const json& report, const std::vector<std::string>& probes) {
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> header = {"leg", "kv / v-round"};
  for (const std::string& p : probes) header.push_back(p);
  header.push_back("verdict");
  rows.push_back(header);
  for (const json& leg : report["legs"]) {
    std::vector<std::string> row = {
        std::to_string(leg["index"].get<int>()),
        leg["name"].get<std::string>() + (leg["reference"].get<bool>() ? " (ref)" : "")};
    for (const std::string& p : probes) row.push_back(CellText(leg["probes"][p]));
    row.push_back(leg["verdict"] == "pass" ? "PASS" : "FAIL");
    rows.push_back(row);
  }
  std::vector<size_t> width(header.size(), 0);
  for (const auto& row : rows) {
    for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  }
  for (const auto& row : rows) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c)
      line += Pad(row[c], width[c]) + (c + 1 < row.size() ? "  " : "");
    std::printf("%s\n", line.c_str());
  }
  std::printf("\n");
  for (const json& leg : report["legs"])
    std::printf("%s\n", leg["verdict_line"].get<std::string>().c_str());
}

}  // namespace

int RunProbe(const ProbeOptions& o) {
  // Usage checks first: nothing runs on bad options.
  std::vector<KvType> kvs;
  for (const std::string& name : SplitList(o.kv)) {
    Result<KvType> t = ParseKvType(name);
    if (!t.ok()) {
      std::fprintf(stderr, "lamina: --kv: %s\n", t.error().message.c_str());
      return kExitUsage;
    }
    kvs.push_back(*t);
  }
  std::vector<KvRounding> rounds;
  for (const std::string& name : SplitList(o.kv_v_round)) {
    Result<KvRounding> r = ParseKvRounding(name);
    if (!r.ok()) {
      std::fprintf(stderr, "lamina: --kv-v-round: %s\n", r.error().message.c_str());
      return kExitUsage;
    }
    rounds.push_back(*r);
  }
  if (kvs.empty() || rounds.empty()) {
    std::fprintf(stderr, "lamina: --kv and --kv-v-round need at least one value\n");
    return kExitUsage;
  }
  std::vector<std::string> probes;
  const std::vector<std::string> probe_list = SplitList(o.probes);
  const std::set<std::string> requested(probe_list.begin(), probe_list.end());
  for (const std::string& name : requested) {
    if (std::find(std::begin(kProbeNames), std::end(kProbeNames), name) == std::end(kProbeNames)) {
      std::fprintf(stderr,
                   "lamina: --probes: unknown probe \"%s\" (expected prefill, counting, needle, "
                   "json, copy, divergence)\n",
                   name.c_str());
      return kExitUsage;
    }
  }
  for (const char* name : kProbeNames) {
    if (requested.count(name)) probes.push_back(name);
  }
  if (probes.empty()) {
    std::fprintf(stderr, "lamina: --probes needs at least one probe\n");
    return kExitUsage;
  }
  Context ctx;
  ctx.options = o;
  if (!ParseIntList(o.needle_depths, "--needle-depths", 0, 100, &ctx.needle_depths) ||
      !ParseIntList(o.needle_lengths, "--needle-lengths", 16, 1 << 20, &ctx.needle_lengths)) {
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
  }

  // Legs: f32 reference unless the list starts with an exact-enough mode; quantized modes are
  // crossed with every V rounding.
  if (kvs.front() != KvType::kF32 && kvs.front() != KvType::kF16)
    kvs.insert(kvs.begin(), KvType::kF32);
  for (KvType kv : kvs) {
    const std::vector<KvRounding> rs =
        IsQuantized(kv) ? rounds : std::vector<KvRounding>{KvRounding::kNearest};
    for (KvRounding r : rs) {
      Leg leg;
      leg.kv = kv;
      leg.v_round = r;
      leg.name = std::string(KvTypeName(kv)) +
                 (IsQuantized(kv) ? std::string("/") + KvRoundingName(r) : "");
      ctx.legs.push_back(leg);
    }
  }
  for (const std::string& spec : o.inject_faults) {
    const size_t colon = spec.find(':');
    KvCache::Fault fault;
    char* end = nullptr;
    const long idx = colon == std::string::npos ? -1 : std::strtol(spec.c_str(), &end, 10);
    if (colon == std::string::npos || end != spec.c_str() + colon || idx < 0 ||
        idx >= static_cast<long>(ctx.legs.size()) || !ParseFault(spec.substr(colon + 1), &fault)) {
      std::fprintf(stderr,
                   "lamina: --inject-fault: \"%s\" is not LEG_INDEX:FAULT (legs 0..%zu; faults "
                   "skip-decode-writes, "
                   "corrupt-decode-writes, biased-v)\n",
                   spec.c_str(), ctx.legs.size() - 1);
      return kExitUsage;
    }
    ctx.legs[idx].fault = fault;
    ctx.legs[idx].name += "+" + std::string(FaultName(fault));
  }

  std::string model_path = o.model_path;
  if (!ResolveModelPath(&model_path)) return kExitUsage;
  LoadedModel lm = LoadModelForCli(model_path);
  if (!lm.model) return kExitBadInput;
  const Model& model = *lm.model;
  const Hparams& hp = model.hparams();
  ctx.model = &model;
  ctx.n_ctx = hp.n_ctx_train > 0 ? std::min(o.n_ctx, hp.n_ctx_train) : o.n_ctx;
  if (ctx.n_ctx < o.n_ctx) {
    std::fprintf(stderr, "lamina: --ctx %d capped at the model's training context %d\n", o.n_ctx,
                 ctx.n_ctx);
  }
  Result<std::string> tmpl = model.file().GetString("tokenizer.chat_template");
  if (tmpl.ok()) ctx.chat_template = *tmpl;
  for (const Leg& leg : ctx.legs) {
    Result<KvCacheConfig> kc = MakeKvCacheConfig(hp, ctx.SessionFor(leg));
    if (!kc.ok()) {
      std::fprintf(stderr, "lamina: %s\n", kc.error().message.c_str());
      return kExitUsage;
    }
  }
  ThreadPool pool(o.n_threads);
  ctx.pool = &pool;

  json report;
  report["model"] = model_path;
  report["arch"] = hp.arch;
  report["n_ctx"] = ctx.n_ctx;
  report["seed"] = o.seed;
  report["probes"] = probes;
  report["chat_template"] = ctx.chat_template.empty() ? "none" : "yes";
  report["thresholds"] = {{"kl_mean_max", ctx.thresholds.kl_mean_max},
                          {"kl_bucket_max", ctx.thresholds.kl_bucket_max},
                          {"top1_min", ctx.thresholds.top1_min},
                          {"path_diff_max", ctx.thresholds.path_diff_max},
                          {"bias_rel_max", ctx.thresholds.bias_rel_max},
                          {"keep_fraction", ctx.thresholds.keep_fraction}};
  report["legs"] = json::array();
  for (size_t i = 0; i < ctx.legs.size(); ++i) {
    const Leg& leg = ctx.legs[i];
    KvCache cache(*MakeKvCacheConfig(hp, ctx.SessionFor(leg)));
    report["legs"].push_back({{"index", i},
                              {"name", leg.name},
                              {"kv", KvTypeName(leg.kv)},
                              {"v_round", KvRoundingName(leg.v_round)},
                              {"reference", i == 0},
                              {"fault", FaultName(leg.fault)},
                              {"bits_per_element", cache.BitsPerElement()},
                              {"bytes_per_token", cache.BytesPerToken()},
                              {"probes", json::object()}});
  }

  // Touch the weights once so the first leg's cold prefill is not charged for page faults.
  {
    std::unique_ptr<Session> warm = ctx.NewSession(Leg{});
    std::vector<int32_t> ids = model.tokenizer().Encode("Once upon a time", true, false);
    (void)warm->Eval(ids, false);
  }
  const double t0 = NowSeconds();
  for (const std::string& name : probes) {
    if (name == "prefill") probe::RunPrefillProbe(ctx, report);
    if (name == "counting") probe::RunCountingProbe(ctx, report);
    if (name == "needle") probe::RunNeedleProbe(ctx, report);
    if (name == "json") probe::RunJsonProbe(ctx, report);
    if (name == "copy") probe::RunCopyProbe(ctx, report);
    if (name == "divergence") probe::RunDivergenceProbe(ctx, report);
  }
  report["seconds"] = NowSeconds() - t0;
  Verdicts(report, probes);
  PrintTable(report, probes);

  if (!o.out_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(o.out_dir, ec);
    const std::string json_path = o.out_dir + "/probe.json";
    const std::string html_path = o.out_dir + "/report.html";
    std::ofstream jf(json_path), hf(html_path);
    jf << report.dump(2, ' ', false, json::error_handler_t::replace) << "\n";
    hf << probe::RenderHtmlReport(report);
    if (!jf || !hf) {
      std::fprintf(stderr, "lamina: --out: cannot write %s\n", o.out_dir.c_str());
      return kExitFailure;
    }
    std::fprintf(stderr, "lamina: wrote %s and %s\n", json_path.c_str(), html_path.c_str());
  }
  return report["pass"].get<bool>() ? kExitOk : kExitFailure;
}

}  // namespace lamina::cli
