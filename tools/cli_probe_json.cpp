// probe.json, the JSON view of a typed probe report: one object per leg with one object per
// probe ("status", "cell", "reason" and the probe's own numbers and outputs).
#include "cli_probe.h"

namespace lamina::cli::probe_view {

namespace {

using nlohmann::json;
using probe::Outcome;

// "status", "cell" and, when there is one, "reason".
void AddOutcome(const Outcome& o, json& p) {
  p["status"] = probe::StatusName(o.status);
  p["cell"] = o.cell;
  if (!o.reason.empty()) p["reason"] = o.reason;
}

json OptionalInt(int v) { return v < 0 ? json(nullptr) : json(v); }

json Difference(const std::optional<probe::OutputDifference>& d) {
  if (!d) return nullptr;
  return {{"item", d->item}, {"byte", d->byte}};
}

json PrefillJson(const probe::PrefillResult& r) {
  json p;
  p["tokens"] = r.tokens;
  p["seconds"] = r.seconds;
  AddOutcome(r.outcome, p);
  if (r.measured) {
    p["tok_s"] = r.tok_s;
    p["last_logits_max_abs_diff"] = r.last_logits_max_abs_diff;
    p["last_logits_kl"] = r.last_logits_kl;
    p["last_top1_same"] = r.last_top1_same;
  }
  return p;
}

json CountingJson(const probe::CountingResult& r) {
  const probe::CountingAnalysis& a = r.analysis;
  json p;
  p["n"] = a.n;
  p["pass"] = a.pass;
  p["sequence_ok"] = a.sequence_ok;
  p["stopped_after_n"] = a.stopped_after_n;
  p["ended_turn"] = a.ended_turn;
  p["lines"] = a.lines;
  p["first_wrong_line"] = OptionalInt(a.first_wrong_line);
  if (a.first_wrong_line > 0) p["first_wrong_text"] = a.first_wrong_text;
  p["longest_repeat"] = {{"value", a.longest_repeat_value}, {"length", a.longest_repeat_length}};
  p["skipped_count"] = a.skipped_count;
  p["skipped"] = a.skipped;
  p["first_40"] = a.first_40;
  p["text"] = r.text;
  p["generated_tokens"] = r.generated_tokens;
  if (!r.error.empty()) p["error"] = r.error;
  if (!r.note.empty()) p["note"] = r.note;
  AddOutcome(r.outcome, p);
  return p;
}

json NeedleJson(const probe::NeedleResult& r) {
  json grid = json::array();
  for (const probe::NeedleCell& c : r.grid) {
    grid.push_back({{"length", c.length},
                    {"depth", c.depth},
                    {"expected", c.expected},
                    {"answer", c.answer},
                    {"hit", c.hit}});
    if (!c.error.empty()) grid.back()["error"] = c.error;
  }
  json p;
  p["grid"] = grid;
  p["lengths"] = r.lengths;
  p["depths"] = r.depths;
  p["skipped_lengths"] = r.skipped_lengths;
  p["hits"] = r.hits;
  p["cells"] = r.cells;
  p["recall"] = r.recall;
  AddOutcome(r.outcome, p);
  return p;
}

json JsonProbeJson(const probe::JsonResult& r) {
  json items = json::array();
  for (const probe::JsonItem& it : r.items) {
    items.push_back({{"output", it.output},
                     {"valid", it.valid},
                     {"exact", it.exact},
                     {"expected", it.expected}});
    if (!it.error.empty()) items.back()["error"] = it.error;
  }
  json p;
  p["items"] = items;
  p["valid_rate"] = r.valid_rate;
  p["exact_rate"] = r.exact_rate;
  p["first_difference"] = Difference(r.first_difference);
  AddOutcome(r.outcome, p);
  return p;
}

json CopyJson(const probe::CopyResult& r) {
  json items = json::array();
  for (const probe::CopyItem& it : r.items) {
    items.push_back({{"expected", it.expected},
                     {"output", it.output},
                     {"exact", it.exact},
                     {"first_wrong_byte", it.first_wrong_byte}});
    if (!it.error.empty()) items.back()["error"] = it.error;
  }
  json p;
  p["items"] = items;
  p["exact_rate"] = r.exact_rate;
  p["first_difference"] = Difference(r.first_difference);
  AddOutcome(r.outcome, p);
  return p;
}

json ThinkingJson(const probe::ThinkingResult& r) {
  json items = json::array();
  for (const probe::ThinkingItem& it : r.items) {
    items.push_back({{"task", it.task},
                     {"expected", it.expected},
                     {"output", it.output},
                     {"thought", it.thought},
                     {"answer", it.answer},
                     {"closed", it.closed},
                     {"right", it.right}});
    if (!it.error.empty()) items.back()["error"] = it.error;
  }
  json p;
  p["items"] = items;
  p["closed"] = r.closed;
  p["right"] = r.right;
  p["identical"] = !r.first_difference.has_value();
  p["first_difference"] = Difference(r.first_difference);
  AddOutcome(r.outcome, p);
  return p;
}

json SideJson(const probe::SideError& s) {
  return {{"rel_rms", s.rel_rms},
          {"mean_error", s.mean_error},
          {"bias_rel", s.bias_rel},
          {"cosine", s.cosine},
          {"gain", s.gain},
          {"rel_rms_prompt_cells", s.rel_rms_prompt_cells},
          {"rel_rms_decode_cells", s.rel_rms_decode_cells}};
}

json BucketsJson(const std::vector<probe::KlBucket>& buckets) {
  json out = json::array();
  for (const probe::KlBucket& b : buckets) {
    out.push_back({{"from", b.from},
                   {"to", b.to},
                   {"mean_kl", b.mean_kl},
                   {"max_kl", b.max_kl},
                   {"top1", b.top1}});
  }
  return out;
}

json DivergenceJson(const probe::DivergenceResult& r) {
  json p;
  p["tokens"] = r.tokens;
  p["prompt_tokens"] = r.prompt_tokens;
  p["decode_steps"] = r.decode_steps;
  p["reference"] = r.reference;
  AddOutcome(r.outcome, p);
  if (!r.measured) return p;
  p["kl_mean"] = r.kl_mean;
  p["kl_p99"] = r.kl_p99;
  p["kl_max"] = r.kl_max;
  p["top1_agreement"] = r.top1_agreement;
  p["buckets"] = BucketsJson(r.buckets);
  p["chart"] = BucketsJson(r.chart);
  p["path_max_abs_diff"] = r.path_max_abs_diff;
  p["path_first_mismatch"] = OptionalInt(r.path_first_mismatch);
  p["free_run"] = {{"tokens", r.free_run_tokens},
                   {"first_difference", OptionalInt(r.free_run_first_difference)},
                   {"text", r.free_run_text}};
  if (!r.reference) {
    if (r.layers) {
      json layers = json::array();
      for (const probe::LayerError& l : *r.layers) {
        layers.push_back({{"layer", l.layer}, {"k", SideJson(l.k)}, {"v", SideJson(l.v)}});
      }
      p["layers"] = layers;
    } else {
      p["layers"] = nullptr;
    }
  }
  return p;
}

}  // namespace

json ProbeJson(const probe::ProbeReport& report) {
  json j;
  j["model"] = report.model;
  j["arch"] = report.arch;
  j["n_ctx"] = report.n_ctx;
  j["seed"] = report.seed;
  json probes = json::array();
  for (probe::ProbeKind k : report.probes) probes.push_back(probe::ProbeName(k));
  j["probes"] = probes;
  j["chat_template"] = report.chat_template;
  const probe::Thresholds& t = report.thresholds;
  j["thresholds"] = {{"kl_mean_max", t.kl_mean_max},   {"kl_bucket_max", t.kl_bucket_max},
                     {"top1_min", t.top1_min},         {"path_diff_max", t.path_diff_max},
                     {"bias_rel_max", t.bias_rel_max}, {"keep_fraction", t.keep_fraction}};
  j["legs"] = json::array();
  for (const probe::LegReport& leg : report.legs) {
    json l = {{"index", leg.index},
              {"name", leg.name},
              {"kv", leg.kv},
              {"v_round", leg.v_round},
              {"reference", leg.reference},
              {"fault", leg.fault},
              {"bits_per_element", leg.bits_per_element ? json(*leg.bits_per_element) : json()},
              {"bytes_per_token", leg.bytes_per_token ? json(*leg.bytes_per_token) : json()},
              {"kv_window", leg.kv_window ? json(*leg.kv_window) : json()},
              {"probes", json::object()}};
    json& p = l["probes"];
    if (leg.prefill) p["prefill"] = PrefillJson(*leg.prefill);
    if (leg.counting) p["counting"] = CountingJson(*leg.counting);
    if (leg.needle) p["needle"] = NeedleJson(*leg.needle);
    if (leg.json) p["json"] = JsonProbeJson(*leg.json);
    if (leg.schema) p["schema"] = JsonProbeJson(*leg.schema);
    if (leg.copy) p["copy"] = CopyJson(*leg.copy);
    if (leg.thinking) p["thinking"] = ThinkingJson(*leg.thinking);
    if (leg.divergence) p["divergence"] = DivergenceJson(*leg.divergence);
    l["verdict"] = leg.pass ? "pass" : "fail";
    l["verdict_line"] = leg.verdict_line;
    j["legs"].push_back(l);
  }
  j["seconds"] = report.seconds;
  j["pass"] = report.pass;
  return j;
}

}  // namespace lamina::cli::probe_view
