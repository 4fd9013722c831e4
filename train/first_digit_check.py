"""Does a checkpoint read the start number from a counting prompt? Prints, for a few ranges, the
model's top three guesses (with probabilities) for the first answer token of
"Count from A to B, one number per line." -- the first digit of A.

    /usr/bin/python3 train/first_digit_check.py CKPT [CKPT...]

A model that has learned the look-up puts nearly all the mass on A's first digit; one that
guesses spreads it over digits (train/README.md, stage 3). Works on train.py checkpoints and
on the f16 weights in train/checkpoints/.
"""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from data import PROMPTS, render_chat  # noqa: E402
from model import load_eval_model, sequence_logits  # noqa: E402
from tokenizer import build_default  # noqa: E402

RANGES = [(350, 558), (587, 612), (1, 300), (40, 47), (207, 367), (878, 896)]


def main():
    torch.set_num_threads(1)
    tok = build_default(1234, 1024)
    for path in sys.argv[1:]:
        model = load_eval_model(path)
        print(path)
        for a, b in RANGES:
            ids = tok.encode(render_chat(PROMPTS["count"].format(a=a, b=b)), add_bos=True)
            logits = sequence_logits(model, ids)
            top = torch.topk(torch.softmax(logits[-1], -1), 3)
            guesses = ", ".join(f"{tok.decode([int(i)])!r} {float(p):.2f}"
                                for p, i in zip(top.values, top.indices))
            print(f"  {a} -> {b}: {guesses}")


if __name__ == "__main__":
    main()
