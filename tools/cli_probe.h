// Internals of `lamina probe`: the legs under test, the context every probe receives, and the
// probes themselves. Results live in one JSON document (probe.json); the terminal table and the
// HTML report are views of it.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli_commands.h"
#include "model/model.h"
#include "runtime/kv_cache.h"
#include "runtime/session.h"
#include "util/thread_pool.h"

namespace lamina::cli::probe {

// One configuration under test. Every probe builds a fresh Session for it.
struct Leg {
  KvType kv = KvType::kF32;
  KvRounding v_round = KvRounding::kNearest;
  KvCache::Fault fault = KvCache::Fault::kNone;  // test-only (--inject-fault)
  std::string name;                              // "k8v4/rtn"
};

// Pass/fail rules; docs/KV.md (## Probe) states them.
struct Thresholds {
  double kl_mean_max = 0.05;    // divergence: mean KL(reference || leg) over the text
  double kl_bucket_max = 0.15;  // ... and in every position bucket
  double top1_min = 0.90;       // top-1 agreement with the reference
  double path_diff_max = 1e-3;  // |decode-path - prompt-path logits| within the leg
  double bias_rel_max = 0.05;   // |mean stored-exact K or V error| / RMS, any layer
  double keep_fraction = 0.75;  // needle/json/copy: keep this share of the reference's score
};

struct Context {
  const Model* model = nullptr;
  ThreadPool* pool = nullptr;
  ProbeOptions options;
  std::vector<Leg> legs;  // legs[0] is the reference
  int n_ctx = 0;
  Thresholds thresholds;
  std::string chat_template;        // tokenizer.chat_template, "" when absent
  std::vector<int> needle_lengths;  // haystack tokens
  std::vector<int> needle_depths;   // percent

  SessionConfig SessionFor(const Leg& leg) const;
  // A fresh session for the leg, with its test-only fault applied.
  std::unique_ptr<Session> NewSession(const Leg& leg) const;
};

// Wraps a user instruction in the model's chat template when it has one (the text then ends
// with the assistant header); otherwise returns it unchanged. `answer_prefix` follows either way.
std::string RenderPrompt(const Context& ctx, const std::string& user,
                         const std::string& answer_prefix);

struct Generation {
  std::vector<int32_t> tokens;
  std::string text;
  bool error = false;
  std::string error_message;
  bool ended_turn = false;  // the model chose end-of-generation (not the budget or `stop`)
};
// Greedy continuation of `prompt` (tokenized with BOS and special tokens) in a fresh session:
// up to max_tokens, stopping at end-of-generation or when stop(text) returns true.
Generation GenerateGreedy(const Context& ctx, const Leg& leg, const std::string& prompt,
                          int max_tokens, const std::function<bool(const std::string&)>& stop = {});

// Seeded filler sentences of plain English, about `n_tokens` tokens long for this tokenizer.
std::string FillerText(const Context& ctx, uint64_t seed, int n_tokens);

// Each probe fills report["legs"][i]["probes"][NAME] for every leg with at least
// "status" ("pass", "fail", "n/a" or "info"), "cell" (the table text) and, on failure, "reason".
void RunPrefillProbe(Context& ctx, nlohmann::json& report);
void RunCountingProbe(Context& ctx, nlohmann::json& report);
void RunNeedleProbe(Context& ctx, nlohmann::json& report);
void RunJsonProbe(Context& ctx, nlohmann::json& report);
void RunCopyProbe(Context& ctx, nlohmann::json& report);
// Teacher-forced KL, free-running divergence and the per-layer K/V diagnostics.
void RunDivergenceProbe(Context& ctx, nlohmann::json& report);

// Parses counting output: pass (1..n, then the end of the turn), first wrong line (n + 1 when the
// count runs on past n), longest repeat, skipped numbers, first 40 lines.
nlohmann::json AnalyzeCounting(const std::string& text, int n, bool ended_turn);

// Writes the self-contained HTML report of a probe.json document.
std::string RenderHtmlReport(const nlohmann::json& report);

}  // namespace lamina::cli::probe
