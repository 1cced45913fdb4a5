"""Self-attention of the Llama-family decoders (posenc.models.families): SelfAttention's path plus the few
things the members add around it, each a field of `AttentionShape`:

- head_dim set apart from d_model // n_head (Qwen3, Gemma);
- biases on q, k, v (Qwen2) or on all four projections (Llama's attention_bias);
- RMSNorm on q and k before the rotation, per head (Qwen3, Gemma 3) or over all heads at once (OLMo 2);
- a query scale other than head_dim^-1/2 (Gemma's query_pre_attn_scalar^-1/2), folded into q, which every
  path (SDPA, the maps' attention) then divides by sqrt(Dh) as usual;
- tanh soft-capping of the scores, c tanh(s / c) (Gemma 2), and a sliding window (keys at distance >= W
  are not attended: Mistral, Gemma, Qwen's sliding layers): the masked path below.

Under a position map the scheme attends itself (its `attend` hook); the window then lives in the map
(position_maps/window.py) and soft-capping is refused when the config is built.
Notation: B, H, Hkv, Tq, Tk, Dh as in attention.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from posenc.inference_tensors import LastPositions
from posenc.masks import causal_mask
from posenc.nn import dispatch
from posenc.nn.attention_core import sdpa
from posenc.nn.kv_cache import KVCache
from posenc.nn.norms import rms_norm
from posenc.nn.sliding_window import sliding_attention
from posenc.scheme import Scheme


@dataclass(frozen=True)
class AttentionShape:
    d_model: int
    n_head: int
    n_kv_head: int
    head_dim: int
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: str | None = None  # None, "head" or "all"
    norm_eps: float = 1e-6
    norm_offset: float = 0.0  # the q/k norms scale by (offset + weight), as the model's other norms
    query_scale: float | None = None  # the scores' scale; None: head_dim^-1/2
    softcap: float | None = None
    window: int | None = None  # None: every earlier key


class DecoderAttention(nn.Module):
    def __init__(self, shape: AttentionShape, layer: int) -> None:
        super().__init__()
        s, self.shape, self.layer = shape, shape, layer
        self.n_head, self.n_kv_head, self.head_dim = s.n_head, s.n_kv_head, s.head_dim
        self.q_proj = nn.Linear(s.d_model, s.n_head * s.head_dim, bias=s.qkv_bias)
        self.k_proj = nn.Linear(s.d_model, s.n_kv_head * s.head_dim, bias=s.qkv_bias)
        self.v_proj = nn.Linear(s.d_model, s.n_kv_head * s.head_dim, bias=s.qkv_bias)
        self.o_proj = nn.Linear(s.n_head * s.head_dim, s.d_model, bias=s.o_bias)
        if s.qk_norm is not None:
            per_head = s.qk_norm == "head"
            self.q_norm = rms_norm(s.head_dim if per_head else s.n_head * s.head_dim, s.norm_eps, s.norm_offset)
            self.k_norm = rms_norm(s.head_dim if per_head else s.n_kv_head * s.head_dim, s.norm_eps, s.norm_offset)
        # SDPA scales by Dh^-1/2; a different scale is folded into q (rotations are linear)
        factor = 1.0 if s.query_scale is None else s.query_scale * math.sqrt(s.head_dim)
        self.q_factor = 1.0 if math.isclose(factor, 1.0, rel_tol=1e-12) else factor

    def _heads(self, x: Tensor, n: int) -> Tensor:
        b, t, _ = x.shape
        return x.view(b, t, n, self.head_dim).transpose(1, 2)  # (B,n,T,Dh)

    def forward(self, x: Tensor, scheme: Scheme, q_pos: Tensor, k_pos: Tensor,
                cache: KVCache | None = None) -> Tensor:
        """x (B,Tq,D); q_pos (B,Tq); k_pos (B,Tk) = positions of cached + new keys."""
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)  # (B,Tq,H*Dh), (B,Tq,Hkv*Dh) x2
        if self.shape.qk_norm == "all":
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = self._heads(q, self.n_head), self._heads(k, self.n_kv_head), self._heads(v, self.n_kv_head)
        if self.shape.qk_norm == "head":
            q, k = self.q_norm(q), self.k_norm(k)  # over Dh, each head alone
        if self.q_factor != 1.0:
            q = q * self.q_factor
        q, k = scheme.rotate(q, k, q_pos, q_pos)  # new keys sit at the new positions
        kept = None
        if cache is not None:
            k, v = cache.update(self.layer, k, v)  # (B,Hkv,Tk,Dh)
            kept = cache.derived(self.layer)
        out = self._attend(q, k, v, scheme, q_pos, k_pos, kept)
        return self.o_proj(out.transpose(1, 2).flatten(2))  # (B,Tq,D)

    def _windowed(self, q_pos: Tensor, k_pos: Tensor) -> bool:
        w = self.shape.window
        return w is not None and position_span(q_pos, k_pos) >= w

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, scheme: Scheme, q_pos: Tensor, k_pos: Tensor,
                kept: dict | None) -> Tensor:
        """(B,H,Tq,Dh). A scheme that attends itself (a position map, whose window lives inside it) goes to the
        dispatch first, as does every layer without soft-capping or a window it reaches; the rest are masked.
        Pretrained decoders: inference and fine-tuning without attention dropout.

        Under torch.compile a layer with a window or a cap runs this outside the graph, as in eager: which path it
        takes reads the positions (a window reached or not, blocks where they count up), and the masked path inside
        the graph would be a (T, T) mask where eager runs causal SDPA or blocks."""
        attends_itself = dispatch.form_of(type(scheme)) in ("mapped", "attends")
        capped_or_windowed = self.shape.softcap is not None or self.shape.window is not None
        if not attends_itself and capped_or_windowed and torch.compiler.is_compiling():
            # built at each traced call: torch.compiler.disable imports torch._dynamo, kept out of `import posenc`
            return torch.compiler.disable(self._attend)(q, k, v, scheme, q_pos, k_pos, kept)
        windowed = not attends_itself and self._windowed(q_pos, k_pos)
        if attends_itself or not (self.shape.softcap is not None or windowed):
            return dispatch.attention(q, k, v, scheme, q_pos, k_pos, True, 0.0, kept)
        if windowed:  # block by block over the keys each block's window reaches, where positions count up
            softcap = self.shape.softcap
            out = sliding_attention(
                q, k, v, q_pos, k_pos, self.shape.window,
                lambda rows, cols: scheme.bias(q_pos[:, rows], k_pos[:, cols], q[:, :, rows], k[:, :, cols]),
                lambda q, k, v, bias, allowed: masked_attention(q, k, v, bias, allowed, softcap))
            if out is not None:
                return out
        return masked_attention(q, k, v, scheme.bias(q_pos, k_pos, q, k), self._allowed(q, k, q_pos, k_pos),
                                self.shape.softcap)

    def _allowed(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """(B|1,1,Tq,Tk) bool: causal by index (as every posenc path), and within the window by position."""
        allowed = causal_mask(q.shape[-2], k.shape[-2], q.device)[None, None]
        if self.shape.window is not None:
            near = q_pos[:, :, None] - k_pos[:, None, :] < self.shape.window  # (B,Tq,Tk)
            allowed = allowed & near[:, None]
        return allowed


def _span(q_pos: Tensor, k_pos: Tensor) -> int:
    return int(q_pos.max() - k_pos.min())  # one read for both


# max(q_pos) - min(k_pos), the widest distance any query reaches, read once per forward (each read of a device value
# waits for the device; Gemma 3 270M has 15 sliding layers a token)
position_span = LastPositions(_span)


def masked_attention(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None, allowed: Tensor,
                     softcap: float | None) -> Tensor:
    """softmax(cap(q k^T / sqrt(Dh)) + bias, where allowed) v; q (B,H,Tq,Dh), k/v (B,Hkv,Tk,Dh) -> (B,H,Tq,Dh).
    Without a cap or bias it is SDPA with a boolean mask; with one, the eager form (scores in memory)."""
    gqa = k.shape[1] != q.shape[1]
    if softcap is None and bias is None:
        return sdpa(q, k, v, allowed, gqa=gqa)
    if gqa:
        g = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5  # (B,H,Tq,Tk)
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)  # Gemma 2: before the mask, as transformers
    if bias is not None:
        scores = scores + bias.to(scores.dtype)
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


__all__ = ["AttentionShape", "DecoderAttention", "masked_attention", "position_span"]
