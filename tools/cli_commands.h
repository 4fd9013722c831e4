// Subcommands of the `lamina` CLI. Each returns a process exit code:
//   0 success, 1 runtime failure, 2 bad usage (CLI11 parse errors too), 3 bad input file
//   (malformed GGUF, unsupported model or type, unreadable text file).
#pragma once

#include <string>

namespace lamina::cli {

constexpr int kExitOk = 0;
constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;
constexpr int kExitBadInput = 3;

struct InspectOptions {
  std::string model_path;
  bool json = false;
};
// `lamina inspect MODEL`: metadata and a tensor table (name, type, shape, bytes).
int RunInspect(const InspectOptions& options);

}  // namespace lamina::cli
