// The shared option validators (cli_options.h).
#include "cli_options.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "cli_commands.h"

namespace lamina::cli {

namespace {

bool ParseFinite(const std::string& s, double* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size() || errno == ERANGE || !std::isfinite(v)) return false;
  *out = v;
  return true;
}

bool ParseInt(const std::string& s, int64_t* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (end != s.c_str() + s.size() || errno == ERANGE) return false;
  *out = v;
  return true;
}

int Cores() {
  const unsigned n = std::thread::hardware_concurrency();
  return n > 0 ? static_cast<int>(n) : 1;
}

}  // namespace

CLI::Validator Threads() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        const int cores = Cores();
        const int64_t max = static_cast<int64_t>(kMaxThreadsPerCore) * cores;
        int64_t v = 0;
        if (!ParseInt(s, &v) || v < 0 || v > max) {
          return "must be 0 (all cores) .. " + std::to_string(max) + " (" +
                 std::to_string(kMaxThreadsPerCore) + " x the " + std::to_string(cores) +
                 " cores), got " + s;
        }
        if (v > cores) {
          std::fprintf(stderr,
                       "lamina: warning: %lld threads on %d cores; threads will share cores and "
                       "run slower\n",
                       static_cast<long long>(v), cores);
        }
        return "";
      },
      "0..4xCORES");
}

CLI::Validator InRange(const ValueRange& range) {
  return CLI::Validator(
      [range](std::string& s) -> std::string {
        double v = NAN;  // stays NaN (out of every range) when s is no number of its kind
        int64_t i = 0;
        if (range.integer && ParseInt(s, &i)) v = static_cast<double>(i);
        if (!range.integer) ParseFinite(s, &v);
        return CheckRange(range, v, s).value_or("");
      },
      range.What());
}

CLI::Validator Probability() { return InRange(kProbabilityRange); }
CLI::Validator Positive() { return InRange(kPositiveRange); }
CLI::Validator NonNegativeFinite() { return InRange(kNonNegativeRange); }
CLI::Validator Temperature() { return InRange(kTemperatureRange); }
CLI::Validator IntRange(int64_t lo, int64_t hi) { return InRange(IntegerRange(lo, hi)); }

CLI::Validator Seed() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        char* end = nullptr;
        errno = 0;
        const bool digits = !s.empty() && s.find_first_not_of("0123456789") == std::string::npos;
        if (!digits || (std::strtoull(s.c_str(), &end, 10), errno == ERANGE)) {
          return "must be an integer in [0, 2^64), got " + s;
        }
        return "";
      },
      "SEED");
}

CLI::Validator ContextSize() { return InRange(kContextSizeRange); }

int ParseErrorExit(const CLI::App& app, const CLI::ParseError& e) {
  if (e.get_exit_code() == 0) return app.exit(e);  // --help and the like
  std::fprintf(stderr, "lamina: %s\n", e.what());
  return kExitUsage;
}

}  // namespace lamina::cli
