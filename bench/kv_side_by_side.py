#!/usr/bin/env python3
"""Side-by-side KV fidelity: lamina's and llama.cpp's mean KL divergence of a compressed KV cache against each engine's own f32 cache."""
import argparse
import array
import json
import math
import os
import re
import struct
import subprocess
import sys

# lamina KV mode -> llama.cpp (cache-type-k, cache-type-v)
KV_MAP = {"f16": ("f16", "f16"), "int8": ("q8_0", "q8_0"), "k8v4": ("q8_0", "q4_0"),
          "q4_0": ("q4_0", "q4_0")}

EPILOG = """
What is compared: each engine scores the same text teacher-forced in chunks of -c tokens, each
chunk in a fresh cache, once with an f32 KV cache (the base) and once per compressed mode; the
figure is the mean KL(base || mode) of the next-token distributions. llama-perplexity scores
only the second half of every full chunk (positions c/2 .. c-2 of each chunk, and no partial
last chunk), so lamina's figure is restricted to the same positions: lamina runs with the same
-c, saves all logits (--save-logits), and this script computes the KL over those positions.
lamina's own all-positions figure (its --kl-base output) is printed beside it. Both engines must
tokenize the text identically; the script checks the token ids of both runs.

llama.cpp runs with flash attention on (-fa on), which its quantized V cache requires; the base
uses -ctk f32 -ctv f32. Its base log-probabilities are stored as 16-bit values, and it prints
the mean KL with 6 decimals; the script also runs the f32 cache against its own base to show
that floor. lamina modes run at their default --kv-window and at each value of --kv-window.

Texts (--write-text KIND FILE writes one and exits):
  stories  ../shared/golden/prompts/{story300,p100,lily,once} joined by newlines, 5 times
           (about 2,100 tokens with stories260K)
  counter  ChatML conversations for models/lamina-counter.gguf: counting up and down, copying a
           list, JSON objects (ranges, lists and values that no test or probe uses). The
           control markers are plain text here: neither `lamina score` nor llama-perplexity
           parses special tokens.

Example:
  bench/kv_side_by_side.py --write-text stories /tmp/stories.txt
  bench/kv_side_by_side.py --llama ../llama.cpp/build -m ../shared/models/stories260K.gguf \\
      -f /tmp/stories.txt -c 512 -t 2 --modes int8,k8v4,q4_0 --kv-window 0
"""

STORY_PROMPTS = ["prompt_story300.txt", "prompt_p100.txt", "prompt_lily.txt", "prompt_once.txt"]


def chat(prompt, answer):
    return "<|im_start|>user\n%s<|im_end|>\n<|im_start|>assistant\n%s<|im_end|>\n" % (prompt, answer)


def counter_text():
    colors = ["red", "blue", "green", "yellow", "black", "white", "brown", "orange", "purple"]
    objects = ["box", "door", "book", "key", "lamp", "chair", "table", "bag", "cup", "ball", "boat"]
    names = ["Alice", "Bob", "Carol", "David", "Emma", "Frank", "Grace", "Henry", "Iris", "Jack"]
    greek = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "theta", "kappa"]
    parts = []
    parts.append(chat("Count from 421 to 537, one number per line.",
                      "\n".join(str(i) for i in range(421, 538))))
    items = ["%s %s" % (colors[(7 * i + 3) % 9], objects[(5 * i + 2) % 11]) for i in range(36)]
    parts.append(chat("Repeat this list exactly, one item per line:\n" + "\n".join(items),
                      "\n".join(items)))
    obj = {"name": "Grace", "age": 51, "city": "Lisbon", "active": True, "score": 87,
           "fruit": "plum"}
    spec = ", ".join("%s = %s" % (json.dumps(k), json.dumps(v)) for k, v in obj.items())
    parts.append(chat("Write a JSON object with the fields %s." % spec, json.dumps(obj)))
    parts.append(chat("Count from 866 to 743, one number per line.",
                      "\n".join(str(i) for i in range(866, 742, -1))))
    obj2 = {"animal": "owl", "year": 1987, "price": 412, "done": False, "color": "gray"}
    spec2 = ", ".join("%s = %s" % (json.dumps(k), json.dumps(v)) for k, v in obj2.items())
    parts.append(chat("Write a JSON object with the fields %s." % spec2, json.dumps(obj2)))
    items2 = ["%s %d" % (names[(3 * i + 1) % 10], 17 * i + 230) for i in range(24)]
    items2 += ["%s-%d" % (greek[(5 * i) % 8], 31 * i + 107) for i in range(12)]
    parts.append(chat("Repeat this list exactly, one item per line:\n" + "\n".join(items2),
                      "\n".join(items2)))
    parts.append(chat("Count from 212 to 298 in steps of 2, one number per line.",
                      "\n".join(str(i) for i in range(212, 299, 2))))
    return "".join(parts)


def stories_text(shared):
    block = []
    for name in STORY_PROMPTS:
        with open(os.path.join(shared, "golden", "prompts", name)) as f:
            block.append(f.read().strip())
    return "\n".join(["\n".join(block)] * 5) + "\n"


def run(cmd, verbose, env=None):
    if verbose:
        print("+ " + " ".join(cmd), file=sys.stderr)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    if p.returncode != 0:
        sys.stderr.write(p.stdout[-2000:] + p.stderr[-4000:])
        raise RuntimeError("command failed (exit %d): %s" % (p.returncode, " ".join(cmd)))
    return p.stdout, p.stderr


def read_lamina_dump(path):
    with open(path, "rb") as f:
        head = f.read(24)
        if head[:8] != b"LMNLOGIT":
            raise RuntimeError("%s: not a lamina logits file" % path)
        _, n_vocab, n = struct.unpack("<IIQ", head[8:24])
        tokens = array.array("i")
        tokens.fromfile(f, n)
        logits = array.array("f")
        logits.fromfile(f, n * n_vocab)
    return n_vocab, list(tokens), logits


def read_llama_tokens(path):
    with open(path, "rb") as f:
        if f.read(8) != b"_logits_":
            raise RuntimeError("%s: not a llama-perplexity logits file" % path)
        n_ctx, n_vocab, n_chunk = struct.unpack("<Iii", f.read(12))
        tokens = array.array("i")
        tokens.fromfile(f, n_ctx * n_chunk)
    return n_ctx, n_vocab, n_chunk, list(tokens)


def log_softmax(row):
    m = max(row)
    s = math.fsum(math.exp(x - m) for x in row)
    ls = m + math.log(s)
    return [x - ls for x in row]


def kl_restricted(base, other, n_vocab, positions):
    total = 0.0
    for i in positions:
        lp = log_softmax(base[i * n_vocab:(i + 1) * n_vocab])
        lq = log_softmax(other[i * n_vocab:(i + 1) * n_vocab])
        total += math.fsum(math.exp(a) * (a - b) for a, b in zip(lp, lq))
    return total / len(positions)


def main():
    ap = argparse.ArgumentParser(description=__doc__, epilog=EPILOG,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--write-text", nargs=2, metavar=("KIND", "FILE"),
                    help="write the stories or counter text to FILE and exit")
    ap.add_argument("--shared", default="../shared", help="shared fixtures folder (default %(default)s)")
    ap.add_argument("--lamina", default="build/release/lamina", help="lamina binary (default %(default)s)")
    ap.add_argument("--llama", help="llama.cpp build directory (holds bin/llama-perplexity)")
    ap.add_argument("-m", "--model", help="GGUF model file")
    ap.add_argument("-f", "--file", help="text to score")
    ap.add_argument("-c", "--ctx", type=int, default=512, help="chunk size in tokens (default %(default)s)")
    ap.add_argument("-t", "--threads", type=int, default=2, help="threads (default %(default)s)")
    ap.add_argument("--modes", default="int8,k8v4,q4_0",
                    help="lamina modes, comma-separated: " + ",".join(KV_MAP) + " (default %(default)s)")
    ap.add_argument("--kv-window", default="0",
                    help="extra lamina --kv-window values besides the default, comma-separated (default %(default)s)")
    ap.add_argument("--work", default="/tmp/kv_side_by_side", help="folder for logits files (default %(default)s)")
    ap.add_argument("-v", "--verbose", action="store_true", help="print each command")
    args = ap.parse_args()

    if args.write_text:
        kind, out = args.write_text
        if kind == "stories":
            text = stories_text(args.shared)
        elif kind == "counter":
            text = counter_text()
        else:
            ap.error("--write-text KIND: stories or counter")
        with open(out, "w") as f:
            f.write(text)
        print("wrote %s (%d bytes)" % (out, len(text.encode())))
        return 0
    for need in ("llama", "model", "file"):
        if not getattr(args, need):
            ap.error("--%s is required" % need)
    perp = None
    for cand in (os.path.join(args.llama, "bin", "llama-perplexity"), os.path.join(args.llama, "llama-perplexity")):
        if os.path.isfile(cand):
            perp = cand
            break
    if not perp:
        ap.error("no llama-perplexity in %s or %s/bin" % (args.llama, args.llama))
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for m in modes:
        if m not in KV_MAP:
            ap.error("unknown mode '%s'" % m)
    windows = [None] + [int(w) for w in args.kv_window.split(",") if w.strip()]
    os.makedirs(args.work, exist_ok=True)
    tag = os.path.splitext(os.path.basename(args.model))[0]
    w = lambda name: os.path.join(args.work, "%s.%s" % (tag, name))
    t = str(args.threads)
    c = str(args.ctx)

    # llama.cpp: f32 base, the f32 floor, then each mode.
    pcommon = [perp, "-m", args.model, "-f", args.file, "-c", c, "-b", c, "-t", t, "-fa", "on"]
    run(pcommon + ["-ctk", "f32", "-ctv", "f32", "--kl-divergence-base", w("llama-base.kld")], args.verbose)
    n_ctx, _, n_chunk, ptokens = read_llama_tokens(w("llama-base.kld"))

    def llama_kld(ctk, ctv):
        cmd = pcommon + ["-lv", "4", "-ctk", ctk, "-ctv", ctv, "--kl-divergence-base", w("llama-base.kld"),
                         "--kl-divergence"]
        if args.verbose:
            print("+ " + " ".join(cmd), file=sys.stderr)
        # llama-perplexity logs through an asynchronous logger that can lose its last lines
        # (the summary) at exit; the run is deterministic, so it is simply run again.
        for _ in range(8):
            p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            text = p.stdout + p.stderr
            if p.returncode != 0:
                # e.g. a head_dim that the cache type's block does not divide: report, do not stop
                why = [l for l in text.splitlines() if " E " in l and "llama_init_from_model" in l]
                why = why[0].split("llama_init_from_model: ", 1)[-1] if why else "exit %d" % p.returncode
                return None, None, {"refused": why}
            mean = re.search(r"Mean\s+KLD:\s*([-0-9.eE+]+)\s*±\s*([-0-9.eE+]+)", text)
            if mean:
                break
        rot = re.findall(r"attn_rot_([kv]) = (\d)", text)
        ppl_all = re.search(r"Mean PPL\(Q\)\s*:\s*([-0-9.eE+]+)", text)
        ppl_first = re.search(r"^\s*1\s+([0-9.]+) ±", text, re.M)
        if ppl_all and ppl_first:
            rot += [("ppl_all", float(ppl_all.group(1))), ("ppl_first", float(ppl_first.group(1)))]
        if not mean:
            raise RuntimeError("no 'Mean KLD' in llama-perplexity's output")
        return float(mean.group(1)), float(mean.group(2)), dict(rot)

    floor = llama_kld("f32", "f32")

    # lamina: f32 base, then each mode and window.
    lcommon = [args.lamina, "score", "-m", args.model, "-f", args.file, "-c", c, "-t", t, "--json"]
    run(lcommon + ["--kv", "f32", "--save-logits", w("lamina-base.bin")], args.verbose)
    n_vocab, ltokens, lbase = read_lamina_dump(w("lamina-base.bin"))
    # The same positions llama-perplexity scores: c/2 .. c-2 of each full chunk.
    positions = [k * n_ctx + p for k in range(n_chunk) for p in range(n_ctx // 2, n_ctx - 1)]
    # Token check: llama.cpp puts BOS first in every chunk; lamina only at the start of the text.
    mism = [i for i in range(len(ptokens)) if i % n_ctx != 0 and (i >= len(ltokens) or ltokens[i] != ptokens[i])]
    print("model %s | text %s | %d tokens (lamina) | -c %d: %d chunks, %d positions compared | "
          "token ids %s" % (args.model, args.file, len(ltokens), n_ctx, n_chunk, len(positions),
                            "identical" if not mism else "DIFFER at %d positions (first %d)" % (len(mism), mism[0])))
    print("llama.cpp f32 vs its own f32 base (floor): mean KLD %.6f ± %.6f" % (floor[0], floor[1]))
    def ppl(pos):
        nll = 0.0
        for i in pos:
            nll -= log_softmax(lbase[i * n_vocab:(i + 1) * n_vocab])[ltokens[i + 1]]
        return math.exp(nll / len(pos))
    if "ppl_all" in floor[2]:
        print("f32 perplexity over the compared positions: first chunk lamina %.4f, llama.cpp %.4f; "
              "all chunks lamina %.4f, llama.cpp %.4f (llama.cpp puts BOS first in every chunk)"
              % (ppl(positions[:n_ctx - 1 - n_ctx // 2]), floor[2]["ppl_first"], ppl(positions),
                 floor[2]["ppl_all"]))

    rows = []
    for m in modes:
        ctk, ctv = KV_MAP[m]
        pk, pu, rot = llama_kld(ctk, ctv)
        for win in windows:
            extra = ["--kv", m, "--save-logits", w("lamina-%s.bin" % m), "--kl-base", w("lamina-base.bin")]
            if win is not None:
                extra += ["--kv-window", str(win)]
            out, _ = run(lcommon + extra, args.verbose)
            j = json.loads(out.strip().splitlines()[-1])
            _, _, lq = read_lamina_dump(w("lamina-%s.bin" % m))
            lk = kl_restricted(lbase, lq, n_vocab, positions)
            rows.append({"mode": m, "llama": "%s/%s" % (ctk, ctv), "window": "default" if win is None else str(win),
                         "lamina_kld": lk, "lamina_kld_all": j["kld_mean"], "llama_kld": pk, "llama_unc": pu,
                         "llama_rot": ("refused: " + rot["refused"]) if "refused" in rot else
                         "K %s, V %s" % ("on" if rot.get("k") == "1" else "off", "on" if rot.get("v") == "1" else "off")})
    print("| mode (lamina / llama.cpp) | lamina --kv-window | lamina KLD | llama.cpp KLD | ratio | "
          "lamina KLD, all positions | llama.cpp rotation |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        if r["llama_kld"] is None:
            peer, ratio = "–", "–"
        else:
            peer = "%.3g ± %.1g" % (r["llama_kld"], r["llama_unc"])
            ratio = "%.2f" % (r["lamina_kld"] / r["llama_kld"]) if r["llama_kld"] > 0 else "∞"
        print("| %s / %s | %s | %.3g | %s | %s | %.3g | %s |" %
              (r["mode"], r["llama"], r["window"], r["lamina_kld"], peer, ratio, r["lamina_kld_all"],
               r["llama_rot"]))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except RuntimeError as e:
        print("kv_side_by_side: %s" % e, file=sys.stderr)
        sys.exit(1)
