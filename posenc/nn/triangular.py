"""Rows per query that attention reads only in part: row i of a (Tq, L) block of rows is read from index
Tq - 1 - i on (posenc.scheme.RelativeRows), so the product that makes them can skip the rest, about half.
Notation: B, H, Tq, Dh as in attention.py; L the row length."""

from __future__ import annotations

import torch
from torch import Tensor

CHUNK = 256  # queries per matrix product


def _chunks(tq: int):
    """(start, stop, first column read) per chunk of queries."""
    for start in range(0, tq, CHUNK):
        stop = min(start + CHUNK, tq)
        yield start, stop, max(tq - stop, 0)


class _TriangularRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, table: Tensor) -> Tensor:
        b, h, tq, _ = x.shape
        rows = x.new_empty(b, h, tq, table.shape[1])  # (B,H,Tq,L); the unread corner is never read
        for start, stop, first in _chunks(tq):
            torch.matmul(x[:, :, start:stop], table[:, first:].transpose(-1, -2), out=rows[:, :, start:stop, first:])
        ctx.save_for_backward(x, table)
        return rows

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, table = ctx.saved_tensors
        dx, dtable = torch.zeros_like(x), torch.zeros_like(table)
        for start, stop, first in _chunks(x.shape[2]):
            g = grad[:, :, start:stop, first:]  # (B,H,c,L')
            dx[:, :, start:stop] = g @ table[:, first:]
            dtable[:, first:] += (g.transpose(-1, -2) @ x[:, :, start:stop]).sum(0)  # (H,L',Dh)
        return dx, dtable


def triangular_rows(x: Tensor, table: Tensor) -> Tensor:
    """x (B,H,Tq,Dh) @ table (H,L,Dh)^T -> (B,H,Tq,L), exact where attention reads the rows (row i from
    index Tq - 1 - i on), unspecified elsewhere."""
    if x.shape[2] < 2 * CHUNK:
        return x @ table.transpose(-1, -2)
    return _TriangularRows.apply(x, table)


__all__ = ["triangular_rows"]
