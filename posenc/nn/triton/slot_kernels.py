"""Triton kernels: the static decode step's attention under a position map over every slot of a fixed-size cache
(posenc.nn.static_attention.map_slot_attention's math, flash-decoding's form; posenc/nn/triton/slots.py launches).

    picked(h, j) = max_m (q_m(h) . k_j + mask(m, j)),   out(h) = softmax_j(picked(h, .)) v

One program per (share of the slots, KV head, batch row) holds the g*(M+1) query rows of its KV head (every map's
rotated query of each of its g query heads, W wide), and per block of BN slots: one product scores every slot under
every map, the mask (0 where map m scores slot j, -inf elsewhere) picks each slot's map by the max over the maps, and
one online softmax (FlashAttention-2's, base 2) folds the values in, in float32. Under a map that scores few slots
(SKIP) a block no map scores reads none of its keys and values. Each share writes its running max,
sum and unnormalised output; _merge_shares merges them (flash-decoding: Dao et al. 2023, "Flash-Decoding for
long-context inference").

Rows: r = gi * MP + m (gi < GP the query head of the group, m < MP the map, each padded to a power of 2, GP * MP >= 16
for tl.dot). The max over the maps is taken on (GP, MP, BN) and broadcast back to every row of its group, so the
softmax and the values' product keep R rows (identical within a group): no tile below tl.dot's 16 rows, and the
extra exponentials are a few hundred per block against the block's 2 * BN * (W + Dh) bytes read.
"""

from __future__ import annotations

import triton
import triton.language as tl

from posenc.nn.triton.attention_kernels import LOG2E, _dot, _fold_values, _softmax_step

BASE2 = tl.constexpr(LOG2E)  # the scores (natural log) in base 2, as the online softmax takes them


@triton.jit
def _slot_forward(Q, K, V, MASK, ACC, BEST, TOTAL,
                  sqb, sqh, sqm, skb, skh, skl, svb, svh, svl, smb, smm,
                  B, H, GROUP, MAPS, L, W, SHARE,
                  D: tl.constexpr, BW: tl.constexpr, BD: tl.constexpr, GP: tl.constexpr, MP: tl.constexpr,
                  BN: tl.constexpr, EVEN: tl.constexpr, SKIP: tl.constexpr, PRECISION: tl.constexpr,
                  UPCAST: tl.constexpr):
    """Q (B,H,M+1,W), K (B,Hkv,L,W), V (B,Hkv,L,D), MASK (B|1,M+1,L) in the model's dtype, each with unit stride in
    its last dim; ACC (S,B,H,D), BEST and TOTAL (S,B,H) float32: per share, the output before the division by the
    sum, the running max (base 2) and the sum. EVEN: L is a multiple of BN and W, D fill BW, BD (no masked load).
    SKIP: a block no map scores loads none of its keys and values, their loads masked off by the block's mask, read
    first (the loop then keeps no software pipeline: only maps that score few slots take it, slots.plan)."""
    share = tl.program_id(0)
    hk = tl.program_id(1).to(tl.int64)
    b = tl.program_id(2).to(tl.int64)
    R: tl.constexpr = GP * MP
    r = tl.arange(0, R)
    gi = r // MP
    m = r % MP
    h = hk * GROUP + gi  # (R,) each row's query head
    w = tl.arange(0, BW)
    d = tl.arange(0, BD)
    maps = tl.arange(0, MP)
    q = tl.load(Q + b * sqb + h[:, None] * sqh + m[:, None] * sqm + w[None, :],
                mask=(gi < GROUP)[:, None] & (m < MAPS)[:, None] & (w < W)[None, :], other=0.0)  # (R,BW)
    best = tl.full((R,), float("-inf"), tl.float32)
    total = tl.zeros((R,), tl.float32)
    acc = tl.zeros((R, BD), tl.float32)
    k_base = K + b * skb + hk * skh
    v_base = V + b * svb + hk * svh
    m_base = MASK + b * smb
    start = share * SHARE
    end = tl.minimum(L, start + SHARE)
    for n0 in range(start, end, BN):
        j = n0 + tl.arange(0, BN)
        j_ok = j < end
        if EVEN:
            bias = tl.load(m_base + maps[:, None] * smm + j[None, :], mask=(maps < MAPS)[:, None],
                           other=float("-inf"))  # (MP,BN)
        else:
            bias = tl.load(m_base + maps[:, None] * smm + j[None, :], mask=(maps < MAPS)[:, None] & j_ok[None, :],
                           other=float("-inf"))
        if SKIP:  # the slots read: none where no map scores the block (its scores are -inf whatever the keys hold)
            j_ok = j < tl.where(tl.max(tl.max(bias.to(tl.float32), 1), 0) > float("-inf"), end, 0)
        if EVEN and not SKIP:
            kt = tl.load(k_base + j[None, :] * skl + w[:, None])  # (BW,BN)
            v = tl.load(v_base + j[:, None] * svl + d[None, :])  # (BN,BD)
        else:
            kt = tl.load(k_base + j[None, :] * skl + w[:, None], mask=(w < W)[:, None] & j_ok[None, :], other=0.0)
            v = tl.load(v_base + j[:, None] * svl + d[None, :], mask=j_ok[:, None] & (d < D)[None, :], other=0.0)
        s = _dot(q, kt, PRECISION, UPCAST)  # (R,BN) every map's score of every slot
        s = tl.reshape(s, (GP, MP, BN)) + bias.to(tl.float32)[None, :, :]
        picked = tl.max(s, 1, keep_dims=True)  # (GP,1,BN): each slot under the map that scores it, else -inf
        picked = tl.reshape(tl.broadcast_to(picked, (GP, MP, BN)), (R, BN)) * BASE2
        prob, correction, best, total = _softmax_step(best, total, picked, True)  # a block may score no slot
        acc = _fold_values(acc, correction, prob, v, PRECISION, UPCAST)
    keep = (m == 0) & (gi < GROUP)  # one row per query head
    row = (share * B + b) * H + h  # (R,)
    tl.store(ACC + row[:, None] * D + d[None, :], acc, mask=keep[:, None] & (d < D)[None, :])
    tl.store(BEST + row, best, mask=keep)
    tl.store(TOTAL + row, total, mask=keep)


@triton.jit
def _merge_shares(ACC, BEST, TOTAL, OUT, ROWS, SHARES, D: tl.constexpr, BD: tl.constexpr, BS: tl.constexpr):
    """One program per (batch row, head) = row: its SHARES shares (ACC (S,ROWS,D), BEST, TOTAL (S,ROWS) float32)
    merged by their maxima, BS shares at a time -> OUT (ROWS,D) in the output's dtype. A share that scored no slot
    (max -inf, sum 0) weighs 0."""
    row = tl.program_id(0).to(tl.int64)
    s = tl.arange(0, BS)
    d = tl.arange(0, BD)
    top = tl.full((1,), float("-inf"), tl.float32)
    total = tl.zeros((1,), tl.float32)
    acc = tl.zeros((1, BD), tl.float32)
    for s0 in range(0, SHARES, BS):
        ok = s0 + s < SHARES
        best = tl.load(BEST + (s0 + s) * ROWS + row, mask=ok, other=float("-inf"))  # (BS,)
        new_top = tl.maximum(top, tl.max(best, 0))
        shift = tl.where(new_top == float("-inf"), 0.0, new_top)  # (1,)
        weight = tl.exp2(best - shift)  # (BS,) 0 for an empty share
        part = tl.load(ACC + ((s0 + s) * ROWS + row)[:, None] * D + d[None, :], mask=ok[:, None] & (d < D)[None, :],
                       other=0.0)  # (BS,BD)
        sums = tl.load(TOTAL + (s0 + s) * ROWS + row, mask=ok, other=0.0)
        scale = tl.exp2(top - shift)
        total = total * scale + tl.sum(sums * weight, 0)
        acc = acc * scale[:, None] + tl.sum(part * weight[:, None], 0)[None, :]
        top = new_top
    out = acc / total[:, None]
    tl.store(OUT + row * D + d[None, :], out.to(OUT.dtype.element_ty), mask=(d < D)[None, :])
