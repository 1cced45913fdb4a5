"""Causal attention with each bias scheme: posenc's dispatch (rows in the native kernel / flex score_mod / chunked)
vs plain causal SDPA with no positions vs the naive path that materialises the (H, T, T) bias (NeMo's way)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from benchmarks.memory import peak_live_bytes
from benchmarks.timing import interleaved_seconds, ratio
from posenc.models import GPTConfig
from posenc.nn import bias_paths

try:
    from posenc.nn import dispatch
except ImportError:  # a baseline run on a tree from before the dispatch
    dispatch = None
from posenc.nn.attention_core import attend
from posenc.registry import build

SCHEMES_WITH_BIAS = ("alibi", "kerple", "sandwich", "relative", "fire", "shaw")
NAIVE_MAX_T = 2048  # the naive (H,T,T) path, for contrast; at 8192 it is 2 GiB per bias and ~10 s a call


def _scheme(name: str, heads: int, head_dim: int, t: int):
    cfg = GPTConfig(vocab_size=16, n_layer=1, n_head=heads, d_model=heads * head_dim, max_seq_len=t,
                    position_embedding_type=name)
    return build(name, cfg.dims(), cfg.options).eval()


def _posenc_path(scheme, q, k, v, pos):
    if dispatch is not None:  # what SelfAttention runs after the rotation
        return dispatch.attention(q, k, v, scheme, pos, pos, True)
    if scheme.needs_weights:  # Shaw: its value term reads the weights
        if hasattr(bias_paths, "weights_attention"):
            return bias_paths.weights_attention(q, k, v, scheme, pos, pos, True)
        from posenc.nn.attention_core import attend_eager  # before weights_attention existed (a baseline run)

        out, w = attend_eager(q, k, v, scheme.bias(pos, pos, q, k), True)
        return out + scheme.mix_values(w, pos, pos)
    return bias_paths.biased_attention(q, k, v, scheme, pos, pos, True)


def attention_rows(lengths: list[int], heads: int, head_dim: int, repeats: int,
                   schemes=SCHEMES_WITH_BIAS) -> list[dict]:
    rows = []
    for t in lengths:
        rows += _rows_at(t, heads, head_dim, repeats, schemes)
    return rows


def _rows_at(t: int, heads: int, head_dim: int, repeats: int, schemes) -> list[dict]:
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, heads, t, head_dim, generator=g) for _ in range(3))
    pos = torch.arange(t)[None]
    calls = {("none (causal SDPA)", "sdpa"): lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)}
    for name in schemes:
        scheme = _scheme(name, heads, head_dim, t)
        calls[(name, "posenc")] = lambda s=scheme: _posenc_path(s, q, k, v, pos)
        if t <= NAIVE_MAX_T:
            calls[(name, "naive (H,T,T) bias")] = lambda s=scheme: attend(q, k, v, s.bias(pos, pos, q, k), True)
    with torch.no_grad():
        seconds = interleaved_seconds(calls, repeats, warmup=1)
        memory = {key: peak_live_bytes(fn) for key, fn in calls.items()}
    base = ("none (causal SDPA)", "sdpa")
    return [{"T": t, "scheme": name, "path": path, "ms": 1e3 * seconds[(name, path)],
             "x sdpa": ratio(seconds[(name, path)], seconds[base]), "peak MiB": memory[(name, path)] / 2**20,
             "x sdpa mem": ratio(memory[(name, path)], memory[base])} for name, path in calls]
