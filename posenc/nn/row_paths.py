"""Attention whose bias is read from rows inside one native kernel (posenc.nn.fused_attention), for schemes
that give rows: Scheme.bias_by_distance (one row per head: ALiBi, KERPLE, Sandwich, T5) or
Scheme.relative_rows (one row per query: Shaw, Transformer-XL). Notation as in attention.py.

Rows are indexed by r = n - m (key minus query). They serve when every row of positions counts up by one
(n - m = j - i - delta for key j, query i): the usual training, prompt and cached-decoding layout. Any other
layout (packed or randomized positions), another dtype or device, or dropout, returns None: the caller
falls back to the chunked or reference path, which every fast path here is tested equal to.
"""

from __future__ import annotations

import weakref

import torch
from torch import Tensor

from posenc.nn import fused_attention
from posenc.scheme import Scheme

# Positions and rows are shared by all layers of a forward: one check and one row per forward, not per layer.
_offsets_memo: list = [None]  # (q_pos, k_pos, versions, delta)
_rows_memo: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # scheme -> (q_pos, k_pos, key, rows)


def position_offsets(q_pos: Tensor, k_pos: Tensor) -> Tensor | None:
    """(B,Tq), (B,Tk) -> delta = q_pos[:, 0] - k_pos[:, 0] (B,) when every row of both counts up by one."""
    hit = _offsets_memo[0]
    versions = (q_pos._version, k_pos._version)
    if hit is not None and hit[0] is q_pos and hit[1] is k_pos and hit[2] == versions:
        return hit[3]
    delta = _offsets(q_pos, k_pos)
    _offsets_memo[0] = (q_pos, k_pos, versions, delta)
    return delta


def _counts_up(pos: Tensor) -> bool:
    rows = pos[:1] if pos.stride(0) == 0 else pos  # an expanded tensor: one row to check
    steps = torch.arange(pos.shape[1], device=pos.device)
    return bool((rows - rows[:, :1] == steps).all())


def _offsets(q_pos: Tensor, k_pos: Tensor) -> Tensor | None:
    if q_pos.dim() != 2 or k_pos.dim() != 2 or not (_counts_up(q_pos) and _counts_up(k_pos)):
        return None
    return (q_pos[:, 0] - k_pos[:, 0]).to(torch.int64)


def relative_span(delta: Tensor, tq: int, tk: int, causal: bool) -> tuple[int, int]:
    """Lowest and highest r = n - m = j - i - delta that attention reads (causal: j <= i + tk - tq)."""
    low = -(tq - 1) - int(delta.max())
    high = (tk - tq if causal else tk - 1) - int(delta.min())
    return low, high


def _distance_rows(scheme: Scheme, q_pos: Tensor, k_pos: Tensor, low: int, high: int) -> Tensor | None:
    """(1,H,1,S) rows over r = low..high from the scheme's bias of m - n = -r, once per forward."""
    key = (q_pos._version, k_pos._version, low, high, torch.is_grad_enabled(),
           tuple(p._version for p in scheme.parameters()))
    hit = _rows_memo.get(scheme)
    if hit is not None and hit[0] is q_pos and hit[1] is k_pos and hit[2] == key:
        return hit[3]
    distance = torch.arange(-high, -low + 1, device=q_pos.device)  # m - n, ascending
    by_distance = scheme.bias_by_distance(distance)  # (H,S)
    rows = None if by_distance is None else by_distance.flip(-1)[None, :, None, :]  # r = low..high
    _rows_memo[scheme] = (q_pos, k_pos, key, rows)
    return rows


def attend(q: Tensor, k: Tensor, v: Tensor, scheme: Scheme, q_pos: Tensor, k_pos: Tensor,
           causal: bool) -> Tensor | None:
    """q (B,H,Tq,Dh), k/v (B,Hkv,Tk,Dh) -> (B,H,Tq,Dh) with the scheme's bias (and value term), or None."""
    if not fused_attention.can_run(q, k, v):
        return None
    delta = position_offsets(q_pos, k_pos)
    if delta is None:
        return None
    tq, tk = q.shape[-2], k.shape[-2]
    low, high = relative_span(delta, tq, tk, causal)
    if high - low + 1 > 2 * (tq + tk):  # batch rows far apart: rows would be longer than the scores
        return None
    rows = _distance_rows(scheme, q_pos, k_pos, low, high)
    if rows is not None:
        return fused_attention.attend_rows(q, k, v, rows, -delta - low, causal)[0]
    relative = scheme.relative_rows(q, low, high)
    if relative is None:
        return None
    q_in = q if relative.q_shift is None else q + relative.q_shift.to(q.dtype)[None, :, None, :]
    fused = fused_attention.attend_rows(q_in, k, v, relative.rows, -delta - relative.low, causal,
                                        want_mass=relative.values is not None)
    out, mass = fused
    return out if mass is None else out + mass @ relative.values  # (B,H,Tq,S) @ (S,Dh)


__all__ = ["attend", "position_offsets", "relative_span"]
