// The measuring probes: cold prefill speed, teacher-forced KL divergence through single-token
// decode steps (with a decode-path vs prompt-path check), free-running divergence, and per-layer
// stored-vs-exact K/V diagnostics read back from the legs' caches. They need a backend with
// logits; other legs are n/a.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "probe/kl.h"
#include "probe/probes.h"
#include "runtime/sampler.h"
#include "util/timer.h"

namespace lamina::probe {

namespace {

std::vector<int32_t> TextTokens(const RunContext& ctx, const std::string& text, int max_tokens) {
  std::vector<int32_t> ids = ctx.reference().Tokenize(text);
  if (static_cast<int>(ids.size()) > max_tokens) ids.resize(max_tokens);
  return ids;
}

std::string Fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), format, v);
  return buf;
}

// Why leg i cannot be measured by a logit probe; "" when it can.
std::string NoLogitsReason(const RunContext& ctx, size_t i) {
  if (!ctx.info[i].logits) return ctx.info[i].no_logits_reason;
  if (!ctx.info[0].logits) return "the reference leg has no logits";
  return "";
}

}  // namespace

std::vector<PrefillResult> RunPrefillProbe(const RunContext& ctx) {
  std::vector<PrefillResult> results(ctx.legs.size());
  if (!ctx.info[0].logits) {
    for (size_t i = 0; i < ctx.legs.size(); ++i) {
      results[i].outcome = {Status::kNotApplicable, "no logits", NoLogitsReason(ctx, i)};
    }
    return results;
  }
  const int n_vocab = ctx.reference().n_vocab();
  const int n = std::min(ctx.config.n_ctx - 1, 2048);
  const std::vector<int32_t> ids =
      TextTokens(ctx, FillerText(ctx, ctx.config.seed * 65537 + 11, n + 16), n);
  std::vector<float> ref_logits;
  std::vector<double> lp, lq;
  // One untimed pass first: "cold" means a fresh cache, not weights still on disk and idle
  // worker threads, which would be charged to the first leg only.
  (void)ctx.reference().NewStream()->Eval(ids.data(), static_cast<int>(ids.size()), false);
  for (size_t i = 0; i < ctx.legs.size(); ++i) {
    PrefillResult& p = results[i];
    p.tokens = static_cast<int>(ids.size());
    const std::string no_logits = NoLogitsReason(ctx, i);
    if (!no_logits.empty()) {
      p.outcome = {Status::kNotApplicable, "no logits", no_logits};
      continue;
    }
    ctx.Progress("prefill", i);
    std::unique_ptr<LogitStream> s = ctx.legs[i].backend->NewStream();
    const double t0 = NowSeconds();
    Result<const float*> r = s->Eval(ids.data(), static_cast<int>(ids.size()), false);
    p.seconds = NowSeconds() - t0;
    p.outcome.status = Status::kInfo;
    if (!r.ok()) {
      p.outcome = {Status::kFail, "error", r.error().message};
      continue;
    }
    p.measured = true;
    p.tok_s = ids.size() / std::max(p.seconds, 1e-9);
    if (ref_logits.empty()) ref_logits.assign(*r, *r + n_vocab);
    double max_abs = 0.0;
    for (int v = 0; v < n_vocab; ++v) {
      max_abs = std::max<double>(max_abs, std::fabs((*r)[v] - ref_logits[v]));
    }
    p.last_logits_max_abs_diff = max_abs;
    p.last_logits_kl = KlDivergence(ref_logits.data(), *r, n_vocab, lp, lq);
    p.last_top1_same = ArgMax(*r, n_vocab) == ArgMax(ref_logits.data(), n_vocab);
    p.outcome.cell =
        Fmt("%.0f tok/s", p.tok_s) + (i == 0 ? "" : Fmt(", KL %.2g", p.last_logits_kl));
  }
  return results;
}

namespace {

constexpr int kTableBuckets = 4;
constexpr int kChartBuckets = 32;
constexpr int kPathSample = 1024;  // logits per position kept for the decode-vs-prompt check

// Stored-vs-exact statistics of one side (K or V) of one layer.
struct ErrorStats {
  double sum_d2 = 0, sum_e2 = 0, sum_s2 = 0, sum_se = 0, sum_d = 0;
  int64_t count = 0;
  void Add(const float* s, const float* e, int n) {
    for (int i = 0; i < n; ++i) {
      const double d = static_cast<double>(s[i]) - e[i];
      sum_d2 += d * d;
      sum_e2 += static_cast<double>(e[i]) * e[i];
      sum_s2 += static_cast<double>(s[i]) * s[i];
      sum_se += static_cast<double>(s[i]) * e[i];
      sum_d += d;
    }
    count += n;
  }
  double RelRms() const { return sum_e2 > 0 ? std::sqrt(sum_d2 / sum_e2) : 0.0; }
  SideError ToSideError() const {
    const double rms_e = count ? std::sqrt(sum_e2 / count) : 0.0;
    const double mean = count ? sum_d / count : 0.0;
    SideError s;
    s.rel_rms = RelRms();
    s.mean_error = mean;
    s.bias_rel = rms_e > 0 ? mean / rms_e : 0.0;
    s.cosine = sum_s2 > 0 && sum_e2 > 0 ? sum_se / std::sqrt(sum_s2 * sum_e2) : 0.0;
    s.gain = sum_e2 > 0 ? sum_se / sum_e2 : 0.0;
    return s;
  }
};

// Per layer K and V error of `leg` against `ref` over positions [0, n) (of a sliding-window
// ring, the positions both still hold), split at the first decode-written position.
std::vector<LayerError> LayerDiagnostics(const KvCache& ref, const KvCache& leg, int n,
                                         int n_prompt) {
  const KvCacheConfig& c = leg.config();
  std::vector<LayerError> layers;
  std::vector<float> s, e;  // [n, head_dim] decoded rows
  for (int layer = 0; layer < c.n_layer; ++layer) {
    LayerError lj;
    lj.layer = layer;
    const int held = std::max(leg.RingFirstHeld(layer, 0), ref.RingFirstHeld(layer, 0));
    for (int side = 0; side < 2; ++side) {
      ErrorStats all, prompt, decode;
      for (int h = 0; h < c.n_kv_heads; ++h) {
        s.resize(static_cast<size_t>(n) * c.head_dim);
        e.resize(static_cast<size_t>(n) * c.head_dim);
        leg.ReadHeadRows(side, layer, 0, h, n, s.data());
        ref.ReadHeadRows(side, layer, 0, h, n, e.data());
        for (int p = held; p < n; ++p) {
          const float* sp = s.data() + static_cast<size_t>(p) * c.head_dim;
          const float* ep = e.data() + static_cast<size_t>(p) * c.head_dim;
          all.Add(sp, ep, c.head_dim);
          (p < n_prompt ? prompt : decode).Add(sp, ep, c.head_dim);
        }
      }
      SideError& sj = side == 0 ? lj.k : lj.v;
      sj = all.ToSideError();
      sj.rel_rms_prompt_cells = prompt.RelRms();
      sj.rel_rms_decode_cells = decode.RelRms();
    }
    layers.push_back(lj);
  }
  return layers;
}

std::vector<KlBucket> Buckets(const std::vector<double>& kl, const std::vector<int>& agree,
                              int n_buckets) {
  std::vector<KlBucket> out;
  const int n = static_cast<int>(kl.size());
  for (int b = 0; b < n_buckets; ++b) {
    const int lo = static_cast<int>(static_cast<int64_t>(n) * b / n_buckets);
    const int hi = static_cast<int>(static_cast<int64_t>(n) * (b + 1) / n_buckets);
    if (hi <= lo) continue;
    double sum = 0, top1 = 0, max = 0;
    for (int p = lo; p < hi; ++p) {
      sum += kl[p];
      top1 += agree[p];
      max = std::max(max, kl[p]);
    }
    out.push_back({lo, hi, sum / (hi - lo), max, top1 / (hi - lo)});
  }
  return out;
}

}  // namespace

namespace {

// The text the divergence probe steps through and the sizes derived from it.
struct DivergenceInput {
  std::vector<int32_t> ids;
  int n = 0;  // tokens
  // The first eighth is one prompt batch; every later token is a single-token decode step, the
  // path generated tokens take, so a decode-path write fault shows up in the KL.
  int n_prompt = 0;
  int n_vocab = 0;
  int stride = 1;            // every stride-th logit is sampled for the decode-vs-prompt check
  int n_sample = 0;          // logits sampled per position
  std::vector<bool> active;  // legs with logits
};

// What the lockstep pass gathers per leg.
struct Lockstep {
  std::vector<std::vector<double>> kl;
  std::vector<std::vector<int>> agree;
  std::vector<double> path_diff;
  std::vector<int> path_first;
  std::vector<std::string> errors;
  std::vector<std::optional<std::vector<LayerError>>> diagnostics;
};

DivergenceInput DivergenceText(const RunContext& ctx) {
  DivergenceInput in;
  in.n_vocab = ctx.reference().n_vocab();
  const std::string text = ctx.config.text ? *ctx.config.text
                                           : FillerText(ctx, ctx.config.seed * 1000003 + 5,
                                                        ctx.config.divergence_tokens + 16);
  in.ids = TextTokens(ctx, text, std::min(ctx.config.divergence_tokens, ctx.config.n_ctx));
  in.n = static_cast<int>(in.ids.size());
  in.n_prompt = std::max(1, in.n / 8);
  in.stride = std::max(1, in.n_vocab / kPathSample);
  in.n_sample = (in.n_vocab + in.stride - 1) / in.stride;
  in.active.resize(ctx.legs.size());
  for (size_t i = 0; i < ctx.legs.size(); ++i) in.active[i] = NoLogitsReason(ctx, i).empty();
  return in;
}

// Prompt-path twin of each leg: the whole text as one batch; a strided sample of its logits
// per position, [n, n_sample], is kept for the comparison with the decode path.
std::vector<std::vector<float>> PromptPathSamples(const RunContext& ctx,
                                                  const DivergenceInput& in) {
  std::vector<std::vector<float>> batch_sample(ctx.legs.size());
  for (size_t i = 0; i < ctx.legs.size(); ++i) {
    if (!in.active[i]) continue;
    std::unique_ptr<LogitStream> s = ctx.legs[i].backend->NewStream();
    Result<const float*> r = s->Eval(in.ids.data(), in.n, true);
    if (!r.ok()) continue;
    batch_sample[i].resize(static_cast<size_t>(in.n) * in.n_sample);
    for (int p = 0; p < in.n; ++p) {
      for (int k = 0; k < in.n_sample; ++k) {
        batch_sample[i][static_cast<size_t>(p) * in.n_sample + k] =
            (*r)[static_cast<size_t>(p) * in.n_vocab + k * in.stride];
      }
    }
  }
  return batch_sample;
}

// Scores the m rows each leg returned for positions [pos, pos + m) against the reference's
// rows and the leg's own prompt-path sample.
void CompareRows(const DivergenceInput& in, const std::vector<std::vector<float>>& batch_sample,
                 const std::vector<const float*>& logits, int pos, int m, double path_diff_max,
                 Lockstep* out) {
  std::vector<double> lp, lq;
  for (int t = 0; t < m; ++t) {
    const float* ref = logits[0] + static_cast<size_t>(t) * in.n_vocab;
    const int ref_top = ArgMax(ref, in.n_vocab);
    for (size_t i = 0; i < logits.size(); ++i) {
      if (!logits[i]) continue;
      const float* row = logits[i] + static_cast<size_t>(t) * in.n_vocab;
      out->kl[i][pos + t] = i == 0 ? 0.0 : KlDivergence(ref, row, in.n_vocab, lp, lq);
      out->agree[i][pos + t] = ArgMax(row, in.n_vocab) == ref_top;
      if (batch_sample[i].empty()) continue;
      const float* b = batch_sample[i].data() + static_cast<size_t>(pos + t) * in.n_sample;
      for (int k = 0; k < in.n_sample; ++k) {
        const double d = std::fabs(static_cast<double>(row[k * in.stride]) - b[k]);
        if (d > out->path_diff[i]) out->path_diff[i] = d;
        if (d > path_diff_max && out->path_first[i] < 0) out->path_first[i] = pos + t;
      }
    }
  }
}

// All legs step through the text in lockstep (each in its own fresh sequence) so every
// position's KL against the reference is computed without storing the reference's logits.
Lockstep RunLockstep(const RunContext& ctx, const DivergenceInput& in,
                     const std::vector<std::vector<float>>& batch_sample) {
  const size_t n_legs = ctx.legs.size();
  std::vector<std::unique_ptr<LogitStream>> streams(n_legs);
  for (size_t i = 0; i < n_legs; ++i) {
    if (in.active[i]) streams[i] = ctx.legs[i].backend->NewStream();
  }
  Lockstep out;
  out.kl.assign(n_legs, std::vector<double>(in.n, 0.0));
  out.agree.assign(n_legs, std::vector<int>(in.n, 0));
  out.path_diff.assign(n_legs, 0.0);
  out.path_first.assign(n_legs, -1);
  out.errors.resize(n_legs);
  std::vector<const float*> logits(n_legs, nullptr);
  if (ctx.config.progress) {
    ctx.config.progress("probe divergence: " + std::to_string(in.n) + " tokens, " +
                        std::to_string(n_legs) + " legs in lockstep");
  }
  for (int pos = 0; pos < in.n;) {
    const int m = pos == 0 ? in.n_prompt : 1;
    for (size_t i = 0; i < n_legs; ++i) {
      logits[i] = nullptr;
      if (!in.active[i] || !out.errors[i].empty()) continue;
      Result<const float*> r = streams[i]->Eval(in.ids.data() + pos, m, /*all_logits=*/true);
      if (!r.ok()) {
        out.errors[i] = r.error().message;
        continue;
      }
      logits[i] = *r;
    }
    if (!logits[0]) break;
    CompareRows(in, batch_sample, logits, pos, m, ctx.config.thresholds.path_diff_max, &out);
    pos += m;
  }

  // Per-layer diagnostics from the lockstep caches (the reference's is the exact one).
  out.diagnostics.resize(n_legs);
  for (size_t i = 1; i < n_legs; ++i) {
    if (!in.active[i] || !out.errors[i].empty() || !out.errors[0].empty()) continue;
    const KvCache* ref_cache = streams[0]->cache();
    const KvCache* leg_cache = streams[i]->cache();
    if (ref_cache && leg_cache) {
      out.diagnostics[i] = LayerDiagnostics(*ref_cache, *leg_cache, in.n, in.n_prompt);
    }
  }
  return out;
}

// Free-running: greedy from the text's prompt part; the tokens each leg generates.
std::vector<std::vector<int32_t>> FreeRun(const RunContext& ctx, const DivergenceInput& in) {
  const int n_free = std::min(ctx.config.free_run_tokens, ctx.config.n_ctx - in.n_prompt);
  std::vector<std::vector<int32_t>> free_tokens(ctx.legs.size());
  for (size_t i = 0; i < ctx.legs.size() && n_free > 0; ++i) {
    if (!in.active[i]) continue;
    std::unique_ptr<LogitStream> s = ctx.legs[i].backend->NewStream();
    Result<const float*> r = s->Eval(in.ids.data(), in.n_prompt, false);
    for (int g = 0; g < n_free && r.ok(); ++g) {
      const int32_t id = ArgMax(*r, in.n_vocab);
      free_tokens[i].push_back(id);
      if (g + 1 < n_free) r = s->Eval(&id, 1, false);
    }
  }
  return free_tokens;
}

// Why a measured leg fails the divergence probe, "; "-joined; "" when it passes.
std::string DivergenceFailures(const DivergenceResult& p, const Thresholds& th) {
  std::vector<std::string> reasons;
  if (p.path_first_mismatch >= 0) {
    reasons.push_back("decode path differs from prompt path from position " +
                      std::to_string(p.path_first_mismatch) + " (max |dlogit| " +
                      Fmt("%.3g", p.path_max_abs_diff) + ")");
  }
  if (p.kl_mean > th.kl_mean_max) {
    reasons.push_back("mean KL " + Fmt("%.3g", p.kl_mean) + " > " + Fmt("%g", th.kl_mean_max));
  }
  for (const KlBucket& b : p.buckets) {
    if (b.mean_kl > th.kl_bucket_max) {
      reasons.push_back("mean KL " + Fmt("%.3g", b.mean_kl) + " at positions " +
                        std::to_string(b.from) + "-" + std::to_string(b.to) + " > " +
                        Fmt("%g", th.kl_bucket_max));
      break;
    }
  }
  // Quantization noise averages out over a layer's cells; a systematic offset does not.
  if (p.layers) {
    bool biased = false;
    for (const LayerError& l : *p.layers) {
      for (int side = 0; side < 2 && !biased; ++side) {
        const double b = (side == 0 ? l.k : l.v).bias_rel;
        if (std::fabs(b) > th.bias_rel_max) {
          reasons.push_back(std::string(side == 0 ? "K" : "V") + " bias " + Fmt("%.3g", b) +
                            " x RMS at layer " + std::to_string(l.layer) + " (limit " +
                            Fmt("%g", th.bias_rel_max) + ")");
          biased = true;
        }
      }
      if (biased) break;
    }
  }
  if (p.top1_agreement < th.top1_min) {
    reasons.push_back("top-1 agreement " + Fmt("%.1f%%", 100 * p.top1_agreement) + " < " +
                      Fmt("%.0f%%", 100 * th.top1_min));
  }
  std::string reason;
  for (const std::string& r : reasons) reason += (reason.empty() ? "" : "; ") + r;
  return reason;
}

// Fills leg i's result from the lockstep pass and the free run.
void SummarizeLeg(const RunContext& ctx, size_t i, const DivergenceInput& in, const Lockstep& ls,
                  const std::vector<std::vector<int32_t>>& free_tokens, DivergenceResult* p) {
  const int n = in.n;
  p->tokens = n;
  p->prompt_tokens = in.n_prompt;
  p->decode_steps = n - in.n_prompt;
  if (!in.active[i]) {
    p->outcome = {Status::kNotApplicable, "no logits", NoLogitsReason(ctx, i)};
    return;
  }
  if (!ls.errors[i].empty()) {
    p->outcome = {Status::kFail, "error", ls.errors[i]};
    return;
  }
  p->measured = true;
  double mean = 0, top1 = 0;
  for (int pos = 0; pos < n; ++pos) {
    mean += ls.kl[i][pos];
    top1 += ls.agree[i][pos];
  }
  mean /= std::max(1, n);
  top1 /= std::max(1, n);
  p->kl_mean = mean;
  p->kl_p99 = Percentile(ls.kl[i], 0.99);
  p->kl_max = n ? *std::max_element(ls.kl[i].begin(), ls.kl[i].end()) : 0.0;
  p->top1_agreement = top1;
  p->buckets = Buckets(ls.kl[i], ls.agree[i], kTableBuckets);
  p->chart = Buckets(ls.kl[i], ls.agree[i], std::min(kChartBuckets, std::max(1, n)));
  p->path_max_abs_diff = ls.path_diff[i];
  p->path_first_mismatch = ls.path_first[i];
  int first_diff = -1;
  for (size_t g = 0; g < free_tokens[i].size() && g < free_tokens[0].size(); ++g) {
    if (free_tokens[i][g] != free_tokens[0][g]) {
      first_diff = static_cast<int>(g);
      break;
    }
  }
  p->free_run_tokens = static_cast<int>(free_tokens[i].size());
  p->free_run_first_difference = first_diff;
  p->free_run_text = ctx.legs[i].backend->Detokenize(free_tokens[i]);
  if (i > 0) p->layers = ls.diagnostics[i];

  const std::string reason = DivergenceFailures(*p, ctx.config.thresholds);
  p->outcome.status = reason.empty() ? Status::kPass : Status::kFail;
  p->outcome.reason = reason;
  p->outcome.cell =
      i == 0 ? std::string("reference")
             : "KL " + Fmt("%.2g", mean) + ", top-1 " + Fmt("%.1f%%", 100 * top1) +
                   (first_diff < 0 ? std::string(", free-run same")
                                   : ", free-run differs @" + std::to_string(first_diff));
}

}  // namespace

std::vector<DivergenceResult> RunDivergenceProbe(const RunContext& ctx) {
  const size_t n_legs = ctx.legs.size();
  std::vector<DivergenceResult> results(n_legs);
  for (size_t i = 0; i < n_legs; ++i) results[i].reference = i == 0;
  if (!ctx.info[0].logits) {
    for (size_t i = 0; i < n_legs; ++i) {
      results[i].outcome = {Status::kNotApplicable, "no logits", NoLogitsReason(ctx, i)};
    }
    return results;
  }
  const DivergenceInput in = DivergenceText(ctx);
  const std::vector<std::vector<float>> batch_sample = PromptPathSamples(ctx, in);
  const Lockstep lockstep = RunLockstep(ctx, in, batch_sample);
  const std::vector<std::vector<int32_t>> free_tokens = FreeRun(ctx, in);
  for (size_t i = 0; i < n_legs; ++i) {
    SummarizeLeg(ctx, i, in, lockstep, free_tokens, &results[i]);
  }
  return results;
}

}  // namespace lamina::probe
