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
"""

from __future__ import annotations

import torch
from torch import Tensor

from posenc.nn import triton as gpu
from posenc.nn.call import Call
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
    origin = call.k_pos[:, :1]
    q_rows = [_cos_sin(_rotate_queries(inner, _unit(inner, (p.shape[0], tq, dh), q.device), p), inner, b)
              for p in position_map.query_positions(call.q_pos, origin)]
    in_kernel = tq == 1 and call.kept is None  # one query, no cache to keep rotated keys: rotated per tile
    key_tables: dict[int, int] = {}  # id of a key position tensor -> its table (maps sharing one share it)
    keys, key_maps = [], []
    for m, p in enumerate(position_map.key_positions(call.k_pos, origin)):
        if id(p) not in key_tables:
            key_tables[id(p)] = len(keys)
            if in_kernel:  # cos/sin rows: the kernel rotates the key tiles
                unit = _unit(inner, (p.shape[0], tk, dh), q.device)
                keys.append(_cos_sin(_rotate_keys(inner, unit, p), inner, b))
            else:  # the keys rotated once, in their dtype (kept with a cache: a step rotates its new key only)
                keys.append(_rotate_keys(inner, k, p, call.kept, m, f"rotated keys ({k.dtype})", k.dtype))
        key_maps.append(key_tables[id(p)])
    q_cos, q_sin = (torch.stack([rows[n] for rows in q_rows]) for n in (0, 1))  # (M,B,Tq,R/2)
    if in_kernel:
        key_rows = tuple(torch.stack([rows[n] for rows in keys]) for n in (0, 1))  # (Mk,B,Tk,R/2)
    else:
        key_rows, k = None, tuple(keys)  # Mk x (B,Hkv,Tk,Dh)
    scale = position_map.score_scale(call.q_pos, origin, tk)  # a number, or (B,Tq) (DCA's release): folded into q
    if isinstance(scale, Tensor):
        q, scale = (q.float() * scale[:, None, :, None]).to(q.dtype), 1.0
    return mapped.attend_mapped(q, k, v, q_cos, q_sin, key_rows, tuple(key_maps), call.q_pos, call.k_pos, rule,
                                call.causal, float(scale), inner.interleaved)


__all__ = ["map_triton"]
