"""Measure the shipped model's bars through the lamina binary (greedy, one process per prompt).

    /usr/bin/python3 train/eval_model.py [--model models/lamina-counter.gguf] [--kv f16]
        [--quick] [--json OUT.json] [--lamina build/release/lamina]

Tasks (the prompts are data.py's canonical ones; every item is generated from a fixed seed that
training never uses, so the figures are reproducible and held out):

  count    "Count from 1 to 300, one number per line." must print exactly 1..300, one per line,
           then end the turn; plus 20 random ranges A < B within 1..1000 whose answers fit the
           trained answer length (at most 1,100 tokens, i.e. up to ~275 three-digit numbers).
  needle   one "The secret code is NNNNN." sentence at depths 10%..90% (9 depths) of a haystack of
           generated sentences, whole prompt about L tokens, then "What is the secret code?";
           a hit when the answer contains the code. L = 512 and 1,024 (the bars), 2,048 and
           4,096 (measured; with YaRN scaling of the trained 1,280-token context unless
           --no-yarn).
  json     objects, arrays and arrays of objects from given fields: a hit when the output parses
           and equals the requested value (all fields, all values).
  copy     lists of exactly 50 items: a hit when the output is the list, byte for byte.

--seeds 11-20 pools ten other draws (each its own 1..300, ranges, needles, JSON and copy items)
and judges the bars on the pooled rates: a check of a choice made on the recorded draw, whose
100 JSON prompts and 40 lists move by a few points from draw to draw.

Prints one line per task and, with --json, writes every prompt's outcome. Exit code 0 when every
bar is met, 1 otherwise.
"""

import argparse
import concurrent.futures as futures
import json
import os
import random
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from data import Generator, PROMPTS, THINK_CLOSE  # noqa: E402
from tokenizer import build_default  # noqa: E402

EVAL_SEED = 424_242  # never a training seed (those are seed * 1_000_003 + step)
TRAINED_CTX = 1280
THOUGHT_TOKENS = 64  # room for the plan with --reasoning on


def run_lamina(args, prompt, n_predict, extra=()):
    think = args.reasoning == "on"
    if think and "-c" in extra:  # the context holds the plan too
        extra = list(extra)
        extra[extra.index("-c") + 1] = str(int(extra[extra.index("-c") + 1]) + THOUGHT_TOKENS)
    cmd = [args.lamina, "run", "--chat", "-m", args.model, "-p", prompt,
           "-n", str(n_predict + (THOUGHT_TOKENS if think else 0)), "--temp", "0", "--kv", args.kv,
           "--json", "-t", str(args.threads), "--reasoning", args.reasoning, *extra]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        return {"error": out.stderr.strip()[-300:], "text": ""}
    result = json.loads(out.stdout)
    if think:
        # the answer is what follows the thought; no closed thought is a miss
        thought, closed, answer = result["text"].partition(THINK_CLOSE.strip())
        result["thought"] = thought.strip()
        result["text"] = answer.lstrip("\n") if closed else ""
    return result


def count_tokens(text):
    # one digit token per digit plus the newline, as the tokenizer splits numbers
    return len(text) + 1


def count_items(args, rng):
    items = [(1, 300)]
    while len(items) < 21:
        a = rng.randint(1, 999)
        b = rng.randint(a + 1, 1000)
        answer = "\n".join(str(x) for x in range(a, b + 1))
        if count_tokens(answer) <= 1100:
            items.append((a, b))
    if args.quick:
        items = items[:5]
    out = []
    for a, b in items:
        expected = "\n".join(str(x) for x in range(a, b + 1))
        prompt = PROMPTS["count"].format(a=a, b=b)
        out.append({"prompt": prompt, "expected": expected,
                    "n_predict": count_tokens(expected) + 16})
    return out


def needle_items(args, tok):
    lengths = [512, 1024] if args.quick else [512, 1024, 2048, 4096]
    if args.needle_lengths:
        lengths = [int(x) for x in args.needle_lengths.split(",")]
    depths = list(range(10, 100, 10))
    trials = 2 if args.quick else 6
    out = []
    for length in lengths:
        for depth in depths:
            for t in range(trials):
                g = Generator(args.seed + length * 1000 + depth * 10 + t)
                code = g.rng.randint(10000, 99999)
                question = PROMPTS["needle_question"]
                overhead = len(tok.encode(f"<|im_start|>user\n\n\n{question}<|im_end|>\n"
                                          "<|im_start|>assistant\n"))
                budget = length - 24 - overhead  # room for the answer
                sentences, n = [], 0
                while True:
                    s = g.sentence()
                    k = len(tok.encode(" " + s, add_bos=False))
                    if n + k > budget - 12:
                        break
                    sentences.append(s)
                    n += k
                at = round(len(sentences) * depth / 100)
                sentences.insert(at, f"The secret code is {code}.")
                prompt = " ".join(sentences) + "\n\n" + question
                extra = ["-c", str(length)]
                if length > TRAINED_CTX and args.yarn:
                    extra += ["--rope-scaling", "yarn", "--rope-scale",
                              f"{length / TRAINED_CTX:.4f}", "--yarn-orig-ctx", str(TRAINED_CTX)]
                out.append({"prompt": prompt, "expected": str(code), "length": length,
                            "depth": depth, "n_predict": 20, "extra": extra})
    return out


def json_items(args):
    g = Generator(args.seed + 7)
    n = 20 if args.quick else 100
    out = []
    for _ in range(n):
        prompt, answer = g.json_task()
        out.append({"prompt": prompt, "expected": answer, "n_predict": 400})
    return out


def copy_items(args):
    n = 8 if args.quick else 40
    out = []
    for k in range(n):
        g = Generator(args.seed + 100 + k)
        mixed = g.rng.random() < 0.3
        kind = g.rng.randrange(6)
        items = [g.item(g.rng.randrange(6) if mixed else kind) for _ in range(50)]
        body = "\n".join(items)
        out.append({"prompt": f"{PROMPTS['copy']}\n{body}", "expected": body,
                    "n_predict": 600})
    return out


def grade(task, item, result):
    text = result.get("text", "")
    if task == "count" or task == "copy":
        return text == item["expected"]
    if task == "needle":
        return item["expected"] in text
    try:
        return json.loads(text) == json.loads(item["expected"])
    except ValueError:
        return False


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=os.path.join(root, "models/lamina-counter.gguf"))
    ap.add_argument("--lamina", default=os.path.join(root, "build/release/lamina"))
    ap.add_argument("--kv", default="f16")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=2, help="lamina processes at once")
    ap.add_argument("--quick", action="store_true", help="fewer items (a progress check)")
    ap.add_argument("--tasks", default="count,needle,json,copy")
    ap.add_argument("--json", help="write every outcome here")
    ap.add_argument("--no-yarn", dest="yarn", action="store_false",
                    help="needles beyond the trained 1,280 tokens without YaRN scaling")
    ap.add_argument("--seed", type=int, default=EVAL_SEED,
                    help="another held-out draw of every task (default %(default)s, the "
                         "recorded figures), to check a choice made on the default one")
    ap.add_argument("--seeds", default=None,
                    help="FIRST-LAST: pool the draws of these seeds instead of one --seed")
    ap.add_argument("--reasoning", default="off", choices=["on", "off"],
                    help="on: every prompt with thinking on (the model's plan, then the answer, "
                         "graded on the answer)")
    ap.add_argument("--needle-lengths", default=None,
                    help="comma-separated prompt lengths (default 512,1024,2048,4096)")
    args = ap.parse_args()

    seeds = [args.seed]
    if args.seeds:
        try:
            first, last = (int(x) for x in args.seeds.split("-"))
        except ValueError:
            ap.error(f"--seeds wants FIRST-LAST, got {args.seeds!r}")
        if not 0 <= first <= last or last - first >= 1000:
            ap.error(f"--seeds {args.seeds}: want 0 <= FIRST <= LAST, at most 1,000 draws")
        seeds = list(range(first, last + 1))
    tok = build_default(1234, 1024)

    def draw_items(task, seed):
        """The items of one task in the draw of `seed`."""
        draw = argparse.Namespace(**dict(vars(args), seed=seed))
        if task == "count":
            return count_items(draw, random.Random(seed))
        if task == "needle":
            return needle_items(draw, tok)
        return {"json": json_items, "copy": copy_items}[task](draw)

    tasks = args.tasks.split(",")
    for task in tasks:
        if task not in ("count", "needle", "json", "copy"):
            ap.error(f"--tasks: unknown task {task!r} (count, needle, json, copy)")
    report = {"model": args.model, "kv": args.kv, "seeds": seeds, "tasks": {}}
    all_met = True
    for task in tasks:
        items = [it for seed in seeds for it in draw_items(task, seed)]
        t0 = time.time()
        with futures.ThreadPoolExecutor(args.jobs) as ex:
            results = list(ex.map(
                lambda it: run_lamina(args, it["prompt"], it["n_predict"], it.get("extra", ())),
                items))
        outcomes = []
        for it, res in zip(items, results):
            hit = grade(task, it, res)
            rec = {k: v for k, v in it.items() if k not in ("prompt", "extra")}
            prompt_ids = res.get("prompt_tokens") or []
            rec.update(hit=hit, output=res.get("text", "")[:6000], prompt_tokens=len(prompt_ids))
            if "thought" in res:
                rec["thought"] = res["thought"]
            if "error" in res:
                rec["error"] = res["error"]
            outcomes.append(rec)
        hits = sum(o["hit"] for o in outcomes)
        line = f"{task:7s} {hits}/{len(outcomes)} ({100 * hits / len(outcomes):.1f}%)"
        if task == "count":
            met = hits == len(outcomes)
            one_to_300 = "\n".join(str(x) for x in range(1, 301))
            firsts = [o for o in outcomes if o["expected"] == one_to_300]
            exact = sum(o["hit"] for o in firsts)
            if len(firsts) == 1:
                line += f"  1..300: {'exact' if exact else 'WRONG'}"
            else:
                line += f"  1..300: {exact}/{len(firsts)} exact"
        elif task == "needle":
            by_len = {}
            for o in outcomes:
                h, n = by_len.get(o["length"], (0, 0))
                by_len[o["length"]] = (h + o["hit"], n + 1)
            line += "  " + ", ".join(f"{L}: {h}/{n}" for L, (h, n) in sorted(by_len.items()))
            met = all(h >= 0.95 * n for L, (h, n) in by_len.items() if L <= 1024)
        else:
            met = hits >= 0.95 * len(outcomes)
        all_met &= met
        line += f"  bar {'met' if met else 'NOT met'}  [{time.time() - t0:.0f} s]"
        print(line, flush=True)
        report["tasks"][task] = {"hits": hits, "items": len(outcomes), "bar_met": met,
                                 "outcomes": outcomes}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0 if all_met else 1


if __name__ == "__main__":
    sys.exit(main())
