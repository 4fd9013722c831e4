// The HTML view of a typed probe report: one self-contained page (inline CSS and SVG, no
// scripts, no network) with the summary table, KL-vs-position chart, needle heatmaps, counting
// outputs side by side and per-layer K/V error bars.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "cli_probe.h"

namespace lamina::cli::probe_view {

namespace {

using probe::LegReport;
using probe::ProbeKind;
using probe::ProbeReport;
using probe::Status;

const char* const kColors[] = {"#222222", "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728",
                               "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#17becf"};

std::string Esc(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '&':
        out += "&amp;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string Num(double v, const char* format = "%.4g") {
  char buf[64];
  std::snprintf(buf, sizeof(buf), format, v);
  return buf;
}

std::string Color(size_t i) { return kColors[i % (sizeof(kColors) / sizeof(kColors[0]))]; }

std::string StatusClass(Status s) {
  return s == Status::kNotApplicable ? "na" : probe::StatusName(s);
}

// The legs whose divergence probe measured something (the chart and the layer views).
bool HasChart(const LegReport& leg) { return leg.divergence && leg.divergence->measured; }
bool HasLayers(const LegReport& leg) {
  return !leg.reference && HasChart(leg) && leg.divergence->layers.has_value();
}

std::string SummaryTable(const ProbeReport& report) {
  std::string h =
      "<table class=\"summary\"><tr><th>leg</th><th>kv / v-round</th><th>bits/elem</th>";
  for (ProbeKind kind : report.probes) h += "<th>" + Esc(probe::ProbeName(kind)) + "</th>";
  h += "<th>verdict</th></tr>\n";
  for (const LegReport& leg : report.legs) {
    h += "<tr><td>" + std::to_string(leg.index) + "</td><td>" + Esc(leg.name) +
         (leg.reference ? " (reference)" : "") + "</td><td>" +
         (leg.bits_per_element ? Num(*leg.bits_per_element, "%.2f") : std::string("—")) + "</td>";
    for (ProbeKind kind : report.probes) {
      const probe::Outcome* o = leg.outcome(kind);
      const probe::Outcome none;
      const probe::Outcome& p = o ? *o : none;
      h += "<td class=\"" + StatusClass(p.status) + "\" title=\"" + Esc(p.reason) + "\">" +
           Esc(p.cell) + (p.status == Status::kNotApplicable ? " (n/a)" : "") + "</td>";
    }
    const std::string verdict = leg.pass ? "pass" : "fail";
    h += "<td class=\"" + verdict + "\">" + (leg.pass ? "PASS" : "FAIL") + "</td></tr>\n";
  }
  h += "</table>\n<ul class=\"verdicts\">";
  for (const LegReport& leg : report.legs) h += "<li>" + Esc(leg.verdict_line) + "</li>";
  return h + "</ul>\n";
}

// KL divergence versus position, one polyline per non-reference leg, log y axis.
std::string KlChart(const ProbeReport& report) {
  const double w = 760, ht = 320, left = 60, right = 180, top = 16, bottom = 40;
  double max_pos = 1, lo = 1e-7, hi = 1e-3;
  for (const LegReport& leg : report.legs) {
    if (!HasChart(leg)) continue;
    for (const probe::KlBucket& b : leg.divergence->chart) {
      max_pos = std::max(max_pos, static_cast<double>(b.to));
      if (!leg.reference) hi = std::max(hi, b.mean_kl);
    }
  }
  const double llo = std::log10(lo), lhi = std::ceil(std::log10(hi));
  auto x = [&](double pos) { return left + (w - left - right) * pos / max_pos; };
  auto y = [&](double kl) {
    const double l = std::clamp(std::log10(std::max(kl, lo)), llo, lhi);
    return top + (ht - top - bottom) * (1.0 - (l - llo) / (lhi - llo));
  };
  std::string s = "<svg id=\"kl-chart\" xmlns=\"http://www.w3.org/2000/svg\" width=\"" + Num(w) +
                  "\" height=\"" + Num(ht) + "\" viewBox=\"0 0 " + Num(w) + " " + Num(ht) + "\">";
  s += "<rect x=\"" + Num(left) + "\" y=\"" + Num(top) + "\" width=\"" + Num(w - left - right) +
       "\" height=\"" + Num(ht - top - bottom) + "\" fill=\"#fafafa\" stroke=\"#999\"/>";
  for (int e = static_cast<int>(llo); e <= static_cast<int>(lhi); ++e) {
    const double yy = y(std::pow(10.0, e));
    s += "<line x1=\"" + Num(left) + "\" x2=\"" + Num(w - right) + "\" y1=\"" + Num(yy) +
         "\" y2=\"" + Num(yy) + "\" stroke=\"#ddd\"/><text x=\"" + Num(left - 4) + "\" y=\"" +
         Num(yy + 4) + "\" text-anchor=\"end\" font-size=\"11\">1e" + std::to_string(e) + "</text>";
  }
  for (int t = 0; t <= 4; ++t) {
    const double pos = max_pos * t / 4;
    s += "<text x=\"" + Num(x(pos)) + "\" y=\"" + Num(ht - bottom + 16) +
         "\" text-anchor=\"middle\" font-size=\"11\">" + Num(pos, "%.0f") + "</text>";
  }
  s += "<text x=\"" + Num((left + w - right) / 2) + "\" y=\"" + Num(ht - 6) +
       "\" text-anchor=\"middle\" font-size=\"12\">position (tokens)</text>";
  s += "<text x=\"14\" y=\"" + Num(ht / 2) + "\" font-size=\"12\" transform=\"rotate(-90 14 " +
       Num(ht / 2) + ")\" text-anchor=\"middle\">mean KL</text>";
  size_t row = 0;
  for (size_t i = 0; i < report.legs.size(); ++i) {
    const LegReport& leg = report.legs[i];
    if (leg.reference || !HasChart(leg)) continue;
    std::string pts;
    for (const probe::KlBucket& b : leg.divergence->chart) {
      const double mid = (static_cast<double>(b.from) + b.to) / 2;
      pts += Num(x(mid), "%.1f") + "," + Num(y(b.mean_kl), "%.1f") + " ";
    }
    s += "<polyline class=\"kl-line\" fill=\"none\" stroke-width=\"2\" stroke=\"" + Color(i) +
         "\" points=\"" + pts + "\"/>";
    const double ly = top + 14 + 16 * row++;
    s += "<line x1=\"" + Num(w - right + 10) + "\" x2=\"" + Num(w - right + 30) + "\" y1=\"" +
         Num(ly - 4) + "\" y2=\"" + Num(ly - 4) + "\" stroke-width=\"2\" stroke=\"" + Color(i) +
         "\"/><text x=\"" + Num(w - right + 34) + "\" y=\"" + Num(ly) + "\" font-size=\"11\">" +
         Esc(leg.name) + "</text>";
  }
  return s + "</svg>\n";
}

// One heatmap per leg: rows are haystack lengths, columns needle depths; green = recalled.
std::string NeedleGrids(const ProbeReport& report) {
  std::string h = "<div class=\"grids\">";
  for (const LegReport& leg : report.legs) {
    if (!leg.needle) continue;
    const probe::NeedleResult& p = *leg.needle;
    const std::vector<int>& depths = p.depths;
    std::vector<int> rows;
    for (const probe::NeedleCell& c : p.grid) {
      if (std::find(rows.begin(), rows.end(), c.length) == rows.end()) rows.push_back(c.length);
    }
    const double cw = 46, ch = 24, left = 56, top = 34;
    const double w = left + cw * depths.size() + 8, ht = top + ch * rows.size() + 8;
    std::string s = "<svg class=\"needle-grid\" xmlns=\"http://www.w3.org/2000/svg\" width=\"" +
                    Num(w) + "\" height=\"" + Num(ht) +
                    "\"><text x=\"0\" y=\"12\" font-size=\"12\" font-weight=\"bold\">" +
                    Esc(leg.name) + "</text>";
    for (size_t d = 0; d < depths.size(); ++d) {
      s += "<text x=\"" + Num(left + cw * d + cw / 2) + "\" y=\"" + Num(top - 6) +
           "\" text-anchor=\"middle\" font-size=\"10\">" + std::to_string(depths[d]) + "%</text>";
    }
    for (size_t r = 0; r < rows.size(); ++r) {
      s += "<text x=\"" + Num(left - 4) + "\" y=\"" + Num(top + ch * r + ch / 2 + 4) +
           "\" text-anchor=\"end\" font-size=\"10\">" + std::to_string(rows[r]) + "</text>";
    }
    for (const probe::NeedleCell& c : p.grid) {
      const size_t r = std::find(rows.begin(), rows.end(), c.length) - rows.begin();
      size_t d = 0;
      while (d < depths.size() && depths[d] != c.depth) ++d;
      s += "<rect x=\"" + Num(left + cw * d) + "\" y=\"" + Num(top + ch * r) + "\" width=\"" +
           Num(cw - 2) + "\" height=\"" + Num(ch - 2) + "\" fill=\"" +
           (c.hit ? "#4caf50" : "#e53935") + "\"><title>expected " + Esc(c.expected) +
           ", answered " + Esc(c.answer) + "</title></rect>";
    }
    h += s + "</svg>";
  }
  return h + "</div>\n";
}

// The first 40 printed lines of every leg side by side; lines that are not the expected
// number are marked.
std::string CountingSideBySide(const ProbeReport& report) {
  std::string h = "<table class=\"counting\"><tr><th>line</th>";
  size_t max_lines = 0;
  for (const LegReport& leg : report.legs) {
    h += "<th>" + Esc(leg.name) + "</th>";
    if (leg.counting) max_lines = std::max(max_lines, leg.counting->analysis.first_40.size());
  }
  h += "</tr>";
  for (size_t l = 0; l < max_lines; ++l) {
    h += "<tr><td>" + std::to_string(l + 1) + "</td>";
    for (const LegReport& leg : report.legs) {
      const std::vector<std::string>* lines =
          leg.counting ? &leg.counting->analysis.first_40 : nullptr;
      if (lines && l < lines->size()) {
        const std::string& v = (*lines)[l];
        const bool ok = v == std::to_string(l + 1);
        h += std::string("<td") + (ok ? "" : " class=\"fail\"") + ">" + Esc(v.substr(0, 40)) +
             "</td>";
      } else {
        h += "<td></td>";
      }
    }
    h += "</tr>";
  }
  h += "</table>\n";
  return h;
}

// Relative RMS error of stored K and V per layer, one bar chart per non-reference leg.
std::string LayerBars(const ProbeReport& report) {
  std::string h = "<div class=\"grids\">";
  for (const LegReport& leg : report.legs) {
    if (!HasLayers(leg)) continue;
    const std::vector<probe::LayerError>& layers = *leg.divergence->layers;
    double hi = 0.01;
    for (const probe::LayerError& l : layers) hi = std::max({hi, l.k.rel_rms, l.v.rel_rms});
    const double bw = 12, gap = 10, left = 44, top = 24, plot = 120;
    const double w = left + layers.size() * (2 * bw + gap) + 10, ht = top + plot + 34;
    std::string s = "<svg class=\"layer-bars\" xmlns=\"http://www.w3.org/2000/svg\" width=\"" +
                    Num(std::max(w, 220.0)) + "\" height=\"" + Num(ht) +
                    "\"><text x=\"0\" y=\"12\" font-size=\"12\" font-weight=\"bold\">" +
                    Esc(leg.name) + " (rel. RMS, max " + Num(hi, "%.3g") + ")</text>";
    s += "<line x1=\"" + Num(left) + "\" x2=\"" + Num(w) + "\" y1=\"" + Num(top + plot) +
         "\" y2=\"" + Num(top + plot) + "\" stroke=\"#999\"/>";
    for (size_t i = 0; i < layers.size(); ++i) {
      const double x0 = left + i * (2 * bw + gap);
      for (int side = 0; side < 2; ++side) {
        const probe::SideError& st = side == 0 ? layers[i].k : layers[i].v;
        const double v = st.rel_rms;
        const double bh = plot * v / hi;
        s += "<rect x=\"" + Num(x0 + side * bw) + "\" y=\"" + Num(top + plot - bh) + "\" width=\"" +
             Num(bw - 1) + "\" height=\"" + Num(bh) + "\" fill=\"" +
             (side == 0 ? "#1f77b4" : "#ff7f0e") + "\"><title>layer " + std::to_string(i) +
             (side == 0 ? " K" : " V") + ": rel RMS " + Num(v) + ", bias " + Num(st.mean_error) +
             ", cosine " + Num(st.cosine, "%.6f") + "</title></rect>";
      }
      s += "<text x=\"" + Num(x0 + bw) + "\" y=\"" + Num(top + plot + 14) +
           "\" text-anchor=\"middle\" font-size=\"10\">" + std::to_string(i) + "</text>";
    }
    s += "<text x=\"" + Num(left) + "\" y=\"" + Num(ht - 4) +
         "\" font-size=\"10\"><tspan fill=\"#1f77b4\">K</tspan> <tspan fill=\"#ff7f0e\">V</tspan> "
         "by layer</text>";
    h += s + "</svg>";
  }
  return h + "</div>\n";
}

std::string LayerTable(const ProbeReport& report) {
  std::string h =
      "<table class=\"layers\"><tr><th>leg</th><th>layer</th><th>side</th><th>rel RMS</th>"
      "<th>prompt cells</th><th>decode cells</th><th>mean error</th><th>bias / "
      "RMS</th><th>cosine</th>"
      "<th>gain</th></tr>";
  for (const LegReport& leg : report.legs) {
    if (!HasLayers(leg)) continue;
    for (const probe::LayerError& l : *leg.divergence->layers) {
      for (int side = 0; side < 2; ++side) {
        const probe::SideError& st = side == 0 ? l.k : l.v;
        h += "<tr><td>" + Esc(leg.name) + "</td><td>" + std::to_string(l.layer) + "</td><td>" +
             (side == 0 ? "k" : "v") + "</td><td>" + Num(st.rel_rms) + "</td><td>" +
             Num(st.rel_rms_prompt_cells) + "</td><td>" + Num(st.rel_rms_decode_cells) +
             "</td><td>" + Num(st.mean_error) + "</td><td>" + Num(st.bias_rel) + "</td><td>" +
             Num(st.cosine, "%.6f") + "</td><td>" + Num(st.gain, "%.4f") + "</td></tr>";
      }
    }
  }
  return h + "</table>\n";
}

// The outputs of the JSON or copy probe, one row per item and leg.
template <typename Result>
std::string OutputsTable(const ProbeReport& report, std::optional<Result> LegReport::*probe) {
  std::string h = "<table class=\"outputs\"><tr><th>leg</th><th>item</th><th>output</th></tr>";
  for (const LegReport& leg : report.legs) {
    if (!(leg.*probe)) continue;
    const auto& items = (leg.*probe)->items;
    for (size_t k = 0; k < items.size(); ++k) {
      h += std::string("<tr><td>") + Esc(leg.name) + "</td><td>" + std::to_string(k) +
           "</td><td class=\"" + (items[k].exact ? "pass" : "fail") + "\"><pre>" +
           Esc(items[k].output.substr(0, 300)) + "</pre></td></tr>";
    }
  }
  return h + "</table>\n";
}

// The thinking probe's items, one row per item and leg: the thought, then the answer.
std::string ThinkingTable(const ProbeReport& report) {
  std::string h =
      "<table class=\"thinking\"><tr><th>leg</th><th>task</th><th>thought</th><th>answer</th>"
      "</tr>";
  for (const LegReport& leg : report.legs) {
    if (!leg.thinking) continue;
    for (const probe::ThinkingItem& it : leg.thinking->items) {
      h += "<tr><td>" + Esc(leg.name) + "</td><td>" + Esc(it.task) + "</td><td class=\"" +
           (it.closed ? "pass" : "fail") + "\"><pre>" + Esc(it.thought.substr(0, 300)) +
           (it.closed ? "" : " (not closed)") + "</pre></td><td class=\"" +
           (it.right ? "pass" : "fail") + "\"><pre>" + Esc(it.answer.substr(0, 300)) +
           "</pre></td></tr>";
    }
  }
  return h + "</table>\n";
}

}  // namespace

std::string RenderHtmlReport(const ProbeReport& report) {
  auto has = [&](ProbeKind kind) {
    return std::find(report.probes.begin(), report.probes.end(), kind) != report.probes.end();
  };
  std::string h =
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>lamina "
      "probe</title><style>"
      "body{font-family:sans-serif;margin:24px;color:#222}table{border-collapse:collapse;margin:"
      "8px 0}"
      "td,th{border:1px solid #ccc;padding:3px "
      "7px;font-size:13px;text-align:left;vertical-align:top}"
      ".pass{background:#e8f5e9}.fail{background:#ffebee}.na{background:#f5f5f5;color:#777}"
      ".grids svg{margin:6px 14px 6px 0}pre{margin:0;white-space:pre-wrap;max-width:640px}"
      "</style></head><body>\n";
  h += "<h1>lamina probe</h1><p>model <code>" + Esc(report.model) + "</code> (" + Esc(report.arch) +
       "), context " + std::to_string(report.n_ctx) + ", seed " + std::to_string(report.seed) +
       ": <b id=\"overall\" class=\"" +
       (report.pass ? "pass\">every leg passes" : "fail\">some leg fails") + "</b></p>\n";
  h += "<h2>Summary</h2>" + SummaryTable(report);
  if (has(ProbeKind::kDivergence)) {
    h += "<h2>KL divergence versus position</h2><p>Teacher-forced, KL(reference &#8741; leg); the "
         "first eighth is one "
         "prompt batch, every later token a single-token decode step.</p>" +
         KlChart(report);
    auto rows_table = [](const std::vector<std::vector<std::string>>& rows) {
      std::string t = "<table>";
      for (size_t r = 0; r < rows.size(); ++r) {
        t += "<tr>";
        for (const std::string& cell : rows[r]) {
          t += (r == 0 ? "<th>" : "<td>") + Esc(cell) + (r == 0 ? "</th>" : "</td>");
        }
        t += "</tr>";
      }
      return t + "</table>\n";
    };
    const auto by_position = KlByPositionRows(report);
    if (!by_position.empty()) {
      h += "<h2>KL by position</h2><p>Mean KL over each quarter of the text.</p>" +
           rows_table(by_position);
    }
    const auto by_distance = KlByDistanceRows(report);
    if (!by_distance.empty()) {
      h += "<h2>KL by distance</h2><p>With the R most recent cells kept exact a query reads "
           "only cells at distance &#8805; R from the compressed storage, so KL(0) &#8722; KL(R) "
           "is what the R most recent cells contribute; in brackets the share of the R = 0 KL "
           "left.</p>" +
           rows_table(by_distance);
    }
    h += "<h2>Stored versus exact K/V per layer</h2>" + LayerBars(report) + LayerTable(report);
  }
  if (has(ProbeKind::kNeedle)) {
    h += "<h2>Needle recall</h2><p>Rows: haystack tokens; columns: needle depth.</p>" +
         NeedleGrids(report);
  }
  if (has(ProbeKind::kCounting))
    h += "<h2>Counting, first 40 lines</h2>" + CountingSideBySide(report);
  if (has(ProbeKind::kJson)) h += "<h2>JSON outputs</h2>" + OutputsTable(report, &LegReport::json);
  if (has(ProbeKind::kSchema)) {
    h += "<h2>Constrained JSON outputs</h2><p>The same requests under a grammar of their schema: "
         "every output is schema-valid; green when it holds the values asked for.</p>" +
         OutputsTable(report, &LegReport::schema);
  }
  if (has(ProbeKind::kCopy)) h += "<h2>Copy outputs</h2>" + OutputsTable(report, &LegReport::copy);
  if (has(ProbeKind::kThinking)) {
    h += "<h2>Thinking</h2><p>Tasks asked with thinking on: the thought before &lt;/think&gt; "
         "(green when the block closed), then the answer (green when exact).</p>" +
         ThinkingTable(report);
  }
  return h + "</body></html>\n";
}

}  // namespace lamina::cli::probe_view
