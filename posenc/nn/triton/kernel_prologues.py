"""The lines every attention kernel's program opens with, as @triton.jit helpers: which block, head and batch row
it runs, its index ranges, and the tiles or pointers it reads before its loop. Triton inlines a jit function into
its caller, so a kernel compiles to the instructions of the lines these replace (the static table's registers,
spills and loop instructions unchanged).

Grid as in attention_kernels.py: axis 0 the block (BM queries, or BN keys for dK/dV), axis 1 the query head h,
axis 2 the batch row b. Tensors (B,H,T,Dh) with strides s?b, s?h, s?t and unit stride along Dh; BD >= Dh a power
of two, its padding masked.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def program(BLOCK: tl.constexpr, H, GROUP):
    """-> the block's first row (axis 0 times BLOCK), query head h, batch row b, key/value head hk (GQA: GROUP
    query heads share one) and the (b, h) index bh = b H + h. h and b are int64: a (b, h) base offset may pass
    2^31 elements (the per-tile offsets against it stay int32)."""
    start = tl.program_id(0) * BLOCK
    h = tl.program_id(1).to(tl.int64)
    b = tl.program_id(2).to(tl.int64)
    return start, h, b, h // GROUP, b * H + h


@triton.jit
def block_indices(start, LENGTH, D: tl.constexpr, BLOCK: tl.constexpr, BD: tl.constexpr):
    """-> the block's rows start .. start + BLOCK - 1 (queries or keys) (BLOCK,), the head dims (BD,), their masks
    (rows inside LENGTH, Tq or Tk; dims inside D) and the mask of the block's (BLOCK,BD) tile of q, k, v or dO."""
    rows = start + tl.arange(0, BLOCK)
    d = tl.arange(0, BD)
    rows_ok = rows < LENGTH
    d_ok = d < D
    return rows, d, rows_ok, d_ok, rows_ok[:, None] & d_ok[None, :]


@triton.jit
def forward_key_pointers(K, V, b, hk, d, skb, skh, skt, svb, svh, svt, BN: tl.constexpr):
    """A forward program's key tile pointers, k transposed (BD,BN) and v (BN,BD), at key 0 of head (b, hk)."""
    jl = tl.arange(0, BN)
    k_ptrs = K + b * skb + hk * skh + jl[None, :] * skt + d[:, None]
    v_ptrs = V + b * svb + hk * svh + jl[:, None] * svt + d[None, :]
    return k_ptrs, v_ptrs


@triton.jit
def dq_key_pointers(K, V, b, hk, d, skb, skh, skt, svb, svh, svt, BN: tl.constexpr):
    """A dQ program's key tile pointers, both transposed (BD,BN), at key 0 of head (b, hk)."""
    jl = tl.arange(0, BN)
    k_ptrs = K + b * skb + hk * skh + jl[None, :] * skt + d[:, None]
    v_ptrs = V + b * svb + hk * svh + jl[None, :] * svt + d[:, None]
    return k_ptrs, v_ptrs


@triton.jit
def dq_rows(Q, DO, LSE, DELTA, b, h, bh, i, d, i_ok, q_mask, TQ, sqb, sqh, sqt, sdob, sdoh, sdot):
    """A dQ program's query block, loaded once: q and dO (BM,BD), LSE and delta (BM,); padded queries read as
    probability 0."""
    q = tl.load(Q + b * sqb + h * sqh + i[:, None] * sqt + d[None, :], mask=q_mask, other=0.0)  # (BM,BD)
    do = tl.load(DO + b * sdob + h * sdoh + i[:, None] * sdot + d[None, :], mask=q_mask, other=0.0)
    lse = tl.load(LSE + bh * TQ + i, mask=i_ok, other=float("inf"))  # padded queries: probability 0
    delta = tl.load(DELTA + bh * TQ + i, mask=i_ok, other=0.0)
    return q, do, lse, delta


@triton.jit
def key_block(K, V, b, hk, j, d, kv_mask, skb, skh, skt, svb, svh, svt):
    """A dK/dV program's key block, loaded once: k and v (BN,BD) of head (b, hk), 0 where kv_mask is not."""
    k = tl.load(K + b * skb + hk * skh + j[:, None] * skt + d[None, :], mask=kv_mask, other=0.0)
    v = tl.load(V + b * svb + hk * svh + j[:, None] * svt + d[None, :], mask=kv_mask, other=0.0)
    return k, v


@triton.jit
def dkdv_query_pointers(Q, DO, LSE, DELTA, b, h, bh, d, TQ, sqb, sqh, sqt, sdob, sdoh, sdot, BM: tl.constexpr):
    """A dK/dV program's query tile pointers at query 0 of head (b, h): q transposed (BD,BM), dO (BM,BD), LSE and
    delta (BM,) (rows of Tq per (b, h))."""
    il = tl.arange(0, BM)
    q_ptrs = Q + b * sqb + h * sqh + il[None, :] * sqt + d[:, None]
    do_ptrs = DO + b * sdob + h * sdoh + il[:, None] * sdot + d[None, :]
    return q_ptrs, do_ptrs, LSE + bh * TQ + il, DELTA + bh * TQ + il


__all__ = ["block_indices", "dkdv_query_pointers", "dq_key_pointers", "dq_rows", "forward_key_pointers", "key_block",
           "program"]
