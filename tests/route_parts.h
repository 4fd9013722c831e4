// The parts of a chat answer (reasoning, content, tool calls) as each protocol route writes them,
// read back from a whole JSON answer or from its stream (Anthropic and Responses SSE, Ollama
// NDJSON), so that tests can check every route maps an answer alike, streamed or not.
#pragma once

#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace lamina::testing_util {

enum class RouteKind { kAnthropic, kResponses, kOllamaChat, kOllamaGenerate };

struct RouteParts {
  std::string reasoning, content;
  std::vector<std::pair<std::string, std::string>> calls;  // name, arguments (JSON, compact)
  bool operator==(const RouteParts&) const = default;
};

inline std::string DumpParts(const RouteParts& p) {
  std::string s = "reasoning=" + nlohmann::json(p.reasoning).dump() +
                  " content=" + nlohmann::json(p.content).dump();
  for (const auto& [n, a] : p.calls) s += " call=" + n + a;
  return s;
}

// Arguments as compact JSON (a string holding JSON is parsed first).
inline std::string CompactArgs(const nlohmann::json& a) {
  if (a.is_string()) {
    return nlohmann::json::parse(a.get<std::string>(), nullptr, false).dump();
  }
  return a.dump();
}

// The `data:` lines of an SSE body, parsed; or the lines of an NDJSON body.
inline std::vector<nlohmann::json> JsonLines(const std::string& body) {
  std::vector<nlohmann::json> out;
  std::istringstream in(body);
  std::string line;
  while (std::getline(in, line)) {
    if (line.starts_with("data: ")) line = line.substr(6);
    if (line.empty() || line[0] != '{') continue;
    out.push_back(nlohmann::json::parse(line, nullptr, false));
  }
  return out;
}

inline void AddOllama(RouteKind k, const nlohmann::json& j, RouteParts* p) {
  if (k == RouteKind::kOllamaGenerate) {
    p->reasoning += j.value("thinking", "");
    p->content += j.value("response", "");
    return;
  }
  const nlohmann::json& m = j["message"];
  p->reasoning += m.value("thinking", "");
  p->content += m.value("content", "");
  if (m.contains("tool_calls")) {
    for (const nlohmann::json& c : m["tool_calls"]) {
      p->calls.emplace_back(c["function"]["name"], CompactArgs(c["function"]["arguments"]));
    }
  }
}

inline RouteParts WholeParts(RouteKind k, const nlohmann::json& j) {
  RouteParts p;
  if (k == RouteKind::kAnthropic) {
    for (const nlohmann::json& b : j["content"]) {
      if (b["type"] == "thinking") p.reasoning += b["thinking"].get<std::string>();
      if (b["type"] == "text") p.content += b["text"].get<std::string>();
      if (b["type"] == "tool_use") p.calls.emplace_back(b["name"], CompactArgs(b["input"]));
    }
  } else if (k == RouteKind::kResponses) {
    for (const nlohmann::json& item : j["output"]) {
      if (item["type"] == "reasoning") p.reasoning += item["content"][0]["text"].get<std::string>();
      if (item["type"] == "message") p.content += item["content"][0]["text"].get<std::string>();
      if (item["type"] == "function_call") {
        p.calls.emplace_back(item["name"], CompactArgs(item["arguments"]));
      }
    }
  } else {
    AddOllama(k, j, &p);
  }
  return p;
}

inline RouteParts StreamParts(RouteKind k, const std::string& body) {
  RouteParts p;
  std::string args;  // Anthropic: the open tool_use block's arguments
  for (const nlohmann::json& e : JsonLines(body)) {
    if (k == RouteKind::kAnthropic) {
      const std::string type = e.value("type", "");
      if (type == "content_block_start" && e["content_block"]["type"] == "tool_use") {
        p.calls.emplace_back(e["content_block"]["name"], "");
        args.clear();
      } else if (type == "content_block_delta") {
        const nlohmann::json& d = e["delta"];
        if (d["type"] == "thinking_delta") p.reasoning += d["thinking"].get<std::string>();
        if (d["type"] == "text_delta") p.content += d["text"].get<std::string>();
        if (d["type"] == "input_json_delta") {
          args += d["partial_json"].get<std::string>();
          p.calls.back().second = CompactArgs(args);
        }
      }
    } else if (k == RouteKind::kResponses) {
      const std::string type = e.value("type", "");
      if (type == "response.reasoning_text.delta") p.reasoning += e["delta"].get<std::string>();
      if (type == "response.output_text.delta") p.content += e["delta"].get<std::string>();
      if (type == "response.output_item.done" && e["item"]["type"] == "function_call") {
        p.calls.emplace_back(e["item"]["name"], CompactArgs(e["item"]["arguments"]));
      }
    } else {
      AddOllama(k, e, &p);
    }
  }
  return p;
}

// Whether any part shows harmony's markers.
inline bool ShowsMarkers(const RouteParts& p) {
  auto has = [](const std::string& s) { return s.find("<|") != std::string::npos; };
  bool any = has(p.reasoning) || has(p.content);
  for (const auto& c : p.calls) any = any || has(c.first) || has(c.second);
  return any;
}

}  // namespace lamina::testing_util
