// Internals of the probe library shared by probe.cpp, tasks.cpp and measure.cpp: the context of
// one run and the probes themselves. Each probe returns one result per leg, in leg order.
#pragma once

#include <cstdint>
#include <optional>
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

// A generation budget for `text` on leg `leg`: its token count, or its byte count (a bound for
// any tokenizer) where the backend only estimates token counts.
int TokenBudget(const RunContext& ctx, size_t leg, const std::string& text);
// `s` without leading and trailing white space.
std::string Trim(const std::string& s);
// Index of the first byte where a and b differ; -1 when equal.
int64_t FirstDifference(const std::string& a, const std::string& b);
// The first (item, byte) where a leg's outputs differ from the reference's; none when equal.
std::optional<OutputDifference> FirstDifferenceFromReference(const std::vector<std::string>& outs,
                                                             const std::vector<std::string>& ref);
// A rate-style verdict: fail on a generation error (the first one), n/a when the reference
// scores 0, fail when the leg keeps less than keep_fraction of the reference's score.
void RateVerdict(const RunContext& ctx, Outcome& o, double leg_score, double ref_score,
                 const std::string& what, const std::string& na_reason, const std::string& error);
// A seeded list of n_items "color thing" lines (the copy tasks' phrasing), joined by newlines.
std::string SeededList(uint64_t seed, int n_items);

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
// Counting up, counting down and a copy asked with thinking on (thinking.cpp).
std::vector<ThinkingResult> RunThinkingProbe(const RunContext& ctx);
// Teacher-forced KL, free-running divergence and the per-layer K/V diagnostics.
std::vector<DivergenceResult> RunDivergenceProbe(const RunContext& ctx);

}  // namespace lamina::probe
