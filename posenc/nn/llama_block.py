"""Llama decoder block (Touvron et al. 2023): pre-RMSNorm, GQA attention, SwiGLU MLP.

x + attn(rms(x)), then x + down(silu(gate(h)) * up(h)) with h = rms(x) (Shazeer 2020, eq. 6).
Attention is posenc's one SelfAttention, so every scheme (and the KV cache) works here too.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from posenc.nn.attention import SelfAttention
from posenc.nn.kv_cache import KVCache
from posenc.scheme import Scheme


class SwiGLU(nn.Module):
    def __init__(self, d_model: int, hidden: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(d_model, hidden, bias=False)
        self.up_proj = nn.Linear(d_model, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, d_model, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))  # (B,T,hidden) -> (B,T,D)


class LlamaBlock(nn.Module):
    def __init__(self, d_model: int, n_head: int, n_kv_head: int, hidden: int, layer: int,
                 eps: float = 1e-5) -> None:
        super().__init__()
        self.input_layernorm = nn.RMSNorm(d_model, eps=eps)
        self.attn = SelfAttention(d_model, n_head, n_kv_head, causal=True, bias=False, layer=layer)
        self.post_attention_layernorm = nn.RMSNorm(d_model, eps=eps)
        self.mlp = SwiGLU(d_model, hidden)

    def forward(self, x: Tensor, scheme: Scheme, q_pos: Tensor, k_pos: Tensor,
                cache: KVCache | None = None) -> Tensor:
        x = x + self.attn(self.input_layernorm(x), scheme, q_pos, k_pos, cache)
        return x + self.mlp(self.post_attention_layernorm(x))
