"""`cope`: contextual position encoding (Golovneva et al. 2024, "Contextual Position Encoding:
Learning to Count What's Important", arXiv 2405.18719, and its reference code).

Positions are counted by the content, not by tokens:
  g_ij = sigmoid(q_i . k_j / sqrt(Dh))        gate: does key j count for query i?
  p_ij = sum_{t=j..i} g_it                    contextual position of j seen from i
  e[p] = (p - floor p) e[ceil p] + (1 - p + floor p) e[floor p]   interpolation of a learned table
  a_ij = q_i . k_j / sqrt(Dh) + q_i . e[p_ij]
The table e has cope_npos_max rows of Dh, shared by heads and owned by each layer (per_layer), and
p is clipped to npos_max - 1, as in the reference code. As there, the position term q . e is not
divided by sqrt(Dh) (only the gates use the scaled product); the table starts at zero.

Efficiency (as in the paper): p is fractional, so e[p] is never built per pair. q @ e^T (B,H,Tq,npos) holds
every integer position's logit; the pair's logit is interpolated between the gathers at floor p
and ceil p. Gates use all keys the hook sees (cached + new), masked causally, and p is a cumsum
from the right, so decoding with the KV cache gives exactly the full computation's p. Position
ids are never read: relative=True. Causal only (p sums from j up to i).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from posenc.masks import causal_mask
from posenc.scheme import Dims, Scheme, cast
from posenc.validators import positive_int


def counting_dtype(dtype: torch.dtype) -> torch.dtype:
    """What the gates, their counts and the rows are computed in: float32, or float64 for float64 inputs (a count
    of hundreds of gates in 16 bits would move by whole positions; a float64 model is a reference, kept exact)."""
    return torch.float64 if dtype == torch.float64 else torch.float32  # (not promote_types: a call per step)


def contextual_positions(q: Tensor, k: Tensor) -> Tensor:
    """q (B,H,Tq,Dh), k (B,Hkv,Tk,Dh) -> p_ij = sum_{t=j..i} g_it (B,H,Tq,Tk) in counting_dtype, 0 for j > i.

    The Tq queries are the last Tq of the Tk keys (as in attention's causal mask)."""
    h, hkv, tq, tk = q.shape[1], k.shape[1], q.shape[-2], k.shape[-2]
    if hkv != h:  # GQA: each key head serves h // hkv query heads
        k = k.repeat_interleave(h // hkv, dim=1)  # (B,H,Tk,Dh)
    wide = counting_dtype(q.dtype)
    logits = (q.to(wide) @ k.to(wide).transpose(-1, -2)) * q.shape[-1] ** -0.5  # (B,H,Tq,Tk)
    gates = torch.sigmoid(logits).masked_fill(~causal_mask(tq, tk, q.device), 0.0)  # g_ij, 0 for future keys
    return gates.flip(-1).cumsum(-1).flip(-1)  # sum over t >= j; gates past i are 0


def interpolated_logits(q: Tensor, table: Tensor, positions: Tensor) -> Tensor:
    """q (B,H,Tq,Dh), table (npos,Dh), p (B,H,Tq,Tk) -> q . e[p] (B,H,Tq,Tk), e linearly interpolated."""
    p = positions.clamp(max=table.shape[0] - 1)
    floor = p.floor()
    weight = p - floor  # (B,H,Tq,Tk)
    wide = counting_dtype(q.dtype)
    per_position = q.to(wide) @ table.to(wide).T  # (B,H,Tq,npos): q . e[n] for every integer n
    low = per_position.gather(-1, floor.long())
    high = per_position.gather(-1, p.ceil().long())
    return weight * high + (1.0 - weight) * low


@dataclass(frozen=True, kw_only=True)
class CoPEOptions:
    cope_npos_max: int = 64  # rows of the position table; contextual positions clip at npos_max - 1

    def __post_init__(self) -> None:
        positive_int("cope_npos_max", self.cope_npos_max)


class CoPE(Scheme):
    Options = CoPEOptions
    shift_invariant = True  # reads no position ids at all
    per_layer = True  # each layer learns its own table (reference code: one CoPE per attention)
    supports_bidirectional = False

    def __init__(self, dims: Dims, options: CoPEOptions | None = None, **flat: Any) -> None:
        super().__init__(dims, options, **flat)
        self.table = nn.Parameter(torch.zeros(self.options.cope_npos_max, dims.head_dim))  # e[0..npos-1] (npos,Dh)

    def bias(self, q_pos: Tensor, k_pos: Tensor, q: Tensor | None = None, k: Tensor | None = None) -> Tensor:
        """q_i . e[p_ij] (B,H,Tq,Tk); attention adds it to the scaled q . k logits."""
        if q is None or k is None:
            raise ValueError("cope: bias() needs q and k (gates are sigmoid(q . k)); attention passes them")
        return interpolated_logits(q, self.table, contextual_positions(q, k))

    def contextual_rows(self, q: Tensor) -> Tensor:
        """q . e[n] for every integer position n (B,H,Tq,npos) in counting_dtype: the fast paths interpolate them
        per pair."""
        wide = counting_dtype(q.dtype)
        return cast(q, wide) @ cast(self.table, wide).T

    def extra_repr(self) -> str:
        return f"npos_max={self.table.shape[0]}, head_dim={self.dims.head_dim}"


__all__ = ["CoPE", "contextual_positions", "counting_dtype", "interpolated_logits"]
