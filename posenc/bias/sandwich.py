"""`sandwich`: parameter-free bias from sinusoidal inner products (Chi et al. 2023,
"Dissecting Transformer Length Extrapolation via the Lens of Receptive Field Analysis", eq. 3).

  S(m, n) = p_m . p_n = sum_{k=1..d/2} cos(|m - n| w_k),   w_k = 10000^(-2k/d)
compressed per head h = 1..H as (S - d/2) / (8h/H). d is the head dimension: NeMo's GPT builds
SandwichRelativePositionEmbedding with hidden_size = hidden_size // num_attention_heads (or
kv_channels), and the paper's p_m are the sinusoids of one head. S depends only on |m - n|, so we
build it once per distance and gather: (H,T,T) work is one lookup, not d/2 cosines per entry.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from posenc.bias._distance import distance_bias
from posenc.scheme import Dims, Scheme, ScoreMod


def sandwich_table(max_distance: int, d: int) -> Tensor:
    """S(r) - d/2 for r = 0..max_distance, float32 (max_distance + 1,), computed in float64."""
    k = torch.arange(1, d // 2 + 1, dtype=torch.float64)
    w = 10000.0 ** (-2.0 * k / d)
    r = torch.arange(max_distance + 1, dtype=torch.float64)[:, None]
    return (torch.cos(r * w).sum(-1) - d / 2).to(torch.float32)


def sandwich_head_scales(n_heads: int) -> Tensor:
    """8h/H for h = 1..H, float32 (H,)."""
    return 8.0 * torch.arange(1, n_heads + 1, dtype=torch.float32) / n_heads


class Sandwich(Scheme):
    shift_invariant = True

    def __init__(self, dims: Dims, options: Any = None, **flat: Any) -> None:
        super().__init__(dims, options, **flat)
        self.register_buffer("head_scales", sandwich_head_scales(dims.n_head), persistent=False)
        self.register_buffer("table", sandwich_table(min(dims.max_seq_len, 4096), dims.head_dim), persistent=False)

    def _table(self, max_distance: int) -> Tensor:
        if max_distance >= self.table.numel():  # longer than ever seen: grow once, keep it
            size = max(max_distance + 1, 2 * self.table.numel())
            self.table = sandwich_table(size - 1, self.dims.head_dim).to(self.table.device)
        return self.table

    def bias(self, q_pos: Tensor, k_pos: Tensor, q: Tensor | None = None, k: Tensor | None = None) -> Tensor:
        return distance_bias(q_pos, k_pos, self.bias_by_distance)  # (B|1,H,Tq,Tk)

    def bias_by_distance(self, distance: Tensor) -> Tensor:
        """distance (S,) m - n -> (H,S): the table at |m - n|, compressed per head."""
        table = self._table(int(distance.abs().max()))
        return table[distance.abs()][None] / self.head_scales[:, None]

    def score_mod(self, q_pos: Tensor, k_pos: Tensor) -> ScoreMod:
        both = torch.cat((q_pos, k_pos), 1)
        span = int(both.max() - both.min())
        table = self._table(span)[: span + 1]
        symmetric = torch.cat((table.flip(0), table[1:]))  # index m - n + span, no abs() in the kernel
        by_offset = (symmetric[None, :] / self.head_scales[:, None]).contiguous()  # (H, 2*span+1)
        # (abs() of an index inside score_mod trips an Inductor C++ codegen bug in torch 2.13.)

        def sandwich(score, b, h, q_idx, kv_idx):
            return score + by_offset[h, q_pos[b, q_idx] - k_pos[b, kv_idx] + span]

        return sandwich
