"""The q/k/v/o projections and head split shared by self- and cross-attention (GQA: Hkv <= H)."""

from __future__ import annotations

from torch import Tensor, nn


class HeadProjections(nn.Module):
    def __init__(self, d_model: int, n_head: int, n_kv_head: int, bias: bool = False) -> None:
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = n_head, n_kv_head, d_model // n_head
        self.q_proj = nn.Linear(d_model, n_head * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(d_model, n_kv_head * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(d_model, n_kv_head * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(n_head * self.head_dim, d_model, bias=bias)

    def _heads(self, x: Tensor, n: int) -> Tensor:
        b, t, _ = x.shape
        return x.view(b, t, n, self.head_dim).transpose(1, 2)  # (B,n,T,Dh)
