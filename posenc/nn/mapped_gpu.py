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
rows, its key tables, the rows of the keys a decode step adds, the positions in int32, the score scale) is derived
once per forward and shared by the layers (StepTables), every map's rows from one rotate() call: a decode step reads
its positions, which on a GPU waits for the device, once and not once per layer and map. The kept keys a step adds
are rotated by those rows straight into the kept buffer (the rotation of a key is linear in it: rows * key, the
scheme's own rows). What is left per layer: one rotation per key table, the kernel, the merge of the key shares
(benchmarks/map_decode_ops.py counts them; tests/position_maps/test_decode_step_ops.py bounds them).
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
from posenc.nn.mapped_attention import _rotate_keys
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
    """What one forward's calls derive from its positions alone, built by its first layer and read by the others:
    each map's query rows, the key tables (the distinct key position tensors, maps sharing one share its table),
    the rows of the keys a step adds per key table, the positions as the kernel reads them, the score scale. The
    scheme holds the last one until its next call: after a long prompt, up to (M + Mk) x B x T x R x 4 bytes (0.3 GB
    for DCA at 128k, R 128)."""

    key: tuple  # the positions tensors, their versions, the call's shape and device, the map: a hit needs all equal
    state: tuple  # kept_tables.state of the scheme: its tensors, their versions and storage
    q_cos: Tensor  # (M,B,Tq,R/2) float32
    q_sin: Tensor
    key_positions: tuple[Tensor, ...]  # per key table (B,Tk): the distinct tensors of the map's key_positions
    key_maps: tuple[int, ...]  # per map, its key table
    positions: tuple[Tensor, Tensor]  # q_pos (B,Tq), k_pos (B,Tk) int32, contiguous: the kernel's
    scale: float | Tensor  # the map's score_scale: a number or (B,Tq)
    key_rows: tuple[Tensor, Tensor] | None  # in_kernel: cos, sin (Mk,B,Tk,R/2) float32 of every key
    new_key_rows: dict[tuple[int, int], tuple[Tensor, Tensor]] = field(default_factory=dict)  # (table, done) ->
    # cos, sin (B,1,Tk-done,R/2) float32 of the keys past `done` (built with the tables for done = Tk - Tq)


def step_tables(scheme: Scheme, q_pos: Tensor, k_pos: Tensor, b: int, tq: int, dh: int, device: torch.device,
                in_kernel: bool) -> StepTables:
    """The scheme's StepTables for these positions: built by the first layer of a forward, read by the others.
    in_kernel: the kernel rotates every key (rows of all keys), else the kept keys take the new keys' rows."""
    now = state(scheme)  # the rotation's tensors (a frequency patched in place between two calls: another table)
    key = (q_pos, k_pos, position_version(q_pos), position_version(k_pos), b, tq, dh, device, in_kernel,
           scheme.position_map)
    last = scheme.__dict__.get("_step_tables")
    if last is not None and last.key[0] is q_pos and last.key[1] is k_pos and last.key[2:] == key[2:] \
            and same_state(last.state, now):
        return last
    position_map, inner = scheme.position_map, scheme.inner
    origin, tk = k_pos[:, :1], k_pos.shape[1]
    queries = position_map.query_positions(q_pos, origin)  # M x (B,Tq)
    per_map = position_map.key_positions(k_pos, origin)  # M x (B,Tk), maps sharing a tensor share its table
    tables = {id(p): p for p in per_map}  # in the maps' order
    key_maps = tuple(list(tables).index(id(p)) for p in per_map)
    n = tk if in_kernel else min(tq, tk)  # the keys whose rows the step needs: every key, or its new ones
    keys = [p[:, tk - n:] for p in tables.values()]  # Mk x (B,n)
    as_query, as_key = _rows(inner, torch.cat([*queries, *keys], dim=1), b, dh)  # (B,M*Tq+Mk*n,R/2) each
    m, half = len(queries), as_query[0].shape[-1]
    q_cos, q_sin = (t[:, : m * tq].reshape(b, m, tq, half).transpose(0, 1).contiguous() for t in as_query)
    k_cos, k_sin = (t[:, m * tq:].contiguous().view(b, len(keys), n, half) for t in as_key)  # (B,Mk,n,R/2)
    key_rows = None
    new_key_rows = {}
    if in_kernel:
        key_rows = (k_cos.transpose(0, 1).contiguous(), k_sin.transpose(0, 1).contiguous())  # (Mk,B,Tk,R/2)
    else:
        new_key_rows = {(t, tk - n): (k_cos[:, t, None], k_sin[:, t, None]) for t in range(len(keys))}  # (B,1,n,R/2)
    kernel_positions = (_int32(q_pos, b, tq, device), _int32(k_pos, b, tk, device))
    scale = position_map.score_scale(q_pos, origin, tk)
    tables_now = StepTables(key, now, q_cos, q_sin, tuple(tables.values()), key_maps, kernel_positions, scale,
                            key_rows, new_key_rows)
    scheme.__dict__["_step_tables"] = tables_now  # a plain attribute: not a module's state, never saved
    return tables_now


def _int32(pos: Tensor, b: int, n: int, device: torch.device) -> Tensor:
    """pos (B|1,n) as the kernel reads positions: (B,n) int32, contiguous, on the device."""
    return pos.expand(b, n).to(device=device, dtype=torch.int32).contiguous()


def _rows(inner: Scheme, pos: Tensor, b: int, dh: int) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]:
    """(cos, sin) (B,T,R/2) float32 of the queries' rotation at pos (B|1,T), and of the keys': a unit vector rotated
    as a query and as a key (xPos scales the two apart) in one rotate() call on one positions tensor, so a step's
    positions of every map are read once (on a GPU, a wait for the device) and not once per map and side."""
    unit = _unit(inner, (pos.shape[0], pos.shape[1], dh), pos.device)
    q_rot, k_rot = inner.rotate(unit, unit, pos, pos)
    return _cos_sin(q_rot, inner, b), _cos_sin(k_rot, inner, b)


def _rotate_by_rows(inner: Scheme, fresh: Tensor, pos: Tensor, done: int, table: int, tables: StepTables,
                    out: Tensor) -> None:
    """The keys past `done` (B,Hkv,Tk-done,Dh) rotated at pos[:, done:] by the step's rows of key table `table`,
    written into out (the kept buffer's new places): rotation is linear in the key, so the rows of a unit key serve
    every layer. The rows of a step's new keys come with the tables; others (a layer whose kept keys were dropped)
    are built by the first layer that asks."""
    rows = tables.new_key_rows.get((table, done))
    if rows is None:
        cos, sin = _rows(inner, pos[:, done:], fresh.shape[0], fresh.shape[-1])[1]
        rows = tables.new_key_rows[(table, done)] = (cos[:, None], sin[:, None])  # (B,1,T,R/2)
    from posenc.nn.triton import rotary  # imports triton: map_triton serves only where it runs

    rotary.rotate(fresh, rows[0], rows[1], inner.interleaved, out=out)


def map_triton(call: Call) -> Tensor | None:
    """The map's attention in one launch (posenc/nn/triton/mapped.py); declines gradients, dropout, what the GPU
    attention does not fit, a map without a pair rule or with more maps than a program holds, and a scheme without
    RoPE's rot_dim and pairing. Per layer: the kept keys' new rows rotated, then the launch; the rest is the step's
    (StepTables)."""
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
    in_kernel = tq == 1 and call.kept is None  # one query, no cache to keep rotated keys: rotated per tile
    tables = step_tables(scheme, call.q_pos, call.k_pos, b, tq, dh, q.device, in_kernel)
    if in_kernel:  # the raw keys, with every key's cos/sin rows: the kernel rotates the key tiles
        key_rows = tables.key_rows
    else:  # the keys rotated once, in their dtype; kept in the cache, a step rotates its new keys by the step's rows
        key_rows, source, label = None, append_only_buffer(call.k_pos), (f"rotated keys ({k.dtype})", position_map)
        k = tuple(_rotate_keys(inner, k, p, call.kept, table, label, k.dtype, source,
                               lambda fresh, done, out, p=p, table=table: _rotate_by_rows(
                                   inner, fresh, p, done, table, tables, out))
                  for table, p in enumerate(tables.key_positions))  # Mk x (B,Hkv,Tk,Dh)
    scale = tables.scale
    if isinstance(scale, Tensor):  # folded into q
        q, scale = (q.float() * scale[:, None, :, None]).to(q.dtype), 1.0
    return mapped.attend_mapped(q, k, v, tables.q_cos, tables.q_sin, key_rows, tables.key_maps, *tables.positions,
                                rule, call.causal, float(scale), inner.interleaved)


__all__ = ["map_triton"]
