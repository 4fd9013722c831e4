// The shared option validators (cli_options.h).
#include "cli_options.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "cli_commands.h"
#include "cli_common.h"
#include "runtime/sampler.h"

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

namespace {

// Optimal string alignment distance: insertions, deletions, substitutions and swaps of two
// neighbouring characters each count one.
size_t EditDistance(const std::string& a, const std::string& b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[a.size()][b.size()];
}

std::string StripDashes(const std::string& s) {
  const size_t i = s.find_first_not_of('-');
  return i == std::string::npos ? "" : s.substr(i);
}

// The subcommand whose arguments were left over (CLI11's ExtrasError), else `app` itself.
const CLI::App& AppWithExtras(const CLI::App& app) {
  for (const CLI::App* sub : app.get_subcommands()) {
    if (!sub->remaining().empty()) return AppWithExtras(*sub);
  }
  return app;
}

std::vector<std::string> LongOptionNames(const CLI::App& cmd) {
  std::vector<std::string> names;
  for (const CLI::Option* opt : cmd.get_options()) {
    if (opt->get_group().empty()) continue;  // hidden
    for (const std::string& l : opt->get_lnames()) names.push_back("--" + l);
  }
  return names;
}

bool HasOption(const CLI::App& cmd, const std::string& name) {
  return const_cast<CLI::App&>(cmd).get_option_no_throw(name) != nullptr;
}

}  // namespace

std::string ClosestName(const std::string& typed, const std::vector<std::string>& names) {
  const std::string t = StripDashes(typed);
  if (t.empty()) return "";
  const size_t max_distance = t.size() <= 3 ? 1 : t.size() <= 6 ? 2 : 3;
  std::string best;
  size_t best_distance = SIZE_MAX;
  for (const std::string& name : names) {
    const std::string n = StripDashes(name);
    const size_t d = EditDistance(t, n);
    const std::string& shorter = t.size() < n.size() ? t : n;
    const std::string& longer = t.size() < n.size() ? n : t;
    const bool prefix = shorter.size() >= 3 && longer.compare(0, shorter.size(), shorter) == 0;
    if ((d <= max_distance || prefix) && d < best_distance) {
      best = name;
      best_distance = d;
    }
  }
  return best;
}

std::string ForeignFlagError(const CLI::App& cmd, const std::vector<std::string>& args) {
  for (const std::string& a : args) {
    if (a == "--") break;
    if (a.size() < 2 || a[0] != '-' || !std::isalpha(static_cast<unsigned char>(a.back()))) {
      continue;  // values, negative numbers
    }
    std::string name = a.substr(0, a.find('='));
    if (HasOption(cmd, name)) continue;
    const std::string long_name = LlamaLongName(name);
    if (!long_name.empty() && HasOption(cmd, long_name)) continue;  // -md: --model-draft
    const std::string advice = LlamaFlagAdvice(name);
    if (!advice.empty()) return "lamina: " + name + ": " + advice;
    if (!long_name.empty()) {
      return "lamina: " + name + " (" + long_name + "): not an option of `lamina " +
             cmd.get_name() + "`";
    }
    // "-tgs": CLI11 would take it as -t with the value "gs" ("-temp" as -t "emp").
    const bool word =
        name[1] != '-' && name.size() > 2 && std::all_of(name.begin() + 1, name.end(), [](char c) {
          return std::isalpha(static_cast<unsigned char>(c)) || c == '-';
        });
    if (!word || !HasOption(cmd, name.substr(0, 2))) continue;
    std::string line = "lamina: " + name + ": not an option of `lamina " + cmd.get_name() + "`";
    const std::string near = ClosestName(name, LongOptionNames(cmd));
    if (!near.empty()) return line + "; did you mean '" + near + "'?";
    const CLI::Option* opt = const_cast<CLI::App&>(cmd).get_option_no_throw(name.substr(0, 2));
    if (opt->get_type_size() != 0) {
      line += " (to give " + name.substr(0, 2) + " the value " + name.substr(2) + ", write " +
              name.substr(0, 2) + " " + name.substr(2) + ")";
    }
    return line;
  }
  return "";
}

int ParseErrorExit(const CLI::App& app, const CLI::ParseError& e) {
  if (e.get_exit_code() == 0) return app.exit(e);  // --help and the like
  if (dynamic_cast<const CLI::ExtrasError*>(&e) != nullptr) {
    const CLI::App& cmd = AppWithExtras(app);
    for (const std::string& extra : cmd.remaining()) {
      if (extra.size() < 3 || extra.compare(0, 2, "--") != 0) continue;
      const std::string name = extra.substr(0, extra.find('='));
      const std::string near = ClosestName(name, LongOptionNames(cmd));
      if (near.empty()) {
        std::fprintf(stderr, "lamina: unknown option '%s' (--help lists the options)\n",
                     name.c_str());
      } else {
        std::fprintf(stderr, "lamina: unknown option '%s'; did you mean '%s'?\n", name.c_str(),
                     near.c_str());
      }
      return kExitUsage;
    }
  }
  std::fprintf(stderr, "lamina: %s\n", e.what());
  return kExitUsage;
}

void AddSamplerChainOptions(CLI::App* cmd, SamplerChainOptions& o) {
  cmd->add_option("--presence-penalty", o.presence_penalty,
                  "Presence penalty: subtracted from the logit of a token seen (0: off)")
      ->check(InRange(kOpenAiPenaltyRange));
  cmd->add_option("--frequency-penalty", o.frequency_penalty,
                  "Frequency penalty: times a token's count, subtracted from its logit (0: off)")
      ->check(InRange(kOpenAiPenaltyRange));
  cmd->add_option("--typical", o.typical_p, "Locally typical sampling, p (1: off)")
      ->check(Probability());
  cmd->add_option("--xtc-probability", o.xtc_probability, "XTC: chance of a cut (0: off)")
      ->check(Probability());
  cmd->add_option("--xtc-threshold", o.xtc_threshold,
                  "XTC: probability from which tokens are cut (> 0.5: off)")
      ->check(Probability());
  cmd->add_option("--mirostat", o.mirostat, "Mirostat version (0: off, 1, 2); replaces the chain")
      ->check(InRange(kMirostatRange));
  cmd->add_option("--mirostat-lr", o.mirostat_eta, "Mirostat learning rate, eta")
      ->check(NonNegativeFinite());
  cmd->add_option("--mirostat-ent", o.mirostat_tau, "Mirostat target entropy, tau")
      ->check(NonNegativeFinite());
  cmd->add_option("--dry-multiplier", o.dry_multiplier, "DRY multiplier (0: off)")
      ->check(NonNegativeFinite());
  cmd->add_option("--dry-base", o.dry_base, "DRY base (< 1: off)")->check(NonNegativeFinite());
  cmd->add_option("--dry-allowed-length", o.dry_allowed_length,
                  "DRY: repeats this long go unpenalized")
      ->check(InRange(kDryAllowedLengthRange));
  cmd->add_option("--dry-penalty-last-n", o.dry_penalty_last_n,
                  "DRY: tokens looked back (0: off; -1: the whole context, at most 65536)")
      ->check(InRange(kRepeatLastNRange));
  cmd->add_option("--dry-sequence-breaker", o.dry_sequence_breakers,
                  "DRY sequence breaker (repeatable; \"none\": none; default: \\n : \" *)")
      ->take_all()
      ->allow_extra_args(false);
  cmd->add_option("--samplers", o.samplers,
                  "The chain's order, names separated by ';' (default: "
                  "penalties;dry;top_k;typ_p;top_p;min_p;xtc;temperature)")
      ->check(CLI::Validator(
          [](std::string& v) {
            std::string error;
            ParseSamplerStages(v, &error);
            return error;
          },
          "NAME;NAME..."));
}

void ApplySamplerChain(const SamplerChainOptions& o, SamplerConfig* samp) {
  samp->presence_penalty = o.presence_penalty;
  samp->frequency_penalty = o.frequency_penalty;
  samp->typical_p = o.typical_p;
  samp->xtc_probability = o.xtc_probability;
  samp->xtc_threshold = o.xtc_threshold;
  samp->mirostat = o.mirostat;
  samp->mirostat_tau = o.mirostat_tau;
  samp->mirostat_eta = o.mirostat_eta;
  samp->dry_multiplier = o.dry_multiplier;
  samp->dry_base = o.dry_base;
  samp->dry_allowed_length = o.dry_allowed_length;
  samp->dry_penalty_last_n = o.dry_penalty_last_n;
  if (!o.dry_sequence_breakers.empty()) {
    samp->dry_sequence_breakers.clear();
    for (const std::string& b : o.dry_sequence_breakers) {
      if (b != "none") samp->dry_sequence_breakers.push_back(b.substr(0, kMaxDryBreakerBytes));
    }
  }
  samp->samplers = ParseSamplerStages(o.samplers);
}

}  // namespace lamina::cli
