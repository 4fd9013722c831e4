"""Which tokens does each attention head read where the counting stop is decided? Teacher-forced
"Count from A to B, one number per line.": for each number given, the top three positions every
head attends to from that number's last digit (where the end of turn is predicted), and the
same from the comma after B in the prompt (where B's digits can be gathered for the stop's
look-up).

    /usr/bin/python3 train/stop_heads.py CKPT [A B N ...]     # default: 517 634 534 634 624

train/README.md (after stage 19): on stage 11's weights the layer-3 heads that pick the comma
after B are the stop; at the comma, layers 0-2 gather B's last two digits but not the leading
one, so 534 matches 634 there.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from data import PROMPTS, render_chat  # noqa: E402
from model import load_eval_model, sequence_logits  # noqa: E402
from tokenizer import IM_END, build_default  # noqa: E402


def main():
    path, *rest = sys.argv[1:] or [None]
    if path is None:
        sys.exit(__doc__)
    a, b, *numbers = [int(x) for x in rest] or [517, 634, 534, 634, 624]
    tok = build_default(1234, 1024)
    model = load_eval_model(path)
    cfg = model.cfg
    for layer in model.layers:
        layer.attn.keep_probs = True
    head = tok.encode(render_chat(PROMPTS["count"].format(a=a, b=b)), add_bos=True)
    lines = [str(i) for i in range(a, b + 1)]
    ids = head + tok.encode("\n".join(lines), add_bos=False) + [IM_END]
    sequence_logits(model, ids)
    n = len(ids)
    pieces = [tok.decode([i]).replace("\n", "\\n") for i in ids]
    comma = next(i for i in range(len(head)) if pieces[i] == "," and pieces[i - 1].isdigit())
    where = [(f"comma after B (position {comma})", comma)]
    pos = len(head)
    for line in lines:
        if int(line) in numbers:
            where.append((f"last digit of {line} (position {pos + len(line) - 1})",
                          pos + len(line) - 1))
        pos += len(line) + 1
    group = cfg.n_heads // cfg.n_kv_heads
    for title, q in where:
        print(f"== {title}")
        for li, layer in enumerate(model.layers):
            probs = layer.attn.probs.view(cfg.n_kv_heads, group, n, n)
            for h in range(cfg.n_heads):
                row = probs[h // group, h % group, q]
                top = row.topk(3)
                print(f"  L{li}H{h}: " + ", ".join(
                    f"{int(i)} {pieces[int(i)]!r} {'prompt' if i < len(head) else 'answer'} "
                    f"{float(v):.2f}" for v, i in zip(top.values, top.indices)))


if __name__ == "__main__":
    main()
