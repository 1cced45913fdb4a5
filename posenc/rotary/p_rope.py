"""`p_rope`: RoPE on the highest-frequency fraction p of the pairs only (Barbero et al. 2024,
"Round and Round We Go! What makes Rotary Positional Encodings useful?", sec. 6).

The paper finds that the lowest RoPE frequencies rotate so slowly that they act as a
near-constant "semantic channel", which rotation only corrupts at long range; p-RoPE sets
their frequency to zero (angle 0: the pair passes through unrotated). p = 1 is RoPE,
p = 0 is NoPE. Pairs are ordered from the highest frequency (theta_0 = 1) down, so the
first round(p * R/2) pairs keep their frequency and the rest get 0.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from posenc.errors import bad_value
from posenc.rotary.rope import RoPE
from posenc.scheme import Dims


def kept_pairs(n_pairs: int, fraction: float) -> int:
    """How many of the n_pairs highest frequencies p-RoPE keeps."""
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0.0 <= fraction <= 1.0:
        raise bad_value("p_rope_fraction", fraction, "a fraction in [0, 1] (1 = RoPE, 0 = NoPE)")
    return round(fraction * n_pairs)


def truncate_frequencies(inv_freq: Tensor, fraction: float) -> Tensor:
    """inv_freq (R/2,), highest first -> the same with the lowest (1 - p) share set to 0."""
    keep = kept_pairs(inv_freq.shape[-1], fraction)
    mask = torch.arange(inv_freq.shape[-1], device=inv_freq.device) < keep
    return torch.where(mask, inv_freq, torch.zeros_like(inv_freq))


class PRoPE(RoPE):
    relative = True

    def __init__(self, dims: Dims, p_rope_fraction: float = 0.75, **rope_kwargs: Any) -> None:
        kept_pairs(2, p_rope_fraction)  # validate before any table is built
        self.p_rope_fraction = float(p_rope_fraction)  # read by _frequencies during RoPE.__init__
        super().__init__(dims, **rope_kwargs)

    @classmethod
    def from_config(cls, dims: Dims, cfg: Any) -> PRoPE:
        return cls(dims, p_rope_fraction=cfg.p_rope_fraction, **RoPE.config_kwargs(cfg))

    def _frequencies(self, seq_len: int | None) -> tuple[Tensor, float]:
        # Scalings act first (they are defined on the full spectrum), then the low end is cut.
        inv_freq, scale = super()._frequencies(seq_len)
        return truncate_frequencies(inv_freq, self.p_rope_fraction), scale

    def extra_repr(self) -> str:
        return super().extra_repr() + f", p={self.p_rope_fraction:g}"
