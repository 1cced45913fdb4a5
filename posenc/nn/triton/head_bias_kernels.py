"""Triton kernel: dQ of row-bias attention (attention_kernels._dq) with, instead of the row gradient's diagonal sums,
the gradient of a bias whose row per head depends on that head's parameters only (Scheme.head_bias: KERPLE):

    dL/dtheta[h, k] = sum over b, i, j of dS[b, h, i, j] * J[h, k, e[b] - i + j]      J = d rows / d theta (H,K,S)

Per tile that is one product and one sum along the keys per parameter into a (BM,) accumulator: no diagonal sums
(two reductions and a store per tile) and no (B, H, Tq / BM, Tk) buffer. (A (BM,BN) accumulator per parameter, one
multiply-add per pair, held 3 BM BN floats across the loop: more registers and instructions, attention.TILES.)
J's rows are read as the bias is, padded by the host so every tile's index lies inside (attention_kernels'
docstring); K = 3 rows always (a scheme with fewer parameters gets rows of zeros).
"""

from __future__ import annotations

import triton
import triton.language as tl

from posenc.nn.triton import kernel_prologues as prologue
from posenc.nn.triton.attention_kernels import _bias, _dot, _interior_end, _key_end, _key_tile, _probabilities


@triton.jit
def _dq_param_tiles(dq, g0, g1, g2, q, do, lse, delta, k_ptrs, v_ptrs, bias_ptrs, jac_ptrs, jac_stride, i, n_start,
                    n_end, TQ, TK, qk_scale, skt, svt, d_ok, CAUSAL: tl.constexpr, MASKED: tl.constexpr,
                    EVEN_D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, PRECISION: tl.constexpr,
                    UPCAST: tl.constexpr):
    """Key tiles [n_start, n_end) of one query block: dQ, and dS * J_k summed along the keys into g_k (BM,)."""
    k_ptrs += n_start * skt
    v_ptrs += n_start * svt
    for n0 in range(n_start, n_end, BN):
        j = n0 + tl.arange(0, BN)
        k_t, v_t = _key_tile(k_ptrs, v_ptrs, j, TK, d_ok, MASKED, EVEN_D)
        s = _dot(q, k_t, PRECISION, UPCAST)  # (BM,BN)
        offset = n0 + (tl.arange(0, BN)[None, :] - tl.arange(0, BM)[:, None])  # e[b] - i + j, less the bases
        s = tl.fma(s, qk_scale, _bias(bias_ptrs + offset, UPCAST))
        p = _probabilities(s, lse[:, None], i[:, None], j[None, :], TQ, TK, CAUSAL, MASKED)  # (BM,BN)
        ds = p * (_dot(do, v_t, PRECISION, UPCAST) - delta[:, None])  # (BM,BN): d loss / d logit
        dq += _dot(ds.to(k_t.dtype), tl.trans(k_t), PRECISION, UPCAST)
        jac = jac_ptrs + offset
        g0 += tl.sum(ds * _bias(jac, UPCAST), 1)
        g1 += tl.sum(ds * _bias(jac + jac_stride, UPCAST), 1)
        g2 += tl.sum(ds * _bias(jac + 2 * jac_stride, UPCAST), 1)
        k_ptrs += BN * skt
        v_ptrs += BN * svt
    return dq, g0, g1, g2


@triton.jit
def _dq_head_params(Q, K, V, DO, LSE, DELTA, DQ, ROWS, JAC, E, G,
                    sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sdob, sdoh, sdot,
                    H, GROUP, TQ, TK, row_stride, jac_head_stride, jac_stride, qk_scale, scale,
                    D: tl.constexpr, CAUSAL: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                    BD: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """dQ of one query block (DQ contiguous (B,H,Tq,Dh)) and its three parameter sums into G[b, h, block, 0:3]
    (each written once: no atomics; the host adds them up in a fixed order)."""
    m0, h, b, hk = prologue.program(BM, GROUP)
    bh = b * H + h
    i, jl, d, i_ok, d_ok, q_mask = prologue.block_indices(m0, TQ, D, BM, BN, BD)
    q, do, lse, delta = prologue.dq_query_block(Q, DO, LSE, DELTA, b, h, bh, i, d, i_ok, q_mask, TQ, sqb, sqh, sqt,
                                                sdob, sdoh, sdot)
    k_ptrs, v_ptrs = prologue.dq_key_pointers(K, V, b, hk, jl, d, skb, skh, skt, svb, svh, svt)  # at key 0
    e = tl.load(E + b)
    bias_ptrs = ROWS + h * row_stride + e - m0  # the row at query m0, key 0
    jac_ptrs = JAC + h * jac_head_stride + e - m0  # J[h, 0] likewise; J[h, k] k rows of jac_stride further
    g0 = tl.zeros((BM,), tl.float32)
    g1 = tl.zeros((BM,), tl.float32)
    g2 = tl.zeros((BM,), tl.float32)
    dq = tl.zeros((BM, BD), tl.float32)
    interior = _interior_end(m0, TQ, TK, CAUSAL, BM, BN)
    end = _key_end(m0, TQ, TK, CAUSAL, BM)
    dq, g0, g1, g2 = _dq_param_tiles(dq, g0, g1, g2, q, do, lse, delta, k_ptrs, v_ptrs, bias_ptrs, jac_ptrs,
                                     jac_stride, i, 0, interior, TQ, TK, qk_scale, skt, svt, d_ok, CAUSAL, False,
                                     BD == D, BM, BN, PRECISION, UPCAST)
    dq, g0, g1, g2 = _dq_param_tiles(dq, g0, g1, g2, q, do, lse, delta, k_ptrs, v_ptrs, bias_ptrs, jac_ptrs,
                                     jac_stride, i, interior, end, TQ, TK, qk_scale, skt, svt, d_ok, CAUSAL, True,
                                     BD == D, BM, BN, PRECISION, UPCAST)
    out = G + (bh * tl.num_programs(0) + tl.program_id(0)) * 3
    tl.store(out, tl.sum(g0, 0))
    tl.store(out + 1, tl.sum(g1, 0))
    tl.store(out + 2, tl.sum(g2, 0))
    tl.store(DQ + (bh * TQ + i[:, None]) * D + d[None, :], (dq * scale).to(DQ.dtype.element_ty), mask=q_mask)
