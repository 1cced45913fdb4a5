"""Attention of one query per batch row over every slot of a fixed-size KV cache (posenc.nn.static_cache), with the
step's row (B|1, H|1, 1, L) added to the scores: the scheme's bias where it has one, 0 elsewhere, -inf on empty slots
and on keys outside a sliding window. Fixed shapes, no host reads: a CUDA graph captures it.

Under a position map (map_slot_attention) the step's terms are per map: each map's query rotation, each key table's
rotation of the step's new key (a key's mapped position depends on its own position alone, so every key is rotated
once, when it arrives, into its layer's table of rotated keys), and a mask saying which map scores each slot.
Notation as in attention.py; L the cache's slots, M the map's maps, Mk its key tables (maps that share one key
position tensor share its table: DCA's three maps one table, Self-Extend's two maps two), g = H // Hkv.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
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


@dataclass
class MapSlots:
    """A map's terms of one step, shared by the layers under it, in buffers that never move (written before each
    step by posenc.models.static_map_terms). The rotations are multipliers (posenc.nn.mapped_decode.Turns: x * c +
    x[..., perm] * s, the scheme's own rotation read off a unit vector), in the work dtype (float32 for half
    precision, as the CPU's map_decode computes)."""

    c: Tensor  # (M+Mk,B,1,1,Dh): rows 0..M-1 rotate the query for each map, rows M.. the new key for each key table
    s: Tensor
    perm: Tensor  # (Dh,) int64: each dim's partner in its pair
    mask: Tensor  # (Mk,B,1,M,1,L) in the model's dtype: 0 where slot j is scored by map m from table t, else -inf
    scale: Tensor  # (B,1,1,1) in the work dtype: the map's score_scale, folded into q as map_decode does
    n_maps: int


def map_slot_scores(q: Tensor, k: Tensor, tables: Tensor, slot: Tensor, terms: MapSlots) -> Tensor:
    """The step's scores under a map: q (B,H,1,Dh) unrotated, k (B,Hkv,L,Dh) the cache's raw keys with the step's at
    `slot` (1,), tables (Mk,B,Hkv,L,Dh) the layer's rotated keys, into which the step's key is rotated here ->
    (B,Hkv,g,L), each slot scored by the map that takes it (-inf where none does and on empty slots), unscaled."""
    b, h, _, dh = q.shape
    hkv, slots, m = k.shape[1], k.shape[2], terms.n_maps
    new = k.index_select(2, slot)  # (B,Hkv,1,Dh): the step's raw key
    x = torch.cat((q.to(terms.c.dtype) * terms.scale, new.to(terms.c.dtype)), dim=1)  # (B,H+Hkv,1,Dh)
    turned = torch.addcmul(x * terms.c, x[..., terms.perm], terms.s)  # (M+Mk,B,H+Hkv,1,Dh): every rotation at once
    tables.index_copy_(3, slot, turned[m:, :, h:].to(tables.dtype))  # each table's rotation of the new key
    queries = turned[:m, :, :h].reshape(m, b, hkv, h // hkv, dh).permute(1, 2, 0, 3, 4)  # (B,Hkv,M,g,Dh)
    scores = queries.reshape(b, hkv, -1, dh).to(tables.dtype) @ tables.transpose(-1, -2)  # (Mk,B,Hkv,M*g,L)
    return (scores.view(-1, b, hkv, m, h // hkv, slots) + terms.mask).amax(dim=(0, 3))  # (B,Hkv,g,L)


def map_slot_attention(q: Tensor, k: Tensor, v: Tensor, tables: Tensor, slot: Tensor, terms: MapSlots) -> Tensor:
    """One query per row under a map over every slot: q (B,H,1,Dh), k/v (B,Hkv,L,Dh) raw from the static cache ->
    (B,H,1,Dh). One softmax over the merged row (each slot under one map) is the exact softmax of the map's scores;
    scores * Dh^-1/2 and the softmax as map_decode computes them (half precision: the softmax in float32)."""
    b, h, _, dh = q.shape
    scores = map_slot_scores(q, k, tables, slot, terms)  # (B,Hkv,g,L)
    weights = torch.softmax(scores * dh**-0.5, dim=-1, dtype=torch.float32 if scores.element_size() < 4 else None)
    return (weights.to(v.dtype) @ v).reshape(b, h, 1, dh)  # (B,Hkv,g,Dh) -> (B,H,1,Dh)


__all__ = ["MapSlots", "map_slot_attention", "map_slot_scores", "slot_attention"]
