"""Fast RoPE kernels (no autograd: apply_rotary's autograd function calls them forward and backward), each
tested equal to the reference path.

native: posenc/nn/csrc/rotary.cpp, one pass over x for either pairing, float32 on CPU (posenc.nn.native).
triton: posenc/nn/triton/rotary.py, its GPU twin: one pass for either pairing in bf16, fp16 or fp32 (CUDA).
interleaved pairs (x[2i], x[2i+1]) are complex numbers in memory already: one complex multiply
reads x once and writes once (the memory-copy floor). half-split pairs (x[i], x[i+R/2]) are not
adjacent; a torch.compile'd kernel fuses the four products into one pass. Compilation costs ~20 s
once per process, so it is used only for tensors large enough to repay it; any failure to
compile falls back to the eager path for the rest of the process.
"""

from __future__ import annotations

import ctypes
import functools
import os
import warnings

import torch
from torch import Tensor

from posenc.nn import native
from posenc.nn import triton as gpu
from posenc.nn.kernel_checks import check_rotary

COMPILE_MIN_ELEMENTS = 1 << 22  # ~16 MB of float32: below this the eager path costs < a few ms
_compiled = None
_compile_failed = os.environ.get("POSENC_COMPILE", "1") == "0"


def rotate_interleaved_complex(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x (B,H,T,Dh) float32/64 with the first R dims as adjacent pairs; cos/sin (B,1,T,R/2)."""
    rot = 2 * cos.shape[-1]
    out = torch.empty_like(x)
    turn = torch.complex(cos.to(x.dtype), sin.to(x.dtype))  # (B,1,T,R/2)
    pairs = torch.view_as_complex(x[..., :rot].unflatten(-1, (-1, 2)))
    torch.mul(pairs, turn, out=torch.view_as_complex(out[..., :rot].unflatten(-1, (-1, 2))))
    if rot < x.shape[-1]:
        out[..., rot:] = x[..., rot:]
    return out


def _half_split(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    half = cos.shape[-1]
    x1, x2, rest = x[..., :half], x[..., half : 2 * half], x[..., 2 * half :]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest), dim=-1)


def rotate_half_split_compiled(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor | None:
    """The fused kernel, or None when compilation is unavailable (caller uses the eager path)."""
    global _compiled, _compile_failed
    if _compile_failed:
        return None
    try:
        if _compiled is None:
            _compiled = torch.compile(_half_split, dynamic=True, fullgraph=True)
        return _compiled(x, cos.to(x.dtype), sin.to(x.dtype))
    except Exception as err:
        _compile_failed = True
        warnings.warn(f"posenc: compiled RoPE unavailable ({type(err).__name__}); using eager path", stacklevel=2)
        return None


def triton_fits(x: Tensor, cos: Tensor, sin: Tensor) -> bool:
    """The Triton kernel rotates x (B,H,T,Dh) with these tables (B|1,1,T,R/2): triton installed, x on a CUDA
    device (or the interpreter's CPU); tables per head or in another layout take the eager path."""
    if not gpu.serves(x):  # first: a CPU tensor leaves here
        return False
    return _triton_shapes(x.shape, cos.shape, sin.shape)  # asked up to three times per call: answered once per shape


@functools.lru_cache(maxsize=256)
def _triton_shapes(shape: torch.Size, table: torch.Size, sin_table: torch.Size) -> bool:
    return (len(shape) == 4 and len(table) == 4 and table == sin_table and table[0] in (1, shape[0])
            and table[1] == 1 and table[2] == shape[2] and 2 * table[3] <= shape[3])


def rotate_triton(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool, sign: float = 1.0) -> Tensor | None:
    """x (B,H,T,Dh) rotated by sign * angle in one Triton pass, or None where it does not serve."""
    if not triton_fits(x, cos, sin):
        return None
    return _triton_rotary().rotate(x, cos, sin, interleaved, sign)


@functools.cache
def _triton_rotary():
    """posenc.nn.triton.rotary, imported once a tensor it serves shows up (it imports triton): an import statement
    per call cost more than a cached call, twice per layer and step."""
    from posenc.nn.triton import rotary

    return rotary


def can_use_complex(x: Tensor) -> bool:
    return x.dtype in (torch.float32, torch.float64) and x.stride(-1) == 1 and all(s % 2 == 0 for s in x.stride()[:-1])


def rotate_native(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool, sign: float = 1.0) -> Tensor | None:
    """x (B,H,T,Dh) float32 on CPU, cos/sin (B|1,1,T,R/2) -> x rotated by sign * angle; None when the
    native kernels are unavailable here or the tables are in another layout; tables wider than the head refused."""
    if x.dtype != torch.float32 or x.device.type != "cpu" or x.dim() != 4 or (lib := native.library()) is None:
        return None
    check_rotary(x, cos, sin)  # the kernel writes R = 2 * cos.shape[-1] dims of every row of out
    b, t = x.shape[0], x.shape[2]
    if cos.dim() != 4 or cos.shape[0] not in (1, b) or cos.shape[1:3] != (1, t):
        return None
    x = x if x.stride(-1) == 1 else x.contiguous()
    if cos.dtype != torch.float32 or sin.dtype != torch.float32:
        cos, sin = cos.to(torch.float32), sin.to(torch.float32)
    if cos.stride() != sin.stride() or cos.stride(-1) != 1:
        cos, sin = cos.contiguous(), sin.contiguous()
    out = torch.empty_like(x)
    if out.stride(-1) != 1:
        out = torch.empty(x.shape, dtype=x.dtype)
    strides = _native_strides(x.shape, x.stride(), out.stride(), cos.shape, cos.stride())
    lib.posenc_rotate(x.data_ptr(), strides[0], out.data_ptr(), strides[1], cos.data_ptr(), sin.data_ptr(), strides[2],
                      strides[3], int(interleaved), sign, torch.get_num_threads())  # native.threads(), inlined
    return out


def rotate_pair_native(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, interleaved: bool, cos_k: Tensor | None = None,
                       sin_k: Tensor | None = None) -> tuple[Tensor, Tensor] | None:
    """q (B,H,T,Dh) and k (B,Hkv,T,Dh) float32 on CPU rotated by tables (B|1,1,T,R/2), k by cos_k, sin_k (default:
    q's), into one new tensor (B,H+Hkv,T,Dh), returned as its two views; None where rotate_native would not serve
    either. A decode step
    rotates its own row of q and k in every layer: this is rotate_native without the concatenation, with every
    check of the layout made once per layout (_pair_layout), and one kernel call for both into one output."""
    cos_k, sin_k = (cos, sin) if cos_k is None else (cos_k, sin_k)
    if not (q.is_cpu and k.is_cpu and cos.is_cpu and cos_k.is_cpu) or (lib := native.library()) is None:
        return None
    layout = _pair_layout(q.shape, q.stride(), q.dtype, k.shape, k.stride(), k.dtype, cos.shape, cos.stride(),
                          sin.shape, sin.stride(), cos.dtype, sin.dtype, cos_k.shape, cos_k.stride(), sin_k.shape,
                          sin_k.stride(), cos_k.dtype, sin_k.dtype)
    if layout is None:
        return None
    shape, arrays, split = layout
    out = torch.empty(shape)
    lib.posenc_rotate_pair(q.data_ptr(), k.data_ptr(), out.data_ptr(), cos.data_ptr(), sin.data_ptr(),
                           cos_k.data_ptr(), sin_k.data_ptr(), arrays, int(interleaved), torch.get_num_threads())
    return out.split_with_sizes(split, 1)  # (Tensor.split's Python wrapper cost as much again)


@functools.lru_cache(maxsize=64)
def _pair_layout(q_shape, q_strides, q_dtype, k_shape, k_strides, k_dtype, cos_shape, cos_strides, sin_shape,
                 sin_strides, cos_dtype, sin_dtype, cos_k_shape, cos_k_strides, sin_k_shape, sin_k_strides,
                 cos_k_dtype, sin_k_dtype) -> tuple | None:
    """For rotate_pair_native: (the output's shape, the kernel's layout array: q's and k's strides and shapes and k's
    first element in the output, the split), or None where a layout or dtype is not the kernel's. Raises
    (check_rotary) for tables wider than the head."""
    if q_dtype != torch.float32 or k_dtype != torch.float32 or len(q_shape) != 4 or len(k_shape) != 4:
        return None
    (b, h, t, d), hkv = q_shape, k_shape[1]
    tables = ((cos_shape, cos_strides, sin_shape, sin_strides, cos_dtype, sin_dtype),
              (cos_k_shape, cos_k_strides, sin_k_shape, sin_k_strides, cos_k_dtype, sin_k_dtype))
    if (tuple(k_shape) != (b, hkv, t, d) or q_strides[-1] != 1 or k_strides[-1] != 1
            or not all(_table_fits(q_shape, *table) for table in tables)):
        return None
    shape = (b, h + hkv, t, d)
    out_strides = (shape[1] * t * d, t * d, d, 1)  # torch.empty(shape)'s
    arrays = (*_native_strides(q_shape, q_strides, out_strides, cos_shape, cos_strides),
              *_native_strides(k_shape, k_strides, out_strides, cos_k_shape, cos_k_strides))
    layout = native.int64s(*(n for array in arrays for n in array), h * t * d)  # k's rows start after q's
    return shape, layout, (h, hkv)


def _table_fits(x_shape, cos_shape, cos_strides, sin_shape, sin_strides, cos_dtype, sin_dtype) -> bool:
    """cos, sin (B|1,1,T,R/2) float32 with a shared, unit-stride last dim layout for x (B,H,T,Dh); raises
    (check_rotary) for tables wider than the head."""
    if cos_shape != sin_shape or len(cos_shape) < 1 or 2 * cos_shape[-1] > x_shape[-1]:
        check_rotary(torch.empty(x_shape, device="meta"), torch.empty(cos_shape, device="meta"),
                     torch.empty(sin_shape, device="meta"))
    return (len(cos_shape) == 4 and cos_shape[0] in (1, x_shape[0]) and tuple(cos_shape[1:3]) == (1, x_shape[2])
            and cos_dtype == sin_dtype == torch.float32 and cos_strides == sin_strides and cos_strides[-1] == 1)


@functools.lru_cache(maxsize=256)
def _native_strides(shape: tuple[int, ...], x_strides: tuple[int, ...], out_strides: tuple[int, ...],
                    cos_shape: tuple[int, ...], cos_strides: tuple[int, ...]) -> tuple[ctypes.Array, ...]:
    """The kernel's stride and shape arrays for one layout, built once: a decode step rotates one row per layer with
    the same layout every time, and building four ctypes arrays cost more than the rotation. The kernel only reads
    them."""
    b, h, t, d = shape
    cos_b = cos_strides[0] if cos_shape[0] > 1 else 0
    return (native.int64s(*x_strides[:3]), native.int64s(*out_strides[:3]), native.int64s(cos_b, cos_strides[2]),
            native.int64s(b, h, t, d, 2 * cos_shape[-1]))
