// The probe as a library: "is this KV mode safe for my model and my work?" Each leg (a
// configuration under test, reached through a caller-supplied ProbeBackend) runs every chosen
// probe in fresh sequences; legs[0] is the reference the others are judged against. RunProbe
// returns typed results (report.h); docs/KV.md (## Probe) describes the probes and their rules.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "probe/backend.h"
#include "probe/report.h"

namespace lamina::probe {

struct ProbeConfig {
  std::vector<ProbeKind> probes;                          // run in this order
  int n_ctx = 4096;                                       // context of every sequence
  std::vector<int> needle_lengths = {1024, 2048, 4096};   // haystack tokens
  std::vector<int> needle_depths = {10, 30, 50, 70, 90};  // percent
  int count_to = 300;
  int divergence_tokens = 1024;  // teacher-forced text (capped by the context)
  int free_run_tokens = 128;
  std::optional<std::string> text;  // divergence text; nullopt: seeded filler sentences
  uint64_t seed = 0;                // texts and needles
  Thresholds thresholds;
  // Progress lines ("probe counting: leg 1/3 f16"); none when empty.
  std::function<void(const std::string&)> progress;
};

// One configuration under test.
struct Leg {
  std::string name;  // "k8v4/rtn"
  std::unique_ptr<ProbeBackend> backend;
};

// Runs config.probes over the legs (at least one) and judges every leg. The report's model,
// arch and chat_template are the caller's to fill.
ProbeReport RunProbe(const ProbeConfig& config, std::vector<Leg>& legs);

// Parses counting output: pass (1..n, then the end of the turn), first wrong line (n + 1 when
// the count runs on past n), longest repeat, skipped numbers, first 40 lines.
CountingAnalysis AnalyzeCounting(const std::string& text, int n, bool ended_turn);

}  // namespace lamina::probe
