// LoadModel: open the GGUF, build the tokenizer, dispatch on general.architecture.
#include "model/llama.h"
#include "model/model.h"

namespace lamina {

Result<std::unique_ptr<Model>> LoadModel(const std::string& path) {
  Result<std::unique_ptr<gguf::File>> file = gguf::File::Open(path);
  if (!file.ok()) return file.error();
  Result<std::string> arch = (*file)->GetString("general.architecture");
  if (!arch.ok()) return Error{path + ": missing general.architecture"};
  Result<std::unique_ptr<Tokenizer>> tok = Tokenizer::FromGguf(**file);
  if (!tok.ok()) return tok.error();
  if (*arch == "llama") return LoadLlama(std::move(*file), std::move(*tok));
  return Error{path + ": unsupported architecture \"" + *arch + "\" (supported: llama)"};
}

}  // namespace lamina
