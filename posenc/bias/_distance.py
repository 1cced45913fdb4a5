"""Biases that depend only on the distance m - n: values are computed once per distance (H, span)
and gathered, instead of evaluating a kernel or a bucket on every (B, H, Tq, Tk) entry; rows of a
batch that share positions (the usual case) share one (1, H, Tq, Tk) bias, broadcast over B."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor


def shared_rows(q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
    """(B,Tq), (B,Tk) -> the first row only when every row equals it (then the bias broadcasts)."""
    if q_pos.shape[0] > 1 and bool((q_pos == q_pos[:1]).all()) and (k_pos is q_pos or bool((k_pos == k_pos[:1]).all())):
        return q_pos[:1], k_pos[:1]
    return q_pos, k_pos


def distance_bias(q_pos: Tensor, k_pos: Tensor, values_for: Callable[[Tensor], Tensor]) -> Tensor:
    """values_for(distances (S,) int64, ascending m - n) -> (H, S); returns (b, H, Tq, Tk), b in {1, B}."""
    q_pos, k_pos = shared_rows(q_pos, k_pos)
    distance = q_pos[:, :, None] - k_pos[:, None, :]  # (b,Tq,Tk) = m - n
    lowest = int(distance.min())
    values = values_for(torch.arange(lowest, int(distance.max()) + 1, device=q_pos.device))  # (H,S)
    b, tq, tk = distance.shape
    gathered = values.index_select(1, (distance - lowest).flatten())  # (H, b*Tq*Tk)
    return gathered.view(-1, b, tq, tk).transpose(0, 1)  # (b,H,Tq,Tk); a free view when b == 1
