"""Causal attention with each bias scheme: posenc's dispatch (flex score_mod / chunked) vs plain causal
SDPA with no positions vs the naive path that materialises the (H, T, T) bias (NeMo's way)."""

from __future__ import annotations

import torch

from benchmarks.memory import peak_live_bytes
from benchmarks.timing import median_seconds, ratio
from posenc.models import GPTConfig
from posenc.nn.attention_core import attend
from posenc.nn.bias_paths import biased_attention
from posenc.registry import build

SCHEMES_WITH_BIAS = ("alibi", "kerple", "sandwich", "relative", "fire", "shaw")
NAIVE_MAX_T = 4096  # the naive (H,T,T) path at 8192 is 2 GiB per bias and ~10 s a call: measured up to here


def _scheme(name: str, heads: int, head_dim: int, t: int):
    cfg = GPTConfig(vocab_size=16, n_layer=1, n_head=heads, d_model=heads * head_dim, max_seq_len=t,
                    position_embedding_type=name)
    return build(name, cfg.dims(), cfg.options).eval()


def _posenc_path(scheme, q, k, v, pos):
    if scheme.needs_weights:  # Shaw: the eager path (its value term needs the weights)
        from posenc.nn.attention_core import attend_eager

        out, w = attend_eager(q, k, v, scheme.bias(pos, pos, q, k), True)
        return out + scheme.mix_values(w, pos, pos)
    return biased_attention(q, k, v, scheme, pos, pos, True)


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
    with torch.no_grad():
        base = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        base_s, base_mem = median_seconds(base, repeats), peak_live_bytes(base)
        rows = [{"T": t, "scheme": "none (causal SDPA)", "path": "sdpa", "ms": 1e3 * base_s, "x sdpa": 1.0,
                 "peak MiB": base_mem / 2**20, "x sdpa mem": 1.0}]
        for name in schemes:
            scheme = _scheme(name, heads, head_dim, t)
            paths = {"posenc": lambda s=scheme: _posenc_path(s, q, k, v, pos)}
            if t <= NAIVE_MAX_T:
                paths["naive (H,T,T) bias"] = lambda s=scheme: attend(q, k, v, s.bias(pos, pos, q, k), True)
            for path, fn in paths.items():
                seconds, mem = median_seconds(fn, repeats), peak_live_bytes(fn)
                rows.append({"T": t, "scheme": name, "path": path, "ms": 1e3 * seconds,
                             "x sdpa": ratio(seconds, base_s), "peak MiB": mem / 2**20,
                             "x sdpa mem": ratio(mem, base_mem)})
    return rows
