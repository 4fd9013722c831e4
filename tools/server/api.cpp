// Request JSON → typed requests with type checks, and the response helpers (see api.h).
#include "api.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <random>
#include <unordered_map>

#include "../json_schema.h"
#include "chat/reasoning.h"
#include "chat/tool_calls.h"
#include "runtime/grammar.h"
#include "tokenizer/unicode.h"

namespace lamina::cli::api {

json ErrorBody(const ApiError& e) {
  json error = {{"code", e.status}, {"message", e.message}, {"type", e.type}};
  if (e.extra.is_object()) {
    for (const auto& [k, v] : e.extra.items()) error[k] = v;
  }
  return {{"error", error}};
}

ApiError EventError(const serve::Event& e) {
  switch (e.error) {
    case serve::ErrorKind::kShuttingDown:
      return {503, "unavailable_error", e.message};
    case serve::ErrorKind::kBadRequest:
      return {400, "invalid_request_error", e.message};
    case serve::ErrorKind::kContextExceeded:
      return {400,
              "exceed_context_size_error",
              e.message,
              {{"n_prompt_tokens", e.n_prompt_tokens}, {"n_ctx", e.n_ctx}}};
    case serve::ErrorKind::kEngineFailure:
    case serve::ErrorKind::kNone:
      break;
  }
  return {500, "server_error", e.message};
}

namespace {

constexpr ValueRange kChoicesRange = IntegerRange(1, kMaxChoices);
constexpr ValueRange kLogprobsRange = IntegerRange(0, kMaxLogprobs);
// llama-server's seeds: -1 (and 0xFFFFFFFF, its LLAMA_DEFAULT_SEED) draw a random one.
constexpr ValueRange kSeedRange{-1.0, 0x1p64, false, true,
                                "-1 (random) or an integer in [0, 2^64)"};

// The one table of numeric request fields and their ranges.
constexpr NumericField kNumericFields[] = {
    {"temperature", kTemperatureRange},
    {"top_k", kTopKRange},
    {"top_p", kProbabilityRange},
    {"min_p", kProbabilityRange},
    {"repeat_penalty", kPositiveRange},
    {"repeat_last_n", kRepeatLastNRange},
    {"presence_penalty", kOpenAiPenaltyRange},
    {"frequency_penalty", kOpenAiPenaltyRange},
    {"typical_p", kProbabilityRange},
    {"xtc_probability", kProbabilityRange},
    {"xtc_threshold", kProbabilityRange},
    {"mirostat", kMirostatRange},
    {"mirostat_tau", kNonNegativeRange},
    {"mirostat_eta", kNonNegativeRange},
    {"dry_multiplier", kNonNegativeRange},
    {"dry_base", kNonNegativeRange},
    {"dry_allowed_length", kDryAllowedLengthRange},
    {"dry_penalty_last_n", kRepeatLastNRange},
    {"seed", kSeedRange},
    {"n_predict", kNPredictRange},
    {"max_tokens", kNPredictRange},
    {"max_completion_tokens", kNPredictRange},
    {"n_probs", kLogprobsRange},
    {"logprobs", kLogprobsRange},  // /v1/completions
    {"top_logprobs", kLogprobsRange},
    {"n", kChoicesRange},
    {"n_cmpl", kChoicesRange},
    {"n_keep", kNKeepRange},
    {"id_slot", kSlotIdRange},
    {"speculative.n_max", kDraftTokensRange},
    {"speculative.n_min", kDraftTokensRange},
    {"speculative.p_min", kProbabilityRange},
    {"reasoning_budget_tokens", kNPredictRange},
};

const ValueRange& RangeOf(std::string_view key) {
  for (const NumericField& f : kNumericFields) {
    if (f.key == key) return f.range;
  }
  std::abort();  // every numeric field read below is in the table
}

std::string Quote(std::string_view key) { return "\"" + std::string(key) + "\""; }

bool Fail(ApiError* err, const std::string& message) {
  err->status = 400;
  err->type = "invalid_request_error";
  err->message = message;
  return false;
}

// A value as a message shows it: its JSON, cut at 64 bytes on a character boundary (an error
// body is JSON, so the message stays valid UTF-8 whatever the value holds).
std::string Shown(const json& v) {
  std::string text = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (text.size() > 64) {
    text.resize(64);
    text.resize(64 - unicode::IncompleteTailLength(text));
    text += "...";
  }
  return text;
}

// Optional numeric fields, checked against their range in kNumericFields: absent or null leaves
// *out unchanged; anything else outside the range (a string, NaN, infinity, a fraction for an
// integer) is a 400 naming the field, the range and the value.
bool GetNumber(const json& j, const char* key, double* out, ApiError* err) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return true;
  const double v = it->is_number() ? it->get<double>() : NAN;
  if (auto bad = CheckRange(RangeOf(key), v, Shown(*it))) return Fail(err, Quote(key) + " " + *bad);
  *out = v;
  return true;
}

bool GetFloat(const json& j, const char* key, float* out, ApiError* err) {
  double v = *out;
  if (!GetNumber(j, key, &v, err)) return false;
  *out = static_cast<float>(v);
  return true;
}

// Integer fields: their ranges lie within int.
bool GetInt(const json& j, const char* key, int* out, ApiError* err) {
  double v = *out;
  if (!GetNumber(j, key, &v, err)) return false;
  *out = static_cast<int>(v);
  return true;
}

// "seed": -1 or an unsigned 64-bit integer (checked on the integer itself, which a double
// cannot hold exactly); -1 and 0xFFFFFFFF leave *random set.
bool GetSeed(const json& j, uint64_t* out, bool* random, ApiError* err) {
  auto it = j.find("seed");
  if (it == j.end() || it->is_null()) return true;
  const double v = it->is_number() ? it->get<double>() : NAN;
  if (v == -1.0) {
    *random = true;
    return true;
  }
  uint64_t seed = 0;
  if (it->is_number_unsigned()) {
    seed = it->get<uint64_t>();
  } else if (it->is_number_integer() && it->get<long long>() >= 0) {
    seed = static_cast<uint64_t>(it->get<long long>());
  } else if (it->is_number_float() && v >= 0.0 && v < 0x1p64 && v == std::floor(v)) {
    seed = static_cast<uint64_t>(v);
  } else {
    return Fail(err, "\"seed\" must be " + kSeedRange.What() + ", got " + Shown(*it));
  }
  *random = seed == 0xFFFFFFFFULL;
  *out = seed;
  return true;
}

bool GetBool(const json& j, const char* key, bool* out, ApiError* err) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return true;
  if (!it->is_boolean()) return Fail(err, std::string("\"") + key + "\" must be a boolean");
  *out = it->get<bool>();
  return true;
}

// The grammar a body asks for: "grammar" (GBNF), "json_schema", or "response_format"
// ({"type": "json_object"[, "schema"]}, {"type": "json_schema", "json_schema": {"schema"}});
// empty when none. *none: the body turns a constraint off ("grammar": "" or response_format
// {"type": "text"}), e.g. the server's default one.
bool ReadConstraint(const json& body, std::string* gbnf, bool* none, ApiError* err) {
  const json* schema = nullptr;
  // json_object without a schema: any JSON object (OpenAI's JSON mode; llama-server's too).
  json any_json = {{"type", "object"}};
  if (auto it = body.find("json_schema"); it != body.end() && !it->is_null()) {
    if (!it->is_object() && !it->is_boolean()) {
      return Fail(err, "\"json_schema\" must be an object (a JSON schema)");
    }
    schema = &*it;
  }
  if (auto it = body.find("response_format"); it != body.end() && !it->is_null()) {
    if (!it->is_object()) return Fail(err, "\"response_format\" must be an object");
    auto type = it->find("type");
    if (type == it->end() || !type->is_string()) {
      return Fail(err,
                  "\"response_format.type\" must be \"text\", \"json_object\" or \"json_schema\"");
    }
    const std::string t = type->get<std::string>();
    if (t == "json_object") {
      auto s = it->find("schema");
      schema = s != it->end() && !s->is_null() ? &*s : &any_json;
    } else if (t == "json_schema") {
      auto js = it->find("json_schema");
      const json* holder = js != it->end() && js->is_object() ? &*js : &*it;
      auto s = holder->find("schema");
      if (s == holder->end() || (!s->is_object() && !s->is_boolean())) {
        return Fail(err, "\"response_format.json_schema.schema\" must be a JSON schema object");
      }
      schema = &*s;
    } else if (t == "text") {
      *none = true;
    } else {
      return Fail(
          err,
          "\"response_format.type\" must be \"text\", \"json_object\" or \"json_schema\", got \"" +
              t + "\"");
    }
  }
  auto g = body.find("grammar");
  if (g != body.end() && g->is_string() && g->get<std::string>().empty()) *none = true;
  const bool has_grammar =
      g != body.end() && !g->is_null() && !(g->is_string() && g->get<std::string>().empty());
  if (has_grammar && schema) {
    return Fail(
        err,
        "either \"json_schema\" (or \"response_format\") or \"grammar\" can be given, not both");
  }
  if (has_grammar) {
    if (!g->is_string()) return Fail(err, "\"grammar\" must be a string (GBNF)");
    *gbnf = g->get<std::string>();
    return true;
  }
  if (schema) {
    Result<std::string> converted = JsonSchemaToGbnf(*schema);
    if (!converted.ok()) return Fail(err, converted.error().message);
    *gbnf = std::move(*converted);
  }
  return true;
}

// The choice count under `key` (`n` or `n_cmpl`) and llama-server's streaming extras.
bool ReadChoices(const json& body, const char* key, size_t n_prompts, Completion* out,
                 ApiError* err) {
  int n = 1;
  if (!GetInt(body, key, &n, err)) return false;
  if (n_prompts * static_cast<size_t>(n) > kMaxCompletions) {
    return Fail(err, std::string("more than ") + std::to_string(kMaxCompletions) +
                         " completions in one request (prompts times \"" + key + "\")");
  }
  out->n_choices = n;
  return GetBool(body, "timings_per_token", &out->timings_per_token, err) &&
         GetBool(body, "return_progress", &out->return_progress, err) &&
         GetBool(body, "verbose", &out->verbose, err);
}

// Before the requests are copied for their choices: each prompt within the slot's context, and
// the logit biases of all completions within kMaxLogitBiasCopies.
bool CheckCopies(const Completion& c, const Defaults& d, ApiError* err) {
  const size_t n_completions = c.requests.size() * static_cast<size_t>(c.n_choices);
  for (const serve::Request& r : c.requests) {
    const size_t n = r.prompt.size();
    if (d.n_ctx_slot > 0 && n > static_cast<size_t>(d.n_ctx_slot)) {
      err->status = 400;
      err->type = "exceed_context_size_error";
      err->message =
          "the request exceeds the available context size, try increasing it: the prompt has " +
          std::to_string(n) + " tokens and a slot's context is " + std::to_string(d.n_ctx_slot);
      err->extra = {{"n_prompt_tokens", n}, {"n_ctx", d.n_ctx_slot}};
      return false;
    }
    if (r.params.logit_bias.size() * n_completions > kMaxLogitBiasCopies) {
      return Fail(err, "\"logit_bias\" biases " + std::to_string(r.params.logit_bias.size()) +
                           " tokens in each of " + std::to_string(n_completions) +
                           " completions; at most " + std::to_string(kMaxLogitBiasCopies) +
                           " in all");
    }
  }
  return true;
}

// One request per prompt → n_choices per prompt, choice c with the seed + c.
void ExpandChoices(Completion* out) {
  for (serve::Request& r : out->requests) r.return_progress = out->return_progress && out->stream;
  if (out->n_choices == 1) return;
  std::vector<serve::Request> all;
  for (const serve::Request& r : out->requests) {
    for (int c = 0; c < out->n_choices; ++c) {
      all.push_back(r);
      all.back().params.sampler.seed = r.params.sampler.seed + static_cast<uint64_t>(c);
    }
  }
  out->requests = std::move(all);
}

// The sampler's numbers and ignore_eos; adaptive_target is refused.
bool ReadSamplerFields(const json& body, GenerateParams* p, ApiError* err) {
  SamplerConfig& s = p->sampler;
  if (!GetFloat(body, "temperature", &s.temperature, err) ||
      !GetInt(body, "top_k", &s.top_k, err) || !GetFloat(body, "top_p", &s.top_p, err) ||
      !GetFloat(body, "min_p", &s.min_p, err) ||
      !GetFloat(body, "repeat_penalty", &s.repeat_penalty, err) ||
      !GetInt(body, "repeat_last_n", &s.repeat_last_n, err) ||
      !GetFloat(body, "presence_penalty", &s.presence_penalty, err) ||
      !GetFloat(body, "frequency_penalty", &s.frequency_penalty, err) ||
      !GetFloat(body, "typical_p", &s.typical_p, err) ||
      !GetFloat(body, "xtc_probability", &s.xtc_probability, err) ||
      !GetFloat(body, "xtc_threshold", &s.xtc_threshold, err) ||
      !GetInt(body, "mirostat", &s.mirostat, err) ||
      !GetFloat(body, "mirostat_tau", &s.mirostat_tau, err) ||
      !GetFloat(body, "mirostat_eta", &s.mirostat_eta, err) ||
      !GetFloat(body, "dry_multiplier", &s.dry_multiplier, err) ||
      !GetFloat(body, "dry_base", &s.dry_base, err) ||
      !GetInt(body, "dry_allowed_length", &s.dry_allowed_length, err) ||
      !GetInt(body, "dry_penalty_last_n", &s.dry_penalty_last_n, err) ||
      !GetBool(body, "ignore_eos", &p->ignore_eos, err)) {
    return false;
  }
  // llama-server's adaptive-p sampler is not in lamina's chain: asking for it (a target >= 0) is
  // refused rather than ignored; a negative target (its "off") is accepted.
  if (auto it = body.find("adaptive_target"); it != body.end() && !it->is_null()) {
    if (!it->is_number() || it->get<double>() >= 0.0) {
      return Fail(err,
                  "\"adaptive_target\": the adaptive-p sampler is not supported (a negative "
                  "value, its off, is accepted)");
    }
  }
  return true;
}

// DRY's sequence breakers: an array of at most kMaxDryBreakers strings of at most
// kMaxDryBreakerBytes bytes (an empty array: none).
bool ReadDryBreakers(const json& body, SamplerConfig* s, ApiError* err) {
  if (auto it = body.find("dry_sequence_breakers"); it != body.end() && !it->is_null()) {
    if (!it->is_array()) return Fail(err, "\"dry_sequence_breakers\" must be an array of strings");
    if (it->size() > kMaxDryBreakers) {
      return Fail(err, "\"dry_sequence_breakers\" has " + std::to_string(it->size()) +
                           " strings; at most " + std::to_string(kMaxDryBreakers));
    }
    s->dry_sequence_breakers.clear();
    for (const json& v : *it) {
      if (!v.is_string()) return Fail(err, "\"dry_sequence_breakers\" must be an array of strings");
      const std::string& text = v.get_ref<const std::string&>();
      if (text.size() > kMaxDryBreakerBytes) {
        return Fail(err, "a \"dry_sequence_breakers\" string has " + std::to_string(text.size()) +
                             " bytes; at most " + std::to_string(kMaxDryBreakerBytes));
      }
      s->dry_sequence_breakers.push_back(text);
    }
  }
  return true;
}

// llama-server's `samplers`: the chain's order, an array of step names (at most 32).
bool ReadSamplerOrder(const json& body, SamplerConfig* s, ApiError* err) {
  if (auto it = body.find("samplers"); it != body.end() && !it->is_null()) {
    constexpr size_t kMaxSamplerStages = 32;
    const std::string names =
        "\"penalties\", \"dry\", \"top_k\", \"typ_p\", \"top_p\", \"min_p\", \"xtc\", "
        "\"temperature\"";
    // llama-server's short form: one letter a step ("edkyp" ...).
    if (it->is_string()) {
      static constexpr std::pair<char, SamplerStage> kLetters[] = {
          {'e', SamplerStage::kPenalties}, {'d', SamplerStage::kDry},
          {'k', SamplerStage::kTopK},      {'y', SamplerStage::kTypicalP},
          {'p', SamplerStage::kTopP},      {'m', SamplerStage::kMinP},
          {'x', SamplerStage::kXtc},       {'t', SamplerStage::kTemperature}};
      const std::string& letters = it->get_ref<const std::string&>();
      if (letters.size() > kMaxSamplerStages) {
        return Fail(err, "\"samplers\" has " + std::to_string(letters.size()) +
                             " letters; at most " + std::to_string(kMaxSamplerStages));
      }
      s->samplers.clear();
      for (char ch : letters) {
        auto l = std::find_if(std::begin(kLetters), std::end(kLetters),
                              [ch](const auto& e) { return e.first == ch; });
        if (l == std::end(kLetters)) {
          return Fail(err, "\"samplers\" has the letter " + Shown(json(std::string(1, ch))) +
                               "; the known letters are e (penalties), d (dry), k (top_k), y "
                               "(typ_p), p (top_p), m (min_p), x (xtc), t (temperature)");
        }
        s->samplers.push_back(l->second);
      }
    } else if (!it->is_array()) {
      return Fail(err, "\"samplers\" must be an array of strings or a string of letters: " + names);
    } else {
      if (it->size() > kMaxSamplerStages) {
        return Fail(err, "\"samplers\" has " + std::to_string(it->size()) + " names; at most " +
                             std::to_string(kMaxSamplerStages));
      }
      s->samplers.clear();
      for (const json& v : *it) {
        SamplerStage stage;
        if (!v.is_string() || !SamplerStageFromName(v.get<std::string>(), &stage)) {
          return Fail(err, "\"samplers\" has " + Shown(v) + "; the known samplers are " + names);
        }
        s->samplers.push_back(stage);
      }
    }
    // An empty array or string: temperature alone.
    if (s->samplers.empty()) s->samplers.push_back(SamplerStage::kTemperature);
  }
  return true;
}

// "stop": a string or an array of at most kMaxStops strings.
bool ReadStops(const json& body, std::vector<std::string>* stop, ApiError* err) {
  if (auto it = body.find("stop"); it != body.end() && !it->is_null()) {
    stop->clear();
    const bool array = it->is_array();
    if (!it->is_string() && !array) {
      return Fail(err, "\"stop\" must be a string or an array of strings");
    }
    if (array && it->size() > kMaxStops) {
      return Fail(err, "\"stop\" has " + std::to_string(it->size()) + " strings; at most " +
                           std::to_string(kMaxStops));
    }
    const json one = array ? json() : json::array({*it});
    for (const json& v : array ? *it : one) {
      if (!v.is_string()) return Fail(err, "\"stop\" must be a string or an array of strings");
      if (v.get_ref<const std::string&>().size() > kMaxStopBytes) {
        return Fail(err, "a \"stop\" string has " +
                             std::to_string(v.get_ref<const std::string&>().size()) +
                             " bytes; at most " + std::to_string(kMaxStopBytes));
      }
      stop->push_back(v.get<std::string>());
    }
  }
  return true;
}

}  // namespace

bool ReadParams(const json& body, const Defaults& d, serve::Request* out, ApiError* err) {
  GenerateParams p = d.params;
  SamplerConfig& s = p.sampler;
  if (!ReadSamplerFields(body, &p, err) || !ReadDryBreakers(body, &s, err) ||
      !ReadSamplerOrder(body, &s, err)) {
    return false;
  }
  bool random = d.seed < 0 || d.seed == 0xFFFFFFFFLL;
  uint64_t seed = random ? 0 : static_cast<uint64_t>(d.seed);
  if (!GetSeed(body, &seed, &random, err)) return false;
  if (random) seed = std::random_device{}() & 0x7FFFFFFF;
  s.seed = seed;
  // Token budget: n_predict (llama-server), max_tokens / max_completion_tokens (OpenAI).
  if (!GetInt(body, "n_predict", &p.n_predict, err) ||
      !GetInt(body, "max_tokens", &p.n_predict, err) ||
      !GetInt(body, "max_completion_tokens", &p.n_predict, err)) {
    return false;
  }
  if (!ReadStops(body, &p.stop, err)) return false;
  std::string gbnf;
  bool none = false;
  if (!ReadConstraint(body, &gbnf, &none, err)) return false;
  if (none) p.grammar.reset();  // the server's default grammar too
  if (!gbnf.empty()) {
    Result<std::shared_ptr<const Grammar>> grammar = Grammar::Parse(gbnf);
    if (!grammar.ok()) return Fail(err, grammar.error().message);
    p.grammar = std::move(*grammar);
  }
  out->params = p;
  out->n_keep = d.n_keep;
  if (!GetInt(body, "id_slot", &out->id_slot, err) ||
      !GetBool(body, "cache_prompt", &out->cache_prompt, err) ||
      !GetInt(body, "n_keep", &out->n_keep, err) ||
      !GetInt(body, "speculative.n_max", &out->draft_max, err) ||
      !GetInt(body, "speculative.n_min", &out->draft_min, err)) {
    return false;
  }
  if (out->draft_min > out->draft_max && out->draft_max >= 0) {
    return Fail(err, "\"speculative.n_min\" (" + std::to_string(out->draft_min) +
                         ") exceeds \"speculative.n_max\" (" + std::to_string(out->draft_max) +
                         ")");
  }
  return GetFloat(body, "speculative.p_min", &out->draft_p_min, err);
}

namespace {

// A request's biases, summed per token as llama.cpp's logit-bias sampler adds them up (-inf
// stays -inf), one entry per token in the order tokens first appear.
class BiasSum {
 public:
  explicit BiasSum(std::vector<std::pair<int32_t, float>>* out) : out_(out) {
    for (size_t i = 0; i < out->size(); ++i) at_.try_emplace((*out)[i].first, i);
  }
  void Add(int32_t id, float bias) {
    auto [it, fresh] = at_.try_emplace(id, out_->size());
    if (fresh) {
      out_->push_back({id, bias});
    } else {
      (*out_)[it->second].second += bias;
    }
  }

 private:
  std::vector<std::pair<int32_t, float>>* out_;
  std::unordered_map<int32_t, size_t> at_;  // token → its entry in *out_
};

// One logit_bias entry: a token id (a number, or a string of digits in the object form) or a
// text (each of its tokens gets the bias), and a bias (a number, or false = never).
bool AddBias(const json& key, const json& value, const Model& model, BiasSum* sum, ApiError* err) {
  float bias;
  if (value.is_boolean()) {
    if (value.get<bool>()) return true;  // true: no change
    bias = -INFINITY;
  } else if (value.is_number()) {
    // Bounded, so that the sum of every bias a token may get stays a finite float.
    const double v = value.get<double>();
    if (!std::isfinite(v) || std::fabs(v) > kMaxLogitBiasValue) {
      return Fail(err, "\"logit_bias\" values must be false or numbers in [-1e30, 1e30], got " +
                           Shown(value));
    }
    bias = static_cast<float>(v);
  } else {
    return Fail(err, "\"logit_bias\" values must be numbers or false");
  }
  const int n_vocab = model.hparams().n_vocab;
  auto add_id = [&](long long id) {
    if (id < 0 || id >= n_vocab) {
      return Fail(err, "token id " + std::to_string(id) + " in \"logit_bias\" is out of range");
    }
    sum->Add(static_cast<int32_t>(id), bias);
    return true;
  };
  if (key.is_number_integer()) return add_id(key.get<long long>());
  if (!key.is_string()) return Fail(err, "\"logit_bias\" keys must be token ids or strings");
  const std::string& text = key.get_ref<const std::string&>();
  if (!text.empty() && text.size() < 12 &&
      std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return add_id(std::stoll(text));
  }
  if (text.size() > kMaxLogitBiasTextBytes) {
    return Fail(err, "a \"logit_bias\" text has " + std::to_string(text.size()) +
                         " bytes; at most " + std::to_string(kMaxLogitBiasTextBytes));
  }
  for (int32_t id : model.tokenizer().Encode(text, false, false)) sum->Add(id, bias);
  return true;
}

}  // namespace

bool ReadLogitBias(const json& body, const Model& model, GenerateParams* p, ApiError* err) {
  auto it = body.find("logit_bias");
  if (it == body.end() || it->is_null()) return true;
  if (!it->is_object() && !it->is_array()) {
    return Fail(err, "\"logit_bias\" must be an object or an array of pairs");
  }
  if (it->size() > kMaxLogitBiasEntries) {
    return Fail(err, "\"logit_bias\" has " + std::to_string(it->size()) + " entries; at most " +
                         std::to_string(kMaxLogitBiasEntries));
  }
  BiasSum sum(&p->logit_bias);
  if (it->is_object()) {
    for (const auto& [k, v] : it->items()) {
      if (!AddBias(json(k), v, model, &sum, err)) return false;
    }
  } else {
    for (const json& pair : *it) {
      if (!pair.is_array() || pair.size() != 2) {
        return Fail(err, "\"logit_bias\" entries must be [token or text, bias] pairs");
      }
      if (!AddBias(pair[0], pair[1], model, &sum, err)) return false;
    }
  }
  return true;
}

std::vector<int32_t> TokenizePrompt(const Model& model, const std::string& text, bool add_special) {
  return model.tokenizer().Encode(text, add_special, /*parse_special=*/true);
}

namespace {

// One prompt: text, token ids, a mix (the first text part gets BOS), or llama-server's object
// {"prompt_string": one of those} ("multimodal_data" beside it is refused: no media here).
bool ReadOnePrompt(const json& v, const Model& model, std::vector<int32_t>* out, ApiError* err) {
  const int n_vocab = model.hparams().n_vocab;
  if (v.is_string()) {
    *out = TokenizePrompt(model, v.get<std::string>(), true);
    return true;
  }
  if (v.is_object()) {
    if (v.contains("multimodal_data")) {
      return Fail(err,
                  "\"multimodal_data\" in \"prompt\": this model does not take images or audio");
    }
    auto text = v.find("prompt_string");
    if (text == v.end() || !(text->is_string() || text->is_array())) {
      return Fail(err, "a \"prompt\" object needs \"prompt_string\": a string, token ids or a mix");
    }
    return ReadOnePrompt(*text, model, out, err);
  }
  if (!v.is_array()) {
    return Fail(err,
                "\"prompt\" must be a string, token ids, a mix of both, an object with "
                "\"prompt_string\", or an array of those");
  }
  bool first = true;
  for (const json& part : v) {
    if (part.is_number_integer()) {
      const long long id = part.get<long long>();
      if (id < 0 || id >= n_vocab) {
        return Fail(err, "token id " + std::to_string(id) +
                             " in \"prompt\" is out of range (vocabulary of " +
                             std::to_string(n_vocab) + ")");
      }
      out->push_back(static_cast<int32_t>(id));
    } else if (part.is_string()) {
      std::vector<int32_t> t = TokenizePrompt(model, part.get<std::string>(), first);
      out->insert(out->end(), t.begin(), t.end());
    } else {
      return Fail(err, "\"prompt\" array elements must be token ids or strings");
    }
    first = false;
  }
  return true;
}

}  // namespace

bool ParseCompletion(const json& body, const Model& model, const Defaults& defaults, bool oai,
                     Completion* out, ApiError* err) {
  if (!body.is_object()) return Fail(err, "the body must be a JSON object");
  serve::Request base;
  if (!ReadParams(body, defaults, &base, err) || !ReadLogitBias(body, model, &base.params, err)) {
    return false;
  }
  if (auto rf = body.find("response_fields"); rf != body.end() && !rf->is_null()) {
    if (!rf->is_array()) return Fail(err, "\"response_fields\" must be an array of strings");
    for (const json& f : *rf) {
      if (!f.is_string()) return Fail(err, "\"response_fields\" must be an array of strings");
      out->response_fields.push_back(f.get<std::string>());
    }
  }
  if (!GetBool(body, "stream", &out->stream, err) ||
      !GetBool(body, "return_tokens", &out->return_tokens, err)) {
    return false;
  }
  if (auto so = body.find("stream_options"); so != body.end() && so->is_object()) {
    if (!GetBool(*so, "include_usage", &out->include_usage, err)) return false;
  }
  auto it = body.find("prompt");
  if (it == body.end()) return Fail(err, "\"prompt\" is required");
  // As llama-server: an array without a number in it is several prompts; otherwise one.
  std::vector<const json*> prompts;
  bool many = it->is_array() && !it->empty();
  if (many) {
    for (const json& v : *it) many = many && !v.is_number();
  }
  if (many) {
    if (it->size() > kMaxCompletions) {
      return Fail(err, "more than " + std::to_string(kMaxCompletions) + " prompts in one request");
    }
    for (const json& v : *it) prompts.push_back(&v);
  } else {
    prompts.push_back(&*it);
  }
  int n_probs = 0;
  if (!GetInt(body, oai ? "logprobs" : "n_probs", &n_probs, err)) return false;
  base.n_probs = n_probs;
  if (!GetBool(body, "post_sampling_probs", &base.post_sampling_probs, err)) return false;
  if (oai) base.post_sampling_probs = false;  // OpenAI's logprobs are log-probabilities
  out->post_sampling_probs = base.post_sampling_probs;
  out->logprobs = n_probs > 0;
  out->top_logprobs = n_probs;
  out->verbose = defaults.verbose;
  if (!ReadChoices(body, oai ? "n" : "n_cmpl", prompts.size(), out, err)) return false;
  for (const json* p : prompts) {
    serve::Request r = base;
    if (!ReadOnePrompt(*p, model, &r.prompt, err)) return false;
    out->requests.push_back(std::move(r));
  }
  if (!CheckCopies(*out, defaults, err)) return false;
  ExpandChoices(out);
  return true;
}

namespace {

constexpr int kMaxToolJsonDepth = 64;

// A JSON value as a template value (object members keep their order).
bool ToTemplateValue(const json& j, int depth, chat::jinja::Value* out) {
  if (depth > kMaxToolJsonDepth) return false;
  switch (j.type()) {
    case json::value_t::null:
      *out = chat::jinja::Value::None();
      return true;
    case json::value_t::boolean:
      *out = chat::jinja::Value(j.get<bool>());
      return true;
    case json::value_t::number_integer:
      *out = chat::jinja::Value(static_cast<int64_t>(j.get<int64_t>()));
      return true;
    case json::value_t::number_unsigned: {
      const uint64_t u = j.get<uint64_t>();
      *out = u <= static_cast<uint64_t>(INT64_MAX) ? chat::jinja::Value(static_cast<int64_t>(u))
                                                   : chat::jinja::Value(static_cast<double>(u));
      return true;
    }
    case json::value_t::number_float:
      *out = chat::jinja::Value(j.get<double>());
      return true;
    case json::value_t::string:
      *out = chat::jinja::Value(j.get<std::string>());
      return true;
    case json::value_t::array: {
      chat::jinja::Array a;
      for (const json& v : j) {
        a.emplace_back();
        if (!ToTemplateValue(v, depth + 1, &a.back())) return false;
      }
      *out = chat::jinja::Value::MakeArray(std::move(a));
      return true;
    }
    case json::value_t::object: {
      chat::jinja::Object o;
      for (const auto& [k, v] : j.items()) {
        o.emplace_back(k, chat::jinja::Value());
        if (!ToTemplateValue(v, depth + 1, &o.back().second)) return false;
      }
      *out = chat::jinja::Value::MakeObject(std::move(o));
      return true;
    }
    default:
      return false;
  }
}

// Depth of a JSON value (nlohmann parses deep input; templates and grammars must not recurse
// on it unchecked).
bool WithinDepth(const json& j, int depth) {
  if (depth > kMaxToolJsonDepth) return false;
  if (j.is_array() || j.is_object()) {
    for (const json& v : j) {
      if (!WithinDepth(v, depth + 1)) return false;
    }
  }
  return true;
}

bool ValidToolName(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-' || c == '.';
  });
}

// An assistant message's "tool_calls".
bool ReadMessageToolCalls(const json& calls, const std::string& where,
                          std::vector<chat::ChatToolCall>* out, ApiError* err) {
  if (!calls.is_array()) return Fail(err, where + ".tool_calls must be an array");
  if (calls.size() > kMaxToolCallsPerMessage) {
    return Fail(err, where + ".tool_calls has more than " +
                         std::to_string(kMaxToolCallsPerMessage) + " calls");
  }
  for (size_t k = 0; k < calls.size(); ++k) {
    const json& c = calls[k];
    const std::string at = where + ".tool_calls[" + std::to_string(k) + "]";
    if (!c.is_object()) return Fail(err, at + " must be an object");
    chat::ChatToolCall call;
    if (auto id = c.find("id"); id != c.end() && !id->is_null()) {
      if (!id->is_string()) return Fail(err, at + ".id must be a string");
      call.id = id->get<std::string>();
    }
    if (auto type = c.find("type"); type != c.end() && !type->is_null()) {
      if (!type->is_string() || *type != "function") {
        return Fail(err, at + ".type must be \"function\"");
      }
    }
    auto fn = c.find("function");
    if (fn == c.end() || !fn->is_object()) return Fail(err, at + ".function must be an object");
    auto name = fn->find("name");
    if (name == fn->end() || !name->is_string() || name->get<std::string>().empty()) {
      return Fail(err, at + ".function.name must be a non-empty string");
    }
    call.name = name->get<std::string>();
    auto args = fn->find("arguments");
    if (args == fn->end() || args->is_null()) {
      call.arguments = chat::jinja::Value::MakeObject();
    } else if (args->is_string()) {
      // Templates (Qwen's, Llama's) write `arguments | tojson`: an object is what they expect.
      const json parsed = json::parse(args->get<std::string>(), nullptr, false);
      if (parsed.is_object() && WithinDepth(parsed, 0)) {
        ToTemplateValue(parsed, 0, &call.arguments);
      } else {
        call.arguments = chat::jinja::Value(args->get<std::string>());
      }
    } else if (args->is_object()) {
      if (!ToTemplateValue(*args, 0, &call.arguments)) {
        return Fail(err, at + ".function.arguments is nested too deeply");
      }
    } else {
      return Fail(err, at + ".function.arguments must be a string (JSON) or an object");
    }
    out->push_back(std::move(call));
  }
  return true;
}

}  // namespace

bool ReadTools(const json& body, ToolRequest* out, ApiError* err) {
  *out = ToolRequest();
  if (auto it = body.find("tools"); it != body.end() && !it->is_null()) {
    if (!it->is_array()) return Fail(err, "\"tools\" must be an array of function tools");
    if (it->size() > kMaxTools) {
      return Fail(err, "\"tools\" has more than " + std::to_string(kMaxTools) + " tools");
    }
    if (!WithinDepth(*it, 0)) return Fail(err, "\"tools\" is nested too deeply");
    if (it->dump().size() > kMaxToolsBytes) {
      return Fail(err, "\"tools\" is over " + std::to_string(kMaxToolsBytes >> 10) + " KiB");
    }
    for (size_t i = 0; i < it->size(); ++i) {
      const json& t = (*it)[i];
      const std::string at = "tools[" + std::to_string(i) + "]";
      if (!t.is_object()) return Fail(err, at + " must be an object");
      auto type = t.find("type");
      if (type == t.end() || !type->is_string() || *type != "function") {
        return Fail(err, at + ".type must be \"function\"");
      }
      auto fn = t.find("function");
      if (fn == t.end() || !fn->is_object()) return Fail(err, at + ".function must be an object");
      auto name = fn->find("name");
      if (name == fn->end() || !name->is_string() || !ValidToolName(name->get<std::string>())) {
        return Fail(err, at + ".function.name must be 1 to 64 letters, digits, underscores, "
                              "dashes or dots");
      }
      if (auto d = fn->find("description"); d != fn->end() && !d->is_null() && !d->is_string()) {
        return Fail(err, at + ".function.description must be a string");
      }
      if (auto p = fn->find("parameters"); p != fn->end() && !p->is_null() && !p->is_object()) {
        return Fail(err, at + ".function.parameters must be an object (a JSON schema)");
      }
      const std::string n = name->get<std::string>();
      if (std::find(out->names.begin(), out->names.end(), n) != out->names.end()) {
        return Fail(err, "tool \"" + n + "\" is given twice in \"tools\"");
      }
      out->names.push_back(n);
    }
    out->tools = *it;
  }
  const bool has_tools = !out->tools.empty();
  out->choice = has_tools ? "auto" : "none";
  if (auto it = body.find("tool_choice"); it != body.end() && !it->is_null()) {
    if (it->is_string()) {
      const std::string c = it->get<std::string>();
      if (c != "none" && c != "auto" && c != "required") {
        return Fail(err,
                    "\"tool_choice\" must be \"none\", \"auto\", \"required\" or "
                    "{\"type\": \"function\", \"function\": {\"name\": ...}}");
      }
      out->choice = c;
    } else if (it->is_object()) {
      auto fn = it->find("function");
      auto type = it->find("type");
      auto name = fn != it->end() && fn->is_object() ? fn->find("name") : it->end();
      if (type == it->end() || !type->is_string() || *type != "function" || fn == it->end() ||
          !fn->is_object() || name == fn->end() || !name->is_string()) {
        return Fail(err,
                    "\"tool_choice\" must be \"none\", \"auto\", \"required\" or "
                    "{\"type\": \"function\", \"function\": {\"name\": ...}}");
      }
      out->choice = "function";
      out->forced = name->get<std::string>();
      if (std::find(out->names.begin(), out->names.end(), out->forced) == out->names.end()) {
        return Fail(err,
                    "\"tool_choice\" names \"" + out->forced + "\", which is not in \"tools\"");
      }
    } else {
      return Fail(err, "\"tool_choice\" must be a string or an object");
    }
    if (!has_tools && out->choice != "none") {
      return Fail(err, "\"tool_choice\" needs \"tools\"");
    }
  }
  return GetBool(body, "parallel_tool_calls", &out->parallel, err);
}

bool ToolCallGrammar(const ToolRequest& tools, std::string* gbnf, std::string* root,
                     ApiError* err) {
  // One JSON schema for the call object: {"name": const, "arguments": parameters} per tool.
  auto call_schema = [&](bool any_arguments) {
    json alts = json::array();
    for (const json& t : tools.tools) {
      const json& fn = t["function"];
      const std::string name = fn["name"].get<std::string>();
      if (tools.choice == "function" && name != tools.forced) continue;
      json params = {{"type", "object"}};
      if (!any_arguments) {
        if (auto p = fn.find("parameters"); p != fn.end() && p->is_object() && !p->empty()) {
          params = *p;
        }
      }
      alts.push_back({{"type", "object"},
                      {"properties", {{"name", {{"const", name}}}, {"arguments", params}}},
                      {"required", {"name", "arguments"}}});
    }
    return alts.size() == 1 ? alts[0] : json{{"anyOf", alts}};
  };
  Result<std::string> converted = JsonSchemaToGbnf(call_schema(false));
  // A parameters schema the converter cannot take (or one whose $refs point at the tool's own
  // root): any object for the arguments.
  if (!converted.ok()) converted = JsonSchemaToGbnf(call_schema(true));
  if (!converted.ok()) return Fail(err, "tools: " + converted.error().message);
  *root = "lamina-tool-calls";
  *gbnf = std::move(*converted) +
          "\nlamina-tool-call ::= \"<tool_call>\\n\" root \"\\n</tool_call>\"\n" + *root +
          " ::= lamina-tool-call" + (tools.parallel ? " (\"\\n\" lamina-tool-call)*" : "") + "\n";
  return true;
}

bool HarmonyToolCallGrammar(const ToolRequest& tools, std::string* gbnf, std::string* root,
                            ApiError* err) {
  std::string names;  // the callable names as GBNF alternatives
  json params = {{"type", "object"}};
  int n_callable = 0;
  for (const json& t : tools.tools) {
    const json& fn = t["function"];
    const std::string name = fn["name"].get<std::string>();
    if (tools.choice == "function" && name != tools.forced) continue;
    names += (names.empty() ? "" : " | ") + json(name).dump();
    if (auto p = fn.find("parameters"); p != fn.end() && p->is_object() && !p->empty()) {
      params = *p;
    }
    ++n_callable;
  }
  // One callable tool: its parameters; several: any object (the name comes first).
  if (n_callable > 1) params = {{"type", "object"}};
  Result<std::string> converted = JsonSchemaToGbnf(params);
  if (!converted.ok()) converted = JsonSchemaToGbnf(json{{"type", "object"}});
  if (!converted.ok()) return Fail(err, "tools: " + converted.error().message);
  *root = "lamina-harmony-call";
  *gbnf = std::move(*converted) + "\n" + *root + " ::= \"<|channel|>commentary to=functions.\" (" +
          names + ") \" <|constrain|>json<|message|>\" root\n";
  return true;
}

namespace {

// The render options of a chat body: thinking and the template variables (see RenderMessages).
bool ReadRenderOptions(const json& body, const Defaults& defaults, chat::ChatRenderOptions* out,
                       ApiError* err) {
  out->enable_thinking = defaults.enable_thinking;
  json kwargs = defaults.chat_template_kwargs;
  if (auto it = body.find("chat_template_kwargs"); it != body.end() && !it->is_null()) {
    if (!it->is_object()) return Fail(err, "\"chat_template_kwargs\" must be an object");
    if (it->size() > kMaxTemplateKwargs || it->dump().size() > kMaxTemplateKwargsBytes) {
      return Fail(err, "\"chat_template_kwargs\" over " + std::to_string(kMaxTemplateKwargs) +
                           " members or " + std::to_string(kMaxTemplateKwargsBytes) + " bytes");
    }
    for (const auto& [key, value] : it->items()) kwargs[key] = value;
  }
  if (auto effort = body.find("reasoning_effort"); effort != body.end() && !effort->is_null()) {
    static const char* const kEfforts[] = {"none", "minimal", "low", "medium", "high"};
    const bool known =
        effort->is_string() && std::any_of(std::begin(kEfforts), std::end(kEfforts),
                                           [&](const char* e) { return *effort == e; });
    if (!known) {
      return Fail(err,
                  "\"reasoning_effort\" must be \"none\", \"minimal\", \"low\", \"medium\" or "
                  "\"high\"");
    }
    kwargs["reasoning_effort"] = *effort;
    out->enable_thinking = *effort != "none";
  }
  if (auto t = kwargs.find("enable_thinking"); t != kwargs.end()) {
    if (!t->is_boolean()) {
      return Fail(err, "\"chat_template_kwargs.enable_thinking\" must be a boolean");
    }
    out->enable_thinking = t->get<bool>();
  }
  if (!kwargs.empty() && !ToTemplateValue(kwargs, 0, &out->extra)) {
    return Fail(err, "\"chat_template_kwargs\" is nested too deep");
  }
  return true;
}

// The "messages" array as chat messages; *last_parts gets the last message's text parts when
// its content is an array of parts.
bool ReadMessages(const json& body, std::vector<chat::ChatMessage>* messages,
                  std::vector<std::string>* last_parts, ApiError* err) {
  if (!body.is_object()) return Fail(err, "the body must be a JSON object");
  auto it = body.find("messages");
  if (it == body.end() || !it->is_array()) return Fail(err, "\"messages\" must be an array");
  if (it->empty()) return Fail(err, "\"messages\" is empty");
  for (size_t i = 0; i < it->size(); ++i) {
    const json& m = (*it)[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) return Fail(err, where + " must be an object");
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) return Fail(err, where + ".role must be a string");
    chat::ChatMessage msg{role->get<std::string>(), ""};
    auto content = m.find("content");
    if (content == m.end() || content->is_null()) {
      msg.content_null = true;  // an assistant turn with tool calls only
    } else if (content->is_string()) {
      msg.content = content->get<std::string>();
    } else if (content->is_array()) {
      // Content parts: the text ones, joined by a newline (by a blank line in a continued
      // assistant message), as llama-server joins them.
      last_parts->clear();
      for (const json& part : *content) {
        // json::value() throws on a non-string "type"; look the fields up instead.
        auto type = part.is_object() ? part.find("type") : part.end();
        if (!part.is_object() || type == part.end() || !type->is_string() || *type != "text") {
          return Fail(err, where + ".content: only text parts are supported");
        }
        auto text = part.find("text");
        last_parts->push_back(text != part.end() && text->is_string() ? text->get<std::string>()
                                                                      : std::string());
        msg.content += (last_parts->size() > 1 ? "\n" : "") + last_parts->back();
      }
      if (i + 1 < it->size()) last_parts->clear();
    } else {
      return Fail(err, where + ".content must be a string or an array of parts");
    }
    if (auto calls = m.find("tool_calls"); calls != m.end() && !calls->is_null()) {
      if (msg.role != "assistant")
        return Fail(err, where + ": only assistant turns have tool_calls");
      if (!ReadMessageToolCalls(*calls, where, &msg.tool_calls, err)) return false;
    }
    // reasoning_content: an assistant turn's thinking given apart (llama-server reads it too).
    for (auto [key, field] :
         {std::pair{"tool_call_id", &msg.tool_call_id}, std::pair{"name", &msg.name},
          std::pair{"reasoning_content", &msg.reasoning_content}}) {
      auto f = m.find(key);
      if (f == m.end() || f->is_null()) continue;
      if (!f->is_string()) return Fail(err, where + "." + key + " must be a string");
      *field = f->get<std::string>();
    }
    if (!msg.reasoning_content.empty() && msg.role != "assistant") {
      return Fail(err, where + ": only assistant turns have reasoning_content");
    }
    messages->push_back(std::move(msg));
  }
  return true;
}

}  // namespace

bool RenderMessages(const json& body, const Model& model, const chat::ChatSetup& chat,
                    const Defaults& defaults, std::string* prompt, ApiError* err) {
  const bool prefill_assistant = defaults.prefill_assistant;
  chat::ChatRenderOptions options;
  if (!ReadRenderOptions(body, defaults, &options, err)) return false;
  std::vector<chat::ChatMessage> messages;
  std::vector<std::string> last_parts;  // the last message's text parts, when it has parts
  if (!ReadMessages(body, &messages, &last_parts, err)) return false;
  // Assistant prefill: the last assistant message is continued, not closed.
  // (An assistant turn with tool calls is a finished turn, never continued.)
  const bool last_is_assistant =
      messages.back().role == "assistant" && messages.back().tool_calls.empty();
  bool prefill = prefill_assistant && last_is_assistant;
  bool add_generation_prompt = true;
  auto agp = body.find("add_generation_prompt");
  const bool explicit_generation_prompt = agp != body.end() && !agp->is_null();
  if (explicit_generation_prompt) {
    if (!agp->is_boolean()) return Fail(err, "\"add_generation_prompt\" must be a boolean");
    add_generation_prompt = agp->get<bool>();
  }
  if (auto cf = body.find("continue_final_message"); cf != body.end() && !cf->is_null()) {
    if (!cf->is_boolean()) return Fail(err, "\"continue_final_message\" must be a boolean");
    prefill = cf->get<bool>();
    if (prefill && !last_is_assistant) {
      return Fail(err,
                  "\"continue_final_message\" needs the last message to be from the assistant");
    }
    if (prefill && explicit_generation_prompt && add_generation_prompt) {
      return Fail(err,
                  "\"add_generation_prompt\" and \"continue_final_message\" cannot both be true");
    }
  }
  std::string prefix;
  if (prefill) {
    if (messages.size() >= 2 && messages[messages.size() - 2].role == "assistant") {
      return Fail(err, "cannot continue the last message: two assistant messages end the list");
    }
    if (!last_parts.empty()) {
      for (size_t p = 0; p < last_parts.size(); ++p) {
        prefix += (p > 0 ? "\n\n" : "") + last_parts[p];
      }
    } else {
      prefix = std::move(messages.back().content);
    }
    messages.pop_back();
    add_generation_prompt = true;  // the continued turn's header
    // Harmony: the continued text is the answer's final channel (as llama.cpp continues it).
    if (chat.harmony) prefix = "<|channel|>final<|message|>" + prefix;
  }
  ToolRequest tools;
  if (!ReadTools(body, &tools, err)) return false;
  chat::ChatTools template_tools;
  if (tools.active()) ToTemplateValue(tools.tools, 0, &template_tools);  // depth checked
  options.add_generation_prompt = add_generation_prompt;
  Result<std::string> text =
      chat::RenderChatPrompt(chat, messages, model.tokenizer(), template_tools, options);
  if (!text.ok()) return Fail(err, text.error().message);
  *prompt = std::move(*text) + prefix;
  return true;
}

bool ParseChat(const json& body, const Model& model, const chat::ChatSetup& chat,
               const Defaults& defaults, Completion* out, ApiError* err) {
  if (!body.is_object()) return Fail(err, "the body must be a JSON object");
  serve::Request r;
  if (!ReadParams(body, defaults, &r, err) || !ReadLogitBias(body, model, &r.params, err)) {
    return false;
  }
  if (!GetBool(body, "stream", &out->stream, err)) return false;
  if (auto so = body.find("stream_options"); so != body.end() && so->is_object()) {
    if (!GetBool(*so, "include_usage", &out->include_usage, err)) return false;
  }
  if (!GetBool(body, "logprobs", &out->logprobs, err) ||
      !GetInt(body, "top_logprobs", &out->top_logprobs, err)) {
    return false;
  }
  if (out->top_logprobs > 0 && !out->logprobs) {
    return Fail(err, "\"top_logprobs\" needs \"logprobs\": true");
  }
  r.n_probs = out->logprobs ? std::max(1, out->top_logprobs) : 0;
  out->verbose = defaults.verbose;
  if (!ReadChoices(body, "n", 1, out, err)) return false;
  ToolRequest tools;
  if (!ReadTools(body, &tools, err)) return false;
  if (tools.active()) {
    out->parse_tool_calls = true;
    out->tool_names = tools.names;
  }
  if (tools.active() && tools.choice != "auto") {
    // "required" or a named function: the output is constrained to a call.
    std::string unused;
    bool none = false;
    if (!ReadConstraint(body, &unused, &none, err)) return false;
    if (!unused.empty()) {
      return Fail(err, "\"tool_choice\": \"" + tools.choice +
                           "\" cannot be combined with \"grammar\", \"json_schema\" or "
                           "\"response_format\"");
    }
    std::string gbnf, root;
    // A harmony (gpt-oss) answer calls in its own message form.
    if (chat.harmony ? !HarmonyToolCallGrammar(tools, &gbnf, &root, err)
                     : !ToolCallGrammar(tools, &gbnf, &root, err)) {
      return false;
    }
    Result<std::shared_ptr<const Grammar>> grammar = Grammar::Parse(gbnf, root);
    if (!grammar.ok()) return Fail(err, "tools: " + grammar.error().message);
    r.params.grammar = std::move(*grammar);
  }
  std::string text;
  if (!RenderMessages(body, model, chat, defaults, &text, err)) return false;
  // Reasoning: how the answer's thinking block comes back, and its budget.
  out->reasoning_format = defaults.reasoning_format;
  if (auto f = body.find("reasoning_format"); f != body.end() && !f->is_null()) {
    if (!f->is_string() ||
        !chat::ReasoningFormatFromName(f->get<std::string>(), &out->reasoning_format)) {
      return Fail(err,
                  "\"reasoning_format\" must be \"none\", \"deepseek\", \"deepseek-legacy\" or "
                  "\"auto\"");
    }
  }
  out->thinking_at_start = chat::PromptOpensThinking(text);
  out->harmony = chat.harmony;
  int budget = defaults.reasoning_budget;
  if (!GetInt(body, "reasoning_budget_tokens", &budget, err)) return false;
  std::string message = defaults.reasoning_budget_message;
  if (auto m = body.find("reasoning_budget_message"); m != body.end() && !m->is_null()) {
    if (!m->is_string() || m->get_ref<const std::string&>().size() > kMaxStopBytes) {
      return Fail(err, "\"reasoning_budget_message\" must be a string of at most " +
                           std::to_string(kMaxStopBytes) + " bytes");
    }
    message = m->get<std::string>();
  }
  if (budget >= 0) {
    r.params.reasoning_budget = budget;
    r.params.thinking_at_start = out->thinking_at_start;
    r.params.think_close = model.tokenizer().Encode(message + std::string(chat::kThinkClose),
                                                    /*add_special=*/false, /*parse_special=*/true);
  }
  r.prompt = TokenizePrompt(model, text, true);
  out->requests.push_back(std::move(r));
  if (!CheckCopies(*out, defaults, err)) return false;
  ExpandChoices(out);
  return true;
}

const char* FinishReason(StopReason reason) {
  return reason == StopReason::kLimit || reason == StopReason::kContextFull ? "length" : "stop";
}

const char* StopType(StopReason reason) {
  switch (reason) {
    case StopReason::kEos:
      return "eos";
    case StopReason::kStopString:
      return "word";
    case StopReason::kLimit:
    case StopReason::kContextFull:
      return "limit";
    default:
      return "none";
  }
}

json TimingsJson(const serve::Timings& t) {
  auto per_token = [](double ms, int n) { return n > 0 ? ms / n : 0.0; };
  auto per_second = [](double ms, int n) { return ms > 0 ? 1e3 * n / ms : 0.0; };
  json j = {{"cache_n", t.cache_n},
            {"prompt_n", t.prompt_n},
            {"prompt_ms", t.prompt_ms},
            {"prompt_per_token_ms", per_token(t.prompt_ms, t.prompt_n)},
            {"prompt_per_second", per_second(t.prompt_ms, t.prompt_n)},
            {"predicted_n", t.predicted_n},
            {"predicted_ms", t.predicted_ms},
            {"predicted_per_token_ms", per_token(t.predicted_ms, t.predicted_n)},
            {"predicted_per_second", per_second(t.predicted_ms, t.predicted_n)}};
  if (t.draft_n > 0) {  // as llama-server reports speculative decoding
    j["draft_n"] = t.draft_n;
    j["draft_n_accepted"] = t.draft_n_accepted;
  }
  return j;
}

json PieceJson(const std::string& piece) {
  // Valid UTF-8 → the string; otherwise the byte values.
  size_t i = 0;
  bool valid = true;
  while (i < piece.size() && valid) {
    const unsigned char c = piece[i];
    const int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (len == 0 || i + len > piece.size()) {
      valid = false;
      break;
    }
    for (int k = 1; k < len; ++k)
      valid = valid && (static_cast<unsigned char>(piece[i + k]) >> 6) == 2;
    i += len;
  }
  if (valid) return piece;
  json bytes = json::array();
  for (unsigned char c : piece) bytes.push_back(static_cast<int>(c));
  return bytes;
}

std::span<const NumericField> NumericFields() { return kNumericFields; }

bool TokenizeAnswer(const json& body, const Model& model, std::string* answer, ApiError* err) {
  if (!body.is_object()) return Fail(err, "the body must be a JSON object");
  auto content = body.find("content");
  if (content == body.end() || !content->is_string()) {
    return Fail(err, "\"content\" must be a string");
  }
  bool add_special = false, with_pieces = false, parse_special = true;
  if (!GetBool(body, "add_special", &add_special, err) ||
      !GetBool(body, "with_pieces", &with_pieces, err) ||
      !GetBool(body, "parse_special", &parse_special, err)) {
    return false;
  }
  // At most a token per byte (and the special ones added): bounded by the body's size.
  const Tokenizer& tok = model.tokenizer();
  const std::vector<int32_t> ids =
      tok.Encode(content->get_ref<const std::string&>(), add_special, parse_special);
  if (ids.size() > kMaxTokenizeTokens) {
    return Fail(err, "\"content\" has " + std::to_string(ids.size()) +
                         " tokens; /tokenize answers at most " +
                         std::to_string(kMaxTokenizeTokens));
  }
  std::string& out = *answer;
  out.clear();
  out.reserve(ids.size() * (with_pieces ? 24 : 7) + 16);
  out += "{\"tokens\":[";
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) out += ',';
    if (with_pieces) {
      out += "{\"id\":" + std::to_string(ids[i]) + ",\"piece\":";
      out += PieceJson(tok.TokenToPiece(ids[i], true))
                 .dump(-1, ' ', false, json::error_handler_t::replace);
      out += '}';
    } else {
      out += std::to_string(ids[i]);
    }
  }
  out += "]}";
  return true;
}

bool DetokenizeAnswer(const json& body, const Model& model, std::string* answer, ApiError* err) {
  if (!body.is_object()) return Fail(err, "the body must be a JSON object");
  std::string text;
  auto tokens = body.find("tokens");
  if (tokens != body.end() && !tokens->is_null()) {
    if (!tokens->is_array()) return Fail(err, "\"tokens\" must be an array");
    if (tokens->size() > kMaxDetokenizeTokens) {
      return Fail(err, "\"tokens\" has " + std::to_string(tokens->size()) +
                           " tokens; /detokenize takes at most " +
                           std::to_string(kMaxDetokenizeTokens));
    }
    const int n_vocab = model.hparams().n_vocab;
    for (const json& t : *tokens) {
      if (!t.is_number_integer() || t.get<long long>() < 0 || t.get<long long>() >= n_vocab) {
        return Fail(err, "\"tokens\" holds an invalid token id");
      }
      text += model.tokenizer().TokenToPiece(t.get<int32_t>(), true);
      if (text.size() > kMaxDetokenizeBytes) {
        return Fail(err, "the text of \"tokens\" is over " + std::to_string(kMaxDetokenizeBytes) +
                             " bytes");
      }
    }
  }
  *answer = json{{"content", std::move(text)}}.dump(-1, ' ', false, json::error_handler_t::replace);
  return true;
}

}  // namespace lamina::cli::api
