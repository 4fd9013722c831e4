// Generate and GenerateSpeculative as clients of a one-slot engine (see generate.h).
#include "engine/generate.h"

#include <algorithm>
#include <memory>

#include "engine/engine.h"

namespace lamina::engine {
namespace {

// Collects one request's events into a GenerateResult, passing text on to the caller.
class ResultSink : public EventSink {
 public:
  ResultSink(GenerateResult* result, const std::function<bool(const std::string&)>& on_text,
             const std::function<void(int, int)>& on_prompt_progress)
      : result_(result), on_text_(on_text), on_progress_(on_prompt_progress) {}

  void Push(Event e) override {
    switch (e.kind) {
      case Event::Kind::kText:
        result_->tokens.insert(result_->tokens.end(), e.tokens.begin(), e.tokens.end());
        result_->text += e.text;
        // After the caller cancelled, the text still held back joins the result only.
        if (!e.text.empty() && on_text_ && !cancelled_ && !on_text_(e.text)) cancelled_ = true;
        break;
      case Event::Kind::kProgress:  // after each prompt chunk (not the start)
        if (on_progress_ && e.progress.processed > e.progress.cache) {
          on_progress_(e.progress.processed, e.progress.total);
        }
        break;
      case Event::Kind::kDone:
        result_->n_cached = e.timings.cache_n;
        result_->reason = e.reason;
        result_->stop_word = e.stop_word;
        result_->prompt_seconds = e.timings.prompt_ms / 1e3;
        result_->decode_seconds = e.timings.predicted_ms / 1e3;
        spec_ = e.spec;
        done_ = true;
        break;
      case Event::Kind::kError:
        error_ = e.message;
        done_ = true;
        break;
    }
  }
  bool cancelled() const override { return cancelled_; }
  bool done() const { return done_; }
  const std::string& error() const { return error_; }
  const spec::SpecStats& spec() const { return spec_; }

 private:
  GenerateResult* result_;
  const std::function<bool(const std::string&)>& on_text_;
  const std::function<void(int, int)>& on_progress_;
  bool cancelled_ = false;
  bool done_ = false;
  std::string error_;
  spec::SpecStats spec_;
};

Result<GenerateResult> RunOne(Session& session, int seq, const std::vector<int32_t>& prompt,
                              const GenerateOptions& options, spec::Drafter* drafter,
                              const spec::SpecOptions* spec, spec::SpecStats* stats,
                              const std::function<bool(const std::string&)>& on_text,
                              const std::function<void(int, int)>& on_prompt_progress) {
  if (prompt.empty()) return Error{"empty prompt"};
  const int n_prompt = static_cast<int>(prompt.size());
  if (n_prompt > session.n_ctx()) {
    return Error{"the prompt (" + std::to_string(n_prompt) + " tokens) exceeds the context of " +
                 std::to_string(session.n_ctx())};
  }
  EngineConfig config;
  config.n_slots = 1;
  config.first_seq = seq;
  config.context_edge = ContextEdge::kAllCells;
  config.prompt_chunk = options.prompt_chunk;
  config.n_batch = options.prompt_chunk > 0 ? options.prompt_chunk : n_prompt;
  if (drafter != nullptr) {
    LAMINA_CHECK(spec->draft_max >= 1);
    config.spec.options = *spec;
    config.n_batch = std::max(config.n_batch, spec->draft_max + 1);
  }
  Engine engine(session, config, nullptr);
  if (drafter != nullptr) engine.LendDrafter(0, drafter);

  GenerateResult result;
  result.n_prompt = n_prompt;
  auto sink = std::make_shared<ResultSink>(&result, on_text, on_prompt_progress);
  Request request;
  request.prompt = prompt;
  request.params = options.params;
  request.cache_prompt = options.reuse_prefix;
  request.return_progress = static_cast<bool>(on_prompt_progress);
  const Engine::Admission a = engine.TryStart(1, request, sink);
  LAMINA_CHECK(a == Engine::Admission::kStarted || a == Engine::Admission::kRejected);
  while (!sink->done()) LAMINA_CHECK(engine.Step());
  if (!sink->error().empty()) return Error{sink->error()};
  if (stats != nullptr) stats->Add(sink->spec());
  return result;
}

}  // namespace

Result<GenerateResult> Generate(Session& session, int seq, const std::vector<int32_t>& prompt,
                                const GenerateOptions& options,
                                const std::function<bool(const std::string&)>& on_text,
                                const std::function<void(int, int)>& on_prompt_progress) {
  return RunOne(session, seq, prompt, options, nullptr, nullptr, nullptr, on_text,
                on_prompt_progress);
}

Result<GenerateResult> GenerateSpeculative(
    Session& session, int seq, const std::vector<int32_t>& prompt, const GenerateOptions& options,
    spec::Drafter& drafter, const spec::SpecOptions& spec, spec::SpecStats* stats,
    const std::function<bool(const std::string&)>& on_text,
    const std::function<void(int, int)>& on_prompt_progress) {
  return RunOne(session, seq, prompt, options, &drafter, &spec, stats, on_text, on_prompt_progress);
}

}  // namespace lamina::engine
