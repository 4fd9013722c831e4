// `lamina chat` (an interactive loop over the model's chat template, with /commands), the chat
// setup that `run --chat` shares, and the lookup of the shipped model used when no -m is given.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "chat/chat_template.h"
#include "chat/reasoning.h"
#include "cli_chat_input.h"
#include "cli_common.h"
#include "cli_spec.h"
#include "runtime/generate.h"
#include "runtime/session.h"
#include "runtime/session_file.h"
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
std::string TurnsToJson(const std::vector<chat::ChatMessage>& messages) {
  nlohmann::json j = nlohmann::json::array();
  for (const chat::ChatMessage& m : messages) {
    j.push_back({{"role", m.role}, {"content", m.content}});
  }
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// The payload's turns; none when it is not what TurnsToJson writes (the cells still help).
std::vector<chat::ChatMessage> TurnsFromJson(const std::string& text) {
  std::vector<chat::ChatMessage> out;
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

Result<chat::ChatSetup> ChooseChatSetup(const Model& model, const ChatTemplateOptions& o) {
  const Tokenizer& tok = model.tokenizer();
  if (!o.file.empty()) {
    std::string source, error;
    if (!ReadTextFile(o.file, &source, &error)) return Error{"--chat-template-file " + error};
    Result<chat::ChatSetup> setup = chat::ChatSetupFromJinja(source, tok);
    if (!setup.ok()) return Error{o.file + ": " + setup.error().message};
    return setup;
  }
  if (!o.name.empty()) {
    // As llama-server, a value that is not a name is a Jinja source: one with Jinja tags or
    // with white space. A single word must be a built-in name (a typo is an error, not a
    // template that prints the word).
    if (o.name.find("{%") != std::string::npos || o.name.find("{{") != std::string::npos ||
        o.name.find_first_of(" \t\n\r") != std::string::npos) {
      return chat::ChatSetupFromJinja(o.name, tok);
    }
    return chat::ChatSetupFromName(o.name, tok);
  }
  Result<std::string> tmpl = model.file().GetString("tokenizer.chat_template");
  if (!tmpl.ok()) {
    return Error{model.file().path() +
                 " has no tokenizer.chat_template (use --chat-template NAME or "
                 "--chat-template-file F, or run without --chat)"};
  }
  Result<chat::ChatSetup> setup = chat::ChatSetupForModel(*tmpl, tok, o.jinja);
  if (!setup.ok()) return Error{model.file().path() + ": " + setup.error().message};
  return setup;
}

bool ReadChatSetup(const Model& model, const ChatTemplateOptions& options, chat::ChatSetup* out,
                   int* exit_code) {
  Result<chat::ChatSetup> setup = ChooseChatSetup(model, options);
  if (!setup.ok()) {
    std::fprintf(stderr, "lamina: %s\n", setup.error().message.c_str());
    *exit_code = kExitBadInput;
    return false;
  }
  *out = std::move(*setup);
  return true;
}

chat::ChatRenderOptions ChatRenderOptionsFor(const ChatTemplateOptions& options) {
  chat::ChatRenderOptions render;
  if (options.reasoning == "auto") {
    render.enable_thinking.reset();
  } else {
    render.enable_thinking = options.reasoning == "on";
  }
  return render;
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

namespace {

constexpr const char* kChatHelp =
    "commands:\n"
    "  /help          this list\n"
    "  /clear         forget the conversation (the system turn stays)\n"
    "  /save FILE     save the conversation (its turns and KV cells, as --session FILE)\n"
    "  /load FILE     load a conversation saved with /save or --session\n"
    "  /bye           exit (also /exit, /quit, Ctrl-D, or Ctrl-C twice at an empty prompt)\n"
    "Ctrl-C stops an answer (what was shown stays in the conversation). A line starting\n"
    "with // or \\/ sends the rest of it, from its '/', to the model.\n";

// The model's general.name, else its file name without .gguf.
std::string ModelName(const Model& model) {
  Result<std::string> name = model.file().GetString("general.name");
  if (name.ok() && !name->empty()) return *name;
  return fs::path(model.file().path()).stem().string();
}

// The conversation of `lamina chat` and the session holding its cells.
struct ChatState {
  ChatState(const RunOptions& options, Session& s) : o(options), session(s) {}

  const RunOptions& o;
  Session& session;
  uint64_t model_hash = 0;
  std::string system;
  std::vector<chat::ChatMessage> messages;
  std::vector<int32_t> history;  // the tokens of the last turn (prompt + answer)

  void Clear() {
    messages.clear();
    if (!system.empty()) messages.push_back({"system", system});
  }

  // /save FILE: the --session file format (the cells of the conversation and its turns).
  void Save(const std::string& path) {
    if (model_hash == 0) model_hash = ModelIdentityHash(session.model());
    RunOptions to = o;
    to.session = path;
    int rc = kExitOk;
    if (SaveSessionForCli(to, session, model_hash, history, TurnsToJson(messages), &rc)) {
      std::fprintf(stderr, "lamina: saved %zu turns to %s\n", messages.size(), path.c_str());
    }
  }

  // /load FILE: a file of /save or --session; a refused file leaves the conversation as it was.
  void Load(const std::string& path) {
    std::error_code ec;
    if (!fs::exists(path, ec)) {
      std::fprintf(stderr, "lamina: %s: no such file\n", path.c_str());
      return;
    }
    if (model_hash == 0) model_hash = ModelIdentityHash(session.model());
    Result<SessionRestore> r = LoadSessionFile(path, session, 0, model_hash);
    if (!r.ok()) {
      std::fprintf(stderr, "lamina: /load %s\n", r.error().message.c_str());
      return;
    }
    const std::string& turns = r->app;
    history = session.tokens(0);
    std::vector<chat::ChatMessage> loaded = TurnsFromJson(turns);
    if (loaded.empty()) {
      std::fprintf(stderr, "lamina: %s holds no conversation turns; the conversation is kept\n",
                   path.c_str());
      return;
    }
    messages = std::move(loaded);
    std::fprintf(stderr, "lamina: loaded %zu turns (%d cached tokens) from %s\n", messages.size(),
                 r->n_file, path.c_str());
  }
};

enum class LineKind { kSend, kHandled, kExit };

// A line starting with '/': a command (run here, never sent to the model), or with "//" or
// "\/" a line sent from its second character.
LineKind HandleCommand(std::string* line, ChatState* chat) {
  if (line->starts_with("//") || line->starts_with("\\/")) {
    line->erase(0, 1);
    return LineKind::kSend;
  }
  if (!line->starts_with("/")) return LineKind::kSend;
  const size_t space = line->find_first_of(" \t");
  const std::string name = line->substr(0, space);
  std::string arg = space == std::string::npos ? "" : line->substr(space + 1);
  arg.erase(0, arg.find_first_not_of(" \t"));
  arg.erase(arg.find_last_not_of(" \t") + 1);
  if (name == "/bye" || name == "/exit" || name == "/quit") return LineKind::kExit;
  if (name == "/help" || name == "/?") {
    std::fputs(kChatHelp, stderr);
  } else if (name == "/clear") {
    chat->Clear();
    std::fprintf(stderr, "lamina: conversation cleared\n");
  } else if (name == "/save" || name == "/load") {
    if (arg.empty()) {
      std::fprintf(stderr, "lamina: usage: %s FILE\n", name.c_str());
    } else if (name == "/save") {
      chat->Save(arg);
    } else {
      chat->Load(arg);
    }
  } else {
    std::fprintf(stderr,
                 "lamina: unknown command %s (type /help for commands; start the line with // "
                 "to send it)\n",
                 name.c_str());
  }
  return LineKind::kHandled;
}

// The prompt tokens of the conversation with its new user turn, forgetting the oldest turns
// (keeping a system turn) while it does not fit; false (after the message, the user turn taken
// back) when it cannot be rendered or does not fit.
bool ConversationTokens(const chat::ChatSetup& setup, const chat::ChatRenderOptions& render,
                        const Tokenizer& tok, int n_ctx, std::vector<chat::ChatMessage>* messages,
                        std::vector<int32_t>* tokens, bool* opens_thinking) {
  Result<std::string> text = chat::RenderChatPrompt(setup, *messages, tok, {}, render);
  if (!text.ok()) {
    std::fprintf(stderr, "lamina: %s\n", text.error().message.c_str());
    messages->pop_back();
    return false;
  }
  *tokens = tok.Encode(*text, true, true);
  // Forget the oldest turns (keeping a system turn) while the conversation does not fit.
  int dropped = 0;
  while (static_cast<int>(tokens->size()) + 1 >= n_ctx && messages->size() > 1) {
    const size_t first = (*messages)[0].role == "system" ? 1 : 0;
    if (messages->size() - first <= 1) break;
    messages->erase(messages->begin() + static_cast<std::ptrdiff_t>(first));
    ++dropped;
    text = chat::RenderChatPrompt(setup, *messages, tok, {}, render);
    if (!text.ok()) break;
    *tokens = tok.Encode(*text, true, true);
  }
  if (static_cast<int>(tokens->size()) + 1 >= n_ctx) {
    std::fprintf(stderr, "lamina: this turn (%zu tokens) does not fit the context of %d (use -c)\n",
                 tokens->size(), n_ctx);
    messages->pop_back();
    return false;
  }
  *opens_thinking = text.ok() && chat::PromptOpensThinking(*text);
  if (dropped > 0) {
    if (dropped == 1) {
      std::fprintf(stderr, "[dropped the oldest turn to fit the %d-token context]\n", n_ctx);
    } else {
      std::fprintf(stderr, "[dropped the %d oldest turns to fit the %d-token context]\n", dropped,
                   n_ctx);
    }
  }
  return true;
}

// Streams the answer to `tokens`, adds it to the conversation and saves the session file
// (--session); an exit code.
int AnswerTurn(const std::vector<int32_t>& tokens, bool opens_thinking, bool harmony,
               const GenerateOptions& go, SpecSetup* spec, spec::SpecStats* spec_stats,
               ChatState* chat) {
  // The cells the session shares with this conversation are reused; the rest is evaluated.
  // Ctrl-C (the flag) stops the answer between tokens; what was shown is the answer.
  ClearInterrupt();
  std::string shown;
  AnswerPrinter printer(harmony);
  Result<GenerateResult> r =
      GenerateWithSpec(chat->session, tokens, go, *spec, spec_stats, [&](const std::string& piece) {
        if (InterruptPending()) return false;
        shown += piece;
        printer.Print(piece);
        return true;
      });
  printer.Finish();
  if (!r.ok()) {
    std::fprintf(stderr, "lamina: %s\n", r.error().message.c_str());
    return kExitFailure;
  }
  const bool stopped = r->reason == StopReason::kCancelled || InterruptPending();
  ClearInterrupt();
  std::printf("\n");
  std::fflush(stdout);
  chat->history = tokens;
  chat->history.insert(chat->history.end(), r->tokens.begin(), r->tokens.end());
  if (stopped && shown.empty()) {
    chat->messages.pop_back();  // stopped before any text: the question is dropped too
  } else {
    // A thinking block (opened by the prompt or the answer) or harmony's analysis channel is the
    // turn's reasoning_content, which templates render or drop as they do; the rest is its
    // content (chat/answer.h, as the server reads answers).
    chat::AnswerParts parts = chat::SplitAnswer(
        {harmony, chat::ReasoningFormat::kDeepseek, opens_thinking}, stopped ? shown : r->text);
    chat::ChatMessage answer{"assistant", std::move(parts.content)};
    answer.reasoning_content = std::move(parts.reasoning);
    chat->messages.push_back(std::move(answer));
  }
  if (!chat->o.session.empty()) {
    int rc = kExitOk;
    if (!SaveSessionForCli(chat->o, chat->session, chat->model_hash, chat->history,
                           TurnsToJson(chat->messages), &rc)) {
      return rc;
    }
  }
  return kExitOk;
}

}  // namespace

int RunChat(const ChatOptions& options) {
  const RunOptions& o = options.run;
  LoadedModel lm = LoadModelForCli(o.common);
  if (!lm.model) return kExitBadInput;
  if (int rc = kExitOk; !AttachMtpHead(o.spec.mode, o.common.model_path, *lm.model, &rc)) return rc;
  const Model& model = *lm.model;
  chat::ChatSetup setup;
  int rc = kExitOk;
  if (!ReadChatSetup(model, o.chat_template, &setup, &rc)) return rc;
  const chat::ChatRenderOptions render = ChatRenderOptionsFor(o.chat_template);
  const Tokenizer& tok = model.tokenizer();
  const bool interactive = isatty(STDIN_FILENO) != 0;
  // On a terminal Ctrl-C stops an answer: the worker threads are created with SIGINT blocked,
  // so that it reaches the thread that reads the terminal and polls the flag.
  if (interactive) BlockInterrupts();
  ThreadPool pool(o.common.n_threads);
  SessionConfig sc;
  if (!MakeSessionConfig(o.common, model, &sc, &rc)) return rc;
  if (const uint64_t mtp = MtpPlanBytes(o.spec, model, sc);
      mtp > 0 && !CheckMemoryPlan(o.common, model, &sc, 0, 0, 0, "", &rc, mtp)) {
    return rc;
  }
  Session session(model, sc, pool);
  SpecSetup spec;
  if (!MakeSpecSetup(o.spec, o.common.model_path, model, session.n_ctx(), pool, &spec, &rc,
                     /*build_drafter=*/true, &session)) {
    return rc;
  }
  if (interactive) InstallInterruptHandler();
  spec::SpecStats spec_stats;

  GenerateOptions go;
  go.params.sampler = MakeSamplerConfig(o);
  go.params.n_predict = o.n_predict;
  if (!MakeGrammar(o, &go.params.grammar, &rc)) return rc;

  ChatState chat(o, session);
  chat.system = options.system;
  chat.Clear();
  std::vector<chat::ChatMessage>& messages = chat.messages;
  // --session FILE: the conversation so far (its cells, and its turns in the file's payload).
  if (!o.session.empty()) {
    chat.model_hash = ModelIdentityHash(model);
    std::string turns;
    if (!RestoreSessionForCli(o, session, chat.model_hash, nullptr, &turns, &rc)) return rc;
    if (!turns.empty()) messages = TurnsFromJson(turns);
    chat.history = session.tokens(0);
  }
  if (interactive) {
    std::fprintf(stderr,
                 "lamina chat: %s, context %d tokens, at most %d tokens per answer (-n), KV %s\n"
                 "type /help for commands, Ctrl-C to stop an answer\n",
                 ModelName(model).c_str(), session.n_ctx(), o.n_predict, o.common.kv.c_str());
  }
  ChatInput input(interactive);
  bool interrupted_at_prompt = false;  // the last thing read was Ctrl-C at an empty prompt
  std::string line;
  while (true) {
    bool had_text = false;
    const ChatInput::Status status = input.Read(&line, &had_text);
    if (status == ChatInput::Status::kEof) break;
    if (status == ChatInput::Status::kInterrupted) {
      if (had_text) {
        interrupted_at_prompt = false;
        continue;
      }
      if (interrupted_at_prompt) break;
      interrupted_at_prompt = true;
      std::fprintf(stderr, "(press Ctrl-C again or type /bye to exit)\n");
      continue;
    }
    interrupted_at_prompt = false;
    if (line.empty()) continue;
    input.Remember(line);
    const LineKind kind = HandleCommand(&line, &chat);
    if (kind == LineKind::kExit) break;
    if (kind == LineKind::kHandled) continue;
    messages.push_back({"user", line});

    std::vector<int32_t> tokens;
    bool opens_thinking = false;
    if (!ConversationTokens(setup, render, tok, session.n_ctx(), &messages, &tokens,
                            &opens_thinking)) {
      continue;
    }
    rc = AnswerTurn(tokens, opens_thinking, setup.harmony, go, &spec, &spec_stats, &chat);
    if (rc != kExitOk) return rc;
  }
  if (spec.drafter) std::fprintf(stderr, "lamina: %s\n", SpecSummary(spec, spec_stats).c_str());
  return kExitOk;
}

}  // namespace lamina::cli
