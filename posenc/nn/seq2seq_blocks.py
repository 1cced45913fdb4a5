"""Encoder-decoder blocks (T5 layout, pre-norm).

The encoder block is blocks.TransformerBlock with causal=False: same layout, no mask.
The decoder block adds cross-attention between self-attention and the MLP:
  x + self_attn(norm(x)),  x + cross_attn(norm(x), encoder memory),  x + mlp(norm(x)).
"""

from __future__ import annotations

from torch import Tensor, nn

from posenc.nn.attention import SelfAttention
from posenc.nn.blocks import MLP
from posenc.nn.cross_attention import CrossAttention
from posenc.nn.kv_cache import KVCache
from posenc.scheme import Scheme


class CrossDecoderBlock(nn.Module):
    def __init__(self, d_model: int, n_head: int, n_kv_head: int, hidden: int, layer: int,
                 bias: bool = False, dropout: float = 0.0, eps: float = 1e-5) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(d_model, eps=eps, bias=bias)
        self.attn = SelfAttention(d_model, n_head, n_kv_head, True, bias, dropout, layer)
        self.norm2 = nn.LayerNorm(d_model, eps=eps, bias=bias)
        self.cross = CrossAttention(d_model, n_head, n_kv_head, bias, dropout)
        self.norm3 = nn.LayerNorm(d_model, eps=eps, bias=bias)
        self.mlp = MLP(d_model, hidden, bias, dropout)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, scheme: Scheme, q_pos: Tensor, k_pos: Tensor, memory: tuple[Tensor, Tensor],
                cache: KVCache | None = None) -> Tensor:
        """x (B,Tq,D); memory = self.cross.memory(encoder outputs); cache holds self-attention keys only."""
        x = x + self.dropout(self.attn(self.norm1(x), scheme, q_pos, k_pos, cache))
        x = x + self.dropout(self.cross(self.norm2(x), memory))
        return x + self.mlp(self.norm3(x))


__all__ = ["CrossDecoderBlock"]
