"""Deepen a checkpoint without changing what it computes: new transformer blocks are inserted
whose output projections (attention wo, FFN w2) are zero, so each starts as the identity on the
residual stream and the grown model gives the same logits as the original. Fine-tuning then
has extra layers to compose features with (train/README.md, stage 13: the stop at B needs the
current number's leading digit and B's, which the four-layer model never brought together).

    /usr/bin/python3 train/grow.py CKPT --after 1,3 --out train/out/grown.pt
    /usr/bin/python3 train/train.py --preset P --init train/out/grown.pt ...   # P with that depth

--after lists original layer indices; a new block goes after each. The new blocks' other
weights are drawn as train.py's model initialises them (seeded by --seed). --attn-from L starts
the new blocks' attention (its norm and the q, k, v projections; wo stays zero) as a copy of
original layer L's, so their heads already attend where layer L's do (stage 21: a previous-token
read one layer later, which carries what layer L gathered at the token before).
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import Config, Transformer  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("ckpt")
    ap.add_argument("--after", required=True, help="comma-separated layer indices")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--attn-from", type=int, help="copy the new blocks' attention q/k/v (and "
                    "its norm) from this original layer")
    args = ap.parse_args()
    src = torch.load(args.ckpt, map_location="cpu")
    cfg = dict(src["config"])
    after = sorted(int(x) for x in args.after.split(","))
    if any(i < 0 or i >= cfg["n_layers"] for i in after):
        sys.exit(f"--after {args.after}: layers are 0..{cfg['n_layers'] - 1}")
    old = {k: v.float() for k, v in src["model"].items()}
    cfg["n_layers"] += len(after)
    torch.manual_seed(args.seed)
    fresh = Transformer(Config(**cfg)).state_dict()  # weights for the new blocks
    # new layer index -> old layer index (None for an inserted block)
    order = []
    for i in range(src["config"]["n_layers"]):
        order.append(i)
        if i in after:
            order.append(None)
    grown = {k: v for k, v in old.items() if not k.startswith("layers.")}
    for new_i, old_i in enumerate(order):
        prefix = f"layers.{new_i}."
        for k, v in fresh.items():
            if not k.startswith(prefix):
                continue
            if old_i is not None:
                grown[k] = old[f"layers.{old_i}." + k[len(prefix):]]
            elif k.endswith("wo.weight") or k.endswith("w2.weight"):
                grown[k] = torch.zeros_like(v)
            elif args.attn_from is not None and (".attn." in k or "attn_norm" in k):
                grown[k] = old[f"layers.{args.attn_from}." + k[len(prefix):]].clone()
            else:
                grown[k] = v
    torch.save({"model": grown, "config": cfg}, args.out)
    print(f"{args.ckpt}: {src['config']['n_layers']} -> {cfg['n_layers']} layers "
          f"(new blocks after {after}), saved {args.out}")


if __name__ == "__main__":
    main()
