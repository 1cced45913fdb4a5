"""What a task's generator hands the builder."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Draft:
    ids: list[int]
    answers: tuple[str, ...]
    needle_starts: tuple[int, ...]  # per answer: where the line holding it starts; () without needles
