// Shared CLI helpers.
#include "cli_common.h"

#include <unistd.h>

#include <fstream>
#include <map>
#include <sstream>

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

std::vector<std::string> NormalizeLlamaArgs(int argc, char** argv) {
  static const std::map<std::string, std::string> kAliases = {{"-np", "--parallel"},
                                                              {"-fa", "--flash-attn"},
                                                              {"-ngl", "--n-gpu-layers"},
                                                              {"-cb", "--cont-batching"},
                                                              {"-nocb", "--no-cont-batching"},
                                                              {"-ub", "--ubatch-size"},
                                                              {"-tb", "--threads-batch"},
                                                              {"-kvu", "--kv-unified"},
                                                              {"-ctk", "--cache-type-k"},
                                                              {"-ctv", "--cache-type-v"},
                                                              {"-sm", "--split-mode"},
                                                              {"-mg", "--main-gpu"},
                                                              {"-dev", "--device"},
                                                              {"-to", "--timeout"},
                                                              {"-md", "--model-draft"}};
  std::vector<std::string> out;
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    auto it = kAliases.find(a);
    out.push_back(it != kAliases.end() ? it->second : a);
  }
  return out;
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
  Result<KvCacheConfig> kc = MakeKvCacheConfig(model.hparams(), *out);
  if (!kc.ok()) {
    std::fprintf(stderr, "lamina: %s\n", kc.error().message.c_str());
    *exit_code = kExitUsage;
    return false;
  }
  return true;
}

SamplerConfig MakeSamplerConfig(const RunOptions& o) {
  SamplerConfig samp;
  samp.temperature = o.temperature;
  samp.top_k = o.top_k;
  samp.top_p = o.top_p;
  samp.min_p = o.min_p;
  samp.repeat_penalty = o.repeat_penalty;
  samp.seed = o.seed;
  return samp;
}

void PrintKvSummary(const KvCache& cache) {
  const KvCacheConfig& c = cache.config();
  std::fprintf(stderr,
               "lamina: kv cache %s (V rounding %s): %.2f bits/elem, %zu bytes/token, %.2f MiB for %d tokens\n",
               KvTypeName(c.type), KvRoundingName(c.v_rounding), cache.BitsPerElement(), cache.BytesPerToken(),
               cache.BytesTotal() / (1024.0 * 1024.0), c.n_ctx);
}

}  // namespace lamina::cli
