"""`p_rope`: RoPE on the highest-frequency fraction p of the pairs only (Barbero et al. 2024,
"Round and Round We Go! What makes Rotary Positional Encodings useful?", sec. 6).

The paper finds that the lowest RoPE frequencies rotate so slowly that they act as a
near-constant "semantic channel", which rotation only corrupts at long range; p-RoPE sets
their frequency to zero (angle 0: the pair passes through unrotated). p = 1 is RoPE,
p = 0 is NoPE. Pairs are ordered from the highest frequency (theta_0 = 1) down, so the
first round(p * R/2) pairs keep their frequency and the rest get 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from posenc.errors import bad_value
from posenc.rotary.rope import RoPE, RotaryOptions


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


@dataclass(frozen=True, kw_only=True)
class PRoPEOptions(RotaryOptions):
    p_rope_fraction: float = 0.75  # share of the highest frequencies kept (Barbero et al. 2024)

    def __post_init__(self) -> None:
        super().__post_init__()
        kept_pairs(2, self.p_rope_fraction)


class PRoPE(RoPE):
    Options = PRoPEOptions
    shift_invariant = True

    def _frequencies(self, seq_len: int | None) -> tuple[Tensor, float]:
        # Scalings act first (they are defined on the full spectrum), then the low end is cut.
        inv_freq, scale = super()._frequencies(seq_len)
        return truncate_frequencies(inv_freq, self.options.p_rope_fraction), scale
