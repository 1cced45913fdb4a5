"""Cross-attention of an encoder-decoder: decoder queries read the encoder's outputs.

Notation as in attention.py: B batch, H query heads, Hkv key/value heads, Tq decoder
queries, Ts encoder (source) positions, Dh head dim, D model dim.
No positional scheme here: T5 gives cross-attention no position bias (Raffel et al. 2020,
sec. 2.1 and HF's T5LayerCrossAttention, has_relative_attention_bias=False); the encoder
already put positions into its outputs, and query/source positions live on different axes.
"""

from __future__ import annotations

from torch import Tensor

from posenc.nn.attention import attend
from posenc.nn.projections import HeadProjections


class CrossAttention(HeadProjections):
    def __init__(self, d_model: int, n_head: int, n_kv_head: int, bias: bool = False, dropout: float = 0.0) -> None:
        super().__init__(d_model, n_head, n_kv_head, bias)
        self.dropout = dropout

    def memory(self, encoded: Tensor) -> tuple[Tensor, Tensor]:
        """Encoder outputs (B,Ts,D) -> keys, values (B,Hkv,Ts,Dh); computed once per generate()."""
        return self._heads(self.k_proj(encoded), self.n_kv_head), self._heads(self.v_proj(encoded), self.n_kv_head)

    def forward(self, x: Tensor, memory: tuple[Tensor, Tensor]) -> Tensor:
        """x (B,Tq,D), memory from self.memory() -> (B,Tq,D). Every query sees every source position."""
        q = self._heads(self.q_proj(x), self.n_head)  # (B,H,Tq,Dh)
        k, v = memory
        out = attend(q, k, v, None, causal=False, dropout=self.dropout if self.training else 0.0)  # (B,H,Tq,Dh)
        return self.o_proj(out.transpose(1, 2).flatten(2))  # (B,Tq,D)


__all__ = ["CrossAttention"]
