// The measuring probes of `lamina probe`: cold prefill speed, teacher-forced KL divergence
// through single-token decode steps (with a decode-path vs prompt-path check), free-running
// divergence, and per-layer stored-vs-exact K/V diagnostics read back from the caches.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "cli_common.h"
#include "cli_kl.h"
#include "cli_probe.h"
#include "kernels/kv_decode.h"
#include "kernels/kv_format.h"
#include "runtime/sampler.h"
#include "util/timer.h"

namespace lamina::cli::probe {

using nlohmann::json;

namespace {

std::vector<int32_t> TextTokens(const Context& ctx, const std::string& text, int max_tokens) {
  std::vector<int32_t> ids =
      ctx.model->tokenizer().Encode(text, /*add_special=*/true, /*parse_special=*/false);
  if (static_cast<int>(ids.size()) > max_tokens) ids.resize(max_tokens);
  return ids;
}

std::string Fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), format, v);
  return buf;
}

}  // namespace

void RunPrefillProbe(Context& ctx, json& report) {
  const int n_vocab = ctx.model->hparams().n_vocab;
  const int n = std::min(ctx.n_ctx - 1, 2048);
  const std::vector<int32_t> ids =
      TextTokens(ctx, FillerText(ctx, ctx.options.seed * 65537 + 11, n + 16), n);
  std::vector<float> ref_logits;
  std::vector<double> lp, lq;
  // One untimed pass first: "cold" means a fresh cache, not weights still on disk and idle
  // worker threads, which would be charged to the first leg only.
  (void)ctx.NewSession(Leg{})->Eval(ids, false);
  for (size_t i = 0; i < ctx.legs.size(); ++i) {
    std::fprintf(stderr, "lamina: probe prefill: leg %zu/%zu %s\n", i + 1, ctx.legs.size(),
                 ctx.legs[i].name.c_str());
    std::unique_ptr<Session> s = ctx.NewSession(ctx.legs[i]);
    const double t0 = NowSeconds();
    Result<const float*> r = s->Eval(ids, false);
    const double seconds = NowSeconds() - t0;
    json p;
    p["tokens"] = ids.size();
    p["seconds"] = seconds;
    p["status"] = "info";
    if (!r.ok()) {
      p["status"] = "fail";
      p["reason"] = r.error().message;
      p["cell"] = "error";
      report["legs"][i]["probes"]["prefill"] = p;
      continue;
    }
    const double tps = ids.size() / std::max(seconds, 1e-9);
    p["tok_s"] = tps;
    if (i == 0) ref_logits.assign(*r, *r + n_vocab);
    double max_abs = 0.0;
    for (int v = 0; v < n_vocab; ++v)
      max_abs = std::max<double>(max_abs, std::fabs((*r)[v] - ref_logits[v]));
    const double kl = KlDivergence(ref_logits.data(), *r, n_vocab, lp, lq);
    p["last_logits_max_abs_diff"] = max_abs;
    p["last_logits_kl"] = kl;
    p["last_top1_same"] = ArgMax(*r, n_vocab) == ArgMax(ref_logits.data(), n_vocab);
    p["cell"] = Fmt("%.0f tok/s", tps) + (i == 0 ? "" : Fmt(", KL %.2g", kl));
    report["legs"][i]["probes"]["prefill"] = p;
  }
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
  json ToJson() const {
    const double rms_e = count ? std::sqrt(sum_e2 / count) : 0.0;
    const double mean = count ? sum_d / count : 0.0;
    return {{"rel_rms", RelRms()},
            {"mean_error", mean},
            {"bias_rel", rms_e > 0 ? mean / rms_e : 0.0},
            {"cosine", sum_s2 > 0 && sum_e2 > 0 ? sum_se / std::sqrt(sum_s2 * sum_e2) : 0.0},
            {"gain", sum_e2 > 0 ? sum_se / sum_e2 : 0.0}};
  }
};

// Per layer K and V error of `leg` against `ref` over positions [0, n), split at the first
// decode-written position.
json LayerDiagnostics(const KvCache& ref, const KvCache& leg, int n, int n_prompt) {
  const KvCacheConfig& c = leg.config();
  json layers = json::array();
  std::vector<float> s, e;  // [n, head_dim] decoded rows
  for (int layer = 0; layer < c.n_layer; ++layer) {
    json lj;
    for (int side = 0; side < 2; ++side) {
      ErrorStats all, prompt, decode;
      for (int h = 0; h < c.n_kv_heads; ++h) {
        s.resize(static_cast<size_t>(n) * c.head_dim);
        e.resize(static_cast<size_t>(n) * c.head_dim);
        leg.ReadHeadRows(side, layer, 0, h, n, s.data());
        ref.ReadHeadRows(side, layer, 0, h, n, e.data());
        for (int p = 0; p < n; ++p) {
          const float* sp = s.data() + static_cast<size_t>(p) * c.head_dim;
          const float* ep = e.data() + static_cast<size_t>(p) * c.head_dim;
          all.Add(sp, ep, c.head_dim);
          (p < n_prompt ? prompt : decode).Add(sp, ep, c.head_dim);
        }
      }
      json sj = all.ToJson();
      sj["rel_rms_prompt_cells"] = prompt.RelRms();
      sj["rel_rms_decode_cells"] = decode.RelRms();
      lj[side == 0 ? "k" : "v"] = sj;
    }
    lj["layer"] = layer;
    layers.push_back(lj);
  }
  return layers;
}

json Buckets(const std::vector<double>& kl, const std::vector<int>& agree, int n_buckets) {
  json out = json::array();
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
    out.push_back({{"from", lo},
                   {"to", hi},
                   {"mean_kl", sum / (hi - lo)},
                   {"max_kl", max},
                   {"top1", top1 / (hi - lo)}});
  }
  return out;
}

}  // namespace

void RunDivergenceProbe(Context& ctx, json& report) {
  const Thresholds& th = ctx.thresholds;
  const int n_vocab = ctx.model->hparams().n_vocab;
  std::string text;
  if (!ctx.options.text_file.empty()) {
    std::string err;
    ReadTextFile(ctx.options.text_file, &text, &err);  // checked before any leg ran
  } else {
    text = FillerText(ctx, ctx.options.seed * 1000003 + 5, ctx.options.divergence_tokens + 16);
  }
  const std::vector<int32_t> ids =
      TextTokens(ctx, text, std::min(ctx.options.divergence_tokens, ctx.n_ctx));
  const int n = static_cast<int>(ids.size());
  // The first eighth is one prompt batch; every later token is a single-token decode step, the
  // path generated tokens take, so a decode-path write fault shows up in the KL.
  const int n_prompt = std::max(1, n / 8);
  const size_t n_legs = ctx.legs.size();
  const int stride = std::max(1, n_vocab / kPathSample);
  const int n_sample = (n_vocab + stride - 1) / stride;

  // Prompt-path twin of each leg: the whole text as one batch; a strided sample of its logits
  // per position, [n, n_sample], is kept for the comparison with the decode path.
  std::vector<std::vector<float>> batch_sample(n_legs);
  for (size_t i = 0; i < n_legs; ++i) {
    std::unique_ptr<Session> s = ctx.NewSession(ctx.legs[i]);
    Result<const float*> r = s->Eval(ids, true);
    if (!r.ok()) continue;
    batch_sample[i].resize(static_cast<size_t>(n) * n_sample);
    for (int p = 0; p < n; ++p) {
      for (int k = 0; k < n_sample; ++k) {
        batch_sample[i][static_cast<size_t>(p) * n_sample + k] =
            (*r)[static_cast<size_t>(p) * n_vocab + k * stride];
      }
    }
  }

  // All legs step through the text in lockstep (each in its own fresh session) so every
  // position's KL against the reference is computed without storing the reference's logits.
  std::vector<std::unique_ptr<Session>> sessions;
  for (const Leg& leg : ctx.legs) sessions.push_back(ctx.NewSession(leg));
  std::vector<std::vector<double>> kl(n_legs, std::vector<double>(n, 0.0));
  std::vector<std::vector<int>> agree(n_legs, std::vector<int>(n, 0));
  std::vector<double> path_diff(n_legs, 0.0);
  std::vector<int> path_first(n_legs, -1);
  std::vector<std::string> errors(n_legs);
  std::vector<double> lp, lq;
  std::vector<const float*> logits(n_legs, nullptr);
  std::fprintf(stderr, "lamina: probe divergence: %d tokens, %zu legs in lockstep\n", n, n_legs);
  for (int pos = 0; pos < n;) {
    const int m = pos == 0 ? n_prompt : 1;
    for (size_t i = 0; i < n_legs; ++i) {
      logits[i] = nullptr;
      if (!errors[i].empty()) continue;
      Result<const float*> r = sessions[i]->Eval(ids.data() + pos, m, /*all_logits=*/true);
      if (!r.ok()) {
        errors[i] = r.error().message;
        continue;
      }
      logits[i] = *r;
    }
    if (!logits[0]) break;
    for (int t = 0; t < m; ++t) {
      const float* ref = logits[0] + static_cast<size_t>(t) * n_vocab;
      const int ref_top = ArgMax(ref, n_vocab);
      for (size_t i = 0; i < n_legs; ++i) {
        if (!logits[i]) continue;
        const float* row = logits[i] + static_cast<size_t>(t) * n_vocab;
        kl[i][pos + t] = i == 0 ? 0.0 : KlDivergence(ref, row, n_vocab, lp, lq);
        agree[i][pos + t] = ArgMax(row, n_vocab) == ref_top;
        if (!batch_sample[i].empty()) {
          const float* b = batch_sample[i].data() + static_cast<size_t>(pos + t) * n_sample;
          for (int k = 0; k < n_sample; ++k) {
            const double d = std::fabs(static_cast<double>(row[k * stride]) - b[k]);
            if (d > path_diff[i]) path_diff[i] = d;
            if (d > th.path_diff_max && path_first[i] < 0) path_first[i] = pos + t;
          }
        }
      }
    }
    pos += m;
  }

  // Per-layer diagnostics from the lockstep caches (the reference's is the exact one).
  std::vector<json> diagnostics(n_legs);
  for (size_t i = 1; i < n_legs; ++i) {
    if (errors[i].empty() && errors[0].empty()) {
      diagnostics[i] = LayerDiagnostics(sessions[0]->cache(), sessions[i]->cache(), n, n_prompt);
    }
  }
  sessions.clear();

  // Free-running: greedy from the text's prompt part, index of the first token that differs.
  const int n_free = std::min(ctx.options.free_run_tokens, ctx.n_ctx - n_prompt);
  std::vector<int32_t> ref_free;
  std::vector<std::vector<int32_t>> free_tokens(n_legs);
  for (size_t i = 0; i < n_legs && n_free > 0; ++i) {
    std::unique_ptr<Session> s = ctx.NewSession(ctx.legs[i]);
    Result<const float*> r = s->Eval(ids.data(), n_prompt, false);
    for (int g = 0; g < n_free && r.ok(); ++g) {
      const int32_t id = ArgMax(*r, n_vocab);
      free_tokens[i].push_back(id);
      if (g + 1 < n_free) r = s->Eval(&id, 1, false);
    }
  }

  for (size_t i = 0; i < n_legs; ++i) {
    json p;
    p["tokens"] = n;
    p["prompt_tokens"] = n_prompt;
    p["decode_steps"] = n - n_prompt;
    p["reference"] = i == 0;
    if (!errors[i].empty()) {
      p["status"] = "fail";
      p["reason"] = errors[i];
      p["cell"] = "error";
      report["legs"][i]["probes"]["divergence"] = p;
      continue;
    }
    double mean = 0, top1 = 0;
    for (int pos = 0; pos < n; ++pos) {
      mean += kl[i][pos];
      top1 += agree[i][pos];
    }
    mean /= std::max(1, n);
    top1 /= std::max(1, n);
    p["kl_mean"] = mean;
    p["kl_p99"] = Percentile(kl[i], 0.99);
    p["kl_max"] = n ? *std::max_element(kl[i].begin(), kl[i].end()) : 0.0;
    p["top1_agreement"] = top1;
    p["buckets"] = Buckets(kl[i], agree[i], kTableBuckets);
    p["chart"] = Buckets(kl[i], agree[i], std::min(kChartBuckets, std::max(1, n)));
    p["path_max_abs_diff"] = path_diff[i];
    p["path_first_mismatch"] = path_first[i] < 0 ? json(nullptr) : json(path_first[i]);
    int first_diff = -1;
    for (size_t g = 0; g < free_tokens[i].size() && g < free_tokens[0].size(); ++g) {
      if (free_tokens[i][g] != free_tokens[0][g]) {
        first_diff = static_cast<int>(g);
        break;
      }
    }
    p["free_run"] = {{"tokens", free_tokens[i].size()},
                     {"first_difference", first_diff < 0 ? json(nullptr) : json(first_diff)},
                     {"text", ctx.model->tokenizer().Decode(free_tokens[i])}};
    if (i > 0) p["layers"] = diagnostics[i];

    std::vector<std::string> reasons;
    if (path_first[i] >= 0) {
      reasons.push_back("decode path differs from prompt path from position " +
                        std::to_string(path_first[i]) + " (max |dlogit| " +
                        Fmt("%.3g", path_diff[i]) + ")");
    }
    if (mean > th.kl_mean_max)
      reasons.push_back("mean KL " + Fmt("%.3g", mean) + " > " + Fmt("%g", th.kl_mean_max));
    for (const json& b : p["buckets"]) {
      if (b["mean_kl"].get<double>() > th.kl_bucket_max) {
        reasons.push_back("mean KL " + Fmt("%.3g", b["mean_kl"].get<double>()) + " at positions " +
                          std::to_string(b["from"].get<int>()) + "-" +
                          std::to_string(b["to"].get<int>()) + " > " + Fmt("%g", th.kl_bucket_max));
        break;
      }
    }
    // Quantization noise averages out over a layer's cells; a systematic offset does not.
    if (i > 0 && diagnostics[i].is_array()) {
      for (const json& l : diagnostics[i]) {
        for (const char* side : {"k", "v"}) {
          const double b = l[side]["bias_rel"].get<double>();
          if (std::fabs(b) > th.bias_rel_max) {
            reasons.push_back(std::string(side == std::string("k") ? "K" : "V") + " bias " +
                              Fmt("%.3g", b) + " x RMS at layer " +
                              std::to_string(l["layer"].get<int>()) + " (limit " +
                              Fmt("%g", th.bias_rel_max) + ")");
            break;
          }
        }
        if (reasons.size() && reasons.back().find(" bias ") != std::string::npos) break;
      }
    }
    if (top1 < th.top1_min) {
      reasons.push_back("top-1 agreement " + Fmt("%.1f%%", 100 * top1) + " < " +
                        Fmt("%.0f%%", 100 * th.top1_min));
    }
    std::string reason;
    for (const std::string& r : reasons) reason += (reason.empty() ? "" : "; ") + r;
    p["status"] = reasons.empty() ? "pass" : "fail";
    if (!reasons.empty()) p["reason"] = reason;
    p["cell"] = i == 0 ? std::string("reference")
                       : "KL " + Fmt("%.2g", mean) + ", top-1 " + Fmt("%.1f%%", 100 * top1) +
                             (first_diff < 0 ? std::string(", free-run same")
                                             : ", free-run differs @" + std::to_string(first_diff));
    report["legs"][i]["probes"]["divergence"] = p;
  }
}

}  // namespace lamina::cli::probe
