// `lamina run`: tokenize the prompt, prefill (one batch or chunks), then decode and stream text.
#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli_common.h"
#include "runtime/sampler.h"
#include "runtime/session.h"
#include "util/timer.h"

namespace lamina::cli {

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
  const Model& model = *lm.model;
  const Tokenizer& tok = model.tokenizer();
  const int n_vocab = model.hparams().n_vocab;

  ThreadPool pool(o.common.n_threads);
  SessionConfig sc;
  int rc = kExitOk;
  if (!MakeSessionConfig(o.common, model, &sc, &rc)) return rc;
  Session session(model, sc, pool);
  if (!o.json) PrintKvSummary(session.cache());

  std::vector<int32_t> prompt_tokens = tok.Encode(prompt, /*add_special=*/true, /*parse_special=*/true);
  if (prompt_tokens.empty()) {
    std::fprintf(stderr, "lamina: the prompt is empty and the model adds no BOS token\n");
    return kExitUsage;
  }
  if (static_cast<int>(prompt_tokens.size()) + o.n_predict > session.n_ctx()) {
    std::fprintf(stderr, "lamina: prompt (%zu tokens) + -n %d exceeds the context of %d (use -c)\n",
                 prompt_tokens.size(), o.n_predict, session.n_ctx());
    return kExitUsage;
  }

  Sampler sampler(MakeSamplerConfig(o));

  // Prefill.
  const double t_prompt0 = NowSeconds();
  const int n_prompt = static_cast<int>(prompt_tokens.size());
  const int chunk = o.prompt_chunk > 0 ? o.prompt_chunk : n_prompt;
  const float* logits = nullptr;
  for (int i = 0; i < n_prompt; i += chunk) {
    const int n = std::min(chunk, n_prompt - i);
    Result<const float*> r = session.Eval(prompt_tokens.data() + i, n, false);
    if (!r.ok()) {
      std::fprintf(stderr, "lamina: %s\n", r.error().message.c_str());
      return kExitFailure;
    }
    logits = *r;
    if (StderrIsTerminal() && !o.json && n_prompt > 256) {
      std::fprintf(stderr, "\rprompt %d/%d", i + n, n_prompt);
    }
  }
  if (StderrIsTerminal() && !o.json && n_prompt > 256) std::fprintf(stderr, "\n");
  const double t_prompt = NowSeconds() - t_prompt0;

  // Decode.
  std::vector<int32_t> history = prompt_tokens;
  std::vector<int32_t> generated;
  std::string text;
  StreamingDetokenizer detok(tok);
  const double t_gen0 = NowSeconds();
  for (int i = 0; i < o.n_predict; ++i) {
    const int32_t id = sampler.Sample(logits, n_vocab, history);
    if (!o.ignore_eos && tok.IsEog(id)) break;
    generated.push_back(id);
    history.push_back(id);
    const std::string piece = detok.Push(id);
    text += piece;
    if (!o.json) {
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
    }
    if (i + 1 == o.n_predict) break;
    Result<const float*> r = session.Eval(&id, 1, false);
    if (!r.ok()) {
      std::fprintf(stderr, "lamina: %s\n", r.error().message.c_str());
      return kExitFailure;
    }
    logits = *r;
  }
  const std::string tail = detok.Flush();
  text += tail;
  const double t_gen = NowSeconds() - t_gen0;
  const int n_decoded = std::max<int>(0, static_cast<int>(generated.size()) - 1);
  const double prompt_tps = n_prompt / std::max(t_prompt, 1e-9);
  const double decode_tps = n_decoded > 0 ? n_decoded / std::max(t_gen, 1e-9) : 0.0;

  if (o.json) {
    nlohmann::json j;
    j["prompt_tokens"] = prompt_tokens;
    j["generated_tokens"] = generated;
    j["text"] = text;
    j["timings"] = {{"load_s", lm.load_seconds},
                    {"prompt_s", t_prompt},
                    {"prompt_tok_s", prompt_tps},
                    {"decode_s", t_gen},
                    {"decode_tok_s", decode_tps},
                    {"n_prompt", n_prompt},
                    {"n_generated", generated.size()}};
    j["kv"] = KvTypeName(sc.kv_type);
    j["kv_v_round"] = KvRoundingName(sc.v_rounding);
    std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  } else {
    std::fwrite(tail.data(), 1, tail.size(), stdout);
    std::printf("\n");
    std::fprintf(stderr,
                 "lamina: load %.3f s | prompt %d tokens, %.1f tok/s | decode %zu tokens, %.1f tok/s\n",
                 lm.load_seconds, n_prompt, prompt_tps, generated.size(), decode_tps);
  }
  return kExitOk;
}

}  // namespace lamina::cli
