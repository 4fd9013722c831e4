// Helpers shared by the CLI subcommands: model loading with timing and error reporting, and
// progress lines on a terminal.
#pragma once

#include <cstdio>
#include <memory>
#include <string>

#include "cli_commands.h"
#include "model/model.h"
#include "runtime/kv_cache.h"
#include "runtime/sampler.h"
#include "runtime/session.h"
#include "tokenizer/chat_template.h"

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

// Builds the session config from the common options and checks that the KV mode suits the
// model; on failure prints "lamina: ..." and returns the exit code in *exit_code.
bool MakeSessionConfig(const CommonOptions& options, const Model& model, SessionConfig* out,
                       int* exit_code);

// The sampler settings of run / chat.
SamplerConfig MakeSamplerConfig(const RunOptions& options);

// Prints the KV cache's size line to stderr.
void PrintKvSummary(const KvCache& cache);

// The model's chat setup from its tokenizer.chat_template (cli_chat.cpp); false with a message
// (and *exit_code) when it has none or lamina does not know its format.
bool ReadChatSetup(const Model& model, ChatSetup* out, int* exit_code);

}  // namespace lamina::cli
