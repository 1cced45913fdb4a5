"""Attention with rows per query (Scheme.relative_table: Shaw, Transformer-XL) on the GPU, forward and backward,
through the Triton kernels in relative_kernels.py; no (B, H, Tq, Tk) tensor and no (B, H, Tq, S) rows exist.

    logit(b, h, i, j) = qc_i . k_j / sqrt(Dh) + scale * qr_i . table[h, clamp(j - i + e[b], 0, S - 1)]
    out_i            += sum_j p_ij values[clamp(j - i + e[b], 0, S - 1)]                    (values given)

qc = q + q_shift, qr = q + row_shift (posenc.scheme.RelativeTable). Gradients reach q, k, v, the table and the
values, hence (through autograd, outside the kernels) the shifts and whatever the scheme built the table from
(Shaw's P_K and P_V; Transformer-XL's u, v and W_R). The tables' gradients add up with float32 atomics: unlike the
row kernel (attention.py) they do not repeat bit for bit between runs.

Launches go through the row kernel's launch(), with tiles from its table (attention.TILES, the relative_* kernels:
a tile reads two chunks of BN distances, so BM <= BN, except the forward's BM = 2 BN without a value table), chosen
by the static table (benchmarks/gpu_static.py).
"""

from __future__ import annotations

import torch
from torch import Tensor

from posenc.nn.fused_attention import per_batch_row
from posenc.nn.triton import attention, cdiv
from posenc.nn.triton import relative_far_kernels as far_kernels
from posenc.nn.triton import relative_kernels as kernels
from posenc.nn.triton.attention import Tiles, _bhd, _check_sizes, _dense_last, _options, padded_head_dim
from posenc.nn.triton.attention_kernels import LOG2E
from posenc.scheme import RelativeTable

# Transformer-XL's kernels, Shaw's (the value table: its own tiles), and the far passes (the row kernel's tiles)
KERNELS = ("relative_forward", "relative_dkdv", "relative_dq", "relative_values_forward", "relative_values_dkdv",
           "relative_values_dq", "forward", "dkdv", "dq")


def serves(q: Tensor) -> bool:
    """The table has tiles for this head dim and dtype (bf16/fp16 up to Dh 128, TF32 up to 64: larger spill)."""
    return q.device.type == "cpu" or all((kernel, padded_head_dim(q.shape[-1]), q.dtype) in attention.TILES
                                         for kernel in KERNELS)


def _tiles(kernel: str, q: Tensor) -> Tiles:
    return attention.tiles(kernel, q.shape[-1], q.device, q.dtype)


def _relative_tiles(kernel: str, q: Tensor, has_values: bool) -> Tiles:
    """relative_<kernel>, or relative_values_<kernel> for a value table (Shaw: more registers, smaller tiles)."""
    return _tiles(f"relative_{'values_' if has_values else ''}{kernel}", q)


class _RelativeAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, qc: Tensor, qr: Tensor, k: Tensor, v: Tensor, table: Tensor, values: Tensor | None, e: Tensor,
                causal: bool, scale: float) -> Tensor:
        qc, qr, k, v = _dense_last(qc), _dense_last(qr), _dense_last(k), _dense_last(v)
        table = table.contiguous()
        _check_sizes(qc, k, v)
        b, h, tq, d = qc.shape
        has_values = values is not None
        t = _relative_tiles("forward", qc, has_values)
        far = table.shape[1] < tq + k.shape[2] - 1  # a clipped table: whole tiles read its row 0
        vt = values.contiguous() if has_values else table[0]
        out = torch.empty_like(qc, memory_format=torch.contiguous_format)  # (B,H,Tq,Dh)
        lse = torch.empty(b, h, tq, device=qc.device, dtype=torch.float32)  # base 2
        f = _far_tiles("forward", t, qc) if far else t
        o_far, lse_far = out, lse  # unread without far tiles
        if far:  # the far tiles first, at the row kernel's tiles: O (float32) and LSE without the row's bias
            o_far = torch.empty(b, h, tq, d, device=qc.device, dtype=torch.float32)
            lse_far = torch.empty(b, h, tq, device=qc.device, dtype=torch.float32)
            attention.launch(far_kernels._far_forward, (cdiv(tq, f.bm), h, b), qc, k, v, o_far, lse_far, e,
                             *_bhd(qc), *_bhd(k), *_bhd(v), h, h // k.shape[1], tq, k.shape[2], d**-0.5 * LOG2E,
                             D=d, CAUSAL=causal, BM=f.bm, BN=f.bn, BD=padded_head_dim(d),
                             **_options(f, qc.dtype, qc.device))
        attention.launch(kernels._forward, (cdiv(tq, t.bm), h, b),
                         qc, qr, k, v, table, vt, out, lse, o_far, lse_far, e, *_bhd(qc), *_bhd(qr), *_bhd(k),
                         *_bhd(v), *_bhd(out), *_table_strides(table, vt), h, h // k.shape[1], tq, k.shape[2],
                         table.shape[1], d**-0.5 * LOG2E, scale * LOG2E, D=d, CAUSAL=causal, HAS_VALUES=has_values,
                         FAR=far, BM=t.bm, BN=t.bn, BD=padded_head_dim(d), FBM=f.bm, FBN=f.bn,
                         **_options(t, qc.dtype, qc.device))
        ctx.save_for_backward(qc, qr, k, v, table, vt, out, lse, e)
        ctx.causal, ctx.scale, ctx.has_values, ctx.far = causal, scale, has_values, far
        return out

    @staticmethod
    def backward(ctx, dout: Tensor):
        qc, qr, k, v, table, vt, out, lse, e = ctx.saved_tensors
        dout, delta = attention.output_gradient_and_delta(_dense_last(dout), out)  # delta (B,H,Tq)
        b, h, tq, d = qc.shape
        hkv, tk, length = k.shape[1], k.shape[2], table.shape[1]
        group = h // hkv
        scales = (d**-0.5 * LOG2E, ctx.scale * LOG2E, d**-0.5)
        shape = dict(D=d, CAUSAL=ctx.causal, HAS_VALUES=ctx.has_values, FAR=ctx.far, BD=padded_head_dim(d))
        lse_far, delta_far = _far_softmax(qr, table, vt, dout, lse, delta, ctx) if ctx.far else (lse, delta)
        strides = (*_bhd(qc), *_bhd(qr), *_bhd(k), *_bhd(v), *_bhd(dout), *_table_strides(table, vt))
        kv_dtype = k.dtype if group == 1 else torch.float32
        dk_heads = torch.empty(b, h, tk, d, device=qc.device, dtype=kv_dtype)
        dv_heads = torch.empty(b, h, tk, d, device=qc.device, dtype=kv_dtype)
        t = _relative_tiles("dkdv", qc, ctx.has_values)
        f = _far_tiles("dkdv", t, qc) if ctx.far else t
        dk_far, dv_far = dk_heads, dv_heads  # unread without far tiles
        if ctx.far:  # the far query tiles at the row kernel's tiles: dK (before the scale), dV in float32
            dk_far, dv_far = (torch.empty(b, h, tk, d, device=qc.device, dtype=torch.float32) for _ in "kv")
            attention.launch(far_kernels._far_dkdv, (cdiv(tk, f.bn), h, b), qc, k, v, dout, lse_far, delta_far,
                             dk_far, dv_far, e, *_bhd(qc), *_bhd(k), *_bhd(v), *_bhd(dout), h, group, tq, tk,
                             scales[0], D=d, CAUSAL=ctx.causal, BM=f.bm, BN=f.bn, BD=padded_head_dim(d),
                             **_options(f, qc.dtype, qc.device))
        attention.launch(kernels._dkdv, (cdiv(tk, t.bn), h, b), qc, qr, k, v, dout, lse, delta, dk_far, dv_far,
                         dk_heads, dv_heads, table, vt, e, *strides, h, group, tq, tk, length, *scales,
                         BM=t.bm, BN=t.bn, FBM=f.bm, FBN=f.bn, **shape, **_options(t, qc.dtype, qc.device))
        dk, dv = dk_heads, dv_heads
        if group > 1:
            dk = dk_heads.view(b, hkv, group, tk, d).sum(2).to(k.dtype)
            dv = dv_heads.view(b, hkv, group, tk, d).sum(2).to(v.dtype)
        t = _relative_tiles("dq", qc, ctx.has_values)
        dtable = torch.zeros(h, length, d, device=qc.device, dtype=torch.float32)  # per query head, then summed
        dvalues = torch.zeros(h if ctx.has_values else 1, length, d, device=qc.device, dtype=torch.float32)
        dqc = torch.empty(b, h, tq, d, device=qc.device, dtype=qc.dtype)
        dqr = torch.empty(b, h, tq, d, device=qc.device, dtype=torch.float32)
        f = _far_tiles("dq", t, qc) if ctx.far else t
        dq_far = dqr  # unread without far tiles
        if ctx.far:  # the far key tiles at the row kernel's tiles: dQ before the scale, float32
            dq_far = torch.empty(b, h, tq, d, device=qc.device, dtype=torch.float32)
            attention.launch(far_kernels._far_dq, (cdiv(tq, f.bm), h, b), qc, k, v, dout, lse_far, delta_far,
                             dq_far, e, *_bhd(qc), *_bhd(k), *_bhd(v), *_bhd(dout), h, group, tq, tk, scales[0],
                             D=d, CAUSAL=ctx.causal, BM=f.bm, BN=f.bn, BD=padded_head_dim(d),
                             **_options(f, qc.dtype, qc.device))
        attention.launch(kernels._dq, (cdiv(tq, t.bm), h, b), qc, qr, k, v, dout, lse, delta, dq_far, dqc, dqr,
                         table, vt, dtable, dvalues, e, *strides, h, group, tq, tk, length, *scales, BM=t.bm,
                         BN=t.bn, FBM=f.bm, FBN=f.bn, **shape, **_options(t, qc.dtype, qc.device))
        dtable = dtable * ctx.scale  # (H,S,Dh)
        if table.shape[0] == 1:  # one table for every head (Shaw)
            dtable = dtable.sum(0, keepdim=True)
        dvalues = dvalues.sum(0) if ctx.has_values else None  # (S,Dh)
        dqr = (dqr * ctx.scale).to(qr.dtype)
        return (dqc, dqr, dk, dv, dtable.to(table.dtype), None if dvalues is None else dvalues.to(vt.dtype), None,
                None, None)


def _far_tiles(kernel: str, near: Tiles, q: Tensor) -> Tiles:
    """The row kernel's tiles for a far pass (relative_far_kernels), whose blocks must hold whole blocks of the
    relative kernel's (near) tiles: its programs recompute the far block that holds theirs."""
    far = _tiles(kernel, q)
    if far.bm % near.bm or far.bn % near.bn:
        raise ValueError(f"far tiles {far.bm}x{far.bn} ({kernel}) must be multiples of {near.bm}x{near.bn}")
    return far


def _far_softmax(qr: Tensor, table: Tensor, vt: Tensor, dout: Tensor, lse: Tensor, delta: Tensor, ctx
                 ) -> tuple[Tensor, Tensor]:
    """(B,H,Tq) each: lse less the bias of the table's row 0 (base 2), delta less dO . VT[0]: with them the row
    kernel's plain loops give the p and dS of tiles whose every pair reads row 0."""
    row0 = table[:, 0].float()  # (H|1,Dh)
    bias = (qr.float() * row0[None, :, None, :]).sum(-1) * (ctx.scale * LOG2E)
    delta_far = delta - (dout.float() @ vt[0].float()) if ctx.has_values else delta
    return (lse - bias).contiguous(), delta_far.contiguous()


def _table_strides(table: Tensor, vt: Tensor) -> tuple[int, int, int]:
    """(head stride of the table, 0 where every head shares it; row stride; the values' row stride)."""
    return (table.stride(0) if table.shape[0] > 1 else 0), table.stride(1), vt.stride(-2)


def attend_relative(q: Tensor, k: Tensor, v: Tensor, relative: RelativeTable, e: Tensor, causal: bool) -> Tensor:
    """q (B,H,Tq,Dh), k/v (B,Hkv,Tk,Dh), e (B|1,) int64: the table's index of key j - i (row i reads
    table[clamp(j - i + e)]) -> (B,H,Tq,Dh). Gradients reach q, k, v and every tensor of `relative`."""
    h, dh = q.shape[1], q.shape[-1]
    table = relative.table
    if table.dim() != 3 or table.shape[0] not in (1, h) or table.shape[-1] != dh or table.shape[1] < 1:
        raise ValueError(f"relative table {tuple(table.shape)}: expected (H|1, S, Dh) with H={h}, Dh={dh}, S >= 1")
    if relative.values is not None and relative.values.shape != table.shape[1:]:
        raise ValueError(f"relative values {tuple(relative.values.shape)}: expected (S, Dh) = {tuple(table.shape[1:])}")
    qc = q if relative.q_shift is None else q + relative.q_shift.to(q.dtype)[None, :, None, :]
    qr = q if relative.row_shift is None else q + relative.row_shift.to(q.dtype)[None, :, None, :]
    values = None if relative.values is None else relative.values.to(q.dtype)
    return _RelativeAttention.apply(qc, qr, k, v, table.to(q.dtype), values, per_batch_row(e.to(q.device), q),
                                    causal, float(relative.scale))


__all__ = ["KERNELS", "attend_relative", "serves"]
