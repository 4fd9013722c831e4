// Shared CLI helpers.
#include "cli_common.h"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>

#include "runtime/generate.h"
#include "runtime/recurrent_state.h"
#include "runtime/session_file.h"
#include "util/memory.h"
#include "util/timer.h"

namespace lamina::cli {

LoadedModel LoadModelForCli(const std::string& path) {
  CommonOptions options;
  options.model_path = path;
  return LoadModelForCli(options);
}

LoadedModel LoadModelForCli(const CommonOptions& options) {
  LoadedModel out;
  RopeOverrides rope;
  if (options.rope_scaling == "none") rope.type = RopeScalingType::kNone;
  if (options.rope_scaling == "linear") rope.type = RopeScalingType::kLinear;
  if (options.rope_scaling == "yarn") rope.type = RopeScalingType::kYarn;
  rope.scale = options.rope_scale;
  rope.yarn_orig_ctx = options.yarn_orig_ctx;
  const double t0 = NowSeconds();
  Result<std::unique_ptr<Model>> model = LoadModel(options.model_path, rope);
  out.load_seconds = NowSeconds() - t0;
  if (!model.ok()) {
    std::fprintf(stderr, "lamina: %s\n", model.error().message.c_str());
    return out;
  }
  out.model = std::move(*model);
  return out;
}

namespace {

// llama.cpp's one-dash spellings of long flags (-np, -fa, -md, ...): CLI11 would read "-np" as
// "-n p", so each is rewritten to its long name before parsing.
const std::map<std::string, std::string>& LlamaAliases() {
  static const std::map<std::string, std::string> kAliases = {{"-np", "--parallel"},
                                                              {"-fa", "--flash-attn"},
                                                              {"-ngl", "--n-gpu-layers"},
                                                              {"-cb", "--cont-batching"},
                                                              {"-nocb", "--no-cont-batching"},
                                                              {"-ub", "--ubatch-size"},
                                                              {"-tb", "--threads-batch"},
                                                              {"-kvu", "--kv-unified"},
                                                              {"-no-kvu", "--no-kv-unified"},
                                                              {"-bs", "--backend-sampling"},
                                                              {"-ctk", "--cache-type-k"},
                                                              {"-ctv", "--cache-type-v"},
                                                              {"-sm", "--split-mode"},
                                                              {"-mg", "--main-gpu"},
                                                              {"-dev", "--device"},
                                                              {"-to", "--timeout"},
                                                              {"-md", "--model-draft"},
                                                              {"-jf", "--json-schema-file"},
                                                              {"-sys", "--system-prompt"},
                                                              {"-cnv", "--conversation"},
                                                              {"-if", "--interactive-first"},
                                                              {"-mli", "--multiline-input"},
                                                              {"-rea", "--reasoning"}};
  return kAliases;
}

struct ForeignFlag {
  const char* short_name;  // llama.cpp's one-dash spelling, or ""
  const char* long_name;   // its long spelling, or ""
  const char* advice;      // what to use with lamina instead
};

// llama.cpp flags (llama-cli, llama-bench, llama-server) and what to use instead where a lamina
// subcommand does not take them. A subcommand that does take one (serve: -fa, -ngl, ...; bench:
// --parallel) never gets here.
constexpr ForeignFlag kForeignFlags[] = {
    {"-cnv", "--conversation", "use `lamina chat` for a conversation"},
    {"-no-cnv", "--no-conversation", "`lamina run` never converses; drop it"},
    {"-st", "--single-turn", "use `lamina run --chat -p TEXT` for one turn"},
    {"-i", "--interactive", "use `lamina chat`"},
    {"-if", "--interactive-first", "use `lamina chat`"},
    {"-mli", "--multiline-input", "use `lamina chat`"},
    {"-sys", "--system-prompt", "use `lamina chat --system TEXT`"},
    {"-r", "--reverse-prompt", "generation stops at the model's end-of-generation tokens"},
    {"-ngl", "--n-gpu-layers", "lamina runs on the CPU; drop it"},
    {"", "--gpu-layers", "lamina runs on the CPU; drop it"},
    {"-ngld", "--n-gpu-layers-draft", "lamina runs on the CPU; drop it"},
    {"-dev", "--device", "lamina runs on the CPU; drop it"},
    {"-devd", "--device-draft", "lamina runs on the CPU; drop it"},
    {"-sm", "--split-mode", "lamina runs on the CPU; drop it"},
    {"-mg", "--main-gpu", "lamina runs on the CPU; drop it"},
    {"-ts", "--tensor-split", "lamina runs on the CPU; drop it"},
    {"-nkvo", "--no-kv-offload", "lamina runs on the CPU; drop it"},
    {"-ot", "--override-tensor", "lamina runs on the CPU; drop it"},
    {"-otd", "--override-tensor-draft", "lamina runs on the CPU; drop it"},
    {"-cmoe", "--cpu-moe", "lamina runs on the CPU; drop it"},
    {"-ncmoe", "--n-cpu-moe", "lamina runs on the CPU; drop it"},
    {"-fa", "--flash-attn", "lamina's attention is always tiled (flash-style); drop it"},
    {"-ctk", "--cache-type-k", "use --kv MODE (K and V together: f16, int8, k8v4, q4_0, ...)"},
    {"-ctv", "--cache-type-v", "use --kv MODE (K and V together: f16, int8, k8v4, q4_0, ...)"},
    {"-ctkd", "--cache-type-k-draft", "use --kv-draft MODE"},
    {"-ctvd", "--cache-type-v-draft", "use --kv-draft MODE"},
    {"-np", "--parallel", "one sequence here; `lamina serve -np N` serves N at once"},
    {"-cb", "--cont-batching", "a server flag (`lamina serve` always batches continuously)"},
    {"-nocb", "--no-cont-batching", "a server flag; drop it"},
    {"-kvu", "--kv-unified", "a server flag; drop it"},
    {"-to", "--timeout", "a server flag; drop it"},
    {"-b", "--batch-size", "use `lamina run --prompt-chunk N` for the prompt's batch size"},
    {"-ub", "--ubatch-size", "lamina has no micro-batches; drop it"},
    {"-tb", "--threads-batch", "-t N sets the threads of the prompt and of generation alike"},
    {"-dt", "--defrag-thold", "lamina's KV cache needs no defragmentation; drop it"},
    {"-lv", "--verbosity", "lamina has no log levels; drop it"},
    {"-v", "--verbose", "lamina has no log levels; drop it"},
    {"-sp", "--special", "not supported by lamina; drop it"},
    {"-ps", "--draft-p-split", "use --draft-p-min P"},
    {"-mu", "--model-url", "lamina reads local GGUF files: download it, then pass -m FILE"},
    {"-hf", "--hf-repo", "lamina reads local GGUF files: download it, then pass -m FILE"},
    {"-hff", "--hf-file", "lamina reads local GGUF files: download it, then pass -m FILE"},
    {"-hft", "--hf-token", "lamina reads local GGUF files: download it, then pass -m FILE"},
    {"-dr", "--docker-repo", "lamina reads local GGUF files: download it, then pass -m FILE"},
    {"-pg", "", "use -p N -n M (bench runs the prompt and the generation tests)"},
    {"-o", "", "use --json for machine-readable output"},
    {"", "--mlock", "lamina does not lock the model in memory; drop it"},
    {"", "--no-mmap", "lamina reads the model into memory; drop it"},
};

}  // namespace

std::vector<std::string> NormalizeLlamaArgs(int argc, char** argv) {
  std::vector<std::string> out;
  for (int i = 0; i < argc; ++i) {
    const std::string long_name = LlamaLongName(argv[i]);
    out.push_back(long_name.empty() ? std::string(argv[i]) : long_name);
  }
  return out;
}

std::string LlamaLongName(const std::string& flag) {
  auto it = LlamaAliases().find(flag);
  return it != LlamaAliases().end() ? it->second : "";
}

std::string LlamaFlagAdvice(const std::string& flag) {
  if (flag.empty()) return "";
  for (const ForeignFlag& f : kForeignFlags) {
    if (flag == f.short_name || flag == f.long_name) return f.advice;
  }
  return "";
}

bool StderrIsTerminal() { return ::isatty(STDERR_FILENO) == 1; }

bool ReadTextFile(const std::string& path, std::string* out, std::string* error) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    *error = path + ": cannot open";
    return false;
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  *out = ss.str();
  return true;
}

bool MakeSessionConfig(const CommonOptions& o, const Model& model, SessionConfig* out,
                       int* exit_code) {
  Result<KvType> kv = ParseKvType(o.kv);
  if (!kv.ok()) {
    std::fprintf(stderr, "lamina: --kv: %s\n", kv.error().message.c_str());
    *exit_code = kExitUsage;
    return false;
  }
  Result<KvRounding> round = ParseKvRounding(o.kv_v_round);
  if (!round.ok()) {
    std::fprintf(stderr, "lamina: --kv-v-round: %s\n", round.error().message.c_str());
    *exit_code = kExitUsage;
    return false;
  }
  if (o.n_ctx < 0) {
    std::fprintf(stderr, "lamina: -c must not be negative\n");
    *exit_code = kExitUsage;
    return false;
  }
  out->n_ctx = o.n_ctx;
  out->kv_type = *kv;
  out->v_rounding = *round;
  out->kv_seed = o.kv_seed;
  out->kv_window = o.kv_window < 0 ? kKvWindowModeDefault : o.kv_window;
  out->swa_full = o.swa_full;
  out->recurrent_ring = o.recurrent_ring;
  Result<KvCacheConfig> kc = MakeKvCacheConfig(model.hparams(), *out);
  if (!kc.ok()) {
    std::fprintf(stderr, "lamina: %s\n", kc.error().message.c_str());
    *exit_code = kExitUsage;
    return false;
  }
  // The cache alone first (the batch is checked where its size is known).
  return CheckMemoryPlan(o, model, out, 0, 0, 0, "", exit_code);
}

bool CheckMemoryPlan(const CommonOptions& o, const Model& model, SessionConfig* sc,
                     int batch_tokens, int logit_rows, uint64_t extra, const char* batch_hint,
                     int* exit_code, uint64_t mtp_bytes) {
  Result<MemoryLimit> limit = ResolveMemoryLimit(o.mem_limit, std::getenv("LAMINA_MEM_LIMIT"));
  if (!limit.ok()) {
    std::fprintf(stderr, "lamina: %s\n", limit.error().message.c_str());
    *exit_code = kExitUsage;
    return false;
  }
  sc->memory_limit = limit->bytes;
  Result<KvCacheConfig> kc = MakeKvCacheConfig(model.hparams(), *sc);
  if (!kc.ok()) {
    std::fprintf(stderr, "lamina: %s\n", kc.error().message.c_str());
    *exit_code = kExitUsage;
    return false;
  }
  // The KV cache and, on hybrid models, every sequence's ring of recurrent states.
  const uint64_t recurrent =
      RecurrentState::PlanBytes(model.hparams().recurrent, kc->n_seq, sc->recurrent_ring);
  const uint64_t cache = SatAdd(KvCacheBytes(*kc), recurrent);
  const uint64_t batch = batch_tokens > 0 || logit_rows > 0
                             ? ForwardBytes(model.hparams(), batch_tokens, logit_rows)
                             : 0;
  const uint64_t total = SatAdd(SatAdd(SatAdd(cache, batch), extra), mtp_bytes);
  if (total <= limit->bytes) return true;
  const std::string limit_text = FormatBytes(limit->bytes) + " (" + limit->source +
                                 "; change it with --mem-limit or LAMINA_MEM_LIMIT)";
  if (recurrent > 0 && cache > limit->bytes && recurrent > KvCacheBytes(*kc)) {
    std::fprintf(stderr,
                 "lamina: the recurrent states (%d per sequence x %d sequence%s) need %s besides "
                 "the %s KV cache, over the memory limit of %s; lower --recurrent-ring or use "
                 "fewer --parallel sequences\n",
                 sc->recurrent_ring, kc->n_seq, kc->n_seq == 1 ? "" : "s",
                 FormatBytes(recurrent).c_str(), FormatBytes(KvCacheBytes(*kc)).c_str(),
                 limit_text.c_str());
  } else if (mtp_bytes > 0 && SatAdd(cache, mtp_bytes) > limit->bytes) {
    std::fprintf(stderr,
                 "lamina: --spec mtp needs %s for the MTP head's KV cache and the kept hidden "
                 "states (%d tokens x %d sequence%s) besides the %s KV cache, over the memory "
                 "limit of %s; lower --ctx-size/-c, choose a smaller --kv-draft mode, use fewer "
                 "--parallel sequences or another --spec mode\n",
                 FormatBytes(mtp_bytes).c_str(), kc->n_ctx, kc->n_seq, kc->n_seq == 1 ? "" : "s",
                 FormatBytes(cache).c_str(), limit_text.c_str());
  } else if (cache > limit->bytes) {
    std::fprintf(stderr,
                 "lamina: the KV cache (%s, %d tokens x %d sequence%s) needs %s, over the memory "
                 "limit of %s; lower --ctx-size/-c, choose a smaller --kv mode or fewer --parallel "
                 "sequences\n",
                 KvTypeName(kc->type), kc->n_ctx, kc->n_seq, kc->n_seq == 1 ? "" : "s",
                 FormatBytes(cache).c_str(), limit_text.c_str());
  } else {
    std::string kept = extra > 0 ? " (and " + FormatBytes(extra) + " of kept logits)" : "";
    if (mtp_bytes > 0) kept += " (and " + FormatBytes(mtp_bytes) + " for --spec mtp)";
    std::fprintf(stderr,
                 "lamina: a batch of %d tokens needs %s%s besides the %s KV cache, over the memory "
                 "limit of %s; %s\n",
                 batch_tokens, FormatBytes(batch).c_str(), kept.c_str(), FormatBytes(cache).c_str(),
                 limit_text.c_str(), batch_hint);
  }
  *exit_code = kExitUsage;
  return false;
}

bool RestoreSessionForCli(const RunOptions& o, Session& session, uint64_t model_hash,
                          const std::vector<int32_t>* prompt, std::string* app, int* exit_code) {
  Result<SessionRestore> r = LoadSessionFile(o.session, session, 0, model_hash);
  if (!r.ok()) {
    if (!o.session_fresh_on_error) {
      std::fprintf(stderr, "lamina: session %s (--session-fresh-on-error reads the prompt again)\n",
                   r.error().message.c_str());
      *exit_code = kExitBadInput;
      return false;
    }
    std::fprintf(stderr, "lamina: warning: session %s; starting fresh\n",
                 r.error().message.c_str());
    session.Truncate(0, 0);
    return true;
  }
  if (!r->found) {
    std::fprintf(stderr, "lamina: session %s: new file\n", o.session.c_str());
    return true;
  }
  if (app != nullptr) *app = r->app;
  if (prompt != nullptr) {
    const int kept = ReusePrefix(session, 0, *prompt);
    std::fprintf(stderr,
                 "lamina: session %s: restored %d of the prompt's %zu tokens (the file held %d)\n",
                 o.session.c_str(), kept, prompt->size(), r->n_file);
  } else {
    std::fprintf(stderr, "lamina: session %s: restored %d tokens\n", o.session.c_str(), r->n_file);
  }
  return true;
}

bool SaveSessionForCli(const RunOptions& o, Session& session, uint64_t model_hash,
                       const std::vector<int32_t>& history, const std::string& app,
                       int* exit_code) {
  Status st = CatchUp(session, 0, history);
  if (st.ok()) st = SaveSessionFile(o.session, session, 0, model_hash, app);
  if (!st.ok()) {
    std::fprintf(stderr, "lamina: session %s\n", st.error().message.c_str());
    *exit_code = kExitFailure;
    return false;
  }
  return true;
}

std::vector<SamplerStage> ParseSamplerStages(const std::string& names, std::string* error) {
  std::vector<SamplerStage> out;
  size_t begin = 0;
  while (begin <= names.size() && !names.empty()) {
    size_t end = names.find(';', begin);
    if (end == std::string::npos) end = names.size();
    const std::string name = names.substr(begin, end - begin);
    SamplerStage stage;
    if (!name.empty()) {
      if (!SamplerStageFromName(name, &stage)) {
        if (error) {
          *error = "unknown sampler '" + name +
                   "' (known: penalties, dry, top_k, typ_p, top_p, min_p, xtc, temperature)";
        }
        return {};
      }
      out.push_back(stage);
    }
    begin = end + 1;
  }
  return out;
}

SamplerConfig MakeSamplerConfig(const RunOptions& o) {
  SamplerConfig samp;
  samp.temperature = o.temperature;
  samp.top_k = o.top_k;
  samp.top_p = o.top_p;
  samp.min_p = o.min_p;
  samp.repeat_penalty = o.repeat_penalty;
  samp.repeat_last_n = o.repeat_last_n;
  ApplySamplerChain(o.chain, &samp);
  samp.seed = o.seed;
  // The seed (random unless --seed gave it) on stderr, so that a sampled run can be repeated.
  if (o.temperature > 0.0f) {
    std::fprintf(stderr, "lamina: seed: %llu\n", static_cast<unsigned long long>(o.seed));
  }
  return samp;
}

void PrintKvSummary(const KvCache& cache) {
  const KvCacheConfig& c = cache.config();
  std::string window;
  if (cache.window() > 0) {
    window = ", window of " + std::to_string(cache.window()) + " exact cells (" +
             std::to_string(cache.WindowBytes() / 1024) + " KiB)";
  }
  if (cache.has_rings()) {
    window += ", sliding-window layers in rings of " + std::to_string(cache.ring_cells()) +
              " cells (" + std::to_string(cache.RingBytes() / 1024) + " KiB; --swa-full: all)";
  }
  std::fprintf(stderr,
               "lamina: kv cache %s (V rounding %s): %.2f bits/elem, %zu bytes/token, %.2f MiB for "
               "%d tokens%s\n",
               KvTypeName(c.type), KvRoundingName(c.v_rounding), cache.BitsPerElement(),
               cache.BytesPerToken(), cache.BytesTotal() / (1024.0 * 1024.0), c.n_ctx,
               window.c_str());
}

void AnswerPrinter::Write(const std::string& text) {
  if (text.empty()) return;
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fflush(stdout);
}

void AnswerPrinter::Parts(const chat::AnswerParts& p) {
  if (!p.reasoning.empty()) {
    if (!thinking_open_) Write("<think>\n");
    thinking_open_ = true;
    Write(p.reasoning);
  }
  if (thinking_open_ && (!p.content.empty() || !p.calls.empty())) {
    Write("\n</think>\n\n");
    thinking_open_ = false;
  }
  Write(p.content);
  for (const chat::ToolCall& c : p.calls) Write("[call " + c.name + " " + c.arguments + "]\n");
}

void AnswerPrinter::Print(const std::string& piece) {
  if (!harmony_) return Write(piece);
  Parts(splitter_.Push(piece));
}

void AnswerPrinter::Finish() {
  if (!harmony_) return;
  Parts(splitter_.Flush());
  if (thinking_open_) Write("\n</think>\n");
  thinking_open_ = false;
}

}  // namespace lamina::cli
