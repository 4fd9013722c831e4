#!/usr/bin/env python3
"""Side-by-side throughput: lamina bench and the llama-bench of llama.cpp and/or ik_llama.cpp,
interleaved round by round."""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

# lamina KV mode -> llama.cpp (cache-type-k, cache-type-v)
KV_MAP = {
    "f32": ("f32", "f32"),
    "f16": ("f16", "f16"),
    "int8": ("q8_0", "q8_0"),
    "k8v4": ("q8_0", "q4_0"),
    "q4_0": ("q4_0", "q4_0"),
}

EPILOG = """
Measurements: ppN (a N-token prompt into an empty cache) and tgN or tgN@D (N single-token decode
steps after D tokens are in the cache; default D 0). Each is run for every KV mode in --kv.
KV modes map lamina -> llama.cpp as: f16 -> f16/f16, int8 -> q8_0/q8_0, k8v4 -> q8_0/q4_0,
q4_0 -> q4_0/q4_0 (f32 -> f32/f32). llama.cpp runs with flash attention on (-fa 1), which a
quantized V cache requires; lamina's KV window keeps its default unless --kv-window is given.

Each round runs, per (KV mode, depth): lamina bench once, then each peer's llama-bench once
(same -p/-n/-t, -d when the depth is not 0, -r REPS). A llama-bench without -d (ik_llama.cpp's,
llama.cpp's before it had one) times tgN@D as -gp D,N where it has that (N tokens timed after an
untimed D-token prompt, the same steps); one with neither prints n/a at a depth. A round's
figure is the median of that invocation's samples. Printed per measurement: each engine's
median over rounds and, per peer, the per-round ratio lamina/peer (min / median / max). The
script never builds a peer: point --llama (llama.cpp) and/or --ik-llama (ik_llama.cpp) at a
CPU-only build directory.

Example:
  bench/side_by_side.py --llama ../llama.cpp/build --ik-llama ../ik_llama.cpp/build \\
      -m /path/to/synth-181m.Q8_0.gguf -t 2 --kv f16,int8,k8v4,q4_0 --measure pp512,tg64 --rounds 3

AVX2 code on an AVX-512 host: build each peer CPU-only with AVX-512 off into its own directory
and pass --lamina-env LAMINA_ISA=avx2, e.g.
  bench/side_by_side.py --lamina-env LAMINA_ISA=avx2 --llama ../llama.cpp/build-avx2 \\
      --ik-llama ../ik_llama.cpp/build-avx2 -m /path/to/synth-181m.Q8_0.gguf -t 2 --rounds 3
"""


def find_llama_bench(d):
    for cand in (os.path.join(d, "bin", "llama-bench"), os.path.join(d, "llama-bench")):
        if os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    return None


def parse_measures(text):
    """Returns a list of (kind, n, depth)."""
    out = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        depth = 0
        if "@" in item:
            item, d = item.split("@", 1)
            depth = int(d)
        if item.startswith("pp"):
            kind = "pp"
        elif item.startswith("tg"):
            kind = "tg"
        else:
            raise ValueError("measurement '%s': expected ppN, tgN or tgN@DEPTH" % item)
        n = int(item[2:])
        if n <= 0 or depth < 0:
            raise ValueError("measurement '%s': N must be > 0 and DEPTH >= 0" % item)
        if kind == "pp" and depth > 0:
            raise ValueError("pp at a depth: lamina bench times prompts into an empty cache only")
        out.append((kind, n, depth))
    return out


def run(cmd, verbose, env=None):
    """env: extra variables for this command only (on top of this process's environment)."""
    if verbose:
        print("+ " + "".join("%s=%s " % kv for kv in sorted((env or {}).items())) + " ".join(cmd),
              file=sys.stderr)
    full_env = None
    if env:
        full_env = dict(os.environ)
        full_env.update(env)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full_env)
    if p.returncode != 0:
        sys.stderr.write(p.stderr[-4000:])
        raise RuntimeError("command failed (exit %d): %s" % (p.returncode, " ".join(cmd)))
    return p.stdout


def run_lamina(args, kv, depth, n_prompt, n_gen):
    cmd = [args.lamina, "bench", "-m", args.model, "-t", str(args.threads), "--kv", kv,
           "-p", str(n_prompt), "-n", str(n_gen), "-d", str(depth), "-r", str(args.reps), "--json"]
    if args.kv_window is not None:
        cmd += ["--kv-window", str(args.kv_window)]
    j = json.loads(run(cmd, args.verbose, args.lamina_env).strip().splitlines()[-1])
    res = {}
    if n_prompt > 0:
        res[("pp", n_prompt, 0)] = statistics.median(j["pp_samples"])
    if n_gen > 0:
        res[("tg", n_gen, depth)] = statistics.median(j["tg_samples"])
    return res, j


def depth_option(bench):
    """How a llama-bench times decode at a depth: "-d", "-gp" or None (neither)."""
    try:
        text = subprocess.run([bench, "--help"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    if re.search(r"^\s*-d,|--n-depth", text, re.M):
        return "-d"
    if re.search(r"^\s*-gp\b", text, re.M):
        return "-gp"
    return None


def run_llama(args, bench, kv, depth, n_prompt, n_gen, how):
    ctk, ctv = KV_MAP[kv]
    cmd = [bench, "-m", args.model, "-t", str(args.threads), "-ctk", ctk, "-ctv", ctv,
           "-fa", "1", "-r", str(args.reps), "-o", "json"]
    gp = depth > 0 and how == "-gp"
    if depth > 0 and how is None:
        return {}, []  # a depth's group is decode only (parse_measures): n/a
    if gp:
        cmd += ["-p", "0", "-n", "0", "-gp", "%d,%d" % (depth, n_gen)]
    else:
        cmd += ["-p", str(n_prompt), "-n", str(n_gen)]
        if depth > 0:
            cmd += ["-d", str(depth)]
    rows = json.loads(run(cmd, args.verbose))
    res = {}
    for r in rows:
        samples = r.get("samples_ts") or [r["avg_ts"]]
        if gp and r["n_prompt"] == depth and r["n_gen"] == n_gen:
            res[("tg", n_gen, depth)] = statistics.median(samples)
        elif r["n_prompt"] > 0 and r["n_gen"] == 0:
            res[("pp", r["n_prompt"], 0)] = statistics.median(samples)
        elif r["n_gen"] > 0 and r["n_prompt"] == 0:
            res[("tg", r["n_gen"], r.get("n_depth", 0))] = statistics.median(samples)
    return res, rows


def bandwidth(path, verbose):
    if not path or not os.path.isfile(path):
        return None
    out = run([path, "--benchmark_filter=MemoryReadBandwidth", "--benchmark_format=json"], verbose)
    j = json.loads(out)
    res = {}
    for b in j.get("benchmarks", []):
        name = b.get("name", "")
        if "GB/s" in b:
            threads = name.split("/")[1] if "/" in name else "?"
            # Google Benchmark's rate counter is in bytes per second
            res[threads] = b["GB/s"] / 1e9
    return res


def loadavg():
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "?"


def label(m):
    kind, n, depth = m
    return "%s%d" % (kind, n) + ("@%d" % depth if depth else "")


def main():
    ap = argparse.ArgumentParser(description=__doc__, epilog=EPILOG,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lamina", default="build/release/lamina", help="lamina binary (default %(default)s)")
    ap.add_argument("--lamina-env", action="append", default=[], metavar="NAME=VALUE",
                    help="set NAME=VALUE in lamina's environment only, e.g. LAMINA_ISA=avx2 to time "
                    "its AVX2 code on an AVX-512 host (repeatable)")
    ap.add_argument("--llama", default=None, help="llama.cpp build directory (holds bin/llama-bench)")
    ap.add_argument("--ik-llama", default=None,
                    help="ik_llama.cpp build directory (holds bin/llama-bench)")
    ap.add_argument("-m", "--model", required=True, help="GGUF model file, read by both engines")
    ap.add_argument("-t", "--threads", type=int, default=2, help="threads (default %(default)s)")
    ap.add_argument("--kv", default="f16", help="lamina KV modes, comma-separated: " + ",".join(KV_MAP)
                    + " (default %(default)s)")
    ap.add_argument("--measure", default="pp512,tg64",
                    help="ppN, tgN, tgN@DEPTH, comma-separated (default %(default)s)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default %(default)s)")
    ap.add_argument("-r", "--reps", type=int, default=1,
                    help="repetitions inside each invocation; its median is the round's figure (default %(default)s)")
    ap.add_argument("--kv-window", type=int, default=None, help="lamina --kv-window (default: the mode's)")
    ap.add_argument("--matmul-bench", default="build/release/bench/matmul_bench",
                    help="prints the machine's read bandwidth first if this exists (default %(default)s)")
    ap.add_argument("--json", default=None, help="also write every sample and the summary here")
    ap.add_argument("-v", "--verbose", action="store_true", help="print each command")
    args = ap.parse_args()

    env = {}
    for item in args.lamina_env:
        name, sep, value = item.partition("=")
        if not sep or not name:
            ap.error("--lamina-env '%s': expected NAME=VALUE" % item)
        env[name] = value
    args.lamina_env = env
    kvs = [k.strip() for k in args.kv.split(",") if k.strip()]
    for k in kvs:
        if k not in KV_MAP:
            ap.error("unknown KV mode '%s' (one of %s)" % (k, ", ".join(KV_MAP)))
    try:
        measures = parse_measures(args.measure)
    except ValueError as e:
        ap.error(str(e))
    if not os.path.isfile(args.lamina):
        ap.error("no lamina binary at %s (build it or pass --lamina)" % args.lamina)
    peers = []  # (name, llama-bench path)
    for name, d in (("llama.cpp", args.llama), ("ik_llama.cpp", args.ik_llama)):
        if d is None:
            continue
        bench = find_llama_bench(d)
        if not bench:
            ap.error("no llama-bench in %s or %s/bin (build %s's llama-bench target there)"
                     % (d, d, name))
        peers.append((name, bench))
    depth_how = {name: depth_option(bench) for name, bench in peers}
    if not peers:
        ap.error("give --llama and/or --ik-llama (a peer's build directory)")
    if not os.path.isfile(args.model):
        ap.error("no model file at %s" % args.model)

    # One lamina / llama-bench invocation per (KV mode, depth) covers all its measurements.
    groups = {}
    for m in measures:
        kind, n, depth = m
        g = groups.setdefault(depth, {"pp": 0, "tg": 0})
        if g[kind] and g[kind] != n:
            ap.error("one N per kind and depth (got %s%d and %s%d at depth %d)" % (kind, g[kind], kind, n, depth))
        g[kind] = n

    bw = bandwidth(args.matmul_bench, args.verbose)
    info = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "model": args.model,
            "threads": args.threads, "rounds": args.rounds, "reps": args.reps,
            "lamina": args.lamina, "lamina_env": env, "peers": dict(peers), "bandwidth_gb_s": bw}
    info["load_start"] = loadavg()
    print("date %s | model %s | %d threads | %d rounds x %d reps | load average %s" %
          (info["date"], args.model, args.threads, args.rounds, args.reps, info["load_start"]))
    if env:
        print("lamina environment: " + " ".join("%s=%s" % kv for kv in sorted(env.items())))
    if bw:
        print("read bandwidth (matmul_bench MemoryReadBandwidth): " +
              ", ".join("%.1f GB/s on %s thread%s" % (v, t, "" if t == "1" else "s") for t, v in sorted(bw.items())))
    else:
        print("read bandwidth: not measured (no %s)" % args.matmul_bench)

    names = ["lamina"] + [n for n, _ in peers]
    samples = {}  # (kv, measure) -> {engine name: [round figures]}
    builds = {}   # peer name -> "commit (build N)"
    for rnd in range(args.rounds):
        for kv in kvs:
            for depth, g in sorted(groups.items()):
                res = {"lamina": run_lamina(args, kv, depth, g["pp"], g["tg"])[0]}
                for name, bench in peers:
                    res[name], rows = run_llama(args, bench, kv, depth, g["pp"], g["tg"],
                                                depth_how[name])
                    if rows and name not in builds:
                        builds[name] = "%s (build %s)" % (rows[0].get("build_commit"),
                                                          rows[0].get("build_number"))
                for m in measures:
                    if m[2] != depth:
                        continue
                    s = samples.setdefault((kv, m), {n: [] for n in names})
                    for n in names:
                        if m not in res[n]:
                            if n != "lamina" and depth > 0 and depth_how[n] is None:
                                continue  # this peer's llama-bench cannot time a depth: n/a
                            raise RuntimeError("no %s figure from %s" % (label(m), n))
                        s[n].append(res[n][m])
                    print("round %d  %-5s %-12s " % (rnd + 1, kv, label(m)) +
                          "  ".join("%s %9s" % (n, "%.2f" % res[n][m] if m in res[n] else "n/a")
                                    for n in names) + " tok/s",
                          file=sys.stderr, flush=True)

    info["peer_builds"] = builds
    info["load_end"] = loadavg()
    for name, _ in peers:
        how = {"-d": "-d for depths", "-gp": "-gp DEPTH,N for depths",
               None: "no depth option: n/a at depths"}[depth_how[name]]
        print("%s: %s, llama-bench -fa 1, %s" % (name, builds.get(name), how))
    print("load average at the end %s" % info["load_end"])
    hdr = "| KV (lamina / peer) | test | lamina tok/s | " + " | ".join(
        "%s tok/s | lamina/%s min / median / max" % (n, n) for n, _ in peers) + " |"
    print(hdr)
    print("|---|---|---|" + "---|---|" * len(peers))
    summary = []
    for kv in kvs:
        for m in measures:
            s = samples[(kv, m)]
            row = {"kv": kv, "peer_kv": "%s/%s" % KV_MAP[kv], "test": label(m),
                   "lamina_median": statistics.median(s["lamina"]), "rounds": s}
            cells = []
            for n, _ in peers:
                ratios = [a / b for a, b in zip(s["lamina"], s[n]) if b > 0]
                if not ratios:
                    row[n] = None
                    cells.append("n/a | n/a")
                    continue
                row[n] = {"median": statistics.median(s[n]), "ratio_min": min(ratios),
                          "ratio_median": statistics.median(ratios), "ratio_max": max(ratios)}
                cells.append("%.1f | %.2fx / %.2fx / %.2fx" %
                             (row[n]["median"], row[n]["ratio_min"], row[n]["ratio_median"],
                              row[n]["ratio_max"]))
            summary.append(row)
            print("| %s / %s | %s | %.1f | %s |" % (kv, row["peer_kv"], row["test"],
                                                   row["lamina_median"], " | ".join(cells)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"info": info, "rows": summary}, f, indent=1)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except RuntimeError as e:
        print("side_by_side: %s" % e, file=sys.stderr)
        sys.exit(1)
