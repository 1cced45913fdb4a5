"""Attention masks as pure functions, shared by attention and the schemes that mask their own terms."""

from __future__ import annotations

import torch
from torch import Tensor


def causal_mask(tq: int, tk: int, device: torch.device) -> Tensor:
    """(Tq,Tk) bool, True where allowed. The Tq queries are the last Tq of the Tk keys."""
    q_idx = torch.arange(tk - tq, tk, device=device)[:, None]
    return torch.arange(tk, device=device)[None, :] <= q_idx
