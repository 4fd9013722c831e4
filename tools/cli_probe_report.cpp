// The HTML view of a probe.json document: one self-contained page (inline CSS and SVG, no
// scripts, no network) with the summary table, KL-vs-position chart, needle heatmaps, counting
// outputs side by side and per-layer K/V error bars.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "cli_probe.h"

namespace lamina::cli::probe {

using nlohmann::json;

namespace {

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

std::string StatusClass(const json& p) {
  return p.value("status", "info") == "n/a" ? "na" : p.value("status", "info");
}

std::string SummaryTable(const json& report) {
  std::string h =
      "<table class=\"summary\"><tr><th>leg</th><th>kv / v-round</th><th>bits/elem</th>";
  for (const json& name : report["probes"]) h += "<th>" + Esc(name.get<std::string>()) + "</th>";
  h += "<th>verdict</th></tr>\n";
  for (const json& leg : report["legs"]) {
    h += "<tr><td>" + std::to_string(leg["index"].get<int>()) + "</td><td>" +
         Esc(leg["name"].get<std::string>()) +
         (leg["reference"].get<bool>() ? " (reference)" : "") + "</td><td>" +
         Num(leg["bits_per_element"].get<double>(), "%.2f") + "</td>";
    for (const json& name : report["probes"]) {
      const json& p = leg["probes"][name.get<std::string>()];
      std::string title = p.value("reason", "");
      h += "<td class=\"" + StatusClass(p) + "\" title=\"" + Esc(title) + "\">" +
           Esc(p.value("cell", "")) + (p.value("status", "") == "n/a" ? " (n/a)" : "") + "</td>";
    }
    h += "<td class=\"" + leg["verdict"].get<std::string>() + "\">" +
         (leg["verdict"] == "pass" ? "PASS" : "FAIL") + "</td></tr>\n";
  }
  h += "</table>\n<ul class=\"verdicts\">";
  for (const json& leg : report["legs"])
    h += "<li>" + Esc(leg["verdict_line"].get<std::string>()) + "</li>";
  return h + "</ul>\n";
}

// KL divergence versus position, one polyline per non-reference leg, log y axis.
std::string KlChart(const json& report) {
  const double w = 760, ht = 320, left = 60, right = 180, top = 16, bottom = 40;
  double max_pos = 1, lo = 1e-7, hi = 1e-3;
  for (const json& leg : report["legs"]) {
    const json& d = leg["probes"]["divergence"];
    if (!d.contains("chart")) continue;
    for (const json& b : d["chart"]) {
      max_pos = std::max(max_pos, b["to"].get<double>());
      if (!leg["reference"].get<bool>()) hi = std::max(hi, b["mean_kl"].get<double>());
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
  for (size_t i = 0; i < report["legs"].size(); ++i) {
    const json& leg = report["legs"][i];
    const json& d = leg["probes"]["divergence"];
    if (leg["reference"].get<bool>() || !d.contains("chart")) continue;
    std::string pts;
    for (const json& b : d["chart"]) {
      const double mid = (b["from"].get<double>() + b["to"].get<double>()) / 2;
      pts += Num(x(mid), "%.1f") + "," + Num(y(b["mean_kl"].get<double>()), "%.1f") + " ";
    }
    s += "<polyline class=\"kl-line\" fill=\"none\" stroke-width=\"2\" stroke=\"" + Color(i) +
         "\" points=\"" + pts + "\"/>";
    const double ly = top + 14 + 16 * row++;
    s += "<line x1=\"" + Num(w - right + 10) + "\" x2=\"" + Num(w - right + 30) + "\" y1=\"" +
         Num(ly - 4) + "\" y2=\"" + Num(ly - 4) + "\" stroke-width=\"2\" stroke=\"" + Color(i) +
         "\"/><text x=\"" + Num(w - right + 34) + "\" y=\"" + Num(ly) + "\" font-size=\"11\">" +
         Esc(leg["name"].get<std::string>()) + "</text>";
  }
  return s + "</svg>\n";
}

// One heatmap per leg: rows are haystack lengths, columns needle depths; green = recalled.
std::string NeedleGrids(const json& report) {
  std::string h = "<div class=\"grids\">";
  for (const json& leg : report["legs"]) {
    const json& p = leg["probes"]["needle"];
    if (!p.contains("grid")) continue;
    const json& lengths = p["lengths"];
    const json& depths = p["depths"];
    std::vector<int> rows;
    for (const json& c : p["grid"]) {
      if (std::find(rows.begin(), rows.end(), c["length"].get<int>()) == rows.end())
        rows.push_back(c["length"]);
    }
    (void)lengths;
    const double cw = 46, ch = 24, left = 56, top = 34;
    const double w = left + cw * depths.size() + 8, ht = top + ch * rows.size() + 8;
    std::string s = "<svg class=\"needle-grid\" xmlns=\"http://www.w3.org/2000/svg\" width=\"" +
                    Num(w) + "\" height=\"" + Num(ht) +
                    "\"><text x=\"0\" y=\"12\" font-size=\"12\" font-weight=\"bold\">" +
                    Esc(leg["name"].get<std::string>()) + "</text>";
    for (size_t d = 0; d < depths.size(); ++d) {
      s += "<text x=\"" + Num(left + cw * d + cw / 2) + "\" y=\"" + Num(top - 6) +
           "\" text-anchor=\"middle\" font-size=\"10\">" + std::to_string(depths[d].get<int>()) +
           "%</text>";
    }
    for (size_t r = 0; r < rows.size(); ++r) {
      s += "<text x=\"" + Num(left - 4) + "\" y=\"" + Num(top + ch * r + ch / 2 + 4) +
           "\" text-anchor=\"end\" font-size=\"10\">" + std::to_string(rows[r]) + "</text>";
    }
    for (const json& c : p["grid"]) {
      const size_t r = std::find(rows.begin(), rows.end(), c["length"].get<int>()) - rows.begin();
      size_t d = 0;
      while (d < depths.size() && depths[d] != c["depth"]) ++d;
      const bool hit = c["hit"].get<bool>();
      s += "<rect x=\"" + Num(left + cw * d) + "\" y=\"" + Num(top + ch * r) + "\" width=\"" +
           Num(cw - 2) + "\" height=\"" + Num(ch - 2) + "\" fill=\"" +
           (hit ? "#4caf50" : "#e53935") + "\"><title>expected " +
           Esc(c["expected"].get<std::string>()) + ", answered " +
           Esc(c["answer"].get<std::string>()) + "</title></rect>";
    }
    h += s + "</svg>";
  }
  return h + "</div>\n";
}

// The first 40 printed lines of every leg side by side; lines that are not the expected
// number are marked.
std::string CountingSideBySide(const json& report) {
  std::string h = "<table class=\"counting\"><tr><th>line</th>";
  size_t max_lines = 0;
  for (const json& leg : report["legs"]) {
    h += "<th>" + Esc(leg["name"].get<std::string>()) + "</th>";
    if (leg["probes"].contains("counting"))
      max_lines = std::max(max_lines, leg["probes"]["counting"]["first_40"].size());
  }
  h += "</tr>";
  for (size_t l = 0; l < max_lines; ++l) {
    h += "<tr><td>" + std::to_string(l + 1) + "</td>";
    for (const json& leg : report["legs"]) {
      const json& lines = leg["probes"]["counting"]["first_40"];
      if (l < lines.size()) {
        const std::string v = lines[l].get<std::string>();
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
std::string LayerBars(const json& report) {
  std::string h = "<div class=\"grids\">";
  for (const json& leg : report["legs"]) {
    const json& d = leg["probes"]["divergence"];
    if (leg["reference"].get<bool>() || !d.contains("layers") || !d["layers"].is_array()) continue;
    const json& layers = d["layers"];
    double hi = 0.01;
    for (const json& l : layers)
      hi = std::max({hi, l["k"]["rel_rms"].get<double>(), l["v"]["rel_rms"].get<double>()});
    const double bw = 12, gap = 10, left = 44, top = 24, plot = 120;
    const double w = left + layers.size() * (2 * bw + gap) + 10, ht = top + plot + 34;
    std::string s = "<svg class=\"layer-bars\" xmlns=\"http://www.w3.org/2000/svg\" width=\"" +
                    Num(std::max(w, 220.0)) + "\" height=\"" + Num(ht) +
                    "\"><text x=\"0\" y=\"12\" font-size=\"12\" font-weight=\"bold\">" +
                    Esc(leg["name"].get<std::string>()) + " (rel. RMS, max " + Num(hi, "%.3g") +
                    ")</text>";
    s += "<line x1=\"" + Num(left) + "\" x2=\"" + Num(w) + "\" y1=\"" + Num(top + plot) +
         "\" y2=\"" + Num(top + plot) + "\" stroke=\"#999\"/>";
    for (size_t i = 0; i < layers.size(); ++i) {
      const double x0 = left + i * (2 * bw + gap);
      for (int side = 0; side < 2; ++side) {
        const json& st = layers[i][side == 0 ? "k" : "v"];
        const double v = st["rel_rms"].get<double>();
        const double bh = plot * v / hi;
        s += "<rect x=\"" + Num(x0 + side * bw) + "\" y=\"" + Num(top + plot - bh) + "\" width=\"" +
             Num(bw - 1) + "\" height=\"" + Num(bh) + "\" fill=\"" +
             (side == 0 ? "#1f77b4" : "#ff7f0e") + "\"><title>layer " + std::to_string(i) +
             (side == 0 ? " K" : " V") + ": rel RMS " + Num(v) + ", bias " +
             Num(st["mean_error"].get<double>()) + ", cosine " +
             Num(st["cosine"].get<double>(), "%.6f") + "</title></rect>";
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

std::string LayerTable(const json& report) {
  std::string h =
      "<table class=\"layers\"><tr><th>leg</th><th>layer</th><th>side</th><th>rel RMS</th>"
      "<th>prompt cells</th><th>decode cells</th><th>mean error</th><th>bias / "
      "RMS</th><th>cosine</th>"
      "<th>gain</th></tr>";
  for (const json& leg : report["legs"]) {
    const json& d = leg["probes"]["divergence"];
    if (leg["reference"].get<bool>() || !d.contains("layers") || !d["layers"].is_array()) continue;
    for (const json& l : d["layers"]) {
      for (const char* side : {"k", "v"}) {
        const json& st = l[side];
        h += "<tr><td>" + Esc(leg["name"].get<std::string>()) + "</td><td>" +
             std::to_string(l["layer"].get<int>()) + "</td><td>" + side + "</td><td>" +
             Num(st["rel_rms"]) + "</td><td>" + Num(st["rel_rms_prompt_cells"]) + "</td><td>" +
             Num(st["rel_rms_decode_cells"]) + "</td><td>" + Num(st["mean_error"]) + "</td><td>" +
             Num(st["bias_rel"]) + "</td><td>" + Num(st["cosine"], "%.6f") + "</td><td>" +
             Num(st["gain"], "%.4f") + "</td></tr>";
      }
    }
  }
  return h + "</table>\n";
}

std::string OutputsTable(const json& report, const char* probe) {
  std::string h = "<table class=\"outputs\"><tr><th>leg</th><th>item</th><th>output</th></tr>";
  for (const json& leg : report["legs"]) {
    const json& p = leg["probes"][probe];
    if (!p.contains("items")) continue;
    for (size_t k = 0; k < p["items"].size(); ++k) {
      const json& it = p["items"][k];
      h += std::string("<tr><td>") + Esc(leg["name"].get<std::string>()) + "</td><td>" +
           std::to_string(k) + "</td><td class=\"" + (it["exact"].get<bool>() ? "pass" : "fail") +
           "\"><pre>" + Esc(it["output"].get<std::string>().substr(0, 300)) + "</pre></td></tr>";
    }
  }
  return h + "</table>\n";
}

}  // namespace

std::string RenderHtmlReport(const json& report) {
  auto has = [&](const char* probe) {
    for (const json& p : report["probes"]) {
      if (p == probe) return true;
    }
    return false;
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
  h += "<h1>lamina probe</h1><p>model <code>" + Esc(report["model"].get<std::string>()) +
       "</code> (" + Esc(report["arch"].get<std::string>()) + "), context " +
       std::to_string(report["n_ctx"].get<int>()) + ", seed " +
       std::to_string(report["seed"].get<uint64_t>()) + ": <b id=\"overall\" class=\"" +
       (report["pass"].get<bool>() ? "pass\">every leg passes" : "fail\">some leg fails") +
       "</b></p>\n";
  h += "<h2>Summary</h2>" + SummaryTable(report);
  if (has("divergence")) {
    h += "<h2>KL divergence versus position</h2><p>Teacher-forced, KL(reference &#8741; leg); the "
         "first eighth is one "
         "prompt batch, every later token a single-token decode step.</p>" +
         KlChart(report);
    h += "<h2>Stored versus exact K/V per layer</h2>" + LayerBars(report) + LayerTable(report);
  }
  if (has("needle"))
    h += "<h2>Needle recall</h2><p>Rows: haystack tokens; columns: needle depth.</p>" +
         NeedleGrids(report);
  if (has("counting")) h += "<h2>Counting, first 40 lines</h2>" + CountingSideBySide(report);
  if (has("json")) h += "<h2>JSON outputs</h2>" + OutputsTable(report, "json");
  if (has("copy")) h += "<h2>Copy outputs</h2>" + OutputsTable(report, "copy");
  return h + "</body></html>\n";
}

}  // namespace lamina::cli::probe
