"""CoPE's attention (posenc.content.cope: gates, a reverse cumulative sum, an interpolated table) on the GPU,
forward and backward, through the Triton kernels in cope_kernels.py; no (B, H, Tq, Tk) tensor exists, in
training either. The GPU twin of posenc.nn.fused_attention.attend_contextual (csrc/cope.cpp): the same rows
(B, H, Tq, P) = q . e[n] in, the same gradients out (q, k, v and the rows, from which autograd reaches the table
through CoPE.contextual_rows). Causal only, as CoPE is; the Tq queries are the last Tq of the Tk keys.

The backward keeps, per query, two carries per key tile (cope_kernels' docstring): 8 Tq Tk / BN bytes per
(b, h), the same order as the row kernel's diagonal buffer (attention.py); dQ runs in two launches, the tiles with
gates and then the far keys (its float32 part of dQ between them: 4 Tq Dh bytes per (b, h)). Launches go through
attention.launch, so benchmarks/gpu_static.py compiles exactly what runs here.
"""

from __future__ import annotations

import torch
from torch import Tensor

from posenc.nn.triton import attention, cdiv
from posenc.nn.triton import cope_kernels as kernels
from posenc.nn.triton.attention import INTERPRETED_TILES, Tiles, _bhd, _check_sizes, _dense_last, _options

# (kernel, padded head dim) -> Tiles on a GPU, chosen by the static table (python -m benchmarks.gpu_static): tiles
# that spill no register and fit 227 KB of shared memory. The loops with gates (the tiles within P - 1 gates of
# the diagonal) hold the registers: at Dh 64, a 64 x 64 forward spilled 104-184 B, a 32 x 32 dQ 320 B; dQ's and
# dK/dV's 16-query tiles spill nothing. dQ's and dK/dV's loops hold per-row sums and scans (the gates' count, dpos'
# suffix): with 16 queries over 8 warps each row spans all 8 (57 barriers and 150 shared loads and stores per tile),
# so 4 warps: SASS instructions per pair and warp (loop x warps / pairs) at bf16 Dh 64 / 128, TF32 Dh 64, 8 -> 4
# warps: dq 13.4 -> 7.6 / 14.4 -> 8.6 / 14.6 -> 8.6 (255 registers, 0 spilled); dkdv (both branches) 10.8 -> 6.1 /
# 11.5 -> 6.3 (TF32 at 4 warps spilled 8 B: 8 warps kept). dq_far (dQ's keys past P - 1 gates, a pass of its own:
# plain tiles) at 64 x 64, 4 warps: 0.28 / 0.34 / 0.49 per pair, against 1.44 / 2.07 / 2.28 for the far loop inside
# the 16-query dQ (16 x 64 tiles over 8 warps); 128 x 64 at 8 warps saves 0-12% more per pair but doubles the
# spread of the far keys' ends over a block (the masked tiles). dq and dkdv share BN (the carries are stored per
# key tile of BN; the ends are multiples of it).
_BY_HEAD_DIM = {
    "forward": {16: Tiles(32, 32, 8, 1), **dict.fromkeys((32, 64, 128), Tiles(64, 32, 4, 2))},
    "dq": {16: Tiles(16, 16, 4, 1), **dict.fromkeys((32, 64, 128), Tiles(16, 32, 4, 1))},
    "dq_far": dict.fromkeys((16, 32, 64, 128), Tiles(64, 64, 4, 2)),
    "dkdv": {16: Tiles(16, 16, 4, 1), **dict.fromkeys((32, 64, 128), Tiles(16, 32, 4, 1))},
}
_FP32_BY_HEAD_DIM = {  # TF32 (attention.serves_float32): 4-byte operands
    "forward": dict.fromkeys((16, 32, 64), Tiles(32, 32, 8, 1)),
    "dq": {16: Tiles(16, 16, 4, 1), **dict.fromkeys((32, 64), Tiles(16, 32, 4, 1))},
    "dq_far": dict.fromkeys((16, 32, 64), Tiles(64, 64, 4, 2)),
    "dkdv": {16: Tiles(16, 16, 4, 1), **dict.fromkeys((32, 64), Tiles(16, 32, 8, 1))},
}
# Key tiles per tile of the forward's far loop (keys past P - 1 counted gates: no gates, one bias per query). Its
# registers stay under the gated loop's, so a wider tile costs none: a 64 x 64 forward tile takes 553 loop
# instructions per warp (1,024 pairs) at Dh 64 against 2 x 299 for two 64 x 32 tiles.
FAR_WIDTH = 2
TILES = {(kernel, dim, dtype): t
         for dtype, table in ((torch.bfloat16, _BY_HEAD_DIM), (torch.float16, _BY_HEAD_DIM),
                              (torch.float32, _FP32_BY_HEAD_DIM))
         for kernel, by_dim in table.items() for dim, t in by_dim.items()}


def serves(head_dim: int, dtype: torch.dtype) -> bool:
    """A head dim the tiles above cover for this dtype (wider heads spilled: the chunked path serves them)."""
    return ("dq", attention.padded_head_dim(head_dim), dtype) in TILES


def gpu_tiles(kernel: str, head_dim: int, dtype: torch.dtype) -> Tiles:
    return TILES[kernel, attention.padded_head_dim(head_dim), dtype]


def tiles(kernel: str, head_dim: int, device: torch.device, dtype: torch.dtype) -> Tiles:
    """The GPU table, or the interpreter's small tiles on a CPU (tests and the static check replace this)."""
    return INTERPRETED_TILES if device.type == "cpu" else gpu_tiles(kernel, head_dim, dtype)


def _sizes(q: Tensor, k: Tensor, rows: Tensor) -> tuple[int, ...]:
    """The kernels' H, GROUP, TQ, TK, P."""
    return q.shape[1], q.shape[1] // k.shape[1], q.shape[2], k.shape[2], rows.shape[-1]


def _head(d: int) -> dict:
    return dict(D=d, BD=attention.padded_head_dim(d))


class _ContextualAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, rows: Tensor) -> Tensor:
        q, k, v, rows = _dense_last(q), _dense_last(k), _dense_last(v), rows.contiguous()
        _check_sizes(q, k, v)
        b, h, tq, d = q.shape
        t = tiles("forward", d, q.device, q.dtype)
        out = torch.empty_like(q, memory_format=torch.contiguous_format)  # (B,H,Tq,Dh)
        lse = torch.empty(b, h, tq, device=q.device, dtype=torch.float32)  # base 2; the backward's softmax
        attention.launch(kernels._cope_forward, (cdiv(tq, t.bm), h, b), q, k, v, out, lse, rows,
                         *_bhd(q), *_bhd(k), *_bhd(v), *_bhd(out), *_sizes(q, k, rows), d**-0.5, **_head(d),
                         BM=t.bm, BN=t.bn, FAR=FAR_WIDTH, **_options(t, q.dtype, q.device))
        ctx.save_for_backward(q, k, v, out, lse, rows)
        return out

    @staticmethod
    def backward(ctx, dout: Tensor):
        q, k, v, out, lse, rows = ctx.saved_tensors
        dout, delta = attention.output_gradient_and_delta(_dense_last(dout), out)  # delta (B,H,Tq)
        b, h, tq, d = q.shape
        hkv, tk = k.shape[1], k.shape[2]
        group = h // hkv
        t_dq, t_kv = tiles("dq", d, q.device, q.dtype), tiles("dkdv", d, q.device, q.dtype)
        key_tiles = cdiv(tk, t_dq.bn)  # the carries' tiles: _dkdv must walk the same ones
        carry_g = torch.empty(b, h, tq, key_tiles, device=q.device, dtype=torch.float32)  # gated tiles' only
        carry_d = torch.empty_like(carry_g)
        total = torch.empty(b, h, tq, device=q.device, dtype=torch.float32)  # D_i
        end = torch.empty(b, h, tq, device=q.device, dtype=torch.int32)  # keys j < end[i]: the far pass's
        drows = torch.zeros_like(rows)  # (B,H,Tq,P) float32
        dq_near = torch.empty(b, h, tq, d, device=q.device, dtype=torch.float32)  # the gated pass's dQ
        dq = torch.empty(b, h, tq, d, device=q.device, dtype=q.dtype)
        strides = (*_bhd(q), *_bhd(k), *_bhd(v), *_bhd(dout))
        scalars = (*_sizes(q, k, rows), key_tiles, d**-0.5)
        attention.launch(kernels._cope_dq, (cdiv(tq, t_dq.bm), h, b), q, k, v, dout, lse, delta, dq_near, end, rows,
                         drows, carry_g, carry_d, total, *strides, *scalars, **_head(d), BM=t_dq.bm, BN=t_dq.bn,
                         **_options(t_dq, q.dtype, q.device))
        t_far = tiles("dq_far", d, q.device, q.dtype)
        attention.launch(kernels._cope_dq_far, (cdiv(tq, t_far.bm), h, b), q, k, v, dout, lse, delta, dq, dq_near,
                         end, rows, drows, *strides, *_sizes(q, k, rows), d**-0.5, **_head(d), BM=t_far.bm,
                         BN=t_far.bn, **_options(t_far, q.dtype, q.device))
        kv_dtype = k.dtype if group == 1 else torch.float32  # a GQA group's heads are added up in float32 after
        dk_heads = torch.empty(b, h, tk, d, device=q.device, dtype=kv_dtype)
        dv_heads = torch.empty(b, h, tk, d, device=q.device, dtype=kv_dtype)
        attention.launch(kernels._cope_dkdv, (key_tiles, h, b), q, k, v, dout, lse, delta, dk_heads, dv_heads, rows,
                         end, carry_g, carry_d, total, *strides, *scalars, **_head(d), BM=t_kv.bm, BN=t_dq.bn,
                         **_options(t_kv, q.dtype, q.device))
        dk, dv = dk_heads, dv_heads
        if group > 1:
            dk = dk_heads.view(b, hkv, group, tk, d).sum(2).to(k.dtype)
            dv = dv_heads.view(b, hkv, group, tk, d).sum(2).to(v.dtype)
        return dq, dk, dv, drows


def attend_contextual(q: Tensor, k: Tensor, v: Tensor, rows: Tensor) -> Tensor:
    """Causal attention with CoPE's bias: q (B,H,Tq,Dh), k/v (B,Hkv,Tk,Dh) in bf16, fp16 or fp32 (one dtype),
    rows (B,H,Tq,P) = q . e[n] (CoPE.contextual_rows) -> (B,H,Tq,Dh) in q's dtype, accumulated in float32."""
    attention.check_qkv(q, k, v, True)
    if rows.dim() != 4 or rows.shape[:3] != q.shape[:3] or rows.shape[3] < 1 or not rows.is_floating_point():
        raise ValueError(f"CoPE rows {tuple(rows.shape)} {rows.dtype}: expected floats (B,H,Tq,P >= 1) = "
                         f"({', '.join(map(str, q.shape[:3]))}, P) for q {tuple(q.shape)}")
    return _ContextualAttention.apply(q, k, v, rows.to(torch.float32))


__all__ = ["TILES", "attend_contextual", "gpu_tiles", "serves", "tiles"]
