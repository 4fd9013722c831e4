"""Where does a checkpoint's counting stop, and can it look up digit strings? Teacher-forced, for
a few ranges of "Count from A to B, one number per line.":

  - the probability of ending the turn after B (should be ~1) and after every earlier number whose
    end-of-turn probability is above 5 % (should be none; the usual offenders are the "traps",
    numbers that end in B's last digits: 534 when B is 634, 100 and 200 when B is 300);
  - the loss on repeats of random digit strings (BOS, a run of 12..120 digits and newlines, the run
    again; nats per token of the second run, chance 2.40): over eleven symbols only a look-up keyed
    on the last two or three tokens copies, the look-up the stop needs.

    /usr/bin/python3 train/count_check.py [--newline] CKPT [CKPT...]

--newline: the checkpoint was trained with a newline before the end of turn (train.py's
count_newline), so the stop is read after the newline that follows each number.

Works on train.py checkpoints and on the f16 weights in train/checkpoints/ (train/README.md,
stages 7-10).
"""

import os
import random
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from data import PROMPTS, render_chat  # noqa: E402
from model import load_eval_model, sequence_logits  # noqa: E402
from tokenizer import BOS, IM_END, build_default  # noqa: E402

RANGES = [(517, 634), (1, 300), (207, 367), (558, 791), (350, 558), (832, 994), (1, 40)]


def log_probs(model, ids):
    """[len(ids), vocab] log-probabilities of the next token at each position."""
    return torch.log_softmax(sequence_logits(model, ids), -1)


def main():
    torch.set_num_threads(1)
    tok = build_default(1234, 1024)
    digit_ids = tok.encode("0123456789\n", add_bos=False)
    newline = "--newline" in sys.argv[1:]
    for path in [a for a in sys.argv[1:] if a != "--newline"]:
        model = load_eval_model(path)
        print(path)
        for a, b in RANGES:
            head = tok.encode(render_chat(PROMPTS["count"].format(a=a, b=b)), add_bos=True)
            answer = "\n".join(str(i) for i in range(a, b + 1))
            lp = log_probs(model, head + tok.encode(answer + "\n" * newline, add_bos=False)
                           + [IM_END])
            pos = len(head)
            early = []
            p_at_b = 0.0
            for line in answer.split("\n"):
                pos += len(line)  # one token per digit: pos is now the newline's position
                p_end = float(lp[pos - 1 + newline, IM_END].exp())
                if line == str(b):
                    p_at_b = p_end
                elif p_end > 0.05:
                    early.append(f"{line} {p_end:.2f}")
                pos += 1
            # the five strongest earlier ends (a young checkpoint ends everywhere a little)
            early.sort(key=lambda e: -float(e.split()[1]))
            more = f" (+{len(early) - 5} more)" if len(early) > 5 else ""
            print(f"  {a} -> {b}: end after B {p_at_b:.2f}; "
                  f"earlier ends: {', '.join(early[:5]) + more if early else 'none'}")
        rng = random.Random(5)
        total, count = 0.0, 0
        for _ in range(8):
            run = [rng.choice(digit_ids) for _ in range(rng.randint(12, 120))]
            ids = [BOS] + run + run
            lp = log_probs(model, ids)
            for t in range(len(run) + 1, len(ids) - 1):
                total -= float(lp[t, ids[t + 1]])
                count += 1
        print(f"  digit-string repeats: {total / count:.3f} nats/token (chance 2.40)")


if __name__ == "__main__":
    main()
