// Subcommands of the `lamina` CLI. Each returns a process exit code:
//   0 success, 1 runtime failure, 2 bad usage (CLI11 parse errors too), 3 bad input file
//   (malformed GGUF, unsupported model or type, unreadable text file).
#pragma once

#include <cstdint>
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

struct CommonOptions {
  std::string model_path;
  int n_ctx = 0;        // 0: model default (capped)
  int n_threads = 0;    // 0: all cores
  std::string kv = "f16";
  std::string kv_v_round = "rtn";
  uint64_t kv_seed = 0;
  std::string rope_scaling;  // none, linear or yarn; empty: the model's
  float rope_scale = 0.0f;   // context scaling factor; 0: the model's
  int yarn_orig_ctx = 0;     // YaRN original context; 0: the model's
};

struct RunOptions {
  CommonOptions common;
  std::string prompt;
  std::string prompt_file;
  int n_predict = 128;
  float temperature = 0.8f;
  int top_k = 40;
  float top_p = 0.95f;
  float min_p = 0.05f;
  float repeat_penalty = 1.0f;
  uint64_t seed = 0;
  bool ignore_eos = false;
  bool json = false;
  int prompt_chunk = 0;  // 0: the whole prompt in one batch
};
// `lamina run`: stream a continuation of the prompt.
int RunGenerate(const RunOptions& options);

struct ScoreOptions {
  CommonOptions common;
  std::string text_file;
  std::string save_logits;
  std::string kl_base;
  bool json = false;
};
// `lamina score`: teacher-forced perplexity, logits dump and KL divergence against a dump.
int RunScore(const ScoreOptions& options);

struct BenchOptions {
  CommonOptions common;
  int n_prompt = 512;
  int n_gen = 64;
  int depth = 0;
  int reps = 3;
  bool json = false;
};
// `lamina bench`: prompt-processing and generation throughput, llama-bench style.
int RunBench(const BenchOptions& options);

}  // namespace lamina::cli
