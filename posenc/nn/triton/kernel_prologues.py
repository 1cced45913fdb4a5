"""The lines the attention kernels' programs open with, as @triton.jit helpers: which block, head and batch row a
program runs, its index ranges, and the pointers it starts its loops from. Grid as in attention_kernels.py: axis 0
the block (BM queries, or BN keys for dK/dV), axis 1 the query head h, axis 2 the batch row b; tensors (B,H,T,Dh)
with strides s?b, s?h, s?t and unit stride along Dh, BD >= Dh a power of two.

Triton inlines these, so a kernel's IR is the op sequence of the lines they replace, in the same order; the sm_90
compile is then the same to the instruction (benchmarks.gpu_static: registers, spills, loop instructions). The
order is what these keep exact: ptxas' register allocation near 255 registers moves with it (a key offset range
made two lines later cost one dQ 16 B of spills), and so does the hoisting of folded constants, which differs for
a constant folded inside a helper. So the helpers hold no constant a kernel used to fold (a masked load's `other`,
a compare against the constexpr D): those lines stay in the kernels.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def heads(GROUP):
    """-> this program's query head h (axis 1), batch row b (axis 2) and key/value head hk (GQA: GROUP query heads
    share one). int64: a (b, h) base offset may pass 2^31 elements (the per-tile offsets against it stay int32)."""
    h = tl.program_id(1).to(tl.int64)
    b = tl.program_id(2).to(tl.int64)
    return h, b, h // GROUP


@triton.jit
def tile_ranges(start, BLOCK: tl.constexpr, OTHER: tl.constexpr, BD: tl.constexpr):
    """-> the block's rows start .. start + BLOCK - 1 (BLOCK,), a tile's offsets along the other axis (OTHER,) and
    the head dims (BD,)."""
    return start + tl.arange(0, BLOCK), tl.arange(0, OTHER), tl.arange(0, BD)


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
def dkdv_query_pointers(Q, DO, LSE, DELTA, b, h, bh, il, d, TQ, sqb, sqh, sqt, sdob, sdoh, sdot):
    """A dK/dV program's query tile pointers at query 0 of head (b, h), bh = b H + h: q transposed (BD,BM), dO
    (BM,BD), LSE and delta (BM,)."""
    q_ptrs = Q + b * sqb + h * sqh + il[None, :] * sqt + d[:, None]
    do_ptrs = DO + b * sdob + h * sdoh + il[:, None] * sdot + d[None, :]
    return q_ptrs, do_ptrs, LSE + bh * TQ + il, DELTA + bh * TQ + il


__all__ = ["dkdv_query_pointers", "dq_key_pointers", "forward_key_pointers", "tile_ranges"]
