"""A published claim's verdict at this scale, as every study's claims table reports it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Verdict:
    source: str
    claim: str
    rule: str
    verdict: str  # held | failed | inconclusive
    evidence: str


__all__ = ["Verdict"]
