"""Slow references for the position maps, written again from the authors' released code (read for the formulas,
not copied), plus a plain Llama forward that takes one of them as its attention.

Each reference builds the whole (T, T) score matrix the way its paper's code does (LongLM's two maps merged by
a tril-minus-shifted-tril mask; ChunkLlama's per-chunk intra/successive/inter calls merged by log-sum-exp;
LM-Infinite's Lambda mask with "stationary" states; StreamingLLM's rolling cache simulated query by query), so
it shares nothing with posenc.nn.mapped_attention but the RoPE convention (HF's rotate_half). Shapes: q (H,T,Dh),
k/v (Hkv,T,Dh), one batch row at a time; tables rounded to float32 as posenc's are (cos_sin).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from posenc.models.llama import Llama
from posenc.rotary import frequencies


class Rope:
    """HF's rotate_half RoPE at any (float) positions, cos/sin scaled and rounded to float32."""

    def __init__(self, head_dim: int, base: float, scaling: dict | None, max_seq_len: int) -> None:
        self.inv_freq, self.scale = frequencies(head_dim, base, scaling, max_seq_len)

    def __call__(self, x: Tensor, pos: Tensor) -> Tensor:
        """x (..., T, Dh), pos (T,) -> rotated x."""
        freqs = pos.to(torch.float64)[:, None] * self.inv_freq.to(torch.float64)[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = (emb.cos() * self.scale).float().to(x.dtype)
        sin = (emb.sin() * self.scale).float().to(x.dtype)
        half = x.shape[-1] // 2
        rotated_half = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rotated_half * sin


class Scaled:
    """A Rope whose cos and sin tables are multiplied by one factor (ChunkLlama's mscale)."""

    def __init__(self, rope: Rope, factor: float) -> None:
        self.rope, self.factor = rope, factor

    def __call__(self, x: Tensor, pos: Tensor) -> Tensor:
        return self.rope(x, pos) * self.factor  # x cos m + rotate_half(x) sin m


def _repeat(x: Tensor, heads: int) -> Tensor:
    return x.repeat_interleave(heads // x.shape[0], dim=0)


def _softmax_out(scores: Tensor, v: Tensor) -> Tensor:
    return torch.softmax(scores, dim=-1) @ v


def self_extend(q: Tensor, k: Tensor, v: Tensor, rope: Rope, group_size: int, window: int,
                integer_shift: bool = False, scale_base: int = -1) -> Tensor:
    """LongLM self_extend_forward (prefill, q_len == kv_seq_len). Its prefill shifts grouped queries by
    W - W / G, its decoding path by W - W // G (integer_shift): equal when G divides W. scale_base > 0: the
    queries are first multiplied by ((position_ids + 1).log() / log(scale_base)).clip(1)."""
    t, dh = q.shape[1], q.shape[-1]
    k, v = _repeat(k, q.shape[0]), _repeat(v, q.shape[0])
    pos = torch.arange(t, dtype=torch.float64)
    if scale_base > 0:
        q = q * ((pos + 1).log() / math.log(scale_base)).clip(1)[:, None]
    shift = 0 if pos.max() < window else window
    group_q = torch.div(pos, group_size, rounding_mode="floor") + shift
    group_q = group_q - (shift // group_size if integer_shift else shift / group_size)
    group_k = torch.div(pos, group_size, rounding_mode="floor")
    neighbour = rope(q, pos) @ rope(k, pos).transpose(-1, -2) / dh**0.5
    group = rope(q, group_q) @ rope(k, group_k).transpose(-1, -2) / dh**0.5
    causal = torch.full((t, t), float("-inf"), dtype=q.dtype).triu(1)
    neighbour_mask = torch.ones(t, t).tril()
    if t - window > 0:
        neighbour_mask[window:, :-window] -= torch.ones(t - window, t - window).tril()
    scores = torch.where(neighbour_mask.bool(), neighbour + causal, group + causal)
    return _softmax_out(scores, v)


def _attn_lse(q: Tensor, k: Tensor, v: Tensor, causal: bool) -> tuple[Tensor, Tensor]:
    """What flash_attn_func returns: the output and the log-sum-exp of each row."""
    scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    if causal:
        scores = scores + torch.full(scores.shape[-2:], float("-inf"), dtype=q.dtype).triu(1)
    return torch.softmax(scores, dim=-1) @ v, torch.logsumexp(scores, dim=-1)


def get_mscale(scale: float) -> float:
    """chunkllama_attn_replace.py (since 2024-03-19): the factor on every cos and sin table."""
    return 1.0 if scale <= 1 else 0.05 * math.log(scale) + 1.0


def dual_chunk(q: Tensor, k: Tensor, v: Tensor, rope: Rope, chunk_size: int, local_window: int,
               max_position_embeddings: int | None = None) -> Tensor:
    """ChunkLlama forward (prefill, no cache): chunks of chunk_len queries, three attention calls merged. With
    max_position_embeddings, the current release: its rotary tables rebuilt for seq_len = kv_seq_len (here t, the
    prompt) carry get_mscale(t / max_position_embeddings) on cos and sin, the queries' and the keys'."""
    t = q.shape[1]
    k, v = _repeat(k, q.shape[0]), _repeat(v, q.shape[0])
    chunk_len = chunk_size - local_window
    q_t = torch.arange(chunk_len, dtype=torch.float64)
    qc_t = (q_t + chunk_len).clamp(max=chunk_size)
    pos = torch.arange(t)
    if max_position_embeddings is not None:
        mscale = get_mscale(t / max_position_embeddings)
        rope = Scaled(rope, mscale)
    keys = rope(k, (pos % chunk_len).to(torch.float64))
    local = pos % chunk_len
    outputs = [_attn_lse(rope(q[:, :chunk_len], q_t[local[:chunk_len]]), keys[:, :chunk_len], v[:, :chunk_len],
                         True)[0]]
    for begin in range(chunk_len, t, chunk_len):
        end = min(begin + chunk_len, t)
        parts = [
            _attn_lse(rope(q[:, begin:end], q_t[local[begin:end]]), keys[:, begin:end], v[:, begin:end], True),
            _attn_lse(rope(q[:, begin:end], qc_t[local[begin:end]]), keys[:, begin - chunk_len:begin],
                      v[:, begin - chunk_len:begin], False),
        ]
        if begin - chunk_len > 0:
            inter = qc_t[chunk_len - 1].repeat(end - begin)
            parts.append(_attn_lse(rope(q[:, begin:end], inter), keys[:, :begin - chunk_len],
                                   v[:, :begin - chunk_len], False))
        weights = torch.softmax(torch.stack([lse for _, lse in parts]), dim=0)  # merge_attn_outputs
        outputs.append(sum(w[..., None] * out for w, (out, _) in zip(weights, parts, strict=True)))
    return torch.cat(outputs, dim=1)


def lm_infinite(q: Tensor, k: Tensor, v: Tensor, rope: Rope, n_global: int, window: int,
                max_distance: int) -> Tensor:
    """LM-Infinite's Lambda attention: local branch rotated, global branch with stationary states."""
    t, dh = q.shape[1], q.shape[-1]
    k, v = _repeat(k, q.shape[0]), _repeat(v, q.shape[0])
    pos = torch.arange(t, dtype=torch.float64)
    rotated = rope(q, pos) @ rope(k, pos).transpose(-1, -2) / dh**0.5
    cap = torch.full((t,), float(min(max_distance, t - 1)), dtype=torch.float64)
    stationary = rope(q, cap) @ k.transpose(-1, -2) / dh**0.5  # keys unrotated: position 0
    i, j = torch.arange(t)[:, None], torch.arange(t)[None, :]
    local = (j <= i) & (i - j < window)
    far_global = (j < n_global) & (i - j >= window)
    scores = torch.where(local, rotated, torch.where(far_global, stationary, float("-inf")))
    return _softmax_out(scores, v)


def attention_sinks(q: Tensor, k: Tensor, v: Tensor, rope: Rope, n_sink: int, window: int) -> Tensor:
    """StreamingLLM with position shift, token by token: a cache of the sinks and the window, keys rotated at
    their index in the cache, the query at the last index."""
    t, dh = q.shape[1], q.shape[-1]
    k, v = _repeat(k, q.shape[0]), _repeat(v, q.shape[0])
    rows = []
    for i in range(t):
        kept = sorted(set(range(min(n_sink, i + 1))) | set(range(max(0, i - window + 1), i + 1)))
        slots = torch.arange(len(kept), dtype=torch.float64)
        scores = rope(q[:, i:i + 1], slots[-1:]) @ rope(k[:, kept], slots).transpose(-1, -2) / dh**0.5
        rows.append(_softmax_out(scores, v[:, kept]))
    return torch.cat(rows, dim=1)


def string(q: Tensor, k: Tensor, v: Tensor, rope: Rope, shifted_offset: int, local_value: int,
           attention_factor: float) -> Tensor:
    """STRING (string_for_llama.py's decoding path, every row): the dense relative-position matrix d for d < S,
    d - S + W for d >= S, built from two score matrices with the query moved back by S - W in the second; cos and
    sin carry attention_factor, so the scores carry its square."""
    t, dh = q.shape[1], q.shape[-1]
    k, v = _repeat(k, q.shape[0]), _repeat(v, q.shape[0])
    pos = torch.arange(t, dtype=torch.float64)
    keys = rope(k, pos).transpose(-1, -2)
    neighbour = rope(q, pos) @ keys / dh**0.5
    shifted = rope(q, pos - shifted_offset + local_value) @ keys / dh**0.5
    d = pos[:, None] - pos[None, :]
    scores = torch.where(d < shifted_offset, neighbour, shifted) * attention_factor**2
    return _softmax_out(scores.masked_fill(d < 0, float("-inf")), v)


def plain(q: Tensor, k: Tensor, v: Tensor, rope: Rope) -> Tensor:
    """Causal RoPE attention: what every method must equal when its window covers the sequence."""
    pos = torch.arange(q.shape[1], dtype=torch.float64)
    return _attn_lse(rope(q, pos), rope(_repeat(k, q.shape[0]), pos), _repeat(v, q.shape[0]), True)[0]


def llama_logits(model: Llama, input_ids: Tensor, attention) -> Tensor:
    """model's weights run through a plain Llama forward whose attention is attention(q, k, v) on one row:
    q (H,T,Dh), k/v (Hkv,T,Dh), unrotated -> (H,T,Dh). input_ids (B,T) -> logits (B,T,V)."""
    x = model.embed_tokens(input_ids)
    for block in model.blocks:
        attn, h = block.attn, block.input_layernorm(x)
        b, t, _ = h.shape
        q = attn.q_proj(h).view(b, t, attn.n_head, -1).transpose(1, 2)
        k = attn.k_proj(h).view(b, t, attn.n_kv_head, -1).transpose(1, 2)
        v = attn.v_proj(h).view(b, t, attn.n_kv_head, -1).transpose(1, 2)
        out = torch.stack([attention(q[r], k[r], v[r]) for r in range(b)])  # (B,H,T,Dh)
        x = x + attn.o_proj(out.transpose(1, 2).reshape(b, t, -1))
        x = x + block.mlp(block.post_attention_layernorm(x))
    return model.lm_head(model.norm(x))
