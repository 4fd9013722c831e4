"""Does a model of this shape learn content look-up (induction heads) at a given learning rate?

    /usr/bin/python3 train/induction_check.py --lr 1e-3 --steps 2000 [--layers 4] [--wd 0.1]

Trains a fresh model (the shipped model's shape unless overridden) on "repeat" sequences only:
BOS, a run of 8..48 random tokens, the same run again, loss on the second run. The run length
varies, so a fixed-offset head cannot solve it; only look-up of the previous occurrence can.
Prints the loss on the second run every 100 steps (chance: ln(vocab - 5)). One thread, 16 rows of
97 tokens per step, about half a second per step here.
"""

import argparse
import os
import random
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import Config, Transformer, causal_doc_mask  # noqa: E402
from train import adamw, make_repeat_rows  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--wd", type=float, default=0.1)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4, help="query heads")
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--ffn", type=int, default=0, help="feed-forward width (default 2 x dim)")
    ap.add_argument("--vocab", type=int, default=1024)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--save", help="write the trained weights here (train.py --init reads them)")
    ap.add_argument("--min-run", type=int, default=8)
    ap.add_argument("--max-run", type=int, default=48)
    ap.add_argument("--bf16", action="store_true",
                    help="matmuls in bfloat16 (autocast; weights and optimizer stay f32)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    cfg = Config(vocab_size=args.vocab, dim=args.dim, n_layers=args.layers, n_heads=args.heads,
                 n_kv_heads=args.kv_heads, ffn_dim=args.ffn or 2 * args.dim)
    model = Transformer(cfg)
    opt = adamw(model, args.lr, args.wd)
    rows, width = 16, 2 * args.max_run + 1
    t0 = time.time()
    for step in range(args.steps):
        (inputs, targets, w, docs, _), = make_repeat_rows(rng, rows, width,
                                                          range(5, args.vocab), args.min_run)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
            logits = model(inputs, torch.arange(width - 1), causal_doc_mask(docs))
        nll = F.cross_entropy(logits.float().transpose(1, 2), targets, reduction="none")
        loss = (nll * w).sum() / w.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if (step + 1) % 100 == 0:
            print(f"step {step + 1} repeat loss {loss.item():.2f} ({time.time() - t0:.0f} s)",
                  flush=True)
    if args.save:
        torch.save({"model": model.state_dict(), "config": cfg.to_dict()}, args.save)
        print(f"saved {args.save}", flush=True)


if __name__ == "__main__":
    main()
