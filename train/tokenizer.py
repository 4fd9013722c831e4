"""A small SentencePiece-style tokenizer in GGUF form (tokenizer.ggml.model = "llama").

Vocabulary (ids in this order):
  0 <unk> (unknown), 1 <s> (BOS, control), 2 </s> (EOS, control),
  3 <|im_start|>, 4 <|im_end|> (control; <|im_end|> ends an assistant turn),
  5..260 <0x00>..<0xFF> byte tokens (byte fallback: newline is <0x0A>),
  then U+2581 (the escaped space) and the printable ASCII characters, digits among them,
  then merged pieces learned BPE-style from generated task text. No merged piece contains a
  digit, so EVERY DIGIT IS ITS OWN TOKEN; merged pieces never contain a newline either.
Scores: a merged piece learned at rank r has score -r (earlier merges win), single characters
-1e4, special and byte tokens 0.

Encoding is llama.cpp's SPM algorithm exactly (what lamina implements in src/tokenizer/spm.cpp):
special tokens are split out first (longest first), each text fragment has spaces replaced by
U+2581 (no space prefix: tokenizer.ggml.add_space_prefix = false), then the adjacent pair whose
concatenation is the highest-scoring token is merged repeatedly (ties: leftmost), and symbols
that are not tokens fall back to <0xNN> bytes. BOS is prepended (add_bos_token = true).
"""

import heapq
import json
import re

SPACE = "\u2581"
SPECIALS = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
UNK, BOS, EOS, IM_START, IM_END = range(5)
BYTE0 = len(SPECIALS)
# GGUF tokenizer.ggml.token_type values
T_NORMAL, T_UNKNOWN, T_CONTROL, T_BYTE = 1, 2, 3, 6


def base_chars():
    return [SPACE] + [chr(c) for c in range(0x21, 0x7F)]


def learn_merges(texts, n_merges):
    """BPE over words (a word is an optional U+2581 then letters/apostrophes, or a run of
    other non-digit, non-space, non-newline characters). Returns merged pieces in rank order."""
    word_re = re.compile(SPACE + r"?[A-Za-z']+|" + SPACE + r"?[^A-Za-z'0-9\s" + SPACE + r"]+")
    counts = {}
    for text in texts:
        for special in SPECIALS:
            text = text.replace(special, "\n")
        text = text.replace(" ", SPACE)
        for w in word_re.findall(text):
            counts[w] = counts.get(w, 0) + 1
    words = [(list(w), c) for w, c in counts.items() if len(w) > 1]
    pieces = []
    seen = set(base_chars())
    for _ in range(n_merges):
        pair_counts = {}
        for syms, c in words:
            for a, b in zip(syms, syms[1:]):
                pair_counts[(a, b)] = pair_counts.get((a, b), 0) + c
        if not pair_counts:
            break
        # deterministic: highest count, then lexicographic
        (a, b), c = max(pair_counts.items(), key=lambda kv: (kv[1], kv[0]))
        if c < 2:
            break
        merged = a + b
        for syms, _ in words:
            i = 0
            while i < len(syms) - 1:
                if syms[i] == a and syms[i + 1] == b:
                    syms[i:i + 2] = [merged]
                else:
                    i += 1
        if merged not in seen:
            seen.add(merged)
            pieces.append(merged)
    return pieces


class Tokenizer:
    def __init__(self, tokens, scores, types):
        self.tokens = tokens
        self.scores = scores
        self.types = types
        self.index = {t: i for i, t in enumerate(tokens)}
        self.specials = sorted([i for i, t in enumerate(types) if t in (T_CONTROL, T_UNKNOWN)],
                               key=lambda i: -len(tokens[i]))

    # -- construction --------------------------------------------------------------------------
    @classmethod
    def build(cls, texts, vocab_size):
        tokens = list(SPECIALS) + [f"<0x{b:02X}>" for b in range(256)] + base_chars()
        n_merges = vocab_size - len(tokens)
        pieces = learn_merges(texts, n_merges)
        types = [T_UNKNOWN, T_CONTROL, T_CONTROL, T_CONTROL, T_CONTROL] + [T_BYTE] * 256
        scores = [0.0] * (len(SPECIALS) + 256)
        types += [T_NORMAL] * len(base_chars())
        scores += [-1e4] * len(base_chars())
        for r, p in enumerate(pieces):
            tokens.append(p)
            types.append(T_NORMAL)
            scores.append(-float(r))
        # pad to the requested size with unused-but-valid pieces so shapes are round
        k = 0
        while len(tokens) < vocab_size:
            tokens.append(f"<unused{k}>")
            types.append(5)  # unused
            scores.append(-1e9)
            k += 1
        return cls(tokens, scores, types)

    def to_json(self):
        return {"tokens": self.tokens, "scores": self.scores, "types": self.types}

    @classmethod
    def from_json(cls, d):
        return cls(d["tokens"], d["scores"], d["types"])

    def save(self, path):
        with open(path, "w") as f:
            json.dump(self.to_json(), f)

    @classmethod
    def load(cls, path):
        with open(path) as f:
            return cls.from_json(json.load(f))

    # -- encoding ------------------------------------------------------------------------------
    def _partition(self, text, parse_special):
        frags = [text]  # str: raw text, int: token
        if not parse_special:
            return frags
        for sid in self.specials:
            needle = self.tokens[sid]
            out = []
            for f in frags:
                if isinstance(f, int):
                    out.append(f)
                    continue
                parts = f.split(needle)
                for j, p in enumerate(parts):
                    if j > 0:
                        out.append(sid)
                    if p:
                        out.append(p)
            frags = out
        return frags

    def _spm(self, text, out):
        # symbols: UTF-8 characters
        syms = list(text)
        n = len(syms)
        if n == 0:
            return
        texts = syms[:]                 # current text of symbol i ("" once merged away)
        prev = list(range(-1, n - 1))
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        heap = []

        def try_add(left, right):
            if left == -1 or right == -1:
                return
            t = texts[left] + texts[right]
            tid = self.index.get(t)
            if tid is None:
                return
            heapq.heappush(heap, (-self.scores[tid], left, right, len(t.encode("utf-8"))))

        for i in range(1, n):
            try_add(i - 1, i)
        while heap:
            _, left, right, size = heapq.heappop(heap)
            lt, rt = texts[left], texts[right]
            if not lt or not rt or len((lt + rt).encode("utf-8")) != size:
                continue
            texts[left] = lt + rt
            texts[right] = ""
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prev[nxt[right]] = left
            try_add(prev[left], left)
            try_add(left, nxt[left])
        i = 0
        while i != -1:
            t = texts[i]
            tid = self.index.get(t)
            if tid is not None and self.types[tid] in (T_NORMAL, T_BYTE, T_CONTROL, T_UNKNOWN, 4):
                out.append(tid)
            else:
                for b in t.encode("utf-8"):
                    out.append(BYTE0 + b)
            i = nxt[i]

    def encode(self, text, add_bos=True, parse_special=True):
        out = [BOS] if add_bos else []
        for f in self._partition(text, parse_special):
            if isinstance(f, int):
                out.append(f)
            else:
                self._spm(f.replace(" ", SPACE), out)
        return out

    def piece(self, tid, special=False):
        t, ty = self.tokens[tid], self.types[tid]
        if ty == T_BYTE:
            return bytes([int(t[3:5], 16)])
        if ty in (T_CONTROL, T_UNKNOWN, 5):
            return t.encode("utf-8") if special else b""
        return t.replace(SPACE, " ").encode("utf-8")

    def decode(self, ids, special=False):
        return b"".join(self.piece(i, special) for i in ids).decode("utf-8", errors="replace")

    def __len__(self):
        return len(self.tokens)


def build_default(seed=1234, vocab_size=1024, n_texts=3000):
    from data import corpus_sample
    return Tokenizer.build(corpus_sample(seed, n_texts), vocab_size)


def for_checkpoint(ck):
    """The tokenizer a checkpoint was trained with. Weights kept without it (train/checkpoints/,
    from induction_check.py) used the default one: every run builds it from seed 1234."""
    if "tokenizer" in ck:
        return Tokenizer.from_json(ck["tokenizer"])
    return build_default(1234, ck["config"]["vocab_size"])


if __name__ == "__main__":
    import argparse
    import os
    import sys
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description="Build the tokenizer vocabulary")
    ap.add_argument("-o", "--output", default="train/out/tokenizer.json")
    ap.add_argument("--vocab-size", type=int, default=1024)
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()
    tok = build_default(args.seed, args.vocab_size)
    os.makedirs(os.path.dirname(args.output) or ".", exist_ok=True)
    tok.save(args.output)
    sample = "<|im_start|>user\nCount from 98 to 102, one number per line.<|im_end|>\n"
    ids = tok.encode(sample)
    print(f"vocab {len(tok)}; sample -> {len(ids)} tokens: {[tok.tokens[i] for i in ids]}")
    assert tok.decode(ids, special=True) == "<s>" + sample
