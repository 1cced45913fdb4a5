"""`alibi`: attention with linear biases (Press et al. 2022, "Train Short, Test Long").

Head h of H gets slope 2^(-8h/H); the logit of query m for key n is lowered by
slope * |m - n|. For H not a power of two the paper (and its code) takes the slopes of
the closest power of two below H, then every other slope of twice that count.
NeMo's num_attention_heads_alibi biases only the first heads; the rest get slope 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from posenc.bias._distance import shared_rows
from posenc.errors import bad_value
from posenc.scheme import Dims, Scheme, ScoreMod, relative_distance
from posenc.validators import positive_int


def _power_of_two_slopes(n: int) -> list[float]:
    start = 2.0 ** (-8.0 / n)
    return [start ** (i + 1) for i in range(n)]


def alibi_slopes(n_heads: int) -> Tensor:
    """Per-head slopes, float32 (n_heads,): 2^-1..2^-8 for 8 heads."""
    if n_heads < 1:
        raise bad_value("n_heads", n_heads, "a positive number of heads")
    if math.log2(n_heads).is_integer():
        return torch.tensor(_power_of_two_slopes(n_heads), dtype=torch.float32)
    closest = 2 ** math.floor(math.log2(n_heads))
    extra = _power_of_two_slopes(2 * closest)[0::2][: n_heads - closest]
    return torch.tensor(_power_of_two_slopes(closest) + extra, dtype=torch.float32)


def partial_slopes(n_heads: int, n_biased: int | None, field: str = "num_attention_heads_alibi") -> Tensor:
    """NeMo's build_slopes: slopes for the first n_biased heads, zero for the rest."""
    n_biased = n_heads if n_biased is None else n_biased
    if not 1 <= n_biased <= n_heads:
        raise bad_value(field, n_biased, f"an int in [1, n_head={n_heads}] or None")
    return torch.cat((alibi_slopes(n_biased), torch.zeros(n_heads - n_biased)))


@dataclass(frozen=True, kw_only=True)
class ALiBiOptions:
    num_attention_heads_alibi: int | None = None  # NeMo: bias only the first heads; None = all

    def __post_init__(self) -> None:
        if self.num_attention_heads_alibi is not None:
            positive_int("num_attention_heads_alibi", self.num_attention_heads_alibi)


class ALiBi(Scheme):
    Options = ALiBiOptions
    shift_invariant = True

    def __init__(self, dims: Dims, options: ALiBiOptions | None = None, **flat: Any) -> None:
        super().__init__(dims, options, **flat)
        slopes = partial_slopes(dims.n_head, self.options.num_attention_heads_alibi)
        self.register_buffer("slopes", slopes, persistent=False)

    @classmethod
    def check_config(cls, dims: Dims, options: ALiBiOptions) -> None:
        partial_slopes(dims.n_head, options.num_attention_heads_alibi)

    def bias(self, q_pos: Tensor, k_pos: Tensor, q: Tensor | None = None, k: Tensor | None = None) -> Tensor:
        q_pos, k_pos = shared_rows(q_pos, k_pos)  # one (1,H,Tq,Tk) bias when rows share positions
        distance = relative_distance(q_pos, k_pos).abs().to(torch.float32)  # (B|1,1,Tq,Tk)
        return -self.slopes.view(1, -1, 1, 1) * distance  # (B|1,H,Tq,Tk)

    def bias_by_distance(self, distance: Tensor) -> Tensor:
        """distance (S,) m - n -> (H,S): -slope * |m - n|, exactly bias()'s values."""
        return -self.slopes[:, None] * distance.abs().to(torch.float32)[None]

    def score_mod(self, q_pos: Tensor, k_pos: Tensor) -> ScoreMod:
        slopes = self.slopes

        def alibi(score, b, h, q_idx, kv_idx):
            distance = (q_pos[b, q_idx] - k_pos[b, kv_idx]).abs().to(score.dtype)
            return score - slopes[h] * distance

        return alibi
