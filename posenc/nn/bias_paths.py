"""Ways to run attention with a positional bias, fastest first; each is tested equal to `attend`
with the bias materialised (the reference, NeMo's way). Which one runs is decided in posenc.nn.dispatch; the
kernels here (plain, flex, chunked, reference, eager_weights, scheme_attend) each take a dispatch.Call.

rows:    posenc.nn.row_paths: the bias computed per block inside one native kernel, forward and backward,
         for schemes that give it as rows, pieces or CoPE rows (CPU, float32; positions counting up by one);
         on CUDA, a Triton kernel for rows per head (posenc.nn.triton: bf16, fp16, fp32).
         The default wherever it serves, training included.
flex:    torch.nn.attention.flex_attention with the scheme's score_mod and a causal block mask,
         compiled once per process with dynamic shapes; no (H,Tq,Tk) tensor exists. Inference only
         on CPU (flex has no CPU backward in torch 2.13); default on CUDA, opt-in on CPU (see
         flex_enabled).
chunked: queries in blocks of CHUNK_ROWS; each block's (B,H,rows,Tk) bias is built, used and freed,
         so memory grows as rows*Tk, not Tq*Tk. Works with autograd and any dtype or position layout.
"""

from __future__ import annotations

import functools
import os
import warnings

import torch
from torch import Tensor

from posenc.nn.attention_core import attend, attend_eager
from posenc.nn.call import Call
from posenc.scheme import Scheme

CHUNK_ROWS = 256
MIN_FAST_SCORES = 1 << 20  # below ~1M scores per head the reference path is already cheap
FLEX_MIN_HEAD_DIM = 16  # flex_attention's Triton kernels (not CPU/MPS): "embedding dimension ... at least 16"
# "failed": flex unusable in this process; "failed_schemes": scheme classes whose score_mod did not compile.
_flex_state = {"compiled": None, "failed": False, "failed_schemes": set()}


def flex_enabled(device: torch.device) -> bool:
    """On by default on CUDA. Opt-in on CPU (POSENC_FLEX=1): torch 2.13's Inductor CPU template for
    flex_attention fails to compile some score_mods depending on sizes and compile order (C++
    'cur_kvSplitSize' errors, seen for ALiBi, KERPLE and Sandwich), costing a ~20 s attempt before the
    fallback; the chunked path needs no compiler."""
    setting = os.environ.get("POSENC_FLEX")
    return setting == "1" if setting is not None else device.type == "cuda"


def chunked_attention(q: Tensor, k: Tensor, v: Tensor, scheme: Scheme, q_pos: Tensor, k_pos: Tensor,
                      causal: bool, dropout: float = 0.0, rows: int = CHUNK_ROWS) -> Tensor:
    """q (B,H,Tq,Dh), k/v (B,Hkv,Tk,Dh) -> (B,H,Tq,Dh), one block of query rows at a time."""
    tq, tk = q.shape[-2], k.shape[-2]
    outs = []
    for start in range(0, tq, rows):
        stop = min(start + rows, tq)
        keys = tk - tq + stop if causal else tk  # causal: later keys are masked anyway, skip them
        q_block = q[:, :, start:stop]
        bias = scheme.bias(q_pos[:, start:stop], k_pos[:, :keys], q_block, k[:, :, :keys])
        outs.append(attend(q_block, k[:, :, :keys], v[:, :, :keys], bias, causal, dropout))
    return torch.cat(outs, dim=2)


def _causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


@functools.lru_cache(maxsize=8)
def _causal_block_mask(t: int, device: str):
    # The mask_mod captures nothing: a captured Python int (e.g. a cache offset) under dynamic
    # shapes makes Inductor 2.13 emit C++ that does not compile ('cur_kvSplitSize5' undeclared).
    from torch.nn.attention.flex_attention import create_block_mask

    return create_block_mask(_causal, None, None, t, t, device=device, _compile=True)


def flex_attention_path(q: Tensor, k: Tensor, v: Tensor, scheme: Scheme, q_pos: Tensor, k_pos: Tensor,
                        causal: bool) -> Tensor | None:
    """The score_mod path, or None when the scheme has none or flex is unavailable here."""
    if _flex_state["failed"] or type(scheme) in _flex_state["failed_schemes"]:
        return None
    if causal and q.shape[-2] != k.shape[-2]:  # queries after a cache: the chunked path (see above)
        return None
    # Contiguous positions: Inductor 2.13 miscompiles score_mods that index stride-0 (expanded) tensors.
    score_mod = scheme.score_mod(q_pos.contiguous(), k_pos.contiguous())
    if score_mod is None:
        return None
    try:
        from torch.nn.attention.flex_attention import flex_attention

        if _flex_state["compiled"] is None:
            # Static shapes on CPU: with dynamic=True Inductor 2.13's CPU flex template emits C++ that does
            # not compile ("'cur_kvSplitSize7' was not declared"); static shapes compile (once per length).
            _flex_state["compiled"] = torch.compile(flex_attention, dynamic=q.device.type != "cpu")
        mask = _causal_block_mask(q.shape[-2], str(q.device)) if causal else None
        return _flex_state["compiled"](q, k, v, score_mod=score_mod, block_mask=mask,
                                       enable_gqa=k.shape[1] != q.shape[1])
    except Exception as err:
        _flex_state["failed_schemes"].add(type(scheme))
        if _flex_state["compiled"] is None:
            _flex_state["failed"] = True
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else ""
        warnings.warn(f"posenc: flex_attention failed for {type(scheme).__name__} ({type(err).__name__}: "
                      f"{first_line}); using the chunked path", stacklevel=2)
        return None


def flex_fits(q: Tensor, v: Tensor) -> bool:
    """Inductor's Triton template for flex_attention refuses head dims below 16 ("NYI"); its CPU and MPS
    templates take any. Asking anyway would cost a failed compile and a warning before the same fallback."""
    return q.device.type in ("cpu", "mps") or min(q.shape[-1], v.shape[-1]) >= FLEX_MIN_HEAD_DIM


def plain(call: Call) -> Tensor:
    """SDPA's own kernels, no bias."""
    return attend(call.q, call.k, call.v, None, call.causal, call.dropout)


def _large(call: Call) -> bool:
    return call.q.shape[-2] * call.k.shape[-2] >= MIN_FAST_SCORES


def flex(call: Call) -> Tensor | None:
    """flex_attention where it is on (flex_enabled) and fits, for long inputs without dropout."""
    q, v = call.q, call.v
    if not _large(call) or call.dropout != 0.0 or not flex_enabled(q.device) or not flex_fits(q, v):
        return None
    return flex_attention_path(q, call.k, v, call.scheme, call.q_pos, call.k_pos, call.causal)


def chunked(call: Call) -> Tensor | None:
    """The bias built per block of CHUNK_ROWS queries, for long inputs of more than one block."""
    if not _large(call) or call.q.shape[-2] <= CHUNK_ROWS:
        return None
    return chunked_attention(call.q, call.k, call.v, call.scheme, call.q_pos, call.k_pos, call.causal, call.dropout)


def reference(call: Call) -> Tensor:
    """The bias materialised (B|1,H,Tq,Tk): NeMo's way, and what every other path is tested equal to."""
    q, k = call.q, call.k
    return attend(q, k, call.v, call.scheme.bias(call.q_pos, call.k_pos, q, k), call.causal, call.dropout)


def eager_weights(call: Call) -> Tensor:
    """The weights materialised (B,H,Tq,Tk) for mix_values (Shaw's value term)."""
    q, k, q_pos, k_pos = call.q, call.k, call.q_pos, call.k_pos
    out, weights = attend_eager(q, k, call.v, call.scheme.bias(q_pos, k_pos, q, k), call.causal, call.dropout)
    return out + call.scheme.mix_values(weights, q_pos, k_pos)  # (B,H,Tq,Dh)


def scheme_attend(call: Call) -> Tensor | None:
    """The scheme runs attention itself (Scheme.attend: the position maps), or declines."""
    return call.scheme.attend(call.q, call.k, call.v, call.q_pos, call.k_pos, call.causal, call.dropout)
