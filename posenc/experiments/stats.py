"""Spreads for the extend tables: Wilson intervals for accuracies, a block bootstrap for perplexity."""

from __future__ import annotations

import math

import torch
from torch import Tensor


def wilson(correct: int, total: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a binomial proportion: sensible at 0/n and n/n, unlike
    the normal approximation, which collapses to a point there (Wilson 1927)."""
    if total == 0:
        return math.nan, math.nan
    p = correct / total
    centre = (p + z * z / (2 * total)) / (1 + z * z / total)
    half = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / (1 + z * z / total)
    return max(0.0, centre - half), min(1.0, centre + half)


def block_bootstrap_ppl(nll: list[Tensor], block: int = 128, samples: int = 1000, seed: int = 0,
                        min_blocks: int = 8) -> tuple[float, float]:
    """95% interval of exp(mean NLL) when the text is resampled in `block`-token blocks (blocks of
    every window pooled): the spread due to which text was read. Blocks, not tokens, because
    neighbouring tokens' losses are correlated; NaN with fewer than `min_blocks` blocks, where a
    bootstrap says little."""
    parts = [t[: t.shape[0] // block * block].view(-1, block).mean(1) for t in nll if t.shape[0] >= block]
    blocks = torch.cat(parts) if parts else torch.empty(0)
    if blocks.numel() < min_blocks:
        return math.nan, math.nan
    g = torch.Generator().manual_seed(seed)
    picks = torch.randint(0, blocks.numel(), (samples, blocks.numel()), generator=g)
    ppl = blocks.double()[picks].mean(1).exp()
    lo, hi = torch.quantile(ppl, torch.tensor([0.025, 0.975], dtype=torch.float64)).tolist()
    return lo, hi
