"""A published claim's verdict at this scale, as every study's claims table reports it."""

from __future__ import annotations

from dataclasses import dataclass

CLOSE = 1.10  # within 10% of the best scheme at the training length: "comes close" (compare's claims, the ladder)


@dataclass(frozen=True)
class Verdict:
    source: str
    claim: str
    rule: str
    verdict: str  # held | failed | inconclusive
    evidence: str


__all__ = ["CLOSE", "Verdict"]
