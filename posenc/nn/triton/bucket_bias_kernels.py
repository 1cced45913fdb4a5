"""Triton kernel: dQ of row-bias attention (attention_kernels._dq) with, instead of the row gradient's diagonal sums,
the gradient of a table read at a fixed bucket per distance (Scheme.bucket_bias: T5):

    dL/dtable[h, k] = sum over b, i, j with buckets[e[b] - i + j] = k of dS[b, h, i, j]

A tile whose pairs all read one bucket (the host says which: one int per tile, -1 where the tile spans several) adds
its dS summed along the keys into a running (BM,) sum, as head_bias_kernels' parameter sums do; the running sum is
folded into the per-bucket totals (NBP,) only when the bucket changes, a few times per program (T5's far tiles, past
max_distance, all read the last bucket). A tile spanning several buckets (near the diagonal) sums dS along its
diagonals (one distance, so one bucket, each) and adds each diagonal's sum to its bucket's total. Neither needs the
bucket to be monotone in distance (a bidirectional T5's is not).
"""

from __future__ import annotations

import triton
import triton.language as tl

from posenc.nn.triton import kernel_prologues as prologue
from posenc.nn.triton.attention_kernels import _bias, _dot, _interior_end, _key_end, _key_tile, _probabilities


@triton.jit
def _diagonals_by_bucket(totals, ds, bucket_ptrs, BM: tl.constexpr, BN: tl.constexpr, NBP: tl.constexpr):
    """totals (NBP,) plus the tile's dS (BM,BN) summed per bucket: along the diagonals c = j - i + BM - 1 in chunks
    of BN (any BM, BN), each diagonal's sum added to the bucket at bucket_ptrs[c] (its distance's)."""
    i = tl.arange(0, BM)[:, None]
    t = tl.arange(0, BN)[None, :]
    slots = tl.arange(0, NBP)[None, :]
    for chunk in range(0, (BM + BN - 1 + BN - 1) // BN):  # a loop, not unrolled: fewer registers held
        column = t + i + (chunk * BN - (BM - 1))  # (BM,BN): the column of row i on diagonal chunk BN + t
        part = tl.gather(ds, tl.minimum(tl.maximum(column, 0), BN - 1), 1)
        part = tl.sum(tl.where((column >= 0) & (column < BN), part, 0.0), 0)  # (BN,) the diagonals' sums
        bucket = tl.load(bucket_ptrs + chunk * BN + tl.arange(0, BN))  # (BN,) int32
        totals += tl.sum(tl.where(bucket[:, None] == slots, part[:, None], 0.0), 0)
    return totals


@triton.jit
def _dq_bucket_tiles(dq, running, current, totals, q, do, lse, delta, k_ptrs, v_ptrs, bias_ptrs, bucket_ptrs,
                     tile_ptrs, i, n_start, n_end, TQ, TK, qk_scale, skt, svt, d_ok, CAUSAL: tl.constexpr,
                     MASKED: tl.constexpr, EVEN_D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                     NBP: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """Key tiles [n_start, n_end) of one query block: dQ, and dS summed per bucket (running: the (BM,) sum of the
    tiles of bucket current since the last change; totals: (NBP,) the rest)."""
    k_ptrs += n_start * skt
    v_ptrs += n_start * svt
    slots = tl.arange(0, NBP)
    for n0 in range(n_start, n_end, BN):
        tile = tl.load(tile_ptrs + n0)  # the tile's one bucket, or -1: several (loaded first: its latency hidden)
        j = n0 + tl.arange(0, BN)
        k_t, v_t = _key_tile(k_ptrs, v_ptrs, j, TK, d_ok, MASKED, EVEN_D)
        s = _dot(q, k_t, PRECISION, UPCAST)  # (BM,BN)
        offset = n0 + (tl.arange(0, BN)[None, :] - tl.arange(0, BM)[:, None])  # e[b] - i + j, less the bases
        s = tl.fma(s, qk_scale, _bias(bias_ptrs + offset, UPCAST))
        p = _probabilities(s, lse[:, None], i[:, None], j[None, :], TQ, TK, CAUSAL, MASKED)  # (BM,BN)
        ds = p * (_dot(do, v_t, PRECISION, UPCAST) - delta[:, None])  # (BM,BN): d loss / d logit
        dq += _dot(ds.to(k_t.dtype), tl.trans(k_t), PRECISION, UPCAST)
        if tile == current:  # the common case: the running bucket again
            running += tl.sum(ds, 1)
        else:
            totals += tl.where(slots == current, tl.sum(running, 0), 0.0)
            if tile >= 0:
                running = tl.sum(ds, 1)
            else:
                running = tl.zeros_like(running)
                totals = _diagonals_by_bucket(totals, ds, bucket_ptrs + n0, BM, BN, NBP)
            current = tl.where(tile >= 0, tile, -2)  # -2: no running bucket (never a tile's mark)
        k_ptrs += BN * skt
        v_ptrs += BN * svt
    return dq, running, current, totals


@triton.jit
def _dq_buckets(Q, K, V, DO, LSE, DELTA, DQ, ROWS, BUCKETS, TILE_BUCKETS, E, G,
                sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sdob, sdoh, sdot,
                H, GROUP, TQ, TK, row_stride, qk_scale, scale,
                D: tl.constexpr, CAUSAL: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, NBP: tl.constexpr,
                BD: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """dQ of one query block (DQ contiguous (B,H,Tq,Dh)) and its sums per bucket into G[b, h, block, 0:NBP] (each
    written once: no atomics; the host adds them up in a fixed order). BUCKETS: the bucket of each row element
    (int32, padded as the rows); TILE_BUCKETS[o]: the one bucket of the BM + BN - 1 elements from o on, or -1."""
    m0, h, b, hk = prologue.program(BM, GROUP)
    bh = b * H + h
    i, jl, d, i_ok, d_ok, q_mask = prologue.block_indices(m0, TQ, D, BM, BN, BD)
    q, do, lse, delta = prologue.dq_query_block(Q, DO, LSE, DELTA, b, h, bh, i, d, i_ok, q_mask, TQ, sqb, sqh, sqt,
                                                sdob, sdoh, sdot)
    k_ptrs, v_ptrs = prologue.dq_key_pointers(K, V, b, hk, jl, d, skb, skh, skt, svb, svh, svt)  # at key 0
    e = tl.load(E + b)
    bias_ptrs = ROWS + h * row_stride + e - m0  # the row at query m0, key 0
    bucket_ptrs = BUCKETS + e - m0 - (BM - 1)  # the bucket of diagonal c = j - i + BM - 1 of the tile at key 0
    tile_ptrs = TILE_BUCKETS + e - m0 - (BM - 1)  # likewise, the tile's one bucket
    running = tl.zeros((BM,), tl.float32)
    current = tl.full((), -2, tl.int32)
    totals = tl.zeros((NBP,), tl.float32)
    dq = tl.zeros((BM, BD), tl.float32)
    interior = _interior_end(m0, TQ, TK, CAUSAL, BM, BN)
    end = _key_end(m0, TQ, TK, CAUSAL, BM)
    dq, running, current, totals = _dq_bucket_tiles(
        dq, running, current, totals, q, do, lse, delta, k_ptrs, v_ptrs, bias_ptrs, bucket_ptrs, tile_ptrs, i, 0,
        interior, TQ, TK, qk_scale, skt, svt, d_ok, CAUSAL, False, BD == D, BM, BN, NBP, PRECISION, UPCAST)
    dq, running, current, totals = _dq_bucket_tiles(
        dq, running, current, totals, q, do, lse, delta, k_ptrs, v_ptrs, bias_ptrs, bucket_ptrs, tile_ptrs, i,
        interior, end, TQ, TK, qk_scale, skt, svt, d_ok, CAUSAL, True, BD == D, BM, BN, NBP, PRECISION, UPCAST)
    slots = tl.arange(0, NBP)
    totals += tl.where(slots == current, tl.sum(running, 0), 0.0)
    tl.store(G + (bh * tl.num_programs(0) + tl.program_id(0)) * NBP + slots, totals)
    tl.store(DQ + (bh * TQ + i[:, None]) * D + d[None, :], (dq * scale).to(DQ.dtype.element_ty), mask=q_mask)
