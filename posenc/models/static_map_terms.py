"""A position map's terms in the static decode step (posenc.models.static_decode): what the step derives from
positions alone, computed once per step for every layer under the map and copied into buffers that never move
(posenc.nn.static_attention.MapSlots), and each layer's table of rotated keys.

Per step, for the new token at slot n (positions framed as the model's stack frames them):
  c, s     each map's query rotation and each key table's rotation of the new key, rows gathered at the step's
           mapped positions from per-position tables (reach) read off the scheme's own rotate() once
           (posenc.nn.mapped_decode.rotation_turns, as the eager map_decode reads them)   (M+Mk,B,1,1,Dh)
  mask     the map's selector over every slot of the cache (its select() over the L slots' positions, fixed shape),
           -1 on the slots not yet filled, as 0 / -inf per (key table, map)   (Mk,B,1,M,1,L)
  scale    the map's score_scale, with the step's key count (DCA's m(T)^2 follows it)   (B,1,1,1)
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


class MapTerms:
    """One mapped scheme instance's step buffers, shared by `layers` (index -> (Hkv, Dh) of the layer)."""

    def __init__(self, scheme: MappedScheme, layers: dict[int, tuple[int, int]], batch: int, slots: int,
                 dtype: torch.dtype, device: torch.device) -> None:
        self.scheme, self.position_map, self.inner = scheme, scheme.position_map, scheme.inner
        head_dims = {dh for _, dh in layers.values()}
        if len(head_dims) != 1:
            raise bad_value("head_dim", sorted(head_dims), "one head dim for every layer under a map")
        dh = head_dims.pop()
        probe = torch.zeros(batch, 1, dtype=torch.int64, device=device)
        per_map = self.position_map.key_positions(probe, probe)  # maps sharing a tensor share its key table
        distinct = list({id(p): None for p in per_map})
        self.key_maps = tuple(distinct.index(id(p)) for p in per_map)
        m, mk = len(per_map), len(distinct)
        work = torch.float32 if dtype.itemsize < 4 else dtype
        self.dtype, self.batch, self.slots, self.head_dim = dtype, batch, slots, dh
        self.step = MapSlots(torch.zeros(m + mk, batch, 1, 1, dh, dtype=work, device=device),
                             torch.zeros(m + mk, batch, 1, 1, dh, dtype=work, device=device),
                             torch.arange(dh, device=device),
                             torch.full((mk, batch, 1, m, 1, slots), float("-inf"), dtype=dtype, device=device),
                             torch.ones(batch, 1, 1, 1, dtype=work, device=device), m)
        # (Mk,1,1,M,1,1): map m where table t is the map's, else -2 (no selector value): the mask's pairs
        self._pairs = torch.tensor([[i if self.key_maps[i] == t else -2 for i in range(m)] for t in range(mk)],
                                   dtype=torch.int8, device=device).view(mk, 1, 1, m, 1, 1)
        self.tables = {layer: torch.zeros(mk, batch, hkv, slots, dh, dtype=dtype, device=device)
                       for layer, (hkv, _) in layers.items()}  # (Mk,B,Hkv,L,Dh) per layer
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
        self.step.perm.copy_(as_query.perm)

    def write(self, q: Tensor, k: Tensor, n: int) -> None:
        """The step's terms: q (B,1) the new token's framed position at slot n, k (B,L) every slot's."""
        pm, step, m = self.position_map, self.step, self.step.n_maps
        origin = k[:, :1]  # (B,1): each row's first key
        queries = pm.query_positions(q, origin)  # M x (B,1)
        new_keys = list({id(p): p for p in pm.key_positions(q, origin)}.values())  # Mk x (B,1): the step's key
        at_queries = torch.cat(queries, dim=1).transpose(0, 1).reshape(-1)  # (M*B,) map-major
        at_keys = torch.cat(new_keys, dim=1).transpose(0, 1).reshape(-1)  # (Mk*B,)
        q_c, q_s, k_c, k_s = self._turns
        for buffer, query_side, key_side in ((step.c, q_c, k_c), (step.s, q_s, k_s)):
            buffer[:m].view(-1, self.head_dim).copy_(query_side.index_select(0, at_queries))  # (M*B,Dh)
            buffer[m:].view(-1, self.head_dim).copy_(key_side.index_select(0, at_keys))  # (Mk*B,Dh)
        chosen = pm.select(q, k, origin)  # (B,1,L) int8 over every slot
        chosen[..., n + 1:] = -1  # slots not yet filled
        picked = chosen.view(1, self.batch, 1, 1, 1, self.slots) == self._pairs  # (Mk,B,1,M,1,L)
        step.mask.copy_(torch.where(picked, 0.0, float("-inf")))
        scale = pm.score_scale(q, origin, n + 1)  # the keys of the step: the cache's and its own
        if isinstance(scale, Tensor):
            step.scale.copy_(scale.view(self.batch, 1, 1, 1))
        else:
            step.scale.fill_(scale)

    def load(self, layer: int, keys: Tensor, k: Tensor) -> None:
        """A prompt's raw keys (B,Hkv,T,Dh) of `layer` at framed positions k (B,T), rotated into its tables."""
        per_map = self.position_map.key_positions(k, k[:, :1])
        for table, pos in enumerate({id(p): p for p in per_map}.values()):
            self.tables[layer][table, :, :, : k.shape[1]].copy_(_rotate_keys(self.inner, keys, pos))


__all__ = ["MapTerms"]
