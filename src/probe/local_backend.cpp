// LocalBackend: fresh Sessions of one loaded model (local_backend.h).
#include "probe/local_backend.h"

#include <algorithm>

#include "chat/chat_template.h"
#include "engine/generate.h"
#include "runtime/generate.h"
#include "runtime/grammar.h"

namespace lamina::probe {

namespace {

class SessionStream : public LogitStream {
 public:
  SessionStream(const Model& model, const SessionConfig& config, ThreadPool& pool)
      : session_(model, config, pool) {}
  Result<const float*> Eval(const int32_t* tokens, int n, bool all_logits) override {
    return session_.Eval(tokens, n, all_logits);
  }
  const KvCache* cache() const override { return &session_.cache(); }

 private:
  Session session_;
};

}  // namespace

LocalBackend::LocalBackend(const Model& model, ThreadPool& pool, const SessionConfig& config,
                           Fault fault, DrafterFactory drafter, spec::SpecOptions spec_options)
    : model_(model),
      pool_(pool),
      config_(config),
      fault_(fault),
      observer_(MakeFaultObserver(fault)),
      drafter_(std::move(drafter)),
      spec_options_(spec_options) {
  spec_options_.adaptive = false;  // the probe exercises the verify path on every step
  config_.write_observer = observer_.get();
  Result<std::string> tmpl = model.file().GetString("tokenizer.chat_template");
  if (tmpl.ok()) chat_template_ = *tmpl;
  if (!chat_template_.empty()) {
    Result<chat::ChatSetup> setup =
        chat::ChatSetupForModel(chat_template_, model.tokenizer(), /*force_jinja=*/false);
    if (setup.ok()) thinking_setup_ = std::make_shared<const chat::ChatSetup>(std::move(*setup));
  }
}

BackendInfo LocalBackend::Info() const {
  BackendInfo info;
  info.kv = KvTypeName(config_.kv_type);
  info.v_round = KvRoundingName(config_.v_rounding);
  info.fault = FaultName(fault_);
  Result<KvCacheConfig> kc = MakeKvCacheConfig(model_.hparams(), config_);
  if (kc.ok()) {
    const KvCache cache(*kc);
    info.bits_per_element = cache.BitsPerElement();
    info.bytes_per_token = cache.BytesPerToken();
    info.kv_window = cache.window();
  }
  info.logits = true;
  info.exact_token_counts = true;
  return info;
}

int LocalBackend::CountTokens(const std::string& text) {
  return static_cast<int>(model_.tokenizer().Encode(text, false, false).size());
}

std::string LocalBackend::RenderPrompt(const std::string& user, bool thinking) const {
  if (thinking && thinking_setup_) {
    chat::ChatRenderOptions options;
    options.enable_thinking = true;
    Result<std::string> prompt =
        chat::RenderChatPrompt(*thinking_setup_, {{"user", user}}, model_.tokenizer(), {}, options);
    if (prompt.ok()) return *prompt;
  }
  const chat::ChatFormat format = chat::DetectChatFormat(chat_template_);
  if (format != chat::ChatFormat::kUnknown) {
    return chat::RenderChat(format, {{"user", user}}, /*add_generation_prompt=*/true,
                            /*enable_thinking=*/false);
  }
  if (chat_template_.find("<|im_start|>") != std::string::npos) {
    return "<|im_start|>user\n" + user + "<|im_end|>\n<|im_start|>assistant\n";
  }
  return user + "\n";
}

Generation LocalBackend::Generate(const GenerationRequest& request) {
  Generation g;
  const Tokenizer& tok = model_.tokenizer();
  const std::string prompt = RenderPrompt(request.user, request.thinking);
  // Llama-3 renders its own <|begin_of_text|>; every other prompt gets the vocabulary's BOS.
  const bool has_bos_text = prompt.rfind("<|begin_of_text|>", 0) == 0;
  std::vector<int32_t> ids =
      tok.Encode(prompt, /*add_special=*/!has_bos_text, /*parse_special=*/true);
  if (ids.empty()) ids.push_back(tok.bos() >= 0 ? tok.bos() : 0);
  const int max_tokens = std::min(request.max_tokens, config_.n_ctx - static_cast<int>(ids.size()));
  if (max_tokens <= 0) {
    g.error = true;
    g.error_message = "prompt of " + std::to_string(ids.size()) +
                      " tokens leaves no room in --ctx " + std::to_string(config_.n_ctx);
    return g;
  }
  Session session(model_, config_, pool_);
  GenerateOptions options;
  options.params.sampler.temperature = 0.0f;  // greedy
  options.params.n_predict = max_tokens;
  options.reuse_prefix = false;
  if (!request.grammar.empty()) {
    Result<std::shared_ptr<const Grammar>> grammar = Grammar::Parse(request.grammar);
    if (!grammar.ok()) {
      g.error = true;
      g.error_message = grammar.error().message;
      return g;
    }
    options.params.grammar = std::move(*grammar);
  }
  std::string text;
  auto on_text = [&](const std::string& piece) {
    text += piece;
    return !(request.stop && request.stop(text));
  };
  std::unique_ptr<spec::Drafter> drafter = drafter_ ? drafter_(session) : nullptr;
  Result<GenerateResult> r = drafter
                                 ? engine::GenerateSpeculative(session, 0, ids, options, *drafter,
                                                               spec_options_, nullptr, on_text)
                                 : engine::Generate(session, 0, ids, options, on_text);
  if (!r.ok()) {
    g.error = true;
    g.error_message = r.error().message;
    return g;
  }
  g.n_tokens = static_cast<int>(r->tokens.size());
  g.text = r->text;
  g.ended_turn = r->reason == StopReason::kEos;
  return g;
}

int LocalBackend::n_vocab() const { return model_.hparams().n_vocab; }

std::vector<int32_t> LocalBackend::Tokenize(const std::string& text) {
  return model_.tokenizer().Encode(text, /*add_special=*/true, /*parse_special=*/false);
}

std::string LocalBackend::Detokenize(const std::vector<int32_t>& ids) {
  return model_.tokenizer().Decode(ids);
}

std::unique_ptr<LogitStream> LocalBackend::NewStream() {
  return std::make_unique<SessionStream>(model_, config_, pool_);
}

}  // namespace lamina::probe
