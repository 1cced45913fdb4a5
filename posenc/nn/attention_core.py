"""Attention kernels without any positional logic: SDPA with an optional bias, and an eager
form that also returns the weights. Notation: B, H, Hkv, Tq, Tk, Dh as in attention.py."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from posenc.errors import bad_value
from posenc.masks import causal_mask


def check_bias_shape(bias: Tensor, q: Tensor, k: Tensor) -> None:
    """A scheme's bias must be (B|1, H|1, Tq, Tk): a user scheme of the wrong shape is named here, in one
    line, rather than as a broadcasting error deep inside SDPA (or, worse, broadcast silently)."""
    b, h, tq, tk = q.shape[0], q.shape[1], q.shape[-2], k.shape[-2]
    shape = tuple(bias.shape)
    if len(shape) != 4 or shape[0] not in (1, b) or shape[1] not in (1, h) or shape[2:] != (tq, tk):
        raise bad_value("the scheme's bias shape", shape, f"(B|1, H|1, Tq, Tk) = ({b}|1, {h}|1, {tq}, {tk}): "
                        "one value per query and key, for every or each head and batch row")


# A call after a KV cache on CUDA leaves cuDNN out of SDPA's choice. torch 2.11 puts cuDNN's attention first on sm90
# and sm100 (cuDNN >= 9.15), and cuDNN builds an execution graph per shape, cached by shape: a decode step has a new key
# length each step, so each step built one. Measured on an H200 (torch 2.11, cuDNN 9.19), one query against 4k keys,
# a new length per call: 46-58 ms without a mask or with a bias row, 0.1-0.25 ms on flash or the efficient kernel.
# A prompt (Tq == Tk) keeps cuDNN: one graph per length, and cuDNN is the faster kernel there on Hopper. Only cuDNN's
# flag is turned off around the call (not sdpa_kernel's list: a caller's own choice of backends stays; and three
# flag calls cost less than the context manager's ten, per layer of every step).
MASK_ALIGNMENT = 16  # bytes: the efficient kernel refuses a mask at another address ("attn_bias_ptr is not correctly
# aligned"), cuDNN's reads it out of bounds (CUDA "misaligned address"); a row sliced from a kept table can start there


def on_cuda(t: Tensor) -> bool:
    return t.is_cuda


def sdpa(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, dropout: float = 0.0, causal: bool = False,
         gqa: bool = False) -> Tensor:
    """F.scaled_dot_product_attention for every SDPA call of posenc's attention paths. On CUDA, a call with Tq != Tk
    (after a KV cache: the key length new each step) runs without cuDNN (above), its float mask at an address every
    kernel reads. q (B,H,Tq,Dh), k/v (B,Hkv,Tk,Dh), mask (B|1,H|1,Tq,Tk) -> (B,H,Tq,Dh)."""
    cudnn = on_cuda(q) and q.shape[-2] != k.shape[-2] and torch.backends.cuda.cudnn_sdp_enabled()
    if on_cuda(q) and mask is not None and mask.is_floating_point() and mask.data_ptr() % MASK_ALIGNMENT:
        mask = mask.clone(memory_format=torch.contiguous_format)  # a new allocation: aligned
    if cudnn:
        torch.backends.cuda.enable_cudnn_sdp(False)
    try:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=causal,
                                              enable_gqa=gqa)
    finally:
        if cudnn:
            torch.backends.cuda.enable_cudnn_sdp(True)


# Decoding on the CPU in half precision (bfloat16 tensors, or autocast, which casts SDPA's inputs): SDPA's flash
# kernel takes 8.4 ms for one bfloat16 query row against 8k keys (SmolLM2's 9 heads, 3 KV heads), the float32
# kernel 1.1 ms, casts included (one thread, AMD Zen 5). So this few rows run in float32: faster and more exact.
FEW_ROWS = 4


def _few_rows_in_float32(q: Tensor, k: Tensor, v: Tensor, dropout: float, gqa: bool) -> Tensor | None:
    """SDPA in float32 with autocast off, returned in the dtype SDPA would have returned; None where it does
    not apply (another device, more rows, already float32 without autocast). The cache is converted at every call:
    float32 copies kept across steps (KVCache.derived, as the maps keep theirs) were slower, 0.67 against 0.60 ms per
    layer with the conversion (SmolLM2 at a 2k cache in bfloat16, one thread, torch.profiler, AMD EPYC Zen 5 with
    AVX-512, other work on the second core): the kept copy is read
    from memory at twice bfloat16's bytes, where the conversion reads bfloat16 and SDPA reads its result warm."""
    autocast = torch.is_autocast_enabled("cpu")
    if q.device.type != "cpu" or q.shape[-2] > FEW_ROWS or not (autocast or q.element_size() < 4):
        return None
    lower = torch.get_autocast_dtype("cpu") if autocast else q.dtype
    with torch.autocast("cpu", enabled=False):
        out = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), dropout_p=dropout, enable_gqa=gqa)
    return out.to(lower)


def attend(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None, causal: bool, dropout: float = 0.0) -> Tensor:
    """softmax(q k^T / sqrt(Dh) + bias + mask) v. q (B,H,Tq,Dh), k/v (B,Hkv,Tk,Dh) -> (B,H,Tq,Dh)."""
    tq, tk = q.shape[-2], k.shape[-2]
    gqa = k.shape[1] != q.shape[1]
    needs_mask = causal and tq > 1
    if bias is None:
        if not needs_mask:
            few = _few_rows_in_float32(q, k, v, dropout, gqa)
            return few if few is not None else sdpa(q, k, v, dropout=dropout, gqa=gqa)
        if tq == tk:
            return sdpa(q, k, v, dropout=dropout, causal=True, gqa=gqa)
        return sdpa(q, k, v, causal_mask(tq, tk, q.device), dropout, gqa=gqa)
    check_bias_shape(bias, q, k)
    bias = bias.to(q.dtype)
    if needs_mask:
        # A 4-D float mask keeps SDPA on its fast kernel; -inf where the future is.
        bias = bias.masked_fill(~causal_mask(tq, tk, q.device), float("-inf"))
    if bias.dim() == 4 and bias.shape[0] == 1 and q.shape[0] > 1:
        bias = bias.expand(q.shape[0], -1, -1, -1)
    return sdpa(q, k, v, bias, dropout, gqa=gqa)


def attend_eager(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None, causal: bool,
                 dropout: float = 0.0) -> tuple[Tensor, Tensor]:
    """The same as attend() but materialises the weights (B,H,Tq,Tk) for schemes that need them."""
    h, hkv = q.shape[1], k.shape[1]
    if hkv != h:  # GQA: share each key/value head among h // hkv query heads
        k, v = k.repeat_interleave(h // hkv, 1), v.repeat_interleave(h // hkv, 1)
    scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5  # (B,H,Tq,Tk)
    if bias is not None:
        check_bias_shape(bias, q, k)
        scores = scores + bias.to(scores.dtype)
    if causal and q.shape[-2] > 1:
        scores = scores.masked_fill(~causal_mask(q.shape[-2], k.shape[-2], q.device), float("-inf"))
    weights = F.dropout(torch.softmax(scores, dim=-1), dropout)
    return weights @ v, weights
