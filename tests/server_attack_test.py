#!/usr/bin/env python3
"""Adversarial checks of `lamina serve` on loopback (docs/SERVER.md): malformed and oversized
heads and bodies, slow clients, floods of unauthenticated uploads, API keys, Host and CORS
rules, deep JSON and schemas, out-of-range sampling fields, tenant isolation of the prefix
cache, /slots, /monitor and slot files, and many clients hanging up at random.

Each check is refused cleanly with the right status, the server still answers GET /health
afterwards, a normal request is answered in under 2 s during or after the attack, and memory
(VmRSS) and threads stay bounded. One line per check; exit 1 when one fails, 77 when the binary
or the model is missing. Python standard library only.

  LAMINA_BINARY=build/release/lamina LAMINA_MODEL=models/lamina-counter.gguf \\
      python3 tests/server_attack_test.py [--only 1,4,12] [--table FILE]
"""

import argparse
import gzip
import http.client
import json
import os
import random
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BINARY = os.environ.get("LAMINA_BINARY", os.path.join(ROOT, "build", "release", "lamina"))
MODEL = os.environ.get("LAMINA_MODEL", os.path.join(ROOT, "models", "lamina-counter.gguf"))

KEY_A, KEY_B = "key-alpha-0123", "key-bravo-4567"  # --api-key A,B (a comma list)
KEY_C = "key-charlie-89"  # a second --api-key flag
KEY_D = "key-delta-file"  # from --api-key-file
# Keys used only by the tenant check (10), from the key file too: their scopes start empty.
KEY_E, KEY_F, KEY_G = "key-echo-fresh", "key-foxtrot-fresh", "key-golf-fresh"
GOOD_ORIGIN = "http://good.example"
MiB = 1 << 20
RSS_SLACK_KB = 64 * 1024  # an unauthenticated attack may cost at most this much memory
NORMAL_LATENCY_S = 2.0


# ---------------------------------------------------------------------------------------------
# Plumbing


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def proc_status(pid):
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                out[k] = v.strip()
    except OSError:
        pass
    return out


def rss_kb(pid):
    return int(proc_status(pid).get("VmRSS", "0 kB").split()[0])


def n_threads(pid):
    return int(proc_status(pid).get("Threads", "0"))


class RssPeak:
    """Samples VmRSS every 20 ms while in the with-block; .peak in kB."""

    def __init__(self, pid):
        self.pid, self.peak, self._stop = pid, 0, threading.Event()

    def __enter__(self):
        self.peak = rss_kb(self.pid)
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_kb(self.pid))
            self._stop.wait(0.02)

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, rss_kb(self.pid))


class Server:
    def __init__(self, args, workdir, name):
        self.port = free_port()
        self.log_path = os.path.join(workdir, f"{name}.log")
        self.log = open(self.log_path, "wb")
        cmd = [BINARY, "serve", "-m", MODEL, "--port", str(self.port)] + args
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        self.pid = self.proc.pid
        deadline = time.time() + 60
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}: {self.tail()}")
            try:
                if request(self.port, "GET", "/health", timeout=2)[0] == 200:
                    break
            except OSError:
                pass
            if time.time() > deadline:
                raise RuntimeError("server did not become healthy in 60 s: " + self.tail())
            time.sleep(0.1)

    def tail(self):
        try:
            if not self.log.closed:
                self.log.flush()
            with open(self.log_path, "rb") as f:
                return f.read()[-2000:].decode("utf-8", "replace")
        except OSError:
            return ""

    def alive(self):
        return self.proc.poll() is None

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def request(port, method, path, body=None, headers=None, timeout=30.0, key=None):
    """One request on a fresh connection: (status, headers {lower: value}, body bytes)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        h = dict(headers or {})
        if key is not None:
            h["Authorization"] = "Bearer " + key
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
            h.setdefault("Content-Type", "application/json")
        elif isinstance(body, str):
            body = body.encode()
        conn.request(method, path, body=body, headers=h)
        r = conn.getresponse()
        data = r.read()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, data
    finally:
        conn.close()


def jbody(data):
    try:
        return json.loads(data)
    except ValueError:
        return None


def err_message(data):
    j = jbody(data)
    if isinstance(j, dict) and isinstance(j.get("error"), dict):
        return str(j["error"].get("message", ""))
    return data[:200].decode("utf-8", "replace")


def error_shape_ok(data, status):
    j = jbody(data)
    if not (isinstance(j, dict) and isinstance(j.get("error"), dict)):
        return False
    e = j["error"]
    return e.get("code") == status and isinstance(e.get("message"), str) and "type" in e


def health_ok(port, timeout=5.0):
    try:
        return request(port, "GET", "/health", timeout=timeout)[0] == 200
    except OSError:
        return False


def timed(fn, *a, **kw):
    t0 = time.monotonic()
    r = fn(*a, **kw)
    return r, time.monotonic() - t0


def normal_completion(port, key=KEY_A, timeout=30.0):
    """A short greedy completion: (ok, seconds)."""
    t0 = time.monotonic()
    try:
        st, _, data = request(port, "POST", "/completion",
                              {"prompt": "1 2 3 4", "n_predict": 8, "temperature": 0},
                              key=key, timeout=timeout)
        j = jbody(data)
        ok = st == 200 and isinstance(j, dict) and "content" in j
    except OSError:
        ok = False
    return ok, time.monotonic() - t0


def normal_health(port):
    t0 = time.monotonic()
    ok = health_ok(port, timeout=10)
    return ok, time.monotonic() - t0


def raw_exchange(port, chunks, read_timeout=10.0):
    """Sends the byte chunks (head, body pieces) from a thread while reading the answer.

    Returns a dict: status (None when no status line came), head (text), body (bytes), sent
    (bytes the kernel took), send_error, closed (the server closed the connection), t_status
    (seconds to the status line), recv_error, elapsed."""
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.settimeout(read_timeout)
    res = {"status": None, "head": "", "body": b"", "sent": 0, "send_error": None,
           "closed": False, "t_status": None, "recv_error": None}
    stop = threading.Event()

    def sender():
        try:
            for c in chunks:
                if stop.is_set():
                    return
                s.sendall(c)
                res["sent"] += len(c)
        except OSError as e:
            res["send_error"] = type(e).__name__

    t0 = time.monotonic()
    th = threading.Thread(target=sender, daemon=True)
    th.start()
    buf = b""
    deadline = t0 + read_timeout
    need = None
    while time.monotonic() < deadline:
        try:
            d = s.recv(65536)
        except socket.timeout:
            break
        except OSError as e:
            res["recv_error"] = type(e).__name__
            break
        if not d:
            res["closed"] = True
            break
        buf += d
        if res["status"] is None and b"\r\n" in buf:
            res["t_status"] = time.monotonic() - t0
            parts = buf.split(b"\r\n", 1)[0].split()
            if len(parts) >= 2 and parts[1].isdigit():
                res["status"] = int(parts[1])
        if b"\r\n\r\n" in buf and need is None:
            head = buf.partition(b"\r\n\r\n")[0]
            res["head"] = head.decode("latin-1")
            need = 0
            for line in res["head"].split("\r\n")[1:]:
                k, _, v = line.partition(":")
                if k.strip().lower() == "content-length":
                    need = int(v.strip())
        if need is not None and len(buf.partition(b"\r\n\r\n")[2]) >= need:
            break
    if b"\r\n\r\n" in buf:
        res["body"] = buf.partition(b"\r\n\r\n")[2]
    elif buf:
        res["head"] = buf[:200].decode("latin-1")
    res["elapsed"] = time.monotonic() - t0
    stop.set()
    try:
        s.close()
    except OSError:
        pass
    th.join(5)
    return res


def head_bytes(method, path, port, headers=(), host=None):
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host or f'127.0.0.1:{port}'}"]
    lines += [f"{k}: {v}" for k, v in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def body_pieces(total, piece=64 * 1024):
    block = b"x" * piece
    left = total
    while left > 0:
        n = min(piece, left)
        yield block[:n]
        left -= n


def chunked_pieces(total, piece=64 * 1024):
    block = b"7" * piece
    left = total
    while left > 0:
        n = min(piece, left)
        yield f"{n:x}\r\n".encode() + block[:n] + b"\r\n"
        left -= n
    yield b"0\r\n\r\n"


def fmt_mb(kb):
    return f"{kb / 1024:.1f} MB"


# ---------------------------------------------------------------------------------------------
# Results


class Check:
    def __init__(self, num, name):
        self.num, self.name = num, name
        self.fails = []
        self.figures = []
        self.status = ""  # what the attack got, for the table
        self.rss = ""
        self.latency = ""

    def expect(self, cond, what):
        if not cond:
            self.fails.append(what)
        return cond

    def fig(self, text):
        self.figures.append(text)


class Ctx:
    def __init__(self, workdir):
        self.workdir = workdir
        self.main = None
        self.save_dir = os.path.join(workdir, "slots")
        self.stale_tmp = self.live_tmp = ""
        self.idle_rss = 0
        self.idle_threads = 0
        self.n_vocab = None


def common_after(ctx, c, rss_before, unauth, during_latency=None, rss_peak=None):
    """Health, a normal completion under 2 s, RSS within the slack."""
    port, pid = ctx.main.port, ctx.main.pid
    c.expect(ctx.main.alive(), "server process exited: " + ctx.main.tail())
    c.expect(health_ok(port), "GET /health is not 200 after the attack")
    ok, lat = normal_completion(port)
    c.expect(ok, "normal completion after the attack failed")
    c.expect(lat < NORMAL_LATENCY_S, f"normal completion after the attack took {lat:.2f} s")
    if during_latency is None:
        c.latency = f"{lat * 1000:.0f} ms after"
    else:
        c.latency = f"{during_latency * 1000:.0f} ms during, {lat * 1000:.0f} ms after"
    rss_after = rss_kb(pid)
    delta = rss_after - rss_before
    c.rss = f"{fmt_mb(rss_before)} -> {fmt_mb(rss_after)} ({delta / 1024:+.1f} MB)"
    if rss_peak is not None:
        c.rss += f", peak {fmt_mb(rss_peak)}"
    c.fig(f"rss {c.rss}; normal completion {c.latency}")
    if unauth:  # measured from the check's own start (earlier checks may have grown the heap)
        c.expect(delta <= RSS_SLACK_KB,
                 f"RSS {fmt_mb(rss_after)} is over {fmt_mb(rss_before)} before + 64 MB")
        if rss_peak is not None:
            c.expect(rss_peak - rss_before <= RSS_SLACK_KB,
                     f"peak RSS {fmt_mb(rss_peak)} is over {fmt_mb(rss_before)} before + 64 MB")


# ---------------------------------------------------------------------------------------------
# 1. Range


def check_range(ctx, c):
    port, pid = ctx.main.port, ctx.main.pid
    rss0 = rss_kb(pid)
    st, h, plain = request(port, "GET", "/")
    c.expect(st == 200 and len(plain) > 0, f"GET / without Range: {st}, {len(plain)} bytes")
    got = []
    with RssPeak(pid) as peak:
        for label, ranges in (("2000 x '0-'", ",".join(["0-"] * 2000)),
                              ("2000 x 'i-i'", ",".join(f"{i % 100}-{i % 100}" for i in range(2000)))):
            hdr = "bytes=" + ranges
            (st, h, data), dt = timed(request, port, "GET", "/", None, {"Range": hdr})
            got.append(f"{label} ({len(hdr)} B header): {st}, {len(data)} B in "
                       f"{dt * 1000:.0f} ms")
            c.expect(st == 200, f"GET / with Range {label}: status {st}, expected 200")
            c.expect(data == plain, f"GET / with Range {label}: {len(data)} bytes, expected the "
                     f"page's own {len(plain)} bytes")
            c.expect("multipart" not in h.get("content-type", ""), "answered multipart/byteranges")
    c.status = f"200, {len(data)} B (page {len(plain)} B)"
    c.fig("; ".join(got))
    common_after(ctx, c, rss0, unauth=True, rss_peak=peak.peak)


# ---------------------------------------------------------------------------------------------
# 2. Header floods


def check_headers(ctx, c):
    port, pid = ctx.main.port, ctx.main.pid
    rss0 = rss_kb(pid)
    got = []
    with RssPeak(pid) as peak:
        # 10,000 header fields (~150 KB).
        hdrs = [(f"X-Flood-{i}", "v") for i in range(10000)]
        r = raw_exchange(port, [head_bytes("GET", "/health", port, hdrs)])
        got.append(f"10k fields: {r['status']}")
        c.expect(r["status"] == 431, f"GET /health with 10,000 header fields: got status "
                 f"{r['status']} (closed={r['closed']}, recv_error={r['recv_error']}), expected 431")
        # 101 short fields (~1 KB): the count limit, not the size.
        hdrs = [(f"X-{i}", "v") for i in range(101)]
        r = raw_exchange(port, [head_bytes("GET", "/health", port, hdrs)])
        got.append(f"101 fields: {r['status']}")
        c.expect(r["status"] == 431, f"GET /health with 101 short header fields (1 KB head): "
                 f"got {r['status']}, expected 431")
        r = raw_exchange(port, [head_bytes("GET", "/health", port,
                                           [(f"X-{i}", "v") for i in range(90)])])
        c.expect(r["status"] == 200, f"GET /health with 90 header fields: got {r['status']}, "
                 "expected 200")
        # One 1 MB header line without a newline.
        start = f"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nX-Long: ".encode()
        r = raw_exchange(port, [start] + list(body_pieces(MiB)), read_timeout=12)
        got.append(f"1 MB line: {r['status'] or 'closed'} after {r['sent'] >> 10} KiB sent")
        c.expect(r["status"] == 431 or (r["status"] is None and (r["closed"] or r["recv_error"])),
                 f"a 1 MB header line without newline: status {r['status']}, closed "
                 f"{r['closed']}, after {r['elapsed']:.1f} s; expected 431 or a closed connection")
        # A request line of 100 KB.
        r = raw_exchange(port, [f"GET /{'a' * 100000} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
                               .encode()])
        got.append(f"100 KB request line: {r['status']}")
        c.expect(r["status"] in (431, 414, 400), f"a 100 KB request line: status {r['status']}, "
                 "expected 431/414/400")
        if r["status"] in (431, 414, 400):
            c.expect(error_shape_ok(r["body"], r["status"]),
                     f"the {r['status']} body is not the JSON error shape: {r['body'][:120]!r}")
    c.status = ", ".join(got)
    c.fig(c.status)
    common_after(ctx, c, rss0, unauth=True, rss_peak=peak.peak)


# ---------------------------------------------------------------------------------------------
# 3. Chunked bodies over --max-body, and Content-Encoding


def check_bodies(ctx, c):
    port, pid = ctx.main.port, ctx.main.pid
    rss0 = rss_kb(pid)
    got = []
    total = 64 * MiB
    with RssPeak(pid) as peak:
        h = head_bytes("POST", "/completion", port,
                       [("Authorization", "Bearer " + KEY_A), ("Content-Type", "application/json"),
                        ("Transfer-Encoding", "chunked")])
        r = raw_exchange(port, [h] + list(chunked_pieces(total)), read_timeout=20)
        got.append(f"chunked 64 MB with key: {r['status']} after {r['sent'] >> 20} MB sent")
        c.expect(r["status"] == 413, f"POST /completion (key A) with a 64 MB chunked body: got "
                 f"{r['status']}, expected 413 (--max-body 8 MiB)")
        c.expect(r["sent"] < total, "the whole 64 MB chunked body was taken")
        if r["status"] == 413:
            c.expect(error_shape_ok(r["body"], 413), f"413 body: {r['body'][:120]!r}")
        for path, key in (("/health", None), ("/completion", None), ("/health", KEY_A)):
            hs = [("Content-Type", "application/json"), ("Transfer-Encoding", "chunked")]
            if key:
                hs.append(("Authorization", "Bearer " + key))
            r = raw_exchange(port, [head_bytes("POST", path, port, hs)] +
                             list(chunked_pieces(total)), read_timeout=20)
            who = "key A" if key else "no key"
            got.append(f"POST {path} ({who}): {r['status']} after {r['sent'] >> 20} MB")
            c.expect(r["status"] is not None and 400 <= r["status"] < 500,
                     f"POST {path} ({who}) with a 64 MB chunked body: got {r['status']}, "
                     "expected a 4xx")
            c.expect(r["sent"] < total, f"POST {path} ({who}): the server read all 64 MB")
            if not key:
                c.expect(r["status"] == 401, f"POST {path} without a key: {r['status']}, "
                         "expected 401")
        # gzip
        gz = gzip.compress(json.dumps({"prompt": "1 2 3", "n_predict": 2}).encode())
        st, _, data = request(port, "POST", "/completion", gz,
                              {"Content-Encoding": "gzip", "Content-Type": "application/json"},
                              key=KEY_A)
        got.append(f"gzip: {st}")
        c.expect(st == 415, f"POST /completion with Content-Encoding: gzip: got {st}, expected 415")
        c.expect(error_shape_ok(data, st), f"{st} body not the JSON error shape: {data[:120]!r}")
        st, _, _ = request(port, "POST", "/completion",
                           {"prompt": "1 2 3", "n_predict": 2, "temperature": 0},
                           {"Content-Encoding": "identity"}, key=KEY_A)
        c.expect(st == 200, f"Content-Encoding: identity: got {st}, expected 200")
        # A GET with a body over 16 KiB.
        st, _, _ = request(port, "GET", "/health", b"x" * (64 * 1024),
                           {"Content-Type": "text/plain"})
        got.append(f"GET 64 KB body: {st}")
        c.expect(st == 413, f"GET /health with a 64 KiB body: got {st}, expected 413")
    c.status = "; ".join(got)
    c.fig(c.status)
    common_after(ctx, c, rss0, unauth=False, rss_peak=peak.peak)


# ---------------------------------------------------------------------------------------------
# 4. Slowloris


def check_slowloris(ctx, c):
    port, pid = ctx.main.port, ctx.main.pid
    rss0, th0 = rss_kb(pid), n_threads(pid)
    n = 500
    socks = []
    t_start = time.monotonic()
    for i in range(n):
        if time.monotonic() - t_start > 8.0:
            c.expect(False, f"opening the slow clients took over 8 s ({i} of {n} open)")
            break
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.sendall(f"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nX-Slow-{i}: ".encode())
            s.setblocking(False)
            socks.append(s)
        except OSError as e:
            c.expect(False, f"slow client {i} could not connect: {e}")
            break
    t_connect = time.monotonic() - t_start
    stop = threading.Event()

    def drip():
        while not stop.is_set():
            for s in socks:
                try:
                    s.send(b"a")
                except OSError:
                    pass
            stop.wait(0.5)

    dripper = threading.Thread(target=drip, daemon=True)
    dripper.start()
    lat_h, lat_c, th_max = [], [], th0
    with RssPeak(pid) as peak:
        time.sleep(1.0)
        for _ in range(3):
            th_max = max(th_max, n_threads(pid))
            ok, dt = normal_health(port)
            c.expect(ok, "GET /health failed during the slow clients")
            lat_h.append(dt)
            ok, dt = normal_completion(port)
            c.expect(ok, "a normal completion failed during the slow clients")
            lat_c.append(dt)
            time.sleep(0.5)
        # The head deadline (10 s) closes every slow client.
        while time.monotonic() - t_start < 13.0:
            th_max = max(th_max, n_threads(pid))
            time.sleep(0.5)
        stop.set()
        dripper.join()
        closed = 0
        for s in socks:
            try:
                d = s.recv(4096)
                if d == b"" or d.startswith(b"HTTP/1.1 4"):
                    closed += 1
            except BlockingIOError:
                pass
            except OSError:
                closed += 1
        for s in socks:
            s.close()
    worst_h, worst_c = max(lat_h), max(lat_c)
    c.fig(f"{len(socks)} slow conns (connected in {t_connect:.1f} s); health max {worst_h * 1000:.0f} ms, completion max "
          f"{worst_c * 1000:.0f} ms; threads {th0} -> max {th_max}; closed by the server "
          f"within 13 s: {closed}/{len(socks)}")
    c.status = f"{closed}/{len(socks)} closed by the head deadline; threads {th0} -> {th_max}"
    c.expect(worst_h < NORMAL_LATENCY_S, f"GET /health took {worst_h:.2f} s during the attack")
    c.expect(worst_c < NORMAL_LATENCY_S, f"a completion took {worst_c:.2f} s during the attack")
    c.expect(th_max - th0 <= 8, f"threads grew from {th0} to {th_max} with {n} slow connections")
    c.expect(closed >= 0.95 * len(socks), f"only {closed} of {len(socks)} slow connections were "
             "closed 13 s after they started (head deadline 10 s)")
    common_after(ctx, c, rss0, unauth=True, during_latency=max(worst_h, worst_c),
                 rss_peak=peak.peak)


# ---------------------------------------------------------------------------------------------
# 5. Parallel unauthenticated 8 MB uploads


def check_upload_flood(ctx, c):
    port, pid = ctx.main.port, ctx.main.pid
    rss0 = rss_kb(pid)
    n, size = 16, 8 * MiB
    results = [None] * n

    def one(i):
        key_hdr = [] if i % 2 == 0 else [("Authorization", "Bearer wrong-key")]
        h = head_bytes("POST", "/completion", port,
                       [("Content-Type", "application/json"), ("Content-Length", str(size))] +
                       key_hdr)
        results[i] = raw_exchange(port, [h] + list(body_pieces(size)), read_timeout=20)

    with RssPeak(pid) as peak:
        t0 = time.monotonic()
        ths = [threading.Thread(target=one, args=(i,)) for i in range(n)]
        for t in ths:
            t.start()
        ok, lat = normal_completion(port)
        c.expect(ok, "a normal completion failed during the uploads")
        for t in ths:
            t.join()
        wall = time.monotonic() - t0
    statuses = [r["status"] for r in results]
    t_status = [r["t_status"] for r in results if r["t_status"] is not None]
    sent = [r["sent"] for r in results]
    slowest = max(t_status) if t_status else float("inf")
    c.status = f"{statuses.count(401)}/{n} got 401, slowest after {slowest * 1000:.0f} ms"
    c.fig(f"{n} x 8 MB: statuses {sorted(set(map(str, statuses)))}, slowest 401 "
          f"{slowest * 1000:.0f} ms, wall {wall:.2f} s, most bytes taken {max(sent) >> 10} KiB, "
          f"completion during {lat * 1000:.0f} ms")
    c.expect(all(s == 401 for s in statuses), f"statuses {statuses}, expected 401 for every one")
    c.expect(slowest < 2.0, f"slowest 401 after {slowest:.2f} s")
    c.expect(max(sent) < size, "a whole 8 MB body was taken")
    c.expect(lat < NORMAL_LATENCY_S, f"a completion took {lat:.2f} s during the uploads")
    common_after(ctx, c, rss0, unauth=True, during_latency=lat, rss_peak=peak.peak)


# ---------------------------------------------------------------------------------------------
# 6. API keys


def check_auth(ctx, c):
    port, pid = ctx.main.port, ctx.main.pid
    rss0 = rss_kb(pid)
    got = []
    # Fail-closed startup.
    empty_file = os.path.join(ctx.workdir, "empty-keys.txt")
    with open(empty_file, "w") as f:
        f.write("# no key here\n\n")
    cases = [(["--api-key", ""], 2), (["--api-key", "a,,b"], 2), (["--api-key", ","], 2),
             (["--api-key-file", empty_file], 3),
             (["--api-key-file", os.path.join(ctx.workdir, "missing.txt")], 3)]
    for args, want in cases:
        try:
            p = subprocess.run([BINARY, "serve", "-m", MODEL, "--port", str(free_port())] + args,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=30)
            rc = p.returncode
        except subprocess.TimeoutExpired:
            rc = "still running after 30 s"
        shown = " ".join(a if a.startswith("--") else repr(os.path.basename(a)) for a in args)
        got.append(f"{shown}: exit {rc}")
        c.expect(rc == want, f"serve {shown}: exit {rc}, expected {want}")
    body = {"prompt": "1 2 3", "n_predict": 2, "temperature": 0}
    for label, hdrs, want in (
            ("no key", {}, 401),
            ("wrong Bearer", {"Authorization": "Bearer nope"}, 401),
            ("wrong X-Api-Key", {"X-Api-Key": "nope"}, 401),
            ("key A with a suffix", {"Authorization": "Bearer " + KEY_A + "x"}, 401),
            ("key A's prefix", {"Authorization": "Bearer " + KEY_A[:-1]}, 401),
            ("Basic scheme", {"Authorization": "Basic " + KEY_A}, 401),
            ("Bearer A", {"Authorization": "Bearer " + KEY_A}, 200),
            ("Bearer B (same list)", {"Authorization": "Bearer " + KEY_B}, 200),
            ("X-Api-Key B", {"X-Api-Key": KEY_B}, 200),
            ("Bearer C (2nd --api-key)", {"Authorization": "Bearer " + KEY_C}, 200),
            ("X-Api-Key D (key file)", {"X-Api-Key": KEY_D}, 200)):
        st, _, data = request(port, "POST", "/completion", body, hdrs)
        got.append(f"{label}: {st}")
        c.expect(st == want, f"POST /completion with {label}: got {st}, expected {want}")
        if want == 401 and st == 401:
            c.expect(error_shape_ok(data, 401) and
                     jbody(data)["error"]["type"] == "authentication_error",
                     f"401 body: {data[:150]!r}")
    for path in ("/health", "/v1/models", "/models", "/"):
        st, _, _ = request(port, "GET", path)
        c.expect(st == 200, f"public GET {path} without a key: {st}, expected 200")
    for path in ("/slots", "/monitor", "/props", "/metrics"):
        st, _, _ = request(port, "GET", path)
        c.expect(st == 401, f"GET {path} without a key: {st}, expected 401")
    st, _, _ = request(port, "POST", "/tokenize", {"content": "1 2"})
    c.expect(st == 401, f"POST /tokenize without a key: {st}, expected 401")
    c.status = "; ".join(got)
    c.fig(c.status)
    common_after(ctx, c, rss0, unauth=True)


# ---------------------------------------------------------------------------------------------
# 7. Host allow-list and CORS


def check_host_cors(ctx, c):
    port, pid = ctx.main.port, ctx.main.pid
    rss0 = rss_kb(pid)
    got = []
    for host, want in (("evil.example", 403), (f"evil.example:{port}", 403),
                       ("127.0.0.1.evil.example", 403), ("localhost.evil.example", 403),
                       (f"localhost:{port}", 200), ("LOCALHOST", 200), (f"127.0.0.1:{port}", 200),
                       (f"[::1]:{port}", 200)):
        r = raw_exchange(port, [head_bytes("GET", "/health", port, host=host)])
        got.append(f"Host {host}: {r['status']}")
        c.expect(r["status"] == want, f"GET /health with Host: {host}: got {r['status']}, "
                 f"expected {want}")
        if want == 403 and r["status"] == 403:
            c.expect(error_shape_ok(r["body"], 403) and
                     jbody(r["body"])["error"]["type"] == "permission_error",
                     f"403 body: {r['body'][:150]!r}")
    # A foreign Host is refused on a keyed route too, key or not.
    r = raw_exchange(port, [head_bytes("POST", "/completion", port,
                                       [("Authorization", "Bearer " + KEY_A),
                                        ("Content-Length", "2")], host="evil.example"), b"{}"])
    c.expect(r["status"] == 403, f"POST /completion with key A and Host: evil.example: "
             f"{r['status']}, expected 403")

    def acao(method, path, origin, extra=None, key=None):
        h = {"Origin": origin}
        h.update(extra or {})
        st, hd, _ = request(port, method, path, None, h, key=key)
        return st, hd.get("access-control-allow-origin")

    st, a = acao("GET", "/health", "http://evil.example")
    got.append(f"GET, Origin evil: ACAO {a}")
    c.expect(a is None, f"GET /health with Origin http://evil.example: ACAO {a!r}, expected none")
    st, a = acao("GET", "/slots", "http://evil.example", key=KEY_A)
    c.expect(a is None, f"GET /slots (key A) with a foreign Origin: ACAO {a!r}")
    st, a = acao("OPTIONS", "/completion", "http://evil.example",
                 {"Access-Control-Request-Method": "POST"})
    got.append(f"OPTIONS, Origin evil: {st}, ACAO {a}")
    c.expect(a is None, f"preflight from http://evil.example: ACAO {a!r}, expected none")
    st, a = acao("GET", "/health", GOOD_ORIGIN)
    got.append(f"GET, Origin good: ACAO {a}")
    c.expect(a == GOOD_ORIGIN, f"GET /health with Origin {GOOD_ORIGIN} (--cors-origin): ACAO "
             f"{a!r}, expected {GOOD_ORIGIN}")
    st, a = acao("OPTIONS", "/completion", GOOD_ORIGIN, {"Access-Control-Request-Method": "POST"})
    got.append(f"OPTIONS, Origin good: {st}, ACAO {a}")
    c.expect(st in (200, 204) and a == GOOD_ORIGIN,
             f"preflight from {GOOD_ORIGIN}: {st}, ACAO {a!r}")
    st, a = acao("GET", "/health", GOOD_ORIGIN + ".evil.example")
    c.expect(a is None, f"Origin {GOOD_ORIGIN}.evil.example: ACAO {a!r}, expected none")
    st, a = acao("GET", "/health", "null")
    c.expect(a is None, f"Origin null: ACAO {a!r}, expected none")
    c.status = "; ".join(got)
    c.fig(c.status)
    common_after(ctx, c, rss0, unauth=True)


# ---------------------------------------------------------------------------------------------
# 8. Deep JSON and schemas


def check_deep_json(ctx, c):
    port, pid = ctx.main.port, ctx.main.pid
    rss0 = rss_kb(pid)
    depth = 100000
    got = []
    deep_array = "[" * depth + "]" * depth
    deep_pattern = "(" * 15000 + "a" + ")" * 15000
    pattern_schema = {"type": "object",
                      "properties": {"x": {"type": "string", "pattern": deep_pattern}},
                      "required": ["x"]}
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0}
    cases = [
        ("body nested 100k (arrays)", "/completion", deep_array),
        ("body nested 100k (objects)", "/completion", '{"a":' * depth + "1" + "}" * depth),
        ("prompt nested 100k", "/completion", '{"n_predict":2,"prompt":' + deep_array + "}"),
        ("json_schema const nested 100k", "/completion",
         '{"prompt":"1","n_predict":2,"json_schema":{"const":' + deep_array + "}}"),
        ("json_schema items nested 20k", "/completion",
         '{"prompt":"1","n_predict":2,"json_schema":' + '{"items":' * 20000 +
         '{"type":"string"}' + "}" * 20000 + "}"),
        ("json_schema pattern 15k groups", "/completion",
         json.dumps({"prompt": "1", "n_predict": 2, "json_schema": pattern_schema})),
        ("response_format pattern 15k groups", "/v1/chat/completions",
         json.dumps(dict(chat, response_format={"type": "json_schema", "json_schema": {
             "name": "x", "schema": pattern_schema}}))),
        ("tool parameters pattern 15k groups, tool_choice required", "/v1/chat/completions",
         json.dumps(dict(chat, tool_choice="required", tools=[{"type": "function", "function": {
             "name": "f", "parameters": pattern_schema}}]))),
        ("tool parameters pattern 15k groups, tool_choice auto", "/v1/chat/completions",
         json.dumps(dict(chat, tools=[{"type": "function", "function": {
             "name": "f", "parameters": pattern_schema}}]))),
    ]
    with RssPeak(pid) as peak:
        for label, path, body in cases:
            try:
                (st, _, data), dt = timed(request, port, "POST", path, body.encode(),
                                          {"Content-Type": "application/json"}, 60, KEY_A)
            except OSError as e:
                st, data, dt = f"no answer ({type(e).__name__})", b"", 0
            got.append(f"{label}: {st} in {dt * 1000:.0f} ms")
            c.expect(st == 400, f"POST {path} {label}: got {st} in {dt:.2f} s, expected 400; "
                     f"{err_message(data)[:160]!r}")
            if st == 400:
                c.expect(error_shape_ok(data, 400), f"{label}: 400 body {data[:120]!r}")
            c.expect(dt < 10, f"{label}: {dt:.1f} s to answer")
            if not ctx.main.alive():
                c.expect(False, f"the server died on {label}")
                break
        # Wide, not deep: one object of 50,000 members (600 KB) must parse in linear time.
        wide = ('{"prompt":"1","n_predict":2,' +
                ",".join(f'"k{i}":0' for i in range(50000)) + "}")
        try:
            (st, _, data), dt = timed(request, port, "POST", "/completion", wide.encode(),
                                      {"Content-Type": "application/json"}, 60, KEY_A)
        except OSError as e:
            st, data, dt = f"no answer ({type(e).__name__})", b"", 60
        got.append(f"object of 50k members: {st} in {dt * 1000:.0f} ms")
        c.expect(st in (200, 400) and dt < NORMAL_LATENCY_S,
                 f"POST /completion with 50,000 members in the body object ({len(wide) >> 10} "
                 f"KiB): {st} after {dt:.2f} s, expected an answer (200 or 400) in < 2 s")
        # Many objects just under a per-object cap: 2,000 objects of 4,000 members (~50 MB
        # would exceed --max-body; 8 MiB of them is ~110 objects): the work stays bounded.
        obj = "{" + ",".join(f'"k{i}":0' for i in range(4000)) + "}"
        n_obj = (8 << 20) // (len(obj) + 1) - 1
        many = ('{"prompt":"1","n_predict":2,"x":[' + ",".join([obj] * n_obj) + "]}")
        try:
            (st, _, data), dt = timed(request, port, "POST", "/completion", many.encode(),
                                      {"Content-Type": "application/json"}, 60, KEY_A)
        except OSError as e:
            st, data, dt = f"no answer ({type(e).__name__})", b"", 60
        got.append(f"{n_obj} objects of 4k members: {st} in {dt * 1000:.0f} ms")
        c.expect(st in (200, 400) and dt < NORMAL_LATENCY_S,
                 f"POST /completion with {n_obj} objects of 4,000 members "
                 f"({len(many) >> 10} KiB): {st} after {dt:.2f} s, expected an answer in < 2 s")
    c.status = "; ".join(got)
    c.fig(c.status)
    common_after(ctx, c, rss0, unauth=False, rss_peak=peak.peak)


# ---------------------------------------------------------------------------------------------
# 9. Sampling fields, logit_bias, n, /tokenize


def check_fields(ctx, c):
    port, pid = ctx.main.port, ctx.main.pid
    rss0 = rss_kb(pid)
    got = []
    base = {"prompt": "1 2 3", "n_predict": 4, "temperature": 0}
    nv = ctx.n_vocab or 1024

    def post(path, body, raw=False, timeout=60):
        data = body if raw else json.dumps(body).encode()
        return request(port, "POST", path, data, {"Content-Type": "application/json"},
                       timeout, KEY_A)

    with RssPeak(pid) as peak:
        for field, value, raw in (("temperature", 1e30, None), ("top_p", 7, None),
                                  ("n_predict", -5, None), ("top_k", -2, None),
                                  ("min_p", 1.5, None), ("repeat_penalty", -1, None),
                                  ("n_probs", 100000, None), ("temperature", None, "1e400"),
                                  ("top_p", None, "-1e400"), ("temperature", None, "NaN"),
                                  ("temperature", "nan", None), ("n_predict", 1e20, None),
                                  ("max_tokens", -7, None)):
            if raw is None:
                st, _, data = post("/completion", dict(base, **{field: value}))
                shown = repr(value)
            else:
                text = json.dumps(base)[:-1] + f', "{field}": {raw}' + "}"
                st, _, data = post("/completion", text.encode(), raw=True)
                shown = raw
            msg = err_message(data)
            got.append(f"{field}={shown}: {st}")
            c.expect(st == 400, f"POST /completion {field}={shown}: got {st}, expected 400")
            if st == 400 and raw is None:
                c.expect(field in msg, f"{field}={shown}: the 400 message does not name the "
                         f"field: {msg[:150]!r}")
        # logit_bias: one huge text key, many entries.
        (st, _, data), dt = timed(post, "/completion",
                                  dict(base, logit_bias=[["7" * (2 * MiB), -1.0]]))
        got.append(f"logit_bias 2 MB text key: {st} in {dt * 1000:.0f} ms")
        c.expect(st in (200, 400), f"logit_bias with a 2 MB text key: {st}")
        c.expect(dt < 10, f"logit_bias with a 2 MB text key took {dt:.1f} s")
        (st, _, data), dt = timed(post, "/completion",
                                  dict(base, logit_bias=[[i % nv, 0.5] for i in range(300000)]))
        got.append(f"logit_bias 300k pairs: {st} in {dt * 1000:.0f} ms")
        c.expect(st in (200, 400), f"logit_bias with 300,000 pairs: {st}")
        c.expect(dt < 10, f"logit_bias with 300,000 pairs took {dt:.1f} s")
        (st, _, data), dt = timed(post, "/completion",
                                  dict(base, logit_bias={f"{i}{'9' * 20}": 0.1
                                                         for i in range(10000)}))
        got.append(f"logit_bias 10k text keys: {st} in {dt * 1000:.0f} ms")
        c.expect(st in (200, 400), f"logit_bias object with 10,000 text keys: {st}")
        c.expect(dt < NORMAL_LATENCY_S, f"logit_bias with 10,000 text keys took {dt:.1f} s")
        for label, path, body in (
                ("n_cmpl 1000", "/completion", dict(base, n_cmpl=1000)),
                ("n_cmpl 17", "/completion", dict(base, n_cmpl=17)),
                ("n 1000 (chat)", "/v1/chat/completions",
                 {"messages": [{"role": "user", "content": "hi"}], "n": 1000, "max_tokens": 2}),
                ("n 1000 (/v1/completions)", "/v1/completions",
                 {"prompt": "1", "n": 1000, "max_tokens": 2}),
                ("100 prompts x n_cmpl 16", "/completion",
                 dict(base, prompt=["1 2"] * 100, n_cmpl=16))):
            st, _, data = post(path, body)
            got.append(f"{label}: {st}")
            c.expect(st == 400, f"POST {path} {label}: got {st}, expected 400")
    c.expect(peak.peak - rss0 <= 256 * 1024,
             f"peak RSS {fmt_mb(peak.peak)} is over {fmt_mb(rss0)} + 256 MB (fields, logit_bias)")
    # /tokenize with_pieces on 1 MiB of digits (~400k tokens), twice: a 400 naming a limit, or
    # an answer whose memory is bounded and given back.
    text = "12 34 5678 " * (MiB // 11)
    tk = []
    for attempt in range(2):
        r0 = rss_kb(pid)
        with RssPeak(pid) as tpeak:
            (st, _, data), dt = timed(post, "/tokenize", {"content": text, "with_pieces": True})
        r1 = rss_kb(pid)
        tk.append((st, dt, r0, tpeak.peak, r1))
        got.append(f"/tokenize 1 MiB with_pieces #{attempt + 1}: {st}, {len(data) >> 10} KiB in "
                   f"{dt * 1000:.0f} ms, RSS {fmt_mb(r0)} -> peak {fmt_mb(tpeak.peak)} -> "
                   f"{fmt_mb(r1)}")
        c.expect(st in (200, 400, 413), f"/tokenize 1 MiB with_pieces: {st}")
        if st == 400:
            m = err_message(data).lower()
            c.expect(any(w in m for w in ("limit", "most", "too", "max")),
                     f"/tokenize 400 does not name a limit: {m[:150]!r}")
            break
        c.expect(dt < 5, f"/tokenize of 1 MiB with_pieces took {dt:.1f} s")
        c.expect(tpeak.peak - r0 <= 256 * 1024,
                 f"/tokenize of 1 MiB with_pieces (a {len(data) >> 20} MB answer): RSS "
                 f"{fmt_mb(r0)} -> peak {fmt_mb(tpeak.peak)}, over + 256 MB")
    peak_all = max([peak.peak] + [t[3] for t in tk])
    if len(tk) == 2:
        c.expect(tk[1][4] - tk[0][4] <= RSS_SLACK_KB,
                 f"the same /tokenize again grew RSS from {fmt_mb(tk[0][4])} to "
                 f"{fmt_mb(tk[1][4])} (memory not given back)")
    # Every token banned: the answer ends cleanly with no banned token.
    ban = [[i, False] for i in range(nv)]
    (st, _, data), dt = timed(post, "/completion",
                              dict(base, n_predict=16, logit_bias=ban, return_tokens=True))
    j = jbody(data) or {}
    got.append(f"all {nv} banned: {st}, tokens {j.get('tokens')}, stop_type {j.get('stop_type')}")
    c.expect(st in (200, 400), f"logit_bias banning all {nv} tokens: {st}")
    if st == 200:
        c.expect(j.get("tokens") == [] and j.get("content") == "",
                 f"every token banned, yet the answer holds tokens {j.get('tokens')!r} / "
                 f"content {j.get('content')!r}")
    c.expect(dt < 5, f"banning every token took {dt:.1f} s")
    # ... all but one: only that one may come out.
    st0, _, d0 = post("/completion", dict(base, n_predict=1, return_tokens=True))
    if st0 == 200 and (jbody(d0) or {}).get("tokens"):
        keep = jbody(d0)["tokens"][0]
        ban = [[i, False] for i in range(nv) if i != keep]
        st, _, data = post("/completion", dict(base, n_predict=6, logit_bias=ban,
                                               return_tokens=True))
        toks = (jbody(data) or {}).get("tokens")
        got.append(f"all but {keep} banned: {st}, tokens {toks}")
        c.expect(st == 200 and toks is not None and all(t == keep for t in toks),
                 f"all but token {keep} banned: {st}, tokens {toks}")
    c.status = "; ".join(got)
    c.fig(c.status)
    common_after(ctx, c, rss0, unauth=False, rss_peak=peak_all)


# ---------------------------------------------------------------------------------------------
# 10. Tenants and the prefix cache


def check_tenants(ctx, c):
    port, pid = ctx.main.port, ctx.main.pid
    rss0 = rss_kb(pid)
    got = []
    P = " ".join(str(i) for i in range(100, 300))

    def comp(key, prompt, salt=None):
        b = {"prompt": prompt, "n_predict": 2, "temperature": 0}
        if salt is not None:
            b["cache_salt"] = salt
        st, _, data = request(port, "POST", "/completion", b, key=key)
        j = jbody(data) or {}
        return (st, (j.get("timings") or {}).get("cache_n"), j.get("id_slot"),
                j.get("tokens_evaluated"))

    st, cn, slot_a, n_eval = comp(KEY_A, P)
    c.expect(st == 200, f"A's completion: {st}")
    got.append(f"A, P ({n_eval} tokens): cache_n {cn}, slot {slot_a}")
    # Every probe comes from a scope that has cached nothing yet.
    probes = [("E, P", KEY_E, P, None), ("F, P[:1/2]", KEY_F, P[:len(P) // 2], None),
              ("A salt s1, P", KEY_A, P, "s1"),
              ("E salt s2, P[:1/4]", KEY_E, P[:len(P) // 4], "s2"),
              ("G salt s3, P + more", KEY_G, P + " 300 301", "s3")]
    for label, key, prompt, salt in probes:
        st, cn, _, _ = comp(key, prompt, salt)
        got.append(f"{label}: cache_n {cn}")
        c.expect(st == 200 and cn == 0, f"{label}: status {st}, cache_n {cn}, expected 0")
    st, cn, slot_a2, _ = comp(KEY_A, P)
    got.append(f"A again: cache_n {cn}")
    c.expect(st == 200 and cn is not None and n_eval is not None and cn >= n_eval - 1,
             f"A again: cache_n {cn}, expected >= {n_eval - 1 if n_eval else '?'}")
    st, _, _ = request(port, "POST", "/completion",
                       {"prompt": "1", "n_predict": 1, "cache_salt": "s" * 257}, key=KEY_A)
    c.expect(st == 400, f"cache_salt of 257 bytes: {st}, expected 400")
    # Chat: A, then G (unsalted G has cached nothing), then A again.
    msg = {"messages": [{"role": "user", "content": "Repeat: " + P}], "max_tokens": 2,
           "temperature": 0}

    def chat(key):
        st, _, data = request(port, "POST", "/v1/chat/completions", msg, key=key)
        j = jbody(data) or {}
        ct = ((j.get("usage") or {}).get("prompt_tokens_details") or {}).get("cached_tokens")
        return st, ct, (j.get("timings") or {}).get("cache_n")

    chat(KEY_A)
    st, ct, cn = chat(KEY_G)
    got.append(f"G chat: cached_tokens {ct}, cache_n {cn}")
    c.expect(st == 200 and ct == 0 and cn == 0, f"G's chat after A's: {st}, cached_tokens {ct}, "
             f"cache_n {cn}, expected 0")
    st, ct, cn = chat(KEY_A)
    got.append(f"A chat again: cached_tokens {ct}")
    c.expect(st == 200 and ct and ct > 0, f"A's chat again: cached_tokens {ct}, expected > 0")
    # /slots and /monitor as G sees them (G has made one unsalted request: the chat).
    _, _, data_a = request(port, "GET", "/slots", key=KEY_A)
    a_slots = {s.get("id"): s for s in (jbody(data_a) or [])}
    a_ids = [i for i, s in a_slots.items() if s.get("n_past", 0) > 0]
    c.expect(slot_a2 in a_ids, f"A's own /slots shows no n_past for slot {slot_a2}")
    st, _, data = request(port, "GET", "/slots", key=KEY_G)
    d_slots = {s.get("id"): s for s in (jbody(data) or [])}
    c.expect(st == 200 and all(i in d_slots for i in a_ids), f"G's /slots: {st}, lists "
             f"{sorted(d_slots)}")
    for i in a_ids:
        if d_slots.get(i, {}).get("n_past", 0) > 0 and a_slots[i] == d_slots[i]:
            continue  # a slot G itself holds (its chat) looks alike to both
        s = d_slots.get(i, {})
        leak = {k: v for k, v in s.items()
                if k in ("n_past", "n_prompt_tokens", "n_decoded", "id_task", "prompt",
                         "is_processing", "next_token", "tokens")
                and v not in (0, -1, False, None, "", [])}
        c.expect(not leak, f"G's /slots shows A's slot {i} with {leak}")
    got.append(f"G's view of A's slot {slot_a2}: n_past {d_slots.get(slot_a2, {}).get('n_past')}")
    st, _, data = request(port, "GET", "/monitor", key=KEY_G)
    mon = jbody(data) or {}
    for s in mon.get("slots", []):
        if s.get("id") == slot_a2:
            leak = {k: v for k, v in s.items() if k in ("n_past", "n_prompt", "n_decoded", "busy")
                    and v not in (0, False, None)}
            c.expect(not leak, f"G's /monitor shows A's slot {slot_a2} with {leak}")
    recent = mon.get("recent", [])
    got.append(f"G's /monitor recent: {len(recent)} entries")
    c.expect(st == 200 and all(r.get("prompt_n") != n_eval for r in recent) and
             sum(r.get("route") == "/v1/chat/completions" for r in recent) <= 1,
             f"G's /monitor recent lists other tenants' requests: {recent[:4]}")
    c.status = "; ".join(got)
    c.fig(c.status)
    common_after(ctx, c, rss0, unauth=False)


# ---------------------------------------------------------------------------------------------
# 11. Slot files


def check_slot_files(ctx, c):
    port, pid = ctx.main.port, ctx.main.pid
    rss0 = rss_kb(pid)
    got = []
    c.expect(not os.path.exists(ctx.stale_tmp), f"stale {os.path.basename(ctx.stale_tmp)} is "
             "still in --slot-save-path after startup")
    c.expect(os.path.exists(ctx.live_tmp), f"{os.path.basename(ctx.live_tmp)} of a running "
             "process was removed at startup")
    got.append(f"stale tmp removed at startup: {not os.path.exists(ctx.stale_tmp)}")
    abs_dir = os.path.realpath(ctx.save_dir)

    def leaks(msg):
        return abs_dir in msg or ctx.save_dir in msg or ctx.workdir in msg

    st, _, data = request(port, "POST", "/completion",
                          {"prompt": "5 6 7 8 9", "n_predict": 2, "temperature": 0}, key=KEY_A)
    slot = (jbody(data) or {}).get("id_slot", 0)
    bad = ["a\x00b", "a\x01b", "a\nb", "a/b", "/etc/passwd", "..", "../x", "./x", ".hidden",
           "x" * 200, "x" * 129, "a\\b", "a.tmp.1", "", "a b", "caf\u00e9", "key-x/../y"]
    n400 = 0
    for name in bad:
        for action in ("save", "restore"):
            st, _, data = request(port, "POST", f"/slots/{slot}?action={action}",
                                  {"filename": name}, key=KEY_A)
            msg = err_message(data)
            n400 += st == 400
            c.expect(st == 400, f"{action} filename {name[:20]!r}: got {st}, expected 400")
            c.expect(not leaks(msg), f"{action} {name[:20]!r}: the message shows the folder: "
                     f"{msg[:200]!r}")
    got.append(f"{n400}/{2 * len(bad)} bad names -> 400")
    st, _, data = request(port, "POST", f"/slots/{slot}?action=save", {"filename": 7}, key=KEY_A)
    c.expect(st == 400, f"save with filename 7 (a number): {st}")
    # A saves; B can neither restore it nor save or erase A's slot.
    st, _, data = request(port, "POST", f"/slots/{slot}?action=save", {"filename": "mine.bin"},
                          key=KEY_A)
    c.expect(st == 200 and (jbody(data) or {}).get("n_saved", 0) > 0,
             f"A saves slot {slot}: {st} {data[:150]!r}")
    c.expect(not os.path.exists(os.path.join(ctx.save_dir, "mine.bin")),
             "A's file is in the shared folder, not its key's folder")
    st, _, data = request(port, "POST", f"/slots/{slot}?action=restore", {"filename": "mine.bin"},
                          key=KEY_A)
    c.expect(st == 200, f"A restores its own file: {st} {data[:150]!r}")
    other = (slot + 1) % 8
    st, _, data = request(port, "POST", f"/slots/{other}?action=restore",
                          {"filename": "mine.bin"}, key=KEY_B)
    msg = err_message(data)
    got.append(f"B restores A's file: {st}")
    c.expect(st == 400, f"B restores A's 'mine.bin' into slot {other}: {st}, expected 400 "
             f"({msg[:150]!r})")
    c.expect(not leaks(msg), f"B's error shows the folder: {msg!r}")
    st, _, data = request(port, "POST", f"/slots/{slot}?action=save", {"filename": "stolen.bin"},
                          key=KEY_B)
    got.append(f"B saves A's slot: {st}")
    c.expect(st == 400 or (st == 200 and (jbody(data) or {}).get("n_saved") == 0),
             f"B saves A's slot {slot}: {st} {data[:150]!r}, expected a refusal")
    st, _, data = request(port, "POST", f"/slots/{slot}?action=erase", None, key=KEY_B)
    got.append(f"B erases A's slot: {st}")
    c.expect(st == 400, f"B erases A's slot {slot}: {st} {data[:150]!r}, expected 400")
    st, _, data = request(port, "POST", "/completion",
                          {"prompt": "5 6 7 8 9", "n_predict": 2, "temperature": 0}, key=KEY_A)
    cn = ((jbody(data) or {}).get("timings") or {}).get("cache_n")
    c.expect(st == 200 and cn and cn > 0, f"A's cells are gone after B's attempts: cache_n {cn}")
    for sid in ("-1", "99999", "abc", "99999999999999999999"):
        st, _, data = request(port, "POST", f"/slots/{sid}?action=save", {"filename": "x"},
                              key=KEY_A)
        c.expect(400 <= st < 500, f"save into slot {sid!r}: {st}, expected a 4xx")
    c.status = "; ".join(got)
    c.fig(c.status)
    common_after(ctx, c, rss0, unauth=False)


# ---------------------------------------------------------------------------------------------
# 12. 64 clients with random hang-ups


COUNT_PROMPTS = [(1, 12), (40, 52), (100, 108), (7, 19), (250, 262), (3, 9), (500, 510),
                 (61, 70)]


def chat_body(i, stream):
    a, b = COUNT_PROMPTS[i % len(COUNT_PROMPTS)]
    return {"messages": [{"role": "user",
                          "content": f"Count from {a} to {b}, one number per line."}],
            "max_tokens": 48, "temperature": 0, "stream": stream}


def stream_chat(port, body, key, hang_after=None, timeout=60):
    """An SSE chat: ("done", text), or ("hung up", None) after hang_after events."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", "/v1/chat/completions", json.dumps(body).encode(),
                     {"Content-Type": "application/json", "Authorization": "Bearer " + key})
        r = conn.getresponse()
        if r.status != 200:
            return ("status", r.status)
        text, events = "", 0
        while True:
            line = r.fp.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                return ("done", text)
            events += 1
            if hang_after is not None and events >= hang_after:
                conn.sock.shutdown(socket.SHUT_RDWR)
                return ("hung up", None)
            for ch in json.loads(payload).get("choices", []):
                text += (ch.get("delta") or {}).get("content") or ""
        return ("eof", text)
    finally:
        conn.close()


def check_many_clients(ctx, c):
    port, pid = ctx.main.port, ctx.main.pid
    solo = {}
    for i in range(len(COUNT_PROMPTS)):
        st, _, data = request(port, "POST", "/v1/chat/completions", chat_body(i, False), key=KEY_C)
        c.expect(st == 200, f"solo answer {i}: {st}")
        solo[i] = ((jbody(data) or {}).get("choices") or [{}])[0].get("message", {}).get("content")
    time.sleep(0.3)
    rss0, th0 = rss_kb(pid), n_threads(pid)
    rng = random.Random(12)
    kinds = []
    for _ in range(64):
        r = rng.random()
        kinds.append("stream-hangup" if r < 0.25 else "post-hangup" if r < 0.4 else
                     "head-hangup" if r < 0.45 else "stream" if r < 0.7 else "plain")
    hang = [rng.randint(1, 6) for _ in range(64)]
    results = [None] * 64
    keys = [KEY_A, KEY_B, KEY_C, KEY_D]

    def client(i):
        k, key, p = kinds[i], keys[i % 4], i % len(COUNT_PROMPTS)
        try:
            if k == "stream-hangup":
                results[i] = stream_chat(port, chat_body(p, True), key, hang_after=hang[i])
            elif k == "stream":
                results[i] = stream_chat(port, chat_body(p, True), key)
            elif k == "plain":
                st, _, data = request(port, "POST", "/v1/chat/completions", chat_body(p, False),
                                      key=key, timeout=60)
                j = jbody(data) or {}
                results[i] = (("done", (j.get("choices") or [{}])[0].get("message", {})
                               .get("content")) if st == 200 else ("status", st))
            elif k == "post-hangup":  # the whole request, then gone before the answer
                s = socket.create_connection(("127.0.0.1", port), timeout=10)
                b = json.dumps(chat_body(p, False)).encode()
                s.sendall(head_bytes("POST", "/v1/chat/completions", port,
                                     [("Authorization", "Bearer " + key),
                                      ("Content-Type", "application/json"),
                                      ("Content-Length", str(len(b)))]) + b)
                time.sleep(hang[i] * 0.01)
                s.close()
                results[i] = ("hung up", None)
            else:  # gone in the middle of the body
                s = socket.create_connection(("127.0.0.1", port), timeout=10)
                s.sendall(head_bytes("POST", "/v1/chat/completions", port,
                                     [("Authorization", "Bearer " + key),
                                      ("Content-Length", "500")]) + b'{"messages":')
                s.close()
                results[i] = ("hung up", None)
        except Exception as e:  # noqa: BLE001 - reported as a failure below
            results[i] = ("error", f"{type(e).__name__}: {e}")

    with RssPeak(pid) as peak:
        t0 = time.monotonic()
        threads = [threading.Thread(target=client, args=(i,)) for i in range(64)]
        for t in threads:
            t.start()
        ok_h, lat_h = normal_health(port)
        ok_c, lat_c = normal_completion(port)
        th_max = n_threads(pid)
        for t in threads:
            t.join(90)
        wall = time.monotonic() - t0
    wrong, errors, done = [], [], 0
    for i, r in enumerate(results):
        if r is None or r[0] in ("error", "status", "eof"):
            errors.append((i, kinds[i], r))
        elif r[0] == "done":
            done += 1
            if r[1] != solo[i % len(COUNT_PROMPTS)]:
                wrong.append((i, kinds[i], r[1], solo[i % len(COUNT_PROMPTS)]))
    time.sleep(1.0)
    _, _, data = request(port, "GET", "/slots", key=KEY_A)
    busy = [s.get("id") for s in (jbody(data) or []) if s.get("is_processing")]
    th1 = n_threads(pid)
    n_hang = sum(k != "stream" and k != "plain" for k in kinds)
    c.fig(f"64 clients ({n_hang} hang up): {done} complete answers, {len(wrong)} differ from "
          f"solo, {len(errors)} errors, wall {wall:.2f} s; during: health {lat_h * 1000:.0f} ms, "
          f"completion {lat_c * 1000:.0f} ms; "
          f"threads {th0} -> max {th_max} -> {th1}; peak RSS {fmt_mb(peak.peak)}")
    c.status = (f"{done} answers ({n_hang} hang-ups), {len(wrong)} wrong, {len(errors)} errors, "
                f"threads {th0} -> {th1}")
    c.expect(not wrong, f"answers differ from their solo run: {wrong[:3]}")
    c.expect(not errors, f"clients failed: {errors[:3]}")
    c.expect(ok_h and lat_h < NORMAL_LATENCY_S, f"GET /health during the load: {ok_h}, "
             f"{lat_h:.2f} s")
    c.expect(ok_c and lat_c < NORMAL_LATENCY_S, f"a completion during the load: {ok_c}, "
             f"{lat_c:.2f} s")
    c.expect(not busy, f"slots still processing 1 s after the load: {busy}")
    c.expect(th1 - th0 <= 4, f"threads {th0} before, {th1} after")
    c.expect(rss_kb(pid) - rss0 <= RSS_SLACK_KB, f"RSS {fmt_mb(rss0)} before, "
             f"{fmt_mb(rss_kb(pid))} after")
    common_after(ctx, c, rss0, unauth=False, during_latency=lat_c)


# ---------------------------------------------------------------------------------------------
# 13. --max-connections


def check_max_connections(ctx, c):
    srv = Server(["-np", "1", "-t", "1", "--max-connections", "50"], ctx.workdir, "capped")
    try:
        pid, port = srv.pid, srv.port
        rss0, th0 = rss_kb(pid), n_threads(pid)
        socks = []
        for i in range(120):  # idle, half a head, one keep-alive request answered
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            if i % 3 == 1:
                s.sendall(f"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n".encode())
            elif i % 3 == 2:
                s.sendall(head_bytes("GET", "/health", port))
            socks.append(s)
        time.sleep(0.3)
        lat = []
        for _ in range(3):
            ok, dt = normal_health(srv.port)
            c.expect(ok, "GET /health failed with 120 connections open at --max-connections 50")
            lat.append(dt)
        st, _, _ = request(port, "POST", "/completion",
                           {"prompt": "1 2 3", "n_predict": 4, "temperature": 0})
        c.expect(st == 200, f"a completion at the connection cap: {st}")
        dropped = 0
        for s in socks:
            s.setblocking(False)
            try:
                while True:
                    d = s.recv(65536)
                    if not d:
                        dropped += 1
                        break
            except BlockingIOError:
                pass
            except OSError:
                dropped += 1
            s.close()
        th1 = n_threads(pid)
        c.fig(f"120 connections at cap 50: {dropped} dropped, health max "
              f"{max(lat) * 1000:.0f} ms, threads {th0} -> {th1}, RSS {fmt_mb(rss0)} -> "
              f"{fmt_mb(rss_kb(pid))}")
        c.status = f"{dropped}/120 oldest waiting connections dropped; newcomers answered"
        c.rss = f"{fmt_mb(rss0)} -> {fmt_mb(rss_kb(pid))}"
        c.latency = f"{max(lat) * 1000:.0f} ms during"
        c.expect(max(lat) < NORMAL_LATENCY_S, f"GET /health took {max(lat):.2f} s at the cap")
        c.expect(dropped >= 120 - 50, f"only {dropped} of 120 connections were dropped at "
                 "--max-connections 50")
        c.expect(th1 - th0 <= 4, f"threads {th0} -> {th1}")
        c.expect(srv.alive() and health_ok(port), "the capped server is not healthy afterwards")
    finally:
        srv.stop()


# ---------------------------------------------------------------------------------------------


CHECKS = [
    (1, "range", "2,000-range Range header on GET /", check_range),
    (2, "headers", "10,000 header fields; 101 fields; 1 MB header line; 100 KB request line",
     check_headers),
    (3, "bodies", "64 MB chunked bodies (with and without key), gzip, 64 KiB GET body",
     check_bodies),
    (4, "slowloris", "500 connections dripping a partial head", check_slowloris),
    (5, "upload-flood", "16 unauthenticated 8 MB bodies at once", check_upload_flood),
    (6, "auth", "fail-closed startup; wrong, partial and several API keys", check_auth),
    (7, "host-cors", "foreign Host (DNS rebinding) and foreign Origin", check_host_cors),
    (8, "deep-json", "JSON nested 100,000 deep; deep const/items; pattern of 15,000 groups",
     check_deep_json),
    (9, "fields", "out-of-range sampling fields, huge logit_bias, n, 1 MiB /tokenize, all banned",
     check_fields),
    (10, "tenants", "prefix cache, /slots and /monitor across API keys and cache_salt",
     check_tenants),
    (11, "slot-files", "slot file names, stale temporary files, per-key folders",
     check_slot_files),
    (12, "many-clients", "64 clients at once with random hang-ups", check_many_clients),
    (13, "max-connections", "120 idle / half-sent connections at --max-connections 50",
     check_max_connections),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="", help="comma list of check numbers")
    ap.add_argument("--table", default="", help="append a Markdown table of the figures here")
    ap.add_argument("--baseline", action="store_true",
                    help="start the server with only flags an older lamina (or a peer) takes: "
                         "three --api-key; for measuring another build against checks 1-5")
    args = ap.parse_args()
    if not (os.access(BINARY, os.X_OK) and os.path.isfile(MODEL)):
        print(f"skipped: no binary {BINARY} or no model {MODEL}")
        return 77
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 8192 if hard == resource.RLIM_INFINITY else min(hard, 8192)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    only = {int(x) for x in args.only.split(",") if x.strip()}
    workdir = tempfile.mkdtemp(prefix="lamina-attack-")
    ctx = Ctx(workdir)
    checks = [Check(n, name) for n, name, _, _ in CHECKS if not only or n in only]
    fns = {n: fn for n, _, _, fn in CHECKS}
    t_all = time.monotonic()
    try:
        os.makedirs(ctx.save_dir)
        dead = 999999
        while os.path.exists(f"/proc/{dead}"):
            dead -= 1
        ctx.stale_tmp = os.path.join(ctx.save_dir, f"old.bin.tmp.{dead}")
        ctx.live_tmp = os.path.join(ctx.save_dir, f"busy.bin.tmp.{os.getpid()}")
        for p in (ctx.stale_tmp, ctx.live_tmp):
            with open(p, "wb") as f:
                f.write(b"partial")
        key_file = os.path.join(workdir, "keys.txt")
        with open(key_file, "w") as f:
            f.write(f"# tenants\n\n{KEY_D}\n{KEY_E}\n{KEY_F}\n{KEY_G}\n")
        flags = ["-np", "8", "-c", "16384", "-t", "1"]
        if args.baseline:
            flags += ["--api-key", KEY_A, "--api-key", KEY_B, "--api-key", KEY_C]
        else:
            flags += ["--api-key", f"{KEY_A},{KEY_B}", "--api-key", KEY_C, "--api-key-file",
                      key_file, "--cors-origin", GOOD_ORIGIN, "--slot-save-path", ctx.save_dir]
        ctx.main = Server(flags, workdir, "main")
        _, _, data = request(ctx.main.port, "GET", "/v1/models")
        try:
            ctx.n_vocab = int(jbody(data)["data"][0]["meta"]["n_vocab"])
        except (TypeError, KeyError, ValueError, IndexError):
            ctx.n_vocab = None
        for _ in range(3):
            normal_completion(ctx.main.port)
        time.sleep(0.3)
        ctx.idle_rss, ctx.idle_threads = rss_kb(ctx.main.pid), n_threads(ctx.main.pid)
        print(f"server pid {ctx.main.pid}, port {ctx.main.port}: idle RSS {fmt_mb(ctx.idle_rss)}, "
              f"{ctx.idle_threads} threads, n_vocab {ctx.n_vocab}", flush=True)
        for c in checks:
            t0 = time.monotonic()
            if not ctx.main.alive():
                c.fails.append("the server is not running: " + ctx.main.tail())
            else:
                try:
                    fns[c.num](ctx, c)
                except Exception as e:  # noqa: BLE001 - a check that throws failed
                    c.fails.append(f"{type(e).__name__}: {e}\n{traceback.format_exc()}")
            tag = "ok  " if not c.fails else "FAIL"
            print(f"{tag} {c.num:2d} {c.name} ({time.monotonic() - t0:.1f} s): "
                  f"{' | '.join(c.figures)}", flush=True)
            for f in c.fails:
                print(f"       - {f}", flush=True)
    finally:
        if ctx.main is not None:
            ctx.main.stop()
            if any(c.fails for c in checks):
                print("server log tail:\n" + ctx.main.tail())
        shutil.rmtree(workdir, ignore_errors=True)
    n_fail = sum(1 for c in checks if c.fails)
    print(f"{len(checks) - n_fail}/{len(checks)} checks passed in "
          f"{time.monotonic() - t_all:.1f} s")
    if args.table:
        def cell(s):
            return s.replace("|", "/").replace("\n", " ")
        with open(args.table, "a") as f:
            f.write("| # | attack | result | what the server answered | RSS before -> after | "
                    "normal request |\n|---|---|---|---|---|---|\n")
            for c in checks:
                what = next(d for n, _, d, _ in CHECKS if n == c.num)
                res = "ok" if not c.fails else "FAIL: " + "; ".join(c.fails)[:400]
                f.write(f"| {c.num} | {cell(what)} | {cell(res)} | {cell(c.status)} | "
                        f"{cell(c.rss)} | {cell(c.latency)} |\n")
    return 1 if n_fail else 0


if __name__ == "__main__":
    sys.exit(main())
