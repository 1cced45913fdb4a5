"""Triton kernel: attention under a position map (Self-Extend, DCA, LM-Infinite, attention sinks, STRING) in one
pass, the map chosen per pair inside each tile (posenc.position_map: PositionMap, PairRule): the decode steps
(mapped.py sends Tq > 1 to mapped_prefill_kernels.py, one map per program, which shares _tile_map and _select).

    score(i, j) = rot(q_i, P_q^m(i)) . rot(k_j, P_k^m(j)) * qk_scale,   m = rule(pos_i, pos_j)

Per (BM queries x BN keys) tile: the pair rule (a kind id and a few integers, PairRule) gives each pair's map
from the positions q_pos and k_pos, or -1 (not attended). The tile's class comes first, from the bounds of its
positions alone (_tile_map, scalars): no pair attended (skipped before any key is loaded: LM-Infinite's and the
sinks' middle); every pair under one map and inside the causal mask (that map's scores as they are, no per-pair
selection, merge or mask: most tiles of a long prompt); or mixed, each pair's map chosen from its positions. For
each map present the keys are rotated at that map's positions (cos/sin rows per key, the scheme's own tables, so
every rope_scaling, p-RoPE's cut and xPos's scale are in them) and scored against the queries rotated at the
map's query positions (once per program, kept in registers); the pair takes its map's score. One online softmax
(base 2) runs over every pair: no pass per map, no merge of maps, nothing read back by the host. (A decode step
splits its keys into shares, the shares merged after by log-sum-exp: SPLIT.)

Pairs: half-split (x[p], x[p + R/2]) or interleaved (x[2p], x[2p + 1]); dims past R are not rotated and enter the
score as a third product (REST > 0). Causality by index, as posenc.masks: query i (of the last Tq keys) sees keys
j <= i + Tk - Tq. Inference only: no backward (the dispatch sends gradients to the eager map path).
"""

from __future__ import annotations

import triton
import triton.language as tl

from posenc.nn.triton.attention_kernels import _dot, _fold_values, _softmax_step, _valid


@triton.jit
def _select(qp, kp, origin, rule_a, rule_b, window, KIND: tl.constexpr, WINDOWED: tl.constexpr):
    """qp (BM,1), kp (1,BN) int32 positions -> (BM,BN) int32: the map scoring each pair, -1 where none
    (posenc.position_map's PAIR_RULES: 0 SPLIT, 1 WINDOW_AND_START, 2 CHUNKS)."""
    d = qp - kp
    if KIND == 0:
        sel = tl.where(d < rule_a, 0, 1)
    elif KIND == 1:
        sel = tl.where(d < rule_a, 0, tl.where(kp - origin < rule_b, 1, -1))
    else:
        apart = _floor_div(qp, rule_a) - _floor_div(kp, rule_a)
        sel = tl.minimum(tl.maximum(apart, 0), 2)
    if WINDOWED:
        sel = tl.where(d < window, sel, -1)
    return sel


BIG = tl.constexpr(2**30)  # past every position: the bounds' identity
MIXED = tl.constexpr(3)  # _tile_map: the tile's pairs take more than one map (or some none): chosen per pair


@triton.jit
def _floor_div(x, a):
    """floor(x / a) for a >= 1 (Triton's // truncates toward zero)."""
    q = x // a
    return tl.where((x % a != 0) & (x < 0), q - 1, q)


@triton.jit
def _tile_map(q_lo, q_hi, k_lo, k_hi, origin, rule_a, rule_b, window, KIND: tl.constexpr, WINDOWED: tl.constexpr):
    """The map of every pair of a tile whose query positions lie in [q_lo, q_hi] and key positions in
    [k_lo, k_hi] (scalars), as _select would give it pair by pair: -1 (no pair attended), 0..2 (one map for
    every pair), or MIXED. Exact for any positions: each rule is monotone in d = qp - kp (SPLIT, the window),
    in kp (the sinks) or in both chunk indices (CHUNKS), so the bounds' answers bound every pair's."""
    d_lo = q_lo - k_hi
    d_hi = q_hi - k_lo
    if KIND == 0:
        cls = tl.where(d_hi < rule_a, 0, tl.where(d_lo >= rule_a, 1, MIXED))
    elif KIND == 1:
        start = tl.where(k_hi - origin < rule_b, 1, tl.where(k_lo - origin >= rule_b, -1, MIXED))
        cls = tl.where(d_hi < rule_a, 0, tl.where(d_lo >= rule_a, start, MIXED))
    else:
        apart_lo = tl.minimum(tl.maximum(_floor_div(q_lo, rule_a) - _floor_div(k_hi, rule_a), 0), 2)
        apart_hi = tl.minimum(tl.maximum(_floor_div(q_hi, rule_a) - _floor_div(k_lo, rule_a), 0), 2)
        cls = tl.where(apart_lo == apart_hi, apart_lo, MIXED)
    if WINDOWED:
        cls = tl.where(d_lo >= window, -1, tl.where((d_hi < window) | (cls == -1), cls, MIXED))
    return cls


@triton.jit
def _rotate_rows(x1, x2, COS, SIN, rows, p, ok, HALF: tl.constexpr):
    """Queries (R,BP) pairs x1, x2 (float32) rotated by the table rows `rows` (R,): (x1 c - x2 s, x2 c + x1 s)."""
    off = rows[:, None] * HALF + p[None, :]
    mask = ok[:, None] & (p[None, :] < HALF)
    c = tl.load(COS + off, mask=mask, other=0.0)
    s = tl.load(SIN + off, mask=mask, other=0.0)
    return x1 * c - x2 * s, x2 * c + x1 * s


@triton.jit
def _rotate_cols(y1, y2, COS, SIN, cols, p, ok, HALF: tl.constexpr):
    """Keys transposed (BP,C) rotated by the table rows `cols` (C,), as _rotate_rows."""
    off = cols[None, :] * HALF + p[:, None]
    mask = ok[None, :] & (p[:, None] < HALF)
    c = tl.load(COS + off, mask=mask, other=0.0)
    s = tl.load(SIN + off, mask=mask, other=0.0)
    return y1 * c - y2 * s, y2 * c + y1 * s


@triton.jit
def _map_scores(qa, qb, qr, k_base, skt, j, j_ok, first, second, r, CK, SK, cols, p, D: tl.constexpr,
                HALF: tl.constexpr, REST: tl.constexpr, ROTATED: tl.constexpr, PRECISION: tl.constexpr,
                UPCAST: tl.constexpr, MASKED: tl.constexpr = True):
    """One map's raw scores (BM,BN): its rotated queries qa, qb (BM,BP) against the keys at k_base, read transposed
    (BP,BN) by pair halves and rotated at the key table rows `cols` (ROTATED: the host rotated them already), plus
    the unrotated dims (qr (BM,BR) . kr (BR,BN)). MASKED=False: every key j of the tile is in range."""
    if MASKED or p.shape[0] != HALF:
        k_mask = (p[:, None] < HALF) & j_ok[None, :]
        y1 = tl.load(k_base + j[None, :] * skt + first[:, None], mask=k_mask, other=0.0)
        y2 = tl.load(k_base + j[None, :] * skt + second[:, None], mask=k_mask, other=0.0)
    else:  # every key in range and no padded pair: plain loads
        y1 = tl.load(k_base + j[None, :] * skt + first[:, None])
        y2 = tl.load(k_base + j[None, :] * skt + second[:, None])
    if not ROTATED:
        ka, kb = _rotate_cols(y1.to(tl.float32), y2.to(tl.float32), CK, SK, cols, p, j_ok, HALF)
        y1, y2 = ka.to(qa.dtype), kb.to(qb.dtype)
    s = _dot(qa, y1, PRECISION, UPCAST) + _dot(qb, y2, PRECISION, UPCAST)
    if REST > 0:
        kr = tl.load(k_base + j[None, :] * skt + r[:, None], mask=(r[:, None] < D) & j_ok[None, :], other=0.0)
        s += _dot(qr, kr, PRECISION, UPCAST)
    return s


@triton.jit
def _mapped_forward(Q, K0, K1, K2, V, OUT, LSE, QPOS, KPOS, CQ, SQ, CK, SK,
                    sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sob, soh, sot,
                    B, H, GROUP, TQ, TK, SPLITS, qk_scale, rule_a, rule_b, window,
                    D: tl.constexpr, HALF: tl.constexpr, REST: tl.constexpr, INTERLEAVED: tl.constexpr,
                    KIND: tl.constexpr, WINDOWED: tl.constexpr, N_MAPS: tl.constexpr,
                    KEY_MAP1: tl.constexpr, KEY_MAP2: tl.constexpr, ROTATED: tl.constexpr, CAUSAL: tl.constexpr,
                    BM: tl.constexpr, BN: tl.constexpr, BP: tl.constexpr, BR: tl.constexpr, BD: tl.constexpr,
                    SPLIT: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """One program per (query block, head, batch row). Tables: CQ/SQ (M,B,Tq,HALF), CK/SK (Mk,B,Tk,HALF) float32;
    map m reads query table m and key table KEY_MAP<m> (map 0: key table 0). Positions (B,Tq), (B,Tk) int32.
    K0, K1, K2: the keys map 0, 1, 2 scores, of one layout (B,Hkv,Tk,Dh): the raw keys thrice, rotated by the kernel
    at the tables' rows, or (ROTATED) each map's keys as the host rotated them (CK/SK unread).
    SPLIT (decoding: few rows, many keys): axis 0 holds SPLITS programs per query block, each over its share of the
    keys, writing its normalised output to OUT (SPLITS,B,H,Tq,Dh) float32 and its log-sum-exp (base 2) to LSE
    (SPLITS,B,H,Tq); the host merges them (flash-decoding)."""
    split = tl.program_id(0) % SPLITS
    m0 = tl.program_id(0) // SPLITS * BM
    h = tl.program_id(1).to(tl.int64)
    b = tl.program_id(2).to(tl.int64)
    hk = h // GROUP  # GQA: GROUP query heads share a key/value head
    i = m0 + tl.arange(0, BM)
    i_ok = i < TQ
    p = tl.arange(0, BP)
    p_ok = p < HALF
    if INTERLEAVED:
        first = 2 * p
        second = 2 * p + 1
    else:
        first = p
        second = p + HALF
    r = 2 * HALF + tl.arange(0, BR)  # the unrotated dims
    q_row = Q + b * sqb + h * sqh + i[:, None] * sqt
    q_mask = i_ok[:, None] & p_ok[None, :]
    x1 = tl.load(q_row + first[None, :], mask=q_mask, other=0.0).to(tl.float32)  # (BM,BP)
    x2 = tl.load(q_row + second[None, :], mask=q_mask, other=0.0).to(tl.float32)
    qr = tl.zeros((BM, BR), Q.dtype.element_ty)  # read only where REST > 0
    if REST > 0:
        qr = tl.load(q_row + r[None, :], mask=i_ok[:, None] & (r[None, :] < D), other=0.0)  # (BM,BR)
    rows = b * TQ + i  # the queries' rows in map 0's table; map m's lie m * B * Tq further
    qa0, qb0 = _rotate_rows(x1, x2, CQ, SQ, rows, p, i_ok, HALF)
    qa0, qb0 = qa0.to(Q.dtype.element_ty), qb0.to(Q.dtype.element_ty)
    qa1, qb1 = qa0, qb0
    qa2, qb2 = qa0, qb0
    if N_MAPS > 1:
        qa1, qb1 = _rotate_rows(x1, x2, CQ, SQ, rows + B * TQ, p, i_ok, HALF)
        qa1, qb1 = qa1.to(Q.dtype.element_ty), qb1.to(Q.dtype.element_ty)
    if N_MAPS > 2:
        qa2, qb2 = _rotate_rows(x1, x2, CQ, SQ, rows + 2 * B * TQ, p, i_ok, HALF)
        qa2, qb2 = qa2.to(Q.dtype.element_ty), qb2.to(Q.dtype.element_ty)
    qp = tl.load(QPOS + b * TQ + i, mask=i_ok, other=0)
    origin = tl.load(KPOS + b * TK)  # the row's first key
    d = tl.arange(0, BD)
    best = tl.full((BM,), float("-inf"), tl.float32)  # running max, base 2
    total = tl.zeros((BM,), tl.float32)
    acc = tl.zeros((BM, BD), tl.float32)
    n_end = TK
    if CAUSAL:
        n_end = tl.minimum(TK, m0 + BM + TK - TQ)
    k_offset = b * skb + hk * skh
    n_start = 0
    if SPLIT:  # this program's share of the key tiles
        share = tl.cdiv(tl.cdiv(n_end, SPLITS), BN) * BN
        n_start = split * share
        n_end = tl.minimum(n_end, n_start + share)
    q_lo = tl.min(tl.where(i_ok, qp, BIG), 0)  # the block's query positions lie in [q_lo, q_hi]
    q_hi = tl.max(tl.where(i_ok, qp, -BIG), 0)
    for n0 in range(n_start, n_end, BN):
        j = n0 + tl.arange(0, BN)
        j_ok = j < TK
        kp = tl.load(KPOS + b * TK + j, mask=j_ok, other=0)
        cls = _tile_map(q_lo, q_hi, tl.min(tl.where(j_ok, kp, BIG), 0), tl.max(tl.where(j_ok, kp, -BIG), 0),
                        origin, rule_a, rule_b, window, KIND, WINDOWED)
        if cls != -1:  # else no pair of the tile is attended: skipped
            cols = b * TK + j  # the keys' rows in key table 0
            whole = (cls != MIXED) & (n0 + BN <= TK)  # one map for every pair, and every pair inside the mask
            if CAUSAL:
                whole = whole & (n0 + BN - 1 <= m0 + TK - TQ)
            s = tl.zeros((BM, BN), tl.float32)
            if whole:  # one map's scores as they are: no selection, merge or mask
                if cls == 0:
                    s = _map_scores(qa0, qb0, qr, K0 + k_offset, skt, j, j_ok, first, second, r, CK, SK, cols, p, D,
                                    HALF, REST, ROTATED, PRECISION, UPCAST, False)
                if N_MAPS > 1:  # noqa: SIM102  (a constexpr test, then a runtime one: Triton takes no `and` of the two)
                    if cls == 1:
                        s = _map_scores(qa1, qb1, qr, K1 + k_offset, skt, j, j_ok, first, second, r, CK, SK,
                                        cols + KEY_MAP1 * B * TK, p, D, HALF, REST, ROTATED, PRECISION, UPCAST, False)
                if N_MAPS > 2:  # noqa: SIM102
                    if cls == 2:
                        s = _map_scores(qa2, qb2, qr, K2 + k_offset, skt, j, j_ok, first, second, r, CK, SK,
                                        cols + KEY_MAP2 * B * TK, p, D, HALF, REST, ROTATED, PRECISION, UPCAST, False)
                prob, correction, best, total = _softmax_step(best, total, s * qk_scale, False)
                if D == BD:
                    v = tl.load(V + b * svb + hk * svh + j[:, None] * svt + d[None, :])  # (BN,BD)
                else:
                    v = tl.load(V + b * svb + hk * svh + j[:, None] * svt + d[None, :], mask=d[None, :] < D, other=0.0)
            else:  # per pair: each pair's map, the maps present scored, the mask applied
                sel = _select(qp[:, None], kp[None, :], origin, rule_a, rule_b, window, KIND, WINDOWED)  # (BM,BN)
                ok = _valid(i[:, None], j[None, :], TQ, TK, CAUSAL) & (sel >= 0)
                sel = tl.where(ok, sel, -1)
                top = tl.max(tl.max(sel, 1), 0)
                low = tl.min(tl.min(tl.where(ok, sel, 3), 1), 0)
                if low == 0:
                    s = _map_scores(qa0, qb0, qr, K0 + k_offset, skt, j, j_ok, first, second, r, CK, SK, cols, p, D,
                                    HALF, REST, ROTATED, PRECISION, UPCAST)
                if N_MAPS > 1:  # noqa: SIM102
                    if (low <= 1) & (top >= 1):
                        s1 = _map_scores(qa1, qb1, qr, K1 + k_offset, skt, j, j_ok, first, second, r, CK, SK,
                                         cols + KEY_MAP1 * B * TK, p, D, HALF, REST, ROTATED, PRECISION, UPCAST)
                        s = tl.where(sel == 1, s1, s)
                if N_MAPS > 2:  # noqa: SIM102
                    if top >= 2:
                        s2 = _map_scores(qa2, qb2, qr, K2 + k_offset, skt, j, j_ok, first, second, r, CK, SK,
                                         cols + KEY_MAP2 * B * TK, p, D, HALF, REST, ROTATED, PRECISION, UPCAST)
                        s = tl.where(sel == 2, s2, s)
                s = tl.where(ok, s * qk_scale, float("-inf"))
                prob, correction, best, total = _softmax_step(best, total, s, True)  # a row may be empty so far
                v = tl.load(V + b * svb + hk * svh + j[:, None] * svt + d[None, :],
                            mask=j_ok[:, None] & (d[None, :] < D), other=0.0)  # (BN,BD)
            acc = _fold_values(acc, correction, prob, v, PRECISION, UPCAST)
    acc = acc / tl.where(total > 0, total, 1.0)[:, None]
    out_ptrs = OUT + b * sob + h * soh + i[:, None] * sot + d[None, :]
    if SPLIT:
        out_ptrs += split.to(tl.int64) * B * sob
        lse = tl.where(total > 0, best + tl.log2(total), float("-inf"))  # -inf: no key of this share attended
        tl.store(LSE + ((split * B + b) * H + h) * TQ + i, lse, mask=i_ok)
    tl.store(out_ptrs, acc.to(OUT.dtype.element_ty), mask=i_ok[:, None] & (d[None, :] < D))

