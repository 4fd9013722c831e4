// LoadModel: open the GGUF (every file of a split model), build the tokenizer, dispatch on
// general.architecture through the architecture table (architectures.h), then apply any RoPE
// scaling overrides. LoadMtpHead adds a companion file's multi-token-prediction head.
#include "model/architectures.h"
#include "model/hparams.h"
#include "model/model.h"

namespace lamina {

Result<std::unique_ptr<Model>> LoadModel(const std::string& path) {
  return LoadModel(path, RopeOverrides{});
}

namespace {

// The model of the file's architecture, weights repacked or not.
Result<std::unique_ptr<Model>> LoadArchitecture(const std::string& path, bool repack) {
  Result<std::unique_ptr<gguf::File>> file = gguf::File::Open(path);
  if (!file.ok()) return file.error();
  Result<std::string> arch = (*file)->GetString("general.architecture");
  if (!arch.ok()) return Error{path + ": missing general.architecture"};
  Result<std::unique_ptr<Tokenizer>> tok = Tokenizer::FromGguf(**file);
  if (!tok.ok()) return tok.error();
  const Architecture* found = nullptr;
  std::string supported;
  for (const Architecture& a : kArchitectures) {
    if (*arch == a.name) found = &a;
    supported += (supported.empty() ? "" : ", ") + std::string(a.name);
  }
  if (found == nullptr) {
    return Error{path + ": unsupported architecture \"" + *arch + "\" (supported: " + supported +
                 ")"};
  }
  if (found->factory != nullptr) return found->factory(std::move(*file), std::move(*tok), repack);
  return LoadDecoder(std::move(*file), std::move(*tok), found->options, repack);
}

}  // namespace

Status CheckModelFile(const std::string& path) {
  Result<std::unique_ptr<Model>> model = LoadArchitecture(path, /*repack=*/false);
  if (!model.ok()) return model.error();
  return Status::Ok();
}

Result<std::unique_ptr<Model>> LoadModel(const std::string& path, const RopeOverrides& overrides) {
  Result<std::unique_ptr<Model>> model = LoadArchitecture(path, /*repack=*/true);
  if (!model.ok() || overrides.empty()) return model;
  Hparams& hp = (*model)->hparams_;
  hp.rope = ResolveRope(hp.rope, hp.rope_scaling, overrides);
  if (hp.rope_short_ctx > 0) {  // phi3: the long factors with the same overrides
    const float* long_factors = hp.rope_long.freq_factors;
    hp.rope_long = hp.rope;
    hp.rope_long.freq_factors = long_factors;
  }
  // Sliding-window layers keep their own base and never scale (llama.cpp), or (gpt-oss) take the
  // overridden RoPE but keep the file's base and frequency scale (llama.cpp's *_train_swa).
  if (hp.swa_global_rope) {
    const RopeParams swa = hp.rope_swa;
    hp.rope_swa = hp.rope;
    hp.rope_swa.freq_base = swa.freq_base;
    hp.rope_swa.freq_scale = swa.freq_scale;
  } else {
    hp.rope_swa = SlidingWindowRope(hp.rope, hp.rope_swa.freq_base);
  }
  if (hp.rope.freq_scale <= 0.0f || !(hp.rope.freq_scale < 1e6f)) {
    return Error{path + ": invalid --rope-scale"};
  }
  return model;
}

Status LoadMtpHead(Model& model, const std::string& path) {
  Result<std::unique_ptr<gguf::File>> file = gguf::File::Open(path);
  if (!file.ok()) return file.error();
  return model.AttachMtp(std::move(*file));
}

}  // namespace lamina
