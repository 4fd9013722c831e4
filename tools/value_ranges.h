// The ranges numeric settings may take, written once for the command line's validators
// (cli_options.h) and the server's request fields (server/api.cpp), so that a flag and the
// request field it defaults refuse the same values with the same words. Header-only and free
// of CLI11 and JSON, so the request mapping compiles without either.
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace lamina::cli {

// A closed range [lo, hi] (or (lo, hi] with lo_open) of finite numbers, whole ones only when
// `integer`. `what` names it in messages ("a temperature in [0, 100]"); empty for integer
// ranges, which are named "an integer in [lo, hi]".
struct ValueRange {
  double lo = 0.0;
  double hi = 0.0;
  bool lo_open = false;
  bool integer = false;
  std::string_view what;

  bool Contains(double v) const {
    return std::isfinite(v) && v >= lo && v <= hi && !(lo_open && v == lo) &&
           (!integer || v == std::floor(v));
  }
  std::string What() const {
    if (!what.empty()) return std::string(what);
    return "an integer in [" + std::to_string(static_cast<long long>(lo)) + ", " +
           std::to_string(static_cast<long long>(hi)) + "]";
  }
};

constexpr ValueRange IntegerRange(int64_t lo, int64_t hi) {
  return {static_cast<double>(lo), static_cast<double>(hi), false, true, {}};
}

// "must be <what>, got <shown>" when v is outside r (NaN and infinities always are).
inline std::optional<std::string> CheckRange(const ValueRange& r, double v,
                                             const std::string& shown) {
  if (r.Contains(v)) return std::nullopt;
  return "must be " + r.What() + ", got " + shown;
}

// Sampling: 0 is greedy; above 100 every candidate is as likely as any other anyway.
inline constexpr ValueRange kTemperatureRange{0.0, 100.0, false, false,
                                              "a temperature in [0, 100]"};
// top-p, min-p, speculative p-min.
inline constexpr ValueRange kProbabilityRange{0.0, 1.0, false, false, "a probability in [0, 1]"};
// Penalties (1: off).
inline constexpr ValueRange kPositiveRange{0.0, 1e30, true, false, "a finite number > 0"};
// Scales where 0 means "the model's"; mirostat's tau and eta, DRY's multiplier and base.
inline constexpr ValueRange kNonNegativeRange{0.0, 1e30, false, false, "a finite number >= 0"};
// OpenAI's presence_penalty and frequency_penalty (0: off).
inline constexpr ValueRange kOpenAiPenaltyRange{-2.0, 2.0, false, false, "a number in [-2, 2]"};
// mirostat: 0 (off), 1 or 2 (the version).
inline constexpr ValueRange kMirostatRange = IntegerRange(0, 2);
// dry_allowed_length: repeats this long go unpenalized.
inline constexpr ValueRange kDryAllowedLengthRange = IntegerRange(0, 1 << 20);
// top-k (0: off): beyond any vocabulary.
inline constexpr ValueRange kTopKRange = IntegerRange(0, 1 << 20);
// repeat_last_n and dry_penalty_last_n: the tokens the penalty looks back (0: off; -1: the whole
// context, as llama-server takes it in a request).
inline constexpr ValueRange kRepeatLastNRange = IntegerRange(-1, 1 << 20);
// n_predict / max_tokens (-1: until a stop rule or the slot is full), as `serve -n`.
inline constexpr ValueRange kNPredictRange = IntegerRange(-1, 1 << 24);
// Context sizes (0: the model's). Larger fit in no memory.
inline constexpr ValueRange kContextSizeRange = IntegerRange(0, int64_t{1} << 30);
// Server slots (--parallel) and a request's slot id (-1: the scheduler picks).
inline constexpr int kMaxSlots = 256;
inline constexpr ValueRange kSlotIdRange = IntegerRange(-1, kMaxSlots - 1);
// n_keep: prompt tokens a context shift keeps (-1: the whole prompt).
inline constexpr ValueRange kNKeepRange = IntegerRange(-1, int64_t{1} << 30);
// Speculative drafts per verify step, below the KV window's slack (kKvWindowSlack = 64): a
// rejected draft is cut back within it. -1 in a request: the server's setting.
inline constexpr ValueRange kDraftTokensRange = IntegerRange(-1, 63);

}  // namespace lamina::cli
