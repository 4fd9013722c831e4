// Read-only memory-mapped file. Errors name the path and the failing system call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "util/status.h"

namespace lamina {

class MappedFile {
 public:
  static Result<std::unique_ptr<MappedFile>> Open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile() = default;
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// Hands the whole pages inside [p, p + n) of a read-only private file mapping back to the
// kernel (madvise MADV_DONTNEED): for data copied elsewhere that the process will not read
// again. A later read still sees the file's bytes (the pages fault in again).
void ReleaseMappedPages(const void* p, size_t n);

}  // namespace lamina
