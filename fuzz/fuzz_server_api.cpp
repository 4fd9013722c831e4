// Fuzz target: the server's request JSON → typed request mapping (tools/server/api.cpp) and
// the chat-prompt rendering behind it, on the shipped model. Input: byte 0 picks the route
// (bits 0-1: /completion, /v1/completions, /v1/chat/completions) and the chat format (bits 2-3:
// the model's template, ChatML, Qwen3, Llama-3); the rest is the body. Every body must end in
// typed requests within their ranges or a 400 with a message, never an exception.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "chat/chat_template.h"
#include "model/model.h"
#include "server/api.h"

namespace {

namespace api = lamina::cli::api;

struct State {
  std::unique_ptr<lamina::Model> model;
  lamina::chat::ChatSetup chat[4];  // the model's template, ChatML, Qwen3, Llama-3
  api::Defaults defaults;
};

State* LoadState() {
  auto* s = new State();
  const std::string path = std::string(LAMINA_SOURCE_DIR) + "/models/lamina-counter.gguf";
  auto model = lamina::LoadModel(path);
  if (!model.ok()) {
    std::fprintf(stderr, "fuzz_server_api: %s: %s\n", path.c_str(), model.error().message.c_str());
    std::abort();
  }
  s->model = std::move(model).value();
  auto tmpl = s->model->file().GetString("tokenizer.chat_template");
  s->chat[0] = lamina::chat::ChatSetupFromTemplate(tmpl.ok() ? *tmpl : "");
  if (s->chat[0].format == lamina::chat::ChatFormat::kUnknown) {
    s->chat[0].format = lamina::chat::ChatFormat::kChatML;
  }
  s->chat[1].format = lamina::chat::ChatFormat::kChatML;
  s->chat[2].format = lamina::chat::ChatFormat::kQwen3;
  s->chat[3].format = lamina::chat::ChatFormat::kLlama3;
  s->defaults.params.n_predict = 16;
  return s;
}

State& GetState() {
  static State* state = LoadState();  // loaded once per process
  return *state;
}

void Check(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "fuzz_server_api: %s\n", what);
  std::abort();
}

}  // namespace

// Loads the model before fuzzing starts, so that loading does not count against an
// input's time limit (the regression runner loads on first use instead).
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  (void)GetState();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  State& st = GetState();
  if (size < 1) return 0;
  const int route = data[0] & 3;
  const lamina::chat::ChatSetup& chat = st.chat[(data[0] >> 2) & 3];
  const api::json body = api::json::parse(data + 1, data + size, nullptr, false);
  if (body.is_discarded() || !body.is_object()) return 0;  // the server answers 400 before
  api::Completion c;
  api::ApiError err;
  const bool ok = route == 2
                      ? api::ParseChat(body, *st.model, chat, st.defaults, &c, &err)
                      : api::ParseCompletion(body, *st.model, st.defaults, route == 1, &c, &err);
  if (!ok) {
    Check(err.status == 400 && !err.message.empty(), "a refusal without a status or reason");
    (void)api::ErrorBody(err).dump();
    return 0;
  }
  Check(!c.requests.empty(), "no request from an accepted body");
  Check(c.n_choices >= 1 && c.n_choices <= api::kMaxChoices, "n / n_cmpl out of [1, 16]");
  Check(c.requests.size() % c.n_choices == 0 && c.requests.size() <= 64,
        "not n choices per prompt, or over 64 completions");
  Check(!c.parse_tool_calls || !c.tool_names.empty(), "tool calls looked for without tools");
  const int n_vocab = st.model->hparams().n_vocab;
  for (const lamina::serve::Request& r : c.requests) {
    for (int32_t id : r.prompt)
      Check(id >= 0 && id < n_vocab, "a prompt id outside the vocabulary");
    const lamina::SamplerConfig& s = r.params.sampler;
    Check(s.top_p >= 0.0f && s.top_p <= 1.0f, "top_p out of [0, 1]");
    Check(s.min_p >= 0.0f && s.min_p <= 1.0f, "min_p out of [0, 1]");
    Check(s.repeat_penalty > 0.0f, "repeat_penalty not > 0");
    Check(s.temperature >= 0.0f, "a negative temperature");
    Check(r.n_probs >= 0 && r.n_probs <= 20, "n_probs out of [0, 20]");
    Check(r.draft_max >= -1 && r.draft_max <= 64, "speculative.n_max out of range");
    Check(r.draft_min >= -1 && r.draft_min <= 64, "speculative.n_min out of range");
    Check(r.draft_p_min == -1.0f || (r.draft_p_min >= 0.0f && r.draft_p_min <= 1.0f),
          "speculative.p_min out of [0, 1]");
  }
  return 0;
}
