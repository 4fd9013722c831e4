#!/usr/bin/env bash
# Reproduces the draft model for speculative decoding from scratch (seeded): distillation of the
# shipped model, export, checks.
#   bash train/make_draft.sh [OUT_GGUF]   # models/lamina-counter-draft.gguf unless given a path
# The teacher is the shipped models/lamina-counter.gguf, read from the GGUF (train/gguf_model.py);
# the student (2 layers, width 128, 2 query heads and 1 KV head of head_dim 64, FFN 384; 0.52 M
# parameters, 1.0 MiB as f16) is trained from random weights on KL(teacher || student) over the
# answer tokens of the data.py task mix (train/distill.py; models/README.md,
# "lamina-counter-draft.gguf"). Needs Debian's python3-torch, python3-numpy and
# libopenblas0-pthread and a built lamina (build/release, or LAMINA=...).
# The run writes train/out/draft/draft.pt and resumes from it when it exists (delete it to start
# over); a finished run is skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-models/lamina-counter-draft.gguf}
PY=/usr/bin/python3
LAMINA=${LAMINA:-build/release/lamina}
THREADS=${THREADS:-2}
DIR=train/out/draft
mkdir -p "$DIR" "$(dirname "$OUT")"
LOG=$DIR/distill.log
TEACHER=models/lamina-counter.gguf

# 1. The teacher's weights as a checkpoint, and lamina's logits on it against PyTorch's: the
#    GGUF reader maps every tensor back (check_export.py on the shipped file).
$PY train/gguf_model.py "$TEACHER" -o "$DIR/teacher.pt"
if [ -x "$LAMINA" ]; then
  $PY train/check_export.py "$DIR/teacher.pt" "$TEACHER" --lamina "$LAMINA"
fi

# 2. 1,100 steps of ~2,400 tokens of the data.py mix (10 % random repeats), lr 2e-3 by cosine to
#    2e-4 after 30 warm-up steps, data seed 950, weights seed 1234: steps 0-699 on the data's
#    answers (cross-entropy, no teacher), steps 700-1,099 on KL(teacher || student); the run
#    ends at step 878 of that schedule (lr 3.8e-4), where the recorded run was stopped to fit
#    the time budget on a shared machine.
if [ ! -f "$DIR/draft.done" ]; then
  nice -n 15 $PY train/distill.py --teacher "$TEACHER" --out "$DIR/draft.pt" --steps 1100 \
    --label-steps 700 --bucket-tokens 2400 --lr 2e-3 --threads "$THREADS" --seed 1234 \
    --stop-at 878 --data-seed 950 --eval-every 100 2>&1 | tee -a "$LOG"
  touch "$DIR/draft.done"
fi

# 3. Export (f16, the teacher's tokenizer and template), check against lamina, and measure the
#    greedy agreement with the teacher per task on held-out prompts.
$PY train/export_gguf.py "$DIR/draft.pt" -o "$OUT" --type f16 --name lamina-counter-draft
if [ -x "$LAMINA" ]; then
  $PY train/check_export.py "$DIR/draft.pt" "$OUT" --lamina "$LAMINA"
  $PY train/draft_agreement.py --draft "$OUT" --target "$TEACHER" --lamina "$LAMINA" \
    --threads "$THREADS" --json "$DIR/agreement.json"
fi
