#!/usr/bin/env bash
# The layer rule (docs/ARCHITECTURE.md): each src/ folder includes only itself and the folders
# below it in  util → quant → kernels → gguf → tokenizer → chat → model → runtime → spec → engine → probe → serve.
# Fails listing every include that points upward.
set -euo pipefail
cd "$(dirname "$0")/../src"
declare -A allowed=(
  [util]="util"
  [quant]="util quant"
  [kernels]="util quant kernels"
  [gguf]="util quant gguf"
  [tokenizer]="util quant gguf tokenizer"
  [chat]="util quant gguf tokenizer chat"
  [model]="util quant kernels gguf tokenizer chat model"
  [runtime]="util quant kernels gguf tokenizer chat model runtime"
  [spec]="util quant kernels gguf tokenizer chat model runtime spec"
  [engine]="util quant kernels gguf tokenizer chat model runtime spec engine"
  [probe]="util quant kernels gguf tokenizer chat model runtime spec engine probe"
  [serve]="util quant kernels gguf tokenizer chat model runtime spec engine probe serve"
)
bad=0
for dir in */; do
  dir=${dir%/}
  if [ -z "${allowed[$dir]+x}" ]; then
    echo "layering: src/$dir is not in the layer map (add it here and to docs/ARCHITECTURE.md)"
    bad=1
    continue
  fi
  while IFS= read -r hit; do
    file=${hit%%:*}
    target=$(sed -E 's/.*#include "([a-z_]+)\/.*/\1/' <<<"$hit")
    if [[ " ${allowed[$dir]} " != *" $target "* ]]; then
      echo "layering: src/$file includes $target/ (src/$dir may include only: ${allowed[$dir]})"
      bad=1
    fi
  done < <(grep -HE '^#include "[a-z_]+/' "$dir"/* || true)
  # HTTP, JSON and HTML stay at the edge (tools/).
  if grep -lE '^#include <(httplib\.h|nlohmann/)' "$dir"/* >/dev/null 2>&1; then
    echo "layering: src/$dir includes an HTTP or JSON library: $(grep -lE '^#include <(httplib\.h|nlohmann/)' "$dir"/* | tr '\n' ' ')"
    bad=1
  fi
done
[ "$bad" -eq 0 ] && echo "layering: every include points down the layer map"
exit "$bad"
