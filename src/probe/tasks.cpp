// The generation probes (counting, needle, json, copy) and the texts they share: seeded filler
// sentences and the task prompts, in the shipped model's phrasing. Every answer is greedy, in a
// fresh sequence of the leg's backend.
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <random>
#include <set>

#include "probe/json_check.h"
#include "probe/probes.h"

namespace lamina::probe {

int TokenBudget(const RunContext& ctx, size_t leg, const std::string& text) {
  return ctx.info[leg].exact_token_counts ? ctx.legs[leg].backend->CountTokens(text)
                                          : static_cast<int>(text.size());
}

namespace {

Generation GenerateGreedy(const RunContext& ctx, size_t leg, const std::string& user,
                          int max_tokens, const std::function<bool(const std::string&)>& stop) {
  GenerationRequest request;
  request.user = user;
  request.max_tokens = max_tokens;
  request.stop = stop;
  return ctx.legs[leg].backend->Generate(request);
}

// Word lists and sentence shapes of the shipped model's training prose (train/data.py), which
// are also plain English for any other model.
const char* const kNames[] = {"Tom",   "Lily", "Max", "Anna", "Ben",
                              "Grace", "Sam",  "Mia", "Leo",  "Zoe"};
const char* const kAdjectives[] = {"small", "big",  "old",    "quiet", "happy",
                                   "brave", "kind", "gentle", "soft",  "little"};
const char* const kAnimals[] = {"fox",  "cat",  "dog",  "bird", "owl",
                                "bear", "deer", "duck", "frog", "goat"};
const char* const kColors[] = {"red", "blue", "green", "yellow", "brown", "white", "gray", "pink"};
const char* const kThings[] = {"ball", "box",  "lamp", "book", "key",
                               "cup",  "boat", "bell", "map",  "chair"};
const char* const kPlaces[] = {"the park", "the garden", "the forest", "the river",
                               "the lake", "the school", "the market", "the hill",
                               "the farm", "the village"};
const char* const kVerbs[] = {"found",   "opened", "carried", "watched", "painted",
                              "visited", "lost",   "saw",     "liked",   "fixed"};
const char* const kFeelings[] = {"happy", "calm", "glad", "curious", "sleepy", "proud"};
const char* const kCities[] = {"Paris", "Berlin", "Madrid", "Rome",
                               "Oslo",  "Vienna", "Lisbon", "Dublin"};

template <size_t N>
const char* Pick(std::mt19937_64& rng, const char* const (&words)[N]) {
  return words[rng() % N];
}

std::string Sentence(std::mt19937_64& rng) {
  const std::string name = Pick(rng, kNames), adj = Pick(rng, kAdjectives),
                    animal = Pick(rng, kAnimals), color = Pick(rng, kColors),
                    thing = Pick(rng, kThings), place = Pick(rng, kPlaces);
  switch (rng() % 5) {
    case 0:
      return name + " " + Pick(rng, kVerbs) + " a " + color + " " + thing + " in " + place + ".";
    case 1:
      return "The " + adj + " " + animal + " lived near " + place + ".";
    case 2:
      return name + " felt " + Pick(rng, kFeelings) + " and went to " + place + ".";
    case 3:
      return "The " + animal + " " + Pick(rng, kVerbs) + " the " + color + " " + thing + ".";
    default:
      return name + " and " + Pick(rng, kNames) + " talked about the " + adj + " " + animal + ".";
  }
}

// Sentences of filler, about n_tokens tokens in all.
std::vector<std::string> FillerSentences(const RunContext& ctx, uint64_t seed, int n_tokens) {
  std::mt19937_64 rng(seed);
  std::vector<std::string> out;
  int total = 0;
  while (total < n_tokens) {
    out.push_back(Sentence(rng));
    total += TokenCount(ctx, " " + out.back());
  }
  return out;
}

std::string Join(const std::vector<std::string>& parts, const std::string& sep) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? sep : "") + parts[i];
  return out;
}

}  // namespace

std::string Trim(const std::string& s) {
  size_t a = 0, b = s.size();
  while (a < b && std::isspace(static_cast<unsigned char>(s[a]))) ++a;
  while (b > a && std::isspace(static_cast<unsigned char>(s[b - 1]))) --b;
  return s.substr(a, b - a);
}

int64_t FirstDifference(const std::string& a, const std::string& b) {
  const size_t n = std::min(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    if (a[i] != b[i]) return static_cast<int64_t>(i);
  }
  return a.size() == b.size() ? -1 : static_cast<int64_t>(n);
}

void RateVerdict(const RunContext& ctx, Outcome& o, double leg_score, double ref_score,
                 const std::string& what, const std::string& na_reason, const std::string& error) {
  if (!error.empty()) {
    o.status = Status::kFail;
    o.reason = error;
  } else if (ref_score <= 0.0) {
    o.status = Status::kNotApplicable;
    o.reason = na_reason;
  } else if (leg_score < ref_score * ctx.config.thresholds.keep_fraction) {
    o.status = Status::kFail;
    char buf[160];
    std::snprintf(buf, sizeof(buf), "%s %.0f%% vs reference %.0f%%", what.c_str(), 100 * leg_score,
                  100 * ref_score);
    o.reason = buf;
  } else {
    o.status = Status::kPass;
  }
}

std::string FillerText(const RunContext& ctx, uint64_t seed, int n_tokens) {
  return Join(FillerSentences(ctx, seed, n_tokens), " ");
}

std::string SeededList(uint64_t seed, int n_items) {
  std::mt19937_64 rng(seed);
  std::vector<std::string> items;
  for (int w = 0; w < n_items; ++w) {
    items.push_back(std::string(Pick(rng, kColors)) + " " + Pick(rng, kThings));
  }
  return Join(items, "\n");
}

CountingAnalysis AnalyzeCounting(const std::string& text, int n, bool ended_turn) {
  std::vector<std::string> lines;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    const std::string line = Trim(text.substr(start, end - start));
    if (!line.empty()) lines.push_back(line);
    start = end + 1;
  }
  std::vector<int64_t> values;  // -1: not a number
  for (const std::string& line : lines) {
    std::string digits = line;
    while (!digits.empty() && (digits.back() == '.' || digits.back() == ',')) digits.pop_back();
    const bool numeric = !digits.empty() && digits.size() < 10 &&
                         std::all_of(digits.begin(), digits.end(), [](char c) {
                           return std::isdigit(static_cast<unsigned char>(c));
                         });
    values.push_back(numeric ? std::stoll(digits) : -1);
  }
  int first_wrong = -1;
  for (int i = 0; i < n; ++i) {
    if (i >= static_cast<int>(values.size()) || values[i] != i + 1) {
      first_wrong = i + 1;
      break;
    }
  }
  // 1..n right but no end of turn after n: the stop is what failed (a line n + 1, or nothing).
  const bool sequence_ok = first_wrong < 0;
  const bool stopped = ended_turn && static_cast<int>(values.size()) == n;
  if (sequence_ok && !stopped) first_wrong = n + 1;
  int64_t run_value = -1, best_value = -1;
  int run = 0, best = 0;
  for (int64_t v : values) {
    run = (v == run_value) ? run + 1 : 1;
    run_value = v;
    if (v >= 0 && run > best) {
      best = run;
      best_value = v;
    }
  }
  int64_t max_seen = 0;
  std::set<int64_t> seen;
  for (int64_t v : values) {
    if (v >= 1 && v <= n) {
      seen.insert(v);
      max_seen = std::max(max_seen, v);
    }
  }
  std::vector<int64_t> skipped;
  for (int64_t v = 1; v <= max_seen; ++v) {
    if (!seen.count(v)) skipped.push_back(v);
  }
  CountingAnalysis a;
  a.n = n;
  a.pass = first_wrong < 0;
  a.sequence_ok = sequence_ok;
  a.stopped_after_n = stopped;
  a.ended_turn = ended_turn;
  a.lines = static_cast<int>(lines.size());
  a.first_wrong_line = first_wrong;
  if (first_wrong > 0) {
    a.first_wrong_text = first_wrong <= static_cast<int>(lines.size()) ? lines[first_wrong - 1]
                         : first_wrong == n + 1                        ? "(no end of turn)"
                                                                       : "(missing)";
  }
  a.longest_repeat_value = best_value;
  a.longest_repeat_length = best;
  a.skipped_count = static_cast<int>(skipped.size());
  a.skipped.assign(skipped.begin(), skipped.begin() + std::min<size_t>(40, skipped.size()));
  a.first_40.assign(lines.begin(), lines.begin() + std::min<size_t>(40, lines.size()));
  return a;
}

std::vector<CountingResult> RunCountingProbe(const RunContext& ctx) {
  const int n = ctx.config.count_to;
  const std::string user = "Count from 1 to " + std::to_string(n) + ", one number per line.";
  std::string expected;
  for (int i = 1; i <= n; ++i) expected += std::to_string(i) + "\n";
  // Stop once a line after N is out (the turn should have ended at N), or 40 lines after the
  // first mistake (enough to show the pattern).
  auto stop = [n](const std::string& text) {
    const int complete = static_cast<int>(std::count(text.begin(), text.end(), '\n'));
    if (complete < 2) return false;
    const CountingAnalysis a = AnalyzeCounting(text.substr(0, text.rfind('\n')), n, false);
    if (a.lines > n) return true;
    return a.first_wrong_line >= 0 && a.lines >= a.first_wrong_line + 40;
  };
  std::vector<CountingResult> results;
  bool ref_sequence_ok = false, ref_stopped = false;
  for (size_t i = 0; i < ctx.legs.size(); ++i) {
    ctx.Progress("counting", i);
    const Generation g = GenerateGreedy(ctx, i, user, TokenBudget(ctx, i, expected) + 16, stop);
    CountingResult p;
    p.analysis = AnalyzeCounting(g.text, n, g.ended_turn);
    const CountingAnalysis& a = p.analysis;
    p.text = g.text.substr(0, 4000);
    p.generated_tokens = g.n_tokens;
    if (g.error) p.error = g.error_message;
    const bool sequence_ok = a.sequence_ok && !g.error;
    const bool stopped = a.stopped_after_n && !g.error;
    if (i == 0) {
      ref_sequence_ok = sequence_ok;
      ref_stopped = stopped;
    }
    // The stop counts only where the reference stops: a model that runs on past N at full
    // precision still shows a KV fault in the numbers it prints.
    const bool pass = sequence_ok && (stopped || !ref_stopped);
    char cell[96];
    if (pass) {
      std::snprintf(cell, sizeof(cell), stopped ? "%d/%d" : "%d/%d, no stop", n, n);
    } else if (a.longest_repeat_length == 0) {
      std::snprintf(cell, sizeof(cell), "no numbers");
    } else if (a.ended_turn && a.first_wrong_line > a.lines) {
      std::snprintf(cell, sizeof(cell), "ended after line %d", a.lines);
    } else if (a.first_wrong_line >= 0) {
      std::snprintf(cell, sizeof(cell), "line %d, run %dx%lld", a.first_wrong_line,
                    a.longest_repeat_length, static_cast<long long>(a.longest_repeat_value));
    } else {
      std::snprintf(cell, sizeof(cell), "error");
    }
    p.outcome.cell = cell;
    if (g.error) {
      p.outcome.status = Status::kFail;
      p.outcome.reason = g.error_message;
    } else if (!ref_sequence_ok) {
      p.outcome.status = Status::kNotApplicable;
      p.outcome.reason = "model cannot count: reference leg fails too";
    } else if (pass) {
      p.outcome.status = Status::kPass;
      if (!stopped) p.note = "no end of turn after " + std::to_string(n) + " (reference neither)";
    } else {
      p.outcome.status = Status::kFail;
      p.outcome.reason = "first wrong line " + std::to_string(a.first_wrong_line) + " (\"" +
                         a.first_wrong_text + "\"), longest repeat " +
                         std::to_string(a.longest_repeat_length) + "x";
    }
    results.push_back(std::move(p));
  }
  return results;
}

std::vector<NeedleResult> RunNeedleProbe(const RunContext& ctx) {
  const std::vector<int>& lengths = ctx.config.needle_lengths;
  const std::vector<int>& depths = ctx.config.needle_depths;
  const uint64_t seed = ctx.config.seed;
  struct Cell {
    int length, depth;
    std::string user, expected;
  };
  std::vector<Cell> cells;
  std::vector<int> skipped_lengths;
  for (int length : lengths) {
    // The question and answer need room after the haystack.
    if (length + 48 > ctx.config.n_ctx) {
      skipped_lengths.push_back(length);
      continue;
    }
    const std::vector<std::string> filler = FillerSentences(ctx, seed * 7919 + length, length);
    for (int depth : depths) {
      std::mt19937_64 rng(seed * 104729 + length * 131 + depth);
      const std::string secret = std::to_string(10000 + rng() % 90000);
      std::vector<std::string> hay = filler;
      const size_t at = std::min(hay.size(), static_cast<size_t>(hay.size() * depth / 100.0 + 0.5));
      // The shipped model's needle phrasing (train/data.py); the answer repeats the fact.
      hay.insert(hay.begin() + at, "The secret code is " + secret + ".");
      cells.push_back({length, depth, Join(hay, " ") + "\n\nWhat is the secret code?", secret});
    }
  }
  std::vector<NeedleResult> results;
  std::vector<int> ref_hits;  // per cell, reference leg
  for (size_t i = 0; i < ctx.legs.size(); ++i) {
    ctx.Progress("needle", i);
    NeedleResult p;
    std::string error;
    int hits = 0, hits_on_ref = 0, ref_total = 0;
    for (size_t c = 0; c < cells.size(); ++c) {
      auto stop = [&](const std::string& text) {
        return text.find(cells[c].expected) != std::string::npos ||
               text.find('\n', 1) != std::string::npos;
      };
      const Generation g = GenerateGreedy(ctx, i, cells[c].user, 24, stop);
      const bool hit = !g.error && g.text.find(cells[c].expected) != std::string::npos;
      hits += hit;
      if (i == 0) ref_hits.push_back(hit);
      ref_total += ref_hits[c];
      hits_on_ref += hit && ref_hits[c];
      NeedleCell cell;
      cell.length = cells[c].length;
      cell.depth = cells[c].depth;
      cell.expected = cells[c].expected;
      cell.answer = Trim(g.text);
      cell.hit = hit;
      if (g.error) cell.error = g.error_message;
      if (g.error && error.empty()) error = g.error_message;
      p.grid.push_back(std::move(cell));
    }
    p.lengths = lengths;
    p.depths = depths;
    p.skipped_lengths = skipped_lengths;
    p.hits = hits;
    p.cells = static_cast<int>(cells.size());
    p.recall = cells.empty() ? 0.0 : static_cast<double>(hits) / cells.size();
    p.outcome.cell = std::to_string(hits) + "/" + std::to_string(cells.size());
    if (cells.empty()) {
      p.outcome.status = Status::kNotApplicable;
      p.outcome.reason = "no needle length fits --ctx " + std::to_string(ctx.config.n_ctx);
    } else {
      RateVerdict(ctx, p.outcome, ref_total ? static_cast<double>(hits_on_ref) / ref_total : 0.0,
                  ref_total ? 1.0 : 0.0, "recall of the reference's needles",
                  "model cannot recall needles: reference leg fails too", error);
    }
    results.push_back(std::move(p));
  }
  return results;
}

namespace {

// The JSON object in text: from the first '{' to its matching '}' ("" when unbalanced).
std::string ExtractObject(const std::string& text) {
  const size_t open = text.find('{');
  if (open == std::string::npos) return "";
  int depth = 0;
  bool in_string = false;
  for (size_t i = open; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{') {
      ++depth;
    } else if (c == '}' && --depth == 0) {
      return text.substr(open, i - open + 1);
    }
  }
  return "";
}

}  // namespace

std::optional<OutputDifference> FirstDifferenceFromReference(const std::vector<std::string>& outs,
                                                             const std::vector<std::string>& ref) {
  for (size_t k = 0; k < outs.size() && k < ref.size(); ++k) {
    const int64_t d = FirstDifference(outs[k], ref[k]);
    if (d >= 0) return OutputDifference{static_cast<int>(k), d};
  }
  return std::nullopt;
}

namespace {

struct JsonRequestItem {
  std::string user;
  std::string name;
  int age;
  std::string city;
  std::string expected;  // compact JSON, keys sorted
};

// Four seeded requests for an object {"name", "age", "city"} (the JSON and schema probes).
std::vector<JsonRequestItem> JsonRequestItems(const RunContext& ctx) {
  std::vector<JsonRequestItem> items;
  std::mt19937_64 rng(ctx.config.seed * 31337 + 1);
  for (int k = 0; k < 4; ++k) {
    const std::string name = Pick(rng, kNames);
    const int age = 18 + static_cast<int>(rng() % 70);
    const std::string city = Pick(rng, kCities);
    // The shipped model's JSON phrasing (train/data.py, json_style "quoted"): each field given
    // as "name" = value, the name quoted as it is written in the answer.
    const std::string user = "Write a JSON object with the fields \"name\" = \"" + name +
                             "\", \"age\" = " + std::to_string(age) + ", \"city\" = \"" + city +
                             "\".";
    const std::string expected = "{\"age\":" + std::to_string(age) +
                                 ",\"city\":" + JsonQuote(city) + ",\"name\":" + JsonQuote(name) +
                                 "}";
    items.push_back({user, name, age, city, expected});
  }
  return items;
}

// The schema of the schema probe's objects as GBNF: {"name": string, "age": integer, "city":
// string} in that order, strings of up to 40 characters, optional single spaces between tokens.
const char* const kPersonGrammar =
    R"(root ::= "{" ws "\"name\"" ws ":" ws string "," ws "\"age\"" ws ":" ws integer "," ws "\"city\"" ws ":" ws string ws "}"
string ::= "\"" ( [^"\\\x00-\x1F] | "\\" ["\\/bfnrt] ){0,40} "\""
integer ::= "-"? ( [0] | [1-9] [0-9]{0,9} )
ws ::= " "?
)";

// Shared by the JSON and schema probes: each leg answers the items, graded by validity and by
// the values asked for; `grammar` constrains the answers ("" for free-running).
std::vector<JsonResult> RunJsonItems(const RunContext& ctx, const char* probe_name,
                                     const std::string& grammar) {
  const std::vector<JsonRequestItem> items = JsonRequestItems(ctx);
  std::vector<JsonResult> results;
  std::vector<std::string> ref_outputs;
  double ref_valid = 0, ref_exact = 0;
  for (size_t i = 0; i < ctx.legs.size(); ++i) {
    ctx.Progress(probe_name, i);
    JsonResult p;
    std::string error;
    std::vector<std::string> outs;
    int valid = 0, exact = 0, cut = 0;
    for (const JsonRequestItem& item : items) {
      GenerationRequest request;
      request.user = item.user;
      request.max_tokens = 96;
      request.grammar = grammar;
      if (grammar.empty()) {
        request.stop = [](const std::string& text) { return !ExtractObject(text).empty(); };
      }
      const Generation g = ctx.legs[i].backend->Generate(request);
      const std::string object = grammar.empty() ? ExtractObject(g.text) : g.text;
      const auto fields = ParseJsonObject(object);
      bool ok = fields.has_value();
      if (!grammar.empty()) {
        // Schema-valid: exactly the three fields, of their types.
        ok = ok && fields->size() == 3 && fields->count("name") &&
             fields->at("name").kind == JsonScalar::Kind::kString && fields->count("age") &&
             fields->at("age").kind == JsonScalar::Kind::kInteger && fields->count("city") &&
             fields->at("city").kind == JsonScalar::Kind::kString;
      }
      const bool same = ok && fields->size() == 3 && fields->count("name") &&
                        JsonEquals(fields->at("name"), item.name) && fields->count("age") &&
                        JsonEquals(fields->at("age"), item.age) && fields->count("city") &&
                        JsonEquals(fields->at("city"), item.city);
      valid += ok;
      exact += same;
      // A constrained answer the token budget ended before the grammar closed it (a model that
      // writes long strings, as random-weight ones do) is invalid without any fault.
      cut += !grammar.empty() && !ok && !g.error && g.n_tokens >= request.max_tokens;
      outs.push_back(g.text);
      p.items.push_back({g.text, ok, same, item.expected, g.error ? g.error_message : ""});
      if (g.error && error.empty()) error = g.error_message;
    }
    if (i == 0) ref_outputs = outs;
    p.valid_rate = static_cast<double>(valid) / items.size();
    p.exact_rate = static_cast<double>(exact) / items.size();
    p.first_difference = FirstDifferenceFromReference(outs, ref_outputs);
    p.outcome.cell = "valid " + std::to_string(valid) + "/" + std::to_string(items.size()) +
                     ", exact " + std::to_string(exact) + "/" + std::to_string(items.size()) +
                     (cut > 0 ? ", " + std::to_string(cut) + " cut by the budget" : "");
    if (i == 0) {
      ref_valid = p.valid_rate;
      ref_exact = p.exact_rate;
    }
    if (!grammar.empty() && error.empty() && valid + cut < static_cast<int>(items.size())) {
      // The grammar guarantees schema-valid output once it closes; an answer that ended
      // otherwise invalid is the engine's fault.
      p.outcome.status = Status::kFail;
      p.outcome.reason = "constrained output not schema-valid (" + std::to_string(valid) + "/" +
                         std::to_string(items.size()) + ")";
    } else if (!grammar.empty()) {
      RateVerdict(ctx, p.outcome, p.exact_rate, ref_exact, "constrained JSON exactness",
                  "model cannot write the values: reference leg fails too", error);
    } else {
      RateVerdict(ctx, p.outcome, p.valid_rate + p.exact_rate, ref_valid + ref_exact,
                  "JSON validity + exactness",
                  "model cannot write the JSON: reference leg fails too", error);
    }
    results.push_back(std::move(p));
  }
  return results;
}

}  // namespace

std::vector<JsonResult> RunJsonProbe(const RunContext& ctx) {
  return RunJsonItems(ctx, "json", "");
}

std::vector<JsonResult> RunSchemaProbe(const RunContext& ctx) {
  return RunJsonItems(ctx, "schema", kPersonGrammar);
}

std::vector<CopyResult> RunCopyProbe(const RunContext& ctx) {
  // Lists of 30 "color thing" items in the shipped model's copy phrasing (train/data.py).
  std::vector<std::string> texts, users;
  std::mt19937_64 rng(ctx.config.seed * 271828 + 3);
  for (int k = 0; k < 3; ++k) {
    std::vector<std::string> items;
    for (int w = 0; w < 30; ++w) {
      items.push_back(std::string(Pick(rng, kColors)) + " " + Pick(rng, kThings));
    }
    texts.push_back(Join(items, "\n"));
    users.push_back("Repeat this list exactly, one item per line:\n" + texts.back());
  }
  std::vector<CopyResult> results;
  std::vector<std::string> ref_outputs;
  double ref_rate = 0;
  for (size_t i = 0; i < ctx.legs.size(); ++i) {
    ctx.Progress("copy", i);
    CopyResult p;
    std::string error;
    std::vector<std::string> outs;
    int exact = 0;
    for (size_t k = 0; k < texts.size(); ++k) {
      const std::string& want = texts[k];
      auto stop = [&want](const std::string& text) { return Trim(text).size() >= want.size(); };
      const Generation g = GenerateGreedy(ctx, i, users[k], TokenBudget(ctx, i, want) + 8, stop);
      const bool ok = Trim(g.text).rfind(want, 0) == 0;
      exact += ok;
      outs.push_back(g.text);
      p.items.push_back({want, g.text, ok,
                         FirstDifference(Trim(g.text).substr(0, want.size()), want),
                         g.error ? g.error_message : ""});
      if (g.error && error.empty()) error = g.error_message;
    }
    if (i == 0) ref_outputs = outs;
    p.exact_rate = static_cast<double>(exact) / texts.size();
    p.first_difference = FirstDifferenceFromReference(outs, ref_outputs);
    p.outcome.cell = "exact " + std::to_string(exact) + "/" + std::to_string(texts.size());
    if (i == 0) ref_rate = p.exact_rate;
    RateVerdict(ctx, p.outcome, p.exact_rate, ref_rate, "exact copies",
                "model cannot copy text: reference leg fails too", error);
    results.push_back(std::move(p));
  }
  return results;
}

}  // namespace lamina::probe
