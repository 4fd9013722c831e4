// The build's version, commit and build number, from CMake's compile definitions (only this file
// sees them, so a new commit rebuilds one file).
#include "build_info.h"

#ifndef LAMINA_VERSION
#define LAMINA_VERSION "0.0.0"
#endif
#ifndef LAMINA_GIT_COMMIT
#define LAMINA_GIT_COMMIT ""
#endif
#ifndef LAMINA_BUILD_NUMBER
#define LAMINA_BUILD_NUMBER "0"
#endif

namespace lamina {

std::string VersionLine() {
  std::string v = std::string("lamina ") + LAMINA_VERSION;
  if (std::string(LAMINA_GIT_COMMIT).empty()) return v;
  return v + " (" + LAMINA_GIT_COMMIT + ")";
}

std::string BuildFingerprint() {
  const std::string commit = LAMINA_GIT_COMMIT;
  return std::string("b") + LAMINA_BUILD_NUMBER + "-" + (commit.empty() ? LAMINA_VERSION : commit);
}

}  // namespace lamina
