// Speculative-decoding flags and drafter set-up for run and chat (see cli_spec.h).
#include "cli_spec.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>

#include "cli_common.h"
#include "engine/generate.h"
#include "runtime/recurrent_state.h"
#include "util/memory.h"

namespace lamina::cli {

void AddSpecOptions(CLI::App* cmd, SpecCliOptions& s) {
  cmd->add_option("--spec", s.mode,
                  "Speculative decoding: off, lookup (prompt lookup), draft (a draft model) or mtp "
                  "(the model's own multi-token-prediction block)")
      ->check(CLI::IsMember({"off", "lookup", "draft", "mtp"}));
  // llama.cpp's --spec-type, for the kinds lamina has: none, draft-simple, ngram-simple,
  // draft-mtp.
  cmd->add_option_function<std::string>(
         "--spec-type",
         [&s](const std::string& value) {
           static const std::map<std::string, std::string> kModes = {{"none", "off"},
                                                                     {"draft-simple", "draft"},
                                                                     {"ngram-simple", "lookup"},
                                                                     {"draft-mtp", "mtp"}};
           auto it = kModes.find(value);
           if (it == kModes.end()) {
             throw CLI::ValidationError("--spec-type", value +
                                                           ": lamina has none, draft-simple "
                                                           "(--spec draft), ngram-simple "
                                                           "(--spec lookup) and draft-mtp "
                                                           "(--spec mtp)");
           }
           s.mode = it->second;
         },
         "llama.cpp's spelling of --spec")
      ->group("");
  cmd->add_option(
      "--model-draft", s.draft_model,
      "Draft model for --spec draft (-md) (default: <model>-draft.gguf beside the model)");
  cmd->add_option("--draft-max,--draft,--draft-n,--spec-draft-n-max", s.draft_max,
                  "Tokens drafted per verify step (default: 8)");
  cmd->add_option("--draft-min,--draft-n-min,--spec-draft-n-min", s.draft_min,
                  "Drafts shorter than this are not verified (default: 0)");
  cmd->add_option("--draft-p-min", s.draft_p_min,
                  "Stop drafting when the draft model's (or MTP block's) probability falls below P "
                  "(default: 0.5)");
  cmd->add_option(
      "--lookup-ngram", s.lookup_ngram,
      "Shortest match of the history's end that prompt lookup drafts from (default: 2)");
  cmd->add_option("--kv-draft", s.kv_draft,
                  "KV cache mode of the draft model or MTP block (default: f16)");
  cmd->add_flag("--spec-fixed", s.fixed, "Always draft (no pausing when speculation does not pay)");
}

namespace {
// --spec mtp: the model's own MTP block in a session of the target's context (--kv-draft).
template <typename Fail>
bool MakeMtpSetup(const SpecCliOptions& o, const Model& target, int n_ctx, ThreadPool& pool,
                  SpecSetup* out, const Fail& fail, bool build_drafter, Session* target_session) {
  Status has = spec::CheckMtp(target);
  if (!has.ok()) return fail(kExitBadInput, has.error().message);
  SessionConfig dc;
  dc.n_ctx = n_ctx;
  Result<KvType> kv = ParseKvType(o.kv_draft);
  if (!kv.ok()) return fail(kExitUsage, "--kv-draft: " + kv.error().message);
  dc.kv_type = *kv;
  Result<KvCacheConfig> cc = MakeKvCacheConfig(target.mtp()->hparams(), dc);
  if (!cc.ok()) return fail(kExitUsage, "--kv-draft: " + cc.error().message);
  out->draft_config = dc;
  if (build_drafter && target_session != nullptr) {
    out->drafter = std::make_unique<spec::MtpDrafter>(*target_session, 0, dc, pool, o.draft_p_min);
  }
  return true;
}
}  // namespace

uint64_t MtpPlanBytes(const SpecCliOptions& o, const Model& target, const SessionConfig& sc) {
  if (o.mode != "mtp" || target.mtp() == nullptr) return 0;
  const Hparams& mtp = target.mtp()->hparams();
  Result<KvCacheConfig> tc = MakeKvCacheConfig(target.hparams(), sc);  // n_ctx 0 resolved
  if (!tc.ok()) return 0;
  SessionConfig dc;
  dc.n_ctx = tc->n_ctx;
  Result<KvType> kv = ParseKvType(o.kv_draft);
  if (!kv.ok()) return 0;
  dc.kv_type = *kv;
  Result<KvCacheConfig> cc = MakeKvCacheConfig(mtp, dc);
  if (!cc.ok()) return 0;
  const uint64_t per_seq = SatAdd(
      SatAdd(KvCacheBytes(*cc), RecurrentState::PlanBytes(mtp.recurrent, 1, dc.recurrent_ring)),
      SatMul(static_cast<uint64_t>(std::max(0, tc->n_ctx)),
             static_cast<uint64_t>(target.hparams().n_embd) * sizeof(float)));
  return SatMul(per_seq, static_cast<uint64_t>(std::max(1, tc->n_seq)));
}

bool MakeSpecSetup(const SpecCliOptions& o, const std::string& target_path, const Model& target,
                   int n_ctx, ThreadPool& pool, SpecSetup* out, int* exit_code, bool build_drafter,
                   Session* target_session) {
  auto fail = [&](int code, const std::string& msg) {
    std::fprintf(stderr, "lamina: %s\n", msg.c_str());
    *exit_code = code;
    return false;
  };
  if (o.mode == "off") return true;
  const bool draft = o.mode == "draft";
  spec::SpecOptions& so = out->options;
  so.draft_max = o.draft_max != SpecCliOptions::kUnset ? o.draft_max : 8;
  if (so.draft_max < 1) return fail(kExitUsage, "--draft-max must be at least 1");
  if (so.draft_max >= kKvWindowSlack) {
    // A rejected draft is cut back within the KV window's slack (kv_cache.h).
    return fail(kExitUsage, "--draft-max must be below " + std::to_string(kKvWindowSlack));
  }
  if (o.draft_min < 0) return fail(kExitUsage, "--draft-min must not be negative");
  if (o.draft_min > so.draft_max) return fail(kExitUsage, "--draft-min exceeds --draft-max");
  so.draft_min = o.draft_min;
  if (!(o.draft_p_min >= 0.0f && o.draft_p_min <= 1.0f)) {
    return fail(kExitUsage, "--draft-p-min must be in [0, 1]");
  }
  if (o.lookup_ngram < 1 || o.lookup_ngram > 64) {
    return fail(kExitUsage, "--lookup-ngram must be in [1, 64]");
  }
  so.adaptive = !o.fixed;
  // One cost model for every generation of this setup (a chat's turns, a benchmark's runs).
  so.costs = std::make_shared<spec::CostModel>();
  if (o.mode == "mtp")
    return MakeMtpSetup(o, target, n_ctx, pool, out, fail, build_drafter, target_session);
  if (!draft) {
    if (build_drafter) out->drafter = NewDrafter(o, *out, pool);
    return true;
  }
  std::string path = o.draft_model;
  if (path.empty()) {
    namespace fs = std::filesystem;
    const fs::path t(target_path);
    const fs::path guess = t.parent_path() / (t.stem().string() + "-draft.gguf");
    if (!fs::exists(guess)) {
      return fail(kExitUsage, "--spec draft needs -md DRAFT_MODEL (no " + guess.string() + ")");
    }
    path = guess.string();
  }
  LoadedModel lm = LoadModelForCli(path);  // prints its own error line
  if (!lm.model) {
    *exit_code = kExitBadInput;
    return false;
  }
  Status compatible = spec::CheckDraftCompatible(target, *lm.model);
  if (!compatible.ok()) return fail(kExitBadInput, compatible.error().message);
  SessionConfig dc;
  dc.n_ctx = n_ctx;
  Result<KvType> kv = ParseKvType(o.kv_draft);
  if (!kv.ok()) return fail(kExitUsage, "--kv-draft: " + kv.error().message);
  dc.kv_type = *kv;
  Result<KvCacheConfig> cc = MakeKvCacheConfig(lm.model->hparams(), dc);
  if (!cc.ok()) return fail(kExitUsage, "--kv-draft: " + cc.error().message);
  out->draft_model = std::move(lm.model);
  out->load_seconds = lm.load_seconds;
  out->draft_config = dc;
  if (build_drafter) {
    out->drafter = std::make_unique<spec::ModelDrafter>(*out->draft_model, dc, pool, o.draft_p_min);
  }
  return true;
}

bool AttachMtpHead(const std::string& modes, const std::string& model_path, Model& model,
                   int* exit_code) {
  bool wanted = false;
  for (size_t start = 0; start <= modes.size();) {
    const size_t comma = std::min(modes.find(',', start), modes.size());
    wanted = wanted || modes.substr(start, comma - start) == "mtp";
    start = comma + 1;
  }
  if (!wanted || model.mtp() != nullptr) return true;
  namespace fs = std::filesystem;
  const fs::path t(model_path);
  const fs::path head = t.parent_path() / (t.stem().string() + "-mtp.gguf");
  if (!fs::exists(head)) return true;  // CheckMtp refuses the model later, naming the file
  Status st = LoadMtpHead(model, head.string());
  if (st.ok()) return true;
  std::fprintf(stderr, "lamina: --spec mtp: %s\n", st.error().message.c_str());
  *exit_code = kExitBadInput;
  return false;
}

std::unique_ptr<spec::Drafter> NewDrafter(const SpecCliOptions& o, const SpecSetup& setup,
                                          ThreadPool& pool, Session* target_session) {
  if (o.mode == "mtp" && target_session != nullptr) {
    return std::make_unique<spec::MtpDrafter>(*target_session, 0, setup.draft_config, pool,
                                              o.draft_p_min);
  }
  if (o.mode == "lookup") return std::make_unique<spec::LookupDrafter>(o.lookup_ngram);
  if (o.mode == "draft" && setup.draft_model) {
    return std::make_unique<spec::ModelDrafter>(*setup.draft_model, setup.draft_config, pool,
                                                o.draft_p_min);
  }
  return nullptr;
}

Result<GenerateResult> GenerateWithSpec(Session& session, const std::vector<int32_t>& prompt,
                                        const GenerateOptions& go, SpecSetup& spec,
                                        spec::SpecStats* stats,
                                        const std::function<bool(const std::string&)>& on_text,
                                        const std::function<void(int, int)>& on_prompt_progress) {
  if (!spec.drafter) return engine::Generate(session, 0, prompt, go, on_text, on_prompt_progress);
  return engine::GenerateSpeculative(session, 0, prompt, go, *spec.drafter, spec.options, stats,
                                     on_text, on_prompt_progress);
}

std::string SpecSummary(const SpecSetup& spec, const spec::SpecStats& s) {
  char buf[256];
  std::snprintf(buf, sizeof(buf),
                "spec %s | drafted %lld, accepted %lld (%.1f%%), %.2f tokens per verify step, "
                "%lld verify / %lld plain steps",
                spec.drafter ? spec.drafter->name() : "off", static_cast<long long>(s.drafted),
                static_cast<long long>(s.accepted), 100.0 * s.acceptance(), s.tokens_per_verify(),
                static_cast<long long>(s.verify_steps), static_cast<long long>(s.plain_steps));
  return buf;
}

}  // namespace lamina::cli
