// Anthropic's Messages API and Ollama's API mapped onto the OpenAI chat path (see protocols.h).
#include "protocols.h"

#include <chrono>
#include <cstdio>
#include <ctime>
#include <random>

#include "json_limits.h"
#include "serve/tool_calls.h"

namespace lamina::cli::protocols {

namespace {

bool Fail(ApiError* err, const std::string& message) {
  *err = {400, "invalid_request_error", message};
  return false;
}

std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string RandomId(const char* prefix) {
  static constexpr char kAlnum[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  thread_local std::mt19937_64 rng(std::random_device{}());
  std::string id = prefix;
  for (int i = 0; i < 24; ++i) id += kAlnum[rng() % 62];
  return id;
}

// Generated arguments as a JSON object (an empty one when they do not parse).
json ArgumentsObject(const std::string& generated) {
  json parsed;
  std::string error;
  if (!ParseJsonBounded(generated, kMaxJsonDepth, &parsed, &error, "arguments") ||
      !parsed.is_object()) {
    return json::object();
  }
  return parsed;
}

std::string Trimmed(const std::string& text) {
  const size_t b = text.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  return text.substr(b, text.find_last_not_of(" \t\r\n") - b + 1);
}

// Streamed text with tool calls held back: what may start a call waits until the answer ends.
class HeldText {
 public:
  explicit HeldText(const AnswerInfo& info) : info_(info) {}
  // The part of `piece` (and of earlier pieces held back) that can go out now.
  std::string Add(const std::string& piece) {
    all_ += piece;
    const size_t safe = info_.parse_tool_calls ? serve::ToolCallSafePrefix(all_) : all_.size();
    if (safe <= sent_) return "";
    std::string out = all_.substr(sent_, safe - sent_);
    sent_ = safe;
    return out;
  }
  // At the end: the text not sent yet, and the tool calls.
  std::string Finish(std::vector<serve::ToolCall>* calls) {
    if (!info_.parse_tool_calls) return all_.substr(std::min(sent_, all_.size()));
    serve::ToolCallParse parsed = serve::ParseToolCalls(all_, info_.tool_names);
    *calls = std::move(parsed.calls);
    if (calls->empty()) return all_.substr(std::min(sent_, all_.size()));
    if (parsed.content.compare(0, sent_, all_, 0, sent_) != 0) return "";
    std::string rest = parsed.content.substr(std::min(sent_, parsed.content.size()));
    return Trimmed(rest).empty() ? "" : rest;
  }

 private:
  const AnswerInfo& info_;
  std::string all_;
  size_t sent_ = 0;
};

// The whole answer's content and calls.
std::string SplitCalls(const AnswerInfo& info, const std::string& text,
                       std::vector<serve::ToolCall>* calls) {
  if (!info.parse_tool_calls) return text;
  serve::ToolCallParse parsed = serve::ParseToolCalls(text, info.tool_names);
  if (parsed.calls.empty()) return text;
  *calls = std::move(parsed.calls);
  return Trimmed(parsed.content);
}

// ---- Anthropic ----

// A "system" string or array of text blocks; a tool_result's content likewise.
bool BlocksText(const json& v, const std::string& where, std::string* out, ApiError* err) {
  if (v.is_null()) return true;
  if (v.is_string()) {
    *out = v.get<std::string>();
    return true;
  }
  if (!v.is_array()) return Fail(err, where + " must be a string or an array of text blocks");
  for (const json& b : v) {
    auto type = b.is_object() ? b.find("type") : b.end();
    auto text = b.is_object() ? b.find("text") : b.end();
    if (type == b.end() || *type != "text" || text == b.end() || !text->is_string()) {
      return Fail(err, where + ": only text blocks are supported");
    }
    if (!out->empty()) out->push_back('\n');
    out->append(text->get_ref<const std::string&>());
  }
  return true;
}

// One Anthropic message → OpenAI messages (tool results become "tool" messages).
bool AnthropicMessage(const json& m, size_t i, json* messages, ApiError* err) {
  const std::string where = "messages[" + std::to_string(i) + "]";
  if (!m.is_object()) return Fail(err, where + " must be an object");
  auto role = m.find("role");
  if (role == m.end() || (*role != "user" && *role != "assistant")) {
    return Fail(err, where + ".role must be \"user\" or \"assistant\"");
  }
  auto content = m.find("content");
  if (content == m.end()) return Fail(err, where + ".content is missing");
  if (content->is_string()) {
    messages->push_back({{"role", *role}, {"content", *content}});
    return true;
  }
  if (!content->is_array()) return Fail(err, where + ".content must be a string or an array");
  std::string text;
  json calls = json::array();
  for (const json& b : *content) {
    const std::string type = b.is_object() && b.contains("type") && b["type"].is_string()
                                 ? b["type"].get<std::string>()
                                 : "";
    if (type == "text" && b.contains("text") && b["text"].is_string()) {
      text += b["text"].get<std::string>();
    } else if (type == "tool_use" && *role == "assistant" && b.contains("name")) {
      calls.push_back(
          {{"id", b.value("id", RandomId("toolu_"))},
           {"type", "function"},
           {"function", {{"name", b["name"]}, {"arguments", b.value("input", json::object())}}}});
    } else if (type == "tool_result" && *role == "user") {
      std::string result;
      if (!BlocksText(b.value("content", json("")), where + ".tool_result.content", &result, err))
        return false;
      if (b.value("is_error", false)) result = "Error: " + result;
      messages->push_back(
          {{"role", "tool"}, {"tool_call_id", b.value("tool_use_id", "")}, {"content", result}});
    } else if (type == "thinking" || type == "redacted_thinking") {
      continue;
    } else {
      return Fail(err, where + ".content: \"" + type +
                           "\" blocks are not supported (text, tool_use, tool_result)");
    }
  }
  if (!calls.empty()) {
    messages->push_back({{"role", "assistant"},
                         {"content", text.empty() ? json(nullptr) : json(text)},
                         {"tool_calls", calls}});
  } else if (!text.empty() || messages->empty() || messages->back()["role"] != "tool") {
    messages->push_back({{"role", *role}, {"content", text}});
  }
  return true;
}

bool AnthropicTools(const json& body, json* out, ApiError* err) {
  if (auto tools = body.find("tools"); tools != body.end() && !tools->is_null()) {
    if (!tools->is_array()) return Fail(err, "\"tools\" must be an array");
    json list = json::array();
    for (size_t k = 0; k < tools->size(); ++k) {
      const json& t = (*tools)[k];
      if (!t.is_object() || !t.contains("name") || !t["name"].is_string()) {
        return Fail(err, "tools[" + std::to_string(k) + "].name must be a string");
      }
      json fn = {{"name", t["name"]},
                 {"parameters", t.value("input_schema", json{{"type", "object"}})}};
      if (t.contains("description")) fn["description"] = t["description"];
      list.push_back({{"type", "function"}, {"function", std::move(fn)}});
    }
    (*out)["tools"] = std::move(list);
  }
  auto choice = body.find("tool_choice");
  if (choice == body.end() || choice->is_null()) return true;
  const std::string type =
      choice->is_object() && choice->contains("type") && (*choice)["type"].is_string()
          ? (*choice)["type"].get<std::string>()
          : "";
  if (type == "auto") {
    (*out)["tool_choice"] = "auto";
  } else if (type == "any") {
    (*out)["tool_choice"] = "required";
  } else if (type == "none") {
    (*out)["tool_choice"] = "none";
  } else if (type == "tool" && choice->contains("name")) {
    (*out)["tool_choice"] = {{"type", "function"}, {"function", {{"name", (*choice)["name"]}}}};
  } else {
    return Fail(err, "\"tool_choice.type\" must be \"auto\", \"any\", \"tool\" or \"none\"");
  }
  if (auto d = choice->find("disable_parallel_tool_use"); d != choice->end() && d->is_boolean()) {
    (*out)["parallel_tool_calls"] = !d->get<bool>();
  }
  return true;
}

// Ollama's options (and top-level fields of the same names) → the sampling fields.
bool OllamaOptions(const json& body, json* out, ApiError* err) {
  static const char* const kSame[] = {"temperature",
                                      "top_p",
                                      "top_k",
                                      "min_p",
                                      "typical_p",
                                      "seed",
                                      "repeat_penalty",
                                      "repeat_last_n",
                                      "presence_penalty",
                                      "frequency_penalty",
                                      "mirostat",
                                      "mirostat_tau",
                                      "mirostat_eta",
                                      "stop"};
  auto opts = body.find("options");
  if (opts == body.end() || opts->is_null()) return true;
  if (!opts->is_object()) return Fail(err, "\"options\" must be an object");
  for (const char* k : kSame) {
    if (auto it = opts->find(k); it != opts->end() && !it->is_null()) (*out)[k] = *it;
  }
  if (auto it = opts->find("num_predict"); it != opts->end() && !it->is_null())
    (*out)["n_predict"] = *it;
  if (auto it = opts->find("num_keep"); it != opts->end() && !it->is_null()) (*out)["n_keep"] = *it;
  return true;
}

// Ollama's "format": "json" or a JSON schema → response_format.
bool OllamaFormat(const json& body, json* out, ApiError* err) {
  auto f = body.find("format");
  if (f == body.end() || f->is_null() || (f->is_string() && f->get<std::string>().empty()))
    return true;
  if (f->is_string() && *f == "json") {
    (*out)["response_format"] = {{"type", "json_object"}};
  } else if (f->is_object()) {
    (*out)["response_format"] = {{"type", "json_schema"}, {"json_schema", {{"schema", *f}}}};
  } else {
    return Fail(err, "\"format\" must be \"json\" or a JSON schema object");
  }
  return true;
}

bool OllamaStream(const json& body, json* out, ApiError* err) {
  auto s = body.find("stream");
  if (s != body.end() && !s->is_null() && !s->is_boolean())
    return Fail(err, "\"stream\" must be a boolean");
  (*out)["stream"] = s == body.end() || s->is_null() ? true : s->get<bool>();
  return true;
}

}  // namespace

bool AnthropicToChat(const json& body, bool count_only, json* out, ApiError* err) {
  if (!body.is_object()) return Fail(err, "the body must be a JSON object");
  *out = json::object();
  if (!count_only) {
    auto mt = body.find("max_tokens");
    if (mt == body.end() || !mt->is_number_integer() || mt->get<long long>() < 1) {
      return Fail(err, "max_tokens: Field required (an integer of at least 1)");
    }
    (*out)["max_tokens"] = *mt;
  }
  json messages = json::array();
  std::string system;
  if (auto s = body.find("system"); s != body.end()) {
    if (!BlocksText(*s, "system", &system, err)) return false;
    if (!system.empty()) messages.push_back({{"role", "system"}, {"content", system}});
  }
  auto ms = body.find("messages");
  if (ms == body.end() || !ms->is_array()) return Fail(err, "messages: Field required (an array)");
  for (size_t i = 0; i < ms->size(); ++i) {
    if (!AnthropicMessage((*ms)[i], i, &messages, err)) return false;
  }
  (*out)["messages"] = std::move(messages);
  for (const char* k : {"temperature", "top_p", "top_k", "stream"}) {
    if (auto it = body.find(k); it != body.end()) (*out)[k] = *it;
  }
  if (auto it = body.find("stop_sequences"); it != body.end() && !it->is_null()) {
    (*out)["stop"] = *it;
  }
  return AnthropicTools(body, out, err);
}

bool OllamaChatToChat(const json& body, json* out, ApiError* err) {
  if (!body.is_object()) return Fail(err, "the body must be a JSON object");
  *out = json::object();
  auto ms = body.find("messages");
  if (ms == body.end() || !ms->is_array()) return Fail(err, "\"messages\" must be an array");
  json messages = json::array();
  for (size_t i = 0; i < ms->size(); ++i) {
    const json& m = (*ms)[i];
    if (!m.is_object()) return Fail(err, "messages[" + std::to_string(i) + "] must be an object");
    if (m.contains("images") && !m["images"].is_null() && !m["images"].empty()) {
      return Fail(err, "messages[" + std::to_string(i) + "].images: images are not supported");
    }
    json o = {{"role", m.value("role", json(nullptr))}, {"content", m.value("content", json(""))}};
    if (auto tc = m.find("tool_calls"); tc != m.end() && tc->is_array() && !tc->empty()) {
      o["tool_calls"] = *tc;
      for (json& c : o["tool_calls"]) {
        if (c.is_object() && !c.contains("type")) c["type"] = "function";
      }
    }
    if (auto n = m.find("tool_name"); n != m.end() && n->is_string()) o["name"] = *n;
    messages.push_back(std::move(o));
  }
  (*out)["messages"] = std::move(messages);
  if (auto t = body.find("tools"); t != body.end() && !t->is_null()) (*out)["tools"] = *t;
  return OllamaOptions(body, out, err) && OllamaFormat(body, out, err) &&
         OllamaStream(body, out, err);
}

bool OllamaGenerateToBody(const json& body, json* out, bool* raw, ApiError* err) {
  if (!body.is_object()) return Fail(err, "the body must be a JSON object");
  *out = json::object();
  auto p = body.find("prompt");
  if (p != body.end() && !p->is_null() && !p->is_string()) {
    return Fail(err, "\"prompt\" must be a string");
  }
  const std::string prompt = p != body.end() && p->is_string() ? p->get<std::string>() : "";
  if (body.contains("images") && !body["images"].is_null() && !body["images"].empty()) {
    return Fail(err, "\"images\": images are not supported");
  }
  *raw = body.value("raw", false) == true;
  if (*raw) {
    (*out)["prompt"] = prompt;
  } else {
    json messages = json::array();
    if (auto s = body.find("system"); s != body.end() && s->is_string() && !s->empty())
      messages.push_back({{"role", "system"}, {"content", *s}});
    messages.push_back({{"role", "user"}, {"content", prompt}});
    (*out)["messages"] = std::move(messages);
  }
  return OllamaOptions(body, out, err) && OllamaFormat(body, out, err) &&
         OllamaStream(body, out, err);
}

json AnthropicError(const ApiError& e) {
  std::string type = e.type;
  if (e.status == 401) type = "authentication_error";
  if (e.status == 403) type = "permission_error";
  if (e.status == 404) type = "not_found_error";
  if (e.status == 429) type = "rate_limit_error";
  if (e.status == 503) type = "overloaded_error";
  if (e.status >= 500 && e.status != 503) type = "api_error";
  if (e.status == 400) type = "invalid_request_error";
  return {{"type", "error"}, {"error", {{"type", type}, {"message", e.message}}}};
}

json OllamaError(const ApiError& e) { return {{"error", e.message}}; }

std::string OllamaTime(double t) {
  const std::time_t secs = static_cast<std::time_t>(t);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%04d-%02d-%02dT%02d:%02d:%02d.%06dZ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                static_cast<int>((t - static_cast<double>(secs)) * 1e6));
  return buf;
}

namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

class AnthropicFormatter : public Formatter {
 public:
  explicit AnthropicFormatter(AnswerInfo info)
      : info_(std::move(info)), held_(info_), id_(RandomId("msg_")) {}
  const char* stream_type() const override { return "text/event-stream"; }

  json Whole(const std::string& text, const serve::Event& done) override {
    std::vector<serve::ToolCall> calls;
    const std::string content = SplitCalls(info_, text, &calls);
    json blocks = json::array();
    if (!content.empty() || calls.empty()) blocks.push_back({{"type", "text"}, {"text", content}});
    for (const serve::ToolCall& c : calls) {
      blocks.push_back({{"type", "tool_use"},
                        {"id", RandomId("toolu_")},
                        {"name", c.name},
                        {"input", ArgumentsObject(c.arguments)}});
    }
    json msg = Message(std::move(blocks), StopReason(done, !calls.empty()));
    msg["stop_sequence"] = StopSequence(done);
    msg["usage"]["output_tokens"] = done.timings.predicted_n;
    return msg;
  }

  std::string Start() override {
    json msg = Message(json::array(), nullptr);
    return Event("message_start", {{"type", "message_start"}, {"message", msg}});
  }

  std::string Text(const std::string& piece) override { return TextDelta(held_.Add(piece)); }

  std::string Done(const serve::Event& done) override {
    std::vector<serve::ToolCall> calls;
    std::string out = TextDelta(held_.Finish(&calls));
    if (calls.empty() && !text_open_ && n_blocks_ == 0) out += TextDelta("", true);
    if (text_open_) out += BlockStop();
    for (const serve::ToolCall& c : calls) {
      out += BlockStart({{"type", "tool_use"},
                         {"id", RandomId("toolu_")},
                         {"name", c.name},
                         {"input", json::object()}});
      out += Event(
          "content_block_delta",
          {{"type", "content_block_delta"},
           {"index", n_blocks_},
           {"delta",
            {{"type", "input_json_delta"}, {"partial_json", Dump(ArgumentsObject(c.arguments))}}}});
      out += BlockStop();
    }
    out += Event("message_delta", {{"type", "message_delta"},
                                   {"delta",
                                    {{"stop_reason", StopReason(done, !calls.empty())},
                                     {"stop_sequence", StopSequence(done)}}},
                                   {"usage", {{"output_tokens", done.timings.predicted_n}}}});
    return out + Event("message_stop", {{"type", "message_stop"}});
  }

  json Error(const ApiError& e) const override { return AnthropicError(e); }
  std::string StreamError(const ApiError& e) const override {
    return Event("error", AnthropicError(e));
  }

 private:
  static std::string Event(const char* name, const json& data) {
    return std::string("event: ") + name + "\ndata: " + Dump(data) + "\n\n";
  }
  json Message(json content, json stop_reason) const {
    return {{"id", id_},
            {"type", "message"},
            {"role", "assistant"},
            {"model", info_.model},
            {"content", std::move(content)},
            {"stop_reason", std::move(stop_reason)},
            {"stop_sequence", nullptr},
            {"usage", {{"input_tokens", info_.prompt_tokens}, {"output_tokens", 0}}}};
  }
  static const char* StopReason(const serve::Event& done, bool tool_use) {
    if (tool_use) return "tool_use";
    switch (done.reason) {
      case lamina::StopReason::kLimit:
      case lamina::StopReason::kContextFull:
        return "max_tokens";
      case lamina::StopReason::kStopString:
        return "stop_sequence";
      default:
        return "end_turn";
    }
  }
  static json StopSequence(const serve::Event& done) {
    return done.reason == lamina::StopReason::kStopString ? json(done.stop_word) : json(nullptr);
  }
  // A text delta, opening the text block first; `force`: open it even for no text.
  std::string TextDelta(const std::string& text, bool force = false) {
    if (text.empty() && !force) return "";
    std::string out;
    if (!text_open_) {
      text_open_ = true;
      out = BlockStart({{"type", "text"}, {"text", ""}});
    }
    if (text.empty()) return out;
    return out +
           Event("content_block_delta", {{"type", "content_block_delta"},
                                         {"index", n_blocks_},
                                         {"delta", {{"type", "text_delta"}, {"text", text}}}});
  }
  // content_block_start; the first is followed by a ping, as Anthropic's streams have it.
  std::string BlockStart(json block) {
    std::string out = Event("content_block_start", {{"type", "content_block_start"},
                                                    {"index", n_blocks_},
                                                    {"content_block", std::move(block)}});
    if (!pinged_) out += Event("ping", {{"type", "ping"}});
    pinged_ = true;
    return out;
  }
  std::string BlockStop() {
    text_open_ = false;
    return Event("content_block_stop", {{"type", "content_block_stop"}, {"index", n_blocks_++}});
  }

  AnswerInfo info_;
  HeldText held_;
  std::string id_;
  bool text_open_ = false;
  bool pinged_ = false;
  int n_blocks_ = 0;
};

class OllamaFormatter : public Formatter {
 public:
  OllamaFormatter(AnswerInfo info, bool generate)
      : info_(std::move(info)), held_(info_), generate_(generate) {}
  const char* stream_type() const override { return "application/x-ndjson"; }

  json Whole(const std::string& text, const serve::Event& done) override {
    std::vector<serve::ToolCall> calls;
    const std::string content = generate_ ? text : SplitCalls(info_, text, &calls);
    json j = Piece(content, calls);
    Final(&j, done);
    return j;
  }
  std::string Start() override { return ""; }
  std::string Text(const std::string& piece) override {
    const std::string text = held_.Add(piece);
    if (text.empty()) return "";
    return Dump(Piece(text, {})) + "\n";
  }
  std::string Done(const serve::Event& done) override {
    std::vector<serve::ToolCall> calls;
    const std::string rest = held_.Finish(&calls);
    std::string out;
    if (!rest.empty() || !calls.empty()) out = Dump(Piece(rest, calls)) + "\n";
    json j = Piece("", {});
    Final(&j, done);
    return out + Dump(j) + "\n";
  }
  json Error(const ApiError& e) const override { return OllamaError(e); }
  std::string StreamError(const ApiError& e) const override { return Dump(OllamaError(e)) + "\n"; }

 private:
  json Piece(const std::string& text, const std::vector<serve::ToolCall>& calls) const {
    json j = {{"model", info_.model}, {"created_at", OllamaTime(Now())}};
    if (generate_) {
      j["response"] = text;
    } else {
      j["message"] = {{"role", "assistant"}, {"content", text}};
      if (!calls.empty()) {
        json list = json::array();
        for (const serve::ToolCall& c : calls) {
          list.push_back(
              {{"function", {{"name", c.name}, {"arguments", ArgumentsObject(c.arguments)}}}});
        }
        j["message"]["tool_calls"] = std::move(list);
      }
    }
    j["done"] = false;
    return j;
  }
  void Final(json* j, const serve::Event& done) const {
    const serve::Timings& t = done.timings;
    auto ns = [](double ms) { return static_cast<long long>(ms * 1e6); };
    (*j)["done"] = true;
    (*j)["done_reason"] = api::FinishReason(done.reason);
    (*j)["total_duration"] = ns(t.prompt_ms + t.predicted_ms);
    (*j)["load_duration"] = 0;
    (*j)["prompt_eval_count"] = info_.prompt_tokens;
    (*j)["prompt_eval_duration"] = ns(t.prompt_ms);
    (*j)["eval_count"] = t.predicted_n;
    (*j)["eval_duration"] = ns(t.predicted_ms);
  }

  AnswerInfo info_;
  HeldText held_;
  bool generate_;
};

}  // namespace

std::unique_ptr<Formatter> MakeAnthropicFormatter(AnswerInfo info) {
  return std::make_unique<AnthropicFormatter>(std::move(info));
}

std::unique_ptr<Formatter> MakeOllamaFormatter(AnswerInfo info, bool generate) {
  return std::make_unique<OllamaFormatter>(std::move(info), generate);
}

}  // namespace lamina::cli::protocols
