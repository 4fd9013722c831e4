// Speculative decoding on the command line: the flags run and chat share (llama.cpp's spellings
// where it has them) and the drafter they build.
#pragma once

#include <memory>
#include <string>

#include "cli_commands.h"
#include "model/model.h"
#include "runtime/generate.h"
#include "spec/speculative.h"

namespace CLI {
class App;
}

namespace lamina::cli {

// Registers --spec, -md/--model-draft, --draft-max, --draft-min, --draft-p-min, --lookup-ngram,
// --kv-draft and --spec-fixed on a subcommand.
void AddSpecOptions(CLI::App* cmd, SpecCliOptions& spec);

// The drafter and its model, when --spec asks for one.
struct SpecSetup {
  std::unique_ptr<Model> draft_model;
  std::unique_ptr<spec::Drafter> drafter;  // null: --spec off
  spec::SpecOptions options;
  SessionConfig draft_config;  // the draft model's session (context, KV mode)
  double load_seconds = 0.0;
};
// Validates the flags and builds the drafter for `target` (loaded from target_path; a draft
// model defaults to <target>-draft.gguf beside it). Returns false after printing one line, with
// *exit_code set (usage: bad flags; bad input: a missing, malformed or mismatched draft model).
// n_ctx: the target session's context (the draft session gets the same). build_drafter false:
// validate and load only (the server builds one drafter per slot). --spec mtp drafts for
// sequence 0 of target_session (refused when the model has no MTP block; no drafter without a
// session).
bool MakeSpecSetup(const SpecCliOptions& o, const std::string& target_path, const Model& target,
                   int n_ctx, ThreadPool& pool, SpecSetup* out, int* exit_code,
                   bool build_drafter = true, Session* target_session = nullptr);

// When `modes` (one mode or a comma-separated list) holds mtp and `model` has no MTP block of
// its own, gives it the head of <model>-mtp.gguf beside model_path if that file exists
// (LoadMtpHead). Returns false after printing one line, with *exit_code set, when the file is
// malformed or does not fit the model.
bool AttachMtpHead(const std::string& modes, const std::string& model_path, Model& model,
                   int* exit_code);

// The memory --spec mtp adds to a target session of config `sc`: one MTP session per
// sequence (its KV cache of the target's context, in the --kv-draft mode, and its recurrent
// states, if any) and the target's kept hidden states ([n_ctx, n_embd] floats per sequence).
// 0 for other modes, a model without an MTP block, or a --kv-draft mode MakeSpecSetup refuses.
uint64_t MtpPlanBytes(const SpecCliOptions& o, const Model& target, const SessionConfig& sc);

// A fresh drafter of the setup's kind (null for --spec off, and for mtp without a target
// session): a new draft session each call.
std::unique_ptr<spec::Drafter> NewDrafter(const SpecCliOptions& o, const SpecSetup& setup,
                                          ThreadPool& pool, Session* target_session = nullptr);

// Generate or GenerateSpeculative, as the setup says.
Result<GenerateResult> GenerateWithSpec(
    Session& session, const std::vector<int32_t>& prompt, const GenerateOptions& go,
    SpecSetup& spec, spec::SpecStats* stats,
    const std::function<bool(const std::string&)>& on_text = {},
    const std::function<void(int, int)>& on_prompt_progress = {});

// "spec lookup | drafted N, accepted M (P%), T tokens per verify step, V verify / S plain steps"
std::string SpecSummary(const SpecSetup& spec, const spec::SpecStats& stats);

}  // namespace lamina::cli
