"""The dispatch's kernel map_decode: one query per row under a position map, without gradients or dropout (a cached
decode step), on the CPU (on CUDA after map_triton: a map without a pair rule). mapped_attention's general form (a
selector (B,C,Tk) per query chunk, key ranges found by nonzero, one fused kernel per map and range, the maps merged by
log-sum-exp) costs a decode step 128-171 operators per layer more than RoPE's, 16-25 of them host reads; here 36-50,
none reading the host (tests/position_maps/test_map_decode.py), and the maps stay exact.

With one query, the keys each map scores are runs of consecutive keys (a window, the first keys, chunks) that depend
on positions alone, the same for every layer of a step: DecodeRuns finds them once per step (one read of the
selector) with each map's key positions, the score scale, and the rotation of each map's query and of the step's new
key per key table as multipliers (rotate(x) = x * C + x[..., perm] * S: a rotary scheme turns each pair of dims
linearly, so rotating two unit vectors through the scheme's own rotate() gives C and S, every rope_scaling and xPos's
scales included). Per layer: the query rotated for every map in three operators, the step's new key rotated into
each key table's kept buffer (_rotate_keys, shared with the prompt's path), then one score row run by run (q_m . k_m
over the run's keys), one softmax over the row, which is the exact softmax over the merged scores (no log-sum-exp
merge needed), and one product with the values per span of consecutive attended keys.
Notation: B, H, Hkv, Tk, Dh as in attention.py; g = H // Hkv query heads per key/value head; M maps.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import Tensor

from posenc.inference_tensors import position_version
from posenc.nn import runs_attention
from posenc.nn.call import Call
from posenc.nn.kv_cache import append_only_buffer, in_float32
from posenc.nn.mapped_attention import _rotate_keys, _rotate_queries
from posenc.scheme import Scheme

Run = tuple[int, int, int]  # (map, first key, end key): map scores keys first..end-1


@dataclass
class DecodeRuns:
    """What one decode step's layers share, derived from positions alone: the runs of keys per map in key order,
    the spans of consecutive attended keys, each map's query positions (B,1) and key positions (B,Tk), the score
    scale (a number or (B,1)), and the rotations as multipliers (Turns) of the maps' queries and of the step's new
    key per key table, None for a scheme that is not a pairwise rotation (then rotate() runs per map and layer)."""

    key: tuple  # the positions tensors, their versions, the map, the compute dtype: a hit needs all equal
    runs: tuple[Run, ...]
    spans: tuple[tuple[int, int], ...]  # (first key, end key) of consecutive attended keys
    query_positions: tuple[Tensor, ...]
    key_positions: tuple[Tensor, ...]
    scale: float | Tensor
    query_turns: Turns | None  # C, S (M,B,1,1,Dh)
    key_turns: tuple[Turns, ...] | None  # per key table: C, S (B,1,1,Dh) of the new key


@dataclass
class Turns:
    """A rotation as multipliers: rotate(x) = x * c + x[..., perm] * s, c and s broadcast against x."""

    c: Tensor
    s: Tensor
    perm: Tensor  # (Dh,) long: each dim's partner in its pair, itself outside the rotated dims

    def __call__(self, x: Tensor) -> Tensor:
        return torch.addcmul(x * self.c, x[..., self.perm], self.s)

    def into(self, x: Tensor, out: Tensor) -> None:
        torch.mul(x, self.c, out=out)
        out.addcmul_(x[..., self.perm], self.s)


def rotation_turns(inner: Scheme, pos: Tensor, dtype: torch.dtype, dh: int) -> tuple[Turns, Turns] | None:
    """The rotation of queries and of keys at pos (B,T) as Turns with c, s (B|1,1,T,Dh) in dtype; None for a scheme
    without RoPE's rot_dim and pairing. From the scheme's RotationTables where it has them (rotate() applies those
    tables, so c and s are their cos and sin, laid out over the pairs), else from one rotate() of two unit vectors."""
    if not (hasattr(inner, "rot_dim") and hasattr(inner, "interleaved")):
        return None
    tables = inner.rotation_tables(pos, pos)
    if tables is None:
        return _turns_of_units(inner, pos, dtype, dh)
    perm = _unit_vectors(inner.rot_dim, inner.interleaved, dh, dtype, pos.device)[2]
    return tuple(Turns(*_over_pairs(cos.to(dtype), sin.to(dtype), inner.interleaved, dh), perm)
                 for cos, sin in ((tables.cos_q, tables.sin_q), (tables.cos_k, tables.sin_k)))


def _over_pairs(cos: Tensor, sin: Tensor, interleaved: bool, dh: int) -> tuple[Tensor, Tensor]:
    """cos, sin (B|1,1,T,R/2) -> c, s (B|1,1,T,Dh): a pair's (first, second) dims take (cos, cos) and (-sin, sin),
    the dims past R 1 and 0 (rotate() passes them through)."""
    if interleaved:
        c, s = torch.stack((cos, cos), -1).flatten(-2), torch.stack((-sin, sin), -1).flatten(-2)
    else:
        c, s = torch.cat((cos, cos), -1), torch.cat((-sin, sin), -1)
    rest = dh - c.shape[-1]
    if rest:
        c, s = torch.cat((c, c.new_ones(*c.shape[:-1], rest)), -1), torch.cat((s, s.new_zeros(*s.shape[:-1], rest)), -1)
    return c, s


def _turns_of_units(inner: Scheme, pos: Tensor, dtype: torch.dtype, dh: int) -> tuple[Turns, Turns]:
    """rotation_turns of a scheme without RotationTables: u1 holds 1 in the first dim of every pair and in the
    dims past rot_dim, u2 in the second dim of every pair; R u1 = (cos, sin) on a pair's (first, second) dims and
    whatever rotate() does to a dim it passes through, R u2 = (-sin, cos) and 0. So c is R u2 on second dims and
    R u1 elsewhere, s the other way round."""
    units, second, perm = _unit_vectors(inner.rot_dim, inner.interleaved, dh, dtype, pos.device)
    units = units[None, :, None].expand(pos.shape[0], 2, pos.shape[1], dh)  # (B,2,T,Dh)
    sides = []
    for rotated in inner.rotate(units, units, pos, pos):  # as queries, as keys: (B,2,T,Dh), [R u1, R u2]
        by_u1, by_u2 = rotated[:, None, 0], rotated[:, None, 1]  # (B,1,T,Dh)
        sides.append(Turns(torch.where(second, by_u2, by_u1), torch.where(second, by_u1, by_u2), perm))
    return sides[0], sides[1]


@functools.lru_cache(maxsize=32)
def _unit_vectors(rot_dim: int, interleaved: bool, dh: int, dtype: torch.dtype,
                  device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
    """u1, u2 as (2,Dh) in dtype, the mask of second dims (Dh,) bool, and each dim's partner in its pair (Dh,)
    long (itself past rot_dim). Made once per layout: never written to."""
    half = rot_dim // 2
    index = torch.arange(dh, device=device)
    first = index[0 : 2 * half : 2] if interleaved else index[:half]
    second = first + 1 if interleaved else first + half
    perm = index.clone()
    perm[first], perm[second] = second, first
    units = torch.zeros(2, dh, dtype=dtype, device=device)
    units[0] = 1.0
    units[0, second], units[1, second] = 0.0, 1.0
    is_second = torch.zeros(dh, dtype=torch.bool, device=device)
    is_second[second] = True
    return units, is_second, perm


def decode_runs(scheme, q_pos: Tensor, k_pos: Tensor, dtype: torch.dtype, dh: int) -> DecodeRuns | None:
    """The step's DecodeRuns, built by its first layer and kept on the scheme for the others; None where the batch
    rows attend under different runs (rows at different positions), or no key is attended. dtype: the scores'."""
    key = (q_pos, k_pos, position_version(q_pos), position_version(k_pos), scheme.position_map, dtype, dh)
    last = scheme.__dict__.get("_decode_runs")
    if last is not None and last.key[0] is q_pos and last.key[1] is k_pos and last.key[2:] == key[2:]:
        return last
    position_map, origin = scheme.position_map, k_pos[:, :1]
    select = position_map.select(q_pos, k_pos, origin)[:, 0]  # (B,Tk) int8
    if select.shape[0] > 1 and not bool((select == select[:1]).all()):
        return None
    row = select[0]
    cuts = [0, *((row[1:] != row[:-1]).nonzero().flatten() + 1).tolist(), row.shape[0]]  # the one host read
    maps = row[torch.tensor(cuts[:-1])].tolist()
    runs = tuple((m, a, z) for m, a, z in zip(maps, cuts, cuts[1:], strict=False) if m >= 0)
    if not runs:
        return None
    spans: list[list[int]] = []
    for _, a, z in runs:
        if spans and spans[-1][1] == a:
            spans[-1][1] = z
        else:
            spans.append([a, z])
    queries, keys = position_map.query_positions(q_pos, origin), position_map.key_positions(k_pos, origin)
    tables = list({id(p): p for p in keys}.values())  # the distinct key position tensors, in the maps' order
    turns = rotation_turns(scheme.inner, torch.cat([*queries, *(p[:, -1:] for p in tables)], dim=1), dtype, dh)
    query_turns = key_turns = None
    if turns is not None:
        m = len(queries)
        as_query, as_key = turns
        query_turns = Turns(as_query.c[:, 0, :m].transpose(0, 1)[:, :, None, None],
                            as_query.s[:, 0, :m].transpose(0, 1)[:, :, None, None], as_query.perm)  # (M,B,1,1,Dh)
        key_turns = tuple(Turns(as_key.c[:, :, m + t, None], as_key.s[:, :, m + t, None], as_key.perm)
                          for t in range(len(tables)))  # (B,1,1,Dh)
    runs_now = DecodeRuns(key, runs, tuple((a, z) for a, z in spans), queries, keys,
                          position_map.score_scale(q_pos, origin, k_pos.shape[1]), query_turns, key_turns)
    scheme.__dict__["_decode_runs"] = runs_now  # a plain attribute: not a module's state, never saved
    return runs_now


def map_decode(call: Call) -> Tensor | None:
    """q (B,H,1,Dh), k/v (B,Hkv,Tk,Dh) raw from the KV cache -> (B,H,1,Dh); declines more queries, gradients,
    dropout, a device other than the CPU and CUDA (where map_triton serves first: this takes a map without a pair
    rule, reading the device 3 times a step where map_fused reads it in every layer), and batch rows attended under
    different runs."""
    q, k, v, scheme = call.q, call.k, call.v, call.scheme
    if q.shape[-2] != 1 or call.grad or call.dropout > 0 or q.device.type not in ("cpu", "cuda"):
        return None
    dtype = q.dtype
    step = decode_runs(scheme, call.q_pos, call.k_pos, torch.float32 if q.element_size() < 4 else dtype, q.shape[-1])
    if step is None:
        return None
    if q.element_size() < 4:  # half precision: scores and sums in float32, one rounding at the end (as prompts)
        q, v = q.float(), in_float32(v, call.kept, "values in float32")
    if isinstance(step.scale, Tensor):
        q = q * step.scale[:, None, :, None].to(q.dtype)
    elif step.scale != 1.0:
        q = q * step.scale
    inner, position_map = scheme.inner, scheme.position_map
    source, tables, table_at, table_of = append_only_buffer(call.k_pos), [], {}, []
    for m, pos in enumerate(step.key_positions):  # maps sharing one key-position tensor share its kept keys
        if id(pos) not in table_at:
            turns = None if step.key_turns is None else step.key_turns[len(tables)]
            table_at[id(pos)] = len(tables)
            tables.append(_rotate_keys(inner, k, pos, call.kept, m, ("rotated keys", position_map), source=source,
                                       rotate_new=_new_key_rotation(inner, pos, turns)))  # (B,Hkv,Tk,Dh)
        table_of.append(table_at[id(pos)])  # map m's key table
    b, h, _, dh = q.shape
    hkv = k.shape[1]
    if step.query_turns is not None:
        queries = step.query_turns(q).view(-1, b, hkv, h // hkv, dh)  # (M,B,Hkv,g,Dh)
    else:
        queries = torch.stack([_rotate_queries(inner, q, p).reshape(b, hkv, h // hkv, dh)
                               for p in step.query_positions])
    # one native call for the runs, the softmax and the values (half precision: on its float32 queries, keys and
    # values, as the operators below)
    if runs_attention.can_run(queries, tables, v):
        runs = [(m, table_of[m], a, z) for m, a, z in step.runs]
        return runs_attention.attend_runs(queries, tables, v, runs, dh**-0.5).reshape(b, h, 1, dh).to(dtype)
    keys = [tables[t] for t in table_of]
    scores = torch.cat([queries[m] @ keys[m][:, :, a:z].transpose(-1, -2) for m, a, z in step.runs], dim=-1)
    weights = torch.softmax(scores * dh**-0.5, dim=-1)  # (B,Hkv,g,attended keys)
    out, seen = None, 0
    for a, z in step.spans:
        part = weights[..., seen : seen + z - a] @ v[:, :, a:z]  # (B,Hkv,g,Dh)
        out, seen = part if out is None else out + part, seen + z - a
    return out.reshape(b, h, 1, dh).to(dtype)


def _new_key_rotation(inner: Scheme, pos: Tensor, turns: Turns | None):
    """_rotate_keys's rotate_new: the step's one new key by the step's Turns; more keys (a store started afresh)
    by the scheme's rotate()."""
    def rotate_new(fresh: Tensor, done: int, out: Tensor) -> None:
        if turns is not None and fresh.shape[2] == 1:
            turns.into(fresh, out)
        else:
            out.copy_(inner.rotate(fresh[:, :1, :1], fresh, pos[:, done : done + 1], pos[:, done:])[1])

    return rotate_new


__all__ = ["DecodeRuns", "Turns", "decode_runs", "map_decode", "rotation_turns"]
