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

CLI::Validator RealRange(double lo, double hi, bool lo_open, const std::string& what) {
  return CLI::Validator(
      [=](std::string& s) -> std::string {
        double v = 0;
        if (!ParseFinite(s, &v) || v < lo || v > hi || (lo_open && v == lo)) {
          return "must be " + what + ", got " + s;
        }
        return "";
      },
      what);
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

CLI::Validator Probability() { return RealRange(0.0, 1.0, false, "a probability in [0, 1]"); }
CLI::Validator Positive() { return RealRange(0.0, 1e30, true, "a finite number > 0"); }
CLI::Validator NonNegativeFinite() { return RealRange(0.0, 1e30, false, "a finite number >= 0"); }
CLI::Validator Temperature() { return RealRange(0.0, 100.0, false, "a temperature in [0, 100]"); }

CLI::Validator IntRange(int64_t lo, int64_t hi) {
  const std::string what = "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  return CLI::Validator(
      [=](std::string& s) -> std::string {
        int64_t v = 0;
        if (!ParseInt(s, &v) || v < lo || v > hi) return "must be " + what + ", got " + s;
        return "";
      },
      what);
}

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

CLI::Validator ContextSize() { return IntRange(0, int64_t{1} << 30); }

int ParseErrorExit(const CLI::App& app, const CLI::ParseError& e) {
  if (e.get_exit_code() == 0) return app.exit(e);  // --help and the like
  std::fprintf(stderr, "lamina: %s\n", e.what());
  return kExitUsage;
}

}  // namespace lamina::cli
