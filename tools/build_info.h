// What this build is: the version, the git commit and the build number known at configure time.
#pragma once

#include <string>

namespace lamina {

// "lamina 0.1.0 (abc123def456)": `lamina --version`.
std::string VersionLine();
// "b<commits>-<commit>" as llama-server's build_info and system_fingerprint ("b0-0.1.0" when git
// was not there at configure time).
std::string BuildFingerprint();

}  // namespace lamina
