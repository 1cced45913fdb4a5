"""One attention for every scheme: rotate, cache, bias, mask, then SDPA.

Notation: B batch, H query heads, Hkv key/value heads (GQA when Hkv < H), Tq new queries,
Tk keys (cached + new), Dh head dim, D model dim.
The scheme is passed in, never stored, so one instance serves all layers and the state
dict holds its parameters once. Attention calls every hook and never asks which scheme.
"""

from __future__ import annotations

from torch import Tensor

from posenc.nn import dispatch
from posenc.nn.attention_core import attend, attend_eager, causal_mask
from posenc.nn.kv_cache import KVCache
from posenc.nn.projections import HeadProjections
from posenc.scheme import Scheme

__all__ = ["SelfAttention", "attend", "attend_eager", "causal_mask"]


class SelfAttention(HeadProjections):
    def __init__(self, d_model: int, n_head: int, n_kv_head: int, causal: bool, bias: bool = False,
                 dropout: float = 0.0, layer: int = 0) -> None:
        super().__init__(d_model, n_head, n_kv_head, bias)
        self.causal, self.dropout, self.layer = causal, dropout, layer

    def forward(self, x: Tensor, scheme: Scheme, q_pos: Tensor, k_pos: Tensor,
                cache: KVCache | None = None) -> Tensor:
        """x (B,Tq,D); q_pos (B,Tq); k_pos (B,Tk) = positions of cached + new keys."""
        q = self._heads(self.q_proj(x), self.n_head)  # (B,H,Tq,Dh)
        k = self._heads(self.k_proj(x), self.n_kv_head)  # (B,Hkv,Tq,Dh)
        v = self._heads(self.v_proj(x), self.n_kv_head)
        q, k = scheme.rotate(q, k, q_pos, q_pos)  # new keys sit at the new positions
        kept = None
        if cache is not None:
            k, v = cache.update(self.layer, k, v)  # (B,Hkv,Tk,Dh)
            kept = cache.derived(self.layer)
        dropout = self.dropout if self.training else 0.0
        out = dispatch.attention(q, k, v, scheme, q_pos, k_pos, self.causal, dropout, kept)  # (B,H,Tq,Dh)
        return self.o_proj(out.transpose(1, 2).flatten(2))  # (B,Tq,D)
