"""One attention call as every kernel receives it, and the one test of whether it needs a gradient.

posenc.nn.dispatch builds a Call once per layer and hands it to the kernels it picks (row_paths, bias_paths,
mapped_attention); they live below the dispatch and import this, not it. Notation as in attention.py.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from posenc.scheme import Scheme


class Call(NamedTuple):
    """q (B,H,Tq,Dh), k/v (B,Hkv,Tk,Dh) as rotate() left them; q_pos (B,Tq), k_pos (B,Tk) as frame() left them;
    grad: needs_grad() of this call; kept: where a kernel may keep what it derives from the cached keys."""

    q: Tensor
    k: Tensor
    v: Tensor
    scheme: Scheme
    q_pos: Tensor
    k_pos: Tensor
    causal: bool
    dropout: float
    grad: bool
    kept: dict | None = None  # a KV cache's store for this layer (KVCache.derived): values derived from its keys


def needs_grad(q: Tensor, k: Tensor, v: Tensor, scheme: Scheme | None = None) -> bool:
    """Whether a backward will want a gradient from this attention call: autograd on, and q, k, v or one of the
    scheme's parameters requiring a gradient. Kernels without a backward (flex on the CPU, the decode shortcuts,
    the fused kernels of the position maps) serve only where this is False."""
    if not torch.is_grad_enabled():
        return False
    if q.requires_grad or k.requires_grad or v.requires_grad:
        return True
    return scheme is not None and any(p.requires_grad for p in scheme.parameters())


__all__ = ["Call", "needs_grad"]
