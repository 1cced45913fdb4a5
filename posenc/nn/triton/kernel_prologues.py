"""The lines the attention kernels' programs open with, as @triton.jit helpers: which block, head and batch row a
program runs, its index ranges, and the pointers it starts its loops from. Grid as in attention_kernels.py: axis 0
the block (BM queries, or BN keys for dK/dV), axis 1 the query head h, axis 2 the batch row b; tensors (B,H,T,Dh)
with strides s?b, s?h, s?t and unit stride along Dh, BD >= Dh a power of two.

Triton inlines these, so a kernel's IR is the op sequence of the lines a call replaces; a kernel calls a helper only
for lines it ran in that order (ptxas' allocation near 255 registers moves with the order: a first, reordering
version moved registers in 27 of benchmarks.gpu_static's settings and made FIRE's dQ in float32 spill 8-16 B).
Same PTX is not enough either: ptxas also reads its debug lines (.loc, a helper's inlined-at scope), and scheduled
FIRE's and CoPE's kernels differently with them (+1..+2 registers, up to +23 loop instructions), so
piecewise_kernels.py and cope_kernels.py keep their opening lines inline, line for line, as do relative_kernels' q
and qr (one mask) and _far_dkdv's pointers. Checked on every setting benchmarks.gpu_static compiles: the same
registers, spills, shared memory and loop instructions as before; keep the line count here (debug lines).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def program(BLOCK: tl.constexpr, GROUP):
    """-> the block's first row (axis 0 times BLOCK), query head h, batch row b and key/value head hk (GQA: GROUP
    query heads share one). h and b are int64: a (b, h) base offset may pass 2^31 elements (the per-tile offsets
    against it stay int32)."""
    start = tl.program_id(0) * BLOCK
    h = tl.program_id(1).to(tl.int64)
    b = tl.program_id(2).to(tl.int64)
    return start, h, b, h // GROUP


@triton.jit
def tile_ranges(start, BLOCK: tl.constexpr, OTHER: tl.constexpr, BD: tl.constexpr):
    """-> the block's rows start .. start + BLOCK - 1 (BLOCK,), a tile's offsets along the other axis (OTHER,) and
    the head dims (BD,)."""
    return start + tl.arange(0, BLOCK), tl.arange(0, OTHER), tl.arange(0, BD)


@triton.jit
def block_indices(start, LENGTH, D: tl.constexpr, BLOCK: tl.constexpr, OTHER: tl.constexpr, BD: tl.constexpr):
    """tile_ranges, then the masks: rows inside LENGTH (Tq or Tk), dims inside D, and the block's (BLOCK,BD) tile
    (of q, dO, or k and v). -> rows, other, d, rows_ok, d_ok, tile mask."""
    rows, other, d = tile_ranges(start, BLOCK, OTHER, BD)
    rows_ok, d_ok = rows < LENGTH, d < D
    return rows, other, d, rows_ok, d_ok, rows_ok[:, None] & d_ok[None, :]


@triton.jit
def query_rows(Q, b, h, i, d, i_ok, d_ok, sqb, sqh, sqt):
    """A forward program's query block (BM,BD) of head (b, h), 0 outside the rows and head dims."""
    return tl.load(Q + b * sqb + h * sqh + i[:, None] * sqt + d[None, :], mask=i_ok[:, None] & d_ok[None, :],
                   other=0.0)


@triton.jit
def dq_query_block(Q, DO, LSE, DELTA, b, h, bh, i, d, i_ok, q_mask, TQ, sqb, sqh, sqt, sdob, sdoh, sdot):
    """A dQ program's query block, loaded once: q and dO (BM,BD), LSE and delta (BM,); padded queries read as
    probability 0."""
    q = tl.load(Q + b * sqb + h * sqh + i[:, None] * sqt + d[None, :], mask=q_mask, other=0.0)  # (BM,BD)
    do = tl.load(DO + b * sdob + h * sdoh + i[:, None] * sdot + d[None, :], mask=q_mask, other=0.0)
    lse = tl.load(LSE + bh * TQ + i, mask=i_ok, other=float("inf"))  # padded queries: probability 0
    delta = tl.load(DELTA + bh * TQ + i, mask=i_ok, other=0.0)
    return q, do, lse, delta


@triton.jit
def forward_key_pointers(K, V, b, hk, jl, d, skb, skh, skt, svb, svh, svt):
    """A forward program's key tile pointers at key 0 of head (b, hk): k transposed (BD,BN), v (BN,BD)."""
    k_ptrs = K + b * skb + hk * skh + jl[None, :] * skt + d[:, None]
    v_ptrs = V + b * svb + hk * svh + jl[:, None] * svt + d[None, :]
    return k_ptrs, v_ptrs


@triton.jit
def dq_key_pointers(K, V, b, hk, jl, d, skb, skh, skt, svb, svh, svt):
    """A dQ program's key tile pointers at key 0 of head (b, hk): k and v both transposed (BD,BN)."""
    k_ptrs = K + b * skb + hk * skh + jl[None, :] * skt + d[:, None]
    v_ptrs = V + b * svb + hk * svh + jl[None, :] * svt + d[:, None]
    return k_ptrs, v_ptrs


@triton.jit
def key_block(K, V, b, hk, j, d, kv_mask, skb, skh, skt, svb, svh, svt):
    """A dK/dV program's key block, loaded once: k and v (BN,BD) of head (b, hk), 0 outside kv_mask."""
    k = tl.load(K + b * skb + hk * skh + j[:, None] * skt + d[None, :], mask=kv_mask, other=0.0)
    v = tl.load(V + b * svb + hk * svh + j[:, None] * svt + d[None, :], mask=kv_mask, other=0.0)
    return k, v


@triton.jit
def dkdv_query_pointers(Q, DO, LSE, DELTA, b, h, bh, il, d, TQ, sqb, sqh, sqt, sdob, sdoh, sdot):
    """A dK/dV program's query tile pointers at query 0 of head (b, h), bh = b H + h: q transposed (BD,BM), dO
    (BM,BD), LSE and delta (BM,)."""
    q_ptrs = Q + b * sqb + h * sqh + il[None, :] * sqt + d[:, None]
    do_ptrs = DO + b * sdob + h * sdoh + il[:, None] * sdot + d[None, :]
    return q_ptrs, do_ptrs, LSE + bh * TQ + il, DELTA + bh * TQ + il


__all__ = ["block_indices", "dkdv_query_pointers", "dq_key_pointers", "dq_query_block", "forward_key_pointers",
           "key_block", "program", "query_rows", "tile_ranges"]
