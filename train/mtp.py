"""Train a multi-token-prediction (MTP) head for the shipped model with its trunk frozen.

    /usr/bin/python3 train/mtp.py train --trunk models/lamina-counter.gguf --out train/out/mtp/mtp.pt
    /usr/bin/python3 train/mtp.py export train/out/mtp/mtp.pt -o models/lamina-counter-mtp.gguf
    /usr/bin/python3 train/mtp.py check train/out/mtp/mtp.pt models/lamina-counter-mtp.gguf

The head is the qwen35 MTP block's structure on a llama decoder block: cell p takes token x_p
and the trunk's normed final hidden state h_{p-1} (zeros at a sequence's first token), computes
eh_proj([enorm(embed(x_p)) | hnorm(h_{p-1})]), runs one llama decoder block (RoPE at position p,
causal attention over the head's own cells), its own head norm and the trunk's tied output head,
and predicts x_{p+1}: two tokens ahead of h_{p-1}. Only the head learns (about 1.9 M parameters);
the trunk is read from its GGUF (gguf_model.py) and frozen. Each step draws the data.py task mix
(make_bucketed_batch, as distill.py) and minimises KL(trunk at p || head at p) over the answer
tokens, the trunk's next-token distribution being what a verify step accepts.

`export` writes the companion GGUF lamina finds as `<model>-mtp.gguf` (models/README.md,
"lamina-counter-mtp.gguf"): llama hyper-parameters that must equal the trunk's, block_count =
trunk layers + 1, nextn_predict_layers = 1, and the tensors blk.<L>.nextn.{eh_proj,enorm,hnorm,
shared_head_norm}.weight and blk.<L>.{attn_norm,attn_q,attn_k,attn_v,attn_output,ffn_norm,
ffn_gate,ffn_up,ffn_down}.weight (L = the trunk's layer count). No tokenizer and no embedding:
both are the trunk's. `check` compares the exported head's logits through lamina (`lamina score
--mtp --save-logits` on the trunk with the head beside it) with this file's PyTorch head.
"""

import argparse
import json
import os
import random
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from data import Generator, render_chat  # noqa: E402
from gguf_model import LAYER_NAMES, load_gguf_model  # noqa: E402
from model import Block, RMSNorm, causal_doc_mask, rope_tables  # noqa: E402
from train import adamw, lr_at, make_bucketed_batch  # noqa: E402

TASKS = ["count", "needle", "copy", "lookup", "json", "prose", "repeat"]
EVAL_SEED = 31_000_000  # held-out batches: seeds no training stream uses


class MtpHead(nn.Module):
    """The MTP block over a frozen llama trunk (whose embedding it reads, not owns)."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.enorm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.hnorm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.eh_proj = nn.Linear(2 * cfg.dim, cfg.dim, bias=False)
        self.block = Block(cfg)
        self.head_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        nn.init.normal_(self.eh_proj.weight, mean=0.0, std=0.02)

    def forward(self, embed, tokens, h_prev, positions, mask, keep=None):
        """tokens [B, T]; h_prev [B, T, dim] (the trunk's normed state of the previous token,
        zeros at a document's first); mask additive [B, 1, T, T]. Returns (logits [B, T, V],
        or [n, V] of the positions where the bool mask `keep` [B, T] is set; normed hidden
        [B, T, dim])."""
        cfg = self.cfg
        B, T = tokens.shape
        cos, sin = rope_tables(cfg.head_dim, positions, cfg.rope_base)
        mask = mask.expand(B, cfg.n_heads, T, T).reshape(B * cfg.n_kv_heads,
                                                          (cfg.n_heads // cfg.n_kv_heads) * T, T)
        e = embed[tokens]
        x = self.eh_proj(torch.cat([self.enorm(e), self.hnorm(h_prev)], dim=-1))
        x = self.block(x, cos, sin, mask)
        hn = self.head_norm(x)
        return (hn if keep is None else hn[keep]) @ embed.t(), hn


@torch.no_grad()
def trunk_states(trunk, x, d, bf16, keep=None):
    """The trunk's normed final states [B, T, dim] and logits [B, T, V] (or [n, V] where the
    bool mask `keep` [B, T] is set), without gradients."""
    cfg = trunk.cfg
    B, T = x.shape
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        cos, sin = rope_tables(cfg.head_dim, torch.arange(T), cfg.rope_base)
        mask = causal_doc_mask(d).expand(B, cfg.n_heads, T, T).reshape(
            B * cfg.n_kv_heads, (cfg.n_heads // cfg.n_kv_heads) * T, T)
        h = trunk.tok_embeddings(x)
        for layer in trunk.layers:
            h = layer(h, cos, sin, mask)
        h = trunk.norm(h.float())
        logits = (h if keep is None else h[keep]) @ trunk.tok_embeddings.weight.t()
    return h.float(), logits.float()


def shift_states(h, d):
    """h_prev [B, T, dim]: row t holds h[t - 1], zeros where t starts a document."""
    prev = torch.zeros_like(h)
    prev[:, 1:] = h[:, :-1]
    first = torch.ones_like(d, dtype=torch.bool)
    first[:, 1:] = d[:, 1:] != d[:, :-1]
    prev[first] = 0.0
    return prev


def head_loss(head, trunk, x, w, d, bf16):
    """Sum over answer tokens of KL(trunk || head), the argmax hits and the token count."""
    keep = w > 0
    h, t = trunk_states(trunk, x, d, bf16, keep)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        s, _ = head(trunk.tok_embeddings.weight, x, shift_states(h, d),
                    torch.arange(x.shape[1]), causal_doc_mask(d), keep)
    s = s.float()
    log_ps = F.log_softmax(s, -1)
    log_pt = F.log_softmax(t, -1)
    kl = (log_pt.exp() * (log_pt - log_ps)).sum(-1)
    return kl.sum(), (s.argmax(-1) == t.argmax(-1)), keep


def batch(tok, seed, args, normal_ids, repeat):
    return make_bucketed_batch(tok, seed, args.bucket_tokens, args.buckets,
                               args.max_answer_tokens, Generator.TASK_WEIGHTS,
                               short_frac=args.short_frac, repeat=repeat,
                               normal_ids=normal_ids)


@torch.no_grad()
def agreement(head, trunk, tok, args, normal_ids, n_batches=2):
    """Per task: the share of held-out answer tokens where the head's argmax at p (from h_{p-1}
    and x_p) is the trunk's argmax at p (from h_p)."""
    head.eval()
    stats = {t: [0, 0] for t in TASKS}
    for b in range(n_batches):
        for x, y, w, d, spans in batch(tok, EVAL_SEED + b, args, normal_ids, 0.05):
            h, t = trunk_states(trunk, x, d, False)
            s, _ = head(trunk.tok_embeddings.weight, x, shift_states(h, d),
                        torch.arange(x.shape[1]), causal_doc_mask(d))
            hit = s.argmax(-1) == t.argmax(-1)
            for row, a, e, task in spans:
                stats[task][0] += int(hit[row, a:e].sum())
                stats[task][1] += e - a
    head.train()
    out = {t: round(v[0] / v[1], 4) for t, v in stats.items() if v[1]}
    answer = [v for t, v in stats.items() if t != "repeat"]
    out["all"] = round(sum(v[0] for v in answer) / max(1, sum(v[1] for v in answer)), 4)
    return out


def init_head(trunk, seed):
    """A head whose block starts as a copy of the trunk's last layer (its norms too)."""
    torch.manual_seed(seed)
    head = MtpHead(trunk.cfg)
    head.block.load_state_dict(trunk.layers[-1].state_dict())
    head.head_norm.load_state_dict(trunk.norm.state_dict())
    return head


def cmd_train(args):
    torch.set_num_threads(args.threads)
    random.seed(args.seed)
    trunk, tok, _ = load_gguf_model(args.trunk)
    for p in trunk.parameters():
        p.requires_grad_(False)
    head = init_head(trunk, args.seed)
    opt = adamw(head, args.lr, args.weight_decay)
    step = 0
    if os.path.exists(args.out):
        ck = torch.load(args.out, map_location="cpu")
        head.load_state_dict(ck["head"])
        opt.load_state_dict(ck["opt"])
        step = ck["step"]
        print(f"resuming from {args.out} at step {step}", flush=True)
    normal_ids = [i for i in range(len(tok)) if tok.types[i] == 1]
    n_params = sum(p.numel() for p in head.parameters())
    print(f"head params {n_params:,}; trunk {trunk.n_params():,} frozen; steps {args.steps} "
          f"lr {args.lr} threads {torch.get_num_threads()}", flush=True)
    t_start = last = time.time()
    end = min(args.steps, args.stop_at or args.steps)
    while step < end:
        lr = lr_at(step, args.steps, args.lr, args.warmup, 0, args.min_lr_frac)
        for g in opt.param_groups:
            g["lr"] = lr
        t0 = time.time()
        parts = batch(tok, args.data_seed * 1_000_003 + step, args, normal_ids, args.repeat)
        n_tok = sum(int((p[2] > 0).sum()) for p in parts)
        loss, hits = 0.0, 0
        for x, y, w, d, _ in parts:
            part, hit, _ = head_loss(head, trunk, x, w, d, args.bf16)
            loss = loss + part / max(1, n_tok)
            hits += int(hit.sum())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        opt.step()
        step += 1
        if step % args.log_every == 0:
            print(f"step {step}/{args.steps} kl {loss.item():.4f} agree {hits / max(1, n_tok):.4f}"
                  f" lr {lr:.2e} step {time.time() - t0:.2f}s elapsed {time.time() - t_start:.0f}s",
                  flush=True)
        if step % args.eval_every == 0 or step == end:
            print(f"eval step {step} {json.dumps(agreement(head, trunk, tok, args, normal_ids))}",
                  flush=True)
        if time.time() - last > args.ckpt_minutes * 60 or step == end:
            tmp = args.out + ".tmp"
            torch.save({"head": head.state_dict(), "opt": opt.state_dict(), "step": step,
                        "config": trunk.cfg.to_dict(), "args": vars(args)}, tmp)
            os.replace(tmp, args.out)
            last = time.time()
            print(f"checkpoint {args.out} step {step}", flush=True)


def load_head(path, trunk):
    ck = torch.load(path, map_location="cpu")
    head = MtpHead(trunk.cfg)
    head.load_state_dict(ck["head"])
    return head.eval()


def cmd_export(args):
    from export_gguf import F32, GGML_F16, GGML_F32, STRING, U32, GgufWriter
    trunk, _, meta = load_gguf_model(args.trunk)
    head = load_head(args.checkpoint, trunk)
    cfg = trunk.cfg
    L = cfg.n_layers
    w = GgufWriter()
    w.add("general.architecture", STRING, "llama")
    w.add("general.name", STRING, args.name)
    w.add("general.type", STRING, "mtp")
    w.add("general.alignment", U32, 32)
    w.add("llama.block_count", U32, L + 1)
    w.add("llama.nextn_predict_layers", U32, 1)
    w.add("llama.context_length", U32, cfg.context_length)
    w.add("llama.embedding_length", U32, cfg.dim)
    w.add("llama.feed_forward_length", U32, cfg.ffn_dim)
    w.add("llama.attention.head_count", U32, cfg.n_heads)
    w.add("llama.attention.head_count_kv", U32, cfg.n_kv_heads)
    w.add("llama.rope.dimension_count", U32, cfg.head_dim)
    w.add("llama.rope.freq_base", F32, cfg.rope_base)
    w.add("llama.attention.layer_norm_rms_epsilon", F32, cfg.norm_eps)
    w.add("llama.vocab_size", U32, cfg.vocab_size)
    sd = {k: v.float().numpy() for k, v in head.state_dict().items()}
    p = f"blk.{L}."

    def put(name, arr):
        if arr.ndim == 2:
            rows, cols = arr.shape
            w.add_tensor(name, GGML_F16, [cols, rows], arr.astype("<f2").tobytes())
        else:
            w.add_tensor(name, GGML_F32, [arr.shape[0]], arr.astype("<f4").tobytes())

    put(p + "nextn.eh_proj.weight", sd["eh_proj.weight"])
    put(p + "nextn.enorm.weight", sd["enorm.weight"])
    put(p + "nextn.hnorm.weight", sd["hnorm.weight"])
    put(p + "nextn.shared_head_norm.weight", sd["head_norm.weight"])
    for ours, theirs in LAYER_NAMES.items():
        put(p + theirs, sd["block." + ours])
    w.write(args.output)
    print(f"wrote {args.output} ({os.path.getsize(args.output):,} bytes)")


def read_logits(path):
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"LMNLOGIT", f"{path}: not a lamina logits file"
    _, n_vocab, n = struct.unpack_from("<IIQ", data, 8)
    toks = np.frombuffer(data, dtype="<i4", count=n, offset=24)
    logits = np.frombuffer(data, dtype="<f4", count=n * n_vocab, offset=24 + 4 * n)
    return toks, logits.reshape(n, n_vocab)


def cmd_check(args):
    """lamina's head logits (`score --mtp`) against the PyTorch head on f16-rounded weights."""
    trunk, _, _ = load_gguf_model(args.trunk)
    head = load_head(args.checkpoint, trunk)
    head.load_state_dict({k: (v.half().float() if v.dim() >= 2 else v)
                          for k, v in head.state_dict().items()})
    ok = True
    for seed, task in [(5, "count"), (6, "json"), (7, "copy")]:
        text = render_chat(*Generator(seed).example(task)[1:])[:600]
        with tempfile.TemporaryDirectory() as dd:
            # lamina reads the head as <model>-mtp.gguf beside the model
            tf, lf, m = (os.path.join(dd, n) for n in ("t.txt", "l.bin", "m.gguf"))
            os.symlink(os.path.abspath(args.trunk), m)
            os.symlink(os.path.abspath(args.gguf), os.path.join(dd, "m-mtp.gguf"))
            with open(tf, "w") as f:
                f.write(text)
            r = subprocess.run([args.lamina, "score", "-m", m, "-f", tf, "--kv", "f32", "--mtp",
                                "--save-logits", lf], capture_output=True, text=True)
            if r.returncode != 0:
                print(f"lamina score --mtp failed: {r.stderr}")
                return 1
            toks, lam = read_logits(lf)
        x = torch.tensor([list(toks)], dtype=torch.long)
        d = torch.zeros_like(x)
        with torch.no_grad():
            h, _ = trunk_states(trunk, x, d, False)
            ref, _ = head(trunk.tok_embeddings.weight, x, shift_states(h, d),
                          torch.arange(x.shape[1]), causal_doc_mask(d))
        ref = ref[0].numpy()
        n = min(len(ref), len(lam))
        diff = np.abs(ref[:n] - lam[:n]).max()
        spread = ref[:n].max() - ref[:n].min()
        top1 = (ref[:n].argmax(-1) == lam[:n].argmax(-1)).mean()
        print(f"{task}: {n} positions, max |logit diff| {diff:.4g} (logit range {spread:.4g}), "
              f"top-1 agreement {top1:.4f}")
        if diff > 0.02 * max(1.0, spread) or top1 < 0.98:
            ok = False
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train")
    t.add_argument("--trunk", default="models/lamina-counter.gguf")
    t.add_argument("--out", default="train/out/mtp/mtp.pt", help="checkpoint (resumed from)")
    t.add_argument("--steps", type=int, default=1500)
    t.add_argument("--stop-at", type=int,
                   help="end at this step of the --steps schedule (the lr not yet decayed)")
    t.add_argument("--lr", type=float, default=1e-3)
    t.add_argument("--min-lr-frac", type=float, default=0.1)
    t.add_argument("--warmup", type=int, default=30)
    t.add_argument("--weight-decay", type=float, default=0.1)
    t.add_argument("--bucket-tokens", type=int, default=2400, help="tokens of examples a step")
    t.add_argument("--buckets", type=lambda v: tuple(int(x) for x in v.split(",")),
                   default=(320, 640), help="row lengths examples are packed into")
    t.add_argument("--max-answer-tokens", type=int, default=560)
    t.add_argument("--short-frac", type=float, default=0.2)
    t.add_argument("--repeat", type=float, default=0.05, help="share of random repeats")
    t.add_argument("--seed", type=int, default=4321, help="seeds the head's initial weights")
    t.add_argument("--data-seed", type=int, default=960)
    t.add_argument("--threads", type=int, default=2)
    t.add_argument("--bf16", action="store_true", help="matmuls in bfloat16 (autocast)")
    t.add_argument("--ckpt-minutes", type=float, default=3.0)
    t.add_argument("--eval-every", type=int, default=250)
    t.add_argument("--log-every", type=int, default=10)
    e = sub.add_parser("export")
    e.add_argument("checkpoint")
    e.add_argument("-o", "--output", required=True)
    e.add_argument("--trunk", default="models/lamina-counter.gguf")
    e.add_argument("--name", default="lamina-counter-mtp")
    c = sub.add_parser("check")
    c.add_argument("checkpoint")
    c.add_argument("gguf")
    c.add_argument("--trunk", default="models/lamina-counter.gguf")
    c.add_argument("--lamina", default="build/release/lamina")
    args = ap.parse_args()
    if args.cmd == "train":
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        cmd_train(args)
    elif args.cmd == "export":
        cmd_export(args)
    else:
        sys.exit(cmd_check(args))


if __name__ == "__main__":
    main()
