// `lamina chat` (an interactive loop over the model's chat template), the chat setup that
// `run --chat` shares, and the lookup of the shipped model used when no -m is given.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli_common.h"
#include "cli_spec.h"
#include "runtime/generate.h"
#include "runtime/session.h"
#include "runtime/session_file.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace lamina::cli {

namespace fs = std::filesystem;

namespace {

// models/lamina-*.gguf in `dir`; lamina-counter.gguf first, then by name.
std::string FindIn(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return "";
  std::vector<fs::path> found;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.starts_with("lamina-") && name.ends_with(".gguf") && entry.is_regular_file(ec)) {
      found.push_back(entry.path());
    }
  }
  if (found.empty()) return "";
  std::sort(found.begin(), found.end(), [](const fs::path& a, const fs::path& b) {
    const bool ac = a.filename() == "lamina-counter.gguf";
    const bool bc = b.filename() == "lamina-counter.gguf";
    if (ac != bc) return ac;
    return a < b;
  });
  return found.front().string();
}

// The turns of a conversation as a session file's payload.
std::string TurnsToJson(const std::vector<ChatMessage>& messages) {
  nlohmann::json j = nlohmann::json::array();
  for (const ChatMessage& m : messages) j.push_back({{"role", m.role}, {"content", m.content}});
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// The payload's turns; none when it is not what TurnsToJson writes (the cells still help).
std::vector<ChatMessage> TurnsFromJson(const std::string& text) {
  std::vector<ChatMessage> out;
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_array()) return out;
  for (const nlohmann::json& m : j) {
    if (!m.is_object() || !m.contains("role") || !m.contains("content") || !m["role"].is_string() ||
        !m["content"].is_string()) {
      return {};
    }
    out.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
  }
  return out;
}

fs::path ExecutableDir() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  return ec ? fs::path() : exe.parent_path();
}

}  // namespace

Result<ChatSetup> ChooseChatSetup(const Model& model, const ChatTemplateOptions& o) {
  const Tokenizer& tok = model.tokenizer();
  if (!o.file.empty()) {
    std::string source, error;
    if (!ReadTextFile(o.file, &source, &error)) return Error{"--chat-template-file " + error};
    Result<ChatSetup> setup = ChatSetupFromJinja(source, tok);
    if (!setup.ok()) return Error{o.file + ": " + setup.error().message};
    return setup;
  }
  if (!o.name.empty()) {
    if (o.name.find("{%") != std::string::npos || o.name.find("{{") != std::string::npos) {
      return ChatSetupFromJinja(o.name, tok);
    }
    return ChatSetupFromName(o.name, tok);
  }
  Result<std::string> tmpl = model.file().GetString("tokenizer.chat_template");
  if (!tmpl.ok()) {
    return Error{model.file().path() +
                 " has no tokenizer.chat_template (use --chat-template NAME or "
                 "--chat-template-file F, or run without --chat)"};
  }
  Result<ChatSetup> setup = ChatSetupForModel(*tmpl, tok, o.jinja);
  if (!setup.ok()) return Error{model.file().path() + ": " + setup.error().message};
  return setup;
}

bool ReadChatSetup(const Model& model, const ChatTemplateOptions& options, ChatSetup* out,
                   int* exit_code) {
  Result<ChatSetup> setup = ChooseChatSetup(model, options);
  if (!setup.ok()) {
    std::fprintf(stderr, "lamina: %s\n", setup.error().message.c_str());
    *exit_code = kExitBadInput;
    return false;
  }
  *out = std::move(*setup);
  return true;
}

std::string FindShippedModel() {
  const fs::path exe_dir = ExecutableDir();
  if (!exe_dir.empty()) {
    std::string p = FindIn(exe_dir / ".." / ".." / "models");
    if (!p.empty()) return fs::path(p).lexically_normal().string();
    p = FindIn(exe_dir / ".." / "models");
    if (!p.empty()) return fs::path(p).lexically_normal().string();
  }
  return FindIn("models");
}

bool ResolveModelPath(std::string* model_path) {
  if (!model_path->empty()) return true;
  *model_path = FindShippedModel();
  if (!model_path->empty()) return true;
  std::fprintf(stderr,
               "lamina: no model given and no shipped model found (models/lamina-*.gguf next to "
               "the build or in the current directory); pass one with -m MODEL.gguf\n");
  return false;
}

int RunChat(const ChatOptions& options) {
  const RunOptions& o = options.run;
  LoadedModel lm = LoadModelForCli(o.common);
  if (!lm.model) return kExitBadInput;
  const Model& model = *lm.model;
  ChatSetup setup;
  int rc = kExitOk;
  if (!ReadChatSetup(model, o.chat_template, &setup, &rc)) return rc;
  const Tokenizer& tok = model.tokenizer();
  ThreadPool pool(o.common.n_threads);
  SessionConfig sc;
  if (!MakeSessionConfig(o.common, model, &sc, &rc)) return rc;
  Session session(model, sc, pool);
  SpecSetup spec;
  if (!MakeSpecSetup(o.spec, o.common.model_path, model, session.n_ctx(), pool, &spec, &rc)) {
    return rc;
  }
  spec::SpecStats spec_stats;

  GenerateOptions go;
  go.params.sampler = MakeSamplerConfig(o);
  go.params.n_predict = o.n_predict;
  if (!MakeGrammar(o, &go.params.grammar, &rc)) return rc;

  const bool interactive = isatty(STDIN_FILENO) != 0;
  std::vector<ChatMessage> messages;
  if (!options.system.empty()) messages.push_back({"system", options.system});
  // --session FILE: the conversation so far (its cells, and its turns in the file's payload).
  const uint64_t model_hash = o.session.empty() ? 0 : ModelIdentityHash(model);
  if (!o.session.empty()) {
    std::string turns;
    if (!RestoreSessionForCli(o, session, model_hash, nullptr, &turns, &rc)) return rc;
    if (!turns.empty()) messages = TurnsFromJson(turns);
  }
  std::string line;
  while (true) {
    if (interactive) {
      std::fprintf(stderr, "> ");
      std::fflush(stderr);
    }
    if (!std::getline(std::cin, line)) break;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    messages.push_back({"user", line});

    Result<std::string> text = RenderChatPrompt(setup, messages, tok);
    if (!text.ok()) {
      std::fprintf(stderr, "lamina: %s\n", text.error().message.c_str());
      messages.pop_back();
      continue;
    }
    std::vector<int32_t> tokens = tok.Encode(*text, true, true);
    // Forget the oldest turns (keeping a system turn) while the conversation does not fit.
    while (static_cast<int>(tokens.size()) + 1 >= session.n_ctx() && messages.size() > 1) {
      const size_t first = messages[0].role == "system" ? 1 : 0;
      if (messages.size() - first <= 1) break;
      messages.erase(messages.begin() + static_cast<std::ptrdiff_t>(first));
      text = RenderChatPrompt(setup, messages, tok);
      if (!text.ok()) break;
      tokens = tok.Encode(*text, true, true);
    }
    if (static_cast<int>(tokens.size()) + 1 >= session.n_ctx()) {
      std::fprintf(stderr,
                   "lamina: this turn (%zu tokens) does not fit the context of %d (use -c)\n",
                   tokens.size(), session.n_ctx());
      messages.pop_back();
      continue;
    }
    // The cells the session shares with this conversation are reused; the rest is evaluated.
    Result<GenerateResult> r =
        GenerateWithSpec(session, tokens, go, spec, &spec_stats, [](const std::string& piece) {
          std::fwrite(piece.data(), 1, piece.size(), stdout);
          std::fflush(stdout);
          return true;
        });
    if (!r.ok()) {
      std::fprintf(stderr, "lamina: %s\n", r.error().message.c_str());
      return kExitFailure;
    }
    const std::string& answer = r->text;
    std::printf("\n");
    std::fflush(stdout);
    messages.push_back({"assistant", answer});
    if (!o.session.empty()) {
      std::vector<int32_t> history = tokens;
      history.insert(history.end(), r->tokens.begin(), r->tokens.end());
      if (!SaveSessionForCli(o, session, model_hash, history, TurnsToJson(messages), &rc)) {
        return rc;
      }
    }
  }
  if (spec.drafter) std::fprintf(stderr, "lamina: %s\n", SpecSummary(spec, spec_stats).c_str());
  return kExitOk;
}

}  // namespace lamina::cli
