"""Does the residual stream hold all of B's digits where the stop looks? For a checkpoint trained
with the auxiliary digit probe (train.py --aux-layer, aux_loss): the probe's accuracy per place
(thousands, hundreds, tens, units) on the output of its layer at B's last digit and at the comma
after it, over prompts
"Count from A to B, one number per line." with B drawn from 100..999 (the hundreds digit is what
tells 534 from 634).

    /usr/bin/python3 train/aux_check.py CKPT [N]        # N prompts (default 300)
"""

import os
import random
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from data import PROMPTS, render_chat  # noqa: E402
from model import load_eval_model, sequence_logits  # noqa: E402
from tokenizer import build_default  # noqa: E402
from train import digit_slots  # noqa: E402


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    path = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 300
    torch.set_num_threads(1)
    ck = torch.load(path, map_location="cpu")
    if "aux_head" not in ck:
        sys.exit(f"{path}: no digit probe in this checkpoint (train.py --aux-layer)")
    layer = ck["args"]["aux_layer"]
    head = torch.nn.Linear(ck["config"]["dim"], 44)
    head.load_state_dict(ck["aux_head"])
    model = load_eval_model(path)
    captured = {}
    model.layers[layer].register_forward_hook(lambda m, i, o: captured.__setitem__("x", o))
    tok = build_default(1234, 1024)
    rng = random.Random(11)
    hits = {"last digit": [0, 0, 0, 0], "comma": [0, 0, 0, 0]}
    for _ in range(n):
        b = rng.randint(100, 999)
        a = rng.randint(1, b - 1)
        ids = tok.encode(render_chat(PROMPTS["count"].format(a=a, b=b)), add_bos=True)
        pieces = [tok.decode([i]) for i in ids]
        comma = next(i for i in range(1, len(ids)) if pieces[i] == "," and pieces[i - 1].isdigit())
        sequence_logits(model, ids)
        for where, pos in (("last digit", comma - 1), ("comma", comma)):
            h = captured["x"][0, pos]
            h = h * torch.rsqrt(h.pow(2).mean() + 1e-5)
            with torch.no_grad():
                pred = head(h).view(4, 11).argmax(-1).tolist()
            for k, (p, t) in enumerate(zip(pred, digit_slots(b))):
                hits[where][k] += p == t
    names = ["thousands", "hundreds", "tens", "units"]
    print(f"{path}: probe on layer {layer}'s output, {n} prompts")
    for where, counts in hits.items():
        print(f"  at B's {where}: " if where != "comma" else "  at the comma after B: ",
              ", ".join(f"{name} {h / n:.2f}" for name, h in zip(names, counts)))


if __name__ == "__main__":
    main()
