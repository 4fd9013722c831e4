// The typed results of a probe run: one LegReport per leg, holding one result struct per probe
// that ran (its status, table cell and reason, then the probe's own numbers and outputs), and the
// leg's verdict. probe.json, the terminal table and the HTML report (tools/) are views of these.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace lamina::probe {

enum class ProbeKind {
  kPrefill,
  kCounting,
  kNeedle,
  kJson,
  kSchema,
  kCopy,
  kThinking,
  kDivergence
};
inline constexpr ProbeKind kAllProbes[] = {
    ProbeKind::kPrefill, ProbeKind::kCounting, ProbeKind::kNeedle,   ProbeKind::kJson,
    ProbeKind::kSchema,  ProbeKind::kCopy,     ProbeKind::kThinking, ProbeKind::kDivergence};
// "prefill", "counting", "needle", "json", "schema", "copy", "thinking", "divergence".
const char* ProbeName(ProbeKind kind);
// The inverse of ProbeName; false when `name` is none of them.
bool ParseProbeName(const std::string& name, ProbeKind* out);

enum class Status { kPass, kFail, kNotApplicable, kInfo };
// "pass", "fail", "n/a", "info".
const char* StatusName(Status status);

// Pass/fail rules; docs/KV.md (## Probe) states them.
struct Thresholds {
  double kl_mean_max = 0.05;    // divergence: mean KL(reference || leg) over the text
  double kl_bucket_max = 0.15;  // ... and in every position bucket
  double top1_min = 0.90;       // top-1 agreement with the reference
  double path_diff_max = 1e-3;  // |decode-path - prompt-path logits| within the leg
  double bias_rel_max = 0.05;   // |mean stored-exact K or V error| / RMS, any layer
  double keep_fraction = 0.75;  // needle/json/copy: keep this share of the reference's score
};

// What every probe of every leg reports.
struct Outcome {
  Status status = Status::kInfo;
  std::string cell;    // the table text
  std::string reason;  // why it failed or is n/a; "" otherwise
};

// The first (item, byte) where a leg's outputs differ from the reference leg's.
struct OutputDifference {
  int item = 0;
  int64_t byte = 0;
};

struct PrefillResult {
  Outcome outcome;
  int tokens = 0;
  double seconds = 0.0;
  bool measured = false;  // false: the batch failed (outcome says why) or the leg has no logits
  double tok_s = 0.0;
  double last_logits_max_abs_diff = 0.0;  // against the reference leg
  double last_logits_kl = 0.0;
  bool last_top1_same = false;
};

// Counting output parsed (AnalyzeCounting).
struct CountingAnalysis {
  int n = 0;
  bool pass = false;             // 1..n, then the end of the turn
  bool sequence_ok = false;      // 1..n
  bool stopped_after_n = false;  // the turn ended right after n
  bool ended_turn = false;
  int lines = 0;                      // non-empty lines
  int first_wrong_line = -1;          // 1-based; n + 1 when only the stop is missing; -1: none
  std::string first_wrong_text;       // that line, "(no end of turn)" or "(missing)"
  int64_t longest_repeat_value = -1;  // the number repeated on most consecutive lines
  int longest_repeat_length = 0;
  int skipped_count = 0;              // numbers in 1..max printed that never appear
  std::vector<int64_t> skipped;       // the first 40 of them
  std::vector<std::string> first_40;  // the first 40 lines as printed (trimmed)
};

struct CountingResult {
  Outcome outcome;
  CountingAnalysis analysis;
  std::string text;  // the first 4000 bytes of the output
  int generated_tokens = 0;
  std::string error;  // a generation error; "" when none
  std::string note;   // a pass with a remark (no end of turn where the reference has none)
};

struct NeedleCell {
  int length = 0;  // haystack tokens
  int depth = 0;   // percent
  std::string expected;
  std::string answer;  // trimmed
  bool hit = false;
  std::string error;  // a generation error; "" when none
};

struct NeedleResult {
  Outcome outcome;
  std::vector<NeedleCell> grid;
  std::vector<int> lengths;
  std::vector<int> depths;
  std::vector<int> skipped_lengths;  // too long for the context
  int hits = 0;
  int cells = 0;
  double recall = 0.0;
};

struct JsonItem {
  std::string output;
  bool valid = false;
  bool exact = false;
  std::string expected;  // the object asked for, compact JSON with sorted keys
  std::string error;     // a generation error; "" when none
};

struct JsonResult {
  Outcome outcome;
  std::vector<JsonItem> items;
  double valid_rate = 0.0;
  double exact_rate = 0.0;
  std::optional<OutputDifference> first_difference;
};

struct CopyItem {
  std::string expected;
  std::string output;
  bool exact = false;
  int64_t first_wrong_byte = -1;  // -1: none
  std::string error;              // a generation error; "" when none
};

struct CopyResult {
  Outcome outcome;
  std::vector<CopyItem> items;
  double exact_rate = 0.0;
  std::optional<OutputDifference> first_difference;
};

// One task of the thinking probe, asked with the model's thinking on: the plan it writes first
// (before </think>), then the answer graded as the plain probe of that task grades it.
struct ThinkingItem {
  std::string task;      // "count 1..20", "count down 12..1", "copy 10 items"
  std::string expected;  // the answer asked for
  std::string output;    // the whole text as generated (thought, </think>, answer)
  std::string thought;   // the text before </think>, trimmed (a leading <think> dropped)
  std::string answer;    // the text after </think>, trimmed ("" when the block never closed)
  bool closed = false;   // </think> was written
  bool right = false;    // closed, and the answer is the one asked for
  std::string error;     // a generation error; "" when none
};

struct ThinkingResult {
  Outcome outcome;
  std::vector<ThinkingItem> items;
  int closed = 0;  // items whose thought closed
  int right = 0;   // items whose thought closed and whose answer is right
  // The first (item, byte) where the whole texts differ from the reference leg's; none when
  // byte-identical.
  std::optional<OutputDifference> first_difference;
};

// Stored-vs-exact error of one side (K or V) of one layer.
struct SideError {
  double rel_rms = 0.0;  // RMS(stored - exact) / RMS(exact)
  double mean_error = 0.0;
  double bias_rel = 0.0;  // mean_error / RMS(exact)
  double cosine = 0.0;
  double gain = 0.0;  // <stored, exact> / <exact, exact>
  double rel_rms_prompt_cells = 0.0;
  double rel_rms_decode_cells = 0.0;
};

struct LayerError {
  int layer = 0;
  SideError k;
  SideError v;
};

// KL and top-1 agreement over positions [from, to).
struct KlBucket {
  int from = 0;
  int to = 0;
  double mean_kl = 0.0;
  double max_kl = 0.0;
  double top1 = 0.0;
};

struct DivergenceResult {
  Outcome outcome;
  int tokens = 0;
  int prompt_tokens = 0;
  int decode_steps = 0;
  bool reference = false;
  bool measured = false;  // false: an evaluation failed (outcome says why) or no logits
  double kl_mean = 0.0;
  double kl_p99 = 0.0;
  double kl_max = 0.0;
  double top1_agreement = 0.0;
  std::vector<KlBucket> buckets;   // quarters of the positions
  std::vector<KlBucket> chart;     // up to 32 buckets, for the report's chart
  double path_max_abs_diff = 0.0;  // decode path against prompt path, sampled logits
  int path_first_mismatch = -1;    // -1: none
  int free_run_tokens = 0;
  int free_run_first_difference = -1;  // -1: none
  std::string free_run_text;
  // Per layer, non-reference legs with both caches readable; nullopt otherwise.
  std::optional<std::vector<LayerError>> layers;
};

struct LegReport {
  int index = 0;
  std::string name;     // "k8v4/rtn", "int8/rtn+biased-v", a server's name
  std::string kv;       // "k8v4"; "" when the backend does not say (a server)
  std::string v_round;  // "rtn"; "" likewise
  bool reference = false;
  std::string fault = "none";
  std::optional<double> bits_per_element;
  std::optional<size_t> bytes_per_token;
  std::optional<int> kv_window;  // recent cells kept exact (0: none)
  std::optional<PrefillResult> prefill;
  std::optional<CountingResult> counting;
  std::optional<NeedleResult> needle;
  std::optional<JsonResult> json;
  // The constrained-JSON probe: the JSON probe's objects asked for under a grammar of their
  // schema; valid = schema-valid (the grammar guarantees it), exact = the values asked for.
  std::optional<JsonResult> schema;
  std::optional<CopyResult> copy;
  // The thinking probe: tasks asked with thinking on; right = the thought closed and the answer
  // is exact.
  std::optional<ThinkingResult> thinking;
  std::optional<DivergenceResult> divergence;
  bool pass = false;
  std::string verdict_line;  // "leg 2 k8v4/rtn: PASS — mean KL ..., top-1 ..."

  // The outcome of one probe; nullptr when it did not run.
  const Outcome* outcome(ProbeKind kind) const;
};

struct ProbeReport {
  std::string model;  // what was probed: a GGUF path, a server's URL
  std::string arch;   // the model's architecture; "remote" for a server
  int n_ctx = 0;
  uint64_t seed = 0;
  std::string chat_template;  // "yes", "none", or "server" (the server applies its own)
  std::vector<ProbeKind> probes;
  Thresholds thresholds;
  std::vector<LegReport> legs;  // legs[0] is the reference
  double seconds = 0.0;
  bool pass = false;  // every leg passes
};

}  // namespace lamina::probe
