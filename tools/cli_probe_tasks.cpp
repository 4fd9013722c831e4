// The generation probes of `lamina probe` (counting, needle, json, copy) and the helpers they
// share: prompt rendering in the model's chat template, greedy generation in a fresh session,
// and seeded filler text.
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <random>
#include <set>

#include "cli_probe.h"
#include "runtime/sampler.h"

#if __has_include("tokenizer/chat_template.h")
#include "tokenizer/chat_template.h"
#define LAMINA_PROBE_HAS_CHAT_TEMPLATE 1
#endif

namespace lamina::cli::probe {

using nlohmann::json;

SessionConfig Context::SessionFor(const Leg& leg) const {
  SessionConfig sc;
  sc.n_ctx = n_ctx;
  sc.kv_type = leg.kv;
  sc.v_rounding = leg.v_round;
  sc.kv_seed = options.seed;
  return sc;
}

std::unique_ptr<Session> Context::NewSession(const Leg& leg) const {
  auto s = std::make_unique<Session>(*model, SessionFor(leg), *pool);
  s->mutable_cache().InjectFaultForTesting(leg.fault);
  return s;
}

std::string RenderPrompt(const Context& ctx, const std::string& user,
                         const std::string& answer_prefix) {
#ifdef LAMINA_PROBE_HAS_CHAT_TEMPLATE
  const ChatFormat format = DetectChatFormat(ctx.chat_template);
  if (format != ChatFormat::kUnknown) {
    // Qwen3-style templates get thinking switched off: the probes grade the answer itself.
    return RenderChat(format, {{"user", user}}, /*add_generation_prompt=*/true,
                      /*enable_thinking=*/false) +
           answer_prefix;
  }
#endif
  if (ctx.chat_template.find("<|im_start|>") != std::string::npos) {
    return "<|im_start|>user\n" + user + "<|im_end|>\n<|im_start|>assistant\n" + answer_prefix;
  }
  return user + "\n" + answer_prefix;
}

Generation GenerateGreedy(const Context& ctx, const Leg& leg, const std::string& prompt,
                          int max_tokens, const std::function<bool(const std::string&)>& stop) {
  Generation g;
  const Tokenizer& tok = ctx.model->tokenizer();
  const int n_vocab = ctx.model->hparams().n_vocab;
  // Llama-3 renders its own <|begin_of_text|>; every other prompt gets the vocabulary's BOS.
  const bool has_bos_text = prompt.rfind("<|begin_of_text|>", 0) == 0;
  std::vector<int32_t> ids =
      tok.Encode(prompt, /*add_special=*/!has_bos_text, /*parse_special=*/true);
  if (ids.empty()) ids.push_back(tok.bos() >= 0 ? tok.bos() : 0);
  max_tokens = std::min(max_tokens, ctx.n_ctx - static_cast<int>(ids.size()));
  if (max_tokens <= 0) {
    g.error = true;
    g.error_message = "prompt of " + std::to_string(ids.size()) +
                      " tokens leaves no room in --ctx " + std::to_string(ctx.n_ctx);
    return g;
  }
  std::unique_ptr<Session> s = ctx.NewSession(leg);
  Result<const float*> r = s->Eval(ids, false);
  StreamingDetokenizer detok(tok);
  for (int i = 0; i < max_tokens; ++i) {
    if (!r.ok()) {
      g.error = true;
      g.error_message = r.error().message;
      break;
    }
    const int32_t id = ArgMax(*r, n_vocab);
    if (tok.IsEog(id)) {
      g.ended_turn = true;
      break;
    }
    g.tokens.push_back(id);
    g.text += detok.Push(id);
    if (stop && stop(g.text)) break;
    if (i + 1 < max_tokens) r = s->Eval(&id, 1, false);
  }
  g.text += detok.Flush();
  return g;
}

namespace {

// Word lists and sentence shapes of the shipped model's training prose (train/data.py), which
// are also plain English for any other model.
const char* const kNames[] = {"Tom", "Lily", "Max", "Anna", "Ben", "Grace", "Sam", "Mia", "Leo", "Zoe"};
const char* const kAdjectives[] = {"small", "big",  "old",   "quiet", "happy",
                                   "brave", "kind", "gentle", "soft", "little"};
const char* const kAnimals[] = {"fox", "cat", "dog", "bird", "owl", "bear", "deer", "duck", "frog", "goat"};
const char* const kColors[] = {"red", "blue", "green", "yellow", "brown", "white", "gray", "pink"};
const char* const kThings[] = {"ball", "box",  "lamp", "book", "key",
                               "cup",  "boat", "bell", "map",  "chair"};
const char* const kPlaces[] = {"the park",  "the garden", "the forest", "the river", "the lake",
                               "the school", "the market", "the hill",  "the farm",  "the village"};
const char* const kVerbs[] = {"found",   "opened", "carried", "watched", "painted",
                              "visited", "lost",   "saw",     "liked",   "fixed"};
const char* const kFeelings[] = {"happy", "calm", "glad", "curious", "sleepy", "proud"};
const char* const kCities[] = {"Paris", "Berlin", "Madrid", "Rome", "Oslo", "Vienna", "Lisbon", "Dublin"};

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

int TokenCount(const Context& ctx, const std::string& text) {
  return static_cast<int>(ctx.model->tokenizer().Encode(text, false, false).size());
}

// Sentences of filler, about n_tokens tokens in all.
std::vector<std::string> FillerSentences(const Context& ctx, uint64_t seed, int n_tokens) {
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

std::string Trim(const std::string& s) {
  size_t a = 0, b = s.size();
  while (a < b && std::isspace(static_cast<unsigned char>(s[a]))) ++a;
  while (b > a && std::isspace(static_cast<unsigned char>(s[b - 1]))) --b;
  return s.substr(a, b - a);
}

// Index of the first byte where a and b differ; -1 when equal.
int64_t FirstDifference(const std::string& a, const std::string& b) {
  const size_t n = std::min(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    if (a[i] != b[i]) return static_cast<int64_t>(i);
  }
  return a.size() == b.size() ? -1 : static_cast<int64_t>(n);
}

void Progress(const Context& ctx, const char* probe, size_t leg) {
  std::fprintf(stderr, "lamina: probe %s: leg %zu/%zu %s\n", probe, leg + 1, ctx.legs.size(),
               ctx.legs[leg].name.c_str());
}

// A rate-style verdict: n/a when the reference scores 0, fail when the leg keeps less than
// keep_fraction of the reference's score.
void RateVerdict(const Context& ctx, json& p, double leg_score, double ref_score,
                 const std::string& what, const std::string& na_reason) {
  if (ref_score <= 0.0) {
    p["status"] = "n/a";
    p["reason"] = na_reason;
  } else if (leg_score < ref_score * ctx.thresholds.keep_fraction) {
    p["status"] = "fail";
    char buf[160];
    std::snprintf(buf, sizeof(buf), "%s %.0f%% vs reference %.0f%%", what.c_str(), 100 * leg_score,
                  100 * ref_score);
    p["reason"] = buf;
  } else {
    p["status"] = "pass";
  }
}

}  // namespace

std::string FillerText(const Context& ctx, uint64_t seed, int n_tokens) {
  return Join(FillerSentences(ctx, seed, n_tokens), " ");
}

json AnalyzeCounting(const std::string& text, int n, bool ended_turn) {
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
  json j;
  j["n"] = n;
  j["pass"] = first_wrong < 0;
  j["sequence_ok"] = sequence_ok;
  j["stopped_after_n"] = stopped;
  j["ended_turn"] = ended_turn;
  j["lines"] = lines.size();
  j["first_wrong_line"] = first_wrong < 0 ? json(nullptr) : json(first_wrong);
  if (first_wrong > 0) {
    j["first_wrong_text"] = first_wrong <= static_cast<int>(lines.size()) ? lines[first_wrong - 1]
                            : first_wrong == n + 1                        ? "(no end of turn)"
                                                                          : "(missing)";
  }
  j["longest_repeat"] = {{"value", best_value}, {"length", best}};
  j["skipped_count"] = skipped.size();
  j["skipped"] =
      std::vector<int64_t>(skipped.begin(), skipped.begin() + std::min<size_t>(40, skipped.size()));
  j["first_40"] =
      std::vector<std::string>(lines.begin(), lines.begin() + std::min<size_t>(40, lines.size()));
  return j;
}

void RunCountingProbe(Context& ctx, json& report) {
  const int n = ctx.options.count_to;
  const std::string prompt =
      RenderPrompt(ctx, "Count from 1 to " + std::to_string(n) + ", one number per line.", "");
  std::string expected;
  for (int i = 1; i <= n; ++i) expected += std::to_string(i) + "\n";
  const int budget = TokenCount(ctx, expected) + 16;
  // Stop once a line after N is out (the turn should have ended at N), or 40 lines after the
  // first mistake (enough to show the pattern).
  auto stop = [n](const std::string& text) {
    const int complete = static_cast<int>(std::count(text.begin(), text.end(), '\n'));
    if (complete < 2) return false;
    const json a = AnalyzeCounting(text.substr(0, text.rfind('\n')), n, false);
    if (a["lines"].get<int>() > n) return true;
    return !a["first_wrong_line"].is_null() &&
           a["lines"].get<int>() >= a["first_wrong_line"].get<int>() + 40;
  };
  bool ref_sequence_ok = false, ref_stopped = false;
  for (size_t i = 0; i < ctx.legs.size(); ++i) {
    Progress(ctx, "counting", i);
    Generation g = GenerateGreedy(ctx, ctx.legs[i], prompt, budget, stop);
    json p = AnalyzeCounting(g.text, n, g.ended_turn);
    p["text"] = g.text.substr(0, 4000);
    p["generated_tokens"] = g.tokens.size();
    if (g.error) p["error"] = g.error_message;
    const bool sequence_ok = p["sequence_ok"].get<bool>() && !g.error;
    const bool stopped = p["stopped_after_n"].get<bool>() && !g.error;
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
    } else if (p["longest_repeat"]["length"].get<int>() == 0) {
      std::snprintf(cell, sizeof(cell), "no numbers");
    } else if (p["ended_turn"].get<bool>() &&
               p["first_wrong_line"].get<int>() > p["lines"].get<int>()) {
      std::snprintf(cell, sizeof(cell), "ended after line %d", p["lines"].get<int>());
    } else if (!p["first_wrong_line"].is_null()) {
      std::snprintf(cell, sizeof(cell), "line %d, run %dx%lld", p["first_wrong_line"].get<int>(),
                    p["longest_repeat"]["length"].get<int>(),
                    static_cast<long long>(p["longest_repeat"]["value"].get<int64_t>()));
    } else {
      std::snprintf(cell, sizeof(cell), "error");
    }
    p["cell"] = cell;
    if (!ref_sequence_ok) {
      p["status"] = "n/a";
      p["reason"] = "model cannot count: reference leg fails too";
    } else if (pass) {
      p["status"] = "pass";
      if (!stopped)
        p["note"] = "no end of turn after " + std::to_string(n) + " (reference neither)";
    } else {
      p["status"] = "fail";
      p["reason"] =
          g.error ? g.error_message
                  : "first wrong line " + std::to_string(p["first_wrong_line"].get<int>()) +
                        " (\"" + p["first_wrong_text"].get<std::string>() + "\"), longest repeat " +
                        std::to_string(p["longest_repeat"]["length"].get<int>()) + "x";
    }
    report["legs"][i]["probes"]["counting"] = p;
  }
}

void RunNeedleProbe(Context& ctx, json& report) {
  const std::vector<int>& lengths = ctx.needle_lengths;
  const std::vector<int>& depths = ctx.needle_depths;
  struct Cell {
    int length, depth;
    std::string prompt, expected;
  };
  std::vector<Cell> cells;
  std::vector<int> skipped_lengths;
  for (int length : lengths) {
    // The question and answer need room after the haystack.
    if (length + 48 > ctx.n_ctx) {
      skipped_lengths.push_back(length);
      continue;
    }
    const std::vector<std::string> filler =
        FillerSentences(ctx, ctx.options.seed * 7919 + length, length);
    for (int depth : depths) {
      std::mt19937_64 rng(ctx.options.seed * 104729 + length * 131 + depth);
      const std::string secret = std::to_string(10000 + rng() % 90000);
      std::vector<std::string> hay = filler;
      const size_t at = std::min(hay.size(), static_cast<size_t>(hay.size() * depth / 100.0 + 0.5));
      // The shipped model's needle phrasing (train/data.py); the answer repeats the fact.
      hay.insert(hay.begin() + at, "The secret code is " + secret + ".");
      const std::string user = Join(hay, " ") + "\n\nWhat is the secret code?";
      cells.push_back({length, depth, RenderPrompt(ctx, user, ""), secret});
    }
  }
  std::vector<int> ref_hits;  // per cell, reference leg
  for (size_t i = 0; i < ctx.legs.size(); ++i) {
    Progress(ctx, "needle", i);
    json p;
    json grid = json::array();
    int hits = 0, hits_on_ref = 0, ref_total = 0;
    for (size_t c = 0; c < cells.size(); ++c) {
      auto stop = [&](const std::string& text) {
        return text.find(cells[c].expected) != std::string::npos ||
               text.find('\n', 1) != std::string::npos;
      };
      Generation g = GenerateGreedy(ctx, ctx.legs[i], cells[c].prompt, 24, stop);
      const bool hit = !g.error && g.text.find(cells[c].expected) != std::string::npos;
      hits += hit;
      if (i == 0) ref_hits.push_back(hit);
      ref_total += ref_hits[c];
      hits_on_ref += hit && ref_hits[c];
      grid.push_back({{"length", cells[c].length},
                      {"depth", cells[c].depth},
                      {"expected", cells[c].expected},
                      {"answer", Trim(g.text)},
                      {"hit", hit}});
      if (g.error) grid.back()["error"] = g.error_message;
    }
    p["grid"] = grid;
    p["lengths"] = lengths;
    p["depths"] = depths;
    p["skipped_lengths"] = skipped_lengths;
    p["hits"] = hits;
    p["cells"] = cells.size();
    p["recall"] = cells.empty() ? 0.0 : static_cast<double>(hits) / cells.size();
    p["cell"] = std::to_string(hits) + "/" + std::to_string(cells.size());
    if (cells.empty()) {
      p["status"] = "n/a";
      p["reason"] = "no needle length fits --ctx " + std::to_string(ctx.n_ctx);
    } else {
      RateVerdict(ctx, p, ref_total ? static_cast<double>(hits_on_ref) / ref_total : 0.0,
                  ref_total ? 1.0 : 0.0, "recall of the reference's needles",
                  "model cannot recall needles: reference leg fails too");
    }
    report["legs"][i]["probes"]["needle"] = p;
  }
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

// The first (item, byte) where a leg's outputs differ from the reference's; null when none.
json FirstDifferenceFromReference(const std::vector<std::string>& outs,
                                  const std::vector<std::string>& ref) {
  for (size_t k = 0; k < outs.size() && k < ref.size(); ++k) {
    const int64_t d = FirstDifference(outs[k], ref[k]);
    if (d >= 0) return {{"item", k}, {"byte", d}};
  }
  return nullptr;
}

}  // namespace

void RunJsonProbe(Context& ctx, json& report) {
  struct Item {
    std::string prompt;
    json expected;
  };
  std::vector<Item> items;
  std::mt19937_64 rng(ctx.options.seed * 31337 + 1);
  for (int k = 0; k < 4; ++k) {
    const std::string name = Pick(rng, kNames);
    const int age = 18 + static_cast<int>(rng() % 70);
    const std::string city = Pick(rng, kCities);
    // The shipped model's JSON phrasing (train/data.py, json_style "quoted"): each field given
    // as "name" = value, the name quoted as it is written in the answer.
    const std::string user = "Write a JSON object with the fields \"name\" = \"" + name +
                             "\", \"age\" = " + std::to_string(age) + ", \"city\" = \"" + city +
                             "\".";
    items.push_back({RenderPrompt(ctx, user, ""), {{"name", name}, {"age", age}, {"city", city}}});
  }
  std::vector<std::string> ref_outputs;
  double ref_valid = 0, ref_exact = 0;
  for (size_t i = 0; i < ctx.legs.size(); ++i) {
    Progress(ctx, "json", i);
    std::vector<std::string> outs;
    json list = json::array();
    int valid = 0, exact = 0;
    for (const Item& item : items) {
      auto stop = [](const std::string& text) { return !ExtractObject(text).empty(); };
      Generation g = GenerateGreedy(ctx, ctx.legs[i], item.prompt, 96, stop);
      const std::string obj = ExtractObject(g.text);
      json parsed = json::parse(obj, nullptr, /*allow_exceptions=*/false);
      const bool ok = !obj.empty() && !parsed.is_discarded() && parsed.is_object();
      valid += ok;
      exact += ok && parsed == item.expected;
      outs.push_back(g.text);
      list.push_back({{"output", g.text},
                      {"valid", ok},
                      {"exact", ok && parsed == item.expected},
                      {"expected", item.expected.dump()}});
    }
    if (i == 0) ref_outputs = outs;
    json p;
    p["items"] = list;
    p["valid_rate"] = static_cast<double>(valid) / items.size();
    p["exact_rate"] = static_cast<double>(exact) / items.size();
    p["first_difference"] = FirstDifferenceFromReference(outs, ref_outputs);
    p["cell"] = "valid " + std::to_string(valid) + "/" + std::to_string(items.size()) + ", exact " +
                std::to_string(exact) + "/" + std::to_string(items.size());
    if (i == 0) {
      ref_valid = p["valid_rate"];
      ref_exact = p["exact_rate"];
    }
    const double ref_score = ref_valid + ref_exact;
    RateVerdict(ctx, p, p["valid_rate"].get<double>() + p["exact_rate"].get<double>(), ref_score,
                "JSON validity + exactness",
                "model cannot write the JSON: reference leg fails too");
    report["legs"][i]["probes"]["json"] = p;
  }
}

void RunCopyProbe(Context& ctx, json& report) {
  // Lists of 30 "color thing" items in the shipped model's copy phrasing (train/data.py).
  std::vector<std::string> texts, prompts;
  std::mt19937_64 rng(ctx.options.seed * 271828 + 3);
  for (int k = 0; k < 3; ++k) {
    std::vector<std::string> items;
    for (int w = 0; w < 30; ++w) items.push_back(std::string(Pick(rng, kColors)) + " " + Pick(rng, kThings));
    texts.push_back(Join(items, "\n"));
    prompts.push_back(
        RenderPrompt(ctx, "Repeat this list exactly, one item per line:\n" + texts.back(), ""));
  }
  std::vector<std::string> ref_outputs;
  double ref_rate = 0;
  for (size_t i = 0; i < ctx.legs.size(); ++i) {
    Progress(ctx, "copy", i);
    std::vector<std::string> outs;
    json list = json::array();
    int exact = 0;
    for (size_t k = 0; k < texts.size(); ++k) {
      const std::string& want = texts[k];
      auto stop = [&want](const std::string& text) { return Trim(text).size() >= want.size(); };
      Generation g = GenerateGreedy(ctx, ctx.legs[i], prompts[k], TokenCount(ctx, want) + 8, stop);
      const bool ok = Trim(g.text).rfind(want, 0) == 0;
      exact += ok;
      outs.push_back(g.text);
      list.push_back(
          {{"expected", want},
           {"output", g.text},
           {"exact", ok},
           {"first_wrong_byte", FirstDifference(Trim(g.text).substr(0, want.size()), want)}});
    }
    if (i == 0) ref_outputs = outs;
    json p;
    p["items"] = list;
    p["exact_rate"] = static_cast<double>(exact) / texts.size();
    p["first_difference"] = FirstDifferenceFromReference(outs, ref_outputs);
    p["cell"] = "exact " + std::to_string(exact) + "/" + std::to_string(texts.size());
    if (i == 0) ref_rate = p["exact_rate"];
    RateVerdict(ctx, p, p["exact_rate"], ref_rate, "exact copies",
                "model cannot copy text: reference leg fails too");
    report["legs"][i]["probes"]["copy"] = p;
  }
}

}  // namespace lamina::cli::probe
