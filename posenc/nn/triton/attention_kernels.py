"""Triton kernels: flash attention whose bias is read, per tile, from one row per head (Scheme.bias_by_distance).

    logit(b, h, i, j) = q_i . k_j / sqrt(Dh) + rows[h, e[b] - i + j]   (then the causal mask)

Notation as in posenc/nn/attention.py; BM query rows and BN key columns per tile, BD >= Dh a power of two.
Causal attention lets query i (the i-th of the last Tq keys) see keys j <= i + OFF, OFF = Tk - Tq, as
posenc.masks does. Softmax runs in base 2 (exp2 is the GPU's native instruction): the host multiplies the
rows by log2(e) once, and the scores' scale carries it too, so a biased logit is one fused multiply-add
(tl.fma: without it the multiply and the add stayed two instructions per element, 1.21x a plain loop's count).

What keeps the loop near a plain flash loop (Triton's fused-attention tutorial; Dao 2023, FlashAttention-2):
- Interior tiles (every pair valid) run without a mask; only the diagonal and the ragged last tile are masked
  (MASKED, a constexpr: two copies of the loop body).
- The rows come padded by PAD entries on both sides (the host's job), so every index a tile forms, valid pair or
  not, lies inside the buffer: no clamp and no mask on the bias load. Padded query rows compute finite values
  that are never stored; in the backward their log-sum-exp reads +inf, so their probabilities are 0.
- Offsets: the (b, h) base in int64 once per program; per-tile offsets in int32 against that base (the host
  refuses a head whose slice passes 2^31 elements); pointers advance by one tile per step. The bias tile's
  addresses are formed inside the loop from a scalar base and the tile's j - i, so ptxas sees one base per
  thread plus constants (immediate offsets) instead of a 64-bit pointer per element held across the loop
  (that cost 254 registers and 1.21x a plain loop's instructions at Dh 64; this, 176 and 1.13x).

Forward: one program per (query block, h, b); online softmax; it keeps the log-sum-exp per query for the
backward. Backward without atomics, so results repeat bit for bit:
  _dkdv: one program per (key block, h, b): dK, dV of query head h (GQA: the host sums each group's heads);
  _dq:   one program per (query block, h, b): dQ, and the logit gradient dS summed along the tile's diagonals
         (the entries that read one row element) into a per-program buffer (ROW_GRAD);
  _row_reduce: adds those buffers up in a fixed order into the row gradient (H, S).
"""

from __future__ import annotations

import triton
import triton.language as tl

from posenc.nn.triton import kernel_prologues as prologue

LOG2E = 1.4426950408889634


@triton.jit
def _dot(a, b, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    # UPCAST: Triton 3.6's interpreter computes bf16 dots wrongly (garbage); it then multiplies in float32.
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision=PRECISION)
    return tl.dot(a, b, input_precision=PRECISION)


@triton.jit
def _nearest_tf32(x, PRECISION: tl.constexpr):
    """x as the nearest TF32 value (ties away from zero, as cvt.rna), where tl.dot multiplies float32 as TF32;
    other types and exact products unchanged. Triton hands float32 registers to the tensor cores as they are, which
    then drop the 13 low mantissa bits: a truncation, biased towards 0. For the probabilities that bias does not
    cancel in the backward's D = rowsum(dO * O) (O summed truncated p, dP = dO V^T weighs the exact p): every
    query's dS summed to ~1e-3 instead of 0, and a parameter whose gradient sums dS over many queries (KERPLE's,
    a row's) drifted by that much times Tq. Rounded to nearest, the errors are unbiased and average out.
    Two integer operations on the bits (cvt.rna.tf32.f32 in inline assembly took 46-50 loop instructions per
    forward tile against these 30-32, and spilled 8 B in Shaw's fp32 forward: the static table)."""
    if PRECISION == "tf32" and x.dtype == tl.float32:
        x = ((x.to(tl.int32, bitcast=True) + 0x1000) & -8192).to(tl.float32, bitcast=True)
    return x


@triton.jit
def _bias(ptrs, UPCAST: tl.constexpr):
    """The bias tile at ptrs, float32. On a GPU an opaque load: Triton's pipeliner would otherwise stage it through
    shared memory with K and V (it feeds p, hence the second product): BM x BN x 4 bytes per stage, 32 KB at
    128 x 64, and loop instructions 1.39x a plain forward's against 1.21x this way (the static table)."""
    if UPCAST:  # the interpreter runs no assembly
        return tl.load(ptrs)
    return tl.inline_asm_elementwise("ld.global.nc.f32 $0, [$1];", "=r,l", [ptrs], dtype=tl.float32,
                                     is_pure=True, pack=1)


@triton.jit
def _valid(i, j, TQ, TK, CAUSAL: tl.constexpr):
    """Pairs attention reads: key in range and (causal) not after the query. i, j broadcast to the tile.
    Padded queries (i >= Tq) stay unmasked, so their rows never hold only -inf; their values are not stored."""
    ok = j < TK
    if CAUSAL:
        ok = ok & (j <= i + (TK - TQ))
    return ok


@triton.jit
def _probabilities(s, lse, i, j, TQ, TK, CAUSAL: tl.constexpr, MASKED: tl.constexpr):
    """A backward loop's probabilities, recomputed from the forward's log-sum-exp (base 2): exp2(s - lse), 0 for
    pairs outside the mask (MASKED). s, lse, i, j broadcast to the tile, either way round (dQ: queries x keys,
    dK/dV: keys x queries)."""
    p = tl.exp2(s - lse)
    if MASKED:
        p = tl.where(_valid(i, j, TQ, TK, CAUSAL), p, 0.0)
    return p


@triton.jit
def _forward_key_tile(k_ptrs, j, TK, d_ok, MASKED: tl.constexpr, EVEN_D: tl.constexpr):
    """A forward loop's key tile at k_ptrs, transposed (BD,BN); MASKED: keys past Tk read as 0, else only the head
    dim's padding is masked."""
    if MASKED:
        k_t = tl.load(k_ptrs, mask=(j[None, :] < TK) & d_ok[:, None], other=0.0)  # (BD,BN)
    elif EVEN_D:
        k_t = tl.load(k_ptrs)
    else:
        k_t = tl.load(k_ptrs, mask=d_ok[:, None], other=0.0)
    return k_t


@triton.jit
def _key_scores(q, k_ptrs, j, TK, d_ok, MASKED: tl.constexpr, EVEN_D: tl.constexpr, PRECISION: tl.constexpr,
                UPCAST: tl.constexpr):
    """A forward loop's q against one key tile (k_ptrs: (BD,BN)), unscaled (BM,BN)."""
    return _dot(q, _forward_key_tile(k_ptrs, j, TK, d_ok, MASKED, EVEN_D), PRECISION, UPCAST)


@triton.jit
def _softmax_step(best, total, s, EMPTY_ROWS: tl.constexpr):
    """The online softmax's update (FlashAttention-2, Dao 2023, Algorithm 1) for one key tile's scores s (BM,BN,
    base 2, -inf where not attended), the one copy every forward loop calls: -> the tile's probabilities p (BM,BN)
    against the new running max, the factor (BM,) that rescales what the earlier tiles summed, the new running max
    (best) and sum (total). EMPTY_ROWS: a row may have attended no key yet (its max still -inf); it shifts by 0
    instead (exp2(-inf - -inf) is NaN). The row kernels' loops never leave a row empty: padded queries are
    unmasked, and a real query's first tile holds key 0."""
    new_best = tl.maximum(best, tl.max(s, 1))
    shift = new_best
    if EMPTY_ROWS:
        shift = tl.where(new_best == float("-inf"), 0.0, new_best)
    p = tl.exp2(s - shift[:, None])  # (BM,BN)
    correction = tl.exp2(best - shift)
    total = total * correction + tl.sum(p, 1)
    return p, correction, new_best, total


@triton.jit
def _fold_values(acc, correction, p, v, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """The running output (BM,BD) rescaled by _softmax_step's correction plus the tile's p (BM,BN) times v (BN,BD)."""
    return acc * correction[:, None] + _dot(_nearest_tf32(p.to(v.dtype), PRECISION), v, PRECISION, UPCAST)


@triton.jit
def _value_tile(v_ptrs, j, TK, d_ok, MASKED: tl.constexpr, EVEN_D: tl.constexpr):
    """A forward loop's value tile (BN,BD); MASKED: keys past Tk read as 0, else only the head dim's padding is
    masked."""
    if MASKED:
        v = tl.load(v_ptrs, mask=(j[:, None] < TK) & d_ok[None, :], other=0.0)
    elif EVEN_D:
        v = tl.load(v_ptrs)
    else:
        v = tl.load(v_ptrs, mask=d_ok[None, :], other=0.0)
    return v


@triton.jit
def _online_softmax(acc, best, total, s, v_ptrs, i, j, TQ, TK, d_ok, CAUSAL: tl.constexpr, MASKED: tl.constexpr,
                    EVEN_D: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """One key tile's scores s (BM,BN, base 2, scaled and biased) into the online softmax: pairs outside the mask
    dropped (MASKED), then the running max (best), sum (total) and output (acc) updated with the tile's values.
    Also returns the tile's probabilities p (BM,BN), for a caller that adds values of its own (Shaw's table)."""
    if MASKED:
        s = tl.where(_valid(i[:, None], j[None, :], TQ, TK, CAUSAL), s, float("-inf"))
    p, correction, best, total = _softmax_step(best, total, s, False)
    acc = _fold_values(acc, correction, p, _value_tile(v_ptrs, j, TK, d_ok, MASKED, EVEN_D), PRECISION, UPCAST)
    return acc, best, total, p


@triton.jit
def _fwd_tiles(acc, best, total, q, k_ptrs, v_ptrs, bias_ptrs, i, n_start, n_end, TQ, TK, qk_scale,
               skt, svt, d_ok, CAUSAL: tl.constexpr, MASKED: tl.constexpr, HAS_BIAS: tl.constexpr,
               EVEN_D: tl.constexpr, BN: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """Key tiles [n_start, n_end) of one query block: the online softmax's running max, sum and output."""
    k_ptrs += n_start * skt
    v_ptrs += n_start * svt
    for n0 in range(n_start, n_end, BN):
        j = n0 + tl.arange(0, BN)
        s = _key_scores(q, k_ptrs, j, TK, d_ok, MASKED, EVEN_D, PRECISION, UPCAST)  # (BM,BN)
        if HAS_BIAS:  # one fused multiply-add: Triton does not contract a multiply and an add by itself
            tile = bias_ptrs + n0 + (tl.arange(0, BN)[None, :] - tl.arange(0, i.shape[0])[:, None])
            s = tl.fma(s, qk_scale, _bias(tile, UPCAST))  # + rows[h, e - i + j] log2(e), base 2
        else:
            s = s * qk_scale
        acc, best, total, _ = _online_softmax(acc, best, total, s, v_ptrs, i, j, TQ, TK, d_ok, CAUSAL, MASKED,
                                              EVEN_D, PRECISION, UPCAST)
        k_ptrs += BN * skt
        v_ptrs += BN * svt
    return acc, best, total


@triton.jit
def _interior_end(m0, TQ, TK, CAUSAL: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    """Key tiles before this are valid for every query of the block starting at m0 (no mask needed)."""
    full = TK // BN * BN
    if CAUSAL:  # tile [n0, n0 + BN) is below the diagonal for query m0 when n0 + BN - 1 <= m0 + Tk - Tq
        full = tl.minimum(full, tl.maximum(m0 + TK - TQ + 1, 0) // BN * BN)
    return full


@triton.jit
def _key_end(m0, TQ, TK, CAUSAL: tl.constexpr, BM: tl.constexpr):
    """One past the last key a block of queries starting at m0 may see."""
    if CAUSAL:
        return tl.minimum(TK, m0 + BM + TK - TQ)
    return TK


@triton.jit
def _query_phases(n0, TQ, TK, CAUSAL: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    """The query tiles of a key block starting at n0: [first, full) masked (the diagonal), [full, last) unmasked,
    [last, Tq) the ragged last tile. Tiles before first see no key of the block (causal) and are skipped."""
    first = 0
    full = 0
    if CAUSAL:
        first = tl.maximum(n0 - (TK - TQ), 0) // BM * BM
        full = tl.minimum(tl.cdiv(tl.maximum(n0 + BN - 1 - (TK - TQ), 0), BM) * BM, TQ // BM * BM)
        full = tl.maximum(full, first)
    last = tl.maximum(TQ // BM * BM, full)
    return first, full, last


@triton.jit
def _forward(Q, K, V, OUT, LSE, ROWS, E,
             sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sob, soh, sot,
             H, GROUP, TQ, TK, row_stride, qk_scale,
             D: tl.constexpr, CAUSAL: tl.constexpr, HAS_BIAS: tl.constexpr,
             BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr,
             PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    m0, h, b, hk = prologue.program(BM, GROUP)
    i, jl, d = prologue.tile_ranges(m0, BM, BN, BD)
    d_ok, i_ok = d < D, i < TQ
    q = prologue.query_rows(Q, b, h, i, d, i_ok, d_ok, sqb, sqh, sqt)  # (BM,BD)
    k_ptrs, v_ptrs = prologue.forward_key_pointers(K, V, b, hk, jl, d, skb, skh, skt, svb, svh, svt)  # at key 0
    bias_ptrs = ROWS + h * row_stride + tl.load(E + b) - m0  # the row at query m0, key 0
    best = tl.full((BM,), float("-inf"), tl.float32)  # running max, base 2
    total = tl.zeros((BM,), tl.float32)  # running sum of exp2(s - best)
    acc = tl.zeros((BM, BD), tl.float32)
    interior = _interior_end(m0, TQ, TK, CAUSAL, BM, BN)
    acc, best, total = _fwd_tiles(acc, best, total, q, k_ptrs, v_ptrs, bias_ptrs, i, 0, interior, TQ, TK,
                                  qk_scale, skt, svt, d_ok, CAUSAL, False, HAS_BIAS, BD == D, BN, PRECISION, UPCAST)
    acc, best, total = _fwd_tiles(acc, best, total, q, k_ptrs, v_ptrs, bias_ptrs, i, interior,
                                  _key_end(m0, TQ, TK, CAUSAL, BM), TQ, TK, qk_scale, skt, svt, d_ok, CAUSAL, True,
                                  HAS_BIAS, BD == D, BN, PRECISION, UPCAST)
    acc = acc / total[:, None]
    tl.store(OUT + b * sob + h * soh + i[:, None] * sot + d[None, :], acc.to(OUT.dtype.element_ty),
             mask=i_ok[:, None] & d_ok[None, :])
    tl.store(LSE + (b * H + h) * TQ + i, best + tl.log2(total), mask=i_ok)  # base 2


@triton.jit
def _query_tile(q_ptrs, do_ptrs, lse_ptrs, delta_ptrs, i, TQ, d_ok, MASKED: tl.constexpr, EVEN_D: tl.constexpr):
    """A dK/dV loop's query tile: q transposed (BD,BM), dO (BM,BD), LSE and delta (BM,); MASKED: the ragged or
    diagonal tiles (rows past Tq read as probability 0), else only the head dim's padding is masked."""
    if MASKED:
        i_ok = i < TQ
        q_t = tl.load(q_ptrs, mask=i_ok[None, :] & d_ok[:, None], other=0.0)  # (BD,BM)
        do = tl.load(do_ptrs, mask=i_ok[:, None] & d_ok[None, :], other=0.0)  # (BM,BD)
        lse = tl.load(lse_ptrs, mask=i_ok, other=float("inf"))  # padded queries: probability 0
        delta = tl.load(delta_ptrs, mask=i_ok, other=0.0)
    else:
        if EVEN_D:
            q_t = tl.load(q_ptrs)
            do = tl.load(do_ptrs)
        else:
            q_t = tl.load(q_ptrs, mask=d_ok[:, None], other=0.0)
            do = tl.load(do_ptrs, mask=d_ok[None, :], other=0.0)
        lse = tl.load(lse_ptrs)
        delta = tl.load(delta_ptrs)
    return q_t, do, lse, delta


@triton.jit
def _dkdv_tiles(dk, dv, k, v, q_ptrs, do_ptrs, lse_ptrs, delta_ptrs, bias_ptrs, j, m_start, m_end, TQ, TK,
                qk_scale, sqt, sdot, d_ok, CAUSAL: tl.constexpr, MASKED: tl.constexpr, HAS_BIAS: tl.constexpr,
                EVEN_D: tl.constexpr, BM: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """Query tiles [m_start, m_end) against one key block, in the transposed tile (keys x queries)."""
    q_ptrs += m_start * sqt
    do_ptrs += m_start * sdot
    lse_ptrs += m_start
    delta_ptrs += m_start
    for m0 in range(m_start, m_end, BM):
        i = m0 + tl.arange(0, BM)
        q_t, do, lse, delta = _query_tile(q_ptrs, do_ptrs, lse_ptrs, delta_ptrs, i, TQ, d_ok, MASKED, EVEN_D)
        s_t = _dot(k, q_t, PRECISION, UPCAST)  # (BN,BM)
        if HAS_BIAS:
            tile = bias_ptrs - m0 + (tl.arange(0, j.shape[0])[:, None] - tl.arange(0, BM)[None, :])  # (BN,BM)
            s_t = tl.fma(s_t, qk_scale, _bias(tile, UPCAST))
        else:
            s_t = s_t * qk_scale
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


@triton.jit
def _dkdv(Q, K, V, DO, LSE, DELTA, DK, DV, ROWS, E,
          sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sdob, sdoh, sdot,
          H, GROUP, TQ, TK, row_stride, qk_scale, scale,
          D: tl.constexpr, CAUSAL: tl.constexpr, HAS_BIAS: tl.constexpr,
          BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr,
          PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """dK, dV of one key block for query head h, (BN,BD), into DK/DV contiguous (B,H,Tk,Dh): per query head, so
    GQA groups sit on the grid (the host adds a group's heads up)."""
    n0, h, b, hk = prologue.program(BN, GROUP)
    j, il, d, _, d_ok, kv_mask = prologue.block_indices(n0, TK, D, BN, BM, BD)
    k, v = prologue.key_block(K, V, b, hk, j, d, kv_mask, skb, skh, skt, svb, svh, svt)  # (BN,BD) each
    bh = b * H + h
    q_ptrs, do_ptrs, lse_ptrs, delta_ptrs = prologue.dkdv_query_pointers(Q, DO, LSE, DELTA, b, h, bh, il, d, TQ,
                                                                         sqb, sqh, sqt, sdob, sdoh, sdot)  # at query 0
    bias_ptrs = ROWS + h * row_stride + tl.load(E + b) + n0  # the row at key n0, query 0
    dk = tl.zeros((BN, BD), tl.float32)
    dv = tl.zeros((BN, BD), tl.float32)
    first, full, last = _query_phases(n0, TQ, TK, CAUSAL, BM, BN)
    dk, dv = _dkdv_tiles(dk, dv, k, v, q_ptrs, do_ptrs, lse_ptrs, delta_ptrs, bias_ptrs, j, first, full, TQ, TK,
                         qk_scale, sqt, sdot, d_ok, CAUSAL, True, HAS_BIAS, BD == D, BM, PRECISION, UPCAST)
    dk, dv = _dkdv_tiles(dk, dv, k, v, q_ptrs, do_ptrs, lse_ptrs, delta_ptrs, bias_ptrs, j, full, last, TQ, TK,
                         qk_scale, sqt, sdot, d_ok, CAUSAL, False, HAS_BIAS, BD == D, BM, PRECISION, UPCAST)
    dk, dv = _dkdv_tiles(dk, dv, k, v, q_ptrs, do_ptrs, lse_ptrs, delta_ptrs, bias_ptrs, j, last, TQ, TQ, TK,
                         qk_scale, sqt, sdot, d_ok, CAUSAL, True, HAS_BIAS, BD == D, BM, PRECISION, UPCAST)
    out = (bh * TK + j[:, None]) * D + d[None, :]
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
def _key_tile(k_ptrs, v_ptrs, j, TK, d_ok, MASKED: tl.constexpr, EVEN_D: tl.constexpr):
    """A dQ loop's key tile, both transposed (BD,BN); MASKED: keys past Tk read as 0, else only the head dim's
    padding is masked."""
    if MASKED:
        kv_mask_t = (j[None, :] < TK) & d_ok[:, None]
        k_t = tl.load(k_ptrs, mask=kv_mask_t, other=0.0)  # (BD,BN)
        v_t = tl.load(v_ptrs, mask=kv_mask_t, other=0.0)
    elif EVEN_D:
        k_t = tl.load(k_ptrs)
        v_t = tl.load(v_ptrs)
    else:
        k_t = tl.load(k_ptrs, mask=d_ok[:, None], other=0.0)
        v_t = tl.load(v_ptrs, mask=d_ok[:, None], other=0.0)
    return k_t, v_t


@triton.jit
def _store_diagonals(diag, n0, x, carry, BM: tl.constexpr, BN: tl.constexpr):
    """The diagonal sums of one (BM,BN) tile x into diag[n0 : n0 + BN], the previous tile's upper diagonals
    (carry) added to this tile's lower ones (the same c); returns this tile's upper diagonals, the next carry."""
    low, high = _diagonal_sums(x, BM, BN)
    tl.store(diag + n0 + tl.arange(0, BN), low + carry)
    return high


@triton.jit
def _dq_tiles(dq, carry, q, do, lse, delta, k_ptrs, v_ptrs, bias_ptrs, diag, i, n_start, n_end, TQ, TK,
              qk_scale, skt, svt, d_ok, CAUSAL: tl.constexpr, MASKED: tl.constexpr, HAS_BIAS: tl.constexpr,
              ROW_GRAD: tl.constexpr, EVEN_D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
              PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """Key tiles [n_start, n_end) of one query block: dQ, and the diagonal sums of dS (ROW_GRAD)."""
    k_ptrs += n_start * skt
    v_ptrs += n_start * svt
    for n0 in range(n_start, n_end, BN):
        j = n0 + tl.arange(0, BN)
        k_t, v_t = _key_tile(k_ptrs, v_ptrs, j, TK, d_ok, MASKED, EVEN_D)
        s = _dot(q, k_t, PRECISION, UPCAST)  # (BM,BN)
        if HAS_BIAS:
            tile = bias_ptrs + n0 + (tl.arange(0, BN)[None, :] - tl.arange(0, BM)[:, None])
            s = tl.fma(s, qk_scale, _bias(tile, UPCAST))
        else:
            s = s * qk_scale
        p = _probabilities(s, lse[:, None], i[:, None], j[None, :], TQ, TK, CAUSAL, MASKED)  # (BM,BN)
        ds = p * (_dot(do, v_t, PRECISION, UPCAST) - delta[:, None])  # (BM,BN): d loss / d logit
        dq += _dot(ds.to(k_t.dtype), tl.trans(k_t), PRECISION, UPCAST)
        if ROW_GRAD:
            carry = _store_diagonals(diag, n0, ds, carry, BM, BN)
        k_ptrs += BN * skt
        v_ptrs += BN * svt
    return dq, carry


@triton.jit
def _dq(Q, K, V, DO, LSE, DELTA, DQ, ROWS, E, DIAG,
        sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sdob, sdoh, sdot,
        H, GROUP, TQ, TK, row_stride, diag_len, qk_scale, scale,
        D: tl.constexpr, CAUSAL: tl.constexpr, HAS_BIAS: tl.constexpr, ROW_GRAD: tl.constexpr,
        BM: tl.constexpr, BN: tl.constexpr,
        BD: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """dQ of one query block (DQ contiguous (B,H,Tq,Dh)) and, if ROW_GRAD, the diagonal sums of dS into
    DIAG[b, h, block, c] at c = j - i + m0 + BM - 1 (each c written once: no atomics)."""
    m0, h, b, hk = prologue.program(BM, GROUP)
    bh = b * H + h
    i, jl, d, i_ok, d_ok, q_mask = prologue.block_indices(m0, TQ, D, BM, BN, BD)
    q, do, lse, delta = prologue.dq_query_block(Q, DO, LSE, DELTA, b, h, bh, i, d, i_ok, q_mask, TQ, sqb, sqh, sqt,
                                                sdob, sdoh, sdot)
    k_ptrs, v_ptrs = prologue.dq_key_pointers(K, V, b, hk, jl, d, skb, skh, skt, svb, svh, svt)  # at key 0
    bias_ptrs = ROWS + h * row_stride + tl.load(E + b) - m0  # the row at query m0, key 0
    diag = DIAG + (bh * tl.num_programs(0) + tl.program_id(0)) * diag_len
    carry = tl.zeros((BN,), tl.float32)  # the previous tile's upper diagonals: the same c as this tile's lower
    dq = tl.zeros((BM, BD), tl.float32)
    interior = _interior_end(m0, TQ, TK, CAUSAL, BM, BN)
    end = _key_end(m0, TQ, TK, CAUSAL, BM)
    dq, carry = _dq_tiles(dq, carry, q, do, lse, delta, k_ptrs, v_ptrs, bias_ptrs, diag, i, 0, interior, TQ, TK,
                          qk_scale, skt, svt, d_ok, CAUSAL, False, HAS_BIAS, ROW_GRAD, BD == D, BM, BN, PRECISION,
                          UPCAST)
    dq, carry = _dq_tiles(dq, carry, q, do, lse, delta, k_ptrs, v_ptrs, bias_ptrs, diag, i, interior, end, TQ, TK,
                          qk_scale, skt, svt, d_ok, CAUSAL, True, HAS_BIAS, ROW_GRAD, BD == D, BM, BN, PRECISION,
                          UPCAST)
    if ROW_GRAD:
        tl.store(diag + tl.cdiv(end, BN) * BN + tl.arange(0, BN), carry)
    tl.store(DQ + (bh * TQ + i[:, None]) * D + d[None, :], (dq * scale).to(DQ.dtype.element_ty), mask=q_mask)


@triton.jit
def _row_reduce(DIAG, E, DROW, B, H, Q_BLOCKS, diag_len, row_len, BM: tl.constexpr, BR: tl.constexpr):
    """drow[h, r] = sum over b, then query blocks, in that fixed order, of DIAG[b, h, block, c] at
    c = r - e[b] + m0 + BM - 1 (the diagonal of row element r in block m0)."""
    h = tl.program_id(0)
    r = tl.program_id(1) * BR + tl.arange(0, BR)
    acc = tl.zeros((BR,), tl.float32)
    for b in range(0, B):
        e = tl.load(E + b)
        base = DIAG + (b * H + h).to(tl.int64) * Q_BLOCKS * diag_len
        for block in range(0, Q_BLOCKS):
            c = r - e + block * BM + BM - 1
            acc += tl.load(base + block * diag_len + c, mask=(c >= 0) & (c < diag_len), other=0.0)
    tl.store(DROW + h * row_len + r, acc, mask=r < row_len)


__all__ = ["LOG2E"]
