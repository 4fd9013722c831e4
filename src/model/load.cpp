// LoadModel: open the GGUF (every file of a split model), build the tokenizer, dispatch on
// general.architecture, then apply any RoPE scaling overrides.
#include "model/architectures.h"
#include "model/layers.h"
#include "model/llama.h"
#include "model/model.h"

namespace lamina {

Result<std::unique_ptr<Model>> LoadModel(const std::string& path) {
  return LoadModel(path, RopeOverrides{});
}

Result<std::unique_ptr<Model>> LoadModel(const std::string& path, const RopeOverrides& overrides) {
  Result<std::unique_ptr<gguf::File>> file = gguf::File::Open(path);
  if (!file.ok()) return file.error();
  Result<std::string> arch = (*file)->GetString("general.architecture");
  if (!arch.ok()) return Error{path + ": missing general.architecture"};
  Result<std::unique_ptr<Tokenizer>> tok = Tokenizer::FromGguf(**file);
  if (!tok.ok()) return tok.error();
  using Factory =
      Result<std::unique_ptr<Model>> (*)(std::unique_ptr<gguf::File>, std::unique_ptr<Tokenizer>);
  static const std::pair<const char*, Factory> kArchitectures[] = {
      {"llama", LoadLlama}, {"qwen2", LoadQwen2},       {"qwen2moe", LoadQwen2Moe},
      {"qwen3", LoadQwen3}, {"qwen3moe", LoadQwen3Moe}, {"qwen3next", LoadQwen3Next}};
  Factory factory = nullptr;
  std::string supported;
  for (const auto& [name, f] : kArchitectures) {
    if (*arch == name) factory = f;
    supported += (supported.empty() ? "" : ", ") + std::string(name);
  }
  if (factory == nullptr) {
    return Error{path + ": unsupported architecture \"" + *arch + "\" (supported: " + supported +
                 ")"};
  }
  Result<std::unique_ptr<Model>> model = factory(std::move(*file), std::move(*tok));
  if (!model.ok() || overrides.empty()) return model;
  Hparams& hp = (*model)->hparams_;
  hp.rope = ResolveRope(hp.rope, hp.rope_scaling, overrides);
  if (hp.rope.freq_scale <= 0.0f || !(hp.rope.freq_scale < 1e6f)) {
    return Error{path + ": invalid --rope-scale"};
  }
  return model;
}

}  // namespace lamina
