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
    b, h = q.shape[:2]
    hkv, slots = k.shape[1], k.shape[2]
    # One query row per head, GQA by enable_gqa, the row expanded (no copy). Not the g query heads of a key head as g
    # query rows of it (q (B,Hkv,g,Dh), the row copied to (B,Hkv,g,L)): cuDNN then ran one program per key head over
    # every slot, 0.52 ms a layer at 32k slots for SmolLM2's 3 key heads, against 0.06 ms (H200, torch 2.11).
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=row.expand(b, h, 1, slots), enable_gqa=hkv != h)
    return out  # (B,H,1,Dh), in whatever memory order the device's kernel returns


__all__ = ["slot_attention"]
