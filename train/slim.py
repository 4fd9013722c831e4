"""Keep a training checkpoint's weights small enough to commit: the model (and the digit probe,
when the run had one) as f16, with its config, step, tokenizer and a note; no optimizer state.
`train.py --init` and `grow.py` accept the result.

    /usr/bin/python3 train/slim.py train/out/growmix.pt train/checkpoints/growmix.pt --note "..."
"""

import argparse

import torch


def slim_checkpoint(ck, note):
    """The parts of checkpoint ck worth keeping: model (and digit probe) weights as f16, config,
    step, tokenizer and args, with a note; no optimizer state."""
    slim = {"model": {k: v.half() for k, v in ck["model"].items()}, "config": ck["config"],
            "step": ck.get("step", 0), "note": note}
    for key in ("tokenizer", "args"):
        if key in ck:
            slim[key] = ck[key]
    if ck.get("aux_head") is not None:
        slim["aux_head"] = {k: v.half() for k, v in ck["aux_head"].items()}
    return slim


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("ckpt")
    ap.add_argument("out")
    ap.add_argument("--note", default="")
    args = ap.parse_args()
    slim = slim_checkpoint(torch.load(args.ckpt, map_location="cpu"), args.note)
    torch.save(slim, args.out)
    print(f"{args.out}: step {slim['step']}, {len(slim['model'])} tensors")


if __name__ == "__main__":
    main()
