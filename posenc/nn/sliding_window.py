"""Sliding-window attention one block of queries at a time, each over the keys its window can reach.

A sliding layer (Mistral, Gemma 2/3's local layers, Qwen's sliding layers) attends to keys at distance < W. With one
(Tq, Tk) mask, attention computes and then throws away every score outside the window: at Gemma 3's W = 512 and a
32k prompt, 64x the work the window needs, in each of its 15 local layers (the dense mask was most of a 32k forward's
time on the CPU). Here queries [a, b) read only keys [lo, hi): from the first key the window of the block's
nearest query can reach (by the positions' offset) to the last the causal mask allows, so the work is
Tq x (block + W) instead of Tq x Tk. Within a block, the mask is the dense one's own entries: the same pairs, exactly.

Served where the positions of every row count up by one (the usual case: then a key's distance is a difference of
indices plus the row's offset); other positions, or a Tk the blocks would not shrink, keep the dense mask (None).
Notation as in attention.py.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from posenc.nn.row_paths import position_offsets

BLOCK_MIN, BLOCK_MAX = 256, 4096  # queries per block: 2W inside these bounds (keys per block <= 3W)

# bias(query slice, key slice) -> the scheme's bias for those pairs, (B|1,H|1,b-a,hi-lo), or None
BiasOf = Callable[[slice, slice], Tensor | None]
Attend = Callable[[Tensor, Tensor, Tensor, Tensor | None, Tensor], Tensor]  # (q, k, v, bias, allowed) -> out


def block_size(window: int) -> int:
    return min(BLOCK_MAX, max(BLOCK_MIN, 2 * window))


def sliding_attention(q: Tensor, k: Tensor, v: Tensor, q_pos: Tensor, k_pos: Tensor, window: int,
                      bias_of: BiasOf, attend: Attend) -> Tensor | None:
    """Causal attention within the window, q (B,H,Tq,Dh), k/v (B,Hkv,Tk,Dh) -> (B,H,Tq,Dh), each block through
    attend(q, k, v, bias, allowed) with allowed (B|1,1,b-a,hi-lo) bool; None where the dense mask is kept."""
    tq, tk = q.shape[-2], k.shape[-2]
    block = block_size(window)
    if tk <= block + window:  # the whole mask is about as small as one block's
        return None
    offsets = position_offsets(q_pos, k_pos)  # distance(i, j) = delta + i - j; None unless positions count up
    if offsets is None:
        return None
    past = tk - tq  # query i is key i + past (causal by index, as every posenc path)
    outs = []
    for a in range(0, tq, block):
        b = min(tq, a + block)
        lo = max(0, a + offsets.lowest - window + 1)  # delta + a - j < W for the row with the smallest delta
        hi = min(tk, b + past)  # j <= i + past
        lo = min(lo, hi - 1)  # at least one key (a block whose every key is masked gives NaN, as the dense mask)
        rows, cols = slice(a, b), slice(lo, hi)
        causal = torch.arange(lo, hi, device=q.device)[None, :] <= torch.arange(a, b, device=q.device)[:, None] + past
        near = q_pos[:, rows, None] - k_pos[:, None, cols] < window  # (B,b-a,hi-lo)
        allowed = (causal & near)[:, None]  # (B,1,b-a,hi-lo)
        outs.append(attend(q[:, :, rows], k[:, :, cols], v[:, :, cols], bias_of(rows, cols), allowed))
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)


__all__ = ["BLOCK_MAX", "BLOCK_MIN", "block_size", "sliding_attention"]
