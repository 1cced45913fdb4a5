"""Triton kernels: the far tiles of a clipped relative table (Shaw), at the row kernel's tiles.

Where every pair of a tile reads the table's row 0 (causal attention farther from the diagonal than the clip
distance: most tiles at long T), the logit is q . k / sqrt(Dh) plus one number per query (qr_i . R[0]) and the
value term is the tile's mass times VT[0]. Those tiles are a plain flash loop, so they run here with the row
kernel's tiles (attention.TILES' forward, dkdv and dq: 128 x 64 forward against relative_kernels' 32 x 32, whose
smaller tiles the per-pair skew needs), and relative_kernels' programs start from what these leave:

  _far_forward  keys [0, far) of each query block, no bias: O (normalised, float32) and the log-sum-exp (base 2,
                -inf where the block has no far tile); the relative forward adds the row's bias and VT[0].
  _far_dq       the same keys: dQ (float32, before the scale), from LSE_FAR = lse - bias and DELTA_FAR = delta -
                dO . VT[0] (relative.py's _far_softmax), which give those tiles' p and dS.
  _far_dkdv     queries [far, last) of each key block: dK (before the scale), dV (float32).

The ranges are the whole tiles of these programs' blocks; a relative program recomputes them for the far block
that holds its own (far_keys, far_queries below), so the two together visit every tile once. Partials are
float32, so the split adds no rounding beyond a sum's order.
"""

from __future__ import annotations

import triton
import triton.language as tl

from posenc.nn.triton import kernel_prologues as prologue
from posenc.nn.triton.attention_kernels import _dkdv_tiles, _dq_tiles, _fwd_tiles, _interior_end, _query_phases


@triton.jit
def far_keys(c_base, m0, TQ, TK, CAUSAL: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    """One past the far key tiles of the query block [m0, m0 + BM) whose key 0 sits at table index c_base: whole
    tiles of BN keys with every pair at c <= 0 (c = c_base + j - il, largest at il = 0), unmasked."""
    interior = _interior_end(m0, TQ, TK, CAUSAL, BM, BN)
    return tl.minimum(tl.maximum(1 - c_base, 0) // BN * BN, interior)


@triton.jit
def far_queries(c_base, n0, TQ, TK, CAUSAL: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    """(start, end) of the far query tiles of the key block [n0, n0 + BN) whose key n0 sits at table index c_base
    for query 0: whole unmasked tiles of BM queries from the first whose every pair has c <= 0; start == end when
    none."""
    _, full, last = _query_phases(n0, TQ, TK, CAUSAL, BM, BN)
    start = tl.minimum(tl.maximum(tl.cdiv(tl.maximum(c_base + BN - 1, 0), BM) * BM, full), last)
    return start, last


@triton.jit
def _far_forward(Q, K, V, OUT, LSE, E, sqb, sqh, sqt, skb, skh, skt, svb, svh, svt,
                 H, GROUP, TQ, TK, qk_scale,
                 D: tl.constexpr, CAUSAL: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr,
                 PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """O and LSE of the far tiles: OUT (B,H,Tq,Dh) float32 contiguous (0 where none), LSE (B,H,Tq) base 2."""
    m0, h, b, hk = prologue.program(BM, GROUP)
    i, jl, d = prologue.tile_ranges(m0, BM, BN, BD)
    d_ok, i_ok = d < D, i < TQ
    q = prologue.query_rows(Q, b, h, i, d, i_ok, d_ok, sqb, sqh, sqt)  # (BM,BD)
    k_ptrs, v_ptrs = prologue.forward_key_pointers(K, V, b, hk, jl, d, skb, skh, skt, svb, svh, svt)  # at key 0
    far = far_keys(tl.load(E + b) - m0, m0, TQ, TK, CAUSAL, BM, BN)
    best = tl.full((BM,), float("-inf"), tl.float32)
    total = tl.zeros((BM,), tl.float32)
    acc = tl.zeros((BM, BD), tl.float32)
    acc, best, total = _fwd_tiles(acc, best, total, q, k_ptrs, v_ptrs, Q, i, 0, far, TQ, TK, qk_scale, skt, svt,
                                  d_ok, CAUSAL, False, False, BD == D, BN, PRECISION, UPCAST)
    some = total > 0.0
    acc = tl.where(some[:, None], acc / tl.where(some, total, 1.0)[:, None], 0.0)
    bh = b * H + h
    tl.store(OUT + (bh * TQ + i[:, None]) * D + d[None, :], acc, mask=i_ok[:, None] & d_ok[None, :])
    tl.store(LSE + bh * TQ + i, tl.where(some, best + tl.log2(tl.where(some, total, 1.0)), float("-inf")), mask=i_ok)


@triton.jit
def _far_dq(Q, K, V, DO, LSE_FAR, DELTA_FAR, DQ, E, sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sdob, sdoh, sdot,
            H, GROUP, TQ, TK, qk_scale,
            D: tl.constexpr, CAUSAL: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr,
            PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """dQ of the far tiles, before the scale: DQ (B,H,Tq,Dh) float32 contiguous (0 where none)."""
    m0, h, b, hk = prologue.program(BM, GROUP)
    bh = b * H + h
    i, jl, d = prologue.tile_ranges(m0, BM, BN, BD)
    d_ok, i_ok = d < D, i < TQ
    q_mask = i_ok[:, None] & d_ok[None, :]
    q, do, lse, delta = prologue.dq_query_block(Q, DO, LSE_FAR, DELTA_FAR, b, h, bh, i, d, i_ok, q_mask, TQ, sqb, sqh,
                                                sqt, sdob, sdoh, sdot)
    k_ptrs, v_ptrs = prologue.dq_key_pointers(K, V, b, hk, jl, d, skb, skh, skt, svb, svh, svt)  # at key 0
    far = far_keys(tl.load(E + b) - m0, m0, TQ, TK, CAUSAL, BM, BN)
    dq = tl.zeros((BM, BD), tl.float32)
    dq, _ = _dq_tiles(dq, tl.zeros((BN,), tl.float32), q, do, lse, delta, k_ptrs, v_ptrs, Q, Q, i, 0, far, TQ, TK,
                      qk_scale, skt, svt, d_ok, CAUSAL, False, False, False, BD == D, BM, BN, PRECISION, UPCAST)
    tl.store(DQ + (bh * TQ + i[:, None]) * D + d[None, :], dq, mask=q_mask)


@triton.jit
def _far_dkdv(Q, K, V, DO, LSE_FAR, DELTA_FAR, DK, DV, E, sqb, sqh, sqt, skb, skh, skt, svb, svh, svt,
              sdob, sdoh, sdot, H, GROUP, TQ, TK, qk_scale,
              D: tl.constexpr, CAUSAL: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr,
              PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """dK (before the scale) and dV of the far tiles for query head h: DK, DV (B,H,Tk,Dh) float32 contiguous."""
    n0, h, b, hk = prologue.program(BN, GROUP)
    bh = b * H + h
    j, il, d = prologue.tile_ranges(n0, BN, BM, BD)
    d_ok = d < D
    kv_mask = (j < TK)[:, None] & d_ok[None, :]
    k, v = prologue.key_block(K, V, b, hk, j, d, kv_mask, skb, skh, skt, svb, svh, svt)  # (BN,BD) each
    q_ptrs = Q + b * sqb + h * sqh + il[None, :] * sqt + d[:, None]  # (BD,BM) at query 0
    do_ptrs = DO + b * sdob + h * sdoh + il[:, None] * sdot + d[None, :]
    start, end = far_queries(tl.load(E + b) + n0, n0, TQ, TK, CAUSAL, BM, BN)
    dk = tl.zeros((BN, BD), tl.float32)
    dv = tl.zeros((BN, BD), tl.float32)
    dk, dv = _dkdv_tiles(dk, dv, k, v, q_ptrs, do_ptrs, LSE_FAR + bh * TQ + il, DELTA_FAR + bh * TQ + il, Q, j,
                         start, end, TQ, TK, qk_scale, sqt, sdot, d_ok, CAUSAL, False, False, BD == D, BM,
                         PRECISION, UPCAST)
    out = (bh * TK + j[:, None]) * D + d[None, :]
    tl.store(DK + out, dk, mask=kv_mask)
    tl.store(DV + out, dv, mask=kv_mask)


__all__ = ["far_keys", "far_queries", "triton"]
