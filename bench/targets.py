#!/usr/bin/env python3
"""The performance targets in one sitting: every target's own measurement, the targets taking
turns round by round, and a table that says which were met in which rounds."""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

EPILOG = """
Targets (docs/PERFORMANCE.md, "Where the performance targets stand"), each measured per round:
  b8       lamina bench -m Q4_K_M --parallel 1,8 -p 0 -n 32 -r 3: B = 8 aggregate >= 4x B = 1
  window   window_bench BM_ShippedWindow/(1|9)/2: a 9-token verify window <= 2.5 decode steps
  depth16k lamina bench -m Q8_0 -p 0 -n 48 -d 16384 -r 1 --roofline per KV mode: >= 70% of the
           roofline in every mode, and k8v4 >= 1.45x f16 (same round)
  depth0   lamina bench -m Q8_0 / Q4_K_M -p 0 -n 64 -r 3 --roofline: >= 90% of the roofline
  spec     lamina bench --spec off,off,lookup,draft,mtp on the shipped model: every leg >= 0.97x
           plain on every task, prompt lookup >= 1.5x on copying
  pp512    bench/side_by_side.py --measure pp512 with the peers given: >= 1.5x llama.cpp and
           >= 1.0x ik_llama.cpp (Q8_0 and Q4_K_M); skipped without --llama / --ik-llama
A round runs every selected target once, in this order; a target is "met" in a round when every
figure it names is. The host's speed changes between minutes, so the table gives each round's
figures, and the read bandwidth the roofline shares were taken against. Nothing is built here.

Example:
  bench/targets.py --models /path/to/dir-with-synth-181m --rounds 3
  bench/targets.py --models DIR --only pp512 --llama ../llama.cpp/build --ik-llama ../ik_llama.cpp/build
"""

ALL = ["b8", "window", "depth16k", "depth0", "spec", "pp512"]
KV_MODES = ["f16", "k8v4", "int8", "q4_0"]


def run(cmd, verbose, env=None):
    if verbose:
        print("$ " + " ".join(cmd), file=sys.stderr, flush=True)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    if p.returncode != 0:
        raise RuntimeError("%s exited %d: %s" % (cmd[0], p.returncode, p.stderr.strip()[-400:]))
    return p.stdout


def lamina_json(args, extra):
    return json.loads(run([args.lamina, "bench", "-t", str(args.threads), "--json"] + extra,
                          args.verbose))


def measure_b8(args):
    d = lamina_json(args, ["-m", args.q4k, "--parallel", "1,8", "-p", "0", "-n", "32", "-r", "3"])
    rows = {r["streams"]: r for r in d["parallel"]}
    ratio = rows[8]["vs_1"]
    text = "%.2fx (B = 1 %.0f, B = 8 %.0f tok/s)" % (ratio, rows[1]["aggregate_tok_s"],
                                                     rows[8]["aggregate_tok_s"])
    return ratio >= 4.0, text


def measure_window(args):
    out = run([args.window_bench, "--benchmark_filter=BM_ShippedWindow/(1|9)/2/",
               "--benchmark_format=json", "--benchmark_min_time=0.5"], args.verbose)
    us = {}
    for b in json.loads(out)["benchmarks"]:
        m = re.match(r"BM_ShippedWindow/(\d+)/2", b["name"])
        if m:
            scale = {"ns": 1e-3, "us": 1.0, "ms": 1e3}[b.get("time_unit", "ns")]
            us[int(m.group(1))] = b["real_time"] * scale
    steps = us[9] / us[1]
    return steps <= 2.5, "%.2f steps (%.0f / %.0f us)" % (steps, us[9], us[1])


def measure_depth16k(args):
    tok, share = {}, {}
    for mode in KV_MODES:
        d = lamina_json(args, ["-m", args.q8, "-p", "0", "-n", "48", "-d", "16384", "-r", "1",
                               "--kv", mode, "--roofline"])
        tok[mode] = d["tg_tok_s"]
        share[mode] = d["roofline"]["share"]
    ratio = tok["k8v4"] / tok["f16"]
    met = all(s >= 0.70 for s in share.values()) and ratio >= 1.45
    text = ", ".join("%s %.1f%%" % (m, 100 * share[m]) for m in KV_MODES)
    return met, text + "; k8v4 / f16 %.2fx" % ratio


def measure_depth0(args):
    parts, met = [], True
    for name, path in (("Q8_0", args.q8), ("Q4_K_M", args.q4k)):
        d = lamina_json(args, ["-m", path, "-p", "0", "-n", "64", "-r", "3", "--roofline"])
        s = d["roofline"]["share"]
        met = met and s >= 0.90
        parts.append("%s %.1f%% (%.0f tok/s, probe %.1f GB/s)" %
                     (name, 100 * s, d["tg_tok_s"], d["roofline"]["measured_gbs"]))
    return met, ", ".join(parts)


def measure_spec(args):
    extra = ["-m", args.shipped, "--spec", "off,off,lookup,draft,mtp", "-r", "5"]
    if args.draft:
        extra += ["-md", args.draft]
    rows = lamina_json(args, extra)
    legs = [r for r in rows if r["spec"] not in ("off", "off2")]
    low = min(legs, key=lambda r: r["ratio"])
    copy = [r["ratio"] for r in legs if r["task"] == "copy" and r["spec"] == "lookup"]
    control = [r["ratio"] for r in rows if r["spec"] == "off2"]
    same = all(r["ids_match"] for r in rows)
    met = low["ratio"] >= 0.97 and copy and copy[0] >= 1.5 and same
    text = "lowest %.3fx (%s, %s), lookup on copy %s, control %s, ids %s" % (
        low["ratio"], low["spec"], low["task"], "%.2fx" % copy[0] if copy else "n/a",
        "/".join("%.2f" % c for c in control) or "n/a", "equal" if same else "DIFFER")
    return met, text


def measure_pp512(args):
    parts, met = [], True
    for name, path in (("Q8_0", args.q8), ("Q4_K_M", args.q4k)):
        fd, out = tempfile.mkstemp(prefix="lamina-targets-", suffix=".json")
        os.close(fd)
        cmd = [sys.executable, os.path.join(os.path.dirname(__file__), "side_by_side.py"),
               "--lamina", args.lamina, "-m", path, "-t", str(args.threads), "--measure", "pp512",
               "--rounds", "1", "--json", out]
        if args.llama:
            cmd += ["--llama", args.llama]
        if args.ik_llama:
            cmd += ["--ik-llama", args.ik_llama]
        run(cmd, args.verbose)
        with open(out) as f:
            row = json.load(f)["rows"][0]
        os.remove(out)
        cells = []
        for peer, goal in (("llama.cpp", 1.5), ("ik_llama.cpp", 1.0)):
            if row.get(peer):
                r = row[peer]["ratio_median"]
                met = met and r >= goal
                cells.append("%.2fx %s" % (r, peer))
        parts.append("%s %.0f tok/s, %s" % (name, row["lamina_median"], " / ".join(cells)))
    return met, "; ".join(parts)


MEASURE = {"b8": measure_b8, "window": measure_window, "depth16k": measure_depth16k,
           "depth0": measure_depth0, "spec": measure_spec, "pp512": measure_pp512}
GOAL = {"b8": "B = 8 aggregate >= 4x B = 1 (Q4_K_M)",
        "window": "9-token verify window <= 2.5 decode steps (shipped model)",
        "depth16k": "16K decode >= 70% of the roofline, every KV mode; k8v4 >= 1.45x f16 (Q8_0)",
        "depth0": "depth-0 decode >= 90% of the roofline (Q8_0, Q4_K_M)",
        "spec": "speculation >= 0.97x plain on every task, >= 1.5x on copying (shipped model)",
        "pp512": "pp512 >= 1.5x llama.cpp, >= 1.0x ik_llama.cpp (Q8_0, Q4_K_M)"}


def loadavg():
    try:
        return "%.2f" % os.getloadavg()[0]
    except OSError:
        return "n/a"


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def main():
    ap = argparse.ArgumentParser(description=__doc__, epilog=EPILOG,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lamina", default="build/release/lamina", help="lamina binary (default %(default)s)")
    ap.add_argument("--window-bench", default="build/release/bench/window_bench",
                    help="window_bench binary (default %(default)s)")
    ap.add_argument("--models", default=None,
                    help="directory holding synth-181m.Q8_0.gguf and synth-181m.Q4_K_M.gguf "
                         "(lamina-synth files; README, benchmarks)")
    ap.add_argument("--q8", default=None, help="the Q8_0 file (default MODELS/synth-181m.Q8_0.gguf)")
    ap.add_argument("--q4k", default=None, help="the Q4_K_M file (default MODELS/synth-181m.Q4_K_M.gguf)")
    ap.add_argument("--shipped", default="models/lamina-counter.gguf", help="default %(default)s")
    ap.add_argument("--draft", default="models/lamina-counter-draft.gguf", help="default %(default)s")
    ap.add_argument("--llama", default=None, help="llama.cpp build directory, for pp512")
    ap.add_argument("--ik-llama", default=None, help="ik_llama.cpp build directory, for pp512")
    ap.add_argument("-t", "--threads", type=int, default=2, help="threads (default %(default)s)")
    ap.add_argument("--rounds", type=int, default=2, help="rounds (default %(default)s)")
    ap.add_argument("--only", default=",".join(ALL), help="targets, comma-separated: " + ",".join(ALL))
    ap.add_argument("--json", default=None, help="also write every round's figures here")
    ap.add_argument("-v", "--verbose", action="store_true", help="print each command")
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    only = [t.strip() for t in args.only.split(",") if t.strip()]
    for t in only:
        if t not in MEASURE:
            ap.error("unknown target %r (known: %s)" % (t, ",".join(ALL)))
    if "pp512" in only and not (args.llama or args.ik_llama):
        only.remove("pp512")
        print("pp512: skipped (no --llama or --ik-llama)", file=sys.stderr)
    needs_synth = {"b8", "depth16k", "depth0", "pp512"} & set(only)
    if needs_synth:
        if args.models:
            args.q8 = args.q8 or os.path.join(args.models, "synth-181m.Q8_0.gguf")
            args.q4k = args.q4k or os.path.join(args.models, "synth-181m.Q4_K_M.gguf")
        for p in (args.q8, args.q4k):
            if not p or not os.path.isfile(p):
                ap.error("no file %s: give --models DIR or --q8 / --q4k" % p)
    if args.draft and not os.path.isfile(args.draft):
        args.draft = None

    print("date %s | %s | %d threads | %d rounds | load average %s" %
          (time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), cpu_name(), args.threads,
           args.rounds, loadavg()))
    results = {t: [] for t in only}  # target -> [(met, text, utc)]
    for rnd in range(args.rounds):
        for t in only:
            met, text = MEASURE[t](args)
            stamp = time.strftime("%H:%M", time.gmtime())
            results[t].append((met, text, stamp))
            print("round %d %s %-8s %s  %s" % (rnd + 1, stamp, t, "met" if met else "not met", text),
                  file=sys.stderr, flush=True)
    print("load average at the end %s" % loadavg())
    print("| target | %s | met |" % " | ".join("round %d" % (r + 1) for r in range(args.rounds)))
    print("|---|%s---|" % ("---|" * args.rounds))
    for t in only:
        n_met = sum(1 for m, _, _ in results[t] if m)
        verdict = "yes" if n_met == args.rounds else "no" if n_met == 0 else "%d of %d rounds" % (
            n_met, args.rounds)
        print("| %s | %s | %s |" % (GOAL[t], " | ".join("%s (%s)" % (x, s) for _, x, s in results[t]),
                                    verdict))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({t: [{"met": m, "figures": x, "utc": s} for m, x, s in v]
                       for t, v in results.items()}, f, indent=1)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except RuntimeError as e:
        print("targets: %s" % e, file=sys.stderr)
        sys.exit(1)
