// `lamina score`: teacher-forced evaluation. The text is tokenized (with BOS) and processed in
// consecutive windows of n_ctx tokens, each in a fresh cache; every position's next-token
// distribution is scored. --save-logits writes all logits; --kl-base compares against such a
// file (KL(base || this), top-1 agreement). --mtp scores the model's multi-token-prediction block
// instead: row p is the block's distribution of x_{p+1} from x_p and the trunk's h_{p-1}.
//
// Logits file: "LMNLOGIT" | u32 version=1 | u32 n_vocab | u64 n_positions |
//              i32 tokens[n_positions] | f32 logits[n_positions][n_vocab]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli_common.h"
#include "cli_spec.h"
#include "probe/kl.h"
#include "runtime/session.h"
#include "util/memory.h"
#include "util/timer.h"

namespace lamina::cli {

namespace {

using probe::KlDivergence;
using probe::LogSoftmax;
using probe::Percentile;

constexpr char kLogitsMagic[8] = {'L', 'M', 'N', 'L', 'O', 'G', 'I', 'T'};

struct LogitsDump {
  uint32_t n_vocab = 0;
  std::vector<int32_t> tokens;
  std::vector<float> logits;  // [n_positions, n_vocab]
};

bool WriteDump(const std::string& path, const LogitsDump& d, std::string* err) {
  std::ofstream out(path, std::ios::binary);
  if (!out) {
    *err = path + ": cannot create";
    return false;
  }
  const uint32_t version = 1;
  const uint64_t n = d.tokens.size();
  out.write(kLogitsMagic, 8);
  out.write(reinterpret_cast<const char*>(&version), 4);
  out.write(reinterpret_cast<const char*>(&d.n_vocab), 4);
  out.write(reinterpret_cast<const char*>(&n), 8);
  out.write(reinterpret_cast<const char*>(d.tokens.data()), 4 * n);
  out.write(reinterpret_cast<const char*>(d.logits.data()), 4 * d.logits.size());
  if (!out) {
    *err = path + ": write failed";
    return false;
  }
  return true;
}

bool ReadDump(const std::string& path, LogitsDump* d, std::string* err) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) {
    *err = path + ": cannot open";
    return false;
  }
  const uint64_t size = static_cast<uint64_t>(in.tellg());
  in.seekg(0);
  char magic[8];
  uint32_t version = 0;
  uint64_t n = 0;
  if (size < 24 || !in.read(magic, 8) || std::memcmp(magic, kLogitsMagic, 8) != 0) {
    *err = path + ": not a lamina logits file (bad magic at byte 0)";
    return false;
  }
  in.read(reinterpret_cast<char*>(&version), 4);
  in.read(reinterpret_cast<char*>(&d->n_vocab), 4);
  in.read(reinterpret_cast<char*>(&n), 8);
  if (version != 1) {
    *err = path + ": unsupported logits file version " + std::to_string(version) + " at byte 8";
    return false;
  }
  if (d->n_vocab == 0 || d->n_vocab > (1u << 24) || n > (1ull << 32) ||
      size != 24 + 4 * n + 4ull * n * d->n_vocab) {
    *err =
        path + ": header (n_vocab at byte 12, n_positions at byte 16) does not match the file size";
    return false;
  }
  d->tokens.resize(n);
  d->logits.resize(n * d->n_vocab);
  in.read(reinterpret_cast<char*>(d->tokens.data()), 4 * n);
  in.read(reinterpret_cast<char*>(d->logits.data()), 4 * d->logits.size());
  if (!in) {
    *err = path + ": truncated";
    return false;
  }
  return true;
}

// The negative log-likelihood of the scored positions, and the context of the last window.
struct Scored {
  double nll = 0.0;
  int64_t n_scored = 0;
  int n_ctx = 0;
};

// The MTP block's logits over one window the trunk `session` has evaluated (with KeepHidden):
// cell p pairs x_p with h_{p-1} (zeros at p = 0), as the MTP drafter lays it out.
Result<const float*> MtpWindow(const Model& model, const SessionConfig& sc, ThreadPool& pool,
                               const Session& session, const int32_t* tokens, int n,
                               std::unique_ptr<Session>* mtp) {
  const int d = model.hparams().n_embd;
  *mtp = std::make_unique<Session>(*model.mtp(), sc, pool);
  SequenceBatch batch;
  std::vector<float> embd(static_cast<size_t>(n) * d, 0.0f);  // [n, n_embd] h_{p-1}
  for (int p = 0; p < n; ++p) {
    batch.Add(tokens[p], 0, p, true);
    if (p > 0) std::copy_n(session.Hidden(0, p - 1), d, embd.data() + static_cast<size_t>(p) * d);
  }
  return (*mtp)->Decode(batch, embd.data());
}

// Scores `tokens` in consecutive windows of n_ctx tokens, each in a fresh session, keeping every
// position's logits in *dump when keep_logits; false (after the message) when an evaluation
// fails. Progress goes to a terminal's stderr unless quiet.
bool ScoreWindows(const Model& model, const SessionConfig& sc, ThreadPool& pool,
                  const std::vector<int32_t>& tokens, bool keep_logits, bool quiet, bool mtp,
                  Scored* out, LogitsDump* dump) {
  const int n_vocab = model.hparams().n_vocab;
  for (size_t start = 0; start < tokens.size();) {
    Session session(model, sc, pool);
    if (mtp) session.KeepHidden();
    out->n_ctx = session.n_ctx();
    const int n = static_cast<int>(std::min<size_t>(out->n_ctx, tokens.size() - start));
    Result<const float*> r = session.Eval(tokens.data() + start, n, true);
    std::unique_ptr<Session> mtp_session;
    if (r.ok() && mtp)
      r = MtpWindow(model, sc, pool, session, tokens.data() + start, n, &mtp_session);
    if (!r.ok()) {
      std::fprintf(stderr, "lamina: %s\n", r.error().message.c_str());
      return false;
    }
    std::vector<double> lsm;
    for (int i = 0; i < n; ++i) {
      const float* row = *r + static_cast<int64_t>(i) * n_vocab;
      if (start + i + 1 < tokens.size() && i + 1 < n) {
        LogSoftmax(row, n_vocab, lsm);
        out->nll -= lsm[tokens[start + i + 1]];
        ++out->n_scored;
      }
      if (keep_logits) {
        dump->tokens.push_back(tokens[start + i]);
        dump->logits.insert(dump->logits.end(), row, row + n_vocab);
      }
    }
    start += n;
    if (StderrIsTerminal() && !quiet)
      std::fprintf(stderr, "\rscored %zu/%zu", start, tokens.size());
  }
  return true;
}

// --kl-base: KL(base || this) per position and top-1 agreement, into *j.
void AddKlStats(const LogitsDump& base, const LogitsDump& dump, int n_vocab, nlohmann::json* j) {
  std::vector<double> kld(dump.tokens.size());
  int64_t agree = 0;
  std::vector<double> lp, lq;
  for (size_t i = 0; i < dump.tokens.size(); ++i) {
    const float* p = base.logits.data() + i * n_vocab;
    const float* q = dump.logits.data() + i * n_vocab;
    kld[i] = KlDivergence(p, q, n_vocab, lp, lq);
    agree += (std::max_element(p, p + n_vocab) - p) == (std::max_element(q, q + n_vocab) - q);
  }
  double mean = 0.0;
  for (double k : kld) mean += k;
  mean /= kld.size();
  (*j)["kld_mean"] = mean;
  (*j)["kld_median"] = Percentile(kld, 0.5);
  (*j)["kld_p99"] = Percentile(kld, 0.99);
  (*j)["kld_max"] = *std::max_element(kld.begin(), kld.end());
  (*j)["top1_agreement"] = static_cast<double>(agree) / kld.size();
}

}  // namespace

int RunScore(const ScoreOptions& o) {
  std::string text, err;
  if (!ReadTextFile(o.text_file, &text, &err)) {
    std::fprintf(stderr, "lamina: %s\n", err.c_str());
    return kExitBadInput;
  }
  LogitsDump base;
  if (!o.kl_base.empty() && !ReadDump(o.kl_base, &base, &err)) {
    std::fprintf(stderr, "lamina: --kl-base: %s\n", err.c_str());
    return kExitBadInput;
  }
  LoadedModel lm = LoadModelForCli(o.common);
  if (!lm.model) return kExitBadInput;
  int rc = kExitOk;
  if (o.mtp && !AttachMtpHead("mtp", o.common.model_path, *lm.model, &rc)) return rc;
  const Model& model = *lm.model;
  if (o.mtp && model.mtp() == nullptr) {
    std::fprintf(stderr, "lamina: --mtp: the model has no multi-token-prediction block\n");
    return kExitBadInput;
  }
  const int n_vocab = model.hparams().n_vocab;
  std::vector<int32_t> tokens = model.tokenizer().Encode(text, true, false);
  if (tokens.size() < 2) {
    std::fprintf(stderr, "lamina: %s: need at least 2 tokens to score\n", o.text_file.c_str());
    return kExitBadInput;
  }
  ThreadPool pool(o.common.n_threads);
  SessionConfig sc;
  if (!MakeSessionConfig(o.common, model, &sc, &rc)) return rc;
  {
    // One window is evaluated with all its logits; --save-logits / --kl-base keep them all.
    Result<KvCacheConfig> kc = MakeKvCacheConfig(model.hparams(), sc);
    const int window = static_cast<int>(std::min<size_t>(kc.ok() ? kc->n_ctx : 0, tokens.size()));
    const bool keep = !o.save_logits.empty() || !o.kl_base.empty();
    const uint64_t kept = keep ? SatMul(SatMul(tokens.size(), n_vocab), 2 * sizeof(float)) : 0;
    if (!CheckMemoryPlan(o.common, model, &sc, window, window, kept, "lower --ctx-size/-c", &rc)) {
      return rc;
    }
  }

  LogitsDump dump;
  dump.n_vocab = static_cast<uint32_t>(n_vocab);
  const bool keep_logits = !o.save_logits.empty() || !o.kl_base.empty();
  const double t0 = NowSeconds();
  Scored scored;
  if (!ScoreWindows(model, sc, pool, tokens, keep_logits, o.json, o.mtp, &scored, &dump)) {
    return kExitFailure;
  }
  if (StderrIsTerminal() && !o.json) std::fprintf(stderr, "\n");
  const double seconds = NowSeconds() - t0;
  const double ppl = std::exp(scored.nll / std::max<int64_t>(1, scored.n_scored));

  nlohmann::json j;
  j["perplexity"] = ppl;
  j["n_tokens"] = tokens.size();
  j["n_scored"] = scored.n_scored;
  j["n_ctx"] = scored.n_ctx;
  j["kv"] = KvTypeName(sc.kv_type);
  j["kv_v_round"] = KvRoundingName(sc.v_rounding);
  j["seconds"] = seconds;
  if (!o.save_logits.empty() && !WriteDump(o.save_logits, dump, &err)) {
    std::fprintf(stderr, "lamina: --save-logits: %s\n", err.c_str());
    return kExitFailure;
  }
  if (!o.kl_base.empty()) {
    if (base.n_vocab != dump.n_vocab || base.tokens != dump.tokens) {
      std::fprintf(stderr,
                   "lamina: --kl-base: %s was made from other tokens or another vocabulary\n",
                   o.kl_base.c_str());
      return kExitBadInput;
    }
    AddKlStats(base, dump, n_vocab, &j);
  }
  if (o.json) {
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("perplexity %.4f over %lld scored tokens (%zu tokens, n_ctx %d, kv %s, %.2f s)\n",
                ppl, static_cast<long long>(scored.n_scored), tokens.size(), scored.n_ctx,
                KvTypeName(sc.kv_type), seconds);
    if (!o.kl_base.empty()) {
      std::printf(
          "KL divergence vs %s: mean %.6g median %.6g p99 %.6g max %.6g | top-1 agreement %.4f\n",
          o.kl_base.c_str(), j["kld_mean"].get<double>(), j["kld_median"].get<double>(),
          j["kld_p99"].get<double>(), j["kld_max"].get<double>(),
          j["top1_agreement"].get<double>());
    }
  }
  return kExitOk;
}

}  // namespace lamina::cli
