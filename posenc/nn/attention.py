"""One attention for every scheme: rotate, cache, bias, mask, then SDPA.

Notation: B batch, H query heads, Hkv key/value heads (GQA when Hkv < H), Tq new queries,
Tk keys (cached + new), Dh head dim, D model dim.
The scheme is passed in, never stored, so one instance serves all layers and the state
dict holds its parameters once. Attention calls every hook and never asks which scheme.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posenc.nn.kv_cache import KVCache
from posenc.scheme import Scheme


def causal_mask(tq: int, tk: int, device: torch.device) -> Tensor:
    """(Tq,Tk) bool, True where allowed. The Tq queries are the last Tq of the Tk keys."""
    q_idx = torch.arange(tk - tq, tk, device=device)[:, None]
    return torch.arange(tk, device=device)[None, :] <= q_idx


def attend(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None, causal: bool, dropout: float = 0.0) -> Tensor:
    """softmax(q k^T / sqrt(Dh) + bias + mask) v. q (B,H,Tq,Dh), k/v (B,Hkv,Tk,Dh) -> (B,H,Tq,Dh)."""
    tq, tk = q.shape[-2], k.shape[-2]
    gqa = k.shape[1] != q.shape[1]
    needs_mask = causal and tq > 1
    if bias is None:
        if not needs_mask:
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, enable_gqa=gqa)
        if tq == tk:
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True, enable_gqa=gqa)
        mask = causal_mask(tq, tk, q.device)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, enable_gqa=gqa)
    bias = bias.to(q.dtype)
    if needs_mask:
        # A 4-D float mask keeps SDPA on its fast kernel; -inf where the future is.
        bias = bias.masked_fill(~causal_mask(tq, tk, q.device), float("-inf"))
    if bias.dim() == 4 and bias.shape[0] == 1 and q.shape[0] > 1:
        bias = bias.expand(q.shape[0], -1, -1, -1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout, enable_gqa=gqa)


def attend_eager(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None, causal: bool,
                 dropout: float = 0.0) -> tuple[Tensor, Tensor]:
    """The same as attend() but materialises the weights (B,H,Tq,Tk) for schemes that need them."""
    h, hkv = q.shape[1], k.shape[1]
    if hkv != h:  # GQA: share each key/value head among h // hkv query heads
        k, v = k.repeat_interleave(h // hkv, 1), v.repeat_interleave(h // hkv, 1)
    scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5  # (B,H,Tq,Tk)
    if bias is not None:
        scores = scores + bias.to(scores.dtype)
    if causal and q.shape[-2] > 1:
        scores = scores.masked_fill(~causal_mask(q.shape[-2], k.shape[-2], q.device), float("-inf"))
    weights = F.dropout(torch.softmax(scores, dim=-1), dropout)
    return weights @ v, weights


class SelfAttention(nn.Module):
    def __init__(self, d_model: int, n_head: int, n_kv_head: int, causal: bool, bias: bool = False,
                 dropout: float = 0.0, layer: int = 0) -> None:
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = n_head, n_kv_head, d_model // n_head
        self.causal, self.dropout, self.layer = causal, dropout, layer
        self.q_proj = nn.Linear(d_model, n_head * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(d_model, n_kv_head * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(d_model, n_kv_head * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(n_head * self.head_dim, d_model, bias=bias)

    def _heads(self, x: Tensor, n: int) -> Tensor:
        b, t, _ = x.shape
        return x.view(b, t, n, self.head_dim).transpose(1, 2)  # (B,n,T,Dh)

    def forward(self, x: Tensor, scheme: Scheme, q_pos: Tensor, k_pos: Tensor,
                cache: KVCache | None = None) -> Tensor:
        """x (B,Tq,D); q_pos (B,Tq); k_pos (B,Tk) = positions of cached + new keys."""
        q = self._heads(self.q_proj(x), self.n_head)  # (B,H,Tq,Dh)
        k = self._heads(self.k_proj(x), self.n_kv_head)  # (B,Hkv,Tq,Dh)
        v = self._heads(self.v_proj(x), self.n_kv_head)
        q, k = scheme.rotate(q, k, q_pos, q_pos)  # new keys sit at the new positions
        if cache is not None:
            k, v = cache.update(self.layer, k, v)  # (B,Hkv,Tk,Dh)
        bias = scheme.bias(q_pos, k_pos, q, k)  # (B|1,H,Tq,Tk) or None
        dropout = self.dropout if self.training else 0.0
        if scheme.needs_weights:
            out, weights = attend_eager(q, k, v, bias, self.causal, dropout)  # (B,H,Tq,Dh)
            out = out + scheme.mix_values(weights, q_pos, k_pos)
        else:
            out = attend(q, k, v, bias, self.causal, dropout)  # (B,H,Tq,Dh)
        return self.o_proj(out.transpose(1, 2).flatten(2))  # (B,Tq,D)
