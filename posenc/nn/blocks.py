"""The pre-norm transformer block (GPT-2 layout): x + attn(norm(x)), x + mlp(norm(x)). Causal in a
decoder (GPT), bidirectional in an encoder (T5)."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from posenc.nn.attention import SelfAttention
from posenc.nn.kv_cache import KVCache
from posenc.scheme import Scheme


class MLP(nn.Module):
    def __init__(self, d_model: int, hidden: int, bias: bool = False, dropout: float = 0.0) -> None:
        super().__init__()
        self.up = nn.Linear(d_model, hidden, bias=bias)
        self.down = nn.Linear(hidden, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.down(F.gelu(self.up(x))))


class TransformerBlock(nn.Module):
    def __init__(self, d_model: int, n_head: int, n_kv_head: int, hidden: int, layer: int,
                 bias: bool = False, dropout: float = 0.0, causal: bool = True, eps: float = 1e-5) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(d_model, eps=eps, bias=bias)
        self.attn = SelfAttention(d_model, n_head, n_kv_head, causal, bias, dropout, layer)
        self.norm2 = nn.LayerNorm(d_model, eps=eps, bias=bias)
        self.mlp = MLP(d_model, hidden, bias, dropout)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, scheme: Scheme, q_pos: Tensor, k_pos: Tensor,
                cache: KVCache | None = None) -> Tensor:
        x = x + self.dropout(self.attn(self.norm1(x), scheme, q_pos, k_pos, cache))
        return x + self.mlp(self.norm2(x))
