// `lamina bench --spec off,lookup,draft,mtp`: greedy generation on a fixed task set (counting to
// 300, a JSON object, copying a 50-item list, prose), each task in the model's chat template
// (ChatML for a model without one), with each speculative mode, in interleaved rounds (every
// round runs every task's requests, each request with every mode right after one another in a
// fresh session, the modes' order rotated per request; a task shorter than kRoundTokens is
// requested several times per round; one warm-up round is not counted; a second "off" is a
// control leg). Prints per task and mode the median decode tok/s, the median of the per-round
// ratios to plain decoding by wall clock with their middle half, the same by the process's CPU
// time, the control leg's middle half beside it, acceptance and tokens per verify step, what each
// leg asked of its drafter per 1,000 tokens (calls, probes, caught-up cells, drafted tokens,
// verify windows), where its decode time went, the minor page faults per 1,000 tokens while
// decoding (every leg), then what each leg's cost model measured (one per leg, kept across its
// runs).
// The output ids are checked equal to plain decoding's (they must be, at temperature 0).
#include <sys/resource.h>
#include <time.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "chat/chat_template.h"
#include "cli_common.h"
#include "cli_spec.h"

namespace lamina::cli {

namespace {

struct Task {
  const char* name;
  std::string user;
  int n_predict;
};

std::vector<Task> Tasks() {
  static const char* kNames[] = {"David", "Kate",  "Emma", "Iris", "Eva",   "Sam",
                                 "Paul",  "Clara", "Bob",  "Leo",  "Henry", "Grace",
                                 "Max",   "Lily",  "Tom",  "Anna", "Ben",   "Mia"};
  std::mt19937 rng(7);
  std::string list = "Repeat this list exactly, one item per line:";
  for (int i = 0; i < 50; ++i) list += std::string("\n") + kNames[rng() % 18];
  return {{"count", "Count from 1 to 300, one number per line.", 1200},
          {"json",
           "Write a JSON array of 4 objects with these fields: \"name\" = \"Alice\", \"age\" = "
           "34; \"name\" = \"Bob\", \"age\" = 27; \"name\" = \"Carol\", \"age\" = 41; \"name\" "
           "= \"Dan\", \"age\" = 19.",
           256},
          {"copy", list, 256},
          {"prose", "Tell me a short story about a brave little fox.", 256}};
}

// A task shorter than this is requested several times per round (at most kMaxRequests), so
// that each round's ratio rests on about as many tokens as a long task's.
constexpr int kRoundTokens = 400;
constexpr int kMaxRequests = 6;

// The q-quantile of v (nearest rank; 0.5: the median).
double Quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())));
  return v[i];
}
double Median(const std::vector<double>& v) { return Quantile(v, 0.5); }

// The process's CPU time (every thread's), in seconds: unlike the wall clock, it does not grow
// while the process waits for a core another process holds.
double CpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// The process's minor page faults so far (every thread's): a first touch of fresh memory, which
// costs a trap (and on a VM a host fault too, 25-35 us a page on the EPYC VM) wherever a decode
// step writes to pages it never wrote before. Deterministic for a run, unlike the times.
int64_t MinorFaults() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<int64_t>(ru.ru_minflt);
}

struct Leg {
  std::vector<double> tok_s;      // [rounds] decode tokens per wall second
  std::vector<double> ratio;      // [rounds] wall-clock speed over plain decoding's
  std::vector<double> cpu_ratio;  // [rounds] speed per CPU second over plain decoding's
  spec::SpecStats stats;
  double decode_seconds = 0.0;  // every round's together
  double cpu_seconds = 0.0;     // every round's together (decode: from the first token's text)
  int64_t faults = 0;           // minor page faults while decoding, every round's together
  int64_t tokens = 0;           // every round's together
  int n_tokens = 0;
  int requests = 0;  // counted requests
  bool ids_match = true;
};

// --spec's modes, each once, "off" (the baseline) first; a second "off" is a control leg, "off2"
// (plain decoding measured again: the bench's own noise floor). False (after the message) for
// an unknown mode.
bool ParseSpecModes(const std::string& list, std::vector<std::string>* modes) {
  for (size_t start = 0; start <= list.size();) {
    const size_t comma = std::min(list.find(',', start), list.size());
    std::string m = list.substr(start, comma - start);
    if (m != "off" && m != "lookup" && m != "draft" && m != "mtp") {
      std::fprintf(stderr, "lamina: --spec takes off, lookup, draft and mtp, comma-separated\n");
      return false;
    }
    if (m == "off" && std::find(modes->begin(), modes->end(), m) != modes->end()) m = "off2";
    if (std::find(modes->begin(), modes->end(), m) == modes->end()) modes->push_back(m);
    start = comma + 1;
  }
  if (modes->empty() || (*modes)[0] != "off") modes->insert(modes->begin(), "off");  // the baseline
  return true;
}

// The table (or one JSON array) of every task and mode; false when a speculative run's ids
// differ from plain decoding's.
bool PrintSpecBench(const BenchOptions& o, const std::vector<Task>& tasks,
                    const std::vector<std::string>& modes,
                    std::map<std::string, std::map<std::string, Leg>>& legs) {
  nlohmann::json out = nlohmann::json::array();
  if (!o.json) {
    std::printf("%-6s %-7s %6s %5s %8s %7s %11s %7s %11s %8s %10s %s\n", "task", "spec", "tokens",
                "reqs", "tok/s", "x plain", "(mid half)", "x cpu", "control", "accept",
                "tok/verify", "same ids");
  }
  bool all_match = true;
  for (const Task& t : tasks) {
    // The control leg's middle half: plain decoding against itself, the noise each ratio has.
    char control[32] = "-";
    if (legs[t.name].count("off2") > 0) {
      const Leg& c = legs[t.name]["off2"];
      std::snprintf(control, sizeof control, "%.2f-%.2f", Quantile(c.ratio, 0.25),
                    Quantile(c.ratio, 0.75));
    }
    for (const std::string& m : modes) {
      const Leg& leg = legs[t.name][m];
      all_match = all_match && leg.ids_match;
      if (o.json) {
        out.push_back({{"task", t.name},
                       {"spec", m},
                       {"tokens", leg.n_tokens},
                       {"requests", leg.requests},
                       {"tok_s", Median(leg.tok_s)},
                       {"ratio", Median(leg.ratio)},
                       {"ratio_p25", Quantile(leg.ratio, 0.25)},
                       {"ratio_p75", Quantile(leg.ratio, 0.75)},
                       {"cpu_ratio", Median(leg.cpu_ratio)},
                       {"control", control},
                       {"acceptance", leg.stats.acceptance()},
                       {"tokens_per_verify", leg.stats.tokens_per_verify()},
                       {"drafted", leg.stats.drafted},
                       {"verify_steps", leg.stats.verify_steps},
                       {"plain_steps", leg.stats.plain_steps},
                       {"drafter_calls", leg.stats.asks},
                       {"probes", leg.stats.probes},
                       {"catch_up_cells", leg.stats.catch_up_cells},
                       {"emitted", leg.stats.emitted},
                       {"ids_match", leg.ids_match}});
        continue;
      }
      if (m == "off") {
        std::printf("%-6s %-7s %6d %5d %8.1f %7s %11s %7s %11s %8s %10s %s\n", t.name, m.c_str(),
                    leg.n_tokens, leg.requests, Median(leg.tok_s), "1.00", "-", "1.00", control,
                    "-", "-", "-");
      } else {
        char mid[32];
        std::snprintf(mid, sizeof mid, "%.2f-%.2f", Quantile(leg.ratio, 0.25),
                      Quantile(leg.ratio, 0.75));
        std::printf("%-6s %-7s %6d %5d %8.1f %7.2f %11s %7.2f %11s %7.1f%% %10.2f %s\n", t.name,
                    m.c_str(), leg.n_tokens, leg.requests, Median(leg.tok_s), Median(leg.ratio),
                    mid, Median(leg.cpu_ratio), control, 100.0 * leg.stats.acceptance(),
                    leg.stats.tokens_per_verify(), leg.ids_match ? "yes" : "NO");
      }
    }
  }
  if (o.json) std::printf("%s\n", out.dump().c_str());
  return all_match;
}

// What the leg's cost model measured, in plain steps: windows of 2..9 tokens, a draft pass, a
// caught-up cell (short catch-ups, and bulk ones after a pause) ('-': not measured).
void PrintCosts(const std::string& mode, const spec::CostModel& c) {
  std::printf("costs %-7s window 2..9:", mode.c_str());
  for (int w = 2; w <= 9; ++w) {
    if (c.measured(w)) {
      std::printf(" %.2f", c.WindowSteps(w));
    } else {
      std::printf(" -");
    }
  }
  std::printf(" | draft pass %.3f | catch-up cell %.3f (bulk %.3f) | acceptance %.2f\n",
              c.DraftSteps(1), c.CatchUpSteps(1), c.CatchUpSteps(64) / 64, c.acceptance());
}

// What each speculative leg asked of its drafter, per 1,000 emitted tokens (every round's
// together): the drafter's calls (drafts, probes, calls that got no draft), the probes, the
// positions it caught up with in them (an MTP head's batched passes over the cells it missed) and
// the tokens it drafted. Deterministic for a model, unlike the times: a figure to compare
// controllers by.
void PrintDrafterWork(const std::vector<Task>& tasks, const std::vector<std::string>& modes,
                      std::map<std::string, std::map<std::string, Leg>>& legs) {
  std::printf("%-6s %-7s %14s %15s %16s %15s %15s\n", "task", "spec", "calls per 1k",
              "probes per 1k", "catch-up per 1k", "drafted per 1k", "windows per 1k");
  for (const Task& t : tasks) {
    for (const std::string& m : modes) {
      if (m == "off" || m == "off2") continue;
      const spec::SpecStats& s = legs[t.name][m].stats;
      const double per = 1000.0 / std::max<double>(1.0, static_cast<double>(s.emitted));
      std::printf("%-6s %-7s %14.1f %15.1f %16.1f %15.1f %15.1f\n", t.name, m.c_str(), s.asks * per,
                  s.probes * per, s.catch_up_cells * per, s.drafted * per, s.verify_steps * per);
    }
  }
}

// Where each speculative leg's decode time went, in the plain leg's steps (its decode time per
// token, every round's together) per 1,000 emitted tokens: the plain steps' forward passes, the
// verify windows', the drafter's calls (of which catch-ups), the rest (sampling, bookkeeping) and
// the total (1,000 would be plain speed); and the tokens the verify steps gave per plain step
// their windows and the drafter's calls took (above 1: drafting paid for itself).
void PrintTimeSplit(const std::vector<Task>& tasks, const std::vector<std::string>& modes,
                    std::map<std::string, std::map<std::string, Leg>>& legs) {
  std::printf("%-6s %-7s %9s %9s %9s %9s %9s %9s %12s\n", "task", "spec", "plain", "windows",
              "drafter", "catch-up", "other", "total", "tok/step");
  for (const Task& t : tasks) {
    const Leg& off = legs[t.name]["off"];
    const double step = off.decode_seconds / std::max<double>(1.0, static_cast<double>(off.tokens));
    for (const std::string& m : modes) {
      if (m == "off" || m == "off2") continue;
      const Leg& leg = legs[t.name][m];
      const spec::SpecStats& s = leg.stats;
      const double per = 1000.0 / std::max<double>(1.0, static_cast<double>(leg.tokens)) / step;
      const double passes = s.plain_seconds + s.window_seconds + s.draft_seconds;
      const double spent = (s.window_seconds + s.draft_seconds) / step;
      std::printf("%-6s %-7s %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f %12.2f\n", t.name, m.c_str(),
                  s.plain_seconds * per, s.window_seconds * per, s.draft_seconds * per,
                  s.catch_up_seconds * per, (leg.decode_seconds - passes) * per,
                  leg.decode_seconds * per,
                  spent > 0.0 ? static_cast<double>(s.accepted + s.verify_steps) / spent : 0.0);
    }
  }
}

// Minor page faults per 1,000 tokens while decoding (from the first token's text to the end),
// every leg: a leg whose steps write to fresh memory pays a fault per new page (deterministic).
void PrintFaults(const std::vector<Task>& tasks, const std::vector<std::string>& modes,
                 std::map<std::string, std::map<std::string, Leg>>& legs) {
  std::printf("%-6s", "faults");
  for (const std::string& m : modes) std::printf(" %9s", m.c_str());
  std::printf("   (minor page faults per 1,000 tokens while decoding)\n");
  for (const Task& t : tasks) {
    std::printf("%-6s", t.name);
    for (const std::string& m : modes) {
      const Leg& leg = legs[t.name][m];
      std::printf(" %9.1f", 1000.0 * static_cast<double>(leg.faults) /
                                std::max<double>(1.0, static_cast<double>(leg.tokens)));
    }
    std::printf("\n");
  }
}

}  // namespace

int RunBenchSpec(const BenchOptions& o, const Model& model, ThreadPool& pool) {
  std::vector<std::string> modes;
  if (!ParseSpecModes(o.spec, &modes)) return kExitUsage;
  SessionConfig sc;
  int rc = kExitOk;
  if (!MakeSessionConfig(o.common, model, &sc, &rc)) return rc;
  if (o.common.n_ctx == 0) sc.n_ctx = 2048;
  chat::ChatSetup chat;
  // A model without a template (a synthetic one) gets ChatML's.
  ChatTemplateOptions tmpl;
  if (!model.file().GetString("tokenizer.chat_template").ok()) tmpl.name = "chatml";
  if (!ReadChatSetup(model, tmpl, &chat, &rc)) return rc;
  const Tokenizer& tok = model.tokenizer();

  // One setup per mode (the draft model loads once).
  std::map<std::string, SpecCliOptions> options;
  std::map<std::string, SpecSetup> setups;
  for (const std::string& m : modes) {
    SpecCliOptions so = o.spec_options;
    so.mode = m == "off2" ? "off" : m;
    if (!MakeSpecSetup(so, o.common.model_path, model, sc.n_ctx, pool, &setups[m], &rc,
                       /*build_drafter=*/false)) {
      return rc;
    }
    options[m] = so;
  }
  const std::vector<Task> tasks = Tasks();
  std::map<std::string, std::map<std::string, Leg>> legs;  // task → mode → figures
  // Round 0 warms up (the weights' pages, the allocator, each leg's cost model) and is not
  // counted; it also sets how many requests of each task a round makes (a short task several,
  // so that a round's ratio rests on ~kRoundTokens tokens). Every request runs every leg right
  // after one another (the legs share the load of that moment), in an order rotated per request,
  // so that no leg always runs first or right after another.
  std::map<std::string, int> requests;  // task → requests per counted round
  int turn = 0;                         // requests so far: the rotation
  for (int round = 0; round <= o.reps; ++round) {
    for (const Task& t : tasks) {
      const std::vector<int32_t> prompt =
          tok.Encode(chat::RenderChatPrompt(chat, {chat::ChatMessage{"user", t.user}}, tok).value(),
                     true, true);
      GenerateOptions go;
      go.params.sampler.temperature = 0.0f;
      go.params.n_predict = t.n_predict;
      // mode → this round's decode tokens, wall seconds and CPU seconds
      std::map<std::string, double> tokens, wall, cpu;
      const int n_requests = round == 0 ? 1 : requests[t.name];
      for (int q = 0; q < n_requests; ++q, ++turn) {
        std::map<std::string, std::vector<int32_t>> ids;  // mode → this request's output
        for (size_t i = 0; i < modes.size(); ++i) {
          const std::string& m = modes[(i + turn) % modes.size()];
          Session session(model, sc, pool);
          SpecSetup& setup = setups[m];
          setup.drafter = NewDrafter(options[m], setup, pool, &session);
          spec::SpecStats stats;
          // The decode's CPU time starts at the first token's text: after the prompt and what
          // the drafter does with it (an MTP head's or a draft model's prompt pass, which the
          // wall clock counts as prompt time too).
          double cpu_start = CpuSeconds();
          int64_t faults_start = MinorFaults();
          bool started = false;
          auto on_text = [&cpu_start, &faults_start, &started](const std::string&) {
            if (!started) {
              cpu_start = CpuSeconds();
              faults_start = MinorFaults();
            }
            started = true;
            return true;
          };
          Result<GenerateResult> r = GenerateWithSpec(session, prompt, go, setup, &stats, on_text);
          const double cpu_seconds = CpuSeconds() - cpu_start;
          const int64_t faults = MinorFaults() - faults_start;
          if (!r.ok()) {
            std::fprintf(stderr, "lamina: %s\n", r.error().message.c_str());
            return kExitFailure;
          }
          ids[m] = r->tokens;
          if (round == 0) {
            if (m == "off") {
              requests[t.name] =
                  std::clamp<int>((kRoundTokens + static_cast<int>(r->tokens.size()) - 1) /
                                      std::max<int>(1, static_cast<int>(r->tokens.size())),
                                  1, kMaxRequests);
            }
            continue;
          }
          tokens[m] += static_cast<double>(r->tokens.size());
          wall[m] += r->decode_seconds;
          cpu[m] += cpu_seconds;
          Leg& leg = legs[t.name][m];
          leg.n_tokens = static_cast<int>(r->tokens.size());
          leg.stats.Add(stats);
          leg.decode_seconds += r->decode_seconds;
          leg.cpu_seconds += cpu_seconds;
          leg.faults += faults;
          leg.tokens += static_cast<int64_t>(r->tokens.size());
          ++leg.requests;
        }
        for (const std::string& m : modes) {
          Leg& leg = legs[t.name][m];
          leg.ids_match = leg.ids_match && ids[m] == ids["off"];
        }
      }
      if (round == 0) continue;
      // The round's speeds: its requests' tokens over their seconds, each leg against plain.
      auto speed = [&](std::map<std::string, double>& sec, const std::string& m) {
        return tokens[m] / std::max(sec[m], 1e-9);
      };
      for (const std::string& m : modes) {
        Leg& leg = legs[t.name][m];
        leg.tok_s.push_back(speed(wall, m));
        leg.ratio.push_back(speed(wall, m) / std::max(speed(wall, "off"), 1e-9));
        leg.cpu_ratio.push_back(speed(cpu, m) / std::max(speed(cpu, "off"), 1e-9));
      }
    }
  }
  const bool ids_match = PrintSpecBench(o, tasks, modes, legs);
  if (!o.json) {
    PrintDrafterWork(tasks, modes, legs);
    PrintTimeSplit(tasks, modes, legs);
    PrintFaults(tasks, modes, legs);
    for (const std::string& m : modes) {
      if (setups[m].options.costs) PrintCosts(m, *setups[m].options.costs);
    }
  }
  if (!ids_match) {
    std::fprintf(stderr, "lamina: a speculative run's ids differ from plain decoding\n");
    return kExitFailure;
  }
  return kExitOk;
}

}  // namespace lamina::cli
