#!/usr/bin/env bash
# Reproduces the shipped model from scratch (seeded): tokenizer, training, export, checks.
#   bash train/make_model.sh [OUT_GGUF] [extra train.py flags...]
# Needs Debian's python3-torch, python3-numpy and libopenblas0-pthread (scripts: apt-get install
# -y python3-torch python3-numpy libopenblas0-pthread) and a built lamina (build/release).
# Resumes from train/out/ckpt.pt and train/out/tune.pt when they exist; delete them to start over.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-models/lamina-counter.gguf}
shift || true
PY=/usr/bin/python3
LAMINA=${LAMINA:-build/release/lamina}
mkdir -p train/out "$(dirname "$OUT")"
# 1. Induction heads first: random repeats alone, one per row, lr 2e-3 (seed 0 forms them after
#    ~550 steps; ~5 minutes on one core). Skipped when its weights exist.
if [ ! -f train/out/induction.pt ]; then
  nice -n 10 $PY train/induction_check.py --lr 2e-3 --wd 0.1 --seed 0 --steps 1000 \
    --save train/out/induction.pt 2>&1 | tee -a train/out/train.log
fi
# 2. The task mix from those weights (resumes from train/out/ckpt.pt when it exists).
nice -n 10 $PY train/train.py --preset full --seed 1234 --out train/out/ckpt.pt \
  --init train/out/induction.pt "$@" 2>&1 | tee -a train/out/train.log
# 3. The bars' tasks weighted up, from stage 2's weights, on a data stream of its own (resumes
#    from train/out/tune.pt when it exists).
nice -n 10 $PY train/train.py --preset tune --seed 1234 --data-seed 777 --out train/out/tune.pt \
  --init train/out/ckpt.pt 2>&1 | tee -a train/out/train.log
$PY train/export_gguf.py train/out/tune.pt -o "$OUT" --type f16
if [ -x "$LAMINA" ]; then
  $PY train/check_export.py train/out/tune.pt "$OUT" --lamina "$LAMINA"
  $PY train/eval_model.py --model "$OUT" --lamina "$LAMINA" --json train/out/eval.json || true
fi
