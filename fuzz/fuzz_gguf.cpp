// Fuzz target: the GGUF reader and model loading (metadata, tensor table, hyperparameters,
// tokenizer from metadata) over arbitrary bytes. Every input must end in a value or an Error.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "gguf/gguf.h"
#include "model/model.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // The reader maps a path; an anonymous in-memory file gives it one without touching disk.
  const int fd = memfd_create("fuzz_gguf", 0);
  if (fd < 0) return 0;
  size_t done = 0;
  while (done < size) {
    const ssize_t n = write(fd, data + done, size - done);
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  auto file = lamina::gguf::File::OpenSingle(path);
  if (file.ok()) {
    auto model = lamina::LoadModel(path);
    (void)model;
  }
  close(fd);
  return 0;
}
