// Runs a shell command (the real lamina binary, Chromium, ...) and collects its exit code and
// standard output, for the tests that drive real processes.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace lamina::testing_util {

struct ProcessOutput {
  int code = -1;    // exit status, -1 when the process did not exit normally
  std::string out;  // everything written to stdout
};

inline ProcessOutput RunShell(const std::string& cmd) {
  ProcessOutput o;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return o;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) o.out.append(buf, n);
  const int status = pclose(p);
  o.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return o;
}

}  // namespace lamina::testing_util
