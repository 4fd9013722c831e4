// Anthropic's Messages API, OpenAI's Responses API and Ollama's API mapped onto the OpenAI chat
// path (see protocols.h).
#include "protocols.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <random>

#include "chat/answer.h"
#include "chat/reasoning.h"
#include "chat/tool_calls.h"
#include "json_limits.h"

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
    const size_t safe = info_.parse_tool_calls ? chat::ToolCallSafePrefix(all_) : all_.size();
    if (safe <= sent_) return "";
    std::string out = all_.substr(sent_, safe - sent_);
    sent_ = safe;
    return out;
  }
  // At the end: the text not sent yet, and the tool calls.
  std::string Finish(std::vector<chat::ToolCall>* calls) {
    if (!info_.parse_tool_calls) return all_.substr(std::min(sent_, all_.size()));
    chat::ToolCallParse parsed = chat::ParseToolCalls(all_, info_.tool_names);
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
                       std::vector<chat::ToolCall>* calls) {
  if (!info.parse_tool_calls) return text;
  chat::ToolCallParse parsed = chat::ParseToolCalls(text, info.tool_names);
  if (parsed.calls.empty()) return text;
  *calls = std::move(parsed.calls);
  return Trimmed(parsed.content);
}

// The answer's format for chat/answer.h.
chat::AnswerFormat FormatOf(const AnswerInfo& info) {
  return {info.harmony, info.reasoning_format, info.thinking_at_start};
}

// Streamed answer text: reasoning apart (a thinking block, or harmony's analysis channel: the
// shared chat::AnswerSplitter), the content with tool calls held back (harmony's calls come whole
// from the splitter, kept for the end).
class AnswerText {
 public:
  explicit AnswerText(const AnswerInfo& info)
      : harmony_(info.harmony), splitter_(FormatOf(info)), held_(info) {}
  struct Parts {
    std::string reasoning, content;
  };
  // What of `piece` (and of earlier pieces held back) can go out now.
  Parts Add(const std::string& piece) { return Take(splitter_.Push(piece)); }
  // At the end: the rest, and the tool calls.
  Parts Finish(std::vector<chat::ToolCall>* calls) {
    Parts out = Take(splitter_.Flush());
    if (harmony_) {
      *calls = std::move(calls_);
    } else {
      out.content += held_.Finish(calls);
    }
    return out;
  }

 private:
  Parts Take(chat::AnswerParts p) {
    for (chat::ToolCall& c : p.calls) calls_.push_back(std::move(c));
    if (harmony_) return {std::move(p.reasoning), std::move(p.content)};
    return {std::move(p.reasoning), held_.Add(p.content)};
  }

  bool harmony_;
  chat::AnswerSplitter splitter_;
  HeldText held_;
  std::vector<chat::ToolCall> calls_;  // harmony's calls so far
};

// The whole answer's reasoning, content and calls.
AnswerText::Parts SplitAnswer(const AnswerInfo& info, const std::string& text,
                              std::vector<chat::ToolCall>* calls) {
  chat::AnswerParts p = chat::SplitAnswer(FormatOf(info), text);
  if (info.harmony) {
    *calls = std::move(p.calls);
    return {std::move(p.reasoning), std::move(p.content)};  // as streamed
  }
  return {std::move(p.reasoning), SplitCalls(info, p.content, calls)};
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

}  // namespace

ThinkingSigner::ThinkingSigner() {
  if (RAND_bytes(key_, sizeof key_) != 1) {
    std::random_device rd;  // OpenSSL's generator failed: the OS's
    for (unsigned char& b : key_) b = static_cast<unsigned char>(rd());
  }
}

std::string ThinkingSigner::Sign(const std::string& scope, const std::string& thinking) const {
  // The scope, a separator no scope contains, then the text.
  const std::string message = scope + '\x1f' + thinking;
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  HMAC(EVP_sha256(), key_, sizeof key_, reinterpret_cast<const unsigned char*>(message.data()),
       message.size(), mac, &n);
  unsigned char b64[4 * ((EVP_MAX_MD_SIZE + 2) / 3) + 1];
  const int len = EVP_EncodeBlock(b64, mac, static_cast<int>(n));
  return std::string(reinterpret_cast<const char*>(b64), static_cast<size_t>(len));
}

bool ThinkingSigner::Verify(const std::string& scope, const std::string& thinking,
                            const std::string& signature) const {
  const std::string expected = Sign(scope, thinking);
  return signature.size() == expected.size() &&
         CRYPTO_memcmp(signature.data(), expected.data(), expected.size()) == 0;
}

namespace {

// One Anthropic message → OpenAI messages (tool results become "tool" messages). An assistant
// turn's thinking blocks signed by `signer` for `scope` become its reasoning_content.
bool AnthropicMessage(const json& m, size_t i, json* messages, ApiError* err,
                      const ThinkingSigner* signer, const std::string& scope) {
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
  std::string reasoning;  // verified thinking
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
    } else if (type == "thinking") {
      auto th = b.find("thinking");
      auto sig = b.find("signature");
      if (*role == "assistant" && signer != nullptr && th != b.end() && th->is_string() &&
          sig != b.end() && sig->is_string() &&
          signer->Verify(scope, th->get<std::string>(), sig->get<std::string>())) {
        reasoning += th->get<std::string>();
      }
    } else if (type == "redacted_thinking") {
      continue;  // lamina writes none; another server's are opaque
    } else {
      return Fail(err, where + ".content: \"" + type +
                           "\" blocks are not supported (text, tool_use, tool_result)");
    }
  }
  if (!calls.empty()) {
    messages->push_back({{"role", "assistant"},
                         {"content", text.empty() ? json(nullptr) : json(text)},
                         {"tool_calls", calls}});
  } else if (!text.empty() || !reasoning.empty() || messages->empty() ||
             messages->back()["role"] != "tool") {
    messages->push_back({{"role", *role}, {"content", text}});
  }
  if (!reasoning.empty()) messages->back()["reasoning_content"] = reasoning;
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

// Ollama's "think": true / false turns the template's thinking on or off ("high", "medium",
// "low": on, as a reasoning_effort).
bool OllamaThink(const json& body, json* out, ApiError* err) {
  auto t = body.find("think");
  if (t == body.end() || t->is_null()) return true;
  if (t->is_boolean()) {
    (*out)["chat_template_kwargs"] = {{"enable_thinking", t->get<bool>()}};
    return true;
  }
  if (t->is_string() && (*t == "high" || *t == "medium" || *t == "low")) {
    (*out)["reasoning_effort"] = *t;
    return true;
  }
  return Fail(err, "\"think\" must be a boolean or \"high\", \"medium\", \"low\"");
}

bool OllamaStream(const json& body, json* out, ApiError* err) {
  auto s = body.find("stream");
  if (s != body.end() && !s->is_null() && !s->is_boolean())
    return Fail(err, "\"stream\" must be a boolean");
  (*out)["stream"] = s == body.end() || s->is_null() ? true : s->get<bool>();
  return true;
}

}  // namespace

// ---- OpenAI Responses ----

namespace {

// A message item's content: a string, or input_text / output_text / text parts.
bool ResponsesContent(const json& v, const std::string& where, std::string* out, ApiError* err) {
  if (v.is_string()) {
    *out = v.get<std::string>();
    return true;
  }
  if (!v.is_array()) return Fail(err, where + " must be a string or an array of parts");
  for (const json& part : v) {
    auto type = part.is_object() ? part.find("type") : part.end();
    auto text = part.is_object() ? part.find("text") : part.end();
    const bool textual = type != part.end() && type->is_string() &&
                         (*type == "input_text" || *type == "output_text" || *type == "text");
    if (!textual || text == part.end() || !text->is_string()) {
      return Fail(err, where + ": only input_text and output_text parts are supported");
    }
    if (!out->empty()) out->push_back('\n');
    out->append(text->get_ref<const std::string&>());
  }
  return true;
}

// A reasoning input item's text: its reasoning_text content parts, else its summary_text parts
// (joined by newlines; encrypted_content is not read).
bool ReasoningItemText(const json& item, const std::string& where, std::string* out,
                       ApiError* err) {
  for (const char* key : {"content", "summary"}) {
    auto parts = item.find(key);
    if (parts == item.end() || parts->is_null()) continue;
    if (!parts->is_array()) return Fail(err, where + "." + key + " must be an array");
    for (size_t k = 0; k < parts->size(); ++k) {
      const json& part = (*parts)[k];
      auto text = part.is_object() ? part.find("text") : part.end();
      if (!part.is_object() || text == part.end() || !text->is_string()) {
        return Fail(err, where + "." + key + "[" + std::to_string(k) + "].text must be a string");
      }
      if (!out->empty()) out->push_back('\n');
      out->append(text->get_ref<const std::string&>());
    }
    if (!out->empty()) return true;
  }
  return true;
}

// The input items → OpenAI chat messages (function calls → an assistant turn's tool_calls,
// their outputs → "tool" turns, a reasoning item → the reasoning_content of the assistant turn
// right after it).
bool ResponsesInput(const json& input, json* messages, ApiError* err) {
  if (input.is_string()) {
    messages->push_back({{"role", "user"}, {"content", input}});
    return true;
  }
  if (!input.is_array()) return Fail(err, "\"input\" must be a string or an array of items");
  std::string reasoning;  // of the reasoning item before the next assistant turn
  const auto add_turn = [&](json turn) {
    if (turn["role"] == "assistant" && !reasoning.empty()) turn["reasoning_content"] = reasoning;
    reasoning.clear();
    messages->push_back(std::move(turn));
  };
  for (size_t i = 0; i < input.size(); ++i) {
    const json& item = input[i];
    const std::string where = "input[" + std::to_string(i) + "]";
    if (!item.is_object()) return Fail(err, where + " must be an object");
    const std::string type = item.contains("type") && item["type"].is_string()
                                 ? item["type"].get<std::string>()
                                 : "message";
    if (type == "message") {
      auto role = item.find("role");
      static const char* const kRoles[] = {"user", "assistant", "system", "developer"};
      const bool known = role != item.end() && role->is_string() &&
                         std::any_of(std::begin(kRoles), std::end(kRoles),
                                     [&](const char* r) { return *role == r; });
      if (!known) {
        return Fail(err,
                    where + ".role must be \"user\", \"assistant\", \"system\" or \"developer\"");
      }
      std::string text;
      auto content = item.find("content");
      if (content == item.end()) return Fail(err, where + ".content is missing");
      if (!ResponsesContent(*content, where + ".content", &text, err)) return false;
      add_turn({{"role", *role == "developer" ? "system" : role->get<std::string>()},
                {"content", text}});
    } else if (type == "function_call") {
      for (const char* k : {"call_id", "name", "arguments"}) {
        if (!item.contains(k) || !item[k].is_string()) {
          return Fail(err, where + "." + k + " must be a string");
        }
      }
      json call = {{"id", item["call_id"]},
                   {"type", "function"},
                   {"function", {{"name", item["name"]}, {"arguments", item["arguments"]}}}};
      // Consecutive calls are one assistant turn.
      if (!messages->empty() && messages->back()["role"] == "assistant" &&
          messages->back().contains("tool_calls") && reasoning.empty()) {
        messages->back()["tool_calls"].push_back(std::move(call));
      } else {
        add_turn(
            {{"role", "assistant"}, {"content", nullptr}, {"tool_calls", json::array({call})}});
      }
    } else if (type == "function_call_output") {
      if (!item.contains("call_id") || !item["call_id"].is_string()) {
        return Fail(err, where + ".call_id must be a string");
      }
      std::string output;
      auto o = item.find("output");
      if (o == item.end()) return Fail(err, where + ".output is missing");
      if (!ResponsesContent(*o, where + ".output", &output, err)) return false;
      add_turn({{"role", "tool"}, {"tool_call_id", item["call_id"]}, {"content", output}});
    } else if (type == "reasoning") {
      reasoning.clear();
      if (!ReasoningItemText(item, where, &reasoning, err)) return false;
    } else {
      return Fail(err, where + ".type \"" + type +
                           "\" is not supported (message, function_call, "
                           "function_call_output, reasoning)");
    }
  }
  return true;
}

// Function tools → chat tools; tool_choice likewise.
bool ResponsesTools(const json& body, json* out, ApiError* err) {
  if (auto tools = body.find("tools"); tools != body.end() && !tools->is_null()) {
    if (!tools->is_array()) return Fail(err, "\"tools\" must be an array");
    json list = json::array();
    for (size_t k = 0; k < tools->size(); ++k) {
      const json& t = (*tools)[k];
      const std::string where = "tools[" + std::to_string(k) + "]";
      if (!t.is_object() || t.value("type", "") != "function") {
        return Fail(err, where + ": only function tools are supported");
      }
      if (!t.contains("name") || !t["name"].is_string()) {
        return Fail(err, where + ".name must be a string");
      }
      json fn = {{"name", t["name"]},
                 {"parameters", t.contains("parameters") && !t["parameters"].is_null()
                                    ? t["parameters"]
                                    : json{{"type", "object"}}}};
      if (t.contains("description")) fn["description"] = t["description"];
      list.push_back({{"type", "function"}, {"function", std::move(fn)}});
    }
    if (!list.empty()) (*out)["tools"] = std::move(list);
  }
  auto choice = body.find("tool_choice");
  if (choice == body.end() || choice->is_null()) return true;
  if (choice->is_string()) {
    if (*choice != "auto" && *choice != "none" && *choice != "required") {
      return Fail(err, "\"tool_choice\" must be \"auto\", \"none\", \"required\" or a function");
    }
    (*out)["tool_choice"] = *choice;
    return true;
  }
  if (!choice->is_object() || choice->value("type", "") != "function" ||
      !choice->contains("name") || !(*choice)["name"].is_string()) {
    return Fail(err, "\"tool_choice\" must be \"auto\", \"none\", \"required\" or a function");
  }
  (*out)["tool_choice"] = {{"type", "function"}, {"function", {{"name", (*choice)["name"]}}}};
  return true;
}

}  // namespace

bool ResponsesToChat(const json& body, json* out, json* echo, ApiError* err) {
  if (!body.is_object()) return Fail(err, "the body must be a JSON object");
  if (auto prev = body.find("previous_response_id"); prev != body.end() && !prev->is_null()) {
    return Fail(err,
                "\"previous_response_id\" is not supported: lamina keeps no responses; send the "
                "conversation as input items");
  }
  *out = json::object();
  json messages = json::array();
  if (auto ins = body.find("instructions"); ins != body.end() && !ins->is_null()) {
    if (!ins->is_string()) return Fail(err, "\"instructions\" must be a string");
    messages.push_back({{"role", "system"}, {"content", *ins}});
  }
  auto input = body.find("input");
  if (input == body.end()) return Fail(err, "\"input\" is missing");
  if (!ResponsesInput(*input, &messages, err)) return false;
  if (messages.empty()) return Fail(err, "\"input\" is empty");
  (*out)["messages"] = std::move(messages);
  for (const char* k : {"temperature", "top_p", "stream", "parallel_tool_calls", "seed"}) {
    if (auto it = body.find(k); it != body.end()) (*out)[k] = *it;
  }
  if (auto it = body.find("max_output_tokens"); it != body.end()) (*out)["max_tokens"] = *it;
  if (auto r = body.find("reasoning"); r != body.end() && r->is_object()) {
    if (auto e = r->find("effort"); e != r->end() && !e->is_null()) (*out)["reasoning_effort"] = *e;
  }
  // text.format: {"type": "text" | "json_object" | "json_schema", "schema", "name"}.
  if (auto text = body.find("text"); text != body.end() && text->is_object()) {
    if (auto f = text->find("format"); f != text->end() && f->is_object()) {
      const std::string type = f->value("type", "");
      if (type == "json_schema") {
        (*out)["response_format"] = {
            {"type", "json_schema"},
            {"json_schema", {{"schema", f->contains("schema") ? (*f)["schema"] : json()}}}};
      } else if (type == "json_object" || type == "text") {
        (*out)["response_format"] = {{"type", type}};
      } else {
        return Fail(err,
                    "\"text.format.type\" must be \"text\", \"json_object\" or \"json_schema\"");
      }
    }
  }
  if (!ResponsesTools(body, out, err)) return false;
  *echo = {{"instructions", body.value("instructions", json())},
           {"temperature", body.value("temperature", json())},
           {"top_p", body.value("top_p", json())},
           {"max_output_tokens", body.value("max_output_tokens", json())},
           {"tool_choice", body.value("tool_choice", json("auto"))},
           {"tools", body.value("tools", json::array())},
           {"parallel_tool_calls", body.value("parallel_tool_calls", json(false))},
           {"text", body.value("text", json{{"format", {{"type", "text"}}}})},
           {"metadata", body.value("metadata", json::object())}};
  return true;
}

bool AnthropicToChat(const json& body, bool count_only, json* out, ApiError* err,
                     const ThinkingSigner* signer, const std::string& scope) {
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
    if (!AnthropicMessage((*ms)[i], i, &messages, err, signer, scope)) return false;
  }
  (*out)["messages"] = std::move(messages);
  for (const char* k : {"temperature", "top_p", "top_k", "stream"}) {
    if (auto it = body.find(k); it != body.end()) (*out)[k] = *it;
  }
  if (auto it = body.find("stop_sequences"); it != body.end() && !it->is_null()) {
    (*out)["stop"] = *it;
  }
  // thinking: {"type": "enabled", "budget_tokens": N} or {"type": "disabled"}.
  if (auto t = body.find("thinking"); t != body.end() && !t->is_null()) {
    const std::string type = t->is_object() ? t->value("type", "") : "";
    if (type == "enabled") {
      (*out)["chat_template_kwargs"] = {{"enable_thinking", true}};
      if (auto b = t->find("budget_tokens"); b != t->end() && !b->is_null()) {
        (*out)["reasoning_budget_tokens"] = *b;
      }
    } else if (type == "disabled") {
      (*out)["chat_template_kwargs"] = {{"enable_thinking", false}};
    } else {
      return Fail(err, "thinking.type must be \"enabled\" or \"disabled\"");
    }
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
         OllamaStream(body, out, err) && OllamaThink(body, out, err);
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
         OllamaStream(body, out, err) && (*raw || OllamaThink(body, out, err));
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
  // Thinking comes back as a "thinking" block before the text, signed for the tenant
  // (ThinkingSigner): sent back unchanged in a later turn, it is used as that turn's thinking.
  const char* stream_type() const override { return "text/event-stream"; }

  json Whole(const std::string& text, const serve::Event& done) override {
    std::vector<chat::ToolCall> calls;
    const AnswerText::Parts parts = SplitAnswer(info_, text, &calls);
    const std::string& content = parts.content;
    json blocks = json::array();
    if (!parts.reasoning.empty()) {
      blocks.push_back({{"type", "thinking"},
                        {"thinking", parts.reasoning},
                        {"signature", Signature(parts.reasoning)}});
    }
    if (!content.empty() || calls.empty()) blocks.push_back({{"type", "text"}, {"text", content}});
    for (const chat::ToolCall& c : calls) {
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

  std::string Text(const std::string& piece) override {
    const AnswerText::Parts parts = held_.Add(piece);
    return ThinkingDelta(parts.reasoning) + TextDelta(parts.content);
  }

  std::string Done(const serve::Event& done) override {
    std::vector<chat::ToolCall> calls;
    const AnswerText::Parts parts = held_.Finish(&calls);
    std::string out = ThinkingDelta(parts.reasoning) + TextDelta(parts.content);
    if (thinking_open_) out += ThinkingStop();
    if (calls.empty() && !text_open_ && !text_sent_) out += TextDelta("", true);
    if (text_open_) out += BlockStop();
    for (const chat::ToolCall& c : calls) {
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
  std::string Signature(const std::string& thinking) const {
    return info_.signer != nullptr ? info_.signer->Sign(info_.scope, thinking) : std::string();
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
  // A thinking delta, opening the thinking block first.
  std::string ThinkingDelta(const std::string& text) {
    if (text.empty()) return "";
    std::string out;
    if (!thinking_open_) {
      thinking_open_ = true;
      out = BlockStart({{"type", "thinking"}, {"thinking", ""}, {"signature", ""}});
    }
    thinking_ += text;
    return out + Event("content_block_delta",
                       {{"type", "content_block_delta"},
                        {"index", n_blocks_},
                        {"delta", {{"type", "thinking_delta"}, {"thinking", text}}}});
  }
  // The block's signature, over all its thinking deltas, as Anthropic sends it: last.
  std::string ThinkingStop() {
    thinking_open_ = false;
    std::string out =
        Event("content_block_delta",
              {{"type", "content_block_delta"},
               {"index", n_blocks_},
               {"delta", {{"type", "signature_delta"}, {"signature", Signature(thinking_)}}}});
    thinking_.clear();
    out += BlockStop();  // after: it moves n_blocks_ on
    return out;
  }
  // A text delta, opening the text block first (after closing a thinking block); `force`: open
  // it even for no text.
  std::string TextDelta(const std::string& text, bool force = false) {
    if (text.empty() && !force) return "";
    std::string out;
    if (thinking_open_) out += ThinkingStop();
    if (!text_open_) {
      text_open_ = true;
      text_sent_ = true;
      out += BlockStart({{"type", "text"}, {"text", ""}});
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
  AnswerText held_;
  std::string id_;
  bool thinking_open_ = false;
  std::string thinking_;  // the open thinking block's text so far
  bool text_open_ = false;
  bool text_sent_ = false;  // a text block was opened
  bool pinged_ = false;
  int n_blocks_ = 0;
};

class OllamaFormatter : public Formatter {
 public:
  // Thinking comes back as Ollama's "thinking" (message.thinking in /api/chat).
  OllamaFormatter(AnswerInfo info, bool generate)
      : info_(std::move(info)), held_(info_), generate_(generate) {}
  const char* stream_type() const override { return "application/x-ndjson"; }

  json Whole(const std::string& text, const serve::Event& done) override {
    std::vector<chat::ToolCall> calls;
    const AnswerText::Parts parts = SplitAnswer(info_, text, &calls);
    json j = Piece(parts.content, calls, parts.reasoning);
    Final(&j, done);
    return j;
  }
  std::string Start() override { return ""; }
  std::string Text(const std::string& piece) override {
    const AnswerText::Parts parts = held_.Add(piece);
    if (parts.content.empty() && parts.reasoning.empty()) return "";
    return Dump(Piece(parts.content, {}, parts.reasoning)) + "\n";
  }
  std::string Done(const serve::Event& done) override {
    std::vector<chat::ToolCall> calls;
    const AnswerText::Parts parts = held_.Finish(&calls);
    std::string out;
    if (!parts.content.empty() || !parts.reasoning.empty() || !calls.empty()) {
      out = Dump(Piece(parts.content, calls, parts.reasoning)) + "\n";
    }
    json j = Piece("", {});
    Final(&j, done);
    return out + Dump(j) + "\n";
  }
  json Error(const ApiError& e) const override { return OllamaError(e); }
  std::string StreamError(const ApiError& e) const override { return Dump(OllamaError(e)) + "\n"; }

 private:
  json Piece(const std::string& text, const std::vector<chat::ToolCall>& calls,
             const std::string& thinking = "") const {
    json j = {{"model", info_.model}, {"created_at", OllamaTime(Now())}};
    if (generate_) {
      j["response"] = text;
      if (!thinking.empty()) j["thinking"] = thinking;
    } else {
      j["message"] = {{"role", "assistant"}, {"content", text}};
      if (!thinking.empty()) j["message"]["thinking"] = thinking;
      if (!calls.empty()) {
        json list = json::array();
        for (const chat::ToolCall& c : calls) {
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
  AnswerText held_;
  bool generate_;
};

// OpenAI's Responses API: a response object with output items (a reasoning item when the
// answer thought, a message with one output_text part, function calls), or a stream of typed
// events with sequence numbers.
class ResponsesFormatter : public Formatter {
 public:
  ResponsesFormatter(AnswerInfo info, json echo)
      : info_(std::move(info)),
        echo_(std::move(echo)),
        text_(info_),
        id_(RandomId("resp_")),
        created_(static_cast<long long>(Now())) {}
  const char* stream_type() const override { return "text/event-stream"; }

  json Whole(const std::string& text, const serve::Event& done) override {
    std::vector<chat::ToolCall> calls;
    const AnswerText::Parts parts = SplitAnswer(info_, text, &calls);
    json output = json::array();
    if (!parts.reasoning.empty()) output.push_back(ReasoningItem(RandomId("rs_"), parts.reasoning));
    if (!parts.content.empty() || calls.empty()) {
      output.push_back(MessageItem(RandomId("msg_"), parts.content, "completed"));
    }
    for (const chat::ToolCall& c : calls) output.push_back(CallItem(c));
    return Response(Status(done), std::move(output), &done);
  }

  std::string Start() override {
    json r = Response("in_progress", json::array(), nullptr);
    // One statement per event: the order of a + b's operands is unspecified, their numbers not.
    std::string out = Event("response.created", {{"response", r}});
    out += Event("response.in_progress", {{"response", r}});
    return out;
  }

  std::string Text(const std::string& piece) override { return Parts(text_.Add(piece)); }

  std::string Done(const serve::Event& done) override {
    std::vector<chat::ToolCall> calls;
    std::string out = Parts(text_.Finish(&calls));
    out += CloseReasoning();
    if (!message_open_ && calls.empty()) out += OpenMessage();
    out += CloseMessage();
    for (const chat::ToolCall& c : calls) {
      const json item = CallItem(c);
      const int index = n_items_++;
      json added = item;
      added["arguments"] = "";
      added["status"] = "in_progress";
      out += Event("response.output_item.added", {{"output_index", index}, {"item", added}});
      out += Event("response.function_call_arguments.delta",
                   {{"item_id", item["id"]}, {"output_index", index}, {"delta", c.arguments}});
      out += Event("response.function_call_arguments.done",
                   {{"item_id", item["id"]}, {"output_index", index}, {"arguments", c.arguments}});
      out += Event("response.output_item.done", {{"output_index", index}, {"item", item}});
      output_.push_back(item);
    }
    out += Event("response.completed", {{"response", Response(Status(done), output_, &done)}});
    return out;
  }

  json Error(const ApiError& e) const override {
    return {{"error",
             {{"message", e.message}, {"type", e.type}, {"param", nullptr}, {"code", e.status}}}};
  }
  std::string StreamError(const ApiError& e) const override {
    return Event("error", {{"code", e.type}, {"message", e.message}, {"param", nullptr}});
  }

 private:
  std::string Event(const char* type, json data) const {
    data["type"] = type;
    data["sequence_number"] = sequence_++;
    return std::string("event: ") + type + "\ndata: " + Dump(data) + "\n\n";
  }
  static const char* Status(const serve::Event& done) {
    return done.reason == lamina::StopReason::kLimit ||
                   done.reason == lamina::StopReason::kContextFull
               ? "incomplete"
               : "completed";
  }
  json Response(const char* status, json output, const serve::Event* done) const {
    json r = {{"id", id_},
              {"object", "response"},
              {"created_at", created_},
              {"status", status},
              {"model", info_.model},
              {"output", std::move(output)},
              {"error", nullptr},
              {"incomplete_details", nullptr},
              {"previous_response_id", nullptr},
              {"store", false},
              {"usage", nullptr}};
    for (const auto& [k, v] : echo_.items()) r[k] = v;
    if (std::string(status) == "incomplete") {
      r["incomplete_details"] = {{"reason", "max_output_tokens"}};
    }
    if (done != nullptr) {
      const int out_tokens = done->timings.predicted_n;
      r["usage"] = {{"input_tokens", info_.prompt_tokens},
                    {"input_tokens_details", {{"cached_tokens", done->timings.cache_n}}},
                    {"output_tokens", out_tokens},
                    {"output_tokens_details", {{"reasoning_tokens", 0}}},
                    {"total_tokens", info_.prompt_tokens + out_tokens}};
    }
    return r;
  }
  static json MessageItem(const std::string& id, const std::string& text, const char* status) {
    return {{"type", "message"},
            {"id", id},
            {"status", status},
            {"role", "assistant"},
            {"content", json::array({OutputText(text)})}};
  }
  static json OutputText(const std::string& text) {
    return {{"type", "output_text"}, {"text", text}, {"annotations", json::array()}};
  }
  static json ReasoningItem(const std::string& id, const std::string& text) {
    return {{"type", "reasoning"},
            {"id", id},
            {"summary", json::array()},
            {"content", json::array({{{"type", "reasoning_text"}, {"text", text}}})}};
  }
  static json CallItem(const chat::ToolCall& c) {
    return {{"type", "function_call"}, {"id", RandomId("fc_")},    {"call_id", RandomId("call_")},
            {"name", c.name},          {"arguments", c.arguments}, {"status", "completed"}};
  }
  // Streamed parts: reasoning text into the reasoning item, content into the message's part.
  std::string Parts(const AnswerText::Parts& p) {
    std::string out;
    if (!p.reasoning.empty()) {
      if (reasoning_id_.empty()) {
        reasoning_id_ = RandomId("rs_");
        reasoning_index_ = n_items_++;
        json item = ReasoningItem(reasoning_id_, "");
        item["content"] = json::array();
        out += Event("response.output_item.added",
                     {{"output_index", reasoning_index_}, {"item", item}});
      }
      reasoning_ += p.reasoning;
      out += Event("response.reasoning_text.delta", {{"item_id", reasoning_id_},
                                                     {"output_index", reasoning_index_},
                                                     {"content_index", 0},
                                                     {"delta", p.reasoning}});
    }
    if (!p.content.empty()) {
      out += CloseReasoning();
      if (!message_open_) out += OpenMessage();
      content_ += p.content;
      out += Event("response.output_text.delta", {{"item_id", message_id_},
                                                  {"output_index", message_index_},
                                                  {"content_index", 0},
                                                  {"delta", p.content},
                                                  {"logprobs", json::array()}});
    }
    return out;
  }
  std::string CloseReasoning() {
    if (reasoning_id_.empty() || reasoning_closed_) return "";
    reasoning_closed_ = true;
    const json item = ReasoningItem(reasoning_id_, reasoning_);
    output_.push_back(item);
    std::string out = Event("response.reasoning_text.done", {{"item_id", reasoning_id_},
                                                             {"output_index", reasoning_index_},
                                                             {"content_index", 0},
                                                             {"text", reasoning_}});
    out += Event("response.output_item.done", {{"output_index", reasoning_index_}, {"item", item}});
    return out;
  }
  std::string OpenMessage() {
    message_open_ = true;
    message_id_ = RandomId("msg_");
    message_index_ = n_items_++;
    json item = MessageItem(message_id_, "", "in_progress");
    item["content"] = json::array();
    std::string out =
        Event("response.output_item.added", {{"output_index", message_index_}, {"item", item}});
    out += Event("response.content_part.added", {{"item_id", message_id_},
                                                 {"output_index", message_index_},
                                                 {"content_index", 0},
                                                 {"part", OutputText("")}});
    return out;
  }
  std::string CloseMessage() {
    if (!message_open_) return "";
    message_open_ = false;
    const json item = MessageItem(message_id_, content_, "completed");
    output_.push_back(item);
    std::string out = Event("response.output_text.done", {{"item_id", message_id_},
                                                          {"output_index", message_index_},
                                                          {"content_index", 0},
                                                          {"text", content_},
                                                          {"logprobs", json::array()}});
    out += Event("response.content_part.done", {{"item_id", message_id_},
                                                {"output_index", message_index_},
                                                {"content_index", 0},
                                                {"part", OutputText(content_)}});
    out += Event("response.output_item.done", {{"output_index", message_index_}, {"item", item}});
    return out;
  }

  AnswerInfo info_;
  json echo_;
  AnswerText text_;
  std::string id_;
  long long created_;
  mutable int sequence_ = 0;  // the stream's events, numbered (StreamError too)
  int n_items_ = 0;
  json output_ = json::array();  // the items done so far, for response.completed
  std::string reasoning_id_, reasoning_;
  int reasoning_index_ = 0;
  bool reasoning_closed_ = false;
  std::string message_id_, content_;
  int message_index_ = 0;
  bool message_open_ = false;
};

}  // namespace

std::unique_ptr<Formatter> MakeAnthropicFormatter(AnswerInfo info) {
  return std::make_unique<AnthropicFormatter>(std::move(info));
}

std::unique_ptr<Formatter> MakeResponsesFormatter(AnswerInfo info, json echo) {
  return std::make_unique<ResponsesFormatter>(std::move(info), std::move(echo));
}

std::unique_ptr<Formatter> MakeOllamaFormatter(AnswerInfo info, bool generate) {
  return std::make_unique<OllamaFormatter>(std::move(info), generate);
}

}  // namespace lamina::cli::protocols
