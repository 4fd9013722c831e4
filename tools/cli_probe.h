// The tools side of `lamina probe`: the views of a typed probe report (the terminal table,
// probe.json, the self-contained HTML report) and the backend that probes an OpenAI-compatible
// server over HTTP (--url). The probe itself lives in src/probe/.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "probe/backend.h"
#include "probe/report.h"
#include "util/status.h"

namespace lamina::cli::probe_view {

// The table (one row per leg, one column per probe) and the verdict lines, as printed.
std::string ProbeTable(const probe::ProbeReport& report);

// The divergence probe's KL split two ways, as rows of cells (the first row is the header);
// empty when no non-reference leg measured it.
// By position: each leg's mean KL over each quarter of the text (later positions attend over
// more compressed cells).
std::vector<std::vector<std::string>> KlByPositionRows(const probe::ProbeReport& report);
// By distance: legs that differ only in their recent exact window R, side by side. With R cells
// kept exact a query reads only cells at distance >= R from the compressed storage, so
// KL(0) - KL(R) is what the R most recent cells contribute; each cell also gives the share of
// the R = 0 leg's KL that remains. Empty unless some mode ran with two or more windows.
std::vector<std::vector<std::string>> KlByDistanceRows(const probe::ProbeReport& report);

// probe.json: every number of the report.
nlohmann::json ProbeJson(const probe::ProbeReport& report);

// report.html: one page with inline CSS and SVG, no scripts, nothing fetched.
std::string RenderHtmlReport(const probe::ProbeReport& report);

}  // namespace lamina::cli::probe_view

namespace lamina::cli {

struct RemoteOptions {
  std::string url;      // http://host:port[/prefix]; a trailing /v1 is dropped
  std::string api_key;  // sent as "Authorization: Bearer KEY" when set
  std::string model;    // the request's "model"; empty: the server's first /v1/models entry
  int timeout_s = 600;  // per request
};

struct RemoteServer {
  std::unique_ptr<probe::ProbeBackend> backend;
  std::string model;  // the model id requests name ("" when the server lists none)
};

// Connects to the server (GET /v1/models) and returns its backend: greedy answers from
// POST /v1/chat/completions (temperature 0, max_tokens), token counts from POST /tokenize where
// the server has it (lamina serve, llama-server) and estimated from usage.prompt_tokens where it
// does not. No logits: the prefill and divergence probes are n/a on it. An error when the server
// cannot be reached.
Result<RemoteServer> ConnectRemote(const RemoteOptions& options);

}  // namespace lamina::cli
