"""KV cache that stores the positions of its keys, so every scheme decodes correctly.

Keys are stored already rotated (rotation depends only on a key's own position); biases
are recomputed from the stored key positions and the new query positions. Buffers grow
by doubling, so a decode step writes one slice instead of copying the whole cache.
"""

from __future__ import annotations

import torch
from torch import Tensor

# Set on the KV caches' position buffers: written only past their length (append), so a view of one holds the same
# values at the same indices for as long as the buffer lives, and a bigger buffer it grows into holds them too. The
# attribute's value names the buffer across its growth (one token per _Grown): what is derived from cached positions
# may be trusted by that name instead of compared value by value (a comparison waits for the device).
APPEND_ONLY = "_posenc_append_only"


class AppendOnly:
    """The name of one append-only positions buffer, the same object across its growth. What is read from its values
    holds for as long as it lives, so a decode step reads only its new entries: of the first `counted` entries,
    `not_one` steps between neighbours (in some row) are not +1 (posenc.nn.row_paths' check), and `from_first` keeps
    every entry minus its row's first (the frame of schemes that measure positions from the first key)."""

    def __init__(self) -> None:
        self.counted, self.not_one = 0, 0
        self.from_first: _Grown | None = None


def append_only_buffer(view: Tensor) -> AppendOnly | None:
    """The name of the KV cache's positions buffer that view (a cache's key positions, (B,Tk)) reads, or None for
    any other tensor."""
    base = view._base
    return None if base is None else getattr(base, APPEND_ONLY, None)


def leading_entries(view: Tensor) -> AppendOnly | None:
    """append_only_buffer(view) where view (B,T) is the first T entries of every row of that buffer, else None."""
    name = append_only_buffer(view)
    base = view._base
    if name is None or view.dim() != 2 or view.shape[0] != base.shape[0] or view.stride() != base.stride():
        return None
    return name if view.storage_offset() == base.storage_offset() else None


def from_first_entry(pos: Tensor) -> Tensor:
    """pos (B,T) minus each row's first entry. For the leading entries of a positions buffer the result is kept with
    the buffer's name and only new entries are subtracted (a decode step's cost stops growing with the cache); it is
    then itself the leading entries of an append-only buffer, so what is read from it stays incremental too."""
    name = leading_entries(pos)
    if name is None:
        return pos - pos[:, :1]
    kept, length = name.from_first, pos.shape[1]
    if kept is None:
        kept = name.from_first = _Grown(pos, time_dim=1, append_only=True)
    if kept.length < length:
        kept.append(pos[:, kept.length :] - pos[:, :1])
    return kept.data.narrow(1, 0, length)


class _Grown:
    """A (B, H, T, Dh) buffer (or (B, T) for positions) with spare capacity on the T axis. append_only: data is
    marked APPEND_ONLY (nothing but append() writes it)."""

    def __init__(self, first: Tensor, time_dim: int, append_only: bool = False) -> None:
        self.time_dim, self.append_only = time_dim, AppendOnly() if append_only else None
        self.length = 0
        self.data = first.new_empty(self._shape(first, max(16, first.shape[time_dim])))
        if append_only:
            setattr(self.data, APPEND_ONLY, self.append_only)

    def _shape(self, like: Tensor, capacity: int) -> list[int]:
        shape = list(like.shape)
        shape[self.time_dim] = capacity
        return shape

    def append(self, new: Tensor) -> Tensor:
        self.slot(new.shape[self.time_dim]).copy_(new)
        return self.data.narrow(self.time_dim, 0, self.length)

    def slot(self, n: int) -> Tensor:
        """The buffer grown by n along the time axis: the view of the n new places (to be written by the caller)."""
        end = self.length + n
        if end > self.data.shape[self.time_dim]:
            bigger = self.data.new_empty(self._shape(self.data, max(end, 2 * self.data.shape[self.time_dim])))
            bigger.narrow(self.time_dim, 0, self.length).copy_(self.data.narrow(self.time_dim, 0, self.length))
            self.data = bigger
            if self.append_only is not None:
                setattr(bigger, APPEND_ONLY, self.append_only)
        start, self.length = self.length, end
        return self.data.narrow(self.time_dim, start, n)


def in_float32(t: Tensor, kept: dict | None, label: str) -> Tensor:
    """A KV cache's keys or values t (B,Hkv,Tk,Dh) in float32. With the layer's store (KVCache.derived), the copy is
    kept under `label` and a step converts only its new entries (a decode step in half precision on the CPU computes in
    float32: converting the whole cache in every layer of every step cost more than the attention). The kept copy's
    last entry is checked against t's (another cache, or one rewound: converted afresh)."""
    if kept is None:
        return t.float()
    entry, length = kept.get(label), t.shape[2]
    done = 0 if entry is None else entry.length
    if entry is not None and not (0 < done <= length and entry.data.shape[:2] == t.shape[:2]
                                  and torch.equal(entry.data[:, :, done - 1], t[:, :, done - 1].float())):
        entry, done = None, 0
    if entry is not None and done == length:
        return entry.data[:, :, :length]
    fresh = t[:, :, done:].float()
    if entry is None:
        entry = kept[label] = _Grown(fresh, time_dim=2)
    return entry.append(fresh)


class KVCache:
    """Per-layer keys and values plus the positions of the keys (shared by all layers)."""

    def __init__(self, n_layer: int) -> None:
        self.layers: list[tuple[_Grown, _Grown] | None] = [None] * n_layer
        self._positions: _Grown | None = None
        self._tokens: _Grown | None = None  # token history, for schemes that read it (Abacus)
        self._derived: list[dict] = [{} for _ in range(n_layer)]

    @property
    def origin(self) -> Tensor | None:
        """(B,1) position of each row's first cached token, or None before the first call."""
        return None if self._positions is None else self._positions.data[:, :1]

    @property
    def length(self) -> int:
        return 0 if self._positions is None else self._positions.length

    def add_positions(self, pos: Tensor) -> Tensor:
        """Record the new tokens' positions (B,Tq); returns all key positions (B,Tk)."""
        if self._positions is None:
            self._positions = _Grown(pos, time_dim=1, append_only=True)
        return self._positions.append(pos)

    def add_tokens(self, input_ids: Tensor) -> Tensor:
        """Record the new token ids (B,Tq); returns every token id so far (B,Tk)."""
        if self._tokens is None:
            self._tokens = _Grown(input_ids, time_dim=1)
        return self._tokens.append(input_ids)

    def derived(self, layer: int) -> dict:
        """A store for what attention derives from this layer's keys (a position map's rotated keys): the keys
        only grow, so what is derived from them can grow with them, one step at a time."""
        return self._derived[layer]

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Append this layer's new k, v (B,Hkv,Tq,Dh); returns all keys and values (B,Hkv,Tk,Dh)."""
        if self.layers[layer] is None:
            self.layers[layer] = (_Grown(k, time_dim=2), _Grown(v, time_dim=2))
        keys, values = self.layers[layer]
        return keys.append(k), values.append(v)


__all__ = ["KVCache", "from_first_entry", "in_float32", "leading_entries"]
