// `lamina run --chat` (one user turn through the model's chat template), `lamina chat` (an
// interactive loop over the same) and the lookup of the shipped model used when no -m is given.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "cli_common.h"
#include "gguf/gguf.h"
#include "runtime/sampler.h"
#include "runtime/session.h"
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

fs::path ExecutableDir() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  return ec ? fs::path() : exe.parent_path();
}

struct ChatSetup {
  ChatFormat format = ChatFormat::kUnknown;
  std::string default_system;
};

// Reads tokenizer.chat_template and recognises its format; prints the reason on failure.
bool ReadChatSetup(const std::string& model_path, ChatSetup* out, int* exit_code) {
  Result<std::unique_ptr<gguf::File>> file = gguf::File::Open(model_path);
  if (!file.ok()) {
    std::fprintf(stderr, "lamina: %s\n", file.error().message.c_str());
    *exit_code = kExitBadInput;
    return false;
  }
  Result<std::string> tmpl = (*file)->GetString("tokenizer.chat_template");
  if (!tmpl.ok()) {
    std::fprintf(stderr, "lamina: %s has no tokenizer.chat_template; use run without --chat\n",
                 model_path.c_str());
    *exit_code = kExitBadInput;
    return false;
  }
  out->format = DetectChatFormat(*tmpl);
  if (out->format == ChatFormat::kUnknown) {
    std::fprintf(stderr,
                 "lamina: the chat template of %s is not one lamina knows (ChatML, Qwen3, "
                 "Llama-3); use run without --chat and format the prompt yourself\n",
                 model_path.c_str());
    *exit_code = kExitBadInput;
    return false;
  }
  out->default_system = DefaultSystemPrompt(*tmpl);
  return true;
}

// Rendered conversation for the model; a leading BOS text (Llama-3's "<|begin_of_text|>") is
// dropped when the tokenizer adds BOS itself, so it is not doubled.
std::string Render(const ChatSetup& setup, const std::vector<ChatMessage>& messages,
                   const Tokenizer* tok) {
  std::string text = RenderChat(setup.format, messages, /*add_generation_prompt=*/true,
                                /*enable_thinking=*/false, setup.default_system);
  if (tok != nullptr && tok->add_bos() && tok->bos() >= 0) {
    const std::string& bos = tok->TokenText(tok->bos());
    if (!bos.empty() && text.starts_with(bos)) text.erase(0, bos.size());
  } else if (tok == nullptr && text.starts_with("<|begin_of_text|>")) {
    text.erase(0, 17);
  }
  return text;
}

}  // namespace

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

int RunChatPrompt(const RunOptions& options) {
  ChatSetup setup;
  int rc = kExitOk;
  if (!ReadChatSetup(options.common.model_path, &setup, &rc)) return rc;
  RunOptions o = options;
  std::string user = o.prompt;
  if (!o.prompt_file.empty()) {
    std::string err;
    if (!ReadTextFile(o.prompt_file, &user, &err)) {
      std::fprintf(stderr, "lamina: %s\n", err.c_str());
      return kExitBadInput;
    }
    o.prompt_file.clear();
  }
  o.prompt = Render(setup, {ChatMessage{"user", user}}, nullptr);
  o.ignore_eos = false;  // the turn ends at the template's end-of-turn token
  return RunGenerate(o);
}

int RunChat(const ChatOptions& options) {
  const RunOptions& o = options.run;
  ChatSetup setup;
  int rc = kExitOk;
  if (!ReadChatSetup(o.common.model_path, &setup, &rc)) return rc;
  LoadedModel lm = LoadModelForCli(o.common);
  if (!lm.model) return kExitBadInput;
  const Model& model = *lm.model;
  const Tokenizer& tok = model.tokenizer();
  const int n_vocab = model.hparams().n_vocab;
  ThreadPool pool(o.common.n_threads);
  SessionConfig sc;
  if (!MakeSessionConfig(o.common, model, &sc, &rc)) return rc;
  Session session(model, sc, pool);

  Sampler sampler(MakeSamplerConfig(o));

  const bool interactive = isatty(STDIN_FILENO) != 0;
  std::vector<ChatMessage> messages;
  if (!options.system.empty()) messages.push_back({"system", options.system});
  std::vector<int32_t> cached;  // the tokens whose K/V the session holds, in order
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

    std::vector<int32_t> tokens = tok.Encode(Render(setup, messages, &tok), true, true);
    // Forget the oldest turns (keeping a system turn) while the conversation does not fit.
    while (static_cast<int>(tokens.size()) + 1 >= session.n_ctx() && messages.size() > 1) {
      const size_t first = messages[0].role == "system" ? 1 : 0;
      if (messages.size() - first <= 1) break;
      messages.erase(messages.begin() + static_cast<std::ptrdiff_t>(first));
      tokens = tok.Encode(Render(setup, messages, &tok), true, true);
    }
    if (static_cast<int>(tokens.size()) + 1 >= session.n_ctx()) {
      std::fprintf(stderr, "lamina: this turn (%zu tokens) does not fit the context of %d (use -c)\n",
                   tokens.size(), session.n_ctx());
      messages.pop_back();
      continue;
    }
    // Reuse the cached prefix; evaluate the rest (at least one token, for fresh logits).
    size_t keep = 0;
    while (keep < cached.size() && keep < tokens.size() && cached[keep] == tokens[keep]) ++keep;
    if (keep == tokens.size()) --keep;
    session.Truncate(static_cast<int>(keep));
    cached.resize(keep);
    Result<const float*> r = session.Eval(tokens.data() + keep,
                                          static_cast<int>(tokens.size() - keep), false);
    if (!r.ok()) {
      std::fprintf(stderr, "lamina: %s\n", r.error().message.c_str());
      return kExitFailure;
    }
    cached = tokens;
    const float* logits = *r;

    std::vector<int32_t> history = tokens;
    std::string answer;
    StreamingDetokenizer detok(tok);
    for (int i = 0; i < o.n_predict && session.n_past() < session.n_ctx(); ++i) {
      const int32_t id = sampler.Sample(logits, n_vocab, history);
      if (tok.IsEog(id)) break;
      history.push_back(id);
      const std::string piece = detok.Push(id);
      answer += piece;
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
      if (session.n_past() + 1 >= session.n_ctx()) break;
      Result<const float*> next = session.Eval(&id, 1, false);
      if (!next.ok()) {
        std::fprintf(stderr, "lamina: %s\n", next.error().message.c_str());
        return kExitFailure;
      }
      cached.push_back(id);
      logits = *next;
    }
    const std::string tail = detok.Flush();
    answer += tail;
    std::fwrite(tail.data(), 1, tail.size(), stdout);
    std::printf("\n");
    std::fflush(stdout);
    messages.push_back({"assistant", answer});
  }
  return kExitOk;
}

}  // namespace lamina::cli
