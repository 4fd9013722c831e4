#!/usr/bin/env bash
# Installs the Debian packages lamina builds with (when missing) and builds the `lamina` binary
# of the release preset. With --tests: also the test and benchmark packages, the npm test
# clients (when npm is here), and every target (tests, benchmarks, fuzz regressions).
set -euo pipefail
cd "$(dirname "$0")/.."
tests=0
[ "${1:-}" = "--tests" ] && tests=1
# libjs-marked: marked.min.js, embedded into the server's web page for Markdown (CMakeLists.txt).
packages=(build-essential cmake ninja-build pkg-config libhwy-dev libpcre2-dev nlohmann-json3-dev
          libcli11-dev libcpp-httplib-dev libboost-dev libedit-dev libjs-marked libssl-dev)
[ "$tests" -eq 1 ] && packages+=(googletest libgtest-dev libbenchmark-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}" >&2
  if [ "$(id -u)" -eq 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
fi
# The server tests' real clients (tests/node/package.json) when npm is here; they skip without.
if [ "$tests" -eq 1 ] && command -v npm >/dev/null 2>&1 && [ ! -d tests/node/node_modules ]; then
  npm ci --prefix tests/node --no-audit --no-fund --loglevel=error >/dev/null || \
    echo "setup: npm packages of tests/node could not be installed; those tests will skip" >&2
fi
preset=${LAMINA_PRESET:-release}
if [ "$tests" -eq 1 ]; then
  cmake --preset "$preset" -DLAMINA_BUILD_TESTS=ON -DLAMINA_BUILD_BENCH=ON >/dev/null
  cmake --build --preset "$preset" -j "$(nproc)"
else
  cmake --preset "$preset" -DLAMINA_BUILD_TESTS=OFF -DLAMINA_BUILD_BENCH=OFF >/dev/null
  cmake --build --preset "$preset" -j "$(nproc)" --target lamina
fi
