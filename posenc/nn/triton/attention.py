"""Attention with a bias of one row per head (Scheme.bias_by_distance: ALiBi, KERPLE, Sandwich, T5) on the GPU,
forward and backward, through the Triton kernels in attention_kernels.py; no (B, H, Tq, Tk) tensor exists.

    bias(b, h, i, j) = rows[h, e[b] - i + j]        rows (H, S) float32, e (B,) int64

the same indexing as posenc.nn.fused_attention's rows (its CPU twin), for rows shared by every query. The rows
must cover every key a query sees (0 <= e[b] - i + j < S wherever the mask allows): posenc.nn.row_paths builds
them over exactly the span attention reads. Gradients reach q, k, v and the rows, so a scheme's parameters
(KERPLE's b, a, p; T5's bucket table) train through the rows' own autograd graph. The row gradient is summed
per tile along its diagonals into a buffer of (B, H, Tq / BM, Tk + BN) floats and reduced in a fixed order:
no atomics, so it repeats bit for bit (the buffer is about 4 Tq Tk / BM bytes per (b, h): 200 MB at Tq = Tk
= 16k, H = 12, BM = 64).

Rows per query (Shaw, Transformer-XL), FIRE's pieces and CoPE have no Triton kernel yet: on CUDA they take the
flex (inference) or chunked path (posenc.nn.bias_paths).
"""

from __future__ import annotations

import torch
import triton
from torch import Tensor

from posenc.nn.fused_attention import per_batch_row
from posenc.nn.triton import attention_kernels as kernels

REDUCE_BLOCK = 256  # row elements per program of the row-gradient reduction


def blocks(head_dim: int, device: torch.device) -> tuple[int, int]:
    """(BM, BN) tile of queries x keys. Not tuned on a GPU yet (no measurement; see the issue note): 64 x 64 is
    FlashAttention-2's usual tile for Dh <= 128 in 16-bit types; the interpreter runs 16 x 16 (tests)."""
    if device.type == "cpu":
        return 16, 16
    return (64, 64) if head_dim <= 128 else (32, 32)


def _launch_options(device: torch.device, dtype: torch.dtype) -> dict:
    interpreted = device.type == "cpu"
    tf32 = dtype != torch.float32 or torch.backends.cuda.matmul.allow_tf32  # fp32 keeps fp32 unless allowed
    options = {"PRECISION": "tf32" if tf32 and not interpreted else "ieee", "UPCAST": interpreted}
    if not interpreted:
        options.update(num_warps=4, num_stages=2)
    return options


def _dense_last(t: Tensor) -> Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def _bhd(t: Tensor) -> tuple[int, int, int]:
    return t.stride(0), t.stride(1), t.stride(2)


class _RowBiasAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, rows: Tensor, e: Tensor, causal: bool) -> Tensor:
        q, k, v = _dense_last(q), _dense_last(k), _dense_last(v)
        b, h, tq, d = q.shape
        bm, bn = blocks(d, q.device)
        out = torch.empty_like(q, memory_format=torch.contiguous_format)  # (B,H,Tq,Dh)
        lse = torch.empty(b, h, tq, device=q.device, dtype=torch.float32)  # base 2; the backward's softmax
        kernels._forward[(triton.cdiv(tq, bm), b * h)](
            q, k, v, out, lse, rows, e, *_bhd(q), *_bhd(k), *_bhd(v), *_bhd(out),
            h, h // k.shape[1], tq, k.shape[2], d, rows.shape[1], d**-0.5 * kernels.LOG2E,
            CAUSAL=causal, BM=bm, BN=bn, BD=max(16, triton.next_power_of_2(d)), **_launch_options(q.device, q.dtype))
        ctx.save_for_backward(q, k, v, out, lse, rows, e)
        ctx.causal = causal
        return out

    @staticmethod
    def backward(ctx, dout: Tensor):
        q, k, v, out, lse, rows, e = ctx.saved_tensors
        dout = _dense_last(dout)
        b, h, tq, d = q.shape
        hkv, tk, length = k.shape[1], k.shape[2], rows.shape[1]
        bm, bn = blocks(d, q.device)
        delta = (dout.float() * out.float()).sum(-1)  # (B,H,Tq): rowsum(dO * O), FlashAttention-2's D
        dq = torch.empty(b, h, tq, d, device=q.device, dtype=q.dtype)
        dk = torch.empty(b, hkv, tk, d, device=q.device, dtype=k.dtype)
        dv = torch.empty(b, hkv, tk, d, device=q.device, dtype=v.dtype)
        common = dict(CAUSAL=ctx.causal, BM=bm, BN=bn, BD=max(16, triton.next_power_of_2(d)),
                      **_launch_options(q.device, q.dtype))
        strides = (*_bhd(q), *_bhd(k), *_bhd(v), *_bhd(dout))
        scales = (d**-0.5 * kernels.LOG2E, d**-0.5)
        kernels._dkdv[(triton.cdiv(tk, bn), b * hkv)](q, k, v, dout, lse, delta, dk, dv, rows, e, *strides,
                                                       h, h // hkv, tq, tk, d, length, *scales, **common)
        row_grad = ctx.needs_input_grad[3]
        q_blocks, diag_len = triton.cdiv(tq, bm), triton.cdiv(tk, bn) * bn + bn
        diag = torch.zeros(b * h, q_blocks, diag_len if row_grad else 1, device=q.device, dtype=torch.float32)
        kernels._dq[(q_blocks, b * h)](q, k, v, dout, lse, delta, dq, rows, e, diag, *strides,
                                       h, h // hkv, tq, tk, d, length, diag.shape[-1], *scales,
                                       ROW_GRAD=row_grad, **common)
        drow = None
        if row_grad:
            drow = torch.empty_like(rows)
            kernels._row_reduce[(h, triton.cdiv(length, REDUCE_BLOCK))](diag, e, drow, b, h, q_blocks, diag_len,
                                                                       length, BM=bm, BR=REDUCE_BLOCK)
        return dq, dk, dv, drow, None, None


def attend_rows(q: Tensor, k: Tensor, v: Tensor, rows: Tensor, e: Tensor, causal: bool) -> Tensor:
    """q (B,H,Tq,Dh), k/v (B,Hkv,Tk,Dh) in bf16, fp16 or fp32 (one dtype), rows (H,S) or (1,H,1,S), e (B,)
    -> (B,H,Tq,Dh) in q's dtype, accumulated in float32. Causal needs Tq <= Tk (queries are the last keys)."""
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v dtypes: {q.dtype}, {k.dtype}, {v.dtype}; expected one dtype")
    if q.shape[1] % k.shape[1] != 0:
        raise ValueError(f"query heads H={q.shape[1]}: expected a multiple of the key heads Hkv={k.shape[1]}")
    if causal and q.shape[2] > k.shape[2]:
        raise ValueError(f"causal attention with Tq={q.shape[2]} queries: expected Tq <= Tk={k.shape[2]}")
    rows = rows.reshape(q.shape[1], rows.shape[-1]).to(torch.float32).contiguous()  # (H,S)
    return _RowBiasAttention.apply(q, k, v, rows, per_batch_row(e.to(q.device), q), causal)


__all__ = ["attend_rows", "blocks"]
