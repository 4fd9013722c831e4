// `lamina bench`: llama-bench style throughput. pp: a P-token random prompt as one batch into a
// fresh cache; tg: N single-token decodes after DEPTH tokens are already in the cache. Reports
// the median over REPS, and the decode roofline from the bytes each token reads.
#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>

#include "cli_common.h"
#include "runtime/session.h"
#include "util/timer.h"

namespace lamina::cli {

namespace {
double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}
}  // namespace

int RunBench(const BenchOptions& o) {
  if (o.n_prompt < 0 || o.n_gen < 0 || o.depth < 0 || o.reps < 1) {
    std::fprintf(stderr, "lamina: -p, -n, -d must be >= 0 and -r >= 1\n");
    return kExitUsage;
  }
  LoadedModel lm = LoadModelForCli(o.common);
  if (!lm.model) return kExitBadInput;
  const Model& model = *lm.model;
  const Hparams& hp = model.hparams();
  ThreadPool pool(o.common.n_threads);
  SessionConfig sc;
  int rc = kExitOk;
  if (!MakeSessionConfig(o.common, model, &sc, &rc)) return rc;
  if (o.common.n_ctx == 0) sc.n_ctx = std::max(o.n_prompt, o.depth + o.n_gen + 1) + 1;
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int32_t> dist(0, hp.n_vocab - 1);
  auto random_tokens = [&](int n) {
    std::vector<int32_t> t(n);
    for (auto& x : t) x = dist(rng);
    return t;
  };

  std::vector<double> pp, tg;
  size_t kv_bytes_per_token = 0;
  for (int rep = 0; rep < o.reps; ++rep) {
    if (o.n_prompt > 0) {
      Session s(model, sc, pool);
      std::vector<int32_t> prompt = random_tokens(o.n_prompt);
      const double t0 = NowSeconds();
      Result<const float*> r = s.Eval(prompt, false);
      const double dt = NowSeconds() - t0;
      if (!r.ok()) {
        std::fprintf(stderr, "lamina: %s\n", r.error().message.c_str());
        return kExitFailure;
      }
      pp.push_back(o.n_prompt / dt);
    }
    if (o.n_gen > 0) {
      Session s(model, sc, pool);
      kv_bytes_per_token = s.cache().BytesPerToken();
      // The cache is filled through its writer with random cells rather than by a DEPTH-token
      // prompt: decode speed depends on how many cells are read, not on what they hold.
      if (o.depth > 0) s.FillWithRandomCells(o.depth, 1234 + rep);
      std::vector<int32_t> gen = random_tokens(o.n_gen + 1);
      // One untimed warm-up step first (first-touch of scratch buffers), as llama-bench does.
      if (Result<const float*> r = s.Eval(&gen[o.n_gen], 1, false); !r.ok()) {
        std::fprintf(stderr, "lamina: %s\n", r.error().message.c_str());
        return kExitFailure;
      }
      const double t0 = NowSeconds();
      for (int i = 0; i < o.n_gen; ++i) {
        Result<const float*> r = s.Eval(&gen[i], 1, false);
        if (!r.ok()) {
          std::fprintf(stderr, "lamina: %s\n", r.error().message.c_str());
          return kExitFailure;
        }
      }
      tg.push_back(o.n_gen / (NowSeconds() - t0));
    }
  }
  const double pp_med = Median(pp), tg_med = Median(tg);
  // Bytes read per decoded token: all weights but the embedding rows, plus the K/V cells
  // attended (depth, the warm-up token and half the generated tokens on average).
  const double kv_read = static_cast<double>(kv_bytes_per_token) * (o.depth + 1 + o.n_gen / 2.0);
  const double bytes_per_token = static_cast<double>(model.WeightBytesPerToken()) + kv_read;
  if (o.json) {
    nlohmann::json j;
    j["model"] = o.common.model_path;
    j["n_params"] = model.ParameterCount();
    j["threads"] = pool.size();
    j["kv"] = KvTypeName(sc.kv_type);
    j["n_prompt"] = o.n_prompt;
    j["n_gen"] = o.n_gen;
    j["depth"] = o.depth;
    j["reps"] = o.reps;
    j["pp_tok_s"] = pp_med;
    j["tg_tok_s"] = tg_med;
    j["pp_samples"] = pp;
    j["tg_samples"] = tg;
    j["bytes_per_token"] = bytes_per_token;
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("model %s | %.1fM params | %d threads | kv %s\n", o.common.model_path.c_str(),
                model.ParameterCount() / 1e6, pool.size(), KvTypeName(sc.kv_type));
    if (o.n_prompt > 0) std::printf("pp%-6d %10.2f tok/s\n", o.n_prompt, pp_med);
    if (o.n_gen > 0) {
      std::printf("tg%-6d %10.2f tok/s (depth %d; %.1f MB read per token)\n", o.n_gen, tg_med,
                  o.depth, bytes_per_token / 1e6);
    }
  }
  return kExitOk;
}

}  // namespace lamina::cli
