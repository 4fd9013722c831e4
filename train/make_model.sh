#!/usr/bin/env bash
# Reproduces the shipped model from scratch (seeded): tokenizer, training, export, checks.
#   bash train/make_model.sh [OUT_GGUF] [extra train.py flags...]
# Needs Debian's python3-torch, python3-numpy and libopenblas0-pthread (scripts: apt-get install
# -y python3-torch python3-numpy libopenblas0-pthread) and a built lamina (build/release).
# Resumes from train/out/ckpt.pt when it exists; delete it to start over.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-models/lamina-counter.gguf}
shift || true
PY=/usr/bin/python3
LAMINA=${LAMINA:-build/release/lamina}
mkdir -p train/out "$(dirname "$OUT")"
nice -n 10 $PY train/train.py --preset full --seed 1234 --out train/out/ckpt.pt "$@" 2>&1 | tee -a train/out/train.log
$PY train/export_gguf.py train/out/ckpt.pt -o "$OUT" --type f16
if [ -x "$LAMINA" ]; then
  $PY train/check_export.py train/out/ckpt.pt "$OUT" --lamina "$LAMINA"
fi
