#!/usr/bin/env bash
# Builds the fuzz preset and runs every libFuzzer target of fuzz/ for SECONDS each (default 30),
# each over a scratch copy of its committed corpus; stops at the first finding (exit code != 0).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-30}
if ! command -v clang++ >/dev/null 2>&1; then
  echo "fuzz smoke: clang++ is missing (Debian: apt-get install clang)" >&2
  exit 1
fi
cmake --preset fuzz >/dev/null
cmake --build --preset fuzz
for src in fuzz/fuzz_*.cpp; do
  name=$(basename "$src" .cpp)
  echo "fuzz smoke: ${name} for ${seconds} s" >&2
  log="build/fuzz/smoke-${name}.log"
  if ! bash scripts/fuzz.sh "${name#fuzz_}" "$seconds" >"$log" 2>&1; then
    grep -E 'ERROR|SUMMARY|runtime error|^fuzz_|terminate called|what\(\)|invariant failed' "$log" | head -20 >&2 || true
    echo "fuzz smoke: ${name} found a failing input (a crash-* file here; log ${log})" >&2
    exit 1
  fi
  grep -E '^Done' "$log" >&2 || true
done
