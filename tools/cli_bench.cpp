// `lamina bench`: llama-bench style throughput. pp: a P-token random prompt as one batch into a
// fresh cache; tg: N single-token decodes after DEPTH tokens are already in the cache. Reports
// the median over REPS, and the decode roofline from the bytes each token reads. --parallel B:
// B sequences decode together, one token each per forward pass (the server's batched decode).
#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>

#include "cli_common.h"
#include "cli_spec.h"
#include "runtime/session.h"
#include "util/timer.h"

namespace lamina::cli {

namespace {
double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}
}  // namespace

namespace {
// --parallel: B sequences (each DEPTH cells deep) decode one token each per forward pass.
struct ParallelFigure {
  int n_seq = 0;
  double aggregate_tok_s = 0.0;
  double per_seq_tok_s = 0.0;
};

Result<ParallelFigure> BenchParallel(const Model& model, SessionConfig sc, const BenchOptions& o,
                                     int n_seq, int rep, ThreadPool& pool) {
  sc.n_seq = n_seq;
  Session s(model, sc, pool);
  if (o.depth > 0) {
    s.FillWithRandomCells(o.depth, 1234 + rep);
    for (int q = 1; q < n_seq; ++q) s.CopyPrefix(0, q, o.depth);
  }
  std::mt19937 rng(99 + rep);
  std::uniform_int_distribution<int32_t> dist(0, model.hparams().n_vocab - 1);
  SequenceBatch batch;
  auto step = [&]() -> Status {
    batch.Clear();
    for (int q = 0; q < n_seq; ++q) batch.Add(dist(rng), q, s.n_past(q), true);
    Result<const float*> r = s.Decode(batch);
    return r.ok() ? Status::Ok() : Status(r.error());
  };
  if (Status st = step(); !st.ok()) return st.error();  // warm-up
  const double t0 = NowSeconds();
  for (int i = 0; i < o.n_gen; ++i) {
    if (Status st = step(); !st.ok()) return st.error();
  }
  const double dt = NowSeconds() - t0;
  return ParallelFigure{n_seq, n_seq * o.n_gen / dt, o.n_gen / dt};
}
}  // namespace

namespace {

// --parallel's stream counts, "1,2,4,8"; false (after the message) when one is out of range.
bool ParseStreamCounts(const std::string& list, std::vector<int>* counts) {
  for (size_t start = 0; start < list.size();) {
    const size_t comma = std::min(list.find(',', start), list.size());
    const int b = std::atoi(list.substr(start, comma - start).c_str());
    if (b < 1 || b > 256) {
      std::fprintf(stderr, "lamina: --parallel takes counts in 1..256, e.g. 1,2,4,8\n");
      return false;
    }
    counts->push_back(b);
    start = comma + 1;
  }
  return true;
}

// --parallel: the aggregate and per-stream decode speed of each stream count; an exit code.
int RunParallelBench(const BenchOptions& o, const Model& model, SessionConfig sc,
                     ThreadPool& pool) {
  std::vector<int> counts;
  if (!ParseStreamCounts(o.parallel, &counts)) return kExitUsage;
  if (o.n_gen < 1) {
    std::fprintf(stderr, "lamina: --parallel needs -n >= 1\n");
    return kExitUsage;
  }
  if (o.common.n_ctx == 0) sc.n_ctx = o.depth + o.n_gen + 2;
  int rc = kExitOk;
  for (int b : counts) {
    SessionConfig planned = sc;
    planned.n_seq = b;
    if (!CheckMemoryPlan(o.common, model, &planned, b, b, 0, "use fewer --parallel streams", &rc)) {
      return rc;
    }
  }
  nlohmann::json rows = nlohmann::json::array();
  if (!o.json) {
    std::printf("model %s | %.1fM params | %d threads | kv %s | depth %d | %d steps\n",
                o.common.model_path.c_str(), model.ParameterCount() / 1e6, pool.size(),
                KvTypeName(sc.kv_type), o.depth, o.n_gen);
    std::printf("%8s %16s %16s %10s\n", "streams", "aggregate tok/s", "per-stream tok/s", "vs 1");
  }
  double single = 0.0;
  for (int b : counts) {
    std::vector<double> agg, per;
    for (int rep = 0; rep < o.reps; ++rep) {
      Result<ParallelFigure> f = BenchParallel(model, sc, o, b, rep, pool);
      if (!f.ok()) {
        std::fprintf(stderr, "lamina: %s\n", f.error().message.c_str());
        return kExitFailure;
      }
      agg.push_back(f->aggregate_tok_s);
      per.push_back(f->per_seq_tok_s);
    }
    const double a = Median(agg), p = Median(per);
    if (b == 1) single = a;
    rows.push_back({{"streams", b}, {"aggregate_tok_s", a}, {"per_stream_tok_s", p}});
    if (!o.json) {
      std::printf("%8d %16.2f %16.2f %9.2fx\n", b, a, p, single > 0 ? a / single : 0.0);
    }
  }
  if (o.json) {
    nlohmann::json j = {{"model", o.common.model_path},
                        {"n_params", model.ParameterCount()},
                        {"threads", pool.size()},
                        {"kv", KvTypeName(sc.kv_type)},
                        {"depth", o.depth},
                        {"n_gen", o.n_gen},
                        {"parallel", rows}};
    std::printf("%s\n", j.dump().c_str());
  }
  return kExitOk;
}

// The pp and tg speeds of every repetition.
struct BenchSamples {
  std::vector<double> pp, tg;
  size_t kv_bytes_per_token = 0;
};

// Runs the pp and tg tests REPS times; false (after the message) when an evaluation fails.
bool MeasureBench(const BenchOptions& o, const Model& model, const SessionConfig& sc,
                  ThreadPool& pool, BenchSamples* out) {
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int32_t> dist(0, model.hparams().n_vocab - 1);
  auto random_tokens = [&](int n) {
    std::vector<int32_t> t(n);
    for (auto& x : t) x = dist(rng);
    return t;
  };
  // pp: as llama-bench, one untimed warm-up prompt on the session every repetition reuses (its
  // cache cleared first); with --no-warmup a fresh session per repetition.
  std::optional<Session> pp_session;
  if (o.n_prompt > 0 && o.warmup) {
    pp_session.emplace(model, sc, pool);
    if (Result<const float*> r = pp_session->Eval(random_tokens(o.n_prompt), false); !r.ok()) {
      std::fprintf(stderr, "lamina: %s\n", r.error().message.c_str());
      return false;
    }
  }
  for (int rep = 0; rep < o.reps; ++rep) {
    if (o.n_prompt > 0) {
      std::optional<Session> fresh;
      if (!o.warmup) fresh.emplace(model, sc, pool);
      Session& s = o.warmup ? *pp_session : *fresh;
      s.Truncate(0);
      std::vector<int32_t> prompt = random_tokens(o.n_prompt);
      const double t0 = NowSeconds();
      Result<const float*> r = s.Eval(prompt, false);
      const double dt = NowSeconds() - t0;
      if (!r.ok()) {
        std::fprintf(stderr, "lamina: %s\n", r.error().message.c_str());
        return false;
      }
      out->pp.push_back(o.n_prompt / dt);
    }
    if (o.n_gen > 0) {
      Session s(model, sc, pool);
      out->kv_bytes_per_token = s.cache().BytesPerToken();
      // The cache is filled through its writer with random cells rather than by a DEPTH-token
      // prompt: decode speed depends on how many cells are read, not on what they hold.
      if (o.depth > 0) s.FillWithRandomCells(o.depth, 1234 + rep);
      std::vector<int32_t> gen = random_tokens(o.n_gen + 1);
      // One untimed warm-up step first (first-touch of scratch buffers), as llama-bench does.
      if (Result<const float*> r = s.Eval(&gen[o.n_gen], 1, false); !r.ok()) {
        std::fprintf(stderr, "lamina: %s\n", r.error().message.c_str());
        return false;
      }
      const double t0 = NowSeconds();
      for (int i = 0; i < o.n_gen; ++i) {
        Result<const float*> r = s.Eval(&gen[i], 1, false);
        if (!r.ok()) {
          std::fprintf(stderr, "lamina: %s\n", r.error().message.c_str());
          return false;
        }
      }
      out->tg.push_back(o.n_gen / (NowSeconds() - t0));
    }
  }
  return true;
}

// The medians and the decode roofline, as a table or one JSON object.
void PrintBench(const BenchOptions& o, const Model& model, const SessionConfig& sc,
                const ThreadPool& pool, const BenchSamples& s) {
  const std::vector<double>& pp = s.pp;
  const std::vector<double>& tg = s.tg;
  const double pp_med = Median(pp), tg_med = Median(tg);
  // Bytes read per decoded token: all weights but the embedding rows, plus the K/V cells
  // attended (depth, the warm-up token and half the generated tokens on average).
  const double kv_read = static_cast<double>(s.kv_bytes_per_token) * (o.depth + 1 + o.n_gen / 2.0);
  // Hybrid models also read (and write back) every recurrent layer's conv tail and delta state.
  const RecurrentShape& rec = model.hparams().recurrent;
  const double state_read = static_cast<double>(rec.n_layer) *
                            static_cast<double>(rec.conv_floats() + rec.state_floats()) *
                            sizeof(float);
  const double bytes_per_token =
      static_cast<double>(model.WeightBytesPerToken()) + kv_read + state_read;
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
    j["state_bytes_per_token"] = state_read;
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("model %s | %.1fM params | %d threads | kv %s\n", o.common.model_path.c_str(),
                model.ParameterCount() / 1e6, pool.size(), KvTypeName(sc.kv_type));
    if (o.n_prompt > 0) std::printf("pp%-6d %10.2f tok/s\n", o.n_prompt, pp_med);
    if (o.n_gen > 0) {
      std::printf("tg%-6d %10.2f tok/s (depth %d; %.1f MB read per token", o.n_gen, tg_med, o.depth,
                  bytes_per_token / 1e6);
      if (state_read > 0) std::printf(", %.2f MB of it recurrent state", state_read / 1e6);
      std::printf(")\n");
    }
  }
}

}  // namespace

int RunBench(const BenchOptions& o) {
  if (o.n_prompt < 0 || o.n_gen < 0 || o.depth < 0 || o.reps < 1) {
    std::fprintf(stderr, "lamina: -p, -n, -d must be >= 0 and -r >= 1\n");
    return kExitUsage;
  }
  LoadedModel lm = LoadModelForCli(o.common);
  if (!lm.model) return kExitBadInput;
  if (int rc = kExitOk; !AttachMtpHead(o.spec, o.common.model_path, *lm.model, &rc)) return rc;
  const Model& model = *lm.model;
  ThreadPool pool(o.common.n_threads);
  SessionConfig sc;
  int rc = kExitOk;
  if (!MakeSessionConfig(o.common, model, &sc, &rc)) return rc;
  if (!o.spec.empty()) return RunBenchSpec(o, model, pool);
  if (o.common.n_ctx == 0) sc.n_ctx = std::max(o.n_prompt, o.depth + o.n_gen + 1) + 1;
  if (!CheckMemoryPlan(o.common, model, &sc, std::max(1, o.n_prompt), 1, 0, "lower -p", &rc)) {
    return rc;
  }
  if (!o.parallel.empty()) return RunParallelBench(o, model, sc, pool);
  BenchSamples samples;
  if (!MeasureBench(o, model, sc, pool, &samples)) return kExitFailure;
  PrintBench(o, model, sc, pool, samples);
  return kExitOk;
}

}  // namespace lamina::cli
