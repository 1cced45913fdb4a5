"""Row-bias attention (attention.py) for rows read from a table by a fixed bucket per distance (Scheme.bucket_bias:
T5): the same forward and dK/dV; dQ's kernel (bucket_bias_kernels.py) sums dS per bucket and tile into the table's
gradient (H,NB), in place of the row gradient by distance that attention.py's dQ builds (diagonal sums of every
tile into a (B, H, Tq / BM, Tk + BN) buffer, then a reduction).

    bias(b, h, i, j) = table[h, buckets[e[b] - i + j]],   dL/dtable[h, k] = sum of dS[b,h,i,j] where that bucket is k

The host marks each window of BM + BN - 1 row elements (one tile's distances) with its one bucket, or -1 where it
spans several; each program writes its NBP sums once and the host adds them over batch rows and query blocks in a
fixed order (no atomics: results repeat bit for bit).
"""

from __future__ import annotations

import torch
from torch import Tensor

from posenc.inference_tensors import DerivedPerTensor
from posenc.nn.fused_attention import per_batch_row
from posenc.nn.triton import attention, cdiv, next_power_of_2
from posenc.nn.triton import bucket_bias_kernels as kernels
from posenc.nn.triton.attention import (
    _bhd,
    _dense_last,
    _options,
    _RowBiasAttention,
    key_gradients,
    output_gradient_and_delta,
    padded_head_dim,
)

LOG2E = attention.kernels.LOG2E
MAX_BUCKETS = 128  # totals per program (NBP,) and the one-hot (BN, NBP) of a tile spanning several buckets
# attention.tiles and attention.launch are looked up at each call: the static check and the tests replace them


def _padded_buckets(buckets: Tensor, pad: int, window: int) -> tuple[Tensor, Tensor]:
    """buckets (S,) -> views, starting at the real data, of (S + 2 pad) int32 buckets (the end values repeated over
    the padding: pairs there are masked, dS = 0) and of the windows' marks: at o, the one bucket of elements
    o .. o + window - 1, or -1 where they hold several."""
    buckets = buckets.to(torch.int32)
    padded = torch.cat((buckets[:1].expand(pad), buckets, buckets[-1:].expand(pad + window - 1)))
    windows = padded.unfold(0, window, 1)  # (S + 2 pad, window)
    low, high = windows.amin(1), windows.amax(1)
    marks = torch.where(low == high, low, -1)
    return padded[pad:], marks[pad:]


# Once per forward: every layer's backward reads the same buckets tensor (row_paths builds it once per forward).
padded_buckets = DerivedPerTensor(_padded_buckets)


class _BucketBiasAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, table: Tensor, rows: Tensor, biased: Tensor, buckets: Tensor,
                e: Tensor, causal: bool) -> Tensor:
        out = _RowBiasAttention.forward(ctx, q, k, v, rows, biased, e, causal)
        ctx.buckets, ctx.n_buckets = buckets, table.shape[1]
        return out

    @staticmethod
    def backward(ctx, dout: Tensor):
        q, k, v, out, lse, biased, e = ctx.saved_tensors
        dout, delta = output_gradient_and_delta(_dense_last(dout), out)  # delta (B,H,Tq)
        b, h, tq, d = q.shape
        dk, dv = key_gradients(ctx, q, k, v, dout, lse, delta, biased, e)
        t = attention.tiles("dq_buckets", d, q.device, q.dtype)
        pad = attention.row_pad(d, q.device, q.dtype) + t.bn
        buckets, marks = padded_buckets(ctx.buckets, pad, t.bm + t.bn - 1)
        q_blocks, slots = cdiv(tq, t.bm), next_power_of_2(ctx.n_buckets)
        sums = torch.empty(b, h, q_blocks, slots, device=q.device, dtype=torch.float32)
        dq = torch.empty(b, h, tq, d, device=q.device, dtype=q.dtype)
        attention.launch(kernels._dq_buckets, (q_blocks, h, b), q, k, v, dout, lse, delta, dq, biased, buckets, marks,
                         e, sums, *_bhd(q), *_bhd(k), *_bhd(v), *_bhd(dout), h, h // k.shape[1], tq, k.shape[2],
                         ctx.row_stride, d**-0.5 * LOG2E, d**-0.5, D=d, CAUSAL=ctx.causal, BM=t.bm, BN=t.bn,
                         NBP=slots, BD=padded_head_dim(d), **_options(t, q.dtype, q.device))
        dtable = sums.sum((0, 2))[:, :ctx.n_buckets]  # (H,NB): batch rows and query blocks added in a fixed order
        return dq, dk, dv, dtable, None, None, None, None, None


def attend_bucket_bias(q: Tensor, k: Tensor, v: Tensor, table: Tensor, buckets: Tensor, e: Tensor,
                       causal: bool) -> Tensor:
    """attention.attend_rows with rows[h, s] = table[h, buckets[s]]: table (H,NB) with NB <= MAX_BUCKETS, buckets
    (S,) integers in [0, NB); the gradient reaches table. q (B,H,Tq,Dh), k/v (B,Hkv,Tk,Dh), e (B,) -> (B,H,Tq,Dh)."""
    attention.check_qkv(q, k, v, causal)
    h = q.shape[1]
    if table.dim() != 2 or table.shape[0] != h or not 1 <= table.shape[1] <= MAX_BUCKETS:
        raise ValueError(f"table {tuple(table.shape)}: expected (H,NB) with H={h} and 1 <= NB <= {MAX_BUCKETS}")
    if buckets.dim() != 1 or buckets.numel() < 1 or buckets.is_floating_point():
        raise ValueError(f"buckets {tuple(buckets.shape)} {buckets.dtype}: expected integers (S,) with S >= 1")
    rows = table.detach().to(torch.float32)[:, buckets]  # (H,S)
    biased = attention.padded_rows(rows, attention.row_pad(q.shape[-1], q.device, q.dtype))
    return _BucketBiasAttention.apply(q, k, v, table, rows, biased, buckets, per_batch_row(e.to(q.device), q),
                                      causal)


__all__ = ["MAX_BUCKETS", "attend_bucket_bias"]
