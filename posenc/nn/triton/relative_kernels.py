"""Triton kernels: flash attention with rows per query built per tile from a table (Scheme.relative_table: Shaw's
clipped key and value tables, Transformer-XL's projected sinusoid), forward and backward.

    logit(b, h, i, j) = qc_i . k_j / sqrt(Dh) + row_scale * qr_i . R[h, c]         c = clamp(j - i + e[b], 0, S-1)
    out_i             = sum_j p_ij (v_j + VT[c])                                      (HAS_VALUES: Shaw's eq. 3)

qc and qr are two queries of one head (Transformer-XL: q + u and q + v; Shaw: q twice). No (Tq, Tk) tensor and no
(Tq, S) rows exist: a tile of BM queries and BN keys spans BM + BN - 1 distances, c0 - BM + 1 .. c0 + BN - 1 at
c0 = n0 - m0 + e, so it multiplies qr by two chunks of BN table rows, [c0 - BN, c0) and [c0, c0 + BN) (BM <= BN),
and reads each pair's product at its distance with a gather (_rotated). Along a query block's key loop the chunks
move by BN per tile, so the forward and dQ carry the upper chunk over as the next tile's lower one: one product
qr . R per tile, as many as q . k. A forward query block may be two key tiles tall (BM = 2 BN, Transformer-XL at
Dh 128: 64 rows, the wgmma's height, where 32 x 32 ran mma.sync at 4x Dh 64's instructions per pair): its rows span
three chunks, two carried (_rotated_stacked). dK/dV recomputes both chunks per query tile (qr changes with it);
where BM <= BN / 4 the lower one is BM rows wide (_rotated_narrow). The table's rows are read clamped, which is
Shaw's clipping (many distances of a tile collapse onto the first or last row) and costs nothing for Transformer-XL
(its table covers every distance). The value term goes the other way: the probabilities regrouped by distance
(_unrotated) times the value table's two chunks.

Far tiles (FAR, a clipped table: Shaw): where every pair of a tile lies at c <= 0 (causal attention away from the
diagonal: most tiles at long T), every pair reads row 0, so the bias is one number per query and the value term
is the tile's mass times VT[0]. Those tiles run first, in passes of their own at the row kernel's tiles
(relative_far_kernels.py: 128 x 64 where these programs take 32 x 32, ~5x fewer instructions per pair), and these
programs start from their float32 partials: the forward from their O and log-sum-exp plus the row's bias and
VT[0]; dQ and dK/dV from their gradients, which the backward's far passes compute from the log-sum-exp less that
bias and delta less dO . VT[0]. Each program here skips exactly the far tiles of the far block that holds it.

Gradients: dK, dV in _dkdv (one program per key block, like attention_kernels._dkdv); dQc, dQr, and the tables'
gradients in _dq (one program per query block). A table row gathers from every query block, so those add up with
float32 atomics (_add_rows: distances past either end of the table summed in registers first). Loops, masks,
base-2 softmax: as attention_kernels (its helpers are reused here). Offsets: the (b, h) base once per program, each
tile's addresses formed in its loop from int32 offsets (distances in int32 too).
"""

from __future__ import annotations

import triton
import triton.language as tl

from posenc.nn.triton import kernel_prologues as prologue
from posenc.nn.triton.attention_kernels import (
    _dot,
    _forward_key_tile,
    _interior_end,
    _key_end,
    _key_tile,
    _online_softmax,
    _probabilities,
    _query_phases,
)
from posenc.nn.triton.relative_far_kernels import far_keys, far_queries


@triton.jit
def _chunk_t(T, c0, S, srow, d, d_ok, BN: tl.constexpr):
    """Table rows clamp(c0 .. c0 + BN - 1, 0, S - 1), transposed: (BD,BN)."""
    c = tl.minimum(tl.maximum(c0 + tl.arange(0, BN), 0), S - 1)
    return tl.load(T + c[None, :] * srow + d[:, None], mask=d_ok[:, None], other=0.0)


@triton.jit
def _chunk(T, c0, S, srow, d, d_ok, BN: tl.constexpr):
    """Table rows clamp(c0 .. c0 + BN - 1, 0, S - 1): (BN,BD)."""
    c = tl.minimum(tl.maximum(c0 + tl.arange(0, BN), 0), S - 1)
    return tl.load(T + c[:, None] * srow + d[None, :], mask=d_ok[None, :], other=0.0)


@triton.jit
def _dot_into(a, b, acc, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """acc + a @ b. The bias enters as the product's accumulator: Triton's layout pass then keeps the softmax in
    the product's layout (added after the product, the gather's layout spread into the softmax, which it then
    computed twice)."""
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc=acc, input_precision=PRECISION)
    return tl.dot(a, b, acc=acc, input_precision=PRECISION)


@triton.jit
def _rotated(low, high, BM: tl.constexpr, BN: tl.constexpr, zero=0):
    """Per-distance products (BM,BN) of the chunks [c0 - BN, c0) (low) and [c0, c0 + BN) (high) read at each
    pair's distance: entry (il, jl) is high[il, jl - il] where jl >= il, else low[il, BN + jl - il]. Both columns
    are (jl - il) mod BN, and row il reads column r of high where r + il < BN, of low elsewhere: one select in the
    products' own layout, then one gather (a rotation of each row by il), not a gather per chunk."""
    r_il = tl.arange(0, BN)[None, :] + tl.arange(0, BM)[:, None]  # r + il
    t = tl.arange(0, BN)[None, :] - tl.arange(0, BM)[:, None] + zero  # jl - il
    return tl.gather(tl.where(r_il < BN, high, low), tl.where(t >= 0, t, t + BN), 1)


@triton.jit
def _rotated_narrow(low, high, BM: tl.constexpr, BN: tl.constexpr):
    """_rotated with the lower chunk only as wide as the tile is tall: low (BM,BM) over [c0 - BM, c0), high (BM,BN)
    over [c0, c0 + BN); entry (il, jl) is high[il, jl - il] where jl >= il, else low[il, BM + jl - il]. Two gathers,
    one product of BM x BM instead of BM x BN (a key block's tile in dK/dV: BM < BN)."""
    t = tl.arange(0, BN)[None, :] - tl.arange(0, BM)[:, None]  # jl - il
    upper = tl.gather(high, tl.maximum(t, 0), 1)
    lower = tl.gather(low, tl.minimum(t + BM, BM - 1), 1)
    return tl.where(t >= 0, upper, lower)


@triton.jit
def _rotated_stacked(lowest, low, high, BM: tl.constexpr, BN: tl.constexpr, zero=0):
    """_rotated for a tile of two stacked BN x BN blocks (BM = 2 BN): rows il = a BN + b span BM + BN - 1
    distances, three chunks: [c0 - 2 BN, c0 - BN) (lowest), [c0 - BN, c0) (low), [c0, c0 + BN) (high). Row il reads
    column r of the chunk a below high's where r + b < BN, of the one below that elsewhere, rotated by b."""
    b = tl.arange(0, BM)[:, None] % BN
    top = tl.arange(0, BM)[:, None] < BN  # a = 0
    r_b = tl.arange(0, BN)[None, :] + b  # r + b
    t = tl.arange(0, BN)[None, :] - b + zero  # jl - b
    chunk = tl.where(r_b < BN, tl.where(top, high, low), tl.where(top, low, lowest))
    return tl.gather(chunk, tl.where(t >= 0, t, t + BN), 1)


@triton.jit
def _opaque_zero(x, BM: tl.constexpr, BN: tl.constexpr, UPCAST: tl.constexpr):
    """A (BM,BN) int32 zero the compiler cannot see through, made from x (a loop's variable): added to a gather's
    index, it keeps the index (and the gather's per-element lane arithmetic) inside the loop. Hoisted, they held
    a register per element: Transformer-XL's 64x64 forward at 4 warps spilled 224 B (sm_90, bf16 Dh 64); recomputed,
    none, at 0.72 instructions per pair and warp against 8 warps' 1.10 (whose products M = 64 left half the warps
    idle). The interpreter runs no assembly: a plain zero there."""
    if UPCAST:
        return tl.zeros((BM, BN), tl.int32)
    return tl.inline_asm_elementwise("mov.b32 $0, 0;", "=r,r", [x + tl.zeros((BM, BN), tl.int32)], dtype=tl.int32,
                                     is_pure=True, pack=1)


@triton.jit
def _rotate_back(x, BM: tl.constexpr, BN: tl.constexpr):
    """x (BM,BN) by distance, one gather: entry (il, t) is x[il, (il + t) mod BN], the pair at distance c0 + t
    where il + t < BN (the upper chunk), at c0 - BN + t elsewhere (the lower)."""
    r_il = tl.arange(0, BM)[:, None] + tl.arange(0, BN)[None, :]  # il + t
    return tl.gather(x, tl.where(r_il < BN, r_il, r_il - BN), 1)


@triton.jit
def _unrotated(x, BM: tl.constexpr, BN: tl.constexpr):
    """The inverse regrouping of a (BM,BN) tile by distance: low[il, t] = x[il, t - BN + il] (distance c0 - BN + t)
    and high[il, t] = x[il, il + t] (distance c0 + t), 0 where no key of the tile lies at that distance: one gather
    (_rotate_back) split by il + t < BN."""
    r_il = tl.arange(0, BM)[:, None] + tl.arange(0, BN)[None, :]  # il + t
    rotated = _rotate_back(x, BM, BN)
    return tl.where(r_il >= BN, rotated, 0.0), tl.where(r_il < BN, rotated, 0.0)


@triton.jit
def _fwd_tiles(acc, best, total, prev, prev2, q, qr, K, V, R, VT, i, c_base, n_start, n_end, TQ, TK, S,
               srow, svrow, qk_scale, row_scale, skt, svt, d, d_ok, CAUSAL: tl.constexpr, MASKED: tl.constexpr,
               HAS_VALUES: tl.constexpr, BN: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """Key tiles [n_start, n_end) of one query block (K, V: the head's first key and value); prev: qr . R over the
    BN distances below the first tile's, prev2 (BM = 2 BN) over the BN below those."""
    BM: tl.constexpr = q.shape[0]
    for n0 in range(n_start, n_end, BN):
        j = n0 + tl.arange(0, BN)
        # the tiles' addresses from the head's base and int32 offsets formed here: pointer tensors carried from
        # outside the loops held 64-bit offsets per thread across both loops (spilled at 64 x 32, Dh 128)
        k_ptrs = K + j[None, :] * skt + d[:, None]  # (BD,BN)
        v_ptrs = V + j[:, None] * svt + d[None, :]  # (BN,BD)
        # k loaded before the table's chunk and q . k after qr . R, as before the helpers: _key_scores' order (load
        # and product after the chunk) cost up to 15 registers and 31 loop instructions, q . k first up to 68
        # registers (sm_90, Shaw bf16 Dh 128: 187 -> 255). EVEN_D False: the head dim masked, as ever (at BD == Dh the
        # mask folds away: the same SASS as EVEN_D True).
        k_t = _forward_key_tile(k_ptrs, j, TK, d_ok, MASKED, False)  # (BD,BN)
        c0 = c_base + n0
        cur = _dot(qr, _chunk_t(R, c0, S, srow, d, d_ok, BN), PRECISION, UPCAST) * (row_scale / qk_scale)
        zero = _opaque_zero(c0, BM, BN, UPCAST)
        if BM > BN:
            bias = _rotated_stacked(prev2, prev, cur, BM, BN, zero)
            prev2 = prev
        else:
            bias = _rotated(prev, cur, BM, BN, zero)
        s = _dot_into(q, k_t, bias, PRECISION, UPCAST) * qk_scale  # (BM,BN), base 2
        prev = cur
        acc, best, total, p = _online_softmax(acc, best, total, s, v_ptrs, i, j, TQ, TK, d_ok, CAUSAL, MASKED, False,
                                              PRECISION, UPCAST)
        if HAS_VALUES:  # + sum_j p_ij VT[c]: the probabilities by distance times the value table's two chunks
            low, high = _unrotated(p, BM, BN)
            value_type = v_ptrs.dtype.element_ty
            acc += _dot(low.to(value_type), _chunk(VT, c0 - BN, S, svrow, d, d_ok, BN), PRECISION, UPCAST)
            acc += _dot(high.to(value_type), _chunk(VT, c0, S, svrow, d, d_ok, BN), PRECISION, UPCAST)
    return acc, best, total, prev, prev2


@triton.jit
def _forward(Q, QR, K, V, R, VT, OUT, LSE, O_FAR, LSE_FAR, E,
             sqb, sqh, sqt, srb, srh, srt, skb, skh, skt, svb, svh, svt, sob, soh, sot,
             s_table_h, srow, svrow,
             H, GROUP, TQ, TK, S, qk_scale, row_scale,
             D: tl.constexpr, CAUSAL: tl.constexpr, HAS_VALUES: tl.constexpr, FAR: tl.constexpr,
             BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr, FBM: tl.constexpr, FBN: tl.constexpr,
             PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """One query block's output and log-sum-exp. FAR: the far tiles of the FBM x FBN block that holds this one
    were run by relative_far_kernels._far_forward (O_FAR, LSE_FAR: no bias); this program starts from them."""
    m0, h, b, hk = prologue.program(BM, GROUP)
    i, _, d = prologue.tile_ranges(m0, BM, BN, BD)
    d_ok = d < D
    q_mask = (i < TQ)[:, None] & d_ok[None, :]
    q = tl.load(Q + b * sqb + h * sqh + i[:, None] * sqt + d[None, :], mask=q_mask, other=0.0)  # (BM,BD)
    qr = tl.load(QR + b * srb + h * srh + i[:, None] * srt + d[None, :], mask=q_mask, other=0.0)
    K += b * skb + hk * skh
    V += b * svb + hk * svh
    R += h * s_table_h
    c_base = tl.load(E + b).to(tl.int32) - m0  # the distance index of key 0 at query m0
    best = tl.full((BM,), float("-inf"), tl.float32)
    total = tl.zeros((BM,), tl.float32)
    acc = tl.zeros((BM, BD), tl.float32)
    interior = _interior_end(m0, TQ, TK, CAUSAL, BM, BN)
    far = 0
    if FAR:  # tiles whose every pair reads row 0 (clipped): their softmax, normalised, plus the row's bias
        m0_far = m0 // FBM * FBM
        far = far_keys(c_base + m0 - m0_far, m0_far, TQ, TK, CAUSAL, FBM, FBN)
        bh = b * H + h
        best = tl.load(LSE_FAR + bh * TQ + i, mask=i < TQ, other=float("-inf"))  # base 2, -inf: no far tile
        total = tl.where(best > float("-inf"), 1.0, 0.0)
        acc = tl.load(O_FAR + (bh * TQ + i[:, None]) * D + d[None, :], mask=q_mask, other=0.0)
        row0 = tl.load(R + d, mask=d_ok, other=0.0).to(tl.float32)
        best += tl.sum(qr.to(tl.float32) * row0[None, :], 1) * row_scale
        if HAS_VALUES:  # their value term: the mass so far times VT[0]
            acc += total[:, None] * tl.load(VT + d, mask=d_ok, other=0.0).to(tl.float32)[None, :]
    tl.static_assert(BM == BN or (BM == 2 * BN and not HAS_VALUES), "tiles: BM = BN, or 2 BN without values")
    prev = _dot(qr, _chunk_t(R, c_base + far - BN, S, srow, d, d_ok, BN), PRECISION, UPCAST) * (row_scale / qk_scale)
    prev2 = prev
    if BM > BN:
        prev2 = _dot(qr, _chunk_t(R, c_base + far - 2 * BN, S, srow, d, d_ok, BN), PRECISION, UPCAST) * (
            row_scale / qk_scale)
    acc, best, total, prev, prev2 = _fwd_tiles(acc, best, total, prev, prev2, q, qr, K, V, R, VT, i,
                                               c_base, far, interior, TQ, TK, S, srow, svrow, qk_scale, row_scale,
                                               skt, svt, d, d_ok, CAUSAL, False, HAS_VALUES, BN, PRECISION, UPCAST)
    acc, best, total, prev, prev2 = _fwd_tiles(acc, best, total, prev, prev2, q, qr, K, V, R, VT, i,
                                               c_base, interior, _key_end(m0, TQ, TK, CAUSAL, BM), TQ, TK, S, srow,
                                               svrow, qk_scale, row_scale, skt, svt, d, d_ok, CAUSAL, True,
                                               HAS_VALUES, BN, PRECISION, UPCAST)
    acc = acc / total[:, None]
    tl.store(OUT + b * sob + h * soh + i[:, None] * sot + d[None, :], acc.to(OUT.dtype.element_ty), mask=q_mask)
    tl.store(LSE + (b * H + h) * TQ + i, best + tl.log2(total), mask=i < TQ)  # base 2


@triton.jit
def _dkdv_tiles(dk, dv, k, v, Q, QR, DO, LSE, DELTA, R, VT, j, c_base, m_start, m_end,
                TQ, TK, S, srow, svrow, qk_scale, bias_scale, sqt, srt, sdot, d, d_ok, CAUSAL: tl.constexpr,
                MASKED: tl.constexpr, HAS_VALUES: tl.constexpr, BM: tl.constexpr, PRECISION: tl.constexpr,
                UPCAST: tl.constexpr):
    """Query tiles [m_start, m_end) against one key block, in the transposed tile (keys x queries); Q, QR, DO, LSE,
    DELTA at the head's first query (addresses formed per tile, as _fwd_tiles)."""
    BN: tl.constexpr = k.shape[0]
    for m0 in range(m_start, m_end, BM):
        i = m0 + tl.arange(0, BM)
        i_ok = (i < TQ) if MASKED else (i >= 0)
        q_t = tl.load(Q + i[None, :] * sqt + d[:, None], mask=i_ok[None, :] & d_ok[:, None], other=0.0)  # (BD,BM)
        qr = tl.load(QR + i[:, None] * srt + d[None, :], mask=i_ok[:, None] & d_ok[None, :], other=0.0)  # (BM,BD)
        do = tl.load(DO + i[:, None] * sdot + d[None, :], mask=i_ok[:, None] & d_ok[None, :], other=0.0)  # (BM,BD)
        lse = tl.load(LSE + i, mask=i_ok, other=float("inf"))  # padded queries: probability 0
        delta = tl.load(DELTA + i, mask=i_ok, other=0.0)
        c0 = c_base - m0  # the distance index of key n0 at query m0
        # qr changes with the query tile: both chunks' products per tile (the forward and dQ carry one over)
        if BM * 4 <= BN:  # a narrow lower chunk: BM x BM products, and a second gather
            low = _dot(qr, _chunk_t(R, c0 - BM, S, srow, d, d_ok, BM), PRECISION, UPCAST)  # (BM,BM)
            high = _dot(qr, _chunk_t(R, c0, S, srow, d, d_ok, BN), PRECISION, UPCAST)  # (BM,BN)
            bias_t = tl.trans(_rotated_narrow(low, high, BM, BN)) * bias_scale  # (BN,BM), in units of qk_scale
        else:
            low = _dot(qr, _chunk_t(R, c0 - BN, S, srow, d, d_ok, BN), PRECISION, UPCAST)
            high = _dot(qr, _chunk_t(R, c0, S, srow, d, d_ok, BN), PRECISION, UPCAST)
            bias_t = tl.trans(_rotated(low, high, BM, BN)) * bias_scale
        s_t = _dot_into(k, q_t, bias_t, PRECISION, UPCAST) * qk_scale
        p_t = _probabilities(s_t, lse[None, :], i[None, :], j[:, None], TQ, TK, CAUSAL, MASKED)  # (BN,BM)
        dv += _dot(p_t.to(do.dtype), do, PRECISION, UPCAST)
        if HAS_VALUES:  # d out_i / d p_ij also reads VT[c]: dO_i . VT[c]
            low = _dot(do, _chunk_t(VT, c0 - BN, S, svrow, d, d_ok, BN), PRECISION, UPCAST)
            high = _dot(do, _chunk_t(VT, c0, S, svrow, d, d_ok, BN), PRECISION, UPCAST)
            dp_t = _dot_into(v, tl.trans(do), tl.trans(_rotated(low, high, BM, BN)), PRECISION, UPCAST)  # (BN,BM)
        else:
            dp_t = _dot(v, tl.trans(do), PRECISION, UPCAST)  # (BN,BM)
        ds_t = p_t * (dp_t - delta[None, :])
        dk += _dot(ds_t.to(q_t.dtype), tl.trans(q_t), PRECISION, UPCAST)
    return dk, dv


@triton.jit
def _dkdv(Q, QR, K, V, DO, LSE, DELTA, DK_FAR, DV_FAR, DK, DV, R, VT, E,
          sqb, sqh, sqt, srb, srh, srt, skb, skh, skt, svb, svh, svt, sdob, sdoh, sdot,
          s_table_h, srow, svrow,
          H, GROUP, TQ, TK, S, qk_scale, row_scale, scale,
          D: tl.constexpr, CAUSAL: tl.constexpr, HAS_VALUES: tl.constexpr, FAR: tl.constexpr,
          BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr, FBM: tl.constexpr, FBN: tl.constexpr,
          PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """dK, dV of one key block for query head h, (BN,BD), into DK/DV contiguous (B,H,Tk,Dh). FAR: the far query
    tiles of the FBM x FBN block that holds this one gave their dK (before the scale) and dV
    (relative_far_kernels._far_dkdv: DK_FAR, DV_FAR float32); this program adds the other tiles'."""
    n0, h, b, hk = prologue.program(BN, GROUP)
    j, _, d = prologue.tile_ranges(n0, BN, BM, BD)
    d_ok = d < D
    kv_mask = (j < TK)[:, None] & d_ok[None, :]
    k, v = prologue.key_block(K, V, b, hk, j, d, kv_mask, skb, skh, skt, svb, svh, svt)  # (BN,BD) each
    bh = b * H + h
    Q += b * sqb + h * sqh
    QR += b * srb + h * srh
    DO += b * sdob + h * sdoh
    LSE += bh * TQ
    DELTA += bh * TQ
    R += h * s_table_h
    c_base = tl.load(E + b).to(tl.int32) + n0
    dk = tl.zeros((BN, BD), tl.float32)
    dv = tl.zeros((BN, BD), tl.float32)
    first, full, last = _query_phases(n0, TQ, TK, CAUSAL, BM, BN)
    far_start = last  # [far_start, far_end): the far program's queries
    far_end = last
    if FAR:
        n0_far = n0 // FBN * FBN
        start, end = far_queries(c_base + n0_far - n0, n0_far, TQ, TK, CAUSAL, FBM, FBN)
        far_start = tl.where(start < end, start, last)
        far_end = tl.where(start < end, end, last)
        out = (bh * TK + j[:, None]) * D + d[None, :]
        dk = tl.load(DK_FAR + out, mask=kv_mask, other=0.0)
        dv = tl.load(DV_FAR + out, mask=kv_mask, other=0.0)
    bias_scale = row_scale / qk_scale  # the bias enters k . q's product as its accumulator
    dk, dv = _dkdv_tiles(dk, dv, k, v, Q, QR, DO, LSE, DELTA, R, VT, j, c_base, first,
                         full, TQ, TK, S, srow, svrow, qk_scale, bias_scale, sqt, srt, sdot, d, d_ok, CAUSAL, True,
                         HAS_VALUES, BM, PRECISION, UPCAST)
    dk, dv = _dkdv_tiles(dk, dv, k, v, Q, QR, DO, LSE, DELTA, R, VT, j, c_base, full,
                         far_start, TQ, TK, S, srow, svrow, qk_scale, bias_scale, sqt, srt, sdot, d, d_ok, CAUSAL,
                         False, HAS_VALUES, BM, PRECISION, UPCAST)
    # after the far queries: less than one far tile of whole tiles, then the ragged last (masked: right for both)
    dk, dv = _dkdv_tiles(dk, dv, k, v, Q, QR, DO, LSE, DELTA, R, VT, j, c_base, far_end,
                         TQ, TQ, TK, S, srow, svrow, qk_scale, bias_scale, sqt, srt, sdot, d, d_ok, CAUSAL, True,
                         HAS_VALUES, BM, PRECISION, UPCAST)
    out = (bh * TK + j[:, None]) * D + d[None, :]
    tl.store(DK + out, (dk * scale).to(DK.dtype.element_ty), mask=kv_mask)
    tl.store(DV + out, dv.to(DV.dtype.element_ty), mask=kv_mask)


@triton.jit
def _add_rows(G, c0, x, S, d, d_ok, D: tl.constexpr, BN: tl.constexpr, CLIPPED: tl.constexpr):
    """G[clamp(c0 + t, 0, S - 1)] += x[t] (x (BN,BD) float32, G rows of D floats). CLIPPED (a table shorter than
    the distances, whose end rows many pairs read): rows inside the table with one atomic add of distinct
    addresses, the rows past either end summed across the tile first. Otherwise (the end rows read by few pairs or
    none: Transformer-XL's table spans every distance, the pairs past its ends lie outside the mask and add 0) each
    row adds at its clamped address: no reductions across the tile, the same sums."""
    c = c0 + tl.arange(0, BN)
    if CLIPPED:
        tl.atomic_add(G + c[:, None] * D + d[None, :], x, mask=((c >= 0) & (c < S))[:, None] & d_ok[None, :],
                      sem="relaxed")
        below = tl.sum(tl.where((c < 0)[:, None], x, 0.0), 0)  # (BD,)
        above = tl.sum(tl.where((c >= S)[:, None], x, 0.0), 0)
        tl.atomic_add(G + d, below, mask=d_ok & (c0 < 0), sem="relaxed")
        tl.atomic_add(G + (S - 1) * D + d, above, mask=d_ok & (c0 + BN > S), sem="relaxed")
    else:
        c = tl.minimum(tl.maximum(c, 0), S - 1)
        tl.atomic_add(G + c[:, None] * D + d[None, :], x, mask=d_ok[None, :], sem="relaxed")


@triton.jit
def _dq_tiles(dq, dqr, prev, prev_v, rot_ds, rot_p, ds_sum, p_sum, c_last, q, qr, do, lse, delta, K, V, R, VT, DR,
              DVT, i, c_base, n_start, n_end, TQ, TK, S, srow, svrow, qk_scale, bias_scale, skt, svt, d, d_ok,
              CAUSAL: tl.constexpr, MASKED: tl.constexpr, HAS_VALUES: tl.constexpr, FAR: tl.constexpr,
              D: tl.constexpr, BN: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """Key tiles [n_start, n_end) of one query block: dQc, dQr, and the tables' gradients (atomics into DR, DVT);
    ds_sum, p_sum (FAR: a clipped table): the rows' sums of dS and p over these tiles. prev, prev_v: the last chunk
    products (qr . R in units of qk_scale, dO . VT); rot_ds, rot_p: the last tile's dS and p rotated by distance
    (_rotate_back), whose upper part reads the chunk this tile's lower part reads: one product per tile for both."""
    BM: tl.constexpr = q.shape[0]
    r_il = tl.arange(0, BM)[:, None] + tl.arange(0, BN)[None, :]  # il + t: >= BN is this tile's lower chunk
    for n0 in range(n_start, n_end, BN):
        j = n0 + tl.arange(0, BN)
        k_ptrs = K + j[None, :] * skt + d[:, None]  # (BD,BN): addresses formed per tile, as _fwd_tiles
        v_ptrs = V + j[None, :] * svt + d[:, None]
        k_t, v_t = _key_tile(k_ptrs, v_ptrs, j, TK, d_ok, MASKED, False)  # (BD,BN) each
        c0 = c_base + n0
        c_last = c0
        cur = _dot(qr, _chunk_t(R, c0, S, srow, d, d_ok, BN), PRECISION, UPCAST) * bias_scale
        s = _dot_into(q, k_t, _rotated(prev, cur, BM, BN), PRECISION, UPCAST) * qk_scale
        prev = cur
        p = _probabilities(s, lse[:, None], i[:, None], j[None, :], TQ, TK, CAUSAL, MASKED)  # (BM,BN)
        if HAS_VALUES:
            cur_v = _dot(do, _chunk_t(VT, c0, S, svrow, d, d_ok, BN), PRECISION, UPCAST)
            dp = _dot_into(do, v_t, _rotated(prev_v, cur_v, BM, BN), PRECISION, UPCAST)  # (BM,BN)
            prev_v = cur_v
            rotated = _rotate_back(p, BM, BN)  # d VT[c] = sum of p_ij dO_i over the pairs at c
            lower = tl.where(r_il >= BN, rotated, rot_p)  # every pair at distances [c0 - BN, c0)
            rot_p = rotated
            _add_rows(DVT, c0 - BN, _dot(tl.trans(lower).to(do.dtype), do, PRECISION, UPCAST), S, d, d_ok, D, BN, FAR)
        else:
            dp = _dot(do, v_t, PRECISION, UPCAST)  # (BM,BN)
        ds = p * (dp - delta[:, None])  # (BM,BN): d loss / d logit
        if FAR:
            ds_sum += tl.sum(ds, 1)
            p_sum += tl.sum(p, 1)
        dq += _dot(ds.to(k_t.dtype), tl.trans(k_t), PRECISION, UPCAST)
        rotated = _rotate_back(ds, BM, BN)  # the logit gradient by distance: d qr . R[c]
        lower = tl.where(r_il >= BN, rotated, rot_ds).to(qr.dtype)  # every pair at distances [c0 - BN, c0)
        rot_ds = rotated
        dqr += _dot(lower, tl.trans(_chunk_t(R, c0 - BN, S, srow, d, d_ok, BN)), PRECISION, UPCAST)
        _add_rows(DR, c0 - BN, _dot(tl.trans(lower), qr, PRECISION, UPCAST), S, d, d_ok, D, BN, FAR)
    return dq, dqr, prev, prev_v, rot_ds, rot_p, ds_sum, p_sum, c_last


@triton.jit
def _dq_last_chunk(dqr, rot_ds, rot_p, qr, do, R, VT, DR, DVT, c0, S, srow, svrow, d, d_ok, HAS_VALUES: tl.constexpr,
                   FAR: tl.constexpr, D: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """After the last tile: its upper part (distances [c0, c0 + BN)) into dQr and the tables' gradients."""
    BM: tl.constexpr = rot_ds.shape[0]
    BN: tl.constexpr = rot_ds.shape[1]
    upper = (tl.arange(0, BM)[:, None] + tl.arange(0, BN)[None, :]) < BN
    if HAS_VALUES:
        last = tl.where(upper, rot_p, 0.0)
        _add_rows(DVT, c0, _dot(tl.trans(last).to(do.dtype), do, PRECISION, UPCAST), S, d, d_ok, D, BN, FAR)
    last = tl.where(upper, rot_ds, 0.0).to(qr.dtype)
    dqr += _dot(last, tl.trans(_chunk_t(R, c0, S, srow, d, d_ok, BN)), PRECISION, UPCAST)
    _add_rows(DR, c0, _dot(tl.trans(last), qr, PRECISION, UPCAST), S, d, d_ok, D, BN, FAR)
    return dqr


@triton.jit
def _dq(Q, QR, K, V, DO, LSE, DELTA, DQ_FAR, DQ, DQR, R, VT, DR, DVT, E,
        sqb, sqh, sqt, srb, srh, srt, skb, skh, skt, svb, svh, svt, sdob, sdoh, sdot,
        s_table_h, srow, svrow,
        H, GROUP, TQ, TK, S, qk_scale, row_scale, scale,
        D: tl.constexpr, CAUSAL: tl.constexpr, HAS_VALUES: tl.constexpr, FAR: tl.constexpr,
        BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr, FBM: tl.constexpr, FBN: tl.constexpr,
        PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """dQc and dQr (before the row scale) of one query block, contiguous (B,H,Tq,Dh); the tables' gradients
    (before the row scale) added into DR and DVT, each (H,S,Dh) float32. FAR: the far tiles of the FBM x FBN
    block that holds this one gave their dQ (relative_far_kernels._far_dq: DQ_FAR, float32, before the scale);
    their dS and p reach row 0 through the rows' sums, which softmax fixes: sum_j dS_ij = 0 and sum_j p_ij = 1
    over all keys, so the far tiles' are minus, and one minus, the other tiles'."""
    m0, h, b, hk = prologue.program(BM, GROUP)
    bh = b * H + h
    i, _, d = prologue.tile_ranges(m0, BM, BN, BD)
    d_ok, i_ok = d < D, i < TQ
    q_mask = i_ok[:, None] & d_ok[None, :]
    q = tl.load(Q + b * sqb + h * sqh + i[:, None] * sqt + d[None, :], mask=q_mask, other=0.0)  # (BM,BD)
    qr = tl.load(QR + b * srb + h * srh + i[:, None] * srt + d[None, :], mask=q_mask, other=0.0)
    do = tl.load(DO + b * sdob + h * sdoh + i[:, None] * sdot + d[None, :], mask=q_mask, other=0.0)
    lse = tl.load(LSE + bh * TQ + i, mask=i_ok, other=float("inf"))
    delta = tl.load(DELTA + bh * TQ + i, mask=i_ok, other=0.0)
    K += b * skb + hk * skh
    V += b * svb + hk * svh
    R += h * s_table_h
    DR += h * S * D
    DVT += h * S * D
    c_base = tl.load(E + b).to(tl.int32) - m0
    dq = tl.zeros((BM, BD), tl.float32)
    dqr = tl.zeros((BM, BD), tl.float32)
    interior = _interior_end(m0, TQ, TK, CAUSAL, BM, BN)
    far = 0
    if FAR:
        m0_far = m0 // FBM * FBM
        far = far_keys(c_base + m0 - m0_far, m0_far, TQ, TK, CAUSAL, FBM, FBN)
        dq = tl.load(DQ_FAR + (bh * TQ + i[:, None]) * D + d[None, :], mask=q_mask, other=0.0)
    bias_scale = row_scale / qk_scale  # the bias enters q . k's product as its accumulator
    prev = _dot(qr, _chunk_t(R, c_base + far - BN, S, srow, d, d_ok, BN), PRECISION, UPCAST) * bias_scale
    prev_v = tl.zeros((BM, BN), tl.float32)
    if HAS_VALUES:
        prev_v = _dot(do, _chunk_t(VT, c_base + far - BN, S, svrow, d, d_ok, BN), PRECISION, UPCAST)
    rot_ds = tl.zeros((BM, BN), tl.float32)
    rot_p = tl.zeros((BM, BN), tl.float32)
    ds_sum = tl.zeros((BM,), tl.float32)
    p_sum = tl.zeros((BM,), tl.float32)
    c_last = c_base + far - BN  # the last tile's distance index of its first key, carried out of the loops
    dq, dqr, prev, prev_v, rot_ds, rot_p, ds_sum, p_sum, c_last = _dq_tiles(
        dq, dqr, prev, prev_v, rot_ds, rot_p, ds_sum, p_sum, c_last, q, qr, do, lse, delta, K, V, R, VT, DR, DVT, i,
        c_base, far, interior, TQ, TK, S, srow, svrow, qk_scale, bias_scale, skt, svt, d, d_ok, CAUSAL, False,
        HAS_VALUES, FAR, D, BN, PRECISION, UPCAST)
    key_end = _key_end(m0, TQ, TK, CAUSAL, BM)
    dq, dqr, prev, prev_v, rot_ds, rot_p, ds_sum, p_sum, c_last = _dq_tiles(
        dq, dqr, prev, prev_v, rot_ds, rot_p, ds_sum, p_sum, c_last, q, qr, do, lse, delta, K, V, R, VT, DR, DVT, i,
        c_base, interior, key_end, TQ, TK, S, srow, svrow, qk_scale, bias_scale, skt, svt, d, d_ok, CAUSAL, True,
        HAS_VALUES, FAR, D, BN, PRECISION, UPCAST)
    dqr = _dq_last_chunk(dqr, rot_ds, rot_p, qr, do, R, VT, DR, DVT, c_last, S, srow, svrow, d, d_ok, HAS_VALUES,
                         FAR, D, PRECISION, UPCAST)
    if FAR:
        far_ds = tl.where(i_ok & (far > 0), -ds_sum, 0.0)  # (BM,): the far tiles' dS, all at row 0
        dqr += far_ds[:, None] * tl.load(R + d, mask=d_ok, other=0.0).to(tl.float32)[None, :]
        tl.atomic_add(DR + d, tl.sum(far_ds[:, None] * qr.to(tl.float32), 0), mask=d_ok, sem="relaxed")
        if HAS_VALUES:
            far_p = tl.where(i_ok & (far > 0), 1.0 - p_sum, 0.0)
            tl.atomic_add(DVT + d, tl.sum(far_p[:, None] * do.to(tl.float32), 0), mask=d_ok, sem="relaxed")
    out = (bh * TQ + i[:, None]) * D + d[None, :]
    tl.store(DQ + out, (dq * scale).to(DQ.dtype.element_ty), mask=q_mask)
    tl.store(DQR + out, dqr.to(DQR.dtype.element_ty), mask=q_mask)


__all__ = ["triton"]
