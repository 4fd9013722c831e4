"""Export a training checkpoint to a standard GGUF v3 llama model.

    /usr/bin/python3 train/export_gguf.py train/out/ckpt.pt -o models/lamina-counter.gguf [--type f16|q8_0]

The file follows llama.cpp's conventions, so any GGUF engine that does can load it:
  general.architecture = llama; llama.* hyperparameters; tensors token_embd.weight,
  blk.N.{attn_norm,attn_q,attn_k,attn_v,attn_output,ffn_norm,ffn_gate,ffn_up,ffn_down}.weight,
  output_norm.weight (no output.weight: the head is tied to the embedding);
  a SentencePiece-style vocabulary (tokenizer.ggml.model = llama) with scores and token types,
  BOS <s>, EOS <|im_end|>, add_bos_token = true, add_space_prefix = false, and a ChatML
  tokenizer.chat_template. Q/K are written as trained: the model was trained with GGUF llama's
  adjacent-pair RoPE, so no permutation is needed.
Matrices are f16 (or Q8_0 blocks: f16 scale + 32 int8), norm weights f32. The GGUF writer is
here (little-endian, alignment 32); no gguf package is used.
"""

import argparse
import os
import struct
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tokenizer import for_checkpoint  # noqa: E402

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% if enable_thinking is defined and enable_thinking %}{{ '<think>\\n' }}{% endif %}"
    "{% endif %}"
)

# GGUF value types
U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
# GGML tensor types
GGML_F32, GGML_F16, GGML_Q8_0 = 0, 1, 8
ALIGN = 32


class GgufWriter:
    def __init__(self):
        self.kv = []       # (key, type, value, elem_type)
        self.tensors = []  # (name, ggml_type, ne list, bytes)

    def add(self, key, vtype, value, elem_type=None):
        self.kv.append((key, vtype, value, elem_type))

    @staticmethod
    def _str(s):
        b = s.encode("utf-8")
        return struct.pack("<Q", len(b)) + b

    def _scalar(self, vtype, v):
        fmt = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f",
               BOOL: "<B", U64: "<Q", I64: "<q", F64: "<d"}
        if vtype == STRING:
            return self._str(v)
        if vtype == BOOL:
            v = 1 if v else 0
        return struct.pack(fmt[vtype], v)

    def add_tensor(self, name, ggml_type, ne, data):
        self.tensors.append((name, ggml_type, list(ne), bytes(data)))

    def write(self, path):
        out = bytearray()
        out += b"GGUF" + struct.pack("<IQQ", 3, len(self.tensors), len(self.kv))
        for key, vtype, value, elem_type in self.kv:
            out += self._str(key) + struct.pack("<I", vtype)
            if vtype == ARRAY:
                out += struct.pack("<IQ", elem_type, len(value))
                if elem_type == F32:
                    out += np.asarray(value, dtype="<f4").tobytes()
                elif elem_type == I32:
                    out += np.asarray(value, dtype="<i4").tobytes()
                else:
                    for v in value:
                        out += self._scalar(elem_type, v)
            else:
                out += self._scalar(vtype, value)
        offset = 0
        offsets = []
        for name, ggml_type, ne, data in self.tensors:
            offsets.append(offset)
            out += self._str(name) + struct.pack("<I", len(ne))
            out += struct.pack(f"<{len(ne)}Q", *ne)
            out += struct.pack("<IQ", ggml_type, offset)
            offset += (len(data) + ALIGN - 1) // ALIGN * ALIGN
        out += b"\0" * ((-len(out)) % ALIGN)
        for (name, ggml_type, ne, data), off in zip(self.tensors, offsets):
            out += data
            out += b"\0" * ((-len(data)) % ALIGN)
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(out)
        os.replace(tmp, path)
        return len(out)


def quantize_q8_0(w):
    """Rows of w (float32 [rows, cols], cols % 32 == 0) as GGML Q8_0 blocks."""
    rows, cols = w.shape
    blocks = w.reshape(rows, cols // 32, 32).astype(np.float32)
    amax = np.abs(blocks).max(axis=-1)
    d = amax / 127.0
    inv = np.where(d > 0, 1.0 / np.where(d > 0, d, 1), 0.0)
    q = np.round(blocks * inv[..., None]).clip(-127, 127).astype(np.int8)
    rec = np.zeros((rows, cols // 32), dtype=[("d", "<f2"), ("qs", "i1", 32)])
    rec["d"] = d.astype(np.float16)
    rec["qs"] = q
    return rec.tobytes()


def main():
    ap = argparse.ArgumentParser(description="Export a checkpoint to GGUF")
    ap.add_argument("checkpoint")
    ap.add_argument("-o", "--output", required=True)
    ap.add_argument("--type", default="f16", choices=["f16", "q8_0", "f32"])
    ap.add_argument("--name", default="lamina-counter")
    args = ap.parse_args()

    ck = torch.load(args.checkpoint, map_location="cpu")
    cfg = ck["config"]
    sd = {k: v.float().numpy() for k, v in ck["model"].items()}
    tok = ck["tokenizer"] if "tokenizer" in ck else for_checkpoint(ck).to_json()
    hd = cfg["dim"] // cfg["n_heads"]

    w = GgufWriter()
    w.add("general.architecture", STRING, "llama")
    w.add("general.name", STRING, args.name)
    w.add("general.alignment", U32, ALIGN)
    w.add("general.license", STRING, "MIT")
    w.add("general.description", STRING,
          f"lamina task model trained on synthetic counting/needle/copy/lookup/JSON/prose "
          f"data, step {ck['step']}")
    w.add("llama.context_length", U32, cfg["context_length"])
    w.add("llama.embedding_length", U32, cfg["dim"])
    w.add("llama.block_count", U32, cfg["n_layers"])
    w.add("llama.feed_forward_length", U32, cfg["ffn_dim"])
    w.add("llama.attention.head_count", U32, cfg["n_heads"])
    w.add("llama.attention.head_count_kv", U32, cfg["n_kv_heads"])
    w.add("llama.rope.freq_base", F32, float(cfg["rope_base"]))
    w.add("llama.rope.dimension_count", U32, hd)
    w.add("llama.attention.layer_norm_rms_epsilon", F32, float(cfg["norm_eps"]))
    w.add("llama.vocab_size", U32, len(tok["tokens"]))
    w.add("tokenizer.ggml.model", STRING, "llama")
    w.add("tokenizer.ggml.tokens", ARRAY, tok["tokens"], STRING)
    w.add("tokenizer.ggml.scores", ARRAY, tok["scores"], F32)
    w.add("tokenizer.ggml.token_type", ARRAY, tok["types"], I32)
    w.add("tokenizer.ggml.bos_token_id", U32, 1)
    w.add("tokenizer.ggml.eos_token_id", U32, tok["tokens"].index("<|im_end|>"))
    w.add("tokenizer.ggml.unknown_token_id", U32, 0)
    w.add("tokenizer.ggml.add_bos_token", BOOL, True)
    w.add("tokenizer.ggml.add_eos_token", BOOL, False)
    w.add("tokenizer.ggml.add_space_prefix", BOOL, False)
    w.add("tokenizer.chat_template", STRING, CHATML_TEMPLATE)

    def matrix(name, arr):
        rows, cols = arr.shape
        if args.type == "q8_0":
            w.add_tensor(name, GGML_Q8_0, [cols, rows], quantize_q8_0(arr))
        elif args.type == "f16":
            w.add_tensor(name, GGML_F16, [cols, rows], arr.astype("<f2").tobytes())
        else:
            w.add_tensor(name, GGML_F32, [cols, rows], arr.astype("<f4").tobytes())

    def vector(name, arr):
        w.add_tensor(name, GGML_F32, [arr.shape[0]], arr.astype("<f4").tobytes())

    matrix("token_embd.weight", sd["tok_embeddings.weight"])
    for i in range(cfg["n_layers"]):
        p, q = f"layers.{i}.", f"blk.{i}."
        vector(q + "attn_norm.weight", sd[p + "attn_norm.weight"])
        matrix(q + "attn_q.weight", sd[p + "attn.wq.weight"])
        matrix(q + "attn_k.weight", sd[p + "attn.wk.weight"])
        matrix(q + "attn_v.weight", sd[p + "attn.wv.weight"])
        matrix(q + "attn_output.weight", sd[p + "attn.wo.weight"])
        vector(q + "ffn_norm.weight", sd[p + "ffn_norm.weight"])
        matrix(q + "ffn_gate.weight", sd[p + "ffn.w1.weight"])
        matrix(q + "ffn_up.weight", sd[p + "ffn.w3.weight"])
        matrix(q + "ffn_down.weight", sd[p + "ffn.w2.weight"])
    vector("output_norm.weight", sd["norm.weight"])
    n = w.write(args.output)
    print(f"wrote {args.output}: {n} bytes, {len(w.tensors)} tensors, step {ck['step']}, "
          f"type {args.type}", file=sys.stderr)


if __name__ == "__main__":
    main()
