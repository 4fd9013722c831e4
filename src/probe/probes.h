// Internals of the probe library shared by probe.cpp, tasks.cpp and measure.cpp: the context of
// one run and the probes themselves. Each probe returns one result per leg, in leg order.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "probe/probe.h"

namespace lamina::probe {

struct RunContext {
  const ProbeConfig& config;
  std::vector<Leg>& legs;         // legs[0] is the reference
  std::vector<BackendInfo> info;  // [legs]

  // The reference leg's backend, which sizes and tokenizes the shared texts.
  ProbeBackend& reference() const { return *legs[0].backend; }
  // "probe NAME: leg I/N LEG" to config.progress.
  void Progress(const char* probe, size_t leg) const;
};

// Tokens `text` takes for the reference's model (an estimate for some backends).
int TokenCount(const RunContext& ctx, const std::string& text);
// Seeded filler sentences of plain English, about `n_tokens` tokens long for this model.
std::string FillerText(const RunContext& ctx, uint64_t seed, int n_tokens);

std::vector<PrefillResult> RunPrefillProbe(const RunContext& ctx);
std::vector<CountingResult> RunCountingProbe(const RunContext& ctx);
std::vector<NeedleResult> RunNeedleProbe(const RunContext& ctx);
std::vector<JsonResult> RunJsonProbe(const RunContext& ctx);
// The JSON probe's requests under a grammar of their schema (constrained decoding).
std::vector<JsonResult> RunSchemaProbe(const RunContext& ctx);
std::vector<CopyResult> RunCopyProbe(const RunContext& ctx);
// Teacher-forced KL, free-running divergence and the per-layer K/V diagnostics.
std::vector<DivergenceResult> RunDivergenceProbe(const RunContext& ctx);

}  // namespace lamina::probe
