"""Attention of one query per batch row over every slot of a fixed-size KV cache (posenc.nn.static_cache), with the
step's row (B|1, H|1, 1, L) added to the scores: the scheme's bias where it has one, 0 elsewhere, -inf on empty slots
and on keys outside a sliding window. Fixed shapes, no host reads: a CUDA graph captures it.

Under a position map (map_rotate, map_slot_attention) the step's terms are per map: each map's query rotation, each
key table's rotation of the step's new key (a key's mapped position depends on its own position alone, so every key
is rotated once, when it arrives, and the cache keeps it so), and a mask saying which map scores each slot.
The attention over every slot under a map is planned once per layer by the dispatch (posenc.nn.dispatch.SLOT_RULES):
slot_triton (posenc/nn/triton/slots.py, flash-decoding over shares of the slots) on CUDA in 16-bit types and float32,
else slot_torch, map_slot_attention below, which is also its reference.
Notation as in attention.py; L the cache's slots, M the map's maps, Mk its key tables (maps that share one key
position tensor share its table: DCA's three maps one table, Self-Extend's two maps two), W = Mk * Dh, g = H // Hkv.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from posenc.nn import triton as gpu

# queries (B,H,M+1,W), keys (B,Hkv,L,W), v (B,Hkv,L,Dh), mask (B,1,1,M+1,L) -> (B,H,1,Dh): a layer's attention under a
# map over every slot, as planned once for its shapes (posenc.nn.dispatch.slot_attention_for)
SlotAttention = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]


def slot_attention(q: Tensor, k: Tensor, v: Tensor, row: Tensor, softcap: float | None = None) -> Tensor:
    """q (B,H,1,Dh), k/v (B,Hkv,L,Dh), row (B|1,H|1,1,L) in q's dtype -> (B,H,1,Dh)."""
    if softcap is not None:  # Gemma 2: the eager form, scores capped before the row is added
        # imported here: decoder_attention imports the dispatch, which imports this module (slot_torch, slot_triton)
        from posenc.nn.decoder_attention import masked_attention

        return masked_attention(q, k, v, row, row > float("-inf"), softcap)
    b, h = q.shape[:2]
    hkv, slots = k.shape[1], k.shape[2]
    # One query row per head, GQA by enable_gqa, the row expanded (no copy). Not the g query heads of a key head as g
    # query rows of it (q (B,Hkv,g,Dh), the row copied to (B,Hkv,g,L)): cuDNN then ran one program per key head over
    # every slot, 0.52 ms a layer at 32k slots for SmolLM2's 3 key heads, against 0.06 ms (H200, torch 2.11).
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=row.expand(b, h, 1, slots), enable_gqa=hkv != h)
    return out  # (B,H,1,Dh), in whatever memory order the device's kernel returns


class RelativeSlots(NamedTuple):
    """A layer's rows per query over every slot (Scheme.relative_table: Shaw, Transformer-XL), in buffers that never
    move (posenc.models.static_relative_terms writes them before each step). Slot j's bias is
        scale * (q + row_shift[h]) . table[h|0, index[b, j]]
    the scores' query is q + q_shift[h], and the output gains mass @ values, the weights summed by the same index
    (Shaw's value term)."""

    table: Tensor  # (H|1,S,Dh)
    index: Tensor  # (B,1,1,L) int64: each slot's row of the table (0 on empty slots, which the step's row masks)
    scale: float
    row_shift: Tensor | None  # (H,1,Dh)
    q_shift: Tensor | None  # (H,1,Dh)
    values: Tensor | None  # (S,Dh)


def relative_slot_attention(q: Tensor, k: Tensor, v: Tensor, row: Tensor, terms: RelativeSlots,
                            softcap: float | None = None) -> Tensor:
    """slot_attention with a scheme's rows per query added to the row: q (B,H,1,Dh), k/v (B,Hkv,L,Dh) -> (B,H,1,Dh).
    The rows are one product of q with the table's S rows, gathered by slot; with a value term the weights are
    formed in memory (one query row per head)."""
    b, h, _, dh = q.shape
    shifted = q if terms.row_shift is None else q + terms.row_shift  # (B,H,1,Dh)
    per_row = (shifted @ terms.table.transpose(-1, -2)) * terms.scale  # (B,H,1,S)
    bias = row + per_row.gather(-1, terms.index.expand(b, h, 1, -1))  # (B,H,1,L)
    query = q if terms.q_shift is None else q + terms.q_shift
    if terms.values is None:
        return slot_attention(query, k, v, bias, softcap)
    scores = _scores(query, k) * dh**-0.5  # (B,H,1,L)
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)  # as slot_attention's: capped before the row is added
    weights = torch.softmax(scores + bias, dim=-1)
    mass = weights.new_zeros(b, h, 1, terms.values.shape[0]).scatter_add_(-1, terms.index.expand(b, h, 1, -1),
                                                                         weights)  # (B,H,1,S)
    return _mix(weights, v) + mass @ terms.values


def _scores(q: Tensor, k: Tensor) -> Tensor:
    """q (B,H,1,Dh) . k (B,Hkv,L,Dh) -> (B,H,1,L): a key head's g = H / Hkv query heads as g rows of one product
    with its keys (GQA without a copy of the cache's keys per step)."""
    b, h, _, dh = q.shape
    return (q.reshape(b, k.shape[1], h // k.shape[1], dh) @ k.transpose(-1, -2)).view(b, h, 1, -1)


def _mix(weights: Tensor, v: Tensor) -> Tensor:
    """weights (B,H,1,L) @ v (B,Hkv,L,Dh) -> (B,H,1,Dh), grouped as _scores."""
    b, h, _, slots = weights.shape
    return (weights.reshape(b, v.shape[1], h // v.shape[1], slots) @ v).view(b, h, 1, -1)


def contextual_slot_attention(q: Tensor, k: Tensor, v: Tensor, row: Tensor, rows: Tensor, slot: Tensor,
                              softcap: float | None = None) -> Tensor:
    """slot_attention with CoPE's bias (Scheme.contextual_rows): rows (B,H,1,P) read at p_j = sum of the gates
    sigmoid(q . k_t / sqrt(Dh)) over the filled slots t >= j (slot: the step's own, (1,) int64), linearly
    interpolated, p clamped to P - 1; in the rows' dtype (float32, float64 for float64 inputs), as
    posenc.content.cope computes them. -> (B,H,1,Dh)"""
    slots, wide = k.shape[2], rows.dtype
    logits = _scores(q.to(wide), k.to(wide)) * q.shape[-1] ** -0.5  # (B,H,1,L)
    filled = torch.arange(slots, device=slot.device) <= slot  # (L,)
    gates = torch.sigmoid(logits).masked_fill(~filled, 0.0)
    p = gates.flip(-1).cumsum(-1).flip(-1).clamp(max=rows.shape[-1] - 1)  # sum over t >= j, nothing past the step
    floor = p.floor()
    weight = p - floor
    bias = (weight * rows.gather(-1, p.ceil().long()) + (1.0 - weight) * rows.gather(-1, floor.long())).to(row.dtype)
    if q.dtype != wide or softcap is not None:
        return slot_attention(q, k, v, row + bias, softcap)
    # float32 and float64: the gates' logits are the scores (one product of q with every key, not two)
    return _mix(torch.softmax(logits + row + bias, dim=-1), v)


@dataclass
class MapSlots:
    """A map's terms of one step, shared by the layers under it, in buffers that never move (written before each
    step by posenc.models.static_map_terms). The rotations are multipliers (posenc.nn.mapped_decode.Turns: x * c +
    x[..., pair] * s, the scheme's own rotation read off a unit vector) over W = Mk * Dh dims, one block of Dh per key
    table; c and s in float32 for half precision, where the step reads them as one matrix in the half type."""

    c: Tensor  # (B,1,M+1,W): row m < M rotates the query for map m into its table's block (0 elsewhere) and
    s: Tensor  # carries the score's factor (Dh^-1/2 and the map's score_scale); row M rotates the new key per table
    dims: Tensor  # (W,) or (2W,) int64: w -> w mod Dh (the head's dims once per table; left out with one table, where
    # it is every dim in order), then w -> the partner of w mod Dh in its rotated pair
    mask: Tensor  # (B,1,1,M+1,L) in the model's dtype: 0 where map m scores slot j, else -inf (empty slots, row M)
    matrix: Tensor | None = None  # (B,Dh,(M+1)*W) in half precision: c and s as one matrix, rotate(x) = x @ matrix
    skip_unscored: bool = False  # the map scores few slots (PositionMap.scores_few_slots): a kernel may skip blocks


def map_rotate(q: Tensor, k: Tensor, terms: MapSlots) -> tuple[Tensor, Tensor]:
    """q (B,H,1,Dh), k (B,Hkv,1,Dh) the step's own -> every map's query (B,H,M+1,W), each in its key table's block of
    dims and scaled (row M: a product with the key's rotation, scored and masked out), and the step's key rotated for
    every table side by side (B,Hkv,1,W): what the static cache keeps for a layer under a map is its keys so rotated,
    so a key is rotated once, when it arrives. Every rotation at once (each query rotated by the key's row too, so
    both come out of one tensor without a copy): in float32 and float64 x * c + x[..., pair] * s as map_decode's
    Turns (cat, index_select, mul, addcmul; bit for bit the scheme's rotate() for RoPE); in half precision one
    product with the matrix (cat, bmm: each rotated dim a sum of two products accumulated in float32, the multipliers
    rounded to the half type, 2^-9 relative in bf16), as many launches as RoPE's own rotation."""
    h, w = q.shape[1], terms.c.shape[-1]
    x = torch.cat((q, k), dim=1)  # (B,H+Hkv,1,Dh)
    if terms.matrix is not None:
        turned = (x[:, :, 0] @ terms.matrix).view(*x.shape[:2], -1, w)  # (B,H+Hkv,M+1,W)
        return turned[:, :h], turned[:, h:, -1:]
    both = x.index_select(-1, terms.dims)  # (B,H+Hkv,1,W or 2W): the dims per table, then their partners
    tiled = x if both.shape[-1] == w else both[..., :w]
    turned = torch.addcmul(tiled * terms.c, both[..., -w:], terms.s)  # (B,H+Hkv,M+1,W)
    return turned[:, :h], turned[:, h:, -1:]  # (B,H,M+1,W), (B,Hkv,1,W)


def map_slot_attention(queries: Tensor, keys: Tensor, v: Tensor, mask: Tensor) -> Tensor:
    """One query per row under a map over every slot: queries (B,H,M+1,W) from map_rotate, keys (B,Hkv,L,W) the
    layer's rotated keys, v (B,Hkv,L,Dh), mask (B,1,1,M+1,L) -> (B,H,1,Dh). Each map's query meets only its table's
    block (zeros elsewhere), so one product scores every slot under every map; each slot keeps its map's score (the
    others' and the empty slots' at -inf), and one softmax over the merged row is the exact softmax of the map's
    scores (half precision: its sums in float32 inside the kernel, the weights rounded once, as SDPA's)."""
    b, h, m, w = queries.shape
    hkv, slots, dh = keys.shape[1], keys.shape[2], v.shape[-1]
    scores = queries.reshape(b, hkv, -1, w) @ keys.transpose(-1, -2)  # (B,Hkv,g*(M+1),L); a view where B is 1
    picked = (scores.view(b, hkv, h // hkv, m, slots) + mask).amax(dim=3)  # (B,Hkv,g,L)
    return (torch.softmax(picked, dim=-1) @ v).reshape(b, h, 1, dh)  # (B,Hkv,g,Dh) -> (B,H,1,Dh)


def slot_torch(queries: Tensor, keys: Tensor, v: Tensor, mask: Tensor, skip_unscored: bool = False) -> SlotAttention:
    """The dispatch's slot_torch: map_slot_attention, for every device and dtype (the reference of slot_triton)."""
    return map_slot_attention


def slot_triton(queries: Tensor, keys: Tensor, v: Tensor, mask: Tensor,
                skip_unscored: bool = False) -> SlotAttention | None:
    """The dispatch's slot_triton: map_slot_attention's math as one Triton flash-decoding pass and a merge
    (posenc/nn/triton/slots.py), planned for these shapes (shares of the slots from L and the device's SMs); None
    where it does not serve them (no triton, another dtype, shapes past its limits). skip_unscored: the pass reads no
    key or value of a block of slots no map scores (MapSlots.skip_unscored)."""
    if not gpu.serves(queries, keys, v, mask):
        return None
    from posenc.nn.triton import slots  # imports triton: only for tensors it may serve

    plan = slots.plan(queries, keys, v, mask, skip_unscored=skip_unscored)
    return None if plan is None else functools.partial(slots.attend, plan)


__all__ = ["MapSlots", "RelativeSlots", "SlotAttention", "contextual_slot_attention", "map_rotate",
           "map_slot_attention", "relative_slot_attention", "slot_attention", "slot_torch", "slot_triton"]
