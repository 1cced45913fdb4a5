"""The dispatch's kernel map_triton: attention under a position map in one Triton launch per call (on CUDA, or on
the CPU under Triton's interpreter), inference only. The map gives its selector as data (PositionMap.pair_rule)
and its positions per token (query_positions, key_positions); the rotation comes from the wrapped scheme itself.

The kernel needs, per map, the cos/sin of the scheme's rotation at each token's mapped position. They are read off
the scheme's own rotate(): rotating a vector that holds 1 in the first dim of every pair and 0 elsewhere gives
(cos, sin) in the pair's two dims, so every rope_scaling (its frequencies and attention factor), p-RoPE's cut
frequencies and xPos's scales (queries and keys apart) come as the scheme computes them, with no formula of ours.
The keys are rotated once per distinct key position tensor with the scheme's rotate(), in their own dtype, and the
kernel reads them as they are; with a KV cache's store (kept) they are kept there, so a decode step rotates only its
new key (a key's mapped position depends on its own position alone: PositionMap.key_positions). One query without
a cache gives the kernel the keys' cos/sin rows instead, and it rotates each key tile.

Every layer of a forward receives the same positions, so what a call derives from them alone (each map's query
rows, its key positions, the rows of the keys a decode step adds) is derived once per forward and shared by the
layers (StepTables): a decode step reads the rows of its positions, which on a GPU waits for the device, once and
not once per layer and map. The kept keys a step adds are rotated by those rows (the rotation of a key is linear
in it: rows * key, the scheme's own rows).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from posenc.inference_tensors import position_version
from posenc.nn import triton as gpu
from posenc.nn.call import Call
from posenc.nn.kept_tables import same_state, state
from posenc.nn.kv_cache import append_only_buffer
from posenc.nn.mapped_attention import _rotate_keys, _rotate_queries
from posenc.scheme import Scheme


def _unit(scheme: Scheme, shape: tuple[int, int, int], device: torch.device) -> Tensor:
    """(B,1,T,Dh) float32: 1 in the first dim of each rotated pair, 0 elsewhere (rotated: cos there, sin in the
    pair's second dim)."""
    dims = torch.zeros(shape[-1], device=device)
    dims[_first_dims(scheme)] = 1.0
    return dims.expand(shape[0], 1, shape[1], shape[2])


def _first_dims(scheme: Scheme) -> slice:
    half = scheme.rot_dim // 2
    return slice(0, 2 * half, 2) if scheme.interleaved else slice(0, half)


def _second_dims(scheme: Scheme) -> slice:
    half = scheme.rot_dim // 2
    return slice(1, 2 * half, 2) if scheme.interleaved else slice(half, 2 * half)


def _cos_sin(rotated: Tensor, scheme: Scheme, batch: int) -> tuple[Tensor, Tensor]:
    """A rotated unit (b,1,T,Dh) -> cos, sin (B,T,R/2) float32."""
    rows = rotated[:, 0].float().expand(batch, -1, -1)
    return rows[..., _first_dims(scheme)], rows[..., _second_dims(scheme)]


@dataclass
class StepTables:
    """What one forward's calls derive from its positions alone: each map's query rows, the key position tensors,
    and the rows of the keys past `done` (a decode step's new ones) per key table. The scheme holds the last one
    until its next call: after a long prompt, up to (M + Mk) x B x T x R x 4 bytes (0.3 GB for DCA at 128k, R 128)."""

    key: tuple  # the positions tensors, their versions, the call's shape and device, the map: a hit needs all equal
    state: tuple  # kept_tables.state of the scheme: its tensors, their versions and storage
    q_cos: Tensor  # (M,B,Tq,R/2) float32
    q_sin: Tensor
    key_positions: tuple[Tensor, ...]  # per map (maps that share a tensor share the object)
    new_key_rows: dict[tuple[int, int], tuple[Tensor, Tensor]] = field(default_factory=dict)  # (table, done) ->
    # cos, sin (B,1,Tk-done,R/2) float32 of the keys past `done`; (table, -1) -> (B,Tk,R/2) of every key (the kernel
    # rotates the key tiles)


def step_tables(scheme: Scheme, q_pos: Tensor, k_pos: Tensor, b: int, tq: int, dh: int,
                device: torch.device) -> StepTables:
    """The scheme's StepTables for these positions: built by the first layer of a forward, read by the others."""
    now = state(scheme)  # the rotation's tensors (a frequency patched in place between two calls: another table)
    key = (q_pos, k_pos, position_version(q_pos), position_version(k_pos), b, tq, dh, device, scheme.position_map)
    last = scheme.__dict__.get("_step_tables")
    if last is not None and last.key[0] is q_pos and last.key[1] is k_pos and last.key[2:] == key[2:] \
            and same_state(last.state, now):
        return last
    position_map, inner = scheme.position_map, scheme.inner
    origin = k_pos[:, :1]
    q_rows = [_cos_sin(_rotate_queries(inner, _unit(inner, (p.shape[0], tq, dh), device), p), inner, b)
              for p in position_map.query_positions(q_pos, origin)]
    q_cos, q_sin = (torch.stack([rows[n] for rows in q_rows]) for n in (0, 1))  # (M,B,Tq,R/2)
    tables = StepTables(key, now, q_cos, q_sin, tuple(position_map.key_positions(k_pos, origin)))
    scheme.__dict__["_step_tables"] = tables  # a plain attribute: not a module's state, never saved
    return tables


def _key_rows(inner: Scheme, pos: Tensor, b: int, dh: int) -> tuple[Tensor, Tensor]:
    """cos, sin (B,T,R/2) float32 of the keys at pos (B|1,T): the scheme's rotation of a unit key."""
    return _cos_sin(_rotate_keys(inner, _unit(inner, (pos.shape[0], pos.shape[1], dh), pos.device), pos), inner, b)


def _rotate_by_rows(inner: Scheme, fresh: Tensor, pos: Tensor, done: int, table: int, tables: StepTables) -> Tensor:
    """The keys past `done` (B,Hkv,Tk-done,Dh) rotated at pos[:, done:] by the step's rows of key table `table`
    (built by the first layer that asks, read by the others: rotation is linear in the key)."""
    rows = tables.new_key_rows.get((table, done))
    if rows is None:
        cos, sin = _key_rows(inner, pos[:, done:], fresh.shape[0], fresh.shape[-1])
        rows = tables.new_key_rows[(table, done)] = (cos[:, None], sin[:, None])  # (B,1,T,R/2)
    from posenc.nn.triton import rotary  # imports triton: map_triton serves only where it runs

    return rotary.rotate(fresh, rows[0], rows[1], inner.interleaved)


def map_triton(call: Call) -> Tensor | None:
    """The map's attention in one launch (posenc/nn/triton/mapped.py); declines gradients, dropout, what the GPU
    attention does not fit, a map without a pair rule or with more maps than a program holds, and a scheme without
    RoPE's rot_dim and pairing."""
    q, k, v, scheme = call.q, call.k, call.v, call.scheme
    if call.grad or call.dropout > 0 or not gpu.attention_fits(q, k, v, call.causal):
        return None
    position_map, inner = scheme.position_map, scheme.inner
    rule = position_map.pair_rule()
    from posenc.nn.triton import mapped  # imports triton: only for a call it may serve

    if rule is None or position_map.n_maps > mapped.MAX_MAPS or not hasattr(inner, "rot_dim") \
            or not hasattr(inner, "interleaved"):
        return None
    b, _, tq, dh = q.shape
    tk = k.shape[2]
    tables = step_tables(scheme, call.q_pos, call.k_pos, b, tq, dh, q.device)
    in_kernel = tq == 1 and call.kept is None  # one query, no cache to keep rotated keys: rotated per tile
    key_tables: dict[int, int] = {}  # id of a key position tensor -> its table (maps sharing one share it)
    keys, key_maps = [], []
    for p in tables.key_positions:
        if id(p) not in key_tables:
            table = key_tables[id(p)] = len(keys)
            if in_kernel:  # cos/sin rows: the kernel rotates the key tiles (the rows shared by the layers)
                rows = tables.new_key_rows.get((table, -1))
                if rows is None:
                    rows = tables.new_key_rows[(table, -1)] = _key_rows(inner, p, b, dh)
                keys.append(rows)
            else:  # the keys rotated once, in their dtype; kept in the cache, a step rotates its new keys by the
                # step's rows (shared by the layers: no read of the positions per layer)
                keys.append(_rotate_keys(inner, k, p, call.kept, table, (f"rotated keys ({k.dtype})", position_map),
                                         k.dtype, append_only_buffer(call.k_pos),
                                         lambda fresh, done, p=p, table=table: _rotate_by_rows(
                                             inner, fresh, p, done, table, tables)))
        key_maps.append(key_tables[id(p)])
    if in_kernel:
        key_rows = tuple(torch.stack([rows[n] for rows in keys]) for n in (0, 1))  # (Mk,B,Tk,R/2)
    else:
        key_rows, k = None, tuple(keys)  # Mk x (B,Hkv,Tk,Dh)
    scale = position_map.score_scale(call.q_pos, call.k_pos[:, :1], tk)  # a number, or (B,Tq) (DCA's release)
    if isinstance(scale, Tensor):  # folded into q
        q, scale = (q.float() * scale[:, None, :, None]).to(q.dtype), 1.0
    return mapped.attend_mapped(q, k, v, tables.q_cos, tables.q_sin, key_rows, tuple(key_maps), call.q_pos,
                                call.k_pos, rule, call.causal, float(scale), inner.interleaved)


__all__ = ["map_triton"]
