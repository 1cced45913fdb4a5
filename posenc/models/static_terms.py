"""The position terms of a static decode step (posenc.models.static_decode): computed on the host once per step for
every layer by the schemes' own hooks, written with copy_ into buffers that never move, and read by the step's
captured part through one `StepScheme` per layer.

Per step, for the new token at slot n (positions as the model's stack frames them, Scheme.frame):
  embedding  the absolute family's term, embed(0, pos): every embed hook adds a term to x   (B,1,D)
  rotation   each rotating scheme's RotationTables at the new position (queries and the new key)   (B,1,1,R/2)
  rows       per (scheme, window) of the layers: the bias row a decode step adds (dispatch.step_bias_row), or 0,
             over slots 0..n; -inf on the slots not yet filled and on keys at distance >= the window   (B,H|1,1,L)
  relative   per scheme with rows per query (dispatch.static_by_table): its table over the span the slots can hold
             and each slot's row of it (RelativeTerms, static_relative_terms.py), beside a row of 0 / -inf
  (CoPE's gates and rows need q and k alone: formed in the captured part, beside a row of 0 / -inf)
  maps       per scheme under a position map (dispatch.static_by_map): its MapTerms (static_map_terms.py), in
             place of the tables and the row; its layers attend through MapStepScheme
Notation as in posenc.nn.attention; L the cache's slots.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from posenc.models.static_map_terms import MapTerms
from posenc.models.static_relative_terms import RelativeTerms
from posenc.nn import dispatch
from posenc.nn.call import Call
from posenc.nn.kv_cache import APPEND_ONLY, AppendOnly, KVCache
from posenc.nn.static_attention import (
    MapSlots,
    RelativeSlots,
    SlotAttention,
    contextual_slot_attention,
    map_rotate,
    relative_slot_attention,
    slot_attention,
)
from posenc.nn.static_cache import StaticKVCache
from posenc.rotary import apply_rotary
from posenc.scheme import Dims, RotationTables, Scheme


@dataclass(frozen=True)
class LayerShape:
    """What the step needs to know of one layer's attention."""

    n_head: int
    n_kv_head: int
    head_dim: int
    window: int | None
    softcap: float | None


def layer_shape(attn: nn.Module) -> LayerShape:
    """From SelfAttention (GPT) or DecoderAttention (Llama family; its AttentionShape holds the window and cap)."""
    shape = getattr(attn, "shape", None)
    return LayerShape(attn.n_head, attn.n_kv_head, attn.head_dim, getattr(shape, "window", None),
                      getattr(shape, "softcap", None))


class StepScheme(Scheme):
    """One layer's scheme during the captured step: rotate() applies the step's tables, attend() runs slot_attention
    with the layer's row. The attention modules call its hooks as they call any scheme's (it attends itself, so
    they hand it q, k, v after the cache's update)."""

    def __init__(self, dims: Dims, tables: RotationTables | None, row: Tensor, softcap: float | None,
                 relative: RelativeSlots | None = None, contextual: Scheme | None = None,
                 slot: Tensor | None = None) -> None:
        super().__init__(dims)
        self.tables, self.row, self.softcap, self.relative = tables, row, softcap, relative
        self.contextual, self.slot = contextual, slot  # a scheme whose rows the gates read (CoPE), the step's slot

    def rotate(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        t = self.tables
        if t is None:
            return q, k
        if t.cos_k is t.cos_q and q.dtype == k.dtype:  # as RoPE's decode step: one call for both
            both = apply_rotary(torch.cat((q, k), dim=1), t.cos_q, t.sin_q, t.interleaved)  # (B,H+Hkv,1,Dh)
            return both.split((q.shape[1], k.shape[1]), dim=1)
        return apply_rotary(q, t.cos_q, t.sin_q, t.interleaved), apply_rotary(k, t.cos_k, t.sin_k, t.interleaved)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, q_pos: Tensor, k_pos: Tensor, causal: bool,
               dropout: float = 0.0) -> Tensor:
        if self.relative is not None:  # rows per query formed from the scheme's table
            return relative_slot_attention(q, k, v, self.row, self.relative, self.softcap)
        if self.contextual is not None:  # CoPE: its rows read at the gates' counts over the filled slots
            rows = self.contextual.contextual_rows(q)  # (B,H,1,P)
            return contextual_slot_attention(q, k, v, self.row, rows, self.slot, self.softcap)
        return slot_attention(q, k, v, self.row, self.softcap)  # (B,H,1,Dh)


class MapStepScheme(Scheme):
    """One layer's scheme under a position map during the captured step: rotate() gives every map's query (B,H,M,W)
    and the new key rotated for every key table (B,Hkv,1,W), which the static cache keeps; attend() scores every slot
    under the map that takes it, by the kernel the dispatch picks for the layer (dispatch.slot_attention_for:
    static_attention.map_slot_attention, or its Triton form on CUDA)."""

    def __init__(self, dims: Dims, terms: MapSlots) -> None:
        super().__init__(dims)
        self.terms = terms
        self.slots: SlotAttention | None = None  # the dispatch's choice for this layer, at its first step

    def rotate(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        return map_rotate(q, k, self.terms)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, q_pos: Tensor, k_pos: Tensor, causal: bool,
               dropout: float = 0.0) -> Tensor:
        if self.slots is None:  # planned once: fixed shapes, so every step (and a CUDA graph) runs the same launches
            self.slots = dispatch.slot_attention_for(q, k, v, self.terms.mask, self.terms.skip_unscored)
        return self.slots(q, k, v, self.terms.mask)  # (B,H,1,Dh)


def _buffer_like(t: Tensor, batch: int) -> Tensor:
    return torch.zeros((batch, *t.shape[1:]), dtype=t.dtype, device=t.device)


class StepTerms:
    """The step's buffers and what fills them. schemes[i], shapes[i]: layer i's scheme and attention; framing: the
    scheme whose frame() every layer's positions go through (the model's first)."""

    def __init__(self, schemes: list[Scheme], shapes: list[LayerShape], framing: Scheme, cache: StaticKVCache,
                 d_model: int, dtype: torch.dtype) -> None:
        self.schemes, self.shapes, self.framing, self.cache = schemes, shapes, framing, cache
        batch, _, slots, _ = cache.keys[0].shape
        device = cache.slot.device
        self.batch, self.slots, self.dtype = batch, slots, dtype
        self.positions = torch.zeros(batch, slots, dtype=torch.int64, device=device)  # every slot's position
        self.tokens = torch.zeros(batch, slots, dtype=torch.int64, device=device)  # every slot's token (Abacus)
        self.token = torch.zeros(batch, 1, dtype=torch.int64, device=device)  # the step's input
        self._zeros = torch.zeros(batch, 1, d_model, dtype=dtype, device=device)
        embeds = type(framing).embed is not Scheme.embed
        self.embedding = torch.zeros(batch, 1, d_model, dtype=dtype, device=device) if embeds else None
        self._q = {s: torch.zeros(batch, s.n_head, 1, s.head_dim, dtype=dtype, device=device) for s in set(shapes)}
        self.tables: dict[int, RotationTables | None] = {}  # per scheme instance, filled at the first write
        self.rows: dict[tuple[int, int | None], Tensor] = {}  # per (scheme instance, window)
        self.maps = {id(scheme): MapTerms(scheme, shape.head_dim, batch, slots, dtype, device)
                     for scheme, shape in zip(schemes, shapes, strict=True) if dispatch.static_by_map(type(scheme))}
        self.relative = {id(scheme): RelativeTerms(scheme, batch, slots, dtype, device)
                         for scheme in schemes if dispatch.static_by_table(type(scheme))}
        self.restart()

    def kinds(self) -> dict[tuple[int, int | None], int]:
        """(scheme instance, window) -> the first layer of that kind."""
        kinds: dict[tuple[int, int | None], int] = {}
        for i, (scheme, shape) in enumerate(zip(self.schemes, self.shapes, strict=True)):
            if id(scheme) not in self.maps:  # a map's window lives in the map
                kinds.setdefault((id(scheme), shape.window), i)
        return kinds

    def probe(self, position: int) -> None:
        """Compute (and drop) the embedding term and rotation tables of one position: a table that ends before it
        (learned_absolute's) raises here, before any work. The maps' turn tables are grown to cover it."""
        pos = torch.full((1, 1), position, dtype=torch.int64, device=self.token.device)
        if self.maps:  # every framed position up to it: the maps' turn tables cover what they map them to
            every = torch.arange(position + 1, device=self.token.device)[None]  # (1,P)
            for terms in self.maps.values():
                terms.reach(self.framing.frame(every, every)[1])
        q, _ = self.framing.frame(pos, pos)
        self.framing.embed(self._zeros[:1], q, input_ids=self.token[:1])
        for scheme in {id(s): s for s in self.schemes}.values():
            scheme.rotation_tables(q, q)

    def write(self, n: int) -> None:
        """The terms of a step whose token (self.token) and position (self.positions[:, n]) sit at slot n; the
        slots before it hold the earlier tokens."""
        self.tokens[:, n : n + 1].copy_(self.token)
        # the filled slots framed: the leading entries of an append-only buffer (restart), so the framing and the
        # rows' checks of their positions read only the new slot (from_first_entry, row_paths.position_offsets)
        q, k = self.framing.frame(self.positions[:, n : n + 1], self.positions[:, : n + 1])  # (B,1), (B,n+1)
        if self.embedding is not None:
            self.embedding.copy_(self.framing.embed(self._zeros, q, input_ids=self.tokens[:, : n + 1]))
        for scheme in {id(s): s for s in self.schemes if id(s) not in self.maps}.values():
            self._write_tables(scheme, q)
        for (key, window), layer in self.kinds().items():
            self._write_row(key, window, layer, q, k, n)
        for terms in self.relative.values():
            terms.write(q, k, n)
        if self.maps:  # every slot framed (a fixed shape; frame() is per position, from the first key at most)
            every = self.framing.frame(self.positions[:, n : n + 1], self.positions)[1]  # (B,L)
            for terms in self.maps.values():
                terms.write(q, every, n)
        self.cache.slot.fill_(n)

    def restart(self) -> None:
        """Slots from 0 anew (a prefill's load). The rows go back to -inf: a step writes slots 0..n only, so a run
        shorter than the last would read that run's later slots. The positions buffer is append-only until the next
        restart (a step writes the slot after the last filled one), under a new name, so nothing read from the
        previous run's positions is trusted for this one."""
        for row in self.rows.values():
            row.fill_(float("-inf"))
        setattr(self.positions, APPEND_ONLY, AppendOnly())

    def load(self, cache: KVCache, t: int) -> bool:
        """The keys of the layers under a map, from an ordinary cache's first t raw keys (their positions in
        self.positions) rotated per key table into the static cache (which copied the other layers' keys); the
        span of the tables of rows per query. True where a buffer the step's layers read has moved."""
        if not (self.maps or self.relative):
            return False
        _, k = self.framing.frame(self.positions[:, :t], self.positions[:, :t])  # (B,t)
        for layer, scheme in enumerate(self.schemes):
            if id(scheme) in self.maps:
                self.maps[id(scheme)].load(self.cache.keys[layer], cache.layers[layer][0].data[:, :, :t], k)
        return any([terms.load(k) for terms in self.relative.values()])  # every one loaded, not the first only

    def _write_tables(self, scheme: Scheme, q: Tensor) -> None:
        tables = scheme.rotation_tables(q, q)  # the new key sits at the new position
        if tables is None:
            self.tables[id(scheme)] = None
            return
        if id(scheme) not in self.tables:  # first write: the buffers, the keys' shared with the queries' if they are
            cos_q, sin_q = _buffer_like(tables.cos_q, self.batch), _buffer_like(tables.sin_q, self.batch)
            shared = tables.cos_k is tables.cos_q
            cos_k = cos_q if shared else _buffer_like(tables.cos_k, self.batch)
            sin_k = sin_q if shared else _buffer_like(tables.sin_k, self.batch)
            self.tables[id(scheme)] = RotationTables(cos_q, sin_q, cos_k, sin_k, tables.interleaved)
        kept = self.tables[id(scheme)]
        for buffer, value in ((kept.cos_q, tables.cos_q), (kept.sin_q, tables.sin_q), (kept.cos_k, tables.cos_k),
                              (kept.sin_k, tables.sin_k)):
            buffer.copy_(value)

    def _write_row(self, key: int, window: int | None, layer: int, q: Tensor, k: Tensor, n: int) -> None:
        shape = self.shapes[layer]
        keys, values = self.cache.keys[layer][:, :, : n + 1], self.cache.values[layer][:, :, : n + 1]
        call = Call(self._q[shape], keys, values, self.schemes[layer], q, k, True, 0.0, False)
        row = dispatch.step_bias_row(call)  # (B|1,H,1,n+1) or None
        if (key, window) not in self.rows:
            heads = 1 if row is None else row.shape[1]
            self.rows[(key, window)] = torch.full((self.batch, heads, 1, self.slots), float("-inf"), dtype=self.dtype,
                                                  device=self.token.device)
        filled = self.rows[(key, window)][..., : n + 1]  # (B,H|1,1,n+1)
        if row is None:
            filled.zero_()
        else:
            filled.copy_(row)
        if window is not None:  # keys at distance >= W leave the window, as DecoderAttention masks them
            filled.masked_fill_((q[:, :, None] - k[:, None, :] >= window)[:, None], float("-inf"))

    def layer_schemes(self, dims: Dims) -> list[StepScheme]:
        """One StepScheme per layer over the buffers (after the first write, which allocates them)."""
        return [MapStepScheme(dims, self.maps[id(scheme)].step) if id(scheme) in self.maps else
                StepScheme(dims, self.tables[id(scheme)], self.rows[(id(scheme), shape.window)], shape.softcap,
                           self.relative[id(scheme)].terms if id(scheme) in self.relative else None,
                           scheme if dispatch.static_by_gates(type(scheme)) else None, self.cache.slot)
                for scheme, shape in zip(self.schemes, self.shapes, strict=True)]


__all__ = ["LayerShape", "MapStepScheme", "StepScheme", "StepTerms", "layer_shape"]
