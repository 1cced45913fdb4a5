"""Triton kernels for the GPU: attention whose bias is built per tile from one row per head, attention under a
position map (mapped.py: the map chosen per pair in each tile), and RoPE.

They mirror the native CPU kernels (posenc/nn/csrc) and serve where those do not: CUDA tensors in bf16, fp16 or
fp32. Triton is optional: without it (or without a GPU) every caller falls back to the paths it had before.
On a machine without a GPU, TRITON_INTERPRET=1 runs the same kernels on CPU tensors through Triton's
interpreter, which is how `make test` checks them against the reference paths (tests/nn/test_triton_*.py).

The kernel modules are imported lazily, on the first call that can use them: Triton decides at decoration time
whether a kernel is compiled or interpreted, and a CPU-only process should not pay for importing it.
"""

from __future__ import annotations

import importlib.util
import os

import torch
from torch import Tensor

_found: list[bool] = []  # importlib's answer, asked once per process


def installed() -> bool:
    """True when the triton package can be imported here (a GPU is a separate question)."""
    if not _found:
        _found.append(importlib.util.find_spec("triton") is not None)
    return _found[0]


_interpret: list[bool] = []  # the setting, read once per process


def interpreting() -> bool:
    """True when TRITON_INTERPRET=1: the kernels then run on CPU tensors (slowly; for tests). Read once per
    process, as Triton itself reads it (at import and when a kernel is decorated): this is asked per layer of
    every CPU forward, and os.environ's lookup cost more than the rest of that question."""
    if not _interpret:
        _interpret.append(os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"))
    return _interpret[0]


SERVED_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def serves(*tensors: Tensor) -> bool:
    """The Triton kernels can run on these tensors: triton installed, and all on one CUDA device (or all on the
    CPU under the interpreter), in bf16, fp16 or fp32."""
    if not tensors:
        return False
    first = tensors[0]
    # The device first (is_cuda and is_cpu are the cheapest reads): on a CPU without the interpreter this is asked
    # per layer of every forward (decode too).
    if not (first.is_cuda or (first.is_cpu and interpreting())) or not installed():
        return False
    device = first.device
    for tensor in tensors:  # noqa: SIM110  (a loop, not all(generator): host time on every launch)
        if tensor.dtype not in SERVED_DTYPES or tensor.device != device:
            return False
    return True


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for host code. triton.cdiv and triton.next_power_of_2 are constexpr functions: each call from the
    host costs ~2 us (argument unwrapping, a knobs read), and a launch asked several per call (tests check these
    equal Triton's)."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The least power of 2 >= n (0 for n <= 0), as triton.next_power_of_2 gives, in plain integer arithmetic."""
    return 1 << (n - 1).bit_length() if n > 0 else 0


MAX_HEAD_DIM = 256  # the attention kernel keeps a (BM, Dh) tile per operand in registers


def attention_fits(q: Tensor, k: Tensor, v: Tensor, causal: bool) -> bool:
    """The attention kernel serves q (B,H,Tq,Dh), k/v (B,Hkv,Tk,Dh): one dtype, H a multiple of Hkv, one head
    dim up to MAX_HEAD_DIM, and (causal) queries that are the last Tq of the keys, 0 < Tq <= Tk; float32 only as
    TF32 (attention.serves_float32)."""
    if not (q.dim() == k.dim() == v.dim() == 4 and q.dtype == k.dtype == v.dtype and serves(q, k, v)
            and q.shape[-1] == k.shape[-1] == v.shape[-1] <= MAX_HEAD_DIM and q.shape[1] % k.shape[1] == 0
            and not (causal and q.shape[2] > k.shape[2]) and q.shape[2] > 0 and k.shape[2] > 0):  # no empty grid
        return False
    if q.dtype != torch.float32:
        return True
    return _float32_rule(q.shape[-1])


def _float32_rule(head_dim: int) -> bool:
    from posenc.nn.triton.attention import serves_float32  # imports triton: only for a tensor it may serve

    return serves_float32(head_dim, interpreting())


__all__ = ["attention_fits", "cdiv", "installed", "interpreting", "next_power_of_2", "serves"]
