"""Triton kernels: flash attention whose bias is a piecewise-linear function, per head, of a distance feature
scaled per query (Scheme.piecewise_bias: FIRE's MLP of one input, exactly), evaluated per tile from positions.

    x(b, i, j) = feature[e[b] - i + j] * inv[b, i]          (inv = 1 / divisor, given by the host)
    logit(b, h, i, j) = q_i . k_j / sqrt(Dh) + slope[h, s] x + intercept[h, s],  s = #knots below x

the same form as the native CPU kernel (posenc/nn/csrc/bias_piecewise.h). There, each query row's keys fall into
runs of one segment, because x falls (weakly) as the key moves right. Here a tile is the unit: the feature is
non-increasing in r = e - i + j and inv is positive, so every x of a tile lies between its corner features times
its queries' inv extremes, and the host turns those into each tile's segment range [s_lo, s_hi] (one table per
kernel's tiles, piecewise_attention._segment_table; torch.searchsorted over the knots). A tile starts on segment
s_lo's line and switches to the next line where x passes each knot of its range. A query block's key tiles before
the first that crosses more than one knot (dK/dV: a key block's query tiles after the last) run FAST: a branch
for the one crossing, no knot loop, so Triton's pipeliner keeps the K and V loads in flight (it leaves a loop
holding a loop alone); the rest, and the masked diagonal tiles, loop over their knots. A tile on one segment
costs a load and two fused multiply-adds per pair (the row kernel's: a load and one). Slopes and intercepts
come multiplied by log2(e) (the host's job), so the bias is in the base-2 units of the softmax.

The loop structure, offsets, masks and padding are the row kernel's (attention_kernels.py, whose helpers these
kernels call): the feature comes padded on both sides with its own end values, so every tile reads it unmasked
and the padding keeps the feature non-increasing (the corner bounds stay bounds). Backward without atomics:
  _dkdv: dK, dV per key block and query head (the bias recomputed in the transposed tile);
  _dq:   dQ, and (PARAM_GRAD) the bias's own gradients, each written once per program: dx * inv summed along
         the tile's diagonals (the feature's gradient, reduced by attention_kernels._row_reduce), or, for a feature
         of one parameter theta whose derivative the host gives (BY_PARAMETER: FIRE's c), dx * inv * d feature /
         d theta summed over the block's pairs (one product and a row sum per tile: no diagonal sums, no
         reduction); dx * x summed per query row (inv's gradient, times 1 / inv), and dS and dS * x summed per
         segment (the slopes' and intercepts' gradients; the host adds up programs in a fixed order).
         dx = dS * slope[h, s].
All gradients here are per unit of the natural logit: dS = p (dP - delta), as in the row kernel.
"""

from __future__ import annotations

import triton
import triton.language as tl

from posenc.nn.triton.attention_kernels import (
    _bias,
    _dot,
    _interior_end,
    _key_end,
    _key_scores,
    _key_tile,
    _online_softmax,
    _probabilities,
    _query_phases,
    _query_tile,
    _store_diagonals,
)
from posenc.nn.triton.kernel_prologues import dq_query_block as _dq_rows  # main's lines kept: see kernel_prologues


@triton.jit
def _scalar(ptr, UPCAST: tl.constexpr):
    """A float32 scalar load the software pipeliner leaves alone (it staged each one through shared memory, with
    its address arithmetic: 1.4x the loop's instructions)."""
    if UPCAST:  # the interpreter runs no assembly
        return tl.load(ptr)
    return tl.inline_asm_elementwise("ld.global.nc.f32 $0, [$1];", "=r,l", [ptr], dtype=tl.float32, is_pure=True,
                                     pack=1)


@triton.jit
def _index(ptr, UPCAST: tl.constexpr):
    """An int32 scalar load, as _scalar."""
    if UPCAST:
        return tl.load(ptr)
    return tl.inline_asm_elementwise("ld.global.nc.b32 $0, [$1];", "=r,l", [ptr], dtype=tl.int32, is_pure=True,
                                     pack=1)


@triton.jit
def _biased(s, qk_scale, f, inv, s_lo, s_hi, KNOTS, slope_row, intercept_row, FAST: tl.constexpr,
            UPCAST: tl.constexpr):
    """s qk_scale + slope[seg] x + intercept[seg], x = f inv, for a tile whose segments lie in [s_lo, s_hi]; inv
    broadcasts along the tile's query axis. A tile on one segment: two fused multiply-adds per pair (the slope
    times inv once per query). The scores, not the bias, are carried through the knot loop: they keep the dot's
    layout (a carried bias tile went through shared memory on every tile). FAST: at most one knot crossed (the
    host's promise), a branch instead of the knot loop: Triton's pipeliner leaves a loop that holds a loop alone
    (the K and V loads no longer in flight), and a tile on one segment skips the crossing's instructions."""
    slope = tl.broadcast_to(_scalar(slope_row + s_lo, UPCAST) * inv, f.shape)
    biased = tl.fma(s, qk_scale, tl.fma(f, slope, _scalar(intercept_row + s_lo, UPCAST)))
    if FAST:
        if s_lo < s_hi:
            line = tl.fma(f, tl.broadcast_to(_scalar(slope_row + s_lo + 1, UPCAST) * inv, f.shape),
                          _scalar(intercept_row + s_lo + 1, UPCAST))
            biased = tl.where(f * inv > _scalar(KNOTS + s_lo, UPCAST), tl.fma(s, qk_scale, line), biased)
    else:
        for knot in range(s_lo, s_hi):
            line = tl.fma(f, tl.broadcast_to(_scalar(slope_row + knot + 1, UPCAST) * inv, f.shape),
                          _scalar(intercept_row + knot + 1, UPCAST))
            biased = tl.where(f * inv > _scalar(KNOTS + knot, UPCAST), tl.fma(s, qk_scale, line), biased)
    return biased


@triton.jit
def _slope_and_bias_of(x, s_lo, s_hi, KNOTS, slope_row, intercept_row, FAST: tl.constexpr, UPCAST: tl.constexpr):
    """slope[seg] x + intercept[seg] and the slope of each pair's segment (the backward's d bias / d x)."""
    a = _scalar(slope_row + s_lo, UPCAST) + tl.zeros(x.shape, tl.float32)
    bias = a * x + _scalar(intercept_row + s_lo, UPCAST)
    if FAST:
        if s_lo < s_hi:
            above = x > _scalar(KNOTS + s_lo, UPCAST)
            a_next = _scalar(slope_row + s_lo + 1, UPCAST)
            a = tl.where(above, a_next, a)
            bias = tl.where(above, a_next * x + _scalar(intercept_row + s_lo + 1, UPCAST), bias)
    else:
        for knot in range(s_lo, s_hi):
            above = x > _scalar(KNOTS + knot, UPCAST)
            a_next = _scalar(slope_row + knot + 1, UPCAST)
            a = tl.where(above, a_next, a)
            bias = tl.where(above, a_next * x + _scalar(intercept_row + knot + 1, UPCAST), bias)
    return a, bias


@triton.jit
def _fwd_tiles(acc, best, total, q, k_ptrs, v_ptrs, feature_base, inv, segs, KNOTS, slope_row, intercept_row, i,
               n_start, n_end, TQ, TK, qk_scale, skt, svt, d_ok, CAUSAL: tl.constexpr, MASKED: tl.constexpr,
               FAST: tl.constexpr, EVEN_D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
               PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """Key tiles [n_start, n_end) of one query block (feature_base: the feature at query m0, key 0; segs: the
    block's row of the segment table)."""
    k_ptrs += n_start * skt
    v_ptrs += n_start * svt
    for n0 in range(n_start, n_end, BN):
        j = n0 + tl.arange(0, BN)
        s = _key_scores(q, k_ptrs, j, TK, d_ok, MASKED, EVEN_D, PRECISION, UPCAST)  # (BM,BN)
        tile = feature_base + n0 + (tl.arange(0, BN)[None, :] - tl.arange(0, BM)[:, None])
        f = _bias(tile, UPCAST)  # (BM,BN) the feature of each pair
        s_lo, s_hi = _index(segs + 2 * (n0 // BN), UPCAST), _index(segs + 2 * (n0 // BN) + 1, UPCAST)
        s = _biased(s, qk_scale, f, inv[:, None], s_lo, s_hi, KNOTS, slope_row, intercept_row, FAST, UPCAST)
        acc, best, total, _ = _online_softmax(acc, best, total, s, v_ptrs, i, j, TQ, TK, d_ok, CAUSAL, MASKED,
                                              EVEN_D, PRECISION, UPCAST)
        k_ptrs += BN * skt
        v_ptrs += BN * svt
    return acc, best, total


@triton.jit(do_not_specialize=["n_knots"])  # 1 knot would make it a constant
def _forward(Q, K, V, OUT, LSE, FEATURE, E, INV, SEGS, SPLIT, KNOTS, SLOPE, INTERCEPT,
             sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sob, soh, sot,
             H, GROUP, TQ, TK, inv_stride_b, NQ, NK, n_knots, qk_scale,
             D: tl.constexpr, CAUSAL: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr,
             PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """INV (B|1,Tq) with batch stride inv_stride_b; SEGS (B, NQ, NK, 2) int32: each tile's segment range;
    SPLIT (B, NQ): the first key tile crossing more than one knot; SLOPE, INTERCEPT (H, n_knots + 1) contiguous;
    KNOTS (n_knots + 1,) ending in +inf."""
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
    k_ptrs = K + b * skb + hk * skh + jl[None, :] * skt + d[:, None]  # (BD,BN) at key 0
    v_ptrs = V + b * svb + hk * svh + jl[:, None] * svt + d[None, :]  # (BN,BD)
    feature_base = FEATURE + tl.load(E + b) - m0  # the feature at query m0, key 0
    inv = tl.load(INV + b * inv_stride_b + tl.minimum(i, TQ - 1))  # (BM,) padded rows: the last query's
    block = b * NQ + tl.program_id(0)
    segs = SEGS + block * NK * 2
    slope_row, intercept_row = SLOPE + h * (n_knots + 1), INTERCEPT + h * (n_knots + 1)
    best = tl.full((BM,), float("-inf"), tl.float32)
    total = tl.zeros((BM,), tl.float32)
    acc = tl.zeros((BM, BD), tl.float32)
    interior = _interior_end(m0, TQ, TK, CAUSAL, BM, BN)
    fast_end = tl.minimum(tl.load(SPLIT + block) * BN, interior)
    acc, best, total = _fwd_tiles(acc, best, total, q, k_ptrs, v_ptrs, feature_base, inv, segs, KNOTS, slope_row,
                                  intercept_row, i, 0, fast_end, TQ, TK, qk_scale, skt, svt, d_ok, CAUSAL, False,
                                  True, BD == D, BM, BN, PRECISION, UPCAST)
    acc, best, total = _fwd_tiles(acc, best, total, q, k_ptrs, v_ptrs, feature_base, inv, segs, KNOTS, slope_row,
                                  intercept_row, i, fast_end, interior, TQ, TK, qk_scale, skt, svt, d_ok, CAUSAL,
                                  False, False, BD == D, BM, BN, PRECISION, UPCAST)
    acc, best, total = _fwd_tiles(acc, best, total, q, k_ptrs, v_ptrs, feature_base, inv, segs, KNOTS, slope_row,
                                  intercept_row, i, interior, _key_end(m0, TQ, TK, CAUSAL, BM), TQ, TK, qk_scale, skt,
                                  svt, d_ok, CAUSAL, True, False, BD == D, BM, BN, PRECISION, UPCAST)
    acc = acc / total[:, None]
    tl.store(OUT + b * sob + h * soh + i[:, None] * sot + d[None, :], acc.to(OUT.dtype.element_ty),
             mask=i_ok[:, None] & d_ok[None, :])
    tl.store(LSE + (b * H + h) * TQ + i, best + tl.log2(total), mask=i_ok)  # base 2


@triton.jit
def _dkdv_tiles(dk, dv, k, v, q_ptrs, do_ptrs, lse_ptrs, delta_ptrs, inv_ptrs, segs, feature_base, KNOTS,
                slope_row, intercept_row, j, m_start, m_end, TQ, TK, NK, qk_scale, sqt, sdot, d_ok,
                CAUSAL: tl.constexpr, MASKED: tl.constexpr, FAST: tl.constexpr, EVEN_D: tl.constexpr,
                BM: tl.constexpr, BN: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """Query tiles [m_start, m_end) against one key block, in the transposed tile (keys x queries);
    feature_base: the feature at key n0, query 0; segs: the segment table at query block 0 and this key block."""
    q_ptrs += m_start * sqt
    do_ptrs += m_start * sdot
    lse_ptrs += m_start
    delta_ptrs += m_start
    for m0 in range(m_start, m_end, BM):
        i = m0 + tl.arange(0, BM)
        q_t, do, lse, delta = _query_tile(q_ptrs, do_ptrs, lse_ptrs, delta_ptrs, i, TQ, d_ok, MASKED, EVEN_D)
        inv = tl.load(inv_ptrs + tl.minimum(i, TQ - 1))  # (BM,)
        s_t = _dot(k, q_t, PRECISION, UPCAST)  # (BN,BM)
        tile = feature_base - m0 + (tl.arange(0, BN)[:, None] - tl.arange(0, BM)[None, :])  # (BN,BM)
        f_t = _bias(tile, UPCAST)
        seg = segs + (m0 // BM) * NK * 2
        s_lo, s_hi = _index(seg, UPCAST), _index(seg + 1, UPCAST)
        s_t = _biased(s_t, qk_scale, f_t, inv[None, :], s_lo, s_hi, KNOTS, slope_row, intercept_row, FAST, UPCAST)
        p_t = _probabilities(s_t, lse[None, :], i[None, :], j[:, None], TQ, TK, CAUSAL, MASKED)  # (BN,BM)
        dv += _dot(p_t.to(do.dtype), do, PRECISION, UPCAST)
        dp_t = _dot(v, tl.trans(do), PRECISION, UPCAST)  # (BN,BM)
        ds_t = p_t * (dp_t - delta[None, :])
        dk += _dot(ds_t.to(q_t.dtype), tl.trans(q_t), PRECISION, UPCAST)
        q_ptrs += BM * sqt
        do_ptrs += BM * sdot
        lse_ptrs += BM
        delta_ptrs += BM
    return dk, dv


@triton.jit(do_not_specialize=["n_knots"])  # 1 knot would make it a constant
def _dkdv(Q, K, V, DO, LSE, DELTA, DK, DV, FEATURE, E, INV, SEGS, SPLIT, KNOTS, SLOPE, INTERCEPT,
          sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sdob, sdoh, sdot,
          H, GROUP, TQ, TK, inv_stride_b, NQ, NK, n_knots, qk_scale, scale,
          D: tl.constexpr, CAUSAL: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr,
          PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """dK, dV of one key block for query head h into DK/DV contiguous (B,H,Tk,Dh); SEGS (B, NQ, NK, 2) for this
    kernel's tiles, SPLIT (B, NK): one past the last query block whose tile crosses more than one knot."""
    n0 = tl.program_id(0) * BN
    h = tl.program_id(1).to(tl.int64)
    b = tl.program_id(2).to(tl.int64)
    hk = h // GROUP
    j = n0 + tl.arange(0, BN)
    il = tl.arange(0, BM)
    d = tl.arange(0, BD)
    j_ok, d_ok = j < TK, d < D
    kv_mask = j_ok[:, None] & d_ok[None, :]
    k = tl.load(K + b * skb + hk * skh + j[:, None] * skt + d[None, :], mask=kv_mask, other=0.0)  # (BN,BD)
    v = tl.load(V + b * svb + hk * svh + j[:, None] * svt + d[None, :], mask=kv_mask, other=0.0)
    bh = b * H + h
    q_ptrs = Q + b * sqb + h * sqh + il[None, :] * sqt + d[:, None]  # (BD,BM) at query 0
    do_ptrs = DO + b * sdob + h * sdoh + il[:, None] * sdot + d[None, :]  # (BM,BD)
    lse_ptrs = LSE + bh * TQ + il
    delta_ptrs = DELTA + bh * TQ + il
    feature_base = FEATURE + tl.load(E + b) + n0  # the feature at key n0, query 0
    inv_ptrs = INV + b * inv_stride_b
    segs = SEGS + (b * NQ * NK + tl.program_id(0)) * 2
    slope_row, intercept_row = SLOPE + h * (n_knots + 1), INTERCEPT + h * (n_knots + 1)
    dk = tl.zeros((BN, BD), tl.float32)
    dv = tl.zeros((BN, BD), tl.float32)
    first, full, last = _query_phases(n0, TQ, TK, CAUSAL, BM, BN)
    fast_start = tl.minimum(tl.maximum(tl.load(SPLIT + b * NK + tl.program_id(0)) * BM, full), last)
    dk, dv = _dkdv_tiles(dk, dv, k, v, q_ptrs, do_ptrs, lse_ptrs, delta_ptrs, inv_ptrs, segs, feature_base, KNOTS,
                         slope_row, intercept_row, j, first, full, TQ, TK, NK, qk_scale, sqt, sdot, d_ok, CAUSAL,
                         True, False, BD == D, BM, BN, PRECISION, UPCAST)
    dk, dv = _dkdv_tiles(dk, dv, k, v, q_ptrs, do_ptrs, lse_ptrs, delta_ptrs, inv_ptrs, segs, feature_base, KNOTS,
                         slope_row, intercept_row, j, full, fast_start, TQ, TK, NK, qk_scale, sqt, sdot, d_ok,
                         CAUSAL, False, False, BD == D, BM, BN, PRECISION, UPCAST)
    dk, dv = _dkdv_tiles(dk, dv, k, v, q_ptrs, do_ptrs, lse_ptrs, delta_ptrs, inv_ptrs, segs, feature_base, KNOTS,
                         slope_row, intercept_row, j, fast_start, last, TQ, TK, NK, qk_scale, sqt, sdot, d_ok,
                         CAUSAL, False, True, BD == D, BM, BN, PRECISION, UPCAST)
    dk, dv = _dkdv_tiles(dk, dv, k, v, q_ptrs, do_ptrs, lse_ptrs, delta_ptrs, inv_ptrs, segs, feature_base, KNOTS,
                         slope_row, intercept_row, j, last, TQ, TQ, TK, NK, qk_scale, sqt, sdot, d_ok, CAUSAL,
                         True, False, BD == D, BM, BN, PRECISION, UPCAST)
    out = (bh * TK + j[:, None]) * D + d[None, :]
    tl.store(DK + out, (dk * scale).to(DK.dtype.element_ty), mask=kv_mask)
    tl.store(DV + out, dv.to(DV.dtype.element_ty), mask=kv_mask)


@triton.jit
def _segment_sums(seg_ds, seg_dsx, ds, dsx, x, s_lo, s_hi, KNOTS, SEGMENTS: tl.constexpr, FAST: tl.constexpr,
                  UPCAST: tl.constexpr):
    """Add the tile's dS and dS x per segment: all to s_lo, then what lies above each crossed knot moves up one."""
    index = tl.arange(0, SEGMENTS)
    seg_ds += tl.where(index == s_lo, tl.sum(tl.sum(ds, 1), 0), 0.0)
    seg_dsx += tl.where(index == s_lo, tl.sum(tl.sum(dsx, 1), 0), 0.0)
    if FAST:  # at most one knot: a branch, not a loop (see _biased)
        if s_lo < s_hi:
            above = x > _scalar(KNOTS + s_lo, UPCAST)
            moved = tl.sum(tl.sum(tl.where(above, ds, 0.0), 1), 0)
            moved_x = tl.sum(tl.sum(tl.where(above, dsx, 0.0), 1), 0)
            seg_ds += tl.where(index == s_lo + 1, moved, tl.where(index == s_lo, -moved, 0.0))
            seg_dsx += tl.where(index == s_lo + 1, moved_x, tl.where(index == s_lo, -moved_x, 0.0))
    else:
        for knot in range(s_lo, s_hi):
            above = x > _scalar(KNOTS + knot, UPCAST)
            moved = tl.sum(tl.sum(tl.where(above, ds, 0.0), 1), 0)
            moved_x = tl.sum(tl.sum(tl.where(above, dsx, 0.0), 1), 0)
            seg_ds += tl.where(index == knot + 1, moved, tl.where(index == knot, -moved, 0.0))
            seg_dsx += tl.where(index == knot + 1, moved_x, tl.where(index == knot, -moved_x, 0.0))
    return seg_ds, seg_dsx


@triton.jit
def _dq_tiles(dq, feature_sums, d_inv, seg_ds, seg_dsx, q, do, lse, delta, k_ptrs, v_ptrs, feature_base,
              derivative_base, inv, segs, KNOTS, slope_row, intercept_row, diag, i, n_start, n_end, TQ, TK, qk_scale,
              skt, svt, d_ok, CAUSAL: tl.constexpr, MASKED: tl.constexpr, FAST: tl.constexpr,
              PARAM_GRAD: tl.constexpr, BY_PARAMETER: tl.constexpr, EVEN_D: tl.constexpr, BM: tl.constexpr,
              BN: tl.constexpr, SEGMENTS: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """Key tiles [n_start, n_end) of one query block: dQ and (PARAM_GRAD) the bias's gradient sums; feature_sums:
    the diagonal sums' carry (BN,), or (BY_PARAMETER) dx * d feature / d theta summed per query row (BM,)."""
    k_ptrs += n_start * skt
    v_ptrs += n_start * svt
    for n0 in range(n_start, n_end, BN):
        j = n0 + tl.arange(0, BN)
        k_t, v_t = _key_tile(k_ptrs, v_ptrs, j, TK, d_ok, MASKED, EVEN_D)
        s = _dot(q, k_t, PRECISION, UPCAST)  # (BM,BN)
        tile = feature_base + n0 + (tl.arange(0, BN)[None, :] - tl.arange(0, BM)[:, None])
        f = _bias(tile, UPCAST)
        x = f * inv[:, None]  # (BM,BN)
        s_lo, s_hi = _index(segs + 2 * (n0 // BN), UPCAST), _index(segs + 2 * (n0 // BN) + 1, UPCAST)
        if PARAM_GRAD:
            a, bias = _slope_and_bias_of(x, s_lo, s_hi, KNOTS, slope_row, intercept_row, FAST, UPCAST)
            s = tl.fma(s, qk_scale, bias)
        else:
            s = _biased(s, qk_scale, f, inv[:, None], s_lo, s_hi, KNOTS, slope_row, intercept_row, FAST, UPCAST)
        p = _probabilities(s, lse[:, None], i[:, None], j[None, :], TQ, TK, CAUSAL, MASKED)  # (BM,BN)
        ds = p * (_dot(do, v_t, PRECISION, UPCAST) - delta[:, None])  # (BM,BN): d loss / d logit
        dq += _dot(ds.to(k_t.dtype), tl.trans(k_t), PRECISION, UPCAST)
        if PARAM_GRAD:
            dx = ds * a  # base-2 slopes: the host multiplies every sum here by ln 2
            dsx = ds * x
            d_inv += tl.sum(dx * x, 1)
            if BY_PARAMETER:  # times inv once per row, at the end
                derivative = _bias(derivative_base + n0 + (tl.arange(0, BN)[None, :] - tl.arange(0, BM)[:, None]),
                                   UPCAST)
                feature_sums += tl.sum(dx * derivative, 1)
            else:
                feature_sums = _store_diagonals(diag, n0, dx * inv[:, None], feature_sums, BM, BN)
            seg_ds, seg_dsx = _segment_sums(seg_ds, seg_dsx, ds, dsx, x, s_lo, s_hi, KNOTS, SEGMENTS, FAST, UPCAST)
        k_ptrs += BN * skt
        v_ptrs += BN * svt
    return dq, feature_sums, d_inv, seg_ds, seg_dsx


@triton.jit(do_not_specialize=["n_knots"])  # 1 knot would make it a constant
def _dq(Q, K, V, DO, LSE, DELTA, DQ, FEATURE, DERIVATIVE, E, INV, SEGS, SPLIT, KNOTS, SLOPE, INTERCEPT, DIAG, DINV,
        SEG, sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sdob, sdoh, sdot,
        H, GROUP, TQ, TK, inv_stride_b, NQ, NK, n_knots, diag_len, qk_scale, scale,
        D: tl.constexpr, CAUSAL: tl.constexpr, PARAM_GRAD: tl.constexpr, BY_PARAMETER: tl.constexpr,
        BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr, SEGMENTS: tl.constexpr, PRECISION: tl.constexpr,
        UPCAST: tl.constexpr):
    """dQ of one query block (DQ contiguous (B,H,Tq,Dh)) and, if PARAM_GRAD: the feature's gradient, as
    DIAG[b, h, block, c] the row kernel's diagonal sums of dx * inv (BM <= BN), or (BY_PARAMETER) as
    DIAG[b, h, block, 0] = sum over the block's pairs of dx * inv * DERIVATIVE[r] (the feature's one parameter's;
    DERIVATIVE indexed and padded as FEATURE); DINV[b, h, i] = sum_j dx x / inv; SEG[b, h, block, 0 or 1, s] = the
    sums of dS and dS x over segment s."""
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
    k_ptrs = K + b * skb + hk * skh + jl[None, :] * skt + d[:, None]  # (BD,BN) at key 0
    v_ptrs = V + b * svb + hk * svh + jl[None, :] * svt + d[:, None]
    e = tl.load(E + b)
    feature_base = FEATURE + e - m0  # the feature at query m0, key 0
    derivative_base = DERIVATIVE + e - m0  # its derivative likewise
    inv = tl.load(INV + b * inv_stride_b + tl.minimum(i, TQ - 1))  # (BM,)
    block = b * NQ + tl.program_id(0)
    segs = SEGS + block * NK * 2
    slope_row, intercept_row = SLOPE + h * (n_knots + 1), INTERCEPT + h * (n_knots + 1)
    program = bh * tl.num_programs(0) + tl.program_id(0)
    diag = DIAG + program * diag_len
    feature_sums = tl.zeros((BM,) if BY_PARAMETER else (BN,), tl.float32)
    d_inv = tl.zeros((BM,), tl.float32)
    seg_ds = tl.zeros((SEGMENTS,), tl.float32)
    seg_dsx = tl.zeros((SEGMENTS,), tl.float32)
    dq = tl.zeros((BM, BD), tl.float32)
    interior = _interior_end(m0, TQ, TK, CAUSAL, BM, BN)
    end = _key_end(m0, TQ, TK, CAUSAL, BM)
    fast_end = tl.minimum(tl.load(SPLIT + block) * BN, interior)
    dq, feature_sums, d_inv, seg_ds, seg_dsx = _dq_tiles(
        dq, feature_sums, d_inv, seg_ds, seg_dsx, q, do, lse, delta, k_ptrs, v_ptrs, feature_base, derivative_base,
        inv, segs, KNOTS, slope_row, intercept_row, diag, i, 0, fast_end, TQ, TK, qk_scale, skt, svt, d_ok, CAUSAL,
        False, True, PARAM_GRAD, BY_PARAMETER, BD == D, BM, BN, SEGMENTS, PRECISION, UPCAST)
    dq, feature_sums, d_inv, seg_ds, seg_dsx = _dq_tiles(
        dq, feature_sums, d_inv, seg_ds, seg_dsx, q, do, lse, delta, k_ptrs, v_ptrs, feature_base, derivative_base,
        inv, segs, KNOTS, slope_row, intercept_row, diag, i, fast_end, interior, TQ, TK, qk_scale, skt, svt, d_ok,
        CAUSAL, False, False, PARAM_GRAD, BY_PARAMETER, BD == D, BM, BN, SEGMENTS, PRECISION, UPCAST)
    dq, feature_sums, d_inv, seg_ds, seg_dsx = _dq_tiles(
        dq, feature_sums, d_inv, seg_ds, seg_dsx, q, do, lse, delta, k_ptrs, v_ptrs, feature_base, derivative_base,
        inv, segs, KNOTS, slope_row, intercept_row, diag, i, interior, end, TQ, TK, qk_scale, skt, svt, d_ok, CAUSAL,
        True, False, PARAM_GRAD, BY_PARAMETER, BD == D, BM, BN, SEGMENTS, PRECISION, UPCAST)
    if PARAM_GRAD:
        if BY_PARAMETER:  # padded rows summed nothing (their p is 0)
            tl.store(diag, tl.sum(feature_sums * inv, 0))
        else:
            tl.store(diag + tl.cdiv(end, BN) * BN + tl.arange(0, BN), feature_sums)
        tl.store(DINV + bh * TQ + i, d_inv / inv, mask=i_ok)
        segments = SEG + program * 2 * SEGMENTS + tl.arange(0, SEGMENTS)
        tl.store(segments, seg_ds)
        tl.store(segments + SEGMENTS, seg_dsx)
    tl.store(DQ + (bh * TQ + i[:, None]) * D + d[None, :], (dq * scale).to(DQ.dtype.element_ty), mask=q_mask)


__all__: list[str] = []
