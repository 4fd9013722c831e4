// `lamina run`: tokenize the prompt (in the chat template with --chat), then the library's
// generation loop (prefill in one batch or chunks, decode) streams the text.
#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli_common.h"
#include "cli_spec.h"
#include "runtime/generate.h"
#include "runtime/session.h"
#include "runtime/session_file.h"
#include "util/timer.h"

namespace lamina::cli {

namespace {

// --chat: the prompt as one user turn in the chat template; an exit code. *answer: how the
// answer is written (harmony, or a `<think>` block the prompt may open), as the server reads it.
int ApplyChatTemplate(const Model& model, const ChatTemplateOptions& chat_template,
                      std::string* prompt, chat::AnswerFormat* answer) {
  const Tokenizer& tok = model.tokenizer();
  chat::ChatSetup setup;
  int rc = kExitOk;
  if (!ReadChatSetup(model, chat_template, &setup, &rc)) return rc;
  Result<std::string> text = chat::RenderChatPrompt(setup, {chat::ChatMessage{"user", *prompt}},
                                                    tok, {}, ChatRenderOptionsFor(chat_template));
  if (!text.ok()) {
    std::fprintf(stderr, "lamina: %s\n", text.error().message.c_str());
    return kExitBadInput;
  }
  *prompt = std::move(*text);
  answer->harmony = setup.harmony;
  answer->reasoning_format = chat::ReasoningFormat::kDeepseek;  // the server's default
  answer->thinking_at_start = chat::PromptOpensThinking(*prompt);
  return kExitOk;
}

// --chat --json: the answer's reasoning, content and tool calls, split as the server's message
// of a request without tools is (chat::SplitAnswer: harmony's channels and calls, or a `<think>`
// block; other templates' calls need offered tools, which `run` has none of).
void AddAnswerParts(const chat::AnswerFormat& format, const std::string& text, nlohmann::json* j) {
  const chat::AnswerParts parts = chat::SplitAnswer(format, text);
  nlohmann::json list = nlohmann::json::array();
  for (const chat::ToolCall& c : parts.calls) {
    list.push_back(
        {{"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
  }
  (*j)["reasoning"] = parts.reasoning;
  (*j)["content"] = parts.content;
  (*j)["tool_calls"] = std::move(list);
}

// The text and timings (--json: one object with the tokens) after the streamed text.
// answer: how a --chat answer is written (nullptr without --chat).
void PrintRunReport(const RunOptions& o, const LoadedModel& lm, const SessionConfig& sc,
                    const std::vector<int32_t>& prompt_tokens, const GenerateResult& r,
                    const SpecSetup& spec, const spec::SpecStats& spec_stats,
                    const chat::AnswerFormat* answer) {
  const std::vector<int32_t>& generated = r.tokens;
  const int n_prompt = static_cast<int>(prompt_tokens.size());
  const std::string& text = r.text;
  const double t_prompt = r.prompt_seconds, t_gen = r.decode_seconds;
  const int n_decoded = std::max<int>(0, static_cast<int>(generated.size()) - 1);
  const double prompt_tps = n_prompt / std::max(t_prompt, 1e-9);
  const double decode_tps = n_decoded > 0 ? n_decoded / std::max(t_gen, 1e-9) : 0.0;

  if (o.json) {
    nlohmann::json j;
    j["prompt_tokens"] = prompt_tokens;
    j["generated_tokens"] = generated;
    j["text"] = text;
    if (answer != nullptr) AddAnswerParts(*answer, text, &j);
    j["timings"] = {{"load_s", lm.load_seconds},      {"prompt_s", t_prompt},
                    {"prompt_tok_s", prompt_tps},     {"decode_s", t_gen},
                    {"decode_tok_s", decode_tps},     {"n_prompt", n_prompt},
                    {"n_generated", generated.size()}};
    j["kv"] = KvTypeName(sc.kv_type);
    j["kv_v_round"] = KvRoundingName(sc.v_rounding);
    j["seed"] = o.seed;
    if (spec.drafter) {
      j["spec"] = {{"mode", spec.drafter->name()},
                   {"draft_max", spec.options.draft_max},
                   {"drafted", spec_stats.drafted},
                   {"accepted", spec_stats.accepted},
                   {"acceptance", spec_stats.acceptance()},
                   {"tokens_per_verify", spec_stats.tokens_per_verify()},
                   {"verify_steps", spec_stats.verify_steps},
                   {"plain_steps", spec_stats.plain_steps},
                   {"draft_s", spec_stats.draft_seconds}};
    }
    std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  } else {
    std::printf("\n");
    std::fprintf(
        stderr,
        "lamina: load %.3f s | prompt %d tokens, %.1f tok/s | decode %zu tokens, %.1f tok/s\n",
        lm.load_seconds, n_prompt, prompt_tps, generated.size(), decode_tps);
    if (spec.drafter) std::fprintf(stderr, "lamina: %s\n", SpecSummary(spec, spec_stats).c_str());
  }
}

}  // namespace

int RunGenerate(const RunOptions& o) {
  std::string prompt = o.prompt;
  if (!o.prompt_file.empty()) {
    std::string err;
    if (!ReadTextFile(o.prompt_file, &prompt, &err)) {
      std::fprintf(stderr, "lamina: %s\n", err.c_str());
      return kExitBadInput;
    }
  }
  if (o.n_predict < 0 || o.prompt_chunk < 0) {
    std::fprintf(stderr, "lamina: -n, -c and --prompt-chunk must not be negative\n");
    return kExitUsage;
  }
  LoadedModel lm = LoadModelForCli(o.common);
  if (!lm.model) return kExitBadInput;
  if (int rc = kExitOk; !AttachMtpHead(o.spec.mode, o.common.model_path, *lm.model, &rc)) return rc;
  const Model& model = *lm.model;
  const Tokenizer& tok = model.tokenizer();

  ThreadPool pool(o.common.n_threads);
  SessionConfig sc;
  int rc = kExitOk;
  if (!MakeSessionConfig(o.common, model, &sc, &rc)) return rc;

  bool ignore_eos = o.ignore_eos;
  chat::AnswerFormat answer;  // --chat: how the answer is written (harmony: printed by channels)
  if (o.chat) {               // the prompt is one user turn; the answer ends with the turn
    if (int chat_rc = ApplyChatTemplate(model, o.chat_template, &prompt, &answer);
        chat_rc != kExitOk) {
      return chat_rc;
    }
    ignore_eos = false;
  }
  std::vector<int32_t> prompt_tokens =
      tok.Encode(prompt, /*add_special=*/true, /*parse_special=*/true);
  if (prompt_tokens.empty()) {
    std::fprintf(stderr, "lamina: the prompt is empty and the model adds no BOS token\n");
    return kExitUsage;
  }
  const int n_batch = o.prompt_chunk > 0 ? std::min<int>(o.prompt_chunk, prompt_tokens.size())
                                         : static_cast<int>(prompt_tokens.size());
  if (!CheckMemoryPlan(o.common, model, &sc, n_batch, 1, 0, "use --prompt-chunk N", &rc,
                       MtpPlanBytes(o.spec, model, sc))) {
    return rc;
  }
  Session session(model, sc, pool);
  SpecSetup spec;
  if (!MakeSpecSetup(o.spec, o.common.model_path, model, session.n_ctx(), pool, &spec, &rc,
                     /*build_drafter=*/true, &session)) {
    return rc;
  }
  if (!o.json) PrintKvSummary(session.cache());
  const uint64_t model_hash = o.session.empty() ? 0 : ModelIdentityHash(model);
  if (!o.session.empty() &&
      !RestoreSessionForCli(o, session, model_hash, &prompt_tokens, nullptr, &rc)) {
    return rc;
  }
  if (static_cast<int>(prompt_tokens.size()) + o.n_predict > session.n_ctx()) {
    std::fprintf(stderr, "lamina: prompt (%zu tokens) + -n %d exceeds the context of %d (use -c)\n",
                 prompt_tokens.size(), o.n_predict, session.n_ctx());
    return kExitUsage;
  }

  GenerateOptions go;
  go.params.sampler = MakeSamplerConfig(o);
  go.params.n_predict = o.n_predict;
  go.params.ignore_eos = ignore_eos;
  if (!MakeGrammar(o, &go.params.grammar, &rc)) return rc;
  go.prompt_chunk = o.prompt_chunk;
  const int n_prompt = static_cast<int>(prompt_tokens.size());
  const bool progress = StderrIsTerminal() && !o.json && n_prompt > 256;
  spec::SpecStats spec_stats;
  AnswerPrinter printer(answer.harmony);
  Result<GenerateResult> r = GenerateWithSpec(
      session, prompt_tokens, go, spec, &spec_stats,
      [&](const std::string& piece) {
        if (!o.json) printer.Print(piece);
        return true;
      },
      [&](int done, int total) {
        if (progress)
          std::fprintf(stderr, "\rprompt %d/%d%s", done, total, done == total ? "\n" : "");
      });
  if (!o.json) printer.Finish();
  if (!r.ok()) {
    std::fprintf(stderr, "lamina: %s\n", r.error().message.c_str());
    return kExitFailure;
  }
  const std::vector<int32_t>& generated = r->tokens;
  if (!o.session.empty()) {
    std::vector<int32_t> history = prompt_tokens;
    history.insert(history.end(), generated.begin(), generated.end());
    if (!SaveSessionForCli(o, session, model_hash, history, "", &rc)) return rc;
  }
  PrintRunReport(o, lm, sc, prompt_tokens, *r, spec, spec_stats, o.chat ? &answer : nullptr);
  return kExitOk;
}

}  // namespace lamina::cli
