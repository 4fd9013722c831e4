// Per-process temporary paths for tests, removed at scope exit: ctest runs cases in parallel
// processes and two checkouts may run the same case at once, so no test writes a fixed name in
// the shared temp dir.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <utility>

namespace lamina::testing_util {

// <gtest's temp dir>/p<pid>_<name>: in process 12345, "lamina_kill" becomes
// "<temp dir>/p12345_lamina_kill".
inline std::string UniqueTempPath(const std::string& name) {
  return (std::filesystem::path(::testing::TempDir()) /
          ("p" + std::to_string(::getpid()) + "_" + name))
      .string();
}

// Removes a path (a file, or a directory and what it holds) when it goes out of scope, whether
// the test passed or returned early.
class RemoveAtExit {
 public:
  explicit RemoveAtExit(std::string path) : path_(std::move(path)) {}
  ~RemoveAtExit() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  RemoveAtExit(const RemoveAtExit&) = delete;
  RemoveAtExit& operator=(const RemoveAtExit&) = delete;

 private:
  std::string path_;
};

}  // namespace lamina::testing_util
