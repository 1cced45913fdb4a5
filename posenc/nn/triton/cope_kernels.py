"""Triton kernels: causal flash attention with CoPE's contextual position bias (Golovneva et al. 2024), the GPU
twin of posenc/nn/csrc/cope.cpp. Notation as in attention_kernels.py (BM queries x BN keys per tile, BD >= Dh a
power of two, query i sees keys j <= i + OFF, OFF = Tk - Tq):

    z_ij = scale q_i . k_j,  g_ij = sigmoid(z_ij),  p_ij = min(sum_{t=j..i+OFF} g_it, P - 1)
    bias_ij = w rows[i, ceil p] + (1 - w) rows[i, floor p],  w = p - floor p;  logit_ij = z_ij + bias_ij

rows (B, H, Tq, P) float32 = q_i . e[n] for every table entry n (CoPE.contextual_rows). p is a running sum from
the query back, so every loop walks key tiles right to left and carries, per query row, the gates of the keys
right of the tile (`carry`); inside a tile p is that carry plus a reverse cumulative sum along the keys.

Backward (L the loss, dS = P (dP - delta) the logit gradient through the softmax, as in attention_kernels.py):
  dpos_ij = dS_ij (rows[i, ceil p] - rows[i, floor p]) where the clamp passes (sum <= P - 1), else 0
  dg_it   = sum_{j <= t} dpos_ij = D_i - R_it,  D_i = sum_j dpos_ij,  R_it = sum_{j > t} dpos_ij
  d z_it  = dS_it + dg_it g_it (1 - g_it);  dq = scale dz k, dk = scale dz^T q, dv = P^T dO
The right-to-left sweep knows R but learns D only at its end, so _cope_dq keeps two sums, (dS - R g') k and g' k,
and adds D times the second at the end. dQ runs as two passes with tiles of their own: _cope_dq walks only the
gated tiles (until every query of its block has counted P - 1 gates; 16 queries, as the per-row scans hold the
registers) and leaves, per query, the end of its far keys (END); _cope_dq_far runs the keys left of END as plain
flash tiles (one bias per query, dz = dS) four times taller and twice as wide, and adds the two parts. _cope_dkdv
(one program per key tile) needs, per query, the gate and dpos carries at its tile where the tile is gated for
that query: _cope_dq stores them per (query, key tile), (B, H, Tq, Tk / BN) floats each (8 Tq Tk / BN bytes per
(b, h): 32 MB at 16k and BN 64, written only at gated tiles), with D per query; a key tile left of a query's END
is a plain tile for it. d rows: two entries per pair (floor and ceil); keys whose sum passed P - 1 all land on
the last entry and are summed in registers; the others (the tiles within about P gates of the diagonal) are added
with atomics into the query block's own rows, so d rows may differ in the last bit between runs (dq, dk, dv do
not).
"""

from __future__ import annotations

import triton
import triton.language as tl

from posenc.nn.triton.attention_kernels import LOG2E, _dot, _fold_values, _softmax_step, _valid
from posenc.nn.triton.kernel_prologues import dq_query_block as _dq_rows  # main's lines kept: see kernel_prologues

_LOG2E = tl.constexpr(LOG2E)  # softmax in base 2, as attention_kernels (a jit function reads constexpr globals only)


@triton.jit
def _contextual(qk, carry, i, j, rows_at, TQ, TK, P, scale):
    """One tile's CoPE logits. qk (BM,BN) the products q . k; carry (BM,) the gates of keys right of the tile;
    rows_at (BM,) pointers to each query's rows. -> logit (natural units, -inf where masked), gates g (0 where
    masked), the summed gates `count`, weight w, rows at floor and ceil, the pair mask."""
    valid = _valid(i[:, None], j[None, :], TQ, TK, True)  # (BM,BN)
    z = qk * scale
    g = tl.where(valid, tl.sigmoid(z), 0.0)
    # sum over t >= j (gates past the query are 0) as the row's sum less a forward scan: a reverse scan flips the
    # tile twice, which held every register (255 and spills in every kernel, the static table)
    count = (carry + tl.sum(g, 1))[:, None] - tl.cumsum(g, 1) + g
    pos = tl.minimum(count, P * 1.0 - 1.0)  # >= 0: truncation is floor
    low = pos.to(tl.int32)
    w = pos - low.to(tl.float32)
    high = low + (w > 0.0).to(tl.int32)  # ceil p
    ok = valid & (i[:, None] < TQ)  # padded queries read no rows
    r_low = tl.load(rows_at[:, None] + low, mask=ok, other=0.0)
    r_high = tl.load(rows_at[:, None] + high, mask=ok, other=0.0)
    logit = tl.where(valid, z + w * r_high + (1.0 - w) * r_low, float("-inf"))
    return logit, g, count, w, low, high, r_low, r_high, valid


@triton.jit
def _all_far(carry, i_ok, P):
    """Every real query of the tile has counted at least P - 1 gates right of it: each pair of the tile (and of
    every tile further left) reads the last entry with weight 0, so no gate matters there (dpos = 0, hence
    dg = 0: the key tiles further left are plain flash tiles with one bias per query)."""
    return tl.min(tl.where(i_ok, carry, float("inf"))) >= P * 1.0 - 1.0


@triton.jit
def _online(acc, best, total, s, v, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """One tile of the online softmax: s (BM,BN) base-2 logits (-inf where masked), v (BN,BD); a row may see no key
    of the first tiles (EMPTY_ROWS)."""
    p, correction, best, total = _softmax_step(best, total, s, True)
    return _fold_values(acc, correction, p, v, PRECISION, UPCAST), best, total


@triton.jit
def _cope_forward(Q, K, V, OUT, LSE, ROWS,
                  sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sob, soh, sot,
                  H, GROUP, TQ, TK, P, scale,
                  D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr, FAR: tl.constexpr,
                  PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """One program per (query block, h, b): online softmax over key tiles from the diagonal back to key 0; the
    gates only until every query has counted P - 1 of them (_all_far), plain tiles after."""
    m0 = tl.program_id(0) * BM
    h = tl.program_id(1).to(tl.int64)
    b = tl.program_id(2).to(tl.int64)
    hk = h // GROUP
    i = m0 + tl.arange(0, BM)
    jl = tl.arange(0, BN)
    d = tl.arange(0, BD)
    d_ok = d < D
    i_ok = i < TQ
    q = tl.load(Q + b * sqb + h * sqh + i[:, None] * sqt + d[None, :], mask=i_ok[:, None] & d_ok[None, :],
                other=0.0)  # (BM,BD)
    k_base = K + b * skb + hk * skh + d[:, None]  # (BD,1)
    v_base = V + b * svb + hk * svh + d[None, :]  # (1,BD)
    rows_at = ROWS + ((b * H + h) * TQ + i) * P  # (BM,)
    last = tl.load(rows_at + (P - 1), mask=i_ok, other=0.0) * _LOG2E  # the far pairs' bias, base 2
    carry = tl.zeros((BM,), tl.float32)
    best = tl.full((BM,), float("-inf"), tl.float32)  # base 2
    total = tl.zeros((BM,), tl.float32)
    acc = tl.zeros((BM, BD), tl.float32)
    tiles = tl.cdiv(tl.minimum(TK, m0 + BM + TK - TQ), BN)
    t = m0 * 0  # tiles done
    while (t < tiles) & (not _all_far(carry, i_ok, P)):
        j = (tiles - 1 - t) * BN + jl  # right to left
        k_t = tl.load(k_base + j[None, :] * skt, mask=(j[None, :] < TK) & d_ok[:, None], other=0.0)  # (BD,BN)
        logit, g, _, _, _, _, _, _, _ = _contextual(_dot(q, k_t, PRECISION, UPCAST), carry, i, j, rows_at, TQ, TK,
                                                    P, scale)
        carry += tl.sum(g, 1)
        v = tl.load(v_base + j[:, None] * svt, mask=(j[:, None] < TK) & d_ok[None, :], other=0.0)  # (BN,BD)
        acc, best, total = _online(acc, best, total, logit * _LOG2E, v, PRECISION, UPCAST)
        t += 1
    # The far keys [0, end): plain tiles FAR times as wide (the loop with gates above sets the registers)
    end = (tiles - t) * BN
    jf = tl.arange(0, BN * FAR)
    for chunk in range(0, tl.cdiv(end, BN * FAR)):
        j = end - (chunk + 1) * (BN * FAR) + jf  # the last chunk reaches below key 0: masked
        seen = (j >= 0) & (j < TK)
        k_t = tl.load(k_base + j[None, :] * skt, mask=seen[None, :] & d_ok[:, None], other=0.0)
        s = tl.fma(_dot(q, k_t, PRECISION, UPCAST), scale * _LOG2E, last[:, None])
        s = tl.where(seen[None, :] & (j[None, :] <= i[:, None] + (TK - TQ)), s, float("-inf"))
        v = tl.load(v_base + j[:, None] * svt, mask=seen[:, None] & d_ok[None, :], other=0.0)
        acc, best, total = _online(acc, best, total, s, v, PRECISION, UPCAST)
    acc = acc / total[:, None]
    tl.store(OUT + b * sob + h * soh + i[:, None] * sot + d[None, :], acc.to(OUT.dtype.element_ty),
             mask=i_ok[:, None] & d_ok[None, :])
    tl.store(LSE + (b * H + h) * TQ + i, best + tl.log2(total), mask=i_ok)  # base 2


@triton.jit
def _cope_dq(Q, K, V, DO, LSE, DELTA, DQ_NEAR, END, ROWS, DROWS, CARRY_G, CARRY_D, DTOTAL,
             sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sdob, sdoh, sdot,
             H, GROUP, TQ, TK, P, KB, scale,
             D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr,
             PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """dQ's gated pass, one program per (query block, h, b), key tiles right to left until every query has counted
    P - 1 gates (_all_far): dQ of those tiles in float32 (DQ_NEAR contiguous (B,H,Tq,Dh)), d rows (DROWS zeroed,
    like ROWS), the carries entering each of those key tiles (CARRY_G, CARRY_D: (B,H,Tq,KB)), D per query (DTOTAL
    (B,H,Tq)) and the far keys' end per query (END (B,H,Tq) int32: keys j < END[i] are _cope_dq_far's, their
    carries never stored: _cope_dkdv reads END first)."""
    m0 = tl.program_id(0) * BM
    h = tl.program_id(1).to(tl.int64)
    b = tl.program_id(2).to(tl.int64)
    hk = h // GROUP
    bh = b * H + h
    i = m0 + tl.arange(0, BM)
    jl = tl.arange(0, BN)
    d = tl.arange(0, BD)
    i_ok, d_ok = i < TQ, d < D
    q_mask = i_ok[:, None] & d_ok[None, :]
    q, do, lse, delta = _dq_rows(Q, DO, LSE, DELTA, b, h, bh, i, d, i_ok, q_mask, TQ, sqb, sqh, sqt, sdob, sdoh, sdot)
    k_base = K + b * skb + hk * skh + d[:, None]
    v_base = V + b * svb + hk * svh + d[:, None]
    rows_at = ROWS + (bh * TQ + i) * P
    drows_at = DROWS + (bh * TQ + i) * P
    carry_at = (bh * TQ + i) * KB
    top = P * 1.0 - 1.0  # P may arrive as a constexpr 1
    carry = tl.zeros((BM,), tl.float32)  # gates right of the tile
    right = tl.zeros((BM,), tl.float32)  # dpos right of the tile
    far = tl.zeros((BM, BN), tl.float32)  # dS of clamped pairs: all on the last entry, summed after the loop
    reduced = tl.zeros((BM, BD), tl.float32)  # sum (dS - R g') k
    slopes = tl.zeros((BM, BD), tl.float32)  # sum g' k
    tiles = tl.cdiv(tl.minimum(TK, m0 + BM + TK - TQ), BN)
    t = m0 * 0  # tiles done
    while (t < tiles) & (not _all_far(carry, i_ok, P)):
        kb = tiles - 1 - t
        j = kb * BN + jl
        kv_mask = (j[None, :] < TK) & d_ok[:, None]
        k_t = tl.load(k_base + j[None, :] * skt, mask=kv_mask, other=0.0)  # (BD,BN)
        v_t = tl.load(v_base + j[None, :] * svt, mask=kv_mask, other=0.0)
        logit, g, count, w, low, high, r_low, r_high, valid = _contextual(_dot(q, k_t, PRECISION, UPCAST), carry,
                                                                          i, j, rows_at, TQ, TK, P, scale)
        tl.store(CARRY_G + carry_at + kb, carry, mask=i_ok)
        tl.store(CARRY_D + carry_at + kb, right, mask=i_ok)
        carry += tl.sum(g, 1)
        p = tl.exp2(logit * _LOG2E - lse[:, None])  # (BM,BN)
        ds = p * (_dot(do, v_t, PRECISION, UPCAST) - delta[:, None])
        near = valid & (count <= top)  # the clamp passes
        dpos = tl.where(near, ds * (r_high - r_low), 0.0)
        later = (right + tl.sum(dpos, 1))[:, None] - tl.cumsum(dpos, 1)  # R: dpos of keys after j
        gp = g * (1.0 - g)  # 0 where masked
        reduced += _dot((ds - later * gp).to(k_t.dtype), tl.trans(k_t), PRECISION, UPCAST)
        slopes += _dot(gp.to(k_t.dtype), tl.trans(k_t), PRECISION, UPCAST)
        right += tl.sum(dpos, 1)
        far += tl.where(valid & (count > top), ds, 0.0)
        near = near & i_ok[:, None]
        tl.atomic_add(drows_at[:, None] + low, ds * (1.0 - w), mask=near)
        tl.atomic_add(drows_at[:, None] + high, ds * w, mask=near & (w > 0.0))
        t += 1
    tl.atomic_add(drows_at + (P - 1), tl.sum(far, 1), mask=i_ok)
    tl.store(DTOTAL + bh * TQ + i, right, mask=i_ok)
    # keys [0, end) are far for every query of the block; none past a query's own diagonal (P = 1: no gated tile)
    tl.store(END + bh * TQ + i, tl.minimum((tiles - t) * BN, i + 1 + (TK - TQ)), mask=i_ok)
    dq = (reduced + right[:, None] * slopes) * scale
    tl.store(DQ_NEAR + (bh * TQ + i[:, None]) * D + d[None, :], dq, mask=q_mask)


@triton.jit
def _cope_dq_far(Q, K, V, DO, LSE, DELTA, DQ, DQ_NEAR, END, ROWS, DROWS,
                 sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sdob, sdoh, sdot,
                 H, GROUP, TQ, TK, P, scale,
                 D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr,
                 PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """dQ's far pass, after _cope_dq, one program per (query block, h, b) with tiles of its own: the keys j < END[i]
    (past P - 1 gates: one bias per query, the last entry, dz = dS) as plain flash dQ tiles, left to right; adds
    _cope_dq's part (DQ_NEAR) into DQ (contiguous (B,H,Tq,Dh)) and the tiles' dS to the last entry of d rows.
    Keys below every query's END need no mask; the tiles between the smallest and the largest END mask by row."""
    m0 = tl.program_id(0) * BM
    h = tl.program_id(1).to(tl.int64)
    b = tl.program_id(2).to(tl.int64)
    hk = h // GROUP
    bh = b * H + h
    i = m0 + tl.arange(0, BM)
    jl = tl.arange(0, BN)
    d = tl.arange(0, BD)
    i_ok, d_ok = i < TQ, d < D
    q_mask = i_ok[:, None] & d_ok[None, :]
    q, do, lse, delta = _dq_rows(Q, DO, LSE, DELTA, b, h, bh, i, d, i_ok, q_mask, TQ, sqb, sqh, sqt, sdob, sdoh, sdot)
    k_base = K + b * skb + hk * skh + d[:, None]
    v_base = V + b * svb + hk * svh + d[:, None]
    end = tl.load(END + bh * TQ + i, mask=i_ok, other=0)  # (BM,) <= TK
    last = tl.load(ROWS + (bh * TQ + i) * P + (P - 1), mask=i_ok, other=0.0) * _LOG2E - lse  # bias - lse, base 2
    inner = tl.min(tl.where(i_ok, end, TK)) // BN  # whole tiles far for every query
    outer = tl.cdiv(tl.max(end), BN)
    reduced = tl.zeros((BM, BD), tl.float32)  # sum dS k
    far = tl.zeros((BM,), tl.float32)  # sum dS: the last entry of d rows
    for kb in range(0, inner):
        j = kb * BN + jl
        k_t = tl.load(k_base + j[None, :] * skt, mask=d_ok[:, None], other=0.0)  # (BD,BN)
        v_t = tl.load(v_base + j[None, :] * svt, mask=d_ok[:, None], other=0.0)
        p = tl.exp2(tl.fma(_dot(q, k_t, PRECISION, UPCAST), scale * _LOG2E, last[:, None]))  # (BM,BN)
        ds = p * (_dot(do, v_t, PRECISION, UPCAST) - delta[:, None])
        reduced += _dot(ds.to(k_t.dtype), tl.trans(k_t), PRECISION, UPCAST)
        far += tl.sum(ds, 1)
    for kb in range(inner, outer):
        j = kb * BN + jl
        kv_mask = (j[None, :] < TK) & d_ok[:, None]
        k_t = tl.load(k_base + j[None, :] * skt, mask=kv_mask, other=0.0)
        v_t = tl.load(v_base + j[None, :] * svt, mask=kv_mask, other=0.0)
        s = tl.fma(_dot(q, k_t, PRECISION, UPCAST), scale * _LOG2E, last[:, None])
        p = tl.where(j[None, :] < end[:, None], tl.exp2(s), 0.0)  # the gated pass's keys: 0
        ds = p * (_dot(do, v_t, PRECISION, UPCAST) - delta[:, None])
        reduced += _dot(ds.to(k_t.dtype), tl.trans(k_t), PRECISION, UPCAST)
        far += tl.sum(ds, 1)
    tl.atomic_add(DROWS + (bh * TQ + i) * P + (P - 1), far, mask=i_ok)
    at = (bh * TQ + i[:, None]) * D + d[None, :]
    dq = tl.load(DQ_NEAR + at, mask=q_mask, other=0.0) + reduced * scale
    tl.store(DQ + at, dq.to(DQ.dtype.element_ty), mask=q_mask)


@triton.jit
def _cope_dkdv(Q, K, V, DO, LSE, DELTA, DK, DV, ROWS, END, CARRY_G, CARRY_D, DTOTAL,
               sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sdob, sdoh, sdot,
               H, GROUP, TQ, TK, P, KB, scale,
               D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr,
               PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """One program per (key tile, h, b): dK, dV of query head h into DK/DV contiguous (B,H,Tk,Dh) (GQA: the host
    adds a group's heads up), from the carries _dq left at this key tile. BN must be _dq's."""
    kb = tl.program_id(0)
    n0 = kb * BN
    h = tl.program_id(1).to(tl.int64)
    b = tl.program_id(2).to(tl.int64)
    hk = h // GROUP
    bh = b * H + h
    j = n0 + tl.arange(0, BN)
    il = tl.arange(0, BM)
    d = tl.arange(0, BD)
    j_ok, d_ok = j < TK, d < D
    kv_mask = j_ok[None, :] & d_ok[:, None]
    k_t = tl.load(K + b * skb + hk * skh + j[None, :] * skt + d[:, None], mask=kv_mask, other=0.0)  # (BD,BN)
    v_t = tl.load(V + b * svb + hk * svh + j[None, :] * svt + d[:, None], mask=kv_mask, other=0.0)
    top = P * 1.0 - 1.0  # P may arrive as a constexpr 1
    dk = tl.zeros((BN, BD), tl.float32)
    dv = tl.zeros((BN, BD), tl.float32)
    first = tl.maximum(n0 - (TK - TQ), 0) // BM * BM  # the first query block that sees key n0
    for m0 in range(first, TQ, BM):
        i = m0 + il
        i_ok = i < TQ
        q_mask = i_ok[:, None] & d_ok[None, :]
        q = tl.load(Q + b * sqb + h * sqh + i[:, None] * sqt + d[None, :], mask=q_mask, other=0.0)  # (BM,BD)
        do = tl.load(DO + b * sdob + h * sdoh + i[:, None] * sdot + d[None, :], mask=q_mask, other=0.0)
        lse = tl.load(LSE + bh * TQ + i, mask=i_ok, other=float("inf"))
        delta = tl.load(DELTA + bh * TQ + i, mask=i_ok, other=0.0)
        # the rows that see the tile and hold it among _dq's gated tiles: the carries stored there
        far = n0 < tl.load(END + bh * TQ + i, mask=i_ok, other=0)
        gated = i_ok & (n0 <= i + (TK - TQ)) & ~far
        qk = _dot(q, k_t, PRECISION, UPCAST)  # (BM,BN)
        if tl.max(gated.to(tl.int32)) == 0:  # a plain tile: one bias per query, dz = dS
            last = tl.load(ROWS + (bh * TQ + i) * P + (P - 1), mask=i_ok, other=0.0) * _LOG2E
            valid = (j[None, :] < TK) & (j[None, :] <= i[:, None] + (TK - TQ))
            p = tl.where(valid, tl.exp2(tl.fma(qk, scale * _LOG2E, last[:, None]) - lse[:, None]), 0.0)
            dv += _dot(tl.trans(p).to(do.dtype), do, PRECISION, UPCAST)
            dz = p * (_dot(do, v_t, PRECISION, UPCAST) - delta[:, None])
        else:  # a far row here counts more than P - 1 gates and has no dpos left: R = D, dz = dS
            carry_at = (bh * TQ + i) * KB + kb
            total = tl.load(DTOTAL + bh * TQ + i, mask=i_ok, other=0.0)
            carry = tl.where(far, P * 1.0, tl.load(CARRY_G + carry_at, mask=gated, other=0.0))
            right = tl.where(far, total, tl.load(CARRY_D + carry_at, mask=gated, other=0.0))
            logit, g, count, _, _, _, r_low, r_high, valid = _contextual(qk, carry, i, j, ROWS + (bh * TQ + i) * P,
                                                                         TQ, TK, P, scale)
            p = tl.exp2(logit * _LOG2E - lse[:, None])  # (BM,BN)
            dv += _dot(tl.trans(p).to(do.dtype), do, PRECISION, UPCAST)
            ds = p * (_dot(do, v_t, PRECISION, UPCAST) - delta[:, None])
            dpos = tl.where(valid & (count <= top), ds * (r_high - r_low), 0.0)
            later = (right + tl.sum(dpos, 1))[:, None] - tl.cumsum(dpos, 1)
            dz = tl.where(valid, ds + (total[:, None] - later) * g * (1.0 - g), 0.0)
        dk += _dot(tl.trans(dz).to(q.dtype), q, PRECISION, UPCAST)
    out = (bh * TK + j[:, None]) * D + d[None, :]
    mask = j_ok[:, None] & d_ok[None, :]
    tl.store(DK + out, (dk * scale).to(DK.dtype.element_ty), mask=mask)
    tl.store(DV + out, dv.to(DV.dtype.element_ty), mask=mask)


__all__: list[str] = []
