"""Read a GGUF llama model (as export_gguf.py writes it) back into model.py's Transformer.

    /usr/bin/python3 train/gguf_model.py models/lamina-counter.gguf [-o train/out/teacher.pt]

A GGUF v3 reader in numpy: the metadata, the tokenizer (tokens, scores, types) and the f32 / f16
tensors. export_gguf.py writes Q/K as trained (GGUF llama's adjacent-pair RoPE is model.py's
layout), so the tensors map back one to one, ne = [cols, rows] being a [rows, cols] matrix. With
-o the weights are written as a checkpoint that train.py --init, export_gguf.py and
check_export.py accept; `check_export.py OUT.pt GGUF` then compares the two through lamina.
"""

import argparse
import os
import struct
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import Config, Transformer  # noqa: E402
from tokenizer import Tokenizer  # noqa: E402

# GGUF value types (export_gguf.py's) and their scalar formats
U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
SCALAR = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f",
          BOOL: "<B", U64: "<Q", I64: "<q", F64: "<d"}
NUMPY = {U8: "<u1", I8: "<i1", U16: "<u2", I16: "<i2", U32: "<u4", I32: "<i4", F32: "<f4",
         BOOL: "<u1", U64: "<u8", I64: "<i8", F64: "<f8"}
GGML_DTYPE = {0: "<f4", 1: "<f2"}  # f32, f16


class _Reader:
    def __init__(self, data):
        self.data = data
        self.pos = 0

    def take(self, fmt):
        v = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += struct.calcsize(fmt)
        return v[0] if len(v) == 1 else v

    def string(self):
        n = self.take("<Q")
        s = self.data[self.pos:self.pos + n].decode("utf-8")
        self.pos += n
        return s

    def value(self, vtype):
        if vtype == STRING:
            return self.string()
        if vtype == ARRAY:
            etype, n = self.take("<IQ")
            if etype == STRING:
                return [self.string() for _ in range(n)]
            arr = np.frombuffer(self.data, dtype=NUMPY[etype], count=n, offset=self.pos)
            self.pos += arr.nbytes
            return arr.tolist()
        v = self.take(SCALAR[vtype])
        return bool(v) if vtype == BOOL else v


def read_gguf(path):
    """(metadata dict, {tensor name: float32 numpy array in [rows, cols] order})."""
    with open(path, "rb") as f:
        data = f.read()
    r = _Reader(data)
    magic = data[:4]
    r.pos = 4
    version, n_tensors, n_kv = r.take("<IQQ")
    if magic != b"GGUF" or version != 3:
        raise ValueError(f"{path}: not a GGUF v3 file")
    meta = {}
    for _ in range(n_kv):
        key = r.string()
        meta[key] = r.value(r.take("<I"))
    infos = []
    for _ in range(n_tensors):
        name = r.string()
        nd = r.take("<I")
        ne = list(struct.unpack_from(f"<{nd}Q", data, r.pos))
        r.pos += 8 * nd
        gtype, offset = r.take("<IQ")
        infos.append((name, ne, gtype, offset))
    align = meta.get("general.alignment", 32)
    base = (r.pos + align - 1) // align * align
    tensors = {}
    for name, ne, gtype, offset in infos:
        if gtype not in GGML_DTYPE:
            raise ValueError(f"{name}: ggml type {gtype} (only f32 and f16 are read)")
        n = int(np.prod(ne))
        arr = np.frombuffer(data, dtype=GGML_DTYPE[gtype], count=n, offset=base + offset)
        tensors[name] = arr.astype(np.float32).reshape(list(reversed(ne)))
    return meta, tensors


def tokenizer_of(meta):
    return Tokenizer(list(meta["tokenizer.ggml.tokens"]),
                     [float(s) for s in meta["tokenizer.ggml.scores"]],
                     [int(t) for t in meta["tokenizer.ggml.token_type"]])


def config_of(meta):
    return Config(vocab_size=len(meta["tokenizer.ggml.tokens"]),
                  dim=meta["llama.embedding_length"], n_layers=meta["llama.block_count"],
                  n_heads=meta["llama.attention.head_count"],
                  n_kv_heads=meta["llama.attention.head_count_kv"],
                  ffn_dim=meta["llama.feed_forward_length"],
                  context_length=meta["llama.context_length"],
                  rope_base=float(meta["llama.rope.freq_base"]),
                  # GGUF stores f32: the shortest decimal that rounds to it is the trained value
                  norm_eps=float(np.format_float_positional(
                      np.float32(meta["llama.attention.layer_norm_rms_epsilon"]), unique=True)))


# model.py parameter name -> GGUF tensor name (export_gguf.py's mapping, per layer)
LAYER_NAMES = {"attn_norm.weight": "attn_norm.weight", "attn.wq.weight": "attn_q.weight",
               "attn.wk.weight": "attn_k.weight", "attn.wv.weight": "attn_v.weight",
               "attn.wo.weight": "attn_output.weight", "ffn_norm.weight": "ffn_norm.weight",
               "ffn.w1.weight": "ffn_gate.weight", "ffn.w3.weight": "ffn_up.weight",
               "ffn.w2.weight": "ffn_down.weight"}


def load_gguf_model(path):
    """(f32 Transformer in eval mode, Tokenizer, metadata) from a GGUF llama file."""
    meta, tensors = read_gguf(path)
    cfg = config_of(meta)
    sd = {"tok_embeddings.weight": tensors["token_embd.weight"],
          "norm.weight": tensors["output_norm.weight"]}
    for i in range(cfg.n_layers):
        for ours, theirs in LAYER_NAMES.items():
            sd[f"layers.{i}.{ours}"] = tensors[f"blk.{i}.{theirs}"]
    model = Transformer(cfg)
    model.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in sd.items()})
    return model.eval(), tokenizer_of(meta), meta


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("gguf")
    ap.add_argument("-o", "--output", help="write the weights as a checkpoint (f16 matrices)")
    args = ap.parse_args()
    model, tok, meta = load_gguf_model(args.gguf)
    print(f"{args.gguf}: {meta.get('general.name')}, {model.cfg}, "
          f"{model.n_params():,} parameters, vocabulary {len(tok)}")
    if args.output:
        sd = {k: (v.half() if v.dim() >= 2 else v) for k, v in model.state_dict().items()}
        torch.save({"model": sd, "config": model.cfg.to_dict(), "step": 0,
                    "tokenizer": tok.to_json(), "note": f"read from {args.gguf}"}, args.output)
        print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
