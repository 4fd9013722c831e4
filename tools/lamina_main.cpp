// The `lamina` command line: run, score, inspect, bench.
#include <CLI/CLI.hpp>

#include "cli_commands.h"

int main(int argc, char** argv) {
  CLI::App app{"lamina: LLM inference for GGUF models"};
  app.require_subcommand(1);

  lamina::cli::InspectOptions inspect;
  CLI::App* inspect_cmd = app.add_subcommand("inspect", "Print a GGUF file's metadata and tensor table");
  inspect_cmd->add_option("model", inspect.model_path, "GGUF file")->required();
  inspect_cmd->add_flag("--json", inspect.json, "Print one JSON object");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : lamina::cli::kExitUsage;
  }
  if (*inspect_cmd) return lamina::cli::RunInspect(inspect);
  return lamina::cli::kExitUsage;
}
