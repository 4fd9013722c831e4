// RunProbe: the legs' descriptions, every chosen probe in turn, then one verdict per leg.
#include "probe/probe.h"

#include <cstdio>

#include "probe/probes.h"
#include "util/timer.h"

namespace lamina::probe {

const char* ProbeName(ProbeKind kind) {
  switch (kind) {
    case ProbeKind::kPrefill:
      return "prefill";
    case ProbeKind::kCounting:
      return "counting";
    case ProbeKind::kNeedle:
      return "needle";
    case ProbeKind::kJson:
      return "json";
    case ProbeKind::kSchema:
      return "schema";
    case ProbeKind::kCopy:
      return "copy";
    case ProbeKind::kThinking:
      return "thinking";
    case ProbeKind::kDivergence:
      return "divergence";
  }
  return "?";
}

bool ParseProbeName(const std::string& name, ProbeKind* out) {
  for (ProbeKind k : kAllProbes) {
    if (name == ProbeName(k)) {
      *out = k;
      return true;
    }
  }
  return false;
}

const char* StatusName(Status status) {
  switch (status) {
    case Status::kPass:
      return "pass";
    case Status::kFail:
      return "fail";
    case Status::kNotApplicable:
      return "n/a";
    case Status::kInfo:
      return "info";
  }
  return "?";
}

const Outcome* LegReport::outcome(ProbeKind kind) const {
  switch (kind) {
    case ProbeKind::kPrefill:
      return prefill ? &prefill->outcome : nullptr;
    case ProbeKind::kCounting:
      return counting ? &counting->outcome : nullptr;
    case ProbeKind::kNeedle:
      return needle ? &needle->outcome : nullptr;
    case ProbeKind::kJson:
      return json ? &json->outcome : nullptr;
    case ProbeKind::kSchema:
      return schema ? &schema->outcome : nullptr;
    case ProbeKind::kCopy:
      return copy ? &copy->outcome : nullptr;
    case ProbeKind::kThinking:
      return thinking ? &thinking->outcome : nullptr;
    case ProbeKind::kDivergence:
      return divergence ? &divergence->outcome : nullptr;
  }
  return nullptr;
}

void RunContext::Progress(const char* probe, size_t leg) const {
  if (!config.progress) return;
  char buf[64];
  std::snprintf(buf, sizeof(buf), ": leg %zu/%zu ", leg + 1, legs.size());
  config.progress(std::string("probe ") + probe + buf + legs[leg].name);
}

int TokenCount(const RunContext& ctx, const std::string& text) {
  return ctx.reference().CountTokens(text);
}

namespace {

std::string JoinNames(const std::vector<std::string>& names) {
  std::string list;
  for (size_t k = 0; k < names.size(); ++k) list += (k ? ", " : "") + names[k];
  return list;
}

// The leg's pass/fail and its one-line verdict: the failures' reasons, or notes (the KL, and
// the probes that are n/a and why).
void Verdict(const std::vector<ProbeKind>& probes, const BackendInfo& info, LegReport& leg) {
  std::vector<std::string> fails, notes, na, na_no_logits;
  for (ProbeKind kind : probes) {
    const Outcome* o = leg.outcome(kind);
    if (o == nullptr) continue;
    const std::string name = ProbeName(kind);
    if (o->status == Status::kFail) {
      fails.push_back(name + ": " + (o->reason.empty() ? "failed" : o->reason));
    }
    if (o->status == Status::kNotApplicable) {
      const bool no_logits = !info.logits && o->reason == info.no_logits_reason;
      (no_logits ? na_no_logits : na).push_back(name);
    }
  }
  if (leg.divergence && leg.divergence->measured && !leg.reference) {
    char buf[96];
    std::snprintf(buf, sizeof(buf), "mean KL %.3g, top-1 %.1f%%", leg.divergence->kl_mean,
                  100 * leg.divergence->top1_agreement);
    notes.push_back(buf);
  }
  if (!na_no_logits.empty()) {
    notes.push_back(JoinNames(na_no_logits) + " n/a (" + info.no_logits_reason + ")");
  }
  // One n/a keeps its own reason; several share one note.
  if (na.size() == 1) {
    ProbeKind kind = ProbeKind::kPrefill;
    ParseProbeName(na[0], &kind);
    notes.push_back(na[0] + " n/a (" + leg.outcome(kind)->reason + ")");
  } else if (!na.empty()) {
    notes.push_back(JoinNames(na) +
                    " n/a (the model cannot do them: the reference leg fails them too)");
  }
  leg.pass = fails.empty();
  std::string line = "leg " + std::to_string(leg.index) + " " + leg.name +
                     (leg.reference ? " (reference)" : "") + ": " + (leg.pass ? "PASS" : "FAIL");
  const std::vector<std::string>& detail = leg.pass ? notes : fails;
  for (size_t k = 0; k < detail.size(); ++k) line += (k ? "; " : " — ") + detail[k];
  leg.verdict_line = line;
}

}  // namespace

ProbeReport RunProbe(const ProbeConfig& config, std::vector<Leg>& legs) {
  LAMINA_CHECK(!legs.empty());
  RunContext ctx{config, legs, {}};
  ProbeReport report;
  report.n_ctx = config.n_ctx;
  report.seed = config.seed;
  report.probes = config.probes;
  report.thresholds = config.thresholds;
  for (size_t i = 0; i < legs.size(); ++i) {
    const BackendInfo info = legs[i].backend->Info();
    ctx.info.push_back(info);
    LegReport leg;
    leg.index = static_cast<int>(i);
    leg.name = legs[i].name;
    leg.kv = info.kv;
    leg.v_round = info.v_round;
    leg.reference = i == 0;
    leg.fault = info.fault;
    leg.bits_per_element = info.bits_per_element;
    leg.bytes_per_token = info.bytes_per_token;
    leg.kv_window = info.kv_window;
    report.legs.push_back(std::move(leg));
  }
  const double t0 = NowSeconds();
  // Each probe's results land in the legs in order.
  auto place = [&](auto results, auto member) {
    for (size_t i = 0; i < results.size(); ++i) report.legs[i].*member = std::move(results[i]);
  };
  for (ProbeKind kind : config.probes) {
    switch (kind) {
      case ProbeKind::kPrefill:
        place(RunPrefillProbe(ctx), &LegReport::prefill);
        break;
      case ProbeKind::kCounting:
        place(RunCountingProbe(ctx), &LegReport::counting);
        break;
      case ProbeKind::kNeedle:
        place(RunNeedleProbe(ctx), &LegReport::needle);
        break;
      case ProbeKind::kJson:
        place(RunJsonProbe(ctx), &LegReport::json);
        break;
      case ProbeKind::kSchema:
        place(RunSchemaProbe(ctx), &LegReport::schema);
        break;
      case ProbeKind::kCopy:
        place(RunCopyProbe(ctx), &LegReport::copy);
        break;
      case ProbeKind::kThinking:
        place(RunThinkingProbe(ctx), &LegReport::thinking);
        break;
      case ProbeKind::kDivergence:
        place(RunDivergenceProbe(ctx), &LegReport::divergence);
        break;
    }
  }
  report.seconds = NowSeconds() - t0;
  report.pass = true;
  for (size_t i = 0; i < legs.size(); ++i) {
    Verdict(config.probes, ctx.info[i], report.legs[i]);
    report.pass = report.pass && report.legs[i].pass;
  }
  return report;
}

}  // namespace lamina::probe
