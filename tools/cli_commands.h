// Subcommands of the `lamina` CLI. Each returns a process exit code:
//   0 success, 1 runtime failure, 2 bad usage (CLI11 parse errors too, an option out of its
//   range, a plan over the memory limit), 3 bad input file (malformed GGUF, unsupported model or
//   type, unreadable text file, a refused session file), 4 out of memory (an allocation failed
//   although the memory guard allowed the plan).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace CLI {
class App;
}  // namespace CLI
namespace lamina {
class Model;
class ThreadPool;
struct SamplerConfig;
}  // namespace lamina

namespace lamina::cli {

constexpr int kExitOk = 0;
constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;
constexpr int kExitBadInput = 3;
constexpr int kExitOutOfMemory = 4;

struct InspectOptions {
  std::string model_path;
  bool json = false;
};
// `lamina inspect MODEL`: metadata and a tensor table (name, type, shape, bytes).
int RunInspect(const InspectOptions& options);

struct CommonOptions {
  std::string model_path;
  int n_ctx = 0;      // 0: model default (capped)
  int n_threads = 0;  // 0: all cores
  std::string kv = "f16";
  std::string kv_v_round = "rtn";
  int kv_window = -1;       // --kv-window R; -1: the mode's default (kKvModes)
  bool swa_full = false;    // --swa-full: every cell of sliding-window layers, not a ring
  int recurrent_ring = 32;  // --recurrent-ring N (hybrid models; kRecurrentRingDefault)
  uint64_t kv_seed = 0;
  std::string rope_scaling;  // none, linear or yarn; empty: the model's
  float rope_scale = 0.0f;   // context scaling factor; 0: the model's
  int yarn_orig_ctx = 0;     // YaRN original context; 0: the model's
  std::string
      mem_limit;  // --mem-limit SIZE|none; empty: LAMINA_MEM_LIMIT, else 90% of MemAvailable
};

// Speculative decoding (cli_spec.h).
struct SpecCliOptions {
  std::string mode = "off";  // off, lookup, draft, mtp
  std::string draft_model;   // -md; empty: <model>-draft.gguf beside the model
  static constexpr int kUnset = -(1 << 30);
  int draft_max = kUnset;  // kUnset: the mode's default
  int draft_min = 0;
  float draft_p_min = 0.5f;
  int lookup_ngram = 2;
  std::string kv_draft = "f16";
  bool fixed = false;  // --spec-fixed: always draft
};

// How run --chat, chat and serve choose the chat template.
struct ChatTemplateOptions {
  std::string name;    // --chat-template NAME (a built-in) or a Jinja source text
  std::string file;    // --chat-template-file F: a Jinja source file
  bool jinja = false;  // --jinja: the model's template through the Jinja engine, even a known one
  // -rea/--reasoning on|off|auto: the template's enable_thinking (auto: the template's default)
  std::string reasoning = "off";
};

// The sampler chain's flags beyond temperature, top-k, top-p, min-p and the repetition penalty:
// run, chat and serve (there: every request's defaults) take them alike.
struct SamplerChainOptions {
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  float typical_p = 1.0f;
  float xtc_probability = 0.0f;
  float xtc_threshold = 0.1f;
  int mirostat = 0;
  float mirostat_tau = 5.0f;  // --mirostat-ent
  float mirostat_eta = 0.1f;  // --mirostat-lr
  float dry_multiplier = 0.0f;
  float dry_base = 1.75f;
  int dry_allowed_length = 2;
  int dry_penalty_last_n = -1;
  // --dry-sequence-breaker (repeatable; "none": no breakers); empty: llama.cpp's defaults.
  std::vector<std::string> dry_sequence_breakers;
  std::string samplers;  // --samplers a;b;c (llama.cpp's names); empty: the default order
};
// Adds the flags of SamplerChainOptions to a command.
void AddSamplerChainOptions(CLI::App* cmd, SamplerChainOptions& o);
// Sets the chain's fields of `samp` from the flags.
void ApplySamplerChain(const SamplerChainOptions& o, SamplerConfig* samp);

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
  int repeat_last_n = 64;
  SamplerChainOptions chain;
  uint64_t seed = 0;
  bool ignore_eos = false;
  bool json = false;
  int prompt_chunk = 0;  // 0: the whole prompt in one batch
  bool chat = false;     // --chat: the prompt is one user turn of the model's chat template
  ChatTemplateOptions chat_template;
  std::string session;  // --session FILE: restore the state from FILE, save it there after
  bool session_fresh_on_error = false;  // a refused FILE: read the prompt again, not exit 3
  SpecCliOptions spec;
  // Constrained output (at most one): a GBNF grammar or a JSON schema, as text or a file.
  std::string grammar;           // --grammar TEXT (or the path of a file holding it)
  std::string grammar_file;      // --grammar-file F
  std::string json_schema;       // -j/--json-schema TEXT (or the path of a file holding it)
  std::string json_schema_file;  // --json-schema-file F
};
// `lamina run`: stream a continuation of the prompt. With --chat the prompt is rendered as one
// user turn with the chat template (the GGUF's, or --chat-template / --chat-template-file) and
// generation ends with the
// assistant turn.
int RunGenerate(const RunOptions& options);

// Chat (cli_chat.cpp).
struct ChatOptions {
  RunOptions run;      // model, KV, sampling and -n (per answer) options
  std::string system;  // optional system turn
};
// `lamina chat`: reads a user turn per stdin line, streams the answer; EOF ends.
int RunChat(const ChatOptions& options);
// The shipped model: models/lamina-*.gguf (lamina-counter.gguf first) under the executable's
// ../../models (or ../models), else ./models; empty when there is none.
std::string FindShippedModel();
// Fills an empty *model_path with FindShippedModel(); false (with a message telling the user
// to pass -m) when there is none.
bool ResolveModelPath(std::string* model_path);

struct ScoreOptions {
  CommonOptions common;
  std::string text_file;
  std::string save_logits;
  std::string kl_base;
  bool json = false;
  bool mtp = false;  // score the model's MTP block (its own, or <model>-mtp.gguf's)
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
  // pp as llama-bench times it: one untimed warm-up prompt, then each repetition on the same
  // session with its cache cleared (false, --no-warmup: a fresh session per repetition, its
  // first touch of the scratch buffers timed).
  bool warmup = true;
  std::string parallel;  // --parallel B[,B...]: batched decode of B sequences per step
  // --roofline: a streaming-read bandwidth probe on the same threads around every 16-step tg
  // segment; each segment's bytes per second against it (cli_bench.cpp).
  bool roofline = false;
  // --spec off,lookup,draft,mtp: greedy generation on a fixed task set (counting, JSON, copying a
  // list, prose) with each mode, interleaved rounds (cli_bench_spec.cpp).
  std::string spec;
  SpecCliOptions spec_options;  // -md, --draft-max, ... (mode set per leg)
};
// `lamina bench`: prompt-processing and generation throughput, llama-bench style; with
// --parallel, aggregate and per-sequence decode tok/s of B sequences decoding together.
int RunBench(const BenchOptions& options);
// `lamina bench --spec ...` (called by RunBench).
int RunBenchSpec(const BenchOptions& options, const Model& model, ThreadPool& pool);

struct ProbeOptions {
  std::string model_path;                 // empty: the shipped model (models/lamina-*.gguf)
  std::string kv = "f16,int8,k8v4,q4_0";  // legs, comma-separated; f32 reference prepended
  std::string kv_v_round = "rtn";         // V roundings crossed with the quantized modes
  std::string kv_window;                  // windows crossed with the quantized modes; "": default
  std::string probes = "prefill,counting,needle,json,schema,copy,thinking,divergence";
  int n_ctx = 4096;
  std::string needle_depths = "10,30,50,70,90";   // percent of the haystack
  std::string needle_lengths = "1024,2048,4096";  // haystack tokens
  int count_to = 300;
  int divergence_tokens = 1024;  // teacher-forced text length (capped by the context)
  int free_run_tokens = 128;
  std::string text_file;  // divergence text; empty: seeded filler sentences
  std::string out_dir;    // probe.json and report.html; empty: none
  uint64_t seed = 0;
  int n_threads = 0;
  std::vector<std::string> inject_faults;  // test-only: "LEG_INDEX:FAULT"
  std::string spec = "off";     // --spec off,lookup,draft,mtp: each KV leg crossed with these modes
  SpecCliOptions spec_options;  // -md, --draft-max, ... for the speculative legs
  std::string url;      // --url: probe this OpenAI-compatible server (model_path: its model name)
  std::string api_key;  // --url's Bearer token
};
// `lamina probe`: A/B the KV cache modes, one fresh session per leg, against a reference leg;
// with --url, the generation probes against a server.
int RunProbe(const ProbeOptions& options);

// llama.cpp spells some flags with one dash and several letters (-np, -fa, -md, ...); CLI11
// wants those long. Returns argv with each such flag replaced by its long spelling.
std::vector<std::string> NormalizeLlamaArgs(int argc, char** argv);
// The long name NormalizeLlamaArgs gives a llama.cpp one-dash flag ("-np": "--parallel"); ""
// when it keeps the flag as it is.
std::string LlamaLongName(const std::string& flag);
// What to use instead of a llama.cpp flag (either spelling: "-cnv" or "--conversation") that
// lamina's run, chat, score, bench and probe do not take; "" when it is no such flag.
std::string LlamaFlagAdvice(const std::string& flag);

}  // namespace lamina::cli
