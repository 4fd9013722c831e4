// The `lamina` command line: run, chat, score, bench, probe, inspect, serve. Exit codes: see
// cli_commands.h.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <new>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "build_info.h"
#include "chat/chat_template.h"
#include "cli_commands.h"
#include "cli_common.h"
#include "cli_options.h"
#include "cli_spec.h"
#include "runtime/kv_cache.h"
#include "server/server.h"

namespace {
using namespace lamina::cli;  // NOLINT: the validators of cli_options.h

// The help's option groups, shared by the subcommands.
constexpr const char* kGroupModel = "Model and context";
constexpr const char* kGroupKv = "KV cache";
constexpr const char* kGroupInput = "Prompt and output";
constexpr const char* kGroupSampling = "Sampling";
constexpr const char* kGroupTemplate = "Chat template";
constexpr const char* kGroupSession = "Session";
constexpr const char* kGroupConstrained = "Constrained output";
constexpr const char* kGroupSpec = "Speculative decoding";

void AddCommon(CLI::App* cmd, lamina::cli::CommonOptions& c, bool model_required) {
  auto* m = cmd->add_option("-m,--model", c.model_path,
                            model_required ? "GGUF model file"
                                           : "GGUF model file (default: the "
                                             "shipped model)");
  m->group(kGroupModel);
  if (model_required) m->required();
  cmd->add_option("-c,--ctx-size", c.n_ctx,
                  "Context size in tokens (0: the model's, capped at 4096)")
      ->check(ContextSize())
      ->group(kGroupModel);
  cmd->add_option("-t,--threads", c.n_threads, "Threads (0: all cores)")
      ->check(Threads())
      ->group(kGroupModel);
  cmd->add_option("--rope-scaling", c.rope_scaling,
                  "RoPE scaling: none, linear or yarn (default: the model's)")
      ->check(CLI::IsMember({"none", "linear", "yarn"}))
      ->group(kGroupModel);
  cmd->add_option("--rope-scale", c.rope_scale,
                  "RoPE context scaling factor (default: the model's)")
      ->check(NonNegativeFinite())
      ->default_str("")
      ->group(kGroupModel);
  cmd->add_option("--yarn-orig-ctx", c.yarn_orig_ctx,
                  "YaRN original context length (default: the model's)")
      ->check(IntRange(0, 1 << 30))
      ->default_str("")
      ->group(kGroupModel);
  cmd->add_option("--mem-limit", c.mem_limit,
                  "Most bytes the KV cache (with recurrent states, and --spec mtp's head caches "
                  "and kept hidden states) and a batch may take, e.g. 8G, or none (default: "
                  "LAMINA_MEM_LIMIT, else 90% of MemAvailable)")
      ->group(kGroupModel);
  cmd->add_option("--kv", c.kv, "KV cache mode: " + lamina::KvModeNames())->group(kGroupKv);
  cmd->add_option("--kv-v-round", c.kv_v_round, "V rounding for quantized modes: rtn or stochastic")
      ->group(kGroupKv);
  cmd->add_option("--kv-window", c.kv_window,
                  "Recent cells kept exact (f16) in lossy KV modes; 0: off (default: the mode's)")
      ->check(IntRange(0, 1 << 20))
      ->default_str("")
      ->group(kGroupKv);
  cmd->add_flag("--swa-full", c.swa_full,
                "Keep every cell of sliding-window layers (default: a ring of their recent cells; "
                "prefixes cut further back are evaluated again)")
      ->group(kGroupKv);
  cmd->add_option("--kv-seed", c.kv_seed, "Seed of stochastic V rounding")
      ->check(Seed())
      ->group(kGroupKv);
  cmd->add_option("--recurrent-ring", c.recurrent_ring,
                  "Hybrid models: recurrent states kept per sequence, the furthest a rollback "
                  "(speculative verify, prefix reuse) restores exactly; drafts stay below it")
      ->check(IntRange(1, 4096))
      ->group(kGroupKv);
}

// Sampling options of run and chat. The seed's default is random (ChooseSeed).
void AddSamplingOptions(CLI::App* cmd, lamina::cli::RunOptions& r) {
  cmd->option_defaults()->group(kGroupSampling);
  cmd->add_option("--temp", r.temperature, "Temperature (0: greedy)")->check(Temperature());
  cmd->add_option("--top-k", r.top_k, "Top-k (0: off)")->check(IntRange(0, 1 << 30));
  cmd->add_option("--top-p", r.top_p, "Top-p (1: off)")->check(Probability());
  cmd->add_option("--min-p", r.min_p, "Min-p (0: off)")->check(Probability());
  cmd->add_option("--repeat-penalty", r.repeat_penalty, "Repetition penalty (1: off)")
      ->check(Positive());
  cmd->add_option("--repeat-last-n", r.repeat_last_n,
                  "Tokens the penalties look back (0: off; -1: the whole context)")
      ->check(InRange(lamina::cli::kRepeatLastNRange));
  AddSamplerChainOptions(cmd, r.chain);
  cmd->add_option("-s,--seed", r.seed,
                  "RNG seed of sampling (default: random; printed on stderr when sampling)")
      ->check(Seed())
      ->default_str("");
}

// A sampling seed that differs from run to run, for when --seed is not given.
uint64_t RandomSeed() {
  std::random_device rd;
  const uint64_t time =
      static_cast<uint64_t>(std::chrono::high_resolution_clock::now().time_since_epoch().count());
  return ((static_cast<uint64_t>(rd()) << 32) ^ rd() ^ time) & ((uint64_t{1} << 53) - 1);
}

// The subcommands' names, for the suggestion on a mistyped one.
const std::vector<std::string>& CommandNames() {
  static const std::vector<std::string> kNames = {"run",   "chat",    "score", "bench",
                                                  "probe", "inspect", "serve", "version"};
  return kNames;
}

void AddChatTemplateOptions(CLI::App* cmd, lamina::cli::ChatTemplateOptions& t) {
  cmd->option_defaults()->group(kGroupTemplate);
  cmd->add_option("--chat-template", t.name,
                  "Chat template: a built-in name (" + lamina::chat::ChatTemplateNames() +
                      ") or a Jinja source");
  cmd->add_option("--chat-template-file", t.file, "Chat template: a Jinja source file");
  cmd->add_flag("--jinja", t.jinja,
                "Render the model's chat template with the Jinja engine even when it is a "
                "format lamina knows");
  cmd->add_option("--reasoning", t.reasoning,
                  "(-rea) Thinking in the chat template (its enable_thinking): on, off, or auto "
                  "(the template's default)")
      ->check(CLI::IsMember({"on", "off", "auto"}))
      ->capture_default_str();
}

void AddGrammarOptions(CLI::App* cmd, lamina::cli::RunOptions& r) {
  cmd->option_defaults()->group(kGroupConstrained);
  cmd->add_option("--grammar", r.grammar,
                  "GBNF grammar the output must follow (the text, or a file holding it)");
  cmd->add_option("--grammar-file", r.grammar_file, "Read the GBNF grammar from a file");
  cmd->add_option("-j,--json-schema", r.json_schema,
                  "JSON schema the output must follow (the text, or a file holding it)");
  cmd->add_option("--json-schema-file", r.json_schema_file, "Read the JSON schema from a file");
}

void AddSessionOptions(CLI::App* cmd, lamina::cli::RunOptions& r) {
  cmd->option_defaults()->group(kGroupSession);
  cmd->add_option("--session", r.session,
                  "Session file: restore the state it holds when its tokens begin the prompt, "
                  "save the state after the run there (written atomically)");
  cmd->add_flag("--session-fresh-on-error", r.session_fresh_on_error,
                "When the session file is refused (another model or KV mode, corrupt), read the "
                "prompt again instead of exiting with code 3");
}

// Speculative decoding's options (cli_spec.h) in their help group; --draft-max's default
// depends on the mode, as its description says.
void AddSpecGroup(CLI::App* cmd, lamina::cli::SpecCliOptions& spec) {
  cmd->option_defaults()->group(kGroupSpec);
  lamina::cli::AddSpecOptions(cmd, spec);
  cmd->get_option("--draft-max")->default_str("");
}

// The mistyped subcommand's line: the closest name, or the list when none is close.
int UnknownCommand(const std::string& typed) {
  const std::string near = ClosestName(typed, CommandNames());
  if (!near.empty()) {
    std::fprintf(stderr, "lamina: unknown command '%s'; did you mean '%s'?\n", typed.c_str(),
                 near.c_str());
  } else {
    std::string list;
    for (const std::string& n : CommandNames()) list += (list.empty() ? "" : ", ") + n;
    std::fprintf(stderr, "lamina: unknown command '%s'; the commands are %s\n", typed.c_str(),
                 list.c_str());
  }
  return kExitUsage;
}

// Every subcommand's options and its CLI11 app (set once the subcommand is added).
struct Commands {
  RunOptions run;
  CLI::App* run_cmd = nullptr;
  ChatOptions chat;
  CLI::App* chat_cmd = nullptr;
  bool conversation = false;  // llama-cli's -cnv and friends: no effect
  ScoreOptions score;
  CLI::App* score_cmd = nullptr;
  BenchOptions bench;
  CLI::App* bench_cmd = nullptr;
  ProbeOptions probe;
  CLI::App* probe_cmd = nullptr;
  InspectOptions inspect;
  CLI::App* inspect_cmd = nullptr;
};

// The subcommands, each with its options; Main adds them in the order the help lists them.
void AddRunCommand(CLI::App* app, Commands* c) {
  CLI::App* cmd = app->add_subcommand("run", "Generate a continuation of a prompt");
  AddCommon(cmd, c->run.common, false);  // no -m: the shipped model
  cmd->option_defaults()->group(kGroupInput);
  cmd->add_option("-p,--prompt", c->run.prompt, "Prompt text");
  cmd->add_option("-f,--file", c->run.prompt_file, "Read the prompt from a file");
  cmd->add_option("-n,--n-predict", c->run.n_predict, "Tokens to generate")
      ->check(IntRange(0, 1 << 30));
  cmd->add_flag("--ignore-eos", c->run.ignore_eos, "Do not stop at end-of-generation tokens");
  cmd->add_flag("--json", c->run.json, "Print one JSON object instead of streaming text");
  cmd->add_option("--prompt-chunk", c->run.prompt_chunk,
                  "Process the prompt in chunks of N tokens (0: one batch, 1: token by token)")
      ->check(IntRange(0, 1 << 30));
  cmd->add_flag("--chat", c->run.chat,
                "Apply the model's chat template: the prompt is one user turn");
  AddSamplingOptions(cmd, c->run);
  AddChatTemplateOptions(cmd, c->run.chat_template);
  AddSessionOptions(cmd, c->run);
  AddGrammarOptions(cmd, c->run);
  AddSpecGroup(cmd, c->run.spec);
  c->run_cmd = cmd;
}

void AddChatCommand(CLI::App* app, Commands* c) {
  CLI::App* cmd =
      app->add_subcommand("chat", "Interactive chat: one user turn per stdin line, EOF ends");
  AddCommon(cmd, c->chat.run.common, false);
  cmd->option_defaults()->group(kGroupInput);
  cmd->add_option("-n,--n-predict", c->chat.run.n_predict, "Most tokens per answer")
      ->check(IntRange(0, 1 << 30))
      ->default_str("512");
  cmd->add_option("--system,--system-prompt", c->chat.system, "System turn (-sys)");
  // llama-cli's conversation switches: chat is always one.
  cmd->add_flag("-i,--interactive,--conversation,--interactive-first,--multiline-input",
                c->conversation, "llama-cli's conversation flags (-cnv, -i, -if, -mli): no effect")
      ->group("");
  AddSamplingOptions(cmd, c->chat.run);
  AddChatTemplateOptions(cmd, c->chat.run.chat_template);
  AddSessionOptions(cmd, c->chat.run);
  AddGrammarOptions(cmd, c->chat.run);
  AddSpecGroup(cmd, c->chat.run.spec);
  c->chat_cmd = cmd;
}

void AddScoreCommand(CLI::App* app, Commands* c) {
  CLI::App* cmd = app->add_subcommand("score", "Teacher-forced perplexity and KL divergence");
  AddCommon(cmd, c->score.common, false);
  cmd->option_defaults()->group("Scoring");
  cmd->add_option("-f,--file", c->score.text_file, "Text file to score")->required();
  cmd->add_option("--save-logits", c->score.save_logits, "Write every position's logits here");
  cmd->add_option("--kl-base", c->score.kl_base, "Compare against logits saved by --save-logits");
  cmd->add_flag("--json", c->score.json, "Print one JSON object");
  cmd->add_flag("--mtp", c->score.mtp,
                "Score the model's multi-token-prediction block (row p: from x_p and h_(p-1))");
  c->score_cmd = cmd;
}

void AddBenchCommand(CLI::App* app, Commands* c) {
  CLI::App* cmd = app->add_subcommand("bench", "Prompt and generation throughput");
  AddCommon(cmd, c->bench.common, false);
  cmd->option_defaults()->group("Benchmark");
  cmd->add_option("-p,--n-prompt", c->bench.n_prompt, "Prompt tokens (pp test)")
      ->check(IntRange(0, 1 << 30));
  cmd->add_option("-n,--n-gen", c->bench.n_gen, "Generated tokens (tg test)")
      ->check(IntRange(0, 1 << 30));
  cmd->add_option("-d,--depth", c->bench.depth, "Tokens already in the cache before tg")
      ->check(IntRange(0, 1 << 30));
  cmd->add_option("-r,--reps", c->bench.reps, "Repetitions (the median is reported)")
      ->check(IntRange(1, 1000));
  cmd->add_flag("--json", c->bench.json, "Print one JSON object");
  cmd->add_flag("!--no-warmup", c->bench.warmup,
                "pp: a fresh session per repetition, no untimed warm-up prompt (first-touch "
                "of the scratch buffers timed)");
  cmd->add_option("--parallel", c->bench.parallel,
                  "Batched decode: B sequences per step, e.g. 1,2,4,8 (each at DEPTH); the "
                  "counts take turns in each repetition, vs 1 the median of per-repetition ratios");
  cmd->add_flag("--roofline", c->bench.roofline,
                "tg against memory bandwidth measured in this run: a streaming read of a buffer "
                "8x the L3 (at least 256 MiB), two passes, the faster counted, on the same threads "
                "before and after every 16-step segment of each repetition (only the segments "
                "are timed); prints "
                "bytes/token, GB/s achieved and measured, and the share: the median of the "
                "per-segment shares (each against the mean of its two probes; every sample in "
                "--json)");
  cmd->option_defaults()->group(kGroupSpec);
  cmd->add_option("--spec", c->bench.spec,
                  "Speculative decoding on a fixed task set: off,lookup,draft,mtp (with -md, "
                  "--draft-max, --draft-p-min, --lookup-ngram, --kv-draft). Each request runs "
                  "every leg back to back (order rotated), short tasks several requests per "
                  "round, after one warm-up round; -r rounds. A second off (off,off) is a "
                  "control leg: its middle half of per-round ratios is printed beside each "
                  "ratio (wall clock, with the middle half, and by the process's CPU time), so "
                  "a ratio inside it is noise");
  cmd->add_option("--model-draft", c->bench.spec_options.draft_model, "Draft model (-md)");
  cmd->add_option("--draft-max", c->bench.spec_options.draft_max,
                  "Tokens drafted per step (default: 8)")
      ->default_str("");
  cmd->add_option("--draft-p-min", c->bench.spec_options.draft_p_min,
                  "Draft model's probability floor");
  cmd->add_option("--lookup-ngram", c->bench.spec_options.lookup_ngram,
                  "Shortest match prompt lookup drafts from");
  cmd->add_option("--kv-draft", c->bench.spec_options.kv_draft, "Draft model's KV mode");
  cmd->add_flag("--spec-fixed", c->bench.spec_options.fixed, "Always draft");
  c->bench_cmd = cmd;
}

void AddProbeCommand(CLI::App* app, Commands* c) {
  CLI::App* cmd = app->add_subcommand(
      "probe",
      "A/B the KV cache modes: prefill, counting, needle, JSON, copy, thinking, divergence");
  cmd->option_defaults()->group(kGroupModel);
  cmd->add_option("-m,--model", c->probe.model_path,
                  "GGUF model file (default: the shipped model); with --url, the model "
                  "name sent to the server");
  cmd->add_option("-c,--ctx", c->probe.n_ctx, "Context size per leg")->check(IntRange(64, 1 << 30));
  cmd->add_option("-t,--threads", c->probe.n_threads, "Threads (0: all cores)")->check(Threads());
  cmd->option_defaults()->group("Legs");
  cmd->add_option("--kv", c->probe.kv,
                  "KV modes, comma-separated (f32 reference first unless f32/f16 leads)");
  cmd->add_option("--kv-v-round", c->probe.kv_v_round,
                  "V roundings crossed with the quantized modes: rtn,stochastic");
  cmd->add_option("--kv-window", c->probe.kv_window,
                  "Recent full-precision windows crossed with the quantized modes, e.g. "
                  "0,32 (default: each mode's)");
  cmd->add_option("--spec", c->probe.spec,
                  "Speculative legs: off,lookup,draft,mtp crossed with every KV leg");
  cmd->add_option("--model-draft", c->probe.spec_options.draft_model,
                  "Draft model of the draft legs (-md; default <model>-draft.gguf)");
  cmd->add_option("--draft-max", c->probe.spec_options.draft_max,
                  "Tokens drafted per step (default: 8)")
      ->default_str("");
  cmd->add_option("--kv-draft", c->probe.spec_options.kv_draft, "Draft model's KV mode");
  cmd->option_defaults()->group("Probes");
  cmd->add_option("--probes", c->probe.probes,
                  "Probes: prefill,counting,needle,json,schema,copy,thinking,divergence");
  cmd->add_option("--needle-depths", c->probe.needle_depths, "Needle depths in percent");
  cmd->add_option("--needle-lengths", c->probe.needle_lengths, "Haystack lengths in tokens");
  cmd->add_option("--count-to", c->probe.count_to, "N of the counting probe")
      ->check(IntRange(1, 1 << 20));
  cmd->add_option("--divergence-tokens", c->probe.divergence_tokens,
                  "Tokens of teacher-forced text")
      ->check(IntRange(8, 1 << 30));
  cmd->add_option("--free-run-tokens", c->probe.free_run_tokens,
                  "Tokens generated by the free-running comparison")
      ->check(IntRange(0, 1 << 30));
  cmd->add_option("--text", c->probe.text_file,
                  "Text file for the divergence probe (default: seeded filler)");
  // The probe stays reproducible: its seed is fixed unless given.
  cmd->add_option("--seed", c->probe.seed, "Seed of texts, needles and stochastic rounding")
      ->check(Seed());
  cmd->add_option("--out", c->probe.out_dir, "Write probe.json and report.html here");
  cmd->option_defaults()->group("Server");
  cmd->add_option("--url", c->probe.url,
                  "Probe an OpenAI-compatible server (lamina serve, llama-server) as the "
                  "one leg: counting, needle, JSON and copy over /v1/chat/completions");
  cmd->add_option("--api-key", c->probe.api_key, "API key for --url (sent as a Bearer token)");
  // Test-only and hidden: plants a KV cache fault in one leg to show the probes catch it.
  cmd->add_option("--inject-fault", c->probe.inject_faults, "LEG_INDEX:FAULT (test-only)")
      ->group("");
  c->probe_cmd = cmd;
}

void AddInspectCommand(CLI::App* app, Commands* c) {
  CLI::App* cmd = app->add_subcommand("inspect", "Print a GGUF file's metadata and tensor table");
  cmd->add_option("model", c->inspect.model_path, "GGUF file")->required();
  cmd->add_flag("--json", c->inspect.json, "Print one JSON object");
  c->inspect_cmd = cmd;
}

// llama.cpp's spellings: the flags a subcommand does not take are refused by name (-cnv would
// be -c nv to CLI11), the rest rewritten to their long names (-md: --model-draft) by
// NormalizeLlamaArgs. An exit code.
int RefuseForeignFlags(CLI::App& app, int argc, char** argv) {
  if (argc <= 2) return kExitOk;
  const std::vector<std::string> typed(argv + 2, argv + argc);
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
    if (sub->get_name() != argv[1]) continue;
    const std::string error = ForeignFlagError(*sub, typed);
    if (!error.empty()) {
      std::fprintf(stderr, "%s\n", error.c_str());
      return kExitUsage;
    }
  }
  return kExitOk;
}

// Runs the subcommand that was parsed; an exit code.
int RunParsed(Commands& c) {
  if (*c.run_cmd) {
    if (c.run.prompt.empty() && c.run.prompt_file.empty() && !c.run_cmd->count("-p")) {
      // An empty prompt is allowed (BOS only) when given explicitly; otherwise say how to pass one.
      std::fprintf(stderr, "lamina: run needs -p PROMPT or -f FILE\n");
      return kExitUsage;
    }
    if (!ResolveModelPath(&c.run.common.model_path)) return kExitUsage;
    if (!c.run_cmd->count("--seed")) c.run.seed = RandomSeed();
    return RunGenerate(c.run);
  }
  if (*c.chat_cmd) {
    if (!ResolveModelPath(&c.chat.run.common.model_path)) return kExitUsage;
    c.chat.run.n_predict = c.chat_cmd->count("-n") ? c.chat.run.n_predict : 512;
    if (!c.chat_cmd->count("--seed")) c.chat.run.seed = RandomSeed();
    return RunChat(c.chat);
  }
  if (*c.score_cmd) {
    if (!ResolveModelPath(&c.score.common.model_path)) return kExitUsage;
    return RunScore(c.score);
  }
  if (*c.bench_cmd) {
    if (!ResolveModelPath(&c.bench.common.model_path)) return kExitUsage;
    return RunBench(c.bench);
  }
  if (*c.inspect_cmd) return RunInspect(c.inspect);
  if (*c.probe_cmd) return RunProbe(c.probe);
  return kExitUsage;
}

int Main(int argc, char** argv) {
  using namespace lamina::cli;
  if (argc == 2 &&
      (std::strcmp(argv[1], "version") == 0 || std::strcmp(argv[1], "--version") == 0)) {
    std::printf("%s\n", lamina::VersionLine().c_str());
    return kExitOk;
  }
  // `serve` parses its own flags, spelled as llama-server spells them (tools/server/).
  if (argc > 1 && std::strcmp(argv[1], "serve") == 0) return RunServeCommand(argc - 1, argv + 1);
  if (argc > 1 && argv[1][0] != '-') {
    bool known = false;
    for (const std::string& n : CommandNames()) known = known || n == argv[1];
    if (!known) return UnknownCommand(argv[1]);
  }
  CLI::App app{"lamina: LLM inference for GGUF models"};
  app.footer(
      "Also: lamina serve [flags] — an OpenAI- and llama-server-compatible HTTP server "
      "(lamina serve --help).");
  app.require_subcommand(1);
  app.set_version_flag("--version", lamina::VersionLine());
  // Every option's help shows its default (options whose default is "the model's" or "the
  // mode's" say so in their description instead).
  app.option_defaults()->always_capture_default();
  Commands c;
  AddRunCommand(&app, &c);
  AddChatCommand(&app, &c);
  AddScoreCommand(&app, &c);
  AddBenchCommand(&app, &c);
  AddProbeCommand(&app, &c);
  AddInspectCommand(&app, &c);
  if (int rc = RefuseForeignFlags(app, argc, argv); rc != kExitOk) return rc;
  std::vector<std::string> args = NormalizeLlamaArgs(argc, argv);
  std::vector<char*> arg_ptrs;
  for (std::string& a : args) arg_ptrs.push_back(a.data());
  try {
    app.parse(static_cast<int>(arg_ptrs.size()), arg_ptrs.data());
  } catch (const CLI::ParseError& e) {
    return ParseErrorExit(app, e);
  }
  return RunParsed(c);
}
}  // namespace

int main(int argc, char** argv) {
  // The memory guard refuses plans over the limit up front; an allocation that still fails
  // (the machine's memory taken by others meanwhile) ends here with a message, not an abort.
  try {
    return Main(argc, argv);
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr,
                 "lamina: out of memory: an allocation failed (lower --ctx-size, --kv, "
                 "--parallel or --mem-limit)\n");
    return lamina::cli::kExitOutOfMemory;
  } catch (const std::length_error&) {  // a container asked for more than it can address
    std::fprintf(stderr,
                 "lamina: out of memory: an allocation failed (lower --ctx-size, --kv, "
                 "--parallel or --mem-limit)\n");
    return lamina::cli::kExitOutOfMemory;
  }
}
