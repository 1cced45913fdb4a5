"""Exact attention under a PositionMap (Self-Extend, Dual Chunk Attention, LM-Infinite, attention sinks),
in chunks of queries so that memory is O(chunk x Tk), never (H, Tq, Tk).

For each chunk of queries and each map m, the keys that map m scores (a contiguous index range, found
from the selector) are scored at m's positions; the maps' partial softmaxes are merged by their running
max and sum (the log-sum-exp merge of flash attention, and of ChunkLlama's merge_attn_outputs), which is
exactly the softmax over the merged score row. Notation: B, H, Hkv, Tq, Tk, Dh as in attention.py; C the
rows of one chunk; K the keys one map scores in it; g = H // Hkv query heads per key/value head.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from posenc.position_maps.base import PositionMap
from posenc.scheme import Scheme

SCORE_BUDGET = 1 << 24  # score elements per chunk and map: 64 MiB in float32, a few copies at most live


def chunk_rows(batch: int, heads: int, tq: int, tk: int, budget: int | None = None) -> int:
    """Query rows per chunk: as many as keep B * H * C * Tk within the budget (SCORE_BUDGET), at least one."""
    budget = SCORE_BUDGET if budget is None else budget
    return max(1, min(tq, budget // max(1, batch * heads * tk)))


def _rotate_queries(scheme: Scheme, q: Tensor, pos: Tensor) -> Tensor:
    # rotate() takes a pair; a one-key dummy keeps the scheme's own q rotation (xPos scales q and k apart)
    return scheme.rotate(q, q[:, :1, :1], pos, pos[:, :1])[0]


def _rotate_keys(scheme: Scheme, k: Tensor, pos: Tensor) -> Tensor:
    return scheme.rotate(k[:, :1, :1], k, pos[:, :1], pos)[1]


def mapped_attention(q: Tensor, k: Tensor, v: Tensor, scheme: Scheme, position_map: PositionMap,
                     q_pos: Tensor, k_pos: Tensor, causal: bool = True, dropout: float = 0.0,
                     budget: int | None = None) -> Tensor:
    """q (B,H,Tq,Dh), k/v (B,Hkv,Tk,Dh) unrotated, the queries being the last Tq keys; q_pos (B,Tq), k_pos (B,Tk)
    -> (B,H,Tq,Dh). scheme rotates (its rotate()); position_map says at which positions and which keys."""
    dtype = q.dtype
    if q.element_size() < 4:  # half precision: scores and sums in float32, one rounding at the end
        q, k, v = q.float(), k.float(), v.float()
    b, h, tq, _ = q.shape
    tk = k.shape[2]
    origin = k_pos[:, :1]  # (B,1)
    rotated: dict[int, Tensor] = {}  # maps sharing one key-position tensor share its rotation (DCA)
    keys = []
    for pos in position_map.key_positions(k_pos, origin):
        if id(pos) not in rotated:
            rotated[id(pos)] = _rotate_keys(scheme, k, pos)  # (B,Hkv,Tk,Dh)
        keys.append(rotated[id(pos)])
    q_maps = position_map.query_positions(q_pos, origin)  # per map (B,Tq)
    rows = chunk_rows(b, h, tq, tk, budget)
    key_index = torch.arange(tk, device=q.device)
    out = []
    for start in range(0, tq, rows):
        end = min(tq, start + rows)
        select = position_map.select(q_pos[:, start:end], k_pos, origin)  # (B,C,Tk) int8
        if causal:
            query_index = torch.arange(tk - tq + start, tk - tq + end, device=q.device)
            select = select.masked_fill(key_index[None, None, :] > query_index[None, :, None], -1)
        queries = [_rotate_queries(scheme, q[:, :, start:end], p[:, start:end]) for p in q_maps]
        out.append(_merged_chunk(queries, keys, v, select, dropout))
    return torch.cat(out, dim=2).to(dtype)


def _merged_chunk(queries: list[Tensor], keys: list[Tensor], v: Tensor, select: Tensor, dropout: float) -> Tensor:
    """queries per map (B,H,C,Dh), keys per map (B,Hkv,Tk,Dh), v (B,Hkv,Tk,Dh), select (B,C,Tk) -> (B,H,C,Dh)."""
    b, h, c, dh = queries[0].shape
    hkv = v.shape[1]
    g = h // hkv
    high = queries[0].new_full((b, hkv, g * c, 1), float("-inf"))  # running max per row
    total = queries[0].new_zeros((b, hkv, g * c, 1))  # running sum of exp(score - high)
    acc = queries[0].new_zeros((b, hkv, g * c, dh))  # running sum of exp(score - high) v
    for m, (q_m, k_m) in enumerate(zip(queries, keys, strict=True)):
        hit = select == m  # (B,C,Tk)
        cols = hit.any(dim=1).any(dim=0).nonzero()
        if cols.numel() == 0:
            continue
        lo, hi = int(cols[0]), int(cols[-1]) + 1  # the keys this map scores: one contiguous range
        scores = q_m.reshape(b, hkv, g * c, dh) @ k_m[:, :, lo:hi].transpose(-1, -2) * dh**-0.5  # (B,Hkv,g*C,K)
        scores = scores.view(b, hkv, g, c, hi - lo).masked_fill(~hit[:, None, None, :, lo:hi], float("-inf"))
        scores = scores.view(b, hkv, g * c, hi - lo)
        new_high = torch.maximum(high, scores.amax(dim=-1, keepdim=True))
        safe = new_high.masked_fill(new_high == float("-inf"), 0.0)  # rows with no key yet: exp(-inf) = 0
        p = torch.exp(scores - safe)
        keep = torch.exp(high - safe)
        total = total * keep + p.sum(dim=-1, keepdim=True)
        # dropout of the normalised weights = dropout of the numerator's terms (the sum stays undropped)
        acc = acc * keep + (F.dropout(p, dropout) if dropout > 0 else p) @ v[:, :, lo:hi]
        high = new_high
    out = acc / total.clamp_min(torch.finfo(acc.dtype).tiny)  # a row with no key at all gives 0, not NaN
    return out.view(b, h, c, dh)
