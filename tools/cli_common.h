// Helpers shared by the CLI subcommands: model loading with timing and error reporting, and
// progress lines on a terminal.
#pragma once

#include <cstdio>
#include <memory>
#include <string>

#include "chat/answer.h"
#include "chat/chat_template.h"
#include "cli_commands.h"
#include "model/model.h"
#include "runtime/grammar.h"
#include "runtime/kv_cache.h"
#include "runtime/sampler.h"
#include "runtime/session.h"

namespace lamina::cli {

struct LoadedModel {
  std::unique_ptr<Model> model;
  double load_seconds = 0.0;
};

// Loads the model; on failure prints "lamina: <error>" and returns nullptr model.
LoadedModel LoadModelForCli(const std::string& path);
// Same, with the RoPE scaling overrides (--rope-scaling, --rope-scale, --yarn-orig-ctx) of
// the common options applied.
LoadedModel LoadModelForCli(const CommonOptions& options);

// True when stderr is a terminal (progress lines are shown only then).
bool StderrIsTerminal();

// Reads a whole file; false with a message on failure.
bool ReadTextFile(const std::string& path, std::string* out, std::string* error);

// The grammar of --grammar / --grammar-file / --json-schema / --json-schema-file (null when
// none); on failure prints "lamina: ..." (the grammar's or schema's error with its position)
// and returns false with the exit code (2: bad option text, 3: a bad or unreadable file).
bool MakeGrammar(const RunOptions& options, std::shared_ptr<const Grammar>* out, int* exit_code);

// Builds the session config from the common options and checks that the KV mode suits the
// model; on failure prints "lamina: ..." and returns the exit code in *exit_code.
bool MakeSessionConfig(const CommonOptions& options, const Model& model, SessionConfig* out,
                       int* exit_code);

// The memory guard: the KV cache of `sc` (all its sequences) plus the scratch of one batch of
// batch_tokens tokens with logit_rows logits rows plus `extra` bytes the command allocates itself,
// against the limit (--mem-limit, LAMINA_MEM_LIMIT, else 90% of MemAvailable). Over it: prints
// one line naming the bytes, the limit and the options to change (batch_hint names the one for
// the batch), sets *exit_code to bad usage and returns false. Sets sc->memory_limit. mtp_bytes:
// what --spec mtp adds (MtpPlanBytes: the MTP head's KV caches and the kept hidden states).
bool CheckMemoryPlan(const CommonOptions& options, const Model& model, SessionConfig* sc,
                     int batch_tokens, int logit_rows, uint64_t extra, const char* batch_hint,
                     int* exit_code, uint64_t mtp_bytes = 0);

// --session FILE of run / chat: restores FILE into sequence 0 of the session (absent: a new
// file). With `prompt`, reports on stderr how many of its tokens were restored (the cells kept
// are the prefix FILE shares with it). A refused file prints the error and returns false with
// the bad-input exit code, unless fresh_on_error (a warning; the prompt is read again). *app
// receives the file's caller payload.
bool RestoreSessionForCli(const RunOptions& options, Session& session, uint64_t model_hash,
                          const std::vector<int32_t>* prompt, std::string* app, int* exit_code);
// Saves sequence 0 to --session FILE after evaluating what of `history` it lacks (the last
// sampled token); false with a message and the runtime-failure exit code on an I/O error.
bool SaveSessionForCli(const RunOptions& options, Session& session, uint64_t model_hash,
                       const std::vector<int32_t>& history, const std::string& app, int* exit_code);

// The sampler settings of run / chat; when sampling (temperature > 0), prints "lamina: seed: N"
// on stderr so that the run can be repeated with --seed N.
// --samplers: names separated by ';' (llama.cpp's); empty for "" or an unknown name (then
// *error says which).
std::vector<SamplerStage> ParseSamplerStages(const std::string& names,
                                             std::string* error = nullptr);
SamplerConfig MakeSamplerConfig(const RunOptions& options);

// Prints the KV cache's size line to stderr.
void PrintKvSummary(const KvCache& cache);

// The chat setup the options choose: --chat-template-file, else --chat-template (a built-in
// name or a Jinja source), else the model's tokenizer.chat_template (its native format, or
// the Jinja engine; --jinja: always the engine). An Error when the template is absent or does
// not parse, naming the position.
Result<chat::ChatSetup> ChooseChatSetup(const Model& model, const ChatTemplateOptions& options);

// The render options of --reasoning on|off|auto (auto: the template's default).
chat::ChatRenderOptions ChatRenderOptionsFor(const ChatTemplateOptions& options);

// ChooseChatSetup for run --chat / chat (cli_chat.cpp); false with a message (and *exit_code)
// on an Error.
bool ReadChatSetup(const Model& model, const ChatTemplateOptions& options, chat::ChatSetup* out,
                   int* exit_code);
inline bool ReadChatSetup(const Model& model, chat::ChatSetup* out, int* exit_code) {
  return ReadChatSetup(model, ChatTemplateOptions{}, out, exit_code);
}

// A chat answer printed to stdout as it streams. Other templates' text is printed as generated
// (a `<think>` block included); a harmony (gpt-oss) answer goes through chat::AnswerSplitter and
// never shows its markers: the analysis channel inside `<think>` ... `</think>` as a thinking
// model's block reads, the final channel as the answer, a tool call as a line
// `[call NAME ARGUMENTS]`.
class AnswerPrinter {
 public:
  explicit AnswerPrinter(bool harmony)
      : harmony_(harmony), splitter_(chat::AnswerFormat{harmony}) {}
  void Print(const std::string& piece);
  void Finish();  // the end of the answer: what was held back

 private:
  void Parts(const chat::AnswerParts& p);
  void Write(const std::string& text);

  bool harmony_;
  chat::AnswerSplitter splitter_;
  bool thinking_open_ = false;  // printed "<think>" and not yet its close
};

}  // namespace lamina::cli
