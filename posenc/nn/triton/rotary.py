"""RoPE on the GPU: one Triton pass that reads x once and writes it once (the memory-copy floor), for both
pairings, in bf16, fp16 or fp32, computing in float32 and rounding once (as posenc.rotary._core does).

    half-split  (GPT-NeoX, HF Llama): pair p = (x[p], x[p + R/2])
    interleaved (GPT-J, Meta Llama):  pair p = (x[2p], x[2p + 1])
    (a, b) -> (a cos - b sin, b cos + a sin)   with sin negated for the backward: R(theta)^T = R(-theta)

cos/sin are the tables posenc.rotary builds (every scaling is already in them): (B|1, 1, T, R/2) float32.
Dims past R pass through. One program per (block of positions, batch row) rotates every head, so each table
entry is read once per batch row, not once per head.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

POSITIONS_PER_PROGRAM = 16


@triton.jit
def _rotate(X, OUT, COS, SIN, sxb, sxh, sxt, sob, soh, sot, scb, sct,
            H, T, D, HALF, sign,
            INTERLEAVED: tl.constexpr, BT: tl.constexpr, BP: tl.constexpr, BREST: tl.constexpr):
    t = tl.program_id(0) * BT + tl.arange(0, BT)
    b = tl.program_id(1)
    p = tl.arange(0, BP)
    mask = (t[:, None] < T) & (p[None, :] < HALF)
    table = b * scb + t[:, None] * sct + p[None, :]
    cos = tl.load(COS + table, mask=mask, other=0.0)  # (BT,BP) float32
    sin = tl.load(SIN + table, mask=mask, other=0.0) * sign
    if INTERLEAVED:
        first, second = 2 * p, 2 * p + 1
    else:
        first, second = p, p + HALF
    for h in range(0, H):
        x = X + b * sxb + h * sxh + t[:, None] * sxt
        out = OUT + b * sob + h * soh + t[:, None] * sot
        x1 = tl.load(x + first[None, :], mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(x + second[None, :], mask=mask, other=0.0).to(tl.float32)
        tl.store(out + first[None, :], (x1 * cos - x2 * sin).to(OUT.dtype.element_ty), mask=mask)
        tl.store(out + second[None, :], (x2 * cos + x1 * sin).to(OUT.dtype.element_ty), mask=mask)
        if BREST > 0:  # the dims past R, copied
            rest = 2 * HALF + tl.arange(0, BREST)
            rest_mask = (t[:, None] < T) & (rest[None, :] < D)
            tl.store(out + rest[None, :], tl.load(x + rest[None, :], mask=rest_mask), mask=rest_mask)


def rotate(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool, sign: float = 1.0,
           out: Tensor | None = None) -> Tensor:
    """x (B,H,T,Dh) rotated by sign * angle -> out (a new tensor, or `out`, which may be x itself: in place).
    cos/sin (B|1,1,T,R/2) with R <= Dh. No autograd (posenc.rotary._core's function calls this both ways)."""
    b, h, t, d = x.shape
    half = cos.shape[-1]
    if cos.shape != sin.shape or cos.dim() != 4 or cos.shape[0] not in (1, b) or cos.shape[1:3] != (1, t):
        raise ValueError(f"cos/sin shape {tuple(cos.shape)}: expected (1 or {b}, 1, {t}, R/2) for x {tuple(x.shape)}")
    if 2 * half > d:
        raise ValueError(f"rotary dims R={2 * half}: expected R <= head_dim={d}")
    x = x if x.stride(-1) == 1 else x.contiguous()
    cos, sin = (c.to(device=x.device, dtype=torch.float32) for c in (cos, sin))
    if cos.stride() != sin.stride() or cos.stride(-1) != 1:
        cos, sin = cos.contiguous(), sin.contiguous()
    if out is None:
        out = torch.empty(x.shape, device=x.device, dtype=x.dtype)
    rest = d - 2 * half
    grid = (triton.cdiv(t, POSITIONS_PER_PROGRAM), b)
    _rotate[grid](x, out, cos, sin, *x.stride()[:3], *out.stride()[:3], cos.stride(0) if cos.shape[0] > 1 else 0,
                  cos.stride(2), h, t, d, half, sign, INTERLEAVED=interleaved, BT=POSITIONS_PER_PROGRAM,
                  BP=max(triton.next_power_of_2(half), 1), BREST=triton.next_power_of_2(rest) if rest else 0)
    return out


__all__ = ["rotate"]
