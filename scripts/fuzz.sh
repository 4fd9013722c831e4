#!/usr/bin/env bash
# Builds the fuzz preset (when needed) and runs one libFuzzer target for SECONDS over a scratch
# copy of its committed corpus (fuzz/corpus/TARGET): scripts/fuzz.sh gguf 3600
set -euo pipefail
cd "$(dirname "$0")/.."
target=${1:?usage: scripts/fuzz.sh TARGET SECONDS}
seconds=${2:?usage: scripts/fuzz.sh TARGET SECONDS}
[ -d build/fuzz ] || cmake --preset fuzz >/dev/null
cmake --build --preset fuzz --target "fuzz_${target}"
work="build/fuzz/corpus-${target}"
mkdir -p "$work"
# New inputs land in $work; crashes as crash-* files in the current folder (commit each one to
# fuzz/corpus/TARGET/ with its fix).
exec "build/fuzz/fuzz/fuzz_${target}" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 \
  -print_final_stats=1 "$work" "fuzz/corpus/${target}"
