"""Distil the shipped model into a small draft model for speculative decoding.

    /usr/bin/python3 train/distill.py --teacher models/lamina-counter.gguf \
        --out train/out/draft/draft.pt [--init train/out/draft/induction.pt] [--steps N]

The teacher is read from its GGUF (gguf_model.py), so the student gets the teacher's tokenizer
as it is in the file. Each step draws the data.py task mix (Generator.TASK_WEIGHTS) packed into
length-bucketed rows as train.py does (make_bucketed_batch, with a share of random repeats to
keep the look-up heads), runs the teacher without gradients and trains the student on
KL(teacher || student) over the answer tokens (train.py's per-token weights), plus --hard times
the cross-entropy to the teacher's argmax. The teacher's forward pass costs about three times
the student's forward and backward, so the first --label-steps steps skip it and train on the
data's own answer tokens (which the teacher reproduces almost exactly) with train.py's loss, and
the distillation proper follows. What speculation needs is the student's argmax equal
to the teacher's, so every --eval-every steps the log prints, per task, the share of held-out
answer tokens where the two argmaxes agree. Resumes from --out like train.py (the data of step s
comes from seed (data seed, s)).
"""

import argparse
import json
import os
import random
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from data import Generator  # noqa: E402
from gguf_model import load_gguf_model  # noqa: E402
from model import Config, Transformer, causal_doc_mask  # noqa: E402
from train import adamw, lr_at, make_bucketed_batch, save_checkpoint  # noqa: E402

TASKS = ["count", "needle", "copy", "lookup", "json", "prose", "repeat"]
EVAL_SEED = 30_000_000  # held-out batches: seeds no training stream uses


def batch(tok, seed, args, normal_ids, repeat):
    return make_bucketed_batch(tok, seed, args.bucket_tokens, args.buckets,
                               args.max_answer_tokens, Generator.TASK_WEIGHTS,
                               short_frac=args.short_frac, repeat=repeat,
                               normal_ids=normal_ids)


def teacher_logits(teacher, x, d, bf16):
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        return teacher(x, torch.arange(x.shape[1]), causal_doc_mask(d)).float()


def distill_loss(s_logits, t_logits, w, temp, hard):
    """Per-token KL(teacher || student) at temperature temp (times temp^2) plus hard times the
    cross-entropy to the teacher's argmax, weighted by w; summed (the caller normalises)."""
    V = s_logits.shape[-1]
    s, t = s_logits.reshape(-1, V), t_logits.reshape(-1, V)
    w = w.reshape(-1)
    keep = w > 0
    s, t, w = s[keep], t[keep], w[keep]
    log_ps = F.log_softmax(s / temp, -1)
    log_pt = F.log_softmax(t / temp, -1)
    kl = (log_pt.exp() * (log_pt - log_ps)).sum(-1) * temp * temp
    loss = kl
    if hard > 0:
        loss = loss + hard * F.cross_entropy(s, t.argmax(-1), reduction="none")
    return (loss * w).sum(), (s.argmax(-1) == t.argmax(-1)).float().sum(), keep.sum()


@torch.no_grad()
def agreement(student, teacher, tok, args, normal_ids, n_batches=3):
    """Per task: the share of held-out answer tokens where the student's argmax is the
    teacher's, and the mean KL, on teacher-forced data.py answers."""
    student.eval()
    stats = {t: [0, 0, 0.0] for t in TASKS}  # agreeing tokens, tokens, KL sum
    for b in range(n_batches):
        for x, y, w, d, spans in batch(tok, EVAL_SEED + b, args, normal_ids, 0.05):
            t = teacher_logits(teacher, x, d, False)
            s = student(x, torch.arange(x.shape[1]), causal_doc_mask(d))
            hit = s.argmax(-1) == t.argmax(-1)
            lt = F.log_softmax(t, -1)
            kl = (lt.exp() * (lt - F.log_softmax(s, -1))).sum(-1)
            for row, a, e, task in spans:
                st = stats[task]
                st[0] += int(hit[row, a:e].sum())
                st[1] += e - a
                st[2] += float(kl[row, a:e].sum())
    student.train()
    out = {t: {"agree": round(v[0] / v[1], 4), "kl": round(v[2] / v[1], 4), "tokens": v[1]}
           for t, v in stats.items() if v[1]}
    answer = [v for t, v in stats.items() if t != "repeat"]
    out["all"] = {"agree": round(sum(v[0] for v in answer) / max(1, sum(v[1] for v in answer)),
                                 4)}
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--teacher", default="models/lamina-counter.gguf")
    ap.add_argument("--out", default="train/out/draft/draft.pt", help="checkpoint (resumed from)")
    ap.add_argument("--init", help="start from these weights (induction_check.py --save)")
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--stop-at", type=int,
                    help="end at this step of the --steps schedule (the lr not yet decayed)")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--min-lr-frac", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--n-layers", type=int, default=2)
    ap.add_argument("--n-heads", type=int, default=2)
    ap.add_argument("--n-kv-heads", type=int, default=1)
    ap.add_argument("--ffn-dim", type=int, default=384)
    ap.add_argument("--bucket-tokens", type=int, default=3600, help="tokens of examples a step")
    ap.add_argument("--buckets", type=lambda v: tuple(int(x) for x in v.split(",")),
                    default=(320, 640, 1280), help="row lengths examples are packed into")
    ap.add_argument("--max-answer-tokens", type=int, default=1150)
    ap.add_argument("--short-frac", type=float, default=0.2,
                    help="share of needle/copy/lookup examples drawn short (data.Generator)")
    ap.add_argument("--repeat", type=float, default=0.1, help="share of random repeats")
    ap.add_argument("--temp", type=float, default=1.0, help="distillation temperature")
    ap.add_argument("--hard", type=float, default=0.0,
                    help="weight of the cross-entropy to the teacher's argmax")
    ap.add_argument("--label-steps", type=int, default=0,
                    help="the first steps train on the data's answer tokens (cross-entropy, "
                         "train.py's weights) without the teacher, at a fraction of the cost")
    ap.add_argument("--seed", type=int, default=1234, help="seeds the student's initial weights")
    ap.add_argument("--data-seed", type=int, default=950)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--bf16", action="store_true",
                    help="teacher and student matmuls in bfloat16 (autocast)")
    ap.add_argument("--ckpt-minutes", type=float, default=5.0)
    ap.add_argument("--eval-every", type=int, default=250)
    ap.add_argument("--log-every", type=int, default=10)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)

    teacher, tok, _ = load_gguf_model(args.teacher)
    for p in teacher.parameters():
        p.requires_grad_(False)
    ckpt = torch.load(args.out, map_location="cpu") if os.path.exists(args.out) else None
    if ckpt is not None:
        cfg = Config(**ckpt["config"])
        print(f"resuming from {args.out} at step {ckpt['step']}", flush=True)
    else:
        cfg = Config(vocab_size=len(tok), dim=args.dim, n_layers=args.n_layers,
                     n_heads=args.n_heads, n_kv_heads=args.n_kv_heads, ffn_dim=args.ffn_dim,
                     context_length=teacher.cfg.context_length, rope_base=teacher.cfg.rope_base,
                     norm_eps=teacher.cfg.norm_eps)
    student = Transformer(cfg)
    if ckpt is None and args.init:
        init = torch.load(args.init, map_location="cpu")
        shape = ("vocab_size", "dim", "n_layers", "n_heads", "n_kv_heads", "ffn_dim")
        if any(init["config"][k] != getattr(cfg, k) for k in shape):
            sys.exit(f"--init {args.init}: config {init['config']} differs from {cfg.to_dict()}")
        student.load_state_dict({k: v.float() for k, v in init["model"].items()})
        print(f"initialised from {args.init}", flush=True)
    opt = adamw(student, args.lr, args.weight_decay)
    step, history = 0, []
    if ckpt is not None:
        student.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["opt"])
        step, history = ckpt["step"], ckpt.get("history", [])
    normal_ids = [i for i in range(len(tok)) if tok.types[i] == 1]
    print(f"student {json.dumps(cfg.to_dict())} params {student.n_params():,}; teacher "
          f"{teacher.n_params():,}; steps {args.steps} lr {args.lr} threads "
          f"{torch.get_num_threads()}", flush=True)

    t_start = last_ckpt = time.time()
    end = min(args.steps, args.stop_at or args.steps)
    while step < end:
        lr = lr_at(step, args.steps, args.lr, args.warmup, 0, args.min_lr_frac)
        for g in opt.param_groups:
            g["lr"] = lr
        t0 = time.time()
        parts = batch(tok, args.data_seed * 1_000_003 + step, args, normal_ids, args.repeat)
        t1 = time.time()
        labels = step < args.label_steps
        targets = [None if labels else teacher_logits(teacher, x, d, args.bf16)
                   for x, y, w, d, _ in parts]
        t2 = time.time()
        weight_sum = sum(p[2].sum() for p in parts).clamp(min=1)
        loss, hits, n = 0.0, 0.0, 0
        for (x, y, w, d, _), t in zip(parts, targets):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
                s = student(x, torch.arange(x.shape[1]), causal_doc_mask(d)).float()
            if labels:
                nll = F.cross_entropy(s.reshape(-1, cfg.vocab_size), y.reshape(-1),
                                      reduction="none")
                part_loss = (nll * w.reshape(-1)).sum()
                part_hits = ((s.argmax(-1) == y) & (w > 0)).sum()
                part_n = (w > 0).sum()
            else:
                part_loss, part_hits, part_n = distill_loss(s, t, w, args.temp, args.hard)
            loss = loss + part_loss / weight_sum
            hits, n = hits + part_hits, n + part_n
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(student.parameters(), 1.0)
        opt.step()
        t3 = time.time()
        step += 1
        history.append((step, round(loss.item(), 4)))
        if step % args.log_every == 0:
            print(f"step {step}/{args.steps} {'labels' if labels else 'kl'} loss "
                  f"{loss.item():.4f} agree {float(hits) / max(1, int(n)):.4f} lr {lr:.2e} "
                  f"step {t3 - t0:.2f}s (data {t1 - t0:.2f} teacher {t2 - t1:.2f} student "
                  f"{t3 - t2:.2f}) elapsed {time.time() - t_start:.0f}s", flush=True)
        if step % args.eval_every == 0 or step == end:
            ev = agreement(student, teacher, tok, args, normal_ids)
            print(f"eval step {step} {json.dumps(ev)}", flush=True)
        if time.time() - last_ckpt > args.ckpt_minutes * 60 or step == end:
            save_checkpoint(args.out, student, opt, step, cfg, args, tok, history, [0])
            last_ckpt = time.time()
            print(f"checkpoint {args.out} step {step}", flush=True)


if __name__ == "__main__":
    main()
