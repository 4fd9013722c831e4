"""Train the lamina task model (see train/README.md).

    /usr/bin/python3 train/train.py --out train/out/ckpt.pt [--steps N] [--preset full|small]

Resumes from --out when it exists (model, optimizer, step, config, tokenizer are all in the
checkpoint; the data of step s is generated from seed (seed, s), so a resumed run sees the same
batches as an uninterrupted one). Checkpoints are written atomically every --ckpt-minutes and at
the end. Each log line: step, loss, lr, tokens/s, and the split of the step time into data,
forward, backward and optimizer; --profile prints the operator table of two steps (where the
attention matmuls and the elementwise passes over the T x T scores go).
"""

import argparse
import json
import math
import os
import random
import re
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from data import PROMPTS, THINK_OPEN, THINK_CLOSE, Generator, render_chat, thought  # noqa: E402
from model import Config, Transformer, causal_doc_mask  # noqa: E402
from tokenizer import Tokenizer, build_default, IM_END, IM_START, BOS  # noqa: E402
from slim import slim_checkpoint  # noqa: E402

# Training runs in phases, each from a step on: which rows examples are packed into, the task mix,
# the share of examples drawn short (data.Generator.short_frac), the answer cap, and the share of
# "repeat" sequences (BOS, a random run of ordinary tokens, the same run again; loss on the
# second run; the runs vary in length, so only content look-up, not a fixed offset, lowers the
# loss). They come first because a model trained on the task mix alone learned counting's
# fixed-offset attention but, in ~1,600 steps, no content look-up (the induction heads copy,
# lookup, needle and JSON need). See train/README.md for the measured runs.
WARMUP_MIX = dict(count=0.20, needle=0.15, copy=0.30, lookup=0.15, json=0.15, prose=0.05)
MAIN_MIX = dict(count=0.22, needle=0.20, copy=0.22, lookup=0.12, json=0.16, prose=0.08)
TUNE_MIX = dict(count=0.30, needle=0.12, copy=0.22, lookup=0.04, json=0.28, prose=0.04)
LOOKUP_MIX = dict(count=0.30, needle=0.10, copy=0.15, lookup=0.25, json=0.15, prose=0.05)
COUNT_MIX = dict(count=0.36, needle=0.08, copy=0.15, lookup=0.20, json=0.16, prose=0.05)


def tune_stage(steps, lr, warmup, mix, short_frac, repeat, count_boost, count_short,
               count_near=False, short_tasks=("needle", "copy", "lookup"), repeat_digits=0.0,
               count_down=0.20, count_trap=0.0, count_hops=0.0, n_layers=4,
               count_newline=False, multi_turn=0.0, json_rows=0.25, copy_near=0.0,
               json_wide=False):
    """A fine-tuning stage of the shipped model's shape (started with --init): one phase of
    bucketed task examples with quoted JSON fields, lr decaying by cosine from the start."""
    return dict(dim=256, n_layers=n_layers, n_heads=4, n_kv_heads=2, ffn_dim=512, seq_len=1280,
                batch=4, steps=steps, lr=lr, warmup=warmup, bucket_tokens=3600,
                phases=[dict(start=0, buckets=(320, 640, 1280), mix=mix, short_frac=short_frac,
                             max_answer_tokens=1150, repeat=repeat, count_boost=count_boost,
                             count_short=count_short, count_near=count_near,
                             short_tasks=short_tasks, repeat_digits=repeat_digits,
                             count_down=count_down, count_trap=count_trap,
                             count_hops=count_hops, count_newline=count_newline,
                             multi_turn=multi_turn, json_rows=json_rows,
                             copy_near=copy_near, json_style="quoted",
                             **(dict(json_wide=True) if json_wide else {}))],
                decay_phase=0)


def stop_stage(steps, lr, warmup, count_short=0.0, trap=0.5, hops=0.33, repeat=0.1,
               repeat_digits=1.0, mix=None, count_newline=False, n_layers=4, count_near=2):
    """A counting-alone stage of the stop experiments (stages 12-19): the stop data of "tune9"
    (near misses of B weighted, traps, hops, few counts down) and digit-string repeats."""
    return tune_stage(steps=steps, lr=lr, warmup=warmup, mix=mix or dict(count=1.0),
                      short_frac=0.0, repeat=repeat, count_boost=10.0, count_short=count_short,
                      count_near=count_near, repeat_digits=repeat_digits, count_down=0.10,
                      count_trap=trap, count_hops=hops, count_newline=count_newline,
                      n_layers=n_layers)


COPY_MIX = dict(count=0.15, needle=0.05, copy=0.35, lookup=0.10, json=0.30, prose=0.05)


def mix5_stage(steps, lr, mix, warmup=10, trap=0.3, hops=0.2, json_rows=0.5, copy_near=0.3,
               struct_boost=1.0, struct_keys=False, chat_counts=0.0, json_wide=False):
    """A five-layer stage on the whole task mix (stages 25 and 27-38): short counts, traps,
    hops, digit repeats, chat turns and the digit probe, with arrays of objects (json_rows),
    look-alike copy lists (copy_near) and the copy and JSON decisions (struct_boost) weighted as
    asked."""
    stage = tune_stage(steps=steps, lr=lr, warmup=warmup, mix=mix, short_frac=0.6, repeat=0.2,
                       count_boost=10.0, count_short=0.3, count_near=2,
                       short_tasks=("needle", "lookup"), repeat_digits=0.7, count_down=0.10,
                       count_trap=trap, count_hops=hops, n_layers=5, multi_turn=0.1,
                       json_rows=json_rows, copy_near=copy_near, json_wide=json_wide)
    if struct_boost != 1.0:
        stage["phases"][0]["struct_boost"] = struct_boost
    if struct_keys:
        stage["phases"][0]["struct_keys"] = True
    if chat_counts:
        stage["phases"][0]["chat_counts"] = chat_counts
    return dict(stage, aux_layer=3, aux_weight=0.3)


def struct_stage(steps, lr, mix, warmup=10, json_rows=0.6, struct_boost=6.0, struct_keys=True,
                 chat_counts=0.0, json_wide=False):
    """A five-layer stage with the copy and JSON decisions weighted (stages 33-39): mix5_stage
    with fewer traps and hops (0.2, 0.15), 40 % look-alike copy lists and the JSON keys
    weighted with the decisions unless asked otherwise."""
    return mix5_stage(steps, lr, mix, warmup=warmup, trap=0.2, hops=0.15, json_rows=json_rows,
                      copy_near=0.4, struct_boost=struct_boost, struct_keys=struct_keys,
                      chat_counts=chat_counts, json_wide=json_wide)


ROWS_MIX = dict(count=0.35, needle=0.05, copy=0.20, lookup=0.05, json=0.30, prose=0.05)


def fast_phase(mix, trap, hops, json_rows, copy_near, struct_boost, struct_keys=False,
               chat_counts=0.0, json_wide=False):
    """A phase of the one-run recipe ("fast"): the data of a five-layer stage (mix5_stage)."""
    stage = mix5_stage(0, 0.0, mix, trap=trap, hops=hops, json_rows=json_rows,
                       copy_near=copy_near, struct_boost=struct_boost, struct_keys=struct_keys,
                       chat_counts=chat_counts, json_wide=json_wide)
    return {k: v for k, v in stage["phases"][0].items() if k != "start"}


PRESETS = {
    # the one-run experiment (train/README.md, "One run": ~1.9 h, short of the bars): five
    # layers from induction weights (induction_check.py --layers 5), the digit probe on layer 3
    # from the start, repeats alone until the induction transition, then what stages 3-44 found
    # in one mix: key look-up weighted up (reading the start number), the stop data (traps, hops,
    # near misses), look-alike copy lists and arrays of objects with their decisions weighted;
    # from step 1,700 the mix of the decision stages (arrays of objects, keys weighted, counts
    # after counts). lr 2e-3 by cosine from the end of the repeats to 2e-4; kept copies every
    # 100 steps from 1,800 (--keep-at) for the mean of the last four
    "fast": dict(dim=256, n_layers=5, n_heads=4, n_kv_heads=2, ffn_dim=512, seq_len=1280,
                 batch=4, steps=2500, lr=2e-3, warmup=30, bucket_tokens=3600,
                 phases=[dict(start=0, repeat_rows=(16, 97)),
                         dict(after_loss=0.5, **fast_phase(
                             dict(count=0.30, needle=0.08, copy=0.18, lookup=0.16, json=0.22,
                                  prose=0.06),
                             trap=0.3, hops=0.2, json_rows=0.5, copy_near=0.3,
                             struct_boost=4.0, chat_counts=0.1)),
                         dict(start=1700, **fast_phase(
                             dict(count=0.35, needle=0.06, copy=0.20, lookup=0.06, json=0.28,
                                  prose=0.05),
                             trap=0.2, hops=0.15, json_rows=0.7, copy_near=0.4,
                             struct_boost=6.0, struct_keys=True, chat_counts=0.3,
                             json_wide=True))],
                 decay_phase=1, aux_layer=3, aux_weight=0.3,
                 keep_at=(1800, 1900, 2000, 2100, 2200, 2300, 2400, 2500)),
    # the shipped model's shape: repeats alone in short rows at a constant lr 2e-3 until their
    # loss is below 0.5 (the induction transition), then the task mix with a quarter of repeats
    # kept, the lr decaying by cosine from there (train/README.md, run 5)
    "full": dict(dim=256, n_layers=4, n_heads=4, n_kv_heads=2, ffn_dim=512, seq_len=1280,
                 batch=4, steps=1900, lr=2e-3, warmup=50, bucket_tokens=3600,
                 phases=[dict(start=0, repeat_rows=(16, 97)),
                         dict(after_loss=0.5, buckets=(320, 640, 1280), mix=MAIN_MIX,
                              short_frac=0.4, max_answer_tokens=1150, repeat=0.25,
                              json_style="plain"),
                         dict(start=1049, buckets=(320, 640, 1280), mix=MAIN_MIX,
                              short_frac=0.4, max_answer_tokens=1150, repeat=0.25,
                              count_boost=6.0, json_style="plain")],
                 decay_phase=1),
    # stage 3, from the "full" weights (--init): the bars' tasks weighted up, half the counting-up
    # examples short (a start and a stop decision every ~100 tokens instead of every ~1,000),
    # JSON field names quoted as in the answer; lr from 1e-3 down by cosine (train/README.md)
    "tune": tune_stage(steps=900, lr=1e-3, warmup=30, mix=TUNE_MIX, short_frac=0.3, repeat=0.15,
                       count_boost=6.0, count_short=0.5),
    # stage 4 experiment, from the "tune" weights: the same mix at a lower lr, counting back to
    # the main length distribution (short spans made "print B and stop" the common failure) with
    # the decisive counting tokens weighted 10
    "tune2": tune_stage(steps=600, lr=3e-4, warmup=20, mix=TUNE_MIX, short_frac=0.3,
                        repeat=0.15, count_boost=10.0, count_short=0.0),
    # stage 5 experiment, from the "tune2" weights: key look-up (the skill the counting start
    # needs: find the number after "from") weighted up, mostly with few pairs
    "tune3": tune_stage(steps=700, lr=1e-3, warmup=20, mix=LOOKUP_MIX, short_frac=0.6,
                        repeat=0.1, count_boost=10.0, count_short=0.3),
    # stage 6 experiment, from the "tune3" weights: a lower lr, and no extra short counts (with
    # spans of 1..40 the last two digits decide the stop, and "tune3" stopped at 534 for 634)
    "tune4": tune_stage(steps=450, lr=3e-4, warmup=10, mix=LOOKUP_MIX, short_frac=0.6,
                        repeat=0.1, count_boost=10.0, count_short=0.0),
    # stage 7 experiment, from the "tune3" weights: the direction (second line) and the stop's
    # leading digits (the newline after each number ending like B) weighted as decisive, few
    # short counts, counting's share up
    "tune5": tune_stage(steps=600, lr=5e-4, warmup=20, mix=COUNT_MIX, short_frac=0.6,
                        repeat=0.1, count_boost=10.0, count_short=0.1, count_near=True),
    # stage 8 experiment, from the "tune3" weights: as "tune5", plus repeats of digit strings
    # (a look-up keyed on several tokens, which the stop at B and copying numbers need), copy
    # lists never short, and fewer counts down (the bars count up)
    "tune6": tune_stage(steps=700, lr=5e-4, warmup=20, mix=COUNT_MIX, short_frac=0.6,
                        repeat=0.2, count_boost=10.0, count_short=0.1, count_near=True,
                        short_tasks=("needle", "lookup"), repeat_digits=0.7, count_down=0.10),
    # stage 9 experiment, from the "tune3" weights: as "tune6", with 40 % of the counts up
    # drawn as traps (a number ending like B a hundred or two before B) instead of short spans
    "tune7": tune_stage(steps=700, lr=5e-4, warmup=20, mix=COUNT_MIX, short_frac=0.6,
                        repeat=0.2, count_boost=10.0, count_short=0.0, count_near=True,
                        short_tasks=("needle", "lookup"), repeat_digits=0.7, count_down=0.10,
                        count_trap=0.4),
    # stage 10 experiment, from the "tune7" weights: the stop at B had become too rare (going on
    # was weighted at every number ending in B's last digit, ten times per hundred, stopping
    # once): only the real traps (534 for 634) are weighted now, and half the counts up are traps
    "tune8": tune_stage(steps=700, lr=4e-4, warmup=20, mix=COUNT_MIX, short_frac=0.6,
                        repeat=0.2, count_boost=10.0, count_short=0.0, count_near=2,
                        short_tasks=("needle", "lookup"), repeat_digits=0.7, count_down=0.10,
                        count_trap=0.5),
    # stage 11 experiment, from the "tune7" weights: as "tune8", plus short counts by 100, 50, 20
    # or 10 (every line a trap, a stop decision every ~4 tokens) for a third of the counts
    "tune9": tune_stage(steps=600, lr=4e-4, warmup=20, mix=COUNT_MIX, short_frac=0.6,
                        repeat=0.2, count_boost=10.0, count_short=0.0, count_near=2,
                        short_tasks=("needle", "lookup"), repeat_digits=0.7, count_down=0.10,
                        count_trap=0.5, count_hops=0.33),
    # stage 12 experiment, from the "tune9" weights: counting alone (the stop data of "tune9",
    # a few digit-string repeats): is the stop comparison a matter of data share or of the model?
    "tune10": tune_stage(steps=300, lr=5e-4, warmup=10, mix=dict(count=1.0), short_frac=0.0,
                         repeat=0.1, count_boost=10.0, count_short=0.0, count_near=2,
                         repeat_digits=1.0, count_down=0.10, count_trap=0.5, count_hops=0.33),
    # stages 13-19 (train/README.md): counting alone with the stop data, each testing one
    # explanation of the soft stop. From induction weights (induction_check.py --save), the stop
    # data in from the start ("stop6": the same with six layers; "stop4nl" with a newline before
    # the end of turn, encode_example's count_newline)
    "stop4": stop_stage(1500, 1.5e-3, 50, count_short=0.4, trap=0.3, hops=0.3, repeat=0.15,
                        repeat_digits=0.5),
    "stop4nl": stop_stage(1500, 1.5e-3, 50, count_short=0.4, trap=0.3, hops=0.3, repeat=0.15,
                          repeat_digits=0.5, count_newline=True),
    "stop6": stop_stage(1500, 1.5e-3, 50, count_short=0.4, trap=0.3, hops=0.3, repeat=0.15,
                        repeat_digits=0.5, n_layers=6),
    # from stage 11's weights: stage 12 with the newline format; denser stop decisions (most
    # counts short hops by 100/50/20/10, every line a near miss of B, the rest mostly traps);
    # the same with 40 % of the examples copying a list of numbers up to B among near misses of
    # B (data.Generator.stop_copy: the stop decision without the count around it)
    "tune10nl": stop_stage(300, 5e-4, 10, count_newline=True),
    "tune11": stop_stage(800, 5e-4, 10, trap=0.6, hops=0.6),
    "tune12": stop_stage(800, 5e-4, 10, trap=0.6, hops=0.6, mix=dict(count=0.6, stopcopy=0.4)),
    # from stage 11's weights grown to six layers (grow.py --after 1,3: the new blocks start as
    # the identity): room to compose the current number's leading digit with B's
    "grow6": stop_stage(400, 1e-3, 20, n_layers=6),
    # stage 20 experiment, from stage 11's weights: "tune11" plus the auxiliary digit probe
    # (aux_loss) on layer 2's output: B's four place digits must be readable at the comma after
    # B, where the last layer's stop heads look
    "aux1": dict(stop_stage(800, 5e-4, 10, trap=0.6, hops=0.6), aux_layer=2, aux_weight=0.3),
    # the same with the probe on layer 1's output (B's digits gathered a layer earlier)
    "aux2": dict(stop_stage(800, 5e-4, 10, trap=0.6, hops=0.6), aux_layer=1, aux_weight=0.3),
    # "aux1" with the probe weighted 1.0
    "aux3": dict(stop_stage(800, 5e-4, 10, trap=0.6, hops=0.6), aux_layer=2, aux_weight=1.0),
    # stage 21 experiment: stage 11's weights grown to five layers by a block after layer 2
    # (grow.py --after 2 --attn-from 2), the digit probe on the new block's output. At layer 2's
    # output B's last digit holds all of B's digits, the comma after it not the leading one
    # (aux_check.py on "aux1"); the new block can pass them on with a previous-token read
    "grow5": dict(stop_stage(800, 5e-4, 10, trap=0.6, hops=0.6, n_layers=5), aux_layer=3,
                  aux_weight=0.3),
    # from "grow5" at step ~380: 1,200 more steps (lr 5e-4 by cosine), the stop heads having
    # begun to tell 534 from 634 at the comma
    "grow5c": dict(stop_stage(1200, 5e-4, 5, trap=0.6, hops=0.6, n_layers=5), aux_layer=3,
                   aux_weight=0.3),
    # from "grow5" at step 558: the newline after every number one place away from B weighted
    # (count_near=3; "grow5" stopped at 631 and 290, which no weight told apart from going on)
    "grow5d": dict(stop_stage(1000, 5e-4, 5, trap=0.6, hops=0.6, n_layers=5, count_near=3),
                   aux_layer=3, aux_weight=0.3),
    # from "grow5c" at step 300: the counts' usual lengths back (fewer hops and traps: counts
    # from 1, two-digit and long ones had become rare), every one-place miss weighted
    "grow5e": dict(stop_stage(800, 4e-4, 5, trap=0.3, hops=0.3, n_layers=5, count_near=3),
                   aux_layer=3, aux_weight=0.3),
    "grow5b": dict(stop_stage(800, 1e-3, 10, trap=0.6, hops=0.6, n_layers=5), aux_layer=3,
                   aux_weight=1.0),
    # stage 5's weights (tune3) grown to five layers (grow.py --after 2 --attn-from 2), the whole task mix
    # of "tune9" with the digit probe on the new block (stages 21-22 on counting alone gave the
    # stop B's leading digit this way) and a tenth of the examples as the last turn of a chat
    "growmix": dict(tune_stage(steps=900, lr=5e-4, warmup=20, mix=COUNT_MIX, short_frac=0.6,
                               repeat=0.2, count_boost=10.0, count_short=0.0, count_near=2,
                               short_tasks=("needle", "lookup"), repeat_digits=0.7,
                               count_down=0.10, count_trap=0.5, count_hops=0.33, n_layers=5,
                               multi_turn=0.1), aux_layer=3, aux_weight=1.0),
    # from "growmix": short counts back (spans 1..40 from any start: "growmix" ran on past one-
    # and two-digit B, which its counts, mostly long, traps and hops, had made rare)
    "growmix2": mix5_stage(300, 2e-4, COUNT_MIX, trap=0.4, hops=0.25, json_rows=0.25,
                           copy_near=0.0),
    # from "growmix2": counting alone (curriculum step: the stop became exact on counting alone in
    # "grow5c"/"grow5e"), with short counts and fewer hops and traps so counts from 1 stay common
    "growcount": dict(stop_stage(300, 3e-4, 10, count_short=0.3, trap=0.3, hops=0.2, n_layers=5),
                      aux_layer=3, aux_weight=0.3),
    # from "growcount": the whole mix back at a low lr (counting alone lost JSON and copy), copy
    # and JSON weighted up
    "growmix3": mix5_stage(250, 1.5e-4, dict(count=0.25, needle=0.10, copy=0.22, lookup=0.13,
                                             json=0.25, prose=0.05),
                           json_rows=0.25, copy_near=0.0),
    # from "growmix3": copy and JSON weighted up further, half the JSON examples arrays of
    # objects (most JSON misses), at a higher lr than "growmix3" so that their position look-ups
    # can still change; counting kept at 15 %
    "copyjson": mix5_stage(500, 4e-4, COPY_MIX, warmup=20, copy_near=0.0),
    # from "copyjson": the same mix with a third of the copy lists made of look-alike items
    # (two to four first parts: 'Zoe 33', 'Zoe 53'), whose next token only the line settles
    "copyjson2": mix5_stage(600, 3e-4, COPY_MIX, warmup=20),
    # from "copyjson2": counting weighted back up within the mix (a counting-alone stage, as
    # "growcount", erased copy), the copy and JSON data of "copyjson2", a lower lr
    "remix": mix5_stage(400, 2e-4, dict(count=0.35, needle=0.07, copy=0.25, lookup=0.08,
                                        json=0.20, prose=0.05)),
    # from "remix": counting weighted up further, fewer traps and hops (so that long counts
    # from 1 stay common: "remix" ran 1..300 on to 304), at a lower lr
    "remix2": mix5_stage(350, 1.5e-4, dict(count=0.45, needle=0.07, copy=0.20, lookup=0.06,
                                           json=0.17, prose=0.05), trap=0.2, hops=0.15),
    # experiment from "remix2": more look-alike copy lists and arrays of objects (the misses
    # left in stage 31), counting kept at 20 %
    "copyjson3": mix5_stage(300, 2e-4, dict(count=0.20, needle=0.05, copy=0.35, lookup=0.05,
                                            json=0.30, prose=0.05),
                            trap=0.2, hops=0.15, json_rows=0.7, copy_near=0.6),
    # from "remix2": the decisions of copy lists and JSON answers (which row or item comes next,
    # where it parts from look-alikes, go on or stop) weighted 4, so that a dropped or repeated
    # row costs more than its easy tokens earn; counting kept at 35 %
    "struct": struct_stage(400, 2e-4, dict(count=0.35, needle=0.06, copy=0.22, lookup=0.06,
                                           json=0.26, prose=0.05),
                           struct_boost=4.0, struct_keys=False),
    # from "struct": as "struct", the JSON keys' first letters (which field comes next) weighted
    # too, at 6 (stage 33's JSON misses left took a wrong or repeated field as often as a row)
    "struct2": struct_stage(500, 2e-4, dict(count=0.35, needle=0.06, copy=0.22, lookup=0.06,
                                            json=0.26, prose=0.05)),
    # from "struct2": arrays of objects weighted up (70 % of JSON, JSON 35 % of the mix) at a
    # higher lr (copy had answered to 3e-4 in "copyjson2", not to 2e-4)
    "rows": struct_stage(500, 3e-4, dict(count=0.30, needle=0.05, copy=0.20, lookup=0.05,
                                         json=0.35, prose=0.05),
                         warmup=20, json_rows=0.7),
    # from "rows": counting weighted back up at a low lr (as "remix2" after "remix"), a third of
    # the counts up after an earlier count from the same start to another end ("rows" stopped
    # `1 to 6` at 3 after a `1 to 3` turn of the same chat)
    "chatcount": struct_stage(200, 1.5e-4, dict(count=0.45, needle=0.07, copy=0.18, lookup=0.05,
                                                json=0.20, prose=0.05),
                              chat_counts=0.3),
    # experiment from "chatcount": arrays of objects weighted up again (as "rows", at 2e-4),
    # keeping the counts after an earlier count
    "rows2": struct_stage(300, 2e-4, ROWS_MIX, json_rows=0.7, chat_counts=0.3),
    # experiment from "chatcount": "rows" (its lr 3e-4 moved JSON most) with the counts after
    # counts of "chatcount" and counting at 35 %
    "rows3": struct_stage(400, 3e-4, ROWS_MIX, warmup=20, json_rows=0.7, chat_counts=0.3),
    # experiment from "chatcount": "rows3" twice as long, so that the cosine tail (the low lr
    # that brought counting back in "chatcount") comes after the JSON rows have moved
    "rows4": struct_stage(800, 3e-4, ROWS_MIX, warmup=20, json_rows=0.7, chat_counts=0.3),
    # experiment: "rows4" with JSON answers larger than the held-out ones (objects of up to 8
    # fields, arrays of up to 6 objects) and copy's share up from 20 % to 25 %
    "wide": struct_stage(600, 3e-4, dict(count=0.30, needle=0.05, copy=0.25, lookup=0.05,
                                         json=0.30, prose=0.05),
                         warmup=20, json_rows=0.7, chat_counts=0.3, json_wide=True),
    # from "tune3" (stage 5): its data at a lower lr, a fifth of the examples as the last turn
    # of a chat (one or two short earlier turns first), so that `lamina chat` answers the last
    # question and not the first
    "tune3chat": tune_stage(steps=300, lr=3e-4, warmup=10, mix=LOOKUP_MIX, short_frac=0.6,
                            repeat=0.1, count_boost=10.0, count_short=0.3, multi_turn=0.2),
    # pipeline check: a few minutes
    "small": dict(dim=128, n_layers=2, n_heads=2, n_kv_heads=1, ffn_dim=256, seq_len=512,
                  batch=4, steps=60, lr=3e-3, warmup=10, bucket_tokens=1024,
                  phases=[dict(start=0, buckets=(256, 512), mix=WARMUP_MIX, short_frac=0.5,
                               max_answer_tokens=380, repeat=0.2)]),
}
# experiment after "fast", which learned the skills about half as fast per step as run 5: run 5's
# mix without weighted tokens for the first task steps (JSON quoted, the digit probe on), then
# "fast"'s two phases from steps 1,100 and 2,000; 2,800 steps in all, the mean of the last four
# hundreds
PRESETS["fast2"] = dict(PRESETS["fast"], steps=2800, keep_at=(2500, 2600, 2700, 2800),
                        phases=[PRESETS["fast"]["phases"][0],
                                dict(after_loss=0.5, buckets=(320, 640, 1280), mix=MAIN_MIX,
                                     short_frac=0.4, max_answer_tokens=1150, repeat=0.25,
                                     json_style="quoted"),
                                dict({k: v for k, v in PRESETS["fast"]["phases"][1].items()
                                      if k != "after_loss"}, start=1100),
                                dict(PRESETS["fast"]["phases"][2], start=2000)])
# "fast2" with every counting number that differs from B in one place only weighted as a stop
# decision (count_near=3) from step 1,100: "fast" stopped at 914 for 974, a tens-digit miss
# that count_near=2 (534 for 634) never weights; stage 22 (grow5e) showed count_near=3 sharpens
# the stop on every three-digit range. Its first 1,100 steps are "fast2"'s, batch for batch
PRESETS["fast3"] = dict(PRESETS["fast2"],
                        phases=PRESETS["fast2"]["phases"][:2]
                        + [dict(p, count_near=3) for p in PRESETS["fast2"]["phases"][2:]])
# "fast3" stopped on no range at step 1,917 (each ran past B or slipped; count_near=3 weights
# going on after some eighteen neighbours of B for each stop): from step 2,000 "fast2"'s last
# phase again (count_near=2, only the traps weighted), so the stop can form on the settled
# count. Measured: it did not (counting 0/21, JSON 27, copy 8/40; train/README.md, "One run")
PRESETS["fast4"] = dict(PRESETS["fast3"],
                        phases=PRESETS["fast3"]["phases"][:3] + PRESETS["fast2"]["phases"][3:])


def _near(name):
    """Preset NAME with every counting number that differs from B in one place only weighted
    as a stop decision (count_near=3) instead of the traps alone (count_near=2)."""
    return dict(PRESETS[name], phases=[dict(PRESETS[name]["phases"][0], count_near=3)])


# The tail of RECIPE=fastnear, after fasttail's mean (train/README.md, "fastnear"). fasttail's
# counting misses were all tens-digit stops (951 for 938->981, 174 for 5->194), numbers that
# count_near=2 never weights. "nearcount": "chatcount" so weighted (200 steps at 1.5e-4 moved
# nothing); "nearmix" and "nearmix2": the same at 3e-4 for 400 and 800 steps, both from the mean;
# then arrays of objects ("rowsnear") and the larger JSON answers ("widenear") so weighted, and
# "structnear" (struct2 so weighted) from their mean
PRESETS["nearcount"] = _near("chatcount")
PRESETS["nearmix"] = dict(PRESETS["nearcount"], steps=400, lr=3e-4, warmup=20)
PRESETS["nearmix2"] = dict(PRESETS["nearmix"], steps=800)
PRESETS["rowsnear"] = _near("rows4")
PRESETS["widenear"] = _near("wide")
PRESETS["structnear"] = _near("struct2")
# After wide384's final mean (train/README.md, "wide384"): its recorded counting miss was a stop
# at B's last digits (94 for 5 -> 194) and most JSON misses arrays of objects with a row's values
# taken from a neighbouring row. "alike": "rowsnear" with a fifth of the counts up drawn so that
# B's last digits come first as a number of their own (count_suffix) and that number's newline
# weighted as a stop decision (count_near=4), and half the arrays of objects with values repeated
# across rows (rows_alike); 600 steps
def _alike(name, **changes):
    """Preset NAME with the data and weights of "alike" (count_suffix, rows_alike, count_near=4)."""
    return dict(PRESETS[name], **changes,
                phases=[dict(PRESETS[name]["phases"][0], count_near=4, count_suffix=0.2,
                             rows_alike=0.5)])


PRESETS["alike"] = _alike("rowsnear", steps=600)
# "widealike": "widenear" (the larger JSON answers) with the data and weights of "alike"
PRESETS["widealike"] = _alike("widenear")
# "think": the thinking mode (data.thought) on a third of the examples of "widealike", 600 steps
# from the shipped model, without the digit probe
PRESETS["think"] = dict(PRESETS["widealike"], steps=600, aux_layer=None,
                        phases=[dict(PRESETS["widealike"]["phases"][0], think=0.35)])
TASKS = ["count", "needle", "copy", "lookup", "json", "prose"]
# a count-up prompt (PROMPTS["count"]) with its A and B as groups, for chat_counts
COUNT_UP = re.compile(re.escape(PROMPTS["count"]).replace(r"\{a\}", r"(\d+)")
                      .replace(r"\{b\}", r"(\d+)"))


def _common_prefix(a, b):
    n = 0
    while n < len(a) and n < len(b) and a[n] == b[n]:
        n += 1
    return n


def _split_points(parts):
    """For each string of parts, where it stops sharing a prefix with any other: the index of
    its first character that no other part shares at that place (len(part) when another part
    extends it)."""
    return [max((_common_prefix(x, y) for j, y in enumerate(parts) if j != i), default=0)
            for i, x in enumerate(parts)]


def _value_marks(start, text, split):
    """A JSON value's decisions, as offsets into the answer: its first character, where it
    parts from the other values it could be confused with (split; a string's opening quote
    settles nothing), and the character after it."""
    split = max(split, 1) if text.startswith('"') else split
    return [start, start + min(split, len(text)), start + len(text)]


def decisive_chars(task, answer, keys=False):
    """Character offsets of an answer's decisions for the structure weight (struct_boost):
    where the next token is settled by which item or row comes next rather than by the item
    being written. Copy: each line's first character, and the character where the line parts
    from every other line of the list that starts like it ('Zoe 33' / 'Zoe 53': the '3'; the
    newline when another line extends it). JSON: each value's first character and the place
    where it parts from the other values of its field, the character after each value (',' goes
    on, '}' or ']' ends the object or array) and, in an array of objects, the character after
    each '}' (another row or the end); with keys, also each key's first letter (which field
    comes next). Offsets index the answer's UTF-8 bytes; [] when the answer is not of that
    form."""
    out = []
    if task == "copy":
        lines = answer.split("\n")
        pos = 0
        for line, split in zip(lines, _split_points(lines)):
            out += [pos, pos + len(line[:split].encode("utf-8"))]
            pos += len(line.encode("utf-8")) + 1
        return out
    if task != "json":
        return out
    try:
        value = json.loads(answer)
    except ValueError:
        return out
    rows = value if isinstance(value, list) else [value]
    if not rows or (not isinstance(value, list) and not isinstance(value, dict)):
        return out
    marks = []
    if isinstance(value, list) and not all(isinstance(r, dict) for r in rows):
        texts = [json.dumps(x) for x in rows]  # an array of plain values
        text = "["
        for k, (t, split) in enumerate(zip(texts, _split_points(texts))):
            text += ", " if k else ""
            marks += _value_marks(len(text), t, split)
            text += t
        text += "]"
    else:  # an object, or an array of objects with the same fields
        splits = {f: _split_points([json.dumps(r.get(f)) for r in rows]) for f in rows[0]}
        text = "[" if isinstance(value, list) else ""
        for i, row in enumerate(rows):
            text += (", " if i else "") + "{"
            for k, (f, v) in enumerate(row.items()):
                text += ", " if k else ""
                if keys:
                    marks.append(len(text) + 1)
                text += json.dumps(f) + ": "
                t = json.dumps(v)
                marks += _value_marks(len(text), t, splits[f][i] if f in splits else 0)
                text += t
            text += "}"
            if isinstance(value, list):
                marks.append(len(text))  # another row or the end
        text += "]" if isinstance(value, list) else ""
    if text != answer:  # not in json.dumps' compact form: leave it at the base weight
        return []
    return sorted(set(len(text[:m].encode("utf-8")) for m in marks))


def encode_example(tok, prompt, answer, task=None, count_boost=1.0, count_near=False,
                   count_newline=False, history=(), struct_boost=1.0, struct_keys=False,
                   think=False):
    """Token ids and per-token loss weights: 0 on the prompt; on the answer and its <|im_end|>,
    max(1, 48 / answer length) capped at 8, so that short answers (a needle's code, a looked-up
    value) are not drowned by the long counting answers. With count_boost > 1, a counting
    answer's decisive tokens get that weight instead: the first line (the start number, read
    from the prompt), every line whose leading digits change (carries, borrows, steps) and the
    last line with the end of turn (stopping at B). In a long count they are a few percent of
    the tokens, so at weight 1 the easy middle digits hide them: a model can reach a low mean
    loss and still start at the wrong number or fail at 10 -> 11.

    count_near adds two more decisions: the second line (the direction: up, down or the step)
    and the newline after every number that ends in B's last digit (count_near=1) or in all of
    B's digits but the leading one (count_near=2): going on past 534 when B is 634 is decided by
    the leading digit alone, so the stop must compare all of them; count_near=3 weights every
    number that differs from B in one place only (534, 624, 631 for 634); count_near=4 those and
    every shorter number equal to B's last digits (94 and 4 for 194).

    count_newline ends a count's answer with a newline before <|im_end|>: the stop is then
    decided at the newline, where the model computes the next number's first digit and so already
    reads the whole line (at the last digit it only has to know the number is complete); the
    decisive weight moves from the newline to the token after it.

    history: earlier (prompt, answer) turns of the same conversation, rendered before this one
    as the chat template does (`lamina chat`); they are context only (weight 0).

    struct_boost > 1 gives that weight to the tokens that hold a copy or JSON answer's
    decisions (decisive_chars: which item or row comes next, where it parts from look-alikes,
    go on or stop) and to the end of turn: a dropped or repeated row is decided there, and at
    weight 1 the easy tokens of the rows hide it.

    think: the thinking mode. The prompt ends with the block the template opens (THINK_OPEN); the
    answer is the task's plan (data.thought), the block's close (THINK_CLOSE) and then the answer
    as without thinking, every token of the plan and the close weighted at least 2."""
    head = tok.encode("".join(render_chat(p, a) for p, a in history) + render_chat(prompt)
                      + (THINK_OPEN if think else ""), add_bos=True)
    shift = 1 if count_newline and task == "count" else 0
    text = answer + "\n" * shift
    body = tok.encode(text, add_bos=False) + [IM_END]
    w = min(8.0, max(1.0, 48.0 / len(body)))
    weights = [w] * len(body)
    if task == "count" and count_boost > 1.0 and len(body) == len(text) + 1:
        lines = answer.split("\n")  # digits and newlines: one token per character
        # count_near 1: numbers ending in B's last digit; 2: in all of B but its leading digit
        # (534 for 634, 100 and 200 for 300: the traps alone)
        # 3: in all of B's places but one (534, 624 and 631 for 634: every two-of-three match)
        # 4: those of 3 and the shorter numbers equal to B's last digits (94 and 4 for 194)
        tail = 1 if count_near not in (2, 3, 4) else max(1, len(lines[-1]) - 1)

        def near(line):
            if count_near == 4 and len(line) < len(lines[-1]) and lines[-1].endswith(line):
                return True
            if count_near in (3, 4):
                return (len(line) == len(lines[-1])
                        and sum(x != y for x, y in zip(line, lines[-1])) == 1)
            return line[-tail:] == lines[-1][-tail:]

        pos = 0
        for i, line in enumerate(lines):
            decisive = (i == 0 or i == len(lines) - 1 or len(line) != len(lines[i - 1])
                        or line[:-1] != lines[i - 1][:-1] or (count_near and i == 1))
            if decisive:
                # with count_near=2 a carry line's newline (going on) is weighted only at a trap,
                # so that going on is not weighted ten times as often as stopping
                last = i == len(lines) - 1
                end = pos + len(line) + shift + (1 if count_near not in (2, 3, 4) or last
                                                 or near(line) else 0)
                for j in range(pos, end):
                    weights[j] = max(weights[j], count_boost)
            elif count_near and near(line):
                weights[pos + len(line) + shift] = max(weights[pos + len(line) + shift],
                                                       count_boost)
            pos += len(line) + 1
    if task in ("copy", "json") and struct_boost > 1.0:
        marks = decisive_chars(task, answer, struct_keys)
        pos = 0
        for j, t in enumerate(body):
            end = pos + len(tok.piece(t))
            if t == IM_END or any(pos <= m < end for m in marks):
                weights[j] = max(weights[j], struct_boost)
            pos = end
    if think:
        plan = tok.encode(thought(task, prompt, answer) + THINK_CLOSE, add_bos=False)
        body = plan + body
        weights = [max(2.0, weights[0])] * len(plan) + weights
    if task == "stopcopy" and count_boost > 1.0:
        # each line's end is a stop decision (go on after a near miss, end after B)
        for j, t in enumerate(body):
            if t == IM_END or tok.decode([t]) == "\n":
                weights[j] = max(weights[j], count_boost)
    return head + body, [0.0] * len(head) + weights


def digit_slots(n):
    """The digits of n (0..9999) in four place slots, thousands to units; 10 = no digit."""
    s = str(n).rjust(4)
    return [10 if c == " " else int(c) for c in s]


def count_aux_targets(tok, ids, task):
    """Positions and targets of the auxiliary digit probe (see aux_loss) in one counting
    example: at the last digit of the stop number in the prompt and at the token after it (the
    comma, whose key the stop's look-up matches), and at the last digit of every number of the
    answer, the number's four place digits, then the kind of place (1 prompt, 2 answer). The stop at B must tell 534 from 634; a linear read
    of the residual stream before the last layer that names all of B's digits there makes the
    leading digit part of what the last layer's heads can match on. [] for other tasks."""
    if task != "count":
        return []
    digit_of = {tok.encode(str(d), add_bos=False)[0]: d for d in range(10)}
    runs = []  # (start, end) of digit runs
    i = 0
    while i < len(ids):
        if ids[i] in digit_of:
            j = i
            while j < len(ids) and ids[j] in digit_of:
                j += 1
            runs.append((i, j))
            i = j
        else:
            i += 1
    starts = [k for k, t in enumerate(ids) if t == IM_START]
    answer_start = starts[-1]
    user_start = starts[-2] if len(starts) >= 2 else 0  # the last user turn (after any history)
    prompt_runs = [r for r in runs if r[0] > user_start and r[1] <= answer_start]
    answer_runs = [r for r in runs if r[0] > answer_start]
    out = []
    if len(prompt_runs) >= 2:
        s, e = prompt_runs[1]
        value = int("".join(str(digit_of[t]) for t in ids[s:e]))
        if value <= 9999:
            out += [(e - 1, digit_slots(value) + [1]), (e, digit_slots(value) + [1])]
    for s, e in answer_runs:
        value = int("".join(str(digit_of[t]) for t in ids[s:e]))
        if value <= 9999:
            out.append((e - 1, digit_slots(value) + [2]))
    return out


def place_example(toks, wts, docs, spans, row, pos, doc, task, ids, mask):
    """Writes one example at (row, pos) of the [rows, L] token / weight / doc-id buffers and
    records its answer span (row, start, end, task) in target coordinates."""
    n = len(ids)
    toks[row, pos:pos + n] = torch.tensor(ids)
    wts[row, pos:pos + n] = torch.tensor(mask, dtype=torch.float32)
    docs[row, pos:pos + n] = doc
    first = next(i for i, m in enumerate(mask) if m > 0)
    spans.append((row, pos + first - 1, pos + n - 1, task))


def pad_row(docs, row, pos, doc):
    """Padding from pos on: each pad token its own "document" so nothing attends across (and no
    loss). Returns the next free doc id."""
    width = docs.shape[1]
    if pos < width:
        docs[row, pos:] = torch.arange(doc, doc + width - pos)
        doc += width - pos
    return doc


def adamw(model, lr, weight_decay):
    """AdamW with weight decay on matrices only (not norms)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=lr, betas=(0.9, 0.95), eps=1e-8)


def make_batch(tok, seed, batch, seq_len, max_answer_tokens, weights=None):
    """Rows of seq_len+1 tokens packed with whole examples (BOS-separated, block-diagonal
    attention), padded at the end. Returns inputs, targets, loss weights, doc ids and the
    per-example spans (row, start, end, task) of answer tokens in target coordinates."""
    gen = Generator(seed, max_answer_tokens=max_answer_tokens,
                    max_prompt_chars=int(seq_len * 3.9), weights=weights)
    L = seq_len + 1
    toks = torch.zeros(batch, L, dtype=torch.long)
    wts = torch.zeros(batch, L)
    docs = torch.full((batch, L), -1, dtype=torch.long)
    spans = []
    doc = 0
    pending = None
    for row in range(batch):
        pos = 0
        tries = 0
        while True:
            if pending is None:
                task, p, a = gen.example()
                ids, mask = encode_example(tok, p, a)
                if len(ids) > L:
                    tries += 1
                    if tries > 50:
                        break
                    continue
                pending = (task, ids, mask)
            task, ids, mask = pending
            if pos + len(ids) > L:
                break
            place_example(toks, wts, docs, spans, row, pos, doc, task, ids, mask)
            doc += 1
            pos += len(ids)
            pending = None
        doc = pad_row(docs, row, pos, doc)
    inputs = toks[:, :-1]
    targets = toks[:, 1:]
    weights = wts[:, 1:]
    return inputs, targets, weights, docs[:, :-1], spans


def repeat_example(rng, normal_ids, weight=1.0, digit_ids=None):
    """BOS, a run of 8..48 random ordinary tokens, the same run again; loss on the second run.
    With digit_ids (the ten digits and the newline): a run of 12..120 of those. Over eleven
    symbols the token before is no key (every digit follows every other many times), so only a
    look-up keyed on the last two or three tokens copies it: the look-up that copying a list of
    numbers and stopping at B (534 is not 634) need."""
    if digit_ids:
        run = [rng.choice(digit_ids) for _ in range(rng.randint(12, 120))]
    else:
        run = [rng.choice(normal_ids) for _ in range(rng.randint(8, 48))]
    return [BOS] + run + run, [0.0] * (1 + len(run)) + [weight] * len(run)


def make_repeat_rows(rng, rows, width, token_ids, min_run=8):
    """Repeats alone, one per row of `width` tokens from position 0 (the layout in which the
    induction transition shows): BOS, a run of min_run..(width-1)/2 tokens drawn from token_ids
    with `rng`, the run again; loss on the second run after its first token (which nothing
    predicts). Also the data of induction_check.py."""
    toks = torch.zeros(rows, width, dtype=torch.long)   # [rows, width] token ids
    wts = torch.zeros(rows, width)                      # [rows, width] loss weight of each token
    docs = torch.zeros(rows, width, dtype=torch.long)   # [rows, width] 0 = the sequence
    spans = []
    for r in range(rows):
        run = [rng.choice(token_ids) for _ in range(rng.randint(min_run, (width - 1) // 2))]
        ids = [BOS] + run + run
        toks[r, :len(ids)] = torch.tensor(ids)
        wts[r, len(run) + 2:len(ids)] = 1.0
        docs[r, len(ids):] = torch.arange(1, width - len(ids) + 1)  # padding sees itself
        spans.append((r, len(run) + 1, len(ids) - 1, "repeat"))
    return [(toks[:, :-1], toks[:, 1:], wts[:, 1:], docs[:, :-1], spans)]


def make_bucketed_batch(tok, seed, token_budget, buckets, max_answer_tokens, weights=None,
                        short_frac=0.0, repeat=0.0, normal_ids=None, repeat_weight=1.0,
                        count_boost=1.0, count_short=0.0, json_style="quoted",
                        count_near=False, short_tasks=("needle", "copy", "lookup"),
                        repeat_digits=0.0, count_down=0.20, count_trap=0.0, count_hops=0.0,
                        count_newline=False, aux=False, multi_turn=0.0, json_rows=0.25,
                        copy_near=0.0, struct_boost=1.0, struct_keys=False, chat_counts=0.0,
                        json_wide=False, count_suffix=0.0, rows_alike=0.0, think=0.0):
    """The same kind of rows as make_batch, but each example goes to the shortest row length in
    `buckets` that holds it (first fit, longest examples first), so short examples stop paying
    for T x T attention over a long row. Examples are drawn until token_budget tokens are in
    hand. Returns one (inputs, targets, weights, doc ids, spans) tuple per non-empty bucket;
    with aux, a sixth item: the digit probe's targets [rows, L, 5] (-100 where none;
    count_aux_targets). With multi_turn, that share of the examples is the last turn of a
    conversation: one or two short earlier turns (any task, up to 240 tokens) come first, so the
    model learns to answer the last question and not an earlier one (`lamina chat`). With
    chat_counts, that share of the counts up (with no other history) follow one earlier short
    count from the same start to another end: the second count must stop at its own B, not at
    the end the conversation has already seen (`Count from 1 to 3`, then `1 to 6`). With think,
    that share of the examples with no history are drawn in the thinking mode (encode_example)."""
    longest = buckets[-1]
    gen = Generator(seed, max_answer_tokens=max_answer_tokens,
                    max_prompt_chars=int(longest * 3.9), weights=weights,
                    short_frac=short_frac, count_short=count_short, json_style=json_style,
                    short_tasks=short_tasks, count_down=count_down, count_trap=count_trap,
                    count_hops=count_hops, json_rows=json_rows,
                    copy_near=copy_near, json_wide=json_wide, count_suffix=count_suffix,
                    rows_alike=rows_alike)
    rng = random.Random(seed * 7 + 3)
    digit_ids = tok.encode("0123456789\n", add_bos=False) if repeat_digits > 0 else None
    examples = []
    total = 0
    while total < token_budget:
        if repeat > 0 and rng.random() < repeat:
            task = "repeat"
            digits = repeat_digits > 0 and rng.random() < repeat_digits
            ids, mask = repeat_example(rng, normal_ids, repeat_weight,
                                       digit_ids if digits else None)
        else:
            history = []
            if multi_turn > 0 and rng.random() < multi_turn:
                for _ in range(rng.choice((1, 2))):
                    for _try in range(20):
                        _, hp, ha = gen.example()
                        if len(tok.encode(render_chat(hp, ha), add_bos=False)) <= 240:
                            history.append((hp, ha))
                            break
            task, p, a = gen.example()
            start = COUNT_UP.fullmatch(p) if chat_counts > 0 and not history else None
            if start and rng.random() < chat_counts:
                a0, b0 = int(start.group(1)), int(start.group(2))
                b1 = rng.choice([b for b in range(a0 + 1, a0 + 31) if b != b0])
                history = [(PROMPTS["count"].format(a=a0, b=b1),
                            "\n".join(str(x) for x in range(a0, b1 + 1)))]
            thinking = think > 0 and not history and rng.random() < think
            ids, mask = encode_example(tok, p, a, task, count_boost, count_near, count_newline,
                                       history, struct_boost, struct_keys, thinking)
        if len(ids) > longest + 1:
            continue
        examples.append((task, ids, mask, count_aux_targets(tok, ids, task) if aux else []))
        total += len(ids)
    out = []
    by_bucket = {L: [] for L in buckets}
    for ex in examples:
        by_bucket[next(L for L in buckets if len(ex[1]) <= L + 1)].append(ex)
    doc = 0
    for L, exs in by_bucket.items():
        if not exs:
            continue
        exs.sort(key=lambda e: -len(e[1]))
        rows = []  # [free tokens, [examples]]
        for ex in exs:
            row = next((r for r in rows if r[0] >= len(ex[1])), None)
            if row is None:
                row = [L + 1, []]
                rows.append(row)
            row[0] -= len(ex[1])
            row[1].append(ex)
        toks = torch.zeros(len(rows), L + 1, dtype=torch.long)
        wts = torch.zeros(len(rows), L + 1)
        docs = torch.full((len(rows), L + 1), -1, dtype=torch.long)
        aux_t = torch.full((len(rows), L + 1, 5), -100, dtype=torch.long)  # [rows, L+1, 5]
        spans = []
        for r, (_, row_exs) in enumerate(rows):
            pos = 0
            for task, ids, mask, targets in row_exs:
                place_example(toks, wts, docs, spans, r, pos, doc, task, ids, mask)
                for p, slots in targets:
                    aux_t[r, pos + p] = torch.tensor(slots)
                doc += 1
                pos += len(ids)
            doc = pad_row(docs, r, pos, doc)
        part = (toks[:, :-1], toks[:, 1:], wts[:, 1:], docs[:, :-1], spans)
        out.append(part + (aux_t[:, :-1],) if aux else part)
    return out


def aux_loss(aux_head, hidden, targets):
    """The auxiliary digit probe: a linear read of the RMS-normalised residual stream
    hidden [rows, L, dim] into four place digits (11 classes each: 0-9, none) at the positions
    where targets [rows, L, 5] is set (the fifth item: 1 at the stop number in the prompt, 2 in
    the answer). Returns per kind (prompt, answer) the summed cross-entropy and the number of
    positions: the prompt's two places per example are few against the answer's hundreds, so
    the caller averages each kind on its own. Training only: the probe is not part of the model
    and is not exported."""
    out = []
    for kind in (1, 2):
        sel = targets[..., 4] == kind
        n = int(sel.sum())
        if n == 0:
            out.append((hidden.sum() * 0.0, 0))
            continue
        h = hidden[sel]
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5)
        logits = aux_head(h).view(n, 4, 11)
        ce = F.cross_entropy(logits.reshape(-1, 11), targets[sel][:, :4].reshape(-1),
                             reduction="sum")
        out.append((ce / 4, n))
    return out


def lr_at(step, total, base, warmup, decay_from=None, min_frac=0.1):
    """Linear warm-up, then constant until decay_from (None: not yet known, stay constant),
    then cosine down to min_frac * base at step `total`."""
    if step < warmup:
        return base * (step + 1) / warmup
    if decay_from is None:
        return base
    start = max(warmup, decay_from)
    t = min(1.0, max(0, step - start) / max(1, total - start))
    return base * (min_frac + (1 - min_frac) * 0.5 * (1 + math.cos(math.pi * t)))


def next_phase_starts(phases, phase_starts, step, history, window=20):
    """Returns phase_starts (the step at which each phase so far began) extended by the next
    phase when it begins at `step`: either at its fixed `start`, or (`after_loss`) once the mean
    training loss of the last `window` steps of the current phase is below the threshold."""
    if len(phase_starts) == len(phases):
        return phase_starts
    nxt = phases[len(phase_starts)]
    if "start" in nxt:
        begins = step >= nxt["start"]
    else:
        recent = [l for s, l in history if s > phase_starts[-1]][-window:]
        begins = len(recent) == window and sum(recent) / window < nxt["after_loss"]
    return phase_starts + [step] if begins else phase_starts


def weights_state(model, step, cfg, args, tok, aux_head=None):
    """What a checkpoint holds besides the training state: weights (and digit probe), config,
    step, args and tokenizer."""
    state = {"model": model.state_dict(), "step": step, "config": cfg.to_dict(),
             "args": vars(args), "tokenizer": tok.to_json()}
    if aux_head is not None:
        state["aux_head"] = aux_head.state_dict()
    return state


def save_checkpoint(path, model, opt, step, cfg, args, tok, history, phase_starts,
                    aux_head=None):
    tmp = path + ".tmp"
    state = dict(weights_state(model, step, cfg, args, tok, aux_head), opt=opt.state_dict(),
                 history=history, phase_starts=phase_starts)
    torch.save(state, tmp)
    os.replace(tmp, path)


@torch.no_grad()
def evaluate(model, tok, args, n_batches=2):
    """Per-task loss and teacher-forced exact match on a fixed held-out set: an answer counts
    as exact when every answer token (and <|im_end|>) is the argmax, which is exactly when
    greedy decoding would reproduce it."""
    model.eval()
    stats = {t: [0.0, 0, 0, 0] for t in TASKS}  # loss sum, tokens, exact, examples
    for b in range(n_batches):
        x, y, w, d, spans = make_batch(tok, 10_000_000 + b, args.batch, args.seq_len,
                                       args.max_answer_tokens)
        x, y, d = (t.to(args.device) for t in (x, y, d))
        pos = torch.arange(x.shape[1], device=args.device)
        logits = model(x, pos, causal_doc_mask(d))
        nll = F.cross_entropy(logits.transpose(1, 2), y, reduction="none")
        hit = logits.argmax(-1) == y
        for row, s, e, task in spans:
            st = stats[task]
            st[0] += nll[row, s:e].sum().item()
            st[1] += e - s
            st[2] += int(hit[row, s:e].all().item())
            st[3] += 1
    model.train()
    return {t: {"loss": round(v[0] / max(1, v[1]), 4), "exact": f"{v[2]}/{v[3]}"}
            for t, v in stats.items() if v[3]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="train/out/ckpt.pt", help="checkpoint path (resumed from)")
    ap.add_argument("--preset", default="full", choices=sorted(PRESETS))
    ap.add_argument("--steps", type=int)
    ap.add_argument("--batch", type=int)
    ap.add_argument("--seq-len", type=int)
    ap.add_argument("--lr", type=float)
    ap.add_argument("--warmup", type=int)
    ap.add_argument("--dim", type=int)
    ap.add_argument("--n-layers", type=int)
    ap.add_argument("--n-heads", type=int)
    ap.add_argument("--n-kv-heads", type=int)
    ap.add_argument("--ffn-dim", type=int)
    ap.add_argument("--vocab-size", type=int, default=1024)
    ap.add_argument("--max-answer-tokens", type=int, default=None,
                    help="cap on counting answers (default: seq_len - 130)")
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=1234,
                    help="seeds the tokenizer, the initial weights and (by default) the data")
    ap.add_argument("--data-seed", type=int,
                    help="seeds the training data stream instead of --seed (a fine-tuning stage "
                         "keeps the tokenizer's seed but must not replay the earlier stream)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ckpt-minutes", type=float, default=5.0)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--log-every", type=int, default=1)
    ap.add_argument("--profile", action="store_true", help="print an operator profile of 2 steps")
    ap.add_argument("--no-resume", action="store_true")
    ap.add_argument("--init", help="start a fresh run from these weights (induction_check.py --save)")
    ap.add_argument("--aux-layer", type=int,
                    help="train with the auxiliary digit probe on the output of this layer "
                         "(aux_loss; counting examples only)")
    ap.add_argument("--aux-weight", type=float, help="weight of the digit probe's loss (0.3)")
    ap.add_argument("--bf16", action="store_true",
                    help="forward and backward matmuls in bfloat16 (autocast; weights, optimizer "
                         "and loss stay f32)")
    ap.add_argument("--device", default="cpu",
                    help="where the model trains: cpu (the recipe's) or cuda (a GPU; the data is "
                         "still drawn on the CPU, so the same seed gives the same examples)")
    ap.add_argument("--keep-at", type=lambda v: tuple(int(x) for x in v.split(",") if x),
                    help="comma-separated steps at which to also write the weights as f16 "
                         "(slim.py) to OUT-stepN.pt, for a mean of the last checkpoints")
    args = ap.parse_args()
    preset = PRESETS[args.preset]
    for k, v in preset.items():
        if getattr(args, k, None) is None:
            setattr(args, k, v)
    if args.max_answer_tokens is None:
        args.max_answer_tokens = args.seq_len - 130

    data_seed = args.seed if args.data_seed is None else args.data_seed
    torch.set_num_threads(args.threads)
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)

    ckpt = None
    if os.path.exists(args.out) and not args.no_resume:
        ckpt = torch.load(args.out, map_location="cpu")
        print(f"resuming from {args.out} at step {ckpt['step']}", flush=True)
        tok = Tokenizer.from_json(ckpt["tokenizer"])
        cfg = Config(**ckpt["config"])
    else:
        tok = build_default(args.seed, args.vocab_size)
        cfg = Config(vocab_size=len(tok), dim=args.dim, n_layers=args.n_layers,
                     n_heads=args.n_heads, n_kv_heads=args.n_kv_heads, ffn_dim=args.ffn_dim)
    model = Transformer(cfg)
    if ckpt is None and args.init:
        init = torch.load(args.init, map_location="cpu")
        if init["config"] != cfg.to_dict():
            sys.exit(f"--init {args.init}: config {init['config']} differs from {cfg.to_dict()}")
        model.load_state_dict({k: v.float() for k, v in init["model"].items()})
        print(f"initialised from {args.init}", flush=True)
    model.to(args.device)
    opt = adamw(model, args.lr, args.weight_decay)
    aux_head = None
    captured = {}
    if args.aux_layer is not None:
        if args.aux_weight is None:
            args.aux_weight = 0.3
        aux_head = torch.nn.Linear(cfg.dim, 4 * 11).to(args.device)
        # the probe starts random: a ten times larger step lets it fit what the residual stream
        # already holds within a few steps, so its gradient into the model soon asks only for
        # what is missing
        opt.add_param_group({"params": list(aux_head.parameters()), "weight_decay": 0.0,
                             "lr_mult": 10.0})
        model.layers[args.aux_layer].register_forward_hook(
            lambda mod, inp, out: captured.__setitem__("x", out))
        if ckpt is None and args.init and init.get("aux_head") is not None:
            # going on from a run with the probe: keep it, so the model is not pulled toward a
            # random read while the probe refits
            aux_head.load_state_dict({k: v.float() for k, v in init["aux_head"].items()})
    step = 0
    history = []
    phase_starts = [0]  # the step at which each phase so far began
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["opt"])
        step = ckpt["step"]
        history = ckpt.get("history", [])
        phase_starts = ckpt.get("phase_starts", [0])
        if aux_head is not None and "aux_head" in ckpt:
            aux_head.load_state_dict(ckpt["aux_head"])
    normal_ids = [i for i in range(len(tok)) if tok.types[i] == 1]
    print(f"config {json.dumps(cfg.to_dict())} params {model.n_params():,} "
          f"batch {args.batch}x{args.seq_len} steps {args.steps} lr {args.lr} "
          f"threads {torch.get_num_threads()}", flush=True)

    last_ckpt = time.time()
    t_start = time.time()
    tokens_done = 0
    sums = {"data": 0.0, "fwd": 0.0, "bwd": 0.0, "opt": 0.0}
    n_timed = 0
    decay_phase = preset.get("decay_phase", len(preset["phases"]) - 1)
    while step < args.steps:
        phase_starts = next_phase_starts(preset["phases"], phase_starts, step, history)
        phase = preset["phases"][len(phase_starts) - 1]
        decay_from = phase_starts[decay_phase] if len(phase_starts) > decay_phase else None
        lr = lr_at(step, args.steps, args.lr, args.warmup, decay_from)
        for g in opt.param_groups:
            g["lr"] = lr * g.get("lr_mult", 1.0)
        t0 = time.time()
        if step == phase_starts[-1]:
            print(f"phase {len(phase_starts) - 1} from step {step}", flush=True)
        if "repeat_rows" in phase:
            parts = make_repeat_rows(random.Random((data_seed * 1_000_003 + step) * 7 + 3),
                                     *phase["repeat_rows"], normal_ids)
        else:
            parts = make_bucketed_batch(tok, data_seed * 1_000_003 + step,
                                        preset["bucket_tokens"], phase["buckets"],
                                        phase["max_answer_tokens"], phase["mix"],
                                        phase["short_frac"], phase["repeat"], normal_ids,
                                        phase.get("repeat_weight", 1.0),
                                        phase.get("count_boost", 1.0),
                                        phase.get("count_short", 0.0),
                                        phase.get("json_style", "quoted"),
                                        phase.get("count_near", False),
                                        phase.get("short_tasks", ("needle", "copy", "lookup")),
                                        phase.get("repeat_digits", 0.0),
                                        phase.get("count_down", 0.20),
                                        phase.get("count_trap", 0.0),
                                        phase.get("count_hops", 0.0),
                                        phase.get("count_newline", False),
                                        aux=aux_head is not None,
                                        multi_turn=phase.get("multi_turn", 0.0),
                                        json_rows=phase.get("json_rows", 0.25),
                                        copy_near=phase.get("copy_near", 0.0),
                                        struct_boost=phase.get("struct_boost", 1.0),
                                        struct_keys=phase.get("struct_keys", False),
                                        chat_counts=phase.get("chat_counts", 0.0),
                                        json_wide=phase.get("json_wide", False),
                                        count_suffix=phase.get("count_suffix", 0.0),
                                        rows_alike=phase.get("rows_alike", 0.0),
                                        think=phase.get("think", 0.0))
        t1 = time.time()
        prof = None
        if args.profile and step < 2 + (ckpt["step"] if ckpt else 0):
            prof = torch.autograd.profiler.profile()
            prof.__enter__()
        weight_sum = sum(p[2].sum() for p in parts).clamp(min=1)
        loss = 0.0
        ntok = 0
        aux_sums, aux_ns, aux_means = [0.0, 0.0], [0, 0], None
        for x, y, w, d, *rest in parts:
            x, y, w, d = (t.to(args.device) for t in (x, y, w, d))
            with torch.autocast(args.device, dtype=torch.bfloat16, enabled=args.bf16):
                logits = model(x, torch.arange(x.shape[1], device=args.device),
                               causal_doc_mask(d))
            nll = F.cross_entropy(logits.float().reshape(-1, cfg.vocab_size), y.reshape(-1),
                                  reduction="none")
            loss = loss + (nll * w.reshape(-1)).sum() / weight_sum
            if aux_head is not None and len(rest) == 2:
                for k, (s, n) in enumerate(aux_loss(aux_head, captured["x"], rest[1])):
                    aux_sums[k], aux_ns[k] = aux_sums[k] + s, aux_ns[k] + n
            ntok += x.numel()
        aux_n = aux_ns[0] + aux_ns[1]
        if aux_n:
            # the prompt's places (B, where the stop looks) count as much as the answer's
            aux_means = [s / max(1, n) for s, n in zip(aux_sums, aux_ns)]
            loss = loss + args.aux_weight * (aux_means[0] + aux_means[1])
        t2 = time.time()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        t3 = time.time()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        t4 = time.time()
        if prof is not None:
            prof.__exit__(None, None, None)
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25),
                  flush=True)
        step += 1
        tokens_done += ntok
        for k, v in zip(sums, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
            sums[k] += v
        n_timed += 1
        if step % args.log_every == 0:
            dt = t4 - t0
            print(f"step {step}/{args.steps} loss {loss.item():.4f} lr {lr:.2e} "
                  f"{ntok / dt:.0f} tok/s step {dt:.2f}s (data {t1 - t0:.2f} fwd {t2 - t1:.2f} "
                  f"bwd {t3 - t2:.2f} opt {t4 - t3:.2f}) elapsed {time.time() - t_start:.0f}s"
                  + (f" aux prompt {float(aux_means[0]):.4f} answer {float(aux_means[1]):.4f}"
                     if aux_n else ""), flush=True)
        history.append((step, round(loss.item(), 4)))
        if step in (args.keep_at or ()):
            kept = f"{os.path.splitext(args.out)[0]}-step{step}.pt"
            torch.save(slim_checkpoint(weights_state(model, step, cfg, args, tok, aux_head),
                                       f"{args.preset} at step {step}"), kept)
            print(f"kept {kept}", flush=True)
        if step % args.eval_every == 0 or step == args.steps:
            ev = evaluate(model, tok, args)
            print(f"eval step {step} {json.dumps(ev)}", flush=True)
        if time.time() - last_ckpt > args.ckpt_minutes * 60 or step == args.steps:
            save_checkpoint(args.out, model, opt, step, cfg, args, tok, history, phase_starts,
                            aux_head)
            last_ckpt = time.time()
            print(f"checkpoint {args.out} step {step}", flush=True)
    if n_timed:
        avg = {k: round(v / n_timed, 3) for k, v in sums.items()}
        print(f"mean step time split (s): {json.dumps(avg)}", flush=True)


if __name__ == "__main__":
    main()
