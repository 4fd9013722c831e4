// `lamina bench`: llama-bench style throughput. pp: a P-token random prompt as one batch into a
// fresh cache; tg: N single-token decodes after DEPTH tokens are already in the cache. Reports
// the median over REPS, and the decode roofline from the bytes each token reads. --parallel B:
// B sequences decode together, one token each per forward pass (the server's batched decode).
// --roofline: tg's bytes per second against a read-bandwidth probe run on the same threads
// between segments of kRooflineSegment tokens, so each share compares figures a fraction of a
// second apart.
#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>

#include "cli_common.h"
#include "cli_spec.h"
#include "runtime/session.h"
#include "util/bandwidth.h"
#include "util/timer.h"

namespace lamina::cli {

namespace {
// The middle value; of an even count, the mean of the two middle values.
double Median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t h = v.size() / 2;
  return v.size() % 2 == 1 ? v[h] : 0.5 * (v[h - 1] + v[h]);
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
  // Repetitions interleave the counts (repetition r runs every count once, in order), so that a
  // count's ratio to one stream compares runs of the same minute: "vs 1" is the median over
  // repetitions of each one's aggregate over its one-stream run (a shared machine's speed drifts
  // between minutes far more than within one).
  const size_t n_counts = counts.size();
  std::vector<std::vector<double>> agg(n_counts), per(n_counts);  // [count][rep]
  for (int rep = 0; rep < o.reps; ++rep) {
    for (size_t c = 0; c < n_counts; ++c) {
      Result<ParallelFigure> f = BenchParallel(model, sc, o, counts[c], rep, pool);
      if (!f.ok()) {
        std::fprintf(stderr, "lamina: %s\n", f.error().message.c_str());
        return kExitFailure;
      }
      agg[c].push_back(f->aggregate_tok_s);
      per[c].push_back(f->per_seq_tok_s);
    }
  }
  const auto one = std::find(counts.begin(), counts.end(), 1);
  for (size_t c = 0; c < n_counts; ++c) {
    const double a = Median(agg[c]), p = Median(per[c]);
    double vs_one = 0.0;  // 0: no one-stream run to compare with
    if (one != counts.end()) {
      const std::vector<double>& base = agg[static_cast<size_t>(one - counts.begin())];
      std::vector<double> ratios(agg[c].size());
      for (size_t r = 0; r < ratios.size(); ++r) ratios[r] = agg[c][r] / base[r];
      vs_one = Median(ratios);
    }
    nlohmann::json row = {{"streams", counts[c]}, {"aggregate_tok_s", a}, {"per_stream_tok_s", p}};
    if (vs_one > 0) row["vs_1"] = vs_one;
    rows.push_back(row);
    if (!o.json) std::printf("%8d %16.2f %16.2f %9.2fx\n", counts[c], a, p, vs_one);
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
  // --roofline: per segment of tg steps, its repetition, steps, seconds and the probe's GB/s
  // right before and right after it.
  std::vector<int> seg_rep, seg_tokens;
  std::vector<double> seg_seconds, bw_before, bw_after;
  double regions_per_step = 0;  // the pool's parallel regions per timed tg step (last repetition)
};

// --roofline: tg steps per segment between two probes. A segment of the 181M file is ~0.1 s and
// a probe ~10 ms, so the VM's bandwidth, which drifts by a quarter within minutes, is measured
// around each segment rather than around a whole repetition.
constexpr int kRooflineSegment = 16;

// Passes of the probe per measurement: two over its buffer (>= 256 MiB, past the L3), the faster
// counted (ReadBandwidthProbe::Measure), so a probe is a fraction of a segment and one slow pass
// does not lower the roofline.
int ProbePasses(const ReadBandwidthProbe&) { return 2; }

// Runs the pp and tg tests REPS times; false (after the message) when an evaluation fails.
// `probe` (--roofline, else nullptr) runs before the first tg segment of each repetition and
// after every segment; only the segments are timed.
bool MeasureBench(const BenchOptions& o, const Model& model, const SessionConfig& sc,
                  ThreadPool& pool, ReadBandwidthProbe* probe, BenchSamples* out) {
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
      // Without the probe one segment of all N steps; with it, segments of kRooflineSegment
      // steps with a probe before each and after the last.
      const int seg = probe != nullptr ? kRooflineSegment : o.n_gen;
      double bw_prev = probe != nullptr ? probe->Measure(pool, ProbePasses(*probe)) : 0.0;
      double seconds = 0.0;
      uint64_t regions = 0;
      for (int i0 = 0; i0 < o.n_gen; i0 += seg) {
        const int i1 = std::min(o.n_gen, i0 + seg);
        const double t0 = NowSeconds();
        const uint64_t regions0 = pool.regions();
        for (int i = i0; i < i1; ++i) {
          Result<const float*> r = s.Eval(&gen[i], 1, false);
          if (!r.ok()) {
            std::fprintf(stderr, "lamina: %s\n", r.error().message.c_str());
            return false;
          }
        }
        const double dt = NowSeconds() - t0;
        regions += pool.regions() - regions0;
        seconds += dt;
        if (probe == nullptr) continue;
        const double bw_next = probe->Measure(pool, ProbePasses(*probe));
        out->seg_rep.push_back(rep);
        out->seg_tokens.push_back(i1 - i0);
        out->seg_seconds.push_back(dt);
        out->bw_before.push_back(bw_prev);
        out->bw_after.push_back(bw_next);
        bw_prev = bw_next;
      }
      out->tg.push_back(o.n_gen / seconds);
      out->regions_per_step = static_cast<double>(regions) / o.n_gen;
    }
  }
  return true;
}

// What one timed decode step reads, averaged over the tg steps, in bytes.
struct DecodeBytes {
  double weights = 0;   // every matrix and vector but the embedding table (the head included)
  double embd_row = 0;  // the token's embedding row (0 when the head is tied: read as the head)
  double kv = 0;        // K/V cells read, plus the one cell written
  double state = 0;     // hybrid models: the recurrent layers' conv tails and delta states
  double total() const { return weights + embd_row + kv + state; }
};

DecodeBytes DecodeBytesPerToken(const BenchOptions& o, const Model& model,
                                size_t kv_bytes_per_token) {
  DecodeBytes b;
  b.weights = static_cast<double>(model.WeightBytesPerToken());
  const gguf::TensorInfo* embd = model.file().FindTensor("token_embd.weight");
  if (embd != nullptr && model.file().FindTensor("output.weight") != nullptr && embd->ne[1] > 0) {
    b.embd_row = static_cast<double>(embd->n_bytes) / static_cast<double>(embd->ne[1]);
  }
  // The warm-up token sits at position DEPTH; timed step i (0-based) at DEPTH + 1 + i attends
  // DEPTH + 2 + i cells, DEPTH + 1.5 + N / 2 on average, and writes its own.
  const double cells_read = o.depth + 1.5 + o.n_gen / 2.0;
  b.kv = static_cast<double>(kv_bytes_per_token) * (cells_read + 1.0);
  // Hybrid models also read (and write back) every recurrent layer's conv tail and delta state.
  const RecurrentShape& rec = model.hparams().recurrent;
  b.state = static_cast<double>(rec.n_layer) *
            static_cast<double>(rec.conv_floats() + rec.state_floats()) * sizeof(float);
  return b;
}

// --roofline's figures: medians over the tg segments (every repetition's).
struct RooflineFigures {
  double achieved_gbs = 0;     // segment's steps x bytes per token / its seconds
  double measured_gbs = 0;     // the probe, mean of the one before and the one after the segment
  double share = 0;            // achieved / measured, per segment
  std::vector<double> shares;  // per segment
  std::vector<double> rep_shares;  // per repetition: the median of its segments' shares
};

RooflineFigures Roofline(const BenchSamples& s, double bytes_per_token) {
  RooflineFigures r;
  std::vector<double> achieved, measured;
  std::vector<std::vector<double>> per_rep(s.tg.size());  // [reps][segments]
  for (size_t i = 0; i < s.seg_seconds.size(); ++i) {
    const double a = s.seg_tokens[i] * bytes_per_token / s.seg_seconds[i] / 1e9;
    const double m = (s.bw_before[i] + s.bw_after[i]) / 2.0;
    achieved.push_back(a);
    measured.push_back(m);
    r.shares.push_back(m > 0 ? a / m : 0.0);
    per_rep[static_cast<size_t>(s.seg_rep[i])].push_back(r.shares.back());
  }
  for (const std::vector<double>& v : per_rep) r.rep_shares.push_back(Median(v));
  r.achieved_gbs = Median(achieved);
  r.measured_gbs = Median(measured);
  r.share = Median(r.shares);
  return r;
}

// The medians and the decode roofline, as a table or one JSON object.
void PrintBench(const BenchOptions& o, const Model& model, const SessionConfig& sc,
                const ThreadPool& pool, const ReadBandwidthProbe* probe, const BenchSamples& s) {
  const std::vector<double>& pp = s.pp;
  const std::vector<double>& tg = s.tg;
  const double pp_med = Median(pp), tg_med = Median(tg);
  const DecodeBytes bytes = DecodeBytesPerToken(o, model, s.kv_bytes_per_token);
  const double bytes_per_token = bytes.total();
  const double state_read = bytes.state;
  const bool roofline = probe != nullptr && o.n_gen > 0;
  const RooflineFigures rf = roofline ? Roofline(s, bytes_per_token) : RooflineFigures{};
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
    if (roofline) {
      j["roofline"] = {{"weight_bytes", bytes.weights},
                       {"embedding_row_bytes", bytes.embd_row},
                       {"kv_bytes", bytes.kv},
                       {"state_bytes", bytes.state},
                       {"probe_bytes", probe->bytes()},
                       {"probe_passes", ProbePasses(*probe)},
                       {"regions_per_step", s.regions_per_step},
                       {"segment_tokens", kRooflineSegment},
                       {"segment_rep", s.seg_rep},
                       {"segment_steps", s.seg_tokens},
                       {"segment_seconds", s.seg_seconds},
                       {"bw_before_gbs", s.bw_before},
                       {"bw_after_gbs", s.bw_after},
                       {"shares", rf.shares},
                       {"rep_shares", rf.rep_shares},
                       {"achieved_gbs", rf.achieved_gbs},
                       {"measured_gbs", rf.measured_gbs},
                       {"share", rf.share}};
    }
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
    if (roofline) {
      std::printf("roofline %.3f MB/token (weights %.3f, embedding row %.4f, KV %.3f",
                  bytes_per_token / 1e6, bytes.weights / 1e6, bytes.embd_row / 1e6, bytes.kv / 1e6);
      if (state_read > 0) std::printf(", state %.3f", state_read / 1e6);
      std::printf(
          ") | achieved %.1f GB/s | measured %.1f GB/s (read probe, %zu MiB, best of %d passes, %d "
          "threads, "
          "around each %d-step segment) | share %.1f%% (median of %zu segments; reps:",
          rf.achieved_gbs, rf.measured_gbs, probe->bytes() >> 20, ProbePasses(*probe), pool.size(),
          kRooflineSegment, 100.0 * rf.share, rf.shares.size());
      for (double x : rf.rep_shares) std::printf(" %.1f", 100.0 * x);
      std::printf(") | %.1f parallel regions per step\n", s.regions_per_step);
    }
  }
}

}  // namespace

int RunBench(const BenchOptions& o) {
  if (o.n_prompt < 0 || o.n_gen < 0 || o.depth < 0 || o.reps < 1) {
    std::fprintf(stderr, "lamina: -p, -n, -d must be >= 0 and -r >= 1\n");
    return kExitUsage;
  }
  if (o.roofline && (o.n_gen < 1 || !o.parallel.empty() || !o.spec.empty())) {
    std::fprintf(stderr,
                 "lamina: --roofline measures tg: it needs -n >= 1 and no --parallel or --spec\n");
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
  std::optional<ReadBandwidthProbe> probe;
  if (o.roofline) probe.emplace(ReadBandwidthProbe::DefaultBytes());
  BenchSamples samples;
  if (!MeasureBench(o, model, sc, pool, probe ? &*probe : nullptr, &samples)) return kExitFailure;
  PrintBench(o, model, sc, pool, probe ? &*probe : nullptr, samples);
  return kExitOk;
}

}  // namespace lamina::cli
