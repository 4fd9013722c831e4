// The probe's backend for an OpenAI-compatible server (`lamina probe --url`): greedy answers from
// POST /v1/chat/completions (temperature 0, max_tokens), token counts from llama-server's
// POST /tokenize or, where a server has none, estimated from usage.prompt_tokens. The probes'
// stop rules are applied to the finished answer (cut where they first hold), since a plain
// completion cannot be stopped by a predicate while it runs.
#include <httplib.h>

#include <cmath>
#include <unordered_map>

#include "cli_probe.h"

namespace lamina::cli {

namespace {

using nlohmann::json;

// English prose for the token-count estimate (the filler's kind of text).
constexpr const char* kSampleProse =
    "Tom found a red ball in the park. The quiet fox lived near the river. Lily felt happy and "
    "went to the market. The owl watched the blue lamp. Max and Anna talked about the brave "
    "bear. The small duck lived near the lake. Grace opened a green box in the garden. The deer "
    "carried the yellow cup. Ben felt curious and went to the hill. Zoe and Leo talked about the "
    "gentle goat. The frog painted the white boat. Sam visited a pink bell in the village.";

// An HTTP body's error message: OpenAI's {"error": {"message": ...}}, else the body itself.
std::string ErrorMessage(const httplib::Result& res) {
  if (!res) return "request failed: " + httplib::to_string(res.error());
  const json body = json::parse(res->body, nullptr, /*allow_exceptions=*/false);
  std::string message = res->body.substr(0, 300);
  if (body.is_object() && body.contains("error")) {
    const json& e = body["error"];
    if (e.is_object() && e.contains("message") && e["message"].is_string()) {
      message = e["message"].get<std::string>();
    } else if (e.is_string()) {
      message = e.get<std::string>();
    }
  }
  return "HTTP " + std::to_string(res->status) + ": " + message;
}

class RemoteBackend : public probe::ProbeBackend {
 public:
  RemoteBackend(const std::string& origin, std::string prefix, const RemoteOptions& options,
                std::string model)
      : client_(origin), origin_(origin), prefix_(std::move(prefix)), model_(std::move(model)) {
    client_.set_connection_timeout(10, 0);
    client_.set_read_timeout(options.timeout_s, 0);
    client_.set_write_timeout(options.timeout_s, 0);
    client_.set_keep_alive(true);
    if (!options.api_key.empty()) client_.set_bearer_token_auth(options.api_key);
  }

  // GET /v1/models: reachability, and the model id when none was given.
  Status Connect() {
    httplib::Result res = client_.Get(prefix_ + "/v1/models");
    if (!res) {
      return Error{"cannot reach " + origin_ + prefix_ + "/v1/models (" +
                   httplib::to_string(res.error()) + ")"};
    }
    if (res->status == 401 || res->status == 403) return Error{ErrorMessage(res)};
    if (res->status == 200 && model_.empty()) {
      const json body = json::parse(res->body, nullptr, false);
      if (body.is_object() && body.contains("data") && body["data"].is_array() &&
          !body["data"].empty() && body["data"][0].contains("id") &&
          body["data"][0]["id"].is_string()) {
        model_ = body["data"][0]["id"].get<std::string>();
      }
    }
    // Exact token counts where the server tokenizes (lamina serve, llama-server).
    exact_counts_ = RemoteTokenCount("Hello world").has_value();
    if (!exact_counts_) Calibrate();
    return Status::Ok();
  }

  const std::string& model() const { return model_; }

  probe::BackendInfo Info() const override {
    probe::BackendInfo info;
    info.logits = false;
    info.no_logits_reason =
        "needs teacher-forced logits, which an OpenAI-compatible chat API does not return";
    info.exact_token_counts = exact_counts_;
    return info;
  }

  int CountTokens(const std::string& text) override {
    if (!exact_counts_) return static_cast<int>(std::lround(text.size() * tokens_per_byte_));
    auto it = counts_.find(text);
    if (it != counts_.end()) return it->second;
    const std::optional<int> n = RemoteTokenCount(text);
    const int count = n ? *n : static_cast<int>(std::lround(text.size() * tokens_per_byte_));
    counts_.emplace(text, count);
    return count;
  }

  probe::Generation Generate(const probe::GenerationRequest& request) override {
    probe::Generation g;
    int prompt_tokens = 0;
    std::string finish;
    if (!Complete(request.user, request.max_tokens, request.grammar, request.thinking, &g,
                  &prompt_tokens, &finish)) {
      return g;
    }
    // The stop rule, as the local loop applies it after every token: cut at the shortest
    // prefix (whole UTF-8 characters) where it holds.
    bool stopped = false;
    if (request.stop) {
      for (size_t len = 1; len <= g.text.size(); ++len) {
        if (len < g.text.size() && (static_cast<unsigned char>(g.text[len]) & 0xC0) == 0x80) {
          continue;
        }
        if (request.stop(g.text.substr(0, len))) {
          stopped = true;
          if (len < g.text.size()) {
            g.text.resize(len);
            g.n_tokens = CountTokens(g.text);
          }
          break;
        }
      }
    }
    g.ended_turn = !stopped && finish == "stop";
    return g;
  }

 private:
  // POST /v1/chat/completions with one user turn; false with g->error set on failure. With
  // `thinking`, the template's enable_thinking is set and the thinking block is asked back in
  // the content as generated (reasoning_format "none").
  bool Complete(const std::string& user, int max_tokens, const std::string& grammar, bool thinking,
                probe::Generation* g, int* prompt_tokens, std::string* finish) {
    json body = {{"messages", json::array({{{"role", "user"}, {"content", user}}})},
                 {"temperature", 0},
                 {"max_tokens", max_tokens},
                 {"stream", false}};
    if (!grammar.empty()) body["grammar"] = grammar;  // llama-server's field
    if (thinking) {
      body["chat_template_kwargs"] = {{"enable_thinking", true}};
      body["reasoning_format"] = "none";
    }
    if (!model_.empty()) body["model"] = model_;
    httplib::Result res =
        client_.Post(prefix_ + "/v1/chat/completions", body.dump(), "application/json");
    if (!res || res->status != 200) {
      g->error = true;
      g->error_message = ErrorMessage(res);
      return false;
    }
    const json reply = json::parse(res->body, nullptr, false);
    if (!reply.is_object() || !reply.contains("choices") || !reply["choices"].is_array() ||
        reply["choices"].empty() || !reply["choices"][0].is_object()) {
      g->error = true;
      g->error_message = "the server's answer has no choices: " + res->body.substr(0, 300);
      return false;
    }
    const json& choice = reply["choices"][0];
    if (choice.contains("message") && choice["message"].is_object() &&
        choice["message"].contains("content") && choice["message"]["content"].is_string()) {
      g->text = choice["message"]["content"].get<std::string>();
    }
    if (choice.contains("finish_reason") && choice["finish_reason"].is_string()) {
      *finish = choice["finish_reason"].get<std::string>();
    }
    const json usage = reply.value("usage", json::object());
    if (usage.is_object() && usage.contains("completion_tokens") &&
        usage["completion_tokens"].is_number_integer()) {
      g->n_tokens = usage["completion_tokens"].get<int>();
    } else {
      g->n_tokens = CountTokens(g->text);
    }
    if (usage.is_object() && usage.contains("prompt_tokens") &&
        usage["prompt_tokens"].is_number_integer()) {
      *prompt_tokens = usage["prompt_tokens"].get<int>();
    }
    return true;
  }

  // POST /tokenize (llama-server's shape): plain text, no BOS, special-token text literal.
  std::optional<int> RemoteTokenCount(const std::string& text) {
    const json body = {{"content", text}, {"add_special", false}, {"parse_special", false}};
    httplib::Result res = client_.Post(prefix_ + "/tokenize", body.dump(), "application/json");
    if (!res || res->status != 200) return std::nullopt;
    const json reply = json::parse(res->body, nullptr, false);
    if (!reply.is_object() || !reply.contains("tokens") || !reply["tokens"].is_array()) {
      return std::nullopt;
    }
    return static_cast<int>(reply["tokens"].size());
  }

  // Tokens per byte of prose from two one-token completions' usage.prompt_tokens (the turn
  // with the prose against a turn with one word); a quarter when the server reports no usage.
  void Calibrate() {
    probe::Generation g;
    int with_prose = 0, without = 0;
    std::string finish;
    if (Complete(kSampleProse, 1, "", false, &g, &with_prose, &finish) &&
        Complete("Hello", 1, "", false, &g, &without, &finish) && with_prose > without) {
      tokens_per_byte_ = static_cast<double>(with_prose - without) /
                         (std::string(kSampleProse).size() - std::string("Hello").size());
    }
  }

  httplib::Client client_;
  std::string origin_;  // scheme://host:port
  std::string prefix_;  // path before /v1/... ("" or "/api")
  std::string model_;
  bool exact_counts_ = false;
  double tokens_per_byte_ = 0.25;
  std::unordered_map<std::string, int> counts_;  // /tokenize answers by text
};

}  // namespace

Result<RemoteServer> ConnectRemote(const RemoteOptions& options) {
  const std::string& url = options.url;
  const size_t scheme = url.find("://");
  if (scheme == std::string::npos ||
      (url.compare(0, scheme, "http") != 0 && url.compare(0, scheme, "https") != 0)) {
    return Error{"\"" + url + "\" is not an http:// or https:// URL"};
  }
  const size_t path = url.find('/', scheme + 3);
  const std::string origin = url.substr(0, path);
  std::string prefix = path == std::string::npos ? "" : url.substr(path);
  while (!prefix.empty() && prefix.back() == '/') prefix.pop_back();
  if (prefix.size() >= 3 && prefix.compare(prefix.size() - 3, 3, "/v1") == 0) {
    prefix.resize(prefix.size() - 3);
  }
  auto backend = std::make_unique<RemoteBackend>(origin, prefix, options, options.model);
  Status st = backend->Connect();
  if (!st.ok()) return st.error();
  RemoteServer server;
  server.model = backend->model();
  server.backend = std::move(backend);
  return server;
}

}  // namespace lamina::cli
