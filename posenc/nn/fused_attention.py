"""Attention with a positional bias read from rows, in one native kernel forward and backward
(posenc/nn/csrc/attention_*.cpp); no (B, H, Tq, Tk) tensor exists. Notation as in attention.py; S = row length.

    bias(b, h, i, j) = rows[b, h, i, clamp(e[b] - i + j, 0, S - 1)]

rows is (B|1, H, Tq|1, S): one row per head holds a bias of the distance (ALiBi, KERPLE, ...), one row per
query a content term (Shaw's q . a^K). The optional `mass` output (B, H, Tq, S) is the softmax weight landing
on each row index (Shaw's value term). Gradients flow to q, k, v, the rows and the mass.
float32 on CPU only; attend_rows() returns None where the kernels cannot run.
"""

from __future__ import annotations

import torch
from torch import Tensor

from posenc.nn import native


def blocks(tq: int) -> tuple[int, int]:
    """(query rows, key columns) per block, as SDPA's CPU kernel chooses them."""
    return (256 if tq >= 768 else 64 if tq >= 192 else 32), 512


def _operand(t: Tensor) -> tuple:
    """A (B, H, T, Dh) operand: pointer and (b, h, t) strides; t's stride is a BLAS leading dimension (>= Dh)."""
    b, h, n, d = t.shape
    return native.ptr(t), native.int64s(t.stride(0) if b > 1 else 0, t.stride(1) if h > 1 else 0,
                                        t.stride(2) if n > 1 else d)


def _rows(t: Tensor | None) -> tuple:
    """(B|1, H, Tq|1, S) rows: pointer and (b, h, i) strides, 0 where one row serves the whole axis."""
    if t is None:
        return None, None
    return native.ptr(t), native.int64s(*(s if n > 1 else 0 for s, n in zip(t.stride()[:3], t.shape[:3], strict=True)))


def _dense_last(t: Tensor) -> Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


class _RowBiasAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, rows, e, causal, scale, want_mass):
        q, k, v, rows = _dense_last(q), _dense_last(k), _dense_last(v), rows.contiguous()
        b, h, tq, d = q.shape
        out = torch.empty_like(q)
        lse = torch.empty(b, h, tq)  # log-sum-exp per query: the backward recomputes the weights from it
        mass = torch.empty(b, h, tq, rows.shape[-1]) if want_mass else None
        q_block, kv_block = blocks(tq)
        shape = native.int64s(b, h, k.shape[1], tq, k.shape[2], d)
        native.library().posenc_attention_forward(
            *_operand(q), *_operand(k), *_operand(v), *_operand(out), native.ptr(lse), shape, scale, int(causal),
            *_rows(rows), rows.shape[-1], native.ptr(e), native.ptr(mass), _rows(mass)[1], q_block, kv_block,
            native.threads())
        ctx.save_for_backward(q, k, v, out, lse, rows, e, mass)
        ctx.causal, ctx.scale = causal, scale
        if mass is None:
            mass = torch.empty(0)
            ctx.mark_non_differentiable(mass)
        return out, mass

    @staticmethod
    def backward(ctx, dout, dmass):
        q, k, v, out, lse, rows, e, mass = ctx.saved_tensors
        b, h, tq, d = q.shape
        dout = _dense_last(dout)
        dmass = dmass.contiguous() if mass is not None else None
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)  # the kernel accumulates
        drow = torch.zeros_like(rows) if ctx.needs_input_grad[3] else None
        q_block, kv_block = blocks(tq)
        shape = native.int64s(b, h, k.shape[1], tq, k.shape[2], d)
        native.library().posenc_attention_backward(
            *_operand(q), *_operand(k), *_operand(v), *_operand(out), *_operand(dout), native.ptr(lse),
            *_operand(dq), *_operand(dk), *_operand(dv), shape, ctx.scale, int(ctx.causal), *_rows(rows),
            rows.shape[-1], native.ptr(e), *_rows(drow), native.ptr(mass), native.ptr(dmass), _rows(mass)[1],
            min(q_block, 64), kv_block, native.threads())
        return dq, dk, dv, drow, None, None, None, None


def can_run(q: Tensor, k: Tensor, v: Tensor) -> bool:
    return (q.device.type == "cpu" and q.dtype == k.dtype == v.dtype == torch.float32 and q.dim() == 4
            and q.shape[-1] == k.shape[-1] == v.shape[-1] and q.shape[1] % k.shape[1] == 0 and native.has_gemm())


def attend_rows(q: Tensor, k: Tensor, v: Tensor, rows: Tensor, e: Tensor, causal: bool,
                want_mass: bool = False) -> tuple[Tensor, Tensor | None] | None:
    """q (B,H,Tq,Dh), k/v (B,Hkv,Tk,Dh), rows (B|1,H,Tq|1,S), e (B,) int64 -> out (B,H,Tq,Dh) and, if asked,
    mass (B,H,Tq,S); None where the kernels cannot run (not float32 on CPU, or not built)."""
    if not can_run(q, k, v):
        return None
    rows, e = rows.to(torch.float32), e.to(torch.int64).contiguous()
    out, mass = _RowBiasAttention.apply(q, k, v, rows, e, causal, q.shape[-1] ** -0.5, want_mass)
    return out, (mass if want_mass else None)


__all__ = ["attend_rows", "blocks", "can_run"]
