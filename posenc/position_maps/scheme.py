"""A rotary scheme with its positions remapped per (query, key) pair by a PositionMap.

The wrapper (posenc.position_map.MappedScheme) leaves q and k unrotated in rotate(), so the KV cache stores raw keys
(each map rotates them at its own positions); posenc.nn.dispatch runs its attention map by map. Which schemes it
can wrap: those whose only positional hook is rotate() with a rotation that depends on the position alone (rope,
p_rope, xpos), with a static rope_scaling (a dynamic one would pick its frequencies from the remapped
positions of each call, so queries and keys could disagree).
"""

from __future__ import annotations

from torch import Tensor

from posenc.nn import dispatch
from posenc.position_map import MappedScheme


class PositionMapped(MappedScheme):
    """MappedScheme with the attend() hook a caller of the hooks expects: the dispatch's map kernels."""

    def attend(self, q: Tensor, k: Tensor, v: Tensor, q_pos: Tensor, k_pos: Tensor, causal: bool,
               dropout: float = 0.0) -> Tensor:
        return dispatch.attention(q, k, v, self, q_pos, k_pos, causal, dropout)
