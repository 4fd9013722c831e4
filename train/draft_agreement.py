"""How often a draft model's greedy next token is the target's, per task, on held-out prompts.

    /usr/bin/python3 train/draft_agreement.py --draft models/lamina-counter-draft.gguf
        [--target models/lamina-counter.gguf] [--lamina build/release/lamina] [--json OUT]

The target writes its greedy answer to each prompt through the lamina binary (`lamina run
--chat --temp 0`, f16 KV); the draft, read from its GGUF (gguf_model.py, the exported f16
weights), is then teacher-forced on the prompt and that answer, and a position agrees when the
draft's argmax is the target's next token (its end of turn included). In greedy speculative
decoding the draft is always conditioned on tokens the target accepted, i.e. on the target's own
greedy output, so these hits decide acceptance exactly: the script also replays them as
speculation with K drafted tokens per target step and prints the answer tokens per target
forward pass (1 = no gain; at most K + 1).

Held-out prompts (seed --seed, which no training stream uses): count ("Count from 1 to 300, one
number per line." and random ranges within 1..1000, as eval_model.py draws them), JSON, copy
(data.py's lists), prose, and needle and lookup (data.py's).
"""

import argparse
import json
import os
import random
import subprocess
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from data import Generator, PROMPTS  # noqa: E402
from gguf_model import load_gguf_model, read_gguf  # noqa: E402
from model import sequence_logits  # noqa: E402
from tokenizer import IM_END  # noqa: E402


def items(seed, n):
    """{task: [(prompt, n_predict)]}: n held-out prompts per task (count: 1..300 and n - 1
    ranges)."""
    rng = random.Random(seed)
    count = [(PROMPTS["count"].format(a=1, b=300), 1220)]
    while len(count) < n:
        a = rng.randint(1, 999)
        b = rng.randint(a + 1, 1000)
        tokens = len("\n".join(str(x) for x in range(a, b + 1))) + 1
        if tokens <= 1100:
            count.append((PROMPTS["count"].format(a=a, b=b), tokens + 16))
    out = {"count": count}
    for k, (task, n_predict) in enumerate([("json", 400), ("copy", 700), ("prose", 500),
                                           ("needle", 40), ("lookup", 40)]):
        g = Generator(seed + 1000 * (k + 1))
        out[task] = [(g.example(task)[1], n_predict) for _ in range(n)]
    return out


def target_answer(args, prompt, n_predict):
    """(prompt ids, greedy answer ids with the end of turn when the target ended it)."""
    r = subprocess.run([args.lamina, "run", "--chat", "-m", args.target, "-p", prompt, "-n",
                        str(n_predict), "--temp", "0", "--kv", "f16", "--json", "-t",
                        str(args.threads)], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"lamina run failed: {r.stderr[-300:]}")
    out = json.loads(r.stdout)
    answer = list(out["generated_tokens"])
    if len(answer) < n_predict:
        answer.append(IM_END)
    return list(out["prompt_tokens"]), answer


def accepted_per_step(hits, k):
    """Answer tokens per target forward pass when the draft proposes k tokens each step and the
    target keeps the agreeing prefix plus its own next token."""
    i = steps = 0
    while i < len(hits):
        run = 0
        while run < k and i + run < len(hits) and hits[i + run]:
            run += 1
        i += run + 1
        steps += 1
    return len(hits) / max(1, steps)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--draft", default="models/lamina-counter-draft.gguf")
    ap.add_argument("--target", default="models/lamina-counter.gguf")
    ap.add_argument("--lamina", default="build/release/lamina")
    ap.add_argument("--seed", type=int, default=515_151, help="held-out draw")
    ap.add_argument("--n", type=int, default=20, help="prompts per task")
    ap.add_argument("--k", type=lambda v: [int(x) for x in v.split(",")], default=[2, 4, 8],
                    help="drafted tokens per step for the replay")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", help="write the per-task figures here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    draft, _, draft_meta = load_gguf_model(args.draft)
    target_meta, _ = read_gguf(args.target)
    keys = sorted(k for k in set(draft_meta) | set(target_meta) if k.startswith("tokenizer."))
    differ = [k for k in keys if draft_meta.get(k) != target_meta.get(k)]
    print(f"tokenizer metadata: {len(keys) - len(differ)}/{len(keys)} keys identical"
          + (f"; DIFFERENT: {differ}" if differ else ""), flush=True)
    result = {}
    all_hits = []
    for task, prompts in items(args.seed, args.n).items():
        hits_per_prompt = []
        for prompt, n_predict in prompts:
            p, a = target_answer(args, prompt, n_predict)
            ids = p + a
            pred = sequence_logits(draft, ids[:-1]).argmax(-1)[len(p) - 1:]
            hits_per_prompt.append([int(x) == y for x, y in zip(pred.tolist(), a)])
        hits = [h for hs in hits_per_prompt for h in hs]
        all_hits += hits_per_prompt
        result[task] = {"prompts": len(prompts), "tokens": len(hits),
                        "agree": round(sum(hits) / len(hits), 4),
                        **{f"tokens_per_step_k{k}": round(
                            sum(len(h) for h in hits_per_prompt)
                            / sum(len(h) / accepted_per_step(h, k) for h in hits_per_prompt), 3)
                           for k in args.k}}
        print(f"{task:7s} {json.dumps(result[task])}", flush=True)
    flat = [h for hs in all_hits for h in hs]
    result["all"] = {"tokens": len(flat), "agree": round(sum(flat) / len(flat), 4)}
    print(f"all     {json.dumps(result['all'])}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"draft": args.draft, "target": args.target, "seed": args.seed,
                       "tasks": result}, f, indent=1)


if __name__ == "__main__":
    main()
