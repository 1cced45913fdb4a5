"""RoPE on the GPU: one Triton pass that reads x once and writes it once (the memory-copy floor), for both
pairings, in bf16, fp16 or fp32, computing in float32 and rounding once (as posenc.rotary._core does).

    half-split  (GPT-NeoX, HF Llama): pair p = (x[p], x[p + R/2])
    interleaved (GPT-J, Meta Llama):  pair p = (x[2p], x[2p + 1])
    (a, b) -> (a cos - b sin, b cos + a sin)   with sin negated for the backward: R(theta)^T = R(-theta)

Each output is a * cos rounded, then one fma with b * sin: the rounding of torch's mul then addcmul, which the
other rotation paths use (a mapped decode step's Turns, the eager kernel, the CPU's native kernel), so a key
rotated here and the same key rotated by a decode step are one key. (Written out, not left to the compiler:
whether it fuses a multiply and an add, and which product, would be its choice.)

cos/sin are the tables posenc.rotary builds (every scaling is already in them): (B|1, 1, T, R/2) float32.
Dims past R pass through. One program per (block of positions, head, batch row): heads on the grid, so a
(1, 32, 4096, 128) tensor runs 4,096 programs, not 256 that loop over heads. Every load is contiguous: the
half-split halves as two runs, the interleaved pairs as one run of R values split in registers.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from torch import Tensor

from posenc.nn.triton import cdiv, next_power_of_2

BYTES_PER_PROGRAM = 8192  # positions per program: about this many bytes of x (enough loads in flight per SM)


@triton.jit
def _rotate(X, OUT, COS, SIN, sxb, sxh, sxt, sob, soh, sot, scb, sct, T, sign,
            D: tl.constexpr, HALF: tl.constexpr, INTERLEAVED: tl.constexpr, COPY_REST: tl.constexpr,
            BT: tl.constexpr, BP: tl.constexpr, BREST: tl.constexpr):
    t = tl.program_id(0) * BT + tl.arange(0, BT)
    h = tl.program_id(1).to(tl.int64)
    b = tl.program_id(2).to(tl.int64)
    p = tl.arange(0, BP)
    t_ok = t[:, None] < T
    mask = t_ok & (p[None, :] < HALF)
    table = b * scb + t[:, None] * sct + p[None, :]
    cos = tl.load(COS + table, mask=mask, other=0.0)  # (BT,BP) float32
    sin = tl.load(SIN + table, mask=mask, other=0.0) * sign
    x_row = X + b * sxb + h * sxh + t[:, None] * sxt
    out_row = OUT + b * sob + h * soh + t[:, None] * sot
    if INTERLEAVED:  # one contiguous run of 2 BP values, pairs split in registers
        c = tl.arange(0, 2 * BP)
        run_mask = t_ok & (c[None, :] < 2 * HALF)
        x1, x2 = tl.split(tl.reshape(tl.load(x_row + c[None, :], mask=run_mask, other=0.0).to(tl.float32),
                                     (BT, BP, 2)))
        rotated = tl.reshape(tl.join(tl.fma(-x2, sin, x1 * cos), tl.fma(x1, sin, x2 * cos)), (BT, 2 * BP))
        tl.store(out_row + c[None, :], rotated.to(OUT.dtype.element_ty), mask=run_mask)
    else:
        x1 = tl.load(x_row + p[None, :], mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(x_row + HALF + p[None, :], mask=mask, other=0.0).to(tl.float32)
        tl.store(out_row + p[None, :], tl.fma(-x2, sin, x1 * cos).to(OUT.dtype.element_ty), mask=mask)
        tl.store(out_row + HALF + p[None, :], tl.fma(x1, sin, x2 * cos).to(OUT.dtype.element_ty), mask=mask)
    if COPY_REST:  # the dims past R, copied (not needed in place)
        rest = 2 * HALF + tl.arange(0, BREST)
        rest_mask = t_ok & (rest[None, :] < D)
        tl.store(out_row + rest[None, :], tl.load(x_row + rest[None, :], mask=rest_mask), mask=rest_mask)


def launch(kernel, grid: tuple[int, ...], *args, **options) -> None:
    """Every launch of this module (the static check, benchmarks/gpu_static.py, compiles these instead)."""
    kernel[grid](*args, **options)


def positions_per_program(head_dim: int, element_size: int) -> int:
    return max(1, min(128, next_power_of_2(max(1, BYTES_PER_PROGRAM // (head_dim * element_size)))))


@functools.lru_cache(maxsize=1024)
def _launch_shape(t: int, d: int, half: int, element_size: int, interleaved: bool,
                  copy_rest: bool) -> tuple[int, dict[str, int | bool]]:
    """(position blocks on the grid's first axis, the kernel's constexprs) for one shape."""
    block = positions_per_program(d, element_size)
    rest = d - 2 * half
    return cdiv(t, block), dict(
        D=d, HALF=half, INTERLEAVED=interleaved, COPY_REST=copy_rest, BT=block,
        BP=max(next_power_of_2(half), 1), BREST=next_power_of_2(rest) if rest else 1)


def rotate(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool, sign: float = 1.0,
           out: Tensor | None = None) -> Tensor:
    """x (B,H,T,Dh) rotated by sign * angle -> out (a new tensor, or `out`, which may be x itself: in place).
    cos/sin (B|1,1,T,R/2) with R <= Dh. No autograd (posenc.rotary._core's function calls this both ways).
    Host time counts here (a small rotation is launch-bound, forward and backward per layer per step): what the
    layouts decide is worked out once per layout (_plan), and a call reads each tensor's layout once."""
    ready, grid, arguments, constexprs = _plan_for(x, cos, sin, interleaved, out)
    device = x.device
    if not ready or cos.device != device or sin.device != device:
        x, cos, sin = _kernel_layout(x, cos, sin)
        grid, arguments, constexprs = _plan_for(x, cos, sin, interleaved, out)[1:]  # as they are now
    if out is None:
        out = torch.empty_like(x, memory_format=torch.contiguous_format)  # cheaper than torch.empty(shape, ...)
    launch(_rotate, grid, x, out, cos, sin, *arguments, sign, **constexprs)
    return out


def _plan_for(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool, out: Tensor | None) -> tuple:
    in_place = out is not None and out.data_ptr() == x.data_ptr()
    return _plan(x.shape, x.stride(), x.dtype, cos.shape, cos.stride(), cos.dtype, sin.shape, sin.stride(), sin.dtype,
                 interleaved, None if out is None else out.stride(), in_place)


def _kernel_layout(x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """x with contiguous rows, cos/sin float32 on x's device in one layout with contiguous rows: what the kernel
    reads (each conversion only where needed)."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    device = x.device
    if cos.dtype != torch.float32 or cos.device != device or sin.dtype != torch.float32 or sin.device != device:
        cos, sin = (c.to(device=device, dtype=torch.float32) for c in (cos, sin))
    if cos.stride() != sin.stride() or cos.stride(-1) != 1:
        cos, sin = cos.contiguous(), sin.contiguous()
    return x, cos, sin


@functools.lru_cache(maxsize=1024)
def _plan(shape: torch.Size, strides: tuple[int, ...], dtype: torch.dtype, table: torch.Size,
          table_strides: tuple[int, ...], table_dtype: torch.dtype, sin_table: torch.Size,
          sin_strides: tuple[int, ...], sin_dtype: torch.dtype, interleaved: bool,
          out_strides: tuple[int, ...] | None, in_place: bool) -> tuple:
    """(ready, the grid, the kernel's stride and length arguments, its constexprs) for one layout of x (B,H,T,Dh),
    its tables (B|1,1,T,R/2) and out (None: a new contiguous tensor; in_place: out shares x's memory). ready: x's
    rows and the tables are already as the kernel reads them (_kernel_layout would change nothing, the devices
    apart). Raises for shapes it cannot rotate, before any work."""
    b, h, t, d = shape
    half = table[-1]
    if table != sin_table or len(table) != 4 or table[0] not in (1, b) or table[1:3] != (1, t):
        raise ValueError(f"cos/sin shape {tuple(table)}: expected (1 or {b}, 1, {t}, R/2) for x {tuple(shape)}")
    if 2 * half > d:
        raise ValueError(f"rotary dims R={2 * half}: expected R <= head_dim={d}")
    if h > 65_535 or b > 65_535:
        raise ValueError(f"RoPE on the GPU: B={b}, H={h}; each sits on a grid axis of at most 65535")
    ready = (strides[-1] == 1 and table_dtype == torch.float32 and sin_dtype == torch.float32
             and table_strides == sin_strides and table_strides[-1] == 1)
    out_strides = out_strides or (h * t * d, t * d, d, 1)  # None: empty_like's, contiguous
    blocks, constexprs = _launch_shape(t, d, half, dtype.itemsize, interleaved, d > 2 * half and not in_place)
    table_batch = table_strides[0] if table[0] > 1 else 0
    return ready, (blocks, h, b), (*strides[:3], *out_strides[:3], table_batch, table_strides[2], t), constexprs


__all__ = ["launch", "rotate"]
