// `lamina serve`: flags, start-up and shutdown, and the HTTP routes (see server.h).
#include "server.h"

#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <ctime>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <thread>

#include "../build_info.h"
#include "../cli_commands.h"
#include "../cli_common.h"
#include "../cli_options.h"
#include "../cli_spec.h"
#include "api.h"
#include "chat/answer.h"
#include "chat/reasoning.h"
#include "chat/tool_calls.h"
#include "cors_proxy.h"
#include "http.h"
#include "json_limits.h"
#include "model/model.h"
#include "protocols.h"
#include "runtime/kv_cache.h"
#include "serve/scheduler.h"
#include "util/timer.h"

namespace lamina::cli {

namespace {

using api::ApiError;
using api::json;
using Channels = std::vector<std::shared_ptr<serve::Channel>>;

std::vector<std::string> SplitCommas(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    const size_t comma = s.find(',', start);
    std::string part =
        s.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    while (!part.empty() && part.front() == ' ') part.erase(0, 1);
    while (!part.empty() && part.back() == ' ') part.pop_back();
    if (!part.empty()) out.push_back(part);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

std::string JoinCommas(const std::vector<std::string>& parts) {
  std::string out;
  for (const std::string& p : parts) out += (out.empty() ? "" : ", ") + p;
  return out;
}

std::string RandomId(const char* prefix) {
  static constexpr char kAlnum[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  thread_local std::mt19937_64 rng(std::random_device{}());
  std::string id = prefix;
  for (int i = 0; i < 32; ++i) id += kAlnum[rng() % 62];
  return id;
}

std::string Sse(const json& j) {
  return "data: " + j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// Generated arguments as compact JSON text (the generated text when it does not parse here).
std::string ArgumentsText(const std::string& generated) {
  json parsed;
  std::string error;
  if (!ParseJsonBounded(generated, kMaxJsonDepth, &parsed, &error, "arguments")) return generated;
  return Dump(parsed);
}

// OpenAI's message.tool_calls (streaming: each with its "index").
json ToolCallsJson(const std::vector<chat::ToolCall>& calls, bool with_index) {
  json out = json::array();
  for (size_t k = 0; k < calls.size(); ++k) {
    json c = json::object();
    if (with_index) c["index"] = k;
    c["id"] = RandomId("call_");
    c["type"] = "function";
    c["function"] = {{"name", calls[k].name}, {"arguments", ArgumentsText(calls[k].arguments)}};
    out.push_back(std::move(c));
  }
  return out;
}

// The content beside tool calls: trimmed; null when nothing is left.
json ContentBeside(const std::string& text) {
  const size_t b = text.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return nullptr;
  const size_t e = text.find_last_not_of(" \t\r\n");
  return text.substr(b, e - b + 1);
}

// One finished (or failed) request, for the monitor.
// The longest cache_salt a request may give.
constexpr size_t kMaxCacheSalt = 256;
// The Ollama API level /api/version reports (clients gate features on it).
constexpr const char* kOllamaApiVersion = "0.9.0";

struct RecentRequest {
  std::string key_scope;  // the API key's digest (Server::KeyScope): shown to that key only
  std::string route;
  int status = 200;
  int slot = -1;
  int prompt_n = 0;
  int cache_n = 0;
  int predicted_n = 0;
  double predicted_per_second = 0.0;
  std::string stop_type;
  double finished_at = 0.0;  // seconds since the epoch
};

struct Collector;
class OaiStream;

// Everything the routes share. The model and scheduler appear once loading is done.
class Server {
 public:
  explicit Server(ServeOptions options) : o_(std::move(options)) {}

  int Run();

 private:
  int LoadAccessLists();
  // The steps of Run; each returns an exit code, except SetModelNames.
  int CheckBeforeListening(KvType* kv_type, KvRounding* v_rounding);
  int StartScheduler(KvType kv, KvRounding round);
  int ChooseChatFormat();
  int SetRequestDefaults();
  void SetModelNames();
  enum class Route { kCompletion, kOaiCompletion, kOaiChat };
  // The other protocols (protocols.h) and the error shape of each.
  enum class Protocol { kAnthropic, kResponses, kOllamaChat, kOllamaGenerate };
  enum class ErrorStyle { kOpenAi, kAnthropic, kOllama };
  static ErrorStyle StyleOf(const std::string& path);

  void SetUpRoutes();
  // The route groups SetUpRoutes registers, in order (the protocols' are SetUpProtocolRoutes).
  void SetUpAccessLog();
  void SetUpGuards();
  void SetUpCompletionRoutes();
  void SetUpUtilityRoutes();
  void SetUpWebRoutes();
  // The index of the request's API key in api_keys_ (0 when the server has none), -1 when it
  // has none of them. Requests of different keys never share cached prompt cells.
  int KeyIndex(const http::Request& req) const;
  // The request's tenant: a digest of its API key ("" without keys). Prefix-cache cells, slot
  // details, the monitor's recent requests and slot files never cross tenants.
  std::string KeyScope(const http::Request& req) const;
  bool HostAllowed(const std::string& host_header) const;
  bool OriginAllowed(const std::string& origin) const;
  void AddCorsHeaders(const http::Request& req, http::Response& res) const;
  bool Ready(http::Response& res, ErrorStyle style = ErrorStyle::kOpenAi) const;
  void SendError(http::Response& res, const ApiError& e,
                 ErrorStyle style = ErrorStyle::kOpenAi) const;
  bool ParseBody(const http::Request& req, http::Response& res, json* body,
                 ErrorStyle style = ErrorStyle::kOpenAi) const;
  void Count(const std::string& route);
  void Remember(RecentRequest r);

  // A parsed completion's checks (cache_salt, context) and its channels; false: *err is set.
  bool Admit(const http::Request& req, const json& body, api::Completion* c, Channels* channels,
             ApiError* err);
  // Records a finished request of `route_name` for the monitor.
  std::function<void(int, const serve::Event&)> Rememberer(const http::Request& req,
                                                           std::string route_name);
  void HandleCompletion(const http::Request& req, http::Response& res, Route route);
  std::pair<int, json> OaiWhole(const api::Completion& c, const Collector& col, Route route,
                                const std::string& id, long long created,
                                const std::vector<serve::Timings>& timings) const;
  friend class OaiStream;
  void HandleProtocol(const http::Request& req, http::Response& res, Protocol p);
  void HandleCountTokens(const http::Request& req, http::Response& res);
  json OllamaModel() const;
  void HandleOllamaShow(const http::Request& req, http::Response& res);
  void SetUpProtocolRoutes();
  json ParamsJson(const GenerateParams& p) const;
  json NativeFinal(const api::Completion& c, size_t index, const serve::Request& r,
                   const std::string& text, const std::vector<int32_t>& tokens,
                   const serve::Event& done) const;
  json Usage(const api::Completion& c, const std::vector<serve::Timings>& t) const;
  void HandleTokenize(const http::Request& req, http::Response& res);
  void HandleDetokenize(const http::Request& req, http::Response& res);
  void HandleProps(http::Response& res);
  void HandleSlots(const http::Request& req, http::Response& res);
  void HandleSlotAction(const http::Request& req, http::Response& res);
  void HandleModels(http::Response& res);
  void HandleMetrics(http::Response& res);
  void HandleMonitor(const http::Request& req, http::Response& res);

  ServeOptions o_;
  std::unique_ptr<http::Server> http_;
  std::atomic<bool> ready_{false};
  std::unique_ptr<Model> model_;
  std::unique_ptr<ThreadPool> pool_;
  SpecSetup spec_;  // the draft model (before scheduler_, which reads it, so it outlives it)
  bool speculative_ = false;
  std::unique_ptr<serve::Scheduler> scheduler_;
  chat::ChatSetup chat_;
  std::string chat_template_text_;
  api::Defaults defaults_;
  std::string model_id_;
  std::vector<std::string> aliases_;
  std::vector<std::string> tags_;
  std::vector<std::string> api_keys_;
  std::vector<std::string> key_digests_;       // KeyDigest of each key, same order
  protocols::ThinkingSigner thinking_signer_;  // Anthropic thinking blocks' signatures
  std::vector<std::string> cors_origins_;      // --cors-origin
  bool cors_echo_any_ = false;                 // no --cors-origin, API keys: any origin is echoed
  std::vector<std::string> allowed_hosts_;     // --host-allow, lower-cased
  std::string kv_name_;
  double started_at_ = 0.0;

  std::atomic<uint64_t> next_group_{1};  // serve::Request::prefix_group of n choices
  std::mutex stats_mutex_;
  std::map<std::string, uint64_t> http_requests_;  // route → count
  std::deque<RecentRequest> recent_;               // newest last, at most 32
};

// Equal strings, in a time that does not depend on where they differ.
bool ConstantTimeEquals(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < b.size(); ++i) {
    diff |= static_cast<unsigned char>(b[i] ^ (i < a.size() ? a[i] : 0));
  }
  return diff == 0;
}

// FNV-1a of a key, as 16 hex digits: names a key's cache scope and slot-file folder without
// keeping the key itself in either.
std::string KeyDigest(const std::string& key) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : key) {
    h ^= ch;
    h *= 1099511628211ull;
  }
  char out[17];
  std::snprintf(out, sizeof out, "%016llx", static_cast<unsigned long long>(h));
  return out;
}

std::string Server::KeyScope(const http::Request& req) const {
  const int k = KeyIndex(req);
  return k < 0 || api_keys_.empty() ? std::string() : key_digests_[static_cast<size_t>(k)];
}

int Server::KeyIndex(const http::Request& req) const {
  if (api_keys_.empty()) return 0;
  std::string key;
  const std::string auth = req.get_header_value("Authorization");
  if (auth.rfind("Bearer ", 0) == 0) key = auth.substr(7);
  if (key.empty()) key = req.get_header_value("X-Api-Key");
  if (key.empty()) return -1;
  int found = -1;
  for (size_t i = 0; i < api_keys_.size(); ++i) {
    if (ConstantTimeEquals(key, api_keys_[i]) && found < 0) found = static_cast<int>(i);
  }
  return found;
}

Server::ErrorStyle Server::StyleOf(const std::string& path) {
  if (path.rfind("/v1/messages", 0) == 0) return ErrorStyle::kAnthropic;
  if (path.rfind("/api/", 0) == 0) return ErrorStyle::kOllama;
  return ErrorStyle::kOpenAi;
}

void Server::SendError(http::Response& res, const ApiError& e, ErrorStyle style) const {
  res.status = e.status;
  const json body = style == ErrorStyle::kAnthropic ? protocols::AnthropicError(e)
                    : style == ErrorStyle::kOllama  ? protocols::OllamaError(e)
                                                    : api::ErrorBody(e);
  res.set_content(Dump(body), "application/json; charset=utf-8");
}

bool Server::Ready(http::Response& res, ErrorStyle style) const {
  if (ready_) return true;
  SendError(res, {503, "unavailable_error", "Loading model"}, style);
  return false;
}

bool Server::ParseBody(const http::Request& req, http::Response& res, json* body,
                       ErrorStyle style) const {
  std::string error;
  if (!ParseJsonBounded(req.body, kMaxJsonDepth, body, &error)) {
    SendError(res, {400, "invalid_request_error", error}, style);
    return false;
  }
  if (!body->is_object()) {
    SendError(res, {400, "invalid_request_error", "the request body must be a JSON object"}, style);
    return false;
  }
  return true;
}

void Server::Count(const std::string& route) {
  std::lock_guard<std::mutex> lock(stats_mutex_);
  ++http_requests_[route];
}

void Server::Remember(RecentRequest r) {
  std::lock_guard<std::mutex> lock(stats_mutex_);
  r.finished_at = static_cast<double>(std::time(nullptr));
  recent_.push_back(std::move(r));
  while (recent_.size() > 32) recent_.pop_front();
}

namespace {

// Whether a slot's cells (a cache scope: key digest, then "|salt:..." when salted) belong to
// the API key of key_scope.
bool SameKey(const std::string& slot_scope, const std::string& key_scope) {
  return slot_scope.substr(0, slot_scope.find('|')) == key_scope;
}

// A slot of another tenant as that tenant's neighbours see it: its id and size only.
serve::SlotInfo HiddenSlot(const serve::SlotInfo& s) {
  serve::SlotInfo out;
  out.id = s.id;
  out.n_ctx = s.n_ctx;
  return out;
}

// Slot file names: 1..128 characters of [A-Za-z0-9._-], not starting with a dot (so no "..",
// no hidden or temporary file, no separator, NUL or control character).
bool SlotFileNameValid(const std::string& name) {
  if (name.empty() || name.size() > 128 || name.front() == '.') return false;
  if (name.find(".tmp.") != std::string::npos) return false;  // the writer's temporary names
  for (unsigned char ch : name) {
    if (!std::isalnum(ch) && ch != '.' && ch != '_' && ch != '-') return false;
  }
  return true;
}

// Removes the temporary files a killed server left in the slot folder (and its key folders):
// NAME.tmp.PID of a process that no longer runs.
void SweepStaleSlotFiles(const std::string& folder) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (folder.empty() || !fs::is_directory(folder, ec)) return;
  size_t removed = 0;
  auto sweep = [&removed](const fs::path& dir) {
    std::error_code e;
    for (const fs::directory_entry& f : fs::directory_iterator(dir, e)) {
      const std::string name = f.path().filename().string();
      const size_t at = name.rfind(".tmp.");
      if (at == std::string::npos || !f.is_regular_file(e)) continue;
      const std::string pid = name.substr(at + 5);
      if (pid.empty() || pid.find_first_not_of("0123456789") != std::string::npos) continue;
      if (pid != std::to_string(::getpid()) && fs::exists("/proc/" + pid, e)) continue;
      if (fs::remove(f.path(), e)) ++removed;
    }
  };
  sweep(folder);
  for (const fs::directory_entry& d : fs::directory_iterator(folder, ec)) {
    std::error_code e;
    if (d.is_directory(e) && d.path().filename().string().rfind("key-", 0) == 0) sweep(d.path());
  }
  if (removed > 0) {
    std::fprintf(stderr, "lamina: removed %zu stale temporary slot file(s) from %s\n", removed,
                 folder.c_str());
  }
}

// [{"bias", "token"}, ...] as llama-server lists it (bias null for a token that is never
// sampled). With ignore_eos, the end-of-generation tokens follow with null, as llama-server
// turns ignore_eos into those biases.
json LogitBiasJson(const GenerateParams& p, const Tokenizer& tokenizer) {
  json out = json::array();
  auto add = [&out](int32_t id, float bias) {
    out.push_back(
        {{"bias", std::isinf(bias) && bias < 0 ? json(nullptr) : json(bias)}, {"token", id}});
  };
  for (const auto& [id, bias] : p.logit_bias) add(id, bias);
  if (p.ignore_eos) {
    for (int32_t id = 0; id < tokenizer.vocab_size(); ++id) {
      if (tokenizer.IsEog(id)) add(id, -INFINITY);
    }
  }
  return out;
}

// The prompt's text as llama-server shows it: every token's piece, special tokens included
// ("<s> I believe..."), the tokenizer's space prefix removed from the first piece.
std::string PromptText(const Tokenizer& tokenizer, const std::vector<int32_t>& tokens) {
  std::string out;
  for (size_t i = 0; i < tokens.size(); ++i) {
    std::string piece = tokenizer.TokenToPiece(tokens[i], true);
    // Decode drops exactly that prefix from a first token's plain piece.
    if (i == 0 && !piece.empty() && piece[0] == ' ' &&
        tokenizer.Decode({tokens[0]}) != tokenizer.TokenToPiece(tokens[0], false)) {
      piece.erase(0, 1);
    }
    out += piece;
  }
  return out;
}

// llama-server's response_fields: the value at each "a/b" path, under the key "a/b".
json PickFields(const json& answer, const std::vector<std::string>& paths) {
  json out = json::object();
  for (const std::string& path : paths) {
    const json* at = &answer;
    size_t start = 0;
    bool found = true;
    while (found) {
      const size_t slash = path.find('/', start);
      const std::string key =
          path.substr(start, slash == std::string::npos ? std::string::npos : slash - start);
      auto it = at->is_object() ? at->find(key) : at->end();
      if (!at->is_object() || it == at->end()) {
        found = false;
        break;
      }
      at = &*it;
      if (slash == std::string::npos) break;
      start = slash + 1;
    }
    if (found) out[path] = *at;
  }
  return out;
}

}  // namespace

json Server::ParamsJson(const GenerateParams& p) const {
  json out = {{"n_predict", p.n_predict},
              {"seed", p.sampler.seed},
              {"temperature", p.sampler.temperature},
              {"top_k", p.sampler.top_k},
              {"top_p", p.sampler.top_p},
              {"min_p", p.sampler.min_p},
              {"repeat_penalty", p.sampler.repeat_penalty},
              {"repeat_last_n", p.sampler.repeat_last_n},
              {"stop", p.stop},
              {"ignore_eos", p.ignore_eos},
              {"logit_bias", LogitBiasJson(p, model_->tokenizer())}};
  const SamplerConfig& c = p.sampler;
  json stages = json::array();
  for (SamplerStage st : c.samplers.empty() ? DefaultSamplerStages() : c.samplers) {
    stages.push_back(SamplerStageName(st));
  }
  out.update({{"typical_p", c.typical_p},
              {"presence_penalty", c.presence_penalty},
              {"frequency_penalty", c.frequency_penalty},
              {"xtc_probability", c.xtc_probability},
              {"xtc_threshold", c.xtc_threshold},
              {"mirostat", c.mirostat},
              {"mirostat_tau", c.mirostat_tau},
              {"mirostat_eta", c.mirostat_eta},
              {"dry_multiplier", c.dry_multiplier},
              {"dry_base", c.dry_base},
              {"dry_allowed_length", c.dry_allowed_length},
              {"dry_penalty_last_n", c.dry_penalty_last_n},
              {"dry_sequence_breakers", c.dry_sequence_breakers},
              // llama-server's adaptive-p sampler, which lamina has not: always off.
              {"adaptive_target", -1.0},
              {"adaptive_decay", 0.9},
              {"samplers", stages}});
  return out;
}

// Collected log-probabilities of one answer.
struct Probs {
  std::vector<serve::TokenLogprob> own;
  std::vector<std::vector<serve::TokenLogprob>> top;
  void Add(const serve::Event& e) {
    own.insert(own.end(), e.logprobs.begin(), e.logprobs.end());
    top.insert(top.end(), e.top_logprobs.begin(), e.top_logprobs.end());
  }
};

// OpenAI chat `logprobs.content` entries (also llama-server's `completion_probabilities`).
// post: llama-server's post_sampling_probs shape ("prob", "top_probs").
json ProbEntries(const Tokenizer& tok, const Probs& p, int n_top, bool post = false) {
  auto one = [&](const serve::TokenLogprob& t) {
    const std::string piece = tok.TokenToPiece(t.id, false);
    json bytes = json::array();
    for (unsigned char ch : piece) bytes.push_back(static_cast<int>(ch));
    return json{
        {"id", t.id}, {"token", piece}, {post ? "prob" : "logprob", t.logprob}, {"bytes", bytes}};
  };
  json out = json::array();
  for (size_t i = 0; i < p.own.size(); ++i) {
    json e = one(p.own[i]);
    json top = json::array();
    for (int k = 0; k < n_top && k < static_cast<int>(p.top[i].size()); ++k)
      top.push_back(one(p.top[i][k]));
    e[post ? "top_probs" : "top_logprobs"] = top;
    out.push_back(e);
  }
  return out;
}

// The legacy completions `logprobs` object.
json LegacyLogprobs(const Tokenizer& tok, const Probs& p) {
  json tokens = json::array(), lps = json::array(), tops = json::array(), offsets = json::array();
  size_t offset = 0;
  for (size_t i = 0; i < p.own.size(); ++i) {
    const std::string piece = tok.TokenToPiece(p.own[i].id, false);
    tokens.push_back(piece);
    lps.push_back(p.own[i].logprob);
    json top = json::object();
    for (const serve::TokenLogprob& t : p.top[i]) top[tok.TokenToPiece(t.id, false)] = t.logprob;
    tops.push_back(top);
    offsets.push_back(offset);
    offset += piece.size();
  }
  return {{"tokens", tokens},
          {"token_logprobs", lps},
          {"top_logprobs", tops},
          {"text_offset", offsets}};
}

// Each answer's events, gathered until its kDone or kError.
struct Collector {
  struct Answer {
    std::string text;
    std::vector<int32_t> tokens;
    Probs probs;
    serve::Event last;
    bool done = false;
  };
  explicit Collector(Channels c) : channels(std::move(c)), answers(channels.size()) {}
  // Pops events until every answer is done (true) or `until` passes (false).
  bool Collect(std::chrono::steady_clock::time_point until) {
    for (size_t i = 0; i < channels.size(); ++i) {
      Answer& k = answers[i];
      while (!k.done) {
        const auto now = std::chrono::steady_clock::now();
        if (now >= until) return false;
        serve::Event e;
        const auto wait = std::min<std::chrono::steady_clock::duration>(
            std::chrono::milliseconds(100), until - now);
        if (!channels[i]->Pop(&e, std::chrono::duration_cast<std::chrono::milliseconds>(wait) +
                                      std::chrono::milliseconds(1))) {
          continue;
        }
        if (e.kind == serve::Event::Kind::kProgress) continue;
        if (e.kind == serve::Event::Kind::kText) {
          k.text += e.text;
          k.tokens.insert(k.tokens.end(), e.tokens.begin(), e.tokens.end());
          k.probs.Add(e);
          continue;
        }
        k.last = std::move(e);
        k.done = true;
      }
    }
    return true;
  }
  Channels channels;
  std::vector<Answer> answers;
};

json Server::Usage(const api::Completion& c, const std::vector<serve::Timings>& t) const {
  // Each prompt once (its first choice's), every completion token.
  int prompt = 0, cached = 0, completion = 0;
  for (size_t i = 0; i < c.requests.size() && i < t.size(); ++i) {
    if (i % c.n_choices == 0) {
      prompt += static_cast<int>(c.requests[i].prompt.size());
      cached += t[i].cache_n;
    }
    completion += t[i].predicted_n;
  }
  return {{"prompt_tokens", prompt},
          {"completion_tokens", completion},
          {"total_tokens", prompt + completion},
          {"prompt_tokens_details", {{"cached_tokens", cached}}}};
}

json Server::NativeFinal(const api::Completion& c, size_t index, const serve::Request& r,
                         const std::string& text, const std::vector<int32_t>& tokens,
                         const serve::Event& done) const {
  json settings = ParamsJson(r.params);
  settings["n_ctx"] = done.n_ctx;
  settings["n_keep"] = r.n_keep;
  settings["cache_prompt"] = r.cache_prompt;
  settings["model"] = model_id_;
  return {{"index", index},
          {"content", text},
          {"tokens", c.return_tokens ? json(tokens) : json::array()},
          {"id_slot", done.slot},
          {"stop", true},
          {"model", model_id_},
          {"tokens_predicted", done.timings.predicted_n},
          {"tokens_evaluated", static_cast<int>(r.prompt.size())},
          {"tokens_cached", static_cast<int>(r.prompt.size()) + done.timings.predicted_n},
          {"generation_settings", settings},
          {"prompt", PromptText(model_->tokenizer(), r.prompt)},
          {"has_new_line", text.find('\n') != std::string::npos},
          {"truncated", done.truncated},
          {"stop_type", api::StopType(done.reason)},
          {"stopping_word", done.stop_word},
          {"timings", api::TimingsJson(done.timings)}};
}

bool Server::Admit(const http::Request& req, const json& body, api::Completion* c,
                   Channels* channels, ApiError* err) {
  // The prefix cache's tenant: the API key, narrowed by the request's cache_salt (vLLM's field).
  std::string scope = KeyScope(req);
  if (auto salt = body.find("cache_salt"); salt != body.end() && !salt->is_null()) {
    if (!salt->is_string() || salt->get_ref<const std::string&>().size() > kMaxCacheSalt) {
      *err = {
          400, "invalid_request_error",
          "\"cache_salt\" must be a string of at most " + std::to_string(kMaxCacheSalt) + " bytes"};
      return false;
    }
    scope += "|salt:" + salt->get<std::string>();
  }
  for (serve::Request& r : c->requests) r.cache_scope = scope;
  // Prompts over a slot's context are refused here, before any stream starts.
  for (const serve::Request& r : c->requests) {
    const int n = static_cast<int>(r.prompt.size());
    if (n > scheduler_->n_ctx_slot()) {
      *err = {400,
              "exceed_context_size_error",
              "the request exceeds the available context size, try increasing it: the prompt "
              "has " +
                  std::to_string(n) + " tokens and a slot's context is " +
                  std::to_string(scheduler_->n_ctx_slot()),
              {{"n_prompt_tokens", n}, {"n_ctx", scheduler_->n_ctx_slot()}}};
      return false;
    }
    if (n == 0) {
      *err = {400, "invalid_request_error", "the prompt is empty"};
      return false;
    }
  }
  // The choices of one prompt share it: the first evaluates it, the others copy its cells.
  if (c->n_choices > 1) {
    const uint64_t group = next_group_.fetch_add(c->requests.size() / c->n_choices);
    for (size_t i = 0; i < c->requests.size(); ++i) {
      if (c->requests[i].cache_prompt) c->requests[i].prefix_group = group + i / c->n_choices;
    }
  }
  for (const serve::Request& r : c->requests) channels->push_back(scheduler_->Submit(r));
  return true;
}

std::function<void(int, const serve::Event&)> Server::Rememberer(const http::Request& req,
                                                                 std::string route_name) {
  return [this, route_name, key_scope = KeyScope(req)](int status, const serve::Event& done) {
    RecentRequest rr;
    rr.key_scope = key_scope;
    rr.route = route_name;
    rr.status = status;
    rr.slot = done.slot;
    rr.prompt_n = done.timings.prompt_n;
    rr.cache_n = done.timings.cache_n;
    rr.predicted_n = done.timings.predicted_n;
    rr.predicted_per_second = done.timings.predicted_ms > 0
                                  ? 1e3 * done.timings.predicted_n / done.timings.predicted_ms
                                  : 0;
    rr.stop_type = status == 200 ? api::StopType(done.reason) : "error";
    Remember(std::move(rr));
  };
}

void SendCollected(http::Response& res, std::shared_ptr<Collector> col,
                   std::function<std::pair<int, json>()> answer, std::function<void()> cancel_all) {
  if (col->Collect(std::chrono::steady_clock::now() + std::chrono::milliseconds(500))) {
    auto [status, out] = answer();
    res.status = status;
    res.set_content(Dump(out), "application/json; charset=utf-8");
    return;
  }
  // A longer answer: the connection is probed with JSON whitespace (a leading blank is valid
  // JSON) every 250 ms, so a client that goes away cancels its request within a step or two.
  res.set_chunked_content_provider(
      "application/json; charset=utf-8",
      [col, answer, cancel_all](size_t, http::DataSink& sink) {
        if (!col->Collect(std::chrono::steady_clock::now() + std::chrono::milliseconds(250))) {
          if (!sink.write(" ", 1)) {
            cancel_all();
            return false;
          }
          return true;
        }
        const std::string body = Dump(answer().second);
        sink.write(body.data(), body.size());
        sink.done();
        return true;
      },
      [cancel_all](bool) { cancel_all(); });
}

// A streamed completion of the llama-server and OpenAI routes: server-sent events as the engine
// releases text; the choices' events interleave, each chunk carrying its choice's index.
class OaiStream {
 public:
  using Route = Server::Route;
  OaiStream(const Server* server, std::shared_ptr<api::Completion> c, Channels channels,
            Route route, std::string id, long long created,
            std::function<void(int, const serve::Event&)> remember)
      : s_(server),
        c_(std::move(c)),
        channels_(std::move(channels)),
        route_(route),
        id_(std::move(id)),
        created_(created),
        remember_(std::move(remember)) {
    const size_t n = channels_.size();
    done_.assign(n, false);
    text_.resize(n);
    tokens_.resize(n);
    pending_.resize(n);
    sent_.assign(n, 0);
    content_.resize(n);
    for (size_t k = 0; k < n; ++k) {
      splitters_.emplace_back(
          chat::AnswerFormat{c_->harmony, c_->reasoning_format, c_->thinking_at_start});
    }
    harmony_calls_.resize(n);
    timings_.resize(n);
  }

  // One call of the chunked content provider.
  bool Step(http::DataSink& sink) {
    sink_ = &sink;
    if (route_ == Route::kOaiChat && !started_) {
      started_ = true;
      for (size_t i = 0; i < channels_.size(); ++i) {
        if (!Write(Sse(Chunk(i, {{"role", "assistant"}, {"content", nullptr}}, nullptr))))
          return false;
      }
    }
    if (finished_ || n_done_ >= channels_.size()) {
      if (route_ != Route::kCompletion) Write("data: [DONE]\n\n");
      sink.done();
      return true;
    }
    // The next event of any unfinished choice, polled round robin; else a short wait on one.
    serve::Event e;
    size_t i = channels_.size();
    for (size_t k = 0; k < channels_.size() && i == channels_.size(); ++k) {
      const size_t j = (next_ + k) % channels_.size();
      if (!done_[j] && channels_[j]->Pop(&e, std::chrono::milliseconds(0))) i = j;
    }
    if (i == channels_.size()) {
      const auto wait = std::chrono::milliseconds(channels_.size() == 1 ? 100 : 10);
      for (size_t k = 0; k < channels_.size(); ++k) {
        const size_t j = (next_ + k) % channels_.size();
        if (done_[j]) continue;
        if (channels_[j]->Pop(&e, wait)) i = j;
        break;
      }
      if (i == channels_.size()) return true;
    }
    next_ = i + 1;
    if (e.kind == serve::Event::Kind::kProgress) return Progress(i, e);
    if (e.kind == serve::Event::Kind::kText) return Text(i, e);
    if (e.kind == serve::Event::Kind::kError) return Error(e);
    return Final(i, e);
  }

 private:
  void CancelAll() const {
    for (auto& ch : channels_) ch->Cancel();
  }
  bool Write(const std::string& s) {
    if (!sink_->write(s.data(), s.size())) {
      CancelAll();
      return false;
    }
    return true;
  }
  json Chunk(size_t index, json delta, json finish) const {
    return json{{"id", id_},
                {"object", "chat.completion.chunk"},
                {"created", created_},
                {"model", s_->model_id_},
                {"system_fingerprint", BuildFingerprint()},
                {"choices", json::array({{{"index", index},
                                          {"delta", std::move(delta)},
                                          {"logprobs", nullptr},
                                          {"finish_reason", std::move(finish)}}})}};
  }
  json TextChunk(size_t index, const std::string& text, json logprobs, json finish) const {
    return json{{"id", id_},
                {"object", "text_completion"},
                {"created", created_},
                {"model", s_->model_id_},
                {"system_fingerprint", BuildFingerprint()},
                {"choices", json::array({{{"index", index},
                                          {"text", text},
                                          {"logprobs", std::move(logprobs)},
                                          {"finish_reason", std::move(finish)}}})}};
  }

  bool Progress(size_t i, const serve::Event& e) {
    const serve::Request& r = c_->requests[i];
    const json progress = {{"total", e.progress.total},
                           {"cache", e.progress.cache},
                           {"processed", e.progress.processed},
                           {"time_ms", static_cast<int64_t>(e.progress.time_ms)}};
    json j;
    if (route_ == Route::kCompletion) {
      j = {{"index", i},
           {"content", ""},
           {"tokens", json::array()},
           {"stop", false},
           {"id_slot", -1},
           {"tokens_predicted", 0},
           {"tokens_evaluated", r.prompt.size()}};
    } else if (route_ == Route::kOaiCompletion) {
      j = TextChunk(i, "", nullptr, nullptr);
    } else {
      j = Chunk(i, {{"role", "assistant"}, {"content", nullptr}}, nullptr);
    }
    j["prompt_progress"] = progress;
    return Write(Sse(j));
  }

  bool Text(size_t i, const serve::Event& e) {
    const api::Completion* c = c_.get();
    text_[i] += e.text;
    tokens_[i].insert(tokens_[i].end(), e.tokens.begin(), e.tokens.end());
    pending_[i].Add(e);
    std::string text = e.text;
    if (route_ == Route::kOaiChat && c->harmony) return HarmonyText(i, splitters_[i].Push(e.text));
    if (route_ == Route::kOaiChat) {
      if (c->reasoning_format != chat::ReasoningFormat::kNone) {
        // The thinking block goes out as reasoning_content deltas.
        chat::AnswerParts d = splitters_[i].Push(e.text);
        if (!d.reasoning.empty() &&
            !Write(Sse(Chunk(i, {{"reasoning_content", d.reasoning}}, nullptr)))) {
          return false;
        }
        text = std::move(d.content);
      }
      content_[i] += text;
    }
    if (route_ == Route::kOaiChat && c->parse_tool_calls) {
      // Text that may belong to a tool call is held back until the answer is complete.
      const size_t safe = chat::ToolCallSafePrefix(content_[i]);
      if (safe <= sent_[i]) return true;
      text = content_[i].substr(sent_[i], safe - sent_[i]);
      sent_[i] = safe;
    }
    if (text.empty() && !(route_ == Route::kCompletion && c->return_tokens)) return true;
    const Tokenizer& tok = s_->model_->tokenizer();
    json probs;  // this chunk's log-probabilities, in the route's shape
    const Probs& pending = pending_[i];
    if (c->logprobs) {
      probs = route_ == Route::kCompletion
                  ? ProbEntries(tok, pending, c->top_logprobs, c->post_sampling_probs)
              : route_ == Route::kOaiCompletion
                  ? LegacyLogprobs(tok, pending)
                  : json{{"content", ProbEntries(tok, pending, c->top_logprobs)}};
    }
    pending_[i] = Probs();
    json j;
    if (route_ == Route::kCompletion) {
      j = {{"index", i},
           {"content", e.text},
           {"tokens", e.tokens},  // llama-server: a chunk's tokens, whatever return_tokens
           {"stop", false},
           {"id_slot", -1},
           {"tokens_predicted", tokens_[i].size()},
           {"tokens_evaluated", c->requests[i].prompt.size()}};
      if (c->logprobs) j["completion_probabilities"] = probs;
    } else if (route_ == Route::kOaiCompletion) {
      j = TextChunk(i, e.text, c->logprobs ? probs : json(nullptr), nullptr);
    } else {
      j = Chunk(i, {{"content", text}}, nullptr);
      if (c->logprobs) j["choices"][0]["logprobs"] = probs;
    }
    if (c->timings_per_token) j["timings"] = api::TimingsJson(e.timings);
    return Write(Sse(j));
  }

  // A harmony answer's new parts: reasoning and content as chunks now (with the log-probabilities
  // so far), calls kept for the end.
  bool HarmonyText(size_t i, chat::AnswerParts d) {
    for (chat::ToolCall& call : d.calls) harmony_calls_[i].push_back(std::move(call));
    if (!d.reasoning.empty() &&
        !Write(Sse(Chunk(i, {{"reasoning_content", d.reasoning}}, nullptr)))) {
      return false;
    }
    if (d.content.empty()) return true;
    json j = Chunk(i, {{"content", d.content}}, nullptr);
    if (c_->logprobs) {
      j["choices"][0]["logprobs"] = {
          {"content", ProbEntries(s_->model_->tokenizer(), pending_[i], c_->top_logprobs)}};
      pending_[i] = Probs();
    }
    return Write(Sse(j));
  }

  bool Error(const serve::Event& e) {
    const ApiError err = api::EventError(e);
    remember_(err.status, e);
    CancelAll();
    json j = api::ErrorBody(err);
    Write(route_ == Route::kCompletion ? "error: " + Dump(j) + "\n\n" : Sse(j));
    finished_ = true;
    if (route_ != Route::kCompletion) Write("data: [DONE]\n\n");
    sink_->done();
    return true;
  }

  // A chat choice's held-back text at its end: tool calls, or content after all.
  bool ChatToolTail(size_t i, const char** finish) {
    const std::string& all = content_[i];
    chat::ToolCallParse parsed = chat::ParseToolCalls(all, c_->tool_names);
    const size_t sent = sent_[i];
    std::string rest;
    if (parsed.calls.empty()) {
      rest = all.substr(std::min(sent, all.size()));
    } else if (parsed.content.compare(0, sent, all, 0, sent) == 0) {
      rest = parsed.content.substr(std::min(sent, parsed.content.size()));
      if (rest.find_first_not_of(" \t\r\n") == std::string::npos) rest.clear();
    }
    bool ok = true;
    if (!rest.empty() || !pending_[i].own.empty()) {
      json j = Chunk(i, {{"content", rest}}, nullptr);
      if (c_->logprobs) {
        j["choices"][0]["logprobs"] = {
            {"content", ProbEntries(s_->model_->tokenizer(), pending_[i], c_->top_logprobs)}};
      }
      pending_[i] = Probs();
      ok = Write(Sse(j));
    }
    if (ok && !parsed.calls.empty()) {
      json calls = ToolCallsJson(parsed.calls, true);
      for (json& call : calls) {
        ok = ok && Write(Sse(Chunk(i, {{"tool_calls", json::array({call})}}, nullptr)));
      }
      *finish = "tool_calls";
    }
    return ok;
  }

  bool Final(size_t i, const serve::Event& e) {
    const api::Completion* c = c_.get();
    remember_(200, e);
    done_[i] = true;
    timings_[i] = e.timings;
    const bool last = ++n_done_ == channels_.size();
    bool ok = true;
    if (route_ == Route::kCompletion) {
      json j = s_->NativeFinal(*c, i, c->requests[i], text_[i], tokens_[i], e);
      j["content"] = "";
      if (!c->return_tokens) j["tokens"] = json::array();
      ok = Write(Sse(j));
    } else if (route_ == Route::kOaiCompletion) {
      json j = TextChunk(i, "", nullptr, api::FinishReason(e.reason));
      if (last && c->include_usage) j["usage"] = s_->Usage(*c, timings_);
      j["timings"] = api::TimingsJson(e.timings);
      ok = Write(Sse(j));
    } else {
      const char* finish = api::FinishReason(e.reason);
      if (c->harmony) {
        ok = HarmonyText(i, splitters_[i].Flush());
        if (ok && !harmony_calls_[i].empty()) {
          for (json& call : ToolCallsJson(harmony_calls_[i], true)) {
            ok = ok && Write(Sse(Chunk(i, {{"tool_calls", json::array({call})}}, nullptr)));
          }
          finish = "tool_calls";
        }
      } else if (c->reasoning_format != chat::ReasoningFormat::kNone) {
        chat::AnswerParts d = splitters_[i].Flush();
        if (!d.reasoning.empty()) {
          ok = Write(Sse(Chunk(i, {{"reasoning_content", d.reasoning}}, nullptr)));
        }
        content_[i] += d.content;
        if (ok && !c->parse_tool_calls && !d.content.empty()) {
          ok = Write(Sse(Chunk(i, {{"content", d.content}}, nullptr)));
        }
      }
      if (ok && c->parse_tool_calls && !c->harmony) ok = ChatToolTail(i, &finish);
      json j = Chunk(i, json::object(), finish);
      j["timings"] = api::TimingsJson(e.timings);
      ok = ok && Write(Sse(j));
      if (ok && last && c->include_usage) {
        json u = {{"id", id_},
                  {"object", "chat.completion.chunk"},
                  {"created", created_},
                  {"model", s_->model_id_},
                  {"system_fingerprint", BuildFingerprint()},
                  {"choices", json::array()},
                  {"usage", s_->Usage(*c, timings_)},
                  {"timings", api::TimingsJson(e.timings)}};
        ok = Write(Sse(u));
      }
    }
    text_[i].clear();
    tokens_[i].clear();
    return ok;
  }

  const Server* s_;
  std::shared_ptr<api::Completion> c_;
  Channels channels_;
  Route route_;
  std::string id_;
  long long created_;
  std::function<void(int, const serve::Event&)> remember_;
  http::DataSink* sink_ = nullptr;
  bool started_ = false;
  size_t next_ = 0;  // the channel polled first (round robin)
  size_t n_done_ = 0;
  std::vector<bool> done_;
  std::vector<std::string> text_;
  std::vector<std::vector<int32_t>> tokens_;
  std::vector<Probs> pending_;  // log-probabilities not sent yet (their text may be held back)
  std::vector<size_t> sent_;    // chat with tools: bytes of text sent as content so far
  std::vector<std::string> content_;  // chat: the answer's content so far (no thinking block)
  std::vector<chat::AnswerSplitter> splitters_;  // chat: reasoning apart (thinking or harmony)
  std::vector<std::vector<chat::ToolCall>> harmony_calls_;  // harmony's calls, sent at the end
  std::vector<serve::Timings> timings_;
  bool finished_ = false;
};

// The whole answer of a non-streamed completion route: (HTTP status, body).
std::pair<int, json> Server::OaiWhole(const api::Completion& c, const Collector& col, Route route,
                                      const std::string& id, long long created,
                                      const std::vector<serve::Timings>& timings) const {
  const Tokenizer& tok = model_->tokenizer();
  if (route == Route::kCompletion) {
    json answers = json::array();
    for (size_t i = 0; i < col.answers.size(); ++i) {
      const Collector::Answer& k = col.answers[i];
      json a = NativeFinal(c, i, c.requests[i], k.text, k.tokens, k.last);
      if (c.logprobs) {
        a["completion_probabilities"] =
            ProbEntries(tok, k.probs, c.top_logprobs, c.post_sampling_probs);
      }
      if (!c.response_fields.empty()) a = PickFields(a, c.response_fields);
      answers.push_back(std::move(a));
    }
    return {200, answers.size() == 1 ? answers[0] : answers};
  }
  json choices = json::array();
  for (size_t i = 0; i < col.answers.size(); ++i) {
    const Collector::Answer& k = col.answers[i];
    if (route == Route::kOaiCompletion) {
      choices.push_back({{"index", i},
                         {"text", k.text},
                         {"logprobs", c.logprobs ? LegacyLogprobs(tok, k.probs) : json(nullptr)},
                         {"finish_reason", api::FinishReason(k.last.reason)}});
    } else {
      // Reasoning (thinking block or harmony's analysis), content and harmony's calls.
      chat::AnswerParts parts = chat::SplitAnswer(
          chat::AnswerFormat{c.harmony, c.reasoning_format, c.thinking_at_start}, k.text);
      std::string content = std::move(parts.content), reasoning = std::move(parts.reasoning);
      std::vector<chat::ToolCall> harmony_calls = std::move(parts.calls);
      json message = {{"role", "assistant"}, {"content", content}};
      if (!reasoning.empty()) message["reasoning_content"] = reasoning;
      const char* finish = api::FinishReason(k.last.reason);
      if (!harmony_calls.empty()) {
        message["content"] = ContentBeside(content);
        message["tool_calls"] = ToolCallsJson(harmony_calls, false);
        finish = "tool_calls";
      } else if (c.parse_tool_calls && !c.harmony) {
        chat::ToolCallParse parsed = chat::ParseToolCalls(content, c.tool_names);
        if (!parsed.calls.empty()) {
          message["content"] = ContentBeside(parsed.content);
          message["tool_calls"] = ToolCallsJson(parsed.calls, false);
          finish = "tool_calls";
        }
      }
      choices.push_back(
          {{"index", i},
           {"message", std::move(message)},
           {"logprobs", c.logprobs ? json{{"content", ProbEntries(tok, k.probs, c.top_logprobs)}}
                                   : json(nullptr)},
           {"finish_reason", finish}});
    }
  }
  json whole = {{"id", id},
                {"object", route == Route::kOaiCompletion ? "text_completion" : "chat.completion"},
                {"created", created},
                {"model", model_id_},
                {"system_fingerprint", BuildFingerprint()},
                {"choices", std::move(choices)},
                {"usage", Usage(c, timings)},
                {"timings", api::TimingsJson(timings[0])}};
  if (c.verbose && !col.answers.empty()) {
    const Collector::Answer& k = col.answers[0];
    whole["__verbose"] = NativeFinal(c, 0, c.requests[0], k.text, k.tokens, k.last);
  }
  return {200, std::move(whole)};
}

void Server::HandleCompletion(const http::Request& req, http::Response& res, Route route) {
  if (!Ready(res)) return;
  json body;
  if (!ParseBody(req, res, &body)) return;
  auto c = std::make_shared<api::Completion>();
  ApiError err;
  const bool ok = route == Route::kOaiChat
                      ? api::ParseChat(body, *model_, chat_, defaults_, c.get(), &err)
                      : api::ParseCompletion(body, *model_, defaults_,
                                             route == Route::kOaiCompletion, c.get(), &err);
  if (!ok) return SendError(res, err);
  Channels channels;
  if (!Admit(req, body, c.get(), &channels, &err)) return SendError(res, err);
  const std::string route_name = route == Route::kOaiChat         ? "/v1/chat/completions"
                                 : route == Route::kOaiCompletion ? "/v1/completions"
                                                                  : "/completion";
  const std::string id = RandomId(route == Route::kOaiChat ? "chatcmpl-" : "cmpl-");
  const long long created = static_cast<long long>(std::time(nullptr));
  auto remember = Rememberer(req, route_name);
  auto cancel_all = [channels] {
    for (auto& ch : channels) ch->Cancel();
  };
  if (!c->stream) {
    auto col = std::make_shared<Collector>(channels);
    // The whole answer once everything is collected: (HTTP status, body).
    auto answer = [this, c, col, route, id, created, remember,
                   cancel_all]() -> std::pair<int, json> {
      std::vector<serve::Timings> timings;
      for (const Collector::Answer& k : col->answers) {
        if (k.last.kind == serve::Event::Kind::kError) {
          cancel_all();
          const ApiError err = api::EventError(k.last);
          remember(err.status, k.last);
          return {err.status, api::ErrorBody(err)};
        }
        remember(200, k.last);
        timings.push_back(k.last.timings);
      }
      return OaiWhole(*c, *col, route, id, created, timings);
    };
    SendCollected(res, col, answer, cancel_all);
    return;
  }

  // Streaming: server-sent events as the engine releases text; the choices' events interleave,
  // each chunk carrying its choice's index.
  auto stream = std::make_shared<OaiStream>(this, c, channels, route, id, created, remember);
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream", [stream](size_t, http::DataSink& sink) { return stream->Step(sink); },
      [cancel_all](bool) { cancel_all(); });
}

void Server::HandleTokenize(const http::Request& req, http::Response& res) {
  if (!Ready(res)) return;
  json body;
  if (!ParseBody(req, res, &body)) return;
  std::string answer;
  ApiError err;
  if (!api::TokenizeAnswer(body, *model_, &answer, &err)) return SendError(res, err);
  res.set_content(std::move(answer), "application/json; charset=utf-8");
}

void Server::HandleDetokenize(const http::Request& req, http::Response& res) {
  if (!Ready(res)) return;
  json body;
  if (!ParseBody(req, res, &body)) return;
  std::string answer;
  ApiError err;
  if (!api::DetokenizeAnswer(body, *model_, &answer, &err)) return SendError(res, err);
  res.set_content(std::move(answer), "application/json; charset=utf-8");
}

void Server::HandleProps(http::Response& res) {
  if (!Ready(res)) return;
  json params = ParamsJson(defaults_.params);
  params["seed"] = defaults_.seed < 0 ? 0xFFFFFFFFLL : defaults_.seed;
  const KvCache& kv = scheduler_->cache();
  res.set_content(Dump({{"default_generation_settings",
                         {{"id", 0},
                          {"id_task", -1},
                          {"n_ctx", scheduler_->n_ctx_slot()},
                          {"speculative", speculative_},
                          {"is_processing", false},
                          {"params", params}}},
                        {"total_slots", scheduler_->n_slots()},
                        {"model_path", o_.model_path},
                        {"model_alias", model_id_},
                        {"chat_template", chat_template_text_},
                        {"modalities", {{"vision", false}, {"audio", false}}},
                        {"build_info", BuildFingerprint()},
                        {"kv_cache",
                         {{"type", kv_name_},
                          {"bits_per_element", kv.BitsPerElement()},
                          {"bytes_per_token", kv.BytesPerToken()},
                          {"bytes_total", kv.BytesTotal()}}}}),
                  "application/json; charset=utf-8");
}

void Server::HandleSlots(const http::Request& req, http::Response& res) {
  if (!Ready(res)) return;
  if (!o_.slots) {
    return SendError(res,
                     {501, "not_supported_error", "This server does not support slots endpoint."});
  }
  json out = json::array();
  const json params = ParamsJson(defaults_.params);
  const std::string key_scope = KeyScope(req);
  for (serve::SlotInfo s : scheduler_->Slots()) {
    if (!SameKey(s.scope, key_scope)) s = HiddenSlot(s);
    json slot = {{"id", s.id},
                 {"id_task", s.busy ? static_cast<long long>(s.request) : -1},
                 {"n_ctx", s.n_ctx},
                 {"speculative", speculative_},
                 {"is_processing", s.busy},
                 {"n_past", s.n_past},
                 {"n_prompt_tokens", s.n_prompt},
                 {"n_decoded", s.n_decoded}};
    // As llama-server: "params" only once the slot has run a request.
    if (s.request != 0) slot["params"] = params;
    out.push_back(std::move(slot));
  }
  res.set_content(Dump(out), "application/json; charset=utf-8");
}

// Slot actions do not depend on --slots (which governs GET /slots only), as in llama-server.
void Server::HandleSlotAction(const http::Request& req, http::Response& res) {
  if (!Ready(res)) return;
  int id = -1;
  try {
    id = std::stoi(req.matches.at(1));
  } catch (...) {
    return SendError(res, {400, "invalid_request_error", "invalid slot id"});
  }
  const std::string action = req.get_param_value("action");
  if (action == "erase") {
    Result<int> n = scheduler_->EraseSlot(id, KeyScope(req));
    if (!n.ok()) return SendError(res, {400, "invalid_request_error", n.error().message});
    res.set_content(Dump({{"id_slot", id}, {"n_erased", *n}}), "application/json; charset=utf-8");
    return;
  }
  if (action != "save" && action != "restore") {
    return SendError(res, {400, "invalid_request_error", "action must be save, restore or erase"});
  }
  if (o_.slot_save_path.empty()) {
    return SendError(
        res, {501, "not_supported_error",
              "This server does not support slots action (start it with --slot-save-path)."});
  }
  json body;
  if (!ParseBody(req, res, &body)) return;
  auto fn = body.find("filename");
  if (fn == body.end() || !fn->is_string()) {
    return SendError(res, {400, "invalid_request_error", "\"filename\" must be a string"});
  }
  const std::string filename = fn->get<std::string>();
  if (!SlotFileNameValid(filename)) {
    return SendError(res, {400, "invalid_request_error",
                           "Invalid filename: 1 to 128 of A-Z a-z 0-9 . _ -, not starting with a "
                           "dot"});
  }
  // With API keys, each key has a folder of its own: a tenant cannot restore another's file.
  std::filesystem::path folder(o_.slot_save_path);
  const std::string key_scope = KeyScope(req);
  if (!key_scope.empty()) {
    folder /= "key-" + key_scope;
    std::error_code ec;
    std::filesystem::create_directories(folder, ec);
  }
  const std::string path = (folder / filename).string();
  const std::string scope = key_scope;  // restored cells belong to the key (no salt)
  const bool save = action == "save";
  Result<serve::SlotFileResult> r =
      save ? scheduler_->SaveSlot(id, path, scope) : scheduler_->RestoreSlot(id, path, scope);
  if (!r.ok()) {
    // The reason without the server's folder (which a client has no business knowing).
    std::string message = r.error().message;
    for (size_t at; (at = message.find(path)) != std::string::npos;) {
      message.replace(at, path.size(), filename);
    }
    const std::string dir = folder.string();
    for (size_t at; !dir.empty() && (at = message.find(dir)) != std::string::npos;) {
      message.replace(at, dir.size(), "<slot-save-path>");
    }
    return SendError(res, {400, "invalid_request_error", message});
  }
  res.set_content(Dump({{"id_slot", id},
                        {"filename", filename},
                        {save ? "n_saved" : "n_restored", r->n_tokens},
                        {save ? "n_written" : "n_read", r->n_bytes},
                        {"timings", {{save ? "save_ms" : "restore_ms", r->ms}}}}),
                  "application/json; charset=utf-8");
}

void Server::HandleModels(http::Response& res) {
  if (!Ready(res)) return;
  const Hparams& hp = model_->hparams();
  json meta = {{"vocab_type", 2},
               {"n_vocab", hp.n_vocab},
               {"n_ctx_train", hp.n_ctx_train},
               {"n_embd", hp.n_embd},
               {"n_params", model_->ParameterCount()},
               {"size", model_->file().total_size()}};
  json data = {{"id", model_id_},
               {"object", "model"},
               {"created", static_cast<long long>(started_at_)},
               {"owned_by", "lamina"},
               {"aliases", aliases_},
               {"tags", tags_},
               {"meta", meta}};
  json models = {{"name", model_id_},
                 {"model", model_id_},
                 {"modified_at", ""},
                 {"size", ""},
                 {"digest", ""},
                 {"type", "model"},
                 {"description", ""},
                 {"tags", tags_},
                 {"capabilities", json::array({"completion"})},
                 {"parameters", ""},
                 {"details", {{"format", "gguf"}, {"family", hp.arch}}}};
  res.set_content(
      Dump({{"object", "list"}, {"data", json::array({data})}, {"models", json::array({models})}}),
      "application/json; charset=utf-8");
}

void Server::HandleMetrics(http::Response& res) {
  if (!Ready(res)) return;
  const serve::Stats s = scheduler_->stats();
  std::string out;
  auto metric = [&](const char* name, const char* type, const char* help, double value) {
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n" +
           name + " " + std::to_string(value) + "\n";
  };
  metric("llamacpp:prompt_tokens_total", "counter", "Number of prompt tokens processed.",
         static_cast<double>(s.prompt_tokens));
  metric("llamacpp:prompt_seconds_total", "counter", "Prompt process time", s.prompt_seconds);
  metric("llamacpp:tokens_predicted_total", "counter", "Number of generation tokens processed.",
         static_cast<double>(s.predicted_tokens));
  metric("llamacpp:tokens_predicted_seconds_total", "counter", "Predict process time",
         s.decode_seconds);
  metric("llamacpp:n_decode_total", "counter", "Total number of forward passes.",
         static_cast<double>(s.steps));
  metric("llamacpp:prompt_tokens_seconds", "gauge", "Average prompt throughput in tokens/s.",
         s.prompt_seconds > 0 ? s.prompt_tokens / s.prompt_seconds : 0.0);
  metric("llamacpp:predicted_tokens_seconds", "gauge", "Average generation throughput in tokens/s.",
         s.decode_seconds > 0 ? s.predicted_tokens / s.decode_seconds : 0.0);
  metric("llamacpp:requests_processing", "gauge", "Number of requests processing.", s.busy_slots);
  metric("llamacpp:requests_deferred", "gauge", "Number of requests deferred.", s.queued);
  metric("lamina:requests_total", "counter", "Requests finished (done, cancelled or failed).",
         static_cast<double>(s.requests));
  metric("lamina:requests_cancelled_total", "counter", "Requests whose client went away.",
         static_cast<double>(s.requests_cancelled));
  metric("lamina:slots_total", "gauge", "Slots.", scheduler_->n_slots());
  metric("lamina:slots_busy", "gauge", "Slots running a request.", s.busy_slots);
  metric("lamina:kv_cache_bytes", "gauge", "KV cache storage of all slots.",
         static_cast<double>(s.kv_bytes));
  metric("lamina:kv_cache_used_bytes", "gauge", "KV cache bytes of the cells the slots hold.",
         static_cast<double>(s.kv_bytes_used));
  metric("lamina:draft_kv_cache_bytes", "gauge",
         "The drafters' own caches (draft model or MTP block) of all slots.",
         static_cast<double>(s.draft_kv_bytes));
  metric("lamina:draft_kv_cache_used_bytes", "gauge",
         "Bytes of the cells the drafters' own caches hold.",
         static_cast<double>(s.draft_kv_bytes_used));
  {
    std::lock_guard<std::mutex> lock(stats_mutex_);
    out +=
        "# HELP lamina:http_requests_total HTTP requests by route.\n# TYPE "
        "lamina:http_requests_total counter\n";
    for (const auto& [route, n] : http_requests_) {
      out += "lamina:http_requests_total{route=\"" + route + "\"} " + std::to_string(n) + "\n";
    }
  }
  res.set_content(out, "text/plain; version=0.0.4");
}

void Server::HandleMonitor(const http::Request& req, http::Response& res) {
  if (!Ready(res)) return;
  const serve::Stats s = scheduler_->stats();
  json slots = json::array();
  const std::string key_scope = KeyScope(req);
  for (serve::SlotInfo i : scheduler_->Slots()) {
    if (!SameKey(i.scope, key_scope)) i = HiddenSlot(i);
    slots.push_back({{"id", i.id},
                     {"busy", i.busy},
                     {"n_past", i.n_past},
                     {"n_ctx", i.n_ctx},
                     {"n_prompt", i.n_prompt},
                     {"n_decoded", i.n_decoded}});
  }
  json recent = json::array();
  {
    std::lock_guard<std::mutex> lock(stats_mutex_);
    for (auto it = recent_.rbegin(); it != recent_.rend(); ++it) {
      if (it->key_scope != key_scope) continue;
      recent.push_back({{"route", it->route},
                        {"status", it->status},
                        {"slot", it->slot},
                        {"prompt_n", it->prompt_n},
                        {"cache_n", it->cache_n},
                        {"predicted_n", it->predicted_n},
                        {"predicted_per_second", it->predicted_per_second},
                        {"stop_type", it->stop_type},
                        {"finished_at", it->finished_at}});
    }
  }
  const KvCache& kv = scheduler_->cache();
  res.set_content(
      Dump({{"model", model_id_},
            {"slots", slots},
            {"kv",
             {{"type", kv_name_},
              {"bits_per_element", kv.BitsPerElement()},
              {"bytes_total", s.kv_bytes},
              {"bytes_used", s.kv_bytes_used},
              {"draft_bytes_total", s.draft_kv_bytes},
              {"draft_bytes_used", s.draft_kv_bytes_used}}},
            {"tokens_predicted_total", s.predicted_tokens},
            {"prompt_tokens_total", s.prompt_tokens},
            {"predicted_per_second",
             s.decode_seconds > 0 ? s.predicted_tokens / s.decode_seconds : 0.0},
            {"prompt_per_second", s.prompt_seconds > 0 ? s.prompt_tokens / s.prompt_seconds : 0.0},
            {"queued", s.queued},
            {"recent", recent}}),
      "application/json; charset=utf-8");
}

// Whether a Host header names this server: any host when --host-allow has "*" (the default of
// a server bound to a non-loopback address), else one of the allowed names (with any port).
bool Server::HostAllowed(const std::string& host_header) const {
  if (host_header.empty()) return true;  // HTTP/1.0; a browser always sends Host
  if (std::find(allowed_hosts_.begin(), allowed_hosts_.end(), "*") != allowed_hosts_.end())
    return true;
  std::string host = host_header;
  if (!host.empty() && host.front() == '[') {
    host = host.substr(0, host.find(']') + 1);
  } else if (host.find(':') != std::string::npos) {
    host = host.substr(0, host.find(':'));
  }
  for (char& ch : host) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return std::find(allowed_hosts_.begin(), allowed_hosts_.end(), host) != allowed_hosts_.end();
}

namespace {

// Whether an Origin ("http://localhost:3000", "https://[::1]") names this machine.
bool LoopbackOrigin(const std::string& origin) {
  const size_t scheme_end = origin.find("://");
  if (scheme_end == std::string::npos) return false;
  const std::string scheme = origin.substr(0, scheme_end);
  if (scheme != "http" && scheme != "https") return false;
  std::string host = origin.substr(scheme_end + 3);
  if (!host.empty() && host.front() == '[') {
    const size_t close = host.find(']');
    if (close == std::string::npos) return false;
    host = host.substr(0, close + 1);
  } else {
    host = host.substr(0, host.find(':'));
  }
  return host == "localhost" || host == "127.0.0.1" || host == "[::1]";
}

}  // namespace

// CORS: an origin of --cors-origin is echoed (Vary: Origin); "localhost" stands for every
// origin on this machine; "*" allows every origin without credentials. Without --cors-origin,
// every origin is echoed when the server has API keys (a foreign page then still needs a key
// for anything beyond the public routes, as with llama-server's default) and none without
// keys. No other origin gets an Access-Control-Allow-Origin, so browsers keep foreign pages
// from reading answers.
bool Server::OriginAllowed(const std::string& origin) const {
  if (origin.empty()) return false;
  if (cors_echo_any_) return true;
  for (const std::string& o : cors_origins_) {
    if (o == "*" || o == origin || (o == "localhost" && LoopbackOrigin(origin))) return true;
  }
  return false;
}

void Server::AddCorsHeaders(const http::Request& req, http::Response& res) const {
  const std::string origin = req.get_header_value("Origin");
  if (!OriginAllowed(origin)) return;
  const bool any =
      std::find(cors_origins_.begin(), cors_origins_.end(), "*") != cors_origins_.end();
  res.set_header("Access-Control-Allow-Origin", any ? "*" : origin);
  if (!any) res.set_header("Vary", "Origin");
}

void Server::SetUpRoutes() {
  http::Limits limits;
  limits.max_body_bytes = o_.max_body_bytes;
  limits.n_workers = o_.n_threads_http > 0 ? static_cast<size_t>(o_.n_threads_http)
                                           : std::max<size_t>(72, 4 * o_.n_parallel);
  limits.max_connections = static_cast<size_t>(o_.max_connections);
  http_ = std::make_unique<http::Server>(limits);
  http_->SetDefaultHeaders({{"Server", "lamina"}});
  // Runs on every request head, before its body is read: a request from a foreign Host or
  // without a valid key costs only its head.
  http_->SetDecorator(
      [this](const http::Request& req, http::Response& res) { AddCorsHeaders(req, res); });
  if (o_.verbose) SetUpAccessLog();
  SetUpGuards();
  SetUpCompletionRoutes();
  SetUpUtilityRoutes();
  SetUpProtocolRoutes();
  if (o_.ui) SetUpWebRoutes();
}

// -v: one line per answer, errors with their message.
void Server::SetUpAccessLog() {
  http_->SetAccessLog([this](const http::Request& req, const http::Response& res, double ms) {
    std::string what;
    if (res.status >= 400) {
      json err;
      std::string ignored;
      if (ParseJsonBounded(res.body, 8, &err, &ignored) && err.contains("error") &&
          err["error"].is_object() && err["error"].contains("message") &&
          err["error"]["message"].is_string()) {
        what = " " + err["error"]["message"].get<std::string>().substr(0, 200);
      }
    }
    const int key = KeyIndex(req);
    std::fprintf(
        stderr, "lamina: %s %s %s %d %.1f ms%s%s\n", req.remote_addr.c_str(), req.method.c_str(),
        req.path.substr(0, 200).c_str(), res.status, ms,
        api_keys_.empty() ? "" : (key < 0 ? " key=none" : (" key=" + std::to_string(key)).c_str()),
        what.c_str());
  });
}

// The checks every request passes first (Host, API key), the error shape of the HTTP layer's
// own errors, and CORS preflights.
void Server::SetUpGuards() {
  http_->SetHeadFilter([this](const http::Request& req, http::Response& res) {
    if (!HostAllowed(req.get_header_value("Host"))) {
      SendError(res, {403, "permission_error",
                      "Host header not allowed (see --host-allow): this server answers to " +
                          JoinCommas(allowed_hosts_)});
      return true;
    }
    if (req.method == "OPTIONS") return false;
    // The web page's files are public, as llama-server's web UI assets (404 with --no-ui).
    static const char* const kPublic[] = {"/health",
                                          "/models",
                                          "/v1/models",
                                          "/",
                                          "/index.html",
                                          "/sw.js",
                                          "/manifest.webmanifest",
                                          "/_app/version.json",
                                          "/api/tags",
                                          "/api/version"};
    for (const char* p : kPublic) {
      if (req.path == p && (req.method == "GET" || req.method == "HEAD")) return false;
    }
    if (FindWebFile(req.path) && (req.method == "GET" || req.method == "HEAD")) return false;
    if (KeyIndex(req) < 0) {
      SendError(res, {401, "authentication_error", "Invalid API Key"}, StyleOf(req.path));
      return true;
    }
    return false;
  });
  http_->SetErrorWriter([this](http::Response& res, int status, const std::string& message) {
    const char* type = status == 404   ? "not_found_error"
                       : status == 503 ? "unavailable_error"
                       : status >= 500 ? "server_error"
                                       : "invalid_request_error";
    SendError(res, {status, type, message});
  });
  // Preflights: 200 with an empty body, as llama-server; the Access-Control-Allow-* headers
  // only for an allowed origin. Without --cors-origin the answer is llama-server's own; with
  // it the headers are named, since browsers never let "*" stand for Authorization.
  http_->Options("*", [this](const http::Request& req, http::Response& res) {
    res.status = 200;
    res.set_content("", "text/html");
    if (!OriginAllowed(req.get_header_value("Origin"))) return;
    if (cors_echo_any_) {
      res.set_header("Access-Control-Allow-Credentials", "true");
      res.set_header("Access-Control-Allow-Methods", "GET, POST");
      res.set_header("Access-Control-Allow-Headers", "*");
    } else {
      res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
      res.set_header("Access-Control-Allow-Headers", "Authorization, Content-Type, X-Api-Key");
    }
    res.set_header("Access-Control-Max-Age", "600");
  });
}

// /health, the completion routes (native and OpenAI) and the chat template's prompt.
void Server::SetUpCompletionRoutes() {
  http_->Get("/health", [this](const http::Request&, http::Response& res) {
    Count("/health");
    if (!Ready(res)) return;
    res.set_content(R"({"status":"ok"})", "application/json; charset=utf-8");
  });
  auto completion = [this](Route route, const char* name) {
    return [this, route, name](const http::Request& req, http::Response& res) {
      Count(name);
      HandleCompletion(req, res, route);
    };
  };
  http_->Post("/completion", completion(Route::kCompletion, "/completion"));
  http_->Post("/completions", completion(Route::kCompletion, "/completion"));
  http_->Post("/v1/completions", completion(Route::kOaiCompletion, "/v1/completions"));
  http_->Post("/chat/completions", completion(Route::kOaiChat, "/v1/chat/completions"));
  http_->Post("/v1/chat/completions", completion(Route::kOaiChat, "/v1/chat/completions"));
  // A chat request's prompt text (the template applied); false when an error was sent.
  auto render = [this](const http::Request& req, http::Response& res, const char* route,
                       std::string* prompt) {
    Count(route);
    if (!Ready(res)) return false;
    json body;
    if (!ParseBody(req, res, &body)) return false;
    ApiError err;
    if (!api::RenderMessages(body, *model_, chat_, defaults_, prompt, &err)) {
      SendError(res, err);
      return false;
    }
    return true;
  };
  http_->Post("/apply-template", [render](const http::Request& req, http::Response& res) {
    std::string prompt;
    if (!render(req, res, "/apply-template", &prompt)) return;
    res.set_content(Dump({{"prompt", prompt}}), "application/json; charset=utf-8");
  });
  // The prompt tokens a chat request would use, without generating (llama-server's shape).
  auto input_tokens = [this, render](const http::Request& req, http::Response& res) {
    std::string prompt;
    if (!render(req, res, "/v1/chat/completions/input_tokens", &prompt)) return;
    const size_t n = api::TokenizePrompt(*model_, prompt, true).size();
    res.set_content(Dump({{"object", "response.input_tokens"}, {"input_tokens", n}}),
                    "application/json; charset=utf-8");
  };
  http_->Post("/chat/completions/input_tokens", input_tokens);
  http_->Post("/v1/chat/completions/input_tokens", input_tokens);
}

// llama-server's other routes: tokens, props, slots, models, metrics, the monitor, the MCP
// CORS proxy.
void Server::SetUpUtilityRoutes() {
  http_->Post("/tokenize", [this](const http::Request& req, http::Response& res) {
    Count("/tokenize");
    HandleTokenize(req, res);
  });
  http_->Post("/detokenize", [this](const http::Request& req, http::Response& res) {
    Count("/detokenize");
    HandleDetokenize(req, res);
  });
  http_->Get("/props", [this](const http::Request&, http::Response& res) {
    Count("/props");
    HandleProps(res);
  });
  http_->Get("/slots", [this](const http::Request& req, http::Response& res) {
    Count("/slots");
    HandleSlots(req, res);
  });
  http_->Post("/slots/{int}", [this](const http::Request& req, http::Response& res) {
    Count("/slots/{id}");
    HandleSlotAction(req, res);
  });
  for (const char* path : {"/models", "/v1/models"}) {
    http_->Get(path, [this](const http::Request&, http::Response& res) {
      Count("/v1/models");
      HandleModels(res);
    });
  }
  http_->Get("/metrics", [this](const http::Request&, http::Response& res) {
    Count("/metrics");
    HandleMetrics(res);
  });
  http_->Get("/monitor", [this](const http::Request& req, http::Response& res) {
    Count("/monitor");
    HandleMonitor(req, res);
  });
  // llama-server's MCP CORS proxy: only with --ui-mcp-proxy (else 403, as llama-server).
  auto cors_proxy = [this](const http::Request& req, http::Response& res) {
    Count("/cors-proxy");
    if (!o_.ui_mcp_proxy) {
      return SendError(res, {403, "feature_disabled",
                             "this feature is disabled (start the server with --ui-mcp-proxy)"});
    }
    cors_proxy::Failure failure;
    if (!cors_proxy::Forward(req, res, &failure)) {
      SendError(res, {failure.status, failure.type, failure.message});
    }
  };
  http_->Get("/cors-proxy", cors_proxy);
  http_->Post("/cors-proxy", cors_proxy);
}

// The web page (--no-ui: none) and the files a browser asks for at llama-server's UI paths.
void Server::SetUpWebRoutes() {
  for (const std::string& path : WebFilePaths()) {  // "/", "/app.js", ... (web_files.h)
    http_->Get(path, [this, file = FindWebFile(path)](const http::Request&, http::Response& res) {
      Count("/");
      res.set_header("Cache-Control", "no-cache");
      res.set_content(std::string(file->bytes), file->content_type);
    });
  }
  // The files a browser asks for at the paths of llama-server's web UI (an installable page):
  // a manifest, the build's version, and a service worker. lamina's page registers no worker;
  // this one only takes the place of one that llama-server's UI left at this address, drops
  // its caches and unregisters, so the browser shows lamina's page.
  static const std::string kServiceWorker =
      "self.addEventListener('install', () => self.skipWaiting());\n"
      "self.addEventListener('activate', (event) => event.waitUntil((async () => {\n"
      "  for (const key of await caches.keys()) await caches.delete(key);\n"
      "  await self.registration.unregister();\n"
      "})()));\n";
  const std::vector<std::pair<std::string, std::pair<std::string, std::string>>> assets = {
      {"/sw.js", {kServiceWorker, "text/javascript; charset=utf-8"}},
      {"/manifest.webmanifest",
       {Dump({{"name", "lamina"},
              {"short_name", "lamina"},
              {"start_url", "/"},
              {"display", "standalone"},
              {"icons", json::array()}}),
        "application/manifest+json"}},
      {"/_app/version.json",
       {Dump({{"version", BuildFingerprint()}}), "application/json; charset=utf-8"}}};
  for (const auto& [path, file] : assets) {
    http_->Get(path, [file](const http::Request&, http::Response& res) {
      res.set_header("Cache-Control", "no-cache");
      res.set_content(file.first, file.second);
    });
  }
}

// The answer of one channel in a protocol's stream shape (protocols::Formatter).
void StreamFormatted(http::Response& res, std::shared_ptr<serve::Channel> ch,
                     std::shared_ptr<protocols::Formatter> f,
                     std::function<void(int, const serve::Event&)> remember,
                     std::function<void()> cancel_all) {
  auto started = std::make_shared<bool>(false);
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      f->stream_type(),
      [ch, f, remember, cancel_all, started](size_t, http::DataSink& sink) {
        auto write = [&](const std::string& s) {
          if (s.empty() || sink.write(s.data(), s.size())) return true;
          cancel_all();
          return false;
        };
        if (!*started) {
          *started = true;
          if (!write(f->Start())) return false;
        }
        serve::Event e;
        if (!ch->Pop(&e, std::chrono::milliseconds(100))) return true;
        if (e.kind == serve::Event::Kind::kProgress) return true;
        if (e.kind == serve::Event::Kind::kText) return write(f->Text(e.text));
        bool ok = true;
        if (e.kind == serve::Event::Kind::kError) {
          const ApiError err = api::EventError(e);
          remember(err.status, e);
          cancel_all();
          write(f->StreamError(err));
        } else {
          remember(200, e);
          ok = write(f->Done(e));
        }
        sink.done();
        return ok;
      },
      [cancel_all](bool) { cancel_all(); });
}

void Server::HandleProtocol(const http::Request& req, http::Response& res, Protocol p) {
  const ErrorStyle style = p == Protocol::kAnthropic   ? ErrorStyle::kAnthropic
                           : p == Protocol::kResponses ? ErrorStyle::kOpenAi
                                                       : ErrorStyle::kOllama;
  if (!Ready(res, style)) return;
  json body, mapped, echo;
  if (!ParseBody(req, res, &body, style)) return;
  ApiError err;
  bool raw = false, ok = false;
  try {
    ok = p == Protocol::kAnthropic    ? protocols::AnthropicToChat(body, false, &mapped, &err,
                                                                   &thinking_signer_, KeyScope(req))
         : p == Protocol::kResponses  ? protocols::ResponsesToChat(body, &mapped, &echo, &err)
         : p == Protocol::kOllamaChat ? protocols::OllamaChatToChat(body, &mapped, &err)
                                      : protocols::OllamaGenerateToBody(body, &mapped, &raw, &err);
  } catch (const json::exception& e) {
    err = {400, "invalid_request_error", std::string("malformed request: ") + e.what()};
  }
  if (!ok) return SendError(res, err, style);
  auto c = std::make_shared<api::Completion>();
  ok = raw ? api::ParseCompletion(mapped, *model_, defaults_, false, c.get(), &err)
           : api::ParseChat(mapped, *model_, chat_, defaults_, c.get(), &err);
  Channels channels;
  if (!ok || !Admit(req, mapped, c.get(), &channels, &err)) return SendError(res, err, style);
  for (size_t i = 1; i < channels.size(); ++i) channels[i]->Cancel();  // one answer only
  protocols::AnswerInfo info{model_id_,           static_cast<int>(c->requests[0].prompt.size()),
                             c->parse_tool_calls, c->tool_names,
                             c->reasoning_format, c->thinking_at_start,
                             &thinking_signer_,   KeyScope(req)};
  info.harmony = !raw && c->harmony;  // /api/generate's raw mode stays raw
  std::shared_ptr<protocols::Formatter> f =
      p == Protocol::kAnthropic ? protocols::MakeAnthropicFormatter(info)
      : p == Protocol::kResponses
          ? protocols::MakeResponsesFormatter(info, std::move(echo))
          : protocols::MakeOllamaFormatter(info, p == Protocol::kOllamaGenerate);
  auto remember = Rememberer(req, p == Protocol::kAnthropic    ? "/v1/messages"
                                  : p == Protocol::kResponses  ? "/v1/responses"
                                  : p == Protocol::kOllamaChat ? "/api/chat"
                                                               : "/api/generate");
  auto cancel_all = [channels] {
    for (auto& ch : channels) ch->Cancel();
  };
  if (c->stream) return StreamFormatted(res, channels[0], f, remember, cancel_all);
  auto col = std::make_shared<Collector>(Channels{channels[0]});
  auto answer = [col, f, remember, cancel_all]() -> std::pair<int, json> {
    const Collector::Answer& k = col->answers[0];
    if (k.last.kind == serve::Event::Kind::kError) {
      cancel_all();
      const ApiError err = api::EventError(k.last);
      remember(err.status, k.last);
      return {err.status, f->Error(err)};
    }
    remember(200, k.last);
    return {200, f->Whole(k.text, k.last)};
  };
  SendCollected(res, col, answer, cancel_all);
}

void Server::HandleCountTokens(const http::Request& req, http::Response& res) {
  if (!Ready(res, ErrorStyle::kAnthropic)) return;
  json body, mapped;
  if (!ParseBody(req, res, &body, ErrorStyle::kAnthropic)) return;
  ApiError err;
  std::string prompt;
  bool ok = false;
  try {
    ok = protocols::AnthropicToChat(body, true, &mapped, &err, &thinking_signer_, KeyScope(req)) &&
         api::RenderMessages(mapped, *model_, chat_, defaults_, &prompt, &err);
  } catch (const json::exception& e) {
    err = {400, "invalid_request_error", std::string("malformed request: ") + e.what()};
  }
  if (!ok) return SendError(res, err, ErrorStyle::kAnthropic);
  const size_t n = api::TokenizePrompt(*model_, prompt, true).size();
  res.set_content(Dump({{"input_tokens", n}}), "application/json; charset=utf-8");
}

// The model as an entry of Ollama's /api/tags and /api/ps.
json Server::OllamaModel() const {
  const Hparams& hp = model_->hparams();
  const double n = static_cast<double>(model_->ParameterCount());
  char params[32];
  if (n >= 1e9) {
    std::snprintf(params, sizeof params, "%.1fB", n / 1e9);
  } else {
    std::snprintf(params, sizeof params, "%.1fM", n / 1e6);
  }
  const std::string seed = o_.model_path + "|" + std::to_string(model_->file().total_size());
  std::string digest;
  for (const char* salt : {"a", "b", "c", "d"}) digest += KeyDigest(salt + seed);
  return {{"name", model_id_},
          {"model", model_id_},
          {"modified_at", protocols::OllamaTime(started_at_)},
          {"size", model_->file().total_size()},
          {"digest", digest},
          {"details",
           {{"parent_model", ""},
            {"format", "gguf"},
            {"family", hp.arch},
            {"families", json::array({hp.arch})},
            {"parameter_size", params},
            {"quantization_level", ""}}}};
}

void Server::HandleOllamaShow(const http::Request& req, http::Response& res) {
  if (!Ready(res, ErrorStyle::kOllama)) return;
  json body;
  if (!ParseBody(req, res, &body, ErrorStyle::kOllama)) return;
  const Hparams& hp = model_->hparams();
  const json entry = OllamaModel();
  const GenerateParams& d = defaults_.params;
  std::string parameters = "temperature " + std::to_string(d.sampler.temperature) + "\ntop_k " +
                           std::to_string(d.sampler.top_k) + "\ntop_p " +
                           std::to_string(d.sampler.top_p) + "\nmin_p " +
                           std::to_string(d.sampler.min_p) + "\n";
  json info = {{"general.architecture", hp.arch},
               {"general.parameter_count", model_->ParameterCount()},
               {hp.arch + ".context_length", hp.n_ctx_train},
               {hp.arch + ".embedding_length", hp.n_embd},
               {hp.arch + ".vocab_size", hp.n_vocab}};
  res.set_content(Dump({{"modelfile", "FROM " + o_.model_path + "\n"},
                        {"parameters", parameters},
                        {"template", chat_template_text_},
                        {"details", entry["details"]},
                        {"model_info", info},
                        {"capabilities", json::array({"completion", "tools"})},
                        {"modified_at", entry["modified_at"]}}),
                  "application/json; charset=utf-8");
}

// Anthropic's /v1/messages and Ollama's /api/* (docs/SERVER.md, "Other protocols").
void Server::SetUpProtocolRoutes() {
  auto protocol = [this](Protocol p, const char* name) {
    return [this, p, name](const http::Request& req, http::Response& res) {
      Count(name);
      HandleProtocol(req, res, p);
    };
  };
  http_->Post("/v1/messages", protocol(Protocol::kAnthropic, "/v1/messages"));
  http_->Post("/v1/responses", protocol(Protocol::kResponses, "/v1/responses"));
  http_->Post("/responses", protocol(Protocol::kResponses, "/v1/responses"));
  http_->Post("/v1/messages/count_tokens", [this](const http::Request& req, http::Response& res) {
    Count("/v1/messages/count_tokens");
    HandleCountTokens(req, res);
  });
  http_->Post("/api/chat", protocol(Protocol::kOllamaChat, "/api/chat"));
  http_->Post("/api/generate", protocol(Protocol::kOllamaGenerate, "/api/generate"));
  http_->Post("/api/show", [this](const http::Request& req, http::Response& res) {
    Count("/api/show");
    HandleOllamaShow(req, res);
  });
  for (const char* path : {"/api/tags", "/api/ps"}) {
    const bool ps = std::string(path) == "/api/ps";
    http_->Get(path, [this, path, ps](const http::Request&, http::Response& res) {
      Count(path);
      if (!Ready(res, ErrorStyle::kOllama)) return;
      json m = OllamaModel();
      if (ps) {
        m["expires_at"] = "0001-01-01T00:00:00Z";
        m["size_vram"] = 0;
      }
      res.set_content(Dump({{"models", json::array({m})}}), "application/json; charset=utf-8");
    });
  }
  http_->Get("/api/version", [this](const http::Request&, http::Response& res) {
    Count("/api/version");
    res.set_content(Dump({{"version", kOllamaApiVersion}}), "application/json; charset=utf-8");
  });
}

// API keys (fail closed: an empty key, or a key file without one, stops the server), the CORS
// origins and the allowed Host names. Returns an exit code.
int Server::LoadAccessLists() {
  auto add_key = [this](const std::string& key, const std::string& where) {
    if (key.empty()) {
      std::fprintf(stderr, "lamina: %s: an API key may not be empty\n", where.c_str());
      return false;
    }
    for (unsigned char ch : key) {
      if (ch <= 0x20 || ch == 0x7f) {
        std::fprintf(stderr, "lamina: %s: an API key may not hold spaces or control characters\n",
                     where.c_str());
        return false;
      }
    }
    api_keys_.push_back(key);
    key_digests_.push_back(KeyDigest(key));
    return true;
  };
  for (const std::string& arg : o_.api_keys) {
    if (arg.empty() || arg.front() == ',' || arg.back() == ',' ||
        arg.find(",,") != std::string::npos) {
      std::fprintf(stderr, "lamina: --api-key: an API key may not be empty\n");
      return kExitUsage;
    }
    for (const std::string& k : SplitCommas(arg)) {
      if (!add_key(k, "--api-key")) return kExitUsage;
    }
  }
  if (!o_.api_key_file.empty()) {
    std::ifstream in(o_.api_key_file);
    if (!in) {
      std::fprintf(stderr, "lamina: --api-key-file %s: cannot read\n", o_.api_key_file.c_str());
      return kExitBadInput;
    }
    std::string line;
    size_t n_file = 0;
    while (std::getline(in, line)) {
      while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
      if (line.empty() || line.front() == '#') continue;
      if (!add_key(line, "--api-key-file " + o_.api_key_file)) return kExitBadInput;
      ++n_file;
    }
    if (n_file == 0) {
      std::fprintf(stderr, "lamina: --api-key-file %s: holds no API key\n",
                   o_.api_key_file.c_str());
      return kExitBadInput;
    }
  }
  cors_origins_ = SplitCommas(o_.cors_origins);
  if (cors_origins_.size() == 1 && cors_origins_[0] == "none") cors_origins_.clear();
  cors_echo_any_ = o_.cors_origins.empty() && !api_keys_.empty();
  for (std::string h : SplitCommas(o_.allowed_hosts)) {
    for (char& ch : h) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    allowed_hosts_.push_back(h);
  }
  if (allowed_hosts_.empty()) {
    const std::string& h = o_.host;
    const bool loopback =
        h == "127.0.0.1" || h == "localhost" || h == "::1" || h.rfind("127.", 0) == 0;
    if (loopback) {
      allowed_hosts_ = {"localhost", "127.0.0.1", "[::1]"};
      if (h.rfind("127.", 0) == 0 && h != "127.0.0.1") allowed_hosts_.push_back(h);
    } else {
      allowed_hosts_ = {"*"};
    }
  }
  if (api_keys_.empty() && !allowed_hosts_.empty() && allowed_hosts_[0] == "*") {
    std::fprintf(stderr,
                 "lamina: warning: listening on %s without an API key: anyone who can reach "
                 "this address can use the model (--api-key)\n",
                 o_.host.c_str());
  }
  if (o_.ui_mcp_proxy) {
    std::fprintf(stderr,
                 "lamina: warning: --ui-mcp-proxy: /cors-proxy fetches any URL a client names, "
                 "from this machine; do not let untrusted clients reach this server\n");
  }
  return kExitOk;
}

int Server::Run() {
  started_at_ = static_cast<double>(std::time(nullptr));
  // SIGTERM / SIGINT are taken by a waiting thread, never by a handler.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  KvType kv = KvType::kF32;
  KvRounding round = KvRounding::kNearest;
  if (int rc = CheckBeforeListening(&kv, &round); rc != kExitOk) return rc;
  SetUpRoutes();
  std::string bind_error;
  if (!http_->Bind(o_.host, o_.port, &bind_error)) {
    std::fprintf(stderr, "lamina: cannot listen on %s:%d (%s)\n", o_.host.c_str(), o_.port,
                 bind_error.c_str());
    return kExitFailure;
  }
  std::thread listener([this] { http_->Run(); });
  std::fprintf(stderr, "lamina: listening on http://%s:%d\n", o_.host.c_str(), o_.port);

  // A signal ends the wait; the main thread then stops the engine (open requests get an error)
  // and the HTTP server.
  std::atomic<bool> stopping{false};
  std::thread signal_waiter([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    stopping = true;
  });
  // wait: until a signal comes; otherwise (a start-up failure) wake the waiter at once.
  auto shut_down = [&](int rc, bool wait = false) {
    if (!wait && !stopping.exchange(true)) pthread_kill(signal_waiter.native_handle(), SIGTERM);
    signal_waiter.join();
    if (scheduler_) scheduler_->Stop();
    http_->Stop();
    listener.join();
    return rc;
  };

  // Load while /health answers 503.
  const double t0 = NowSeconds();
  Result<std::unique_ptr<Model>> model = LoadModel(o_.model_path);
  if (!model.ok()) {
    std::fprintf(stderr, "lamina: %s\n", model.error().message.c_str());
    return shut_down(kExitBadInput);
  }
  if (stopping) return shut_down(kExitOk);
  if (int rc = kExitOk; !AttachMtpHead(o_.spec.mode, o_.model_path, **model, &rc)) {
    return shut_down(rc);
  }
  model_ = std::move(*model);
  if (int rc = StartScheduler(kv, round); rc != kExitOk) return shut_down(rc);
  if (int rc = ChooseChatFormat(); rc != kExitOk) return shut_down(rc);
  if (int rc = SetRequestDefaults(); rc != kExitOk) return shut_down(rc);
  SetModelNames();
  scheduler_->Start();
  ready_ = true;
  const KvCache& cache = scheduler_->cache();
  std::fprintf(
      stderr, "lamina: model %s loaded in %.2f s; %d slots %s %d cells, kv %s (%.2f MiB)\n",
      model_id_.c_str(), NowSeconds() - t0, scheduler_->n_slots(), o_.kv_unified ? "sharing" : "x",
      scheduler_->n_ctx_slot(), kv_name_.c_str(), cache.BytesTotal() / 1048576.0);
  const int rc = shut_down(kExitOk, /*wait=*/true);  // until SIGTERM / SIGINT
  std::fprintf(stderr, "lamina: stopped\n");
  return rc;
}

// The start-up checks that need no model (access lists, the slot folder, the default grammar,
// the KV mode), before the port is taken. Returns an exit code.
int Server::CheckBeforeListening(KvType* kv_type, KvRounding* v_rounding) {
  if (int rc = LoadAccessLists(); rc != kExitOk) return rc;
  if (!o_.slot_save_path.empty()) {
    // A missing slot folder is made now (llama-server requires it to exist): a save then
    // never fails for want of it.
    std::error_code ec;
    std::filesystem::create_directories(o_.slot_save_path, ec);
    if (!std::filesystem::is_directory(o_.slot_save_path, ec)) {
      std::fprintf(stderr, "lamina: --slot-save-path %s: not a directory and cannot be made one\n",
                   o_.slot_save_path.c_str());
      return kExitUsage;
    }
  }
  SweepStaleSlotFiles(o_.slot_save_path);
  // Every connection is a descriptor: take the hard limit, so --max-connections is reachable.
  if (rlimit nofile{};
      getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < nofile.rlim_max) {
    nofile.rlim_cur = nofile.rlim_max;
    setrlimit(RLIMIT_NOFILE, &nofile);
  }
  // Usage errors that need no model come before the port is taken.
  {
    RunOptions g;
    g.grammar = o_.grammar;
    g.grammar_file = o_.grammar_file;
    g.json_schema = o_.json_schema;
    g.json_schema_file = o_.json_schema_file;
    int rc = kExitOk;
    if (!MakeGrammar(g, &defaults_.params.grammar, &rc)) return rc;
  }
  Result<KvType> kv = ParseKvType(o_.kv);
  Result<KvRounding> round = ParseKvRounding(o_.kv_v_round);
  if (!kv.ok() || !round.ok()) {
    std::fprintf(stderr, "lamina: %s\n", (!kv.ok() ? kv.error() : round.error()).message.c_str());
    return kExitUsage;
  }
  *kv_type = *kv;
  *v_rounding = *round;
  return kExitOk;
}

// The scheduler of the loaded model: its slots, KV cache, memory check and speculative
// decoding. Returns an exit code.
int Server::StartScheduler(KvType kv, KvRounding round) {
  const Hparams& hp = model_->hparams();
  serve::SchedulerConfig sc;
  sc.n_slots = std::max(1, o_.n_parallel);
  sc.n_batch = std::max(1, o_.n_batch);
  sc.context_shift = o_.context_shift;
  const int per_slot_default = std::min(hp.n_ctx_train > 0 ? hp.n_ctx_train : 4096, 4096);
  sc.kv_unified = o_.kv_unified;
  if (o_.kv_unified) {  // one pool of n_ctx cells, any slot may fill it
    sc.session.n_ctx = o_.n_ctx > 0 ? o_.n_ctx : per_slot_default;
  } else {
    sc.session.n_ctx = o_.n_ctx > 0 ? std::max(1, o_.n_ctx / sc.n_slots) : per_slot_default;
  }
  sc.session.kv_type = kv;
  sc.session.v_rounding = round;
  sc.session.kv_seed = o_.kv_seed;
  sc.session.kv_window = o_.kv_window < 0 ? kKvWindowModeDefault : o_.kv_window;
  sc.session.swa_full = o_.swa_full;
  sc.session.recurrent_ring = o_.recurrent_ring;
  sc.session.n_seq = sc.n_slots;
  Result<KvCacheConfig> kc = MakeKvCacheConfig(hp, sc.session);
  if (!kc.ok()) {
    std::fprintf(stderr, "lamina: --kv %s: %s\n", o_.kv.c_str(), kc.error().message.c_str());
    return kExitUsage;
  }
  {
    CommonOptions mem;
    mem.mem_limit = o_.mem_limit;
    int rc = kExitOk;
    if (!CheckMemoryPlan(mem, *model_, &sc.session, sc.n_batch, sc.n_slots, 0, "lower -b", &rc,
                         MtpPlanBytes(o_.spec, *model_, sc.session))) {
      return rc;
    }
  }
  kv_name_ = KvTypeName(kv);
  pool_ = std::make_unique<ThreadPool>(o_.n_threads);
  SpecCliOptions spec_options = o_.spec;
  if (spec_options.mode == "off" && !spec_options.draft_model.empty()) spec_options.mode = "draft";
  int spec_rc = kExitOk;
  if (!MakeSpecSetup(spec_options, o_.model_path, *model_, sc.session.n_ctx, *pool_, &spec_,
                     &spec_rc, /*build_drafter=*/false)) {
    return spec_rc;
  }
  if (spec_options.mode != "off") {
    sc.spec.mode = spec_options.mode == "draft" ? serve::SpecConfig::Mode::kDraft
                   : spec_options.mode == "mtp" ? serve::SpecConfig::Mode::kMtp
                                                : serve::SpecConfig::Mode::kLookup;
    sc.spec.draft_model = spec_.draft_model.get();
    sc.spec.draft_session = spec_.draft_config;
    sc.spec.draft_p_min = spec_options.draft_p_min;
    sc.spec.lookup_ngram = spec_options.lookup_ngram;
    sc.spec.options = spec_.options;
    speculative_ = true;
  }
  scheduler_ = std::make_unique<serve::Scheduler>(*model_, sc, *pool_);
  defaults_.n_ctx_slot = scheduler_->n_ctx_slot();
  return kExitOk;
}

// Chat format: --chat-template-file / --chat-template, else the model's (native or through
// the Jinja engine), else ChatML. Returns an exit code.
int Server::ChooseChatFormat() {
  Result<std::string> tmpl = model_->file().GetString("tokenizer.chat_template");
  chat_template_text_ = tmpl.ok() ? *tmpl : "";
  const cli::ChatTemplateOptions cto{o_.chat_template, o_.chat_template_file, o_.jinja};
  const bool asked = !cto.name.empty() || !cto.file.empty();
  if (asked || !chat_template_text_.empty()) {
    Result<chat::ChatSetup> setup = cli::ChooseChatSetup(*model_, cto);
    if (setup.ok()) {
      chat_ = std::move(*setup);
    } else if (asked) {
      std::fprintf(stderr, "lamina: %s\n", setup.error().message.c_str());
      return kExitUsage;
    } else {
      std::fprintf(stderr, "lamina: %s; using ChatML\n", setup.error().message.c_str());
      chat_ = chat::ChatSetup{};
      chat_.format = chat::ChatFormat::kChatML;
    }
  } else {
    chat_.format = chat::ChatFormat::kChatML;
  }
  return kExitOk;
}

// Every request's defaults from the flags. Returns an exit code.
int Server::SetRequestDefaults() {
  defaults_.params.sampler.temperature = o_.temperature;
  defaults_.params.sampler.top_k = o_.top_k;
  defaults_.params.sampler.top_p = o_.top_p;
  defaults_.params.sampler.min_p = o_.min_p;
  defaults_.params.sampler.repeat_penalty = o_.repeat_penalty;
  defaults_.params.sampler.repeat_last_n = o_.repeat_last_n;
  ApplySamplerChain(o_.chain, &defaults_.params.sampler);
  defaults_.params.n_predict = o_.n_predict;
  defaults_.seed = o_.seed;
  defaults_.prefill_assistant = o_.prefill_assistant;
  defaults_.n_keep = o_.n_keep;
  defaults_.verbose = o_.verbose;
  chat::ReasoningFormatFromName(o_.reasoning_format, &defaults_.reasoning_format);
  defaults_.reasoning_budget = o_.reasoning_budget;
  defaults_.reasoning_budget_message = o_.reasoning_budget_message;
  // auto: the template's own default, or off when the budget is 0
  if (o_.reasoning == "on") {
    defaults_.enable_thinking = true;
  } else if (o_.reasoning == "off" || o_.reasoning_budget == 0) {
    defaults_.enable_thinking = false;
  }
  if (!o_.chat_template_kwargs.empty()) {
    json kwargs = json::parse(o_.chat_template_kwargs, nullptr, /*allow_exceptions=*/false);
    if (!kwargs.is_object() || kwargs.size() > api::kMaxTemplateKwargs) {
      std::fprintf(stderr,
                   "lamina: --chat-template-kwargs must be a JSON object of at most %zu "
                   "members\n",
                   api::kMaxTemplateKwargs);
      return kExitUsage;
    }
    if (auto t = kwargs.find("enable_thinking"); t != kwargs.end()) {
      if (!t->is_boolean()) {
        std::fprintf(stderr, "lamina: --chat-template-kwargs: enable_thinking must be a boolean\n");
        return kExitUsage;
      }
      defaults_.enable_thinking = t->get<bool>();
    }
    defaults_.chat_template_kwargs = std::move(kwargs);
  }
  return kExitOk;
}

// The model's id, aliases and tags.
void Server::SetModelNames() {
  // As llama-server's std::set: sorted, without repeats; the id is the first alias in that order.
  auto sorted_set = [](std::vector<std::string> v) {
    std::sort(v.begin(), v.end());
    v.erase(std::unique(v.begin(), v.end()), v.end());
    return v;
  };
  aliases_ = sorted_set(SplitCommas(o_.alias));
  tags_ = sorted_set(SplitCommas(o_.tags));
  model_id_ =
      aliases_.empty() ? std::filesystem::path(o_.model_path).filename().string() : aliases_[0];
  if (aliases_.empty()) aliases_.push_back(model_id_);
}

// llama-server's -ctk/-ctv pair as a lamina KV mode.
Result<std::string> KvModeOfCacheTypes(const std::string& k, const std::string& v) {
  static const struct {
    const char* k;
    const char* v;
    const char* mode;
  } kPairs[] = {{"f32", "f32", "f32"},
                {"f16", "f16", "f16"},
                {"q8_0", "q8_0", "int8"},
                {"q8_0", "q4_0", "k8v4"},
                {"q4_0", "q4_0", "q4_0"}};
  for (const auto& p : kPairs) {
    if (k == p.k && v == p.v) return std::string(p.mode);
  }
  return Error{"-ctk " + k + " -ctv " + v +
               ": lamina's KV modes are -ctk/-ctv f32/f32 (--kv f32), f16/f16 (f16), q8_0/q8_0 "
               "(int8), q8_0/q4_0 (k8v4), q4_0/q4_0 (q4_0); or --kv " +
               KvModeNames()};
}

// llama-server's flags that lamina takes without an option of its own, read after parsing.
struct LlamaServerFlags {
  std::string cache_type_k, cache_type_v;
  std::vector<std::string> warned;   // flags given that mean nothing here, warned once each
  std::vector<std::string> refused;  // llama-server flags lamina does not offer
  std::string unused_value;
  bool unused_flag = false;
};

// The server's own options: model, address, slots, sampling defaults, access, the web page.
void AddServeOptions(CLI::App* app, ServeOptions* o) {
  app->add_option("-m,--model", o->model_path, "GGUF model (default: the shipped model)");
  app->add_option("--host", o->host, "Address to listen on");
  app->add_option("--port", o->port, "Port to listen on")->check(IntRange(0, 65535));
  app->add_option("-c,--ctx-size", o->n_ctx,
                  "Context cells over all slots (each slot gets ctx / parallel; 0: 4096 per slot)")
      ->check(ContextSize());
  app->add_option("--parallel", o->n_parallel, "Slots (-np)")->check(IntRange(1, 256));
  app->add_flag("--kv-unified,!--no-kv-unified", o->kv_unified,
                "Every slot may use the whole -c context, the slots sharing its cells (-kvu; "
                "the cache then holds -c cells per slot)");
  app->add_option("-n,--n-predict", o->n_predict, "Default tokens to predict (-1: unlimited)")
      ->check(IntRange(-1, 1 << 24));
  app->add_option("-t,--threads", o->n_threads, "Threads for the model (0: all cores)")
      ->check(Threads());
  app->add_option("--threads-http", o->n_threads_http,
                  "HTTP worker threads (0: enough for 64 connections)")
      ->check(IntRange(0, 1024));
  app->add_option("-b,--batch-size", o->n_batch, "Most tokens per forward pass")
      ->check(IntRange(1, 1 << 16));
  app->add_option("--temp", o->temperature, "Default temperature")->check(Temperature());
  app->add_option("--top-k", o->top_k, "Default top-k (0: off)")->check(IntRange(0, 1 << 20));
  app->add_option("--top-p", o->top_p, "Default top-p (1: off)")->check(Probability());
  app->add_option("--min-p", o->min_p, "Default min-p (0: off)")->check(Probability());
  app->add_option("--repeat-penalty", o->repeat_penalty, "Default repetition penalty (1: off)")
      ->check(Positive());
  app->add_option("--repeat-last-n", o->repeat_last_n, "Tokens the penalty looks back")
      ->check(IntRange(0, 1 << 20));
  app->add_option("-s,--seed", o->seed, "Default seed of every request (-1: random per request)");
  app->add_option("-a,--alias", o->alias, "Model names, comma-separated (the first is the id)");
  app->add_option("--tags", o->tags, "Model tags, comma-separated");
  app->add_option("--api-key", o->api_keys,
                  "API key (repeatable); requests need it as Bearer or X-Api-Key");
  app->add_option("--api-key-file", o->api_key_file,
                  "File with one API key per line (# comments); a file without a key is an error");
  app->add_option("--cors-origin,--cors-origins", o->cors_origins,
                  "Origins whose web pages may read answers, comma-separated (*: any; localhost: "
                  "any on this machine; none: no other; default: any with --api-key, else none)");
  app->add_option("--host-allow", o->allowed_hosts,
                  "Host header names answered, comma-separated (*: any; default: the loopback "
                  "names when bound to loopback, else any)");
  app->add_option("--max-connections", o->max_connections,
                  "Open connections at most (idle and slow ones give way to new clients)")
      ->check(IntRange(16, 65536));
  app->add_flag("--slots,!--no-slots", o->slots, "Expose /slots (default on)");
  app->add_option("--slot-save-path", o->slot_save_path, "Folder for slot save/restore files");
  app->add_flag("--context-shift,!--no-context-shift", o->context_shift,
                "When a slot fills, drop old cells and go on (default off: stop)");
  app->add_flag("!--no-ui,!--no-webui", o->ui, "Do not serve the web page at /");
  app->add_flag("--ui-mcp-proxy,--webui-mcp-proxy,!--no-ui-mcp-proxy,!--no-webui-mcp-proxy",
                o->ui_mcp_proxy,
                "Serve /cors-proxy?url=U, which fetches U for a client (llama-server's MCP proxy; "
                "default off: never on a server untrusted clients reach)");
  app->add_flag("-v,--verbose", o->verbose, "More logging");
}

// Chat template, default grammar, KV cache, memory and speculative decoding.
void AddGenerationOptions(CLI::App* app, ServeOptions* o) {
  app->add_option(
      "--chat-template", o->chat_template,
      "Chat template: a built-in name (" + chat::ChatTemplateNames() + ") or a Jinja source");
  app->add_option("--chat-template-file", o->chat_template_file,
                  "Chat template: a Jinja source file");
  app->add_flag("--jinja", o->jinja,
                "Render the model's chat template with the Jinja engine even when it is a format "
                "lamina knows");
  app->add_option("--grammar", o->grammar,
                  "Default GBNF grammar of every request (the text, or a file holding it)");
  app->add_option("--grammar-file", o->grammar_file, "Read the default GBNF grammar from a file");
  app->add_option("-j,--json-schema", o->json_schema,
                  "Default JSON schema of every request (the text, or a file holding it)");
  app->add_option("--json-schema-file", o->json_schema_file,
                  "Read the default JSON schema from a file (-jf)");
  app->add_flag("!--no-prefill-assistant", o->prefill_assistant,
                "A last assistant message is a finished turn, not text to continue");
  app->add_option("--kv", o->kv, "KV cache mode: " + KvModeNames());
  app->add_option("--kv-v-round", o->kv_v_round, "V rounding of quantized modes: rtn, stochastic");
  app->add_option("--kv-seed", o->kv_seed, "Seed of stochastic rounding")->check(Seed());
  app->add_option("--kv-window", o->kv_window,
                  "Recent cells kept exact (f16) in lossy KV modes; 0: off (default: the mode's)")
      ->check(IntRange(0, 1 << 20));
  app->add_flag("--swa-full", o->swa_full,
                "Keep every cell of sliding-window layers (default: a ring of their recent cells; "
                "prefixes cut further back are evaluated again)");
  app->add_option("--recurrent-ring", o->recurrent_ring,
                  "Hybrid models: recurrent states kept per slot, the furthest a rollback restores "
                  "exactly (default 32)")
      ->check(IntRange(1, 4096));
  app->add_option("--mem-limit", o->mem_limit,
                  "Most bytes the KV cache (with recurrent states, and --spec mtp's head caches "
                  "and kept hidden states) and a batch may take, e.g. 8G, or none (default: "
                  "LAMINA_MEM_LIMIT, else 90% of MemAvailable)");
  app->add_option("--max-body", o->max_body_bytes, "Largest request body in bytes")
      ->check(IntRange(1024, 1 << 30));
  AddSpecOptions(app, o->spec);  // -md alone turns on --spec draft, as in llama-server
}

// llama-server's flags: each works, warns that it has no meaning on lamina, or is refused
// (docs/SERVER.md, "llama-server flags"). These are -ctk/-ctv and --keep, then the hidden ones
// that only warn or are true of lamina anyway; AddRefusedFlags adds the refused ones.
void AddLlamaServerFlags(CLI::App* app, ServeOptions* o, LlamaServerFlags* flags) {
  app->add_option("--cache-type-k", flags->cache_type_k,
                  "llama-server's K cache type (-ctk; with -ctv "
                  "it picks --kv: q8_0/q8_0 int8, q8_0/q4_0 k8v4, q4_0/q4_0 q4_0, f16, f32)");
  app->add_option("--cache-type-v", flags->cache_type_v, "llama-server's V cache type (-ctv)");
  app->add_option("--keep", o->n_keep,
                  "Default n_keep of a request (tokens of the prompt kept "
                  "by a context shift; -1: all)")
      ->check(IntRange(-1, 1 << 30));
  std::vector<std::string>* warned = &flags->warned;
  struct NoEffect {
    const char* name;
    const char* why;
  };
  for (const NoEffect& f : std::initializer_list<NoEffect>{
           {"--n-gpu-layers", "lamina runs on the CPU"},
           {"--split-mode", "lamina runs on the CPU"},
           {"--main-gpu", "lamina runs on the CPU"},
           {"--device", "lamina runs on the CPU"},
           {"--flash-attn", "lamina's attention is always tiled (flash-style)"},
           {"--ubatch-size", "lamina's batch is -b"},
           {"--threads-batch", "-t threads serve prompts and decoding alike"},
           {"--timeout", "the HTTP layer's deadlines are fixed (docs/SERVER.md, Limits)"},
           {"--cache-reuse", "the prefix cache reuses whole prefixes"}}) {
    CLI::Option* opt = app->add_option(f.name, flags->unused_value, "no effect on lamina")
                           ->group("")
                           ->each([warned, f](const std::string&) {
                             warned->push_back(std::string(f.name) + ": " + f.why + "; ignored");
                           });
    // llama-server's -fa takes on/off/auto today and was a plain flag before.
    if (std::string(f.name) == "--flash-attn") {
      opt->expected(0, 1)->default_str("on");
    }
  }
  for (const NoEffect& f : std::initializer_list<NoEffect>{
           {"--mlock", "lamina does not lock the model in memory"},
           {"--no-mmap", "lamina reads the model into memory"},
           {"--no-cont-batching", "lamina always batches continuously"},
           {"--no-jinja", "formats lamina knows are rendered natively, others need Jinja"},
           {"--no-warmup", "lamina has no warm-up run"},
           {"--no-perf", "timings are always measured"},
           {"--backend-sampling", "lamina samples on the CPU"}}) {
    app->add_flag_callback(
           f.name,
           [warned, f] { warned->push_back(std::string(f.name) + ": " + f.why + "; ignored"); })
        ->group("");
  }
  // True of lamina anyway: accepted without a word.
  for (const char* name :
       {"--offline", "--metrics", "--props", "--cont-batching", "--log-disable"}) {
    app->add_flag(name, flags->unused_flag, "always so on lamina")->group("");
  }
}

// The sampler chain, reasoning and chat-template variables.
void AddReasoningOptions(CLI::App* app, ServeOptions* o) {
  AddSamplerChainOptions(app, o->chain);
  app->add_option("--reasoning-format", o->reasoning_format,
                  "Thinking blocks: none (left in content), deepseek or auto (reasoning_content "
                  "apart), deepseek-legacy (both)")
      ->check(CLI::IsMember({"none", "deepseek", "deepseek-legacy", "auto"}))
      ->capture_default_str();
  app->add_option("--reasoning", o->reasoning,
                  "(-rea) Thinking on, off or auto (the template's default; off when "
                  "--reasoning-budget is 0): the templates' enable_thinking")
      ->check(CLI::IsMember({"on", "off", "auto"}))
      ->capture_default_str();
  app->add_option(
         "--reasoning-budget", o->reasoning_budget,
         "Tokens of thinking before the close tag is forced (-1: no limit; 0: thinking off)")
      ->check(CLI::Range(-1, 1 << 24))
      ->capture_default_str();
  app->add_option("--reasoning-budget-message", o->reasoning_budget_message,
                  "Text forced before the close tag when the budget ends a thought");
  app->add_option("--chat-template-kwargs", o->chat_template_kwargs,
                  "A JSON object of more chat-template variables for every request");
}

// llama-server flags lamina does not offer: parsed, then refused by name.
void AddRefusedFlags(CLI::App* app, LlamaServerFlags* flags) {
  std::vector<std::string>* refused = &flags->refused;
  for (const char* name : {"--log-file", "--path", "--api-prefix"}) {
    app->add_option(name, flags->unused_value, "not supported")
        ->group("")
        ->each([name, refused](const std::string&) { refused->push_back(name); });
  }
}

// The command line with llama-server's spellings normalized.
std::vector<std::string> ServeArgs(int argc, char** argv) {
  std::vector<std::string> args = NormalizeLlamaArgs(argc, argv);
  // llama-server reads "--a_b" as "--a-b" (only the name: a "--name=value" value is kept).
  for (std::string& a : args) {
    if (a.rfind("--", 0) != 0) continue;
    const size_t name_end = std::min(a.find('='), a.size());
    std::replace(a.begin(), a.begin() + static_cast<std::ptrdiff_t>(name_end), '_', '-');
  }
  return args;
}

// Acts on the llama-server flags once parsing is done: a refused flag, or a -ctk/-ctv pair
// lamina has no mode for, is a usage error. Returns an exit code.
int ApplyLlamaServerFlags(const CLI::App& app, const LlamaServerFlags& flags, ServeOptions* o) {
  if (!flags.refused.empty()) {
    std::fprintf(stderr, "lamina: %s: not supported by lamina serve (docs/SERVER.md)\n",
                 flags.refused[0].c_str());
    return kExitUsage;
  }
  if (!flags.cache_type_k.empty() || !flags.cache_type_v.empty()) {
    Result<std::string> mode =
        KvModeOfCacheTypes(flags.cache_type_k.empty() ? "f16" : flags.cache_type_k,
                           flags.cache_type_v.empty() ? "f16" : flags.cache_type_v);
    if (!mode.ok()) {
      std::fprintf(stderr, "lamina: %s\n", mode.error().message.c_str());
      return kExitUsage;
    }
    if (app.count("--kv") > 0 && o->kv != *mode) {
      std::fprintf(stderr, "lamina: --kv %s contradicts -ctk/-ctv (which mean --kv %s)\n",
                   o->kv.c_str(), mode->c_str());
      return kExitUsage;
    }
    o->kv = *mode;
  }
  return kExitOk;
}

}  // namespace

int RunServeCommand(int argc, char** argv) {
  ServeOptions o;
  CLI::App app{"lamina serve: an OpenAI- and llama-server-compatible HTTP server", "lamina serve"};
  LlamaServerFlags flags;
  AddServeOptions(&app, &o);
  AddGenerationOptions(&app, &o);
  AddLlamaServerFlags(&app, &o, &flags);
  AddReasoningOptions(&app, &o);
  AddRefusedFlags(&app, &flags);
  std::vector<std::string> args = ServeArgs(argc, argv);
  std::vector<char*> ptrs;
  for (std::string& a : args) ptrs.push_back(a.data());
  try {
    app.parse(static_cast<int>(ptrs.size()), ptrs.data());
  } catch (const CLI::ParseError& e) {
    return ParseErrorExit(app, e);
  }
  if (int rc = ApplyLlamaServerFlags(app, flags, &o); rc != kExitOk) return rc;
  for (const std::string& w : flags.warned) {
    std::fprintf(stderr, "lamina: warning: %s\n", w.c_str());
  }
  if (!ResolveModelPath(&o.model_path)) return kExitUsage;
  Server server(o);
  return server.Run();
}

}  // namespace lamina::cli
