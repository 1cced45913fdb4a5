"""A position map's terms in the static decode step (posenc.models.static_decode): what the step derives from
positions alone, computed once per step for every layer under the map and copied into buffers that never move
(posenc.nn.static_attention.MapSlots). The static cache keeps, for a layer under a map, its keys rotated for every key
table side by side (B,Hkv,L,W), W = Mk * Dh: key_width.

Per step, for the new token at slot n (positions framed as the model's stack frames them):
  c, s     each map's query rotation (in its key table's block of dims, times Dh^-1/2 and the map's score_scale with
           the step's key count: DCA's m(T)^2 follows it) and each key table's rotation of the new key, rows gathered
           at the step's mapped positions from per-position tables (reach) read off the scheme's own rotate() once
           (posenc.nn.mapped_decode.rotation_turns, as the eager map_decode reads them)   (B,1,M+1,W)
  mask     the map's selector over every slot of the cache (its select() over the L slots' positions, fixed shape),
           -1 on the slots not yet filled, as 0 / -inf per map (row M, the key's, -inf)   (B,1,1,M+1,L)
Nothing here reads a value back to the host, and no shape depends on n: the step's part (a) may run on the host
while the device replays the previous step. (The scheme's rotate() reads its positions' extremes on the host to size
its own tables; so it runs once per reach, over every mapped position the decoder can meet, not per step.) A prompt's
keys are rotated into the tables once, when the decoder takes over its cache (load), by the scheme's rotate() as the
eager prefill rotates them.
Notation as in posenc.nn.static_attention.
"""

from __future__ import annotations

import torch
from torch import Tensor

from posenc.errors import bad_value
from posenc.nn.mapped_attention import _rotate_keys
from posenc.nn.mapped_decode import rotation_turns
from posenc.nn.static_attention import MapSlots
from posenc.position_map import MappedScheme


def key_tables(scheme: MappedScheme) -> tuple[int, ...]:
    """Per map, its key table: maps whose key_positions give one tensor share it (DCA's three, STRING's two)."""
    probe = torch.zeros(1, 1, dtype=torch.int64)
    per_map = scheme.position_map.key_positions(probe, probe)
    distinct = list({id(p): None for p in per_map})
    return tuple(distinct.index(id(p)) for p in per_map)


def key_width(scheme: MappedScheme, head_dim: int) -> int:
    """W: the dims of a key as the static cache keeps it under the map, one block of Dh per key table."""
    return head_dim * len(set(key_tables(scheme)))


class MapTerms:
    """One mapped scheme instance's step buffers, shared by its layers (each layer's keys: the static cache's)."""

    def __init__(self, scheme: MappedScheme, head_dim: int, batch: int, slots: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        self.scheme, self.position_map, self.inner = scheme, scheme.position_map, scheme.inner
        self.key_maps = key_tables(scheme)
        m, dh, w = len(self.key_maps), head_dim, key_width(scheme, head_dim)
        work = torch.float32 if dtype.itemsize < 4 else dtype
        self.batch, self.slots, self.head_dim = batch, slots, dh
        self.step = MapSlots(torch.zeros(batch, 1, m + 1, w, dtype=work, device=device),
                             torch.zeros(batch, 1, m + 1, w, dtype=work, device=device),
                             torch.zeros(2 * w if w > dh else w, dtype=torch.int64, device=device),
                             torch.full((batch, 1, 1, m + 1, slots), float("-inf"), dtype=dtype, device=device),
                             torch.zeros(batch, dh, (m + 1) * w, dtype=dtype, device=device) if work != dtype else None,
                             self.position_map.scores_few_slots)
        self._ones: tuple[Tensor, Tensor] | None = None  # (1,Dh,1,W) each: 1 where dim d feeds w directly, as partner
        self._maps = torch.arange(m, dtype=torch.int8, device=device).view(1, 1, 1, m, 1)
        self._turns: tuple[Tensor, Tensor, Tensor, Tensor] | None = None  # c, s as queries, c, s as keys (P,Dh)

    def reach(self, k: Tensor) -> None:
        """Turn tables covering every mapped position of the framed positions k (1,P) (0.. the farthest the decoder
        may reach, from an origin at 0): each map's queries and keys there (a host read, once per prefill)."""
        pm = self.position_map
        mapped = torch.cat([*pm.query_positions(k, k[:, :1]), *pm.key_positions(k, k[:, :1])], dim=1)  # (1,*)
        low, high = (int(x) for x in mapped.aminmax())
        if low < 0:
            raise bad_value("attention_extension", pm.spec(), f"a map whose positions are >= 0 (it gives {low})")
        if self._turns is not None and self._turns[0].shape[0] > high:
            return
        positions = torch.arange(high + 1, device=k.device)[None]  # (1,P)
        as_query, as_key = rotation_turns(self.inner, positions, self.step.c.dtype, self.head_dim)  # (1,1,P,Dh)
        self._turns = (as_query.c[0, 0], as_query.s[0, 0], as_key.c[0, 0], as_key.s[0, 0])
        w = self.step.c.shape[-1]
        tile = torch.arange(w, device=k.device) % self.head_dim
        self.step.dims.copy_(torch.cat((tile, as_query.perm[tile])) if w > self.head_dim else as_query.perm)
        d = torch.arange(self.head_dim, device=k.device)[:, None]  # (Dh,1)
        self._ones = tuple((d == index).to(self.step.c.dtype).view(1, self.head_dim, 1, w)
                           for index in (tile, as_query.perm[tile]))

    def write(self, q: Tensor, k: Tensor, n: int) -> None:
        """The step's terms: q (B,1) the new token's framed position at slot n, k (B,L) every slot's."""
        pm, step, m, dh = self.position_map, self.step, len(self.key_maps), self.head_dim
        origin = k[:, :1]  # (B,1): each row's first key
        at_queries = torch.cat(pm.query_positions(q, origin), dim=1).transpose(0, 1).reshape(-1)  # (M*B,) map-major
        new_keys = {id(p): p for p in pm.key_positions(q, origin)}.values()  # Mk x (B,1): the step's key
        at_keys = torch.cat(list(new_keys), dim=1).reshape(-1)  # (B*Mk,) row-major
        factor = pm.score_scale(q, origin, n + 1)  # the keys of the step: the cache's and its own
        factor = dh**-0.5 * (factor.view(1, self.batch, 1) if isinstance(factor, Tensor) else factor)
        q_c, q_s, k_c, k_s = self._turns
        for buffer, query_side, key_side in ((step.c, q_c, k_c), (step.s, q_s, k_s)):
            rows = query_side.index_select(0, at_queries).view(m, self.batch, dh) * factor  # (M,B,Dh)
            for i, table in enumerate(self.key_maps):  # map i's query in its table's block of dims, 0 elsewhere
                buffer[:, 0, i, table * dh : (table + 1) * dh].copy_(rows[i])
            buffer[:, 0, m].copy_(key_side.index_select(0, at_keys).view(self.batch, -1))  # (B,W)
        if step.matrix is not None:  # matrix[b, d, (m, w)]: c where d is w's own dim, s where it is w's partner
            own, partner = self._ones
            step.matrix.view(self.batch, dh, m + 1, -1).copy_(torch.addcmul(step.c * own, step.s, partner))
        chosen = pm.select(q, k, origin)  # (B,1,L) int8 over every slot
        chosen[..., n + 1 :] = -1  # slots not yet filled
        picked = chosen.view(self.batch, 1, 1, 1, self.slots) == self._maps  # (B,1,1,M,L)
        step.mask[..., :m, :].copy_(torch.where(picked, 0.0, float("-inf")))  # row M stays -inf

    def load(self, keys: Tensor, raw: Tensor, k: Tensor) -> None:
        """A prompt's raw keys (B,Hkv,T,Dh) at framed positions k (B,T), rotated per key table into a layer's static
        keys (B,Hkv,L,W), by the scheme's rotate() as the eager prefill rotates them."""
        t, dh = k.shape[1], self.head_dim
        per_map = self.position_map.key_positions(k, k[:, :1])
        for table, pos in enumerate({id(p): p for p in per_map}.values()):
            keys[:, :, :t, table * dh : (table + 1) * dh].copy_(_rotate_keys(self.inner, raw, pos))


__all__ = ["MapTerms", "key_tables", "key_width"]
