"""The terms of a scheme with rows per query (Scheme.relative_table: Shaw, Transformer-XL) in the static decode step
(posenc.models.static_decode): its table over every distance the decoder's slots can hold, and each slot's row of
it, written on the host before each step into buffers that never move; the captured part forms the rows from them
(posenc.nn.static_attention.relative_slot_attention: one product of q with the table, a gather by slot).

The table's span of r = n - m (key minus query position) is read from the prompt's positions at each load: its keys
and every later query, which sits one past the slot before it, up to the last slot. Shaw's table is its 2k+1
clipped rows whatever the span (the index clamps into it); Transformer-XL's covers the span. The table is formed
again when the scheme's tensors change (kept_tables.state), as the ordinary step's kept tables are.
Notation as in posenc.nn.attention; L the cache's slots.
"""

from __future__ import annotations

import torch
from torch import Tensor

from posenc.nn.kept_tables import same_state, state
from posenc.nn.static_attention import RelativeSlots
from posenc.scheme import Scheme, cast


def relative_span(k: Tensor, slots: int) -> tuple[int, int]:
    """(lowest, highest) r = key - query over a prompt's framed positions k (B,T) and the queries after it, one past
    the slot before each, up to slot L - 1 (one host read)."""
    t = k.shape[1]
    lowest, highest, last = k.amin(1), k.amax(1), k[:, -1]  # (B,) each
    low = lowest - (last + slots - t)  # the oldest key against the farthest query
    high = highest - (last + 1)  # the newest prompt key against the first query (a key after it: positions unsorted)
    low, high = torch.stack((low.min(), high.max())).tolist()
    return int(low), max(0, int(high))  # the query's own key: r = 0


class RelativeTerms:
    """One rows-per-query scheme instance's buffers (its layers' RelativeSlots) and what fills them."""

    def __init__(self, scheme: Scheme, batch: int, slots: int, dtype: torch.dtype, device: torch.device) -> None:
        self.scheme, self.slots, self.dtype = scheme, slots, dtype
        self.index = torch.zeros(batch, 1, 1, slots, dtype=torch.int64, device=device)
        self.terms: RelativeSlots | None = None  # at the first load
        self._span: tuple[int, int] | None = None
        self._state: tuple = ()

    def load(self, k: Tensor) -> bool:
        """A prompt at framed positions k (B,T): the table covers its span. True where the buffers moved (a span the
        table did not cover): the step's layers must read the new ones."""
        low, high = relative_span(k, self.slots)
        if self._span is not None and self._span[0] <= low and high <= self._span[1]:
            return False
        self._span, self._state = (low, high), ()
        return True

    def write(self, q: Tensor, k: Tensor, n: int) -> None:
        """The step's terms: q (B,1) the new token's framed position at slot n, k (B,n+1) the filled slots'."""
        self._refresh()
        terms = self.terms
        rows = terms.table.shape[-2]
        self.index[:, 0, 0, : n + 1].copy_((k - q - self._low).clamp_(0, rows - 1))

    def _refresh(self) -> None:
        """The table formed again where the scheme's tensors changed (or at a new span), into the same buffers while
        their shapes hold."""
        now = state(self.scheme)
        if self.terms is not None and same_state(now, self._state):
            return
        low, high = self._span
        like = self.index.new_empty(0, dtype=self.dtype)
        with torch.no_grad():
            table = self.scheme.relative_table(low, high, like)
        if table is None:
            raise ValueError(f"{type(self.scheme).__name__}.relative_table gave no table for r in [{low}, {high}]")
        shifts = [None if t is None else cast(t, self.dtype).detach()[:, None, :] for t in (table.row_shift,
                                                                                             table.q_shift)]
        values = None if table.values is None else cast(table.values, self.dtype).detach()
        fresh = RelativeSlots(cast(table.table, self.dtype).detach(), self.index, table.scale, *shifts, values)
        if self.terms is None or not _same_shapes(self.terms, fresh):
            self.terms = RelativeSlots(*(x.clone() if isinstance(x, Tensor) and x is not self.index else x
                                         for x in fresh))
        else:
            for kept, new in zip(self.terms, fresh, strict=True):
                if isinstance(kept, Tensor) and kept is not self.index:
                    kept.copy_(new)
        self._low, self._state = table.low, now


def _same_shapes(a: RelativeSlots, b: RelativeSlots) -> bool:
    return all((x is None) == (y is None) and (not isinstance(x, Tensor) or x.shape == y.shape)
               for x, y in zip(a, b, strict=True))


__all__ = ["RelativeTerms", "relative_span"]
