#!/usr/bin/env bash
# Reproduces the shipped model's multi-token-prediction head (seeded): training with the trunk
# frozen, export as the companion file lamina reads beside the model, and the check against
# PyTorch through lamina.
#   bash train/make_mtp.sh [OUT_GGUF]   # models/lamina-counter-mtp.gguf unless given a path
# The trunk is models/lamina-counter.gguf, read from its GGUF (train/gguf_model.py) and frozen;
# the head (train/mtp.py: eh_proj over [enorm(embed(x_p)) | hnorm(h_{p-1})], one llama decoder
# block, its own head norm, the trunk's tied output head; 1,869,696 parameters) learns
# KL(trunk at p || head at p) over the answer tokens of the data.py task mix (models/README.md,
# "lamina-counter-mtp.gguf"). Needs Debian's python3-torch, python3-numpy and
# libopenblas0-pthread and a built lamina (build/release, or LAMINA=...). CPU only, f32.
# The run writes train/out/mtp/mtp.pt and resumes from it when it exists (delete it to start
# over); a finished run is skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-models/lamina-counter-mtp.gguf}
PY=/usr/bin/python3
LAMINA=${LAMINA:-build/release/lamina}
THREADS=${THREADS:-2}
DIR=train/out/mtp
TRUNK=models/lamina-counter.gguf
mkdir -p "$DIR" "$(dirname "$OUT")"

# 1. A 150-step schedule of ~1,600 tokens a step of the data.py mix (5 % random repeats; rows
#    of 320 and 640 tokens, answers up to 560 tokens), lr 2e-3 after 8 warm-up steps by cosine
#    to 2e-4, data seed 960, head seed 4321 (its block starts as a copy of the trunk's last
#    layer); the run ends at step 88 (lr 1.0e-3), where the recorded run was stopped at its
#    ~40-minute budget on a shared 2-core machine.
if [ ! -f "$DIR/mtp.done" ]; then
  nice -n 10 $PY train/mtp.py train --trunk "$TRUNK" --out "$DIR/mtp.pt" --steps 150 --lr 2e-3 \
    --warmup 8 --bucket-tokens 1600 --eval-every 50 --log-every 5 --threads "$THREADS" \
    --seed 4321 --data-seed 960 --stop-at 88 2>&1 | tee -a "$DIR/train.log"
  touch "$DIR/mtp.done"
fi

# 2. Export (f16 matrices, f32 norms) and compare lamina's head logits (`lamina score --mtp`)
#    with the PyTorch head's.
$PY train/mtp.py export "$DIR/mtp.pt" -o "$OUT" --trunk "$TRUNK"
if [ -x "$LAMINA" ]; then
  $PY train/mtp.py check "$DIR/mtp.pt" "$OUT" --trunk "$TRUNK" --lamina "$LAMINA"
fi
