"""posenc.attention: a scheme's attention for a model of one's own (a nanoGPT- or litgpt-style block), with the
same fast paths posenc's SelfAttention takes. Notation as in attention.py."""

from __future__ import annotations

import torch
from torch import Tensor

from posenc.errors import bad_value
from posenc.inference_tensors import made_for_one_call
from posenc.nn import dispatch
from posenc.nn.attention_core import attend
from posenc.scheme import Scheme


def _positions(pos: Tensor | None, b: int, t: int, first: int, field: str, device: torch.device) -> Tensor:
    if pos is None:
        return torch.arange(first, first + t, device=device).expand(b, t)
    if not isinstance(pos, Tensor) or pos.dtype.is_floating_point or pos.shape not in ((b, t), (1, t)):
        shape = tuple(pos.shape) if isinstance(pos, Tensor) else type(pos).__name__
        raise bad_value(field, shape, f"an integer tensor of shape ({b}, {t}) or (1, {t})")
    return pos.to(device).expand(b, t)


def _check_inputs(q: Tensor, k: Tensor, v: Tensor, scheme: Scheme, causal: bool) -> None:
    """Everything malformed refused in one line, before any work (and before any native kernel reads memory)."""
    if not isinstance(scheme, Scheme):
        raise bad_value("scheme", type(scheme).__name__, "a posenc.Scheme, e.g. posenc.build('rope', posenc.Dims(...))")
    if not isinstance(causal, bool):
        raise bad_value("causal", causal, "True or False")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor) or not t.is_floating_point():
            raise bad_value(f"{name} dtype", t.dtype if isinstance(t, Tensor) else type(t).__name__,
                            "a floating-point tensor (float32, bfloat16, float16 or float64)")
    if not q.dtype == k.dtype == v.dtype or not q.device == k.device == v.device:
        raise bad_value("q, k, v dtypes and devices", tuple(f"{t.dtype} on {t.device}" for t in (q, k, v)),
                        "one dtype on one device for all three")
    if q.dim() != 4 or k.dim() != 4 or v.shape != k.shape:
        raise bad_value("q, k, v shapes", (tuple(q.shape), tuple(k.shape), tuple(v.shape)),
                        "q (B, H, Tq, Dh) and k, v (B, Hkv, Tk, Dh) of one shape")
    elsewhere = sorted({str(t.device) for t in (*scheme.parameters(), *scheme.buffers()) if t.device != q.device})
    if elsewhere:  # the kernels would read the scheme's tables on one device and q, k, v on another
        raise bad_value("scheme device", ", ".join(elsewhere), f"{q.device}, the device of q, k, v (move the scheme "
                        "there: scheme.to(q.device))")
    dims, (b, h, tq, d) = scheme.dims, q.shape
    if h != dims.n_head or d != dims.head_dim:
        raise bad_value("q shape", tuple(q.shape), f"(B, H={dims.n_head}, Tq, Dh={dims.head_dim}): the heads and "
                        "head dim the scheme was built for (its posenc.Dims)")
    if k.shape[0] != b or k.shape[1] == 0 or h % k.shape[1] or k.shape[-1] != d:
        raise bad_value("k shape", tuple(k.shape), f"(B={b}, a divisor of H={h}, Tk, Dh={d})")
    if causal and tq > k.shape[2]:
        raise bad_value("q length", tq, f"at most the key length Tk={k.shape[2]} with causal=True (queries are the "
                        "last keys)")


def attention(q: Tensor, k: Tensor, v: Tensor, scheme: Scheme, q_pos: Tensor | None = None,
              k_pos: Tensor | None = None, causal: bool = True) -> Tensor:
    """softmax(q k^T / sqrt(Dh) + the scheme's bias + mask) v, with q and k rotated as the scheme says.

    q (B,H,Tq,Dh) and k, v (B,Hkv,Tk,Dh), before any rotation (GQA when Hkv < H); scheme from posenc.build.
    q_pos (B,Tq), k_pos (B,Tk): integer positions; by default the keys sit at 0..Tk-1 and the queries are the
    last Tq keys (a cache before them). Returns (B,H,Tq,Dh). The fastest path that serves, as SelfAttention takes it
    (posenc.nn.dispatch): the native kernels on the CPU (float32), the Triton kernels on CUDA (rows per head;
    RoPE), flex or chunked attention, SDPA.
    Absolute schemes (learned_absolute, sinusoidal, ...) act on the token embeddings, not here: call
    scheme.embed(x, pos) on the block's input; for them this is plain SDPA.
    """
    _check_inputs(q, k, v, scheme, causal)
    b, tq, tk = q.shape[0], q.shape[2], k.shape[2]
    if b == 0 or tq == 0 or tk == 0:  # as SDPA: an empty output, or zeros for queries with no keys
        return attend(q, k, v, None, causal)
    k_pos = _positions(k_pos, b, tk, 0, "k_pos", q.device)  # (B,Tk)
    q_pos = _positions(q_pos, b, tq, tk - tq, "q_pos", q.device) if q_pos is not None else k_pos[:, tk - tq:]
    q_pos, k_pos = scheme.frame(q_pos, k_pos)
    made_for_one_call(q_pos, k_pos)  # fresh tensors (expand, slice, frame): memos may key on them
    q, k = scheme.rotate(q, k, q_pos, k_pos)
    return dispatch.attention(q, k, v, scheme, q_pos, k_pos, causal)  # (B,H,Tq,Dh)


__all__ = ["attention"]
