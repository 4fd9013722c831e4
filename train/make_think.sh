#!/usr/bin/env bash
# Reproduces the thinking model (seeded): the shipped model fine-tuned with a thinking mode, then
# exported with the template that opens the block when a request turns thinking on.
#   bash train/make_think.sh [OUT_GGUF]   # models/lamina-counter-think.gguf unless given a path
# Starts from models/lamina-counter.gguf read back from the GGUF (train/gguf_model.py); trains
# the `think` preset (train.py: a third of the "widealike" examples drawn in the thinking mode,
# data.py `thought`) for 1,200 steps at lr 2e-4 with bf16 matmuls; exports Q8_0 (8.4 MiB) and
# measures the bars with thinking off and on (eval_model.py). DEVICE=cuda trains on a GPU (about
# a minute on one H200; the data is still drawn on the CPU, so the examples are the same);
# the default cpu is the recipe's device but slow without AMX (tens of seconds a step on 2 cores).
# Needs Debian's python3-torch, python3-numpy and libopenblas0-pthread (or any torch >= 1.13) and
# a built lamina (build/release, or LAMINA=...) for the measurements.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-models/lamina-counter-think.gguf}
PY=${PY:-/usr/bin/python3}
LAMINA=${LAMINA:-build/release/lamina}
DEVICE=${DEVICE:-cpu}
THREADS=${THREADS:-2}
DIR=train/out/think
mkdir -p "$DIR" "$(dirname "$OUT")"

$PY train/gguf_model.py models/lamina-counter.gguf -o "$DIR/start.pt"
$PY train/train.py --preset think --seed 1234 --data-seed 861 --steps 1200 --lr 2e-4 --bf16 \
  --dim 384 --n-heads 6 --n-kv-heads 2 --ffn-dim 1024 --init "$DIR/start.pt" \
  --device "$DEVICE" --threads "$THREADS" --log-every 50 --eval-every 300 --out "$DIR/think.pt" \
  2>&1 | tee -a "$DIR/train.log"
$PY train/export_gguf.py "$DIR/think.pt" -o "$OUT" --type q8_0 --name lamina-counter-think
if [ -x "$LAMINA" ]; then
  $PY train/eval_model.py --model "$OUT" --lamina "$LAMINA" --tasks count,json,copy --seeds 11-20 || true
  $PY train/eval_model.py --model "$OUT" --lamina "$LAMINA" --reasoning on --quick || true
fi
