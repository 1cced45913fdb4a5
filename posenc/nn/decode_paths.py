"""A decode step's kernels for biases that positions alone decide (one query per row, no gradient): SDPA with the
step's bias row as its mask. Notation as in attention.py.

Every layer of a decode step reads the same positions and (for a scheme shared by the layers) the same parameters,
so the row of every key, (B|1,H,1,Tk), is built once per step (row_paths.per_forward) and each layer only runs
SDPA: ALiBi's, KERPLE's, Sandwich's and T5's rows by distance (Scheme.bias_by_distance) and FIRE's MLP over every
key's distance (Scheme.piecewise_bias). The rows by distance are also kept across steps (kept_tables), over a
range that doubles: the next step asks for one distance more, and reads a slice.

Each kernel takes a posenc.nn.dispatch.Call and returns the output or None (it does not serve), as row_paths'.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from posenc.nn import fused_attention, row_paths
from posenc.nn.attention_core import sdpa
from posenc.nn.call import Call
from posenc.nn.kept_tables import kept_span
from posenc.nn.row_paths import Offsets, on_gpu, row_slice, runs_native, span_of
from posenc.scheme import PiecewiseBias, Scheme


def rows_decode(call: Call) -> Tensor | None:
    """Rows per head: SDPA with the step's bias row as the mask (its single-query kernel is faster)."""
    mask = distance_step_row(call)
    return None if mask is None else _attend(call, mask)


def pieces_decode(call: Call) -> Tensor | None:
    """FIRE's decode step: its MLP over every key's distance once per step, then SDPA in every layer."""
    mask = pieces_step_row(call)
    return None if mask is None else _attend(call, mask)


def distance_step_row(call: Call) -> Tensor | None:
    """The (B|1,H,1,Tk) row rows_decode adds, or None where it does not serve."""
    return step_row(call, "distance row", _distance_row)


def pieces_step_row(call: Call) -> Tensor | None:
    """The (B|1,H,1,Tk) row pieces_decode adds, or None where it does not serve."""
    return step_row(call, "pieces row", _pieces_row)


def step_row(call: Call, kind: str, build: Callable[[Call], Tensor | None]) -> Tensor | None:
    """build(call), the (B|1,H,1,Tk) bias row in q's dtype, once per step; None where these kernels do not serve
    (dropout, a device or dtype neither SDPA's mask path nor the native kernels take). Every layer of a step
    has the same shapes, dtype, device and positions, so that is asked once per step too."""
    q, k = call.q, call.k
    key = (q.shape, k.shape, q.dtype, q.device, call.causal, call.dropout)
    return row_paths.per_forward(call.scheme, kind, call.q_pos, call.k_pos, key,
                                 lambda: build(call) if _serves(call) else None)


def _serves(call: Call) -> bool:
    return call.dropout == 0.0 and (on_gpu(call) or runs_native(call))


def _attend(call: Call, mask: Tensor) -> Tensor:
    q, k = call.q, call.k
    return sdpa(q, k, call.v, mask, gqa=k.shape[1] != q.shape[1])


def _in_dtype(row: Tensor, like: Tensor) -> Tensor:
    return row if row.dtype == like.dtype else row.to(like.dtype)


def _distance_row(call: Call) -> Tensor | None:
    if (span := span_of(call)) is None:
        return None
    rows = kept_distance_rows(call.scheme, span.low, span.high, call.q.device)  # (1,H,1,S)
    if rows is None:
        return None
    return _in_dtype(row_slice(rows, span.offsets, span.low, call.k.shape[-2], call.q.shape[0]), call.q)


def kept_distance_rows(scheme: Scheme, low: int, high: int, device: torch.device) -> Tensor | None:
    """(1,H,1,S) rows over r = low..high (row_paths.distance_rows), a slice of rows kept across steps. No gradient:
    the caller serves only steps that want none."""
    return kept_span(scheme, ("distance rows", device), low, high,
                     lambda first, last: row_paths.distance_rows(scheme, first, last, device))


def _pieces_row(call: Call) -> Tensor | None:
    if (span := span_of(call)) is None:
        return None
    pieces = call.scheme.piecewise_bias(call.q_pos, span.low, span.high)
    return None if pieces is None else _in_dtype(one_query(pieces, span.offsets, call.k.shape[-2]), call.q)


def one_query(pieces: PiecewiseBias, offsets: Offsets, tk: int) -> Tensor:
    """The piecewise bias of one query per batch row over its tk keys, (B|1,H,1,Tk): on the CPU in one native call
    (fused_attention.piecewise_row), elsewhere in PyTorch (each operator counts here: a decode step runs this once,
    with every cache line cold)."""
    shared = offsets.lowest == offsets.highest
    divisor = pieces.divisor if pieces.divisor.shape[1] == 1 else pieces.divisor[:, :1]  # (b|1,1)
    if pieces.feature.is_cpu:  # the native kernel, one call (its row offsets read on the host: free on the CPU only)
        first = [-offsets.highest - pieces.low] if shared else (-pieces.low - offsets.delta).tolist()
        row = fused_attention.piecewise_row(pieces.feature, divisor, pieces.knots, pieces.slopes, pieces.intercepts,
                                            first, tk)
        if row is not None:
            return row
    if shared and 0 <= (first := -offsets.highest - pieces.low) <= pieces.feature.shape[0] - tk:
        x = pieces.feature.narrow(0, first, tk) / divisor  # (1,Tk): the usual decode step reads a view
    else:
        e = (-pieces.low - offsets.delta)[: 1 if shared else None]  # (b,) index of each row's first key
        x = pieces.feature[e[:, None] + torch.arange(tk, device=e.device)] / divisor  # (b,Tk)
    segment = torch.searchsorted(pieces.knots, x)  # knots below x
    # Each key's slope and intercept in one column gather (3x faster than two advanced-indexing gathers).
    h, b = pieces.slopes.shape[0], x.shape[0]
    lines = torch.cat((pieces.slopes, pieces.intercepts)).index_select(1, segment.view(-1)).view(2, h, b, tk)
    row = torch.addcmul(lines[1], lines[0], x)  # (H,b,Tk)
    return row.view(1, h, 1, tk) if b == 1 else row.transpose(0, 1).unsqueeze(2)  # (b,H,1,Tk)


__all__ = ["distance_step_row", "kept_distance_rows", "one_query", "pieces_decode", "pieces_step_row", "rows_decode",
           "step_row"]
