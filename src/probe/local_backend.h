// The probe's backend for a model loaded in this process: every generation and every logit
// stream is a fresh Session with the leg's SessionConfig (KV mode, V rounding) and, for tests,
// a planted fault as the session's write observer. Generations go through runtime/generate.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "model/model.h"
#include "probe/backend.h"
#include "probe/faults.h"
#include "runtime/session.h"
#include "spec/speculative.h"
#include "util/thread_pool.h"

namespace lamina::chat {
struct ChatSetup;
}  // namespace lamina::chat

namespace lamina::probe {

// A speculative leg: a new drafter per generation (its own draft session), always drafting;
// given the generation's target session (what an MTP drafter reads).
using DrafterFactory = std::function<std::unique_ptr<spec::Drafter>(Session& target)>;

class LocalBackend : public ProbeBackend {
 public:
  // model and pool must outlive the backend; config.write_observer is replaced by the fault's
  // observer (none for Fault::kNone). The config must suit the model (MakeKvCacheConfig).
  // drafter (optional): generations decode speculatively (spec/speculative.h) with its drafts.
  LocalBackend(const Model& model, ThreadPool& pool, const SessionConfig& config,
               Fault fault = Fault::kNone, DrafterFactory drafter = {},
               spec::SpecOptions spec_options = {});

  BackendInfo Info() const override;
  int CountTokens(const std::string& text) override;
  Generation Generate(const GenerationRequest& request) override;
  int n_vocab() const override;
  std::vector<int32_t> Tokenize(const std::string& text) override;
  std::string Detokenize(const std::vector<int32_t>& ids) override;
  std::unique_ptr<LogitStream> NewStream() override;

  // The prompt text of one user turn: the model's chat template with the assistant header (and
  // Qwen3's thinking off: the probes grade the answer itself), or the plain text and a newline
  // when the model has none. With `thinking`, the model's own template (native or Jinja)
  // rendered with enable_thinking = true; the plain rendering when the model has no template or
  // it fails.
  std::string RenderPrompt(const std::string& user, bool thinking = false) const;

 private:
  const Model& model_;
  ThreadPool& pool_;
  SessionConfig config_;
  Fault fault_;
  std::unique_ptr<WriteObserver> observer_;
  std::string chat_template_;  // tokenizer.chat_template; "" when absent
  // The template's setup for thinking prompts; nullptr when there is none or it does not parse.
  std::shared_ptr<const chat::ChatSetup> thinking_setup_;
  DrafterFactory drafter_;
  spec::SpecOptions spec_options_;
};

}  // namespace lamina::probe
