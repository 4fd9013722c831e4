// Every tensor type GGML defines (its id, name and block shape), whether lamina computes with it
// or not: the GGUF reader sizes and bounds-checks a tensor of any of them, and the model loader
// and `lamina inspect` name a type lamina cannot compute yet instead of calling it unknown.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace lamina::gguf {

struct GgmlTypeInfo {
  uint32_t id;
  const char* name;    // as llama.cpp prints it (llama-quantize's type names)
  int64_t block_size;  // elements per block
  size_t type_size;    // bytes per block
};

// The type with this id, or nullptr when GGML defines none (ids of removed types included).
const GgmlTypeInfo* FindGgmlType(uint32_t id);
// Its name, or "type <id>" when GGML defines none.
std::string GgmlTypeNameOf(uint32_t id);

}  // namespace lamina::gguf
