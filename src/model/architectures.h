// Factories of the architectures other than llama (one file each: qwen2.cpp, qwen2moe.cpp,
// qwen3.cpp, qwen3moe.cpp, qwen3next.cpp); LoadModel dispatches on general.architecture.
#pragma once

#include "model/model.h"

namespace lamina {
Result<std::unique_ptr<Model>> LoadQwen2(std::unique_ptr<gguf::File> file,
                                         std::unique_ptr<Tokenizer> tokenizer);
Result<std::unique_ptr<Model>> LoadQwen2Moe(std::unique_ptr<gguf::File> file,
                                            std::unique_ptr<Tokenizer> tokenizer);
Result<std::unique_ptr<Model>> LoadQwen3(std::unique_ptr<gguf::File> file,
                                         std::unique_ptr<Tokenizer> tokenizer);
Result<std::unique_ptr<Model>> LoadQwen3Moe(std::unique_ptr<gguf::File> file,
                                            std::unique_ptr<Tokenizer> tokenizer);
Result<std::unique_ptr<Model>> LoadQwen3Next(std::unique_ptr<gguf::File> file,
                                             std::unique_ptr<Tokenizer> tokenizer);
}  // namespace lamina
