"""Check an exported GGUF against its checkpoint with the lamina binary.

    /usr/bin/python3 train/check_export.py CKPT GGUF [--lamina build/release/lamina]

1. Tokenizer: `lamina run --json` prompt ids must equal train/tokenizer.py's ids (BOS added,
   special tokens parsed) on every sample text, including ChatML turns, digits, JSON and
   non-ASCII text that takes the byte fallback.
2. Forward pass: `lamina score --kv f32 --save-logits` over a ChatML text must match the PyTorch
   model's logits (weights rounded to f16 as exported): reports the max |difference| relative to
   the logit range and the top-1 agreement; a wrong RoPE layout or tensor mapping shows up as a
   large difference.
Exit status 0 when both agree.
"""

import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from data import Generator, render_chat  # noqa: E402
from model import Config, Transformer, sequence_logits  # noqa: E402
from tokenizer import for_checkpoint  # noqa: E402

SAMPLES = [
    "Hello world",
    render_chat("Count from 98 to 102, one number per line."),
    render_chat("Count from 1 to 5, one number per line.", "1\n2\n3\n4\n5"),
    '{"name": "Alice", "age": 34, "active": true, "note": null}',
    "The secret code is 48213.  Two  spaces, tabs\tand\nnewlines\n\n",
    "caf\u00e9 na\u00efve \u2603 \u65e5\u672c",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n",
    "alpha-734: 12345\nkey9: red-7\n",
    "",
]


def lamina_ids(lamina, gguf, text):
    r = subprocess.run([lamina, "run", "-m", gguf, "-p", text, "-n", "1", "--temp", "0",
                        "--json"], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"lamina run failed: {r.stderr}")
    return json.loads(r.stdout)["prompt_tokens"]


def read_logits(path):
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"LMNLOGIT", f"{path}: not a lamina logits file"
    _, n_vocab, n = struct.unpack_from("<IIQ", data, 8)
    toks = np.frombuffer(data, dtype="<i4", count=n, offset=24)
    logits = np.frombuffer(data, dtype="<f4", count=n * n_vocab, offset=24 + 4 * n)
    return toks, logits.reshape(n, n_vocab)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("checkpoint")
    ap.add_argument("gguf")
    ap.add_argument("--lamina", default="build/release/lamina")
    args = ap.parse_args()
    ck = torch.load(args.checkpoint, map_location="cpu")
    tok = for_checkpoint(ck)
    ok = True

    gen = Generator(77)
    samples = SAMPLES + [render_chat(*gen.example(t)[1:]) for t in
                         ["count", "needle", "copy", "lookup", "json", "prose"]]
    n_same = 0
    for s in samples:
        if not s:
            continue  # lamina run refuses an empty prompt without an explicit -p ""
        a = tok.encode(s, add_bos=True, parse_special=True)
        b = lamina_ids(args.lamina, args.gguf, s)
        if a == b:
            n_same += 1
        else:
            ok = False
            i = next((k for k in range(min(len(a), len(b))) if a[k] != b[k]), min(len(a), len(b)))
            print(f"TOKENIZER MISMATCH on {s[:60]!r}: first difference at {i}: "
                  f"python {a[i:i + 5]} lamina {b[i:i + 5]}")
    print(f"tokenizer: {n_same}/{sum(1 for s in samples if s)} samples identical")

    # forward pass
    cfg = Config(**ck["config"])
    model = Transformer(cfg)
    sd = {k: (v.half().float() if v.dim() >= 2 else v) for k, v in ck["model"].items()}
    model.load_state_dict(sd)
    model.eval()
    text = render_chat(*Generator(5).example("count")[1:])[:600]
    with tempfile.TemporaryDirectory() as d:
        tf = os.path.join(d, "t.txt")
        lf = os.path.join(d, "l.bin")
        with open(tf, "w") as f:
            f.write(text)
        r = subprocess.run([args.lamina, "score", "-m", args.gguf, "-f", tf, "--kv", "f32",
                            "--save-logits", lf], capture_output=True, text=True)
        if r.returncode != 0:
            print(f"lamina score failed: {r.stderr}")
            return 1
        ltoks, llog = read_logits(lf)
    ref = sequence_logits(model, list(ltoks)).numpy()
    n = min(len(ref), len(llog))
    diff = np.abs(ref[:n] - llog[:n]).max()
    spread = ref[:n].max() - ref[:n].min()
    top1 = (ref[:n].argmax(-1) == llog[:n].argmax(-1)).mean()
    print(f"forward: {n} positions, max |logit diff| {diff:.4g} (logit range {spread:.4g}), "
          f"top-1 agreement {top1:.4f}")
    if diff > 0.02 * max(1.0, spread) or top1 < 0.98:
        ok = False
        print("FORWARD MISMATCH")
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
