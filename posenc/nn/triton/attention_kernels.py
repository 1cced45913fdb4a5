"""Triton kernels: flash attention whose bias is read, per tile, from one row per head (Scheme.bias_by_distance).

    logit(b, h, i, j) = q_i . k_j / sqrt(Dh) + rows[h, clamp(e[b] - i + j, 0, S - 1)]   (then the causal mask)

Notation as in posenc/nn/attention.py; BM query rows and BN key columns per tile, BD >= Dh a power of two.
Causal attention lets query i (the i-th of the last Tq keys) see keys j <= i + Tk - Tq, as posenc.masks does.
Softmax runs in base 2 (exp2 is the GPU's native instruction): scores and the bias are multiplied by log2(e).

Forward: one program per (block of queries, b, h); online softmax (Dao 2023, FlashAttention-2, Alg. 1); it keeps
the log-sum-exp per query for the backward. Backward (Alg. 2), without atomics so results repeat bit for bit:
  _dkdv: one program per (block of keys, b, key head): loops over the group's query heads and the query blocks;
  _dq:   one program per (block of queries, b, h): loops over key blocks; also sums the logit gradient dS of each
         tile along its diagonals (the entries that read one row element) into a per-program buffer;
  _row_reduce: adds those buffers up in a fixed order into the row gradient (H, S).
"""

from __future__ import annotations

import triton
import triton.language as tl

LOG2E = 1.4426950408889634


@triton.jit
def _dot(a, b, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    # UPCAST: Triton 3.6's interpreter computes bf16 dots wrongly (garbage); it then multiplies in float32.
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision=PRECISION)
    return tl.dot(a, b, input_precision=PRECISION)


@triton.jit
def _key_end(m0, TQ, TK, CAUSAL: tl.constexpr, BM: tl.constexpr):
    """One past the last key a block of queries starting at m0 may see."""
    if CAUSAL:
        return tl.minimum(TK, m0 + BM + TK - TQ)
    return TK


@triton.jit
def _bias_and_mask(s, ROWS, row_len, e, i, j, TQ, TK, CAUSAL: tl.constexpr):
    """Scores s in base-2 logit units plus the row bias; -inf where masked. i, j: query and key indices, already
    broadcast to s's shape ((BM,1) and (1,BN), or transposed for a (BN,BM) tile)."""
    index = tl.minimum(tl.maximum(e - i + j, 0), row_len - 1)
    s += tl.load(ROWS + index) * 1.4426950408889634  # one row per head: reads stay within a few cache lines
    valid = j < TK
    if CAUSAL:
        valid = valid & (j <= i + (TK - TQ))
    return tl.where(valid, s, float("-inf"))


@triton.jit
def _forward(Q, K, V, OUT, LSE, ROWS, E,
             sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sob, soh, sot,
             H, GROUP, TQ, TK, D, row_len, qk_scale,
             CAUSAL: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr,
             PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    m0 = tl.program_id(0) * BM
    bh = tl.program_id(1)
    b, h = bh // H, bh % H
    hk = h // GROUP  # GQA: GROUP query heads share a key/value head
    i = m0 + tl.arange(0, BM)
    d = tl.arange(0, BD)
    d_ok = d < D
    q = tl.load(Q + b * sqb + h * sqh + i[:, None] * sqt + d[None, :], mask=(i[:, None] < TQ) & d_ok[None, :],
                other=0.0)  # (BM,BD)
    e = tl.load(E + b)
    rows = ROWS + h * row_len
    k_base, v_base = K + b * skb + hk * skh, V + b * svb + hk * svh
    best = tl.full((BM,), float("-inf"), tl.float32)  # running max, base 2
    total = tl.zeros((BM,), tl.float32)  # running sum of exp2(s - best)
    acc = tl.zeros((BM, BD), tl.float32)
    for n0 in range(0, _key_end(m0, TQ, TK, CAUSAL, BM), BN):
        j = n0 + tl.arange(0, BN)
        j_ok = j < TK
        k_t = tl.load(k_base + j[None, :] * skt + d[:, None], mask=j_ok[None, :] & d_ok[:, None], other=0.0)
        s = _dot(q, k_t, PRECISION, UPCAST) * qk_scale  # (BM,BN)
        s = _bias_and_mask(s, rows, row_len, e, i[:, None], j[None, :], TQ, TK, CAUSAL)
        new_best = tl.maximum(best, tl.max(s, 1))
        p = tl.exp2(s - new_best[:, None])  # (BM,BN)
        correction = tl.exp2(best - new_best)
        total = total * correction + tl.sum(p, 1)
        v = tl.load(v_base + j[:, None] * svt + d[None, :], mask=j_ok[:, None] & d_ok[None, :], other=0.0)
        acc = acc * correction[:, None] + _dot(p.to(v.dtype), v, PRECISION, UPCAST)
        best = new_best
    acc = acc / total[:, None]
    i_ok = i < TQ
    tl.store(OUT + b * sob + h * soh + i[:, None] * sot + d[None, :], acc.to(OUT.dtype.element_ty),
             mask=i_ok[:, None] & d_ok[None, :])
    tl.store(LSE + bh * TQ + i, best + tl.log2(total), mask=i_ok)  # base 2


@triton.jit
def _dkdv(Q, K, V, DO, LSE, DELTA, DK, DV, ROWS, E,
          sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sdob, sdoh, sdot,
          H, GROUP, TQ, TK, D, row_len, qk_scale, scale,
          CAUSAL: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr,
          PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """dK, dV of one key block, (BN,BD); dK/dV are contiguous (B,Hkv,Tk,Dh). Works in the transposed tile
    (keys x queries) so no operand needs a transpose."""
    n0 = tl.program_id(0) * BN
    bhk = tl.program_id(1)
    hkv = H // GROUP
    b, hk = bhk // hkv, bhk % hkv
    j = n0 + tl.arange(0, BN)
    d = tl.arange(0, BD)
    j_ok, d_ok = j < TK, d < D
    kv_mask = j_ok[:, None] & d_ok[None, :]
    k = tl.load(K + b * skb + hk * skh + j[:, None] * skt + d[None, :], mask=kv_mask, other=0.0)  # (BN,BD)
    v = tl.load(V + b * svb + hk * svh + j[:, None] * svt + d[None, :], mask=kv_mask, other=0.0)
    e = tl.load(E + b)
    dk = tl.zeros((BN, BD), tl.float32)
    dv = tl.zeros((BN, BD), tl.float32)
    first = 0
    if CAUSAL:  # the first query that sees key n0 is i = n0 - (Tk - Tq): earlier query blocks are skipped
        first = tl.maximum(n0 - (TK - TQ), 0) // BM * BM
    for g in range(0, GROUP):
        h = hk * GROUP + g
        rows = ROWS + h * row_len
        for m0 in range(first, TQ, BM):
            i = m0 + tl.arange(0, BM)
            i_ok = i < TQ
            q_t = tl.load(Q + b * sqb + h * sqh + i[None, :] * sqt + d[:, None], mask=i_ok[None, :] & d_ok[:, None],
                          other=0.0)  # (BD,BM)
            do = tl.load(DO + b * sdob + h * sdoh + i[:, None] * sdot + d[None, :], mask=i_ok[:, None] & d_ok[None, :],
                         other=0.0)  # (BM,BD)
            lse = tl.load(LSE + (b * H + h) * TQ + i, mask=i_ok, other=0.0)
            delta = tl.load(DELTA + (b * H + h) * TQ + i, mask=i_ok, other=0.0)
            s_t = _dot(k, q_t, PRECISION, UPCAST) * qk_scale  # (BN,BM)
            s_t = _bias_and_mask(s_t, rows, row_len, e, i[None, :], j[:, None], TQ, TK, CAUSAL)
            p_t = tl.where(i_ok[None, :], tl.exp2(s_t - lse[None, :]), 0.0)
            dv += _dot(p_t.to(do.dtype), do, PRECISION, UPCAST)
            dp_t = _dot(v, tl.trans(do), PRECISION, UPCAST)  # (BN,BM)
            ds_t = p_t * (dp_t - delta[None, :])
            dk += _dot(ds_t.to(q_t.dtype), tl.trans(q_t), PRECISION, UPCAST)
    out = (b * hkv + hk) * TK * D + j[:, None] * D + d[None, :]
    tl.store(DK + out, (dk * scale).to(DK.dtype.element_ty), mask=kv_mask)
    tl.store(DV + out, dv.to(DV.dtype.element_ty), mask=kv_mask)


@triton.jit
def _diagonal_sums(ds, BM: tl.constexpr, BN: tl.constexpr):
    """Sums of a (BM,BN) tile along its diagonals c = j - i + BM - 1 (BM <= BN): c in [0, BN) and [BN, 2 BN)."""
    i = tl.arange(0, BM)[:, None]
    t = tl.arange(0, BN)[None, :]
    low_j = t + i - (BM - 1)  # the column of row i on diagonal t
    low = tl.gather(ds, tl.minimum(tl.maximum(low_j, 0), BN - 1), 1)
    low = tl.sum(tl.where((low_j >= 0) & (low_j < BN), low, 0.0), 0)
    high_j = low_j + BN
    high = tl.gather(ds, tl.minimum(high_j, BN - 1), 1)
    high = tl.sum(tl.where(high_j < BN, high, 0.0), 0)
    return low, high


@triton.jit
def _dq(Q, K, V, DO, LSE, DELTA, DQ, ROWS, E, DIAG,
        sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sdob, sdoh, sdot,
        H, GROUP, TQ, TK, D, row_len, diag_len, qk_scale, scale,
        CAUSAL: tl.constexpr, ROW_GRAD: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr,
        PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """dQ of one query block (DQ contiguous (B,H,Tq,Dh)) and, if ROW_GRAD, the diagonal sums of dS into
    DIAG[b, h, block, c] at c = j - i + m0 + BM - 1 (each c written once: no atomics)."""
    m0 = tl.program_id(0) * BM
    bh = tl.program_id(1)
    b, h = bh // H, bh % H
    hk = h // GROUP
    i = m0 + tl.arange(0, BM)
    d = tl.arange(0, BD)
    i_ok, d_ok = i < TQ, d < D
    q_mask = i_ok[:, None] & d_ok[None, :]
    q = tl.load(Q + b * sqb + h * sqh + i[:, None] * sqt + d[None, :], mask=q_mask, other=0.0)  # (BM,BD)
    do = tl.load(DO + b * sdob + h * sdoh + i[:, None] * sdot + d[None, :], mask=q_mask, other=0.0)
    lse = tl.load(LSE + bh * TQ + i, mask=i_ok, other=0.0)
    delta = tl.load(DELTA + bh * TQ + i, mask=i_ok, other=0.0)
    e = tl.load(E + b)
    rows = ROWS + h * row_len
    k_base, v_base = K + b * skb + hk * skh, V + b * svb + hk * svh
    diag = DIAG + (bh * tl.num_programs(0) + tl.program_id(0)) * diag_len
    carry = tl.zeros((BN,), tl.float32)  # the previous tile's upper diagonals: the same c as this tile's lower
    dq = tl.zeros((BM, BD), tl.float32)
    for n0 in range(0, _key_end(m0, TQ, TK, CAUSAL, BM), BN):
        j = n0 + tl.arange(0, BN)
        kv_mask_t = (j[None, :] < TK) & d_ok[:, None]
        k_t = tl.load(k_base + j[None, :] * skt + d[:, None], mask=kv_mask_t, other=0.0)  # (BD,BN)
        v_t = tl.load(v_base + j[None, :] * svt + d[:, None], mask=kv_mask_t, other=0.0)
        s = _dot(q, k_t, PRECISION, UPCAST) * qk_scale  # (BM,BN)
        s = _bias_and_mask(s, rows, row_len, e, i[:, None], j[None, :], TQ, TK, CAUSAL)
        p = tl.where(i_ok[:, None], tl.exp2(s - lse[:, None]), 0.0)
        ds = p * (_dot(do, v_t, PRECISION, UPCAST) - delta[:, None])  # (BM,BN): d loss / d logit
        dq += _dot(ds.to(k_t.dtype), tl.trans(k_t), PRECISION, UPCAST)
        if ROW_GRAD:
            low, high = _diagonal_sums(ds, BM, BN)
            c = n0 + tl.arange(0, BN)
            tl.store(diag + c, low + carry)
            carry = high
    if ROW_GRAD:
        last = tl.cdiv(_key_end(m0, TQ, TK, CAUSAL, BM), BN) * BN
        tl.store(diag + last + tl.arange(0, BN), carry)
    tl.store(DQ + bh * TQ * D + i[:, None] * D + d[None, :], (dq * scale).to(DQ.dtype.element_ty), mask=q_mask)


@triton.jit
def _row_reduce(DIAG, E, DROW, B, H, Q_BLOCKS, diag_len, row_len, BM: tl.constexpr, BR: tl.constexpr):
    """drow[h, r] = sum over b, then query blocks, in that fixed order, of DIAG[b, h, block, c] at
    c = r - e[b] + m0 + BM - 1 (the diagonal of row element r in block m0)."""
    h = tl.program_id(0)
    r = tl.program_id(1) * BR + tl.arange(0, BR)
    acc = tl.zeros((BR,), tl.float32)
    for b in range(0, B):
        e = tl.load(E + b)
        base = DIAG + (b * H + h) * Q_BLOCKS * diag_len
        for block in range(0, Q_BLOCKS):
            c = r - e + block * BM + BM - 1
            acc += tl.load(base + block * diag_len + c, mask=(c >= 0) & (c < diag_len), other=0.0)
    tl.store(DROW + h * row_len + r, acc, mask=r < row_len)


__all__ = ["LOG2E"]
