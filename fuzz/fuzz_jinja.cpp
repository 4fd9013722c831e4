// Fuzz target: the Jinja engine (parse, then render a three-turn conversation) over arbitrary
// template text, under small limits. Every input must end in a string or an Error.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "chat/jinja.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using lamina::chat::jinja::Value;
  lamina::chat::jinja::Limits limits;
  limits.max_template_bytes = 64 << 10;
  limits.max_loop_iterations = 2000;
  limits.max_output_bytes = 1 << 16;
  limits.max_work = 200000;
  auto t = lamina::chat::jinja::Template::Parse(
      std::string_view(reinterpret_cast<const char*>(data), size), limits);
  if (!t.ok()) return 0;
  auto msg = [](const char* role, const char* content) {
    return Value::MakeObject({{"role", role}, {"content", content}});
  };
  const Value ctx = Value::MakeObject(
      {{"messages", Value::MakeArray({msg("system", "Be brief."), msg("user", "Hi <think>"),
                                      msg("assistant", "<think>r</think>ok"), msg("user", "Bye")})},
       {"bos_token", "<s>"},
       {"eos_token", "</s>"},
       {"add_generation_prompt", true},
       {"enable_thinking", false},
       {"tools", Value::None()}});
  lamina::chat::jinja::RenderOptions ro;
  ro.now_unix = 1721952000;
  (void)t->Render(ctx, ro);
  return 0;
}
