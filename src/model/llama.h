// Factory for the llama architecture (see llama.cpp).
#pragma once

#include "model/model.h"

namespace lamina {
Result<std::unique_ptr<Model>> LoadLlama(std::unique_ptr<gguf::File> file,
                                         std::unique_ptr<Tokenizer> tokenizer);
}  // namespace lamina
