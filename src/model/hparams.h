// Hyper-parameters read from GGUF metadata: the llama-like `<arch>.*` keys every architecture
// shares, RoPE scaling as recorded, and the kernel's RoPE parameters with overrides applied.
#pragma once

#include <string>

#include "model/model.h"

namespace lamina {

// "<arch>.<suffix>": a GGUF metadata key of an architecture.
inline std::string ArchKey(const std::string& arch, const char* suffix) {
  return arch + "." + suffix;
}

// Reads `<arch>.*` hyper-parameters common to llama-like architectures. Missing required keys
// are an error naming the key.
Result<Hparams> ReadLlamaLikeHparams(const gguf::File& file, RopeStyle rope_style);

// Reads `<arch>.rope.scaling.*` (and the older `rope.scale_linear`) as llama.cpp does.
Result<RopeScalingConfig> ReadRopeScaling(const gguf::File& file, const std::string& arch,
                                          int n_ctx_train);

// The kernel's RoPE parameters from the model's n_rot/base/style and scaling config, with
// command-line overrides applied as llama.cpp's context parameters do.
RopeParams ResolveRope(const RopeParams& base, const RopeScalingConfig& scaling,
                       const RopeOverrides& overrides);

}  // namespace lamina
