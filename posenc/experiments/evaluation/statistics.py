"""Spreads and intervals of results: over seeds (mean, std, the seed range, and ranks that call
overlapping schemes tied), Wilson intervals for accuracies, and a block bootstrap for perplexity.

A scheme's interval over seeds is the range of its seeds' values [min, max]: with three seeds that
is wider than mean +- std and narrower than a t-based 95% interval of the mean, and it needs no
normality assumption. Two schemes whose intervals overlap are tied: the leaderboard gives them one rank.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class Spread:
    values: tuple[float, ...]

    @property
    def finite(self) -> tuple[float, ...]:
        return tuple(v for v in self.values if math.isfinite(v))

    @property
    def mean(self) -> float:
        return statistics.fmean(self.finite) if self.finite else math.nan

    @property
    def std(self) -> float:
        """Sample standard deviation (n - 1); 0 for one seed."""
        return statistics.stdev(self.finite) if len(self.finite) > 1 else 0.0 if self.finite else math.nan

    @property
    def low(self) -> float:
        return min(self.finite) if self.finite else math.nan

    @property
    def high(self) -> float:
        return max(self.finite) if self.finite else math.nan

    @property
    def complete(self) -> bool:
        """Every seed gave a finite value (a diverged run or a length past a table gives NaN)."""
        return len(self.finite) == len(self.values) and bool(self.values)

    def overlaps(self, other: Spread) -> bool:
        return self.low <= other.high and other.low <= self.high

    def text(self, digits: int = 2) -> str:
        if not self.finite:
            return "n/a"
        return f"{self.mean:.{digits}f}" if len(self.finite) == 1 else f"{self.mean:.{digits}f} ± {self.std:.{digits}f}"


def tied_ranks(spreads: Mapping[str, Spread]) -> dict[str, str]:
    """Rank by mean (lower is better); a scheme whose interval overlaps the one ranked just above it shares
    that rank, shown with '='. Schemes without values are left out."""
    order = sorted((name for name, s in spreads.items() if s.finite), key=lambda n: spreads[n].mean)
    ranks: dict[str, int] = {}
    for i, name in enumerate(order):
        tied = i > 0 and spreads[name].overlaps(spreads[order[i - 1]])
        ranks[name] = ranks[order[i - 1]] if tied else i + 1
    counts = {r: sum(1 for v in ranks.values() if v == r) for r in ranks.values()}
    return {name: f"{r}=" if counts[r] > 1 else str(r) for name, r in ranks.items()}


def ratios(numerators: Sequence[float], denominators: Sequence[float]) -> Spread:
    """Per-seed ratios (seeds paired by position): e.g. ppl@8x / ppl@1x of each seed."""
    return Spread(tuple(n / d if d and math.isfinite(n) and math.isfinite(d) else math.nan
                        for n, d in zip(numerators, denominators, strict=True)))


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


__all__ = ["Spread", "block_bootstrap_ppl", "ratios", "tied_ranks", "wilson"]
