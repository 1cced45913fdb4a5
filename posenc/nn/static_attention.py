"""Attention of one query per batch row over every slot of a fixed-size KV cache (posenc.nn.static_cache), with the
step's row (B|1, H|1, 1, L) added to the scores: the scheme's bias where it has one, 0 elsewhere, -inf on empty slots
and on keys outside a sliding window. Fixed shapes, no host reads: a CUDA graph captures it.
Notation as in attention.py; L the cache's slots.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from posenc.nn.decoder_attention import masked_attention


def slot_attention(q: Tensor, k: Tensor, v: Tensor, row: Tensor, softcap: float | None = None) -> Tensor:
    """q (B,H,1,Dh), k/v (B,Hkv,L,Dh), row (B|1,H|1,1,L) in q's dtype -> (B,H,1,Dh)."""
    if softcap is not None:  # Gemma 2: the eager form, scores capped before the row is added
        return masked_attention(q, k, v, row, row > float("-inf"), softcap)
    b, h, _, dh = q.shape
    hkv, slots = k.shape[1], k.shape[2]
    # GQA as queries: the g query heads that share a key head become g query rows of it, so SDPA reads each key
    # once and needs no enable_gqa (which not every CUDA kernel that takes a mask supports).
    g = h // hkv
    out = F.scaled_dot_product_attention(q.reshape(b, hkv, g, dh), k, v,
                                         attn_mask=row.expand(b, h, 1, slots).reshape(b, hkv, g, slots))
    return out.reshape(b, h, 1, dh)  # CUDA's kernels return (b, hkv, g, dh) in another memory order


__all__ = ["slot_attention"]
