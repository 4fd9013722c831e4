"""Average the weights of several checkpoints of one model (a uniform "model soup"): fine-tuning
stages from the same parent land near each other, and their mean often makes fewer of the
one-token slips (a neighbour row's value, a skipped field) than any of them. Writes a slim
checkpoint (f16 weights, as slim.py) that export_gguf.py and `train.py --init` accept.

    /usr/bin/python3 train/soup.py A.pt B.pt [C.pt ...] -o SOUP.pt [--weights 1,1,2]
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from slim import slim_checkpoint  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("ckpts", nargs="+")
    ap.add_argument("-o", "--out", required=True)
    ap.add_argument("--weights", default="", help="comma-separated, one per checkpoint")
    ap.add_argument("--note", default="")
    args = ap.parse_args()
    weights = [float(w) for w in args.weights.split(",")] if args.weights else \
        [1.0] * len(args.ckpts)
    if len(weights) != len(args.ckpts) or min(weights) < 0 or sum(weights) <= 0:
        raise SystemExit("soup.py: --weights needs one non-negative weight per checkpoint")
    total = sum(weights)
    first = None
    sums = {}
    aux_sums = {}
    for path, w in zip(args.ckpts, weights):
        ck = torch.load(path, map_location="cpu")
        if first is None:
            first = ck
        elif ck["config"] != first["config"]:
            raise SystemExit(f"soup.py: {path} has another shape than {args.ckpts[0]}")
        for key, into in (("model", sums), ("aux_head", aux_sums)):
            for name, t in (ck.get(key) or {}).items():
                into[name] = into.get(name, 0) + t.float() * (w / total)
    mean = dict(first, model=sums, aux_head=aux_sums or None)
    torch.save(slim_checkpoint(mean, args.note or "mean of " + ", ".join(args.ckpts)), args.out)
    print(f"{args.out}: mean of {len(args.ckpts)} checkpoints, {len(sums)} tensors")


if __name__ == "__main__":
    main()
