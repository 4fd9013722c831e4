"""A llama-architecture transformer in plain PyTorch (1.13): RMSNorm, RoPE, grouped-query
attention, SwiGLU, embeddings tied to the output head.

RoPE uses GGUF llama's "normal" layout: dimensions (2i, 2i+1) of each head form one rotated
pair with angle pos * base^(-2i/head_dim). That is the layout llama.cpp and lamina apply to
`general.architecture = llama`, so the exporter writes Q/K weights as they are (no permutation
as the Hugging Face converter needs).

Attention is written for CPU speed: the query heads of one GQA group are stacked along the
row axis so K and V are never repeated per head ([B, n_kv, group*T, hd] @ [B, n_kv, hd, T]),
the 1/sqrt(hd) scale is folded into Q, and the additive mask (causal and block-diagonal over
the examples packed into a row) is fused into the score matmul with baddbmm.
"""

import math
from dataclasses import dataclass, asdict

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class Config:
    vocab_size: int = 1024
    dim: int = 256
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int = 2
    ffn_dim: int = 512
    context_length: int = 4096   # advertised in the GGUF; training uses seq_len
    rope_base: float = 10000.0
    norm_eps: float = 1e-5

    @property
    def head_dim(self):
        return self.dim // self.n_heads

    def to_dict(self):
        return asdict(self)


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_tables(head_dim, positions, base):
    """cos/sin [T, head_dim/2] for the adjacent-pair layout."""
    inv = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float32,
                                 device=positions.device) / head_dim)
    ang = positions.float()[:, None] * inv[None, :]
    return torch.cos(ang), torch.sin(ang)


def apply_rope(x, cos, sin):
    # x [..., T, hd]; pairs (2i, 2i+1)
    x2 = x.unflatten(-1, (-1, 2))
    a, b = x2[..., 0], x2[..., 1]
    out = torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1)
    return out.flatten(-2)


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        hd = cfg.head_dim
        self.wq = nn.Linear(cfg.dim, cfg.n_heads * hd, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.n_kv_heads * hd, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.n_kv_heads * hd, bias=False)
        self.wo = nn.Linear(cfg.n_heads * hd, cfg.dim, bias=False)
        self.keep_probs = False  # diagnostics (stop_heads.py): keep the last attention map
        self.probs = None

    def forward(self, x, cos, sin, mask):
        # mask: additive, [B * n_kv_heads, group * T, T] (0 or -inf); see Transformer.forward
        B, T, _ = x.shape
        cfg = self.cfg
        hd, nkv = cfg.head_dim, cfg.n_kv_heads
        g = cfg.n_heads // nkv
        q = self.wq(x).view(B, T, cfg.n_heads, hd).transpose(1, 2)   # B H T hd
        k = self.wk(x).view(B, T, nkv, hd).transpose(1, 2)           # B Hkv T hd
        v = self.wv(x).view(B, T, nkv, hd).transpose(1, 2)
        q = apply_rope(q, cos, sin) * (1.0 / math.sqrt(hd))
        k = apply_rope(k, cos, sin)
        # head h uses kv head h // g: stack the g query heads of a group along rows
        q = q.reshape(B * nkv, g * T, hd)
        k = k.reshape(B * nkv, T, hd)
        v = v.reshape(B * nkv, T, hd)
        scores = torch.baddbmm(mask, q, k.transpose(1, 2))
        p = torch.softmax(scores, dim=-1)
        if self.keep_probs:
            self.probs = p.detach()  # [B * n_kv_heads, group * T, T]
        o = torch.bmm(p, v)                                           # B*nkv, g*T, hd
        o = o.view(B, nkv, g, T, hd).reshape(B, cfg.n_heads, T, hd).transpose(1, 2)
        return self.wo(o.reshape(B, T, cfg.n_heads * hd))


class FeedForward(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.w1 = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False)  # gate
        self.w3 = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False)  # up
        self.w2 = nn.Linear(cfg.ffn_dim, cfg.dim, bias=False)  # down

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.ffn = FeedForward(cfg)

    def forward(self, x, cos, sin, mask):
        x = x + self.attn(self.attn_norm(x), cos, sin, mask)
        return x + self.ffn(self.ffn_norm(x))


class Transformer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        assert cfg.n_heads % cfg.n_kv_heads == 0
        self.cfg = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList([Block(cfg) for _ in range(cfg.n_layers)])
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.apply(self._init)
        for name, p in self.named_parameters():
            if name.endswith("wo.weight") or name.endswith("w2.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layers))

    @staticmethod
    def _init(m):
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)

    def forward(self, tokens, positions, mask):
        """tokens [B, T]; positions [T] (RoPE positions); mask additive [B, 1, T, T].
        Returns logits [B, T, vocab]."""
        cfg = self.cfg
        B, T = tokens.shape
        cos, sin = rope_tables(cfg.head_dim, positions, cfg.rope_base)
        # one materialised mask for all layers, rows laid out as the attention stacks them
        mask = mask.expand(B, cfg.n_heads, T, T).reshape(B * cfg.n_kv_heads,
                                                          (cfg.n_heads // cfg.n_kv_heads) * T, T)
        x = self.tok_embeddings(tokens)
        for layer in self.layers:
            x = layer(x, cos, sin, mask)
        x = self.norm(x)
        return x @ self.tok_embeddings.weight.t()

    def n_params(self):
        return sum(p.numel() for p in self.parameters())


def causal_doc_mask(doc_ids):
    """doc_ids [B, T] (one id per packed example) -> additive mask [B, 1, T, T]: a token sees
    earlier tokens of its own example only."""
    B, T = doc_ids.shape
    causal = torch.ones(T, T, dtype=torch.bool, device=doc_ids.device).tril_()
    same = doc_ids[:, :, None] == doc_ids[:, None, :]
    allowed = same & causal
    mask = torch.zeros(B, 1, T, T, device=doc_ids.device)
    mask.masked_fill_(~allowed[:, None], float("-inf"))
    return mask


def load_eval_model(path):
    """A train.py checkpoint or the f16 weights in train/checkpoints/, as an f32 model in eval
    mode."""
    ck = torch.load(path, map_location="cpu")
    model = Transformer(Config(**ck["config"]))
    model.load_state_dict({k: v.float() for k, v in ck["model"].items()})
    return model.eval()


def sequence_logits(model, ids):
    """[len(ids), vocab] next-token logits of one sequence from position 0, without gradients."""
    n = len(ids)
    with torch.no_grad():
        return model(torch.tensor([list(ids)]), torch.arange(n),
                     causal_doc_mask(torch.zeros(1, n, dtype=torch.long)))[0]
