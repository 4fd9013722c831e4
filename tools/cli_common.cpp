// Shared CLI helpers.
#include "cli_common.h"

#include <unistd.h>

#include <fstream>
#include <sstream>

#include "util/timer.h"

namespace lamina::cli {

LoadedModel LoadModelForCli(const std::string& path) {
  LoadedModel out;
  const double t0 = NowSeconds();
  Result<std::unique_ptr<Model>> model = LoadModel(path);
  out.load_seconds = NowSeconds() - t0;
  if (!model.ok()) {
    std::fprintf(stderr, "lamina: %s\n", model.error().message.c_str());
    return out;
  }
  out.model = std::move(*model);
  return out;
}

bool StderrIsTerminal() { return ::isatty(STDERR_FILENO) == 1; }

bool ReadTextFile(const std::string& path, std::string* out, std::string* error) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    *error = path + ": cannot open";
    return false;
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  *out = ss.str();
  return true;
}

void PrintKvSummary(const KvCache& cache) {
  const KvCacheConfig& c = cache.config();
  std::fprintf(stderr,
               "lamina: kv cache %s: %.2f bits/elem, %zu bytes/token, %.2f MiB for %d tokens\n",
               KvTypeName(c.type), cache.BitsPerElement(), cache.BytesPerToken(),
               cache.BytesTotal() / (1024.0 * 1024.0), c.n_ctx);
}

}  // namespace lamina::cli
