"""Row-bias attention (attention.py) for a bias whose row per head depends on that head's parameters only
(Scheme.head_bias: KERPLE): the same forward and dK/dV; dQ's kernel (head_bias_kernels.py) sums dS times the rows'
derivatives per pair into the parameters' gradient (H,K), in place of the row gradient by distance that
attention.py's dQ builds (diagonal sums into a (B, H, Tq / BM, Tk + BN) buffer, then a reduction).

    bias(b, h, i, j) = rows[h, e[b] - i + j],   dL/dparams[h, k] = sum_bij dS[b,h,i,j] derivatives[h, k, e[b] - i + j]

Each program writes its three sums once; the host adds them over batch rows and query blocks in a fixed order (no
atomics: results repeat bit for bit).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from posenc.inference_tensors import DerivedPerTensor, ordinary
from posenc.nn.fused_attention import per_batch_row
from posenc.nn.triton import attention, cdiv
from posenc.nn.triton import head_bias_kernels as kernels
from posenc.nn.triton.attention import (
    _bhd,
    _dense_last,
    _options,
    _RowBiasAttention,
    key_gradients,
    output_gradient_and_delta,
    padded_head_dim,
)
from posenc.scheme import MAX_HEAD_PARAMS

LOG2E = attention.kernels.LOG2E
# attention.tiles and attention.launch are looked up at each call: the static check and the tests replace them


def _padded_derivatives(derivatives: Tensor, pad: int) -> Tensor:
    """(H,K,S) -> a view of (H, MAX_HEAD_PARAMS, S + 2 pad) float32 starting at the real data (zeros past K and in
    the padding: every tile reads them unmasked), without autograd and not an inference tensor (kept)."""
    k = derivatives.shape[1]

    def build() -> Tensor:
        padded = F.pad(derivatives.detach().to(torch.float32), (pad, pad, 0, MAX_HEAD_PARAMS - k)).contiguous()
        return padded[:, :, pad:]

    return ordinary(build)


# derivatives, pad -> _padded_derivatives(derivatives, pad): once per forward, all layers share the derivatives
padded_derivatives = DerivedPerTensor(_padded_derivatives)


class _HeadBiasAttention(torch.autograd.Function):
    """biased: the rows as the kernels read them (attention.padded_rows); jac: the derivatives likewise
    (padded_derivatives), both padded by attention.row_pad."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, params: Tensor, rows: Tensor, biased: Tensor, jac: Tensor,
                e: Tensor, causal: bool) -> Tensor:
        out = _RowBiasAttention.forward(ctx, q, k, v, rows, biased, e, causal)
        ctx.jac, ctx.n_params = jac, params.shape[1]
        return out

    @staticmethod
    def backward(ctx, dout: Tensor):
        q, k, v, out, lse, biased, e = ctx.saved_tensors
        dout, delta = output_gradient_and_delta(_dense_last(dout), out)  # delta (B,H,Tq)
        b, h, tq, d = q.shape
        dk, dv = key_gradients(ctx, q, k, v, dout, lse, delta, biased, e)
        t = attention.tiles("dq_head_params", d, q.device, q.dtype)
        jac = ctx.jac
        head_stride, param_stride = jac.stride(0), jac.stride(1)
        q_blocks = cdiv(tq, t.bm)
        sums = torch.empty(b, h, q_blocks, MAX_HEAD_PARAMS, device=q.device, dtype=torch.float32)
        dq = torch.empty(b, h, tq, d, device=q.device, dtype=q.dtype)
        attention.launch(kernels._dq_head_params, (q_blocks, h, b), q, k, v, dout, lse, delta, dq, biased, jac, e, sums,
               *_bhd(q), *_bhd(k), *_bhd(v), *_bhd(dout), h, h // k.shape[1], tq, k.shape[2], ctx.row_stride,
               head_stride, param_stride, d**-0.5 * LOG2E, d**-0.5, D=d, CAUSAL=ctx.causal, BM=t.bm, BN=t.bn,
               BD=padded_head_dim(d), **_options(t, q.dtype, q.device))
        dparams = sums.sum((0, 2))[:, :ctx.n_params]  # (H,K): batch rows and query blocks added in a fixed order
        return dq, dk, dv, dparams, None, None, None, None, None, None


def attend_head_bias(q: Tensor, k: Tensor, v: Tensor, params: Tensor, rows: Tensor, derivatives: Tensor, e: Tensor,
                     causal: bool) -> Tensor:
    """attention.attend_rows with rows (H,S) read from params (H,K) alone, derivatives (H,K,S) = d rows / d params:
    the gradient reaches params (not rows). q (B,H,Tq,Dh), k/v (B,Hkv,Tk,Dh), e (B,) -> (B,H,Tq,Dh)."""
    attention.check_qkv(q, k, v, causal)
    h, s = q.shape[1], rows.shape[-1]
    if rows.shape != (h, s) or params.shape[0] != h or not 1 <= params.shape[1] <= MAX_HEAD_PARAMS:
        raise ValueError(f"rows {tuple(rows.shape)}, params {tuple(params.shape)}: expected (H,S) and (H,K) with "
                         f"H={h} and 1 <= K <= {MAX_HEAD_PARAMS}")
    if derivatives.shape != (h, params.shape[1], s):
        raise ValueError(f"derivatives {tuple(derivatives.shape)}: expected (H,K,S) = {(h, params.shape[1], s)}")
    pad = attention.row_pad(q.shape[-1], q.device, q.dtype)
    biased, jac = attention.padded_rows(rows, pad), padded_derivatives(derivatives, pad)
    return _HeadBiasAttention.apply(q, k, v, params, rows.detach().to(torch.float32), biased, jac,
                                    per_batch_row(e.to(q.device), q), causal)


__all__ = ["attend_head_bias"]
