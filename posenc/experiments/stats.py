"""Summaries over seeds: mean, spread, and ranking that calls overlapping schemes tied.

A scheme's interval is the range of its seeds' values [min, max]: with three seeds that is wider
than mean +- std and narrower than a t-based 95% interval of the mean, and it needs no normality
assumption. Two schemes whose intervals overlap are tied: the leaderboard gives them one rank.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


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


__all__ = ["Spread", "ratios", "tied_ranks"]
