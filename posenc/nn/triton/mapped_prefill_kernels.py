"""Triton kernel: a prompt (or a chunk of queries after a KV cache) under a position map, ONE map per program
(posenc.position_map: PositionMap, PairRule; mapped_kernels.py scores every map in each program and serves the
decode steps).

    score(i, j) = rot(q_i, P_q^m(i)) . k_j^m * qk_scale,   m = rule(pos_i, pos_j)

Program (query block, share, map m; head; batch row): one rotated query copy (BM,BD) in registers, against the keys
the host rotated for map m (k^m). Holding one copy, not M, leaves the registers for the row kernel's key tiles
(attention_kernels.py: 128x64 at Dh 128) and its loop. Each program writes its normalised output and log-sum-exp;
the host merges a query block's M (x shares) partials by their log-sum-exps (mapped.py, flash-decoding's merge).
(The maps one after the other in one program, into one softmax, would need no merge, but the passes' loop-invariant
addresses, hoisted and held across them, spilled 100-200 B at 128x64.)

Which tiles a map visits comes from the bounds of positions alone (_map_pairs, per map): the host gives each key
tile's position bounds (KLO, KHI: (B, Tk/BN)), and the program classifies all its key tiles up front (CHUNK at a
time, no per-tile load in the loops): the first and last tile where map m may score a pair, and the run of "whole"
tiles (every pair under m, inside the causal mask and Tk). Contiguous positions make [first, last] exactly the
tiles holding a pair of m: LM-Infinite's and the sinks' start-key map visits the start keys' tile alone, their
window map the window (tests/nn/triton_mapped_cases.py counts them). Three loops: per pair over
[first, whole run), unmasked over the whole run (the row kernel's loop, attention_kernels._fwd_tiles without a
bias), per pair after it to the last. A per-pair tile (PBN keys) scores map m's pairs only (each pair's map from its
positions, masked to m and to the causal mask). Exact for any positions: where map m's whole tiles are not one run
(positions out of order), all of [first, last] goes per pair. A tile whose pairs span two maps is visited by both.

Rotation: the queries are rotated in the head dim's own layout, x * cos + sign * partner(x) * sin, partner the
pair's other dim (half-split: d +- R/2; interleaved: d ^ 1), so one product per key tile covers the rotated and the
unrotated dims (cos 1, sin 0 past R). Causality by index, as posenc.masks. Inference only.
"""

from __future__ import annotations

import triton
import triton.language as tl

from posenc.nn.triton.attention_kernels import (
    _dot,
    _fold_values,
    _forward_key_tile,
    _fwd_tiles,
    _softmax_step,
    _valid,
    _value_tile,
)
from posenc.nn.triton.mapped_kernels import BIG, _floor_div, _select


@triton.jit
def _rotated_queries(Q, CQ, SQ, q_row, rows, i_ok, d, D: tl.constexpr, HALF: tl.constexpr,
                     INTERLEAVED: tl.constexpr):
    """The block's queries (BM,BD) rotated by the table rows `rows` (BM,) of CQ/SQ (.., HALF) float32, in q's
    dtype: x * cos + sign * x[partner] * sin per rotated dim, x past 2 * HALF (cos 1, sin 0)."""
    rotated = d < 2 * HALF
    if INTERLEAVED:
        partner = d ^ 1
        pair = d // 2
        sign = tl.where(d % 2 == 0, -1.0, 1.0)
    else:
        partner = tl.where(d < HALF, d + HALF, d - HALF)
        pair = tl.where(d < HALF, d, d - HALF)
        sign = tl.where(d < HALF, -1.0, 1.0)
    x = tl.load(q_row + d[None, :], mask=i_ok[:, None] & (d[None, :] < D), other=0.0).to(tl.float32)  # (BM,BD)
    pair_mask = i_ok[:, None] & rotated[None, :]
    y = tl.load(q_row + partner[None, :], mask=pair_mask, other=0.0).to(tl.float32)
    off = rows[:, None] * HALF + pair[None, :]
    c = tl.load(CQ + off, mask=pair_mask, other=1.0)
    s = tl.load(SQ + off, mask=pair_mask, other=0.0)
    return (x * c + sign[None, :] * y * s).to(Q.dtype.element_ty)


@triton.jit
def _map_pairs(m, q_lo, q_hi, k_lo, k_hi, origin, rule_a, rule_b, window, KIND: tl.constexpr, WINDOWED: tl.constexpr):
    """Map m on the tiles whose query positions lie in [q_lo, q_hi] (scalars) and key positions in [k_lo, k_hi]
    (CHUNK,) -> (may, every) (CHUNK,): map m may score a pair of the tile / scores every pair, as _select gives it
    pair by pair (bounds of each rule's monotone terms, as _tile_map). Per map, not _tile_map's one class: a tile
    mixing map 0 with unattended pairs (LM-Infinite's and the sinks' window edge, far past the start keys) is MIXED
    there, yet holds no pair of map 1, which would visit every tile from the start keys to that edge."""
    d_lo = q_lo - k_hi
    d_hi = q_hi - k_lo
    if KIND == 0:
        may = tl.where(m == 0, d_lo < rule_a, d_hi >= rule_a)
        every = tl.where(m == 0, d_hi < rule_a, d_lo >= rule_a)
    elif KIND == 1:
        may = tl.where(m == 0, d_lo < rule_a, (d_hi >= rule_a) & (k_lo - origin < rule_b))
        every = tl.where(m == 0, d_hi < rule_a, (d_lo >= rule_a) & (k_hi - origin < rule_b))
    else:
        apart_lo = tl.minimum(tl.maximum(_floor_div(q_lo, rule_a) - _floor_div(k_hi, rule_a), 0), 2)
        apart_hi = tl.minimum(tl.maximum(_floor_div(q_hi, rule_a) - _floor_div(k_lo, rule_a), 0), 2)
        may = (apart_lo <= m) & (m <= apart_hi)
        every = (apart_lo == m) & (apart_hi == m)
    if WINDOWED:
        may = may & (d_lo < window)
        every = every & (d_hi < window)
    return may, every


@triton.jit
def _map_tiles(KLO, KHI, b, KT, t_start, t_end, m, q_lo, q_hi, m0, origin, rule_a, rule_b, window, TQ, TK,
               KIND: tl.constexpr, WINDOWED: tl.constexpr, CAUSAL: tl.constexpr, BN: tl.constexpr,
               CHUNK: tl.constexpr):
    """Tiles [t_start, t_end) of the block classified CHUNK at a time from the key tiles' position bounds ->
    (first, last): the first and last tile map m may score a pair in (last < first: none), and (w_first, w_last) the
    run of whole tiles of map m (w_last < w_first: none, or not one run: then [first, last] goes per pair)."""
    first = t_end + 0
    last = t_start - 1
    w_first = t_end + 0
    w_last = t_start - 1
    w_count = 0
    for c0 in range(t_start, t_end, CHUNK):
        t = c0 + tl.arange(0, CHUNK)
        t_ok = t < t_end
        lo = tl.load(KLO + b * KT + t, mask=t_ok, other=BIG)
        hi = tl.load(KHI + b * KT + t, mask=t_ok, other=-BIG)
        may, every = _map_pairs(m, q_lo, q_hi, lo, hi, origin, rule_a, rule_b, window, KIND, WINDOWED)
        hit = t_ok & may
        whole = t_ok & every & ((t + 1) * BN <= TK)
        if CAUSAL:
            whole = whole & ((t + 1) * BN - 1 <= m0 + TK - TQ)
        first = tl.minimum(first, tl.min(tl.where(hit, t, BIG), 0))
        last = tl.maximum(last, tl.max(tl.where(hit, t, -1), 0))
        w_first = tl.minimum(w_first, tl.min(tl.where(whole, t, BIG), 0))
        w_last = tl.maximum(w_last, tl.max(tl.where(whole, t, -1), 0))
        w_count += tl.sum(whole.to(tl.int32), 0)
    if w_count != w_last - w_first + 1:  # none, or not one run: every tile of [first, last] per pair
        w_first = last + 1
        w_last = last
    return first, last, w_first, w_last


@triton.jit
def _pair_tiles(acc, best, total, q, k_base, v_base, QPOS, KPOS, i, d, m, t_start, t_end, b, origin, rule_a, rule_b,
                window, TQ, TK, qk_scale, skt, svt, d_ok, KIND: tl.constexpr, WINDOWED: tl.constexpr,
                CAUSAL: tl.constexpr, EVEN_D: tl.constexpr, BN: tl.constexpr, PBN: tl.constexpr,
                PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """Key tiles [t_start, t_end) per pair: the pairs map m scores (from their positions) inside the causal mask;
    k_ptrs (BD,BN), v_ptrs (BN,BD) at key 0."""
    qp = tl.load(QPOS + b * TQ + i, mask=i < TQ, other=0)  # loaded here: nothing held across the other loops
    jl = tl.arange(0, PBN)
    k_ptrs = k_base + t_start * BN * skt + jl[None, :] * skt + d[:, None]  # (BD,PBN)
    v_ptrs = v_base + t_start * BN * svt + jl[:, None] * svt + d[None, :]  # (PBN,BD)
    for n0 in range(t_start * BN, t_end * BN, PBN):
        j = n0 + jl
        s = _dot(q, _forward_key_tile(k_ptrs, j, TK, d_ok, True, EVEN_D), PRECISION, UPCAST)  # (BM,BN)
        kp = tl.load(KPOS + b * TK + j, mask=j < TK, other=0)
        sel = _select(qp[:, None], kp[None, :], origin, rule_a, rule_b, window, KIND, WINDOWED)  # (BM,BN)
        s = tl.where(_valid(i[:, None], j[None, :], TQ, TK, CAUSAL) & (sel == m), s * qk_scale, float("-inf"))
        prob, correction, best, total = _softmax_step(best, total, s, True)  # a row may be empty so far
        acc = _fold_values(acc, correction, prob, _value_tile(v_ptrs, j, TK, d_ok, True, EVEN_D), PRECISION, UPCAST)
        k_ptrs += PBN * skt
        v_ptrs += PBN * svt
    return acc, best, total


@triton.jit
def _mapped_prefill(Q, K0, K1, K2, V, OUT, LSE, QPOS, KPOS, KLO, KHI, CQ, SQ,
                    sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sob, soh, sot,
                    B, H, GROUP, TQ, TK, KT, SPLITS, qk_scale, rule_a, rule_b, window,
                    D: tl.constexpr, HALF: tl.constexpr, INTERLEAVED: tl.constexpr, KIND: tl.constexpr,
                    WINDOWED: tl.constexpr, N_MAPS: tl.constexpr, CAUSAL: tl.constexpr,
                    BM: tl.constexpr, BN: tl.constexpr, PBN: tl.constexpr, BD: tl.constexpr, CHUNK: tl.constexpr,
                    PARTIAL: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """Axis 0: (query block, share, map) with the map fastest. CQ/SQ (M,B,Tq,HALF) float32: map m's query rotation
    at rows (m * B + b) * Tq + i. K0, K1, K2: the keys rotated for map 0, 1, 2, of one layout (B,Hkv,Tk,Dh).
    Positions (B,Tq), (B,Tk) int32; KLO/KHI (B,KT) int32: each BN-key tile's least and greatest position.
    PARTIAL (more than one map or share): OUT (SPLITS * M,B,H,Tq,Dh) float32, normalised per program, and its
    log-sum-exp (base 2) in LSE (SPLITS * M,B,H,Tq), for the host's merge; else OUT (B,H,Tq,Dh) in q's dtype."""
    m = tl.program_id(0) % N_MAPS
    split = tl.program_id(0) // N_MAPS % SPLITS
    m0 = tl.program_id(0) // (N_MAPS * SPLITS) * BM
    h = tl.program_id(1).to(tl.int64)
    b = tl.program_id(2).to(tl.int64)
    hk = h // GROUP  # GQA: GROUP query heads share a key/value head
    i = m0 + tl.arange(0, BM)
    i_ok = i < TQ
    d = tl.arange(0, BD)
    d_ok = d < D
    qp = tl.load(QPOS + b * TQ + i, mask=i_ok, other=0)
    q_lo = tl.min(tl.where(i_ok, qp, BIG), 0)  # the block's query positions lie in [q_lo, q_hi]
    q_hi = tl.max(tl.where(i_ok, qp, -BIG), 0)
    origin = tl.load(KPOS + b * TK)  # the row's first key
    n_end = TK
    if CAUSAL:
        n_end = tl.minimum(TK, m0 + BM + TK - TQ)
    t_start = 0
    t_end = tl.cdiv(n_end, BN)
    if SPLITS > 1:  # this program's share of the key tiles
        per_share = tl.cdiv(t_end, SPLITS)
        t_start = split * per_share
        t_end = tl.minimum(t_end, t_start + per_share)
    k_offset = b * skb + hk * skh
    v_base = V + b * svb + hk * svh
    best = tl.full((BM,), float("-inf"), tl.float32)  # running max, base 2
    total = tl.zeros((BM,), tl.float32)
    acc = tl.zeros((BM, BD), tl.float32)
    first, last, w_first, w_last = _map_tiles(KLO, KHI, b, KT, t_start, t_end, m, q_lo, q_hi, m0, origin,
                                              rule_a, rule_b, window, TQ, TK, KIND, WINDOWED, CAUSAL, BN, CHUNK)
    if first <= last:
        k_base = K0
        if m == 1:
            k_base = K1
        if m == 2:
            k_base = K2
        k_ptrs = k_base + k_offset + tl.arange(0, BN)[None, :] * skt + d[:, None]  # (BD,BN) at key 0
        v_ptrs = v_base + tl.arange(0, BN)[:, None] * svt + d[None, :]  # (BN,BD) at key 0
        q = _rotated_queries(Q, CQ, SQ, Q + b * sqb + h * sqh + i[:, None] * sqt, (m * B + b) * TQ + i, i_ok, d, D,
                             HALF, INTERLEAVED)  # (BM,BD)
        acc, best, total = _pair_tiles(acc, best, total, q, k_base + k_offset, v_base, QPOS, KPOS, i, d, m, first,
                                       tl.minimum(w_first, last + 1), b, origin, rule_a, rule_b, window, TQ, TK,
                                       qk_scale, skt, svt, d_ok, KIND, WINDOWED, CAUSAL, BD == D, BN,
                                       PBN, PRECISION, UPCAST)
        acc, best, total = _fwd_tiles(acc, best, total, q, k_ptrs, v_ptrs, k_ptrs, i, w_first * BN,
                                      (w_last + 1) * BN, TQ, TK, qk_scale, skt, svt, d_ok, CAUSAL, False, False,
                                      BD == D, BN, PRECISION, UPCAST)
        acc, best, total = _pair_tiles(acc, best, total, q, k_base + k_offset, v_base, QPOS, KPOS, i, d, m,
                                       tl.maximum(w_last + 1, first), last + 1, b, origin, rule_a, rule_b,
                                       window, TQ, TK, qk_scale, skt, svt, d_ok, KIND, WINDOWED, CAUSAL, BD == D,
                                       BN, PBN, PRECISION, UPCAST)
    acc = acc / tl.where(total > 0, total, 1.0)[:, None]
    out_ptrs = OUT + b * sob + h * soh + i[:, None] * sot + d[None, :]
    if PARTIAL:
        share = split * N_MAPS + m
        out_ptrs += share.to(tl.int64) * B * sob
        lse = tl.where(total > 0, best + tl.log2(total), float("-inf"))  # -inf: no pair of this share attended
        tl.store(LSE + ((share * B + b) * H + h) * TQ + i, lse, mask=i_ok)
    tl.store(out_ptrs, acc.to(OUT.dtype.element_ty), mask=i_ok[:, None] & d_ok[None, :])
